"""Routes that hold the same value of a mapped field (S5.2 rule 4) share its contribution, so their
nodes share one context and one result; each still gets its own value, after in-place edits too."""

from __future__ import annotations

import copy

from gen import meta
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.inplace.apply import apply_change
from helpers import NOW

GW = "gateway.networking.k8s.io"


def _objects(values: dict[str, object]) -> list[dict]:
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
    ]
    for name, value in values.items():
        spec: dict = {"parentRefs": [{"name": "gw"}], "rules": [{"name": "api"}]}
        if value is not None:
            spec["timeouts"] = {"request": value}
        objs.append({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta(name, "a"), "spec": spec})
    return objs


def _requests(a) -> dict[str, object]:
    """Each route's (and rule's) effective request timeout."""
    return {str(ep.target): ep.result.spec.get("request") for ep in a.effective if ep.target.kind == "HTTPRoute"}


def test_equal_values_share_a_result_and_each_route_gets_its_own() -> None:
    a = analyse(_objects({"r1": "1s", "r2": "1s", "r3": "2s", "r4": 1, "r5": True, "r6": None}), now=NOW)
    got = _requests(a)
    assert got == {"HTTPRoute/a/r1": "1s", "HTTPRoute/a/r1#api": "1s", "HTTPRoute/a/r2": "1s",
                   "HTTPRoute/a/r2#api": "1s", "HTTPRoute/a/r3": "2s", "HTTPRoute/a/r3#api": "2s",
                   "HTTPRoute/a/r4": 1, "HTTPRoute/a/r4#api": 1, "HTTPRoute/a/r5": True, "HTTPRoute/a/r5#api": True,
                   "HTTPRoute/a/r6": "10s", "HTTPRoute/a/r6#api": "10s"}
    assert type(got["HTTPRoute/a/r4"]) is int and type(got["HTTPRoute/a/r5"]) is bool  # 1 and True kept apart
    result = {str(ep.target): ep.result for ep in a.effective if ep.target.kind == "HTTPRoute"}
    assert result["HTTPRoute/a/r1"] is result["HTTPRoute/a/r2"]
    assert result["HTTPRoute/a/r1#api"] is result["HTTPRoute/a/r2#api"]
    assert result["HTTPRoute/a/r1"] is not result["HTTPRoute/a/r3"]


def test_in_place_edits_of_a_shared_value_equal_a_full_analysis() -> None:
    objs = _objects({"r1": "1s", "r2": "1s", "r3": "2s"})
    a = analyse(copy.deepcopy(objs), now=NOW)
    for value in ("2s", "1s", None, "1s", {"nested": "x"}, "1s"):
        old = next(o for o in objs if o["metadata"]["name"] == "r1")
        new = copy.deepcopy(old)
        if value is None:
            new["spec"].pop("timeouts", None)
        else:
            new["spec"]["timeouts"] = {"request": value}
        assert apply_change(a, copy.deepcopy(old), copy.deepcopy(new)) is not None  # in place
        objs = [new if o is old else o for o in objs]
        full = analyse(copy.deepcopy(objs), now=NOW)
        assert _requests(a) == _requests(full), value
        assert _requests(a)["HTTPRoute/a/r2"] == "1s"
