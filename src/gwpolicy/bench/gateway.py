"""`gwpolicy bench gateway`: what the NGINX data plane costs on the synthetic cluster.

Per size: the analysis it comes from, building the data plane model and rendering it, the
configuration's size, `nginx -t`, the first start, a reload after one HTTPRoute edit, NGINX's
memory, and the time from an HTTPRoute edit to traffic following it (analysis + render + apply +
the first request that reaches the new backend). Loopback only (127.0.12.0/24 for the Gateways,
127.0.13.x for backends), listener ports shifted by --port-offset.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from gwpolicy.bench.generate import cluster

BACKEND_NET = "127.0.13"
ADDRESS_POOL = "127.0.12.0/24"


def self_signed_cert(workdir: Path) -> tuple[bytes, bytes]:
    crt, key = workdir / "bench-gw.crt", workdir / "bench-gw.key"
    if not crt.exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=*.example.com",
                        "-addext", "subjectAltName=DNS:*.example.com", "-keyout", str(key), "-out", str(crt)],
                       check=True, capture_output=True)
    return crt.read_bytes(), key.read_bytes()


def gateway_cluster(routes: int, cert: tuple[bytes, bytes] | None = None, seed: int = 1,
                    echo: dict[str, tuple[str, int]] | None = None) -> Iterator[dict[str, Any]]:
    """bench.generate's cluster plus what a data plane needs: EndpointSlices for every Service and
    the HTTPS listeners' certificate Secret (without `cert` those listeners stay unprogrammed).
    `echo` points chosen Services (by name) at real backends."""
    echo = echo or {}
    for obj in cluster(routes, seed):
        if obj["kind"] == "Gateway" and cert is not None:
            for l in obj["spec"]["listeners"]:
                if l["protocol"] == "HTTPS":
                    l["tls"] = {"certificateRefs": [{"name": "wildcard-example-com"}]}
        yield obj
        if obj["kind"] == "Service":
            name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
            i = sum(map(ord, name)) % 250 + 2
            addr, port = echo.get(name, (f"{BACKEND_NET}.{i}", 3000))
            yield {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": f"{name}-slice", "namespace": ns, "labels": {"kubernetes.io/service-name": name}},
                   "addressType": "IPv4", "ports": [{"name": "http", "port": port}],
                   "endpoints": [{"addresses": [addr], "conditions": {"ready": True}}]}
    if cert is not None:
        yield {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "wildcard-example-com", "namespace": "infra"},
               "data": {"tls.crt": base64.b64encode(cert[0]).decode(), "tls.key": base64.b64encode(cert[1]).decode()}}


EDIT_SERVICE = "svc-edit"
ROUTE0, ROUTE0_HOST = "route-000000", "route-000000.example.com"


def with_edit_backend(objects: list[dict[str, Any]], address: str, port: int) -> list[dict[str, Any]]:
    """The objects plus the Service an edit sends route-000000 to (EDIT_SERVICE, port 8080, in the
    route's namespace), whose EndpointSlice points at a real backend."""
    ns = next(o for o in objects if o["kind"] == "HTTPRoute" and o["metadata"]["name"] == ROUTE0)["metadata"]["namespace"]
    return objects + [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": EDIT_SERVICE, "namespace": ns},
         "spec": {"ports": [{"name": "http", "port": 8080}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": EDIT_SERVICE, "namespace": ns, "labels": {"kubernetes.io/service-name": EDIT_SERVICE}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": port}],
         "endpoints": [{"addresses": [address]}]}]


def route0_server(dp: Any) -> tuple[str, int]:
    """Where NGINX serves route-000000 over plain HTTP: gw-001's http listener (every fifth route
    is on it)."""
    srv = next(s for s in dp.servers if s.listener.name == "gw-001" and s.listener.section == "http")
    return srv.address, srv.port


def request(server: tuple[str, int], host: str, path: str = "/", timeout: float = 10.0) -> tuple[int, str]:
    """One GET through NGINX: the status, and the pod the echo backend names ('' if the body is not
    the echo's)."""
    import http.client

    conn = http.client.HTTPConnection(*server, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": host})
        resp = conn.getresponse()
        body = resp.read()
        try:
            return resp.status, json.loads(body).get("pod", "")
        except ValueError:
            return resp.status, ""
    finally:
        conn.close()


def first_request_showing(shows: Callable[[], bool], since: float, limit: float, what: str, pause: float = 0.0) -> float:
    """Send requests (`shows` sends one) until one shows the edit made at `since`; when that request
    was sent (perf_counter). RuntimeError after `limit` seconds."""
    while True:
        sent = time.perf_counter()
        if shows():
            return sent
        if sent - since > limit:
            raise RuntimeError(f"{what}: traffic did not follow the edit within {limit:.0f} s")
        time.sleep(pause)


def table_head(head: str, cell: str = "---:|") -> list[str]:
    """A Markdown table's head and its rule."""
    return [head, "|" + cell * (head.count("|") - 1)]


def sizes_parser(prog: str, doc: str, sizes: str, workdir: str, port_offset: int) -> argparse.ArgumentParser:
    """The options every gateway benchmark takes: sizes, a work directory, a port offset, --json."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--sizes", default=sizes, help="route counts, comma-separated")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), workdir))
    p.add_argument("--port-offset", type=int, default=port_offset, help=f"added to every listener port (default {port_offset})")
    p.add_argument("--json", help="also write the figures to this file")
    return p


def sizes_of(args: argparse.Namespace) -> tuple[Path, list[int]]:
    """The work directory (made) and the route counts asked for."""
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir, [int(s) for s in args.sizes.split(",") if s]


def print_report(rows: list[dict[str, Any]], table: str, json_path: str | None) -> int:
    """The table on stdout, the rows as JSON where asked."""
    print(table, end="")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=2))
    return 0


def _rss_kb(pid: int) -> int:
    """Resident memory of the NGINX master and its workers."""
    total = 0
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def measure_size(routes: int, workdir: Path, port_offset: int, cert: tuple[bytes, bytes]) -> dict[str, Any]:
    from gwpolicy.engine.analysis import analyse
    from gwpolicy.gateway import policyconf
    from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
    from gwpolicy.gateway.echo import EchoServer
    from gwpolicy.gateway.nginx import Nginx
    from gwpolicy.gateway.render import render

    a_echo = EchoServer("bench-a-x-y", "bench", address=f"{BACKEND_NET}.1").start()
    b_echo = EchoServer("bench-b-x-y", "bench", address=f"{BACKEND_NET}.1").start()
    objects = with_edit_backend(list(gateway_cluster(routes, cert, echo={"svc-000000": (a_echo.address, a_echo.port)})),
                                b_echo.address, b_echo.port)
    config = DataPlaneConfig(controller_name=None, address_pool=ADDRESS_POOL, port_offset=port_offset,
                             # its backends: EndpointSlices it writes, on loopback
                             allow_unmanaged_endpointslices=True, allow_loopback_endpoints=True)
    checks = policyconf.kind_checks()
    row: dict[str, Any] = {"routes": routes, "objects": len(objects)}

    def build(objs: list[dict[str, Any]]) -> tuple[Any, dict[str, bytes], float, float]:
        """CPU seconds (the machine is shared: wall time would measure the neighbours)."""
        t0 = time.process_time()
        analysis = analyse(objs, kind_checks=checks, by_target=True)  # indexed as the gateway has it
        t1 = time.process_time()
        dp = build_dataplane(analysis, config)
        files = render(dp)
        return dp, files, t1 - t0, time.process_time() - t1

    dp, files, row["analysis_s"], row["render_s"] = build(objects)
    row["servers"] = len(dp.servers)
    row["locations"] = sum(len(v.locations) for s in dp.servers for v in s.vhosts)
    row["upstreams"] = len(dp.upstreams)
    row["config_bytes"] = sum(len(v) for k, v in files.items() if not k.startswith("secrets/"))
    root = Path(tempfile.mkdtemp(prefix=f"gw{routes}-", dir=workdir))
    nginx = Nginx(root, verify_timeout=300)
    try:
        t0 = time.perf_counter()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        gen = root / "t"
        for rel, data in files.items():
            (gen / rel).parent.mkdir(parents=True, exist_ok=True)
            (gen / rel).write_bytes(data)
        out = subprocess.run(["nginx", "-t", "-q", "-p", f"{gen}/", "-c", str(gen / "nginx.conf"), "-e", str(root / "logs" / "t.log")],
                             capture_output=True, text=True)
        row["nginx_t_s"] = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        row["nginx_t_cpu_s"] = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
        row["load_average"] = os.getloadavg()[0]
        if out.returncode != 0:
            raise RuntimeError(f"nginx -t failed at {routes} routes: {out.stderr[-500:]}")
        result = nginx.apply(files)
        if not result.ok:
            raise RuntimeError(f"NGINX did not start at {routes} routes: {result.error}")
        row["start_s"] = result.seconds
        row["rss_mb"] = round(_rss_kb(nginx.pid or 0) / 1024, 1)
        server = route0_server(dp)
        status, pod = request(server, ROUTE0_HOST, timeout=5.0)
        if (status, pod) != (200, "bench-a-x-y"):
            raise RuntimeError(f"route-000000 before the edit: {status} {pod!r}")
        # the edit: route-000000 sends its traffic to svc-edit (in its namespace, backed by echo B)
        edited = copy.deepcopy(objects)
        r0 = next(o for o in edited if o["kind"] == "HTTPRoute" and o["metadata"]["name"] == ROUTE0)
        for rule in r0["spec"]["rules"]:
            rule["backendRefs"] = [{"name": EDIT_SERVICE, "port": 8080}]
        t_edit = time.perf_counter()
        _, files2, a2, r2 = build(edited)
        result = nginx.apply(files2)
        if not result.ok:
            raise RuntimeError(f"reload failed at {routes} routes: {result.error}")
        row["reload_s"] = result.seconds
        row["reload_test_s"], row["reload_hup_s"] = result.test_seconds, result.reload_seconds
        first_request_showing(lambda: request(server, ROUTE0_HOST, timeout=5.0)[1] == "bench-b-x-y", t_edit, 120,
                              f"{routes} routes", pause=0.01)
        row["edit_to_traffic_s"] = time.perf_counter() - t_edit  # until the answer that shows it
        row["edit_analysis_s"], row["edit_render_s"] = a2, r2
        row["rss_after_reload_mb"] = round(_rss_kb(nginx.pid or 0) / 1024, 1)
    finally:
        nginx.stop()
        a_echo.stop()
        b_echo.stop()
    return row


def report(rows: list[dict[str, Any]]) -> str:
    head = ("| routes | servers | locations | upstreams | config | analysis (CPU) | dataplane+render (CPU) | `nginx -t` (CPU) | start "
            "| apply of an edit (`nginx -t` + SIGHUP → serving) | edit → traffic | NGINX RSS |")
    lines = table_head(head)
    for r in rows:
        lines.append(f"| {r['routes']:,} | {r['servers']} | {r['locations']:,} | {r['upstreams']:,} | "
                     f"{r['config_bytes'] / 1e6:.1f} MB | {r['analysis_s']:.2f} s | {r['render_s']:.2f} s | "
                     f"{r['nginx_t_s']:.2f} s ({r['nginx_t_cpu_s']:.2f} s) | {r['start_s']:.2f} s | {r['reload_s']:.2f} s ({r['reload_test_s']:.2f} + {r['reload_hup_s']:.2f}) | "
                     f"{r['edit_to_traffic_s']:.2f} s | {r['rss_mb']:.0f} MB |")
    lines.append("")
    lines.append("load average (1 min) at each `nginx -t`: " + ", ".join(f"{r['load_average']:.1f}" for r in rows)
                 + " on " + str(os.cpu_count()) + " CPUs")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sizes_parser("gwpolicy bench gateway", __doc__ or "", "1000,10000", "gwpolicy-bench", 20000).parse_args(argv)
    workdir, sizes = sizes_of(args)
    cert = self_signed_cert(workdir)
    rows = []
    for size in sizes:
        print(f"gateway: measuring {size} routes...", file=sys.stderr)
        rows.append(measure_size(size, workdir, args.port_offset, cert))
    return print_report(rows, report(rows), args.json)
