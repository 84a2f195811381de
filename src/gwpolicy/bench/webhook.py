"""Admission latency of `gwpolicy webhook` on a synthetic cluster: the webhook's HTTPS server in this
process, its model built from the cluster's objects as informers would fill it, and a client sending
AdmissionReviews (an UPDATE of a policy, an HTTPRoute, a Service, a Namespace: a label added) over
loopback TLS, one at a time. Each kind is applied in place (`inplace.apply.apply_change`); the count of
full analyses the reviews ran on a copy says when one was not."""

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
from gwpolicy.engine.status import DEFAULT_CONTROLLER
from gwpolicy.kube import certs
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
    samples = {"policy": route_policies,
               **{label: [o for o in objs if o.get("kind") == kind][:reviews]
                  for label, kind in (("route", "HTTPRoute"), ("service", "Service"), ("namespace", "Namespace"))}}
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
    copies = _FullAnalyses()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl)) as http:
            for label, sample in samples.items():
                times = []
                before = copies.count
                for o in sample:
                    body = _review(o)
                    t = time.perf_counter()
                    async with http.post(f"https://127.0.0.1:{port}/validate", data=body,
                                            headers={"Content-Type": "application/json"}) as resp:
                        answer = orjson.loads(await resp.read())
                    times.append(time.perf_counter() - t)
                    assert answer["response"]["allowed"] is True
                out[label] = {"reviews": len(times), "p50_ms": round(_pct(times, 0.5) * 1000, 2),
                              "p99_ms": round(_pct(times, 0.99) * 1000, 2),
                              "mean_ms": round(statistics.fmean(times) * 1000, 2), "full_analyses": copies.count - before}
    finally:
        copies.restore()
    await runner.cleanup()
    out["stale"] = model.stale  # a review that left the analysis half-changed
    return out


class _FullAnalyses:
    """Counts the whole analyses reviews run on a copy of the objects (`review.analyse`) until `restore`."""

    def __init__(self) -> None:
        from gwpolicy.webhook import review

        self.count = 0
        self._review, self._analyse = review, review.analyse
        review.analyse = self._counted

    def _counted(self, *args: Any, **kw: Any) -> Any:
        self.count += 1
        return self._analyse(*args, **kw)

    def restore(self) -> None:
        self._review.analyse = self._analyse


def measure_webhook(routes: int, reviews: int = 300) -> dict[str, Any]:
    return asyncio.run(_measure(routes, reviews))


def webhook_table(rows: list[dict[str, Any]]) -> list[str]:
    kinds = [k for k in ("policy", "route", "service", "namespace") if k in rows[0]]
    lines = ["Admission webhook (HTTPS on loopback, one review at a time; a label added to each object):", "",
             "| routes | objects | " + " | ".join(f"{k} review p50 / p99 (full analyses)" for k in kinds) + " |",
             "|---|---|" + "---|" * len(kinds)]
    for r in rows:
        cells = [f"{r[k]['p50_ms']} / {r[k]['p99_ms']} ms ({r[k]['full_analyses']} of {r[k]['reviews']})" for k in kinds]
        lines.append(f"| {r['routes']} | {r['objects']} | " + " | ".join(cells) + " |")
    return lines
