"""The gateway's span relay: NGINX logs one line per sampled request of a traced route to it
(syslog over UDP on loopback, gateway/tracing.py writes the directives), and it exports one span
per line with the OpenTelemetry SDK's OTLP/gRPC exporter, to the endpoint of the NginxProxy of
the route's Gateway, in that NginxProxy's batches.

Each span: name (the policy's spanName, else `<METHOD> <route's match>`), kind SERVER, the ids
NGINX made (its parent the incoming span when the policy extracts), start = end - $request_time,
end = $msec, events at the upstream's start, connect and first byte, HTTP (or gRPC) attributes,
the route's name, the policy's span attributes, then the NginxProxy's (the first of a key wins).

Loss is bounded and counted, never pushed onto traffic: NGINX's send is a non-blocking datagram; a
full socket buffer drops datagrams (the kernel counts them: SO_RXQ_OVFL, read on every receive);
a full queue (batchSize x batchCount spans) drops spans; an export that fails after the
exporter's retries drops its batch. `counts` holds each; the gateway serves them as metrics.

The relay batches itself (a bounded deque and an export thread per exporter) rather than using the
SDK's BatchSpanProcessor, which reports the spans it drops only in a log line; encoding, transport
and retries are the SDK exporter's.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from gwpolicy.gateway.nginxproxy import Exporter
from gwpolicy.gateway.tracing import TAG, RouteTrace

log = logging.getLogger("gwpolicy.gateway")

SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # Linux: the count of datagrams the socket dropped


@dataclass
class Counts:
    received: int = 0  # lines read
    malformed: int = 0  # lines that are no span record of a known route (dropped)
    socket_overflow: int = 0  # datagrams the kernel dropped: the relay did not read fast enough
    queue_full: int = 0  # spans dropped: batch_size x batch_count spans were already waiting
    export_failed: int = 0  # spans of batches the exporter could not deliver (collector down)
    exported: int = 0

    @property
    def lost(self) -> int:
        return self.socket_overflow + self.queue_full + self.export_failed


def _ns(text: str) -> int | None:
    """NGINX's seconds with milliseconds ("1796459606.783", "0.001") as nanoseconds."""
    sec, _, frac = text.partition(".")
    if not sec.isdigit() or not (frac.isdigit() or frac == ""):
        return None
    return int(sec) * 1_000_000_000 + int((frac + "000")[:3]) * 1_000_000


def _upstream_ns(text: str) -> int | None:
    """$upstream_*_time over every upstream tried ("0.001, 0.004" or "0.002 : 0.003"; "-": none): the total."""
    total, seen = 0, False
    for part in text.replace(" : ", ",").split(","):
        v = _ns(part.strip())
        if v is not None:
            total += v
            seen = True
    return total if seen else None


def parse_datagram(data: bytes) -> dict[str, str] | None:
    """The JSON record after the syslog header `<190>Dec  5 08:33:26 gwtrace: `; None if it is not one."""
    at = data.find(b" " + TAG.encode() + b": ")
    if at < 0:
        return None
    try:
        rec = json.loads(data[at + len(TAG) + 3:])
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and all(isinstance(v, str) for v in rec.values()) else None


def to_span(rec: dict[str, str], route: RouteTrace, resource: Any) -> Any:
    """One span (an SDK ReadableSpan) from one record, or None when the record is not a valid one."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    trace, span_id, parent = rec.get("t", ""), rec.get("s", ""), rec.get("p", "")
    end, took = _ns(rec.get("end", "")), _ns(rec.get("rt", ""))
    if len(trace) != 32 or len(span_id) != 16 or end is None or took is None:
        return None
    try:
        tid, sid = int(trace, 16), int(span_id, 16)
        pid = int(parent, 16) if parent else 0
        status = int(rec.get("st", ""))
    except ValueError:
        return None
    if not tid or not sid:
        return None
    method, uri = rec.get("m", ""), rec.get("u", "")
    path, _, query = uri.partition("?")
    attrs: dict[str, Any] = {"http.request.method": method, "http.response.status_code": status, "url.path": path,
                             "http.route": route.http_route, "server.address": rec.get("h", ""),
                             "network.protocol.version": rec.get("pr", "").removeprefix("HTTP/"),
                             "client.address": rec.get("c", ""), "gwpolicy.route": route.route}
    if query:
        attrs["url.query"] = query
    if route.route.startswith("GRPCRoute/"):  # gRPC's status is in a trailer (or a trailers-only answer)
        service, _, rpc = path.lstrip("/").partition("/")
        attrs.update({"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc})
        if rec.get("gs", "").isdigit():
            attrs["rpc.grpc.status_code"] = int(rec["gs"])
    if rec.get("sp", "").isdigit():
        attrs["server.port"] = int(rec["sp"])
    events = []
    upstream = _upstream_ns(rec.get("ur", ""))
    if upstream is not None:
        began = end - upstream
        events.append(Event("upstream.start", timestamp=began))
        for key, name in (("uc", "upstream.connected"), ("uh", "upstream.first_byte")):
            v = _upstream_ns(rec.get(key, ""))
            if v is not None:
                events.append(Event(name, timestamp=began + v))
                attrs["gwpolicy.upstream." + name.split(".")[1] + "_s"] = v / 1e9
        attrs["gwpolicy.upstream.response_s"] = upstream / 1e9
    for k, val in reversed(route.attributes):  # the first of a key wins: the policy's over the NginxProxy's
        attrs[k] = val
    ctx = SpanContext(trace_id=tid, span_id=sid, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent_ctx = SpanContext(trace_id=tid, span_id=pid, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)) \
        if pid else None
    return ReadableSpan(name=route.span_name or f"{method} {route.http_route}", context=ctx, parent=parent_ctx,
                        resource=resource, attributes=attrs, events=events, kind=SpanKind.SERVER,
                        status=Status(StatusCode.ERROR) if status >= 500 else Status(StatusCode.UNSET),
                        start_time=end - took, end_time=end,
                        instrumentation_scope=InstrumentationScope("gwpolicy.gateway", "0.1.0"))


def otlp_exporter(exp: Exporter) -> Any:
    """NGF's endpoint (`host:port`) over OTLP/gRPC without TLS; an export gives up after
    min(interval, 10) seconds of retries, so a dead collector costs a batch, not a backlog."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    # grpc's reconnect backoff grows to 2 minutes while a collector is down; capped at the interval
    # (at most 5 s), a collector that is back gets spans again within about one interval
    backoff_ms = int(1000 * max(1.0, min(exp.interval_s, 5.0)))
    return OTLPSpanExporter(endpoint=exp.endpoint, insecure=True, timeout=max(1.0, min(exp.interval_s, 10.0)),
                            channel_options=(("grpc.max_reconnect_backoff_ms", backoff_ms),))  # type: ignore[arg-type]  # grpc takes ints; the stub says str


class _Pipeline:
    """The queue and export thread of one exporter."""

    def __init__(self, exp: Exporter, counts: Counts, make: Callable[[Exporter], Any]) -> None:
        from opentelemetry.sdk.resources import Resource

        self.exp = exp
        self.counts = counts
        self.exporter = make(exp)
        self.resource = Resource.create({"service.name": exp.service_name})
        self.queue: deque[Any] = deque()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="span-export", daemon=True)
        self.thread.start()

    def put(self, span: Any) -> None:
        with self.lock:
            if len(self.queue) >= self.exp.batch_size * self.exp.batch_count:
                self.counts.queue_full += 1
                return
            self.queue.append(span)
            if len(self.queue) >= self.exp.batch_size:
                self.wake.set()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self.wake.wait(self.exp.interval_s)
            self.wake.clear()
            self.flush()

    def flush(self) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        while True:
            with self.lock:
                batch = [self.queue.popleft() for _ in range(min(self.exp.batch_size, len(self.queue)))]
            if not batch:
                return
            try:
                ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
            except Exception:  # noqa: BLE001 - an exporter bug must not stop the relay; the batch is lost and counted
                ok = False
            if ok:
                self.counts.exported += len(batch)
            else:
                self.counts.export_failed += len(batch)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        self.thread.join(15)
        self.flush()
        try:
            self.exporter.shutdown()
        except Exception:  # noqa: BLE001 - shutting down a dead channel
            pass


@dataclass
class SpanRelay:
    """Receives NGINX's records on a UDP socket on loopback and exports spans, one pipeline per
    exporter the routes name (NginxProxy's endpoint, interval, batchSize, batchCount, serviceName)."""

    address: str = "127.0.0.1"
    port: int = 0
    make_exporter: Callable[[Exporter], Any] = otlp_exporter
    counts: Counts = field(default_factory=Counts)

    def __post_init__(self) -> None:
        self.routes: dict[str, RouteTrace] = {}
        self.pipelines: dict[Exporter, _Pipeline] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def target(self) -> str:
        """host:port NGINX logs to."""
        return f"{self.address}:{self.port}"

    def start(self) -> "SpanRelay":
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # the kernel caps it at rmem_max
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        sock.bind((self.address, self.port))
        sock.settimeout(0.5)
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._thread = threading.Thread(target=self._receive, name="span-relay", daemon=True)
        self._thread.start()
        return self

    def update(self, routes: dict[str, RouteTrace]) -> None:
        """The traced routes of the configuration NGINX now serves; pipelines of exporters no route
        names any more are flushed and closed (in the background)."""
        wanted = {r.exporter for r in routes.values() if r.exporter is not None}
        with self._lock:
            for exp in wanted - set(self.pipelines):
                try:
                    self.pipelines[exp] = _Pipeline(exp, self.counts, self.make_exporter)
                except Exception:  # noqa: BLE001 - a bad exporter must not stop the gateway; its spans are counted as lost
                    log.exception("cannot make the span exporter for %s", exp.endpoint)
            gone = [self.pipelines.pop(exp) for exp in set(self.pipelines) - wanted]
            # keys of the previous configuration stay known: lines NGINX sent before the reload still arrive
            self.routes = {**{k: r for k, r in self.routes.items() if r.exporter in wanted}, **routes}
        for p in gone:
            threading.Thread(target=p.stop, name="span-export-stop", daemon=True).start()

    def _receive(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set():
            try:
                data, anc, _flags, _addr = sock.recvmsg(65535, socket.CMSG_SPACE(4))
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            self._take(data, anc)
        sock.setblocking(False)  # stopping: what NGINX sent before is in the socket's buffer; take it all
        while True:
            try:
                data, anc, _flags, _addr = sock.recvmsg(65535, socket.CMSG_SPACE(4))
            except OSError:  # BlockingIOError: the buffer is empty
                return
            self._take(data, anc)

    def _take(self, data: bytes, anc: list[tuple[int, int, bytes]]) -> None:
        """One datagram: its span into its exporter's queue, or counted as malformed."""
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(value) >= 4:
                self.counts.socket_overflow = struct.unpack("I", value[:4])[0]  # a running total
        self.counts.received += 1
        rec = parse_datagram(data)
        route = self.routes.get(rec.get("r", "")) if rec is not None else None
        pipeline = self.pipelines.get(route.exporter) if route is not None and route.exporter is not None else None
        span = to_span(rec, route, pipeline.resource) if rec is not None and route is not None and pipeline else None
        if span is None or pipeline is None:
            self.counts.malformed += 1
            return
        pipeline.put(span)

    def flush(self) -> None:
        for p in list(self.pipelines.values()):
            p.flush()

    def stop(self) -> None:
        """Take every record NGINX has sent, export every span waiting (each pipeline's last
        batches), and close: what a graceful stop of the gateway does once NGINX has stopped."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._sock is not None:
            self._sock.close()
        with self._lock:
            pipelines, self.pipelines = list(self.pipelines.values()), {}
        for p in pipelines:
            p.stop()


class Collector:
    """The relay's counts as Prometheus counters on the gateway's /metrics."""

    def __init__(self, relay: SpanRelay) -> None:
        self.relay = relay

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        c = self.relay.counts
        spans = CounterMetricFamily("gwpolicy_gateway_spans", "Spans of traced requests, by outcome: exported; lost "
                                    "because the export failed (collector down), the queue was full (batchSize x "
                                    "batchCount waiting) or the relay's socket overflowed; malformed (no span record "
                                    "of a traced route)", labels=["outcome"])
        for outcome, value in (("exported", c.exported), ("export_failed", c.export_failed), ("queue_full", c.queue_full),
                               ("socket_overflow", c.socket_overflow), ("malformed", c.malformed)):
            spans.add_metric([outcome], value)
        yield spans
        yield CounterMetricFamily("gwpolicy_gateway_spans_lost", "Spans of sampled requests that never reached the "
                                  "collector (the requests themselves were served)", value=c.lost)
