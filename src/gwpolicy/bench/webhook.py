"""Admission latency of `gwpolicy webhook` on a synthetic cluster: the webhook's HTTPS server in this
process, its model built from the cluster's objects as informers would fill it, and a client sending
AdmissionReviews (an UPDATE of a policy, an UPDATE of an HTTPRoute) over loopback TLS, one at a time."""

from __future__ import annotations

import asyncio
import copy
import ssl
import statistics
import tempfile
import time
import uuid
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gwpolicy.bench.generate import cluster
from gwpolicy.controller.model import ClusterModel
from gwpolicy.status import DEFAULT_CONTROLLER
from gwpolicy.webhook import certs
from gwpolicy.webhook.review import Options
from gwpolicy.webhook.server import Reviewer, server_ssl


def _review(obj: dict[str, Any]) -> bytes:
    edited = copy.deepcopy(obj)
    edited["metadata"].setdefault("labels", {})["bench"] = "yes"
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": str(uuid.uuid4()), "operation": "UPDATE", "object": edited,
                                     "oldObject": obj, "namespace": obj["metadata"].get("namespace")}})


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


async def _measure(routes: int, reviews: int) -> dict[str, Any]:
    model = ClusterModel(DEFAULT_CONTROLLER)
    for o in cluster(routes):
        model.event("ADDED", o)
    t = time.perf_counter()
    model.reconcile()
    analysis_s = time.perf_counter() - t
    a = model.analysis
    assert a is not None
    objs = list(model.objects.values())
    route_policies = [o for o in objs if (o.get("spec") or {}).get("targetRefs") and
                      o["spec"]["targetRefs"][0].get("kind") == "HTTPRoute"][:reviews]
    routes_ = [o for o in objs if o.get("kind") == "HTTPRoute"][:reviews]
    reviewer = Reviewer(model, Options(), lambda: None)
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/validate", reviewer.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ca = certs.make_ca()
    with tempfile.TemporaryDirectory() as tmp:
        crt, key = certs.write_pair(tmp, "tls", certs.make_serving(ca, ["127.0.0.1"]))
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl(crt, key))
        await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client_ssl = ssl.create_default_context(cadata=ca.cert_pem.decode())
    out: dict[str, Any] = {"routes": routes, "objects": len(objs), "analysis_s": round(analysis_s, 2)}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl)) as session:
        for label, sample in (("policy", route_policies), ("route", routes_)):
            times = []
            for o in sample:
                body = _review(o)
                t = time.perf_counter()
                async with session.post(f"https://127.0.0.1:{port}/validate", data=body,
                                        headers={"Content-Type": "application/json"}) as resp:
                    answer = orjson.loads(await resp.read())
                times.append(time.perf_counter() - t)
                assert answer["response"]["allowed"] is True
            out[label] = {"reviews": len(times), "p50_ms": round(_pct(times, 0.5) * 1000, 2),
                          "p99_ms": round(_pct(times, 0.99) * 1000, 2),
                          "mean_ms": round(statistics.fmean(times) * 1000, 2)}
    await runner.cleanup()
    return out


def measure_webhook(routes: int, reviews: int = 300) -> dict[str, Any]:
    return asyncio.run(_measure(routes, reviews))


def webhook_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["Admission webhook (HTTPS on loopback, one review at a time):", "",
             "| routes | objects | policy review p50 / p99 | route review p50 / p99 | reviews each |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['routes']} | {r['objects']} | {r['policy']['p50_ms']} / {r['policy']['p99_ms']} ms | "
                     f"{r['route']['p50_ms']} / {r['route']['p99_ms']} ms | {r['policy']['reviews']} |")
    return lines
