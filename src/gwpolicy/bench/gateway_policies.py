"""`python -m gwpolicy.bench.gateway_policies`: what the gateway's policies cost in NGINX.

On the synthetic cluster of `gwpolicy bench gateway` (bench.generate + EndpointSlices), the same
cluster with and without the gateway's own policy kinds attached (per Gateway a ClientSettingsPolicy
and a RateLimitPolicy; every fourth route a TimeoutPolicy, every tenth a RetryPolicy; every fifth
Service an UpstreamSettingsPolicy and a TimeoutPolicy): analysis and render time, configuration
size, and, up to --traffic-max routes, the time from a policy edit (route-000000's TimeoutPolicy
gets an override readTimeout 1s) to traffic following it (a 1.5 s backend answer turns into a 504). Loopback only:
Gateways in 127.0.35.0/24, backends on 127.0.36.x (POL's range), listener ports + --port-offset.
"""

from __future__ import annotations

import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gwpolicy.bench.gateway import (
    ROUTE0,
    ROUTE0_HOST,
    first_request_showing,
    gateway_cluster,
    print_report,
    request,
    route0_server,
    self_signed_cert,
    sizes_of,
    sizes_parser,
    table_head,
)

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
ADDRESS_POOL = "127.0.35.0/24"
BACKEND = "127.0.36.1"
GW = "gateway.networking.k8s.io"
V = "gwpolicy.io/v1alpha1"


def policy_kinds() -> list[dict[str, Any]]:
    """The CRDs (deploy/4x) and PolicyKinds (deploy/policykinds/4x): the bench runs from a checkout."""
    files = sorted(DEPLOY.glob("4[0-9]-*.yaml")) + sorted((DEPLOY / "policykinds").glob("4[0-9]-*.yaml"))
    if not files:
        raise SystemExit(f"gwpolicy bench: no policy CRDs under {DEPLOY} (run it from a checkout)")
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


def _policy(kind: str, name: str, ns: str, target: dict[str, Any], ts: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": V, "kind": kind,
            "metadata": {"name": name, "namespace": ns, "generation": 1,
                         "creationTimestamp": f"2025-02-01T{ts // 3600 % 24:02d}:{ts // 60 % 60:02d}:{ts % 60:02d}Z"},
            "spec": {"targetRef": target, **spec}}


def gateway_policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our kinds attached across the synthetic cluster (see the module docstring)."""
    out: list[dict[str, Any]] = []
    ts = 0
    for o in objects:
        md = o["metadata"]
        ref = {"group": GW if o["kind"] != "Service" else "", "kind": o["kind"], "name": md["name"]}
        if o["kind"] == "Gateway":
            out.append(_policy("ClientSettingsPolicy", f"{md['name']}-client", md["namespace"], ref, ts,
                               default={"body": {"maxSize": "8m"}, "keepAlive": {"requests": 1000}}))
            out.append(_policy("RateLimitPolicy", f"{md['name']}-rate", md["namespace"], ref, ts,
                               default={"requests": 100, "burst": 50}))
        elif o["kind"] == "HTTPRoute":
            i = int(md["name"].rsplit("-", 1)[1])
            if i % 4 == 0:
                out.append(_policy("TimeoutPolicy", f"{md['name']}-timeout", md["namespace"], ref, ts,
                                   default={"connectionTimeout": 5, "readTimeout": "30s"}))
            if i % 10 == 0:
                out.append(_policy("RetryPolicy", f"{md['name']}-retry", md["namespace"], ref, ts,
                                   default={"attempts": 2, "codes": [502, 503]}))
        elif o["kind"] == "Service" and sum(map(ord, md["name"])) % 5 == 0:
            out.append(_policy("UpstreamSettingsPolicy", f"{md['name']}-pool", md["namespace"], ref, ts,
                               keepAlive={"connections": 8}))
            out.append(_policy("TimeoutPolicy", f"{md['name']}-timeout", md["namespace"], ref, ts,
                               default={"readTimeout": "20s"}))
        ts += 1
    return out


def measure(routes: int, workdir: Path, port_offset: int, traffic: bool) -> dict[str, Any]:
    from gwpolicy.engine.analysis import analyse
    from gwpolicy.gateway import policyconf
    from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
    from gwpolicy.gateway.echo import EchoServer
    from gwpolicy.gateway.nginx import Nginx
    from gwpolicy.gateway.render import render

    echo = EchoServer("bench-pol-x-y", "bench", address=BACKEND).start()
    try:
        base = list(gateway_cluster(routes, self_signed_cert(workdir), echo={"svc-000000": (echo.address, echo.port)}))
        with_policies = base + policy_kinds() + gateway_policies(base)
        config = DataPlaneConfig(controller_name=None, address_pool=ADDRESS_POOL, port_offset=port_offset,
                                 # its backends: EndpointSlices it writes, on loopback
                                 allow_unmanaged_endpointslices=True, allow_loopback_endpoints=True)
        checks = policyconf.kind_checks()
        row: dict[str, Any] = {"routes": routes, "policies": len(with_policies) - len(base) - len(policy_kinds())}

        def build(objs: list[dict[str, Any]]) -> tuple[Any, dict[str, bytes], float, float]:
            t0 = time.perf_counter()
            a = analyse(objs, kind_checks=checks, by_target=True)  # indexed as the gateway has it
            t1 = time.perf_counter()
            dp = build_dataplane(a, config)
            files = render(dp)
            return dp, files, t1 - t0, time.perf_counter() - t1

        def size(files: dict[str, bytes]) -> int:
            return sum(len(v) for k, v in files.items() if not k.startswith(("secrets/", "tls/")))

        _, plain, row["analysis_plain_s"], row["render_plain_s"] = build(base)
        dp, files, row["analysis_s"], row["render_s"] = build(with_policies)
        row["config_plain_bytes"], row["config_bytes"] = size(plain), size(files)
        text = b"".join(v for k, v in files.items() if k.endswith(".conf")).decode()
        row["policy_lines"] = sum(text.count(d) for d in ("proxy_read_timeout", "proxy_connect_timeout",
                                                          "proxy_next_upstream_tries", "client_max_body_size",
                                                          "limit_req zone", "keepalive "))
        if traffic:
            row.update(_edit_to_traffic(with_policies, files, build, workdir, routes, Nginx, route0_server(dp)))
        return row
    finally:
        echo.stop()


def _edit_to_traffic(objs: list[dict[str, Any]], files: dict[str, bytes], build: Any, workdir: Path, routes: int,
                     nginx_cls: Any, server: tuple[str, int]) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"gwpol{routes}-", dir=workdir))
    nginx = nginx_cls(root, verify_timeout=300)
    out: dict[str, Any] = {}
    try:
        result = nginx.apply(files)
        if not result.ok:
            raise RuntimeError(f"NGINX did not start at {routes} routes: {result.error}")
        status = request(server, ROUTE0_HOST, "/?delay=1500ms")[0]
        if status != 200:
            raise RuntimeError(f"route-000000 before the edit answered {status}")
        edited = copy.deepcopy(objs)
        pol = next(o for o in edited if o["kind"] == "TimeoutPolicy" and o["metadata"]["name"] == f"{ROUTE0}-timeout")
        pol["spec"]["override"] = {"readTimeout": "1s"}  # beats a Service default below the route
        t0 = time.perf_counter()
        _, files2, a2, r2 = build(edited)
        result = nginx.apply(files2)
        if not result.ok:
            raise RuntimeError(f"reload failed at {routes} routes: {result.error}")
        out["edit_reload_s"] = result.seconds
        out["edit_applied_s"] = time.perf_counter() - t0
        # the first request sent after the edit that NGINX cuts at 1 s
        sent = first_request_showing(lambda: request(server, ROUTE0_HOST, "/?delay=1500ms")[0] == 504, t0, 60,
                                     "the policy edit")
        out["edit_to_traffic_s"] = sent - t0
        out["edit_analysis_s"], out["edit_render_s"] = a2, r2
    finally:
        nginx.stop()
    return out


def report(rows: list[dict[str, Any]]) -> str:
    head = ("| routes | our policies | config without | config with | policy lines | analysis without / with "
            "| render without / with | policy edit → traffic |")
    lines = table_head(head)
    for r in rows:
        edit = f"{r['edit_to_traffic_s']:.2f} s" if "edit_to_traffic_s" in r else "-"
        lines.append(f"| {r['routes']:,} | {r['policies']:,} | {r['config_plain_bytes'] / 1e6:.2f} MB | "
                     f"{r['config_bytes'] / 1e6:.2f} MB | {r['policy_lines']:,} | "
                     f"{r['analysis_plain_s']:.2f} s / {r['analysis_s']:.2f} s | "
                     f"{r['render_plain_s']:.2f} s / {r['render_s']:.2f} s | {edit} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = sizes_parser("python -m gwpolicy.bench.gateway_policies", __doc__ or "", "1000,10000,20000", "gwpolicy-bench-pol",
                     35000)
    p.add_argument("--traffic-max", type=int, default=10000, help="measure edit -> traffic up to this size")
    args = p.parse_args(argv)
    workdir, sizes = sizes_of(args)
    rows = []
    for n in sizes:
        print(f"gateway policies: measuring {n} routes...", file=sys.stderr)
        rows.append(measure(n, workdir, args.port_offset, n <= args.traffic_max))
    return print_report(rows, report(rows), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
