"""Prototype of gRPC on Debian's NGINX 1.22, with hand-written configurations and real grpcio clients
through NGINX to the gRPC echo backend: what a plaintext `listen ... http2` does to HTTP/1.1
clients, the design chosen so that HTTPRoute traffic on a port is never broken by a GRPCRoute on it,
HTTPS with ALPN, and what `grpc_pass` needs (h2c and grpcs backends, matching, header filters,
weights, the answer to a call nothing matches).

Facts shown here (NGINX 1.22.1):
- `listen ... http2` without `ssl` makes the address:port speak only HTTP/2 with prior knowledge,
  for every server on it: an HTTP/1.1 request gets HTTP/2 frames back (SETTINGS, then GOAWAY),
  which no HTTP/1.1 client can read. NGINX learnt to tell the two apart by the HTTP/2 preface only
  in 1.25.1 (the `http2` directive).
- The choice: a plaintext port that serves a GRPCRoute is owned by a `stream` server that reads
  the first bytes (njs `js_preread`, libnginx-mod-stream-js): the HTTP/2 preface goes to the
  port's servers on an `http2` unix socket, everything else to the same servers on a plain one,
  both with a PROXY protocol header so the servers see the client's address.
- `listen ... ssl http2` negotiates by ALPN: h2 clients (gRPC) get HTTP/2, HTTP/1.1 clients keep HTTP/1.1.
- A call no location serves gets HTTP 404, which gRPC clients read as UNIMPLEMENTED (the status
  the conformance suite expects for an unmatched method or host).

Addresses: 127.0.93.0/24.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gwpolicy.gateway import grpcecho
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.rendergrpc import PREFACE_JS
from raw_nginx import MODULES, RawNginx

pytestmark = pytest.mark.skipif(not Path("/usr/sbin/nginx").exists(), reason="needs Debian's nginx")

ADDR = "127.0.93.1"
SVC = grpcecho.SERVICE
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    from cryptography.hazmat.primitives import serialization

    from gwconformance import make_ca, make_cert

    tmp = tmp_path_factory.mktemp("h2-backends")
    ca_cert, ca_key = make_ca()
    cert, key = make_cert(["abc.example.com"], signer=(ca_cert, ca_key))
    (tmp / "be.crt").write_bytes(cert)
    (tmp / "be.key").write_bytes(key)
    (tmp / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    front_cert, front_key = make_cert(["grpc.example.com", "web.example.com"], signer=(ca_cert, ca_key))
    (tmp / "front.pem").write_bytes(front_cert + front_key)
    servers = {"v1": grpcecho.GrpcEchoServer("grpc-infra-backend-v1-a-b", "ns", address=ADDR),
               "v2": grpcecho.GrpcEchoServer("grpc-infra-backend-v2-a-b", "ns", address=ADDR),
               "tls": grpcecho.GrpcEchoServer("grpc-tls-backend-a-b", "ns", address=ADDR, cert=str(tmp / "be.crt"),
                                              key=str(tmp / "be.key")),
               "http": EchoServer("web-backend-a-b", "ns", address=ADDR)}
    for s in servers.values():
        s.start()
    try:
        yield {"dir": tmp, "ca": (tmp / "ca.pem").read_bytes(), **servers}
    finally:
        for s in servers.values():
            s.stop()


def _grpc_locations(b: dict) -> str:
    """The gRPC routing of a GRPCRoute, as the data plane would write it: exact and regular-expression
    method matches are locations on the URI /service/method, a header match a map, filters
    grpc_set_header, weights split_clients, a grpcs backend grpc_ssl_* directives."""
    return f"""
        location = /{SVC}/Echo {{
            grpc_set_header x-header-set set-overwrites-values;
            grpc_set_header x-header-add "$http_x_header_add,add-appends-values";
            grpc_set_header x-header-remove "";
            grpc_pass grpc://$gw_echo_pick;
        }}
        location ~ ^/{SVC}/EchoT(wo|hree)$ {{
            grpc_pass grpc://$gw_by_version;
        }}
        {_grpcs_location("Echo", "abc.example.com", b['dir'] / 'ca.pem')}
        {_grpcs_location("WrongName", "mismatch.example.com", b['dir'] / 'ca.pem')}
        location /who {{ return 200 "$remote_addr $server_protocol $host\\n"; }}
        location /web/ {{ proxy_pass http://web; }}
        location / {{ return 404; }}
"""


def _grpcs_location(name: str, tls_name: str, ca: Path) -> str:
    """/tls.Echo/<name>: a grpcs backend (BackendTLSPolicy's directives) verified against `tls_name`."""
    return (f"location = /tls.Echo/{name} {{ rewrite ^ /{SVC}/Echo break; grpc_ssl_server_name on; "
            f"grpc_ssl_name {tls_name}; grpc_ssl_verify on; grpc_ssl_trusted_certificate {ca}; grpc_pass grpcs://tls_be; }}")


def _upstreams(b: dict) -> str:
    return f"""
    upstream v1 {{ server {ADDR}:{b['v1'].port}; }}
    upstream v2 {{ server {ADDR}:{b['v2'].port}; }}
    upstream tls_be {{ server {ADDR}:{b['tls'].port}; }}
    upstream web {{ server {ADDR}:{b['http'].port}; }}
    split_clients "$request_id" $gw_echo_pick {{ 70% v1; * v2; }}
    map $http_version $gw_by_version {{ two v2; default v1; }}
"""


@pytest.fixture(scope="module")
def plane(tmp_path_factory, backends):
    tmp = tmp_path_factory.mktemp("h2-plane")
    sock = "@sockets@"
    (tmp / "preface.js").write_text(PREFACE_JS)
    ports = {k: _free_port() for k in ("broken", "shared", "tls")}
    http = _upstreams(backends) + f"""
    # what a plaintext http2 listen does: every server of the port speaks HTTP/2 only
    server {{ listen {ADDR}:{ports['broken']} http2; server_name grpc.example.com; {_grpc_locations(backends)} }}
    server {{ listen {ADDR}:{ports['broken']}; server_name web.example.com; location / {{ proxy_pass http://web; }} }}
    # the choice: the port's servers listen on two unix sockets behind the stream server below
    server {{
        listen unix:{sock}/h1.sock proxy_protocol;
        listen unix:{sock}/h2.sock http2 proxy_protocol;
        server_name grpc.example.com web.example.com;
        set_real_ip_from unix:;
        real_ip_header proxy_protocol;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header X-Forwarded-For $remote_addr;
        {_grpc_locations(backends)}
    }}
    # HTTPS: ALPN picks h2 or http/1.1 per connection
    server {{
        listen {ADDR}:{ports['tls']} ssl http2;
        server_name grpc.example.com web.example.com;
        ssl_certificate {backends['dir'] / 'front.pem'};
        ssl_certificate_key {backends['dir'] / 'front.pem'};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        {_grpc_locations(backends)}
    }}
"""
    stream = f"""
    js_import preface from {tmp / 'preface.js'};
    js_var $gw_h2 0;
    map $gw_h2 $gw_plain {{ 1 unix:{sock}/h2.sock; default unix:{sock}/h1.sock; }}
    server {{
        listen {ADDR}:{ports['shared']};
        js_preread preface.detect;
        proxy_pass $gw_plain;
        proxy_protocol on;
    }}
"""
    nginx = RawNginx(tmp, http=http, stream=stream, modules=("ngx_stream_module.so", "ngx_stream_js_module.so"))
    if not (MODULES / "ngx_stream_js_module.so").exists():
        pytest.fail("libnginx-mod-stream-js is not installed (./dev test installs it)")
    with nginx:
        yield {"ports": ports, "nginx": nginx, **backends}


def _h1(port: int, path: str, host: str, *, tls_ca: bytes | None = None) -> tuple[int, str, str]:
    """An HTTP/1.1 request: (status, HTTP version NGINX answered with, body)."""
    if tls_ca is not None:
        ctx = ssl.create_default_context(cadata=tls_ca.decode())
        ctx.check_hostname = False
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(ADDR, port, timeout=10, context=ctx)
    else:
        conn = http.client.HTTPConnection(ADDR, port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        r = conn.getresponse()
        return r.status, f"HTTP/{r.version // 10}.{r.version % 10}", r.read().decode()
    finally:
        conn.close()


def _call(port: int, method: str = "Echo", *, authority: str = "grpc.example.com", metadata=(), tls_ca=None,
          path: str | None = None) -> grpcecho.Answer:
    chan = grpcecho.channel(f"{ADDR}:{port}", authority=authority, root_certificates=tls_ca,
                            server_name="grpc.example.com" if tls_ca else None)
    try:
        if path is None:
            return grpcecho.call(chan, method, metadata)
        stub = chan.unary_unary(path, request_serializer=grpcecho.EchoRequest.SerializeToString,
                                response_deserializer=grpcecho.EchoResponse.FromString)
        try:
            response, rpc = stub.with_call(grpcecho.EchoRequest(), metadata=list(metadata), timeout=10)
            return grpcecho.Answer(code=rpc.code(), response=response)
        except grpc.RpcError as e:
            return grpcecho.Answer(code=e.code(), details=e.details() or "")
    finally:
        chan.close()


def test_a_plaintext_http2_listen_breaks_every_http11_client_of_its_port(plane):
    port = plane["ports"]["broken"]
    assert _call(port).code == grpc.StatusCode.OK  # gRPC (prior knowledge) works
    for host in ("grpc.example.com", "web.example.com"):  # even the server without `http2`
        with socket.create_connection((ADDR, port), timeout=5) as s:
            s.sendall(f"GET /web/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        assert not data.startswith(b"HTTP/")
        # HTTP/2 frames: SETTINGS (type 4) first, then GOAWAY (type 7): the client cannot read an answer
        assert data[3] == 4 and b"\x07\x00\x00\x00\x00\x00" in data


def test_preface_detection_serves_http11_and_grpc_on_one_port(plane):
    port = plane["ports"]["shared"]
    status, version, body = _h1(port, "/who", "web.example.com")
    assert (status, version) == (200, "HTTP/1.1")
    assert body.split() == ["127.0.0.1", "HTTP/1.1", "web.example.com"]  # the client's address, kept
    status, _, body = _h1(port, "/web/x", "web.example.com")
    assert status == 200 and json.loads(body)["pod"] == "web-backend-a-b"
    assert json.loads(body)["headers"]["X-Forwarded-For"] == ["127.0.0.1"]
    answer = _call(port)
    assert answer.code == grpc.StatusCode.OK and answer.method == f"/{SVC}/Echo"
    # both at once, many times: no connection is sent to the wrong side
    with futures.ThreadPoolExecutor(8) as pool:
        h1 = pool.map(lambda _: _h1(port, "/who", "web.example.com")[0], range(40))
        h2 = pool.map(lambda _: _call(port).code, range(40))
        assert list(h1) == [200] * 40 and list(h2) == [grpc.StatusCode.OK] * 40


def test_a_slow_client_that_sends_its_first_bytes_late_is_still_read(plane):
    port = plane["ports"]["shared"]
    with socket.create_connection((ADDR, port), timeout=5) as s:
        s.sendall(b"GE")  # fewer bytes than it takes to tell; the rest comes later
        time.sleep(0.3)
        s.sendall(b"T /who HTTP/1.1\r\nHost: web.example.com\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200")
    for cut in (2, 4, 7, 16, 23):  # a preface cut anywhere is still a preface
        with socket.create_connection((ADDR, port), timeout=5) as s:
            s.sendall(PREFACE[:cut])
            time.sleep(0.3)
            s.sendall(PREFACE[cut:] + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # the rest and an empty SETTINGS
            data = s.recv(4096)
        assert data[3] == 4, (cut, data[:40])  # the server's SETTINGS: it took the connection as HTTP/2


def test_https_negotiates_h2_for_grpc_and_keeps_http11_clients(plane):
    port, ca = plane["ports"]["tls"], plane["ca"]
    answer = _call(port, tls_ca=ca)
    assert answer.code == grpc.StatusCode.OK and answer.pod.startswith("grpc-infra-backend-v")
    status, version, _ = _h1(port, "/who", "web.example.com", tls_ca=ca)
    assert (status, version) == (200, "HTTP/1.1")
    for offer, chosen in ((["h2", "http/1.1"], "h2"), (["http/1.1"], "http/1.1")):
        ctx = ssl.create_default_context(cadata=ca.decode())
        ctx.set_alpn_protocols(offer)
        with socket.create_connection((ADDR, port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="web.example.com") as s:
            assert s.selected_alpn_protocol() == chosen


@pytest.mark.parametrize("port_name", ["shared", "tls"])
def test_method_header_and_unmatched_calls(plane, port_name):
    port = plane["ports"][port_name]
    ca = plane["ca"] if port_name == "tls" else None
    two = _call(port, "EchoTwo", tls_ca=ca, metadata=[("version", "two")])
    assert two.code == grpc.StatusCode.OK and two.pod.startswith("grpc-infra-backend-v2")
    one = _call(port, "EchoTwo", tls_ca=ca)
    assert one.code == grpc.StatusCode.OK and one.pod.startswith("grpc-infra-backend-v1")
    # the regex matched EchoThree and the backend does not implement it; an unknown method has no location
    assert _call(port, "EchoThree", tls_ca=ca).code == grpc.StatusCode.UNIMPLEMENTED
    assert _call(port, tls_ca=ca, path="/other.Service/Echo").code == grpc.StatusCode.UNIMPLEMENTED
    # an :authority no server_name serves: the port's default server (the first one), which matches
    # the same locations here; with a default server that answers 404 it is UNIMPLEMENTED as well


def test_request_header_filters_set_add_and_remove_metadata(plane):
    port = plane["ports"]["shared"]
    answer = _call(port, metadata=[("x-header-set", "original"), ("x-header-add", "original"),
                                   ("x-header-remove", "gone"), ("some-other-header", "kept")])
    md = answer.metadata()
    assert md["x-header-set"] == ["set-overwrites-values"]
    assert md["x-header-add"] == ["original,add-appends-values"]
    assert "x-header-remove" not in md and md["some-other-header"] == ["kept"]
    fresh = _call(port).metadata()
    assert fresh["x-header-add"] == [",add-appends-values"]  # the naive add leaves a comma: the renderer must map


def test_weighted_backends_split_calls(plane):
    port = plane["ports"]["shared"]
    chan = grpcecho.channel(f"{ADDR}:{port}", authority="grpc.example.com")
    try:
        with futures.ThreadPoolExecutor(10) as pool:
            pods = list(pool.map(lambda _: grpcecho.call(chan, "Echo").pod, range(500)))
    finally:
        chan.close()
    share = sum(p.startswith("grpc-infra-backend-v1") for p in pods) / len(pods)
    assert abs(share - 0.7) <= 0.05, share  # the suite's tolerance


def test_grpcs_backend_is_verified(plane):
    port = plane["ports"]["shared"]
    ok = _call(port, path="/tls.Echo/Echo")
    assert ok.code == grpc.StatusCode.OK and ok.pod == "grpc-tls-backend-a-b"
    # the backend's certificate does not name mismatch.example.com: NGINX refuses it (502), the call fails
    bad = _call(port, path="/tls.Echo/WrongName")
    assert bad.code == grpc.StatusCode.UNAVAILABLE
    assert "verify" in plane["nginx"].error_log.read_text() or "certificate" in plane["nginx"].error_log.read_text()
