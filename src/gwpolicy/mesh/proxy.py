"""`gwpolicy mesh --namespace NS`: the proxy of one client namespace (the edge of the mesh), and the
mesh controller's status writer.

It watches Namespaces, Services, EndpointSlices, HTTPRoutes, the XMesh and the gwpolicy.io policy
kinds (once their CRDs are there) on the process shell (kube/process.py), and on a change
(debounced) renders the proxy's configuration (mesh/render.py: every Service's cluster IP and HTTP
ports, with the mesh routes and the policies that apply to the namespace's requests, once an XMesh
of the mesh controller exists: `mesh_view`) and has NGINX validate, load and verify it
(gateway/nginx.py). Every proxy, whatever its client namespace, takes part in one leader election
(the Lease `gwpolicy-mesh`); the leader writes what the mesh controller reports
(engine/meshstatus.py: the route `status.parents[]` entries of Service parents, the XMesh's
`Accepted`), only where it differs, through the shared status writers (kube/writer.py).
SIGTERM and SIGINT stop NGINX gracefully and give the Lease up.

The egress port (mesh/egress.py) needs the addresses of the hosts ExternalServices name: the proxy
resolves a host when a rendering first asks for it (off the event loop, before NGINX gets that
configuration), and every host again each --egress-resolve-interval seconds, rendering anew when
an answer changed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from lightkube import ApiError
from prometheus_client import CollectorRegistry, Counter, Gauge

from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.kinds import split_api_version
from gwpolicy.engine.mesh import MESH_CONTROLLER, MESH_GROUP
from gwpolicy.engine.meshstatus import Wanted, status_writes
from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.options import worker_processes
from gwpolicy.gateway.state import key_ref, object_key
from gwpolicy.kube import client as kube
from gwpolicy.kube import defaults, serve
from gwpolicy.kube.args import HelpFormatter, Parser, namespace_name, positive_number, program_name
from gwpolicy.kube.client import Kind
from gwpolicy.kube.defaults import ProcessOptions
from gwpolicy.kube.endpoints import ListenError
from gwpolicy.kube.loop import synced_bursts
from gwpolicy.kube.process import WatchingProcess
from gwpolicy.kube.writer import Job, desired_of, patch_status_or_reread, take_first
from gwpolicy.mesh import egress
from gwpolicy.mesh.render import MeshConfig, build, mesh_on

log = logging.getLogger("gwpolicy.mesh")

BUILTIN = [
    Kind("", "v1", "Namespace", "namespaces", False),
    Kind("", "v1", "Service", "services", True),
    Kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True, False),
]
#: the CRD kinds the proxy reads: mesh routes and the policy kinds it applies on mesh paths...
OWN_CRD_KINDS = {("gateway.networking.k8s.io", "HTTPRoute")} | {(policyconf.GROUP, k) for k in policyconf.KINDS}
#: ... and the XMesh that turns the mesh on (the experimental channel's), watched as every process
#: that reads the mesh watches it (kube/process.py `reads_mesh`); deploy/80-mesh.yaml grants these
#: and no others
WATCHED_CRD_KINDS = OWN_CRD_KINDS | {(MESH_GROUP, "XMesh")}
#: the kinds the proxy serves without a mesh: plain forwarding to every Service's endpoints
PLAIN_KINDS = {(k.group, k.kind) for k in BUILTIN}


def mesh_view(objects: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """What the proxy serves from: every object while an XMesh of the mesh controller exists; else
    only Namespaces, Services and EndpointSlices (no mesh routes, no policies: each Service's
    cluster IP forwards to its endpoints as kube-proxy would, docs/mesh.md "Without an XMesh")."""
    objects = list(objects)
    if mesh_on(objects):
        return objects
    return [o for o in objects if (split_api_version(str(o.get("apiVersion", "")))[0], o.get("kind")) in PLAIN_KINDS]


def essence(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An object without what changes when only its status is written (the proxy never reads it)."""
    meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
    return {**{k: v for k, v in raw.items() if k != "status"}, "metadata": meta}


@dataclass
class MeshOptions(ProcessOptions):
    namespace: str = "default"  # the client namespace whose requests the proxy carries
    field_manager: str = "gwpolicy-mesh"
    state_dir: str | None = None
    debounce: float = 0.05
    nginx: str = "/usr/sbin/nginx"
    worker_processes: int | str = "auto"
    allow_unmanaged_endpointslices: bool = False
    allow_loopback_endpoints: bool = False
    #: the egress port to ExternalServices' hosts (None: none), their ports, how often to resolve them
    egress_listen: tuple[str, int] | None = egress.DEFAULT_LISTEN
    egress_ports: tuple[int, ...] = egress.DEFAULT_PORTS
    egress_resolve_interval: float = 30.0


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.events = Counter("gwpolicy_mesh_events", "Watch and list events received, by resource and event type",
                              ["resource", "type"], registry=r)
        self.reloads = Counter("gwpolicy_mesh_nginx_reloads", "New configurations given to NGINX, by result",
                               ["result"], registry=r)
        self.errors = Counter("gwpolicy_mesh_errors", "Errors, by where they happened", ["where"], registry=r)
        self.leader = Gauge("gwpolicy_mesh_leader", "1 when this replica holds the Lease gwpolicy-mesh (it writes the "
                            "mesh controller's status; every replica serves its namespace), else 0", registry=r)
        self.writes = Counter("gwpolicy_mesh_writes", "Status writes, by result (ok; conflict: read again and "
                              "computed again; gone; or the HTTP status code)", ["result"], registry=r)
        self.queue_depth = Gauge("gwpolicy_mesh_queue_depth", "Objects waiting for a status write", registry=r)
        self.informer_failures = Counter("gwpolicy_mesh_informer_failures", "Failed lists and watches, by resource "
                                         "and operation", ["resource", "operation"], registry=r)
        self.informer_stuck = Gauge("gwpolicy_mesh_informer_stuck", "1 while the informer of a resource cannot make "
                                    "progress", ["resource"], registry=r)


class MeshProxy(WatchingProcess):
    """One client namespace's proxy on the process shell."""

    command = "mesh"
    lease_name = "gwpolicy-mesh"
    lease_rbac = "deploy/80-mesh.yaml, Role gwpolicy-mesh-leader-election"
    builtin = BUILTIN
    reads_mesh = True

    def __init__(self, opts: MeshOptions) -> None:
        metrics = Metrics()
        super().__init__(opts, metrics)
        self.opts: MeshOptions = opts
        self.metrics: Metrics = metrics
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.nginx: Any = None
        self.applied: dict[str, bytes] | None = None
        self.error: str | None = None
        self.passes = 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="nginx")
        self.addresses = egress.HostAddresses()  # the ExternalServices' hosts, as last resolved
        self.resolver = ThreadPoolExecutor(4, thread_name_prefix="resolve")
        self.wanted: dict[Ref, Wanted] = {}  # object -> (its newest copy -> the status it should carry)
        self.queue: dict[Ref, None] = {}  # objects whose status differs from what they should carry
        self.queue_event = asyncio.Event()
        self.writing: set[Ref] = set()  # objects a write worker holds
        self.writes_done = 0

    async def on_event(self, etype: str, kind: Kind, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        meta.pop("managedFields", None)
        if kind == kube.CRD:
            if etype != "DELETED":
                self.consider_crd(raw, self.objects)
            return
        raw.setdefault("apiVersion", kind.api_version)
        raw.setdefault("kind", kind.kind)
        key = object_key(raw)
        old = self.objects.get(key)
        if etype == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = raw
        if etype == "DELETED" or old is None or essence(old) != essence(raw):
            self.wake.set()
        else:  # only its status changed (the echo of our own write among them): compare again
            self._enqueue_if_different(key_ref(key))

    def crd_kind(self, crd: dict[str, Any], objects: dict[tuple[str, str, str, str], dict[str, Any]]) -> Kind | None:
        """HTTPRoutes and the gwpolicy.io policy kinds, and nothing else the ClusterRole does not grant."""
        wanted = kube.served_kind(crd)
        return wanted if wanted is not None and (wanted.group, wanted.kind) in OWN_CRD_KINDS else None

    def not_ready(self) -> list[str]:
        why = [] if self.synced else ["informers not synced"]
        if self.applied is None:
            why.append(self.error or "NGINX serves no configuration yet")
        return why

    def status(self) -> dict[str, Any]:
        return {"synced": self.synced, "namespace": self.opts.namespace, "passes": self.passes,
                "serving": self.applied is not None, "error": self.error, "mesh": mesh_on(self.objects.values()),
                "queued": len(self.queue), "writes": self.writes_done}

    async def starting(self) -> None:
        from gwpolicy.gateway.nginx import Nginx

        state = self.opts.state_dir or tempfile.mkdtemp(prefix="gwpolicy-mesh-")
        self.nginx = Nginx(state, binary=self.opts.nginx, outlive=True)

    async def started(self) -> None:
        self.wake.set()
        self.tasks.append(asyncio.create_task(self.loop(), name="mesh"))
        if self.opts.egress_listen is not None:
            self.tasks.append(asyncio.create_task(self.resolving(), name="egress-resolve"))
        writers = self.status_writers(self._next_write, self._requeue, wake=self.queue_event)
        self.writing = writers.writing
        self.tasks += writers.start(1, "write")

    def leader_changed(self, leader: bool) -> None:
        if leader:  # compute what to write: the previous leader may have left work undone
            self.wake.set()

    async def loop(self) -> None:
        async for _ in synced_bursts(self, self.opts.debounce, lambda: self.synced):
            try:
                await self.program()
            except Exception:  # noqa: BLE001 - one bad object must not stop the proxy
                log.exception("programming the proxy failed")
                self.metrics.errors.labels("reconcile").inc()
            try:
                self.reconcile_status()
            except Exception:  # noqa: BLE001
                log.exception("computing the mesh status failed")
                self.metrics.errors.labels("status").inc()
            self.passes += 1

    # ---------- status (the leader's) ----------
    def reconcile_status(self) -> None:
        """What every object the mesh controller writes should carry, and the queue of those that
        differ. Only the leader computes it (a standby's queue would never be written)."""
        if not self.leading:
            self.wanted, self.queue = {}, {}
            self.metrics.queue_depth.set(0)
            return
        self.wanted = status_writes(analyse([dict(o) for o in self.objects.values()], mesh_controller=MESH_CONTROLLER))
        for ref in self.wanted:
            self._enqueue_if_different(ref)

    def desired(self, ref: Ref) -> dict[str, Any] | None:
        """The status `ref` should carry, computed from the copy we hold now."""
        return desired_of(self.objects, self.wanted, ref)

    def _enqueue_if_different(self, ref: Ref) -> None:
        raw = self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))
        want = self.desired(ref) if raw is not None else None
        if want is not None and want != (raw or {}).get("status", {}):
            self.queue[ref] = None
            self.metrics.queue_depth.set(len(self.queue))
            self.queue_event.set()

    def _next_write(self) -> Job[Ref] | None:
        """The writers' next job (kube/writer.py): the first queued object no worker holds."""
        return take_first(self.queue, self.writing, self.write, self.metrics.queue_depth.set)

    def _requeue(self, ref: Ref) -> None:
        self.queue[ref] = None

    async def write(self, ref: Ref) -> None:
        """One object's status, from the copy we hold (a conflict reads it again and computes again)."""
        kind = self.kinds.get((ref.group, ref.kind))
        raw = self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))
        want = self.desired(ref)
        if kind is None or raw is None or want is None or self.client is None or want == raw.get("status", {}):
            return

        async def seen(obj: dict[str, Any]) -> None:
            await self.on_event("MODIFIED", kind, obj)

        try:
            written = await patch_status_or_reread(self.client, kind, raw, want, self.opts.field_manager, seen)
        except ApiError as exc:
            self.metrics.writes.labels(str(exc.status.code)).inc()
            raise
        self.metrics.writes.labels(written).inc()
        self.writes_done += written == "ok"

    async def program(self) -> None:
        config = MeshConfig(allow_unmanaged_endpointslices=self.opts.allow_unmanaged_endpointslices,
                            allow_loopback_endpoints=self.opts.allow_loopback_endpoints,
                            worker_processes=self.opts.worker_processes,
                            egress=egress.config_of(self.opts.egress_listen, self.opts.egress_ports, self.addresses,
                                                    self.opts.allow_loopback_endpoints))
        t = time.perf_counter()
        view = mesh_view(self.objects.values())
        dp, files = build(view, self.opts.namespace, config)
        if config.egress is not None and self.addresses.missing():  # hosts named for the first time
            await self.resolve(self.addresses.missing())
            dp, files = build(view, self.opts.namespace, config)
        for w in dp.warnings:
            log.warning("%s", w)
        if files == self.applied:
            return
        result = await asyncio.get_running_loop().run_in_executor(self.pool, self.nginx.apply, files)
        if result.ok:
            self.applied, self.error = files, None
            self.metrics.reloads.labels("ok").inc()
            log.info("serving generation %d for namespace %s (%d servers) after %.2f s", result.generation,
                     self.opts.namespace, len(dp.servers), time.perf_counter() - t)
        else:
            self.error = result.error or "NGINX did not take the configuration"
            self.metrics.reloads.labels("failed").inc()
            log.error("NGINX refused the configuration: %s", self.error)
            self.wake.set()
            await asyncio.sleep(1.0)

    async def resolve(self, hosts: list[str]) -> bool:
        """Resolve `hosts` (off the event loop); whether an answer changed."""
        loop = asyncio.get_running_loop()
        answers = await asyncio.gather(*(loop.run_in_executor(self.resolver, egress.resolve, h) for h in hosts))
        changed = False
        for host, addresses in zip(hosts, answers):
            if self.addresses.known.get(host) != addresses:
                changed = True
                if not addresses:
                    log.warning("ExternalService %s does not resolve: requests to it through the egress port get 502", host)
                else:
                    log.info("ExternalService %s resolves to %s", host, ", ".join(addresses))
            self.addresses.known[host] = addresses
        for gone in set(self.addresses.known) - set(self.addresses.asked) - set(hosts):
            del self.addresses.known[gone]
        return changed

    async def resolving(self) -> None:
        """Resolve the ExternalServices' hosts again every interval; render anew when an answer changed."""
        while True:
            await asyncio.sleep(self.opts.egress_resolve_interval)
            try:
                if await self.resolve(list(self.addresses.asked)):
                    self.wake.set()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("resolving the ExternalServices' hosts failed")
                self.metrics.errors.labels("resolve").inc()

    async def stopped(self) -> None:
        if self.nginx is not None:
            await asyncio.get_running_loop().run_in_executor(self.pool, self.nginx.stop)
        self.pool.shutdown(wait=False)
        self.resolver.shutdown(wait=False)


DESCRIPTION = """Run the mesh proxy of one client namespace: an NGINX that listens on every Service's
cluster IP and HTTP ports and carries the namespace's requests to the Services' endpoints, with the
mesh routes (HTTPRoutes whose parentRefs name a Service) that apply to them: the namespace's own
consumer routes of a Service where it has any, else the Service's producer routes, and the
gwpolicy.io policies of the mesh paths. Routes and policies apply once an XMesh whose controllerName
is gwpolicy.io/mesh-controller exists; without one, each Service's cluster IP forwards to its
endpoints as it is. Its egress port (--egress-listen) is an HTTP forward proxy for the namespace's
requests to hosts outside the cluster, with the policies of the ExternalServices naming them. Run
one per client namespace, where that namespace's outbound traffic goes (docs/mesh.md). Every proxy
takes part in one leader election (the Lease gwpolicy-mesh); the leader writes the routes'
status.parents entries for their Service parents and the XMesh's Accepted condition, only where
they differ. Ports below 1024 need root (or CAP_NET_BIND_SERVICE)."""


def _egress_listen(text: str) -> tuple[str, int] | None:
    try:
        return egress.parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _egress_ports(text: str) -> tuple[int, ...]:
    try:
        return egress.parse_ports(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse(argv: list[str]) -> MeshOptions:
    p = Parser(prog=f"{program_name()} mesh", formatter_class=HelpFormatter, description=DESCRIPTION,
               epilog="""examples:
  gwpolicy mesh --namespace shop --state-dir /var/lib/gwpolicy-mesh/shop
  ip netns exec shop gwpolicy mesh --namespace shop --kubeconfig kc.yaml   # in the namespace's network namespace
  gwpolicy mesh --namespace shop --lease-namespace gwpolicy-system          # the Lease every proxy shares
""")
    p.add_argument("--namespace", "-n", required=True, type=namespace_name,
                   help="the client namespace whose requests this proxy carries")
    p.add_argument("--state-dir", help="NGINX's files (default: a new temporary directory)")
    p.add_argument("--nginx", default="/usr/sbin/nginx", help="the NGINX binary")
    p.add_argument("--worker-processes", type=worker_processes, default="auto",
                   help="NGINX worker processes: auto (one per core) or a number")
    p.add_argument("--debounce", type=float, default=0.05, help="seconds to gather a burst of changes into one reload")
    p.add_argument("--allow-unmanaged-endpointslices", action="store_true",
                   help="use every EndpointSlice labelled with a Service's name, not only the EndpointSlice "
                        "controller's (as `gwpolicy gateway`)")
    p.add_argument("--allow-loopback-endpoints", action="store_true",
                   help="use loopback endpoint addresses (backends on this machine: tests, demos)")
    p.add_argument("--egress-listen", type=_egress_listen, metavar="ADDRESS:PORT|off",
                   default=f"{egress.DEFAULT_LISTEN[0]}:{egress.DEFAULT_LISTEN[1]}",
                   help="the egress port: an HTTP forward proxy (the workloads' http_proxy) that applies the policies "
                        "of ExternalServices to requests to their hosts (docs/mesh.md); off: none")
    p.add_argument("--egress-ports", type=_egress_ports, default=",".join(map(str, egress.DEFAULT_PORTS)),
                   metavar="PORT[,PORT...]",
                   help="the ports of an ExternalService's host the egress port serves (another port of it is refused)")
    p.add_argument("--egress-resolve-interval", type=positive_number, default=30.0, metavar="SECONDS",
                   help="how often the ExternalServices' hosts are resolved again")
    defaults.add_arguments(p, "mesh")
    a = p.parse_args(argv)
    serve.setup_logging(a.verbose)
    return MeshOptions(**defaults.options(a), namespace=a.namespace, state_dir=a.state_dir, debounce=a.debounce,
                       nginx=a.nginx, worker_processes=a.worker_processes,
                       allow_unmanaged_endpointslices=a.allow_unmanaged_endpointslices,
                       allow_loopback_endpoints=a.allow_loopback_endpoints, egress_listen=a.egress_listen,
                       egress_ports=a.egress_ports, egress_resolve_interval=a.egress_resolve_interval)


def main(argv: list[str]) -> int:
    from gwpolicy.gateway.nginx import NginxError

    opts = parse(argv)
    proxy = MeshProxy(opts)
    return serve.run(proxy, lambda: f"gwpolicy mesh for namespace {opts.namespace} serving health and metrics on "
                     f"port {proxy.port}", (NginxError, ListenError))


__all__ = ["MeshOptions", "MeshProxy", "main", "parse"]
