"""Measure the tracing prototype (tests/span_relay.py): what 100% sampling costs NGINX, and what the
span relay spends exporting at a steady 1,000 requests/s.

    .venv/bin/python tests/bench_proto_tracing.py [--rounds 3] [--seconds 8]

Needs wrk (Debian package). Loopback only (127.0.95.0/24). Three processes besides wrk: the NGINX
under test (one worker), a backend NGINX answering 200 (one worker), the span relay (its own
process, exporting over OTLP/gRPC to a receiver in this process). Figures: requests/s and NGINX
worker CPU per request, untraced vs traced (ratio 100, context propagate), alternating; then wrk
paced to ~1,000 requests/s (10 connections, a 10 ms pause each) and the relay's CPU over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from otlp_receiver import OtlpReceiver  # noqa: E402
from raw_nginx import RawNginx, cpu_seconds  # noqa: E402
from span_relay import TAG, location_conf, trace_nginx_conf  # noqa: E402

ADDR = "127.0.95.1"


def _port() -> int:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return int(s.getsockname()[1])


def _wrk(url: str, seconds: int, *extra: str) -> tuple[int, float]:
    out = subprocess.run(["wrk", "-t1", "-c16", f"-d{seconds}s", *extra, url], capture_output=True, text=True).stdout
    return int(re.search(r"(\d+) requests in", out).group(1)), float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--pause-relay", action="store_true",
                    help="SIGSTOP the relay during the saturation rounds: NGINX's own cost, without the relay's CPU")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gwp-bench-tracing-"))
    rx = OtlpReceiver(ADDR).start()
    routes = tmp / "routes.json"
    routes.write_text(json.dumps({"1": {"route": "HTTPRoute/default/traced", "http_route": "/traced"}}))
    relay = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent / "span_relay.py"), str(routes), rx.endpoint, "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    relay_port = int(relay.stdout.readline())
    syslog = f"syslog:server=127.0.0.1:{relay_port},nohostname,tag={TAG}"
    be_port, port = _port(), _port()
    backend = RawNginx(tmp / "backend", http=f"server {{ listen {ADDR}:{be_port}; location / {{ return 200 ok; }} }}")
    traced = "\n  ".join(location_conf("1", strategy="ratio", ratio=100, context="propagate", syslog=syslog)
                          + ['proxy_set_header Connection "";'])
    front = RawNginx(tmp / "front", http=trace_nginx_conf() + f"""
upstream be {{ server {ADDR}:{be_port}; keepalive 16; }}
server {{
  listen {ADDR}:{port};
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  location /plain {{ proxy_pass http://be; }}
  location /traced {{
  {traced}
  proxy_pass http://be; }}
}}""")
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "traced": []}
    try:
        backend.start()
        front.start()
        if args.pause_relay:
            os.kill(relay.pid, signal.SIGSTOP)
        for _ in range(args.rounds):
            for path in ("plain", "traced"):
                pids = front.pids()[1:]
                c0 = cpu_seconds(pids)
                n, rps = _wrk(f"http://{ADDR}:{port}/{path}", args.seconds)
                results[path].append((rps, (cpu_seconds(pids) - c0) / n * 1e6))
        if args.pause_relay:
            os.kill(relay.pid, signal.SIGCONT)
        time.sleep(2)
        spans_before = len(rx.spans)
        script = tmp / "pace.lua"
        script.write_text("function delay() return 10 end\n")
        r0 = cpu_seconds([relay.pid])
        t0 = time.monotonic()
        out = subprocess.run(["wrk", "-t1", "-c10", "-d20s", "-s", str(script), f"http://{ADDR}:{port}/traced"],
                             capture_output=True, text=True).stdout
        time.sleep(2)  # the last interval's export
        took = time.monotonic() - t0
        relay_cpu = cpu_seconds([relay.pid]) - r0
        paced_rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
        paced_n = int(re.search(r"(\d+) requests in", out).group(1))
        for path, rows in results.items():
            print(f"{path:7s} rps {[int(r) for r, _ in rows]}  NGINX worker us/request {[round(c, 1) for _, c in rows]}")
        print(f"paced: {paced_rps:.0f} requests/s, {paced_n} requests, {len(rx.spans) - spans_before} spans received; "
              f"relay CPU {relay_cpu:.2f} s over {took:.1f} s = {100 * relay_cpu / took:.1f}% of one core, "
              f"{1e6 * relay_cpu / max(1, paced_n):.0f} us per span")
    finally:
        relay.terminate()
        counts = relay.communicate(timeout=30)[0].strip()
        print("relay counts:", counts)
        front.stop()
        backend.stop()
        rx.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
