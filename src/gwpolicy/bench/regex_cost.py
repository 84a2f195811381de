"""`gwpolicy bench regex`: what a hostile request costs another tenant when a route has a
RegularExpression match (docs/gateway.md "Regular expression paths").

One Gateway (127.0.75.1) with tenant-a's HTTPRoute holding the expressions (each a path regex
under `/r<i>/`) and tenant-b's HTTPRoute for `b.example`, both to an echo backend (127.0.75.2),
rendered and served by NGINX as the gateway does (`pcre_jit on`, `--workers` worker processes).
Per expression: the time of one hostile request (a path built to almost match it), and tenant-b's
latency while `--clients` clients send that hostile request in a loop. `--refused` also measures
expressions the dialect refuses (the data plane would never serve them: here its check is
switched off, to show what it prevents).
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import tempfile
import threading
import time
from typing import Any

from gwpolicy.kube.args import HelpFormatter, Parser, program_name

ADDR, BACKEND = "127.0.75.1", "127.0.75.2"
GW = "gateway.networking.k8s.io"

#: (expression, the path that almost matches it: `{piece}` repeated to the hostile length): the
#: accepted worst cases (one repetition that many characters continue, a repeated group, two
#: repetitions split by a character one of them cannot take), and what the dialect refuses
ACCEPTED = [("/r6/[a-z]+", "/r6/{a}"),  # a request that costs NGINX nothing: the load of the clients alone
            ("/r0/.*x[0-9]+!", "/r0/{x1}?"), ("/r1/(/[a-z]+)+x", "/r1/{/a}!"), ("/r2/[a-z]+-[a-z]+!", "/r2/{a-}!")]
REFUSED = [("/r3/(a|aa)+[bc]", "/r3/{a}d"), ("/r4/.*x.*x", "/r4/{x}!"), ("/r5/\\d+\\d+\\d+\\d+x", "/r5/{1}x!")]


def _hostile(template: str, n: int) -> str:
    """The template with its `{piece}` repeated to `n` characters."""
    start, end = template.index("{"), template.index("}")
    piece = template[start + 1:end]
    return template[:start] + piece * (n // len(piece)) + template[end + 1:]


def _get(path: str, host: str, port: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(ADDR, port, timeout=60)
    try:
        conn.request("GET", path, headers={"Host": host})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - t0
    finally:
        conn.close()


def _objects(port: int, expressions: list[str]) -> list[dict[str, Any]]:
    meta = lambda name, ns: {"name": name, "namespace": ns, "creationTimestamp": "2024-01-01T00:00:00Z"}  # noqa: E731
    out: list[dict[str, Any]] = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": {"name": "gwpolicy"},
         "spec": {"controllerName": "gwpolicy.io/gateway-controller"}},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta("gw", "infra"),
         "spec": {"gatewayClassName": "gwpolicy", "listeners": [{"name": "http", "port": port, "protocol": "HTTP",
                                                                 "allowedRoutes": {"namespaces": {"from": "All"}}}]}}]
    return out + [
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("a", "tenant-a"),
         "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}], "hostnames": ["a.example"],
                  "rules": [{"matches": [{"path": {"type": "RegularExpression", "value": e}}],
                             "backendRefs": [{"name": "web", "port": 8080}]} for e in expressions]}},
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("b", "tenant-b"),
         "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}], "hostnames": ["b.example"],
                  "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}}]


def _web(ns: str, echo_port: int) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
             "spec": {"ports": [{"name": "http", "port": 8080}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "web-1", "namespace": ns, "labels": {"kubernetes.io/service-name": "web"}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": echo_port}],
             "endpoints": [{"addresses": [BACKEND], "conditions": {"ready": True}}]}]


def _latency(port: int, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        status, took = _get("/", "b.example", port)
        if status == 200:
            out.append(took)
    return out


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def measure(args: argparse.Namespace) -> list[str]:
    import socket

    from gwpolicy.engine.analysis import analyse
    from gwpolicy.engine.refs import Ref
    from gwpolicy.gateway import pathregex, policyconf
    from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
    from gwpolicy.gateway.echo import EchoServer
    from gwpolicy.gateway.nginx import Nginx
    from gwpolicy.gateway.render import render

    cases = ACCEPTED + (REFUSED if args.refused else [])
    if args.refused:  # show what the dialect prevents: its repetition check off, for this process only
        pathregex.repetition_problem = lambda value: None
        pathregex.path_problem.cache_clear()
    with socket.socket() as s:
        s.bind((ADDR, 0))
        port = s.getsockname()[1]
    echo = EchoServer("web", "tenant-b", address=BACKEND).start()
    nginx = Nginx(tempfile.mkdtemp(prefix="gwpolicy-bench-regex-"), verify_timeout=30)
    rows = [f"NGINX worker_processes {args.workers}, pcre_jit on; {args.clients} hostile clients for {args.seconds:g} s "
            "per expression and length", "",
            "| expression | accepted | hostile path length | one hostile request, ms (median of 5) | tenant-b p50 / p99 / max, ms |",
            "|---|---|---:|---:|---:|"]
    try:
        objs = _objects(port, [e for e, _ in cases]) + _web("tenant-a", echo.port) + _web("tenant-b", echo.port)
        config = DataPlaneConfig(addresses={Ref(GW, "Gateway", "infra", "gw"): ADDR},  # the echo backend is on loopback
                                 allow_unmanaged_endpointslices=True, allow_loopback_endpoints=True,
                                 worker_processes=args.workers if args.workers == "auto" else int(args.workers))
        result = nginx.apply(render(build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), config)))
        if not result.ok:
            raise SystemExit(f"gwpolicy bench regex: NGINX did not load the configuration: {result.error}")
        quiet = _latency(port, min(args.seconds, 3))
        rows.append(f"| (none: tenant-b alone) | | | | {_pct(quiet, .5):.2f} / {_pct(quiet, .99):.2f} / {max(quiet) * 1000:.2f} |")
        for expression, template, length in ((e, t, n) for e, t in cases for n in args.length):
            path = _hostile(template, length)
            one = statistics.median(_get(path, "a.example", port)[1] for _ in range(5)) * 1000
            stop = threading.Event()

            def hammer() -> None:
                while not stop.is_set():
                    _get(path, "a.example", port)

            threads = [threading.Thread(target=hammer, daemon=True) for _ in range(args.clients)]
            for t in threads:
                t.start()
            try:
                got = _latency(port, args.seconds)
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=120)
            accepted = "yes" if (expression, template) in ACCEPTED else "no (refused)"
            rows.append(f"| `{expression}` | {accepted} | {length} | {one:.1f} | {_pct(got, .5):.1f} / {_pct(got, .99):.1f} / "
                        f"{max(got) * 1000:.1f} |")
    finally:
        nginx.stop()
        echo.stop()
    return rows


def main(argv: list[str]) -> int:
    p = Parser(prog=f"{program_name()} bench regex", formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("--clients", type=int, default=8, help="hostile clients at once (default 8)")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds of hostile load per expression (default 5)")
    p.add_argument("--length", type=lambda t: [int(x) for x in t.split(",")], default=[30, 8000],
                   help="characters of the hostile part of the path, comma-separated (default 30,8000)")
    p.add_argument("--workers", default="auto", help="NGINX worker_processes (default auto)")
    p.add_argument("--refused", action="store_true", help="also measure expressions the dialect refuses")
    args = p.parse_args(argv)
    print("\n".join(measure(args)))
    return 0
