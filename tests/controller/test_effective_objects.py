"""EffectivePolicy objects: `gwpolicy controller --effective-policy-objects` keeps one next to every
affected object, equal to what the engine computes from the cluster's objects, writes only those an
edit changes, and deletes those no policy needs any more; an object whose targets are deleted goes by
garbage collection (its owner references). Against `gwpolicy sandbox` and a real kube-apiserver
(conftest.py), the controller as deploy/'s ServiceAccount under deploy/'s RBAC."""

from __future__ import annotations

import copy
import json
import subprocess
import time

import pytest
import yaml

import live_server
from gwpolicy import effectiveobjects as eo
from gwpolicy.analysis import analyse
from gwpolicy.cli.live import read_cluster
from gwpolicy.status import DEFAULT_CONTROLLER
from helpers import ROOT, run_cli
from sandbox_proc import BIN, wait_for

PARABLE = ROOT / "examples" / "parable"
CRD = ROOT / "deploy" / "50-effectivepolicy-crd.yaml"
HOME = "gwpolicy-system"
SA = "gwpolicy-controller"


def offline(objs) -> dict[tuple[str, str], dict]:
    a = analyse(copy.deepcopy(objs), default_namespace="default")
    return {key: eo.document(a, key, owners, DEFAULT_CONTROLLER)["spec"]
            for key, owners in eo.owners_by_key(a, HOME).items()}


def live(sb) -> dict[tuple[str, str], dict]:
    r = sb.http.get("/apis/gwpolicy.io/v1alpha1/effectivepolicies")
    if r.status_code in (404, 503):  # a CRD just made can take a moment to be served
        return {}
    assert r.status_code == 200, f"{r.status_code} {r.text}"
    items = r.json()["items"]
    return {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items}


def writes(sb) -> int:
    return sb.writes(SA, {"effectivepolicies"})


def cluster_objects(sb) -> list[dict]:
    """What the analysis reads of the cluster (a real API server stamps its own creationTimestamps, so
    the expectation is computed from what it holds, not from the files)."""
    return [o for o in read_cluster(str(sb.kubeconfig), None) if o["kind"] != "EffectivePolicy"]


class Running:
    """The server with the parable, deploy/'s RBAC and the EffectivePolicy CRD, and the controller."""

    def __init__(self, sb) -> None:
        self.sb = sb
        self.ctl: subprocess.Popen | None = None

    def start(self) -> None:
        self.ctl = subprocess.Popen([str(BIN / "gwpolicy"), "controller", "--kubeconfig", str(self.sb.identity(SA)),
                                     "--no-leader-election", "--effective-policy-objects", "--listen", "127.0.0.1:0",
                                     "--breadcrumb-qps", "500"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)

    def stop(self) -> None:
        if self.ctl is not None:
            self.ctl.terminate()
            try:
                self.ctl.wait(5)
            except subprocess.TimeoutExpired:
                self.ctl.kill()
            self.ctl = None


@pytest.fixture
def running(tmp_path, server_kind):
    sb = live_server.start(server_kind, tmp_path, files=[PARABLE])
    run = Running(sb)
    try:
        sb.apply([d for d in yaml.safe_load_all(CRD.read_text()) if d])
        sb.install_deploy(policy_groups=["policy.acme.io"])
        run.start()
        yield run
        assert sb.refused(SA) == [], "deploy/'s RBAC refused the controller these"
    finally:
        run.stop()
        sb.close()


def settled(sb, want: dict) -> dict:
    def same():
        have = live(sb)
        return have if {k: v["spec"] for k, v in have.items()} == want else None
    return wait_for(same, 60, 0.2)


def test_effective_policy_objects_follow_the_analysis(running, tmp_path):
    sb = running.sb
    objs = cluster_objects(sb)
    want = offline(objs)
    assert len(want) > 20
    have = settled(sb, want)
    # what `gwpolicy effective` prints offline, item by item, is in the object of its target
    items = run_cli("effective", "--kubeconfig", str(sb.kubeconfig), "-A", "-o", "json").json()["items"]
    for item in items:
        t = item["target"]
        key = (t["namespace"] or (t["name"] if t["kind"] == "Namespace" else HOME), t["name"])
        path = " > ".join((f"{r['kind']}/{r['namespace']}/{r['name']}" if r.get("namespace") else f"{r['kind']}/{r['name']}")
                          + (f"#{r['sectionName']}" if r.get("sectionName") else "") for r in item["path"])
        entries = [e for tg in have[key]["spec"]["targets"] for e in tg["effectivePolicies"]
                   if tg["targetRef"]["kind"] == t["kind"] and path in e["paths"]
                   and e.get("sectionName") == t["sectionName"]
                   and e["policyKind"]["kind"] == item["policyKind"]["kind"]]
        assert [e["spec"] for e in entries] == [item["spec"]], (key, path)
    # owners: deleting the target deletes its EffectivePolicy (garbage collection by owner reference)
    cake = have[("baker", "cake")]
    assert {o["kind"] for o in cake["metadata"]["ownerReferences"]} >= {"HTTPRoute", "Service"}
    assert all(o["uid"] for o in cake["metadata"]["ownerReferences"])

    # describe in live mode points at it
    described = run_cli("describe", "httproute/cake", "-n", "baker", "--kubeconfig", str(sb.kubeconfig))
    assert described.code == 0, described.err
    assert "EffectivePolicy:" in described.out and "baker/cake (kept by gwpolicy.io/policy-controller" in described.out

    wide = run_cli("get", "httproutes", "-n", "baker", "-o", "wide", "--kubeconfig", str(sb.kubeconfig))
    assert wide.code == 0, wide.err
    head, *rows = wide.out.splitlines()
    assert head.split()[-1] == "EFFECTIVEPOLICY"
    assert next(r for r in rows if r.startswith("cake ")).split()[-1] == "baker/cake"

    # a policy edit rewrites exactly the objects whose content changes
    before = writes(sb)
    edited = copy.deepcopy(objs)
    pol = next(o for o in edited if o["kind"] == "TimeoutPolicy" and o["metadata"]["name"] == "tart-timeouts")
    pol["spec"]["request"] = "7s"
    changed = {k for k, v in offline(edited).items() if want.get(k) != v}
    assert changed
    sb.kubectl("patch", "timeoutpolicies.policy.acme.io", "tart-timeouts", "-n", "baker", "--type", "merge",
               "-p", json.dumps({"spec": {"request": "7s"}}))
    settled(sb, offline(edited))
    time.sleep(0.5)  # nothing more follows
    assert writes(sb) - before == len(changed)

    # a deletion: the objects only that policy affected lose theirs
    before_keys = set(offline(edited))
    gone_policy = next(o for o in edited if o["metadata"]["name"] == "grocer-timeouts")
    after = [o for o in edited if o is not gone_policy]
    vanished = before_keys - set(offline(after))
    assert vanished
    sb.kubectl("delete", "timeoutpolicies.policy.acme.io", "grocer-timeouts", "-n", "grocer")
    final = settled(sb, offline(after))
    assert not vanished & set(final)


def test_kubectl_get_effectivepolicies_shows_target_policies_and_age(running):
    sb = running.sb
    wait_for(lambda: ("baker", "cake") in live(sb), 60, 0.2)
    listed = sb.kubectl("get", "effectivepolicies", "-n", "baker").stdout.splitlines()
    assert listed[0].split() == ["NAME", "TARGET", "POLICIES", "AGE"]
    cake = next(line.split() for line in listed if line.startswith("cake "))
    assert cake[1:3] == ["HTTPRoute/cake,", "Service/cake"] or "HTTPRoute/cake" in " ".join(cake)


def test_an_effective_policy_goes_with_its_targets_by_garbage_collection(running):
    """With the controller stopped, deleting the objects an EffectivePolicy is about (its owners) deletes
    it: the cluster's garbage collector follows the owner references, as it does for a ReplicaSet's
    Pods. One owner gone is not enough: it stays while another is there, without the reference to the
    one that went."""
    sb = running.sb
    cake = wait_for(lambda: live(sb).get(("baker", "cake")), 60, 0.2)
    owners = {o["kind"] for o in cake["metadata"]["ownerReferences"]}
    assert owners == {"HTTPRoute", "Service"}, owners
    running.stop()
    others = set(live(sb)) - {("baker", "cake")}
    sb.kubectl("delete", "httproute", "cake", "-n", "baker")
    # the collector takes the reference to the route out, and keeps the object for its Service
    wait_for(lambda: {o["kind"] for o in live(sb)[("baker", "cake")]["metadata"]["ownerReferences"]} == {"Service"}, 30, 0.2)
    sb.kubectl("delete", "service", "cake", "-n", "baker")
    wait_for(lambda: ("baker", "cake") not in live(sb), 30, 0.2)
    assert set(live(sb)) == others, "EffectivePolicy objects of targets still there went too"
