"""The benchmark's synthetic cluster covers what it claims, and its controller figures come from a
real run of `gwpolicy controller` in its own process: every edit handled in place and writing exactly
the one object whose status changes, and a restarted controller finding nothing to write."""

from __future__ import annotations

from collections import Counter

from gwpolicy.bench.controller import measure_controller
from gwpolicy.bench.generate import write_yaml
from gwpolicy.bench.run import report
from helpers import run_cli


def test_the_synthetic_cluster_has_every_level_and_some_conflicts(tmp_path):
    path = tmp_path / "c.yaml"
    write_yaml(400, str(path))
    objs = run_cli("get", "policies", "-f", str(path), "-A", "-o", "json").json()["items"]
    targets = Counter((t.get("kind"), "sectionName" in t) for o in objs for t in o["spec"]["targetRefs"])
    for level in [("GatewayClass", False), ("Namespace", False), ("Gateway", False), ("Gateway", True),
                  ("HTTPRoute", False), ("HTTPRoute", True), ("Service", False)]:
        assert targets[level] > 0, level
    status = run_cli("status", "-f", str(path), "-o", "json").json()["items"]
    reasons = Counter(c["reason"] for s in status for a in (s["status"].get("ancestors") or [])
                      for c in a["conditions"])
    assert reasons["Accepted"] > 0 and reasons["Conflicted"] > 0
    eff = run_cli("effective", "-f", str(path), "-o", "json").json()["items"]
    stanzas = {src["stanza"] for e in eff for src in e["sources"]}
    assert {"defaults", "overrides"} <= stanzas  # and "direct"/"object" from the Direct and None kinds


def test_controller_figures_come_from_edits_handled_in_place(tmp_path):
    out = measure_controller(60, str(tmp_path), timeout=120)
    assert out["initial_writes"] > 60 and out["first_status_s"] > 0
    for edit in ("policy_edit", "route_edit", "namespace_policy_edit"):
        assert out[edit]["path"] == "incremental", edit
        assert out[edit]["writes"] == 1 == out[edit]["controller_writes"], (edit, out[edit])
    # the controller's own process, read from its /metrics: one full analysis, its memory its own
    assert out["controller"]["full_analyses"] == 1 and out["controller"]["peak_rss_mb"] > 20
    assert out["sandbox"]["peak_rss_mb"] > 20 and out["sandbox"]["cpu_s"] > 0
    # a second controller on the cluster with status: one full analysis, nothing left to write
    assert out["restart"]["full_analyses"] == 1 and out["restart"]["writes"] == 0, out["restart"]
    text = report([], [out])
    assert "controller peak RSS MB" in text and "sandbox peak RSS MB" in text
    assert "a second controller process started on the cluster" in text
    assert "every edit handled in place (incremental)" in text
