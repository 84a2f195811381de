"""The mesh controller's status, written by `gwpolicy mesh`: every proxy (one per client namespace)
takes part in one leader election on the Lease gwpolicy-mesh; the holder writes each mesh route's
`status.parents[]` entries for its Service parents and the XMesh's `Accepted`, keeps other
controllers' entries, writes nothing that is right already; a standby writes nothing, and takes
over when the leader dies. Against the sandbox and kube-apiserver, where the proxies run as
deploy/'s ServiceAccount gwpolicy-mesh and nothing they ask is refused."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from typing import Any, Iterator

import pytest

import netns
from gateway_proc import wait_until
from gwpolicy.engine.mesh import MESH_CONTROLLER
from mesh_harness import XMESH, Mesh, namespace

WHY = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")

A, B, S = "mesh-sa", "mesh-sb", "mesh-ss"
SYSTEM = "gwpolicy-system"
HTTPROUTE = "gateway.networking.k8s.io/v1"
LEASE_SECONDS = 3


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": S},
           "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


def _route(ns: str, name: str, parent: dict[str, Any], backend: str = "s") -> dict[str, Any]:
    return {"apiVersion": HTTPROUTE, "kind": "HTTPRoute", "metadata": {"name": name, "namespace": ns},
            "spec": {"parentRefs": [parent], "rules": [{"backendRefs": [{"name": backend, "namespace": S, "port": 80}]}]}}


PRODUCER = _route(S, "producer", {"group": "", "kind": "Service", "name": "s", "port": 80})
CONSUMER = _route(A, "consumer", {"group": "", "kind": "Service", "name": "s", "namespace": S})
NO_SERVICE = _route(S, "nowhere", {"group": "", "kind": "Service", "name": "absent"}, backend="absent")
THEIRS = {"parentRef": {"group": "", "kind": "Service", "name": "s", "namespace": S, "port": 80},
          "controllerName": "example.net/mesh",
          "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "theirs",
                          "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}


@pytest.fixture
def mesh(server_kind: str, tmp_path: Any) -> Iterator[Mesh]:
    m = Mesh(server_kind, tmp_path, [A, B])
    try:
        m.server.install_deploy("80-mesh.yaml")
        m.apply([namespace(A), namespace(B), namespace(S), SERVICE])
        yield m
    finally:
        m.close()


def _start(m: Mesh, *clients: str) -> None:
    m.bind_cluster_ips()
    for ns in clients:
        m.start_proxy(ns, "--lease-namespace", SYSTEM, "--lease-duration", str(LEASE_SECONDS),
                      kubeconfig=m.server.identity("gwpolicy-mesh"))


def _ours(m: Mesh, ns: str, name: str) -> list[dict[str, Any]]:
    parents = (m.get("httproute", ns, name).get("status") or {}).get("parents") or []
    return [p for p in parents if p.get("controllerName") == MESH_CONTROLLER]


def _conds(entry: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in entry.get("conditions") or []}


def _xmesh(m: Mesh) -> dict[str, Any]:
    return json.loads(m.server.kubectl("get", "xmesh", XMESH["metadata"]["name"], "-o", "json").stdout)  # type: ignore[no-any-return]


def _holder(m: Mesh) -> str:
    return str((m.get("lease", SYSTEM, "gwpolicy-mesh").get("spec") or {}).get("holderIdentity") or "")


def _logs(m: Mesh) -> str:
    return "\n".join(f"--- {ns}\n{m.log(ns)}" for ns in m.proxies)


def test_the_leader_writes_route_parents_and_the_xmesh_and_a_standby_takes_over(mesh: Mesh) -> None:
    m = mesh
    m.apply([PRODUCER, CONSUMER, NO_SERVICE])
    _start(m, A, B)
    accepted = {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    wait_until(lambda: [_conds(p) for p in _ours(m, S, "producer")] == [accepted], 60,
               what=f"the producer route's status\n{_logs(m)}")
    producer = _ours(m, S, "producer")[0]
    assert producer["parentRef"] == {"group": "", "kind": "Service", "name": "s", "namespace": S, "port": 80}
    wait_until(lambda: [_conds(p) for p in _ours(m, A, "consumer")] == [accepted], 30, what="the consumer route's status")
    assert _ours(m, A, "consumer")[0]["parentRef"]["namespace"] == S  # the Service's namespace, written out
    wait_until(lambda: [_conds(p) for p in _ours(m, S, "nowhere")] == [
        {"Accepted": ("False", "NoMatchingParent"), "ResolvedRefs": ("False", "BackendNotFound")}], 30,
        what="the route of a missing Service")
    xmesh = wait_until(lambda: (x := _xmesh(m)) and _conds(x.get("status") or {}) == {"Accepted": ("True", "Accepted")}
                       and x, 30, what="the XMesh's Accepted")
    assert xmesh["status"]["conditions"][0]["observedGeneration"] == xmesh["metadata"]["generation"]
    leader = _holder(m)
    assert leader in (f"mesh-{A}", f"mesh-{B}")

    # another controller's entry is kept beside ours: a write that replaced the list gets ours back
    m.server.kubectl("patch", "httproute", "producer", "-n", S, "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": {"parents": [THEIRS]}}))
    wait_until(lambda: [p.get("controllerName") for p in (m.get("httproute", S, "producer")["status"]["parents"])]
               == ["example.net/mesh", MESH_CONTROLLER], 30, what="our entry beside theirs")
    assert m.get("httproute", S, "producer")["status"]["parents"][0] == THEIRS

    # what is right already is not written again: other changes come and go, these stay as they are
    versions = {name: m.get("httproute", ns, name)["metadata"]["resourceVersion"]
                for ns, name in ((S, "producer"), (A, "consumer"), (S, "nowhere"))}
    m.apply([{**SERVICE, "metadata": {"name": "other", "namespace": S}}])
    time.sleep(2.0)
    assert {name: m.get("httproute", ns, name)["metadata"]["resourceVersion"]
            for ns, name in ((S, "producer"), (A, "consumer"), (S, "nowhere"))} == versions

    # the leader dies (no release): the standby takes the Lease once it expires, and writes
    dead = A if leader == f"mesh-{A}" else B
    m.kill(dead)
    standby = f"mesh-{B if dead == A else A}"
    later = _route(B, "later", {"group": "", "kind": "Service", "name": "s", "namespace": S})
    m.apply([later])
    wait_until(lambda: [_conds(p) for p in _ours(m, B, "later")] == [accepted], 30 + LEASE_SECONDS,
               what=f"the new leader's write\n{_logs(m)}")
    assert _holder(m) == standby
    assert m.server.refused("gwpolicy-mesh") == [], "deploy/'s RBAC refused the mesh these"


class Intruder:
    """Holds the Lease gwpolicy-mesh for an identity of its own, renewing it every half second."""

    def __init__(self, m: Mesh) -> None:
        self.m, self.stop = m, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def lease(self) -> dict[str, Any]:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "gwpolicy-mesh", "namespace": SYSTEM},
                "spec": {"holderIdentity": "intruder", "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now,
                         "acquireTime": now}}

    def run(self) -> None:
        while not self.stop.is_set():
            self.m.apply([self.lease()])
            self.stop.wait(0.5)

    def __enter__(self) -> "Intruder":
        self.m.apply([self.lease()])
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_a_replica_without_the_lease_writes_nothing_and_one_that_loses_it_stops(mesh: Mesh) -> None:
    m = mesh
    m.apply([PRODUCER])
    with Intruder(m):
        _start(m, A)
        ip = m.cluster_ip(S, "s")
        wait_until(lambda: m.send(A, ip, 80, "/", timeout=5)[0], 60,  # it serves (s has no endpoints: 5xx)
                   what=f"the proxy serving\n{_logs(m)}")
        time.sleep(LEASE_SECONDS + 1.0)
        assert _ours(m, S, "producer") == []
        assert _conds(_xmesh(m).get("status") or {}) == {"Accepted": ("Unknown", "Pending")}  # the CRD's default
    wait_until(lambda: _ours(m, S, "producer"), 30 + LEASE_SECONDS, what=f"the proxy's write once it leads\n{_logs(m)}")
    assert _holder(m) == f"mesh-{A}"
    # the Lease taken away: the proxy stops writing
    with Intruder(m):
        wait_until(lambda: _holder(m) == "intruder", 10, what="the intruder's Lease")
        time.sleep(1.0)  # the proxy reads the Lease again (every lease duration / 3) and steps down
        m.apply([CONSUMER])
        time.sleep(LEASE_SECONDS + 1.0)
        assert _ours(m, A, "consumer") == []
    wait_until(lambda: _ours(m, A, "consumer"), 30 + LEASE_SECONDS, what="the proxy's write once it leads again")
