"""`gwpolicy bench tracing`: what ObservabilityPolicy tracing at 100% sampling costs NGINX, and what
the gateway's span relay spends exporting at a steady rate (docs/performance.md).

Loopback only (127.0.95.1, free ports). Processes besides wrk: the NGINX under test (one worker),
the static backend NGINX of `bench dataplane`, the span relay (gateway/spanrelay.py) in a process
of its own so that its CPU is its own, exporting over OTLP/gRPC to a receiver in this process that
decodes each request with the opentelemetry-proto messages and counts the spans.

The NGINX under test has two locations proxying to the backend: an untraced one, and one traced
with the directives gateway/tracing.py renders for ratio 100, context propagate. Figures:

- saturation: wrk (1 thread, 16 connections) on each location, alternating, `--rounds` times:
  requests/s and NGINX's worker CPU per request;
- paced: wrk at `--rate` requests/s (10 connections sending on one schedule, a request every
  1/rate seconds, from a Lua `delay()` on the wall clock) on the traced location for `--paced-seconds`: the relay's CPU over the run
  (until every span is exported), per span and as a share of one core; spans received.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gwpolicy.bench import procfs
from gwpolicy.bench.dataplane import BACKEND_ADDRESS, Nginx, free_port, start_backend

ADDRESS = BACKEND_ADDRESS
ROUTE_KEY = "00000000000000b1"  # the traced location's key in NGINX's log line (hex, as render writes)
PACED_CONNS = 10

#: wrk's pacing: one schedule over all connections of its thread, a request every 1/rate s
PACE_LUA = """local ffi = require("ffi")
ffi.cdef[[ typedef struct {{ long tv_sec; long tv_usec; }} gw_timeval; int gettimeofday(gw_timeval *tv, void *tz); ]]
local tv = ffi.new("gw_timeval")
local function now_ms() ffi.C.gettimeofday(tv, nil); return tonumber(tv.tv_sec) * 1000 + tonumber(tv.tv_usec) / 1000 end
local interval, next_at = {interval_ms}, nil
function delay()
  local now = now_ms()
  if next_at == nil or next_at < now - 100 then next_at = now end
  next_at = next_at + interval
  return math.max(0, math.floor(next_at - now))
end
"""

FRONT_CONF = """worker_processes 1;
pid ../run/nginx.pid;
error_log ../logs/error.log notice;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path ../run/cb; proxy_temp_path ../run/p; fastcgi_temp_path ../run/f;
    uwsgi_temp_path ../run/u; scgi_temp_path ../run/s;
    keepalive_requests 1000000;
{http_lines}
    upstream be {{ server {backend}; keepalive 16; }}
    server {{
        listen {address}:{port};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location /plain {{ proxy_pass http://be; }}
        location /traced {{
{traced}
            proxy_pass http://be;
        }}
    }}
}}
"""


def front_conf(address: str, port: int, backend: str, relay: str) -> str:
    """nginx.conf of the NGINX under test, the traced location written by gateway/tracing.py."""
    from gwpolicy.gateway.tracing import HTTP_LINES, Tracing, location_lines

    lines, headers = location_lines(ROUTE_KEY, Tracing(strategy="ratio", ratio=100, context="propagate"), relay)
    traced = [*lines, 'proxy_set_header Connection "";', *headers]
    return FRONT_CONF.format(http_lines="\n".join("    " + l for l in HTTP_LINES), backend=backend, address=address,
                             port=port, traced="\n".join("            " + l for l in traced))


# -- the relay's process -----------------------------------------------------------------------------

def relay_child(endpoint: str, interval_s: float) -> int:
    """`python -m gwpolicy.bench.tracing --relay ENDPOINT INTERVAL`: print the UDP port, relay until
    stdin closes, flush, print the counts as JSON."""
    from gwpolicy.gateway.nginxproxy import Exporter
    from gwpolicy.gateway.spanrelay import SpanRelay
    from gwpolicy.gateway.tracing import RouteTrace

    exp = Exporter(endpoint=endpoint, interval_s=interval_s, batch_size=512, batch_count=4,
                   service_name="gwpolicy-bench", attributes=())
    relay = SpanRelay(address=ADDRESS).start()
    relay.update({ROUTE_KEY: RouteTrace(route="HTTPRoute/default/traced", http_route="/traced", exporter=exp)})
    print(relay.port, flush=True)
    sys.stdin.read()
    relay.stop()
    c = relay.counts
    print(json.dumps({"received": c.received, "exported": c.exported, "socket_overflow": c.socket_overflow,
                      "queue_full": c.queue_full, "export_failed": c.export_failed, "malformed": c.malformed}),
          flush=True)
    return 0


class Receiver:
    """An OTLP/gRPC trace receiver on loopback that counts the spans it is sent."""

    def __init__(self, address: str) -> None:
        from concurrent import futures

        import grpc  # type: ignore[import-untyped]  # grpcio ships no type information
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        outer = self
        self.spans = 0
        self._lock = threading.Lock()

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
                n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                with outer._lock:
                    outer.spans += n
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        port = self.server.add_insecure_port(f"{address}:0")
        self.endpoint = f"{address}:{port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(1)


# -- load ----------------------------------------------------------------------------------------------

def _wrk(url: str, seconds: float, conns: int, *extra: str) -> tuple[int, float]:
    """(requests, requests/s) of one wrk run."""
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--timeout", "5s", *extra, url],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    n, rps = re.search(r"(\d+) requests in", out), re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not n or not rps:
        raise RuntimeError(f"no result from wrk: {out[-300:]}")
    return int(n.group(1)), float(rps.group(1))


def _settled(rx: Receiver, quiet: float = 2.0, limit: float = 30.0) -> int:
    """The receiver's span count once it has not changed for `quiet` seconds."""
    last, since, end = rx.spans, time.monotonic(), time.monotonic() + limit
    while time.monotonic() < end and time.monotonic() - since < quiet:
        time.sleep(0.1)
        if rx.spans != last:
            last, since = rx.spans, time.monotonic()
    return last


def measure(rounds: int, seconds: float, rate: int, paced_seconds: float, workdir: Path,
            log: Any = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    rx = Receiver(ADDRESS)
    relay = subprocess.Popen([sys.executable, "-m", "gwpolicy.bench.tracing", "--relay", rx.endpoint, "1"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    backend = front = None
    try:
        assert relay.stdout is not None and relay.stdin is not None
        relay_port = int(relay.stdout.readline())
        backend, _status = start_backend(workdir / "backend")
        port = free_port(ADDRESS)
        conf = front_conf(ADDRESS, port, f"{ADDRESS}:{backend.port}", f"{ADDRESS}:{relay_port}")
        front = Nginx("front", workdir / "front", ADDRESS, port).start({"nginx.conf": conf.encode()})
        sat: dict[str, list[dict[str, float]]] = {"plain": [], "traced": []}
        for i in range(rounds):
            for path in (("plain", "traced") if i % 2 == 0 else ("traced", "plain")):
                log(f"round {i + 1}/{rounds}: /{path}, {seconds:g} s")
                c0 = front.cpu()
                n, rps = _wrk(f"http://{ADDRESS}:{port}/{path}", seconds, 16)
                sat[path].append({"rps": rps, "cpu_us": (front.cpu() - c0) * 1e6 / max(1, n)})
        spans0 = _settled(rx)  # the saturation rounds' spans have left the relay
        lua = workdir / "pace.lua"
        lua.write_text(PACE_LUA.format(interval_ms=1000 / rate))
        log(f"paced: about {rate} requests/s for {paced_seconds:g} s")
        r0 = procfs.cpu_seconds(relay.pid) or 0.0
        t0 = time.monotonic()
        n, paced_rps = _wrk(f"http://{ADDRESS}:{port}/traced", paced_seconds, PACED_CONNS, "-s", str(lua))
        end = time.monotonic() + 15
        while rx.spans - spans0 < n and time.monotonic() < end:  # the last batches' export
            time.sleep(0.1)
        took = time.monotonic() - t0
        relay_cpu = (procfs.cpu_seconds(relay.pid) or 0.0) - r0
        paced_spans = rx.spans - spans0
        relay.stdin.close()
        counts = json.loads(relay.stdout.readline() or "{}")
        relay.wait(30)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        for n_ in (front, backend):
            if n_ is not None:
                n_.stop()
        rx.stop()
    return {"saturation": sat, "paced": {"rps": paced_rps, "requests": n, "spans": paced_spans, "seconds": took,
                                         "load_seconds": n / max(paced_rps, 1e-9),
                                         "relay_cpu_s": relay_cpu},
            "relay_counts": counts, "rounds": rounds, "seconds": seconds, "load_average": os.getloadavg()}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def _runs(rows: list[dict[str, float]]) -> str:
    return ", ".join(f"{x['rps']:.0f}" for x in rows)


def report(r: dict[str, Any]) -> str:
    sat, p = r["saturation"], r["paced"]
    plain, traced = (_median([x["rps"] for x in sat[k]]) for k in ("plain", "traced"))
    pcpu, tcpu = (_median([x["cpu_us"] for x in sat[k]]) for k in ("plain", "traced"))
    lines = [f"saturation (wrk 1 thread, 16 connections, {r['rounds']} x {r['seconds']:g} s each, alternating; medians):",
             f"  untraced: {plain:.0f} requests/s, NGINX worker {pcpu:.1f} us CPU/request "
             f"(runs: {_runs(sat['plain'])})",
             f"  traced (ratio 100, propagate): {traced:.0f} requests/s, NGINX worker {tcpu:.1f} us CPU/request "
             f"(runs: {_runs(sat['traced'])})",
             f"  cost of tracing: {100 * (1 - traced / plain):.1f}% requests/s, {tcpu - pcpu:+.1f} us NGINX CPU/request"
             if plain else "  cost of tracing: no untraced figure",
             f"paced ({PACED_CONNS} connections): {p['rps']:.0f} requests/s, {p['requests']} requests, "
             f"{p['spans']} spans received",
             f"  span relay: {p['relay_cpu_s']:.2f} s CPU for {p['load_seconds']:.1f} s of requests "
             f"(until its last span was exported: {p['seconds']:.1f} s) = "
             f"{100 * p['relay_cpu_s'] / max(p['load_seconds'], 1e-9):.1f}% of one core, "
             f"{1e6 * p['relay_cpu_s'] / max(1, p['spans']):.0f} us per span",
             f"relay counts over the whole run: {json.dumps(r['relay_counts'])}",
             "load average at the end: " + " ".join(f"{x:.2f}" for x in r["load_average"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from gwpolicy.bench.generate import at_least
    from gwpolicy.kube.args import HelpFormatter, Parser, program_name

    p = Parser(prog=f"{program_name()} bench tracing", formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("--rounds", type=at_least(1), default=3, help="saturation rounds per location")
    p.add_argument("--seconds", type=float, default=8, help="seconds per saturation run")
    p.add_argument("--rate", type=at_least(1), default=1000, help="paced requests/s")
    p.add_argument("--paced-seconds", type=float, default=20, help="seconds of the paced run")
    p.add_argument("--workdir", help="NGINX's files (default: a new temporary directory)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            print(f"Error: {tool} is not installed (Debian: apt-get install {tool})", file=sys.stderr)
            return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gwpolicy-bench-tracing-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = measure(args.rounds, args.seconds, args.rate, args.paced_seconds, workdir)
    except RuntimeError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(report(result), end="")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--relay"]:
        sys.exit(relay_child(sys.argv[2], float(sys.argv[3])))
    sys.exit(main())
