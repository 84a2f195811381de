"""Changes that move many routes at once, applied in place, give what a full analysis gives: a
listener's hostname or allowedRoutes changed (routes leave it for another listener or their own
`Namespace > route` path, and come back), a namespace's labels changed (listeners selecting by
label), a ReferenceGrant created, changed or deleted (cross-namespace backends come and go below
several routes). The clusters are built so that each of these moves several routes, with backends
in other namespaces (a Namespace level inside the moved subtree), routes in the Gateway's own
namespace (no Namespace level above them), routes on two listeners, and policies at every level."""

from __future__ import annotations

import copy
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import GW, meta, route_and_service_targets
from gen import settings as settings_strategy
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.inplace.apply import apply_change, policy_ref
from gwpolicy.engine.refs import Ref
from helpers import NOW, assert_lists_unchanged, path_lists
from test_incremental_topology import assert_node_index, canonical, draw_change, index_view, key, moved_status

NAMESPACES = ["a", "b", "c"]
HOSTNAMES = [None, "*.example.com", "*.example.org", "x.example.com"]
FROMS = [{"from": "All"}, {"from": "Same"}, {"from": "Selector", "selector": {"matchLabels": {"team": "b"}}},
         {"from": "Selector", "selector": {"matchLabels": {"team": "c"}}}]


def listener(name: str, port: int, hostname: str | None, allowed: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "port": port, "protocol": "HTTP", "allowedRoutes": {"namespaces": copy.deepcopy(allowed)}}
    if hostname is not None:
        out["hostname"] = hostname
    return out


def grant(ns: str, froms: list[str], name: str | None = None) -> dict[str, Any]:
    to: dict[str, Any] = {"group": "", "kind": "Service"}
    if name is not None:
        to["name"] = name
    return {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta(f"to-{ns}", ns),
            "spec": {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": f} for f in froms], "to": [to]}}


@st.composite
def moving_cluster(draw: st.DrawFn) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("cls"), "spec": {"controllerName": "x/y"}},
        {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": meta("atompolicy"),
         "spec": {"group": "example.io", "kind": "AtomPolicy", "mergeStrategy": "Atomic"}},
    ]
    for ns in NAMESPACES:
        objs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(ns, labels={"team": draw(st.sampled_from("abc"))})})
    gateways = [("a", "gw0")] + ([("b", "gw1")] if draw(st.booleans()) else [])
    listeners: dict[tuple[str, str], list[str]] = {}
    for ns, name in gateways:
        ls = [listener("one", 80, draw(st.sampled_from(HOSTNAMES)), draw(st.sampled_from(FROMS))),
              listener("two", 81, draw(st.sampled_from(HOSTNAMES)), draw(st.sampled_from(FROMS)))]
        listeners[(ns, name)] = [l["name"] for l in ls]
        objs.append({"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta(name, ns),
                     "spec": {"gatewayClassName": "cls", "listeners": ls}})
    services = [(ns, f"svc-{ns}") for ns in NAMESPACES]
    for ns, name in services:
        objs.append({"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns), "spec": {"ports": [{"name": "http", "port": 80}]}})
    routes: list[tuple[str, str, list[str]]] = []
    for i in range(draw(st.integers(2, 6))):
        ns = draw(st.sampled_from(NAMESPACES))
        parents = []
        for gns, gname in draw(st.lists(st.sampled_from(gateways), min_size=1, max_size=2, unique=True)):
            pref: dict[str, Any] = {"name": gname, "namespace": gns}
            section = draw(st.sampled_from([None, "one", "one", "two"]))
            if section is not None:
                pref["sectionName"] = section
            parents.append(pref)
        rules = []
        for r in range(draw(st.integers(1, 2))):
            rule: dict[str, Any] = {"backendRefs": [{"name": s[1], "namespace": s[0], "port": 80}
                                                    for s in draw(st.lists(st.sampled_from(services), min_size=1, max_size=2, unique=True))]}
            if draw(st.booleans()):
                rule["name"] = f"rule{r}"
            rules.append(rule)
        spec: dict[str, Any] = {"parentRefs": parents, "rules": rules}
        host = draw(st.sampled_from([None, "x.example.com", "y.example.org"]))
        if host is not None:
            spec["hostnames"] = [host]
        routes.append((ns, f"r{i}", [r["name"] for r in rules if "name" in r]))
        objs.append({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta(f"r{i}", ns), "spec": spec})
    for ns in NAMESPACES:
        froms = draw(st.lists(st.sampled_from(NAMESPACES), max_size=2, unique=True))
        if froms:
            objs.append(grant(ns, froms, draw(st.sampled_from([None, f"svc-{ns}"]))))
    targets: list[dict[str, Any]] = [{"group": "", "kind": "Namespace", "name": ns} for ns in NAMESPACES]
    for (ns, name), ls in listeners.items():
        targets.append({"group": GW, "kind": "Gateway", "name": name, "namespace": ns})
        targets += [{"group": GW, "kind": "Gateway", "name": name, "namespace": ns, "sectionName": l} for l in ls]
    targets += route_and_service_targets(routes, services)
    # a policy on every listener and namespace: a route that moves leaves some and meets others
    for (ns, name), ls in listeners.items():
        for l in ls:
            objs.append({"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta(f"{name}-{l}", ns),
                         "spec": {"targetRefs": [{"group": GW, "kind": "Gateway", "name": name, "sectionName": l}],
                                  "defaults": {"timeout": f"{name}-{l}"}}})
    for ns in NAMESPACES:
        objs.append({"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta(f"ns-{ns}", ns),
                     "spec": {"targetRefs": [{"group": "", "kind": "Namespace", "name": ns}], "defaults": {"window": ns}}})
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["FieldPolicy", "FieldPolicy", "DirectPolicy", "AtomPolicy"]))
        target = draw(st.sampled_from(targets))
        ns = target.get("namespace") or draw(st.sampled_from(NAMESPACES))
        spec: dict[str, Any] = {"targetRefs": [target]}
        shape = draw(st.sampled_from(["defaults", "overrides", "direct"]))
        if shape == "direct":
            spec.update(draw(settings_strategy))
        else:
            spec[shape] = draw(settings_strategy)
        objs.append({"apiVersion": "example.io/v1", "kind": kind, "metadata": meta(f"p{i}", ns), "spec": spec})
    return objs


def of_kind(state: dict, kind: str) -> list[dict[str, Any]]:
    return [o for k, o in sorted(state.items()) if k[1] == kind]


def listener_change(state: dict, rnd: random.Random) -> tuple[dict | None, dict | None]:
    """A listener's hostname or allowedRoutes changed, or a listener added or taken away."""
    old = rnd.choice(of_kind(state, "Gateway"))
    new = copy.deepcopy(old)
    ls = new["spec"]["listeners"]
    action = rnd.choice(["hostname", "hostname", "allowed", "listeners"])
    if action == "listeners" or not ls:
        if ls and rnd.random() < 0.5:
            ls.pop(rnd.randrange(len(ls)))
        else:
            names = {l["name"] for l in ls}
            name = rnd.choice([n for n in ("one", "two", "three") if n not in names] or ["one"])
            if name not in names:
                ls.append(listener(name, 82, rnd.choice(HOSTNAMES), rnd.choice(FROMS)))
    else:
        l = rnd.choice(ls)
        if action == "hostname":
            host = rnd.choice(HOSTNAMES)
            if host is None:
                l.pop("hostname", None)
            else:
                l["hostname"] = host
        else:
            l["allowedRoutes"] = {"namespaces": copy.deepcopy(rnd.choice(FROMS))}
    return old, new


def backends_change(state: dict, rnd: random.Random) -> tuple[dict | None, dict | None]:
    """A route's backends changed (below a path moved before, a backend in a namespace its old
    parents held and its new ones do not takes a Namespace level)."""
    old = rnd.choice(of_kind(state, "HTTPRoute"))
    new = copy.deepcopy(old)
    for rule in new["spec"]["rules"]:
        rule["backendRefs"] = [{"name": f"svc-{ns}", "namespace": ns, "port": 80} for ns in rnd.sample(NAMESPACES, rnd.randint(1, 2))]
    return old, new


def labels_change(state: dict, rnd: random.Random) -> tuple[dict | None, dict | None]:
    old = state[("", "Namespace", "", rnd.choice(NAMESPACES))]
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": rnd.choice("abc")}
    return old, new


def grant_change(state: dict, rnd: random.Random) -> tuple[dict | None, dict | None]:
    ns = rnd.choice(NAMESPACES)
    old = state.get((GW, "ReferenceGrant", ns, f"to-{ns}"))
    if old is not None and rnd.random() < 0.4:
        return old, None
    return old, grant(ns, rnd.sample(NAMESPACES, rnd.randint(1, 3)), rnd.choice([None, f"svc-{ns}"]))


CHANGES = ["listener", "listener", "listener", "labels", "grant", "grant", "backends", "route", "policy"]


def apply_and_compare(state: dict, old: dict | None, new: dict | None, a: Any, base: Any) -> Any:
    """Apply one change in place and compare with a full analysis; the analysis to go on with."""
    raw = old if old is not None else new
    assert raw is not None
    ref = policy_ref(a, raw) or Ref(key(raw)[0], raw["kind"], raw["metadata"].get("namespace"), raw["metadata"]["name"])
    if new is None:
        del state[key(old)]  # type: ignore[arg-type]
    else:
        state[key(new)] = new
    held = path_lists(a)
    result = apply_change(a, copy.deepcopy(raw), copy.deepcopy(new))
    assert_lists_unchanged(held)
    full = analyse(copy.deepcopy(list(state.values())), now=NOW)
    if result is None:
        return analyse(copy.deepcopy(list(state.values())), now=NOW), full
    assert canonical(a) == canonical(full), (old, new)
    assert index_view(a) == index_view(full), (old, new)
    assert_node_index(a)
    moved = moved_status(base, full)
    assert moved <= result | {ref}, moved - result
    return a, full


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moving_cluster(), st.randoms(use_true_random=False), settings_strategy,
       st.lists(st.sampled_from(CHANGES), min_size=1, max_size=5))
def test_moves_of_many_routes_in_place_equal_a_full_analysis(objs, rnd: random.Random, new_settings, sequence) -> None:
    state = {key(o): o for o in objs}
    a = analyse(copy.deepcopy(list(state.values())), now=NOW)
    base = analyse(copy.deepcopy(list(state.values())), now=NOW)
    for what in sequence:
        old, new = draw_change(what, state, rnd, new_settings, globals())
        if old is None and new is None:
            continue
        a, base = apply_and_compare(state, old, new, a, base)


def _three_routes() -> list[dict[str, Any]]:
    """Three routes on one listener: one in the Gateway's namespace, two in another, each with a
    backend in a third namespace (let through by a grant), and policies along the way."""
    objs = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("cls"), "spec": {"controllerName": "x/y"}},
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(ns, labels={"team": ns})} for ns in NAMESPACES),
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta("gw0", "a"),
         "spec": {"gatewayClassName": "cls", "listeners": [listener("one", 80, "*.example.com", {"from": "All"}),
                                                           listener("two", 81, None, FROMS[3])]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta("svc-c", "c"), "spec": {"ports": [{"name": "http", "port": 80}]}},
        grant("c", ["a", "b"]),
        {"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta("on-listener", "a"),
         "spec": {"targetRefs": [{"group": GW, "kind": "Gateway", "name": "gw0", "sectionName": "one"}], "defaults": {"timeout": "1s"}}},
        {"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta("on-c", "c"),
         "spec": {"targetRefs": [{"group": "", "kind": "Namespace", "name": "c"}], "defaults": {"retries": 2}}},
    ]
    for ns, name in (("a", "r0"), ("b", "r1"), ("b", "r2")):
        objs.append({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta(name, ns),
                     "spec": {"parentRefs": [{"name": "gw0", "namespace": "a"}], "hostnames": ["x.example.com"],
                              "rules": [{"name": "api", "backendRefs": [{"name": "svc-c", "namespace": "c", "port": 80}]}]}})
    return objs


def _listener_away() -> tuple[dict, Any, Any, dict, dict]:
    """`_three_routes` analysed twice (one to edit in place, one to compare with), its Gateway, and
    that Gateway with the routes' listener's hostname changed so that it admits none of them."""
    state = {key(o): o for o in _three_routes()}
    a = analyse(copy.deepcopy(list(state.values())), now=NOW)
    base = analyse(copy.deepcopy(list(state.values())), now=NOW)
    gw = state[(GW, "Gateway", "a", "gw0")]
    away = copy.deepcopy(gw)
    away["spec"]["listeners"][0]["hostname"] = "*.example.org"
    return state, a, base, gw, away


def _parents(a: Any) -> dict[int, int]:
    """Each route path node (by identity) -> its parent (by identity)."""
    return {id(n): id(n.parent) for t, ns in a.topology.paths.items()
            if t.kind == "HTTPRoute" and t.section is None for n in ns}


def _moved_subtrees(before: dict[int, int], a: Any) -> int:
    """Route paths held by the same node as before under another parent: subtrees moved in place
    (`_graft` hangs the node itself elsewhere), not derived again (a derivation makes a new node).
    Read from the nodes, not by patching `_graft`: a compiled core calls it directly."""
    return sum(1 for n, p in _parents(a).items() if n in before and before[n] != p)


def test_a_hostname_change_moves_every_route_of_the_listener_and_back() -> None:
    """The listener's routes leave it (to their own paths), a namespace's new labels bring two of
    them to the other listener, and the first comes back: each moves the routes' subtrees in place
    (no route is derived from scratch), and the result is a full analysis'."""
    state, a, base, gw, away = _listener_away()
    back = copy.deepcopy(away)
    back["spec"]["listeners"][0]["hostname"] = "*.example.com"
    team_c = copy.deepcopy(state[("", "Namespace", "", "b")])
    team_c["metadata"]["labels"] = {"team": "c"}
    r2 = state[(GW, "HTTPRoute", "b", "r2")]
    to_a = copy.deepcopy(r2)  # below its own path now, a backend in the Gateway's namespace takes a Namespace level
    to_a["spec"]["rules"][0]["backendRefs"] = [{"name": "svc-a", "namespace": "a", "port": 80}]
    state[("", "Service", "a", "svc-a")] = {"apiVersion": "v1", "kind": "Service", "metadata": meta("svc-a", "a"),
                                             "spec": {"ports": [{"name": "http", "port": 80}]}}
    state[(GW, "ReferenceGrant", "a", "to-a")] = grant("a", ["b"])
    a = analyse(copy.deepcopy(list(state.values())), now=NOW)
    base = analyse(copy.deepcopy(list(state.values())), now=NOW)
    r1 = Ref(GW, "HTTPRoute", "b", "r1")
    # away: all three to their own paths; r2's backend to a; new labels: r1 and r2 to the listener
    # selecting them (r2 derived: below the Gateway's namespace, its backend in a takes no Namespace
    # level); back: r0 to its listener (r1 and r2 get a second path: derived, as nothing went)
    for old, new, moves, r1_on in [(gw, away, 3, set()), (r2, to_a, 0, set()),
                                   (state[("", "Namespace", "", "b")], team_c, 1, {"two"}),
                                   (away, back, 1, {"one", "two"})]:
        routes = _parents(a)
        a, base = apply_and_compare(state, old, new, a, base)
        assert _moved_subtrees(routes, a) == moves
        assert {n[3].section for n in a.topology.paths[r1] if len(n) > 3} == r1_on


def test_a_policy_on_a_service_port_is_checked_when_only_the_ports_paths_change() -> None:
    """A route's backendRef moves from one port of its Service to the other: only the ports' paths
    change (the Service's own path below the route stays), and the policy on the port the route now
    reaches, whose ancestors are the Gateways on its paths (statusAncestor: Gateway), is among the
    objects to check, as is the Service."""
    objs = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("cls"), "spec": {"controllerName": "x/y"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta("a")},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta("gw0", "a"),
         "spec": {"gatewayClassName": "cls", "listeners": [listener("one", 80, None, {"from": "All"})]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta("svc", "a"),
         "spec": {"ports": [{"name": "http", "port": 80}, {"name": "metrics", "port": 90}]}},
        {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": meta("atompolicy"),
         "spec": {"group": "example.io", "kind": "AtomPolicy", "mergeStrategy": "Atomic", "statusAncestor": "Gateway"}},
        {"apiVersion": "example.io/v1", "kind": "AtomPolicy", "metadata": meta("on-metrics", "a"),
         "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "svc", "sectionName": "metrics"}],
                  "defaults": {"interval": "5s"}}},
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("r", "a"),
         "spec": {"parentRefs": [{"name": "gw0"}], "rules": [{"backendRefs": [{"name": "svc", "port": 80}]}]}},
    ]
    state = {key(o): o for o in objs}
    a = analyse(copy.deepcopy(list(state.values())), now=NOW)
    base = analyse(copy.deepcopy(list(state.values())), now=NOW)
    route = state[(GW, "HTTPRoute", "a", "r")]
    to_metrics = copy.deepcopy(route)
    to_metrics["spec"]["rules"][0]["backendRefs"][0]["port"] = 90
    policy = Ref("example.io", "AtomPolicy", "a", "on-metrics")
    svc = Ref("", "Service", "a", "svc")
    before = {t: set(ps) for t, ps in a.topology.paths.items() if t.object == svc}
    result = apply_change(a, copy.deepcopy(route), copy.deepcopy(to_metrics))
    assert result is not None
    assert {t for t, ps in a.topology.paths.items() if t.object == svc and before.get(t) != set(ps)} == {
        svc.with_section("http"), svc.with_section("metrics")}  # the Service's own path stays
    state[key(to_metrics)] = to_metrics
    full = analyse(copy.deepcopy(list(state.values())), now=NOW)
    assert canonical(a) == canonical(full)
    assert policy in moved_status(base, full)  # its ancestors now hold the Gateway
    assert {policy, svc} <= result


def test_a_gateway_edit_after_routes_came_and_went_moves_the_routes_naming_it_now() -> None:
    """The routes naming a Gateway are sorted once and kept (`RouteIndex.routes_naming`) until a route
    naming it changes: after a Gateway edit, a route that comes naming it, one that goes and one that
    names it no more are what the next Gateway edit works on (else the new route would stay on the
    listener that no longer admits it, and the gone one be derived again)."""
    state, a, base, gw, away = _listener_away()
    a, base = apply_and_compare(state, gw, away, a, base)
    r0 = state[(GW, "HTTPRoute", "a", "r0")]
    r3 = copy.deepcopy(r0)
    r3["metadata"] = meta("r3", "a")
    a, base = apply_and_compare(state, None, r3, a, base)  # comes, naming gw0
    a, base = apply_and_compare(state, state[(GW, "HTTPRoute", "b", "r1")], None, a, base)  # goes
    r2 = state[(GW, "HTTPRoute", "b", "r2")]
    elsewhere = copy.deepcopy(r2)
    elsewhere["spec"]["parentRefs"] = [{"name": "gw9", "namespace": "a"}]  # names another Gateway now
    a, base = apply_and_compare(state, r2, elsewhere, a, base)
    back = copy.deepcopy(away)
    back["spec"]["listeners"][0]["hostname"] = "*.example.com"
    a, base = apply_and_compare(state, away, back, a, base)
    on = {str(t) for t, ns in a.topology.paths.items() if t.kind == "HTTPRoute" and t.section is None
          for n in ns if any(lv.section == "one" for lv in n.levels)}
    assert on == {"HTTPRoute/a/r0", "HTTPRoute/a/r3"}
