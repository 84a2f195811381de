"""Sandbox and controller in one event loop, for controller tests: faults, restarts and idleness."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from gwpolicy.controller.app import Controller, Options
from gwpolicy.engine.analysis import analyse
from gwpolicy.sandbox.seed import apply_all
from gwpolicy.sandbox.server import Sandbox, SandboxServer, preload_object, write_kubeconfig
from gwpolicy.sandbox.store import ApiFailure, Store

GW_CRDS = Path(__file__).resolve().parent.parent / "deploy" / "gateway-api" / "standard"  # the shipped bundle
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def gateway_api_crds() -> list[dict[str, Any]]:
    import yaml

    out = []
    for f in sorted(GW_CRDS.glob("gateway.networking.k8s.io_*.yaml")):
        out += [d for d in yaml.load_all(f.read_text(), Loader=yaml.CSafeLoader) if d and d.get("kind") == "CustomResourceDefinition"]
    out += [d for d in yaml.safe_load_all((DEPLOY / "10-policykind-crd.yaml").read_text()) if d]
    return out


CRDS = gateway_api_crds()


class Cluster:
    """`async with Cluster(tmp) as c`: a sandbox with Gateway API CRDs and the gwpolicy-system namespace."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sandbox = Sandbox(Store(keep_creation_timestamp=True), bookmark_interval=0.2)
        self.server = SandboxServer(self.sandbox)
        self.kubeconfig = tmp / "kubeconfig"
        self.controllers: list[Controller] = []

    def _preload(self) -> None:
        for obj in CRDS + [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gwpolicy-system"}}]:
            preload_object(self.sandbox.store, copy.deepcopy(obj))  # straight into storage: fast, and no manager

    async def __aenter__(self) -> "Cluster":
        self._preload()
        await self.server.start()
        write_kubeconfig(str(self.kubeconfig), self.server.port)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for c in self.controllers:
            await c.stop()
        await self.server.stop()

    async def restart(self) -> None:
        """The API server goes away and comes back with its data."""
        await self.server.restart()

    async def restart_without_data(self, objects: list[dict[str, Any]], strict: bool = False) -> None:
        """The API server comes back with empty storage (a new etcd), and `objects` are applied again:
        the same objects, new uids, resourceVersions counted from 1 again. `strict`: a watch from a
        resourceVersion the server has not reached is refused as kube-apiserver refuses it (504,
        ResourceVersionTooLarge) instead of being accepted."""
        await self.server.stop()
        old = self.sandbox.store
        store = Store(keep_creation_timestamp=old.keep_creation_timestamp)
        store.listeners.append(self.sandbox._fanout)  # noqa: SLF001 - the server's watch fan-out
        if strict:
            history = store.events_since

            def events_since(rv: int) -> list:
                if rv > store.rv:
                    raise ApiFailure(504, "Timeout", f"Too large resource version: {rv}, current: {store.rv}",
                                     {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                                      "retryAfterSeconds": 1})
                return history(rv)

            store.events_since = events_since  # type: ignore[method-assign]
        self.sandbox.store = store
        self._preload()
        await self.server.start()
        await self.seed(objects)

    def fail_lists(self, plural: str, code: int = 500) -> None:
        """Every list of `plural` answers `code` from now on (a kind the server cannot list), whole or
        in chunks (`heal_lists` ends it)."""
        store = self.sandbox.store
        self._lists = getattr(self, "_lists", None) or (store.list, store.page)

        def failing(listing):
            def fail(r, *args, **kwargs):
                if r.plural == plural:
                    raise ApiFailure(code, "InternalError", f"Internal error occurred: cannot list {plural} (injected)")
                return listing(r, *args, **kwargs)
            return fail

        store.list, store.page = failing(self._lists[0]), failing(self._lists[1])  # type: ignore[method-assign]

    def heal_lists(self) -> None:
        """Lists work again."""
        if getattr(self, "_lists", None):
            self.sandbox.store.list, self.sandbox.store.page = self._lists  # type: ignore[method-assign]
            self._lists = None

    async def seed(self, objects: list[dict[str, Any]]) -> None:
        await asyncio.to_thread(apply_all, self.server.url, copy.deepcopy(objects))

    async def apply(self, obj: dict[str, Any], manager: str = "test") -> dict[str, Any]:
        """Server-side apply one object as it is (no CRDs or namespaces made up around it)."""
        from gwpolicy.engine.kinds import split_api_version
        from gwpolicy.sandbox.seed import url_of

        group, _ = split_api_version(obj["apiVersion"])
        r = self.sandbox.store.registry.by_kind[(group, obj["kind"])]
        async with httpx.AsyncClient() as http:
            resp = await http.patch(url_of(self.server.url, obj, r.plural, r.namespaced),
                                    params={"fieldManager": manager, "force": "true"}, json=obj,
                                    headers={"Content-Type": "application/apply-patch+yaml"})
            resp.raise_for_status()
            return resp.json()

    async def controller(self, **opts: Any) -> Controller:
        o = Options(kubeconfig=str(self.kubeconfig), listen="127.0.0.1:0",
                    lease_namespace=opts.pop("lease_namespace", "gwpolicy-system"),
                    lease_duration=opts.pop("lease_duration", 1.5), breadcrumb_qps=opts.pop("breadcrumb_qps", 0),
                    resync=opts.pop("resync", 5.0), debounce=0.01, **opts)
        c = Controller(o)
        await c.start()
        self.controllers.append(c)
        return c

    async def idle(self, c: Controller, quiet: float = 0.3, timeout: float = 30, after: float | None = None) -> None:
        """Until the controller has seen an event later than `after` (when given), has nothing to do,
        and no event came for `quiet` seconds."""
        end = time.monotonic() + timeout
        while after is not None and c.last_event <= after and time.monotonic() < end:
            await asyncio.sleep(0.01)
        while time.monotonic() < end:
            if c.idle and time.monotonic() - c.last_event > quiet:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"controller not idle: stale={c.model.stale} queued={sum(map(len, c.queues))}")

    def objects(self) -> list[dict[str, Any]]:
        """Every object in the sandbox (what `gwpolicy status` would read from the cluster)."""
        return [copy.deepcopy(o) for o in self.sandbox.store.objects.values()]

    @property
    def writes(self) -> int:
        """Writes to anything but Leases (leader election renews its lease all along)."""
        return sum(n for plural, n in self.sandbox.store.writes_by.items() if plural != "leases")

    async def faults(self, **spec: Any) -> None:
        async with httpx.AsyncClient(base_url=self.server.url) as http:
            await http.post("/sandbox/faults", json=spec)


def strip_times(value: Any) -> Any:
    """Status without lastTransitionTime (the controller's clock is not the offline one)."""
    if isinstance(value, dict):
        return {k: strip_times(v) for k, v in value.items() if k != "lastTransitionTime"}
    if isinstance(value, list):
        return [strip_times(v) for v in value]
    return value


def offline_expectation(objects: list[dict[str, Any]], controller: str = "gwpolicy.io/policy-controller"):
    """What `gwpolicy status` computes offline: object key -> (status, annotations) after the write."""
    a = analyse(copy.deepcopy(objects), controller=controller, now="2000-01-01T00:00:00Z")
    return {(ch.object.group, ch.object.kind, ch.object.namespace or "", ch.object.name):
            (strip_times(ch.status), ch.annotations) for ch in a.status_changes()}


def key_of(raw: dict[str, Any]) -> tuple[str, str, str, str]:
    from gwpolicy.engine.kinds import split_api_version

    group, _ = split_api_version(raw["apiVersion"])
    return (group, raw["kind"], raw["metadata"].get("namespace") or "", raw["metadata"]["name"])


def differences(before: list[dict[str, Any]], after: list[dict[str, Any]], expected) -> list[str]:
    """Where the cluster after the controller differs from the offline computation."""
    problems = []
    prev = {key_of(o): o for o in before}
    for o in after:
        k = key_of(o)
        if k[1] == "Lease":
            continue
        got = (strip_times(o.get("status") or {}), dict(o["metadata"].get("annotations") or {}))
        if k in expected:
            want = expected[k]
            if got != want:
                problems.append(f"{k}: wrote {got}, offline says {want}")
        elif k in prev:
            old = (strip_times(prev[k].get("status") or {}), dict(prev[k]["metadata"].get("annotations") or {}))
            if got != old:
                problems.append(f"{k}: changed although offline says it needs no write: {old} -> {got}")
    return problems


class KubeCluster(Cluster):
    """`Cluster`'s face on a real kube-apiserver (tests/kube_apiserver.py): the same CRDs and namespace,
    deploy/'s RBAC (and the ClusterRoles of the seeded policy groups, as deploy/ tells a user to add
    them), and controllers that run as deploy/'s ServiceAccount with a token from the TokenRequest API.
    `writes` are that ServiceAccount's, from the audit log; `objects()` lists the kinds seeded and
    applied."""

    SA = "gwpolicy-controller"

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.kubeconfig = tmp / "kubeconfig"
        self.controllers = []
        self.server: Any = None
        self.kinds: set[tuple[str, str]] = {("v1", "Namespace"), ("v1", "Service"),
                                            ("apiextensions.k8s.io/v1", "CustomResourceDefinition")}
        self.groups: set[str] = set()

    async def __aenter__(self) -> "KubeCluster":
        from live_server import fresh_kube

        self.server = await asyncio.to_thread(fresh_kube)  # the CRDs and deploy/'s RBAC are in
        try:
            self.kubeconfig = await asyncio.to_thread(self.server.identity, self.SA)
        except BaseException:
            self.server.close()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            for c in self.controllers:
                await c.stop()
        finally:
            self.server.close()

    async def restart(self) -> None:
        await asyncio.to_thread(self.server.restart)

    async def _grant(self, objects: list[dict[str, Any]]) -> None:
        """The ClusterRoles of the policy groups among `objects`' CRDs not granted yet."""

        groups = {o["spec"]["group"] for o in objects if o.get("kind") == "CustomResourceDefinition"}
        groups -= self.groups | {"gateway.networking.k8s.io", "gwpolicy.io"}
        if groups:
            self.groups |= groups
            await asyncio.to_thread(self.server.install_deploy, policy_groups=sorted(groups))

    async def seed(self, objects: list[dict[str, Any]]) -> None:
        """As the sandbox's `apply_all`: with a permissive CRD made up for a kind that has none, and the
        namespaces objects name."""
        from gwpolicy.sandbox.seed import ordered

        have = {c["metadata"]["name"] for c in CRDS}
        objects = [o for o in ordered(CRDS + objects)
                   if not (o.get("kind") == "CustomResourceDefinition" and o["metadata"]["name"] in have)]
        self.kinds |= {(o["apiVersion"], o["kind"]) for o in objects}
        await self._grant(objects)
        await asyncio.to_thread(self.server.apply, copy.deepcopy(objects))

    async def apply(self, obj: dict[str, Any], manager: str = "test") -> dict[str, Any]:
        self.kinds.add((obj["apiVersion"], obj["kind"]))
        body = {k: v for k, v in copy.deepcopy(obj).items() if k != "status"}  # as the sandbox's: status not applied
        return (await asyncio.to_thread(self.server.apply, [body], manager))[0]

    def objects(self) -> list[dict[str, Any]]:
        from live_server import objects_of

        return objects_of(self.server, sorted(self.kinds))

    @property
    def writes(self) -> int:
        return self.server.writes(self.SA)


def cluster(kind: str, tmp: Path) -> Cluster:
    """A `Cluster` on the server of `kind` ("sandbox" or "kube")."""
    return KubeCluster(tmp) if kind == "kube" else Cluster(tmp)
