"""RegularExpression matches mean what RE2's full match means, `^` and `$` included
(docs/gateway.md "Regular expression paths" and "Matches").

A header, a query parameter or a path matches an expression exactly when RE2 (`re2.fullmatch`)
matches the whole value (one that is not empty): with `^`, `$`, both or neither, in the first place of the match map or
after another condition. A hypothesis property sends real requests through real NGINX on
loopback (127.0.74.0/24) and compares each answer with Python's `re2`; a bounded number of
examples (one NGINX reload each) keeps it well under a minute.
"""

from __future__ import annotations

from typing import Any, Iterator
from urllib.parse import quote

import pytest
import re2
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway_kit import Echoes, Served, backend, free_port, gateway, gatewayclass, have_nginx, listener, request, route
from gwpolicy.gateway import pathregex
from gwpolicy.refs import GATEWAY_GROUP, Ref

ADDR = "127.0.74.1"
BACKENDS = "127.0.74.2"
GW_REF = Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")

#: values over a small alphabet, so that random expressions match some and miss others (an empty
#: value never matches: see test_an_empty_or_missing_value_never_matches)
VALUE = st.text(alphabet="ab0-", min_size=1, max_size=5)
ATOMS = ["a", "b", "0", "-", ".", "[ab]", "[^a]", r"\d", "a*", "b+", "0?", "(a|b)", "(?:ab)", "[a0]{1,2}", "(ab)+"]


@st.composite
def expressions(draw: Any) -> str:
    """An expression of the dialect with `^`, `$`, both or neither (also inside alternatives)."""
    def seq() -> str:
        return "".join(draw(st.lists(st.sampled_from(ATOMS), min_size=1, max_size=3)))

    def anchored(body: str) -> str:
        return ("^" if draw(st.booleans()) else "") + body + ("$" if draw(st.booleans()) else "")

    value = anchored(seq())
    if draw(st.integers(0, 3)) == 0:
        value = value + "|" + anchored(seq())
    assume(pathregex.problem(value) is None)  # e.g. `a*a*`: refused, see test_gateway_regex.py
    return value


def _tag(tag: str) -> list[dict[str, Any]]:
    return [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "X-Rule", "value": tag}]}}]


class World:
    def __init__(self, served: Served, echoes: Echoes, port: int) -> None:
        self.served, self.echoes, self.port = served, echoes, port

    def serve(self, rules: list[dict[str, Any]]) -> None:
        rules = rules + [{"backendRefs": [backend("v1")], "filters": _tag("none")}]
        self.served.apply([gatewayclass(), gateway("gw", "infra", listener("http", self.port)), *self.echoes.objects(),
                           route("r", "infra", rules)])

    def rule(self, path: str, **headers: str) -> str:
        a = request(ADDR, self.port, path, "example.com", headers=headers)
        assert a.status in (200, 404), (a.status, path, headers)
        return a.headers.get("x-rule", "404")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if not have_nginx():
        pytest.skip("NGINX is not installed (./dev test installs it)")
    echoes = Echoes(BACKENDS).start("v1")
    served = Served(tmp_path_factory.mktemp("anchors") / "nginx", ADDR, GW_REF)
    try:
        yield World(served, echoes, free_port(ADDR))
    finally:
        served.stop()
        echoes.stop()


def test_an_anchored_header_expression_after_another_condition_matches(world: World) -> None:
    """The common way to write one: `^u[0-9]+$` on X-User, after an Exact header condition."""
    world.serve([{"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                               "headers": [{"name": "X-Env", "value": "canary"},
                                           {"name": "X-User", "type": "RegularExpression", "value": "^u[0-9]+$"}]}],
                  "backendRefs": [backend("v1")], "filters": _tag("user")}])
    assert world.rule("/", **{"X-Env": "canary", "X-User": "u42"}) == "user"
    assert world.rule("/", **{"X-Env": "canary", "X-User": "u42x"}) == "none"
    assert world.rule("/", **{"X-Env": "blue", "X-User": "u42"}) == "none"


def test_an_empty_or_missing_value_never_matches(world: World) -> None:
    """NGINX cannot tell an empty header from a missing one: neither matches, not even `.*` (a
    rule on a header never takes a request without it)."""
    world.serve([{"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                               "headers": [{"name": "X-V", "type": "RegularExpression", "value": ".*"}],
                               "queryParams": [{"name": "v", "type": "RegularExpression", "value": "a*"}]}],
                  "backendRefs": [backend("v1")], "filters": _tag("both")}])
    assert world.rule("/?v=a", **{"X-V": "x"}) == "both"
    assert world.rule("/?v=a") == "none"
    assert world.rule("/?v=a", **{"X-V": ""}) == "none"
    assert world.rule("/?v=", **{"X-V": "x"}) == "none"
    assert world.rule("/", **{"X-V": "x"}) == "none"


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(expressions(), st.lists(VALUE, min_size=4, max_size=6, unique=True)), min_size=3, max_size=4))
def test_header_query_and_path_expressions_match_what_re2_fully_matches(world: World,
                                                                       cases: list[tuple[str, list[str]]]) -> None:
    """Per expression three rules: on a header after an Exact header condition, on a query
    parameter, on the path under its own prefix; each value is sent to each, and the rule that
    answers is the one RE2's full match says (else the catch-all)."""
    rules = []
    for i, (rx, _) in enumerate(cases):
        rules += [
            {"matches": [{"path": {"type": "PathPrefix", "value": f"/h{i}"},
                          "headers": [{"name": "X-A", "value": "1"}, {"name": "X-V", "type": "RegularExpression", "value": rx}]}],
             "backendRefs": [backend("v1")], "filters": _tag(f"h{i}")},
            {"matches": [{"path": {"type": "PathPrefix", "value": f"/q{i}"},
                          "queryParams": [{"name": "v", "type": "RegularExpression", "value": rx}]}],
             "backendRefs": [backend("v1")], "filters": _tag(f"q{i}")},
            {"matches": [{"path": {"type": "RegularExpression", "value": f"/p{i}/(?:{rx})"}}],
             "backendRefs": [backend("v1")], "filters": _tag(f"p{i}")},
        ]
    world.serve(rules)
    for i, (rx, values) in enumerate(cases):
        for v in values:
            want = re2.fullmatch(rx, v) is not None
            assert world.rule(f"/h{i}", **{"X-A": "1", "X-V": v}) == (f"h{i}" if want else "none"), (rx, v, "header")
            assert world.rule(f"/q{i}?v={quote(v)}") == (f"q{i}" if want else "none"), (rx, v, "query")
            path_want = re2.fullmatch(f"/p{i}/(?:{rx})", f"/p{i}/{v}") is not None
            assert world.rule(f"/p{i}/{quote(v)}") == (f"p{i}" if path_want else "none"), (rx, v, "path")
