"""Running the CLI in-process exactly as a user would run it, and reading scenario files."""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gwpolicy.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
# ../shared beside the checkout; from a worktree below it (wt/NAME), the nearest ancestor that has one
SHARED = next((d / "shared" for d in ROOT.parents if (d / "shared").is_dir()), ROOT.parent / "shared")
CONFORMANCE = SHARED / "conformance"
GATEWAY_API = SHARED / "gateway-api"  # its examples (its CRDs are GATEWAY_API_CRDS, the same files)
GATEWAY_API_CRDS = ROOT / "deploy" / "gateway-api"  # the bundle the project ships (test_sandbox_bundled: unchanged)
#: ../shared is the project's test data (the contract's scenarios, the Gateway API conformance cases
#: it translates, upstream examples). CI has it beside the checkout and sets GWPOLICY_REQUIRE_SHARED=1
#: (conftest.py stops a run without it); in a user's clone, which has none, what reads it is skipped.
REQUIRE_SHARED = bool(os.environ.get("GWPOLICY_REQUIRE_SHARED"))
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (the project's shared test data) is not "
                                  "beside this checkout")
NOW = "2026-01-01T00:00:00Z"

#: a namespaced custom resource with a status subresource, for the sandbox store's own tests
WIDGET_CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "metadata": {"name": "widgets.example.io"},
       "spec": {"group": "example.io", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [{"name": "v1", "served": True, "storage": True,
                              "subresources": {"status": {}},
                              "schema": {"openAPIV3Schema": {"type": "object",
                                                             "x-kubernetes-preserve-unknown-fields": True}}}]}}


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(*args: str, stdin: str | None = None) -> Run:
    """Call `gwpolicy ARGS` with captured stdout/stderr (and optional stdin)."""
    out_buf, err = io.BytesIO(), io.StringIO()
    out = io.TextIOWrapper(out_buf, encoding="utf-8")
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr = out, err
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        out.flush()
        sys.stdout, sys.stderr, sys.stdin = old
    return Run(code, out_buf.getvalue().decode(), err.getvalue())


def write_manifests(tmp_path: Path, objects: list[dict[str, Any]], name: str = "manifests.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return path


def set_dotted(target: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    """`target` with `value` at the dotted path `field` (`body.maxSize`), the dicts on the way made."""
    cur = target
    parts = field.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return target


def scenario_files() -> list[Path]:
    return sorted(CONFORMANCE.glob("**/*.yaml"))


def path_lists(a: Any) -> list[tuple[list, tuple]]:
    """Every path's (kind, result) list of the analysis, held, with a copy of what it holds now: an
    in-place update must give a path another list, never change one (the gateway's build cache
    takes an unchanged list, by identity, for an unchanged path; and lists are shared by paths)."""
    return [(pairs, tuple(pairs)) for per_path in a._effective_by_target().values() for pairs in per_path.values()]


def assert_lists_unchanged(held: list[tuple[list, tuple]]) -> None:
    changed = [was for pairs, was in held if tuple(pairs) != was]
    assert not changed, f"{len(changed)} path lists changed in place, e.g. {changed[0]}"


def interpreted(module: str) -> Any:
    """A fresh copy of a core module run from its source, whichever core is imported: a test that
    patches a function the module calls patches this copy (a compiled module calls its functions
    directly, past a patched module attribute). The copy's own classes are its own."""
    import importlib.util

    from gwpolicy import compiled
    spec = importlib.util.spec_from_file_location(f"_interpreted_{module.replace('.', '_')}", compiled.source_path(module))
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = copy  # dataclasses look their module up while it runs
    spec.loader.exec_module(copy)
    return copy
