"""Prototype of ObservabilityPolicy tracing on Debian's NGINX 1.22 (which has no OpenTelemetry
module), end to end with a hand-written configuration: NGINX makes the span ids, decides sampling
and propagates W3C `traceparent` (maps over the header and `$request_id`, `split_clients` for a
ratio), logs each sampled request's timings over syslog/UDP to the span relay (tests/span_relay.py,
the gateway's part), which exports spans with the OpenTelemetry SDK's OTLP/gRPC exporter to a real
OTLP receiver on loopback (tests/otlp_receiver.py). What must hold, each checked in traffic:

- one span per sampled request, with its real timings (client request, upstream connect, first
  byte, end), method, route, status and the policy's and the NginxProxy's attributes;
- `inject`/`propagate`: the backend gets a `traceparent` whose trace id is the span's and whose
  parent is the gateway's span; `extract`/`propagate` continue an incoming trace; `ignore`/`extract`
  leave the request's headers alone; `strategy: parent` follows the incoming sampled flag;
- ratio 0 exports nothing, 100 everything, 50 about half of 1,000 requests;
- spans reach the collector within the exporter interval; a collector that is down loses spans,
  never requests, and the loss is counted.

Addresses: 127.0.92.0/24.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gwpolicy.gateway import grpcecho
from gwpolicy.gateway.echo import EchoServer
from otlp_receiver import OtlpReceiver
from raw_nginx import RawNginx
from span_relay import RouteTrace, SpanRelay, location_conf, otlp_exporter, ratio_conf, trace_nginx_conf

pytestmark = pytest.mark.skipif(not Path("/usr/sbin/nginx").exists(), reason="needs Debian's nginx")

ADDR = "127.0.92.1"
INTERVAL = 0.5
TP = "0af7651916cd43dd8448eb211c80319c"  # an incoming trace id
PARENT = "b7ad6b7169203331"  # the caller's span id

# location -> (route key, strategy, ratio, context)
ROUTES = {
    "/r100": ("1", "ratio", 100, "ignore"),
    "/r0": ("2", "ratio", 0, "propagate"),
    "/r50": ("3", "ratio", 50, "ignore"),
    "/extract": ("4", "ratio", None, "extract"),
    "/inject": ("5", "ratio", None, "inject"),
    "/propagate": ("6", "ratio", None, "propagate"),
    "/parent": ("7", "parent", None, "propagate"),
}
TRACES = {key: RouteTrace(route=f"HTTPRoute/default/{loc.strip('/')}", http_route=loc,
                          span_name="coffee-span" if loc == "/propagate" else "",
                          attributes=(("coffee-key", "coffee-value"), ("shared", "from-policy"),
                                      ("cluster-attribute-key", "cluster-attribute-value"), ("shared", "from-nginxproxy")))
          for loc, (key, *_) in ROUTES.items()}
TRACES["9"] = RouteTrace(route="GRPCRoute/default/echo", http_route=grpcecho.method_path("Echo"))


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _http_conf(relay: SpanRelay, echo_port: int, fast_port: int, port: int, grpc_port: int, grpc_echo_port: int) -> str:
    out = [trace_nginx_conf(), ratio_conf(50),
           f"upstream echo {{ server {ADDR}:{echo_port}; keepalive 8; }}",
           f"upstream fast {{ server {ADDR}:{fast_port}; keepalive 8; }}",
           f"upstream grpcecho {{ server {ADDR}:{grpc_echo_port}; }}",
           f"server {{ listen {ADDR}:{fast_port}; location / {{ return 200 \"fast $http_traceparent\"; }} }}",
           f"server {{\n listen {ADDR}:{port};\n proxy_http_version 1.1;\n proxy_set_header Connection \"\";"]
    for loc, (key, strategy, ratio, context) in ROUTES.items():
        lines = location_conf(key, strategy=strategy, ratio=ratio, context=context, syslog=relay.syslog_target)
        upstream = "fast" if loc == "/r50" else "echo"
        keep = ['proxy_set_header Connection "";'] if context in ("inject", "propagate") else []  # see location_conf
        out.append(f" location {loc} {{\n  " + "\n  ".join(lines + keep + [f"proxy_pass http://{upstream};"]) + "\n }")
    out.append(" location / { return 404; }\n}")
    grpc_lines = location_conf("9", strategy="ratio", ratio=100, context="propagate", syslog=relay.syslog_target,
                               header_directive="grpc_set_header")
    out.append(f"server {{\n listen {ADDR}:{grpc_port} http2;\n location /{grpcecho.SERVICE}/ {{\n  "
               + "\n  ".join(grpc_lines + ["grpc_pass grpc://grpcecho;"]) + "\n }\n}")
    return "\n".join(out)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracing")
    rx = OtlpReceiver(ADDR).start()
    from opentelemetry.sdk.resources import Resource

    relay = SpanRelay(TRACES, otlp_exporter(rx.endpoint, INTERVAL),
                      Resource.create({"service.name": "gwpolicy:default:cafe:my-app"}),
                      interval=INTERVAL, batch_size=64, batch_count=4, address=ADDR).start()
    echo = EchoServer("coffee-abc-def", "default", address=ADDR).start()
    gecho = grpcecho.GrpcEchoServer("grpc-echo-abc-def", "default", address=ADDR).start()
    port, fast, gport = (_free_port(ADDR) for _ in range(3))
    nginx = RawNginx(tmp, http=_http_conf(relay, echo.port, fast, port, gport, gecho.port))
    try:
        nginx.start()
        yield {"rx": rx, "relay": relay, "echo": echo, "port": port, "gport": gport, "nginx": nginx}
    finally:
        nginx.stop()
        gecho.stop()
        echo.stop()
        relay.stop()
        rx.stop()


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(ADDR, port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, {"raw": body.decode()}
    finally:
        conn.close()


def _spans_of(rx: OtlpReceiver, route: str) -> list:
    return [s for s in rx.spans if s.attributes.get("gwpolicy.route") == route]


def _settle(plane, n_before: int, expect: int, timeout: float = 5.0) -> list:
    """The spans that arrived after the first n_before, once `expect` more came (and a moment for strays)."""
    plane["rx"].wait_for(n_before + expect, timeout)
    time.sleep(INTERVAL * 2)
    return plane["rx"].spans[n_before:]


def test_a_span_per_request_with_its_real_timings_and_attributes(plane):
    n = len(plane["rx"].spans)
    t0 = time.time_ns()
    status, echoed = _get(plane["port"], "/r100?delay=200ms&x=1", {"traceparent": f"00-{TP}-{PARENT}-01"})
    t1 = time.time_ns()
    assert status == 200
    (span,) = _settle(plane, n, 1)
    a = span.attributes
    assert span.name == "GET /r100" and span.span.kind == 2  # SPAN_KIND_SERVER
    assert a["http.request.method"] == "GET" and a["http.response.status_code"] == 200
    assert a["url.path"] == "/r100" and a["url.query"] == "delay=200ms&x=1" and a["http.route"] == "/r100"
    assert a["gwpolicy.route"] == "HTTPRoute/default/r100"
    # the policy's attributes, then the NginxProxy's; the policy's wins a key both set
    assert a["coffee-key"] == "coffee-value" and a["cluster-attribute-key"] == "cluster-attribute-value"
    assert a["shared"] == "from-policy"
    assert span.resource["service.name"] == "gwpolicy:default:cafe:my-app"
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
    status, echoed = _get(plane["port"], "/propagate", {"traceparent": f"00-{TP}-{PARENT}-01", "tracestate": "v=1"})
    assert status == 200
    (span,) = _settle(plane, n, 1)
    assert span.name == "coffee-span"
    assert span.trace_id == TP and span.parent_span_id == PARENT
    assert echoed["headers"]["Traceparent"] == [f"00-{TP}-{span.span_id}-01"]
    assert echoed["headers"]["Tracestate"] == ["v=1"]  # the caller's vendor state travels on


def test_inject_starts_a_trace_the_backend_joins(plane):
    n = len(plane["rx"].spans)
    _, echoed = _get(plane["port"], "/inject", {"traceparent": f"00-{TP}-{PARENT}-01", "tracestate": "v=1"})
    _, fresh = _get(plane["port"], "/inject")
    spans = _settle(plane, n, 2)
    by_trace = {s.trace_id: s for s in spans}
    assert TP not in by_trace and all(s.parent_span_id == "" for s in spans)
    for e in (echoed, fresh):
        version, trace, parent, flags = e["headers"]["Traceparent"][0].split("-")
        assert (version, flags) == ("00", "01") and by_trace[trace].span_id == parent
    assert "Tracestate" not in echoed["headers"]


def test_extract_continues_the_trace_without_touching_the_request(plane):
    n = len(plane["rx"].spans)
    _, echoed = _get(plane["port"], "/extract", {"traceparent": f"00-{TP}-{PARENT}-00"})
    _, none = _get(plane["port"], "/extract")
    # ids that W3C forbids (all zeros, upper case) are no context: a new trace
    _, zero = _get(plane["port"], "/extract", {"traceparent": f"00-{'0' * 32}-{PARENT}-01"})
    _, upper = _get(plane["port"], "/extract", {"traceparent": f"00-{TP.upper()}-{PARENT}-01"})
    spans = _settle(plane, n, 4)
    continued = [s for s in spans if s.trace_id == TP]
    assert len(continued) == 1 and continued[0].parent_span_id == PARENT
    assert sum(1 for s in spans if s.parent_span_id == "") == 3
    assert echoed["headers"]["Traceparent"] == [f"00-{TP}-{PARENT}-00"] and "Traceparent" not in none["headers"]
    assert zero["headers"]["Traceparent"] == [f"00-{'0' * 32}-{PARENT}-01"]


def test_parent_strategy_follows_the_incoming_sampled_flag(plane):
    n = len(plane["rx"].spans)
    _, sampled = _get(plane["port"], "/parent", {"traceparent": f"00-{TP}-{PARENT}-01"})
    _, unsampled = _get(plane["port"], "/parent", {"traceparent": f"00-{TP}-{PARENT}-00"})
    _, orphan = _get(plane["port"], "/parent")
    spans = _settle(plane, n, 1)
    assert [(s.trace_id, s.parent_span_id) for s in spans] == [(TP, PARENT)]
    assert sampled["headers"]["Traceparent"] == [f"00-{TP}-{spans[0].span_id}-01"]
    # not sampled: no span, and the backend is told so (flags 00) under the gateway's span id
    assert re.fullmatch(f"00-{TP}-[0-9a-f]{{16}}-00", unsampled["headers"]["Traceparent"][0])
    assert orphan["headers"]["Traceparent"][0].endswith("-00")


def test_ratio_0_exports_nothing_and_50_about_half_of_1000(plane):
    rx = plane["rx"]
    _, zero = _get(plane["port"], "/r0", {"traceparent": f"00-{TP}-{PARENT}-01"})
    assert zero["headers"]["Traceparent"] == [f"00-{TP}-{PARENT}-01"]  # ratio 0 programs nothing at all

    def burst(_: int) -> int:
        conn = http.client.HTTPConnection(ADDR, plane["port"], timeout=10)
        try:
            for _ in range(100):
                conn.request("GET", "/r50")
                r = conn.getresponse()
                r.read()
                assert r.status == 200
        finally:
            conn.close()
        return 100

    with futures.ThreadPoolExecutor(10) as pool:
        assert sum(pool.map(burst, range(10))) == 1000
    time.sleep(INTERVAL * 3)
    assert not _spans_of(rx, "HTTPRoute/default/r0")
    half = len(_spans_of(rx, "HTTPRoute/default/r50"))
    # binomial(1000, 0.5): sd 15.8; 430..570 is beyond 4 sd either way
    assert 430 <= half <= 570, half
    assert plane["relay"].counts.queue_full == 0 and plane["relay"].counts.socket_overflow == 0


def test_spans_arrive_within_the_exporter_interval(plane):
    rx = plane["rx"]
    n = len(rx.spans)
    sent = []
    for _ in range(5):
        sent.append(time.monotonic())
        assert _get(plane["port"], "/r100")[0] == 200
        time.sleep(0.13)
    rx.wait_for(n + 5, timeout=5)
    lags = [arrived - s for arrived, s in zip(rx.arrivals[n:n + 5], sent)]
    # a span waits at most one interval for its batch; the slack is the export's own round trip
    assert max(lags) <= INTERVAL + 0.3, lags


def test_a_grpc_call_through_grpc_pass_gets_its_span_and_the_backend_its_traceparent(plane):
    n = len(plane["rx"].spans)
    chan = grpcecho.channel(f"{ADDR}:{plane['gport']}")
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


def test_a_collector_that_is_down_loses_spans_not_requests_and_the_loss_is_counted(plane):
    rx, relay = plane["rx"], plane["relay"]
    before = relay.counts.export_failed
    rx.stop()
    try:
        statuses = [_get(plane["port"], "/r100")[0] for _ in range(30)]
        assert statuses == [200] * 30
        deadline = time.monotonic() + 20  # the exporter retries for min(interval, 10) s, at least 1 s
        while relay.counts.export_failed - before < 30 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert relay.counts.export_failed - before == 30
    finally:
        rx.start()  # the same port: the collector is back
    # spans flow again once the exporter has reconnected (within about one interval: the reconnect
    # backoff is capped); those sent before that are lost and counted like the others
    n, deadline = len(rx.spans), time.monotonic() + 15
    while len(rx.spans) == n and time.monotonic() < deadline:
        assert _get(plane["port"], "/r100")[0] == 200
        time.sleep(0.2)
    assert len(rx.spans) > n, "no span reached the collector after it came back"
    assert rx.spans[-1].attributes["gwpolicy.route"] == "HTTPRoute/default/r100"
