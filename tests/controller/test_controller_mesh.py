"""`gwpolicy controller` reads the mesh: once the XMesh CRD and an XMesh of gwpolicy.io/mesh-controller
exist, a TimeoutPolicy in one namespace on a Service of another applies by GEP-713's mesh rule, and
the running controller writes its status (Accepted, the mesh rule's message, its ancestor) and the
Service's breadcrumb exactly as `gwpolicy status -f` gives them for the same objects; the XMesh
deleted, the policy is Invalid again, as without a mesh. Against `gwpolicy sandbox` and a real
kube-apiserver (conftest.py), the controller as deploy/'s ServiceAccount under deploy/'s RBAC:
refused nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import live_server
from gwpolicy.cli.live import read_cluster
from gwpolicy.engine.status import ANNOTATION
from helpers import run_cli
from kube_harness import strip_times
from mesh_harness import XMESH, XMESH_CRD
from sandbox_proc import BIN, wait_for

SA = "gwpolicy-controller"
A, B = "mesh-ca", "mesh-cb"
POLICY_PATH = f"/apis/gwpolicy.io/v1alpha1/namespaces/{A}/timeoutpolicies/slow-calls"
SERVICE_PATH = f"/api/v1/namespaces/{B}/services/s"
OBJECTS = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": A}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": B}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": B},
     "spec": {"ports": [{"name": "http", "port": 80}]}},
    {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "slow-calls", "namespace": A},
     "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s", "namespace": B},
              "defaults": {"readTimeout": "1s"}}},
]


def status_f(objects: list[dict[str, Any]], tmp: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """What `gwpolicy status -f` says of these objects: (kind, name) -> its item (the objects whose
    status or annotations the controller's write would change)."""
    path = tmp / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    out = run_cli("status", "-f", str(path), "-o", "json")
    assert out.code == 0, out.err
    return {(i["object"]["kind"], i["object"]["name"]): i for i in json.loads(out.out)["items"]}


def cluster(sb: Any) -> list[dict[str, Any]]:
    return read_cluster(str(sb.kubeconfig), None)


def ours(status: dict[str, Any]) -> list[dict[str, Any]]:
    return strip_times([a for a in status.get("ancestors") or [] if a.get("controllerName") == "gwpolicy.io/policy-controller"])


def written_as(sb: Any, want: dict[tuple[str, str], dict[str, Any]]) -> bool:
    """The policy's status (our ancestors, times aside) and the Service's breadcrumb are what `want` says."""
    policy = sb.http.get(POLICY_PATH).json()
    service = sb.http.get(SERVICE_PATH).json()
    crumb = (service["metadata"].get("annotations") or {}).get(ANNOTATION)
    want_crumb = want[("Service", "s")]["annotations"].get(ANNOTATION) if ("Service", "s") in want else crumb
    return ours(policy.get("status") or {}) == ours(want[("TimeoutPolicy", "slow-calls")]["status"]) and crumb == want_crumb


def accepted(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["status"], c["reason"]) for a in ours(status) for c in a["conditions"] if c["type"] == "Accepted"]


def test_the_controller_writes_a_policy_on_another_namespaces_service_as_status_f_with_and_without_a_mesh(
        server_kind: str, tmp_path: Path) -> None:
    sb = live_server.start(server_kind, tmp_path)
    ctl: subprocess.Popen | None = None
    log = (tmp_path / "controller.log").open("w")
    try:
        sb.install_deploy("41-timeoutpolicy.yaml")
        sb.apply(OBJECTS)
        ctl = subprocess.Popen([str(BIN / "gwpolicy"), "controller", "--kubeconfig", str(sb.identity(SA)),
                                "--no-leader-election", "--listen", "127.0.0.1:0", "--breadcrumb-qps", "500"],
                               stdout=subprocess.DEVNULL, stderr=log, text=True)

        # no mesh (not even its CRD): a target in another namespace without a ReferenceGrant is Invalid
        without = status_f(cluster(sb), tmp_path)
        assert accepted(without[("TimeoutPolicy", "slow-calls")]["status"]) == [("False", "Invalid")]
        wait_for(lambda: written_as(sb, without), 60, 0.2)

        # what `gwpolicy status -f` gives for the same objects with our XMesh, before it exists
        with_mesh = status_f(cluster(sb) + [XMESH], tmp_path)
        item = with_mesh[("TimeoutPolicy", "slow-calls")]
        assert accepted(item["status"]) == [("True", "Accepted")]
        message = item["status"]["ancestors"][0]["conditions"][0]["message"]
        assert f"for requests from namespace {A} only" in message and "mesh rule" in message
        assert with_mesh[("Service", "s")]["annotations"][ANNOTATION] == "true"

        sb.kubectl("apply", "--server-side", "-f", str(XMESH_CRD))
        sb.kubectl("wait", "--for=condition=Established", "crd/xmeshes.gateway.networking.x-k8s.io", "--timeout=30s")
        sb.apply([XMESH])
        wait_for(lambda: written_as(sb, with_mesh), 60, 0.2)
        # and nothing is left that `gwpolicy status -f` of the cluster as it is now would write
        wait_for(lambda: not status_f(cluster(sb), tmp_path), 30, 0.5)
        assert ctl.poll() is None

        # the XMesh deleted: Invalid again, the Service's breadcrumb taken back, as without a mesh
        again = status_f([o for o in cluster(sb) if o["kind"] != "XMesh"], tmp_path)
        assert accepted(again[("TimeoutPolicy", "slow-calls")]["status"]) == [("False", "Invalid")]
        assert ANNOTATION not in again[("Service", "s")]["annotations"]
        sb.kubectl("delete", "xmesh", XMESH["metadata"]["name"])
        wait_for(lambda: written_as(sb, again), 60, 0.2)
        wait_for(lambda: not status_f(cluster(sb), tmp_path), 30, 0.5)
        assert sb.refused(SA) == [], "deploy/'s RBAC refused the controller these"
    finally:
        if ctl is not None:
            ctl.terminate()
            try:
                ctl.wait(5)
            except subprocess.TimeoutExpired:
                ctl.kill()
                ctl.wait()
        log.close()
        sb.close()
