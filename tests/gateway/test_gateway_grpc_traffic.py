"""GRPCRoute through real NGINX: grpcio calls to gwpolicy's gRPC echo backends, over cleartext
HTTP/2 on a plaintext listener (which keeps serving HTTP/1.1 to its HTTPRoutes) and over TLS with
ALPN h2 on an HTTPS listener. Method matching (exact, service-wide, regex), header matching,
request and response header filters, weights, an unmatched method, and a TimeoutPolicy that
reaches the gRPC proxy.

Addresses: 127.0.36.0/24.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from gateway_kit import (
    GW,
    TEST_ENDPOINTS,
    Served,
    analyse,
    backend,
    endpoints,
    free_port_offset,
    gateway,
    gatewayclass,
    listener,
    meta,
    request,
    route,
    service,
    tls_secret,
)
from gwpolicy.gateway import grpcecho, policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.render import render
from test_gateway_policies import policy_manifests

pytestmark = pytest.mark.skipif(not Path("/usr/lib/nginx/modules/ngx_stream_js_module.so").exists(),
                                reason="needs Debian's nginx with libnginx-mod-stream-js")

ADDR = "127.0.36.1"
BACKENDS = "127.0.36.2"
NS = "app"
SVC = grpcecho.SERVICE


def grpc_route(name: str, rules: list[dict[str, Any]], hostnames: list[str] | None = None,
               ts: str = "2024-01-02T00:00:00Z") -> dict[str, Any]:
    spec: dict[str, Any] = {"parentRefs": [{"name": "gw", "namespace": "infra"}], "rules": rules}
    if hostnames:
        spec["hostnames"] = hostnames
    return {"apiVersion": f"{GW}/v1", "kind": "GRPCRoute", "metadata": meta(name, NS, ts=ts), "spec": spec}


@pytest.fixture(scope="module")
def pki():
    from gwconformance import make_ca, make_cert

    ca_cert, ca_key = make_ca()
    from cryptography.hazmat.primitives import serialization

    cert, key = make_cert(["grpc.example.com", "web.example.com"], signer=(ca_cert, ca_key))
    return ca_cert.public_bytes(serialization.Encoding.PEM), cert, key


@pytest.fixture(scope="module")
def backends():
    servers: dict[str, Any] = {v: grpcecho.GrpcEchoServer(f"grpc-{v}-6b7f-x1", NS, address=BACKENDS) for v in ("v1", "v2", "v3")}
    for s in servers.values():
        s.start()
    web = EchoServer("web-6b7f-x1", NS, address=BACKENDS).start()
    try:
        yield servers, web
    finally:
        for s in servers.values():
            s.stop()
        web.stop()


@pytest.fixture(scope="module")
def plane(tmp_path_factory, backends, pki):
    servers, web = backends
    offset = free_port_offset((ADDR,), (80, 443))
    served = Served(tmp_path_factory.mktemp("grpc-traffic"), ADDR)
    _, cert, key = pki
    objects = [gatewayclass(),
               gateway("gw", "infra", listener("http", 80), listener("https", 443, "HTTPS",
                                                                     tls={"mode": "Terminate", "certificateRefs": [{"name": "c"}]})),
               tls_secret("c", "infra", cert, key)]
    for v, s in servers.items():
        objects += [service(v, NS), *endpoints(v, NS, [(BACKENDS, s.port)])]
    objects += [service("web", NS), *endpoints("web", NS, [(BACKENDS, web.port)])]
    objects.append(route("web", NS, [{"backendRefs": [backend("web")]}], hostnames=["web.example.com"]))
    objects.append(grpc_route("g", [
        {"matches": [{"method": {"service": SVC, "method": "Echo"}}], "backendRefs": [backend("v1")],
         "filters": [{"type": "RequestHeaderModifier",
                      "requestHeaderModifier": {"set": [{"name": "x-set", "value": "set-value"}],
                                                "add": [{"name": "x-add", "value": "added"}],
                                                "remove": ["x-remove"]}},
                     {"type": "ResponseHeaderModifier",
                      "responseHeaderModifier": {"add": [{"name": "x-answer", "value": "from-gateway"}]}}]},
        {"matches": [{"method": {"type": "RegularExpression", "service": r"gateway_api_conformance\..*", "method": "Echo[A-Z].*"},
                      "headers": [{"name": "version", "value": "two"}]}],
         "backendRefs": [backend("v2")]},
        {"matches": [{"method": {"service": SVC}}],
         "backendRefs": [backend("v1", weight=1), backend("v3", weight=1)]},
    ], hostnames=["grpc.example.com"]))
    served.files = lambda objs: render(build_dataplane(  # type: ignore[method-assign]
        analyse(policy_manifests() + objs, kind_checks=policyconf.kind_checks()),
        DataPlaneConfig(addresses={served.gateway: ADDR}, port_offset=offset, **TEST_ENDPOINTS)))
    served.apply(objects)
    try:
        yield {"served": served, "objects": objects, "plain": f"{ADDR}:{80 + offset}", "tls": f"{ADDR}:{443 + offset}",
               "http_port": 80 + offset}
    finally:
        served.stop()


def _call(target: str, method: str, metadata: list[tuple[str, str]] | None = None, *, root: bytes | None = None,
          authority: str = "grpc.example.com") -> grpcecho.Answer:
    chan = grpcecho.channel(target, authority=None if root else authority, root_certificates=root,
                            server_name=authority if root else None)
    try:
        return grpcecho.call(chan, method, metadata or [], timeout=10)
    finally:
        chan.close()


def test_an_exact_method_reaches_its_backend_over_h2c_with_its_header_filters(plane):
    a = _call(plane["plain"], "Echo", [("x-add", "sent"), ("x-remove", "gone"), ("x-set", "client")])
    assert a.code == grpc.StatusCode.OK, a.details
    assert a.pod.startswith("grpc-v1-")
    got = a.metadata()
    assert got.get("x-set") == ["set-value"]
    assert got.get("x-add") == ["sent,added"]
    assert "x-remove" not in got
    assert ("x-answer", "from-gateway") in a.initial_metadata


def test_a_regex_method_with_a_header_match_wins_over_the_service_wide_rule(plane):
    a = _call(plane["plain"], "EchoTwo", [("version", "two")])
    assert a.code == grpc.StatusCode.OK and a.pod.startswith("grpc-v2-")
    seen = {_call(plane["plain"], "EchoTwo").pod.split("-")[1] for _ in range(30)}
    assert seen == {"v1", "v3"}  # without the header: the service-wide rule, both weighted backends


def test_a_method_no_rule_matches_is_unimplemented(plane):
    chan = grpcecho.channel(plane["plain"], authority="grpc.example.com")
    try:
        stub = chan.unary_unary("/other.Service/Echo", request_serializer=grpcecho.EchoRequest.SerializeToString,
                                response_deserializer=grpcecho.EchoResponse.FromString)
        with pytest.raises(grpc.RpcError) as e:
            stub(grpcecho.EchoRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        chan.close()


def test_http1_clients_of_the_same_port_are_still_served(plane):
    answer = request(ADDR, plane["http_port"], "/anything", host="web.example.com")
    assert answer.status == 200 and answer.pod.startswith("web-")
    # the client's address came through the stream server (PROXY protocol), not the unix socket's
    assert answer.echo["headers"].get("X-Real-Ip") == ["127.0.0.1"]


def test_grpc_over_tls_with_alpn_h2(plane, pki):
    root, _, _ = pki
    a = _call(plane["tls"], "Echo", root=root)
    assert a.code == grpc.StatusCode.OK, a.details
    assert a.pod.startswith("grpc-v1-")
    assert request(ADDR, int(plane["tls"].rsplit(":", 1)[1]), "/", host="web.example.com", tls=True).status == 200


def test_a_timeout_policy_reaches_the_grpc_proxy(plane):
    """A Gateway's TimeoutPolicy applies to the GRPCRoute's paths too, as grpc_* directives."""
    policy = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": meta("t", "infra"),
              "spec": {"targetRef": {"group": GW, "kind": "Gateway", "name": "gw"},
                       "default": {"readTimeout": 7, "connectionTimeout": 2}}}
    served = plane["served"]
    served.apply(plane["objects"] + [policy])
    try:
        text = served.files(plane["objects"] + [policy])["servers.conf"].decode()
        grpc_part = text[text.index("# GRPCRoute"):]
        assert "grpc_read_timeout 7s;" in grpc_part and "grpc_connect_timeout 2s;" in grpc_part
        assert "proxy_read_timeout 7s;" in text  # the HTTPRoute's locations keep theirs
        a = _call(plane["plain"], "Echo")
        assert a.code == grpc.StatusCode.OK and a.pod.startswith("grpc-v1-")
    finally:
        served.apply(plane["objects"])


def test_a_retry_and_timeout_policy_naming_the_grpcroute_reach_only_its_locations(plane):
    """TimeoutPolicy and RetryPolicy may name a GRPCRoute: its locations get grpc_* directives, the
    HTTPRoute's none, and calls still succeed (the retries list each endpoint twice)."""
    target = {"group": GW, "kind": "GRPCRoute", "name": "g"}
    policies = [{"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": meta("tg", NS),
                 "spec": {"targetRef": target, "default": {"readTimeout": 11}}},
                {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "RetryPolicy", "metadata": meta("rg", NS),
                 "spec": {"targetRef": target, "default": {"attempts": 2}}}]
    served = plane["served"]
    served.apply(plane["objects"] + policies)
    try:
        text = served.files(plane["objects"] + policies)["servers.conf"].decode()
        assert "grpc_read_timeout 11s;" in text and "grpc_next_upstream_tries 2;" in text
        assert "proxy_read_timeout" not in text and "proxy_next_upstream" not in text
        a = _call(plane["plain"], "Echo")
        assert a.code == grpc.StatusCode.OK and a.pod.startswith("grpc-v1-")
    finally:
        served.apply(plane["objects"])
