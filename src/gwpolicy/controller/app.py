"""The controller: discovers kinds at run time, keeps informers, reconciles, writes status with as
few API calls as it can, and serves /healthz, /readyz, /metrics and /statusz."""

from __future__ import annotations

import asyncio
import logging
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx  # the HTTP client lightkube is built on
import orjson
from lightkube import ApiError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from gwpolicy.controller.effectivepolicies import EffectivePolicySync
from gwpolicy.controller.model import ClusterModel
from gwpolicy.engine.refs import Ref
from gwpolicy.engine.status import ANNOTATION, DEFAULT_CONTROLLER
from gwpolicy.kube import client as kube
from gwpolicy.kube import defaults
from gwpolicy.kube.client import Kind
from gwpolicy.kube.defaults import ProcessOptions
from gwpolicy.kube.loop import synced_bursts
from gwpolicy.kube.process import WatchingProcess
from gwpolicy.kube.writer import Job

log = logging.getLogger("gwpolicy.controller")

CRD, BUILTIN = kube.CRD, kube.BUILTIN


class Metrics:
    """Every metric says what it counts; `/metrics` serves them in the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter("gwpolicy_events", "Watch and list events received, by resource and event type",
                              ["resource", "type"], registry=r)
        self.passes = Counter("gwpolicy_reconcile_passes", "Passes of the reconcile loop; each takes every change "
                              "gathered since the previous pass (a full analysis, in-place updates, or only re-checks)",
                              registry=r)
        self.analyses = Counter("gwpolicy_full_analyses", "Full analyses of the cluster (start, leadership, and "
                                "changes that cannot be applied in place)", registry=r)
        self.incremental = Counter("gwpolicy_incremental_updates", "Changes to the cluster applied to the analysis in "
                                   "place, without a full analysis (inplace.apply.apply_change: policies, routes, "
                                   "Gateways, Services, Namespaces, ReferenceGrants, and EndpointSlices, Secrets and "
                                   "ConfigMaps, which it holds but does not read)", registry=r)
        self.reconcile_seconds = Histogram("gwpolicy_reconcile_pass_seconds", "Time a reconcile pass takes to bring "
                                           "the analysis up to date", registry=r)
        self.writes = Counter("gwpolicy_writes", "API calls that write status, our annotation or an EffectivePolicy "
                              "object, by what they write (status, annotation, effectivepolicy) and result (ok, or "
                              "the HTTP status code)", ["what", "result"], registry=r)
        self.queue_depth = Gauge("gwpolicy_queue_depth", "Objects waiting to be compared and written, by queue",
                                 ["queue"], registry=r)
        self.errors = Counter("gwpolicy_errors", "Errors, by where they happened (watch, write, reconcile, "
                              "no-status-subresource, no-status-in-its-schema)", ["where"], registry=r)
        self.leader = Gauge("gwpolicy_leader", "1 when this replica holds the lease (or runs without leader "
                            "election), else 0", registry=r)
        self.lease_errors = Counter("gwpolicy_leader_election_errors", "Failed attempts to take or renew the "
                                    "leader-election Lease, by reason (namespace-missing, forbidden, api, unreachable)",
                                    ["reason"], registry=r)
        self.informer_failures = Counter("gwpolicy_informer_failures", "Failed lists and watches, by resource and "
                                         "operation", ["resource", "operation"], registry=r)
        self.informer_stuck = Gauge("gwpolicy_informer_stuck", "1 while the informer of a resource cannot make "
                                    "progress (its list fails, or its watch keeps failing)", ["resource"], registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        self.peak_rss = Gauge("gwpolicy_peak_resident_memory_bytes", "The most resident memory this process has "
                              "held since it started (getrusage's ru_maxrss)", registry=r)
        unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        self.peak_rss.set_function(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit)
        self.full_analysis_seconds = Gauge("gwpolicy_last_full_analysis_seconds", "Wall time of the last full "
                                           "analysis", registry=r)
        self.full_analysis_cpu = Gauge("gwpolicy_last_full_analysis_cpu_seconds", "CPU time of the reconcile pass "
                                       "that ran the last full analysis", registry=r)
        self.update_seconds = Gauge("gwpolicy_last_incremental_update_seconds", "Wall time of the last change "
                                    "applied to the analysis in place", registry=r)

    def track(self, model: ClusterModel, controller: Controller) -> None:
        """Gauges read from the model and the controller when /metrics is scraped."""
        self.full_analysis_seconds.set_function(lambda: model.last_reconcile_seconds)
        self.update_seconds.set_function(lambda: model.last_update_seconds)
        self.full_analysis_cpu.set_function(lambda: controller.last_full_analysis_cpu)


@dataclass
class Options(ProcessOptions):
    """The controller's options: the shared ones (kube/defaults.py) and its own."""

    controller_name: str = DEFAULT_CONTROLLER
    namespace: str | None = None  # write only inside it (reads stay cluster-wide)
    field_manager: str = "gwpolicy"
    breadcrumb_qps: float = 50.0
    write_workers: int = 4
    debounce: float = 0.02
    effective_policy_objects: bool = False  # keep EffectivePolicy objects (controller/effectivepolicies.py)
    effective_policy_namespace: str | None = None  # where those of cluster-scoped objects go (default: the lease's)
    resync: float = 0.0  # seconds between full relists of every informer; 0: never


def unordered(status: dict[str, Any]) -> dict[str, Any]:
    """Status with its top-level lists as multisets: entries of several writers in another order are
    the same status, and must not make a write."""
    return {k: sorted(orjson.dumps(e, option=orjson.OPT_SORT_KEYS) for e in v) if isinstance(v, list) else v
            for k, v in status.items()}


class Controller(WatchingProcess):
    """The policy controller on the process shell (kube/process.py): what it watches, analyses,
    reports and writes."""

    command = "controller"  # its defaults (kube/defaults.py)
    listen_flag = "--listen"  # the option that sets `Options.listen` (error messages name it)
    # the XMesh once its CRD exists: with one of ours, policies on mesh paths are analysed, and
    # written, as `gwpolicy status` gives them (docs/mesh.md, "Status"); the webhook shares it
    reads_mesh = True

    def __init__(self, opts: Options) -> None:
        metrics = Metrics()
        super().__init__(opts, metrics)
        self.opts: Options = opts
        self.metrics: Metrics = metrics
        self.model = ClusterModel(opts.controller_name)
        self.last_full_analysis_cpu = 0.0  # CPU seconds of the pass that ran the last full analysis
        self.last_update_cpu = 0.0  # CPU seconds of the event that last changed the analysis in place
        self.metrics.track(self.model, self)
        self.high: dict[Ref, None] = {}  # policy status: first
        self.fresh: dict[Ref, None] = {}  # breadcrumbs a change since the last analysis caused: before the backlog
        self.low: dict[Ref, None] = {}  # breadcrumbs: after, rate-limited
        #: the write workers (kube/writer.py); `queue_event` tells them something is queued
        self.writers = self.status_writers(self._next_write, self._requeue, after=self._gauge)
        self.queue_event = self.writers.wake
        self.last_event = time.monotonic()
        self.writes_done = 0
        self.writing = self.writers.writing  # objects a writer holds
        self.next_breadcrumb = 0.0  # monotonic time the next paced write may start
        self.no_status_warned: set[tuple[str, str]] = set()
        self.effective: EffectivePolicySync | None = None
        self.skipped_outside: set[Ref] = set()
        self.paced_calls = 0  # breadcrumb API calls (each took a --breadcrumb-qps slot)
        self.counted = (0, 0)  # the model's full analyses and in-place updates the metrics have counted
        self.events_seen = 0  # events handed to on_event (lists and watches)

    # ---------- discovery ----------
    def informer_resync(self) -> float:
        # cluster-wide always: with --namespace the analysis still needs every Gateway, policy and
        # Namespace it can reach (only writes stay inside the namespace)
        return self.opts.resync

    async def _unwatch(self, group: str, kind_name: str) -> None:
        """The CRD of a kind is gone: stop its informer and forget its objects, so that the next
        analysis takes back what they caused (their breadcrumbs on routes, Gateways and Services)."""
        kind = self.kinds.pop((group, kind_name), None)
        inf = self.informers.pop(kind, None) if kind is not None else None
        if kind is None or inf is None:
            return
        await inf.stop()
        for raw in inf.tombstones():
            self.model.event("DELETED", raw)
        for queue in self.queues:
            for ref in [r for r in queue if (r.group, r.kind) == (group, kind_name)]:
                del queue[ref]
        log.info("stopped watching %s: its CustomResourceDefinition was deleted", kind.api_version + "/" + kind.plural)
        self.model.stale = True
        self.wake.set()

    async def on_event(self, etype: str, kind: Kind, raw: dict[str, Any]) -> None:
        self.last_event = time.monotonic()
        self.events_seen += 1
        if etype == "DELETED" and "spec" not in raw:  # a relist found it gone: its last copy says what it was
            raw = self.model.current(ClusterModel.ref_of(raw)) or raw
        updates, cpu = self.model.incremental_updates, time.process_time()
        self.model.event(etype, raw)
        if self.model.incremental_updates > updates:
            self.last_update_cpu = time.process_time() - cpu
        if kind == CRD:
            if etype == "DELETED":
                spec = raw.get("spec") or {}
                await self._unwatch(spec.get("group", ""), (spec.get("names") or {}).get("kind", ""))
            else:
                self.consider_crd(raw, self.model.objects)
        if (kind.group, kind.kind) == ("gwpolicy.io", "PolicyKind") and etype != "DELETED":
            for key, crd in list(self.model.objects.items()):
                if key[:2] == ("apiextensions.k8s.io", "CustomResourceDefinition"):
                    self.consider_crd(crd, self.model.objects)
        self.wake.set()

    # ---------- reconcile and write ----------
    async def reconcile_loop(self) -> None:
        async for _ in synced_bursts(self, self.opts.debounce, self.listed):  # busy while a pass runs
            t, cpu = time.perf_counter(), time.process_time()
            analyses = self.model.reconciles
            try:
                refs = self.model.reconcile()
            except Exception:  # noqa: BLE001 - a bad object must not stop the controller
                log.exception("reconcile failed")
                self.metrics.errors.labels("reconcile").inc()
                continue
            self.count_pass(t)
            full = self.model.reconciles > analyses
            if full:
                self.last_full_analysis_cpu = time.process_time() - cpu
            self._enqueue(refs, full)
            self._gauge()
            if self.effective is not None:
                self.effective.refresh()
            if refs:
                self.queue_event.set()

    def listed(self) -> bool:
        """Whether every informer has listed its kind (a pass waits for it)."""
        return all(i.synced.is_set() for i in self.informers.values())

    def count_pass(self, started: float) -> None:
        """A pass done, in the metrics: its time, and the model's full analyses and in-place updates
        since the previous pass (an update is applied as its event comes, between passes)."""
        self.metrics.passes.inc()
        analyses, updates = self.counted
        self.metrics.analyses.inc(self.model.reconciles - analyses)
        self.metrics.incremental.inc(self.model.incremental_updates - updates)
        self.counted = (self.model.reconciles, self.model.incremental_updates)
        self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    def _enqueue(self, refs: list[Ref], full: bool) -> None:
        """Queue what a pass found to compare: policies' status first, then breadcrumbs. What a change
        since the last analysis caused goes before an older backlog (the user who edited a route waits
        for its one write, not for the first status of everything), in a queue of its own: rebuilding
        the backlog behind it on every pass made the first status quadratic."""
        a = self.model.analysis
        crumbs = []
        for ref in refs:
            if a is not None and ref in a.policies:
                self.high[ref] = None
            else:
                crumbs.append(ref)
        if full or not self.low:
            self.low.update(dict.fromkeys(crumbs))
            return
        for ref in crumbs:
            self.low.pop(ref, None)
            self.fresh[ref] = None

    def _gauge(self) -> None:
        self.metrics.queue_depth.labels("status").set(len(self.high))
        self.metrics.queue_depth.labels("breadcrumbs").set(len(self.fresh) + len(self.low))

    @property
    def queues(self) -> tuple[dict[Ref, None], ...]:
        """Objects to compare and write, in the order they are taken: policy status, then breadcrumbs."""
        return self.high, self.fresh, self.low

    def _take(self) -> tuple[Ref | None, bool]:
        """The next object to write (policy status first) that no other writer holds; and whether it
        is a breadcrumb (paced)."""
        if not self.leading or self.model.stale:
            return None, False
        for queue in self.queues:
            for ref in queue:  # at most `write_workers` entries are skipped
                if ref not in self.writing:
                    del queue[ref]
                    return ref, queue is not self.high
        return None, False

    def _next_write(self) -> Job[Ref] | None:
        """The writers' next job (kube/writer.py): the next object and its write."""
        ref, paced = self._take()
        if ref is None:
            return None
        return ref, lambda: self.write(ref, paced)

    def _requeue(self, ref: Ref) -> None:
        """An object whose write raised: back in the backlog, to be written again later."""
        self.low[ref] = None

    @property
    def inflight(self) -> int:
        """Writes under way."""
        return self.writers.inflight

    async def _pace(self) -> None:
        """Wait for a slot of --breadcrumb-qps: one schedule shared by all writers. Only API calls wait:
        an object found right already (the echo of our own write, most of all) costs no slot."""
        self.paced_calls += 1
        if self.opts.breadcrumb_qps <= 0:
            return
        now = time.monotonic()
        wait, self.next_breadcrumb = self.next_breadcrumb - now, max(now, self.next_breadcrumb) + 1.0 / self.opts.breadcrumb_qps
        if wait > 0:
            await asyncio.sleep(wait)

    @property
    def idle(self) -> bool:
        """Nothing to analyse, queue or write (tests and the benchmark wait for this)."""
        synced = bool(self.informers) and all(i.synced.is_set() and not i.failures for i in self.informers.values())
        return (synced and not self.model.stale and not self.busy and not self.wake.is_set()
                and not any(self.queues) and self.inflight == 0)

    def writable(self, ref: Ref) -> bool:
        """With --namespace, only objects inside it are written; never a cluster-scoped one."""
        ns = self.opts.namespace
        return ns is None or ref.namespace == ns

    async def write(self, ref: Ref, paced: bool = False) -> None:
        """Bring one object's status and annotation to what they should be; 409 means read again and
        retry. What to write is computed first; a paced write waits for its slot only before an API call."""
        kind = self.kinds.get((ref.group, ref.kind))
        if kind is None or self.client is None:
            return
        for attempt in range(6):
            raw = self.model.current(ref)
            want = self.model.desired(ref)
            if raw is None or want is None:
                return
            status, annotations = want
            have_status = raw.get("status") or {}
            if not (kind.status_subresource and kind.status_schema) and status != have_status:
                # without a status subresource every status write bumps metadata.generation, so
                # observedGeneration could never catch up; without `status` in the schema the API
                # server prunes what we write: write nothing rather than loop
                why = "no status subresource" if not kind.status_subresource else "no status in its schema"
                if (kind.group, kind.kind) not in self.no_status_warned:
                    self.no_status_warned.add((kind.group, kind.kind))
                    log.warning("%s has %s in its CRD; gwpolicy writes no status to it", kind.kind, why)
                self.metrics.errors.labels(why.replace(" ", "-")).inc()
                status = have_status
            status_differs = status != have_status and unordered(status) != unordered(have_status)
            have = (raw["metadata"].get("annotations") or {}).get(ANNOTATION)
            want_ann = annotations.get(ANNOTATION)
            if not status_differs and have == want_ann:
                return
            if not self.writable(ref):
                if ref not in self.skipped_outside:
                    self.skipped_outside.add(ref)
                    log.info("not writing %s: outside --namespace %s", ref, self.opts.namespace)
                return
            what = "status"  # the call under way, for the metrics
            try:
                if status_differs:
                    if paced:
                        await self._pace()
                    out = await kube.patch_status(self.client, kind, ref.name, ref.namespace,
                                                  raw["metadata"]["resourceVersion"], have_status, status,
                                                  self.opts.field_manager)
                    self._written("status", out)
                    raw = self.model.current(ref) or raw
                    have = (raw["metadata"].get("annotations") or {}).get(ANNOTATION)
                if have != want_ann:
                    what = "annotation"
                    if paced:
                        await self._pace()
                    patch = {"metadata": {"annotations": {ANNOTATION: want_ann}}}
                    out = await kube.merge_patch(self.client, kind, ref.name, ref.namespace, patch,
                                                 self.opts.field_manager)
                    self._written("annotation", out)
                return
            except ApiError as exc:
                code = exc.status.code
                self.metrics.writes.labels(what, str(code)).inc()
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

    # ---------- health ----------
    def not_ready(self) -> list[str]:
        """Why the controller is not ready, one line per reason; empty when it is."""
        why = []
        if not self.informers:
            why.append("no informers yet")
        for k, i in sorted(self.informers.items(), key=lambda kv: kv[0].plural):
            name = f"{k.plural}.{k.group}" if k.group else k.plural
            if i.error is not None:
                why.append(f"{name}: {i.error}")
            elif not i.synced.is_set():
                why.append(f"{name}: not listed yet")
        return why + self.election_problem()

    def status(self) -> dict[str, Any]:
        """/statusz besides the leader election."""
        return {
            "ready": not self.not_ready(), "notReady": self.not_ready(),
            "writeNamespace": self.opts.namespace, "stale": self.model.stale,
            "busy": self.busy or self.wake.is_set() or self.inflight > 0,
            "queued": sum(map(len, self.queues)), "writes": self.writes_done,
            "idle": self.idle,
            "fullAnalyses": self.model.reconciles, "lastFullAnalysisSeconds": self.model.last_reconcile_seconds,
            "lastFullAnalysisCpuSeconds": self.last_full_analysis_cpu,
            "incrementalUpdates": self.model.incremental_updates,
            "lastUpdateSeconds": self.model.last_update_seconds, "lastUpdateCpuSeconds": self.last_update_cpu,
            "sinceLastEvent": time.monotonic() - self.last_event, "events": self.events_seen,
            "breadcrumbCalls": self.paced_calls,
            "synced": self.listed(),
            "informers": {f"{k.group}/{k.plural}": {"synced": i.synced.is_set(), "error": i.error,
                                                    "relists": i.relists, "reconnects": i.reconnects,
                                                    "resets": i.resets, "resourceVersion": i.rv}
                          for k, i in self.informers.items()}}

    # ---------- lifecycle (the order is the shell's) ----------
    async def started(self) -> None:
        """The reconcile loop, the EffectivePolicy objects when asked for, the status writers."""
        assert self.client is not None
        self.tasks.append(asyncio.create_task(self.reconcile_loop(), name="reconcile"))
        if self.opts.effective_policy_objects:
            home = self.opts.effective_policy_namespace or defaults.lease_namespace(self.opts.lease_namespace,
                                                                                     self.client.namespace)
            self.effective = EffectivePolicySync(self, home)
            self.effective.start()
        self.tasks += self.writers.start(self.opts.write_workers)  # writes are bound by the API server's latency

    def lease_error(self, reason: str) -> None:
        self.metrics.lease_errors.labels(reason).inc()

    def leader_changed(self, leader: bool) -> None:
        if leader:  # check everything once: the previous leader may have left work undone
            self.model.stale = True
            self.wake.set()

    async def stopping(self) -> None:
        """The EffectivePolicy objects' sync ends while this replica still holds the Lease."""
        if self.effective is not None:
            await self.effective.stop()
