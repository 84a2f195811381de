"""GRPCRoute's status and attachment: listeners of HTTP and HTTPS list it in supportedKinds and
take it unless their allowedRoutes.kinds leave it out; the GatewayClass claims the GRPCRoute
feature; an HTTPRoute and a GRPCRoute serving one hostname through one listener: the older one is
served there, the newer one is Accepted=False reason Conflicted, naming the other (whichever kind
is older), and the data plane serves that hostname with the winner's kind only.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import pytest

from gateway_kit import (
    GW,
    TEST_ENDPOINTS,
    analyse,
    backend,
    endpoints,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    meta,
    route,
    service,
)
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.dataplane.model import SOCKET_DIR
from gwpolicy.gateway.facts import GATEWAY_GROUP, SUPPORTED_FEATURES, Ref, dataplane_objects, gateway_facts
from gwpolicy.gateway.render import render
from gwpolicy.gateway.state import build_index
from test_gateway_policies import policy_manifests
from test_gateway_render_syntax import _nginx_t

GRPC = Ref(GATEWAY_GROUP, "GRPCRoute", "app", "g")
HTTP = Ref(GATEWAY_GROUP, "HTTPRoute", "app", "h")
GW_REF = Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")


def grpc_route(hostnames: list[str] | None, ts: str, name: str = "g") -> dict[str, Any]:
    spec: dict[str, Any] = {"parentRefs": [{"name": "gw", "namespace": "infra"}],
                            "rules": [{"matches": [{"method": {"service": "pkg.Svc"}}], "backendRefs": [backend("grpc")]}]}
    if hostnames is not None:
        spec["hostnames"] = hostnames
    return {"apiVersion": f"{GW}/v1", "kind": "GRPCRoute", "metadata": meta(name, "app", ts=ts), "spec": spec}


def http_route(hostnames: list[str] | None, ts: str) -> dict[str, Any]:
    r = route("h", "app", [{"backendRefs": [backend("web")]}], hostnames=hostnames)
    r["metadata"]["creationTimestamp"] = ts
    return r


def world(*routes: dict[str, Any], **listener_extra: Any) -> list[dict[str, Any]]:
    return [gatewayclass(), gateway("gw", "infra", listener("http", 8080, **listener_extra)),
            service("grpc", "app"), *endpoints("grpc", "app", [("127.0.0.5", 3000)]),
            service("web", "app"), *endpoints("web", "app", [("127.0.0.6", 3000)]), *routes]


def accepted(objs: list[dict[str, Any]], ref: Ref) -> Any:
    return gateway_facts(build_index(objs)).routes[ref].parents[0].accepted


def served_conf(objs: list[dict[str, Any]]) -> str:
    view = dataplane_objects(objs, gateway_facts(build_index(objs)))
    dp = build_dataplane(analyse(view, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS))
    return render(dp)["servers.conf"].decode()


def test_http_and_https_listeners_support_grpcroute_and_the_class_claims_it():
    facts = gateway_facts(build_index(world()))
    kinds = facts.gateways[GW_REF].listeners["http"].supported_kinds
    assert {"group": GW, "kind": "GRPCRoute"} in kinds and {"group": GW, "kind": "HTTPRoute"} in kinds
    assert "GRPCRoute" in SUPPORTED_FEATURES
    assert accepted(world(grpc_route(None, "2024-01-02T00:00:00Z")), GRPC).status


def test_a_listener_whose_allowed_kinds_leave_grpcroute_out_does_not_take_it():
    objs = world(grpc_route(None, "2024-01-02T00:00:00Z"), allowedRoutes={"kinds": [{"kind": "HTTPRoute"}]})
    verdict = accepted(objs, GRPC)
    assert (verdict.status, verdict.reason) == (False, "NotAllowedByListeners")
    assert "grpc_pass" not in served_conf(objs)


@pytest.mark.parametrize("grpc_older", [True, False])
def test_an_httproute_and_a_grpcroute_on_one_hostname_the_older_wins(grpc_older):
    older, newer = "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z"
    objs = world(grpc_route(["api.example"], older if grpc_older else newer),
                 http_route(["api.example", "www.example"], newer if grpc_older else older))
    winner, loser = (GRPC, HTTP) if grpc_older else (HTTP, GRPC)
    assert accepted(objs, winner).status
    lost = accepted(objs, loser)
    assert (lost.status, lost.reason) == (False, "Conflicted")
    assert f"{winner.kind} app/{winner.name}" in lost.message and "api.example" in lost.message
    conf = served_conf(objs)
    assert ("grpc_pass" in conf) == grpc_older and ("proxy_pass" in conf) == (not grpc_older)


def test_different_hostnames_on_one_listener_both_are_served():
    objs = world(grpc_route(["grpc.example"], "2024-01-02T00:00:00Z"), http_route(["www.example"], "2024-01-01T00:00:00Z"))
    assert accepted(objs, GRPC).status and accepted(objs, HTTP).status
    conf = served_conf(objs)
    assert "grpc_pass" in conf and "proxy_pass" in conf


def test_two_grpcroutes_on_one_hostname_are_no_conflict():
    objs = world(grpc_route(None, "2024-01-02T00:00:00Z"), grpc_route(None, "2024-01-03T00:00:00Z", name="g2"))
    assert accepted(objs, GRPC).status
    assert accepted(objs, Ref(GATEWAY_GROUP, "GRPCRoute", "app", "g2")).status


def test_rendering_with_the_in_place_cache_gives_the_same_files():
    """gRPC locations (and their internal locations) replay from the RenderCache byte for byte."""
    from gwpolicy.gateway.render import RenderCache

    grpc = grpc_route(["grpc.example"], "2024-01-02T00:00:00Z")
    grpc["spec"]["rules"].append({"matches": [{"method": {"type": "RegularExpression", "method": "Echo.*"},
                                               "headers": [{"name": "version", "value": "two"}]}],
                                  "backendRefs": [backend("grpc", weight=3), backend("web", weight=1)]})
    objs = world(grpc, http_route(["www.example"], "2024-01-01T00:00:00Z"))
    view = dataplane_objects(objs, gateway_facts(build_index(objs)))
    dp = build_dataplane(analyse(view, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS))
    cache = RenderCache()
    plain = render(dp)
    assert render(dp, cache) == plain
    assert render(dp, cache) == plain and cache.hits > 0


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
def test_client_settings_and_timeouts_reach_grpc_locations_and_nginx_loads_them(tmp_path):
    """A Gateway's ClientSettingsPolicy and TimeoutPolicy on an unconditional and a conditional gRPC
    rule: each directive once per location, gRPC names, and `nginx -t` takes the files."""
    grpc = grpc_route(None, "2024-01-02T00:00:00Z")
    grpc["spec"]["rules"].append({"matches": [{"method": {"service": "pkg.Other"}, "headers": [{"name": "v", "value": "2"}]}],
                                  "backendRefs": [backend("grpc")]})
    target = {"group": GW, "kind": "Gateway", "name": "gw"}
    objs = policy_manifests() + world(grpc) + [
        {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "ClientSettingsPolicy", "metadata": meta("c", "infra"),
         "spec": {"targetRef": target, "default": {"body": {"maxSize": "2m"}}}},
        {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": meta("t", "infra"),
         "spec": {"targetRef": target, "default": {"readTimeout": 9}}}]
    view = dataplane_objects(objs, gateway_facts(build_index(objs)))
    files = render(build_dataplane(analyse(view, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS)))
    conf = files["servers.conf"].decode()
    assert "grpc_read_timeout 9s;" in conf and "proxy_read_timeout" not in conf
    for block in conf.split("location ")[1:]:
        assert block.count("client_max_body_size") <= 1, block
    assert "client_max_body_size 2m;" in conf
    sockets = tempfile.mkdtemp(prefix="gwg", dir="/tmp")
    try:
        run = _nginx_t(tmp_path / "t", {k: v.replace(SOCKET_DIR.encode(), sockets.encode()) for k, v in files.items()})
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_missing_stream_js_module_is_named_with_its_package():
    from gwpolicy.gateway.nginx import NginxError, check_modules

    with pytest.raises(NginxError, match="libnginx-mod-stream-js.*GRPCRoute"):
        check_modules({"nginx.conf": b"load_module /nowhere/ngx_stream_js_module.so;\n"})


@pytest.mark.parametrize("disable", [True, False])
def test_an_nginxproxy_that_disables_http2_leaves_grpcroutes_unserved_and_says_so(disable):
    objs = world(grpc_route(["grpc.example"], "2024-01-02T00:00:00Z"), http_route(["www.example"], "2024-01-01T00:00:00Z"))
    objs[0]["spec"]["parametersRef"] = {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": "proxy",
                                        "namespace": "infra"}
    objs.append({"apiVersion": "gateway.nginx.org/v1alpha2", "kind": "NginxProxy",
                 "metadata": {"name": "proxy", "namespace": "infra"}, "spec": {"disableHTTP2": disable}})
    verdict = accepted(objs, GRPC)
    conf = served_conf(objs)
    assert accepted(objs, HTTP).status and "proxy_pass" in conf  # HTTPRoutes are served either way
    if disable:
        assert (verdict.status, verdict.reason) == (False, "NotAllowedByListeners")
        assert "disableHTTP2" in verdict.message and "infra/gw" in verdict.message
        assert "grpc_pass" not in conf and "http2" not in conf
    else:
        assert verdict.status and "grpc_pass" in conf and " http2 " in conf
    class_msg = gateway_facts(build_index(objs)).classes[Ref(GATEWAY_GROUP, "GatewayClass", None, objs[0]["metadata"]["name"])].message
    assert "NginxProxy in use" in class_msg and "disableHTTP2" not in class_msg  # honoured, so not listed


def _without_http2(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    objs[0]["spec"]["parametersRef"] = {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": "proxy",
                                        "namespace": "infra"}
    return objs + [{"apiVersion": "gateway.nginx.org/v1alpha2", "kind": "NginxProxy",
                    "metadata": {"name": "proxy", "namespace": "infra"}, "spec": {"disableHTTP2": True}}]


def test_without_http2_the_listeners_do_not_list_grpcroute_among_their_supported_kinds():
    lf = gateway_facts(build_index(_without_http2(world()))).gateways[GW_REF].listeners["http"]
    assert lf.supported_kinds == [{"group": GW, "kind": "HTTPRoute"}]
    assert lf.resolved_refs.status and lf.servable


@pytest.mark.parametrize("kinds", [["GRPCRoute"], ["HTTPRoute", "GRPCRoute"]])
def test_without_http2_a_listener_that_asks_for_grpcroute_has_invalid_route_kinds(kinds):
    objs = _without_http2(world(allowedRoutes={"kinds": [{"kind": k} for k in kinds]}))
    lf = gateway_facts(build_index(objs)).gateways[GW_REF].listeners["http"]
    assert (lf.resolved_refs.status, lf.resolved_refs.reason) == (False, "InvalidRouteKinds")
    assert f"{GW}/GRPCRoute" in lf.resolved_refs.message and "disableHTTP2" in lf.resolved_refs.message
    assert lf.supported_kinds == [{"group": GW, "kind": k} for k in kinds if k != "GRPCRoute"]
    # the same listener with HTTP/2 on takes both kinds
    plain = gateway_facts(build_index(world(allowedRoutes={"kinds": [{"kind": k} for k in kinds]})))
    assert plain.gateways[GW_REF].listeners["http"].resolved_refs.status
