"""`gwpolicy echo`: the Gateway API conformance echo backend (echo-basic's JSON), for tests and demos.

Answers every request with `{path, host, method, proto, headers, httpPort, namespace, ingress,
service, pod}` (plus `tls` when serving HTTPS), `Content-Type: application/json` exactly, so a
test sees which backend answered and what it received. `X-Echo-Set-Header: Name:value,N2:v2`
adds those response headers; `?delay=1s` sleeps before answering (echo-basic does both), and so does
every request under a path given with `--delay PATH=DURATION` (a backend slow on one path, for demos).
For policy tests: `/status/NNN` or `?status=NNN` answers with that status; `?fail=N&id=X[&code=C]`
answers the first N requests carrying request id X with status C (503 by default) and the later
ones normally, and `.attempts[X]` counts every request with that id (a retry test's exact
count); `.accepted` counts TCP connections accepted (keep-alive tests: fewer than requests).
Usable in-process (`EchoServer(...).start()`) or as a command.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import ssl
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gwpolicy.kube.args import HelpFormatter, Parser, program_name

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_DELAY = 30.0


def canonical(name: str) -> str:
    """Go's textproto.CanonicalMIMEHeaderKey: `x-echo-foo` -> `X-Echo-Foo`."""
    return "-".join(p[:1].upper() + p[1:].lower() for p in name.split("-"))


def go_duration(text: str) -> float | None:
    """A Go duration ("500ms", "1s", "1m30s") in seconds; None when it is not one."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests send hundreds of requests
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        echo = self.server.echo
        query = parse_qs(urlsplit(self.path).query)
        delay = go_duration(query.get("delay", [""])[0]) if "delay" in query else echo.delay_for(urlsplit(self.path).path)
        if delay:
            time.sleep(min(delay, MAX_DELAY))
        status = echo.status_for(urlsplit(self.path).path, query)
        headers: dict[str, list[str]] = {}
        for name, value in self.headers.items():
            headers.setdefault(canonical(name), []).append(value)
        body: dict[str, Any] = {
            "path": self.path, "host": self.headers.get("Host", ""), "method": self.command,
            "proto": self.request_version, "headers": headers, "httpPort": str(echo.port),
            "namespace": echo.namespace, "ingress": "", "service": "", "pod": echo.pod,
        }
        if isinstance(self.connection, ssl.SSLSocket):
            body["tls"] = {"version": self.connection.version() or "", "serverName": getattr(self.connection, "gw_sni", "") or "",
                           "negotiatedProtocol": self.connection.selected_alpn_protocol() or "",
                           "cipherSuite": (self.connection.cipher() or ("",))[0], "peerCertificates": []}
        echo.count(self, body)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        extra: dict[str, list[str]] = {}
        for pair in (self.headers.get("X-Echo-Set-Header") or "").split(","):
            if ":" in pair:
                n, v = pair.split(":", 1)
                extra.setdefault(n.strip(), []).append(v.strip())
        for n, vs in extra.items():
            self.send_header(n, ",".join(vs))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    echo: "EchoServer"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (NGINX's timeout in a policy test) is not an error worth a traceback."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.echo._lock:
            self.echo.accepted += 1
        super().process_request(request, client_address)


class _Server6(_Server):
    """The same server on an IPv6 address."""

    address_family = socket.AF_INET6


class EchoServer:
    """One echo backend on `address:port` (port 0: any free port; see `.port` after start())."""

    def __init__(self, pod: str, namespace: str, *, address: str = "127.0.0.1", port: int = 0,
                 cert: str | None = None, key: str | None = None, delays: dict[str, float] | None = None) -> None:
        self.pod, self.namespace, self.address = pod, namespace, address
        self.cert, self.key = cert, key
        self.delays = dict(delays or {})  # path prefix -> seconds every request under it waits
        self.requests = 0
        self.connections: set[tuple[str, int]] = set()
        self.accepted = 0  # TCP connections accepted
        self.attempts: dict[str, int] = {}  # request id (?id=) -> requests seen with it
        #: the echo bodies of the last requests, oldest first: what a mirror backend received (the
        #: upstream suite reads echo-basic's log for that)
        self.seen: deque[dict[str, Any]] = deque(maxlen=1000)
        self._lock = threading.Lock()
        self._httpd = (_Server6 if ":" in address else _Server)((address, port), _Handler)
        self._httpd.echo = self
        self.port = self._httpd.server_address[1]
        if cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)

            def remember_sni(sock: ssl.SSLSocket | ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
                sock.gw_sni = name or ""  # type: ignore[union-attr]  # our mark, read back by getattr

            ctx.sni_callback = remember_sni
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        self._thread: threading.Thread | None = None

    def delay_for(self, path: str) -> float | None:
        """Seconds a request for `path` waits (`--delay`): the longest prefix's, by path segments."""
        best = max((p for p in self.delays if path == p or path.startswith(p.rstrip("/") + "/")), key=len, default=None)
        return self.delays[best] if best is not None else None

    def status_for(self, path: str, query: dict[str, list[str]]) -> int:
        """The status to answer: /status/NNN, ?status=NNN, or ?fail=N&id=X[&code=C] (see above)."""
        m = re.fullmatch(r"/status/([1-5][0-9][0-9])", path)
        if m:
            return int(m.group(1))
        first = {k: v[0] for k, v in query.items() if v}
        status = int(first["status"]) if re.fullmatch(r"[1-5][0-9][0-9]", first.get("status", "")) else 200
        rid = first.get("id")
        if rid is not None:
            with self._lock:
                seen = self.attempts[rid] = self.attempts.get(rid, 0) + 1
            fail = first.get("fail", "")
            if fail.isdigit() and seen <= int(fail):
                code = first.get("code", "")
                return int(code) if re.fullmatch(r"[1-5][0-9][0-9]", code) else 503
        return status

    def count(self, handler: BaseHTTPRequestHandler, body: dict[str, Any] | None = None) -> None:
        with self._lock:
            self.requests += 1
            self.connections.add(handler.client_address[:2])
            if body is not None:
                self.seen.append(body)

    def start(self) -> "EchoServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"echo-{self.pod}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "EchoServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, required=True, help="port to listen on")
    p.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--pod", required=True, help="pod name to report, e.g. infra-backend-v1-abc-xyz")
    p.add_argument("--namespace", required=True, help="namespace to report")
    p.add_argument("--cert", help="PEM certificate: serve HTTPS and report the SNI in tls.serverName")
    p.add_argument("--key", help="PEM private key for --cert")
    p.add_argument("--delay", action="append", default=[], metavar="PATH=DURATION",
                   help="answer every request under PATH after DURATION (a Go duration: 500ms, 2s), as ?delay= does")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C."""
    if bool(args.cert) != bool(args.key):
        raise SystemExit("gwpolicy echo: --cert and --key go together")
    delays = {}
    for d in args.delay:
        path, _, text = d.partition("=")
        seconds = go_duration(text)
        if not path.startswith("/") or seconds is None or seconds > MAX_DELAY:
            raise SystemExit(f"gwpolicy echo: --delay {d!r}: expected PATH=DURATION, a path from / and a duration "
                             f"of at most {MAX_DELAY:.0f}s (500ms, 2s)")
        delays[path] = seconds
    try:
        server = EchoServer(args.pod, args.namespace, address=args.address, port=args.port, cert=args.cert, key=args.key,
                            delays=delays)
    except OSError as e:
        raise SystemExit(f"gwpolicy echo: cannot listen on {args.address}:{args.port}: {e.strerror or e}")
    except ssl.SSLError as e:
        raise SystemExit(f"gwpolicy echo: cannot use --cert {args.cert} / --key {args.key}: {e}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    print(f"echo {args.namespace}/{args.pod} on {'https' if args.cert else 'http'}://{args.address}:{server.port}", flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=f"{program_name()} echo", formatter_class=HelpFormatter, description=__doc__.splitlines()[0],
               epilog="""examples:
  gwpolicy echo --port 3000 --pod infra-backend-v1-abc-xyz --namespace gateway-conformance-infra
  gwpolicy echo --port 3001 --pod reports-1 --namespace demo --delay /reports/monthly=2s   # slow on one path
  curl -H 'X-Echo-Set-Header: X-Seen:yes' http://127.0.0.1:3000/some/path   # echo-basic's JSON back
""")
    add_arguments(p)
    return run(p.parse_args(argv))
