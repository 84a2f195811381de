"""The compiled core (src/gwpolicy/compiled.py): used where `./dev` built it, never while its
sources differ from what it was built from, and giving exactly the answers of the interpreted core.

The rest of the suite runs on whichever core `./dev` left (compiled where a compiler is, as in CI);
these tests hold the two to each other and the guard to its rule."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gwpolicy import compiled
from gwpolicy.bench.generate import write_yaml
from helpers import NOW, needs_shared

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "conformance"
BUILT = compiled.MANIFEST.is_file()
needs_build = pytest.mark.skipif(not BUILT, reason="the core is not compiled here (python -m gwpolicy.corebuild build)")


def _run(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def _which_core(pythonpath: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    code = ("import json, gwpolicy.compiled as c; import gwpolicy.engine.effective, gwpolicy.engine.inplace.apply, gwpolicy.engine.topology;"
            "print(json.dumps({'in_use': c.in_use(), 'reason': c.reason,"
            " 'files': [__import__(m, fromlist=['x']).__file__ for m in c.MODULES]}))")
    run = _run(["-c", code], env={"PYTHONPATH": str(pythonpath), **(env or {})})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_where_dev_built_the_core_it_is_the_one_imported() -> None:
    """`./dev` says when its build succeeded; the suite then runs on the compiled modules."""
    if os.environ.get("GWPOLICY_EXPECT_COMPILED") != "1":
        pytest.skip("./dev did not build the compiled core here")
    assert compiled.in_use(), compiled.reason
    assert compiled.describe() == "core: compiled (mypyc)"


def test_the_manifest_is_stale_when_any_source_it_names_changed() -> None:
    sources = {"gwpolicy/engine/topology.py": "aa", "gwpolicy/engine/model.py": "bb"}
    manifest = {"python": sys.implementation.cache_tag, "modules": list(compiled.MODULES), "sources": sources}
    assert compiled.stale(manifest, lambda p: {"topology.py": "aa", "model.py": "bb"}[p.name]) == ""
    assert compiled.stale(manifest, lambda p: {"topology.py": "aa", "model.py": "cc"}[p.name]) \
        == "gwpolicy/engine/model.py changed since the build"

    def gone(p: Path) -> str:
        raise FileNotFoundError(p)
    assert compiled.stale(manifest, gone) == "gwpolicy/engine/model.py is gone"
    assert "not" in compiled.stale({**manifest, "python": "cpython-99"}, lambda p: "aa")
    assert compiled.stale({**manifest, "modules": ["gwpolicy.engine.topology"]}, lambda p: "aa") \
        == "built from another list of modules"


@needs_build
def test_a_source_edited_after_the_build_is_run_from_source_with_the_rest_of_the_core(tmp_path: Path) -> None:
    """A copy of the package with its build: compiled as built; one compiled module's source edited,
    or a module it imports, and all three come from their sources (a stale extension would run the
    old code); GWPOLICY_PURE=1 likewise."""
    shutil.copytree(compiled.PACKAGE_DIR, tmp_path / "gwpolicy", ignore=shutil.ignore_patterns("__pycache__"))
    fresh = _which_core(tmp_path)
    assert fresh["in_use"] is True, fresh
    assert all(not str(f).endswith(".py") for f in fresh["files"])  # type: ignore[attr-defined]
    assert _which_core(tmp_path, {"GWPOLICY_PURE": "1"})["in_use"] is False

    for edited in ("topology.py", "model.py"):
        path = tmp_path / "gwpolicy" / "engine" / edited
        text = path.read_text()
        path.write_text(text + "\n# edited\n")
        got = _which_core(tmp_path)
        assert got["in_use"] is False and got["reason"] == f"gwpolicy/engine/{edited} changed since the build", got
        assert all(str(f).endswith(".py") for f in got["files"])  # type: ignore[attr-defined]
        path.write_text(text)
    assert _which_core(tmp_path)["in_use"] is True


@pytest.mark.slow  # the whole engine twice, on every shared scenario
@needs_shared
@needs_build
def test_the_compiled_and_the_interpreted_core_give_the_same_answers(tmp_path: Path) -> None:
    """Effective policy and status of a synthetic cluster and of the shared scenarios' manifests,
    byte for byte, from both cores (the suite's own checks run on one of them)."""
    cluster = tmp_path / "cluster.yaml"
    write_yaml(150, str(cluster))
    inputs = [cluster]
    scenarios = sorted(SHARED.rglob("*.yaml"))
    assert len(scenarios) > 100
    for i, path in enumerate(scenarios[::12]):  # a spread of them: each costs four runs of the CLI
        scenario = yaml.safe_load(path.read_text())
        inputs.append(tmp_path / f"scenario-{i}.yaml")
        inputs[-1].write_text(yaml.safe_dump_all(scenario["manifests"]))
    for path in inputs:
        for cmd in (["effective", "-f", str(path), "-o", "json", "--now", NOW],
                    ["status", "-f", str(path), "-o", "json", "--now", NOW]):
            both = [_run(["-m", "gwpolicy.cli.main", *cmd], env=env)
                    for env in ({}, {"GWPOLICY_PURE": "1"})]
            assert both[0].returncode == both[1].returncode, (cmd, both[0].stderr, both[1].stderr)
            assert both[0].stdout == both[1].stdout, cmd
            assert both[0].stdout.strip(), (cmd, both[0].stderr)


def test_the_compiled_modules_are_the_core_that_mypy_holds() -> None:
    """A module added to the core is compiled with it (and held to the annotations mypyc checks)."""
    from test_types import CORE_MODULES, PACKAGE
    core = set()
    for name in CORE_MODULES:
        path = PACKAGE / name
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            if f.name != "__init__.py":
                core.add("gwpolicy." + ".".join(f.relative_to(PACKAGE).with_suffix("").parts))
    assert set(compiled.MODULES) == core


def test_clean_takes_the_extension_a_renamed_module_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension beside no source (its module renamed or taken out of the core) goes with the
    build's own, so an import of the old name cannot find it; one beside its source stays."""
    from gwpolicy import corebuild
    package = tmp_path / "gwpolicy"
    (package / "engine").mkdir(parents=True)
    tag = sys.implementation.cache_tag
    orphan = package / "engine" / f"gone.{tag}-x86_64-linux-gnu.so"
    group = package / f"_core__mypyc.{tag}-x86_64-linux-gnu.so"
    own = package / "engine" / f"other.{tag}-x86_64-linux-gnu.so"
    for f in (orphan, group, own, package / "engine" / "other.py"):
        f.write_bytes(b"")
    monkeypatch.setattr(corebuild, "PACKAGE_DIR", package)
    monkeypatch.setattr(corebuild, "MANIFEST", package / "_compiled.json")
    monkeypatch.setattr(corebuild, "source_path", lambda m: tmp_path.joinpath(*m.split(".")).with_suffix(".py"))
    corebuild.clean()
    assert not orphan.exists() and not group.exists()
    assert own.exists()
