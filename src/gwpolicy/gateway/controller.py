"""`gwpolicy gateway`: the controller of the GatewayClasses whose controllerName is ours.

It watches what the data plane is built from (GatewayClass, Gateway, HTTPRoute, ReferenceGrant,
BackendTLSPolicy, Service, EndpointSlice, Secret, ConfigMap, Namespace and the policy kinds found
through their CRDs), and on a change (debounced: a burst of events is one analysis) analyses the
objects with the engine, builds the data plane model, renders it, has NGINX validate and load it
(gateway/driver.py, nginx.py), and writes GEP-1364 status: only what differs from what the object
carries, only for objects of our GatewayClasses, and in `status.parents` only our own entries.

Every replica runs NGINX with the configuration it renders from its own informers; only the holder
of the Lease writes status, and counts an object Programmed once every ready replica serves it
(gateway/replicas.py). NGINX outlives the gateway process (gateway/nginx.py): after a crash, a
SIGKILL or a restart the next process on the same --state-dir adopts it. SIGTERM and SIGINT stop
NGINX too (gracefully); SIGUSR2 ends the gateway and leaves NGINX serving, for the next process.
With --nginx-sidecar, NGINX runs in a container of its own (`gwpolicy nginx-sidecar`,
gateway/sidecar.py) and its life is that container's: the gateway reloads it but never stops it.
The API client, informers, Lease, endpoints and start and stop order are the process shell's
(kube/process.py); the options and flags are gateway/options.py's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2 as httpx  # the HTTP client lightkube is built on
from lightkube import ApiError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gwpolicy.engine.analysis import utc_now
from gwpolicy.engine.model import Obj
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway import nginxproxy, observability
from gwpolicy.gateway.driver import (
    DataPlaneDriver,
    Renderer,
    address_order,
    cannot_listen,
    own_endpoints,
    pod_addresses,
    port_free,
    spec_addresses,
)
from gwpolicy.gateway.facts import ROUTE_KINDS
from gwpolicy.gateway.objects import essence, with_defaults
from gwpolicy.gateway.options import GatewayOptions, parse
from gwpolicy.gateway.policystatus import (
    enforced_here,
    enforced_policy_kinds,
    kind_checks,
    policy_ancestors_of,
    policy_statuses,
)
from gwpolicy.gateway.replicas import Publisher, Replicas
from gwpolicy.gateway.state import GatewayState, key_ref, object_key
from gwpolicy.gateway.status import (
    POLICY_KINDS_ANNOTATION,
    Programming,
    desired_status,
    policy_kinds_annotation,
    stale_routes,
    without_our_entries,
)
from gwpolicy.kube import client as kube
from gwpolicy.kube import defaults, serve
from gwpolicy.kube.client import Kind
from gwpolicy.kube.endpoints import ListenError
from gwpolicy.kube.informer import Informer
from gwpolicy.kube.leader import LEASE
from gwpolicy.kube.loop import synced_bursts
from gwpolicy.kube.process import WatchingProcess
from gwpolicy.kube.writer import Job, desired_of, take_first

__all__ = ["BUILTIN", "DataPlaneDriver", "GatewayController", "GatewayOptions", "Metrics", "Renderer",
           "enforced_here", "main", "parse", "policy_ancestors_of", "spec_addresses", "with_defaults"]

log = logging.getLogger("gwpolicy.gateway")

BUILTIN = [
    Kind("", "v1", "Namespace", "namespaces", False),
    Kind("", "v1", "Service", "services", True),
    Kind("", "v1", "Secret", "secrets", True, False),
    Kind("", "v1", "ConfigMap", "configmaps", True, False),
    Kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True, False),
]


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.events = Counter("gwpolicy_gateway_events", "Watch and list events received, by resource and event type",
                              ["resource", "type"], registry=r)
        self.reconciles = Counter("gwpolicy_gateway_reconciles", "Passes of the reconcile loop; each takes every "
                                  "change gathered since the previous pass, brings the analysis up to date, builds "
                                  "and applies the configuration and queues status", registry=r)
        self.analyses = Counter("gwpolicy_gateway_full_analyses", "Full analyses of the cluster (start, and changes "
                                "that cannot be applied in place)", registry=r)
        self.incremental = Counter("gwpolicy_gateway_incremental_updates", "Changes to the cluster applied to the "
                                   "analysis in place, without a full analysis (inplace.apply.apply_change)", registry=r)
        self.reconcile_seconds = Histogram("gwpolicy_gateway_reconcile_seconds", "Time a reconcile pass takes: the "
                                           "analysis brought up to date, the configuration built, rendered and "
                                           "applied, status computed", registry=r)
        self.reloads = Counter("gwpolicy_gateway_nginx_reloads", "New configurations given to NGINX, by result (ok: "
                               "it serves them; failed: the previous one keeps serving)", ["result"], registry=r)
        self.reload_seconds = Histogram("gwpolicy_gateway_nginx_reload_seconds", "Time NGINX takes to check, load "
                                        "and verify a new configuration", registry=r)
        self.writes = Counter("gwpolicy_gateway_writes", "API calls that write status or the policy-kinds annotation, "
                              "by result (ok, or the HTTP status code)", ["result"], registry=r)
        self.errors = Counter("gwpolicy_gateway_errors", "Errors, by where they happened (watch, reconcile, render, "
                              "write)", ["where"], registry=r)
        self.leader = Gauge("gwpolicy_gateway_leader", "1 when this replica holds the lease (or runs without leader "
                            "election), else 0", registry=r)
        self.queue_depth = Gauge("gwpolicy_gateway_queue_depth", "Objects waiting for a status or annotation write",
                                 registry=r)
        self.informer_failures = Counter("gwpolicy_gateway_informer_failures", "Failed lists and watches, by resource "
                                         "and operation", ["resource", "operation"], registry=r)
        self.informer_stuck = Gauge("gwpolicy_gateway_informer_stuck", "1 while the informer of a resource cannot "
                                    "make progress (its list fails, or its watch keeps failing)", ["resource"], registry=r)


class Steps:
    """Seconds per step of one reconcile (CPU and wall), for /statusz and the benchmark."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self._t = time.perf_counter()
        self._c = time.process_time()

    def lap(self, name: str) -> None:
        t, c = time.perf_counter(), time.process_time()
        self.steps[name] = round(t - self._t, 4)
        self.steps[name + " cpu"] = round(c - self._c, 4)
        self._t, self._c = t, c



class GatewayController(WatchingProcess):
    """The gateway on the process shell (kube/process.py): what it watches, reconciles, serves and writes."""

    command = "gateway"
    lease_name = "gwpolicy-gateway"
    lease_rbac = "deploy/70-gateway.yaml, Role gwpolicy-gateway-leader-election"
    builtin = BUILTIN

    def __init__(self, opts: GatewayOptions, driver: Any = None) -> None:
        metrics = Metrics()
        super().__init__(opts, metrics)
        self.opts: GatewayOptions = opts
        self.metrics: Metrics = metrics
        self.driver = driver
        if getattr(driver, "relay", None) is not None:
            from gwpolicy.gateway.spanrelay import Collector

            metrics.registry.register(Collector(driver.relay))
        #: GatewayState.dataplane_version of what NGINX serves (None: build on the next reconcile)
        self.programmed_version: int | None = None
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.queue: dict[Ref, None] = {}
        self.queue_event = asyncio.Event()
        self.wanted: dict[Ref, Any] = {}  # object -> (its newest copy -> the status it should carry)
        self.annotations: dict[Ref, str] = {}  # GatewayClass -> the policy kinds annotation it should carry
        self.running: dict[Ref, int | None] = {}  # objects (and generations) in the configuration NGINX runs
        self.error: str | None = None
        self.addresses: dict[Ref, list[str]] = {}
        self.listener_facts: dict[Ref, tuple[bool, str, str]] = {}
        self.reconciles = 0
        self.nginx_running = False
        self.retry_in = 1.0  # seconds until a failed apply is tried again
        self.writing: set[Ref] = set()  # objects a write worker holds
        self.nginx_thread = ThreadPoolExecutor(1, thread_name_prefix="nginx")
        #: the analysis and facts, kept up to date in place (gateway/state.py)
        self.state = GatewayState(self.objects, opts.controller_name, kind_checks(), any_address=opts.pod_addresses)
        self.policy_wanted: dict[Ref, Any] = {}  # the policies' part of `wanted`
        self.recheck_all = True  # the next reconcile compares every object of ours, changed or not
        self.last_reconcile: dict[str, float] = {}  # seconds per step of the last reconcile (/statusz, the bench)
        self.warned: set[str] = set()  # the data plane's warnings already logged
        #: routes and listeners NGINX refused, left out of the configuration: ref -> (reason, message)
        self.left_out: dict[Ref, tuple[str, str]] = {}
        #: the units of the configuration NGINX last took (isolate.fingerprints): what changed since is suspect first
        self.good_units: dict[Ref, tuple[Any, ...]] = {}
        self.tried_again: list[Ref] = []  # units left out before, in the configuration again
        self.routes_left_out: dict[Ref, tuple[str, str]] = {}  # what status was last told (Programming.left_out)
        self.over_budget: dict[Ref, tuple[str, str]] = {}  # HTTPRoutes over their namespace's budget (the last build)
        self.replicas: Replicas | None = None  # the leader's view of what every replica serves
        self.publisher: Publisher | None = None  # this replica's Lease, with what its NGINX serves
        self.replica_informer: Informer | None = None
        self.leave_nginx = False  # SIGUSR2: stop without stopping NGINX

    # ---------- watching ----------
    def consider_crd(self, crd: dict[str, Any], objects: dict[tuple[str, str, str, str], dict[str, Any]]) -> None:
        """Policy kinds as every process watches them, and NginxProxy, which GatewayClasses and
        Gateways name as their parameters (gateway/nginxproxy.py), once its CRD is there."""
        super().consider_crd(crd, objects)
        spec = crd.get("spec") or {}
        if (spec.get("group"), (spec.get("names") or {}).get("kind")) == (nginxproxy.GROUP, nginxproxy.KIND):
            versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
            if versions:
                storage = next((v for v in versions if v.get("storage")), versions[0])
                self.watch(Kind(nginxproxy.GROUP, storage["name"], nginxproxy.KIND, "nginxproxies", True, False))

    async def on_event(self, etype: str, kind: Kind, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)
        key = object_key(raw)
        old = self.objects.get(key)
        if etype == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = with_defaults(raw)
        # one comparison for both uses below (_essence copies the metadata and the top level)
        changed = etype == "DELETED" or old is None or essence(old) != essence(self.objects[key])
        if changed and (etype != "DELETED" or old is not None):
            self.state.changed(old, self.objects.get(key))
        if kind == kube.CRD and etype != "DELETED":
            self.consider_crd(raw, self.objects)
        if (kind.group, kind.kind) == ("gwpolicy.io", "PolicyKind") and etype != "DELETED":
            for k, crd in list(self.objects.items()):
                if k[:2] == ("apiextensions.k8s.io", "CustomResourceDefinition"):
                    self.consider_crd(crd, self.objects)
        if changed:
            self.wake.set()
        else:  # only status or bookkeeping changed (the echo of our writes among them): compare again
            ref = key_ref(key)
            if ref in self.wanted or ref in self.annotations:
                self._enqueue_if_different(ref)

    # ---------- reconcile ----------
    async def reconcile_loop(self) -> None:
        async for _ in synced_bursts(self, self.opts.debounce, lambda: self.synced):  # busy while a pass runs
            t = time.perf_counter()
            analyses, updates = self.state.full_passes, self.state.in_place
            try:
                await self.reconcile()
            except Exception:  # noqa: BLE001 - one bad object must not stop the gateway
                log.exception("reconcile failed")
                self.metrics.errors.labels("reconcile").inc()
            self.reconciles += 1
            self.metrics.reconciles.inc()
            self.metrics.analyses.inc(self.state.full_passes - analyses)
            self.metrics.incremental.inc(self.state.in_place - updates)
            self.metrics.reconcile_seconds.observe(time.perf_counter() - t)

    async def reconcile(self) -> None:
        clock = Steps()
        facts_before = self.state.facts
        touched = self.state.refresh()  # in place where it can, else the full pass
        analysis, facts, index = self.state.analysis, self.state.facts, self.state.index
        assert analysis is not None and facts is not None and index is not None
        if facts is not facts_before or self.recheck_all:
            touched = None  # new facts, or a new term as leader: every object of ours is looked at again
            self.recheck_all = False
        clock.lap("analysis" if touched is None else "analysis in place")
        left_before = self.routes_left_out
        if self.driver is not None:  # every replica serves
            await self._program(analysis, facts, clock)
        self.routes_left_out = {r: why for r, why in self.left_out.items() if r.kind in ROUTE_KINDS}
        self.routes_left_out.update(self.over_budget)
        running = self.running if self.replicas is None else self.replicas.served_by_all(self.opts.identity, self.running)
        programming = Programming(dict(running), self.error, self._status_addresses(), dict(self.listener_facts),
                                  dict(self.routes_left_out))
        moved = [r for r in set(left_before) | set(self.routes_left_out) if left_before.get(r) != self.routes_left_out.get(r)]
        if touched is not None and moved:  # their status changes without the routes being touched
            touched = set(touched) | set(moved)
        # what each object should carry, as a function of its newest copy: other controllers write
        # between our analysis and our write, and their entries must survive it
        def ours(obj: Obj, _f: Any = facts, _p: Programming = programming) -> dict[str, Any] | None:
            return desired_status(obj, _f, _p, utc_now())

        if touched is None:
            wanted: dict[Ref, Any] = {}
            for refs in (facts.classes, facts.gateways, facts.routes, stale_routes(index, facts)):
                for ref in refs:
                    wanted[ref] = ours
            self.policy_wanted = policy_statuses(analysis, index, facts, self.opts.controller_name)
            self.policy_wanted.update(observability.statuses(analysis, index, facts, self.opts.controller_name))
            check: list[Ref] | None = None
        else:
            wanted = {r: f for r, f in self.wanted.items() if r not in self.policy_wanted}
            for ref in list(facts.classes) + list(facts.gateways):  # Programmed and attachedRoutes may change
                wanted[ref] = ours
            routes = [r for r in touched if r.group == GATEWAY_GROUP and r.kind in ROUTE_KINDS]
            for ref in routes:
                obj = index.by_ref.get(ref)
                if ref in facts.routes or (obj is not None and without_our_entries(obj, facts.controller) is not None):
                    wanted[ref] = ours
                else:
                    wanted.pop(ref, None)
            policies = {r for r in touched if r in analysis.policies or r in self.policy_wanted}
            for r in touched:
                policies |= analysis.policies_declaring(r)
            self.policy_wanted = {r: f for r, f in self.policy_wanted.items() if r not in policies}
            self.policy_wanted.update(policy_statuses(analysis, index, facts, self.opts.controller_name, policies))
            self.policy_wanted.update(observability.statuses(analysis, index, facts, self.opts.controller_name, policies))
            check = list(facts.classes) + list(facts.gateways) + routes + sorted(policies, key=Ref.sort_key)
        wanted.update(self.policy_wanted)
        self.wanted = wanted
        self.annotations = {}
        kinds = enforced_policy_kinds() + [f"{observability.tracing.KIND}.{observability.tracing.GROUP}"]
        for ref in facts.classes:
            self.annotations[ref] = policy_kinds_annotation(kinds)
        for ref in (list(wanted) if check is None else check) + list(self.annotations):
            self._enqueue_if_different(ref)
        clock.lap("status")
        self.last_reconcile = clock.steps

    def desired(self, ref: Ref) -> dict[str, Any] | None:
        """The status `ref` should carry, computed from the copy we hold now."""
        return desired_of(self.objects, self.wanted, ref)

    async def _program(self, analysis: Any, facts: Any, clock: "Steps | None" = None) -> None:
        version = self.state.dataplane_version
        if (version == self.programmed_version and self.error is None and not self.left_out
                and getattr(self.driver, "applied", None) is not None):
            return  # nothing the data plane reads changed since NGINX took what it serves (a Secret no one names)
        self.programmed_version = None
        left_out = self._still_left_out()
        try:
            dp, files = self.driver.build(analysis, self.state.epoch, left_out)
        except Exception as exc:  # noqa: BLE001 - the builder's errors name the object and field
            log.error("cannot build the NGINX configuration: %s", exc)
            self.metrics.errors.labels("render").inc()
            self.error = f"cannot build the configuration: {exc}"
            return
        for warning in dict.fromkeys(dp.warnings):
            if warning not in self.warned:  # said once, while it holds (an endpoint left out, ...)
                log.warning("%s", warning)
        self.warned = self.warned | set(dp.warnings) if len(self.warned) < 10_000 else set(dp.warnings)
        self.addresses = {ref: list(dp.listen.get(ref, (addr,))) for ref, addr in dp.addresses.items()}
        self.listener_facts = {ref: (lf.programmed, lf.reason, lf.message) for ref, lf in dp.listeners.items()}
        self.over_budget = dict(dp.over_budget)
        generations = {o.ref: o.generation for kind in ("Gateway", *ROUTE_KINDS)
                       for o in analysis.index.of_kind(GATEWAY_GROUP, kind)}
        if clock is not None:
            clock.lap("data plane and render")
        if files == getattr(self.driver, "applied", None):
            self.running = generations  # the same configuration holds these generations too
            self.programmed_version = version
            self._served(generations)
            return
        t = time.perf_counter()
        error = await self._nginx_call(self.driver.apply, files)
        if error is not None and hasattr(self.driver, "check"):
            self.metrics.reloads.labels("failed").inc()
            log.error("NGINX refused the configuration: %s; finding the objects to leave out", error)
            dp, files, error = await self._nginx_call(self._leave_out, analysis, dp, files, error, left_out)
            self.listener_facts = {ref: (lf.programmed, lf.reason, lf.message) for ref, lf in dp.listeners.items()}
        if clock is not None:
            clock.lap("nginx")
        self.metrics.reload_seconds.observe(time.perf_counter() - t)
        if error is None:
            from gwpolicy.gateway.isolate import fingerprints

            self.metrics.reloads.labels("ok").inc()
            self.running, self.error = generations, None
            self.nginx_running = True
            self._served(generations)
            self.programmed_version = version
            self.good_units = fingerprints(dp)
            log.info("NGINX serves the new configuration (%d files) after %.0f ms%s", len(files),
                     (time.perf_counter() - t) * 1000,
                     f"; left out: {', '.join(sorted(str(r) for r in self.left_out))}" if self.left_out else "")
        else:
            self.metrics.reloads.labels("failed").inc()
            self.error = error
            serving = getattr(self.driver, "serving", False)
            log.error("NGINX did not take the new configuration; %s: %s (trying again in %.0f s)",
                      "the previous one keeps serving" if serving else "NGINX is not running, nothing is served",
                      error, self.retry_in)
            # the cause may pass without any object changing (a port another process held, the
            # previous leader's NGINX still stopping): try again, less and less often
            asyncio.get_running_loop().call_later(self.retry_in, self.wake.set)
            self.retry_in = min(self.retry_in * 2, 30.0)
            return
        if any(why[0] == "PortUnavailable" for why in self.left_out.values()):  # the port may be given up: look again
            asyncio.get_running_loop().call_later(self.retry_in, self.wake.set)
            self.retry_in = min(self.retry_in * 2, 30.0)
        else:
            self.retry_in = 1.0

    def _status_addresses(self) -> dict[Ref, list[str]]:
        """What status.addresses says: where NGINX binds the Gateway; with --pod-addresses, the
        Gateway's spec.addresses when it names any (a load balancer's, given by whoever made it),
        else the addresses of every ready replica's pod (its own and those their Leases carry)."""
        if not self.opts.pod_addresses:
            return dict(self.addresses)
        pods = sorted(pod_addresses() | (self.replicas.addresses() if self.replicas is not None else set()),
                      key=address_order)
        out = {}
        for ref in self.addresses:
            gw = self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name)) or {}
            out[ref] = spec_addresses(gw) or pods
        return out

    def _served(self, generations: dict[Ref, int | None]) -> None:
        """NGINX serves the configuration built from `generations`: publish its digest."""
        digest = getattr(self.driver, "digest", None)
        if digest is None:
            return
        if self.replicas is not None:
            self.replicas.built(digest, generations)
        if self.publisher is not None:
            self.publisher.set(digest)

    def _replicas_changed(self) -> None:
        self.wake.set()  # Programmed (and, with --pod-addresses, status.addresses) is judged again

    async def _watch_expiry(self) -> None:
        """A replica that stops renewing its Lease is counted out once the Lease expires."""
        last = None
        while True:
            await asyncio.sleep(0.5)
            now = (self.replicas.ready(), sorted(self.replicas.addresses())) if self.replicas is not None else None
            if now != last:
                last = now
                self.wake.set()

    def _still_left_out(self) -> dict[Ref, tuple[str, str]]:
        """What stays out of the next configuration without being tried again: listeners whose
        address and port another process still holds. Everything else NGINX refused is tried
        again (the object, a policy on its path, a Service may have changed): when NGINX refuses
        it again, _leave_out finds it among the suspects at once."""
        from gwpolicy.gateway.isolate import PORT_UNAVAILABLE

        kept = {ref: why for ref, why in self.left_out.items()
                if why[0] == PORT_UNAVAILABLE and not port_free(*self.port_of(ref))}
        self.tried_again = [ref for ref in self.left_out if ref not in kept]
        self.left_out = kept
        return dict(kept)

    def port_of(self, listener: Ref) -> tuple[str, int]:
        """The address and port NGINX binds for a listener (as the last build placed it)."""
        addr = (self.addresses.get(listener.object) or [""])[0]
        gw = self.objects.get((listener.group, listener.kind, listener.namespace or "", listener.name)) or {}
        port = next((l.get("port") for l in (gw.get("spec") or {}).get("listeners") or []
                     if isinstance(l, dict) and l.get("name") == listener.section), None)
        return addr, (port + self.opts.port_offset) if isinstance(port, int) else 0

    def _leave_out(self, analysis: Any, dp: Any, files: dict[str, bytes], error: str,
                   left_out: dict[Ref, tuple[str, str]]) -> tuple[Any, dict[str, bytes], str | None]:
        """NGINX refused `files`: leave out the listeners whose port it could not bind, or the
        routes and listeners `nginx -t` finds it refuses (gateway/isolate.py), and apply the rest.
        Runs on the NGINX thread (it builds, renders and runs NGINX several times)."""
        from gwpolicy.gateway import isolate

        epoch = self.state.epoch
        left = dict(left_out)
        for _ in range(8):  # each round leaves out at least one more unit, or gives up
            bind = isolate.unbindable(error)
            units = isolate.fingerprints(dp)
            if bind:
                hit = [s.listener for s in dp.servers if (s.address, s.port) in bind]
                hit += [l for p in dp.passthrough if (p.address, p.port) in bind for l in p.listeners]
                for s in dp.servers:
                    if s.listener in hit and (s.address, s.port) in bind:
                        why = bind[(s.address, s.port)]
                        left[s.listener] = (isolate.PORT_UNAVAILABLE, cannot_listen(s.address, s.port - self.opts.port_offset, why))
                for p in dp.passthrough:
                    for ref in p.listeners:
                        if ref in hit:
                            why = bind[(p.address, p.port)]
                            left[ref] = (isolate.PORT_UNAVAILABLE, cannot_listen(p.address, p.port - self.opts.port_offset, why))
                if not hit:
                    break
            else:
                def fails(out: frozenset[Ref]) -> str | None:
                    _, trial = self.driver.build(analysis, epoch, {**left, **{r: ("", "") for r in out}})
                    return self.driver.check(trial)

                suspects = isolate.changed(units, self.good_units) + [r for r in self.tried_again if r in units]
                found = isolate.isolate(isolate.grouped(units), suspects, fails)
                if not found:
                    log.error("NGINX refuses the configuration whatever is left out of it: %s", error)
                    break
                for ref, why in found.items():
                    what = "this listener" if ref.kind == "Gateway" else f"this {ref.kind}"
                    left[ref] = (isolate.REFUSED, f"NGINX refused the configuration with {what} in it, which is left "
                                                  f"out: {isolate.without_paths(why)[:400]}")
            for ref, (reason, message) in left.items():
                if ref not in left_out:
                    log.error("leaving %s out of the configuration (%s): %s", ref, reason, message)
            dp, files = self.driver.build(analysis, epoch, left)
            error = self.driver.apply(files)
            if error is None:
                break
        self.left_out = left
        return dp, files, error

    async def _nginx_call(self, fn: Any, *args: Any) -> Any:
        """Every NGINX operation on one thread: they never overlap, and the event loop goes on."""
        return await asyncio.get_running_loop().run_in_executor(self.nginx_thread, fn, *args)

    # ---------- writes ----------
    def _enqueue_if_different(self, ref: Ref) -> None:
        raw = self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))
        if raw is None:
            return
        want = self.desired(ref)
        differs = want is not None and want != (raw.get("status") or {})
        ann = self.annotations.get(ref)
        if ann is not None and ann != ((raw.get("metadata") or {}).get("annotations") or {}).get(POLICY_KINDS_ANNOTATION):
            differs = True
        if differs:
            self.queue[ref] = None
            self.metrics.queue_depth.set(len(self.queue))
            self.queue_event.set()

    def _next_write(self) -> Job[Ref] | None:
        """The writers' next job (kube/writer.py): the first queued object no worker holds (the
        shell asks only while this replica leads)."""
        return take_first(self.queue, self.writing, self.write, self.metrics.queue_depth.set)

    def _requeue(self, ref: Ref) -> None:
        self.queue[ref] = None

    async def write(self, ref: Ref) -> None:
        """One object's status (merge patch of the status subresource, with the resourceVersion we
        computed from: a 409 means a newer copy is on its way and we compute again from it)."""
        kind = self.kinds.get((ref.group, ref.kind))
        raw = self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))
        if kind is None or raw is None or self.client is None or not kind.status_subresource:
            return
        want = self.desired(ref)
        try:
            if want is not None and want != (raw.get("status") or {}):
                body = {"metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]}, "status": want}
                out = await kube.merge_patch(self.client, kind, ref.name, ref.namespace, body, self.opts.field_manager,
                                             "status")
                self.metrics.writes.labels("ok").inc()
                await self.on_event("MODIFIED", kind, out)
                raw = self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name)) or raw
            ann = self.annotations.get(ref)
            if ann is not None and ann != ((raw.get("metadata") or {}).get("annotations") or {}).get(POLICY_KINDS_ANNOTATION):
                body = {"metadata": {"resourceVersion": raw["metadata"]["resourceVersion"],
                                     "annotations": {POLICY_KINDS_ANNOTATION: ann}}}
                out = await kube.merge_patch(self.client, kind, ref.name, ref.namespace, body, self.opts.field_manager)
                self.metrics.writes.labels("ok").inc()
                await self.on_event("MODIFIED", kind, out)
        except ApiError as exc:
            code = exc.status.code
            self.metrics.writes.labels(str(code)).inc()
            if code == 409:  # stale: the newer copy comes through the informer; compute again from it
                try:
                    fresh = await kube.get_object(self.client, kind, ref.name, ref.namespace)
                except (ApiError, httpx.HTTPError, OSError):
                    return
                await self.on_event("MODIFIED", kind, fresh)
                self.wake.set()
            elif code != 404:
                log.warning("cannot write status of %s: %s", ref, exc.status.message)
                self.queue[ref] = None
                await asyncio.sleep(0.5)
        except (httpx.HTTPError, OSError):
            self.metrics.errors.labels("write").inc()
            self.queue[ref] = None
            await asyncio.sleep(0.5)

    # ---------- what the shell serves (kube/process.py) ----------
    def not_ready(self) -> list[str]:
        if not self.synced:
            return ["informers not synced"]
        why = self.election_problem()
        if not why and self.driver is not None and not self.nginx_running:
            why.append("NGINX has no configuration yet")
        return why

    def ready_text(self) -> str:
        digest = getattr(self.driver, "digest", None)
        return f"ok\nserving {digest}\n" if digest else "ok"

    def status(self) -> dict[str, Any]:
        # NGINX's own words (file paths, a piece of a tenant's value) stay in the log and in the
        # status of the object concerned; whoever can reach this endpoint gets a summary
        return {"serving": getattr(self.driver, "digest", None),
                "nginxPid": getattr(getattr(self.driver, "nginx", None), "pid", None),
                "readyReplicas": self.replicas.ready() if self.replicas is not None else None,
                "synced": self.synced, "reconciles": self.reconciles,
                "busy": self.busy or self.wake.is_set(), "queued": len(self.queue),
                "nginxError": None if self.error is None else
                "NGINX did not load the newest configuration; the gateway's log says why",
                "leftOut": len(self.left_out), "lastReconcile": self.last_reconcile,
                "fullPasses": self.state.full_passes, "inPlace": self.state.in_place,
                "addresses": {str(k): v for k, v in self.addresses.items()}}

    async def http(self) -> None:
        """The shell's endpoints; their address and port are then reserved: no Gateway's listener
        can take them from us, nor fail on them, and no route sends to them."""
        await super().http()
        listen = self.opts.listen or defaults.listen("gateway")
        if self.driver is None or self.port is None:
            return
        self.driver.own_endpoints = own_endpoints(listen, self.port)
        if isinstance(self.driver, Renderer):
            host = listen.rpartition(":")[0].strip("[]") or "0.0.0.0"
            self.driver.reserved = {(host, self.port): f"the gateway's own health and metrics endpoint (gwpolicy "
                                                       f"gateway --listen {host}:{self.port}): give the listener another "
                                                       "port, or the gateway another --listen"}

    # ---------- lifecycle (the order is the shell's) ----------
    async def starting(self) -> None:
        """NGINX adopted or started first."""
        if self.driver is not None:
            await self._nginx_call(self.driver.start)
            try:  # SIGUSR2: end and leave NGINX serving (a restart in place; the next process adopts it)
                asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, self._leave_nginx)
            except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (a test's loop)
                pass

    async def started(self) -> None:
        """The reconcile loop, the status writers and, with leader election and NGINX, this replica's
        own Lease (what its NGINX serves) and the view of every replica's."""
        self.tasks.append(asyncio.create_task(self.reconcile_loop(), name="reconcile"))
        writers = self.status_writers(self._next_write, self._requeue, wake=self.queue_event)
        self.writing = writers.writing
        self.tasks += writers.start(self.opts.write_workers, "write")  # writes wait on the API server: a few in flight
        if self.opts.leader_election and self.driver is not None:
            assert self.client is not None and self.lease_namespace is not None
            self.replicas = Replicas(self.opts.lease_name, self._replicas_changed)
            self.publisher = Publisher(self.client, self.opts.identity, self.lease_namespace, self.opts.lease_name,
                                       self.opts.lease_duration, sorted(pod_addresses(), key=address_order))
            self.tasks.append(self.publisher.start())
            self.replica_informer = Informer(self.client, LEASE, self.replicas.on_event, self.lease_namespace,
                                             self.metrics)
            self.replica_informer.start()
            self.tasks.append(asyncio.create_task(self._watch_expiry(), name="replica-expiry"))
        self.wake.set()

    def leader_changed(self, leader: bool) -> None:
        if leader:
            self.recheck_all = True
            self.wake.set()  # write status for the current state

    def _leave_nginx(self) -> None:
        self.leave_nginx = True
        os.kill(os.getpid(), signal.SIGTERM)  # the process shell's stop, without NGINX's

    async def stopping(self) -> None:
        """This replica's Lease, NGINX (stopped, or left serving after SIGUSR2), the span relay (its
        waiting spans exported, whatever the exporter interval), then (the shell)
        the leader Lease (another replica writes status at once), the informers and the endpoints."""
        for t in self.tasks:
            if t.get_name() in ("reconcile", "write"):
                t.cancel()
        if self.publisher is not None:
            await self.publisher.close()
        if self.driver is not None:
            await self._nginx_call(self.driver.release if self.leave_nginx else self.driver.stop)
            relay = getattr(self.driver, "relay", None)
            if relay is not None:  # NGINX has logged its last requests: their spans are exported now
                await self._nginx_call(relay.stop)
        if self.replica_informer is not None:
            await self.replica_informer.stop()

    async def stopped(self) -> None:
        self.nginx_thread.shutdown(wait=True)


def main(argv: list[str]) -> int:
    from gwpolicy.gateway.nginx import NginxError

    opts = parse(argv)
    c = GatewayController(opts, DataPlaneDriver(opts))
    # NginxError: NGINX missing or too old (it says what to install); ListenError: --listen busy or malformed
    return serve.run(c, lambda: f"gwpolicy gateway {opts.identity} serving health and metrics on port {c.port}",
                     (NginxError, ListenError))

