"""The package type-checks clean under mypy (docs/architecture.md, "Types").

The core is pure and typed, and the annotations are what a reader (and a refactoring) relies on:
a wrong one, or a `type: ignore` that no longer hides anything, fails here. The edges (reading
files, output, the CLI, the webhook, the sandbox) are where a None or a wrong shape reaches a user.
mypy runs as `./dev lint` runs it, with pyproject.toml's `[tool.mypy]` (every module of
src/gwpolicy, every function annotated), and with no cache kept between runs, so the result never
depends on an earlier one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "gwpolicy"

#: the engine from objects to effective policy and status: the compiled core (tests/project/test_compiled.py)
CORE_MODULES = tuple(f"engine/{name}" for name in (
    "analysis.py", "effective.py", "inplace", "topology.py", "attach.py", "status.py",
    "policies.py", "model.py", "refs.py", "merge"))


@pytest.mark.slow  # ./dev lint runs the same mypy
def test_the_package_type_checks_clean() -> None:
    try:  # never skipped: a missing mypy must fail, not pass quietly
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: it is a test dependency (pip install -e '.[test]')")
    files = sorted(PACKAGE.rglob("*.py"))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", os.devnull, "--no-color-output", "--no-pretty"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"mypy finds errors (./dev lint shows them):\n{report}"
    # every module of the package was checked (a path mypy skipped would pass unseen)
    assert f"no issues found in {len(files)} source files" in report, report
