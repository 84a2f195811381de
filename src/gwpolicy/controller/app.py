"""The controller: discovers kinds at run time, keeps informers, reconciles, writes status with as
few API calls as it can, and serves /healthz, /readyz, /metrics and /statusz."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx  # the HTTP client lightkube is built on
from aiohttp import web
from lightkube import ApiError, AsyncClient
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gwpolicy.controller import kube
from gwpolicy.controller.effectivepolicies import EffectivePolicySync
from gwpolicy.controller.informer import Informer
from gwpolicy.controller.kube import Kind
from gwpolicy.controller.leader import LeaderElector
from gwpolicy.controller.model import ClusterModel
from gwpolicy.refs import Ref
from gwpolicy.status import ANNOTATION, DEFAULT_CONTROLLER

log = logging.getLogger("gwpolicy.controller")

CRD, BUILTIN = kube.CRD, kube.BUILTIN


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter("gwpolicy_events", "Watch events received", ["resource", "type"], registry=r)
        self.reconciles = Counter("gwpolicy_reconciles", "Analyses of the cluster", registry=r)
        self.reconcile_seconds = Histogram("gwpolicy_reconcile_seconds", "Time to bring the analysis up to date", registry=r)
        self.writes = Counter("gwpolicy_writes", "Writes to the API server", ["what", "result"], registry=r)
        self.queue_depth = Gauge("gwpolicy_queue_depth", "Objects waiting to be checked and written", ["queue"], registry=r)
        self.errors = Counter("gwpolicy_errors", "Errors", ["where"], registry=r)
        self.leader = Gauge("gwpolicy_leader", "1 when this replica holds the lease", registry=r)


@dataclass
class Options:
    kubeconfig: str | None = None
    context: str | None = None
    controller_name: str = DEFAULT_CONTROLLER
    namespace: str | None = None
    field_manager: str = "gwpolicy"
    listen: str = "0.0.0.0:8080"
    lease_namespace: str = os.environ.get("POD_NAMESPACE", "gwpolicy-system")
    lease_duration: float = 15.0
    identity: str = f"{socket.gethostname()}-{os.getpid()}"
    leader_election: bool = True
    breadcrumb_qps: float = 50.0
    write_workers: int = 4
    debounce: float = 0.02
    effective_policy_objects: bool = False  # keep EffectivePolicy objects (controller/effectivepolicies.py)
    effective_policy_namespace: str | None = None  # where those of cluster-scoped objects go (default: the lease's)


class Controller:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.metrics = Metrics()
        self.model = ClusterModel(opts.controller_name)
        self.client: AsyncClient | None = None
        self.informers: dict[Kind, Informer] = {}
        self.kinds: dict[tuple[str, str], Kind] = {}
        self.wake = asyncio.Event()
        self.high: dict[Ref, None] = {}  # policy status: first
        self.low: dict[Ref, None] = {}  # breadcrumbs: after, rate-limited
        self.queue_event = asyncio.Event()
        self.elector: LeaderElector | None = None
        self.tasks: list[asyncio.Task] = []
        self.last_event = time.monotonic()
        self.writes_done = 0
        self.runner: web.AppRunner | None = None
        self.port: int | None = None
        self.busy = False
        self.inflight = 0  # writes under way
        self.writing: set[Ref] = set()  # objects a writer holds
        self.next_breadcrumb = 0.0  # monotonic time the next paced write may start
        self.no_status_warned: set[tuple[str, str]] = set()
        self.effective: EffectivePolicySync | None = None

    # ---------- discovery ----------
    def _watch(self, kind: Kind) -> None:
        if kind in self.informers or self.client is None:
            return
        self.kinds[(kind.group, kind.kind)] = kind
        inf = Informer(self.client, kind, self.on_event, self.opts.namespace, self.metrics)
        self.informers[kind] = inf
        inf.start()
        log.info("watching %s", kind.api_version + "/" + kind.plural)

    def _consider_crd(self, crd: dict[str, Any]) -> None:
        named = {((pk.get("spec") or {}).get("group", ""), (pk.get("spec") or {}).get("kind", ""))
                 for key, pk in self.model.objects.items() if key[:2] == ("gwpolicy.io", "PolicyKind")}
        kind = kube.kind_of_crd(crd, named)
        if kind is not None:
            self._watch(kind)

    async def on_event(self, etype: str, kind: Kind, raw: dict[str, Any]) -> None:
        self.last_event = time.monotonic()
        self.model.event(etype, raw)
        if kind == CRD and etype != "DELETED":
            self._consider_crd(raw)
        if (kind.group, kind.kind) == ("gwpolicy.io", "PolicyKind") and etype != "DELETED":
            for key, crd in list(self.model.objects.items()):
                if key[:2] == ("apiextensions.k8s.io", "CustomResourceDefinition"):
                    self._consider_crd(crd)
        self.wake.set()

    # ---------- reconcile and write ----------
    async def reconcile_loop(self) -> None:
        while True:
            await self.wake.wait()
            await asyncio.sleep(self.opts.debounce)  # gather a burst of events into one analysis
            self.wake.clear()
            if not all(i.synced.is_set() for i in self.informers.values()):
                await asyncio.sleep(0.05)
                self.wake.set()
                continue
            self.busy = True
            t = time.perf_counter()
            try:
                refs = self.model.reconcile()
            except Exception:  # noqa: BLE001 - a bad object must not stop the controller
                log.exception("reconcile failed")
                self.metrics.errors.labels("reconcile").inc()
                self.busy = False
                continue
            self.metrics.reconciles.inc()
            self.metrics.reconcile_seconds.observe(time.perf_counter() - t)
            a = self.model.analysis
            for ref in refs:
                (self.high if a is not None and ref in a.policies else self.low)[ref] = None
            self._gauge()
            if self.effective is not None:
                self.effective.refresh()
            self.busy = False
            if refs:
                self.queue_event.set()

    def _gauge(self) -> None:
        self.metrics.queue_depth.labels("status").set(len(self.high))
        self.metrics.queue_depth.labels("breadcrumbs").set(len(self.low))

    def _take(self) -> tuple[Ref | None, bool]:
        """The next object to write (policy status first) that no other writer holds; and whether it
        is a breadcrumb (paced)."""
        if not self.leading or self.model.stale:
            return None, False
        for queue in (self.high, self.low):
            for ref in queue:  # at most `write_workers` entries are skipped
                if ref not in self.writing:
                    del queue[ref]
                    return ref, queue is self.low
        return None, False

    async def write_loop(self) -> None:
        """One of `write_workers` writers. Writes are bound by the API server's latency, not by us: a
        few in flight keep it busy. Breadcrumbs are paced together to --breadcrumb-qps."""
        interval = 1.0 / self.opts.breadcrumb_qps if self.opts.breadcrumb_qps > 0 else 0.0
        while True:
            ref, paced = self._take()
            if ref is None:
                self.queue_event.clear()
                try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation (stop() hangs)
                    async with asyncio.timeout(0.2):
                        await self.queue_event.wait()
                except TimeoutError:
                    pass
                continue
            self.writing.add(ref)
            self.inflight += 1
            try:
                if paced and interval:
                    now = time.monotonic()
                    wait, self.next_breadcrumb = self.next_breadcrumb - now, max(now, self.next_breadcrumb) + interval
                    if wait > 0:
                        await asyncio.sleep(wait)
                await self.write(ref)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the writer must outlive any one object's trouble
                log.exception("writing %s failed; it stays queued", ref)
                self.metrics.errors.labels("write").inc()
                self.low[ref] = None
                await asyncio.sleep(0.2)
            finally:
                self.writing.discard(ref)
                self.inflight -= 1
            self._gauge()

    @property
    def idle(self) -> bool:
        """Nothing to analyse, queue or write (tests and the benchmark wait for this)."""
        synced = bool(self.informers) and all(i.synced.is_set() for i in self.informers.values())
        return (synced and not self.model.stale and not self.busy and not self.wake.is_set()
                and not (self.high or self.low) and self.inflight == 0)

    @property
    def leading(self) -> bool:
        return not self.opts.leader_election or (self.elector is not None and self.elector.is_leader)

    async def write(self, ref: Ref) -> None:
        """Bring one object's status and annotation to what they should be; 409 means read again and retry."""
        kind = self.kinds.get((ref.group, ref.kind))
        if kind is None or self.client is None:
            return
        for attempt in range(6):
            raw = self.model.current(ref)
            want = self.model.desired(ref)
            if raw is None or want is None:
                return
            status, annotations = want
            if not kind.status_subresource and status != (raw.get("status") or {}):
                # without a status subresource every status write bumps metadata.generation, so
                # observedGeneration could never catch up: write nothing rather than loop
                if (kind.group, kind.kind) not in self.no_status_warned:
                    self.no_status_warned.add((kind.group, kind.kind))
                    log.warning("%s has no status subresource in its CRD; gwpolicy writes no status to it", kind.kind)
                self.metrics.errors.labels("no-status-subresource").inc()
                status = raw.get("status") or {}
            try:
                if status != (raw.get("status") or {}):
                    body = {"apiVersion": raw["apiVersion"], "kind": raw["kind"],
                            "metadata": {"name": ref.name, "resourceVersion": raw["metadata"]["resourceVersion"]},
                            "status": status}
                    if ref.namespace:
                        body["metadata"]["namespace"] = ref.namespace
                    out = await kube.apply_status(self.client, kind, body, self.opts.field_manager)
                    self._written("status", out)
                    raw = self.model.current(ref) or raw
                have = (raw["metadata"].get("annotations") or {}).get(ANNOTATION)
                want_ann = annotations.get(ANNOTATION)
                if have != want_ann:
                    patch = {"metadata": {"annotations": {ANNOTATION: want_ann}}}
                    res = kube.resource_class(kind)
                    out = kube.to_dict(await self.client.patch(res, ref.name, patch, namespace=ref.namespace,
                                                               patch_type=kube.PatchType.MERGE,
                                                               field_manager=self.opts.field_manager))
                    self._written("annotation", out)
                return
            except ApiError as exc:
                code = exc.status.code
                self.metrics.writes.labels("status", str(code)).inc()
                if code == 404:
                    self.metrics.errors.labels("write").inc()
                    log.warning("cannot write %s: %s", ref, exc.status.message)
                    return
                if code == 409:  # someone wrote in between: read it again and recompute
                    try:
                        fresh = await kube.get_object(self.client, kind, ref.name, ref.namespace)
                    except ApiError:
                        return
                    except (httpx.HTTPError, OSError):  # the server went away: try again shortly
                        await asyncio.sleep(min(0.1 * 2 ** attempt, 2.0))
                        continue
                    self.model.event("MODIFIED", fresh)
                    continue
                self.metrics.errors.labels("write").inc()
            except (httpx.HTTPError, OSError):
                self.metrics.errors.labels("write").inc()
            await asyncio.sleep(min(0.1 * 2 ** attempt, 2.0))
        log.warning("gave up writing %s for now; it stays queued", ref)
        self.low[ref] = None

    def _written(self, what: str, out: dict[str, Any]) -> None:
        self.writes_done += 1
        self.metrics.writes.labels(what, "ok").inc()
        self.model.event("MODIFIED", out)  # our own write: only a comparison, never a new analysis

    # ---------- HTTP ----------
    async def http(self) -> None:
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            ok = bool(self.informers) and all(i.synced.is_set() for i in self.informers.values())
            return web.Response(text="ok" if ok else "informers not synced", status=200 if ok else 503)

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

        async def statusz(_: web.Request) -> web.Response:
            return web.json_response({
                "leader": self.leading, "stale": self.model.stale,
                "busy": self.busy or self.wake.is_set() or self.inflight > 0,
                "queued": len(self.high) + len(self.low), "writes": self.writes_done,
                "reconciles": self.model.reconciles, "lastReconcileSeconds": self.model.last_reconcile_seconds,
                "incrementalUpdates": self.model.incremental_updates,
                "lastUpdateSeconds": self.model.last_update_seconds,
                "sinceLastEvent": time.monotonic() - self.last_event,
                "synced": all(i.synced.is_set() for i in self.informers.values()),
                "informers": {f"{k.group}/{k.plural}": {"relists": i.relists, "reconnects": i.reconnects}
                              for k, i in self.informers.items()}})

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/statusz", statusz)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        host, _, port = self.opts.listen.rpartition(":")
        site = web.TCPSite(self.runner, host or "0.0.0.0", int(port))
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    # ---------- lifecycle ----------
    async def start(self) -> None:
        self.client = kube.make_client(self.opts.kubeconfig, self.opts.context, self.opts.field_manager)
        await self.http()
        for k in [CRD, *BUILTIN]:
            self._watch(k)
        self.tasks.append(asyncio.create_task(self.reconcile_loop(), name="reconcile"))
        if self.opts.effective_policy_objects:
            self.effective = EffectivePolicySync(self, self.opts.effective_policy_namespace or self.opts.lease_namespace)
            self.effective.start()
        for i in range(max(1, self.opts.write_workers)):
            self.tasks.append(asyncio.create_task(self.write_loop(), name=f"write-{i}"))
        if self.opts.leader_election:
            self.elector = LeaderElector(self.client, self.opts.identity, self.opts.lease_namespace,
                                         duration=self.opts.lease_duration, on_change=self._leader_changed)
            self.tasks.append(asyncio.create_task(self.elector.run(), name="leader"))
        else:
            self.metrics.leader.set(1)

    def _leader_changed(self, leader: bool) -> None:
        self.metrics.leader.set(1 if leader else 0)
        if leader:  # check everything once: the previous leader may have left work undone
            self.model.stale = True
            self.wake.set()

    async def stop(self) -> None:
        if self.elector:
            await self.elector.release()
        if self.effective is not None:
            await self.effective.stop()
        for t in self.tasks:
            t.cancel()
        for i in list(self.informers.values()):
            await i.stop()
        for t in self.tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self.runner:
            await self.runner.cleanup()
        if self.client:
            await self.client.close()
