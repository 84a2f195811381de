"""Policies on an ExternalService reach the requests of their own namespace to that host, through
the egress port of the namespace's proxy (docs/mesh.md, "External services").

Two client namespaces, each with its own network namespace, its own /etc/hosts naming the "external"
host `api.external.test` (an echo server on the fabric, port 80, slow under /slow), and its own
`gwpolicy mesh` with the egress port on 127.0.0.1:3128, where the clients send absolute-URI
requests as a workload with `http_proxy` does. A TimeoutPolicy and a RetryPolicy in `mesh-ea`
target `ExternalService api.external.test`: `mesh-ea`'s requests get them, `mesh-eb`'s, to the same
host through its own proxy, do not (GEP-713's mesh rule, M9). When a namespace's /etc/hosts moves
the host, its proxy resolves it again and follows."""

from __future__ import annotations

import json
import time
from urllib.parse import urlsplit

import pytest

import netns
from gateway_proc import wait_until
from mesh_harness import Mesh, namespace, policy_crds

WHY = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")

A, B = "mesh-ea", "mesh-eb"
HOST = "api.external.test"
EGRESS = ("127.0.0.1", 3128)  # gwpolicy mesh's default --egress-listen
SLOW = 4.0  # seconds the external host takes under /slow; the policy gives up after 1 s


def _policy(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": A},
            "spec": {"targetRef": {"group": "gwpolicy.io", "kind": "ExternalService", "name": HOST}, "default": spec}}


TIMEOUT = _policy("TimeoutPolicy", "api-timeout", {"readTimeout": "1s"})
RETRY = _policy("RetryPolicy", "api-retries", {"attempts": 3, "codes": [503]})


@pytest.fixture
def mesh(server_kind, tmp_path):
    m = Mesh(server_kind, tmp_path, [A, B])
    try:
        m.apply(policy_crds("41-timeoutpolicy.yaml", "42-retrypolicy.yaml"))
        m.apply([namespace(A), namespace(B)])
        api = m.backend("external", "api", port=80, delays={"/slow": SLOW})
        for host in m.hosts.values():
            host.hosts_file({HOST: api.address})
        m.start_proxies("--egress-resolve-interval", "1")
        yield m, api
    finally:
        m.close()


def _via_egress(m: Mesh, client: str, url: str, timeout: float = 30) -> tuple[int, dict, float]:
    """One request from inside `client`'s host to its proxy's egress port, as http_proxy sends it:
    the absolute URI in the request line; (status, the echo's JSON or {}, seconds taken)."""
    start = time.monotonic()
    status, _, body = m.send(client, *EGRESS, url, host=urlsplit(url).netloc, timeout=timeout)
    took = time.monotonic() - start
    try:
        echoed = json.loads(body)
    except ValueError:
        echoed = {"text": body[:300].decode(errors="replace")}
    return status, echoed, took


def test_policies_on_an_external_service_apply_to_their_own_namespaces_requests_only(mesh):
    m, api = mesh
    for client in (A, B):  # a host no ExternalService names is passed through (an IP address needs no resolver)
        wait_until(lambda c=client: _via_egress(m, c, f"http://{api.address}/", timeout=5)[0] == 200, 60,
                   what=f"the egress port of {client}: {m.log(client)}")
    m.apply([TIMEOUT])
    slow = f"http://{HOST}/slow"
    wait_until(lambda: _via_egress(m, A, slow)[0] == 504, 60, what=f"mesh-ea's proxy applying the TimeoutPolicy: {m.log(A)}")
    # B's proxy resolves the host too once an ExternalService names it; it then carries B's requests to it
    wait_until(lambda: _via_egress(m, B, f"http://{HOST}/")[0] == 200, 60, what=f"mesh-eb's proxy serving {HOST}: {m.log(B)}")

    status, echoed, took = _via_egress(m, A, slow)
    assert status == 504 and 0.9 < took < SLOW - 1, (status, took, echoed)
    status, echoed, _ = _via_egress(m, A, f"http://{HOST}/fast?x=1")  # a fast request from A still goes through
    assert status == 200, echoed
    assert echoed["pod"] == api.pod and echoed["path"] == "/fast?x=1" and echoed["host"] == HOST
    assert echoed["headers"]["Via"] == ["1.1 gwpolicy-egress"]  # by way of the proxy, not around it
    # B sends the same request to the same host: no policy of B's, none of A's
    status, echoed, took = _via_egress(m, B, slow)
    assert status == 200 and took >= SLOW - 0.1 and echoed["pod"] == api.pod, (status, took, echoed)

    # the RetryPolicy: the host answers 503 twice, A's third try gets its answer; B gets the first 503
    m.apply([RETRY])
    probes = iter(range(1000))

    def retried() -> bool:
        rid = f"from-a-{next(probes)}"
        return _via_egress(m, A, f"http://{HOST}/flaky?fail=2&id={rid}")[0] == 200 and api.attempts[rid] == 3
    wait_until(retried, 60, what=f"mesh-ea's proxy applying the RetryPolicy: {m.log(A)}")
    status, echoed, _ = _via_egress(m, B, f"http://{HOST}/flaky?fail=2&id=from-b")
    assert status == 503 and api.attempts["from-b"] == 1, (status, echoed, dict(api.attempts))

    # a port of the host that is not an egress port cannot get the host's policies: refused
    status, echoed, _ = _via_egress(m, A, f"http://{HOST}:8080/")
    assert status == 403 and "not an egress port" in echoed["text"], echoed
    # a request that names no absolute http:// URI is not proxied
    status, _, body = m.send(A, *EGRESS, "/", host=HOST, timeout=10)
    assert status == 400 and b"absolute http://" in body

    # the TimeoutPolicy gone (the RetryPolicy still names the host), A waits for the slow answer again
    m.delete([TIMEOUT])
    wait_until(lambda: _via_egress(m, A, slow)[0] == 200, 60, what="mesh-ea without the TimeoutPolicy")

    # the host moves (A's /etc/hosts names another address): A's proxy resolves it again and follows
    moved = m.backend("external", "api-moved", port=80)
    m.hosts[A].hosts_file({HOST: moved.address})
    wait_until(lambda: _via_egress(m, A, f"http://{HOST}/")[1].get("pod") == moved.pod, 30,
               what=f"mesh-ea's proxy following {HOST} to {moved.address}: {m.log(A)}")
    assert _via_egress(m, B, f"http://{HOST}/")[1].get("pod") == api.pod  # B's hosts file did not change
