"""`gwpolicy controller` reads the mesh: once the XMesh CRD and an XMesh of gwpolicy.io/mesh-controller
exist, a TimeoutPolicy in one namespace on a Service of another applies by GEP-713's mesh rule, and
the running controller writes its status (Accepted, the mesh rule's message, its ancestor), a
BackendTLSPolicy's ancestor (the XMesh) and every breadcrumb exactly as `gwpolicy status -f` gives
them for the same objects, and keeps the EffectivePolicy objects the engine gives (the mesh path of
the policy's namespace among them); the XMesh deleted, all of it is as without a mesh again. Against
`gwpolicy sandbox` and a real kube-apiserver (conftest.py), the controller as deploy/'s
ServiceAccount under deploy/'s RBAC: refused nothing. Offline, the controller's model (in-place
updates where it takes them, full analyses where it declines) follows the XMesh coming, going and
changing hands exactly as a full analysis."""

from __future__ import annotations

import copy
import json
import random
import subprocess
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import live_server
from gwpolicy.cli.live import read_cluster
from gwpolicy.controller.model import ClusterModel
from gwpolicy.engine import effectiveobjects as eo
from gwpolicy.engine.analysis import Analysis, analyse
from gwpolicy.engine.status import ANNOTATION
from gwpolicy.files.output import effective_list, encode, status_list
from helpers import run_cli
from kube_harness import strip_times
from mesh_harness import XMESH, XMESH_CRD
from sandbox_proc import BIN, wait_for
from test_incremental_topology import key
from test_mesh_engine import mesh_input

SA = "gwpolicy-controller"
A, B = "mesh-ca", "mesh-cb"
OBJECTS = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": A}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": B}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": B},
     "spec": {"ports": [{"name": "http", "port": 80}]}},
    {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "slow-calls", "namespace": A},
     "spec": {"targetRef": {"group": "", "kind": "Service", "name": "s", "namespace": B},
              "defaults": {"readTimeout": "1s"}}},
    # A's consumer route of s, and a policy on it
    {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "rc", "namespace": A},
     "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "s", "namespace": B, "port": 80}],
              "rules": [{"backendRefs": [{"name": "s", "namespace": B, "port": 80}]}]}},
    {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": "on-route", "namespace": A},
     "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "rc"},
              "defaults": {"readTimeout": "2s"}}},
    # a kind whose status goes on Gateways: on mesh paths, reported on the XMesh
    {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy", "metadata": {"name": "tls", "namespace": B},
     "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "s"}],
              "validation": {"wellKnownCACertificates": "System", "hostname": "s.mesh-cb.svc"}}},
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
    """Every object `want` names carries the status (times aside) and breadcrumb annotation it says."""
    live = {(o["kind"], o["metadata"]["name"]): o for o in cluster(sb)}
    for k, item in want.items():
        obj = live.get(k)
        if obj is None:
            return False
        status = obj.get("status") or {}
        if any(strip_times(status.get(f)) != strip_times(v) for f, v in item["status"].items()):
            return False
        if (obj["metadata"].get("annotations") or {}).get(ANNOTATION) != item["annotations"].get(ANNOTATION):
            return False
    return True


def effective_objects(sb: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The EffectivePolicy objects the controller keeps: (namespace, name) -> spec."""
    r = sb.http.get("/apis/gwpolicy.io/v1alpha1/effectivepolicies")
    if r.status_code in (404, 503):  # a CRD just made can take a moment to be served
        return {}
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    return {(o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"] for o in r.json()["items"]}


def engine_objects(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The EffectivePolicy objects the engine gives for these objects: (namespace, name) -> spec."""
    a = analyse([o for o in objects if o["kind"] != "EffectivePolicy"], default_namespace="default")
    return {key: eo.document(a, key, owners, "gwpolicy.io/policy-controller")["spec"]
            for key, owners in eo.owners_by_key(a, "gwpolicy-system").items()}


def paths_of(objects: dict[tuple[str, str], dict[str, Any]], policy: str) -> list[str]:
    """The paths on which EffectivePolicy objects hold the policy of that name."""
    return [p for spec in objects.values() for t in spec["targets"] for e in t["effectivePolicies"]
            if policy in {r["name"] for r in e["policies"]} for p in e["paths"]]


def accepted(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["status"], c["reason"]) for a in ours(status) for c in a["conditions"] if c["type"] == "Accepted"]


def test_the_controller_writes_a_policy_on_another_namespaces_service_as_status_f_with_and_without_a_mesh(
        server_kind: str, tmp_path: Path) -> None:
    sb = live_server.start(server_kind, tmp_path)
    ctl: subprocess.Popen | None = None
    log = (tmp_path / "controller.log").open("w")
    try:
        sb.install_deploy("41-timeoutpolicy.yaml", "50-effectivepolicy-crd.yaml")
        sb.apply(OBJECTS)
        ctl = subprocess.Popen([str(BIN / "gwpolicy"), "controller", "--kubeconfig", str(sb.identity(SA)),
                                "--no-leader-election", "--listen", "127.0.0.1:0", "--breadcrumb-qps", "500",
                                "--effective-policy-objects", "--effective-policy-namespace", "gwpolicy-system"],
                               stdout=subprocess.DEVNULL, stderr=log, text=True)

        # no mesh (not even its CRD): a target in another namespace without a ReferenceGrant is Invalid
        without = status_f(cluster(sb), tmp_path)
        assert accepted(without[("TimeoutPolicy", "slow-calls")]["status"]) == [("False", "Invalid")]
        # the route's own policy affects it, mesh or not: under its Service parent
        assert [p["parentRef"]["kind"] for p in without[("HTTPRoute", "rc")]["status"]["parents"]] == ["Service"]
        wait_for(lambda: written_as(sb, without), 60, 0.2)
        wait_for(lambda: not status_f(cluster(sb), tmp_path), 30, 0.5)
        no_mesh = engine_objects(cluster(sb))
        assert not paths_of(no_mesh, "slow-calls")  # Invalid: on no path
        assert not any(p.startswith("XMesh/") for p in paths_of(no_mesh, "on-route"))
        wait_for(lambda: effective_objects(sb) == no_mesh, 60, 0.2)

        # what `gwpolicy status -f` gives for the same objects with our XMesh, before it exists
        with_mesh = status_f(cluster(sb) + [XMESH], tmp_path)
        item = with_mesh[("TimeoutPolicy", "slow-calls")]
        assert accepted(item["status"]) == [("True", "Accepted")]
        message = item["status"]["ancestors"][0]["conditions"][0]["message"]
        assert f"for requests from namespace {A} only" in message and "mesh rule" in message
        tls = with_mesh[("BackendTLSPolicy", "tls")]["status"]["ancestors"]
        assert [(a["ancestorRef"]["kind"], a["ancestorRef"]["name"]) for a in tls] == [("XMesh", "gwpolicy")]

        sb.kubectl("apply", "--server-side", "-f", str(XMESH_CRD))
        sb.kubectl("wait", "--for=condition=Established", "crd/xmeshes.gateway.networking.x-k8s.io", "--timeout=30s")
        sb.apply([XMESH])
        wait_for(lambda: written_as(sb, with_mesh), 60, 0.2)
        # and nothing is left that `gwpolicy status -f` of the cluster as it is now would write
        wait_for(lambda: not status_f(cluster(sb), tmp_path), 30, 0.5)
        assert ctl.poll() is None
        # the Service's EffectivePolicy holds the policy on the mesh path of the requests from A
        want = engine_objects(cluster(sb))
        paths = paths_of(want, "slow-calls")
        assert paths and all(p.startswith(f"XMesh/gwpolicy > Namespace/{A} > ") for p in paths), paths
        wait_for(lambda: effective_objects(sb) == want, 60, 0.2)

        # the XMesh deleted: Invalid again, the BackendTLSPolicy no longer on the XMesh, as without a mesh
        again = status_f([o for o in cluster(sb) if o["kind"] != "XMesh"], tmp_path)
        assert accepted(again[("TimeoutPolicy", "slow-calls")]["status"]) == [("False", "Invalid")]
        assert not [a for a in again[("BackendTLSPolicy", "tls")]["status"].get("ancestors") or []
                    if a["ancestorRef"]["kind"] == "XMesh"]
        sb.kubectl("delete", "xmesh", XMESH["metadata"]["name"])
        wait_for(lambda: written_as(sb, again), 60, 0.2)
        wait_for(lambda: not status_f(cluster(sb), tmp_path), 30, 0.5)
        assert engine_objects(cluster(sb)) == no_mesh
        wait_for(lambda: effective_objects(sb) == no_mesh, 60, 0.2)
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


def view(a: Analysis) -> tuple[Any, ...]:
    """What the controller writes and keeps from an analysis: effective items, status and breadcrumbs
    (transition times aside: the model's clock is its own), what affects each object, the paths."""
    items = sorted(encode(i, "json") for i in effective_list(a)["items"])
    status = sorted(json.dumps(strip_times(json.loads(encode(i, "json"))), sort_keys=True) for i in status_list(a)["items"])
    affected = {o: {k: sorted(map(str, v)) for k, v in kinds.items()} for o, kinds in a.affected.items()}
    paths = {t: sorted(tuple(map(str, n)) for n in nodes) for t, nodes in a.topology.paths.items()}
    return items, status, affected, paths


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mesh_input(), st.lists(st.sampled_from(["delete", "ours", "theirs", "policy"]), min_size=1, max_size=5),
       st.randoms(use_true_random=False))
def test_the_controllers_model_follows_the_xmesh_as_a_full_analysis_does(objs: list[dict[str, Any]], steps: list[str],
                                                                         rnd: random.Random) -> None:
    """Every step (the XMesh deleted, created or changed to ours or another controller's, a policy
    edited) goes through the model as the informers hand it on; after each pass its analysis gives
    what a full analysis of the same objects gives."""
    controller = "gwpolicy.io/policy-controller"
    model = ClusterModel(controller)
    for o in objs:
        model.event("ADDED", copy.deepcopy(o))
    model.reconcile()
    state = {key(o): o for o in objs}
    xkey = key(objs[0])
    assert objs[0]["kind"] == "XMesh"
    for step in steps:
        if step == "delete":
            if xkey in state:
                model.event("DELETED", copy.deepcopy(state.pop(xkey)))
        elif step in ("ours", "theirs"):
            mesh = copy.deepcopy(objs[0])
            mesh["spec"]["controllerName"] = mesh["spec"]["controllerName"] if step == "ours" else "example.net/mesh"
            model.event("MODIFIED" if xkey in state else "ADDED", copy.deepcopy(mesh))
            state[xkey] = mesh
        else:
            policy = copy.deepcopy(rnd.choice([o for o in state.values() if o["kind"] == "TimeoutPolicy"]))
            stanza = next(k for k in ("defaults", "overrides") if k in policy["spec"])
            policy["spec"][stanza] = {rnd.choice(["x", "y"]): rnd.choice(["1s", "2s", "3s"])}
            model.event("MODIFIED", copy.deepcopy(policy))
            state[key(policy)] = policy
        model.reconcile()
        assert model.analysis is not None
        full = analyse(copy.deepcopy(list(state.values())), controller=controller, by_target=True)
        assert view(model.analysis) == view(full), (step, steps)
