"""TLS passthrough (TLS listener, `tls.mode: Passthrough`, TLSRoute) through real NGINX on loopback
(127.0.15.0/24): NGINX's stream module reads the ClientHello's SNI and forwards the connection
still encrypted, so the client completes its handshake with the backend and sees the backend's
own certificate. Exact names beat wildcards, a name no route serves is closed, the route's
hostnames are intersected with the listener's; and the status: supportedKinds, an HTTPRoute on a
TLSRoute-only listener (NotAllowedByListeners), TLS Terminate (UnsupportedValue). An HTTPS listener
shares the passthrough port: NGINX terminates the names it serves (behind the stream server, on a
unix socket, with the client's address from the PROXY protocol) and passes the TLSRoutes' through.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl

import pytest

import gwconformance as gc
from gateway_kit import (
    TEST_ENDPOINTS,
    Echoes,
    Served,
    backend,
    endpoints,
    free_port,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    meta,
    route,
    service,
    tls_secret,
)
from gwpolicy.analysis import analyse
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane, tls_upstream_name
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.facts import gateway_facts
from gwpolicy.gateway.render import render
from gwpolicy.gateway.status import Programming, all_desired
from gwpolicy.model import build_index
from gwpolicy.refs import Ref

GW = "gateway.networking.k8s.io"
ADDR = "127.0.15.1"
BACKENDS = "127.0.15.2"
GW_REF = Ref(GW, "Gateway", "infra", "gw")


def tls_route(name: str, hostnames: list[str] | None, backends: list[dict], ts: str = "2024-01-01T00:00:00Z",
              **parent) -> dict:
    spec: dict = {"parentRefs": [{"name": "gw", "namespace": "infra", **parent}], "rules": [{"backendRefs": backends}]}
    if hostnames is not None:
        spec["hostnames"] = hostnames
    return {"apiVersion": f"{GW}/v1", "kind": "TLSRoute", "metadata": meta(name, "infra", ts), "spec": spec}


def passthrough(name: str, port: int, hostname: str | None = None, **extra) -> dict:
    return listener(name, port, "TLS", hostname, tls={"mode": "Passthrough"}, **extra)


def tls_service(name: str, port: int) -> list[dict]:
    svc = service(name, "infra", 443)
    svc["spec"]["ports"] = [{"name": "https", "port": 443, "targetPort": port}]
    eps = endpoints(name, "infra", [(BACKENDS, port)])
    eps[0]["ports"][0]["name"] = "https"
    return [svc, *eps]


def objects(port: int, backends: dict[str, int]) -> list[dict]:
    out = [gatewayclass(),
           gateway("gw", "infra", passthrough("pass", port, "*.pass.test"), passthrough("exact", port, "exact.test"))]
    for name, p in backends.items():
        out += tls_service(name, p)
    out += [tls_route("wild", ["*.pass.test"], [backend("wild", 443)]),
            tls_route("app", ["app.pass.test", "nope.other.test"], [backend("app", 443)], sectionName="pass"),
            tls_route("exact", ["exact.test"], [backend("app", 443)], sectionName="exact"),
            tls_route("newer", ["app.pass.test"], [backend("wild", 443)], ts="2024-06-01T00:00:00Z"),  # the older keeps it
            tls_route("broken", ["broken.pass.test"], [backend("nosuch", 443)])]
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not have_nginx():
        pytest.skip("NGINX is not installed (./dev test installs it)")
    if DataPlaneConfig().stream_module is None:
        pytest.skip("NGINX's stream module is not installed (./dev test installs libnginx-mod-stream)")
    tmp = tmp_path_factory.mktemp("passthrough")
    certs, echoes = {}, {}
    for name, hosts in (("app", ["app.pass.test", "exact.test"]), ("wild", ["*.pass.test"])):
        crt, key = gc.make_cert(hosts)
        (tmp / f"{name}.crt").write_bytes(crt)
        (tmp / f"{name}.key").write_bytes(key)
        certs[name] = ssl.PEM_cert_to_DER_cert(crt.decode())
        echoes[name] = EchoServer(f"{name}-6d9f7c5b8-x4k2p", "infra", address=BACKENDS, cert=str(tmp / f"{name}.crt"),
                                  key=str(tmp / f"{name}.key")).start()
    port = free_port(ADDR)
    web_crt, web_key = gc.make_cert(["web.pass.test"])
    plain = Echoes(BACKENDS).start("web")
    objs = objects(port, {n: e.port for n, e in echoes.items()}) + plain.objects() + [
        tls_secret("web-cert", "infra", web_crt, web_key),
        route("web", "infra", [{"backendRefs": [backend("web")]}], hostnames=["web.pass.test"])]
    objs[1]["spec"]["listeners"].append(listener("web", port, "HTTPS", "web.pass.test",
                                                 tls={"certificateRefs": [{"name": "web-cert"}]}))
    served = Served(tmp / "nginx", ADDR, GW_REF)
    served.apply(objs)
    yield {"port": port, "certs": dict(certs, web=ssl.PEM_cert_to_DER_cert(web_crt.decode())), "served": served}
    served.stop()
    plain.stop()
    for e in echoes.values():
        e.stop()


def through(port: int, sni: str | None) -> tuple[bytes, dict]:
    """A TLS handshake with SNI through NGINX, then one HTTP request inside it: the certificate the
    client was shown, and the echo's answer."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPConnection(ADDR, port, timeout=5)
    try:
        conn.sock = ctx.wrap_socket(socket.create_connection((ADDR, port), timeout=5), server_hostname=sni)
        der = conn.sock.getpeercert(binary_form=True)
        conn.request("GET", "/", headers={"Host": sni or "none"})
        resp = conn.getresponse()
        return der, json.loads(resp.read())
    finally:
        conn.close()


def test_the_client_sees_the_backends_certificate_chosen_by_sni(world):
    der, echo = through(world["port"], "app.pass.test")
    assert der == world["certs"]["app"]  # NGINX did not terminate: the backend's own certificate
    assert echo["pod"].startswith("app-") and echo["tls"]["serverName"] == "app.pass.test"
    der, echo = through(world["port"], "x.pass.test")  # the wildcard route
    assert der == world["certs"]["wild"] and echo["pod"].startswith("wild-")
    der, echo = through(world["port"], "exact.test")  # a second listener on the same port
    assert der == world["certs"]["app"]


@pytest.mark.parametrize("sni", ["unknown.test", "nope.other.test", "broken.pass.test", None])
def test_names_no_route_serves_are_closed(world, sni):
    """No route (nope.other.test is outside the listener's hostname), a backend that does not
    exist, or no SNI at all: the connection is closed (or the HTTPS default server refuses the
    handshake), never served."""
    with pytest.raises((OSError, ssl.SSLError)):
        through(world["port"], sni)


def test_an_https_listener_on_the_passthrough_port_terminates_its_own_names(world):
    """NGF's shape: the stream server sends the HTTPS listener's names to its server on a unix
    socket, with the PROXY protocol, so the backend sees the client's address and port."""
    der, echo = through(world["port"], "web.pass.test")
    assert der == world["certs"]["web"]  # NGINX terminated with the listener's certificate
    assert echo["pod"].startswith("web-")
    headers = echo["headers"]
    assert headers["X-Forwarded-Proto"] == ["https"] and headers["X-Forwarded-Port"] == [str(world["port"])]
    assert headers["X-Real-Ip"] == ["127.0.0.1"] and headers["X-Forwarded-For"] == ["127.0.0.1"]
    der, _ = through(world["port"], "app.pass.test")  # and TLSRoutes still pass through
    assert der == world["certs"]["app"]


def test_rendered_stream_block_and_load_module(world):
    files = world["served"].files(objects(9443, {"app": 1, "wild": 2}))
    main = files["nginx.conf"].decode()
    assert main.startswith("# generated") and "load_module /usr/lib/nginx/modules/ngx_stream_module.so;" in main
    assert "stream {\n    include stream.conf;\n}" in main
    stream = files["stream.conf"].decode()
    assert "ssl_preread on;" in stream and "map $ssl_preread_server_name" in stream
    assert f"    app.pass.test {tls_upstream_name('infra', 'app', 443)};\n" in stream  # the older route keeps the name
    assert "ssl_certificate" not in stream and "proxy_protocol" not in stream  # no HTTPS listener on that port
    # an HTTPS listener on the passthrough port: its server moves behind the stream server
    objs = objects(9443, {"app": 1, "wild": 2}) + [tls_secret("web-cert", "infra", *gc.make_cert(["web.pass.test"]))]
    objs[1]["spec"]["listeners"].append(listener("web", 9443, "HTTPS", "web.pass.test", tls={"certificateRefs": [{"name": "web-cert"}]}))
    files = world["served"].files(objs)
    sock = "unix:@gwpolicy-sockets@/h_7f000f01_9443.sock"  # the address' bytes in hex
    assert f"    listen {sock} ssl proxy_protocol;\n" in files["servers.conf"].decode()
    assert f"    listen {sock} default_server ssl proxy_protocol;\n" in files["servers.conf"].decode()  # 404/refusal
    stream = files["stream.conf"].decode()
    assert f"    web.pass.test {sock};\n" in stream and f"    default {sock};\n" in stream and "    proxy_protocol on;\n" in stream
    assert "    app.pass.test unix:@gwpolicy-sockets@/t" in stream  # through a relay that reads the PROXY header
    assert "listen unix:@gwpolicy-sockets@/t0.sock proxy_protocol;" in stream
    # without passthrough listeners nothing of the stream module appears
    plain = render(build_dataplane(analyse([gatewayclass(), gateway("gw", "infra", listener("http", 8080))]),
                                   DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR})))
    assert "stream {" not in plain["nginx.conf"].decode() and "load_module" not in plain["nginx.conf"].decode()
    assert "stream.conf" not in plain


def _status(objs: list[dict]) -> dict:
    index = build_index(objs)
    facts = gateway_facts(index)
    prog = Programming(generations={r: 1 for r in facts.gateways}, addresses={r: [ADDR] for r in facts.gateways})
    return {(r.kind, r.name): s for r, s in all_desired(index, facts, prog, "2026-12-01T00:00:00Z").items()}


def _conds(conds: list[dict]) -> dict:
    return {c["type"]: (c["status"], c["reason"]) for c in conds}


def test_status_of_passthrough_listeners_and_routes():
    http_route = {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("web", "infra"),
                  "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": [{"backendRefs": [backend("app", 443)]}]}}
    elsewhere = tls_route("elsewhere", ["other.test"], [backend("app", 443)], sectionName="pass")
    objs = objects(443, {"app": 1, "wild": 2}) + [http_route, elsewhere]
    objs[1]["spec"]["listeners"].append(listener("terminate", 8443, "TLS", tls={"mode": "Terminate"}))
    st = _status(objs)
    gw = {l["name"]: l for l in st[("Gateway", "gw")]["listeners"]}
    assert gw["pass"]["supportedKinds"] == [{"group": GW, "kind": "TLSRoute"}]
    assert _conds(gw["pass"]["conditions"])["Accepted"] == ("True", "Accepted")
    assert gw["pass"]["attachedRoutes"] == 4  # wild, app, newer, broken
    assert _conds(gw["terminate"]["conditions"])["Accepted"] == ("False", "UnsupportedValue")
    assert _conds(st[("TLSRoute", "app")]["parents"][0]["conditions"]) == {
        "Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    assert _conds(st[("TLSRoute", "broken")]["parents"][0]["conditions"])["ResolvedRefs"] == ("False", "BackendNotFound")
    assert _conds(st[("HTTPRoute", "web")]["parents"][0]["conditions"])["Accepted"] == ("False", "NotAllowedByListeners")
    assert _conds(st[("TLSRoute", "elsewhere")]["parents"][0]["conditions"])["Accepted"] == (
        "False", "NoMatchingListenerHostname")  # hostnames intersected with the listener's, as for HTTPRoute
    # HTTPS and TLS passthrough share a port; one name cannot be both: neither of the pair is served
    objs[1]["spec"]["listeners"] += [listener("https", 443, "HTTPS", "web.test", tls={"certificateRefs": [{"name": "c"}]}),
                                     listener("same", 443, "HTTPS", "exact.test", tls={"certificateRefs": [{"name": "c"}]})]
    gw = {l["name"]: l for l in _status(objs)[("Gateway", "gw")]["listeners"]}
    assert _conds(gw["pass"]["conditions"])["Conflicted"] == ("False", "NoConflicts")
    assert _conds(gw["https"]["conditions"])["Conflicted"] == ("False", "NoConflicts")
    for name in ("same", "exact"):
        assert _conds(gw[name]["conditions"])["Conflicted"] == ("True", "HostnameConflict"), name
        assert _conds(gw[name]["conditions"])["Accepted"] == ("False", "HostnameConflict"), name
    # HTTP does not share a port with HTTPS or TLS: every listener of that port is conflicted
    objs[1]["spec"]["listeners"].append(listener("http", 443, "HTTP"))
    gw = {l["name"]: l for l in _status(objs)[("Gateway", "gw")]["listeners"]}
    for name in ("pass", "exact", "https", "same", "http"):
        assert _conds(gw[name]["conditions"])["Conflicted"] == ("True", "ProtocolConflict"), name
        assert _conds(gw[name]["conditions"])["Programmed"] == ("False", "ProtocolConflict"), name
    assert _conds(gw["terminate"]["conditions"])["Conflicted"] == ("False", "NoConflicts")  # on 8443, and not valid


def test_without_the_stream_module_passthrough_listeners_say_so_and_the_rest_is_served():
    from gwpolicy.gateway.nginx import NginxError, check_modules

    objs = objects(9443, {"app": 1, "wild": 2})
    objs[1]["spec"]["listeners"].append(listener("http", 8080))
    dp = build_dataplane(analyse(objs), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}, stream_module=None))
    fact = dp.listeners[GW_REF.with_section("pass")]
    assert (fact.programmed, fact.reason) == (False, "UnsupportedProtocol") and "libnginx-mod-stream" in fact.message
    assert dp.listeners[GW_REF.with_section("http")].programmed and not dp.passthrough
    files = render(dp)
    assert "stream.conf" not in files and "load_module" not in files["nginx.conf"].decode()
    with pytest.raises(NginxError, match="libnginx-mod-stream"):
        check_modules({"nginx.conf": b"load_module /nowhere/ngx_stream_module.so;\n"})


def test_policies_never_claim_to_reach_passthrough_connections():
    """Passthrough connections are never HTTP: a gwpolicy.io policy on a TLSRoute, or a
    BackendTLSPolicy on a Service only TLSRoutes send to, gets no ancestor entry of ours."""
    from gwpolicy.bench.gateway_policies import policy_kinds
    from gwpolicy.gateway.controller import enforced_here, policy_ancestors_of
    from gwpolicy.gateway.status import policy_ancestors

    timeout = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": meta("t", "infra"),
               "spec": {"targetRef": {"group": GW, "kind": "TLSRoute", "name": "app"}, "default": {"readTimeout": "1s"}}}
    btls = {"apiVersion": f"{GW}/v1", "kind": "BackendTLSPolicy", "metadata": meta("b", "infra"),
            "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "app"}],
                     "validation": {"hostname": "app.pass.test", "wellKnownCACertificates": "System"}}}
    objs = policy_kinds() + objects(9443, {"app": 1, "wild": 2}) + [timeout, btls]
    a = analyse(objs, kind_checks=policyconf.kind_checks())
    facts = gateway_facts(a.index)
    assert a.outcomes.get(Ref("gwpolicy.io", "TimeoutPolicy", "infra", "t"))  # the engine does attach it
    assert not enforced_here(policy_ancestors_of(a, Ref("gwpolicy.io", "TimeoutPolicy", "infra", "t")), facts)
    assert policy_ancestors(a.index.by_ref[Ref(GW, "BackendTLSPolicy", "infra", "b")], facts) == []
