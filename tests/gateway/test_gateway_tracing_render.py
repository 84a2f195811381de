"""ObservabilityPolicy tracing as rendered: no tenant string (span name, span attributes, the
NginxProxy's service name and attributes) ever reaches NGINX's files, whatever it holds; a route
is traced only where its Gateway's NginxProxy sets an exporter and the policy's ratio is above 0;
the relay's table holds exactly the keys the configuration names."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy.engine.analysis import analyse
from gwpolicy.gateway import policyconf, tracing
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER
from gwpolicy.gateway.render import render

GW = "gateway.networking.k8s.io"
NGF = "gateway.nginx.org/v1alpha2"


def _objects(tracing_spec: dict[str, Any], telemetry: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": {"name": "nginx"},
         "spec": {"controllerName": GATEWAY_CONTROLLER,
                  "parametersRef": {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": "proxy", "namespace": "app"}}},
        {"apiVersion": NGF, "kind": "NginxProxy", "metadata": {"name": "proxy", "namespace": "app"},
         "spec": {"telemetry": telemetry} if telemetry else {}},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "app"},
         "spec": {"gatewayClassName": "nginx", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": "coffee", "namespace": "app"},
         "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/coffee"}}],
                                                            "backendRefs": [{"name": "coffee", "port": 80}]}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "coffee", "namespace": "app"},
         "spec": {"ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "coffee-1", "namespace": "app", "labels": {"kubernetes.io/service-name": "coffee"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
         "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}]},
        {"apiVersion": NGF, "kind": "ObservabilityPolicy", "metadata": {"name": "trace", "namespace": "app"},
         "spec": {"targetRefs": [{"group": GW, "kind": "HTTPRoute", "name": "coffee"}], "tracing": tracing_spec}},
    ]


EXPORTER = {"exporter": {"endpoint": "collector.tracing:4317"}}


def _render(objs: list[dict[str, Any]]) -> tuple[Any, dict[str, bytes]]:
    dp = build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks(), by_target=True),
                         DataPlaneConfig(allow_unmanaged_endpointslices=True))
    return dp, render(dp)


def _keys(files: dict[str, bytes]) -> set[str]:
    return set(re.findall(r"set \$gw_tr_route ([0-9a-f]+);", b"".join(files.values()).decode()))


_marked = st.text(min_size=1, max_size=40).map(lambda t: "zq" + t + "qz")  # distinctive, any characters


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_marked, _marked, _marked, st.sampled_from(["ignore", "extract", "inject", "propagate"]))
def test_no_tenant_string_reaches_nginx_whatever_it_holds(name, key, value, context):
    objs = _objects({"strategy": "ratio", "ratio": 40, "context": context, "spanName": name,
                     "spanAttributes": [{"key": key, "value": value}]},
                    {**EXPORTER, "serviceName": "svc", "spanAttributes": [{"key": key, "value": value}]})
    dp, files = _render(objs)
    text = b"".join(files.values()).decode(errors="replace")
    for s in (name, key, value):
        assert s not in text and s.encode("unicode_escape").decode() not in text
    table = tracing.table(dp)
    assert _keys(files) == set(table)  # empty when the policy is invalid (a '"' or '$' in it): nothing traced
    for rt in table.values():
        assert rt.span_name == name and (key, value) in rt.attributes


def test_traced_only_with_an_exporter_and_a_ratio_above_zero():
    on = {"strategy": "ratio", "ratio": 50, "context": "propagate"}
    dp, files = _render(_objects(on, EXPORTER))
    assert len(_keys(files)) == 1 and set(tracing.table(dp)) == _keys(files)
    assert b'split_clients "$gw_tr_trace" $gw_ratio_50' in files["maps.conf"]
    assert b"proxy_set_header traceparent 00-$gw_tr_trace-$gw_span_id-0$gw_tr_sampled;" in files["servers.conf"]
    for objs in (_objects(on, None), _objects(on, {"serviceName": "x"}),
                 _objects({**on, "ratio": 0}, EXPORTER),
                 _objects(on, {**EXPORTER, "disabledFeatures": ["DisableTracing"]})):
        dp, files = _render(objs)
        assert not _keys(files) and not tracing.table(dp)
        assert b"traceparent" not in files["servers.conf"]


def test_the_nginxproxys_error_level_and_client_ip_rewrite_reach_its_servers_as_nginx_words_only():
    objs = _objects({"strategy": "ratio"}, None)
    objs[1]["spec"] = {"logging": {"errorLevel": "warn"},
                       "rewriteClientIP": {"mode": "XForwardedFor", "setIPRecursively": True,
                                           "trustedAddresses": [{"type": "CIDR", "value": "10.1.2.3/16"},
                                                                {"type": "IPAddress", "value": "::ffff:1.2.3.4"},
                                                                {"type": "Hostname", "value": "lb.example.com"}]}}
    _, files = _render(objs)
    server = files["servers.conf"].decode()
    for line in ("error_log ../logs/error.log warn;", "set_real_ip_from 10.1.0.0/16;", "set_real_ip_from ::ffff:102:304;",
                 "real_ip_header X-Forwarded-For;", "real_ip_recursive on;"):
        assert f"    {line}\n" in server
    assert "lb.example.com" not in server
    # an address that does not parse makes the class not accepted: its Gateway is not served at all
    objs[1]["spec"]["rewriteClientIP"]["trustedAddresses"] = [{"type": "CIDR", "value": "10.0.0.0/8; return 200 x"}]
    dp, files = _render(objs)
    assert not dp.servers and "return 200" not in files["servers.conf"].decode()
