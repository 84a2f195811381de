"""Every shared conformance scenario (../shared/conformance, format in its README) through the CLI's JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gwpolicy.refs import parse_ref
from helpers import CONFORMANCE, NOW, needs_shared, run_cli, scenario_files, write_manifests

SCENARIOS = scenario_files()
#: the project's own corners, in the same format, beside the shared ones
PROJECT_SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("**/*.yaml"))
CONTROLLER = "gwpolicy.io/policy-controller"


@needs_shared
def test_the_shared_scenarios_are_there() -> None:
    # the runner must not pass by finding nothing: the suite ships 129 scenarios
    assert CONFORMANCE.is_dir(), f"{CONFORMANCE} is missing: CI needs ../shared beside the checkout"
    assert len(SCENARIOS) >= 129


def _ref_matches(ref_json: dict[str, Any], text: str) -> bool:
    want = parse_ref(text)
    return (ref_json.get("kind") == want.kind and ref_json.get("name") == want.name
            and (ref_json.get("namespace") or None) == want.namespace
            and (ref_json.get("sectionName") or None) == want.section)


def _source_text(src: dict[str, Any]) -> str:
    if src["stanza"] == "object":
        return "object"
    p = src["policy"]
    ref = f"{p['kind']}/{p['namespace']}/{p['name']}" if p.get("namespace") else f"{p['kind']}/{p['name']}"
    return f"{src['stanza']} {ref}"


def check_scenario(path: Path, tmp_path: Path) -> list[str]:
    """Differences between the scenario's expectations and the CLI output, in words."""
    scenario = yaml.safe_load(path.read_text())
    manifests = write_manifests(tmp_path, scenario["manifests"])
    expect = scenario.get("expect") or {}
    problems: list[str] = []
    eff = run_cli("effective", "-f", str(manifests), "-o", "json", "--now", NOW)
    st = run_cli("status", "-f", str(manifests), "-o", "json", "--now", NOW)
    for run in (eff, st):
        if run.code != 0:
            return [f"gwpolicy exited {run.code}: {run.err}"]
    items = eff.json()["items"]
    for exp in expect.get("effective") or []:
        found = [i for i in items if _ref_matches(i["target"], exp["target"])
                 and i["policyKind"]["kind"] == exp["policyKind"]
                 and ("via" not in exp or any(_ref_matches(level, exp["via"]) for level in i["path"]))]
        label = f"effective {exp['policyKind']} of {exp['target']}" + (f" via {exp['via']}" if "via" in exp else "")
        if not found:
            if exp.get("optional") or exp["spec"] == {}:
                continue
            problems.append(f"{label}: no item; want spec {exp['spec']}")
            continue
        for item in found:
            if item["spec"] != exp["spec"]:
                problems.append(f"{label}: spec {item['spec']}, want {exp['spec']} (path {[l['kind'] for l in item['path']]})")
            got_sources = {s["field"]: _source_text(s) for s in item["sources"]}
            for fieldname, want in (exp.get("sources") or {}).items():
                if got_sources.get(fieldname) != want:
                    problems.append(f"{label}: source of {fieldname} is {got_sources.get(fieldname)!r}, want {want!r}")
    status_items = st.json()["items"]
    by_object = {}
    for i in status_items:
        o = i["object"]
        key = f"{o['kind']}/{o['namespace']}/{o['name']}" if "namespace" in o else f"{o['kind']}/{o['name']}"
        by_object[key] = i
    for exp in expect.get("status") or []:
        item = by_object.get(exp["policy"])
        if item is None:
            problems.append(f"status of {exp['policy']}: no item")
            continue
        entries = [e for e in item["status"].get("ancestors", []) if e["controllerName"] == CONTROLLER
                   and ("ancestor" not in exp or _ref_matches(e["ancestorRef"], exp["ancestor"]))]
        if not entries:
            problems.append(f"status of {exp['policy']}: no ancestor entry of ours" +
                            (f" for {exp['ancestor']}" if "ancestor" in exp else ""))
        for e in entries:
            cond = next((c for c in e["conditions"] if c["type"] == "Accepted"), None)
            got = (cond or {}).get("status"), (cond or {}).get("reason")
            if got != (exp["accepted"], exp["reason"]):
                problems.append(f"status of {exp['policy']} on {e['ancestorRef']}: Accepted={got[0]}/{got[1]}, "
                                f"want {exp['accepted']}/{exp['reason']}")
    if "whatif" in scenario:  # a project extension: the changes `whatif` predicts, compared exactly
        problems += _check_whatif(scenario["whatif"], manifests, tmp_path)
    for exp in expect.get("affected") or []:
        item = by_object.get(exp["object"])
        got = _carries_breadcrumb(item, exp["policyKind"]) if item else False
        if got != exp["affected"]:
            problems.append(f"breadcrumb {exp['policyKind']} on {exp['object']}: {got}, want {exp['affected']}")
    return problems


def _check_whatif(whatif: dict[str, Any], manifests: Path, tmp_path: Path) -> list[str]:
    """`whatif: {apply: [objects] | delete: Kind/ns/name, effective: [...], status: [...]}`: each
    effective change as `{target, field, before, after}` (every path counted once), each status
    change as `{object, ancestor, before, after}` with `Status/Reason` conditions; both as sets."""
    args = ["whatif", "-f", str(manifests), "-o", "json", "--now", NOW]
    if "apply" in whatif:
        args += ["--apply", str(write_manifests(tmp_path, whatif["apply"], "apply.yaml"))]
    if "delete" in whatif:
        ref = parse_ref(whatif["delete"])
        args += ["--delete", f"{ref.kind}/{ref.name}"] + (["-n", ref.namespace] if ref.namespace else [])
    run = run_cli(*args)
    if run.code != 0:
        return [f"gwpolicy whatif exited {run.code}: {run.err}"]
    out = run.json()

    def ref_text(j: dict[str, Any]) -> str:
        base = f"{j['kind']}/{j['namespace']}/{j['name']}" if j.get("namespace") else f"{j['kind']}/{j['name']}"
        return base + (f"#{j['sectionName']}" if j.get("sectionName") else "")

    def cond(c: dict[str, Any] | None) -> str | None:
        return None if c is None else f"{c['status']}/{c['reason']}"

    got_eff = {(ref_text(c["target"]), c["field"], repr(c["before"]), repr(c["after"])) for c in out["effective"]}
    want_eff = {(c["target"], c["field"], repr(c.get("before")), repr(c.get("after"))) for c in whatif.get("effective") or []}
    got_st = {(ref_text(c["object"]), ref_text(c["ancestor"]), cond(c["before"]), cond(c["after"]))
              for c in out["status"] if not c.get("breadcrumb")}
    want_st = {(c["object"], c["ancestor"], c.get("before"), c.get("after")) for c in whatif.get("status") or []}
    problems = []
    for what, got, want in (("effective", got_eff, want_eff), ("status", got_st, want_st)):
        problems += [f"whatif {what}: unexpected change {g}" for g in sorted(got - want)]
        problems += [f"whatif {what}: missing change {w}" for w in sorted(want - got)]
    return problems


def _carries_breadcrumb(item: dict[str, Any], kind: str) -> bool:
    ctype = f"gwpolicy.io/{kind}Affected"
    status = item.get("status") or {}
    if any(c.get("type") == ctype for c in status.get("conditions") or []):
        return True
    for parent in status.get("parents") or []:
        if parent.get("controllerName") == CONTROLLER and any(c.get("type") == ctype for c in parent["conditions"]):
            return True
    return (item.get("annotations") or {}).get("gwpolicy.io/PolicyAffected") == "true" and not item["object"]["kind"].endswith(("Gateway", "GatewayClass"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path, tmp_path: Path) -> None:
    problems = check_scenario(path, tmp_path)
    assert not problems, f"scenario {path.relative_to(CONFORMANCE)}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", PROJECT_SCENARIOS, ids=[p.stem for p in PROJECT_SCENARIOS])
def test_project_scenario(path: Path, tmp_path: Path) -> None:
    problems = check_scenario(path, tmp_path)
    assert not problems, f"scenario tests/scenarios/{path.name}:\n  " + "\n  ".join(problems)


def test_the_project_scenarios_are_there() -> None:
    assert len(PROJECT_SCENARIOS) >= 7, PROJECT_SCENARIOS


@needs_shared
def test_the_runner_reports_a_wrong_expectation(tmp_path: Path) -> None:
    # a runner that cannot fail proves nothing: break one expectation of a real scenario
    original = CONFORMANCE / "seeds" / "seed-two-paths.yaml"
    scenario = yaml.safe_load(original.read_text())
    scenario["expect"]["effective"][0]["spec"] = {"retries": 99}
    scenario["expect"]["status"] = [{"policy": "RetryPolicy/default/a", "accepted": "False", "reason": "Conflicted"}]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(scenario))
    problems = check_scenario(broken, tmp_path)
    assert any("want spec" in p or "want {'retries': 99}" in p for p in problems), problems
    assert any("want False/Conflicted" in p for p in problems), problems
