"""`gwpolicy bench replicas`: requests per second through one gateway replica and through three, and
the time from an edit to every replica serving it, on this machine.

Real processes: a `gwpolicy sandbox`, N `gwpolicy gateway` replicas with leader election (each with
its own NGINX, on one loopback Gateway address 127.0.47.1 at listener port 80 + its own
--port-offset, since replicas on one machine cannot share a port), a backend NGINX on 127.0.48.1
that answers 200 (so the backend is never what limits the rate), `--routes` HTTPRoutes `/r<i>`.
Load: `wrk` (Debian package wrk), one per replica at once, for `--seconds`; the figure is their
sum. The edit: one more HTTPRoute applied with kubectl; the time until every replica answers it
with 200 (polled every 10 ms). Loopback only; everything it starts stops when it ends.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gwpolicy.kube.args import HelpFormatter, Parser, program_name

NS = "bench-replicas"
GATEWAY_ADDRESS = "127.0.47.1"
BACKEND_ADDRESS = "127.0.48.1"
CONTROLLER = "gwpolicy.io/bench-replicas"


def _objects(routes: int, backend_port: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "bench-replicas"},
         "spec": {"controllerName": CONTROLLER}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": NS},
         "spec": {"gatewayClassName": "bench-replicas", "addresses": [{"type": "IPAddress", "value": GATEWAY_ADDRESS}],
                  "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "backend", "namespace": NS},
         "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": backend_port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "backend-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "backend"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": backend_port, "protocol": "TCP"}],
         "endpoints": [{"addresses": [BACKEND_ADDRESS], "conditions": {"ready": True}}]},
    ]
    return out + [_route(f"r{i}", f"/r{i}") for i in range(routes)]


def _route(name: str, path: str) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": NS},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],
                                "backendRefs": [{"name": "backend", "port": 8080}]}]}}


def _status(port: int, path: str) -> int | None:
    conn = http.client.HTTPConnection(GATEWAY_ADDRESS, port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def _wait(pred: Any, timeout: float, what: str, step: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(step)
    raise RuntimeError(f"{what} not reached within {timeout:.0f} s")


def _free_port(address: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class _Run:
    def __init__(self, work: Path, nginx: str) -> None:
        self.work, self.nginx = work, nginx
        self.procs: list[subprocess.Popen[Any]] = []
        self.gateways: list[tuple[subprocess.Popen[Any], Path]] = []
        self.kubeconfig = work / "kubeconfig"

    def sandbox(self) -> None:
        p = subprocess.Popen([sys.executable, "-m", "gwpolicy.cli.main", "sandbox", "--port", "0", "--kubeconfig-out",
                              str(self.kubeconfig), "--allow-loopback-endpoints"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()
        if "127.0.0.1" not in line:
            raise RuntimeError(f"the sandbox did not start: {line.strip()}")

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        out = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args], input=stdin, capture_output=True,
                             text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def apply(self, objs: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", stdin="\n".join(json.dumps(o) for o in objs))

    def backend(self) -> int:
        port = _free_port(BACKEND_ADDRESS)
        d = self.work / "backend"
        (d / "logs").mkdir(parents=True)
        (d / "nginx.conf").write_text(
            "worker_processes 1;\npid backend.pid;\nerror_log logs/error.log;\nevents { worker_connections 4096; }\n"
            f"http {{ access_log off; server {{ listen {BACKEND_ADDRESS}:{port} reuseport; keepalive_requests 100000; "
            "location / { return 200 \"ok\\n\"; } } }\n")
        self.procs.append(subprocess.Popen([self.nginx, "-p", f"{d}/", "-c", str(d / "nginx.conf"), "-g", "daemon off;"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return port

    def gateway(self, i: int) -> None:
        state = self.work / f"replica-{i}"
        p = subprocess.Popen([sys.executable, "-m", "gwpolicy.cli.main", "gateway", "--kubeconfig", str(self.kubeconfig),
                              "--listen", "127.0.0.1:0", "--lease-namespace", NS, "--lease-duration", "5",
                              "--identity", f"replica-{i}", "--state-dir", str(state), "--controller-name", CONTROLLER,
                              "--port-offset", str(self.offset(i)), "--allow-loopback-endpoints",
                              "--allow-unmanaged-endpointslices", "--worker-processes", "1"],
                             stdout=subprocess.DEVNULL, stderr=open(self.work / f"replica-{i}.log", "w"))
        self.gateways.append((p, state))

    @staticmethod
    def offset(i: int) -> int:
        return 20000 + 1000 * i

    def close(self) -> None:
        for p, _ in self.gateways:
            p.send_signal(signal.SIGTERM)  # a clean stop: its NGINX stops too
        for p, _ in self.gateways:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _wrk(ports: list[int], seconds: float, connections: int) -> float:
    procs = [subprocess.Popen(["wrk", "-t1", f"-c{connections}", f"-d{seconds:.0f}s",
                               f"http://{GATEWAY_ADDRESS}:{port}/r0"], stdout=subprocess.PIPE, text=True)
             for port in ports]
    total = 0.0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        m = re.search(r"Requests/sec:\s+([\d.]+)", out)
        if m is None or "Non-2xx" in out:
            raise RuntimeError(f"wrk: {out.strip()}")
        total += float(m.group(1))
    return total


def main(argv: list[str]) -> int:
    p = Parser(prog=f"{program_name()} bench replicas", formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("--replicas", type=int, default=3, help="replicas for the second measure (default 3)")
    p.add_argument("--routes", type=int, default=1000, help="HTTPRoutes (default 1000)")
    p.add_argument("--seconds", type=float, default=10, help="seconds of load per measure (default 10)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections per replica (default 32)")
    p.add_argument("--nginx", default="/usr/sbin/nginx", help="the NGINX binary")
    a = p.parse_args(argv)
    for tool in ("wrk", "kubectl"):
        if shutil.which(tool) is None:
            print(f"Error: {tool} is not installed (Debian package {tool if tool == 'wrk' else 'kubectl'})",
                  file=sys.stderr)
            return 1
    work = Path(tempfile.mkdtemp(prefix="gwpolicy-bench-replicas-"))
    run = _Run(work, a.nginx)
    try:
        run.sandbox()
        crds = Path(__file__).resolve().parents[3] / "deploy" / "gateway-api" / "standard"
        run.kubectl("apply", "--server-side", *sum((["-f", str(crds / f"gateway.networking.k8s.io_{n}.yaml")]
                                                    for n in ("gatewayclasses", "gateways", "httproutes")), []))
        run.apply(_objects(a.routes, run.backend()))
        for i in range(a.replicas):
            run.gateway(i)
        ports = [80 + run.offset(i) for i in range(a.replicas)]
        for port in ports:
            _wait(lambda: _status(port, f"/r{a.routes - 1}") == 200, 120, f"the replica on port {port} serving")
        one = _wrk(ports[:1], a.seconds, a.connections)
        many = _wrk(ports, a.seconds, a.connections)
        t0 = time.monotonic()
        run.apply([_route("edited", "/edited")])
        for port in ports:
            _wait(lambda: _status(port, "/edited") == 200, 60, f"the edit through port {port}", step=0.01)
        edit = time.monotonic() - t0
    except RuntimeError as exc:
        print(f"Error: {exc} (the replicas' logs were in {work})", file=sys.stderr)
        return 1
    finally:
        run.close()
        shutil.rmtree(work, ignore_errors=True)
    cores = os.cpu_count()
    print(f"routes {a.routes}, {cores} cores, wrk -t1 -c{a.connections} -d{a.seconds:.0f}s per replica, NGINX "
          "worker_processes 1 per replica")
    print(f"requests per second through 1 replica:  {one:10.0f}")
    print(f"requests per second through {a.replicas} replicas: {many:10.0f}  ({many / one:.2f}x)")
    print(f"edit to all {a.replicas} replicas serving it:   {edit * 1000:10.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
