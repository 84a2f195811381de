"""gateway/replicas.py: what the leader counts as served by every ready replica (Programmed), from
the replicas' Leases, on a clock the test moves."""

from __future__ import annotations

import asyncio

from lightkube import ApiError

from gwpolicy.engine.refs import Ref
from gwpolicy.gateway.replicas import ADDRESSES, REPLICA_OF, SERVING, Publisher, Replicas, lease_name

GW = Ref("gateway.networking.k8s.io", "Gateway", "ns", "gw")
ROUTE = Ref("gateway.networking.k8s.io", "HTTPRoute", "ns", "r")


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def _lease(identity: str, digest: str, renew: str = "t1", lease: str = "gwpolicy-gateway") -> dict:
    return {"metadata": {"name": lease_name(lease, identity), "labels": {REPLICA_OF: lease},
                         "annotations": {SERVING: digest, ADDRESSES: f"10.0.0.{identity[-1]}"}},
            "spec": {"holderIdentity": identity, "renewTime": renew, "leaseDurationSeconds": 15}}


def _seen(r: Replicas, *leases: dict, etype: str = "MODIFIED") -> None:
    for lease in leases:
        asyncio.run(r.on_event(etype, None, lease))


def test_programmed_waits_for_every_ready_replica_and_a_dead_one_stops_counting():
    clock, changes = Clock(), []
    r = Replicas("gwpolicy-gateway", lambda: changes.append(1), clock)
    r.built("d1", {GW: 1, ROUTE: 1})
    r.built("d2", {GW: 2, ROUTE: 1})  # the Gateway edited: generation 2
    _seen(r, _lease("pod-1", "d2"), _lease("pod-2", "d1"))
    assert changes
    # pod-2 still serves generation 1 of the Gateway: only the route is served by all
    assert r.served_by_all("pod-1", {GW: 2, ROUTE: 1}) == {ROUTE: 1}
    _seen(r, _lease("pod-2", "d2", renew="t2"))
    assert r.served_by_all("pod-1", {GW: 2, ROUTE: 1}) == {GW: 2, ROUTE: 1}
    assert r.addresses() == {"10.0.0.1", "10.0.0.2"}
    # pod-2 falls back to d1 and then dies: it counts until its Lease expires (15 s without a change)
    _seen(r, _lease("pod-2", "d1", renew="t3"))
    assert r.served_by_all("pod-1", {GW: 2, ROUTE: 1}) == {ROUTE: 1}
    clock.t += 16
    _seen(r, _lease("pod-1", "d2", renew="t4"))
    assert r.ready() == ["pod-1"] and r.addresses() == {"10.0.0.1"}
    assert r.served_by_all("pod-1", {GW: 2, ROUTE: 1}) == {GW: 2, ROUTE: 1}


def test_a_replica_ahead_of_the_leader_counts_with_what_it_served_before_and_a_deleted_one_not_at_all():
    clock = Clock()
    r = Replicas("gwpolicy-gateway", lambda: None, clock)
    r.built("d1", {GW: 1})
    _seen(r, _lease("pod-2", "d1"))
    _seen(r, _lease("pod-2", "d9", renew="t2"))  # built from objects the leader has not seen yet
    assert r.served_by_all("pod-1", {GW: 1}) == {GW: 1}
    _seen(r, _lease("pod-3", "d9"))  # never served anything the leader built: not counted yet
    assert r.served_by_all("pod-1", {GW: 1}) == {GW: 1}
    r.built("d9", {GW: 2})
    assert r.served_by_all("pod-1", {GW: 2}) == {GW: 2}
    _seen(r, _lease("pod-2", "d9"), etype="DELETED")
    assert r.ready() == ["pod-3"]
    # another gateway's replicas (another lease name) are none of ours
    _seen(r, _lease("pod-4", "d1", lease="other-gateway"))
    assert "pod-4" not in r.ready()


def test_a_lease_name_is_valid_whatever_the_identity():
    assert lease_name("gwpolicy-gateway", "gw-7d9f-abcde") == "gwpolicy-gateway-gw-7d9f-abcde"
    odd = lease_name("gwpolicy-gateway", "Host_Name:1234")
    assert odd.startswith("gwpolicy-gateway-") and odd == odd.lower() and len(odd) <= 253 and "_" not in odd


class _LeaseServer:
    """A fake API server for one replica's Lease: a renewal of a missing Lease gets 404 (then the
    publisher creates it), and each renewal takes `delay`, so a stop can land in the middle of one."""

    def __init__(self, delay: float) -> None:
        self.delay, self.lease, self.calls = delay, None, []

    async def merge_patch(self, client, kind, name, namespace, body, manager):
        self.calls.append("patch")
        await asyncio.sleep(self.delay)
        if self.lease is None:
            import httpx2 as httpx

            raise ApiError(response=httpx.Response(404, json={"kind": "Status", "code": 404, "message": "not found"}))
        self.lease = body

    async def create(self, obj, namespace=None):
        self.calls.append("create")
        self.lease = obj

    async def delete(self, kind, name, namespace=None):
        self.calls.append("delete")
        self.lease = None


def test_a_clean_stop_leaves_no_replica_lease_even_during_a_renewal(monkeypatch):
    """close() during a renewal (a patch that finds no Lease and would create it): the renewal ends
    first and the Lease is deleted last, never created again after its deletion."""
    from gwpolicy.gateway import replicas

    async def scenario() -> list[str]:
        server = _LeaseServer(delay=0.2)
        monkeypatch.setattr(replicas.kube, "merge_patch", server.merge_patch)
        pub = Publisher(server, "pod-1", "ns", "gwpolicy-gateway", duration=0.3)  # type: ignore[arg-type]
        pub.set("d1")
        task = pub.start()
        while server.calls.count("patch") < 3:  # renewals on the clock, one of them in flight now
            await asyncio.sleep(0.01)
        await pub.close()
        await asyncio.sleep(0.5)  # a renewal left running would have created the Lease again by now
        assert server.lease is None, server.calls  # no Lease left behind
        assert task.done()
        return server.calls

    calls = asyncio.run(scenario())
    assert calls[-1] == "delete" and calls.count("delete") == 1, calls
