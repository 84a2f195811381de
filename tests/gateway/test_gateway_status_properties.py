"""Properties of gateway/status.py over random Gateways, listeners and routes (hypothesis): status
agrees with the engine's topology (one model), is idempotent, keeps other controllers' entries in
place, says nothing about Gateways that are not ours, and is current (observedGeneration)."""

from __future__ import annotations

import base64
import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_kit import key_pair
from gwpolicy.analysis import analyse
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER, gateway_facts
from gwpolicy.gateway.status import Programming, all_desired
from gwpolicy.model import build_index
from gwpolicy.refs import GATEWAY_GROUP, Ref

GW = "gateway.networking.k8s.io/v1"
NOW = "2026-12-01T00:00:00Z"
PEM, KEY = (base64.b64encode(x).decode() for x in key_pair())  # a certificate and its key, as `data` holds them

listener = st.fixed_dictionaries({
    "port": st.sampled_from([80, 443, 8080]),
    "protocol": st.sampled_from(["HTTP", "HTTP", "HTTPS", "TCP"]),
    "hostname": st.sampled_from([None, "a.example", "*.example", "b.other"]),
    "from": st.sampled_from(["Same", "All"]),
    "cert": st.sampled_from(["good", "missing"]),
})
parent = st.fixed_dictionaries({
    "gateway": st.sampled_from(["g0", "g1", "theirs", "nowhere"]),
    "section": st.sampled_from([None, None, "l0", "l1", "l9"]),
    "port": st.sampled_from([None, None, 80, 8080, 9999]),
})
route = st.fixed_dictionaries({
    "ns": st.sampled_from(["a", "a", "b"]),
    "hostnames": st.lists(st.sampled_from(["a.example", "x.example", "b.other", "*.example"]), max_size=2, unique=True),
    "parents": st.lists(parent, min_size=1, max_size=2),
    "backend": st.sampled_from(["svc", "svc", "missing", "wrongport", "otherkind", "crossns"]),
    "other_entry": st.booleans(),
})


def _objects(gateways: list[list[dict[str, Any]]], routes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [
        {"apiVersion": GW, "kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": GATEWAY_CONTROLLER}},
        {"apiVersion": GW, "kind": "GatewayClass", "metadata": {"name": "other"}, "spec": {"controllerName": "example.com/x"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "good", "namespace": "a"}, "data": {"tls.crt": PEM, "tls.key": KEY}},
        {"apiVersion": GW, "kind": "Gateway", "metadata": {"name": "theirs", "namespace": "a", "generation": 1},
         "spec": {"gatewayClassName": "other", "listeners": [{"name": "l0", "port": 80, "protocol": "HTTP"}]}},
    ]
    for ns in ("a", "b"):
        objs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "namespace": ns},
                     "spec": {"ports": [{"name": "http", "port": 8080}]}})
    for gi, listeners in enumerate(gateways):
        ls = []
        for li, l in enumerate(listeners):
            d: dict[str, Any] = {"name": f"l{li}", "port": l["port"], "protocol": l["protocol"],
                                 "allowedRoutes": {"namespaces": {"from": l["from"]}}}
            if l["hostname"]:
                d["hostname"] = l["hostname"]
            if l["protocol"] == "HTTPS":
                d["tls"] = {"certificateRefs": [{"name": l["cert"]}]}
            ls.append(d)
        objs.append({"apiVersion": GW, "kind": "Gateway", "metadata": {"name": f"g{gi}", "namespace": "a", "generation": 2},
                     "spec": {"gatewayClassName": "ours", "listeners": ls}})
    for ri, r in enumerate(routes):
        backend = {"svc": {"name": "svc", "port": 8080}, "missing": {"name": "nope", "port": 8080},
                   "wrongport": {"name": "svc", "port": 1}, "otherkind": {"group": "example.com", "kind": "Bucket", "name": "svc"},
                   "crossns": {"name": "svc", "namespace": "b" if r["ns"] == "a" else "a", "port": 8080}}[r["backend"]]
        prefs = []
        for p in r["parents"]:
            d = {"name": p["gateway"], "namespace": "a"}
            if p["section"]:
                d["sectionName"] = p["section"]
            if p["port"]:
                d["port"] = p["port"]
            prefs.append(d)
        obj = {"apiVersion": GW, "kind": "HTTPRoute", "metadata": {"name": f"r{ri}", "namespace": r["ns"], "generation": 3},
               "spec": {"parentRefs": prefs, "hostnames": r["hostnames"], "rules": [{"backendRefs": [backend]}]}}
        if r["other_entry"]:
            obj["status"] = {"parents": [{"controllerName": "example.com/x", "parentRef": {"name": "theirs", "namespace": "a"},
                                          "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}]}
        objs.append(obj)
    return objs


def _reconcile(objs: list[dict[str, Any]], now: str = NOW) -> tuple[dict[Ref, dict[str, Any]], Any, Any]:
    index = build_index(objs)
    facts = gateway_facts(index)
    prog = Programming({r: index.by_ref[r].generation for r in facts.gateways},
                       addresses={r: [f"127.0.20.{i + 1}"] for i, r in enumerate(sorted(facts.gateways))})
    return all_desired(index, facts, prog, now), facts, index


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(listener, min_size=1, max_size=3), min_size=1, max_size=2), st.lists(route, max_size=4))
def test_status_properties(gateways, routes):
    objs = _objects(gateways, routes)
    desired, facts, index = _reconcile(objs)
    topo = analyse(objs).topology

    # one model: a route is attached to a valid listener in status exactly when the topology has a path through it
    for rref, rf in facts.routes.items():
        through = {lvl for p in topo.paths_of(rref) for lvl in p if lvl.kind == "Gateway" and lvl.section is not None}
        for pf in rf.parents:
            gf = facts.gateways[pf.gateway]
            for name in pf.listeners:
                assert pf.gateway.with_section(name) in through
            for lvl in through:
                if lvl.object == pf.gateway and gf.listeners[lvl.section].accepted.status and pf.accepted.status:
                    # the topology's listener is one status counts for some parentRef of this route to that Gateway
                    assert any(lvl.section in q.listeners for q in rf.parents if q.gateway == pf.gateway)
            assert pf.accepted.status == bool(pf.listeners)

    by_ref = {Ref(GATEWAY_GROUP, o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
              for o in objs if o["apiVersion"] == GW}
    for ref, status in desired.items():
        obj = by_ref[ref]
        gen = obj["metadata"].get("generation")
        conds = list(status.get("conditions") or [])
        for l in status.get("listeners") or []:
            conds += l["conditions"]
        for p in status.get("parents") or []:
            if p["controllerName"] == GATEWAY_CONTROLLER:
                conds += p["conditions"]
                assert p["parentRef"]["name"] in ("g0", "g1")[:len(gateways)]  # never theirs, never a missing one
        assert all(c.get("observedGeneration") == gen for c in conds if "lastTransitionTime" in c)
        if ref.kind == "HTTPRoute" and (obj.get("status") or {}).get("parents"):
            assert status["parents"][0] == obj["status"]["parents"][0]  # theirs: untouched, first
        if ref.kind == "Gateway":
            for l in status["listeners"]:
                attached = sum(1 for rf in facts.routes.values() for p in rf.parents
                               if p.gateway == ref and l["name"] in p.listeners)
                assert l["attachedRoutes"] == attached
    assert Ref(GATEWAY_GROUP, "Gateway", "a", "theirs") not in desired
    assert Ref(GATEWAY_GROUP, "GatewayClass", None, "other") not in desired

    # idempotent: over objects that carry it, status computed later is the same
    carried = copy.deepcopy(objs)
    for o in carried:
        ref = Ref(GATEWAY_GROUP, o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        if o["apiVersion"] == GW and ref in desired:
            o["status"] = desired[ref]
    again, _, _ = _reconcile(carried, "2030-01-01T00:00:00Z")
    assert again == desired
