"""HTTPRoute `RegularExpression` path matches (docs/gateway.md "Regular expression paths").

The dialect (pathregex: RE2's syntax, compiled by NGINX's PCRE2), the precedence (Exact, then
RegularExpression, longer expression first, then the longest PathPrefix, then the spec's
tie-breakers) as properties of the data plane and, for a bounded sample, of real NGINX, and traffic
through real NGINX on loopback (127.0.17.0/24): a regex route, its precedence against Exact and
PathPrefix, its conditions and filters, an invalid expression left out with status while the rest
serves, expressions that try to smuggle NGINX syntax, a policy on a regex route.
"""

from __future__ import annotations

import http.client
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_kit import (
    TEST_ENDPOINT_FLAGS,
    TEST_ENDPOINTS,
    Echoes,
    Served,
    backend,
    free_port,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    nginx_choice,
    request,
    route,
)
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.model import build_index
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway import pathregex, policyconf
from gwpolicy.gateway.dataplane import Action, DataPlaneConfig, MatchRule, VirtualHost, build_dataplane
from gwpolicy.gateway.dataplane.order import place_locations, segment_prefix
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER, gateway_facts
from gwpolicy.gateway.render import render

ADDR = "127.0.17.1"
BACKENDS = "127.0.17.2"
needs_nginx = pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")


def rx(value: str, **extra: Any) -> dict[str, Any]:
    return {"path": {"type": "RegularExpression", "value": value}, **extra}


def path(value: str, type: str = "PathPrefix", **extra: Any) -> dict[str, Any]:
    return {"path": {"type": type, "value": value}, **extra}


def rule(*matches: dict[str, Any], to: str = "v1", filters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"matches": list(matches), "backendRefs": [backend(to)]}
    if filters:
        r["filters"] = filters
    return r


def tagged(tag: str) -> list[dict[str, Any]]:
    """A ResponseHeaderModifier that says which rule answered (X-Rule)."""
    return [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "X-Rule", "value": tag}]}}]


# ---------------------------------------------------------------------------------------------
# the dialect


@pytest.mark.parametrize("value", [
    "/users/[0-9]+", "^/a$", "/a/.*", "/(a|b)+/x?", "(?i)/CaSe", "/[[:alpha:]]+", r"/\d{2,4}", r"/\Q.*\E", "/x{",
    '/a"; return 200 pwned;.*', "/b}; location / { return 200; }", r"/c\\", "/d'e", "/$host",
])
def test_expressions_in_re2s_syntax_are_accepted(value: str) -> None:
    assert pathregex.problem(value) is None


@pytest.mark.parametrize("value, why", [
    (r"/(a)\1", "RE2"),  # backreference
    ("/(?=a)", "RE2"), ("/(?<!a)b", "RE2"), ("/(?>a)", "RE2"), ("/a++", "RE2"),  # lookaround, atomic, possessive
    ("/(a", "RE2"), ("*", "RE2"), ("/a{2,1}", "RE2"), ("\\", "RE2"), ("(?x) a", "RE2"),
    ("(?P<host>.*)", "named groups"), ("(?<n>x)", "named groups"),  # NGINX would make them variables ($host!)
    (r"/\x{100}", "PCRE2"),  # RE2 takes it, NGINX's PCRE2 (no UTF mode) does not
    ("/caf\u00e9", "ASCII"), ("/a\nb", "ASCII"), ("/a\x00", "ASCII"),
    ("", "empty"), ("/" * 1025, "longer"),
])
def test_expressions_outside_the_dialect_are_refused_with_a_reason(value: str, why: str) -> None:
    got = pathregex.problem(value)
    assert got is not None and why in got, got


REGEX_CHARS = "ab/.*+?|()[]{}^$\\-0123,:=!<>P'\"; #"


def _random_expressions(n: int, seed: int = 7) -> list[str]:
    rnd = random.Random(seed)
    return ["".join(rnd.choice(REGEX_CHARS) for _ in range(rnd.randint(1, 8))) for _ in range(n)]


@needs_nginx
def test_every_expression_the_dialect_accepts_loads_in_nginx_and_no_refused_one_reaches_it(tmp_path: Path) -> None:
    """400 random strings of regex syntax: each one accepted is in the rendered files, NGINX loads
    them all together; each one refused is in no file (and in the route fact)."""
    values = sorted(set(_random_expressions(400)))
    accepted = [v for v in values if pathregex.problem(v) is None]
    refused = [v for v in values if pathregex.problem(v) is not None]
    assert len(accepted) > 40 and len(refused) > 40  # the sample exercises both sides
    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 8080)), *_services(["v1"]),
            route("r", "infra", [rule(rx(v)) for v in values])]
    dp = build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}))
    files = render(dp)
    maps = files["maps.conf"].decode()
    for v in accepted:
        assert _conf_string_of(pathregex.ANCHORED.format(v)) in maps, v
    unsupported = {m for _, m in dp.routes[Ref(GATEWAY_GROUP, "HTTPRoute", "infra", "r")].unsupported}
    assert len(unsupported) == len(refused)
    out = _nginx_t(tmp_path, files)
    assert out.returncode == 0, out.stderr[-2000:]


def _conf_string_of(regex: str) -> str:
    return '"~' + regex.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _nginx_t(tmp: Path, files: dict[str, bytes]) -> subprocess.CompletedProcess[str]:
    gen = tmp / "gen"
    for rel, data in files.items():
        (gen / rel).parent.mkdir(parents=True, exist_ok=True)
        (gen / rel).write_bytes(data)
    for d in ("run", "logs"):
        (tmp / d).mkdir(exist_ok=True)
    return subprocess.run([shutil.which("nginx") or "nginx", "-t", "-p", f"{gen}/", "-c", str(gen / "nginx.conf"),
                           "-e", str(tmp / "logs" / "t.log")], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------
# precedence, as a property of the data plane's locations and candidate lists

SEGMENTS = ["a", "b", "ab"]
PATHS = st.lists(st.sampled_from(SEGMENTS), min_size=0, max_size=3).map(lambda s: "/" + "/".join(s))
#: expressions over the same small alphabet; Python's re means the same as RE2 and PCRE2 for these
REGEXES = st.sampled_from(["/a", "/a/.*", "/a.*", "/[ab]+", "/(a|b)/b", "/.*", "/b?", "/a(/b)?", "(/ab)+", "/.*/b",
                           "/a/(ab|b)", "/[^a]*"])


def _model_path_ok(r: MatchRule, p: str) -> bool:
    a = r.action
    if a.path_type == "Exact":
        return a.path_value == p
    if a.path_type == "RegularExpression":
        return re.fullmatch(a.path_value, p) is not None
    return segment_prefix(a.path_value, p)


def _spec_choice(rules_: list[MatchRule], p: str, method: str, headers: set[str]) -> MatchRule | None:
    """The precedence this data plane chose, straight from docs/gateway.md: of every matching rule,
    Exact first, then RegularExpression (longer expression first), then the longest PathPrefix,
    then method, most headers, most query parameters, oldest route, namespace/name, rule order."""
    def key(r: MatchRule) -> tuple[Any, ...]:
        a = r.action
        return ({"Exact": 0, "RegularExpression": 1, "PathPrefix": 2}[a.path_type], -len(a.path_value),
                0 if r.method else 1, -len(r.headers), -len(r.query), r.created, r.route_key, a.rule, a.match)
    hits = [r for r in rules_ if _model_path_ok(r, p) and (r.method is None or r.method == method)
            and all(h[1] in headers for h in r.headers)]
    return min(hits, key=key) if hits else None


@st.composite
def match_rules(draw: Any) -> list[MatchRule]:
    out = []
    for i in range(draw(st.integers(1, 8))):
        ptype = draw(st.sampled_from(["Exact", "PathPrefix", "RegularExpression", "RegularExpression"]))
        value = draw(REGEXES) if ptype == "RegularExpression" else draw(PATHS)
        if ptype == "PathPrefix" and len(value) > 1:
            value = value.rstrip("/")
        action = Action(f"r{i}", Ref(GATEWAY_GROUP, "HTTPRoute", "ns", f"route{i % 3}"), i, 0,
                        Ref(GATEWAY_GROUP, "Gateway", "ns", "gw", "l"), "http", 80, ptype, value, (), [], {}, ())
        headers = tuple(("Exact", n, "1") for n in draw(st.lists(st.sampled_from(["x", "y"]), unique=True, max_size=2)))
        method = draw(st.sampled_from([None, None, "POST"]))
        out.append(MatchRule(action, method, headers, (), f"2024-01-0{1 + i % 3}", f"ns/route{i % 3}"))
    return out


@settings(max_examples=500, deadline=None)
@given(match_rules(), PATHS, st.booleans(), st.sets(st.sampled_from(["x", "y"])), st.booleans())
def test_the_rule_the_locations_pick_is_the_one_the_precedence_ranks_first(rules_: list[MatchRule], p: str, post: bool,
                                                                         headers: set[str], slash: bool) -> None:
    if slash and p != "/":
        p += "/"
    vh = VirtualHost("0", "")
    place_locations(vh, rules_)
    method = "POST" if post else "GET"
    want = _spec_choice(rules_, p, method, headers)
    got = nginx_choice(vh, p, method, headers)
    assert (got.action.id if got else None) == (want.action.id if want else None)


# ---------------------------------------------------------------------------------------------
# real NGINX on loopback

GW_REF = Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")


def _services(names: list[str], echoes: Echoes | None = None) -> list[dict[str, Any]]:
    if echoes is not None:
        return echoes.objects()
    from gateway_kit import endpoints, service

    out: list[dict[str, Any]] = []
    for n in names:
        out += [service(n, "infra"), *endpoints(n, "infra", [(BACKENDS, 9)])]
    return out


class World:
    def __init__(self, served: Served, echoes: Echoes, port: int) -> None:
        self.served, self.echoes, self.port = served, echoes, port
        self.files: dict[str, bytes] = {}

    def serve(self, *routes: dict[str, Any], extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        objs = [gatewayclass(), gateway("gw", "infra", listener("http", self.port)), *self.echoes.objects(),
                *(extra or []), *routes]
        self.files = self.served.files(objs)
        result = self.served.nginx.apply(self.files)
        assert result.ok, result.error
        return objs

    def conf(self) -> str:
        return "".join(v.decode() for k, v in self.files.items() if k.endswith(".conf"))

    def get(self, p: str, **kw: Any) -> Any:
        return request(ADDR, self.port, p, kw.pop("host", "example.com"), **kw)

    def post(self, p: str, body: bytes) -> int:
        conn = http.client.HTTPConnection(ADDR, self.port, timeout=5)
        try:
            conn.request("POST", p, body=body, headers={"Host": "example.com"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    def who(self, p: str, **kw: Any) -> str:
        """Which backend answered (v1, v2, v3), or the status code when none did."""
        a = self.get(p, **kw)
        if a.status != 200:
            return str(a.status)
        return a.pod.split("-")[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if not have_nginx():
        pytest.skip("NGINX is not installed (./dev test installs it)")
    echoes = Echoes(BACKENDS).start("v1", "v2", "v3")
    served = Served(tmp_path_factory.mktemp("gw") / "nginx", ADDR, GW_REF)
    try:
        yield World(served, echoes, free_port(ADDR))
    finally:
        served.stop()
        echoes.stop()


def test_a_regex_route_serves_exactly_the_paths_its_expression_matches_in_full(world: World) -> None:
    world.serve(route("users", "infra", [rule(rx("/users/[0-9]+")), rule(rx("^/anchored$"), to="v2")]))
    assert world.who("/users/42") == "v1"
    assert world.who("/anchored") == "v2" and world.who("/anchored/x") == "404"  # your own ^ and $ are harmless
    assert world.who("/users/42?tab=1") == "v1"  # the query is not part of the path
    assert world.who("/users/4%32") == "v1"  # matched against the decoded, normalised path, as Exact is
    assert world.who("/users//7") == "v1"  # NGINX merges the slashes first
    for miss in ("/users/42/x", "/users/abc", "/x/users/42", "/users/", "/"):
        assert world.who(miss) == "404", miss


def test_exact_beats_regex_beats_prefix_and_the_longer_expression_wins(world: World) -> None:
    world.serve(route("r", "infra", [
        rule(path("/users", "PathPrefix"), to="v2"),
        rule(rx("/users/[0-9]+"), to="v1"),
        rule(path("/users/0", "Exact"), to="v3"),
        rule(rx("/files/.*"), to="v2"),
        rule(rx("/files/img/.*"), to="v3"),
        rule(path("/files/img/special", "PathPrefix"), to="v1"),
    ]))
    assert world.who("/users/0") == "v3"  # Exact
    assert world.who("/users/7") == "v1"  # the regex, before the longer... shorter PathPrefix /users
    assert world.who("/users/x") == "v2"  # only the prefix matches
    assert world.who("/users") == "v2"
    assert world.who("/files/img/a.png") == "v3"  # the longer expression first
    assert world.who("/files/doc.txt") == "v2"
    assert world.who("/files/img/special/x") == "v3"  # a regex beats even a longer PathPrefix


def test_across_routes_the_regex_of_the_newer_route_still_beats_the_older_routes_prefix(world: World) -> None:
    world.serve(route("old", "infra", [rule(path("/api"), to="v2")], ts="2024-01-01T00:00:00Z"),
                route("new", "infra", [rule(rx("/api/v[0-9]+/.*"), to="v1")], ts="2024-06-01T00:00:00Z"),
                route("twin", "infra", [rule(rx("/api/v[0-9]+/.*"), to="v3")], ts="2024-07-01T00:00:00Z"))
    assert world.who("/api/v2/items") == "v1"  # equal expressions: the older route
    assert world.who("/api/other") == "v2"


def test_header_method_and_query_conditions_on_a_regex_rule_fall_back_like_prefix_rules(world: World) -> None:
    world.serve(route("r", "infra", [
        rule(path("/"), to="v2"),
        rule(rx("/shop/.*", headers=[{"name": "X-Env", "value": "canary"}]), to="v1"),
        rule(rx("/shop/.*", method="POST"), to="v3"),
        rule(path("/shop/cart", "Exact", headers=[{"name": "X-Env", "value": "blue"}]), to="v3"),
        rule(rx("/q/.*", queryParams=[{"name": "v", "type": "RegularExpression", "value": "[0-9]+"}]), to="v1"),
    ]))
    assert world.who("/shop/cart") == "v2"  # the Exact rule's header fails, so do the regexes': PathPrefix /
    assert world.who("/shop/cart", headers={"X-Env": "blue"}) == "v3"
    assert world.who("/shop/cart", headers={"X-Env": "canary"}) == "v1"  # Exact fails, then the regex
    assert world.who("/shop/cart", method="POST") == "v3"
    assert world.who("/shop/cart", method="POST", headers={"X-Env": "canary"}) == "v3"  # a method before headers
    assert world.who("/q/x?v=12") == "v1"
    assert world.who("/q/x?v=a") == "v2"


def test_filters_on_a_regex_rule_work_as_on_prefix_rules(world: World) -> None:
    world.serve(route("r", "infra", [
        rule(rx("/img/[a-z]+\\.png"), filters=[
            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-Seen", "value": "regex"}]}},
            {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "X-Out", "value": "yes"}]}}]),
        rule(rx("/old/.*"), filters=[{"type": "RequestRedirect", "requestRedirect": {
            "path": {"type": "ReplaceFullPath", "replaceFullPath": "/new"}, "statusCode": 301}}]),
        rule(rx("/v[0-9]/.*"), filters=[{"type": "URLRewrite", "urlRewrite": {
            "path": {"type": "ReplaceFullPath", "replaceFullPath": "/rewritten"}}}], to="v2"),
    ]))
    a = world.get("/img/cat.png")
    assert a.status == 200 and a.headers.get("x-out") == "yes"
    assert a.echo["headers"].get("X-Seen") == ["regex"]
    r = world.get("/old/page?x=1")
    assert r.status == 301 and r.headers["location"].endswith("/new?x=1")
    w = world.get("/v1/anything")
    assert w.status == 200 and w.echo["path"] == "/rewritten" and w.pod.startswith("v2")


def test_an_invalid_expression_never_reaches_nginx_the_route_says_why_and_the_rest_serves(world: World) -> None:
    bad = route("bad", "infra", [rule(rx("/(a)\\1")), rule(path("/still"), to="v2")])
    good = route("good", "infra", [rule(rx("/ok/[0-9]+"), to="v3")])
    objs = world.serve(bad, good)  # NGINX loaded it (apply asserts ok)
    assert "(a)" not in world.conf()
    assert world.who("/ok/1") == "v3"
    assert world.who("/still/x") == "v2"  # the route's valid rules are served (see docs/gateway.md)
    assert world.who("/aa") == "404"
    facts = gateway_facts(build_index(objs), GATEWAY_CONTROLLER)
    bad_parent = facts.routes[Ref(GATEWAY_GROUP, "HTTPRoute", "infra", "bad")].parents[0]
    assert (bad_parent.accepted.status, bad_parent.accepted.reason) == (False, "UnsupportedValue")
    assert "spec.rules[0].matches[0].path.value" in bad_parent.accepted.message
    assert "backreference" in bad_parent.accepted.message or "RE2" in bad_parent.accepted.message
    good_parent = facts.routes[Ref(GATEWAY_GROUP, "HTTPRoute", "infra", "good")].parents[0]
    assert (good_parent.accepted.status, good_parent.accepted.reason) == (True, "Accepted")


def test_expressions_cannot_smuggle_nginx_syntax(world: World) -> None:
    hostile = ['/a"; return 200 pwned;.*', "/b}; location / { return 200 pwned; }", "/c\\\\\"; return 200 pwned; #",
               "/d{1}'; return 200 pwned;", "/e$host", "/f\n return 200 pwned;"]
    world.serve(route("h", "infra", [rule(rx(v)) for v in hostile] + [rule(path("/"), to="v2")]))
    outside_quotes = re.sub(r'"(?:[^"\\]|\\.)*"', '""', world.conf())
    assert "pwned" not in outside_quotes
    assert world.who('/a%22;%20return%20200%20pwned;') == "v1"  # the literal characters, matched as a path
    assert world.who("/b%7D;%20location%20/%20%7B%20return%20200%20pwned;%20%7D") == "v1"
    assert world.who("/d'%3B%20return%20200%20pwned%3B") == "v1"
    for p in ("/", "/pwned", "/e", "/f"):
        a = world.get(p)
        assert a.status == 200 and a.pod.startswith("v2"), p  # the catch-all, never a smuggled `return`


def test_a_policy_on_a_regex_route_applies_to_its_matches_only(world: World) -> None:
    from test_gateway_policies import policy_manifests

    limit = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "RateLimitPolicy",
             "metadata": {"name": "rl", "namespace": "infra", "creationTimestamp": "2024-01-01T00:00:00Z", "generation": 1},
             "spec": {"targetRef": {"group": GATEWAY_GROUP, "kind": "HTTPRoute", "name": "limited"},
                      "default": {"requests": 1, "unit": "Minute", "burst": 1}}}
    world.serve(route("limited", "infra", [rule(rx("/api/v[0-9]+/.*"))]),
                route("free", "infra", [rule(path("/api"), to="v2")]),
                extra=policy_manifests() + [limit])
    assert [world.get(f"/api/v1/x{i}").status for i in range(4)] == [200, 200, 429, 429]
    assert [world.get(f"/api/other{i}").status for i in range(4)] == [200] * 4  # the prefix route has no limit


# ---------------------------------------------------------------------------------------------
# a bounded sample of random rule sets through real NGINX, against the same model

PROBES = ["/", "/a", "/b", "/ab", "/a/b", "/a/ab", "/b/a", "/ab/ab", "/a/b/a", "/b/b"]


@st.composite
def route_rules(draw: Any) -> list[tuple[str, str, bool]]:
    """(path type, value, needs header X-H: 1) per rule."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        ptype = draw(st.sampled_from(["Exact", "PathPrefix", "RegularExpression", "RegularExpression"]))
        value = draw(REGEXES) if ptype == "RegularExpression" else draw(PATHS)
        out.append((ptype, value, draw(st.booleans())))
    return out


@needs_nginx
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route_rules())
def test_nginx_routes_random_rules_as_the_precedence_model_says(world: World, spec: list[tuple[str, str, bool]]) -> None:
    rules_ = []
    models = []
    for i, (ptype, value, header) in enumerate(spec):
        m: dict[str, Any] = path(value, ptype)
        if header:
            m["headers"] = [{"name": "X-H", "value": "1"}]
        rules_.append(rule(m, filters=tagged(f"r{i}")))
        value = value.rstrip("/") or "/" if ptype == "PathPrefix" else value
        action = Action(f"r{i}", Ref(GATEWAY_GROUP, "HTTPRoute", "infra", "rand"), i, 0, GW_REF, "http", 80, ptype,
                        value, (), [], {}, ())
        models.append(MatchRule(action, None, (("Exact", "x-h", "1"),) if header else (), (), "t", "infra/rand"))
    world.serve(route("rand", "infra", rules_))
    for p in PROBES:
        for h in (False, True):
            want = _spec_choice(models, p, "GET", {"x-h"} if h else set())
            a = world.get(p, headers={"X-H": "1"} if h else {})
            got = a.headers.get("x-rule") if a.status == 200 else None
            assert got == (want.action.id if want else None), (p, h, spec)


# ---------------------------------------------------------------------------------------------
# the literal prefix that decides which locations list a regex rule

PATH_CHARS = "ab/"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=REGEX_CHARS, min_size=1, max_size=10),
       st.lists(st.text(alphabet=PATH_CHARS, max_size=6), min_size=1, max_size=20))
def test_every_path_an_expression_matches_starts_with_its_literal_prefix(value: str, paths: list[str]) -> None:
    """A regex rule is left out of the locations whose paths cannot start with its literal prefix:
    that is only right if no path it matches starts otherwise (checked with RE2 itself)."""
    import re2

    if pathregex.problem(value) is not None:
        return
    literal = pathregex.literal_prefix(value)
    compiled = re2.compile(pathregex.ANCHORED.format(value))
    for p in ["/" + p for p in paths] + [literal, literal + "a", literal + "/"]:
        if compiled.search(p) is not None:
            assert p.startswith(literal), (value, literal, p)


@pytest.mark.parametrize("value, literal", [
    ("/users/[0-9]+", "/users/"), ("^/api/v1/.*", "/api/v1/"), ("/api/(v1|v2)/x", "/api/"), ("/a|/b", ""),
    ("/ab?c", "/a"), ("/ab*", "/a"), ("/ab{0,2}", "/a"), ("/ab+", "/ab"), ("(?i)/api", ""), ("[/]x", ""),
    (r"\Q/a|b\E", ""), ("/x[|]y|z", ""), ("/x[]|]y", "/x"), ("/x(a|b)", "/x"),
])
def test_literal_prefixes(value: str, literal: str) -> None:
    assert pathregex.literal_prefix(value) == literal


def test_a_regex_rule_leaves_the_locations_it_cannot_reach_as_they_were(world: World) -> None:
    """A body size limit on a PathPrefix route is checked by NGINX before it knows the rule, so a
    regex rule in the same location would loosen it; one that cannot reach the location does not."""
    from test_gateway_policies import policy_manifests

    limit = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "ClientSettingsPolicy",
             "metadata": {"name": "body", "namespace": "infra", "creationTimestamp": "2024-01-01T00:00:00Z", "generation": 1},
             "spec": {"targetRef": {"group": GATEWAY_GROUP, "kind": "HTTPRoute", "name": "upload"},
                      "default": {"body": {"maxSize": "1k"}}}}
    world.serve(route("upload", "infra", [rule(path("/upload"))]),
                route("users", "infra", [rule(rx("/users/[0-9]+"), to="v2")]),
                extra=policy_manifests() + [limit])
    assert world.post("/upload/x", b"x" * 2048) == 413
    assert world.post("/upload/x", b"x" * 512) == 200
    assert world.who("/users/12") == "v2"
    block = world.conf().split("location /_v0/upload/ {")[1].split("}")[0]
    assert "client_max_body_size 1k;" in block and "$gw_m_" not in block


def test_a_host_with_hundreds_of_expressions_chains_its_maps_and_still_routes(world: World) -> None:
    """NGINX refuses a map source over 4 KiB: past REGEX_FIELDS_PER_MAP expressions a location's
    candidates continue in a second map (and a third), in the same precedence order."""
    from gwpolicy.gateway.rendermaps import REGEX_FIELDS_PER_MAP

    n = 2 * REGEX_FIELDS_PER_MAP + 30
    world.serve(route("many", "infra", [rule(rx(f"/n{i}/[0-9]+"), filters=tagged(f"r{i}")) for i in range(n)]
                      + [rule(path("/n5"), filters=tagged("prefix"))]))
    assert world.conf().count("rewrite ^ $gw_m_") >= 3  # the location's map and two more in the chain
    for i in (0, 9, 57, n - 1):
        a = world.get(f"/n{i}/42")
        assert (a.status, a.headers.get("x-rule")) == (200, f"r{i}"), i
    assert world.get("/n5/x").headers.get("x-rule") == "prefix"  # after all of them: the prefix
    assert world.get(f"/n{n}/1").status == 404


def test_gwpolicy_render_prints_the_golden_regex_configuration() -> None:
    """`gwpolicy render` of tests/golden/render/features/regex-paths (regenerate with GWPOLICY_UPDATE_GOLDEN=1 and
    test_gateway_render.py, which also runs `nginx -t` on it): the regex rules in their maps,
    the quoted expression that holds NGINX syntax, the refused one nowhere."""
    from helpers import run_cli

    golden = Path(__file__).resolve().parents[1] / "golden" / "render" / "features" / "regex-paths"
    run = run_cli("render", "-f", str(golden / "input.yaml"), "--file", "servers.conf", "--file", "maps.conf",
                  *TEST_ENDPOINT_FLAGS)
    assert run.code == 0, run.err
    want = "".join(f"# ==== {name} ====\n{(golden / 'out' / name).read_text()}\n" for name in ("maps.conf", "servers.conf"))
    assert run.out.strip() == want.strip()
    assert '"~^(?:/users/[0-9]+)\\\\z" 1;' in run.out
    assert "(a)" not in run.out


# ---------------------------------------------------------------------------------------------
# header and query parameter regexes: the same dialect (before, one NGINX refused stopped every
# configuration from loading)


@pytest.mark.parametrize("kind", ["headers", "queryParams"])
def test_an_invalid_header_or_query_regex_is_refused_with_status(kind: str) -> None:
    cond = {"name": "a", "type": "RegularExpression", "value": "(?P<host>x)"}
    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 8080)), *_services(["v1"]),
            route("r", "infra", [rule(path("/c", **{kind: [{"name": "b", "value": "1"}, cond]}))])]
    facts = gateway_facts(build_index(objs), GATEWAY_CONTROLLER)
    accepted = facts.routes[Ref(GATEWAY_GROUP, "HTTPRoute", "infra", "r")].parents[0].accepted
    assert (accepted.status, accepted.reason) == (False, "UnsupportedValue")
    assert f"spec.rules[0].matches[0].{kind}[1].value: named groups" in accepted.message


def test_an_invalid_header_regex_never_reaches_nginx_and_the_rest_serves(world: World) -> None:
    world.serve(route("bad", "infra", [rule(path("/h", headers=[{"name": "X-A", "type": "RegularExpression", "value": "("}])),
                                       rule(path("/h", headers=[{"name": "X-B", "type": "RegularExpression", "value": "[0-9]+"}]),
                                            to="v3")]),
                route("good", "infra", [rule(path("/"), to="v2")]))  # NGINX loaded it (serve asserts ok)
    assert "(?:()" not in world.conf()
    assert world.who("/h", headers={"X-A": "("}) == "v2"  # the left-out match takes nothing
    assert world.who("/h", headers={"X-B": "42"}) == "v3"
    assert world.who("/x") == "v2"


def test_replace_prefix_match_on_a_regex_rule_is_refused_in_the_route_fact() -> None:
    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 8080)), *_services(["v1"]),
            route("r", "infra", [rule(rx("/a/.*"), filters=[{"type": "URLRewrite", "urlRewrite": {
                "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/b"}}}])])]
    dp = build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}))
    fact = dp.routes[Ref(GATEWAY_GROUP, "HTTPRoute", "infra", "r")]
    assert fact.unsupported == [(0, "ReplacePrefixMatch needs a PathPrefix match")]
    assert "return 500;" in render(dp)["servers.conf"].decode()


# ---------------------------------------------------------------------------------------------
# repetition a backtracking matcher may take exponential time over


@pytest.mark.parametrize("value, part", [
    ("/r/(a|aa)+[bc]", "(a|aa)+"), ("(a+)+", "(a+)+"), ("/([a-z]+-?)+", "([a-z]+-?)+"), ("(a?a)+", "(a?a)+"),
    ("(x+x+)+y", "(x+x+)+"), ("(ab|ac)*", "(ab|ac)*"), ("(?i)(a|A)+", "(a|A)+"), (r"(\d+)+", r"(\d+)+"),
    ("(a{1,2})+", "(a{1,2})+"), ("(.*a){9}", "(.*a){9}"), (r"(\w+\s?)+$", r"(\w+\s?)+"),
])
def test_nested_or_overlapping_repetition_is_refused_naming_the_part(value: str, part: str) -> None:
    got = pathregex.problem(value)
    assert got is not None and "repetition" in got and f"`{part}`" in got, got


@pytest.mark.parametrize("value", ["(a*)*", "(.*)+", "(a|)+", "(a?)+"])
def test_repeating_what_can_match_nothing_is_refused(value: str) -> None:
    got = pathregex.problem(value)
    assert got is not None and "empty text" in got, got


@pytest.mark.parametrize("value", [
    "(/[a-z]+)+", r"(\d+\.)+", "(a|b)+", "(ab)+", "(?:/[^/]+)*", "(a+b)+", "(a{2})+", "(a{2}){3}", "/a(/b)?",
    "(?i)(a|B)+", r"(\Qab\E)+", "/users/[0-9]+/.*", "[[:alpha:]]+(-[[:alpha:]]+)*",
])
def test_repetition_that_matches_one_way_only_is_accepted(value: str) -> None:
    assert pathregex.problem(value) is None


def test_a_hostile_regex_is_refused_with_status_on_path_and_header() -> None:
    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 8080)), *_services(["v1"]),
            route("p", "infra", [rule(rx("/r/(a|aa)+[bc]"))]),
            route("h", "infra", [rule(path("/h", headers=[{"name": "X-A", "type": "RegularExpression", "value": "(a|aa)+b"}]))])]
    facts = gateway_facts(build_index(objs), GATEWAY_CONTROLLER)
    for name, field in (("p", "path.value"), ("h", "headers[0].value")):
        accepted = facts.routes[Ref(GATEWAY_GROUP, "HTTPRoute", "infra", name)].parents[0].accepted
        assert (accepted.status, accepted.reason) == (False, "UnsupportedValue")
        assert f"spec.rules[0].matches[0].{field}: nested or overlapping repetition in `(a|aa)+`" in accepted.message
    dp = build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}))
    assert "(a|aa)" not in "".join(v.decode() for k, v in render(dp).items() if k.endswith(".conf"))


def test_nginx_compiles_expressions_to_machine_code_and_runs_a_worker_per_core() -> None:
    """`pcre_jit on` and `worker_processes auto` (gwpolicy gateway --worker-processes N sets it)."""
    from gwpolicy.gateway.controller import Renderer, parse

    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 8080)), *_services(["v1"])]
    main = render(build_dataplane(analyse(objs), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR})))["nginx.conf"].decode()
    assert "\nworker_processes auto;\npcre_jit on;\n" in main
    three = Renderer(parse(["--worker-processes", "3"])).build(analyse(objs))[1]["nginx.conf"].decode()
    assert "\nworker_processes 3;\n" in three


@pytest.mark.parametrize("value, parts", [
    (r"/r/\d+\d+x", r"`\d+`, `\d+` one after"), ("/r/.*x.*x", "`.*`, `.*` one after"), ("/r/a*a*b", "`a*`, `a*` one after"),
    ("/r/(.*a){2}", "`.*` (2 times) one after"), ("/a/.*/b/.*/c/.*", "`.*`, `.*` one after"),
    ("(a|b)*a(a|b)*c", "`(a|b)*`, `(a|b)*` one after"), (r"\w+\s*\w+", r"`\w+`, `\w+` one after"),
])
def test_overlapping_repetitions_in_a_row_are_refused(value: str, parts: str) -> None:
    """n^2 steps and more on a hostile text: with 8 clients sending one, `.*x.*x` held another
    tenant's requests for 0.2-0.5 s (docs/gateway.md, `gwpolicy bench regex --refused`)."""
    got = pathregex.problem(value)
    assert got is not None and got.startswith("overlapping repetition: ") and parts in got, got


@pytest.mark.parametrize("value", ["/api/.*/items/.*", "/files/.*\\.png", "/.*/.*", "/a/.*/b/[0-9]+", "[a-z]+-[a-z]+",
                                   "/users/[0-9]+/.*", "/[^/]+/[^/]+"])
def test_repetitions_that_cannot_take_the_same_text_one_after_the_other_are_accepted(value: str) -> None:
    """A final `.*` takes whatever is left (nothing after it can fail); a `/` or `-` between two
    repetitions that cannot take it splits the text one way only."""
    assert pathregex.problem(value) is None
