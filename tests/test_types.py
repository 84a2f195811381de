"""The engine's core and its edges type-check clean under mypy (docs/architecture.md, "Types").

The core is pure and typed, and the annotations are what a reader (and a refactoring) relies on:
a wrong one, or a `type: ignore` that no longer hides anything, fails here. The edges (reading
files, output, the CLI, the webhook, the sandbox) are where a None or a wrong shape reaches a user.
mypy runs once, on exactly these modules (the modules they import are followed and checked with
them), with no cache kept between runs, so the result never depends on an earlier one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "gwpolicy"

#: the modules held to mypy: the engine from objects to effective policy and status
CORE_MODULES = ("analysis.py", "effective.py", "incremental.py", "topology.py", "attach.py", "status.py",
                "policies.py", "model.py", "refs.py", "merge")
#: and its edges: input, output, explanations, the CLI, the admission webhook, the sandbox API server,
#: the controller, the gateway, the benchmarks and the compiled core's guard and build
EDGE_MODULES = ("output.py", "load.py", "yamlfast.py", "explain.py", "effectiveobjects.py", "grants.py",
                "kinds.py", "shapes.py", "timestamps.py", "serve.py", "cli", "webhook", "sandbox",
                "__init__.py", "compiled.py", "corebuild.py", "controller", "gateway", "bench")


def _source_files() -> list[Path]:
    files: list[Path] = []
    for name in CORE_MODULES + EDGE_MODULES:
        path = PACKAGE / name
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def _config(tmp: Path) -> Path:
    """mypy's settings: in every module held to it every function is annotated, too (the body of an
    unannotated one is not checked at all)."""
    edges = ",".join(f"gwpolicy.{name}.*" if (PACKAGE / name).is_dir() else f"gwpolicy.{name.removesuffix('.py')}"
                     for name in CORE_MODULES + EDGE_MODULES)
    config = tmp / "mypy.ini"
    config.write_text("[mypy]\npython_version = 3.11\nwarn_unused_ignores = True\n\n"
                      f"[mypy-{edges}]\ndisallow_untyped_defs = True\ndisallow_incomplete_defs = True\n")
    return config


def test_core_and_edge_modules_type_check_clean(tmp_path: Path) -> None:
    try:  # never skipped: a missing mypy must fail, not pass quietly
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: it is a test dependency (pip install -e '.[test]')")
    files = _source_files()
    assert all(f.is_file() for f in files), [str(f) for f in files if not f.is_file()]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(_config(tmp_path)), "--cache-dir", os.devnull,
         "--show-error-codes", "--no-color-output", "--no-pretty", *[str(f.relative_to(ROOT)) for f in files]],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"mypy finds errors in the modules held to it:\n{report}"
    # every module given was checked (a path mypy skipped would pass unseen)
    assert f"no issues found in {len(files)} source files" in report, report
