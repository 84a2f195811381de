"""The span relay on its own: datagrams as NGINX sends them (syslog over UDP) in, spans out through
an exporter that succeeds, fails or is stuck; every span is either exported or counted as lost,
and the loss is bounded by batchSize x batchCount."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

from opentelemetry.sdk.trace.export import SpanExportResult

from gateway_proc import wait_until
from gwpolicy.gateway.nginxproxy import Exporter
from gwpolicy.gateway.spanrelay import SpanRelay, parse_datagram
from gwpolicy.gateway.tracing import TAG, RouteTrace

EXP = Exporter(endpoint="127.0.0.1:1", interval_s=0.2, batch_size=4, batch_count=2, service_name="gwpolicy:app:gw",
               attributes=(("k", "proxy"),))
ROUTE = RouteTrace(route="HTTPRoute/app/coffee", http_route="/coffee", attributes=(("k", "policy"),), exporter=EXP)


class FakeExporter:
    def __init__(self, result: SpanExportResult, gate: threading.Event | None = None) -> None:
        self.result, self.gate, self.spans = result, gate, []
        self.entered = threading.Event()

    def export(self, batch: list[Any]) -> SpanExportResult:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        self.spans += batch
        return self.result

    def shutdown(self) -> None:
        pass


def _line(i: int, key: str = "abc") -> bytes:
    rec = {"r": key, "t": f"{i + 1:032x}", "s": f"{i + 1:016x}", "p": "", "st": "200", "m": "GET",
           "end": "1796459606.783", "rt": "0.012", "uc": "0.001", "uh": "0.005", "ur": "0.006", "h": "cafe",
           "sp": "80", "pr": "HTTP/1.1", "c": "127.0.0.1", "gs": "", "u": "/coffee?x=1"}
    return f"<190>Dec  5 08:33:26 {TAG}: ".encode() + json.dumps(rec).encode()


def _send(relay: SpanRelay, lines: list[bytes]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for line in lines:
            s.sendto(line, (relay.address, relay.port))


def test_a_record_becomes_a_span_with_the_policys_attribute_over_the_proxys():
    fake = FakeExporter(SpanExportResult.SUCCESS)
    relay = SpanRelay(make_exporter=lambda e: fake).start()
    try:
        relay.update({"abc": ROUTE})
        _send(relay, [_line(0), _line(1, key="unknown"), b"<190>not ours"])
        wait_until(lambda: relay.counts.exported == 1 and relay.counts.malformed == 2, timeout=10)
        (span,) = fake.spans
        assert span.name == "GET /coffee" and span.attributes["k"] == "policy"
        assert span.attributes["url.query"] == "x=1" and span.resource.attributes["service.name"] == "gwpolicy:app:gw"
        assert span.end_time - span.start_time == 12_000_000
    finally:
        relay.stop()


def test_a_failing_export_and_a_full_queue_are_counted_never_blocking_the_receiver():
    gate = threading.Event()
    fake = FakeExporter(SpanExportResult.FAILURE, gate)
    relay = SpanRelay(make_exporter=lambda e: fake).start()
    try:
        relay.update({"abc": ROUTE})
        _send(relay, [_line(i) for i in range(4)])  # one batch: the exporter takes it and hangs
        wait_until(lambda: relay.counts.received == 4, timeout=10)
        assert fake.entered.wait(10)  # the export thread holds the first batch
        _send(relay, [_line(i) for i in range(4, 30)])  # 8 more fit (4 x 2), 18 do not
        wait_until(lambda: relay.counts.received == 30, timeout=10)
        assert relay.counts.queue_full == 18
        gate.set()
        wait_until(lambda: relay.counts.export_failed == 12, timeout=10)
        assert relay.counts.exported == 0 and relay.counts.lost == 30
        assert parse_datagram(_line(0)) is not None
    finally:
        gate.set()
        relay.stop()


def test_stop_exports_every_span_nginx_sent_however_long_the_interval():
    """A graceful stop of the gateway (after NGINX's) stops the relay: records still in its socket's
    buffer are read, and every span waiting for its batch's interval (60 s here) is exported."""
    slow = Exporter(endpoint="127.0.0.1:1", interval_s=60.0, batch_size=64, batch_count=8, service_name="s", attributes=())
    fake = FakeExporter(SpanExportResult.SUCCESS)
    relay = SpanRelay(make_exporter=lambda e: fake).start()
    relay.update({"abc": RouteTrace(route="HTTPRoute/app/coffee", http_route="/coffee", attributes=(), exporter=slow)})
    _send(relay, [_line(i) for i in range(300)])
    relay.stop()  # at once: many records are still unread
    assert relay.counts.received == 300 and relay.counts.exported == 300 and len(fake.spans) == 300
    assert relay.counts.lost == 0
