"""`python -m gwpolicy.bench.tenant_cost`: what one tenant's maximum-size routes cost another
tenant's edits, with and without a per-namespace budget (docs/security.md, "Bounded costs per tenant").

tenant-a holds N HTTPRoutes of 2 rules x 63 Exact matches each (126: the CRD allows 128 per route),
each path `--path-length` characters long; tenant-b then creates a route of one match, three times.
Per edit: seconds from the event to the first 200 from tenant-b's new hostname, through the
gateway's own reconcile (GatewayController with real NGINX, in one process, no API server). With
`--budget B` the gateway runs with `--namespace-match-budget B`. Loopback only: the Gateway on
127.0.57.1, listener port 80 + --port-offset, the echo backend on 127.0.57.200.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import statistics
import sys
import tempfile
import time
from typing import Any

GW = "gateway.networking.k8s.io"
ADDRESS_POOL = "127.0.57.0/25"
ADDRESS = "127.0.57.1"
BACKEND = "127.0.57.200"


def _meta(name: str, ns: str | None = None, ts: str = "2024-01-01T00:00:00Z") -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "creationTimestamp": ts, "generation": 1, "resourceVersion": "1"}
    if ns:
        m["namespace"] = ns
    return m


def _route(name: str, ns: str, host: str, rules: list[dict[str, Any]], ts: str) -> dict[str, Any]:
    return {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": _meta(name, ns, ts),
            "spec": {"parentRefs": [{"name": "shared", "namespace": "infra"}], "hostnames": [host], "rules": rules}}


def cluster(routes: int, path_length: int, echo_port: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": _meta("gwpolicy"),
         "spec": {"controllerName": "gwpolicy.io/gateway-controller"}},
        {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": _meta("shared", "infra"),
         "spec": {"gatewayClassName": "gwpolicy", "listeners": [
             {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}]}},
    ]
    for ns in ("infra", "tenant-a", "tenant-b"):
        out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(ns)})
    for ns in ("tenant-a", "tenant-b"):
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": _meta("web", ns),
                    "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": echo_port}]}})
        out.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": dict(_meta("web-1", ns), labels={"kubernetes.io/service-name": "web"}),
                    "addressType": "IPv4", "ports": [{"name": "http", "port": echo_port}],
                    "endpoints": [{"addresses": [BACKEND], "conditions": {"ready": True}}]})
    backend = [{"name": "web", "port": 8080}]
    out.append(_route("b-route", "tenant-b", "b.example", [{"backendRefs": backend}], "2024-01-01T00:00:00Z"))
    for i in range(routes):
        rules = []
        for r in range(2):
            matches = []
            for m in range(63):
                head = f"/r{i}/{r}/{m}/"
                matches.append({"path": {"type": "Exact", "value": head + "p" * max(0, path_length - len(head))}})
            rules.append({"matches": matches, "backendRefs": backend})
        out.append(_route(f"big-{i:03d}", "tenant-a", f"a{i}.example", rules, f"2024-01-02T00:{i // 60:02d}:{i % 60:02d}Z"))
    return out


def measure(routes: int, path_length: int, budget: int | None, port_offset: int, edits: int) -> dict[str, Any]:
    from gwpolicy.engine.kinds import split_api_version
    from gwpolicy.gateway.controller import DataPlaneDriver, GatewayController, GatewayOptions
    from gwpolicy.gateway.echo import EchoServer
    from gwpolicy.kube.client import Kind

    echo = EchoServer("b-pod", "tenant-b", address=BACKEND).start()
    fields = {f.name for f in dataclasses.fields(GatewayOptions)}
    wanted: dict[str, Any] = {"allow_unmanaged_endpointslices": True, "allow_loopback_endpoints": True,
                              "namespace_budget": budget}
    extra = {k: v for k, v in wanted.items() if k in fields}  # a commit before these options: without them
    with tempfile.TemporaryDirectory() as tmp:
        opts = GatewayOptions(address_pool=ADDRESS_POOL, port_offset=port_offset, state_dir=tmp, leader_election=False,
                              **extra)
        driver = DataPlaneDriver(opts)
        c = GatewayController(opts, driver)

        def kind_of(raw: dict[str, Any]) -> Kind:
            group, version = split_api_version(raw["apiVersion"])
            return Kind(group, version, raw["kind"], raw["kind"].lower() + "s", "namespace" in raw["metadata"])

        def served(host: str) -> bool:
            import http.client

            conn = http.client.HTTPConnection(ADDRESS, 80 + port_offset, timeout=5)
            try:
                conn.request("GET", "/", headers={"Host": host})
                return conn.getresponse().status == 200
            except OSError:
                return False
            finally:
                conn.close()

        async def go() -> dict[str, Any]:
            t0 = time.perf_counter()
            for raw in cluster(routes, path_length, echo.port):
                await c.on_event("ADDED", kind_of(raw), copy.deepcopy(raw))
            await c.reconcile()
            first = time.perf_counter() - t0
            if not served("b.example"):
                raise RuntimeError(f"b.example is not served: {c.error}")
            took = []
            for e in range(edits):
                raw = _route(f"b-new-{e}", "tenant-b", f"b-new-{e}.example", [{"backendRefs": [{"name": "web", "port": 8080}]}],
                             f"2024-02-01T00:00:{e:02d}Z")
                t = time.perf_counter()
                await c.on_event("ADDED", kind_of(raw), copy.deepcopy(raw))
                await c.reconcile()
                while not served(f"b-new-{e}.example"):
                    if time.perf_counter() - t > 120:
                        raise RuntimeError(f"b-new-{e}.example not served after 120 s: {c.error}")
                    await asyncio.sleep(0.01)
                took.append(time.perf_counter() - t)
            return {"routes": routes, "matches": routes * 126, "budget": budget, "first_s": round(first, 2),
                    "edit_s": [round(x, 2) for x in took], "edit_median_s": round(statistics.median(took), 2),
                    "left_out": len(getattr(c, "over_budget", {}))}
        try:
            return asyncio.run(go())
        finally:
            driver.stop()
            c.nginx_thread.shutdown(wait=True)
            echo.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gwpolicy.bench.tenant_cost", description=__doc__)
    p.add_argument("--routes", type=int, default=100, help="tenant-a's maximum-size routes")
    p.add_argument("--path-length", type=int, default=200, help="characters of each Exact path")
    p.add_argument("--budget", type=int, action="append", help="a --namespace-match-budget to measure (repeatable); "
                   "without: no budget")
    p.add_argument("--edits", type=int, default=3, help="tenant-b's new routes, one after the other")
    p.add_argument("--port-offset", type=int, default=30000)
    a = p.parse_args(argv)
    for budget in a.budget or [None]:
        print(measure(a.routes, a.path_length, budget, a.port_offset, a.edits), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
