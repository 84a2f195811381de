"""`gwpolicy mesh` applies every gwpolicy.io policy kind on mesh paths by GEP-713's mesh rule: a
policy in namespace A that targets a Service in namespace B applies to A's requests to that
Service only; B's requests to the same cluster IP and port are left alone. UpstreamSettingsPolicy
is a Direct kind: it is the Service's own, set in B for every client namespace, and one in A
targeting B's Service is Invalid and changes nothing (docs/semantics.md M6, docs/mesh.md).

One mesh per server for the module: a Service of B per kind, each with a backend of its own, so
that the tests' policies never meet."""

from __future__ import annotations

import itertools

import pytest

import netns
from gateway_proc import wait_until
from mesh_harness import Mesh, namespace, policy_crds

WHY = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")

A, B = "mesh-pa", "mesh-pb"
CRDS = ("41-timeoutpolicy.yaml", "42-retrypolicy.yaml", "43-clientsettingspolicy.yaml",
        "44-upstreamsettingspolicy.yaml", "45-ratelimitpolicy.yaml")
SLOW = 4.0  # seconds the backend takes under /slow; the TimeoutPolicy gives up after 1 s
#: the Services of B, one per test (the pooled one is the target of A's Invalid UpstreamSettingsPolicy)
SERVICES = ("s", "s-retry", "s-body", "s-closed", "s-pooled", "s-rate")
ids = itertools.count()


def steadily(pred, n: int = 3):
    """`pred` holding `n` times in a row: while NGINX reloads, a worker of the configuration before
    may still take a connection or two."""
    return lambda: all(pred() for _ in range(n))


def _service(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": B},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


def _policy(kind: str, name: str, ns: str, service: str, spec: dict) -> dict:
    ref = {"group": "", "kind": "Service", "name": service} | ({"namespace": B} if ns != B else {})
    return {"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": ns},
            "spec": {"targetRef": ref, **spec}}


TIMEOUT = _policy("TimeoutPolicy", "impatient", A, "s", {"default": {"readTimeout": "1s"}})
RETRY = _policy("RetryPolicy", "persistent", A, "s-retry", {"default": {"attempts": 3, "codes": [503]}})
BODY = _policy("ClientSettingsPolicy", "small-bodies", A, "s-body", {"default": {"body": {"maxSize": "1k"}}})
CLOSED = _policy("UpstreamSettingsPolicy", "no-pool", B, "s-closed", {"keepAlive": {"connections": 0}})
NOT_OURS = _policy("UpstreamSettingsPolicy", "no-pool-for-b", A, "s-pooled", {"keepAlive": {"connections": 0}})
RATE = _policy("RateLimitPolicy", "one-a-minute", A, "s-rate", {"default": {"requests": 1, "unit": "Minute"}})


@pytest.fixture(scope="module")
def mesh(module_server_kind, tmp_path_factory):
    m = Mesh(module_server_kind, tmp_path_factory.mktemp("mesh-policies"), [A, B])
    try:
        m.apply(policy_crds(*CRDS))
        m.apply([namespace(A), namespace(B)] + [_service(s) for s in SERVICES])
        for s in SERVICES:
            echo = m.backend(B, s, delays={"/slow": SLOW} if s == "s" else None)
            m.publish(B, s, [echo], {"http": echo.port})
        m.start_proxies()
        for s in SERVICES:
            for client in (A, B):
                m.wait_serving(client, m.cluster_ip(B, s), 80)
        yield m
    finally:
        m.close()


def test_a_timeout_policy_by_the_mesh_rule_applies_to_its_own_namespaces_requests_only(mesh):
    m = mesh
    ip = m.cluster_ip(B, "s")
    m.apply([TIMEOUT])
    wait_until(steadily(lambda: m.send(A, ip, 80, "/slow", timeout=30)[0] == 504, 2), 60,
               what=f"mesh-pa's proxy applying the TimeoutPolicy: {m.log(A)}")
    status, _, body = m.send(A, ip, 80, "/slow", timeout=30)
    assert status == 504, body[:200]
    assert m.send(A, ip, 80, "/", timeout=30)[0] == 200  # a fast request from A still goes through
    # B, the Service's own namespace, sends the same request to the same cluster IP and port
    status, _, body = m.send(B, ip, 80, "/slow", timeout=30)
    assert status == 200, body[:200]
    # the policy gone, A waits for the slow answer again
    m.delete([TIMEOUT])
    wait_until(lambda: m.send(A, ip, 80, "/slow", timeout=30)[0] == 200, 60, what="mesh-pa without the TimeoutPolicy")


def _once_failing(m: Mesh, client: str, ip: str) -> tuple[int, int]:
    """A request the backend answers 503 the first time: (the status the client gets, tries seen)."""
    rid = f"{client}-{next(ids)}"
    status = m.send(client, ip, 80, f"/?fail=1&id={rid}", timeout=10)[0]
    return status, m.backends["s-retry"].attempts.get(rid, 0)


def test_a_retry_policy_by_the_mesh_rule_retries_its_own_namespaces_requests_only(mesh):
    m = mesh
    ip = m.cluster_ip(B, "s-retry")
    assert _once_failing(m, A, ip) == (503, 1)  # no retries before the policy
    m.apply([RETRY])
    wait_until(steadily(lambda: _once_failing(m, A, ip)[0] == 200), 60, what=f"mesh-pa's proxy retrying: {m.log(A)}")
    for _ in range(3):
        assert _once_failing(m, A, ip) == (200, 2)  # the 503 retried once, on the Service's one endpoint
        assert _once_failing(m, B, ip) == (503, 1)  # B's answer is the backend's first


def test_a_client_settings_body_limit_by_the_mesh_rule_refuses_its_own_namespaces_bodies_only(mesh):
    m = mesh
    ip = m.cluster_ip(B, "s-body")
    body = b"x" * 4096
    m.apply([BODY])
    wait_until(steadily(lambda: m.send(A, ip, 80, "/upload", method="POST", body=body)[0] == 413), 60,
               what=f"mesh-pa's proxy limiting bodies: {m.log(A)}")
    assert m.send(A, ip, 80, "/upload", method="POST", body=b"x" * 512)[0] == 200  # within the limit
    for _ in range(3):
        assert m.send(A, ip, 80, "/upload", method="POST", body=body)[0] == 413
        assert m.send(B, ip, 80, "/upload", method="POST", body=body)[0] == 200


def _connections(m: Mesh, client: str, service: str, n: int = 6) -> int:
    """TCP connections the Service's backend accepts while `client` sends it `n` requests, one
    after the other."""
    echo = m.backends[service]
    ip = m.cluster_ip(B, service)
    before = echo.accepted
    for _ in range(n):
        assert m.send(client, ip, 80, "/")[0] == 200
    return echo.accepted - before


def test_upstream_settings_are_the_services_own_for_every_namespace_and_invalid_from_another(mesh):
    m = mesh
    # first A's policy on B's s-pooled (Invalid: a Direct kind cannot apply by the mesh rule), then
    # B's own on s-closed: one watch stream, so a proxy that shows the second has seen the first
    m.apply([NOT_OURS])
    m.apply([CLOSED])
    for client in (A, B):
        wait_until(steadily(lambda c=client: _connections(m, c, "s-closed", 3) == 3, 2), 60,
                   what=f"{client}'s proxy without a keep-alive pool to s-closed: {m.log(client)}")
    for client in (A, B):
        assert _connections(m, client, "s-closed") == 6  # each request its own connection
        assert _connections(m, client, "s-pooled") <= 1  # the pool reused (one worker)


def test_a_rate_limit_by_the_mesh_rule_limits_its_own_namespaces_requests_only(mesh):
    m = mesh
    ip = m.cluster_ip(B, "s-rate")
    m.apply([RATE])
    wait_until(steadily(lambda: m.send(A, ip, 80, "/")[0] == 429), 60, what=f"mesh-pa's proxy limiting: {m.log(A)}")
    for _ in range(5):
        assert m.send(A, ip, 80, "/")[0] == 429  # one a minute, and that one is spent
        assert m.send(B, ip, 80, "/")[0] == 200
