"""The engine scenarios for mesh paths (tests/data/mesh-scenarios, format and rules in its README).

A scenario marked `pending` is skipped with its reason; the others run through the CLI's JSON like
the shared scenarios (tests/engine/test_conformance.py), plus the README's extensions: `consumer` on an
effective expectation and `meshStatus`. Every scenario, pending or not, must name only objects
of its own input, so the data cannot drift from what it describes.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gwpolicy.engine.refs import parse_ref
from helpers import NOW, run_cli, write_manifests
from test_conformance import _ref_matches, _source_text, check_scenario

DIR = Path(__file__).resolve().parents[1] / "data" / "mesh-scenarios"
SCENARIOS = sorted(DIR.glob("*.yaml"))
MESH_CONTROLLER = "gwpolicy.io/mesh-controller"
CLUSTER_SCOPED = {"Namespace", "XMesh", "ExternalService", "GatewayClass"}


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


def on_consumer_path(item: dict[str, Any], consumer: str) -> bool:
    """Is the item's path a mesh path of requests from `consumer` ("*": any other namespace)?"""
    path = item["path"]
    return (len(path) >= 2 and path[0].get("kind") == "XMesh" and path[1].get("kind") == "Namespace"
            and path[1].get("name") == consumer)


def effective_problems(items: list[dict[str, Any]], expectations: list[dict[str, Any]]) -> list[str]:
    """The README's `consumer` expectations against `gwpolicy effective -o json` items."""
    problems = []
    for exp in expectations:
        found = [i for i in items if _ref_matches(i["target"], exp["target"]) and i["policyKind"]["kind"] == exp["policyKind"]
                 and on_consumer_path(i, exp["consumer"])
                 and ("via" not in exp or any(_ref_matches(level, exp["via"]) for level in i["path"]))]
        label = f"effective {exp['policyKind']} of {exp['target']} from {exp['consumer']}"
        if not found and exp["spec"] != {}:
            problems.append(f"{label}: no item; want spec {exp['spec']}")
        for item in found:
            if item["spec"] != exp["spec"]:
                problems.append(f"{label}: spec {item['spec']}, want {exp['spec']}")
            got = {s["field"]: _source_text(s) for s in item["sources"]}
            for field, want in (exp.get("sources") or {}).items():
                if got.get(field) != want:
                    problems.append(f"{label}: source of {field} is {got.get(field)!r}, want {want!r}")
    return problems


def _conditions_problems(label: str, want: dict[str, str], conditions: list[dict[str, Any]]) -> list[str]:
    out = []
    for ctype, status_reason in want.items():
        status, reason = status_reason.split("/", 1)
        got = next((c for c in conditions if c.get("type") == ctype), None)
        if got is None or (got.get("status"), got.get("reason")) != (status, reason):
            out.append(f"{label}: {ctype} is {None if got is None else got.get('status')}/"
                       f"{None if got is None else got.get('reason')}, want {status_reason}")
    return out


def mesh_status_problems(items: list[dict[str, Any]], expectations: list[dict[str, Any]]) -> list[str]:
    """The README's `meshStatus` expectations against a StatusList of the mesh controller."""
    def key(o: dict[str, Any]) -> str:
        return f"{o['kind']}/{o['namespace']}/{o['name']}" if o.get("namespace") else f"{o['kind']}/{o['name']}"

    by_object = {key(i["object"]): i for i in items}
    problems = []
    for exp in expectations:
        if "route" in exp:
            item = by_object.get(exp["route"])
            want = parse_ref(exp["parentRef"])
            parents = [p for p in ((item or {}).get("status") or {}).get("parents") or []
                       if p.get("controllerName") == MESH_CONTROLLER and (p["parentRef"].get("group") or "") == ""
                       and p["parentRef"].get("kind") == "Service" and p["parentRef"].get("name") == want.name
                       and p["parentRef"].get("namespace") == want.namespace
                       and (want.section is None or p["parentRef"].get("sectionName") == want.section)]
            label = f"{exp['route']} parent {exp['parentRef']}"
            if not parents:
                problems.append(f"{label}: no status.parents entry of {MESH_CONTROLLER}")
            for p in parents:
                problems += _conditions_problems(label, exp["conditions"], p.get("conditions") or [])
        else:
            item = by_object.get(exp["object"])
            problems += _conditions_problems(exp["object"], exp["conditions"],
                                             ((item or {}).get("status") or {}).get("conditions") or [])
    return problems


def check_mesh_scenario(path: Path, tmp_path: Path) -> list[str]:
    scenario = _load(path)
    plain = copy.deepcopy(scenario)
    expect = plain.setdefault("expect", {})
    mesh_effective = [e for e in expect.get("effective") or [] if "consumer" in e]
    expect["effective"] = [e for e in expect.get("effective") or [] if "consumer" not in e]
    mesh_status = expect.pop("meshStatus", None) or []
    plain_file = tmp_path / "plain-scenario.yaml"
    plain_file.write_text(yaml.safe_dump(plain))
    problems = check_scenario(plain_file, tmp_path)
    manifests = write_manifests(tmp_path, scenario["manifests"], "mesh-manifests.yaml")
    if mesh_effective:
        run = run_cli("effective", "-f", str(manifests), "-o", "json", "--now", NOW)
        problems += [f"gwpolicy effective exited {run.code}: {run.err}"] if run.code else \
            effective_problems(run.json()["items"], mesh_effective)
    if mesh_status:
        run = run_cli("mesh", "status", "-f", str(manifests), "-o", "json", "--now", NOW)
        problems += [f"gwpolicy mesh status exited {run.code}: {run.err}"] if run.code else \
            mesh_status_problems(run.json()["items"], mesh_status)
    return problems


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_mesh_scenario(path: Path, tmp_path: Path) -> None:
    scenario = _load(path)
    if scenario.get("pending"):
        pytest.skip(f"pending: {scenario['pending']}")
    problems = check_mesh_scenario(path, tmp_path)
    assert not problems, f"scenario {path.relative_to(DIR.parent.parent)}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------------
# the data itself, checked now for every scenario


def _objects(scenario: dict[str, Any]) -> set[str]:
    """Every object the input declares (`Kind/ns/name`, `Kind/name`), the Namespaces its objects
    live in, their named sections, and what the mesh rules name without an object."""
    out = {"Namespace/*"}
    for m in scenario["manifests"]:
        kind, md = m["kind"], m["metadata"]
        ns = md.get("namespace")
        ref = f"{kind}/{ns}/{md['name']}" if ns and kind not in CLUSTER_SCOPED else f"{kind}/{md['name']}"
        out.add(ref)
        if ns:
            out.add(f"Namespace/{ns}")
        spec = m.get("spec") or {}
        for section in [p.get("name") for p in spec.get("ports") or []] + [r.get("name") for r in spec.get("rules") or []]:
            if section:
                out.add(f"{ref}#{section}")
        for t in [spec.get("targetRef")] + list(spec.get("targetRefs") or []):
            if t and t.get("kind") == "ExternalService":
                out.add(f"ExternalService/{t['name']}")
    return out


def _policy_ref(m: dict[str, Any]) -> str:
    md = m["metadata"]
    return f"{m['kind']}/{md['namespace']}/{md['name']}" if md.get("namespace") else f"{m['kind']}/{md['name']}"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_the_scenario_names_only_its_own_objects(path: Path) -> None:
    scenario = _load(path)
    assert scenario["name"] == path.stem
    assert scenario.get("pending") is None or isinstance(scenario["pending"], str) and scenario["pending"]
    rules = set(re.findall(r"\*\*(M\d+) ", (DIR / "README.md").read_text()))
    assert all(r.startswith("S") or r in rules for r in scenario["rules"]), scenario["rules"]
    objects = _objects(scenario)
    policies = {_policy_ref(m) for m in scenario["manifests"] if m["kind"].endswith("Policy")}
    namespaces = {o.split("/")[1] for o in objects if o.startswith("Namespace/")}
    expect = scenario.get("expect") or {}
    for e in expect.get("effective") or []:
        assert e["target"] in objects, e
        assert e.get("via") is None or e["via"] in objects, e
        assert e.get("consumer") is None or e["consumer"] in namespaces, e
        for source in (e.get("sources") or {}).values():
            assert source == "object" or source.split(" ", 1)[1] in policies, source
    for s in expect.get("status") or []:
        assert s["policy"] in policies and (s.get("ancestor") is None or s["ancestor"] in objects), s
    for a in expect.get("affected") or []:
        assert a["object"] in objects, a
    routes = {_policy_ref(m): m for m in scenario["manifests"] if m["kind"] == "HTTPRoute"}
    for m in expect.get("meshStatus") or []:
        if "route" in m:  # the parentRef is one the route names (it may name a missing Service)
            route = routes[m["route"]]
            named = {f"Service/{p.get('namespace', route['metadata']['namespace'])}/{p['name']}"
                     for p in route["spec"]["parentRefs"] if p.get("kind") == "Service"}
            assert m["parentRef"].split("#")[0] in named, m
        else:
            assert m["object"] in objects, m
    whatif = scenario.get("whatif") or {}
    for c in whatif.get("effective") or []:
        assert c["target"] in objects, c
    for c in whatif.get("status") or []:
        assert c["object"] in policies and c["ancestor"] in objects, c
    assert whatif.get("delete") is None or whatif["delete"] in objects


def test_every_scenario_runs() -> None:
    # the engine builds mesh paths: a scenario marked pending again would silently test nothing
    pending = [p.stem for p in SCENARIOS if _load(p).get("pending")]
    assert len(SCENARIOS) >= 13 and not pending, pending


def test_the_consumer_filter_and_mesh_status_report_what_differs() -> None:
    # a runner that cannot fail proves nothing: synthetic output against the extensions
    def level(kind: str, name: str, ns: str | None = None) -> dict[str, Any]:
        return {"group": "", "kind": kind, "name": name, **({"namespace": ns} if ns else {})}

    item = {"target": level("Service", "s", "b"), "policyKind": {"group": "example.io", "kind": "TimeoutPolicy"},
            "path": [level("XMesh", "mesh"), level("Namespace", "a"), level("Namespace", "b"), level("Service", "s", "b")],
            "spec": {"timeout": "1s"},
            "sources": [{"field": "timeout", "stanza": "defaults",
                         "policy": {"group": "example.io", "kind": "TimeoutPolicy", "namespace": "a", "name": "p"}}]}
    north_south = {**item, "path": [level("Namespace", "a"), level("Service", "s", "b")], "spec": {"timeout": "9s"}}
    exp = {"target": "Service/b/s", "policyKind": "TimeoutPolicy", "consumer": "a", "spec": {"timeout": "1s"},
           "sources": {"timeout": "defaults TimeoutPolicy/a/p"}}
    assert effective_problems([item, north_south], [exp]) == []
    assert effective_problems([item], [{**exp, "spec": {"timeout": "2s"}}])
    assert effective_problems([item], [{**exp, "sources": {"timeout": "defaults TimeoutPolicy/b/q"}}])
    assert effective_problems([item], [{**exp, "consumer": "*"}])  # no item from "*"
    assert effective_problems([item], [{**exp, "consumer": "*", "spec": {}}]) == []

    status = {"object": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "a", "name": "rc"},
              "status": {"parents": [{"parentRef": {"group": "", "kind": "Service", "namespace": "b", "name": "s"},
                                      "controllerName": MESH_CONTROLLER,
                                      "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}]}}
    want = {"route": "HTTPRoute/a/rc", "parentRef": "Service/b/s", "conditions": {"Accepted": "True/Accepted"}}
    assert mesh_status_problems([status], [want]) == []
    assert mesh_status_problems([status], [{**want, "conditions": {"Accepted": "False/NoMatchingParent"}}])
    assert mesh_status_problems([status], [{**want, "parentRef": "Service/b/other"}])
    other_controller = copy.deepcopy(status)
    other_controller["status"]["parents"][0]["controllerName"] = "example.net/mesh"
    assert mesh_status_problems([other_controller], [want])
