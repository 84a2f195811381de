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


async def _edit_during_backlog(c: Controller, http: httpx.Client, route: dict[str, Any], after: float) -> float:
    """Edit a route `after` seconds into the first status; seconds until its new generation is in its status."""
    await asyncio.sleep(after)
    ns, name = route["metadata"]["namespace"], route["metadata"]["name"]
    url = f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/{name}"
    route = copy.deepcopy(route)
    route["spec"]["hostnames"] = ["during-backlog.example.com"]
    t = time.monotonic()
    r = http.patch(url, params={"fieldManager": "bench", "force": "true"}, json=route,
                   headers={"Content-Type": "application/apply-patch+yaml"})
    r.raise_for_status()
    generation = r.json()["metadata"]["generation"]
    while True:
        live = await asyncio.to_thread(http.get, url)
        conds = [cd for p in (live.json().get("status") or {}).get("parents") or [] for cd in p.get("conditions") or []
                 if cd.get("type", "").startswith("gwpolicy.io/")]
        if conds and all(cd.get("observedGeneration") == generation for cd in conds):
            return time.monotonic() - t
        await asyncio.sleep(0.05)


async def _measure(routes: int, path: str, timeout: float, breadcrumb_qps: float = 0.0) -> dict[str, Any]:
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
                                   breadcrumb_qps=breadcrumb_qps, debounce=0.01))
            objs = {(o["kind"], o["metadata"]["name"]): o for o in cluster(routes)
                    if o["kind"] in ("RetryPolicy", "HTTPRoute")}
            writes0 = _writes(http)
            t = time.monotonic()
            await c.start()
            backlog = None
            if breadcrumb_qps > 0:  # a route edit a few seconds into the first status, while breadcrumbs queue
                backlog = asyncio.create_task(_edit_during_backlog(c, http, objs[("HTTPRoute", "route-000001")], 5.0))
            await _idle(c, timeout)
            first = time.monotonic() - t - 0.3
            out: dict[str, Any] = {"routes": routes, "first_status_s": round(first, 2),
                                   "initial_writes": _writes(http) - writes0,
                                   "full_analysis_s": round(c.model.last_reconcile_seconds, 2)}
            if backlog is not None:
                out["breadcrumb_qps"] = breadcrumb_qps
                out["breadcrumb_calls"] = c.paced_calls
                out["breadcrumb_budget_s"] = round(c.paced_calls / breadcrumb_qps, 2)
                out["route_edit_during_backlog_s"] = round(await backlog, 2)
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


def measure_controller(routes: int, workdir: str, timeout: float = 1800, breadcrumb_qps: float = 0.0) -> dict[str, Any]:
    """With `breadcrumb_qps` > 0, also the breadcrumb API calls, the time they need at that rate
    (`breadcrumb_budget_s`: the least a first complete status can take), and how long a route edit made
    5 s into the first status waits for its status."""
    from gwpolicy.bench.generate import write_yaml

    path = os.path.join(workdir, f"cluster-{routes}.yaml")
    if not os.path.exists(path):
        write_yaml(routes, path)
    return asyncio.run(_measure(routes, path, timeout, breadcrumb_qps))
