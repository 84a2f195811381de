"""A controller's analysis checks again only what changed of an object whose spec it found right
last time, and finds the same problems as a check of everything."""

from __future__ import annotations

import copy

from gwpolicy import shapes
from gwpolicy.refs import GATEWAY_GROUP

GW = f"{GATEWAY_GROUP}/v1"


def _route(name: str, **extra) -> dict:
    return {"apiVersion": GW, "kind": "HTTPRoute", "metadata": {"name": name, "namespace": "a"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["a.example.com"]}, **extra}


def test_a_spec_found_right_is_not_checked_again_and_the_rest_is() -> None:
    objs = [_route("r1"), _route("r2"), _route("bad", spec={"hostnames": [5]})]
    checked = shapes.CheckedSpecs()
    with shapes.remembering(checked):
        first = shapes.problems(objs)
    assert first == [None, None, "spec.hostnames[0]: must be a string, not a number (5)"]
    assert {id(o["spec"]) for o in objs[:2]} == set(checked.specs)  # a spec with a problem is not kept
    # the next copies: the same specs (as the store shares them), a new status, one of them wrong
    again = [dict(objs[0], status={"parents": [{"parentRef": {"name": 7}}]}), dict(objs[1], status={}), objs[2]]
    calls = []
    real = shapes._CHECKERS[(GATEWAY_GROUP, "HTTPRoute")]
    try:
        shapes._CHECKERS[(GATEWAY_GROUP, "HTTPRoute")] = lambda v: calls.append(set(v)) or real(v)
        with shapes.remembering(checked):
            second = shapes.problems(again)
    finally:
        shapes._CHECKERS[(GATEWAY_GROUP, "HTTPRoute")] = real
    assert second == shapes.problems(copy.deepcopy(again)) == [
        "status.parents[0].parentRef.name: must be a string, not a number (7)", None,
        "spec.hostnames[0]: must be a string, not a number (5)"]
    assert calls[:2] == [{"apiVersion", "kind", "metadata", "status"}] * 2 and "spec" in calls[2]


def test_the_same_spec_under_another_kind_is_checked_again() -> None:
    spec = {"parentRefs": [{"name": "gw"}], "ports": 3}  # right for a route (it reads no ports), not for a Service
    checked = shapes.CheckedSpecs()
    with shapes.remembering(checked):
        assert shapes.problems([_route("r", spec=spec)]) == [None]
        # the same spec object under another kind is not taken as checked for that kind
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": spec}
        assert shapes.problems([svc]) == ["spec.ports: must be a list, not a number (3)"]
        assert checked.specs == {}
        assert shapes.problems([_route("r", spec=spec)]) == [None]
        spec["parentRefs"] = 5  # changed in place: a promise broken, but a new value is checked

def test_one_list_under_two_fields_is_judged_by_each_shape() -> None:
    shared = [{"name": "gw", "kind": 5}]  # right as a Service's ports (no kind there), wrong as a grant's `to`
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": shared}}
    grant = {"apiVersion": f"{GATEWAY_GROUP}/v1beta1", "kind": "ReferenceGrant", "metadata": {"name": "g"},
             "spec": {"to": shared, "from": [{"kind": "HTTPRoute", "namespace": "a"}]}}
    again = dict(svc, metadata={"name": "s2"})
    assert shapes.problems([svc, grant, again]) == [None, "spec.to[0].kind: must be a string, not a number (5)", None]
