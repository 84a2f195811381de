"""A route's breadcrumbs keep every other writer's entry in its place and replace ours in place, for
any status.parents (entries of other controllers, ours under the same parentRef twice, gone or new
parentRefs, conditions of any types): `breadcrumbs`, which makes each entry's key once, gives what
the plain composition of `keep_places` and `find_condition` gives."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy.model import Obj
from gwpolicy.refs import GATEWAY_GROUP, Ref
from gwpolicy.status import (
    ANNOTATION,
    MAX_CONDITIONS,
    MAX_PARENTS,
    _affected_messages,
    _parent_key,
    annotation_only,
    annotation_says,
    breadcrumbs,
    condition,
    find_condition,
    keep_places,
)
from gwpolicy.topology import Topology

ME, OTHER = "gwpolicy.io/policy-controller", "example.com/other"
NOW = "2026-01-01T00:00:00Z"
_REFS = st.fixed_dictionaries({"name": st.sampled_from(["gw0", "gw1"])},
                              optional={"sectionName": st.sampled_from(["http", "https"]), "namespace": st.just("a"),
                                        "port": st.sampled_from([80, 443])})
_TYPES = st.sampled_from(["gwpolicy.io/RetryPolicyAffected", "gwpolicy.io/TimeoutPolicyAffected", "Accepted", 7, None])
_CONDITIONS = st.lists(st.one_of(st.fixed_dictionaries(
    {"type": _TYPES}, optional={"status": st.sampled_from(["True", "False"]), "lastTransitionTime": st.sampled_from(
        ["2025-01-01T00:00:00Z", ""]), "message": st.just("old")}), st.just("junk")), max_size=4)
_ENTRIES = st.lists(st.one_of(st.fixed_dictionaries(
    {"parentRef": _REFS, "controllerName": st.sampled_from([ME, OTHER]), "conditions": _CONDITIONS}), st.just(3)),
    max_size=5)


def _reference(obj: Obj, kinds: list[str], parent_refs: list[dict]) -> dict:
    """The route branch of `breadcrumbs` as it was written first: keep_places and find_condition."""
    status = dict(obj.raw.get("status") or {})
    describe = f"gwpolicy describe httproute/{obj.name} -n {obj.namespace}"
    parents = [p for p in status.get("parents") or [] if isinstance(p, dict)]
    kept = [p for p in parents if p.get("controllerName") != ME]
    previous = {_parent_key(p.get("parentRef") or {}): p for p in parents if p.get("controllerName") == ME}
    room = max(0, MAX_PARENTS - len(kept))
    ours = []
    if kinds:
        messages = _affected_messages(kinds, MAX_CONDITIONS, describe)
        for pref in parent_refs[:room]:
            prev = previous.get(_parent_key(pref))
            prev_conds = (prev or {}).get("conditions")
            ours.append({"parentRef": dict(pref), "controllerName": ME,
                         "conditions": [condition(t, "True", "PolicyAffected", m, obj.generation,
                                                  find_condition(prev_conds, t), NOW) for t, m in messages]})
    if ours or len(kept) != len(parents):
        status["parents"] = keep_places(parents, ours, lambda p: p.get("controllerName") == ME,
                                        lambda p: _parent_key(p.get("parentRef") or {}))
    return status


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ENTRIES, st.lists(_REFS, min_size=1, max_size=3),
       st.lists(st.sampled_from(["RetryPolicy", "TimeoutPolicy", "TLSPolicy"]), max_size=3))
def test_breadcrumbs_keep_places_as_keep_places_does(entries, parent_refs, kinds) -> None:
    ref = Ref(GATEWAY_GROUP, "HTTPRoute", "a", "r")
    raw = {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "HTTPRoute",
           "metadata": {"name": "r", "namespace": "a", "generation": 2}, "spec": {"parentRefs": parent_refs},
           "status": {"parents": entries, "other": 1}}
    obj = Obj(raw, ref, "v1", "test")
    topo = Topology()
    topo.route_parents[ref] = parent_refs
    status, _ = breadcrumbs(obj, kinds, topo, ME, NOW)
    assert status == _reference(obj, sorted(set(kinds)), parent_refs)


_ANNOTATIONS = st.one_of(st.none(), st.just("x"), st.dictionaries(
    st.sampled_from([ANNOTATION, "other"]), st.sampled_from(["true", "false", ""]), max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([("", "Service"), ("", "Namespace"), ("example.io", "RetryPolicy")]), _ANNOTATIONS,
       st.one_of(st.none(), st.just({"conditions": []}), st.just(5)), st.booleans())
def test_an_annotation_that_already_says_it_is_exactly_a_write_that_changes_nothing(gk, annotations, status,
                                                                                     affected) -> None:
    group, kind = gk
    meta = {"name": "s", "namespace": "a"}
    if annotations is not None:
        meta["annotations"] = annotations
    raw = {"apiVersion": f"{group}/v1" if group else "v1", "kind": kind, "metadata": meta}
    if status is not None:
        raw["status"] = status
    obj = Obj(raw, Ref(group, kind, "a", "s"), "v1", "test")
    assert annotation_only(obj)
    got_status, got_annotations = breadcrumbs(obj, ["RetryPolicy"] if affected else [], Topology(), ME, NOW)
    unchanged = got_status == (status if isinstance(status, dict) else {}) and \
        got_annotations == (dict(annotations) if isinstance(annotations, dict) else {})
    assert annotation_says(obj, affected) == unchanged
