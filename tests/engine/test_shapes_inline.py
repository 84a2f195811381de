"""The shape checkers accept the fields they can tell at a glance (a string where a string goes)
without calling the field's checker; for every value they say exactly what the plain checkers say."""

from __future__ import annotations

from datetime import date

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy import shapes

_KEYS = ["name", "namespace", "group", "kind", "port", "sectionName", "status", "type", "reason", "message",
         "lastTransitionTime", "observedGeneration", "parents", "parentRef", "controllerName", "conditions",
         "spec", "parentRefs", "hostnames", "rules", "backendRefs", "labels", "annotations", "listeners",
         "hostname", "allowedRoutes", "namespaces", "from", "selector", "matchLabels", "ports", "targetPort",
         "additionalProperties", "weight", "metadata", "ancestors", "ancestorRef", "x"]
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False),
                     st.sampled_from(["", "a", "gw"]), st.just(date(2026, 1, 1)))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=5)), max_leaves=25)


def _plain(shape):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shapes, "_accepted_outright", lambda s: None)
        return shapes._compile(shape, {})


_SHAPES = [*shapes.KIND_SHAPES.values(), shapes.POLICY_STATUS, shapes.METADATA, shapes.CONDITION, shapes.CRD]
_PAIRS = [(shapes._compile(s, {}), _plain(s)) for s in _SHAPES]


def _text(fault):
    return None if fault is None else fault.text()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(_PAIRS))), _VALUES)
def test_inline_checks_say_what_the_plain_checks_say(which, value) -> None:
    fast, plain = _PAIRS[which]
    assert _text(fast(value)) == _text(plain(value))


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_a_route_status_with_any_values_is_judged_alike(value) -> None:
    fast, plain = shapes._compile(shapes.ROUTE, {}), _plain(shapes.ROUTE)
    route = {"status": {"parents": [{"parentRef": {"name": "gw", "port": value}, "conditions": [{"type": value}]}]},
             "spec": {"hostnames": ["a", value], "parentRefs": [{"name": value}]}}
    assert _text(fast(route)) == _text(plain(route))


def test_a_wrong_type_among_right_ones_is_still_named() -> None:
    check = shapes._compile(shapes.ROUTE, {})
    route = {"spec": {"hostnames": ["a.example.com", 5]},
             "status": {"parents": [{"parentRef": {"name": "gw"}, "conditions": [{"type": "A", "observedGeneration": True}]}]}}
    assert check(route).text() == "spec.hostnames[1]: must be a string, not a number (5)"
    del route["spec"]
    assert check(route).text() == "status.parents[0].conditions[0].observedGeneration: must be an integer, not true"
