"""`gwpolicy echo --grpc`: the Gateway API conformance gRPC echo backend, for tests and demos.

It answers as the suite's gRPC echo server does (echo-basic's `grpcecho` service): the service
`gateway_api_conformance.echo_basic.grpcecho.GrpcEcho` with the methods `Echo` and `EchoTwo`, which
return what they saw, and `EchoThree`, which is left unimplemented (the caller gets UNIMPLEMENTED).
The answer, an `EchoResponse`, carries `assertions`: the fully qualified method
(`/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/Echo`), every request metadata entry as a
`Header` (with `:authority` among them, as grpc-go reports it), the `:authority`, the pod context
(namespace, pod) and, over TLS, what the connection negotiated. A test sees which backend answered,
which method it ran and which metadata reached it (the header filters of a GRPCRoute, a
`traceparent` the gateway added).

The messages are built at run time from a descriptor written out below (the proto's equivalent),
with the protobuf library doing the encoding: no generated code to keep in step and no protoc step
in the build. The wire format is the suite's: field numbers and types are those of its
`grpcecho.proto`, so the suite's own client reads our answers and ours reads the suite's.

    package gateway_api_conformance.echo_basic.grpcecho;
    message Header { string key = 1; string value = 2; }
    message Context { string namespace = 1; string ingress = 2; string service_name = 3; string pod = 4; }
    message TLSAssertions { string version = 1; string negotiated_protocol = 2; string server_name = 3;
                            string cipher_suite = 4; repeated string peer_certificates = 5; }
    message Assertions { string fully_qualified_method = 1; repeated Header headers = 2; string authority = 3;
                         Context context = 4; TLSAssertions tls_assertions = 5; }
    message EchoRequest {}
    message EchoResponse { Assertions assertions = 1; EchoRequest request = 2; }
    service GrpcEcho { rpc Echo(EchoRequest) returns (EchoResponse); rpc EchoTwo(...); rpc EchoThree(...); }

Usable in-process (`GrpcEchoServer(...).start()`, and `call()` as a client) or as a command.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections import deque
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import grpc  # type: ignore[import-untyped]  # grpcio ships no type information
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

from gwpolicy.gateway.dataplane.model import hostport
from gwpolicy.kube.args import HelpFormatter, Parser, program_name

PACKAGE = "gateway_api_conformance.echo_basic.grpcecho"
SERVICE = f"{PACKAGE}.GrpcEcho"
#: the methods the service declares; the server implements all but EchoThree (UNIMPLEMENTED, as the suite's)
METHODS = ("Echo", "EchoTwo", "EchoThree")
IMPLEMENTED = ("Echo", "EchoTwo")


def method_path(method: str) -> str:
    """`Echo` -> `/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/Echo` (the HTTP/2 :path)."""
    return f"/{SERVICE}/{method}"


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The proto file of the module docstring, as a descriptor."""
    string, message, repeated = (descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                                 descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                                 descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    fd = descriptor_pb2.FileDescriptorProto(name="gwpolicy/grpcecho.proto", package=PACKAGE, syntax="proto3")

    def msg(name: str, fields: Sequence[tuple[str, int, int, int, str]]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".{PACKAGE}.{type_name}"

    msg("Header", [("key", 1, string, optional, ""), ("value", 2, string, optional, "")])
    msg("Context", [("namespace", 1, string, optional, ""), ("ingress", 2, string, optional, ""),
                    ("service_name", 3, string, optional, ""), ("pod", 4, string, optional, "")])
    msg("TLSAssertions", [("version", 1, string, optional, ""), ("negotiated_protocol", 2, string, optional, ""),
                          ("server_name", 3, string, optional, ""), ("cipher_suite", 4, string, optional, ""),
                          ("peer_certificates", 5, string, repeated, "")])
    msg("Assertions", [("fully_qualified_method", 1, string, optional, ""), ("headers", 2, message, repeated, "Header"),
                       ("authority", 3, string, optional, ""), ("context", 4, message, optional, "Context"),
                       ("tls_assertions", 5, message, optional, "TLSAssertions")])
    msg("EchoRequest", [])
    msg("EchoResponse", [("assertions", 1, message, optional, "Assertions"), ("request", 2, message, optional, "EchoRequest")])
    svc = fd.service.add(name="GrpcEcho")
    for name in METHODS:
        svc.method.add(name=name, input_type=f".{PACKAGE}.EchoRequest", output_type=f".{PACKAGE}.EchoResponse")
    return fd


# a pool of our own: the process-wide default pool may hold another copy of this file (a test that
# also imports code generated from the suite's proto) and would refuse a second definition
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_descriptor())
_CLASSES = message_factory.GetMessages([_file_descriptor()], pool=_POOL)
EchoRequest: Any = _CLASSES[f"{PACKAGE}.EchoRequest"]
EchoResponse: Any = _CLASSES[f"{PACKAGE}.EchoResponse"]


def _authority(context: Any) -> str:
    """The request's :authority. grpcio has no public call for it; grpc core's call details carry it
    (`host`), reachable from the servicer context. Empty when a grpcio release moves it (the answer
    then says nothing rather than something wrong; tests/gateway/test_grpcecho.py notices)."""
    host = getattr(getattr(getattr(context, "_rpc_event", None), "call_details", None), "host", b"")
    return host.decode("utf-8", "replace") if isinstance(host, bytes) else str(host or "")


class GrpcEchoServer:
    """One gRPC echo backend on `address:port` (port 0: any free port; see `.port` after start()).
    With `cert`/`key` (PEM file paths) it serves gRPC over TLS (grpcs), else cleartext HTTP/2 (h2c)."""

    def __init__(self, pod: str, namespace: str, *, address: str = "127.0.0.1", port: int = 0,
                 cert: str | None = None, key: str | None = None, workers: int = 16) -> None:
        self.pod, self.namespace, self.address = pod, namespace, address
        self.tls = bool(cert)
        self.requests = 0
        #: the assertions of the last answers, oldest first (what reached the backend: metadata, method)
        self.seen: deque[Any] = deque(maxlen=1000)
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"grpcecho-{pod}"))
        handlers = {name: grpc.unary_unary_rpc_method_handler(self._handler(name), request_deserializer=EchoRequest.FromString,
                                                               response_serializer=EchoResponse.SerializeToString)
                    for name in IMPLEMENTED}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        where = hostport(address, port)
        if cert:
            if not key:
                raise ValueError("a TLS gRPC echo needs both cert and key")
            with open(cert, "rb") as c, open(key, "rb") as k:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
            self.port = self._server.add_secure_port(where, creds)
        else:
            self.port = self._server.add_insecure_port(where)
        if not self.port:
            raise OSError(f"cannot listen on {where}")

    def _handler(self, method: str) -> Callable[[Any, Any], Any]:
        def answer(request: Any, context: Any) -> Any:
            authority = _authority(context)
            assertions = {"fully_qualified_method": method_path(method), "authority": authority,
                          "context": {"namespace": self.namespace, "pod": self.pod},
                          "headers": ([{"key": ":authority", "value": authority}] if authority else [])
                          + [{"key": m.key, "value": m.value if isinstance(m.value, str) else m.value.hex()}
                             for m in context.invocation_metadata()]}
            if self.tls:
                auth = context.auth_context()
                assertions["tls_assertions"] = {
                    "negotiated_protocol": "h2",  # gRPC over TLS is HTTP/2 by ALPN; grpc core refuses anything else
                    "peer_certificates": [c.decode() for c in auth.get("x509_pem_cert", [])]}
            response = EchoResponse(assertions=assertions, request=request)
            with self._lock:
                self.requests += 1
                self.seen.append(response.assertions)
            return response
        return answer

    def start(self) -> "GrpcEchoServer":
        self._server.start()
        return self

    def stop(self, grace: float = 0.5) -> None:
        self._server.stop(grace).wait(5)

    def __enter__(self) -> "GrpcEchoServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Answer:
    """One call's outcome, as the suite's client records it: the status code and, when OK, the echo."""
    code: Any  # grpc.StatusCode
    details: str = ""
    response: Any = None  # EchoResponse when code is OK
    initial_metadata: list[tuple[str, str]] = field(default_factory=list)

    @property
    def pod(self) -> str:
        return str(self.response.assertions.context.pod) if self.response is not None else ""

    @property
    def namespace(self) -> str:
        return str(self.response.assertions.context.namespace) if self.response is not None else ""

    @property
    def method(self) -> str:
        return str(self.response.assertions.fully_qualified_method) if self.response is not None else ""

    def metadata(self) -> dict[str, list[str]]:
        """The metadata the backend received, name (lower case, as on the wire) -> values in order."""
        out: dict[str, list[str]] = {}
        for h in (self.response.assertions.headers if self.response is not None else []):
            out.setdefault(h.key.lower(), []).append(h.value)
        return out


def channel(target: str, *, authority: str | None = None, root_certificates: bytes | None = None,
            server_name: str | None = None) -> Any:
    """A grpcio channel to `host:port`: cleartext (h2c prior knowledge, as the suite's client) unless
    `root_certificates` is given; `authority` is the :authority every call carries (the suite's
    `grpc.WithAuthority`), `server_name` the TLS name to send and verify when it differs."""
    options: list[tuple[str, Any]] = []
    if authority:
        options.append(("grpc.default_authority", authority))
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    if root_certificates is not None:
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates), options=options)
    return grpc.insecure_channel(target, options=options)


def call(chan: Any, method: str = "Echo", metadata: Sequence[tuple[str, str]] = (), timeout: float = 10.0) -> Answer:
    """One unary call of `method` on a channel from `channel()`; a failed call is an Answer too (its code)."""
    stub = chan.unary_unary(method_path(method), request_serializer=EchoRequest.SerializeToString,
                            response_deserializer=EchoResponse.FromString)
    try:
        response, rpc = stub.with_call(EchoRequest(), metadata=list(metadata), timeout=timeout)
    except grpc.RpcError as e:
        return Answer(code=e.code(), details=e.details() or "")
    return Answer(code=rpc.code(), response=response,
                  initial_metadata=[(m.key, m.value) for m in (rpc.initial_metadata() or ())])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grpc", action="store_true", help="serve the gRPC echo service (this command)")
    p.add_argument("--port", type=int, required=True, help="port to listen on")
    p.add_argument("--address", default="127.0.0.1", help="address to listen on")
    p.add_argument("--pod", required=True, help="pod name to report, e.g. grpc-infra-backend-v1-abc-xyz")
    p.add_argument("--namespace", required=True, help="namespace to report")
    p.add_argument("--cert", help="PEM certificate: serve gRPC over TLS")
    p.add_argument("--key", help="PEM private key for --cert")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C."""
    if bool(args.cert) != bool(args.key):
        raise SystemExit("gwpolicy echo --grpc: --cert and --key go together")
    try:
        server = GrpcEchoServer(args.pod, args.namespace, address=args.address, port=args.port, cert=args.cert, key=args.key)
    except OSError as e:
        raise SystemExit(f"gwpolicy echo --grpc: cannot use --cert/--key or listen on {args.address}:{args.port}: {e}")
    except RuntimeError as e:  # grpcio: a port it cannot bind, a certificate it cannot load
        raise SystemExit(f"gwpolicy echo --grpc: cannot listen on {args.address}:{args.port}: {e}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    print(f"grpc echo {args.namespace}/{args.pod} on {'grpcs' if args.cert else 'h2c'}://{args.address}:{server.port}"
          f" service {SERVICE}", flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=f"{program_name()} echo --grpc", formatter_class=HelpFormatter,
               description=(__doc__ or "").splitlines()[0], epilog="""examples:
  gwpolicy echo --grpc --port 3000 --pod grpc-infra-backend-v1-abc-xyz --namespace gateway-conformance-infra
""")
    add_arguments(p)
    return run(p.parse_args(argv))
