"""`gwpolicy mesh` carries each client namespace's requests: one proxy per client namespace, each
in a network namespace of its own, serving the same cluster IP:port. A consumer route splits the
traffic of its own namespace only; another namespace keeps the producer's behaviour."""

from __future__ import annotations

import json

import pytest

import netns
from gateway_proc import wait_until
from mesh_harness import Mesh, namespace

WHY = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")

A, B, S = "mesh-a", "mesh-b", "mesh-s"
HTTPROUTE = "gateway.networking.k8s.io/v1"


def _svc(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": S},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


PRODUCER = {"apiVersion": HTTPROUTE, "kind": "HTTPRoute", "metadata": {"name": "producer", "namespace": S},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "s", "port": 80}],
                     "rules": [{"filters": [{"type": "ResponseHeaderModifier",
                                             "responseHeaderModifier": {"set": [{"name": "X-Route", "value": "producer"}]}}],
                                "backendRefs": [{"name": "s", "port": 80}]}]}}
CONSUMER = {"apiVersion": HTTPROUTE, "kind": "HTTPRoute", "metadata": {"name": "split", "namespace": A},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "s", "namespace": S}],
                     "rules": [{"filters": [{"type": "ResponseHeaderModifier",
                                             "responseHeaderModifier": {"set": [{"name": "X-Route", "value": "consumer"}]}}],
                                "backendRefs": [{"name": "s", "namespace": S, "port": 80, "weight": 1},
                                                {"name": "s-v2", "namespace": S, "port": 80, "weight": 1}]}]}}


@pytest.fixture
def mesh(server_kind, tmp_path):
    m = Mesh(server_kind, tmp_path, [A, B])
    try:
        m.apply([namespace(A), namespace(B), namespace(S), _svc("s"), _svc("s-v2")])
        v1, v2 = m.backend(S, "s-v1"), m.backend(S, "s-v2")
        m.publish(S, "s", [v1], {"http": v1.port})
        m.publish(S, "s-v2", [v2], {"http": v2.port})
        m.start_proxies()
        yield m
    finally:
        m.close()


def _answers(m: Mesh, client: str, ip: str, n: int) -> tuple[dict[str, int], set[str]]:
    """Which backend answered each of `n` requests from `client` to ip:80, and the X-Route values seen."""
    counts: dict[str, int] = {}
    routes: set[str] = set()
    for _ in range(n):
        status, headers, body = m.send(client, ip, 80, "/", host="s.mesh-s")
        assert status == 200, (client, status, body[:200])
        pod = json.loads(body)["pod"]
        backend = "-".join(pod.split("-")[:-2])
        counts[backend] = counts.get(backend, 0) + 1
        routes |= {v for k, v in headers if k.lower() == "x-route"} or {"none"}
    return counts, routes


def test_a_consumer_route_splits_only_its_own_namespaces_requests(mesh):
    m = mesh
    ip = m.cluster_ip(S, "s")
    for client in (A, B):
        m.wait_serving(client, ip, 80)
    # no route: every namespace's requests go to the Service's endpoints
    for client in (A, B):
        assert _answers(m, client, ip, 20) == ({"s-v1": 20}, {"none"})
    # the producer route applies to everyone
    m.apply([PRODUCER])
    for client in (A, B):
        wait_until(lambda: _answers(m, client, ip, 3)[1] == {"producer"}, 30, what=f"the producer route for {client}")
    # A's consumer route: A's requests are split and the producer route no longer applies to them
    m.apply([CONSUMER])
    wait_until(lambda: _answers(m, A, ip, 3)[1] == {"consumer"}, 30, what="the consumer route for mesh-a")
    counts, routes = _answers(m, A, ip, 200)
    assert routes == {"consumer"} and set(counts) == {"s-v1", "s-v2"}, (counts, routes)
    assert 0.3 <= counts["s-v2"] / 200 <= 0.7, counts
    # B, to the same cluster IP and port, keeps the producer's behaviour
    assert _answers(m, B, ip, 200) == ({"s-v1": 200}, {"producer"})
    # the consumer route gone, A is back on the producer route
    m.delete([CONSUMER])
    wait_until(lambda: _answers(m, A, ip, 3) == ({"s-v1": 3}, {"producer"}), 30, what="mesh-a back on the producer route")


def test_the_proxies_follow_the_services_endpoints(mesh):
    m = mesh
    ip = m.cluster_ip(S, "s")
    for client in (A, B):
        m.wait_serving(client, ip, 80)
        assert _answers(m, client, ip, 5) == ({"s-v1": 5}, {"none"})
    v2 = m.backends["s-v2"]
    m.publish(S, "s", [v2], {"http": v2.port})  # the same slice, now with s-v2's address
    for client in (A, B):
        wait_until(lambda: _answers(m, client, ip, 3)[0] == {"s-v2": 3}, 30, what=f"{client} sent to the new endpoint")
