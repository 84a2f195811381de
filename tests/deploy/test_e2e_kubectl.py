"""End to end as a user runs it: real kubectl against `gwpolicy sandbox`, `gwpolicy controller` as a process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import CONFORMANCE, needs_shared
from sandbox_proc import BIN, GW_CRDS, SandboxProcess, wait_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture
def cluster(tmp_path):
    sb = SandboxProcess(tmp_path, "--keep-creation-timestamp")
    try:
        yield sb, tmp_path
    finally:
        sb.close()


@needs_shared
def test_kubectl_applies_the_controller_writes_and_status_follows_a_deletion(cluster):
    sb, tmp = cluster
    crds = [str(GW_CRDS / f"gateway.networking.k8s.io_{n}.yaml") for n in ("gatewayclasses", "gateways", "httproutes")]
    sb.kubectl("apply", "--server-side", *sum((["-f", c] for c in crds), []), "-f", str(DEPLOY / "00-namespace.yaml"))
    scenario = yaml.safe_load((CONFORMANCE / "seeds" / "seed-breadcrumbs.yaml").read_text())["manifests"]
    from gwpolicy.sandbox.seed import ordered
    objs = ordered(scenario)
    crd_file, obj_file = tmp / "crds.yaml", tmp / "objects.yaml"
    crd_file.write_text(yaml.safe_dump_all([o for o in objs if o["kind"] == "CustomResourceDefinition"]))
    obj_file.write_text(yaml.safe_dump_all([o for o in objs if o["kind"] != "CustomResourceDefinition"]))
    sb.kubectl("apply", "--server-side", "-f", str(crd_file))  # as with a real cluster: CRDs first
    sb.kubectl("apply", "--server-side", "-f", str(obj_file))
    ctl = subprocess.Popen([str(BIN / "gwpolicy"), "controller", "--kubeconfig", str(sb.kubeconfig),
                            "--listen", "127.0.0.1:0", "--lease-duration", "2"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def reason(kind: str, name: str, ns: str) -> str:
            return sb.kubectl("get", kind, name, "-n", ns, "-o",
                              "jsonpath={.status.ancestors[*].conditions[?(@.type==\"Accepted\")].reason}", check=False).stdout

        assert wait_for(lambda: reason("timeoutpolicies.networking.example.io", "bad", "other") == "Invalid", 20)
        assert wait_for(lambda: reason("retrypolicies.networking.example.io", "gw", "default") == "Accepted", 20)
        assert reason("retrypolicies.networking.example.io", "bad-route", "other") == "Invalid"
        crumb = lambda: sb.kubectl("get", "service", "svc", "-n", "default", "-o",
                                   "jsonpath={.metadata.annotations.gwpolicy\\.io/PolicyAffected}").stdout
        assert wait_for(lambda: crumb() == "true", 20)
        gw_cond = lambda: sb.kubectl("get", "gateway", "gw", "-n", "default", "-o",
                                     "jsonpath={.status.conditions[*].type}").stdout
        assert "gwpolicy.io/RetryPolicyAffected" in gw_cond()
        # deleting the Service: the policy that targeted it can no longer find it
        sb.kubectl("delete", "service", "svc", "-n", "default")
        assert wait_for(lambda: reason("timeoutpolicies.networking.example.io", "svc", "default") == "TargetNotFound", 20)
        # deleting the Gateway's policy takes the Gateway's breadcrumb away
        sb.kubectl("delete", "retrypolicies.networking.example.io", "gw", "-n", "default")
        assert wait_for(lambda: "RetryPolicyAffected" not in gw_cond(), 20)
    finally:
        ctl.terminate()
        err = ctl.communicate(timeout=10)[1]
    assert "Traceback" not in err, err


@needs_shared
def test_live_mode_reads_the_cluster(cluster):
    sb, tmp = cluster
    scenario = yaml.safe_load((CONFORMANCE / "seeds" / "seed-two-paths.yaml").read_text())["manifests"]
    from gwpolicy.sandbox.seed import apply_all
    from kube_harness import CRDS
    apply_all(sb.url, CRDS[:0] + [c for c in CRDS if c["spec"]["names"]["kind"] in ("GatewayClass", "Gateway", "HTTPRoute")],
              **sb.client)
    apply_all(sb.url, scenario, **sb.client)
    live = subprocess.run([str(BIN / "gwpolicy"), "effective", "--kubeconfig", str(sb.kubeconfig), "-A",
                           "--now", "2026-01-01T00:00:00Z"], capture_output=True, text=True)
    assert live.returncode == 0, live.stderr
    offline_file = tmp / "s.yaml"
    offline_file.write_text(yaml.safe_dump_all(scenario))
    offline = subprocess.run([str(BIN / "gwpolicy"), "effective", "-f", str(offline_file), "--now", "2026-01-01T00:00:00Z"],
                             capture_output=True, text=True)
    import json
    pick = lambda out: sorted((i["target"]["name"], i["spec"].get("retries")) for i in json.loads(out)["items"]
                              if i["target"]["kind"] == "HTTPRoute")
    assert pick(live.stdout) == pick(offline.stdout) == [("shared", 1), ("shared", 2)]
    described = subprocess.run([str(BIN / "gwpolicy"), "describe", "httproute/shared", "--kubeconfig", str(sb.kubeconfig)],
                               capture_output=True, text=True)
    assert described.returncode == 0, described.stderr
    assert "RetryPolicy/default/a " in described.stdout and "RetryPolicy/default/b " in described.stdout


def test_deploy_manifests_are_valid_kubernetes(tmp_path):
    import kubernetes_validate

    files = [*sorted(DEPLOY.glob("*.yaml")), DEPLOY / "mesh" / "proxy-default.yaml"]  # not the XMesh: a CRD's object
    docs = [d for f in files if f.name != "kustomization.yaml"  # kustomize's, not the API's
            for d in yaml.safe_load_all(f.read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "Deployment", "Namespace"} <= kinds
    for d in docs:
        kubernetes_validate.validate(d, "1.32", strict=True)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d.get("rules") or []]
    # EffectivePolicy objects (opt-in) are the one thing the controller creates and deletes
    own = [r for r in rules if r.get("resources") == ["effectivepolicies"]]
    assert own and all(r["apiGroups"] == ["gwpolicy.io"] for r in own)
    verbs = {v for r in rules if r not in own for v in r["verbs"]}
    assert not verbs & {"delete", "create", "*", "update"}, "the controller needs no such verbs cluster-wide"
    status_rules = [r for r in rules if any(res.endswith("/status") for res in r["resources"])]
    assert all(set(r["verbs"]) <= {"get", "patch"} for r in status_rules)
