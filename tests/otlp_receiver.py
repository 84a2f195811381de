"""A real OTLP/gRPC trace receiver on loopback, for tests: it serves the OpenTelemetry collector's
`TraceService/Export` and decodes every `ExportTraceServiceRequest` with the opentelemetry-proto
messages (nothing is parsed by hand), keeping each span with its resource and scope.

    with OtlpReceiver("127.0.92.1") as rx:
        ... export to rx.endpoint ...
        spans = rx.wait_for(10, timeout=5)      # [ReceivedSpan]
        rx.refuse = True                         # answer UNAVAILABLE from now on (a collector in trouble)

`stop()` then `start()` again on the same port is a collector that went away and came back.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2


def any_value(v: common_pb2.AnyValue) -> Any:
    """An OTLP AnyValue as a Python value (string, bool, int, float, list, dict, bytes)."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass
class ReceivedSpan:
    """One span as the collector got it: the decoded protobuf span, its resource's and its own attributes."""
    span: Any  # opentelemetry.proto.trace.v1.trace_pb2.Span
    resource: dict[str, Any]
    scope: str

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def name(self) -> str:
        return str(self.span.name)

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes(self.span.attributes)

    @property
    def start_ns(self) -> int:
        return int(self.span.start_time_unix_nano)

    @property
    def end_ns(self) -> int:
        return int(self.span.end_time_unix_nano)

    def events(self) -> dict[str, int]:
        """Event name -> its time (ns)."""
        return {e.name: int(e.time_unix_nano) for e in self.span.events}


class _Service(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, receiver: "OtlpReceiver") -> None:
        self.rx = receiver

    def Export(self, request: Any, context: Any) -> Any:
        rx = self.rx
        with rx._cond:
            rx.requests += 1
            if rx.refuse:
                rx.refused += 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "refusing (test)")
            for rs in request.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        rx.spans.append(ReceivedSpan(span=span, resource=resource, scope=ss.scope.name))
                        rx.arrivals.append(time.monotonic())
            rx._cond.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """OTLP/gRPC on `address:port` (port 0: a free one, kept across stop()/start())."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0) -> None:
        self.address, self.port = address, port
        self.spans: list[ReceivedSpan] = []
        self.arrivals: list[float] = []  # time.monotonic() when each span arrived
        self.requests = 0
        self.refused = 0
        self.refuse = False
        self._cond = threading.Condition()
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    def start(self) -> "OtlpReceiver":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), server)
        port = server.add_insecure_port(f"{self.address}:{self.port}")
        if not port:
            raise OSError(f"cannot listen on {self.address}:{self.port}")
        self.port = port
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None

    def wait_for(self, n: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        """The spans once at least `n` have arrived (AssertionError after `timeout` seconds)."""
        end = time.monotonic() + timeout
        with self._cond:
            while len(self.spans) < n:
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.spans)} spans arrived in {timeout} s, expected {n}")
                self._cond.wait(left)
            return list(self.spans)

    def __enter__(self) -> "OtlpReceiver":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
