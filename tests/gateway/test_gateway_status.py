"""gateway/facts.py and gateway/status.py against the expectations of every conformance case (../shared/gateway-conformance),
without a cluster: the base and the case's objects are analysed, the status computed is put on the
objects, and the suite's own comparisons (tests/gwconformance.py) must accept it, after each step too.
Then properties: idempotence, others' entries kept, Programmed only once NGINX runs the object.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

import gwconformance as gc
from gwpolicy.analysis import analyse
from gwpolicy.gateway import backendtls
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER, dataplane_objects, gateway_facts
from gwpolicy.gateway.status import POLICY_KINDS_ANNOTATION, Programming, all_desired, class_annotations, policy_status
from gwpolicy.kinds import split_api_version
from gwpolicy.model import build_index

NOW = "2026-12-01T00:00:00Z"
BASE = gc.load_base()
GENERATED, _ = gc.generated_objects(BASE)
#: status entries this module does not judge, with why
NOT_OURS: dict[str, str] = {}


def _key(o: dict[str, Any]) -> tuple[str, str, str, str]:
    g, _ = split_api_version(o["apiVersion"])
    return (g, o["kind"], (o.get("metadata") or {}).get("namespace") or "", o["metadata"]["name"])


class World:
    """Objects as an API server would hold them: a generation per object, bumped on spec changes."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects: dict[tuple, dict[str, Any]] = {}
        for o in objects:
            self.put(o)

    def put(self, o: dict[str, Any]) -> None:
        o = copy.deepcopy(o)
        k = _key(o)
        old = self.objects.get(k)
        meta = o.setdefault("metadata", {})
        if meta.get("namespace") is None and o["kind"] not in ("Namespace", "GatewayClass"):
            meta["namespace"] = "default"
        gen = (old or {}).get("metadata", {}).get("generation", 0)
        if old is None or old.get("spec") != o.get("spec"):
            gen += 1
        meta["generation"] = gen
        if old is not None and "status" in old:
            o["status"] = old["status"]
        self.objects[k] = o

    def find(self, kind: str, ns: str | None, name: str) -> dict[str, Any] | None:
        for (g, k, n, nm), o in self.objects.items():
            if k == kind and nm == name and (ns is None or n == ns or (kind in ("GatewayClass", "Namespace") and n == "")):
                return o
        return None

    def reconcile(self, programmed: bool = True) -> None:
        index = build_index(list(self.objects.values()))
        facts = gateway_facts(index, GATEWAY_CONTROLLER)
        prog = Programming()
        if programmed:
            for i, ref in enumerate(sorted(facts.gateways)):
                obj = index.by_ref[ref]
                prog.generations[ref] = obj.generation
                prog.addresses[ref] = [f"127.0.20.{i + 1}"]
        desired = all_desired(index, facts, prog, NOW)
        analysis = analyse(dataplane_objects(list(self.objects.values()), facts))
        for ref, conds in backendtls.all_conditions(analysis).items():  # POL's rules, our ancestors
            desired[ref] = policy_status(index.by_ref[ref], conds, facts, NOW)
        for ref, status in desired.items():
            obj = index.by_ref[ref]
            self.objects[_key(obj.raw)]["status"] = status


def _resolve(value: Any, world: World) -> Any:
    if isinstance(value, str):
        m = re.fullmatch(r"\$\{configMap:([^/]+)/([^/]+)/([^}]+)\}", value)
        if m:
            return (world.find("ConfigMap", m.group(1), m.group(2)) or {}).get("data", {}).get(m.group(3))
        return value
    if isinstance(value, dict):
        return {k: _resolve(v, world) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, world) for v in value]
    return value


def _check(entries: list[dict[str, Any]], world: World) -> list[str]:
    failures = []
    for e in entries:
        if e["object"]["kind"] in NOT_OURS:
            continue
        why = gc.check_status(e, world.find)
        if why:
            failures.append(why)
    return failures


#: cases whose status this gateway does not give, and why (docs/gateway.md, "Conformance")
STATUS_GAPS: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=STATUS_GAPS[n], strict=True))
                                  if n in STATUS_GAPS else n for n in gc.case_names()])
def test_status_of_case(name):
    case = gc.load_case(name)
    world = World(BASE["manifests"] + GENERATED + case.get("manifests", []))
    world.reconcile()
    failures = _check(case.get("status") or [], world)
    for g in case.get("namespacesReady") or []:
        for o in world.objects.values():
            if o["kind"] == "Gateway" and o["metadata"]["namespace"] == g and not gc.skip_readiness(o):
                why = gc.gateway_ready(o)
                if why:
                    failures.append("namespacesReady: " + why)
    for i, step in enumerate(case.get("steps") or []):
        before = {}
        for g in step.get("generationChanged") or []:
            before[(g["kind"], g["name"])] = world.find(g["kind"], g.get("namespace"), g["name"])["metadata"]["generation"]
        for action in step.get("actions") or []:
            if "patch" in action:
                o = action["patch"]["object"]
                cur = world.find(o["kind"], o.get("namespace"), o["name"])
                world.put(gc.merge_patch(cur, _resolve(action["patch"]["mergePatch"], world)))
            if "delete" in action:
                d = action["delete"]
                cur = world.find(d["kind"], d.get("namespace"), d["name"])
                if cur is not None:
                    del world.objects[_key(cur)]
            for o in action.get("apply") or []:
                world.put(_resolve(o, world))
        world.reconcile()
        failures += [f"step {i}: {f}" for f in _check(step.get("status") or [], world)]
        for g in step.get("generationChanged") or []:
            now = world.find(g["kind"], g.get("namespace"), g["name"])["metadata"]["generation"]
            if now == before[(g["kind"], g["name"])]:
                failures.append(f"step {i}: generation of {g['name']} did not change")
    assert not failures, "\n".join(failures)


def _world_with_route(extra_parent: dict[str, Any] | None = None) -> World:
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": "r", "namespace": "gateway-conformance-infra"},
             "spec": {"parentRefs": [{"name": "same-namespace"}, {"name": "someone-elses"}],
                      "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]}}
    if extra_parent is not None:
        route["status"] = {"parents": [extra_parent]}
    other_class = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "other"},
                   "spec": {"controllerName": "example.com/other"}}
    other_gw = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "someone-elses", "namespace": "gateway-conformance-infra"},
                "spec": {"gatewayClassName": "other", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
                "status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "Theirs"}]}}
    return World(BASE["manifests"] + GENERATED + [route, other_class, other_gw])


def test_other_controllers_route_entries_and_objects_are_left_as_they_are():
    theirs = {"parentRef": {"name": "someone-elses", "namespace": "gateway-conformance-infra"},
              "controllerName": "example.com/other",
              "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "observedGeneration": 1}]}
    world = _world_with_route(copy.deepcopy(theirs))
    world.reconcile()
    route = world.find("HTTPRoute", "gateway-conformance-infra", "r")
    parents = route["status"]["parents"]
    assert parents[0] == theirs  # untouched, and still first
    ours = [p for p in parents if p["controllerName"] == GATEWAY_CONTROLLER]
    assert [p["parentRef"]["name"] for p in ours] == ["same-namespace"]  # nothing said about their Gateway
    other_gw = world.find("Gateway", "gateway-conformance-infra", "someone-elses")
    assert other_gw["status"] == {"conditions": [{"type": "Accepted", "status": "True", "reason": "Theirs"}]}
    assert "status" not in world.find("GatewayClass", None, "other")


def test_status_is_idempotent_and_keeps_transition_times():
    world = _world_with_route()
    world.reconcile()
    first = copy.deepcopy(world.objects)
    index = build_index(list(world.objects.values()))
    facts = gateway_facts(index)
    prog = Programming({ref: index.by_ref[ref].generation for ref in facts.gateways},
                       addresses={ref: [f"127.0.20.{i + 1}"] for i, ref in enumerate(sorted(facts.gateways))})
    again = all_desired(index, facts, prog, "2030-01-01T00:00:00Z")
    for ref, status in again.items():
        assert status == first[_key(index.by_ref[ref].raw)]["status"], ref


def test_programmed_only_once_nginx_runs_the_gateway_and_a_failure_says_why():
    world = World(BASE["manifests"] + GENERATED)
    world.reconcile(programmed=False)
    gw = world.find("Gateway", "gateway-conformance-infra", "same-namespace")
    prog = {c["type"]: c for c in gw["status"]["conditions"]}["Programmed"]
    assert prog["status"] == "False"
    assert all({c["type"]: c for c in l["conditions"]}["Programmed"]["status"] == "False" for l in gw["status"]["listeners"])
    index = build_index(list(world.objects.values()))
    facts = gateway_facts(index)
    ref = next(r for r in facts.gateways if r.name == "same-namespace")
    failed = Programming({}, error="bind() to 127.0.20.1:80 failed (98: Address already in use)", addresses={ref: ["127.0.20.1"]})
    st = all_desired(index, facts, failed, NOW)[ref]
    prog = {c["type"]: c for c in st["conditions"]}["Programmed"]
    assert (prog["status"], prog["reason"]) == ("False", "Invalid") and "Address already in use" in prog["message"]
    # an older generation running is not this one
    old = Programming({ref: index.by_ref[ref].generation - 1}, addresses={ref: ["127.0.20.1"]})
    st = all_desired(index, facts, old, NOW)[ref]
    assert {c["type"]: c for c in st["conditions"]}["Programmed"]["status"] == "False"


def test_gatewayclass_is_accepted_lists_features_and_policy_kinds():
    world = World(BASE["manifests"][:1])
    world.reconcile()
    cls = world.find("GatewayClass", None, "gwpolicy")
    conds = {c["type"]: c for c in cls["status"]["conditions"]}
    assert conds["Accepted"]["status"] == "True" and conds["SupportedVersion"]["status"] == "True"
    names = [f["name"] for f in cls["status"]["supportedFeatures"]]
    assert names == sorted(names) and "HTTPRoute" in names
    index = build_index(list(world.objects.values()))
    ann = class_annotations(index.by_ref[next(iter(gateway_facts(index).classes))], ["TimeoutPolicy.gwpolicy.io", "RetryPolicy.gwpolicy.io"])
    assert ann[POLICY_KINDS_ANNOTATION] == "RetryPolicy.gwpolicy.io,TimeoutPolicy.gwpolicy.io"


def test_route_without_crd_defaults_gets_full_parent_refs():
    """A server that applies no CRD defaults: parentRef group/kind/namespace are filled in status."""
    world = _world_with_route()
    world.reconcile()
    route = world.find("HTTPRoute", "gateway-conformance-infra", "r")
    ours = [p for p in route["status"]["parents"] if p["controllerName"] == GATEWAY_CONTROLLER][0]
    assert ours["parentRef"] == {"name": "same-namespace", "group": "gateway.networking.k8s.io", "kind": "Gateway",
                                 "namespace": "gateway-conformance-infra"}


def test_status_is_merged_into_the_newest_copy_not_the_one_analysed():
    """Another controller writes between our analysis and our write: what it wrote survives."""
    from gwpolicy.gateway.status import desired_status
    from gwpolicy.model import Obj

    world = _world_with_route()
    world.reconcile()
    index = build_index(list(world.objects.values()))
    facts = gateway_facts(index)
    prog = Programming({r: index.by_ref[r].generation for r in facts.gateways},
                       addresses={r: ["127.0.20.1"] for r in facts.gateways})
    gw_ref = next(r for r in facts.gateways if r.name == "same-namespace")
    route_ref = next(r for r in facts.routes if r.name == "r")
    for ref, extra in ((gw_ref, {"conditions": [{"type": "gwpolicy.io/TimeoutPolicyAffected", "status": "True"}]}),
                       (route_ref, {"parents": [{"controllerName": "example.com/late", "parentRef": {"name": "x"}}]})):
        newer = copy.deepcopy(index.by_ref[ref].raw)
        key, item = next(iter(extra.items()))
        newer["status"][key] = newer["status"].get(key, []) + item
        st = desired_status(Obj(newer, ref, "v1", "api"), facts, prog, NOW)
        assert item[0] in st[key], (ref, st[key])


def test_keep_in_place_leaves_every_entry_where_it_was():
    from gwpolicy.gateway.status import keep_in_place

    ours_old = {"controllerName": "us", "ancestorRef": {"name": "a"}, "conditions": [{"reason": "Old"}]}
    theirs = {"controllerName": "them", "ancestorRef": {"name": "a"}}
    ours_new = dict(ours_old, conditions=[{"reason": "New"}])
    added = {"controllerName": "us", "ancestorRef": {"name": "b"}}
    # the engine's order puts others first; the object has ours first: ours stays first
    assert keep_in_place([ours_old, theirs], [theirs, ours_new, added], "us", "ancestorRef") == [ours_new, theirs, added]
    # an entry of ours that is no longer computed goes; others' stay
    assert keep_in_place([ours_old, theirs], [theirs], "us", "ancestorRef") == [theirs]


def test_routes_of_a_gateway_that_is_not_accepted_are_not_accepted_either():
    gw = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
          "metadata": {"name": "params", "namespace": "gateway-conformance-infra"},
          "spec": {"gatewayClassName": "gwpolicy", "infrastructure": {"parametersRef": {"group": "x", "kind": "Y", "name": "z"}},
                   "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": "to-params", "namespace": "gateway-conformance-infra"},
             "spec": {"parentRefs": [{"name": "params"}], "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]}}
    world = World(BASE["manifests"] + GENERATED + [gw, route])
    world.reconcile()
    g = world.find("Gateway", "gateway-conformance-infra", "params")
    assert {c["type"]: c["reason"] for c in g["status"]["conditions"]}["Accepted"] == "InvalidParameters"
    assert g["status"]["addresses"] == [] and g["status"]["listeners"][0]["attachedRoutes"] == 0
    parent = world.find("HTTPRoute", "gateway-conformance-infra", "to-params")["status"]["parents"][0]
    acc = {c["type"]: c for c in parent["conditions"]}["Accepted"]
    assert acc["status"] == "False" and "InvalidParameters" not in acc["message"] and "not accepted" in acc["message"]
    # and the data plane is given no listener of it
    index = build_index(list(world.objects.values()))
    objs = dataplane_objects(list(world.objects.values()), gateway_facts(index))
    assert next(o for o in objs if o["metadata"]["name"] == "params" and o["kind"] == "Gateway")["spec"]["listeners"] == []


def test_our_entry_goes_when_a_route_no_longer_names_our_gateway():
    world = _world_with_route({"parentRef": {"name": "someone-elses", "namespace": "gateway-conformance-infra"},
                               "controllerName": "example.com/other", "conditions": []})
    world.reconcile()
    route = world.find("HTTPRoute", "gateway-conformance-infra", "r")
    assert [p["controllerName"] for p in route["status"]["parents"]] == ["example.com/other", GATEWAY_CONTROLLER]
    route["spec"]["parentRefs"] = [{"name": "someone-elses"}]  # ours no more
    world.put(route)
    world.reconcile()
    route = world.find("HTTPRoute", "gateway-conformance-infra", "r")
    assert [p["controllerName"] for p in route["status"]["parents"]] == ["example.com/other"]


def test_the_data_plane_gets_only_what_status_accepts():
    """A parentRef status rejects is not given to the data plane (it would serve the route anyway)."""
    bad_filter = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                  "metadata": {"name": "extension", "namespace": "gateway-conformance-infra"},
                  "spec": {"parentRefs": [{"name": "same-namespace"}, {"name": "someone-elses"}],
                           "rules": [{"filters": [{"type": "ExtensionRef", "extensionRef": {"group": "example.com", "kind": "Thing", "name": "x"}}],
                                      "backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]}}
    world = _world_with_route()
    world.put(bad_filter)
    world.reconcile()
    parent = world.find("HTTPRoute", "gateway-conformance-infra", "extension")["status"]["parents"][0]
    assert {c["type"]: c["reason"] for c in parent["conditions"]}["Accepted"] == "UnsupportedValue"
    index = build_index(list(world.objects.values()))
    objs = {(o["kind"], o["metadata"]["name"]): o for o in dataplane_objects(list(world.objects.values()), gateway_facts(index))}
    assert objs[("HTTPRoute", "extension")]["spec"]["parentRefs"] == [{"name": "someone-elses"}]  # not ours: left alone
    assert objs[("HTTPRoute", "r")]["spec"]["parentRefs"] == [{"name": "same-namespace"}, {"name": "someone-elses"}]


def test_a_route_field_nginx_only_approximates_is_said_in_accepted():
    case = gc.load_case("HTTPRouteTimeoutRequest")
    world = World(BASE["manifests"] + GENERATED + case["manifests"])
    world.reconcile()
    parent = world.find("HTTPRoute", "gateway-conformance-infra", "request-timeout")["status"]["parents"][0]
    acc = {c["type"]: c for c in parent["conditions"]}["Accepted"]
    assert acc["status"] == "True" and "spec.rules[0].timeouts.request" in acc["message"]


def test_a_port_the_data_plane_gives_to_an_older_gateway_is_port_unavailable():
    world = World(BASE["manifests"] + GENERATED)
    index = build_index(list(world.objects.values()))
    facts = gateway_facts(index)
    ref = next(r for r in facts.gateways if r.name == "all-namespaces")
    prog = Programming({r: index.by_ref[r].generation for r in facts.gateways},
                       addresses={r: ["127.0.20.1"] for r in facts.gateways},
                       listeners={ref.with_section("http"): (False, "PortUnavailable", "127.0.20.1:80 is already served by an older Gateway")})
    st = all_desired(index, facts, prog, NOW)[ref]
    conds = {c["type"]: c for c in st["listeners"][0]["conditions"]}
    assert (conds["Accepted"]["status"], conds["Accepted"]["reason"]) == ("False", "PortUnavailable")
    assert conds["Programmed"]["status"] == "False"
