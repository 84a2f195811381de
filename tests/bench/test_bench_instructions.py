"""`gwpolicy bench controller-inproc --instructions` counts what each edit executes under callgrind,
and the counts repeat from run to run; `--opcodes EDIT` says which functions and lines execute it.
The callgrind runs need valgrind (skipped where it is missing: about 20 s a run under valgrind, so
CI, which does not install it, skips them)."""

from __future__ import annotations

import json
import shutil

import pytest

from gwpolicy.bench import instructions
from gwpolicy.bench.controller_inproc import EDITS, main
from gwpolicy.bench.generate import write_yaml

NAMES = [name for name, _ in EDITS]
LEAVE = NAMES.index("Gateway: https hostname changed (its routes leave)")
POLICY = NAMES.index("policy edit (a route's RetryPolicy)")

needs_valgrind = pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("vgdb") is None,
                                    reason="valgrind is not installed (Debian: valgrind)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = tmp_path_factory.mktemp("cluster") / "c.yaml"
    write_yaml(30, str(path))
    return str(path)


@needs_valgrind
def test_counts_are_there_repeat_and_grow_with_the_work(cluster, tmp_path, capsys):
    out = tmp_path / "counts.json"
    assert main(["--cluster", cluster, "--instructions", "--json", str(out), "--keep-dumps", str(tmp_path / "dumps")]) == 0
    printed = capsys.readouterr().out
    first = json.loads(out.read_text())[0]
    second = instructions.measure(cluster)
    assert [e["edit"] for e in first["edits"]] == NAMES
    for a, b in [(first["full_analysis_ir"], second["full_analysis_ir"]), (first["toggle_ir"], second["toggle_ir"])] + \
            [(x["ir"], y["ir"]) for x, y in zip(first["edits"], second["edits"])]:
        # the same work, the same count: to 0.1%, or to 60k instructions, the most that where a window
        # closes can move (vgdb's command lands within valgrind's poll, 5,000 basic blocks, when the
        # child is not yet blocked waiting for it: seen on a loaded machine, 5k of a 94k window)
        assert abs(a - b) <= max(0.001 * a, 60_000), (a, b)
    ir = [e["ir"] for e in first["edits"]]
    # each edit is counted, not only the toggles (the compiled core's smallest edit at 30 routes is
    # about twice the toggles' own count)
    assert all(n > 1.5 * first["toggle_ir"] for n in ir), (first["toggle_ir"], ir)
    # the edit that moves every route of a listener does several times the work of one policy's edit
    assert ir[LEAVE] > 3 * ir[POLICY], ir
    assert first["full_analysis_ir"] > max(ir)
    assert all(e["in_place"] for e in first["edits"])
    # a row per edit, in millions, as the timed table has ms
    assert f"| {NAMES[LEAVE]} | {ir[LEAVE] / 1e6:,.2f}M | yes |" in printed
    # the dumps are left for callgrind_annotate: one per window (the toggles, the analysis, the edits)
    assert len(list((tmp_path / "dumps").glob("callgrind.out.*.*"))) == 2 + len(NAMES)


def test_without_valgrind_a_clear_error_names_the_package(cluster, monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    assert main(["--cluster", cluster, "--instructions"]) == 2
    err = capsys.readouterr().err
    assert "valgrind" in err and "apt-get install valgrind" in err and "Traceback" not in err


def test_opcodes_of_one_edit_repeat_and_name_the_functions(cluster, capsys):
    assert main(["--cluster", cluster, "--opcodes", "routes leave", "--top", "5"]) == 0
    printed = capsys.readouterr().out
    once = instructions.opcodes(cluster, LEAVE, 5)
    again = instructions.opcodes(cluster, LEAVE, 5)
    assert once["edit"] == NAMES[LEAVE] and once["opcodes"] == again["opcodes"] > 0
    assert once["functions"] == again["functions"] and len(once["functions"]) == 5
    assert all(f["file"].startswith("gwpolicy/") or f["file"].endswith(".py") for f in once["functions"])
    assert any(f["file"].startswith("gwpolicy/") for f in once["functions"])
    assert f"{once['opcodes']:,} bytecodes executed" in printed
    # the policy edit touches one route: fewer bytecodes than the edit that moves them all
    assert instructions.opcodes(cluster, POLICY, 5)["opcodes"] * 3 < once["opcodes"]


def test_count_opcodes_counts_each_bytecode_executed():
    def loop(n):
        total = 0
        for i in range(n):
            total += i
        return total

    small, _, a = instructions.count_opcodes(lambda: loop(10))
    large, lines, b = instructions.count_opcodes(lambda: loop(110))
    assert (a, b) == (45, sum(range(110)))
    key = next(k for k in large if k[1] == "loop")
    per_iteration = (large[key] - small[key]) / 100
    assert per_iteration == int(per_iteration) and 2 <= per_iteration <= 10  # the same few bytecodes each turn
    assert sum(n for (f, _), n in lines.items() if f == key[0]) >= large[key]


@pytest.mark.parametrize("wanted, message", [
    ("nosuch", "no edit's name holds it"),
    ("Service", "edits' names hold it"),
    ("99", "numbered 0 to"),
])
def test_opcodes_names_the_edit_it_cannot_pick(cluster, wanted, message, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--cluster", cluster, "--opcodes", wanted])
    assert exit.value.code != 0
    err = capsys.readouterr().err
    assert message in err and ("0: policy edit" in err or "numbered" in err)  # what to give instead
    assert "Traceback" not in err


def test_verify_goes_with_the_timed_run_only(cluster, capsys):
    with pytest.raises(SystemExit):
        main(["--cluster", cluster, "--instructions", "--verify"])
    assert "--verify goes with the timed run only" in capsys.readouterr().err


@needs_valgrind
def test_bench_run_counts_the_engines_phases(cluster, tmp_path, capsys):
    from gwpolicy.bench.run import main as bench_main

    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copy(cluster, workdir / "cluster-30.yaml")
    out = tmp_path / "engine.json"
    assert bench_main(["run", "--sizes", "30", "--workdir", str(workdir), "--instructions", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["engine_instructions"][0]
    assert row["routes"] == 30 and row["items"] > 30 and row["status_items"] > 0
    # each phase counted, and each more than the toggles alone
    assert all(row[k] > 10 * row["toggle_ir"] for k in ("load_ir", "analyse_ir", "output_ir", "status_ir")), row
    assert f"| 30 | {row['objects']:,} | {row['load_ir'] / 1e6:,.2f}M |" in capsys.readouterr().out


def test_bench_run_instructions_counts_the_engine_only(tmp_path, capsys):
    from gwpolicy.bench.run import main as bench_main

    assert bench_main(["run", "--sizes", "30", "--workdir", str(tmp_path), "--instructions", "--controller"]) == 2
    assert "controller-inproc --instructions" in capsys.readouterr().err


@needs_valgrind
def test_a_failing_vgdb_is_a_clear_error(cluster, tmp_path, monkeypatch, capfd):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "vgdb").write_text("#!/bin/sh\necho 'vgdb error: no FIFO found matching pid' >&2\nexit 1\n")
    (fake / "vgdb").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{__import__('os').environ['PATH']}")
    assert main(["--cluster", cluster, "--instructions"]) == 1
    err = capfd.readouterr().err
    assert "vgdb zero -c instrumentation on failed: vgdb error: no FIFO found matching pid" in err
    assert "the run under callgrind failed (exit 1)" in err and "Traceback" not in err
