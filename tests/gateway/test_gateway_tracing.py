"""ObservabilityPolicy tracing through the whole gateway: `gwpolicy gateway` on an API server, real
NGINX, real HTTP and gRPC clients and backends on loopback, and a real OTLP/gRPC receiver
(tests/otlp_receiver.py, decoding with opentelemetry-proto). The GatewayClass names an NginxProxy
whose telemetry exporter points at the receiver; each route carries an ObservabilityPolicy.

What must hold, each checked in traffic:
- one span per sampled request, with its real timings (client request, upstream connect, first
  byte, end), method, route, status and the policy's and the NginxProxy's attributes;
- `inject`/`propagate`: the backend gets a `traceparent` whose trace id is the span's and whose
  parent is the gateway's span; `extract`/`propagate` continue an incoming trace; `strategy: parent`
  follows the incoming sampled flag;
- ratio 0 exports nothing, 100 everything, 50 about half of 1,000 requests;
- spans reach the collector within the exporter interval; a collector that is down loses spans,
  never requests, and the gateway's /metrics counts the loss;
- without an NginxProxy exporter for its Gateway, the policy is `Accepted=False`, reason
  `NginxProxyNotSet`, and nothing is traced.

On both API servers: against kube-apiserver, which refuses loopback addresses in EndpointSlices, the
backends run on a test host (tests/backend_hosts.py). Addresses: Gateways from 127.0.99.0/24, the
receiver (and the sandbox's backends) on 127.0.98.0/24.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

import backend_hosts
import live_server
from gateway_kit import backend, endpoints, listener, meta, service
from gateway_proc import GatewayProcess, wait_until
from gwpolicy.gateway import grpcecho, nginxproxy
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER
from otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.skipif(not Path("/usr/lib/nginx/modules/ngx_stream_js_module.so").exists(),
                                reason="needs Debian's nginx with libnginx-mod-stream-js")

NS = "tracing"
POOL = "127.0.99.0/24"
BACKENDS = "127.0.98.1"
RECEIVER = "127.0.98.2"
INTERVAL = 1.0  # the NginxProxy's exporter interval, seconds
GW = "gateway.networking.k8s.io"
NGF = "gateway.nginx.org/v1alpha2"
CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds" / "gateway.nginx.org"
TP = "0af7651916cd43dd8448eb211c80319c"  # an incoming trace id
PARENT = "b7ad6b7169203331"  # the caller's span id
GRPC_HOST = "grpc.example.com"
HTTP_HOST = "cafe.example.com"

#: route name -> (path, tracing)
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "r100": ("/r100", {"strategy": "ratio", "ratio": 100}),
    "r0": ("/r0", {"strategy": "ratio", "ratio": 0, "context": "propagate"}),
    "r50": ("/r50", {"strategy": "ratio", "ratio": 50}),
    "extract": ("/extract", {"strategy": "ratio", "context": "extract"}),
    "inject": ("/inject", {"strategy": "ratio", "context": "inject"}),
    "propagate": ("/propagate", {"strategy": "ratio", "context": "propagate", "spanName": "coffee-span"}),
    "parent": ("/parent", {"strategy": "parent", "context": "propagate"}),
}
ATTRS = [{"key": "coffee-key", "value": "coffee-value"}, {"key": "shared", "value": "from-policy"}]


def _crds() -> list[dict[str, Any]]:
    return [d for f in ("nginxproxies.yaml", "observabilitypolicies.yaml")
            for d in yaml.safe_load_all((CRDS / f).read_text()) if d]


def _class(name: str, proxy: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"controllerName": GATEWAY_CONTROLLER}
    if proxy:
        spec["parametersRef"] = {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": proxy, "namespace": NS}
    return {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta(name), "spec": spec}


def _proxy(name: str, telemetry: dict[str, Any] | None, rewrite: dict[str, Any] | None = None,
           level: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"telemetry": telemetry} if telemetry else {}
    if rewrite:
        spec["rewriteClientIP"] = rewrite
    if level:
        spec["logging"] = {"errorLevel": level}
    return {"apiVersion": NGF, "kind": "NginxProxy", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def _gateway(name: str, cls: str) -> dict[str, Any]:
    return {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta(name, NS),
            "spec": {"gatewayClassName": cls, "listeners": [listener("http", 80)]}}


def _route(name: str, path: str, gw: str = "gw", kind: str = "HTTPRoute", svc: str = "echo") -> dict[str, Any]:
    rule: dict[str, Any] = {"backendRefs": [backend(svc)]}
    spec: dict[str, Any] = {"parentRefs": [{"name": gw}], "rules": [rule]}
    if kind == "HTTPRoute":
        rule["matches"] = [{"path": {"type": "PathPrefix", "value": path}}]
    # an HTTPRoute and a GRPCRoute cannot share a hostname on one listener
    spec["hostnames"] = [HTTP_HOST if kind == "HTTPRoute" else GRPC_HOST]
    return {"apiVersion": f"{GW}/v1", "kind": kind, "metadata": meta(name, NS), "spec": spec}


def _policy(name: str, target: str, tracing: dict[str, Any], kind: str = "HTTPRoute") -> dict[str, Any]:
    return {"apiVersion": NGF, "kind": "ObservabilityPolicy", "metadata": {"name": name, "namespace": NS},
            "spec": {"targetRefs": [{"group": GW, "kind": kind, "name": target}],
                     "tracing": {**tracing, "spanAttributes": ATTRS}}}


def _accepted(server: Any, plural: str, name: str, controller: str = GATEWAY_CONTROLLER) -> list[tuple[str, str]]:
    """(status, reason) of every Accepted condition our ancestor entries of a policy carry."""
    got = server.kubectl("get", f"{plural}.gateway.nginx.org", "-n", NS, name, "-o", "json", check=False)
    if got.returncode:
        return []
    ancestors = (json.loads(got.stdout).get("status") or {}).get("ancestors") or []
    return [(c["status"], c["reason"]) for a in ancestors if a.get("controllerName") == controller
            for c in a.get("conditions") or [] if c.get("type") == "Accepted"]


def _condition(server: Any, kind: str, name: str, ns: str | None = None) -> dict[str, Any]:
    args = ["get", f"{kind}.{GW}", name, "-o", "json"] + (["-n", ns] if ns else [])
    got = server.kubectl(*args, check=False)
    conds = (json.loads(got.stdout).get("status") or {}).get("conditions") or [] if not got.returncode else []
    return next((c for c in conds if c.get("type") == "Accepted"), {})


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, module_server_kind: str):
    tmp = tmp_path_factory.mktemp("tracing")
    host = None
    if module_server_kind == "kube":  # a real API server takes no loopback address in an EndpointSlice
        why = backend_hosts.missing()
        if why:
            pytest.skip(why)
    rx = OtlpReceiver(RECEIVER).start()
    server = live_server.start(module_server_kind, tmp)
    gw = None
    echo = gecho = None
    try:
        if module_server_kind == "kube":
            host = backend_hosts.BackendHost()
            at = host.address(1)
            host.serve([{"pod": "echo-7c9f-a1", "namespace": NS, "address": at, "port": 8080},
                        {"pod": "grpc-echo-7c9f-a1", "namespace": NS, "address": at, "port": 8081, "grpc": True}])
            echo_at, gecho_at = (at, 8080), (at, 8081)
        else:
            echo = EchoServer("echo-7c9f-a1", NS, address=BACKENDS).start()
            gecho = grpcecho.GrpcEchoServer("grpc-echo-7c9f-a1", NS, address=BACKENDS).start()
            echo_at, gecho_at = (BACKENDS, echo.port), (BACKENDS, gecho.port)
        server.apply((live_server.gateway_api_crds() if module_server_kind == "sandbox" else []) + _crds())
        objs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            _class("traced", "proxy"), _class("plain", "plainproxy"),
            _proxy("proxy", {"exporter": {"endpoint": rx.endpoint, "interval": f"{int(INTERVAL * 1000)}ms",
                                          "batchSize": 64, "batchCount": 8},
                             "serviceName": "my-app",
                             "spanAttributes": [{"key": "cluster-attribute-key", "value": "cluster-attribute-value"},
                                                {"key": "shared", "value": "from-nginxproxy"}]}),
            _proxy("plainproxy", None, level="info",
                   rewrite={"mode": "XForwardedFor", "trustedAddresses": [{"type": "CIDR", "value": "127.0.0.0/8"}]}),
            _gateway("gw", "traced"), _gateway("plain", "plain"),
            service("echo", NS), service("grpc-echo", NS),
            *endpoints("echo", NS, [echo_at]), *endpoints("grpc-echo", NS, [gecho_at]),
            _route("bare", "/bare", gw="plain"), _policy("bare", "bare", {"strategy": "ratio"}),
            _route("grpc", "", kind="GRPCRoute", svc="grpc-echo"),
            _policy("grpc", "grpc", {"strategy": "ratio", "context": "propagate"}, kind="GRPCRoute"),
        ]
        for name, (path, tracing) in ROUTES.items():
            objs += [_route(name, path), _policy(name, name, tracing)]
        server.apply(objs)
        gw = GatewayProcess(server.kubeconfig, tmp / "state", pool=POOL)
        addr = {}
        for name in ("gw", "plain"):
            addr[name] = wait_until(lambda n=name: (json.loads(server.kubectl(
                "get", f"gateways.{GW}", "-n", NS, n, "-o", "json").stdout).get("status", {}).get("addresses") or [{}])[0].get("value"),
                timeout=60, what=f"Gateway {name} has an address")
        try:
            for name, (path, _) in ROUTES.items():
                wait_until(lambda p=path: _get(addr["gw"], p)[0] == 200, timeout=60, what=f"{path} served")
            wait_until(lambda: _get(addr["plain"], "/bare")[0] == 200, timeout=60, what="/bare served")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{gw.tail(20)}") from None
        yield {"rx": rx, "server": server, "addr": addr["gw"], "plain": addr["plain"], "gw": gw, "echo_at": echo_at,
               "tmp": tmp}
    finally:
        if gw is not None:
            gw.stop()
        for b in (gecho, echo, host):
            if b is not None:
                b.stop()
        server.close()
        rx.stop()


def _get(address: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection(address, 80, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": HTTP_HOST, **(headers or {})})
        r = conn.getresponse()
        body = r.read()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, {"raw": body.decode(errors="replace")}
    finally:
        conn.close()


def _of(spans: list[Any], route: str) -> list[Any]:
    return [s for s in spans if s.attributes.get("gwpolicy.route") == f"{route.split('/')[0]}/{NS}/{route.split('/')[1]}"]


def _settle(plane: dict[str, Any], n_before: int, expect: int, timeout: float = 15.0) -> list[Any]:
    """The spans that arrived after the first n_before, once `expect` more came (and time for strays)."""
    plane["rx"].wait_for(n_before + expect, timeout)
    time.sleep(INTERVAL * 2)
    return plane["rx"].spans[n_before:]


def _metric(gw: GatewayProcess, name: str, labels: str = "") -> float:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_the_policies_are_accepted_where_the_gateway_exports_and_not_where_it_does_not(plane):
    server = plane["server"]
    assert _condition(server, "gatewayclasses", "traced").get("status") == "True"
    for name in list(ROUTES) + ["grpc"]:
        wait_until(lambda n=name: _accepted(server, "observabilitypolicies", n) == [("True", "Accepted")],
                   timeout=30, what=f"ObservabilityPolicy {name} Accepted")
    wait_until(lambda: _accepted(server, "observabilitypolicies", "bare") == [("False", "NginxProxyNotSet")],
               timeout=30, what="ObservabilityPolicy bare NginxProxyNotSet")


def test_without_an_exporter_nothing_is_traced(plane):
    n = len(plane["rx"].spans)
    for _ in range(5):
        status, echoed = _get(plane["plain"], "/bare", {"traceparent": f"00-{TP}-{PARENT}-01"})
        assert status == 200 and echoed["headers"]["Traceparent"] == [f"00-{TP}-{PARENT}-01"]
    assert _get(plane["addr"], "/r100")[0] == 200  # a marker: once its span is in, /bare's would be too
    spans = _settle(plane, n, 1)
    assert not _of(spans, "HTTPRoute/bare") and len(_of(spans, "HTTPRoute/r100")) == 1


def test_a_span_per_request_with_its_real_timings_and_attributes(plane):
    n = len(plane["rx"].spans)
    t0 = time.time_ns()
    status, echoed = _get(plane["addr"], "/r100?delay=200ms&x=1", {"traceparent": f"00-{TP}-{PARENT}-01"})
    t1 = time.time_ns()
    assert status == 200
    (span,) = _settle(plane, n, 1)
    a = span.attributes
    assert span.name == "GET /r100" and span.span.kind == 2  # SPAN_KIND_SERVER
    assert a["http.request.method"] == "GET" and a["http.response.status_code"] == 200
    assert a["url.path"] == "/r100" and a["url.query"] == "delay=200ms&x=1" and a["http.route"] == "/r100"
    assert a["gwpolicy.route"] == f"HTTPRoute/{NS}/r100"
    # the policy's attributes, then the NginxProxy's; the policy's wins a key both set
    assert a["coffee-key"] == "coffee-value" and a["cluster-attribute-key"] == "cluster-attribute-value"
    assert a["shared"] == "from-policy"
    assert span.resource["service.name"] == f"gwpolicy:{NS}:gw:my-app"
    # real timings (NGINX logs milliseconds): the backend slept 200 ms before its first byte
    assert t0 - 2_000_000 <= span.start_ns < span.end_ns <= t1 + 2_000_000
    assert span.end_ns - span.start_ns >= 200_000_000
    ev = span.events()
    assert ev["upstream.start"] <= ev["upstream.connected"] <= ev["upstream.first_byte"] <= span.end_ns
    assert ev["upstream.first_byte"] - ev["upstream.start"] >= 200_000_000
    # context ignore: a new trace, and the backend sees the caller's header untouched
    assert span.trace_id != TP and span.parent_span_id == ""
    assert echoed["headers"]["Traceparent"] == [f"00-{TP}-{PARENT}-01"]


def test_propagate_continues_the_trace_and_hands_the_backend_the_gateways_span(plane):
    n = len(plane["rx"].spans)
    status, echoed = _get(plane["addr"], "/propagate", {"traceparent": f"00-{TP}-{PARENT}-01", "tracestate": "v=1"})
    assert status == 200
    (span,) = _settle(plane, n, 1)
    assert span.name == "coffee-span"
    assert span.trace_id == TP and span.parent_span_id == PARENT
    assert echoed["headers"]["Traceparent"] == [f"00-{TP}-{span.span_id}-01"]
    assert echoed["headers"]["Tracestate"] == ["v=1"]  # the caller's vendor state travels on
    assert echoed["headers"]["X-Forwarded-For"]  # the base headers still reach the backend


def test_inject_starts_a_trace_the_backend_joins(plane):
    n = len(plane["rx"].spans)
    _, echoed = _get(plane["addr"], "/inject", {"traceparent": f"00-{TP}-{PARENT}-01", "tracestate": "v=1"})
    _, fresh = _get(plane["addr"], "/inject")
    spans = _settle(plane, n, 2)
    by_trace = {s.trace_id: s for s in spans}
    assert TP not in by_trace and all(s.parent_span_id == "" for s in spans)
    for e in (echoed, fresh):
        version, trace, parent, flags = e["headers"]["Traceparent"][0].split("-")
        assert (version, flags) == ("00", "01") and by_trace[trace].span_id == parent
    assert "Tracestate" not in echoed["headers"]


def test_extract_continues_the_trace_without_touching_the_request(plane):
    n = len(plane["rx"].spans)
    _, echoed = _get(plane["addr"], "/extract", {"traceparent": f"00-{TP}-{PARENT}-00"})
    _, none = _get(plane["addr"], "/extract")
    # ids that W3C forbids (all zeros, upper case) are no context: a new trace
    _, zero = _get(plane["addr"], "/extract", {"traceparent": f"00-{'0' * 32}-{PARENT}-01"})
    _get(plane["addr"], "/extract", {"traceparent": f"00-{TP.upper()}-{PARENT}-01"})
    spans = _settle(plane, n, 4)
    continued = [s for s in spans if s.trace_id == TP]
    assert len(continued) == 1 and continued[0].parent_span_id == PARENT
    assert sum(1 for s in spans if s.parent_span_id == "") == 3
    assert echoed["headers"]["Traceparent"] == [f"00-{TP}-{PARENT}-00"] and "Traceparent" not in none["headers"]
    assert zero["headers"]["Traceparent"] == [f"00-{'0' * 32}-{PARENT}-01"]


def test_parent_strategy_follows_the_incoming_sampled_flag(plane):
    n = len(plane["rx"].spans)
    _, sampled = _get(plane["addr"], "/parent", {"traceparent": f"00-{TP}-{PARENT}-01"})
    _, unsampled = _get(plane["addr"], "/parent", {"traceparent": f"00-{TP}-{PARENT}-00"})
    _, orphan = _get(plane["addr"], "/parent")
    spans = _settle(plane, n, 1)
    assert [(s.trace_id, s.parent_span_id) for s in spans] == [(TP, PARENT)]
    assert sampled["headers"]["Traceparent"] == [f"00-{TP}-{spans[0].span_id}-01"]
    # not sampled: no span, and the backend is told so (flags 00) under the gateway's span id
    assert re.fullmatch(f"00-{TP}-[0-9a-f]{{16}}-00", unsampled["headers"]["Traceparent"][0])
    assert orphan["headers"]["Traceparent"][0].endswith("-00")


def test_a_grpc_call_gets_its_span_and_the_backend_its_traceparent(plane):
    n = len(plane["rx"].spans)
    chan = grpcecho.channel(f"{plane['addr']}:80", authority=GRPC_HOST)
    try:
        answer = grpcecho.call(chan, "Echo", [("traceparent", f"00-{TP}-{PARENT}-01")])
    finally:
        chan.close()
    assert answer.code == grpc.StatusCode.OK
    (span,) = _settle(plane, n, 1)
    a = span.attributes
    assert (a["rpc.system"], a["rpc.service"], a["rpc.method"], a["rpc.grpc.status_code"]) == \
        ("grpc", grpcecho.SERVICE, "Echo", 0)
    assert span.trace_id == TP and span.parent_span_id == PARENT
    assert answer.metadata()["traceparent"] == [f"00-{TP}-{span.span_id}-01"]


def test_ratio_0_exports_nothing_100_everything_and_50_about_half_of_1000(plane):
    rx, addr = plane["rx"], plane["addr"]
    _, zero = _get(addr, "/r0", {"traceparent": f"00-{TP}-{PARENT}-01"})
    assert zero["headers"]["Traceparent"] == [f"00-{TP}-{PARENT}-01"]  # ratio 0 programs nothing at all
    n = len(rx.spans)

    def burst(path: str) -> int:
        conn = http.client.HTTPConnection(addr, 80, timeout=30)
        try:
            for _ in range(100):
                conn.request("GET", path, headers={"Host": HTTP_HOST})
                r = conn.getresponse()
                r.read()
                assert r.status == 200
        finally:
            conn.close()
        return 100

    with futures.ThreadPoolExecutor(5) as pool:
        assert sum(pool.map(burst, ["/r50"] * 10 + ["/r100"] * 2 + ["/r0"] * 2)) == 1400
    spans = _settle(plane, n, 200 + 430, timeout=60)
    assert len(_of(spans, "HTTPRoute/r100")) == 200 and not _of(rx.spans, "HTTPRoute/r0")
    half = len(_of(spans, "HTTPRoute/r50"))
    # binomial(1000, 0.5): sd 15.8; 430..570 is beyond 4 sd either way
    assert 430 <= half <= 570, half
    assert _metric(plane["gw"], "gwpolicy_gateway_spans_lost_total") == 0


def test_the_client_address_comes_from_x_forwarded_for_of_a_trusted_peer(plane):
    # the plain class's NginxProxy rewrites the client address (XForwardedFor, 127.0.0.0/8 trusted)
    status, plain = _get(plane["plain"], "/bare", {"X-Forwarded-For": "203.0.113.7"})
    assert status == 200 and plain["headers"]["X-Real-Ip"] == ["203.0.113.7"]
    # the traced one's does not: the peer's address stays
    _, traced = _get(plane["addr"], "/r100", {"X-Forwarded-For": "203.0.113.7"})
    assert traced["headers"]["X-Real-Ip"] == ["127.0.0.1"]


def test_spans_arrive_within_the_exporter_interval(plane):
    rx = plane["rx"]
    n = len(rx.spans)
    sent = []
    for _ in range(5):
        sent.append(time.monotonic())
        assert _get(plane["addr"], "/r100")[0] == 200
        time.sleep(0.3)
    rx.wait_for(n + 5, timeout=15)
    lags = [arrived - s for arrived, s in zip(rx.arrivals[n:n + 5], sent)]
    # a span waits at most one interval for its batch; the slack is the export's own round trip on a busy machine
    assert max(lags) <= INTERVAL + 1.0, lags


def test_a_collector_that_is_down_loses_spans_not_requests_and_the_metric_counts_them(plane):
    rx, gw = plane["rx"], plane["gw"]
    before = _metric(gw, "gwpolicy_gateway_spans_total", '{outcome="export_failed"}')
    rx.stop()
    try:
        statuses = [_get(plane["addr"], "/r100")[0] for _ in range(30)]
        assert statuses == [200] * 30
        # the exporter retries for min(interval, 10) s, at least 1 s, then the batch is counted
        wait_until(lambda: _metric(gw, "gwpolicy_gateway_spans_total", '{outcome="export_failed"}') - before >= 30,
                   timeout=40, step=0.5, what="30 spans counted as lost")
        assert _metric(gw, "gwpolicy_gateway_spans_lost_total") >= 30
    finally:
        rx.start()  # the same port: the collector is back
    n = len(rx.spans)

    def arrived() -> bool:
        assert _get(plane["addr"], "/r100")[0] == 200
        return len(rx.spans) > n

    wait_until(arrived, timeout=30, step=0.3, what="a span reached the collector after it came back")


NGF_EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "ngf"
NGF_CONTROLLER = "gateway.nginx.org/nginx-gateway-controller"


def test_ngfs_documented_tracing_examples_apply_unchanged_and_take_effect_in_traffic(plane):
    """NGF's tracing page, its five manifests applied as written (tests/data/ngf/tracing-*.yaml, into
    `default` as `kubectl apply` without -n does) to a gateway that serves NGF's controllerName. Its
    exporter endpoint is a cluster DNS name of the page's collector; one separate step points just
    that field at the test's receiver. Then /coffee is traced at the policy's 75 percent with the
    policy's and the NginxProxy's attributes; the data plane page's Gateway-level NginxProxies
    (a serviceName with attributes; DisableTracing) change the spans, then stop them."""
    server, rx = plane["server"], plane["rx"]
    files = sorted(NGF_EXAMPLES.glob("tracing-*.yaml"))
    assert [f.name[:10] for f in files] == [f"tracing-0{i}" for i in range(1, 6)]
    for f in files:
        server.kubectl("apply", "--server-side", "-f", str(f))
    # the Deployment runs no pods here: its Service's endpoints are the test's echo backend
    server.apply(endpoints("coffee", "default", [plane["echo_at"]]))
    gw = GatewayProcess(server.kubeconfig, plane["tmp"] / "ngf-state", "--controller-name", NGF_CONTROLLER,
                        pool="127.0.98.64/26")
    try:
        cafe = wait_until(lambda: (json.loads(server.kubectl("get", f"gateways.{GW}", "-n", "default", "cafe", "-o",
                                                             "json").stdout).get("status", {}).get("addresses") or [{}])[0].get("value"),
                          timeout=60, what="Gateway cafe has an address")
        assert _condition(server, "gatewayclasses", "nginx").get("status") == "True"

        def policy() -> list[tuple[str, str]]:
            got = server.kubectl("get", "observabilitypolicies.gateway.nginx.org", "-n", "default", "coffee", "-o",
                                 "json")
            return [(c["status"], c["reason"]) for a in (json.loads(got.stdout).get("status") or {}).get("ancestors") or []
                    if a.get("controllerName") == NGF_CONTROLLER for c in a.get("conditions") or []
                    if c.get("type") == "Accepted"]

        # the exporter is configured as written, so the policy is accepted before any span can reach it
        wait_until(lambda: policy() == [("True", "Accepted")], timeout=30, what="ObservabilityPolicy coffee Accepted")
        server.kubectl("patch", "nginxproxies.gateway.nginx.org", "-n", "default", "ngf-proxy-config", "--type",
                       "merge", "-p", json.dumps({"spec": {"telemetry": {"exporter": {"endpoint": rx.endpoint}}}}))
        n = len(rx.spans)

        def one_traced() -> bool:
            assert _get(cafe, "/coffee")[0] == 200
            return any(s.attributes.get("gwpolicy.route") == "HTTPRoute/default/coffee" for s in rx.spans[n:])

        try:
            wait_until(one_traced, timeout=60, step=0.5, what="a /coffee span once the endpoint points at the receiver")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{gw.tail(20)}") from None
        wait = nginxproxy.DEFAULT_INTERVAL_S + 2  # the example sets no interval: NGF's default
        time.sleep(wait)  # strays of the warm-up land before the count starts
        n = len(rx.spans)
        for _ in range(400):
            assert _get(cafe, "/coffee")[0] == 200
        rx.wait_for(n + 255, timeout=30)
        time.sleep(wait)
        spans = [s for s in rx.spans[n:] if s.attributes.get("gwpolicy.route") == "HTTPRoute/default/coffee"]
        # binomial(400, 0.75): sd 8.7; 255..345 is beyond 5 sd either way
        assert 255 <= len(spans) <= 345, len(spans)
        s = spans[0]
        assert s.name == "GET /coffee" and s.attributes["http.route"] == "/coffee"
        assert s.attributes["coffee-key"] == "coffee-value"
        assert s.attributes["cluster-attribute-key"] == "cluster-attribute-value"
        assert s.resource["service.name"] == "gwpolicy:default:cafe"

        # the data plane page's NginxProxies, applied as written, as the Gateway's own: the first
        # sets a serviceName and its spanAttributes (a list: they replace the class's), the
        # class's exporter stays; the second disables tracing
        def own(name: str) -> None:
            server.kubectl("apply", "--server-side", "-f", str(NGF_EXAMPLES / f"{name}.yaml"))
            server.kubectl("patch", f"gateways.{GW}", "-n", "default", "cafe", "--type", "merge", "-p", json.dumps(
                {"spec": {"infrastructure": {"parametersRef": {"group": "gateway.nginx.org", "kind": "NginxProxy",
                                                               "name": name.split("-", 3)[3]}}}}))

        own("data-plane-04-gateway-telemetry-service-name")
        n = len(rx.spans)

        def renamed() -> bool:
            assert _get(cafe, "/coffee")[0] == 200
            return any(s.resource["service.name"] == "gwpolicy:default:cafe:my-app" for s in rx.spans[n:])

        wait_until(renamed, timeout=60, step=0.5, what="spans of service my-app")
        s = next(s for s in rx.spans[n:] if s.resource["service.name"] == "gwpolicy:default:cafe:my-app")
        assert s.attributes["app-key"] == "app-value" and "cluster-attribute-key" not in s.attributes
        assert s.attributes["coffee-key"] == "coffee-value"

        own("data-plane-06-gateway-disable-tracing")
        wait_until(lambda: policy() == [("False", "NginxProxyNotSet")], timeout=30,
                   what="ObservabilityPolicy coffee NginxProxyNotSet")
        time.sleep(wait)  # spans of requests before the change have landed
        n = len(rx.spans)
        for _ in range(20):
            assert _get(cafe, "/coffee")[0] == 200
        time.sleep(wait)
        assert not [s for s in rx.spans[n:] if s.attributes.get("gwpolicy.route") == "HTTPRoute/default/coffee"]
    finally:
        gw.stop()


@pytest.mark.parametrize("example", ["data-plane-03-gateway-class-telemetry", "data-plane-05-gateway-class-telemetry"])
def test_ngfs_class_telemetry_examples_take_effect_and_a_graceful_stop_exports_their_spans(plane, example):
    """NGF's data plane page's class-level NginxProxies (serviceName my-company; example 3 with
    span attribute company-key and batchSize 20, example 5 without), applied as written and named
    by a GatewayClass's parametersRef; one separate step points just the exporter endpoint at the
    test's receiver. Their interval is 60 s: only full batches (example 3's 20 spans) arrive while
    traffic runs for longer than the default interval; the rest wait, and SIGTERM to the gateway (a
    graceful stop) exports every span at once."""
    server, rx = plane["server"], plane["rx"]
    controller, name = "gwpolicy.io/ngf-data-plane-test", "gateway-class-telemetry"
    server.kubectl("delete", "nginxproxies.gateway.nginx.org", "-n", "default", name, "--ignore-not-found")
    server.kubectl("apply", "--server-side", "-f", str(NGF_EXAMPLES / f"{example}.yaml"))
    server.kubectl("patch", "nginxproxies.gateway.nginx.org", "-n", "default", name, "--type", "merge", "-p",
                   json.dumps({"spec": {"telemetry": {"exporter": {"endpoint": rx.endpoint}}}}))
    cls = {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("ngf-data-plane"),
           "spec": {"controllerName": controller,
                    "parametersRef": {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": name, "namespace": "default"}}}
    server.apply([cls, _gateway("company", "ngf-data-plane"), _route("company", "/company", gw="company"),
                  _policy("company", "company", {"strategy": "ratio"})])
    gw = GatewayProcess(server.kubeconfig, plane["tmp"] / f"dp-state-{example[11:13]}", "--controller-name", controller,
                        pool="127.0.98.32/28")
    stopped = False
    try:
        addr = wait_until(lambda: (json.loads(server.kubectl("get", f"gateways.{GW}", "-n", NS, "company", "-o", "json")
                                              .stdout).get("status", {}).get("addresses") or [{}])[0].get("value"),
                          timeout=60, what="Gateway company has an address")
        def programmed() -> bool:
            got = json.loads(server.kubectl("get", f"gateways.{GW}", "-n", NS, "company", "-o", "json").stdout)
            return any(c.get("type") == "Programmed" and c.get("status") == "True"
                       for c in (got.get("status") or {}).get("conditions") or [])

        # no request before the count: every span of the test's requests is then one it sent
        wait_until(lambda: _accepted(server, "observabilitypolicies", "company", controller) == [("True", "Accepted")]
                   and programmed(), timeout=60, what="ObservabilityPolicy company Accepted, Gateway company Programmed")
        service_name = f"gwpolicy:{NS}:company:my-company"  # NGF's rule: the default name, then the serviceName

        def ours(spans: list[Any]) -> list[Any]:
            return [s for s in spans if s.resource.get("service.name") == service_name]

        n = len(rx.spans)
        sent, end = [], time.monotonic() + 3
        while time.monotonic() < end or len(sent) % 20 != 10:  # example 3's batchSize is 20: half a batch over
            sent.append(f"n={len(sent)}")
            assert _get(addr, f"/company?{sent[-1]}")[0] == 200
            time.sleep(0.05)
        time.sleep(nginxproxy.DEFAULT_INTERVAL_S + 1)  # longer than the default interval, far shorter than 60 s
        early = len(ours(rx.spans[n:]))
        if example.startswith("data-plane-03"):  # full batches go at once, the rest waits for the interval
            assert early >= 20 and 0 < len(sent) - early < 20, (early, len(sent))
        else:  # batchSize 512 (NGF's default): every span waits
            assert early == 0
        t0 = time.monotonic()
        assert gw.stop(signal.SIGTERM) == 0
        stopped = True
        wait_until(lambda: len(ours(rx.spans[n:])) >= len(sent), timeout=10, what="the spans, exported at the stop")
        assert time.monotonic() - t0 < 30
        spans = ours(rx.spans[n:])
        assert sorted(s.attributes["url.query"] for s in spans) == sorted(sent)
        for s in spans:
            assert s.attributes["gwpolicy.route"] == f"HTTPRoute/{NS}/company"
            assert s.attributes.get("company-key") == ("company-value" if example.startswith("data-plane-03") else None)
    finally:
        if not stopped:
            gw.stop()
        server.kubectl("delete", f"gateways.{GW}", "-n", NS, "company", "--ignore-not-found")
