"""kube/leader.py on a fake API server that keeps one Lease (compare-and-swap on resourceVersion)."""

from __future__ import annotations

import asyncio
import copy

import httpx2 as httpx
from lightkube import ApiError

from gwpolicy.kube import leader


class _LeaseServer:
    def __init__(self) -> None:
        self.lease: dict | None = None
        self.version = 0

    def _store(self, body: dict) -> None:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)

    async def get_object(self, client, kind, name, namespace):
        await asyncio.sleep(0)
        if self.lease is None:
            raise ApiError(response=httpx.Response(404, json={"kind": "Status", "code": 404, "message": "not found"}))
        return copy.deepcopy(self.lease)

    async def create(self, obj, namespace=None):
        await asyncio.sleep(0)
        self._store(obj.to_dict())

    async def replace(self, obj, namespace=None):
        await asyncio.sleep(0)
        body = obj.to_dict()
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiError(response=httpx.Response(409, json={"kind": "Status", "code": 409, "message": "conflict"}))
        self._store(body)


def test_a_released_lease_is_not_taken_again_by_the_replica_that_released_it(monkeypatch):
    """After a clean stop's release, the Lease has no holder until a standby takes it: the releasing
    replica's own election, still on its clock, never renews it again."""
    server = _LeaseServer()
    monkeypatch.setattr(leader.kube, "get_object", server.get_object)

    async def scenario() -> None:
        elector = leader.LeaderElector(server, "pod-1", "ns", "gwpolicy-controller", duration=0.3)  # type: ignore[arg-type]
        task = elector.start()
        for _ in range(200):
            if elector.is_leader:
                break
            await asyncio.sleep(0.01)
        assert elector.is_leader
        await elector.release()
        await asyncio.sleep(0.5)  # five renewal periods
        assert server.lease is not None and server.lease["spec"]["holderIdentity"] == "", server.lease["spec"]
        assert task.done() and not elector.is_leader

    asyncio.run(scenario())
