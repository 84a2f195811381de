"""Golden files (tests/golden/, one folder per layer): an output compared with the one kept, or rewritten.

`./dev test --update-golden` (GWPOLICY_UPDATE_GOLDEN=1) writes what the code gives now; read `git diff`
after it, since that is the change a user will see. Otherwise a difference fails with a unified diff
(the kept file first, then what the code gives now), one for each file that differs.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = bool(os.environ.get("GWPOLICY_UPDATE_GOLDEN"))
HOW = "`./dev test --update-golden` rewrites it after an intended change; then read `git diff`"


def _name(path: Path) -> str:
    return str(path.relative_to(GOLDEN.parent.parent)) if path.is_relative_to(GOLDEN.parent.parent) else str(path)


def _diff(path: Path, want: str, got: str) -> str:
    return "".join(difflib.unified_diff(want.splitlines(keepends=True), got.splitlines(keepends=True),
                                        f"{_name(path)} (kept)", f"{_name(path)} (now)"))


def check(path: Path, got: str) -> None:
    """`got` is the text kept in `path`."""
    check_tree(path.parent, {path.name: got}, whole=False)


def check_tree(directory: Path, files: dict[str, str], whole: bool = True) -> None:
    """`files` (relative name -> text) are the files kept under `directory`; `whole`: and no others."""
    kept = {str(p.relative_to(directory)): p for p in directory.rglob("*") if p.is_file()} if directory.is_dir() else {}
    if not whole:
        kept = {name: p for name, p in kept.items() if name in files}
    if UPDATE:
        for name, p in kept.items():
            if name not in files:
                p.unlink()
        for name, text in files.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text)
        return
    problems = [f"{_name(directory / name)} is missing" for name in sorted(set(files) - set(kept))]
    problems += [f"{_name(kept[name])} is no longer written" for name in sorted(set(kept) - set(files))]
    problems += [_diff(kept[name], kept[name].read_text(), files[name]) for name in sorted(set(files) & set(kept))
                 if kept[name].read_text() != files[name]]
    if problems:
        pytest.fail(f"golden output differs ({HOW}):\n" + "\n".join(problems), pytrace=False)
