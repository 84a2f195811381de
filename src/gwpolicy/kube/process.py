"""The shell of a long-running process that watches the API server (the controller, the gateway, the
webhook), written once so that the three cannot drift apart: its API client, its informers and the
kinds its CRDs make known, its leader election, its status writers (which write only while the
replica leads), its HTTP endpoints (`/healthz`, `/readyz`, `/statusz`, `/metrics`) on the listen
address of kube/defaults.py, and the order it starts and stops in. Each process is a
`WatchingProcess` that says only what is its own: what it watches (`watches`, `crd_kind`,
`reads_mesh`: the XMesh once its CRD exists, `on_event`), what it does once started (`started`:
its reconcile loop, its writers), what it reports (`not_ready`, `ready_text`, `status`), what it
does on taking or losing the Lease (`leader_changed`), and what it ends before and after the
shell's own stop (`stopping`, `stopped`).

Start: the API client; the process' own first step (`starting`: the gateway's NGINX); the endpoints
(a busy or malformed address is a ListenError and nothing else starts); an informer per kind of
`watches`; the Lease's namespace; the process' tasks (`started`); then leader election.
Stop: the process' own first steps (`stopping`); the Lease released (another replica takes over at
once); the tasks cancelled, the informers stopped, the endpoints and the client closed; `stopped`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from aiohttp import web
from lightkube import AsyncClient

from gwpolicy.kube import client as kube
from gwpolicy.kube import defaults
from gwpolicy.kube.client import Kind
from gwpolicy.kube.defaults import ProcessOptions
from gwpolicy.kube.endpoints import ListenError, healthz, metrics, serve_endpoints
from gwpolicy.kube.informer import Informer
from gwpolicy.kube.leader import LeaderElector
from gwpolicy.kube.writer import Job, StatusWriters


async def shut_down(tasks: list[asyncio.Task], informers: list[Informer], runner: web.AppRunner | None,
                    client: AsyncClient | None) -> None:
    """The end of a process that watches: its tasks cancelled and awaited, its informers stopped,
    its HTTP endpoints and API client closed."""
    for t in tasks:
        t.cancel()
    for i in informers:
        await i.stop()
    for t in tasks:
        try:
            await t
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping: a task's end is not news
            pass
    if runner:
        await runner.cleanup()
    if client:
        await kube.close_client(client)


class WatchingProcess:
    """The shell (the module docstring); a process subclasses it and overrides what is its own."""

    #: the command whose defaults it takes (kube/defaults.py: its listen port)
    command = "controller"
    #: the flag that sets `listen` (a ListenError names it)
    listen_flag = "--listen"
    #: its leader-election Lease, and where deploy/ grants it (a Forbidden message names it)
    lease_name = "gwpolicy-controller"
    lease_rbac = "deploy/20-rbac.yaml, Role gwpolicy-leader-election"
    #: the kinds it watches besides the CRDs and the kinds they make known
    builtin: list[Kind] = kube.BUILTIN
    #: whether it watches the XMesh once its CRD exists (the mesh is on with an XMesh of ours,
    #: docs/mesh.md): the controller and the webhook (its policies on mesh paths), the mesh proxies
    reads_mesh = False

    def __init__(self, opts: ProcessOptions, metrics: Any) -> None:
        self.opts: Any = opts
        #: `registry` (served on /metrics), `leader` (a gauge), and the informers' counters
        self.metrics = metrics
        self.client: AsyncClient | None = None
        self.informers: dict[Kind, Informer] = {}
        self.kinds: dict[tuple[str, str], Kind] = {}
        self.wake = asyncio.Event()  # kube/loop.py's Watching: set by every event that may change the analysis
        self.busy = False  # True while a pass runs
        self.elector: LeaderElector | None = None
        self.lease_namespace: str | None = opts.lease_namespace
        self.tasks: list[asyncio.Task] = []
        self.runner: web.AppRunner | None = None
        self.port: int | None = None

    # ---------- what each process supplies ----------
    def watches(self) -> list[Kind]:
        """The kinds watched from the start (CRDs add the policy kinds they define)."""
        return [kube.CRD, *self.builtin]

    async def on_event(self, etype: str, kind: Kind, raw: dict[str, Any]) -> None:
        """One list or watch event of an informer."""

    def informer_resync(self) -> float:
        """Seconds between full relists of every informer; 0: never."""
        return 0.0

    def not_ready(self) -> list[str]:
        """Why the process is not ready, one line per reason (/readyz); empty when it is."""
        return [] if self.synced else ["informers not synced"]

    def ready_text(self) -> str:
        """What /readyz says when ready."""
        return "ok"

    def status(self) -> dict[str, Any]:
        """What /statusz reports besides the leader election."""
        return {"synced": self.synced}

    async def starting(self) -> None:
        """Its first step, before the endpoints listen."""

    async def started(self) -> None:
        """Its tasks, once the informers run and the Lease's namespace is known."""

    def leader_changed(self, leader: bool) -> None:
        """This replica took (True) or lost (False) the Lease."""

    def lease_error(self, reason: str) -> None:
        """An attempt to take or renew the Lease failed (namespace-missing, forbidden, api, unreachable)."""

    async def stopping(self) -> None:
        """Its first steps at the end, while it still holds the Lease."""

    async def stopped(self) -> None:
        """Its last steps, after the shell's."""

    # ---------- written once ----------
    @property
    def synced(self) -> bool:
        """Every informer has listed its kind (and there is one)."""
        return bool(self.informers) and all(i.synced.is_set() for i in self.informers.values())

    @property
    def leading(self) -> bool:
        """Whether this replica may write: it holds the Lease, or runs without leader election."""
        return not self.opts.leader_election or (self.elector is not None and self.elector.is_leader)

    def election_problem(self) -> list[str]:
        """The leader election's problem while it keeps this replica from ever leading (RBAC, no namespace)."""
        if self.elector is not None and self.elector.problem is not None and self.elector.blocking:
            return [f"leader election: {self.elector.problem}"]
        return []

    def status_writers(self, take: Callable[[], Job[Any] | None], requeue: Callable[[Any], None], *,
                       wake: asyncio.Event | None = None, after: Callable[[], None] | None = None) -> StatusWriters[Any]:
        """The status writers of a process that writes (kube/writer.py), a failed write counted in
        its metrics (`errors`, where="write"). They take a job only while this replica may write
        (`leading`): a replica without the Lease never writes, whatever its queues hold."""
        return StatusWriters(lambda: take() if self.leading else None, requeue, self.metrics.errors.labels("write").inc,
                             wake=wake, after=after)

    def watch(self, kind: Kind) -> None:
        """An informer for `kind` (cluster-wide), once."""
        if kind in self.informers or self.client is None:
            return
        self.kinds[(kind.group, kind.kind)] = kind
        inf = Informer(self.client, kind, self.on_event, None, self.metrics, resync=self.informer_resync())
        self.informers[kind] = inf
        inf.start()
        log_for(self).info("watching %s", kind.api_version + "/" + kind.plural)

    def crd_kind(self, crd: dict[str, Any], objects: dict[tuple[str, str, str, str], dict[str, Any]]) -> Kind | None:
        """The kind a CRD defines when this process watches it besides the XMesh: a Gateway API kind
        or a policy kind (by its label, or named by a PolicyKind among `objects`)."""
        named = {((pk.get("spec") or {}).get("group", ""), (pk.get("spec") or {}).get("kind", ""))
                 for key, pk in objects.items() if key[:2] == ("gwpolicy.io", "PolicyKind")}
        return kube.kind_of_crd(crd, named)

    def consider_crd(self, crd: dict[str, Any], objects: dict[tuple[str, str, str, str], dict[str, Any]]) -> None:
        """Watch the kind a CRD defines when the process reads it (`crd_kind`; the XMesh when it
        `reads_mesh`); a CRD created again has its informer try at once."""
        kind = self.crd_kind(crd, objects)
        if kind is None and self.reads_mesh:
            kind = kube.mesh_kind_of_crd(crd)
        if kind is not None:
            if kind in self.informers:
                self.informers[kind].kick()  # need not wait out a backoff
            self.watch(kind)

    async def http(self) -> None:
        """/healthz, /readyz, /statusz and /metrics on `listen` (the command's default when unset)."""
        async def readyz(_: web.Request) -> web.Response:
            why = self.not_ready()
            if why:
                return web.Response(text="\n".join(why) + "\n", status=503)
            return web.Response(text=self.ready_text())

        async def statusz(_: web.Request) -> web.Response:
            return web.json_response({"leader": self.leading, "leaseNamespace": self.lease_namespace,
                                      "leaderElectionProblem": self.elector.problem if self.elector else None,
                                      **self.status()})

        self.runner, self.port = await serve_endpoints(
            self.opts.listen or defaults.listen(self.command),
            {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics(self.metrics.registry), "/statusz": statusz},
            self.listen_flag)

    async def start(self) -> None:
        """The start order of the module docstring."""
        self.client = kube.make_client(self.opts.kubeconfig, self.opts.context, self.opts.field_manager)
        await self.starting()
        try:
            await self.http()
        except ListenError:
            await kube.close_client(self.client)
            self.client = None
            raise
        for k in self.watches():
            self.watch(k)
        if self.opts.leader_election:
            self.lease_namespace = defaults.lease_namespace(self.opts.lease_namespace, self.client.namespace)
        await self.started()
        if self.opts.leader_election:
            assert self.lease_namespace is not None
            log_for(self).info("leader election on the Lease %s in namespace %s", self.lease_name, self.lease_namespace)
            self.elector = LeaderElector(self.client, self.opts.identity, self.lease_namespace, self.lease_name,
                                         duration=self.opts.lease_duration, on_change=self._leader_changed,
                                         on_error=self.lease_error, rbac=self.lease_rbac)
            self.tasks.append(self.elector.start())
        else:
            self.metrics.leader.set(1)

    def _leader_changed(self, leader: bool) -> None:
        self.metrics.leader.set(1 if leader else 0)
        self.leader_changed(leader)

    async def stop(self) -> None:
        """The stop order of the module docstring (also after a start that failed half-way)."""
        await self.stopping()
        if self.elector is not None:
            try:
                await self.elector.release()
            except Exception:  # noqa: BLE001 - stopping goes on
                pass
        await shut_down(self.tasks, list(self.informers.values()), self.runner, self.client)
        await self.stopped()


def log_for(process: WatchingProcess) -> logging.Logger:
    """The process' own logger (gwpolicy.controller, gwpolicy.gateway, gwpolicy.webhook)."""
    return logging.getLogger(f"gwpolicy.{process.command}")
