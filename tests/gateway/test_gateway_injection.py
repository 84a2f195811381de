"""No text of an object becomes NGINX syntax (docs/security.md).

The known injections of a tenant into a shared gateway, each through real NGINX on loopback
(127.0.72.0/24): a backendRef name (BackendNotFound, RefNotPermitted, a weighted backend's named
location) or a BackendTLSPolicy CA reference holding a line break and directives, a route name
with a line break, a RequestRedirect scheme and a PathPrefix under ReplacePrefixMatch holding a
quote. None of them adds a directive: the configuration loads, tenant-b's route is served by its
own backend, the ports an injected `server` would open stay closed, the hostile rule answers 500
or is left out, and its route says why with the name `repr()`-ed. `gwpolicy render -f` on such
files prints nothing injected either; and a sink that ever skipped the escaping fails closed.
"""

from __future__ import annotations

import socket
from typing import Any, Iterator

import pytest

import nginx_conf
from gateway_kit import (
    TEST_ENDPOINTS,
    Echoes,
    Served,
    backend,
    free_port,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    meta,
    request,
    route,
    service,
)
from gwpolicy.engine.model import build_index
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway import render as render_mod
from gwpolicy.gateway.facts import gateway_facts

ADDR = "127.0.72.1"
BACKENDS = "127.0.72.2"
GW_REF = Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")


class World:
    def __init__(self, served: Served, echoes: Echoes, port: int) -> None:
        self.served, self.echoes, self.port = served, echoes, port
        self.files: dict[str, bytes] = {}
        self.objs: list[dict[str, Any]] = []

    def serve(self, *objs: dict[str, Any]) -> None:
        self.objs = [gatewayclass(), gateway("gw", "infra", listener("http", self.port)), *self.echoes.objects(),
                     route("b-route", "tenant-b", [{"backendRefs": [backend("b-web")]}], hostnames=["b.example"]), *objs]
        self.files = self.served.files(self.objs)
        result = self.served.nginx.apply(self.files)
        assert result.ok, result.error  # NGINX loaded it: nothing broke the syntax either

    def get(self, host: str, path: str = "/", **headers: str) -> Any:
        return request(ADDR, self.port, path, host, headers=headers)

    def directives(self) -> list[tuple[tuple[str, ...], nginx_conf.Directive]]:
        return [x for d in nginx_conf.parse_files(self.files) for x in d.walk()]

    def assert_nothing_injected(self) -> None:
        """tenant-b is served by its own backend, with its credentials seen by no one else; no
        directive carries the payload's words; nothing listens where an injected server would."""
        b = self.get("b.example", "/login", Authorization="Bearer tenant-b-secret")
        assert b.status == 200 and b.pod.startswith("b-web-"), (b.status, b.body[:200])
        assert self.echoes.servers["a-web"].requests == 0 or all(
            "tenant-b-secret" not in str(seen.get("headers")) for seen in self.echoes.servers["a-web"].seen)
        for path, d in self.directives():
            words = " ".join(nginx_conf.unquoted_words(d))
            assert "pwned" not in words and "injected" not in words, (path, d)
            assert not (d.name == "location" and d.args[:1] == ["~"]), (path, d)  # no regex location is rendered
            assert not (d.name == "root" or d.name == "autoindex"), (path, d)
        for port in INJECTED_PORTS:
            with socket.socket() as s:
                s.settimeout(1)
                assert s.connect_ex((ADDR, port)) != 0, f"something listens on {ADDR}:{port}"

    def resolved(self, ns: str, name: str) -> Any:
        facts = gateway_facts(build_index(self.objs))
        return facts.routes[Ref(GATEWAY_GROUP, "HTTPRoute", ns, name)].resolved_refs

    def accepted(self, ns: str, name: str) -> Any:
        facts = gateway_facts(build_index(self.objs))
        return facts.routes[Ref(GATEWAY_GROUP, "HTTPRoute", ns, name)].parents[0].accepted


INJECTED_PORTS = (18098, 18099)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if not have_nginx():
        pytest.skip("NGINX is not installed (./dev test installs it)")
    echoes = Echoes(BACKENDS).start("a-web", namespace="tenant-a").start("b-web", namespace="tenant-b")
    served = Served(tmp_path_factory.mktemp("injection") / "nginx", ADDR, GW_REF)
    try:
        yield World(served, echoes, free_port(ADDR))
    finally:
        served.stop()
        echoes.stop()


def _a_echo(world: World) -> str:
    s = world.echoes.servers["a-web"]
    return f"{s.address}:{s.port}"


#: known payloads: a `return`, a `server` serving the filesystem, a regex location that
#: takes every other tenant's path (filled in with the test's addresses)
PAYLOADS = {
    "return": "nope\n        return 200 pwned-by-tenant-a;\n        #",
    "server": "n\n}\n}\nserver{listen {addr}:18099;root /;autoindex on;}\nserver{listen {addr}:18098;\nlocation @zz{\n#",
    "intercept": "h\n}\nlocation ~ ^/_v[0-9]+/ {proxy_pass http://{echo};}\nlocation @zz{\n#",
}


def _payload(world: World, key: str) -> str:
    return PAYLOADS[key].replace("{addr}", ADDR).replace("{echo}", _a_echo(world))


def _evil(rules: list[dict[str, Any]], name: str = "evil") -> dict[str, Any]:
    return route(name, "tenant-a", rules, hostnames=["a.example"])


@pytest.mark.parametrize("key", sorted(PAYLOADS))
def test_a_backend_name_with_a_line_break_adds_no_directive(world: World, key: str) -> None:
    payload = _payload(world, key)
    world.serve(_evil([{"matches": [{"path": {"type": "PathPrefix", "value": "/x"}}],
                        "backendRefs": [backend(payload)]}]))
    world.assert_nothing_injected()
    assert world.get("a.example", "/x").status == 500
    got = world.resolved("tenant-a", "evil")
    assert (got.status, got.reason) == (False, "BackendNotFound")
    assert repr(payload) in got.message and "\n" not in got.message


def test_a_cross_namespace_backend_name_adds_no_directive(world: World) -> None:
    """Without a ReferenceGrant the message said RefNotPermitted with the name as written."""
    payload = _payload(world, "return")
    world.serve(_evil([{"backendRefs": [backend(payload, ns="tenant-b")]}]))
    world.assert_nothing_injected()
    assert world.get("a.example").status == 500
    got = world.resolved("tenant-a", "evil")
    assert (got.status, got.reason) == (False, "BackendNotFound") and repr(payload) in got.message


def test_a_weighted_backend_name_adds_no_directive(world: World) -> None:
    """Weighted backends whose filters differ each get an internal location `first used by ...`."""
    payload = _payload(world, "return")
    tagged = [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "X-T", "value": "1"}]}}]
    world.serve(_evil([{"backendRefs": [backend("a-web", weight=1), backend(payload, weight=1, filters=tagged)]}]))
    world.assert_nothing_injected()
    assert {world.get("a.example").status for _ in range(20)} <= {200, 500}


def test_a_backend_tls_ca_reference_adds_no_directive(world: World) -> None:
    payload = "x\n        return 200 injected-via-backendtls;\n        #"
    policy = {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "BackendTLSPolicy", "metadata": meta("tls", "tenant-a"),
              "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "a-web"}],
                       "validation": {"hostname": "a-web.test",
                                      "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": payload}]}}}
    world.serve(_evil([{"backendRefs": [backend("a-web")]}]), policy)
    world.assert_nothing_injected()
    assert world.get("a.example").status == 500  # fail closed: no TLS profile, no plain HTTP
    assert "injected-via-backendtls" not in world.get("a.example").body.decode(errors="replace")


def test_a_route_name_with_a_line_break_adds_no_directive(world: World) -> None:
    """metadata.name as `render -f` or a server that does not validate it lets it through."""
    name = "a-route\n        return 200 name-injected; #"
    world.serve(route(name, "tenant-a", [{"backendRefs": [backend("a-web")]}], hostnames=["a.example"]))
    world.assert_nothing_injected()
    a = world.get("a.example")
    assert a.status == 200 and a.pod.startswith("a-web-")


def test_a_redirect_scheme_that_is_not_http_or_https_is_refused(world: World) -> None:
    scheme = 'http"; } location /_v0/pwn/ { return 200 "scheme-injected'
    world.serve(_evil([{"matches": [{"path": {"type": "PathPrefix", "value": "/r"}}],
                        "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": scheme}}]},
                       {"backendRefs": [backend("a-web")]}]))
    world.assert_nothing_injected()
    assert world.get("a.example", "/r").status == 500
    assert world.get("a.example", "/pwn/").pod.startswith("a-web-")  # the route's other rule, not a smuggled location
    got = world.accepted("tenant-a", "evil")
    assert (got.status, got.reason) == (False, "UnsupportedValue") and "requestRedirect.scheme" in got.message


def test_a_path_prefix_with_a_quote_under_replace_prefix_match_stays_a_path(world: World) -> None:
    value = '/a" /b; return 200 prefix-injected; #'
    world.serve(_evil([{"matches": [{"path": {"type": "PathPrefix", "value": value}}],
                        "filters": [{"type": "URLRewrite", "urlRewrite": {
                            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/z"}}}],
                        "backendRefs": [backend("a-web")]},
                       {"backendRefs": [backend("a-web")]}]))
    world.assert_nothing_injected()
    a = world.get("a.example", '/a%22%20/b;%20return%20200%20prefix-injected;%20%23/more')
    assert a.status == 200 and a.echo["path"] == "/z/more"  # the literal prefix, replaced as the spec says
    assert world.get("a.example", "/a").echo["path"] == "/a"  # not the rewrite's


# ---------------------------------------------------------------------------------------------
# render -f and the final guard


def test_gwpolicy_render_prints_no_injected_directive(tmp_path: Any) -> None:
    """`render -f` on a tenant's files: whatever validated them (nothing here), no line of the
    output outside a comment or a quoted string holds the payload."""
    import yaml

    from helpers import run_cli

    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 80)), service("web", "tenant-a"),
            _evil([{"matches": [{"path": {"type": "PathPrefix", "value": '/a" /b; return 200 pwned; #'}}],
                    "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch",
                                                                              "replacePrefixMatch": "/z"}}}],
                    "backendRefs": [backend("nope\n return 200 pwned;\n #")]},
                   {"filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": 'http"; return 200 "pwned'}}]}],
                  name="a-route\n return 200 pwned; #")]
    f = tmp_path / "tenant.yaml"
    f.write_text(yaml.safe_dump_all(objs))
    run = run_cli("render", "-f", str(f))
    assert run.code == 0, run.err
    for part in run.out.split("# ==== ")[1:]:
        name, body = part.split(" ====\n", 1)
        for _, d in (x for top in nginx_conf.parse(body, name) for x in top.walk()):
            assert "pwned" not in " ".join(nginx_conf.unquoted_words(d)), (name, d)


def test_a_sink_that_skips_the_escaping_fails_closed_for_its_rule_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The final guard: were a future sink to write text with a line break, the rule it serves
    answers 500 and the rest of the configuration is unchanged."""
    from gateway_kit import endpoints
    from gwpolicy.engine.analysis import analyse
    from gwpolicy.gateway import policyconf
    from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane

    real = render_mod._header_lines

    def leaky(fs: Any, rewrite: Any, st: Any) -> list[str]:
        got = real(fs, rewrite, st)
        return got + (["add_header X-Leak 1;\nreturn 200 pwned;"] if fs else [])

    monkeypatch.setattr(render_mod, "_header_lines", leaky)
    tag = [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "X-T", "value": "1"}]}}]
    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 80)), service("web", "infra"),
            *endpoints("web", "infra", [(BACKENDS, 9)]),
            route("leaky", "infra", [{"matches": [{"path": {"type": "PathPrefix", "value": "/leak"}}],
                                      "filters": tag, "backendRefs": [backend("web")]},
                                     {"backendRefs": [backend("web")]}])]
    files = render_mod.render(build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()),
                                              DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR})))
    tree = [d for _, d in (x for top in nginx_conf.parse_files(files) for x in top.walk())]
    assert not [d for d in tree if "pwned" in d.args]
    assert not [l for l in files["servers.conf"].decode().splitlines() if l.strip().startswith("return 200")]
    leak = next(d for d in tree if d.name == "location" and d.args and d.args[-1].endswith("/leak/"))
    assert [(d.name, d.args) for d in leak.block or []] == [("return", ["500"])]
    assert any(d.name == "proxy_pass" for d in tree)  # the other rule still proxies


@pytest.mark.parametrize("names", [("'A", "B'"), ("#A", "B")])
def test_a_header_name_that_starts_a_string_or_a_comment_is_refused(names: tuple[str, str]) -> None:
    """`'` and `#` are token characters (RFC 9110), but a bare word that starts with one is a
    string or a comment to NGINX: `proxy_set_header 'A "1";` would swallow the lines up to the
    next `'`. Such a name makes its rule answer 500; the other directives stay as they were."""
    from gateway_kit import endpoints
    from gwpolicy.engine.analysis import analyse
    from gwpolicy.gateway import policyconf
    from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane

    mod = {"type": "RequestHeaderModifier", "requestHeaderModifier": {
        "set": [{"name": names[0], "value": "1"}, {"name": names[1], "value": "2"}]}}
    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 80)), service("web", "infra"),
            *endpoints("web", "infra", [(BACKENDS, 9)]),
            route("r", "infra", [{"matches": [{"path": {"type": "PathPrefix", "value": "/h"}}], "filters": [mod],
                                  "backendRefs": [backend("web")]}, {"backendRefs": [backend("web")]}])]
    files = render_mod.render(build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()),
                                              DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR})))
    tree = [d for _, d in (x for top in nginx_conf.parse_files(files) for x in top.walk())]
    assert not [d for d in tree if any("\n" in a for a in d.args)]
    h = next(d for d in tree if d.name == "location" and d.args and d.args[-1].endswith("/h/"))
    assert [(d.name, d.args) for d in h.block or []] == [("return", ["500"])]
