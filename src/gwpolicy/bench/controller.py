"""Controller figures: a `gwpolicy sandbox` process holding the synthetic cluster, the controller in
this process; time to the first complete status, then one policy edit, one route edit and one
namespace-wide policy edit, each with the API writes it caused."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx2 as httpx

from gwpolicy.bench.generate import cluster
from gwpolicy.controller.app import Controller, Options


async def _idle(c: Controller, timeout: float, quiet: float = 0.3) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if c.idle and time.monotonic() - c.last_event > quiet:
            return time.monotonic() - start - quiet
        await asyncio.sleep(0.01)
    raise TimeoutError("the controller did not settle")


def _writes(http: httpx.Client) -> int:
    by = http.get("/sandbox/stats").json()["writesByResource"]
    return sum(n for plural, n in by.items() if plural != "leases")


async def _edit(c: Controller, http: httpx.Client, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    before = _writes(http)
    done = c.writes_done
    updates = c.model.incremental_updates
    t = time.monotonic()
    r = http.patch(path, params={"fieldManager": "bench", "force": "true"}, json=body,
                   headers={"Content-Type": "application/apply-patch+yaml"})
    r.raise_for_status()
    while c.last_event < t:  # the edit has come back through the watch
        await asyncio.sleep(0.001)
    seen = time.monotonic() - t
    await _idle(c, timeout)
    return {"settle_s": round(time.monotonic() - t - 0.3, 3), "watch_latency_ms": round(1000 * seen, 1),
            "reprocess_ms": round(1000 * (c.model.last_update_seconds if c.model.incremental_updates > updates
                                          else c.model.last_reconcile_seconds), 1),
            "path": "incremental" if c.model.incremental_updates > updates else "full analysis",
            "writes": _writes(http) - before - 1,  # less the edit itself
            "controller_writes": c.writes_done - done}


async def _measure(routes: int, path: str, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = os.path.join(tmp, "kubeconfig")
        proc = subprocess.Popen([sys.executable, "-m", "gwpolicy.cli.main", "sandbox", "--port", "0", "--kubeconfig-out",
                                 kubeconfig, "--keep-creation-timestamp", "-f", path],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline()
            url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)  # type: ignore[union-attr]
            http = httpx.Client(base_url=url, timeout=120)
            http.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": "gwpolicy-system"}})
            c = Controller(Options(kubeconfig=kubeconfig, listen="127.0.0.1:0", lease_namespace="gwpolicy-system",
                                   breadcrumb_qps=0, debounce=0.01))
            writes0 = _writes(http)
            t = time.monotonic()
            await c.start()
            await _idle(c, timeout)
            first = time.monotonic() - t - 0.3
            out: dict[str, Any] = {"routes": routes, "first_status_s": round(first, 2),
                                   "initial_writes": _writes(http) - writes0,
                                   "full_analysis_s": round(c.model.last_reconcile_seconds, 2)}
            objs = {(o["kind"], o["metadata"]["name"]): o for o in cluster(routes)
                    if o["kind"] in ("RetryPolicy", "HTTPRoute")}
            pol = copy.deepcopy(next(o for (k, n), o in objs.items() if k == "RetryPolicy" and n.endswith("-retries")
                                     and n.startswith("route-")))
            pol["spec"]["defaults"]["maxRetries"] = 8
            ns = pol["metadata"]["namespace"]
            base = f"/apis/policy.example.io/v1/namespaces/{ns}/retrypolicies"
            out["policy_edit"] = await _edit(c, http, f"{base}/{pol['metadata']['name']}", pol, timeout)
            route = copy.deepcopy(objs[("HTTPRoute", "route-000001")])
            route["spec"]["hostnames"] = ["renamed.example.com"]
            rns = route["metadata"]["namespace"]
            out["route_edit"] = await _edit(c, http, f"/apis/gateway.networking.k8s.io/v1/namespaces/{rns}/httproutes/route-000001",
                                            route, timeout)
            nsp = next(o for o in cluster(routes) if o["kind"] == "RetryPolicy" and o["metadata"]["name"] == "namespace-retries")
            nsp = copy.deepcopy(nsp)
            nsp["spec"]["defaults"]["backoff"]["max"] = "2s"
            out["namespace_policy_edit"] = await _edit(
                c, http, f"/apis/policy.example.io/v1/namespaces/{nsp['metadata']['namespace']}/retrypolicies/namespace-retries",
                nsp, timeout)
            await c.stop()
            http.close()
            return out
        finally:
            proc.terminate()
            proc.wait(10)


def measure_controller(routes: int, workdir: str, timeout: float = 1800) -> dict[str, Any]:
    from gwpolicy.bench.generate import write_yaml

    path = os.path.join(workdir, f"cluster-{routes}.yaml")
    if not os.path.exists(path):
        write_yaml(routes, path)
    return asyncio.run(_measure(routes, path, timeout))
