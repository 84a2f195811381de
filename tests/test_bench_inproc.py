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
