"""Prototype of the gateway's span relay: NGINX logs one line per sampled request to it (syslog over
UDP on loopback, `log_format ... escape=json`), and it exports one span per line with the
OpenTelemetry SDK's OTLP/gRPC exporter.

NGINX makes the ids and decides sampling (`trace_nginx_conf()` below writes the directives): the
trace id is the incoming `traceparent`'s when the route extracts it, else `$request_id`; the span id
is 16 hex digits of `$request_id`; `split_clients` over the trace id gives a ratio, the incoming
sampled flag gives `parent`. The same ids go to the backend in the `traceparent` NGINX injects, so
the backend's spans hang below the gateway's. The relay only turns each line into a span: name,
kind SERVER, start = end - $request_time, end = $msec, events at the upstream's connect and first
byte, HTTP attributes, the route's and the NginxProxy's span attributes.

Loss is bounded and counted, never pushed onto traffic: NGINX's send is a non-blocking datagram;
a full socket buffer drops datagrams (the kernel counts them, SO_RXQ_OVFL, read on every receive);
a full queue (batch_size x batch_count spans, NGF's batchSize and batchCount) drops spans; an
export that fails after the exporter's retries drops its batch. `counts` holds each.

The relay batches itself (a bounded deque and one export thread) instead of using the SDK's
BatchSpanProcessor because the latter reports the spans it drops only in a log line (or in its
experimental internal metrics); encoding, transport and retries are the SDK exporter's.

Run as a program (`python tests/span_relay.py ROUTES.json ENDPOINT`) it prints its UDP port and
counts on SIGTERM: the benchmark measures its CPU in a process of its own.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

TAG = "gwtrace"
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # Linux: the count of datagrams the socket dropped
SCOPE = InstrumentationScope("gwpolicy.gateway", "0.1.0")

# the line NGINX logs for a sampled request (escape=json: every value is a JSON string, never raw)
LOG_FORMAT = ("log_format gwtrace escape=json '{"
              '"r":"$gw_tr_route","t":"$gw_tr_trace","s":"$gw_span_id","p":"$gw_tr_parent",'
              '"st":"$status","m":"$request_method","end":"$msec","rt":"$request_time",'
              '"uc":"$upstream_connect_time","uh":"$upstream_header_time","ur":"$upstream_response_time",'
              '"h":"$host","sp":"$server_port","pr":"$server_protocol","c":"$remote_addr",'
              '"gs":"$upstream_http_grpc_status$upstream_trailer_grpc_status","u":"$request_uri"'
              "}';")


@dataclass(frozen=True)
class RouteTrace:
    """What the gateway knows of one traced location (its key in the log line)."""
    route: str  # "HTTPRoute/ns/name" or "GRPCRoute/ns/name"
    http_route: str  # the rule's match, e.g. "/coffee" or "/pkg.Service/Method"
    span_name: str = ""  # the policy's spanName; else "<METHOD> <http_route>"
    attributes: tuple[tuple[str, str], ...] = ()  # the policy's spanAttributes, then the NginxProxy's


@dataclass
class Counts:
    received: int = 0  # lines read
    malformed: int = 0  # lines that are no span record (dropped)
    socket_overflow: int = 0  # datagrams the kernel dropped: the relay did not read fast enough
    queue_full: int = 0  # spans dropped: batch_size x batch_count spans were already waiting
    export_failed: int = 0  # spans of batches the exporter could not deliver (collector down)
    exported: int = 0


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


def to_span(rec: dict[str, str], routes: dict[str, RouteTrace], resource: Resource) -> ReadableSpan | None:
    """One span from one record, or None when the record is not a valid one of ours."""
    route = routes.get(rec.get("r", ""))
    trace, span_id, parent = rec.get("t", ""), rec.get("s", ""), rec.get("p", "")
    end, took = _ns(rec.get("end", "")), _ns(rec.get("rt", ""))
    if route is None or len(trace) != 32 or len(span_id) != 16 or end is None or took is None:
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
    for k, v in reversed(route.attributes):  # the first of a key wins: the policy's over the NginxProxy's
        attrs[k] = v
    ctx = SpanContext(trace_id=tid, span_id=sid, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent_ctx = SpanContext(trace_id=tid, span_id=pid, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)) \
        if pid else None
    return ReadableSpan(name=route.span_name or f"{method} {route.http_route}", context=ctx, parent=parent_ctx,
                        resource=resource, attributes=attrs, events=events, kind=SpanKind.SERVER,
                        status=Status(StatusCode.ERROR) if status >= 500 else Status(StatusCode.UNSET),
                        start_time=end - took, end_time=end, instrumentation_scope=SCOPE)


@dataclass
class SpanRelay:
    """Receive NGINX's records on a UDP socket and export spans in batches (NGF's exporter settings:
    `interval` seconds between exports at most, `batch_size` spans per export, `batch_count` batches
    waiting at most)."""
    routes: dict[str, RouteTrace]
    exporter: SpanExporter
    resource: Resource
    interval: float = 5.0
    batch_size: int = 512
    batch_count: int = 4
    address: str = "127.0.0.1"
    port: int = 0
    counts: Counts = field(default_factory=Counts)
    on_export: Callable[[int], None] | None = None  # test hook: called with each exported batch's size

    def start(self) -> "SpanRelay":
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # the kernel caps it at rmem_max
        self._sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        self._sock.bind((self.address, self.port))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._receive, name="span-relay-recv", daemon=True),
                         threading.Thread(target=self._export_loop, name="span-relay-export", daemon=True)]
        for t in self._threads:
            t.start()
        return self

    @property
    def syslog_target(self) -> str:
        return f"syslog:server={self.address}:{self.port},nohostname,tag={TAG}"

    def _receive(self) -> None:
        limit = self.batch_size * self.batch_count
        while not self._stop.is_set():
            try:
                data, anc, _flags, _addr = self._sock.recvmsg(65535, socket.CMSG_SPACE(4))
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(value) >= 4:
                    self.counts.socket_overflow = struct.unpack("I", value[:4])[0]  # a running total
            self.counts.received += 1
            rec = parse_datagram(data)
            span = to_span(rec, self.routes, self.resource) if rec is not None else None
            if span is None:
                self.counts.malformed += 1
                continue
            with self._lock:
                if len(self._queue) >= limit:
                    self.counts.queue_full += 1
                    continue
                self._queue.append(span)
                if len(self._queue) >= self.batch_size:
                    self._wake.set()

    def _export_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Export everything queued now, a batch at a time."""
        while True:
            with self._lock:
                batch = [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
            if not batch:
                return
            try:
                ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
            except Exception:  # noqa: BLE001 - an exporter bug must not stop the relay; the batch is lost and counted
                ok = False
            if ok:
                self.counts.exported += len(batch)
                if self.on_export:
                    self.on_export(len(batch))
            else:
                self.counts.export_failed += len(batch)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(5)
        self._sock.close()
        self.exporter.shutdown()


def otlp_exporter(endpoint: str, interval: float) -> SpanExporter:
    """NGF's endpoint (`host:port`, optionally `http://host:port`) over OTLP/gRPC without TLS; an
    export gives up after min(interval, 10) seconds of retries, so a dead collector costs a batch, not a backlog."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    # grpc's reconnect backoff grows to 2 minutes while a collector is down; capped at the interval
    # (1-5 s), a collector that is back gets spans again within about one interval
    backoff_ms = int(1000 * max(1.0, min(interval, 5.0)))
    return OTLPSpanExporter(endpoint=endpoint.removeprefix("http://"), insecure=True, timeout=max(1.0, min(interval, 10.0)),
                            channel_options=(("grpc.max_reconnect_backoff_ms", backoff_ms),))


def main(argv: list[str]) -> int:
    """`span_relay.py ROUTES.json ENDPOINT [INTERVAL]`: print the UDP port, relay until SIGTERM, print counts."""
    import signal

    routes = {k: RouteTrace(**v) for k, v in json.loads(open(argv[0]).read()).items()}
    interval = float(argv[2]) if len(argv) > 2 else 1.0
    relay = SpanRelay(routes, otlp_exporter(argv[1], interval), Resource.create({"service.name": "gwpolicy:bench:gw"}),
                      interval=interval).start()
    print(relay.port, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    relay.flush()
    relay.stop()
    print(json.dumps(relay.counts.__dict__), flush=True)
    return 0


def trace_nginx_conf() -> str:
    """The http-context directives every traced location relies on (W3C traceparent in, ids out)."""
    valid = "00-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-[0-9a-f]{2}"
    return "\n".join([
        "# W3C traceparent of the request: version 00, non-zero ids",
        f'map $http_traceparent $gw_in_trace {{ "~^{valid}$" $1; default ""; }}',
        f'map $http_traceparent $gw_in_span {{ "~^{valid}$" $2; default ""; }}',
        'map $http_traceparent $gw_in_sampled { "~^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f][13579bdf]$" 1; default 0; }',
        "# the trace a route that extracts continues: the incoming one, else a new one",
        'map $gw_in_trace $gw_ext_trace { "" $request_id; default $gw_in_trace; }',
        "# the gateway's span id: 16 of $request_id's 32 random hex digits",
        'map $request_id $gw_span_id { "~([0-9a-f]{16})$" $1; }',
        LOG_FORMAT, ""])


def ratio_conf(percent: int) -> str:
    """The sampling variable of a ratio: split_clients over the trace id, so that every gateway on a
    trace decides alike for a continued trace."""
    return f'split_clients "$gw_tr_trace" $gw_ratio_{percent} {{ {percent}% 1; * 0; }}\n'


def location_conf(key: str, *, strategy: str, ratio: int | None, context: str, syslog: str,
                  header_directive: str = "proxy_set_header") -> list[str]:
    """The lines of one traced location (before its proxy_pass; `grpc_set_header` before a grpc_pass):
    ObservabilityPolicy's tracing of a route. A location's own proxy_set_header replaces every one it
    would inherit: with inject or propagate, the location must repeat the others (Connection "" above
    all: without it NGINX sends Connection: close and opens a backend connection per request, which
    measured +18 us of NGINX CPU per request)."""
    extract = context in ("extract", "propagate")
    if strategy == "parent":
        sampled = "$gw_in_sampled"
    elif ratio is None or ratio == 100:
        sampled = "1"
    elif ratio == 0:
        return []  # ratio 0 traces nothing: no span, the headers left as they came
    else:
        sampled = f"$gw_ratio_{ratio}"
    parent = "$gw_in_span" if extract else '""'
    lines = [f"set $gw_tr_route {key};", f"set $gw_tr_trace {'$gw_ext_trace' if extract else '$request_id'};",
             f"set $gw_tr_parent {parent};", f"set $gw_tr_sampled {sampled};",
             f"access_log {syslog} gwtrace if=$gw_tr_sampled;"]
    if context in ("inject", "propagate"):
        lines.append(f"{header_directive} traceparent 00-$gw_tr_trace-$gw_span_id-0$gw_tr_sampled;")
        if context == "inject":
            lines.append(f'{header_directive} tracestate "";')  # a new trace: the caller's vendor state is not ours
    return lines


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
