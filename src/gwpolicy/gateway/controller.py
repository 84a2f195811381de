"""`gwpolicy gateway`: the controller of the GatewayClasses whose controllerName is ours.

It watches what the data plane is built from (GatewayClass, Gateway, HTTPRoute, ReferenceGrant,
BackendTLSPolicy, Service, EndpointSlice, Secret, ConfigMap, Namespace and the policy kinds found
through their CRDs), and on a change (debounced: a burst of events is one analysis) analyses the
objects with the engine, builds the data plane model, renders it, has NGINX validate and load it
(gateway/nginx.py), and writes GEP-1364 status: only what differs from what the object carries,
only for objects of our GatewayClasses, and in `status.parents` only our own entries.

Every replica runs NGINX with the configuration it renders from its own informers; only the holder
of the Lease writes status, and counts an object Programmed once every ready replica serves it
(gateway/replicas.py). NGINX outlives the gateway process (gateway/nginx.py): after a crash, a
SIGKILL or a restart the next process on the same --state-dir adopts it. SIGTERM and SIGINT stop
NGINX too (gracefully); SIGUSR2 ends the gateway and leaves NGINX serving, for the next process.
With --nginx-sidecar, NGINX runs in a container of its own (`gwpolicy nginx-sidecar`,
gateway/sidecar.py) and its life is that container's: the gateway reloads it but never stops it.
The informers, the Lease and the Kubernetes client are the policy controller's
(src/gwpolicy/controller/).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import logging
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx  # the HTTP client lightkube is built on
from aiohttp import web
from lightkube import ApiError, AsyncClient
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gwpolicy.engine.analysis import utc_now
from gwpolicy.engine.kinds import split_api_version
from gwpolicy.engine.model import Obj
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER, ROUTE_KINDS
from gwpolicy.gateway.replicas import Publisher, Replicas
from gwpolicy.gateway.state import GatewayState, key_ref, object_key
from gwpolicy.gateway.status import (
    POLICY_KINDS_ANNOTATION,
    Programming,
    desired_status,
    keep_in_place,
    policy_kinds_annotation,
    policy_status,
    stale_routes,
    without_our_entries,
)
from gwpolicy.kube import client as kube
from gwpolicy.kube import defaults, serve
from gwpolicy.kube.args import HelpFormatter, Parser, program_name
from gwpolicy.kube.client import Kind
from gwpolicy.kube.defaults import ProcessOptions
from gwpolicy.kube.endpoints import ListenError, healthz, metrics, serve_endpoints
from gwpolicy.kube.informer import Informer
from gwpolicy.kube.leader import LEASE, LeaderElector
from gwpolicy.kube.loop import synced_bursts
from gwpolicy.kube.process import shut_down
from gwpolicy.kube.writer import Job, StatusWriters

log = logging.getLogger("gwpolicy.gateway")

BUILTIN = [
    Kind("", "v1", "Namespace", "namespaces", False),
    Kind("", "v1", "Service", "services", True),
    Kind("", "v1", "Secret", "secrets", True, False),
    Kind("", "v1", "ConfigMap", "configmaps", True, False),
    Kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True, False),
]
_VOLATILE_META = ("resourceVersion", "managedFields", "generation")


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


@dataclass
class GatewayOptions(ProcessOptions):
    """The gateway's options: the shared ones (kube/defaults.py) and its own."""

    controller_name: str = GATEWAY_CONTROLLER
    field_manager: str = "gwpolicy-gateway"
    lease_name: str = "gwpolicy-gateway"
    state_dir: str | None = None  # NGINX's files; a fresh temporary directory when None
    address_pool: str | None = None  # loopback network Gateways get their addresses from
    port_offset: int = 0
    debounce: float = 0.05
    write_workers: int = 4
    nginx: str = "/usr/sbin/nginx"
    worker_processes: int | str = "auto"  # NGINX's worker_processes: "auto" (one per core) or a number
    allow_unmanaged_endpointslices: bool = False  # see DataPlaneConfig
    allow_loopback_endpoints: bool = False
    namespace_budget: int | None = None  # DataPlaneConfig.namespace_budget
    pod_addresses: bool = False  # serve every Gateway on all the pod's addresses (see --pod-addresses)
    nginx_sidecar: bool = False  # NGINX is run by `gwpolicy nginx-sidecar` on the state directory


# ---------------------------------------------------------------- defaults a server may not apply

def with_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """The CRD defaults the gateway relies on, for objects from a server that did not apply them
    (parentRef group/kind, backendRef group/kind/weight, a rule's default match, a match's default
    path, a listener's allowedRoutes). Objects that carry them come back equal."""
    group, _ = split_api_version(raw.get("apiVersion", ""))
    if group != GATEWAY_GROUP or not isinstance(raw.get("spec"), dict):
        return raw
    kind = raw.get("kind")
    if kind not in ("HTTPRoute", "Gateway"):
        return raw
    raw = copy.deepcopy(raw)
    spec = raw["spec"]
    if kind == "Gateway":
        for l in spec.get("listeners") or []:
            if isinstance(l, dict):
                ar = l.setdefault("allowedRoutes", {})
                if isinstance(ar, dict):
                    ns = ar.setdefault("namespaces", {})
                    if isinstance(ns, dict):
                        ns.setdefault("from", "Same")
        return raw
    for p in spec.get("parentRefs") or []:
        if isinstance(p, dict):
            p.setdefault("group", GATEWAY_GROUP)
            p.setdefault("kind", "Gateway")
    rules = spec.get("rules")
    if rules is None:
        rules = spec["rules"] = [{}]
    for rule in rules if isinstance(rules, list) else []:
        if not isinstance(rule, dict):
            continue
        if not rule.get("matches"):
            rule["matches"] = [{"path": {"type": "PathPrefix", "value": "/"}}]
        for m in rule["matches"]:
            if isinstance(m, dict):
                path = m.setdefault("path", {"type": "PathPrefix", "value": "/"})
                if isinstance(path, dict):
                    path.setdefault("type", "PathPrefix")
                    path.setdefault("value", "/")
                for h in m.get("headers") or []:
                    if isinstance(h, dict):
                        h.setdefault("type", "Exact")
                for q in m.get("queryParams") or []:
                    if isinstance(q, dict):
                        q.setdefault("type", "Exact")
        for b in rule.get("backendRefs") or []:
            if isinstance(b, dict):
                b.setdefault("group", "")
                b.setdefault("kind", "Service")
                b.setdefault("weight", 1)
    return raw


def _essence(raw: dict[str, Any]) -> Any:
    meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k not in _VOLATILE_META}
    return (raw.get("spec"), meta, {k: v for k, v in raw.items() if k not in ("spec", "metadata", "status")})


def _in_place(obj: Obj, status: dict[str, Any], controller: str) -> dict[str, Any]:
    """The engine's policy status with every ancestor entry where the object has it."""
    previous = (obj.raw.get("status") or {}).get("ancestors") if isinstance(obj.raw.get("status"), dict) else None
    status["ancestors"] = keep_in_place(previous, status.get("ancestors") or [], controller, "ancestorRef")
    return status


def _with_note(status: dict[str, Any], controller: str, note: str | None) -> dict[str, Any]:
    """Our accepted entries say which fields NGINX honours only approximately, and how."""
    if note:
        for a in status.get("ancestors") or []:
            if a.get("controllerName") != controller:
                continue
            for c in a.get("conditions") or []:
                if c.get("type") == "Accepted" and c.get("status") == "True" and note not in c.get("message", ""):
                    c["message"] = f"{c.get('message', '').rstrip()} {note}".strip()
    return status


class _Steps:
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


def _kind_checks() -> Any:
    """This data plane's checks of the policy kinds it enforces (policyconf, POL)."""
    from gwpolicy.gateway import policyconf

    return policyconf.kind_checks()


def policy_ancestors_of(analysis: Any, ref: Ref) -> set[Ref]:
    """The Gateways on the paths of what a policy targets (not through a TLSRoute: passthrough
    connections are never HTTP, so none of the policy kinds this gateway enforces reaches them)."""
    out: set[Ref] = set()
    for o in analysis.outcomes.get(ref, []):
        if o.declared is None or o.declared.kind == "TLSRoute" or not analysis.topology.exists(o.declared):
            continue
        for path in analysis.topology.paths_of(o.declared):
            for level in path:
                if level.kind == "Gateway" and level.group == GATEWAY_GROUP and level.section is None:
                    out.add(level)
    return out


def enforced_here(gateways: set[Ref], facts: Any) -> bool:
    """Whether a policy reaches one of our Gateways (else it is none of this gateway's business)."""
    return any(g in facts.gateways for g in gateways)


# ---------------------------------------------------------------- the data plane, through DP's modules

class Renderer:
    """Builds and renders the configuration (gateway/dataplane.py, render.py), reusing what the
    previous build made of each route and location while the analysis is updated in place."""

    def __init__(self, opts: GatewayOptions) -> None:
        from gwpolicy.gateway.dataplane import BuildCache
        from gwpolicy.gateway.render import RenderCache

        self.opts = opts
        self.build_cache = BuildCache()
        self.render_cache = RenderCache()
        #: address:port the gateway holds itself -> what (its health endpoint): no listener is put there
        self.reserved: dict[tuple[str, int], str] = {}
        #: this process' health and metrics endpoint (address, port): never an endpoint of a route
        self.own_endpoints: frozenset[tuple[str, int]] = frozenset()

    def config(self, left_out: Any = None) -> Any:
        from gwpolicy.gateway.dataplane import DataPlaneConfig

        kw: dict[str, Any] = {"controller_name": self.opts.controller_name, "port_offset": self.opts.port_offset,
                              "worker_processes": self.opts.worker_processes, "reserved": dict(self.reserved),
                              "allow_unmanaged_endpointslices": self.opts.allow_unmanaged_endpointslices,
                              "allow_loopback_endpoints": self.opts.allow_loopback_endpoints,
                              "own_addresses": pod_addresses(), "own_endpoints": self.own_endpoints,
                              "left_out": dict(left_out or {}), "namespace_budget": self.opts.namespace_budget}
        if self.opts.address_pool:
            kw["address_pool"] = self.opts.address_pool
        if self.opts.pod_addresses:
            kw["addresses"] = EVERY_ADDRESS
            kw["any_address"] = True
        return DataPlaneConfig(**kw)

    def build(self, analysis: Any, epoch: Any = None, left_out: Any = None) -> tuple[Any, dict[str, bytes]]:
        """The data plane and its files; `epoch` (GatewayState.epoch) says whether what the last
        build made of each route may be reused (None: build everything afresh); `left_out`: the
        routes and listeners to leave out (DataPlaneConfig.left_out)."""
        from gwpolicy.gateway.dataplane import build_dataplane
        from gwpolicy.gateway.render import render

        if epoch is None:
            dp = build_dataplane(analysis, self.config(left_out))
            return dp, render(dp)
        if epoch != self.build_cache.epoch:
            self.render_cache.clear()
        dp = build_dataplane(analysis, self.config(left_out), self.build_cache.use(epoch))
        return dp, render(dp, self.render_cache)


class _EveryAddress(Mapping[Ref, str]):
    """DataPlaneConfig.addresses that binds every Gateway on all addresses (0.0.0.0): every
    replica renders the same files whatever its pod's address."""

    def __getitem__(self, ref: Ref) -> str:
        return "0.0.0.0"

    def __contains__(self, ref: object) -> bool:
        return True

    def __iter__(self) -> Iterator[Ref]:
        return iter(())

    def __len__(self) -> int:
        return 0


EVERY_ADDRESS = _EveryAddress()


def spec_addresses(gw: dict[str, Any]) -> list[str]:
    """The values of a Gateway's spec.addresses (IPAddress and Hostname)."""
    spec = gw.get("spec")
    if not isinstance(spec, dict):
        return []
    return [a["value"] for a in spec.get("addresses") or []
            if isinstance(a, dict) and isinstance(a.get("value"), str) and a.get("type", "IPAddress") in ("IPAddress", "Hostname")]


def pod_addresses() -> frozenset[str]:
    """The addresses of the gateway's own pod (the downward API's status.podIPs in POD_IPS, or
    POD_IP), which no route may send to."""
    raw = os.environ.get("POD_IPS") or os.environ.get("POD_IP") or ""
    return frozenset(a.strip() for a in raw.split(",") if a.strip())


def _address_order(address: str) -> tuple[int, int | str]:
    import ipaddress

    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (2, address)
    return (ip.version, int(ip))


def _cannot_listen(address: str, port: int, why: str) -> str:
    if why == "Address already in use":
        why = "another process holds that address and port (Address already in use)"
    elif why == "Permission denied":
        why = "Permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE; see --port-offset)"
    return f"NGINX could not listen on {address}:{port}: {why or 'bind() failed'}"


def _port_free(address: str, port: int) -> bool:
    """Could NGINX bind this address and port now (no other process holds it)? Unknown: yes."""
    if not address or not port:
        return True
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def own_endpoints(listen: str, port: int) -> frozenset[tuple[str, int]]:
    """The addresses and port the health and metrics server answers on (every loopback and pod
    address when --listen names no host or an unspecified one)."""
    import ipaddress

    host = listen.rpartition(":")[0].strip("[]")
    try:
        specific = not ipaddress.ip_address(host).is_unspecified
    except ValueError:
        specific = False
    hosts = {host} if specific else {"127.0.0.1", "::1", *pod_addresses()}
    return frozenset((h, port) for h in hosts)


class DataPlaneDriver(Renderer):
    """Builds, renders and applies the configuration: gateway/dataplane.py, render.py, nginx.py."""

    def __init__(self, opts: GatewayOptions) -> None:
        from gwpolicy.gateway.nginx import Nginx

        super().__init__(opts)
        self.state_dir = opts.state_dir or tempfile.mkdtemp(prefix="gwpolicy-gateway-")
        # checks the version (NginxError says what is missing) and adopts the NGINX an earlier
        # gateway process on this state directory left serving
        self.nginx: Nginx | None = Nginx(self.state_dir, binary=opts.nginx, outlive=True, sidecar=opts.nginx_sidecar)
        self.applied: dict[str, bytes] | None = None
        self.lock = threading.Lock()  # apply and stop come from different threads

    def start(self) -> None:
        """Say what was found: an NGINX adopted (it serves on; the first configuration is compared
        with what it serves and reloaded only when it differs), else one starts with the first
        configuration `apply` gets."""
        nginx = self.nginx
        if nginx is not None and nginx.adopted is not None:
            pid, gen = nginx.adopted
            log.info("adopted the running NGINX (master pid %d, generation %d, %s) in %s", pid, gen, nginx.digest,
                     self.state_dir)
        elif nginx is not None and nginx.not_adopted:
            log.warning("%s", nginx.not_adopted)

    @property
    def digest(self) -> str | None:
        """files_digest of the configuration NGINX serves, None while it serves none."""
        nginx = self.nginx
        return nginx.digest if nginx is not None and nginx.pid is not None else None

    def apply(self, files: dict[str, bytes]) -> str | None:
        """Validate, load and verify; None when NGINX serves `files`, else why not (the last good
        configuration keeps serving)."""
        with self.lock:
            if self.nginx is None:  # stopped when we lost the lease; a new master for the new term
                from gwpolicy.gateway.nginx import Nginx

                self.nginx = Nginx(self.state_dir, binary=self.opts.nginx, outlive=True,
                                   sidecar=self.opts.nginx_sidecar)
            result = self.nginx.apply(files)
            if result.ok:
                self.applied = files
                return None
            return result.error or "NGINX did not take the configuration"

    def check(self, files: dict[str, bytes]) -> str | None:
        """`nginx -t` of `files`, loading nothing: None when NGINX would take them, else its messages."""
        with self.lock:
            if self.nginx is None:
                from gwpolicy.gateway.nginx import Nginx

                self.nginx = Nginx(self.state_dir, binary=self.opts.nginx, outlive=True,
                                   sidecar=self.opts.nginx_sidecar)
            return self.nginx.check(files) or None

    @property
    def serving(self) -> bool:
        """Does NGINX run (and so serve the last configuration it took)?"""
        return self.nginx is not None and self.nginx.pid is not None and self.nginx.generation > 0

    def stop(self) -> None:
        """Stop NGINX (it no longer holds the Gateways' addresses); `apply` starts a new one. The
        sidecar's NGINX is left serving: it stops with its own container."""
        if self.opts.nginx_sidecar:
            self.release()
            return
        with self.lock:
            if self.nginx is not None:
                self.nginx.stop()
                self.nginx = None
            self.applied = None

    def release(self) -> None:
        """Leave NGINX serving the last configuration, for the next gateway process to adopt."""
        with self.lock:
            if self.nginx is not None:
                self.nginx.release()
                self.nginx = None
            self.applied = None


class GatewayController:
    def __init__(self, opts: GatewayOptions, driver: Any = None) -> None:
        self.opts = opts
        self.metrics = Metrics()
        self.driver = driver
        #: GatewayState.dataplane_version of what NGINX serves (None: build on the next reconcile)
        self.programmed_version: int | None = None
        self.client: AsyncClient | None = None
        self.informers: dict[Kind, Informer] = {}
        self.kinds: dict[tuple[str, str], Kind] = {}
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.wake = asyncio.Event()
        self.queue: dict[Ref, None] = {}
        self.queue_event = asyncio.Event()
        self.wanted: dict[Ref, Any] = {}  # object -> (its newest copy -> the status it should carry)
        self.annotations: dict[Ref, str] = {}  # GatewayClass -> the policy kinds annotation it should carry
        self.running: dict[Ref, int | None] = {}  # objects (and generations) in the configuration NGINX runs
        self.error: str | None = None
        self.addresses: dict[Ref, list[str]] = {}
        self.listener_facts: dict[Ref, tuple[bool, str, str]] = {}
        self.elector: LeaderElector | None = None
        self.lease_namespace: str | None = opts.lease_namespace
        self.tasks: list[asyncio.Task] = []
        self.runner: web.AppRunner | None = None
        self.port: int | None = None
        self.busy = False
        self.reconciles = 0
        self.nginx_running = False
        self.retry_in = 1.0  # seconds until a failed apply is tried again
        self.writing: set[Ref] = set()  # objects a write worker holds
        self.nginx_thread = ThreadPoolExecutor(1, thread_name_prefix="nginx")
        #: the analysis and facts, kept up to date in place (gateway/state.py)
        self.state = GatewayState(self.objects, opts.controller_name, _kind_checks(), any_address=opts.pod_addresses)
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
    def _watch(self, kind: Kind) -> None:
        if kind in self.informers or self.client is None:
            return
        self.kinds[(kind.group, kind.kind)] = kind
        inf = Informer(self.client, kind, self.on_event, None, self.metrics)
        self.informers[kind] = inf
        inf.start()
        log.info("watching %s/%s", kind.api_version, kind.plural)

    def _consider_crd(self, crd: dict[str, Any]) -> None:
        named = {((pk.get("spec") or {}).get("group", ""), (pk.get("spec") or {}).get("kind", ""))
                 for key, pk in self.objects.items() if key[:2] == ("gwpolicy.io", "PolicyKind")}
        kind = kube.kind_of_crd(crd, named)
        if kind is not None:
            self._watch(kind)

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
        changed = etype == "DELETED" or old is None or _essence(old) != _essence(self.objects[key])
        if changed and (etype != "DELETED" or old is not None):
            self.state.changed(old, self.objects.get(key))
        if kind == kube.CRD and etype != "DELETED":
            self._consider_crd(raw)
        if (kind.group, kind.kind) == ("gwpolicy.io", "PolicyKind") and etype != "DELETED":
            for k, crd in list(self.objects.items()):
                if k[:2] == ("apiextensions.k8s.io", "CustomResourceDefinition"):
                    self._consider_crd(crd)
        if changed:
            self.wake.set()
        else:  # only status or bookkeeping changed (the echo of our writes among them): compare again
            ref = key_ref(key)
            if ref in self.wanted or ref in self.annotations:
                self._enqueue_if_different(ref)

    @property
    def synced(self) -> bool:
        return bool(self.informers) and all(i.synced.is_set() for i in self.informers.values())

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
        clock = _Steps()
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
            self.policy_wanted = self._policy_status(analysis, index, facts)
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
            self.policy_wanted.update(self._policy_status(analysis, index, facts, policies))
            check = list(facts.classes) + list(facts.gateways) + routes + sorted(policies, key=Ref.sort_key)
        wanted.update(self.policy_wanted)
        self.wanted = wanted
        self.annotations = {}
        kinds = self._enforced_policy_kinds()
        for ref in facts.classes:
            self.annotations[ref] = policy_kinds_annotation(kinds)
        for ref in (list(wanted) if check is None else check) + list(self.annotations):
            self._enqueue_if_different(ref)
        clock.lap("status")
        self.last_reconcile = clock.steps

    def desired(self, ref: Ref) -> dict[str, Any] | None:
        """The status `ref` should carry, computed from the copy we hold now."""
        raw = self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))
        fn = self.wanted.get(ref)
        if raw is None or fn is None:
            return None
        group, version = split_api_version(raw.get("apiVersion", ""))
        return fn(Obj(raw, ref, version, "api"))

    def _policy_status(self, analysis: Any, index: Any, facts: Any, only: set[Ref] | None = None) -> dict[Ref, Any]:
        """Ancestor entries under our controllerName for the policies this gateway enforces: the
        BackendTLSPolicy conditions are POL's rules; the gwpolicy.io kinds' are the engine's outcome
        with this data plane's checks (a field NGINX cannot honour makes the policy Invalid).
        `only`: these policies (the others' entries are what they were)."""
        from gwpolicy.engine.status import policy_status as engine_policy_status
        from gwpolicy.gateway import backendtls, policyconf

        out: dict[Ref, Any] = {}
        for ref, conds in backendtls.all_conditions(analysis).items():
            if ref in index.by_ref and (only is None or ref in only):
                out[ref] = lambda obj, _c=conds, _f=facts: policy_status(obj, _c, _f, utc_now())
        enforced = {(policyconf.GROUP, k) for k in policyconf.KINDS}
        topo, controller = analysis.topology, self.opts.controller_name
        chosen = analysis.policies.items() if only is None else (
            (r, analysis.policies[r]) for r in sorted(only, key=Ref.sort_key) if r in analysis.policies)
        for ref, policy in chosen:
            if (ref.group, ref.kind) not in enforced or ref not in index.by_ref:
                continue
            if not enforced_here(policy_ancestors_of(analysis, ref), facts):
                # if it reached us before, our entries go (judged on its newest copy, which our
                # writes since the last full pass are in)
                out[ref] = lambda obj: without_our_entries(obj, controller)
                continue
            outcomes = analysis.outcomes.get(ref, [])
            note = policyconf.approximation_message(ref.kind, policy.obj.spec)
            out[ref] = lambda obj, _p=policy, _o=outcomes, _n=note: _in_place(obj, _with_note(engine_policy_status(
                dataclasses.replace(_p, obj=obj), _o, topo, controller, utc_now()), controller, _n), controller)
        return out

    def _enforced_policy_kinds(self) -> list[str]:
        try:
            from gwpolicy.gateway import policyconf

            kinds = [f"{k}.{policyconf.GROUP}" for k in policyconf.KINDS]
        except ImportError:
            kinds = []
        return kinds + ["BackendTLSPolicy.gateway.networking.k8s.io"]

    async def _program(self, analysis: Any, facts: Any, clock: "_Steps | None" = None) -> None:
        version = self.state.dataplane_version
        if (version == self.programmed_version and self.error is None and not self.left_out
                and getattr(self.driver, "applied", None) is not None):
            return  # nothing the data plane reads changed since NGINX took what it serves (a Secret no one names)
        self.programmed_version = None
        left_out = self._still_left_out()
        try:
            dp, files = self.driver.build(analysis, self.state.epoch, left_out)
        except Exception as exc:  # noqa: BLE001 - DP's errors name the object and field
            log.error("cannot build the NGINX configuration: %s", exc)
            self.metrics.errors.labels("render").inc()
            self.error = f"cannot build the configuration: {exc}"
            return
        for warning in dict.fromkeys(dp.warnings):
            if warning not in self.warned:  # said once, while it holds (an endpoint left out, ...)
                log.warning("%s", warning)
        self.warned = self.warned | set(dp.warnings) if len(self.warned) < 10_000 else set(dp.warnings)
        self.addresses = {ref: [addr] for ref, addr in dp.addresses.items()}
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
                      key=_address_order)
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
                if why[0] == PORT_UNAVAILABLE and not _port_free(*self.port_of(ref))}
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
                        left[s.listener] = (isolate.PORT_UNAVAILABLE, _cannot_listen(s.address, s.port - self.opts.port_offset, why))
                for p in dp.passthrough:
                    for ref in p.listeners:
                        if ref in hit:
                            why = bind[(p.address, p.port)]
                            left[ref] = (isolate.PORT_UNAVAILABLE, _cannot_listen(p.address, p.port - self.opts.port_offset, why))
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

    @property
    def leading(self) -> bool:
        return not self.opts.leader_election or (self.elector is not None and self.elector.is_leader)

    def _next_write(self) -> Job[Ref] | None:
        """The writers' next job (kube/writer.py): the first queued object no worker holds."""
        if not self.leading:
            return None
        ref = next((r for r in self.queue if r not in self.writing), None)
        if ref is None:
            return None
        del self.queue[ref]
        self.metrics.queue_depth.set(len(self.queue))
        return ref, lambda: self.write(ref)

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

    # ---------- HTTP ----------
    async def http(self) -> None:
        async def readyz(_: web.Request) -> web.Response:
            if not self.synced:
                return web.Response(text="informers not synced", status=503)
            if self.elector is not None and self.elector.problem is not None and self.elector.blocking:
                return web.Response(text=f"leader election: {self.elector.problem}\n", status=503)
            if self.driver is not None and not self.nginx_running:
                return web.Response(text="NGINX has no configuration yet", status=503)
            digest = getattr(self.driver, "digest", None)
            return web.Response(text=f"ok\nserving {digest}\n" if digest else "ok")

        async def statusz(_: web.Request) -> web.Response:
            # NGINX's own words (file paths, a piece of a tenant's value) stay in the log and in the
            # status of the object concerned; whoever can reach this endpoint gets a summary
            return web.json_response({"leader": self.leading, "leaseNamespace": self.lease_namespace,
                                      "serving": getattr(self.driver, "digest", None),
                                      "nginxPid": getattr(getattr(self.driver, "nginx", None), "pid", None),
                                      "readyReplicas": self.replicas.ready() if self.replicas is not None else None,
                                      "leaderElectionProblem": self.elector.problem if self.elector else None,
                                      "synced": self.synced, "reconciles": self.reconciles,
                                      "busy": self.busy or self.wake.is_set(), "queued": len(self.queue),
                                      "nginxError": None if self.error is None else
                                      "NGINX did not load the newest configuration; the gateway's log says why",
                                      "leftOut": len(self.left_out), "lastReconcile": self.last_reconcile,
                                      "fullPasses": self.state.full_passes, "inPlace": self.state.in_place,
                                      "addresses": {str(k): v for k, v in self.addresses.items()}})

        listen = self.opts.listen or defaults.listen("gateway")
        self.runner, self.port = await serve_endpoints(
            listen, {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics(self.metrics.registry), "/statusz": statusz})
        if self.driver is not None and self.port is not None:
            self.driver.own_endpoints = own_endpoints(listen, self.port)
        if isinstance(self.driver, Renderer):  # a Gateway's listener can never take this port from us, nor fail on it
            host = listen.rpartition(":")[0].strip("[]") or "0.0.0.0"
            self.driver.reserved = {(host, self.port): f"the gateway's own health and metrics endpoint (gwpolicy "
                                                       f"gateway --listen {host}:{self.port}): give the listener another "
                                                       "port, or the gateway another --listen"}

    # ---------- lifecycle ----------
    async def start(self) -> None:
        self.client = kube.make_client(self.opts.kubeconfig, self.opts.context, self.opts.field_manager)
        if self.driver is not None:
            await self._nginx_call(self.driver.start)
            try:  # SIGUSR2: end and leave NGINX serving (a restart in place; the next process adopts it)
                asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, self._leave_nginx)
            except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (a test's loop)
                pass
        await self.http()
        for k in [kube.CRD, *BUILTIN]:
            self._watch(k)
        self.tasks.append(asyncio.create_task(self.reconcile_loop(), name="reconcile"))
        writers = StatusWriters(self._next_write, self._requeue, self.metrics.errors.labels("write").inc,
                                wake=self.queue_event)
        self.writing = writers.writing
        self.tasks += writers.start(self.opts.write_workers, "write")  # writes wait on the API server: a few in flight
        if self.opts.leader_election:
            self.lease_namespace = defaults.lease_namespace(self.opts.lease_namespace, self.client.namespace)
            log.info("leader election on the Lease %s in namespace %s", self.opts.lease_name, self.lease_namespace)
            self.elector = LeaderElector(self.client, self.opts.identity, self.lease_namespace, self.opts.lease_name,
                                         duration=self.opts.lease_duration, on_change=self._leader_changed,
                                         rbac="deploy/70-gateway.yaml, Role gwpolicy-gateway-leader-election")
            self.tasks.append(asyncio.create_task(self.elector.run(), name="leader"))
            if self.driver is not None:
                self.replicas = Replicas(self.opts.lease_name, self._replicas_changed)
                self.publisher = Publisher(self.client, self.opts.identity, self.lease_namespace, self.opts.lease_name,
                                           self.opts.lease_duration, sorted(pod_addresses(), key=_address_order))
                self.tasks.append(asyncio.create_task(self.publisher.run(), name="replica-lease"))
                self.replica_informer = Informer(self.client, LEASE, self.replicas.on_event, self.lease_namespace,
                                                 self.metrics)
                self.replica_informer.start()
                self.tasks.append(asyncio.create_task(self._watch_expiry(), name="replica-expiry"))
        else:
            self.metrics.leader.set(1)
        self.wake.set()

    def _leader_changed(self, leader: bool) -> None:
        self.metrics.leader.set(1 if leader else 0)
        if leader:
            self.recheck_all = True
            self.wake.set()  # write status for the current state

    def _leave_nginx(self) -> None:
        self.leave_nginx = True
        os.kill(os.getpid(), signal.SIGTERM)  # the process shell's stop, without NGINX's

    async def stop(self) -> None:
        """This replica's Lease, NGINX (stopped, or left serving after SIGUSR2), then the leader
        Lease (another replica writes status at once), then the informers and the HTTP endpoints."""
        for t in self.tasks:
            if t.get_name() in ("reconcile", "write"):
                t.cancel()
        if self.publisher is not None:
            await self.publisher.delete()
        if self.driver is not None:
            await self._nginx_call(self.driver.release if self.leave_nginx else self.driver.stop)
        if self.replica_informer is not None:
            await self.replica_informer.stop()
        if self.elector:
            try:
                await self.elector.release()
            except Exception:  # noqa: BLE001 - stopping goes on
                pass
        await shut_down(self.tasks, list(self.informers.values()), self.runner, self.client)
        self.nginx_thread.shutdown(wait=True)


# ---------------------------------------------------------------- command line

DESCRIPTION = """Run the gateway: a controller for the GatewayClasses whose spec.controllerName is
ours, with NGINX as its data plane. It watches GatewayClass, Gateway, HTTPRoute, ReferenceGrant,
BackendTLSPolicy, Service, EndpointSlice, Secret, ConfigMap and the policy kinds; renders one NGINX
configuration from the engine's analysis; starts NGINX as a child process, validates every new
configuration before loading it and verifies that it serves; and writes GEP-1364 status
(GatewayClass, Gateway and listeners, HTTPRoute parents). Each Gateway is served on its own
loopback address (127.0.0.0/8, from --address-pool unless spec.addresses names one) and its
listeners' ports; status.addresses says where. Runs in the foreground until SIGTERM or SIGINT, then
stops NGINX gracefully; SIGUSR2 ends it and leaves NGINX serving, and so does a crash or SIGKILL: the
next gateway on the same --state-dir adopts the running NGINX without restarting it. With
--nginx-sidecar NGINX is run by `gwpolicy nginx-sidecar` on the same --state-dir, and no signal to
the gateway stops it. Ports below 1024 need root (or CAP_NET_BIND_SERVICE); without it NGINX cannot bind
them, and the Gateway's Programmed condition says so (see --port-offset)."""


def worker_processes(text: str) -> int | str:
    """`auto` or a number of NGINX worker processes (1-1024), for --worker-processes."""
    if text == "auto":
        return text
    if text.isdigit() and 1 <= int(text) <= 1024:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not auto or a number of processes from 1 to 1024")


def parse(argv: list[str]) -> GatewayOptions:
    from gwpolicy.gateway.render_cli import add_endpoint_arguments  # `render -f` takes the same flags

    p = Parser(prog=f"{program_name()} gateway", formatter_class=HelpFormatter, description=DESCRIPTION,
               epilog="""examples:
  # against the sandbox; Gateways of GatewayClasses whose controllerName is ours, leader election
  # on a Lease in the context's namespace, health and metrics on 127.0.0.1:8081
  gwpolicy sandbox --port 8001 --kubeconfig-out /tmp/sb.kubeconfig &
  gwpolicy gateway --kubeconfig /tmp/sb.kubeconfig

  # without root: serve listener port 80 on 8080
  gwpolicy gateway --kubeconfig /tmp/sb.kubeconfig --port-offset 8000
""")
    defaults.add_arguments(p, "gateway")
    p.add_argument("--controller-name", default=GATEWAY_CONTROLLER,
                   help=f"serve the GatewayClasses with this spec.controllerName (default {GATEWAY_CONTROLLER})")
    p.add_argument("--state-dir", help="directory for NGINX's configuration and logs (default: a new temporary directory)")
    p.add_argument("--address-pool", help="loopback network (CIDR) Gateways get their addresses from")
    p.add_argument("--port-offset", type=int, default=0,
                   help="add this to every listener port NGINX binds (e.g. 8000 to serve port 80 on 8080 without root)")
    p.add_argument("--debounce", type=float, default=0.05, help="seconds to gather a burst of changes into one reload")
    p.add_argument("--write-workers", type=int, default=4, help="status writes in flight at most")
    p.add_argument("--nginx", default="/usr/sbin/nginx", help="the NGINX binary (1.22 or newer, with njs)")
    p.add_argument("--worker-processes", type=worker_processes, default="auto",
                   help="NGINX worker processes: auto (one per CPU core, the default) or a number")
    p.add_argument("--pod-addresses", action="store_true",
                   help="serve every Gateway on all of the pod's addresses at its listeners' ports (NGINX listens "
                        "on 0.0.0.0), as in a cluster, instead of a loopback address of --address-pool; "
                        "status.addresses then lists the Gateway's spec.addresses, else the addresses of every "
                        "ready replica's pod (POD_IPS or POD_IP from the downward API)")
    p.add_argument("--nginx-sidecar", action="store_true",
                   help="leave running NGINX to `gwpolicy nginx-sidecar --state-dir` on the same --state-dir (a "
                        "container of its own in the pod, sharing its process namespace): the gateway writes, checks "
                        "and reloads the configuration, and adopts that NGINX, but never starts or stops it")
    add_endpoint_arguments(p)
    a = p.parse_args(argv)
    serve.setup_logging(a.verbose)
    return GatewayOptions(**defaults.options(a), controller_name=a.controller_name, state_dir=a.state_dir,
                          address_pool=a.address_pool, port_offset=a.port_offset, debounce=a.debounce,
                          write_workers=a.write_workers, nginx=a.nginx, worker_processes=a.worker_processes,
                          allow_unmanaged_endpointslices=a.allow_unmanaged_endpointslices,
                          allow_loopback_endpoints=a.allow_loopback_endpoints, namespace_budget=a.namespace_match_budget,
                          pod_addresses=a.pod_addresses, nginx_sidecar=a.nginx_sidecar)


def main(argv: list[str]) -> int:
    from gwpolicy.gateway.nginx import NginxError

    opts = parse(argv)
    c = GatewayController(opts, DataPlaneDriver(opts))
    # NginxError: NGINX missing or too old (it says what to install); ListenError: --listen busy or malformed
    return serve.run(c, lambda: f"gwpolicy gateway {opts.identity} serving health and metrics on port {c.port}",
                     (NginxError, ListenError))
