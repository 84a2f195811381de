"""The compiled core: the engine's modules built to C extensions with mypyc, and the guard
that uses them only while they are the build of the sources beside them.

Why: an in-place update that moves a thousand routes (a Gateway's hostname edited at 20k routes)
is spread over thousands of nodes with no single hot line; compiled, the same code runs it about a
third faster (docs/performance.md). Nothing else changes: the modules stay plain, typed Python, and
without a compiler (or with GWPOLICY_PURE=1) the package runs them interpreted.

Why a guard: Python imports an extension module before the `.py` of the same name, so a build
left beside sources edited since would run the old code silently. `gwpolicy/__init__` calls
`guard()` first: the build's manifest records a SHA-256 of every source it was made from (the
compiled modules and the gwpolicy modules they import); if any differs, or the manifest is missing,
the compiled modules are imported from their sources instead, all of them together.

`python -m gwpolicy.corebuild build` makes the build (`./dev` runs it when the sources changed);
`... status` says which core is in use; `... clean` removes the build.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

#: the modules compiled: the engine's core (tests/project/test_types.py's CORE_MODULES), not its edges
MODULES = ("gwpolicy.engine.topology", "gwpolicy.engine.effective", "gwpolicy.engine.refs", "gwpolicy.engine.model",
           "gwpolicy.engine.inplace.base", "gwpolicy.engine.inplace.recompute", "gwpolicy.engine.inplace.policies",
           "gwpolicy.engine.inplace.edit", "gwpolicy.engine.inplace.hierarchy", "gwpolicy.engine.inplace.apply",
           "gwpolicy.engine.merge.fieldmerge", "gwpolicy.engine.merge.strategies", "gwpolicy.engine.merge.leaves", "gwpolicy.engine.merge.values",
           "gwpolicy.engine.analysis", "gwpolicy.engine.status", "gwpolicy.engine.attach", "gwpolicy.engine.policies")
#: mypyc's shared library is named after the group: `gwpolicy/_core__mypyc.*.so`, inside the package
GROUP = "gwpolicy._core"
PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = PACKAGE_DIR / "_compiled.json"
PURE_ENV = "GWPOLICY_PURE"

#: why the compiled core is not in use ("" when it is); set by `guard`
reason = "not checked"


def digest_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_path(module: str) -> Path:
    return PACKAGE_DIR.parent.joinpath(*module.split(".")).with_suffix(".py")


def stale(manifest: dict[str, Any], digest: Any = None) -> str:
    """Why the build the manifest describes is not the build of the sources now ("" when it is)."""
    digest = digest or digest_file
    if manifest.get("python") != sys.implementation.cache_tag:
        return f"built for {manifest.get('python')}, not {sys.implementation.cache_tag}"
    if sorted(manifest.get("modules", ())) != sorted(MODULES):
        return "built from another list of modules"
    for rel, want in sorted((manifest.get("sources") or {}).items()):
        path = PACKAGE_DIR.parent / rel
        try:
            got = digest(path)
        except OSError:
            return f"{rel} is gone"
        if got != want:
            return f"{rel} changed since the build"
    return ""


class _FromSource:
    """Imports the compiled modules from their `.py` files, ahead of the extensions beside them (a
    meta path finder by its `find_spec` alone: `importlib.abc` costs 20 ms to import)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def check() -> str:
    """Why the build may not be used now ("" when it may)."""
    if os.environ.get(PURE_ENV):
        return f"{PURE_ENV} is set"
    try:
        manifest = json.loads(MANIFEST.read_text())
    except FileNotFoundError:
        return "not built (python -m gwpolicy.corebuild build)"
    except (OSError, ValueError) as e:
        return f"{MANIFEST.name} unreadable: {e}"
    return stale(manifest) if isinstance(manifest, dict) else f"{MANIFEST.name} is not an object"


def guard() -> None:
    """Decide, before any compiled module is imported, whether the build may be used."""
    global reason
    reason = check()
    if reason and not any(isinstance(f, _FromSource) for f in sys.meta_path):
        sys.meta_path.insert(0, _FromSource())


def in_use() -> bool:
    """Are the compiled modules the ones imported (asks the modules themselves)?"""
    return all(not str(getattr(importlib.import_module(m), "__file__", "")).endswith(".py") for m in MODULES)


def describe() -> str:
    """One line for a benchmark's header or a bug report: which core runs."""
    if in_use():
        return "core: compiled (mypyc)"
    return f"core: interpreted ({reason})"
