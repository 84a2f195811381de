"""The in-process controller benchmark runs every kind of edit, each in place, and the analysis it
leaves equals a full analysis of the same objects."""

from __future__ import annotations

from gwpolicy.bench.controller_inproc import EDITS, measure, table
from gwpolicy.bench.generate import write_yaml


def test_every_edit_of_the_benchmark_runs_in_place(tmp_path):
    path = tmp_path / "c.yaml"
    write_yaml(400, str(path))
    out = measure(str(path), verify=True)
    assert out["routes"] == 400 and out["full_analysis_s"] > 0 and out["peak_rss_mb"] > 0
    assert [e["edit"] for e in out["edits"]] == [name for name, _ in EDITS]
    assert [e["edit"] for e in out["edits"] if not e["in_place"]] == []
    checks = {e["edit"]: e["checks"] for e in out["edits"]}
    assert checks["Gateway: https hostname changed (its routes leave)"] > 200  # its routes, their Services
    assert all(n >= 1 for n in checks.values())  # the edited object itself at least
    assert out["verified"] is True
    assert "| namespace-wide policy edit |" in table([out])


def test_the_verify_check_is_not_in_the_models_peak_rss(tmp_path, monkeypatch):
    """--verify's full analysis and encoding (7.5 GB at 20k routes) ran in the benchmark's own
    process, and its peak RSS was reported as the model's."""
    from gwpolicy.bench import controller_inproc

    path = tmp_path / "c.yaml"
    write_yaml(100, str(path))
    same = controller_inproc._same_as_full
    before = controller_inproc._peak_mb()  # this process' peak so far (earlier tests ran in it)
    ballast_mb = int(before) + 400  # more than this process ever held, whatever ran in it before

    def heavy(model):  # a check that holds that much at its peak
        ballast = bytearray(ballast_mb * 1024 * 1024)
        ballast[::4096] = b"x" * len(ballast[::4096])  # touched: resident
        return same(model)

    monkeypatch.setattr(controller_inproc, "_same_as_full", heavy)
    out = controller_inproc.child(str(path), verify=True)
    assert out["verified"] is True and out["verified_with_status"] is True
    assert out["verify_peak_rss_mb"] > ballast_mb
    assert out["peak_rss_with_status_mb"] < before + 200, out  # 100 routes: the model adds little
