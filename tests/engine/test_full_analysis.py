"""The full analysis' shortcuts (docs/architecture.md, "What made the full analysis fast") give what
the plain computation gives: node results looked up by context, `affected` from distinct results,
breadcrumbs from a shallow copy of the status an object carries."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gen import cluster, meta
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.effective import EffectivePolicy
from gwpolicy.engine.inplace.apply import apply_change
from gwpolicy.engine.status import breadcrumbs
from helpers import NOW

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GW = "gateway.networking.k8s.io"


@st.composite
def cluster_with_mapped_fields(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A random cluster, sometimes with a kind that maps a setting onto a route's own field (S5.2 rule
    4: the one input of a node's result that belongs to the owner, not to the path)."""
    objs = draw(cluster())
    if draw(st.booleans()):
        objs.append({"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": meta("fieldpolicy"),
                     "spec": {"group": "example.io", "kind": "FieldPolicy", "attachment": "Inherited",
                              "fieldMappings": [{"setting": "a", "targetKind": {"group": GW, "kind": "HTTPRoute"},
                                                 "field": "spec.timeouts.request"}]}})
        for o in objs:
            if o["kind"] == "HTTPRoute" and draw(st.booleans()):
                o["spec"]["timeouts"] = {"request": draw(st.sampled_from(["1s", "2s"]))}
    return objs


def _plain(a, target, node) -> list[EffectivePolicy]:
    """The node's effective policies computed on their own, as an incremental update computes them."""
    return [EffectivePolicy(target, node, a.kinds[kk], res) for kk, res in a.evaluator.evaluate_node(target, node)
            if res.leaves]


@SETTINGS
@given(cluster_with_mapped_fields())
def test_every_path_gets_what_its_own_evaluation_gives(objs) -> None:
    a = analyse(copy.deepcopy(objs), now=NOW)
    by = a._effective_by_target()
    for target, nodes in a.topology.paths.items():
        for node in nodes:
            got = by.get(target, {}).get(node, [])
            want = _plain(a, target, node)
            assert [(k.key, res.leaves) for k, res in got] == [(ep.kind.key, ep.result.leaves) for ep in want], \
                f"{target} on {node}"
    # and nothing is listed for a path or target that has none
    assert all(eps for per_path in by.values() for eps in per_path.values())
    assert [ep.target for ep in a.effective] == sorted((ep.target for ep in a.effective), key=lambda r: r.sort_key())


@SETTINGS
@given(cluster_with_mapped_fields())
def test_affected_is_what_each_item_draws_on(objs) -> None:
    a = analyse(copy.deepcopy(objs), now=NOW)
    want: dict[Any, dict[Any, set]] = {}
    for ep in a.effective:
        for source in ep.result.policies:
            want.setdefault(ep.target.object, {}).setdefault(ep.kind.key, set()).add(source)
    assert a.affected == want


def test_breadcrumbs_leave_the_object_and_other_writers_entries_untouched() -> None:
    other = {"parentRef": {"name": "gw", "namespace": "a"}, "controllerName": "example.io/other",
             "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                             "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    ours = {"parentRef": {"name": "gw", "namespace": "a"}, "controllerName": "gwpolicy.io/policy-controller",
            "conditions": [{"type": "gwpolicy.io/FieldPolicyAffected", "status": "True", "reason": "PolicyAffected",
                            "message": "old", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    objs = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("cls"), "spec": {"controllerName": "x/y"}},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta("gw", "a"),
         "spec": {"gatewayClassName": "cls", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
         "status": {"conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed", "message": "",
                                    "lastTransitionTime": "2020-01-01T00:00:00Z"}]}},
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("r", "a"),
         "spec": {"parentRefs": [{"name": "gw"}]}, "status": {"parents": [other, ours]}},
        {"apiVersion": "example.io/v1", "kind": "FieldPolicy", "metadata": meta("p", "a"),
         "spec": {"targetRef": {"group": GW, "kind": "HTTPRoute", "name": "r"}, "defaults": {"x": 1}}},
    ]
    before = copy.deepcopy(objs)
    a = analyse(objs, now=NOW)
    changes = {ch.object.kind: ch for ch in a.status_changes()}
    assert objs == before  # the input is never written to
    route = a.index.by_ref[changes["HTTPRoute"].object]
    parents = changes["HTTPRoute"].status["parents"]
    assert parents[0] == other  # the other controller's entry, where it was
    assert parents[1]["conditions"][0]["message"].startswith("Affected by a FieldPolicy")
    # the change is what a computation over a deep copy of the object gives
    status, annotations = breadcrumbs(copy.deepcopy(route), ["FieldPolicy"], a.topology, a.controller, NOW)
    assert (status, annotations) == (changes["HTTPRoute"].status, changes["HTTPRoute"].annotations)
    assert route.raw == before[2]


def test_a_route_edit_in_place_reads_the_routes_new_mapped_field() -> None:
    """A kind that maps a setting onto a route field (S5.2 rule 4): after an in-place edit of that
    field, the route's effective policy holds the new value, as a full analysis of the edited
    objects does (the value read from the old copy was kept before)."""
    objs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta("a")},
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("cls"), "spec": {"controllerName": "x/y"}},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta("gw", "a"),
         "spec": {"gatewayClassName": "cls", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKind", "metadata": meta("timeoutpolicy"),
         "spec": {"group": "example.io", "kind": "TimeoutPolicy", "attachment": "Inherited",
                  "fieldMappings": [{"setting": "request", "targetKind": {"group": GW, "kind": "HTTPRoute"},
                                     "field": "spec.timeouts.request"}]}},
        {"apiVersion": "example.io/v1", "kind": "TimeoutPolicy", "metadata": meta("t", "a"),
         "spec": {"targetRef": {"group": GW, "kind": "Gateway", "name": "gw"}, "defaults": {"request": "10s"}}},
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("r", "a"),
         "spec": {"parentRefs": [{"name": "gw"}], "timeouts": {"request": "1s"}, "rules": [{}]}},
    ]
    a = analyse(copy.deepcopy(objs), now=NOW)
    edited = copy.deepcopy(objs[-1])
    edited["spec"]["timeouts"]["request"] = "5s"
    assert apply_change(a, objs[-1], copy.deepcopy(edited)) is not None  # handled in place
    full = analyse(copy.deepcopy(objs[:-1] + [edited]), now=NOW)

    def route_specs(analysis):
        return [ep.result.spec for ep in analysis.effective if ep.target.kind == "HTTPRoute"]

    assert route_specs(full) == [{"request": "5s"}]
    assert route_specs(a) == route_specs(full)
