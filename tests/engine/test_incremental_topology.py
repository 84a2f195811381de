"""Changes to the hierarchy itself (Gateways, Services, Namespaces, ReferenceGrants), mixed with
policy and route changes, applied in place through `inplace.apply.apply_change`, give exactly what a
full analysis of the same objects gives: after every step of a random sequence on a random cluster."""

from __future__ import annotations

import copy
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import GW, cluster, meta
from gen import settings as settings_strategy
from gwpolicy.engine.analysis import Analysis, analyse
from gwpolicy.engine.inplace.apply import apply_change, policy_ref
from gwpolicy.engine.inplace.base import nodes_at
from gwpolicy.engine.refs import Ref
from gwpolicy.files.output import effective_list, encode, status_list
from helpers import NOW, assert_lists_unchanged, path_lists

Key = tuple[str, str, str, str]

LISTENERS = [
    {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}},
    {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "Same"}}},
    {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
     "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"team": "b"}}}}},
    {"name": "extra", "port": 8080, "protocol": "HTTP", "hostname": "a.example.com",
     "allowedRoutes": {"namespaces": {"from": "All"}}},
    {"name": "other", "port": 81, "protocol": "HTTP", "hostname": "other.org",
     "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"team": "a"}}}}},
    {"name": "tcp", "port": 9000, "protocol": "TCP", "allowedRoutes": {"namespaces": {"from": "All"}}},
]
PORTS = [[{"name": "http", "port": 80}], [{"name": "grpc", "port": 9000}],
         [{"name": "http", "port": 80}, {"name": "grpc", "port": 9000}],
         [{"name": "http", "port": 80}, {"name": "extra", "port": 81}], []]
GRANTS = [
    ("a", {"from": [{"group": "example.io", "kind": "FieldPolicy", "namespace": "b"}], "to": [{"group": GW, "kind": "Gateway"}]}),
    ("a", {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": "b"}], "to": [{"group": "", "kind": "Service"}]}),
    ("b", {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": "a"}], "to": [{"group": "", "kind": "Service", "name": "svc0"}]}),
    ("b", {"from": [{"group": "example.io", "kind": "FieldPolicy", "namespace": "a"},
                    {"group": "example.io", "kind": "AtomPolicy", "namespace": "a"}],
           "to": [{"group": GW, "kind": "HTTPRoute"}, {"group": "", "kind": "Service"}]}),
]


def key(raw: dict[str, Any]) -> Key:
    group = raw["apiVersion"].rsplit("/", 1)[0] if "/" in raw["apiVersion"] else ""
    return group, raw["kind"], raw["metadata"].get("namespace") or "", raw["metadata"]["name"]


def of_kind(objs: dict[Key, dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for k, o in sorted(objs.items()) if k[1] == kind]


def gateway_change(objs, rnd: random.Random) -> tuple[dict | None, dict | None]:
    gateways = of_kind(objs, "Gateway")
    action = rnd.choice(["listeners", "listeners", "class", "delete", "create"] if gateways else ["create"])
    if action == "create":
        new = {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta(f"gw{rnd.randint(0, 3)}", rnd.choice("ab")),
               "spec": {"gatewayClassName": "cls", "listeners": []}}
        old = objs.get(key(new))
        action = "listeners"
    else:
        old = rnd.choice(gateways)
        new = copy.deepcopy(old)
    if action == "delete":
        return old, None
    if action == "class":
        new["spec"]["gatewayClassName"] = rnd.choice(["cls", "nosuch"])
    else:
        chosen: dict[str, dict] = {}
        for l in rnd.sample(LISTENERS, rnd.randint(0, 3)):
            chosen.setdefault(l["name"], copy.deepcopy(l))
        new["spec"]["listeners"] = list(chosen.values())
    return old, new


def service_change(objs, rnd):
    name, ns = f"svc{rnd.randint(0, 2)}", rnd.choice("ab")
    old = objs.get(("", "Service", ns, name))
    if old is not None and rnd.random() < 0.3:
        return old, None
    new = copy.deepcopy(old) if old else {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns), "spec": {}}
    new["spec"]["ports"] = copy.deepcopy(rnd.choice(PORTS))
    if rnd.random() < 0.2:
        new["metadata"]["labels"] = {"app": "x"}  # nothing the hierarchy reads
    return old, new


def namespace_change(objs, rnd):
    name = rnd.choice(["a", "b", "c"])
    old = objs.get(("", "Namespace", "", name))
    if old is not None and rnd.random() < 0.3:
        return old, None
    new = copy.deepcopy(old) if old else {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(name)}
    labels = rnd.choice([{"team": "a"}, {"team": "b"}, {}, None])
    if labels is None:
        new["metadata"].pop("labels", None)
    else:
        new["metadata"]["labels"] = labels
    return old, new


def grant_change(objs, rnd):
    ns, spec = rnd.choice(GRANTS)
    name = rnd.choice(["grant", "grant2"])
    old = objs.get((GW, "ReferenceGrant", ns, name))
    if old is not None and rnd.random() < 0.3:
        return old, None
    new = {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta(name, ns), "spec": copy.deepcopy(spec)}
    return old, new


def policy_change(objs, rnd, new_settings):
    policies = [o for o in objs.values() if o["apiVersion"].startswith("example.io/")]
    if not policies:
        return None, None
    victim = rnd.choice(policies)
    action = rnd.choice(["edit", "retarget", "delete", "add"])
    if action == "delete":
        return victim, None
    changed = copy.deepcopy(victim)
    if action == "edit":
        stanza = next((k for k in ("defaults", "overrides") if k in changed["spec"]), None)
        if stanza:
            changed["spec"][stanza] = new_settings
    elif action == "retarget":
        other = rnd.choice(policies)
        changed["spec"]["targetRefs"] = copy.deepcopy(other["spec"]["targetRefs"])
    else:
        changed["metadata"]["name"] += "-twin"
        return objs.get(key(changed)), changed
    return victim, changed


def route_change(objs, rnd):
    routes = of_kind(objs, "HTTPRoute")
    if not routes:
        return None, None
    victim = rnd.choice(routes)
    action = rnd.choice(["hostnames", "parents", "section", "delete", "add"])
    if action == "delete":
        return victim, None
    changed = copy.deepcopy(victim)
    if action == "hostnames":
        changed["spec"]["hostnames"] = [rnd.choice(["a.example.com", "other.org", "x.example.com"])]
    elif action == "parents":
        changed["spec"]["parentRefs"] = copy.deepcopy(rnd.choice(routes)["spec"]["parentRefs"])
    elif action == "section":  # parentRefs naming one listener each (a Gateway edit looks only at those naming a changed one)
        gateways = of_kind(objs, "Gateway") or [{"metadata": {"name": "gw0", "namespace": "a"}}]
        changed["spec"]["parentRefs"] = [
            {"group": GW, "kind": "Gateway", "name": g["metadata"]["name"], "namespace": g["metadata"]["namespace"],
             "sectionName": rnd.choice([l["name"] for l in LISTENERS])} for g in rnd.sample(gateways, min(2, len(gateways)))]
    else:
        changed["metadata"]["name"] += "-new"
        return objs.get(key(changed)), changed
    return victim, changed


def canonical(a: Analysis):
    """Effective items, status and what affects each object, as sets (the order of a target's paths
    may differ after an in-place change; nothing else may), and the hierarchy itself: every target's
    paths, the sections, virtual backends and the tree of path nodes."""
    items = sorted(encode(i, "json") for i in effective_list(a)["items"])
    status = sorted(encode(i, "json") for i in status_list(a)["items"])
    affected = {o: {k: sorted(v, key=Ref.sort_key) for k, v in kinds.items()} for o, kinds in a.affected.items()}
    topo = a.topology
    paths = {t: sorted(tuple(map(str, n)) for n in nodes) for t, nodes in topo.paths.items()}
    sections = {o: s for o, s in topo.sections.items() if s}
    return items, status, affected, paths, sections, topo.virtual, _tree(a)


def _tree(a: Analysis) -> set[tuple[str, ...]]:
    out, stack = set(), [a.topology.root]
    while stack:
        n = stack.pop()
        out.add(tuple(map(str, n)))
        stack.extend((n.children or {}).values())
    return out


def tree_by_level(a: Analysis) -> dict[Ref, set[int]]:
    """Every node of the tree below the root, by level (by walking it)."""
    out: dict[Ref, set[int]] = {}
    stack = [a.topology.root]
    while stack:
        n = stack.pop()
        if n.level is not None:
            out.setdefault(n.level, set()).add(id(n))
        stack.extend((n.children or {}).values())
    return out


def assert_node_index(a: Analysis) -> None:
    """The index of nodes by level (what a policy change walks down from) holds the tree's nodes."""
    idx = {lv: {id(n) for n in nodes} for lv, nodes in nodes_at(a).items() if nodes}
    assert idx == tree_by_level(a)


def moved_status(before: Analysis, after: Analysis) -> set[Ref]:
    b = {ch.object: ch.status for ch in before.status_changes()}
    c = {ch.object: ch.status for ch in after.status_changes()}
    return {r for r in set(b) | set(c) if b.get(r) != c.get(r)}


CHANGES = ["gateway", "service", "namespace", "grant", "policy", "route", "unread"]


def draw_change(what: str, state: dict, rnd: random.Random, new_settings, changes: dict | None = None) -> tuple[dict | None, dict | None]:
    """(old, new) of one change of the kind `what` to the cluster `state`; `changes`: the namespace
    whose `<what>_change` functions make the kinds other than a policy or a route (this module's
    by default; a test module with changes of its own passes its globals())."""
    if what == "policy":
        return policy_change(state, rnd, new_settings)
    if what == "route":
        return route_change(state, rnd)
    return (changes if changes is not None else globals())[f"{what}_change"](state, rnd)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster(), st.randoms(use_true_random=False), settings_strategy, st.lists(st.sampled_from(CHANGES), min_size=1, max_size=4))
def test_a_sequence_of_changes_in_place_equals_a_full_analysis(objs, rnd: random.Random, new_settings, sequence) -> None:
    state = {key(o): o for o in objs}
    a = analyse(copy.deepcopy(list(state.values())), now=NOW)
    base = analyse(copy.deepcopy(list(state.values())), now=NOW)
    for what in sequence:
        old, new = draw_change(what, state, rnd, new_settings)
        if old is None and new is None:
            continue
        raw = old if old is not None else new
        ref = policy_ref(a, raw) or Ref(key(raw)[0], raw["kind"], raw["metadata"].get("namespace"), raw["metadata"]["name"])
        if new is None:
            del state[key(old)]
        else:
            state[key(new)] = new
        held = path_lists(a)
        result = apply_change(a, copy.deepcopy(raw), copy.deepcopy(new))
        assert_lists_unchanged(held)
        if result is None:
            a = analyse(copy.deepcopy(list(state.values())), now=NOW)  # what the controller does then
            base = analyse(copy.deepcopy(list(state.values())), now=NOW)
            continue
        full = analyse(copy.deepcopy(list(state.values())), now=NOW)
        assert canonical(a) == canonical(full), (what, old, new)
        assert index_view(a) == index_view(full), (what, old, new)
        assert_node_index(a)
        if what == "unread":
            assert result == set()  # nothing the analysis reads changed
        moved = moved_status(base, full)
        assert moved <= result | {ref}, (what, moved - result)
        base = full


def _small() -> list[dict[str, Any]]:
    objs = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("cls"), "spec": {"controllerName": "x/y"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta("a", labels={"team": "a"})},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta("b", labels={"team": "b"})},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta("gw", "a"),
         "spec": {"gatewayClassName": "cls", "listeners": [copy.deepcopy(LISTENERS[0])]}},
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("r", "b"),
         "spec": {"parentRefs": [{"name": "gw", "namespace": "a"}],
                  "rules": [{"name": "one", "backendRefs": [{"name": "svc", "namespace": "a", "port": 80}]}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta("svc", "a"), "spec": {"ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta("p", "a"),
         "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "svc", "sectionName": "http"}],
                  "defaults": {"timeout": "1s"}}},
    ]
    return objs


def test_each_kind_of_change_is_applied_in_place() -> None:
    """Every change the issue names runs in place (no full analysis) and matches a full analysis."""
    state = {key(o): o for o in _small()}
    a = analyse(copy.deepcopy(list(state.values())), now=NOW)
    grant = {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta("g", "a"),
             "spec": {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": "b"}], "to": [{"group": "", "kind": "Service"}]}}
    gw = copy.deepcopy(state[(GW, "Gateway", "a", "gw")])
    gw["spec"]["listeners"].append(copy.deepcopy(LISTENERS[3]))
    svc = copy.deepcopy(state[("", "Service", "a", "svc")])
    svc["spec"]["ports"] = [{"name": "http", "port": 80}, {"name": "grpc", "port": 9000}]
    ns = copy.deepcopy(state[("", "Namespace", "", "b")])
    ns["metadata"]["labels"] = {"team": "c"}
    steps = [(None, grant), (state[(GW, "Gateway", "a", "gw")], gw), (state[("", "Service", "a", "svc")], svc),
             (state[("", "Namespace", "", "b")], ns), (grant, None), (svc, None), (None, svc), (gw, None), (None, gw),
             (None, {"apiVersion": "v1", "kind": "Namespace", "metadata": meta("c")})]
    effective = []
    for old, new in steps:
        raw = old if old is not None else new
        if new is None:
            del state[key(old)]
        else:
            state[key(new)] = new
        assert apply_change(a, copy.deepcopy(raw), copy.deepcopy(new)) is not None, (old, new)
        assert canonical(a) == canonical(analyse(copy.deepcopy(list(state.values())), now=NOW)), (old, new)
        effective.append(len(a.effective))
    # the grant let the route reach the Service (its port carries the policy), and taking it away did not
    assert effective[0] > 0 and effective[4] < effective[3]


def test_a_grant_resolves_again_the_policies_it_lets_through_and_their_ancestors_follow_a_gateway_edit() -> None:
    """Two rarer cases the random sequences reach only now and then: a ReferenceGrant created and
    deleted flips a policy from another namespace between Invalid and Accepted; a Gateway edit that
    moves a route off a listener changes the status of a policy whose ancestors are the Gateways on
    its target's paths (statusAncestor: Gateway), and the objects to check say so."""
    objs = _small() + [
        {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": meta("atompolicy"),
         "spec": {"group": "example.io", "kind": "AtomPolicy", "mergeStrategy": "Atomic", "statusAncestor": "Gateway"}},
        {"apiVersion": "example.io/v1", "kind": "AtomPolicy", "metadata": meta("on-route", "b"),
         "spec": {"targetRefs": [{"group": GW, "kind": "HTTPRoute", "name": "r"}], "defaults": {"retries": 1}}},
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("on-http", "b"),  # it names the listener
         "spec": {"parentRefs": [{"name": "gw", "namespace": "a", "sectionName": "http"}], "rules": [{"name": "x"}]}},
        {"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta("from-b", "b"),
         "spec": {"targetRefs": [{"group": GW, "kind": "Gateway", "name": "gw", "namespace": "a"}], "defaults": {"window": "2s"}}},
    ]
    state = {key(o): o for o in objs}
    a = analyse(copy.deepcopy(list(state.values())), now=NOW)
    from_b = Ref("example.io", "FieldPolicy", "b", "from-b")
    assert {o.reason for o in a.outcomes[from_b]} == {"Invalid"}
    grant = {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta("g", "a"),
             "spec": {"from": [{"group": "example.io", "kind": "FieldPolicy", "namespace": "b"}], "to": [{"group": GW, "kind": "Gateway"}]}}
    gw = copy.deepcopy(state[(GW, "Gateway", "a", "gw")])
    gw["spec"]["listeners"] = [copy.deepcopy(LISTENERS[1])]  # from: Same: the route in b leaves it
    on_route = Ref("example.io", "AtomPolicy", "b", "on-route")
    for old, new, must_check in [(None, grant, from_b), (state[(GW, "Gateway", "a", "gw")], gw, on_route), (grant, None, from_b)]:
        raw = old if old is not None else new
        if new is None:
            del state[key(old)]
        else:
            state[key(new)] = new
        before = analyse(copy.deepcopy([o for k, o in state.items() if o is not new] + ([old] if old else [])), now=NOW)
        result = apply_change(a, copy.deepcopy(raw), copy.deepcopy(new))
        full = analyse(copy.deepcopy(list(state.values())), now=NOW)
        assert result is not None and canonical(a) == canonical(full)
        assert must_check in moved_status(before, full) and must_check in result
    assert {o.reason for o in a.outcomes[from_b]} == {"Invalid"}


def test_a_grant_finds_the_policies_from_other_namespaces_that_came_and_went_in_place() -> None:
    """Which policies name a namespace other than their own (those a ReferenceGrant there may let
    through) is kept as policies come and go in place: a policy from b naming the Gateway in a,
    created after a first grant change, is Accepted once a grant in a lets it through, and a grant
    made after it was deleted finds nothing to resolve again."""
    objs = _small()
    state = {key(o): o for o in objs}
    a = analyse(copy.deepcopy(objs), now=NOW)
    unrelated = {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta("unrelated", "a"),
                 "spec": {"from": [{"group": GW, "kind": "HTTPRoute", "namespace": "b"}], "to": [{"group": "", "kind": "Service"}]}}
    policy = {"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta("from-b", "b"),
              "spec": {"targetRefs": [{"group": GW, "kind": "Gateway", "name": "gw", "namespace": "a"}], "defaults": {"window": "2s"}}}
    grant = {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta("g", "a"),
             "spec": {"from": [{"group": "example.io", "kind": "FieldPolicy", "namespace": "b"}], "to": [{"group": GW, "kind": "Gateway"}]}}
    from_b = Ref("example.io", "FieldPolicy", "b", "from-b")
    steps = [(None, unrelated), (None, policy), (None, grant), (grant, None), (policy, None), (None, grant)]
    for i, (old, new) in enumerate(steps):
        if new is None:
            del state[key(old)]
        else:
            state[key(new)] = new
        result = apply_change(a, copy.deepcopy(old if old is not None else new), copy.deepcopy(new))
        full = analyse(copy.deepcopy(list(state.values())), now=NOW)
        assert result is not None and canonical(a) == canonical(full), f"step {i}"
        if i == 2:  # the grant that lets it through: the policy is resolved again, and now attaches
            assert {o.reason for o in a.outcomes[from_b]} == {"Accepted"} and from_b in result
        if i == 5:
            assert from_b not in a.outcomes and from_b not in result


def test_the_last_object_of_a_namespace_without_its_namespace_object_takes_the_namespace_with_it() -> None:
    """S4.5: a namespace exists while a Namespace object names it or an object lives in it. With its
    Namespace object deleted, the Gateway living there holds it in the hierarchy; deleting that
    Gateway (a kind with an in-place path of its own) must take the namespace's level away too, as a
    full analysis does (hypothesis found it: the in-place update kept `Namespace/b`)."""
    objs = [o for o in _small() if o["kind"] != "HTTPRoute"]
    gw = next(o for o in objs if o["kind"] == "Gateway")
    gw["metadata"]["namespace"] = "b"
    objs.append({"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta("on-gw", "a"),
                 "spec": {"targetRefs": [{"group": GW, "kind": "Gateway", "name": "gw", "namespace": "b"}], "defaults": {}}})
    state = {key(o): o for o in objs}
    a = analyse(copy.deepcopy(objs), now=NOW)
    ns_b = state[("", "Namespace", "", "b")]
    for old in (ns_b, gw):
        del state[key(old)]
        result = apply_change(a, copy.deepcopy(old), None)
        if result is None:
            a = analyse(copy.deepcopy(list(state.values())), now=NOW)
        full = analyse(copy.deepcopy(list(state.values())), now=NOW)
        assert canonical(a) == canonical(full), old["kind"]
    assert Ref("", "Namespace", None, "b") not in a.topology.paths


UNREAD = [("discovery.k8s.io/v1", "EndpointSlice", {"addressType": "IPv4", "endpoints": []}),
          ("v1", "Secret", {"data": {"tls.crt": "eA=="}}), ("v1", "ConfigMap", {"data": {"ca.crt": "x"}})]


def unread_change(objs, rnd):
    api, kind, body = rnd.choice(UNREAD)
    name, ns = f"{kind.lower()}{rnd.randint(0, 1)}", rnd.choice("abc")
    group = api.rsplit("/", 1)[0] if "/" in api else ""
    old = objs.get((group, kind, ns, name))
    if old is not None and rnd.random() < 0.4:
        return old, None
    new = {"apiVersion": api, "kind": kind, "metadata": meta(name, ns), **copy.deepcopy(body)}
    new["metadata"]["labels"] = {"rev": str(rnd.randint(0, 9))}
    return old, new


def index_view(a: Analysis) -> dict[Ref, Any]:
    """What a data plane reads of the index: every object's content, and each kind's sorted list."""
    return {"by_ref": {r: o.raw for r, o in a.index.by_ref.items()},
            "by_kind": {k: [o.ref for o in v] for k, v in a.index.by_kind.items() if v},
            "namespaces": set(a.index.namespaces)}


def test_an_unread_kind_a_policy_targets_runs_a_full_analysis() -> None:
    """A policy may name a ConfigMap as its target: creating that ConfigMap must resolve it again."""
    objs = _small()
    objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("other", "a"), "data": {}})
    pol = next(o for o in objs if o["apiVersion"].startswith("example.io/"))
    pol = copy.deepcopy(pol)
    pol["metadata"]["name"] = "on-a-configmap"
    pol["spec"]["targetRefs"] = [{"group": "", "kind": "ConfigMap", "name": "cm"}]
    objs.append(pol)
    a = analyse(copy.deepcopy(objs), now=NOW)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("cm", pol["metadata"]["namespace"]), "data": {}}
    assert apply_change(a, cm, cm) is None
    other = {"apiVersion": "v1", "kind": "Secret", "metadata": meta("s", "a"), "data": {}}
    b = analyse(copy.deepcopy(objs + [other]), now=NOW)
    changed = copy.deepcopy(other)
    changed["metadata"]["labels"] = {"x": "y"}
    assert apply_change(b, other, changed) == set()
    assert b.index.by_ref[Ref("", "Secret", "a", "s")].raw["metadata"]["labels"] == {"x": "y"}


def test_an_unread_kind_follows_the_policies_that_come_and_go_in_place() -> None:
    """What the policies target is kept as they change in place: a ConfigMap changed while no
    policy names ConfigMaps stays in place; once one does (created in place, naming a ConfigMap
    that does not exist yet), a ConfigMap's change runs a full analysis; once that policy is
    deleted (in place), it is in place again."""
    objs = _small()
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("cm", "a"), "data": {}}
    objs.append(cm)
    a = analyse(copy.deepcopy(objs), now=NOW)
    changed = copy.deepcopy(cm)
    changed["data"] = {"k": "v"}
    assert apply_change(a, cm, changed) == set()  # no policy names a ConfigMap (the counts are made here)
    pol = copy.deepcopy(next(o for o in objs if o["apiVersion"].startswith("example.io/")))
    pol["metadata"]["name"] = "on-a-configmap"
    pol["spec"]["targetRefs"] = [{"group": "", "kind": "ConfigMap", "name": "not-yet"}]
    assert apply_change(a, pol, pol) is not None  # the policy comes in place (its target does not exist)
    assert apply_change(a, changed, cm) is None  # now a ConfigMap may be a target: analyse it all
    assert apply_change(a, pol, None) is not None  # the policy goes in place
    assert apply_change(a, changed, cm) == set()
