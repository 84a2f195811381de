"""`gwpolicy mesh` applies the gwpolicy.io policy kinds on mesh paths by GEP-713's mesh rule: a
policy in namespace A that targets a Service in namespace B applies to A's requests to that
Service only; B's requests to the same cluster IP and port are left alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import netns
from gateway_proc import wait_until
from mesh_harness import Mesh

WHY = netns.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"network namespaces cannot be made here: {WHY}")

A, B = "mesh-pa", "mesh-pb"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SLOW = 4.0  # seconds the backend takes under /slow; the policy gives up after 1 s


def _ns(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": B},
           "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}
POLICY = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy",
          "metadata": {"name": "impatient", "namespace": A},
          "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s", "namespace": B},
                   "default": {"readTimeout": "1s"}}}


def _crd() -> list[dict]:
    """deploy/'s TimeoutPolicy CRD as it is: its targetRef declares the `namespace` the mesh rule
    needs, so a real API server keeps the field rather than pruning it."""
    return [d for d in yaml.safe_load_all((DEPLOY / "41-timeoutpolicy.yaml").read_text()) if d]


@pytest.fixture
def mesh(server_kind, tmp_path):
    m = Mesh(server_kind, tmp_path, [A, B])
    try:
        m.apply(_crd())
        m.apply([_ns(A), _ns(B), SERVICE])
        echo = m.backend(B, "s-v1", delays={"/slow": SLOW})
        m.publish(B, "s", [echo], {"http": echo.port})
        m.start_proxies()
        yield m
    finally:
        m.close()


def test_a_timeout_policy_by_the_mesh_rule_applies_to_its_own_namespaces_requests_only(mesh):
    m = mesh
    ip = m.cluster_ip(B, "s")
    for client in (A, B):
        m.wait_serving(client, ip, 80)
    m.apply([POLICY])
    wait_until(lambda: m.send(A, ip, 80, "/slow", timeout=30)[0] == 504, 60,
               what=f"mesh-pa's proxy applying the TimeoutPolicy: {m.log(A)}")
    status, _, body = m.send(A, ip, 80, "/slow", timeout=30)
    assert status == 504, body[:200]
    assert m.send(A, ip, 80, "/", timeout=30)[0] == 200  # a fast request from A still goes through
    # B, the Service's own namespace, sends the same request to the same cluster IP and port
    status, _, body = m.send(B, ip, 80, "/slow", timeout=30)
    assert status == 200, body[:200]
    # the policy gone, A waits for the slow answer again
    m.delete([POLICY])
    wait_until(lambda: m.send(A, ip, 80, "/slow", timeout=30)[0] == 200, 60, what="mesh-pa without the TimeoutPolicy")
