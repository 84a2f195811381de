"""`gwpolicy mesh --namespace NS`: the proxy of one client namespace (the edge of the mesh).

It watches Namespaces, Services, EndpointSlices, HTTPRoutes and the gwpolicy.io policy kinds (once
their CRDs are there) on the process shell (kube/process.py), and on a change (debounced) renders
the proxy's configuration (mesh/render.py: every Service's cluster IP and HTTP ports, with the mesh
routes and the policies that apply to the namespace's requests) and has NGINX validate, load and verify it (gateway/nginx.py). It writes
nothing to the cluster: it holds no Lease and writes no status. SIGTERM and SIGINT stop NGINX
gracefully.

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
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gwpolicy.engine import names
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.options import worker_processes
from gwpolicy.kube import client as kube
from gwpolicy.kube import defaults, serve
from gwpolicy.kube.args import HelpFormatter, Parser, positive_number, program_name
from gwpolicy.kube.client import Kind
from gwpolicy.kube.defaults import ProcessOptions
from gwpolicy.kube.endpoints import ListenError
from gwpolicy.kube.loop import synced_bursts
from gwpolicy.kube.process import WatchingProcess
from gwpolicy.mesh import egress
from gwpolicy.mesh.render import MeshConfig, build

log = logging.getLogger("gwpolicy.mesh")

BUILTIN = [
    Kind("", "v1", "Namespace", "namespaces", False),
    Kind("", "v1", "Service", "services", True),
    Kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True, False),
]
#: the CRD kinds the proxy reads: mesh routes, and the policy kinds it applies on mesh paths
WATCHED_CRD_KINDS = {("gateway.networking.k8s.io", "HTTPRoute")} | {(policyconf.GROUP, k) for k in policyconf.KINDS}


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
        self.leader = Gauge("gwpolicy_mesh_leader", "Always 1: every proxy serves its namespace", registry=r)
        self.informer_failures = Counter("gwpolicy_mesh_informer_failures", "Failed lists and watches, by resource "
                                         "and operation", ["resource", "operation"], registry=r)
        self.informer_stuck = Gauge("gwpolicy_mesh_informer_stuck", "1 while the informer of a resource cannot make "
                                    "progress", ["resource"], registry=r)


class MeshProxy(WatchingProcess):
    """One client namespace's proxy on the process shell."""

    command = "mesh"
    builtin = BUILTIN

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

    async def on_event(self, etype: str, kind: Kind, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        meta.pop("managedFields", None)
        key = (kind.group, kind.kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if kind == kube.CRD:
            if etype != "DELETED":
                wanted = kube.kind_of_crd(raw, set())
                if wanted is not None and (wanted.group, wanted.kind) in WATCHED_CRD_KINDS:
                    self.watch(wanted)
            return
        raw.setdefault("apiVersion", kind.api_version)
        raw.setdefault("kind", kind.kind)
        if etype == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = raw
        self.wake.set()

    def not_ready(self) -> list[str]:
        why = [] if self.synced else ["informers not synced"]
        if self.applied is None:
            why.append(self.error or "NGINX serves no configuration yet")
        return why

    def status(self) -> dict[str, Any]:
        return {"synced": self.synced, "namespace": self.opts.namespace, "passes": self.passes,
                "serving": self.applied is not None, "error": self.error}

    async def starting(self) -> None:
        from gwpolicy.gateway.nginx import Nginx

        state = self.opts.state_dir or tempfile.mkdtemp(prefix="gwpolicy-mesh-")
        self.nginx = Nginx(state, binary=self.opts.nginx, outlive=True)

    async def started(self) -> None:
        self.wake.set()
        self.tasks.append(asyncio.create_task(self.loop(), name="mesh"))
        if self.opts.egress_listen is not None:
            self.tasks.append(asyncio.create_task(self.resolving(), name="egress-resolve"))

    async def loop(self) -> None:
        async for _ in synced_bursts(self, self.opts.debounce, lambda: self.synced):
            try:
                await self.program()
            except Exception:  # noqa: BLE001 - one bad object must not stop the proxy
                log.exception("programming the proxy failed")
                self.metrics.errors.labels("reconcile").inc()
            self.passes += 1

    async def program(self) -> None:
        config = MeshConfig(allow_unmanaged_endpointslices=self.opts.allow_unmanaged_endpointslices,
                            allow_loopback_endpoints=self.opts.allow_loopback_endpoints,
                            worker_processes=self.opts.worker_processes,
                            egress=egress.config_of(self.opts.egress_listen, self.opts.egress_ports, self.addresses,
                                                    self.opts.allow_loopback_endpoints))
        t = time.perf_counter()
        dp, files = build(list(self.objects.values()), self.opts.namespace, config)
        if config.egress is not None and self.addresses.missing():  # hosts named for the first time
            await self.resolve(self.addresses.missing())
            dp, files = build(list(self.objects.values()), self.opts.namespace, config)
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
consumer routes of a Service where it has any, else the Service's producer routes. Its egress port
(--egress-listen) is an HTTP forward proxy for the namespace's requests to hosts outside the
cluster, with the policies of the ExternalServices naming them. Run one per
client namespace, where that namespace's outbound traffic goes (docs/mesh.md). It writes nothing
to the cluster. Ports below 1024 need root (or CAP_NET_BIND_SERVICE)."""


def namespace_name(text: str) -> str:
    """A namespace name (an RFC 1123 label), for --namespace."""
    if not names.is_label(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name (lower-case letters, digits and '-', "
                                         "at most 63, starting and ending with a letter or digit)")
    return text


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
    defaults.add_arguments(p, "mesh", leader_election=False)
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
