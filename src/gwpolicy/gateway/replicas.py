"""Every replica of `gwpolicy gateway` serves; each says what it serves in a Lease of its own.

Every replica runs NGINX with the configuration it renders from its own informers (rendering is
deterministic: equal objects give byte-equal files, so one digest, nginx.files_digest). A replica
publishes the digest of the configuration its NGINX serves in a coordination.k8s.io/v1 Lease of
its own in the leader-election namespace: named `<lease>-<identity>` (a digest of the identity
when that is no valid name), labelled `gateway.gwpolicy.io/replica-of: <lease>`, holderIdentity
its identity, the digest in the annotation `gateway.gwpolicy.io/serving`, renewed every third of
the lease duration and at once when the digest changes. A replica publishes only while it is
ready (its informers synced, its NGINX serving); a clean stop deletes its Lease.

The leader, the one replica that writes status, watches those Leases. A replica counts as ready
while its Lease record keeps changing: as leader election judges the leader's Lease (client-go's
rule), by the leader's own monotonic clock, never by comparing another machine's renewTime with
its own; a Lease not renewed for its duration is a replica gone. An object is Programmed once every
ready replica serves a configuration built from its current generation (`served_by_all`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from lightkube import ApiError, AsyncClient

from gwpolicy.engine.refs import Ref
from gwpolicy.kube import client as kube
from gwpolicy.kube.leader import LEASE

log = logging.getLogger("gwpolicy.gateway.replicas")

REPLICA_OF = "gateway.gwpolicy.io/replica-of"
SERVING = "gateway.gwpolicy.io/serving"
ADDRESSES = "gateway.gwpolicy.io/pod-addresses"
HISTORY = 64  # configurations the leader remembers the generations of
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def lease_name(lease: str, identity: str) -> str:
    """The name of a replica's Lease: `<lease>-<identity>`, or with a digest of the identity when
    that would be no valid object name (an identity with capitals, or too long)."""
    name = f"{lease}-{identity}"
    if len(name) <= 253 and _NAME.match(name):
        return name
    return f"{lease}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Publisher:
    """This replica's Lease: created, renewed, its digest updated; deleted on a clean stop."""

    def __init__(self, client: AsyncClient, identity: str, namespace: str, lease: str, duration: float,
                 addresses: list[str] | None = None) -> None:
        self.client, self.identity, self.namespace, self.lease = client, identity, namespace, lease
        self.addresses = list(addresses or [])
        self.name = lease_name(lease, identity)
        self.duration = duration
        self.digest: str | None = None
        self._changed = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.problem: str | None = None

    def start(self) -> "asyncio.Task[None]":
        """Run the renewals in a task (the caller's to shut down with its others; `close` ends it first)."""
        self._task = asyncio.create_task(self.run(), name="replica-lease")
        return self._task

    def set(self, digest: str | None) -> None:
        """The digest of what this replica's NGINX serves now (None: it serves nothing, or is not ready)."""
        if digest != self.digest:
            self.digest = digest
            self._changed.set()

    async def run(self) -> None:
        while not self._closing:
            self._changed.clear()
            try:
                if self.digest is not None:
                    await self._renew()
                self.problem = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - an unreachable server must not stop the replica
                why = exc.status.message if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"
                if why != self.problem:
                    log.warning("cannot write this replica's Lease %s/%s: %s", self.namespace, self.name, why)
                self.problem = why
            try:
                await asyncio.wait_for(self._changed.wait(), self.duration / 3)
            except asyncio.TimeoutError:
                pass

    async def _renew(self) -> None:
        body: dict[str, Any] = {
            "metadata": {"labels": {REPLICA_OF: self.lease},
                         "annotations": {SERVING: self.digest, ADDRESSES: ",".join(self.addresses)}},
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(max(1, self.duration)),
                     "renewTime": _now()}}
        try:
            await kube.merge_patch(self.client, LEASE, self.name, self.namespace, body, "gwpolicy-gateway")
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            full = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": dict(body["metadata"], name=self.name, namespace=self.namespace),
                    "spec": dict(body["spec"], acquireTime=_now())}
            await self.client.create(kube.resource_class(LEASE)(full), namespace=self.namespace)  # type: ignore[call-overload]  # lightkube's overloads omit the namespace= it takes

    async def close(self, timeout: float = 5.0) -> None:
        """On a clean stop: no more renewals (one in flight ends first, else it could create the
        Lease again after its deletion), then the Lease deleted, so that the leader need not wait a
        lease duration to count this replica out."""
        self._closing = True
        self._changed.set()
        if self._task is not None and not self._task.done():
            _, pending = await asyncio.wait([self._task], timeout=timeout)
            for t in pending:
                t.cancel()
                await asyncio.wait([t])
        try:
            await self.client.delete(kube.resource_class(LEASE), self.name, namespace=self.namespace)
        except Exception:  # noqa: BLE001 - stopping goes on
            pass


@dataclass
class _Seen:
    identity: str
    digest: str | None
    addresses: list[str]
    duration: float
    record: tuple[Any, ...]
    changed_at: float  # monotonic time the record last changed


class Replicas:
    """What the leader knows of the replicas (from their Leases) and of the configurations it built."""

    def __init__(self, lease: str, on_change: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.lease = lease
        self.on_change = on_change
        self.clock = clock
        self.seen: dict[str, _Seen] = {}  # Lease name -> what it said
        #: digest -> the generations of the objects that configuration was built from (newest last)
        self.history: OrderedDict[str, dict[Ref, int | None]] = OrderedDict()
        #: replica identity -> the newest digest it published that is in `history`
        self.known: dict[str, str] = {}

    def built(self, digest: str, generations: dict[Ref, int | None]) -> None:
        """A configuration this replica built (and its NGINX serves)."""
        self.history[digest] = dict(generations)
        self.history.move_to_end(digest)
        while len(self.history) > HISTORY:
            self.history.popitem(last=False)
        for ident, s in ((s.identity, s) for s in self.seen.values()):
            if s.digest == digest:
                self.known[ident] = digest

    async def on_event(self, etype: str, kind: Any, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        if (meta.get("labels") or {}).get(REPLICA_OF) != self.lease:
            return
        name = meta.get("name", "")
        if etype == "DELETED":
            gone = self.seen.pop(name, None)
            if gone is not None:
                self.known.pop(gone.identity, None)
                self.on_change()
            return
        spec = raw.get("spec") or {}
        notes = meta.get("annotations") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), notes.get(SERVING), notes.get(ADDRESSES))
        old = self.seen.get(name)
        if old is not None and old.record == record:
            return
        addresses = [a.strip() for a in str(record[3] or "").split(",") if a.strip()]
        s = _Seen(str(spec.get("holderIdentity") or name), record[2], addresses,
                  float(spec.get("leaseDurationSeconds") or 15), record, self.clock())
        self.seen[name] = s
        if s.digest is not None and s.digest in self.history:
            self.known[s.identity] = s.digest
        if old is None or old.digest != s.digest or old.addresses != s.addresses:
            self.on_change()

    def ready(self) -> list[str]:
        """Identities of the replicas whose Lease changed within its duration."""
        now = self.clock()
        return sorted({s.identity for s in self.seen.values() if now <= s.changed_at + s.duration})

    def addresses(self) -> set[str]:
        """The pod addresses of the ready replicas."""
        now = self.clock()
        return {a for s in self.seen.values() if now <= s.changed_at + s.duration for a in s.addresses}

    def served_by_all(self, me: str, own_generations: dict[Ref, int | None]) -> dict[Ref, int | None]:
        """The objects (with their generations) in the configuration every ready replica serves:
        this replica's (`me`), and each other ready replica's newest known digest. A replica whose
        digest the leader has not built (it was quicker, or it started from other objects) counts
        with the one before; one with none known yet is not counted until it serves one."""
        out = dict(own_generations)
        for ident in self.ready():
            digest = self.known.get(ident)
            if ident == me or digest is None:
                continue
            gens = self.history.get(digest)
            if gens is None:  # older than the history: it lags far behind, nothing new is served by all
                return {}
            out = {r: g for r, g in out.items() if r in gens and gens[r] == g}
        return out
