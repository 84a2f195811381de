"""The sandbox where it used to be kinder than kube-apiserver: storage across restarts (also kill -9),
resourceVersions that never go back, watches from the future refused, size and depth limits, CRD
deletion, the namespaces a cluster starts with, no-op applies, strategic merge patch, printer
columns, the kinds `kubectl apply -k deploy/` needs, and faults aimed at one client."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx2 as httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_proc import GW_CRDS, SandboxProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]
GW = "/apis/gateway.networking.k8s.io/v1"


def gateway(name: str, ns: str = "default") -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": ns},
            "spec": {"gatewayClassName": "c", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}


def watch_events(sb: SandboxProcess, path: str, timeout: float = 6.0, until=None, **params) -> list[dict]:
    """The events of one watch, read until `until(events)` says enough, the stream ends, or `timeout`."""
    out: list[dict] = []
    try:
        with httpx.stream("GET", sb.url + path, params={"watch": "true", **params}, timeout=timeout, **sb.client) as r:
            for line in r.iter_lines():
                if line.strip():
                    out.append(json.loads(line))
                    if until is not None and until(out):
                        break
    except httpx.ReadTimeout:
        pass
    return out


@pytest.fixture
def sb(tmp_path):
    s = SandboxProcess(tmp_path)
    try:
        s.kubectl("apply", "--server-side", "-f", str(GW_CRDS / "gateway.networking.k8s.io_gateways.yaml"))
        yield s
    finally:
        s.close()


def test_a_new_sandbox_has_the_namespaces_a_cluster_has(tmp_path):
    s = SandboxProcess(tmp_path)
    try:
        names = s.kubectl("get", "namespaces", "-o", "name").stdout.split()
        assert names == ["namespace/default", "namespace/kube-node-lease", "namespace/kube-public", "namespace/kube-system"]
        assert s.http.get("/sandbox/stats").json()["writes"] == 0  # not counted as anyone's writes
    finally:
        s.close()


def test_data_dir_survives_kill_9_with_objects_and_versions(tmp_path):
    data = tmp_path / "data"
    (tmp_path / "a").mkdir()
    first = SandboxProcess(tmp_path / "a", "--data-dir", str(data))
    try:
        first.kubectl("apply", "--server-side", "-f", str(GW_CRDS / "gateway.networking.k8s.io_gateways.yaml"))
        first.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(gateway("kept")))
        before = first.http.get(f"{GW}/namespaces/default/gateways/kept").json()
        older = int(before["metadata"]["resourceVersion"]) - 1
        at_kill = int(first.http.get(f"{GW}/gateways").json()["metadata"]["resourceVersion"])
    finally:
        first.kill()  # SIGKILL: no chance to flush anything
    (tmp_path / "b").mkdir()
    manifest = tmp_path / "kept.yaml"
    manifest.write_text(json.dumps(gateway("kept")))
    # on the same port, as clients' kubeconfigs expect; -f loads only into an empty data directory
    second = SandboxProcess(tmp_path / "b", "--data-dir", str(data), "-f", str(manifest), port=first.port)
    try:
        after = second.http.get(f"{GW}/namespaces/default/gateways/kept").json()
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert "kept" in second.kubectl("get", "gateways").stdout  # the CRD is served again
        assert int(second.http.get(f"{GW}/gateways").json()["metadata"]["resourceVersion"]) == at_kill
        # a watch from the version at the kill resumes; one from before it gets 410, as a restarted server's
        resumed: list[dict] = []
        t = threading.Thread(target=lambda: resumed.extend(watch_events(second, f"{GW}/gateways", timeout=5,
                                                                          until=lambda e: any(x["type"] == "ADDED" for x in e),
                                                                          resourceVersion=str(at_kill))))
        t.start()
        wait_for(lambda: second.http.get("/sandbox/stats").json()["watches"] >= 1)
        created = second.http.post(f"{GW}/namespaces/default/gateways", json=gateway("new")).json()
        t.join(6)
        assert int(created["metadata"]["resourceVersion"]) > at_kill  # never handed out twice
        assert [e["object"]["metadata"]["name"] for e in resumed if e["type"] == "ADDED"] == ["new"]
        gone = watch_events(second, f"{GW}/gateways", timeout=3, resourceVersion=str(older))
        assert gone[0]["type"] == "ERROR" and gone[0]["object"]["code"] == 410
    finally:
        second.close()


def test_a_watch_or_list_from_a_version_not_reached_is_refused_as_kube_apiserver_does(sb):
    current = int(sb.http.get(f"{GW}/gateways").json()["metadata"]["resourceVersion"])
    future = str(current + 1000)
    events = watch_events(sb, f"{GW}/gateways", timeout=8, resourceVersion=future)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["code"] == 504 and status["reason"] == "Timeout"
    assert status["message"] == f"Too large resource version: {future}, current: {current}"
    assert status["details"]["causes"] == [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]
    listed = sb.http.get(f"{GW}/gateways", params={"resourceVersion": future, "resourceVersionMatch": "NotOlderThan"})
    assert listed.status_code == 504 and listed.json()["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


def test_no_bookmark_below_the_watch_start(sb):
    start = int(sb.http.get(f"{GW}/gateways").json()["metadata"]["resourceVersion"])
    events = watch_events(sb, f"{GW}/gateways", timeout=3, until=lambda e: len(e) >= 2,
                          resourceVersion=str(start), allowWatchBookmarks="true")
    marks = [int(e["object"]["metadata"]["resourceVersion"]) for e in events if e["type"] == "BOOKMARK"]
    assert marks and min(marks) >= start


def test_deleting_a_crd_deletes_its_resources_with_deleted_events(sb):
    for n in ("a", "b"):
        assert sb.http.post(f"{GW}/namespaces/default/gateways", json=gateway(n)).status_code == 201
    rv = sb.http.get(f"{GW}/gateways").json()["metadata"]["resourceVersion"]
    events: list[dict] = []
    t = threading.Thread(target=lambda: events.extend(watch_events(
        sb, f"{GW}/gateways", timeout=5, until=lambda e: sum(x["type"] == "DELETED" for x in e) >= 2, resourceVersion=rv)))
    t.start()
    wait_for(lambda: sb.http.get("/sandbox/stats").json()["watches"] >= 1)
    sb.kubectl("delete", "crd", "gateways.gateway.networking.k8s.io")
    t.join(6)
    assert sb.http.get(f"{GW}/namespaces/default/gateways/a").status_code == 404
    assert sorted(e["object"]["metadata"]["name"] for e in events if e["type"] == "DELETED") == ["a", "b"]
    sb.kubectl("apply", "--server-side", "-f", str(GW_CRDS / "gateway.networking.k8s.io_gateways.yaml"))
    assert sb.http.get(f"{GW}/gateways").json()["items"] == []  # nothing comes back with a new CRD


def test_a_no_op_apply_writes_nothing_and_kubectl_diff_exits_0(sb, tmp_path):
    f = tmp_path / "gw.yaml"
    f.write_text(json.dumps(gateway("same")))
    sb.kubectl("apply", "--server-side", "-f", str(f))
    rv = sb.http.get(f"{GW}/namespaces/default/gateways/same").json()["metadata"]["resourceVersion"]
    sb.kubectl("apply", "--server-side", "-f", str(f))
    after = sb.http.get(f"{GW}/namespaces/default/gateways/same").json()
    assert after["metadata"]["resourceVersion"] == rv
    assert watch_events(sb, f"{GW}/gateways", timeout=1, resourceVersion=rv) == []
    assert sb.kubectl("diff", "--server-side", "-f", str(f), check=False).returncode == 0
    changed = gateway("same")
    changed["spec"]["gatewayClassName"] = "other"
    f.write_text(json.dumps(changed))
    diff = sb.kubectl("diff", "--server-side", "-f", str(f), check=False)
    assert diff.returncode == 1 and "+  gatewayClassName: other" in diff.stdout


def test_strategic_merge_patch_merges_by_merge_key_and_a_custom_resource_answers_415(sb):
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}}
    sb.kubectl("apply", "-f", "-", input=json.dumps(svc))
    sb.kubectl("patch", "service", "web", "-p", json.dumps({"spec": {"ports": [{"port": 443, "targetPort": 8443}]}}))
    ports = sb.http.get("/api/v1/namespaces/default/services/web").json()["spec"]["ports"]
    assert ports == [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80},  # defaulted as kube-apiserver does
                     {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443}]
    sb.kubectl("patch", "service", "web", "-p", json.dumps({"spec": {"ports": [{"port": 80, "$patch": "delete"}]}}))
    assert [p["port"] for p in sb.http.get("/api/v1/namespaces/default/services/web").json()["spec"]["ports"]] == [443]
    # kubectl's client-side apply sends strategic patches with $setElementOrder: an edited manifest applies
    svc["spec"]["ports"] = [{"name": "https", "port": 443}, {"name": "admin", "port": 9000}]
    sb.kubectl("apply", "-f", "-", input=json.dumps(svc))
    assert [p["port"] for p in sb.http.get("/api/v1/namespaces/default/services/web").json()["spec"]["ports"]] == [443, 9000]
    sb.http.post(f"{GW}/namespaces/default/gateways", json=gateway("cr"))
    r = sb.http.patch(f"{GW}/namespaces/default/gateways/cr", json={"spec": {"gatewayClassName": "x"}},
                      headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert r.status_code == 415 and r.json()["reason"] == "UnsupportedMediaType"
    assert sb.kubectl("patch", "gateway", "cr", "-p", '{"spec":{"gatewayClassName":"x"}}', check=False).returncode != 0
    assert sb.kubectl("patch", "gateway", "cr", "--type", "merge", "-p", '{"spec":{"gatewayClassName":"x"}}').returncode == 0


def test_bodies_and_objects_over_the_limits_are_refused_before_storing(sb):
    big = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"x": "a" * (3 * 1024 * 1024 + 10)}}
    r = sb.http.post("/api/v1/namespaces/default/configmaps", json=big)
    assert r.status_code == 413 and r.json()["message"] == "Request entity too large: limit is 3145728"
    big["data"]["x"] = "a" * (2 * 1024 * 1024)  # under the request limit: a ConfigMap's own limit (1 MiB) refuses it
    r = sb.http.post("/api/v1/namespaces/default/configmaps", json=big)
    assert r.status_code == 422 and r.json()["message"] == 'ConfigMap "big" is invalid: []: Too long: may not be more than 1048576 bytes'
    assert sb.http.get("/api/v1/namespaces/default/configmaps/big").status_code == 404
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "blobs.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced", "names": {"kind": "Blob", "plural": "blobs"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    assert sb.http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).status_code == 201
    blob = {"apiVersion": "example.com/v1", "kind": "Blob", "metadata": {"name": "big"}, "spec": {"x": "a" * (2 * 1024 * 1024)}}
    r = sb.http.post("/apis/example.com/v1/namespaces/default/blobs", json=blob)  # over etcd's 1.5 MiB
    assert r.status_code == 413 and r.json()["message"] == "etcdserver: request is too large"
    assert sb.http.get("/apis/example.com/v1/namespaces/default/blobs/big").status_code == 404
    deep: dict = {}
    node = deep
    for _ in range(300):
        node["a"] = {}
        node = node["a"]
    r = sb.http.post("/apis/example.com/v1/namespaces/default/blobs",
                     json={"apiVersion": "example.com/v1", "kind": "Blob", "metadata": {"name": "deep"}, "spec": deep})
    assert r.status_code == 422, r.text
    assert sb.http.get("/apis/example.com/v1/blobs").status_code == 200  # every list still answers
    assert sb.kubectl("get", "blobs", "-A").returncode == 0


def test_faults_can_target_one_client(sb):
    sb.http.post("/sandbox/faults", json={"failRequests": [{"code": 500, "fieldManager": "gwpolicy-controller"},
                                                          {"code": 500, "verb": "list", "resource": "gateways",
                                                           "userAgent": "broken-informer"}]})
    try:
        # kubectl is unaffected
        sb.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(gateway("k")))
        assert sb.kubectl("get", "gateways").returncode == 0
        # the controller's writes fail, every time
        for _ in range(2):
            r = sb.http.patch(f"{GW}/namespaces/default/gateways/k", params={"fieldManager": "gwpolicy-controller"},
                              json={"metadata": {"labels": {"x": "y"}}}, headers={"Content-Type": "application/merge-patch+json"})
            assert r.status_code == 500
        lst = sb.http.get(f"{GW}/gateways", headers={"User-Agent": "broken-informer/1.0"})
        assert lst.status_code == 500
        assert sb.http.get(f"{GW}/gateways").status_code == 200
    finally:
        sb.http.post("/sandbox/faults", json={"clear": True})
    r = sb.http.patch(f"{GW}/namespaces/default/gateways/k", params={"fieldManager": "gwpolicy-controller"},
                      json={"metadata": {"labels": {"x": "y"}}}, headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200


def test_printer_columns_in_kubectl_get(sb):
    sb.http.post(f"{GW}/namespaces/default/gateways", json=gateway("shown"))
    status = {"status": {"addresses": [{"type": "IPAddress", "value": "10.0.0.7"}], "conditions": [
        {"type": "Programmed", "status": "True", "reason": "Programmed", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    r = sb.http.patch(f"{GW}/namespaces/default/gateways/shown/status", json=status,
                      headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    lines = sb.kubectl("get", "gateways").stdout.splitlines()
    assert lines[0].split() == ["NAME", "CLASS", "ADDRESS", "PROGRAMMED", "AGE"]
    assert lines[1].split()[:4] == ["shown", "c", "10.0.0.7", "True"]


def test_kubectl_apply_deploy_and_the_gateway_api_bundle(sb):
    out = sb.kubectl("apply", "-k", str(ROOT / "deploy"), check=False)
    assert out.returncode == 0, out.stderr
    assert sb.kubectl("get", "role,rolebinding", "-n", "gwpolicy-system", "-o", "name").stdout.strip()
    out = sb.kubectl("apply", "--server-side", "-f", str(GW_CRDS), check=False)  # with its ValidatingAdmissionPolicy
    assert out.returncode == 0, out.stderr
    assert "validatingadmissionpolicy" in sb.kubectl("get", "validatingadmissionpolicies,validatingadmissionpolicybindings",
                                                     "-o", "name").stdout
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
              "addressType": "IPv4", "endpoints": [{"addresses": ["127.0.0.1"]}], "ports": [{"port": 8080}]}
    sb.kubectl("apply", "-f", "-", input=json.dumps(slice_))
    assert sb.kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "name").stdout.strip() == \
        "endpointslice.discovery.k8s.io/web-1"


def test_the_parable_applies_with_plain_kubectl_server_side_apply(sb):
    sb.kubectl("apply", "--server-side", "-f", str(GW_CRDS), "-f", str(ROOT / "deploy" / "10-policykind-crd.yaml"))
    parable = ROOT / "examples" / "parable"
    first = sb.kubectl("apply", "--server-side", "-f", str(parable), check=False)
    if first.returncode != 0:  # kubectl maps every object before applying any: the CRDs it just made come next time
        assert "ensure CRDs are installed first" in first.stderr, first.stderr
        second = sb.kubectl("apply", "--server-side", "-f", str(parable), check=False)
        assert second.returncode == 0, second.stderr
    assert len(sb.kubectl("get", "retrypolicies.policy.acme.io,timeoutpolicies.policy.acme.io,"
                                "healthcheckpolicies.policy.acme.io", "-A", "-o", "name").stdout.split()) == 31
    assert len(sb.kubectl("get", "httproutes", "-A", "-o", "name").stdout.split()) == 17


ports_st = st.lists(st.integers(1, 20), unique=True, max_size=6)


@settings(max_examples=80, deadline=None)
@given(ports_st, ports_st, st.lists(st.integers(1, 20), unique=True, max_size=3))
def test_strategic_merge_of_service_ports_is_a_merge_by_port(have, patched, deleted):
    """Every port the patch does not name stays as it was; every port it names is merged; deleted go."""
    from gwpolicy.sandbox.strategic import strategic_merge

    live = {"spec": {"ports": [{"port": p, "name": f"old-{p}"} for p in have]}}
    patch = {"spec": {"ports": [{"port": p, "targetPort": p + 1000} for p in patched]
                      + [{"port": p, "$patch": "delete"} for p in deleted if p not in patched]}}
    out = strategic_merge("Service", live, patch)["spec"]["ports"]
    by_port = {p["port"]: p for p in out}
    gone = set(deleted) - set(patched)
    assert set(by_port) == (set(have) | set(patched)) - gone
    for p in have:
        if p not in gone and p not in patched:
            assert by_port[p] == {"port": p, "name": f"old-{p}"}
    for p in patched:
        assert by_port[p]["targetPort"] == p + 1000 and (p not in have or by_port[p]["name"] == f"old-{p}")
    assert live == {"spec": {"ports": [{"port": p, "name": f"old-{p}"} for p in have]}}  # the input is not changed


def test_a_requests_field_validation_is_its_own_while_others_interleave(sb):
    """A slow upload with fieldValidation=Strict keeps Strict while other requests come and go."""
    body = json.dumps(dict(gateway("slow"), spec=dict(gateway("slow")["spec"], colour="blue"))).encode()

    def slowly():
        yield body[:20]
        wait_for(lambda: done.is_set(), 5)
        yield body[20:]

    done = threading.Event()
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=httpx.post(
        sb.url + f"{GW}/namespaces/default/gateways", params={"fieldValidation": "Strict"}, content=slowly(),
        headers={"Content-Type": "application/json", **sb.client["headers"]}, verify=sb.client["verify"], timeout=10)))
    before = sb.http.get("/sandbox/stats").json()["requests"]
    polls = [0]

    def arrived() -> bool:  # the slow request is in the server (each poll counts as one request too)
        polls[0] += 1
        return sb.http.get("/sandbox/stats").json()["requests"] - polls[0] > before

    t.start()
    try:
        wait_for(arrived, 5)
        for i in range(3):  # requests without fieldValidation (Warn) while the strict one uploads
            assert sb.http.post(f"{GW}/namespaces/default/gateways", json=gateway(f"quick-{i}")).status_code == 201
    finally:
        done.set()
        t.join(10)
    assert result["r"].status_code == 400 and 'unknown field "spec.colour"' in result["r"].json()["message"]


def _ancestors(s: SandboxProcess, name: str) -> list:
    r = s.http.get(f"/apis/policy.acme.io/v1/namespaces/default/retrypolicies/{name}")
    return ((r.json().get("status") or {}).get("ancestors") or []) if r.status_code == 200 else []


def test_a_controller_catches_up_after_the_sandbox_is_killed_and_restarted_from_its_data(tmp_path):
    """kill -9 the sandbox under a running `gwpolicy controller`, restart it from --data-dir on the same
    port: the status written before is still there, and a policy made after the restart gets its status."""
    import subprocess
    import sys

    data = tmp_path / "data"
    (tmp_path / "a").mkdir()
    s = SandboxProcess(tmp_path / "a", "--data-dir", str(data))
    ctl = None
    try:
        s.kubectl("apply", "--server-side", "-f", str(GW_CRDS), "-f", str(ROOT / "deploy" / "10-policykind-crd.yaml"),
                  "-f", str(ROOT / "examples" / "parable" / "15-policy-crds.yaml"))
        s.kubectl("apply", "--server-side", "-f", str(ROOT / "examples" / "parable" / "20-policy-kinds.yaml"))
        gw = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "default"},
              "spec": {"gatewayClassName": "c", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}

        def policy(name: str) -> dict:
            return {"apiVersion": "policy.acme.io/v1", "kind": "RetryPolicy", "metadata": {"name": name, "namespace": "default"},
                    "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}],
                             "defaults": {"maxRetries": 3}}}

        s.kubectl("apply", "--server-side", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                         "items": [gw, policy("before")]}))
        ctl = subprocess.Popen([str(Path(sys.executable).parent / "gwpolicy"), "controller", "--kubeconfig", str(s.kubeconfig),
                                "--no-leader-election", "--listen", "127.0.0.1:0"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        had = wait_for(lambda: _ancestors(s, "before"), 30)
        port = s.port
        s.kill()
        (tmp_path / "b").mkdir()
        s = SandboxProcess(tmp_path / "b", "--data-dir", str(data), port=port)
        assert _ancestors(s, "before") == had  # kept across the kill
        s.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(policy("after")))
        after = wait_for(lambda: _ancestors(s, "after"), 30)
        assert after[0]["ancestorRef"]["name"] == "gw"
    finally:
        if ctl is not None:
            ctl.terminate()
            try:
                ctl.wait(10)
            except subprocess.TimeoutExpired:
                ctl.kill()
        s.close()
