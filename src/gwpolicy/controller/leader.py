"""Leader election on a coordination.k8s.io/v1 Lease: only the holder writes; a standby takes over
once the holder has not renewed for the lease duration."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from lightkube import ApiError, AsyncClient

from gwpolicy.controller import kube

log = logging.getLogger("gwpolicy.leader")
LEASE = kube.Kind("coordination.k8s.io", "v1", "Lease", "leases", True)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


class LeaderElector:
    def __init__(self, client: AsyncClient, identity: str, namespace: str, name: str = "gwpolicy-controller",
                 duration: float = 15.0, on_change: Callable[[bool], None] | None = None) -> None:
        self.client, self.identity, self.namespace, self.name = client, identity, namespace, name
        self.duration = duration
        self.renew_every = duration / 3
        self.on_change = on_change
        self.is_leader = False
        self._last_renew: datetime | None = None

    def _set(self, leader: bool) -> None:
        if leader != self.is_leader:
            log.info("%s is %s", self.identity, "now the leader" if leader else "no longer the leader")
            self.is_leader = leader
            if self.on_change:
                self.on_change(leader)

    async def run(self) -> None:
        while True:
            try:
                await self._try()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - an unreachable server must not kill the elector
                log.warning("lease: %s", exc)
            if self.is_leader and self._last_renew and (_now() - self._last_renew).total_seconds() > self.duration:
                self._set(False)  # could not renew in time: someone else may hold it now
            await asyncio.sleep(self.renew_every)

    async def _try(self) -> None:
        now = _now()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": int(max(1, self.duration)),
                "renewTime": _fmt(now)}
        try:
            lease = await kube.get_object(self.client, LEASE, self.name, self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": dict(spec, acquireTime=_fmt(now), leaseTransitions=0)}
            await self.client.create(kube.resource_class(LEASE)(body), namespace=self.namespace)
            self._last_renew = now
            self._set(True)
            return
        held = lease.get("spec") or {}
        holder = held.get("holderIdentity")
        renewed = _parse(held.get("renewTime"))
        expired = renewed is None or now - renewed > timedelta(seconds=float(held.get("leaseDurationSeconds") or self.duration))
        if holder != self.identity and not expired:
            self._set(False)
            return
        new = dict(held, **spec)
        if holder != self.identity:
            new["acquireTime"] = _fmt(now)
            new["leaseTransitions"] = int(held.get("leaseTransitions") or 0) + 1
        body: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                "metadata": {"name": self.name, "namespace": self.namespace,
                                             "resourceVersion": lease["metadata"]["resourceVersion"]},
                                "spec": new}
        try:  # the resourceVersion makes this a compare-and-swap: of two contenders one gets 409
            await self.client.replace(kube.resource_class(LEASE)(body), namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 409:
                self._set(False)
                return
            raise
        self._last_renew = now
        self._set(True)

    async def release(self) -> None:
        """Give the lease up on a clean stop, so a standby need not wait for it to expire."""
        if not self.is_leader:
            return
        try:
            lease = await kube.get_object(self.client, LEASE, self.name, self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["renewTime"] = _fmt(_now() - timedelta(days=1))
                await self.client.replace(kube.resource_class(LEASE)(lease), namespace=self.namespace)
        except Exception:  # noqa: BLE001
            pass
        self._set(False)
