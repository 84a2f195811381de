"""Issue 12, "Wrong answers": each corner that once gave a silently wrong answer, as a user sees it."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from build import GW, gateway, gatewayclass, namespace, parent, policy, route, target
from gen import cluster
from gwpolicy.analysis import analyse
from gwpolicy.output import effective_list, status_list
from helpers import NOW

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def paths_of(a, target_text: str) -> list[str]:
    return sorted({repr(p) for t, ps in a.topology.paths.items() if str(t) == target_text for p in ps})


def specs_of(a, target_text: str, kind: str) -> list[dict]:
    return [ep.result.spec for ep in a.effective if str(ep.target) == target_text and ep.kind.kind == kind]


# --- item 1: a Namespace is placed once, with or without the GatewayClass object (S4.2) ---

def _gateway_and_route_in_one_namespace(with_class: bool) -> list[dict]:
    objs = [gateway("g", "a"), route("r", "a", [parent("g")]),
            policy("TimeoutPolicy", "ns-defaults", "a", target("Namespace", "a"), defaults={"timeout": "1s"}),
            policy("TimeoutPolicy", "gw-defaults", "a", target("Gateway", "g"), defaults={"timeout": "2s"})]
    return ([gatewayclass()] if with_class else []) + objs


def test_without_the_gatewayclass_a_namespace_is_still_placed_once():
    a = analyse(_gateway_and_route_in_one_namespace(with_class=False), now=NOW)
    assert paths_of(a, "HTTPRoute/a/r") == ["Namespace/a > Gateway/a/g > Gateway/a/g#http > HTTPRoute/a/r"]
    # the Gateway is more specific than its Namespace: its default wins, as with the class present
    assert specs_of(a, "HTTPRoute/a/r", "TimeoutPolicy") == [{"timeout": "2s"}]
    with_class = analyse(_gateway_and_route_in_one_namespace(with_class=True), now=NOW)
    assert specs_of(with_class, "HTTPRoute/a/r", "TimeoutPolicy") == [{"timeout": "2s"}]


def _without_class_levels(doc: dict) -> dict:
    for item in doc["items"]:
        item["path"] = [lv for lv in item["path"] if lv["kind"] != "GatewayClass"]
    return doc


def _drop_class_targets(objs: list[dict]) -> list[dict]:
    """The cluster with no policy naming the GatewayClass (those differ by design: it exists or not)."""
    out = []
    for o in copy.deepcopy(objs):
        spec = o.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("targetRefs"), list):
            spec["targetRefs"] = [t for t in spec["targetRefs"] if t.get("kind") != "GatewayClass"]
            if not spec["targetRefs"]:
                continue
        out.append(o)
    return out


@PROPERTY
@given(cluster())
def test_the_result_does_not_depend_on_the_gatewayclass_object_being_there(objs) -> None:
    objs = _drop_class_targets(objs)
    without = [o for o in objs if o["kind"] != "GatewayClass"]
    a, b = analyse(copy.deepcopy(objs), now=NOW), analyse(copy.deepcopy(without), now=NOW)
    assert _without_class_levels(effective_list(a)) == effective_list(b)
    status_a = [i for i in status_list(a)["items"] if i["object"]["kind"] != "GatewayClass"]
    assert status_a == status_list(b)["items"]
