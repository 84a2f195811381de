"""Building the compiled core (gwpolicy.compiled says what it is and why): mypyc compiles
`compiled.MODULES` into the package, beside their sources, and writes the manifest the guard reads.
Run from a source checkout: `python -m gwpolicy.corebuild build [--if-stale] | status | clean`;
`./dev` runs `build --if-stale` before every job."""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import sysconfig
from itertools import chain
from pathlib import Path

from gwpolicy.compiled import GROUP, MANIFEST, MODULES, PACKAGE_DIR, check, describe, digest_file, source_path


def _imports(path: Path) -> set[str]:
    """The gwpolicy modules a source imports (their types are compiled into it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gwpolicy"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gwpolicy"))
    return found


def _sources() -> list[Path]:
    """The compiled modules' sources and the package's own modules they import."""
    out = {source_path(m) for m in MODULES}
    for m in MODULES:
        for dep in _imports(source_path(m)):
            for cand in (source_path(dep), source_path(dep).with_suffix("") / "__init__.py"):
                if cand.is_file():
                    out.add(cand)
    return sorted(out)


def _hashes() -> dict[str, str]:
    """Each source's SHA-256, by its path from `src`: what the manifest records and the guard checks."""
    return {str(p.relative_to(PACKAGE_DIR.parent)): digest_file(p) for p in _sources()}


def _built_files() -> list[Path]:
    """The build's extensions, and any extension in the package with no source beside it: one a module
    renamed or taken out of the core left, which an import of the old name would still find."""
    group = source_path(GROUP + "__mypyc").with_suffix("")
    stems = [source_path(m).with_suffix("") for m in MODULES] + [group]
    built = {p for s in stems for p in s.parent.glob(s.name + ".*") if p.suffix in (".so", ".pyd")}
    for p in chain(PACKAGE_DIR.rglob("*.so"), PACKAGE_DIR.rglob("*.pyd")):
        stem = p.parent / p.name.split(".")[0]
        if stem != group and not stem.with_suffix(".py").is_file():
            built.add(p)
    return sorted(built)


def clean() -> None:
    MANIFEST.unlink(missing_ok=True)
    for p in _built_files():
        p.unlink()


def compiler_missing() -> str:
    """Why this machine cannot build the core ("" when it can)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return f"no Python headers ({header}; Debian: python3-dev)"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install mypy)"
    return ""


def build(workdir: Path) -> None:
    """Compile MODULES with mypyc into the package; the manifest last, so a failed build leaves none."""
    from mypyc.build import mypycify
    from setuptools import setup  # type: ignore[import-untyped, unused-ignore]  # typed from setuptools 71 on

    clean()
    hashes = _hashes()
    workdir.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(workdir / "build.log", "wb") as log:  # mypy's and the compiler's chatter, read on failure
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        os.chdir(PACKAGE_DIR.parent)  # module names are paths from `src`
        try:
            ext = mypycify([str(source_path(m).relative_to(PACKAGE_DIR.parent)) for m in MODULES],
                           opt_level="3", group_name=GROUP, target_dir=str(workdir / "c"))
            setup(name="gwpolicy-core", ext_modules=ext,
                  script_args=["-q", "build_ext", "--inplace", "--build-temp", str(workdir / "o"), "--build-lib", str(workdir / "lib"),
                               "--parallel", str(os.cpu_count() or 1)])
        finally:
            os.chdir(here)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    if hashes != _hashes():
        clean()
        raise RuntimeError("the sources changed during the build; build again")
    MANIFEST.write_text(json.dumps({"python": sys.implementation.cache_tag, "modules": list(MODULES),
                                    "sources": hashes}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if args else "status"
    if what == "status":
        print(describe())
        return 0
    if what == "clean":
        clean()
        return 0
    if what == "build":
        if "--if-stale" in args and not check():
            return 0
        missing = compiler_missing()
        if missing:
            print(f"gwpolicy.corebuild: the core runs interpreted: {missing}", file=sys.stderr)
            return 3
        workdir = PACKAGE_DIR.parent.parent / "build" / "mypyc"
        print("compiling the engine's core with mypyc (about a minute, again only when its sources change) ...",
              file=sys.stderr)
        try:
            build(workdir)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - mypy's type errors and the compiler's end in SystemExit
            clean()
            log = workdir / "build.log"
            tail = log.read_text(errors="replace").splitlines()[-20:] if log.is_file() else []
            print("\n".join(tail), file=sys.stderr)
            print(f"gwpolicy.corebuild: the build failed: {e} (the whole log: {log})", file=sys.stderr)
            return 1
        return 0
    print("usage: python -m gwpolicy.corebuild [status|build [--if-stale]|clean]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
