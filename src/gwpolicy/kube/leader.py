"""Leader election on a coordination.k8s.io/v1 Lease: only the holder writes; a standby takes over
once the holder has not renewed for the lease duration.

Expiry follows client-go: a candidate does not compare the holder's `renewTime` with its own clock
(clocks of two machines differ); it notes, on its local monotonic clock, when it last saw the lease
record change, and takes the lease once `leaseDurationSeconds` have passed since without a change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from lightkube import ApiError, AsyncClient

from gwpolicy.kube import client as kube

log = logging.getLogger("gwpolicy.leader")
LEASE = kube.Kind("coordination.k8s.io", "v1", "Lease", "leases", True)
REPEAT_PROBLEM_EVERY = 60.0  # seconds between repeated log lines about the same problem
BLOCKING = ("namespace-missing", "forbidden")  # problems no retry will fix: /readyz says so


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


def _record(spec: dict[str, Any]) -> tuple:
    return tuple(spec.get(k) for k in ("holderIdentity", "renewTime", "acquireTime", "leaseTransitions",
                                       "leaseDurationSeconds"))


def _missing_namespace(exc: ApiError) -> bool:
    details = getattr(exc.status, "details", None)
    return exc.status.code == 404 and (getattr(details, "kind", None) == "namespaces"
                                       or "namespaces" in (exc.status.message or ""))


class LeaderElector:
    def __init__(self, client: AsyncClient, identity: str, namespace: str, name: str = "gwpolicy-controller",
                 duration: float = 15.0, on_change: Callable[[bool], None] | None = None,
                 on_error: Callable[[str], None] | None = None,
                 rbac: str = "deploy/20-rbac.yaml, Role gwpolicy-leader-election") -> None:
        self.client, self.identity, self.namespace, self.name = client, identity, namespace, name
        self.rbac = rbac  # where deploy/ grants this process its Lease (the forbidden message names it)
        self.duration = duration
        self.renew_every = duration / 3
        self.on_change = on_change
        self.on_error = on_error  # called with a short reason ("namespace-missing", "api") on each failure
        self.is_leader = False
        self.problem: str | None = None  # what keeps leader election from working, in words a user can act on
        self.blocking = False  # the problem is one of set-up (not a passing error): the replica is not ready
        self._last_renew: float | None = None  # monotonic time of our last successful renewal
        self._observed: tuple | None = None  # the lease record as last seen
        self._observed_at = 0.0  # monotonic time it last changed
        self._logged: dict[str, float] = {}
        self._released = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> "asyncio.Task[None]":
        """Run the election in a task (the caller's to shut down with its others; `release` ends it first)."""
        self._task = asyncio.create_task(self.run(), name="leader")
        return self._task

    def _set(self, leader: bool) -> None:
        if leader != self.is_leader:
            log.info("%s is %s", self.identity, "now the leader" if leader else "no longer the leader")
            self.is_leader = leader
            if self.on_change:
                self.on_change(leader)

    def _report(self, reason: str, message: str) -> None:
        self.problem = message
        self.blocking = reason in BLOCKING
        if self.on_error:
            self.on_error(reason)
        last = self._logged.get(message)
        if last is None or time.monotonic() - last > REPEAT_PROBLEM_EVERY:
            self._logged[message] = time.monotonic()
            (log.error if reason == "namespace-missing" else log.warning)("lease: %s", message)

    async def run(self) -> None:
        while not self._released:
            try:
                await self._try()
                self.problem, self.blocking = None, False
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if _missing_namespace(exc):
                    self._report("namespace-missing",
                                 f"the namespace {self.namespace!r} of the leader-election Lease does not exist, so "
                                 "this replica never leads and writes nothing. Create it (kubectl apply -f "
                                 "deploy/00-namespace.yaml, or kubectl create namespace " + self.namespace +
                                 "), or choose another with --lease-namespace, or run one replica with "
                                 "--no-leader-election")
                elif exc.status.code == 403:
                    self._report("forbidden", f"not allowed to read or write the Lease in {self.namespace!r}: "
                                 f"{exc.status.message}; grant get, create and update on leases there "
                                 f"({self.rbac})")
                else:
                    self._report("api", f"HTTP {exc.status.code}: {exc.status.message}")
            except Exception as exc:  # noqa: BLE001 - an unreachable server must not kill the elector
                self._report("unreachable", f"{type(exc).__name__}: {exc}")
            if self.is_leader and self._last_renew is not None and time.monotonic() - self._last_renew > self.duration:
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
            body: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                    "metadata": {"name": self.name, "namespace": self.namespace},
                                    "spec": dict(spec, acquireTime=_fmt(now), leaseTransitions=0)}
            await self.client.create(kube.resource_class(LEASE)(body), namespace=self.namespace)  # type: ignore[call-overload]  # lightkube's overloads omit the namespace= it takes
            self._last_renew = time.monotonic()
            self._set(True)
            return
        held = lease.get("spec") or {}
        holder = held.get("holderIdentity")
        record = _record(held)
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        duration = float(held.get("leaseDurationSeconds") or self.duration)
        expired = not holder or time.monotonic() > self._observed_at + duration
        if holder != self.identity and not expired:
            self._set(False)
            return
        new = dict(held, **spec)
        if holder != self.identity:
            new["acquireTime"] = _fmt(now)
            new["leaseTransitions"] = int(held.get("leaseTransitions") or 0) + 1
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": new}
        try:  # the resourceVersion makes this a compare-and-swap: of two contenders one gets 409
            await self.client.replace(kube.resource_class(LEASE)(body), namespace=self.namespace)  # type: ignore[call-overload]  # lightkube's overloads omit the namespace= it takes
        except ApiError as exc:
            if exc.status.code == 409:
                self._set(False)
                return
            raise
        self._last_renew = time.monotonic()
        self._set(True)

    async def release(self) -> None:
        """Give the lease up on a clean stop, so a standby need not wait for it to expire (as client-go's
        ReleaseOnCancel: no holder, and a duration of one second). The election ends first: a
        renewal after the release would take the lease again, and a standby would wait it out."""
        self._released = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])
        if not self.is_leader:
            return
        try:
            lease = await kube.get_object(self.client, LEASE, self.name, self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["leaseDurationSeconds"] = 1
                lease["spec"]["renewTime"] = _fmt(_now() - timedelta(days=1))
                await self.client.replace(kube.resource_class(LEASE)(lease), namespace=self.namespace)  # type: ignore[call-overload]  # lightkube's overloads omit the namespace= it takes
        except Exception:  # noqa: BLE001
            pass
        self._set(False)
