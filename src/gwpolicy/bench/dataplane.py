"""`gwpolicy bench dataplane`: what a request costs NGINX in gwpolicy's configuration, against a
minimal hand-written configuration for the same routes.

The cluster: one Gateway with an HTTP listener on a pinned loopback address, N HTTPRoutes with
hostnames h-00000.example ... (PathPrefix /, each to its own Service), every EndpointSlice pointing
at one static backend (an NGINX answering 200). gwpolicy's configuration is rendered by the code
`gwpolicy render` runs (analyse with the data plane's kind checks, build_dataplane, render); the
hand-written one is what a person would write for the same routes: one `server` per hostname, an
`upstream` per Service, `location / { proxy_pass http://<upstream>; }`, and each policy's
directives written once in that location.

Measured per configuration and route (the route whose upstream comes first, in the middle and last
in gwpolicy's upstreams.conf, the order NGINX keeps them in):
- wrk (1 thread, 16 connections): requests per second, p50/p99 latency, NGINX's worker CPU per
  request (/proc) and backend connections per request (the backend's stub_status), rounds
  alternating the configurations' order so that each sees the same machine;
- hey at a fixed rate that saturates nothing (latency p50/p99 when the proxy is not the limit);
- the first request after a reload (SIGHUP, new connection) and the requests after it;
- callgrind, where valgrind is installed: NGINX as one process (`master_process off`) under
  callgrind, counting nothing until asked; per route, Ir over N1 then over N2 requests on one
  keep-alive connection, (Ir(N2) - Ir(N1)) / (N2 - N1) instructions per request (deterministic:
  repeat runs agree to about 0.1%), and the instructions of the route's first request.
Scenarios at one route: each policy kind of the gateway (timeout, retry, client settings, upstream
settings, rate limit), a route with method, header and query matches, and all of them together.
`--transform FILE` adds a third configuration: gwpolicy's files passed through FILE's
`transform(files: dict[str, bytes]) -> dict[str, bytes]`, to measure a configuration shape before
the renderer writes it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gwpolicy.bench import procfs

GW = "gateway.networking.k8s.io"
POLICY = "gwpolicy.io/v1alpha1"
NS = "perf"
#: configurations listen on 127.0.94.<n>, the static backend on 127.0.95.1 (ports picked free at run time)
CONFIG_NET = "127.0.94"
BACKEND_ADDRESS = "127.0.95.1"
PATH = "/api/x"
SIZES = (1, 1000, 5000, 20000)
POSITIONS = ("first", "middle", "last")
SCENARIOS = ("timeout", "retry", "client", "upstream", "ratelimit", "matches", "all")
#: the headers and query a request to the "matches" route carries (its matching rule needs them all)
MATCH_HEADERS = {"x-env": "canary", "x-user": "u123"}
MATCH_QUERY = "?v=1"
KEEPALIVE = 16


def host(i: int) -> str:
    return f"h-{i:05d}.example"


# -- the cluster ------------------------------------------------------------------------------------

def cluster(routes: int, address: str, backend: tuple[str, int], scenario: str = "plain",
            targets: tuple[int, ...] = (0,), keepalive: bool = False) -> list[dict[str, Any]]:
    """The manifests (see the module docstring). `scenario` attaches its policy to (or gives its
    matches to) the routes `targets`; `keepalive`: the targets' Services keep gwpolicy's default pool
    of 16 idle connections per worker (False: an UpstreamSettingsPolicy keepAlive.connections 0
    on them, no pool; the upstream and all scenarios set 16 explicitly)."""
    be_addr, be_port = backend
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": {"name": "perf"},
         "spec": {"controllerName": "gwpolicy.io/gateway-controller"}},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": NS},
         "spec": {"gatewayClassName": "perf", "addresses": [{"type": "IPAddress", "value": address}],
                  "listeners": [{"name": "http", "port": 80, "protocol": "HTTP",
                                 "allowedRoutes": {"namespaces": {"from": "Same"}}}]}},
    ]

    def service(name: str) -> list[dict[str, Any]]:
        return [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
                 "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": be_port}]}},
                {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": f"{name}-1", "namespace": NS,
                              "labels": {"kubernetes.io/service-name": name,
                                         "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                 "addressType": "IPv4", "ports": [{"name": "http", "port": be_port, "protocol": "TCP"}],
                 "endpoints": [{"addresses": [be_addr], "conditions": {"ready": True}}]}]

    matched = scenario in ("matches", "all")
    for i in range(routes):
        name = host(i).split(".")[0]
        rules: list[dict[str, Any]] = [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                                        "backendRefs": [{"name": name, "port": 8080}]}]
        if matched and i in targets:
            rules.insert(0, {"matches": [{"path": {"type": "PathPrefix", "value": "/"}, "method": "GET",
                                          "headers": [{"name": "x-env", "value": "canary"},
                                                      {"type": "RegularExpression", "name": "x-user", "value": "u[0-9]+"}],
                                          "queryParams": [{"name": "v", "value": "1"}]}],
                             "backendRefs": [{"name": f"{name}-m", "port": 8080}]})
            docs += service(f"{name}-m")
        docs.append({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": NS},
                     "spec": {"parentRefs": [{"name": "gw", "sectionName": "http"}], "hostnames": [host(i)], "rules": rules}})
        docs += service(name)
    if scenario != "plain" or not keepalive:
        from gwpolicy.bench.gateway_policies import policy_kinds
        docs += policy_kinds()
    for i in targets:
        name = host(i).split(".")[0]
        services = [name] + ([f"{name}-m"] if matched else [])
        docs += _policies(scenario, name, services, keepalive)
    return docs


def _policy(kind: str, name: str, target_kind: str, target: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": POLICY, "kind": kind, "metadata": {"name": name, "namespace": NS},
            "spec": {"targetRef": {"group": "" if target_kind == "Service" else GW, "kind": target_kind, "name": target},
                     **spec}}


def _policies(scenario: str, route: str, services: list[str], keepalive: bool) -> list[dict[str, Any]]:
    kinds = {
        "timeout": [_policy("TimeoutPolicy", f"{route}-to", "HTTPRoute", route,
                            {"default": {"connectionTimeout": "5s", "readTimeout": "30s", "sendTimeout": "30s"}})],
        "retry": [_policy("RetryPolicy", f"{route}-re", "HTTPRoute", route,
                          {"default": {"attempts": 2, "retryOn": ["connect-failure", "reset"], "codes": [503]}})],
        "client": [_policy("ClientSettingsPolicy", f"{route}-cs", "HTTPRoute", route,
                           {"default": {"body": {"maxSize": "1m"}, "keepAlive": {"requests": 100000}}})],
        "ratelimit": [_policy("RateLimitPolicy", f"{route}-rl", "HTTPRoute", route,
                              {"default": {"requests": 1000000, "unit": "Second", "burst": 100000}})],
    }
    out: list[dict[str, Any]] = []
    if scenario == "all":
        for pols in kinds.values():
            out += pols
    else:
        out += kinds.get(scenario, [])
    if scenario in ("upstream", "all"):
        out += [_policy("UpstreamSettingsPolicy", f"{s}-us", "Service", s, {"keepAlive": {"connections": KEEPALIVE}})
                for s in services]
    elif not keepalive:  # gwpolicy keeps a pool by default: no pool takes a policy
        out += [_policy("UpstreamSettingsPolicy", f"{s}-us", "Service", s, {"keepAlive": {"connections": 0}})
                for s in services]
    return out


def render_gwpolicy(objects: list[dict[str, Any]], port_offset: int, worker_processes: int | str = 1) -> dict[str, bytes]:
    """gwpolicy's files for the objects, by the code `gwpolicy render -f` runs."""
    from gwpolicy.engine.analysis import analyse
    from gwpolicy.gateway import policyconf
    from gwpolicy.gateway.dataplane import DEFAULT_CONTROLLER_NAME, DataPlaneConfig, build_dataplane
    from gwpolicy.gateway.render import render

    analysis = analyse(objects, kind_checks=policyconf.kind_checks(), by_target=True)
    dp = build_dataplane(analysis, DataPlaneConfig(controller_name=DEFAULT_CONTROLLER_NAME, port_offset=port_offset,
                                                   worker_processes=worker_processes,
                                                   # the benchmark's backends are its own, on loopback
                                                   allow_unmanaged_endpointslices=True, allow_loopback_endpoints=True))
    return render(dp)


_UPSTREAM = re.compile(r"^upstream (\S+) \{\n    # Service (\S+)/(\S+) port", re.M)


def upstream_order(files: dict[str, bytes]) -> list[str]:
    """The Services of gwpolicy's upstreams in the order upstreams.conf defines them (NGINX's list
    order: a run-time lookup by name walks it from the start)."""
    return [m.group(3) for m in _UPSTREAM.finditer(files.get("upstreams.conf", b"").decode())]


def positions(files: dict[str, bytes], routes: int) -> dict[str, int]:
    """first/middle/last: the routes whose Service's upstream comes first, in the middle and last."""
    order = [s for s in upstream_order(files) if re.fullmatch(r"h-\d{5}", s)]
    if not order:
        if routes:
            raise RuntimeError("the rendered configuration has none of the benchmark's upstreams: its backends were "
                               "refused (see the data plane's endpoint rules, docs/security.md)")
        return {"first": 0}
    picks = {"first": order[0], "middle": order[len(order) // 2], "last": order[-1]}
    if routes == 1:
        picks = {"first": order[0]}
    return {k: int(v[2:]) for k, v in picks.items()}


# -- the hand-written configuration -----------------------------------------------------------------

_HEAD = """worker_processes {workers};
pid ../run/nginx.pid;
error_log ../logs/error.log notice;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    server_names_hash_max_size 65536; server_names_hash_bucket_size 128;
    client_body_temp_path ../run/cb; proxy_temp_path ../run/p; fastcgi_temp_path ../run/f;
    uwsgi_temp_path ../run/u; scgi_temp_path ../run/s;
"""


def handwritten(routes: int, address: str, port: int, backend: tuple[str, int], scenario: str = "plain",
                targets: tuple[int, ...] = (0,), keepalive: bool = False, workers: int | str = 1) -> dict[str, bytes]:
    """A minimal configuration for the same routes, as a person writes it: a server per hostname,
    an upstream per Service, the scenario's directives once in the target routes' location."""
    be = f"{backend[0]}:{backend[1]}"
    http: list[str] = []
    out = [_HEAD.format(workers=workers)]
    for i in range(routes):
        target = i in targets
        ka = keepalive and target or scenario in ("upstream", "all") and target
        peers = 2 if target and scenario in ("retry", "all") else 1
        loc = ["proxy_set_header Host $host;"]
        if ka:
            loc += ["proxy_http_version 1.1;", 'proxy_set_header Connection "";']
        if target:
            loc += _handwritten_lines(scenario, http)
        names = [f"be{i}"] + ([f"be{i}m"] if target and scenario in ("matches", "all") else [])
        for n in names:
            servers = [f"        server {be}{' max_fails=0' if peers > 1 else ''};"] * peers
            out.append(f"    upstream {n} {{\n" + "\n".join(servers) + (f"\n        keepalive {KEEPALIVE};" if ka else "")
                       + "\n    }\n")
        if len(names) > 1:  # the matching rule's upstream, else the route's own
            http.append(f'map "$request_method\\n$http_x_env\\n$http_x_user\\n$arg_v" $be{i} '
                        f'{{ "~^GET\\ncanary\\n(?:u[0-9]+)\\n1$" be{i}m; default be{i}; }}')
            pass_to = f"http://$be{i}"
        else:
            pass_to = f"http://be{i}"
        body = "".join(f"            {l}\n" for l in loc)
        out.append(f"    server {{\n        listen {address}:{port}{' default_server' if i == 0 else ''};\n"
                   f"        server_name {host(i)};\n        location / {{\n{body}            proxy_pass {pass_to};\n"
                   "        }\n    }\n")
    out[1:1] = [f"    {l}\n" for l in dict.fromkeys(http)]
    out.append("}\n")
    return {"nginx.conf": "".join(out).encode()}


def _handwritten_lines(scenario: str, http: list[str]) -> list[str]:
    lines = {
        "timeout": ["proxy_connect_timeout 5s;", "proxy_read_timeout 30s;", "proxy_send_timeout 30s;"],
        "retry": ["proxy_next_upstream error http_503;", "proxy_next_upstream_tries 2;"],
        "client": ["client_max_body_size 1m;", "keepalive_requests 100000;"],
        "ratelimit": ["limit_req zone=rl burst=100000 nodelay;", "limit_req_status 429;"],
    }
    if scenario in ("ratelimit", "all"):
        http.append("limit_req_zone $binary_remote_addr zone=rl:10m rate=1000000r/s;")
    if scenario == "all":
        return [l for k in ("timeout", "retry", "client", "ratelimit") for l in lines[k]]
    return lines.get(scenario, [])


# -- NGINX processes --------------------------------------------------------------------------------

BACKEND_CONF = """worker_processes 1;
pid ../run/nginx.pid;
error_log ../logs/error.log notice;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path ../run/cb; proxy_temp_path ../run/p; fastcgi_temp_path ../run/f;
    uwsgi_temp_path ../run/u; scgi_temp_path ../run/s;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    server {{
        listen {address}:{port} default_server backlog=4096;
        location / {{ default_type text/plain; return 200 "ok $request_uri $request_method $server_protocol $http_host\\n"; }}
    }}
    server {{
        listen {address}:{status_port};
        location = /status {{ stub_status; }}
    }}
}}
"""


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    """The files under root/current (NGINX's prefix), with root/run and root/logs beside it."""
    cur = root / "current"
    if cur.exists():
        shutil.rmtree(cur)
    for rel, data in files.items():
        (cur / rel).parent.mkdir(parents=True, exist_ok=True)
        (cur / rel).write_bytes(data)
    (root / "run").mkdir(parents=True, exist_ok=True)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    return cur


def wait_listening(address: str, port: int, limit: float, alive: Callable[[], bool] = lambda: True) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not alive():
            raise RuntimeError(f"NGINX for {address}:{port} exited before it listened")
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {address}:{port} after {limit:.0f} s")


@dataclass
class Nginx:
    """One NGINX master we started (`daemon off`), stopped by its own pid."""

    label: str
    root: Path
    address: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    config_bytes: int = 0

    def start(self, files: dict[str, bytes], limit: float = 300) -> "Nginx":
        cur = write_tree(self.root, files)
        self.config_bytes = sum(len(v) for k, v in files.items() if k.endswith(".conf"))
        log = open(self.root / "logs" / "stderr.log", "wb")
        self.proc = subprocess.Popen(["nginx", "-p", f"{cur}/", "-c", "nginx.conf", "-g", "daemon off;"],
                                     stdout=log, stderr=log, start_new_session=True)
        log.close()
        try:
            wait_listening(self.address, self.port, limit, lambda: self.proc is not None and self.proc.poll() is None)
        except RuntimeError:
            self.stop()
            raise RuntimeError(f"{self.label}: NGINX did not start: {self.errors()}") from None
        return self

    def errors(self) -> str:
        text = ""
        for f in ("stderr.log", "error.log"):
            p = self.root / "logs" / f
            if p.exists():
                text += p.read_text(errors="replace")
        return " | ".join(l for l in text.splitlines() if "[emerg]" in l or "[alert]" in l or "[crit]" in l)[-800:] or text[-800:]

    def workers(self) -> list[int]:
        if self.proc is None:
            return []
        try:
            return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]
        except OSError:
            return []

    def cpu(self) -> float:
        return sum(procfs.cpu_seconds(w) or 0.0 for w in self.workers())

    def rss_mb(self) -> float:
        pids = ([self.proc.pid] if self.proc else []) + self.workers()
        return sum(procfs.memory_mb(p)[0] or 0.0 for p in pids)

    def reload(self, limit: float = 300) -> float:
        """SIGHUP; the seconds until a new worker exists and every old one is shutting down."""
        assert self.proc is not None
        old = set(self.workers())
        t0 = time.perf_counter()
        os.kill(self.proc.pid, signal.SIGHUP)
        while time.perf_counter() - t0 < limit:
            now = set(self.workers())
            if now - old and all(_title(p).endswith("is shutting down") or p not in now for p in old):
                return time.perf_counter() - t0
            time.sleep(0.002)
        raise RuntimeError(f"{self.label}: no new worker {limit:.0f} s after SIGHUP")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def start_backend(root: Path) -> tuple[Nginx, int]:
    """The static backend and its stub_status port."""
    port, status_port = free_port(BACKEND_ADDRESS), free_port(BACKEND_ADDRESS)
    conf = BACKEND_CONF.format(address=BACKEND_ADDRESS, port=port, status_port=status_port)
    return Nginx("backend", root, BACKEND_ADDRESS, port).start({"nginx.conf": conf.encode()}), status_port


def backend_accepts(status_port: int) -> int:
    """Connections the backend has accepted (stub_status's first counter)."""
    import http.client

    c = http.client.HTTPConnection(BACKEND_ADDRESS, status_port, timeout=5)
    try:
        c.request("GET", "/status")
        return int(c.getresponse().read().decode().splitlines()[2].split()[0])
    finally:
        c.close()


# -- requests ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One request that is measured: where, with which Host, headers and path."""

    label: str  # e.g. gw/1000/last
    config: str  # the Nginx label
    address: str
    port: int
    host: str
    path: str = PATH
    headers: tuple[tuple[str, str], ...] = ()


def get(t: Target, conn: Any = None) -> tuple[int, bytes]:
    import http.client

    c = conn or http.client.HTTPConnection(t.address, t.port, timeout=30)
    try:
        c.request("GET", t.path, headers={"Host": t.host, **dict(t.headers)})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        if conn is None:
            c.close()


def check(t: Target) -> None:
    status, body = get(t)
    if status != 200 or not body.startswith(b"ok "):
        raise RuntimeError(f"{t.label}: {t.host}{t.path} answered {status} {body[:100]!r}, not the backend's 200")


WRK_LUA = """done = function(summary, latency, requests)
  io.write(string.format('RESULT {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,' ..
    '"timeout":%d,"p50":%d,"p90":%d,"p99":%d,"max":%d}\\n', summary.requests, summary.duration,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def wrk(t: Target, nginx: Nginx, duration: float, conns: int, workdir: Path, status_port: int) -> dict[str, Any]:
    """One wrk run: req/s, latency (ms), NGINX worker CPU and backend connections per request."""
    lua = workdir / "report.lua"
    if not lua.exists():
        lua.write_text(WRK_LUA)
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{duration:g}s", "--timeout", "5s", "-s", str(lua), "-H", f"Host: {t.host}"]
    for k, v in t.headers:
        cmd += ["-H", f"{k}: {v}"]
    cmd.append(f"http://{t.address}:{t.port}{t.path}")
    cpu0, acc0 = nginx.cpu(), backend_accepts(status_port)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    cpu1, acc1 = nginx.cpu(), backend_accepts(status_port)
    m = re.search(r"^RESULT (.*)$", out.stdout, re.M)
    if not m:
        raise RuntimeError(f"{t.label}: no result from wrk: {out.stdout[-300:]} {out.stderr[-300:]}")
    r = json.loads(m.group(1))
    n = max(1, r["requests"])
    return {"rps": r["requests"] / (r["duration_us"] / 1e6), "p50_ms": r["p50"] / 1e3, "p99_ms": r["p99"] / 1e3,
            "errors": r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"],
            "cpu_us": (cpu1 - cpu0) * 1e6 / n, "backend_conns_per_req": max(0, acc1 - acc0 - 1) / n,
            "load": os.getloadavg()[0]}


def fixed_rate(t: Target, rate: int, duration: float) -> dict[str, Any] | None:
    """hey at `rate` requests per second (10 connections): p50/p99 ms; None without hey."""
    if shutil.which("hey") is None:
        return None
    conns = 10
    cmd = ["hey", "-z", f"{duration:g}s", "-c", str(conns), "-q", str(max(1, rate // conns)), "-host", t.host]
    for k, v in t.headers:
        cmd += ["-H", f"{k}: {v}"]
    cmd.append(f"http://{t.address}:{t.port}{t.path}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60).stdout
    q = {p: float(v) * 1e3 for p, v in re.findall(r"^\s+(\d+)% in ([\d.]+) secs", out, re.M)}
    codes = dict(re.findall(r"^\s+\[(\d+)\]\s+(\d+) responses", out, re.M))
    return {"p50_ms": q.get("50"), "p99_ms": q.get("99"), "non_200": sum(int(v) for k, v in codes.items() if k != "200")}


def after_reload(t: Target, nginx: Nginx, n: int = 20) -> dict[str, float]:
    """SIGHUP, then the latency (ms) of the first request on a new connection, and the median of
    the next n (each on a new connection too)."""
    reload_s = nginx.reload()

    def one() -> float:
        t0 = time.perf_counter()
        status, _ = get(t)
        if status != 200:
            raise RuntimeError(f"{t.label}: {status} after a reload")
        return (time.perf_counter() - t0) * 1e3

    first = one()
    rest = [one() for _ in range(n)]
    return {"reload_s": reload_s, "first_ms": first, "next_median_ms": statistics.median(rest)}


# -- instructions (callgrind) ------------------------------------------------------------------------

def valgrind_available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("vgdb") is not None


def _vgdb(pid: int, *commands: str) -> None:
    argv = ["vgdb", f"--pid={pid}"]
    for i, c in enumerate(commands):
        argv += (["-c"] if i else []) + c.split()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"vgdb {' '.join(argv[2:])} failed: {(done.stdout + done.stderr)[-500:]}")


def instructions(label: str, files: dict[str, bytes], root: Path, address: str, port: int,
                 targets: list[Target], n1: int, n2: int) -> dict[str, dict[str, float]]:
    """Per target: instructions per request, (Ir(n2) - Ir(n1)) / (n2 - n1) over one keep-alive
    connection, and the instructions of its first request (a new connection) after NGINX started.
    NGINX runs as one process under callgrind, counting only inside the windows."""
    import http.client

    from gwpolicy.bench.instructions import dump_total

    cur = write_tree(root, files)
    conf = cur / "nginx.conf"
    conf.write_text(re.sub(r"^worker_processes [^;]*;", "worker_processes 1;", conf.read_text(), flags=re.M))
    outdir = root / "cg"
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir()
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--log-file={outdir}/valgrind.log",
           f"--callgrind-out-file={outdir}/cg.out", "nginx", "-p", f"{cur}/", "-c", "nginx.conf",
           "-g", "daemon off; master_process off;"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    dumps = 0
    out: dict[str, dict[str, float]] = {}

    def window(name: str, work: Callable[[], None]) -> int:
        nonlocal dumps
        _vgdb(proc.pid, "zero", "instrumentation on")
        work()
        _vgdb(proc.pid, "instrumentation off", f"dump {name}")
        dumps += 1
        return dump_total(f"{outdir}/cg.out.{dumps}", name)

    try:
        wait_listening(address, port, 1800, lambda: proc.poll() is None)
        for t in targets:
            def requests(n: int) -> Callable[[], None]:
                def run() -> None:
                    c = http.client.HTTPConnection(address, port, timeout=60)
                    try:
                        for _ in range(n):
                            status, _ = get(t, c)
                            if status != 200:
                                raise RuntimeError(f"{t.label}: {status} under callgrind")
                    finally:
                        c.close()
                return run

            first = window(f"{t.label}-first", requests(1))
            a = window(f"{t.label}-n1", requests(n1))
            b = window(f"{t.label}-n2", requests(n2))
            out[t.label] = {"ir_per_request": (b - a) / (n2 - n1), "ir_first": float(first)}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            end = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < end:
                try:  # NGINX under valgrind may sleep in epoll_wait through the signal: wake it
                    socket.create_connection((address, port), timeout=0.2).close()
                except OSError:
                    pass
                time.sleep(0.2)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return out


# -- the run ------------------------------------------------------------------------------------------

Transform = Callable[[dict[str, bytes]], dict[str, bytes]]


@dataclass
class Setup:
    """One cluster (size, scenario, keepalive) as each configuration serves it."""

    size: int
    scenario: str
    keepalive: bool
    hosts: dict[str, int]  # position -> route index
    configs: dict[str, dict[str, bytes]] = field(default_factory=dict)  # gw, hw, x -> files
    listen: dict[str, tuple[str, int]] = field(default_factory=dict)
    upstream_index: dict[str, int] = field(default_factory=dict)  # position -> index in gwpolicy's upstreams.conf
    upstreams: int = 0

    def name(self) -> str:
        return f"{self.size}/{self.scenario}/{'ka' if self.keepalive else 'noka'}"

    def targets(self, config: str) -> list[Target]:
        addr, port = self.listen[config]
        matched = self.scenario in ("matches", "all")
        return [Target(f"{config}/{self.name()}/{pos}", config, addr, port, host(i),
                       PATH + (MATCH_QUERY if matched else ""), tuple(MATCH_HEADERS.items()) if matched else ())
                for pos, i in self.hosts.items()]


def load_transform(path: str) -> Transform:
    spec = importlib.util.spec_from_file_location("gwpolicy_bench_transform", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"gwpolicy bench dataplane: --transform {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, "transform", None)
    if not callable(fn):
        raise SystemExit(f"gwpolicy bench dataplane: --transform {path} defines no transform(files) function")
    return fn


class Addresses:
    """127.0.94.<n> for each configuration, a free port on each."""

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> tuple[str, int]:
        self.n += 1
        addr = f"{CONFIG_NET}.{self.n % 250 + 1}"
        return addr, free_port(addr)


def build(size: int, scenario: str, keepalive: bool, backend: tuple[str, int], addrs: Addresses,
          transform: Transform | None, workers: int | str) -> Setup:
    """The configurations of one cluster: gwpolicy's (gw), the hand-written one (hw), gwpolicy's
    transformed (x). The routes measured are chosen from gwpolicy's rendering without policies."""
    gw_addr, gw_port = addrs.next()
    if scenario == "plain":
        probe = render_gwpolicy(cluster(size, gw_addr, backend), gw_port - 80, workers)
        hosts = positions(probe, size)
    else:
        hosts = {"first": 0}
    targets = tuple(sorted(set(hosts.values())))
    setup = Setup(size, scenario, keepalive, hosts)
    files = render_gwpolicy(cluster(size, gw_addr, backend, scenario, targets, keepalive), gw_port - 80, workers)
    setup.configs["gw"], setup.listen["gw"] = files, (gw_addr, gw_port)
    order = upstream_order(files)
    setup.upstreams = len(order)
    setup.upstream_index = {p: order.index(host(i).split(".")[0]) for p, i in hosts.items() if host(i).split(".")[0] in order}
    hw_addr, hw_port = addrs.next()
    setup.configs["hw"] = handwritten(size, hw_addr, hw_port, backend, scenario, targets, keepalive, workers)
    setup.listen["hw"] = (hw_addr, hw_port)
    if transform is not None:
        x_addr, x_port = addrs.next()
        x_files = render_gwpolicy(cluster(size, x_addr, backend, scenario, targets, keepalive), x_port - 80, workers)
        setup.configs["x"], setup.listen["x"] = transform(x_files), (x_addr, x_port)
    return setup


@dataclass
class Options:
    sizes: list[int]
    scenarios: list[str]
    scenario_routes: int
    rounds: int
    duration: float
    conns: int
    rate: int
    rate_duration: float
    n1: int
    n2: int
    load: bool
    instructions: bool
    workdir: Path
    transform: Transform | None
    workers: int | str


def measure(opts: Options, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Every figure of the run (see the module docstring), as rows."""
    opts.workdir.mkdir(parents=True, exist_ok=True)
    have_wrk = shutil.which("wrk") is not None
    notes: list[str] = []
    if opts.load and not have_wrk:
        notes.append("wrk is not installed (Debian: apt-get install wrk): no throughput or latency figures")
    if opts.load and shutil.which("hey") is None:
        notes.append("hey is not installed (Debian: apt-get install hey): no fixed-rate latency")
    cg = opts.instructions and valgrind_available()
    if opts.instructions and not cg:
        notes.append("valgrind is not installed (Debian: apt-get install valgrind): no instruction counts")
    backend, status_port = start_backend(opts.workdir / "backend")
    rows: list[dict[str, Any]] = []
    addrs = Addresses()
    plan = [(n, "plain", ka) for n in opts.sizes for ka in (False, True)]
    plan += [(opts.scenario_routes, s, s in ("upstream", "all")) for s in opts.scenarios]
    try:
        for size, scenario, ka in plan:
            t0 = time.perf_counter()
            setup = build(size, scenario, ka, (BACKEND_ADDRESS, backend.port), addrs, opts.transform, opts.workers)
            log(f"dataplane: {setup.name()}: configurations built in {time.perf_counter() - t0:.1f} s")
            try:
                rows += _measure_setup(setup, opts, backend, status_port, have_wrk and opts.load, cg, log)
            except RuntimeError as e:  # one cluster's failure (a configuration NGINX refuses) ends only its figures
                notes.append(f"{setup.name()} not measured: {e}")
                log(f"dataplane: {setup.name()} not measured: {e}")
    finally:
        backend.stop()
    return {"rows": rows, "notes": notes, "load_average": os.getloadavg(), "cpus": os.cpu_count()}


def _measure_setup(setup: Setup, opts: Options, backend: Nginx, status_port: int, load: bool, cg: bool,
                   log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {t.label: {"size": setup.size, "scenario": setup.scenario, "keepalive": setup.keepalive,
                      "position": t.label.rsplit("/", 1)[1], "config": c,
                      "upstream_index": setup.upstream_index.get(t.label.rsplit("/", 1)[1]), "upstreams": setup.upstreams}
            for c in setup.configs for t in setup.targets(c)}
    if load:
        running: dict[str, Nginx] = {}
        try:
            for c, files in setup.configs.items():
                addr, port = setup.listen[c]
                t0 = time.perf_counter()
                running[c] = Nginx(c, opts.workdir / c, addr, port).start(files)
                for t in setup.targets(c):
                    rows[t.label]["start_s"] = time.perf_counter() - t0
                    rows[t.label]["config_bytes"] = running[c].config_bytes
                    rows[t.label]["rss_mb"] = running[c].rss_mb()
                    check(t)
            targets = [t for c in setup.configs for t in setup.targets(c)]
            runs: dict[str, list[dict[str, Any]]] = {t.label: [] for t in targets}
            for r in range(opts.rounds):
                for t in targets if r % 2 == 0 else list(reversed(targets)):
                    runs[t.label].append(wrk(t, running[t.config], opts.duration, opts.conns, opts.workdir, status_port))
            for label, rs in runs.items():
                for k in ("rps", "p50_ms", "p99_ms", "cpu_us", "backend_conns_per_req", "load"):
                    rows[label][k] = statistics.median(x[k] for x in rs)
                rows[label]["errors"] = sum(x["errors"] for x in rs)
            for t in targets:
                fr = fixed_rate(t, opts.rate, opts.rate_duration) if opts.rate_duration > 0 else None
                if fr is not None:
                    rows[t.label].update({f"rate_{k}": v for k, v in fr.items()})
            for c in setup.configs:
                for t in setup.targets(c):
                    rows[t.label].update({f"reload_{k}" if k != "reload_s" else k: v
                                          for k, v in after_reload(t, running[c]).items()})
            log(f"dataplane: {setup.name()}: traffic measured")
        finally:
            for n in running.values():
                n.stop()
    if cg:
        for c, files in setup.configs.items():
            addr, port = setup.listen[c]
            counts = instructions(c, files, opts.workdir / f"cg-{c}", addr, port, setup.targets(c), opts.n1, opts.n2)
            for label, v in counts.items():
                rows[label].update(v)
        log(f"dataplane: {setup.name()}: instructions counted")
    return list(rows.values())


def report(result: dict[str, Any]) -> str:
    """Markdown tables: per cluster and route, each configuration against the hand-written one."""
    rows = result["rows"]
    hw = {(r["size"], r["scenario"], r["keepalive"], r["position"]): r for r in rows if r["config"] == "hw"}

    def ratio(r: dict[str, Any], k: str) -> str:
        base = hw.get((r["size"], r["scenario"], r["keepalive"], r["position"]), {}).get(k)
        return f"{r[k] / base:.2f}" if r.get(k) is not None and base else "-"

    def num(r: dict[str, Any], k: str, fmt: str) -> str:
        return format(r[k], fmt) if r.get(k) is not None else "-"

    lines = ["| routes | scenario | keepalive | route | upstream # | config | req/s | ratio | p50 ms | p99 ms | p99 ratio "
             "| NGINX CPU µs/req | backend conns/req | Ir/req | Ir ratio | Ir first request | fixed-rate p50 / p99 ms "
             "| after reload: first / next ms |",
             "|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    order = {"hw": 0, "gw": 1, "x": 2}
    for r in sorted(rows, key=lambda r: (r["scenario"] != "plain", r["size"], r["scenario"], r["keepalive"],
                                         POSITIONS.index(r["position"]), order.get(r["config"], 3))):
        up = f"{r['upstream_index'] + 1} of {r['upstreams']}" if r.get("upstream_index") is not None and r["config"] != "hw" else ""
        rate = (f"{r['rate_p50_ms']:.2f} / {r['rate_p99_ms']:.2f}" if r.get("rate_p50_ms") is not None
                and r.get("rate_p99_ms") is not None else "-")
        after = (f"{r['reload_first_ms']:.2f} / {r['reload_next_median_ms']:.2f}" if r.get("reload_first_ms") is not None else "-")
        lines.append(f"| {r['size']:,} | {r['scenario']} | {'on' if r['keepalive'] else 'off'} | {r['position']} | {up} "
                     f"| {r['config']} | {num(r, 'rps', ',.0f')} | {ratio(r, 'rps')} | {num(r, 'p50_ms', '.2f')} "
                     f"| {num(r, 'p99_ms', '.2f')} | {ratio(r, 'p99_ms')} | {num(r, 'cpu_us', '.1f')} "
                     f"| {num(r, 'backend_conns_per_req', '.3f')} | {num(r, 'ir_per_request', ',.0f')} "
                     f"| {ratio(r, 'ir_per_request')} | {num(r, 'ir_first', ',.0f')} | {rate} | {after} |")
    out = lines + [""]
    spread = _spread(rows)
    if spread:
        out += ["instructions per request, last route over first route (same configuration and cluster): "
                + "; ".join(spread), ""]
    out += [f"configs: hw = hand-written, gw = gwpolicy render{', x = gwpolicy render transformed' if any(r['config'] == 'x' for r in rows) else ''}; "
            "ratio: over hw (req/s, p99, Ir); wrk 1 thread, medians of the rounds; load average at the end "
            + " ".join(f"{x:.1f}" for x in result["load_average"]) + f" on {result['cpus']} CPUs"]
    out += [f"note: {n}" for n in result["notes"]]
    return "\n".join(out) + "\n"


def _spread(rows: list[dict[str, Any]]) -> list[str]:
    by: dict[tuple[Any, ...], dict[str, float]] = {}
    for r in rows:
        if r.get("ir_per_request") is not None and r["scenario"] == "plain":
            by.setdefault((r["size"], r["keepalive"], r["config"]), {})[r["position"]] = r["ir_per_request"]
    return [f"{c} {n:,} routes keepalive {'on' if ka else 'off'}: {v['last'] / v['first']:.2f}"
            for (n, ka, c), v in sorted(by.items()) if "first" in v and "last" in v and v["first"]]


def _scenarios(text: str) -> list[str]:
    out = [s.strip() for s in text.split(",") if s.strip()]
    for s in out:
        if s not in SCENARIOS:
            raise argparse.ArgumentTypeError(f"{s!r}: scenarios are {', '.join(SCENARIOS)}")
    return out


def main(argv: list[str] | None = None) -> int:
    from gwpolicy.bench.generate import at_least, route_counts

    _positive = at_least(1)
    p = argparse.ArgumentParser(prog="gwpolicy bench dataplane", description=(__doc__ or "").splitlines()[0],
                                epilog="examples:\n  gwpolicy bench dataplane --quick\n"
                                       "  gwpolicy bench dataplane --sizes 20000 --scenarios '' --rounds 5\n"
                                       "  gwpolicy bench dataplane --sizes 1000 --transform shape.py --no-load",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 and 1,000 routes, one round of 2 s, short fixed-rate runs")
    p.add_argument("--sizes", type=route_counts, help="route counts (default 1,1000,5000,20000)")
    p.add_argument("--scenarios", type=_scenarios, help=f"one-route scenarios (default all: {','.join(SCENARIOS)}; '' for none)")
    p.add_argument("--scenario-routes", type=_positive, default=1, help="routes in the scenario clusters (default 1)")
    p.add_argument("--rounds", type=_positive, help="wrk rounds per route, the order alternating (default 3)")
    p.add_argument("--duration", type=float, help="seconds per wrk run (default 4)")
    p.add_argument("--conns", type=_positive, default=16, help="wrk connections (default 16)")
    p.add_argument("--rate", type=_positive, default=1000, help="fixed-rate requests per second (default 1000)")
    p.add_argument("--rate-duration", type=float, help="seconds per fixed-rate run (default 5; 0: none)")
    p.add_argument("--instruction-requests", default=None, help="N1,N2 requests of the callgrind windows (default 200,1000)")
    p.add_argument("--no-load", action="store_true", help="no wrk, hey or reloads: instruction counts only")
    p.add_argument("--no-instructions", action="store_true", help="no callgrind")
    p.add_argument("--worker-processes", default="1", help="NGINX worker_processes of every configuration (default 1; 'auto')")
    p.add_argument("--transform", help="a Python file whose transform(files) turns gwpolicy's files into a third configuration")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "gwpolicy-bench-dataplane"))
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args(argv)
    if a.worker_processes != "auto":
        try:
            a.worker_processes = _positive(a.worker_processes)
        except argparse.ArgumentTypeError as e:
            p.error(f"--worker-processes: {e}")
    n1n2 = (a.instruction_requests or ("50,250" if a.quick else "200,1000")).split(",")
    try:
        n1, n2 = int(n1n2[0]), int(n1n2[1])
        if not 0 < n1 < n2:
            raise ValueError
    except (ValueError, IndexError):
        p.error(f"--instruction-requests {a.instruction_requests!r}: two numbers N1,N2 with 0 < N1 < N2")
    if shutil.which("nginx") is None:
        print("Error: nginx is not installed (Debian: apt-get install nginx)", file=sys.stderr)
        return 2
    opts = Options(sizes=a.sizes if a.sizes is not None else ([1, 1000] if a.quick else list(SIZES)),
                   scenarios=a.scenarios if a.scenarios is not None else list(SCENARIOS),
                   scenario_routes=a.scenario_routes, rounds=a.rounds or (1 if a.quick else 3),
                   duration=a.duration or (2.0 if a.quick else 4.0), conns=a.conns, rate=a.rate,
                   rate_duration=a.rate_duration if a.rate_duration is not None else (2.0 if a.quick else 5.0),
                   n1=n1, n2=n2, load=not a.no_load, instructions=not a.no_instructions, workdir=Path(a.workdir),
                   transform=load_transform(a.transform) if a.transform else None, workers=a.worker_processes)
    try:
        result = measure(opts)
    except (RuntimeError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(report(result), end="")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0
