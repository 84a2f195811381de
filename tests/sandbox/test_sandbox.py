"""The sandbox behaves like kube-apiserver for what gwpolicy and kubectl use."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from sandbox_proc import GW_CRDS, SandboxProcess, wait_for

GW = "/apis/gateway.networking.k8s.io/v1"


@pytest.fixture(scope="module")
def sb(tmp_path_factory):
    with SandboxProcess(tmp_path_factory.mktemp("sandbox")) as s:
        s.kubectl("apply", "--server-side", "-f", str(GW_CRDS / "gateway.networking.k8s.io_gateways.yaml"),
                  "-f", str(GW_CRDS / "gateway.networking.k8s.io_httproutes.yaml"),
                  "-f", str(GW_CRDS / "gateway.networking.k8s.io_gatewayclasses.yaml"))
        s.http.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}})
        yield s


def gateway(name: str, **spec) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": "t"},
            "spec": {"gatewayClassName": "c", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}], **spec}}


def condition(ctype: str, status: str = "True") -> dict:
    """A condition as the CRDs require one (every field of metav1.Condition but observedGeneration)."""
    return {"type": ctype, "status": status, "reason": "Testing", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}


def test_discovery_from_crds(sb):
    groups = sb.http.get("/apis").json()
    assert any(g["name"] == "gateway.networking.k8s.io" for g in groups["groups"])
    res = {r["name"]: r for r in sb.http.get(GW).json()["resources"]}
    assert res["gateways"]["namespaced"] is True and res["gatewayclasses"]["namespaced"] is False
    assert "gateways/status" in res
    assert "gateway-api" in res["gateways"].get("categories", [])
    assert sb.http.get("/version").json()["major"] == "1"


def test_create_get_list_and_errors_are_kubernetes_status(sb):
    r = sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("a"))
    assert r.status_code == 201
    obj = r.json()
    assert obj["metadata"]["uid"] and obj["metadata"]["creationTimestamp"] and obj["metadata"]["generation"] == 1
    again = sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("a"))
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists" and again.json()["kind"] == "Status"
    missing = sb.http.get(f"{GW}/namespaces/t/gateways/nope")
    assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"
    lst = sb.http.get(f"{GW}/namespaces/t/gateways").json()
    assert lst["kind"] == "GatewayList" and lst["metadata"]["resourceVersion"]
    nons = sb.http.post(f"{GW}/namespaces/ghost/gateways", json=gateway("x"))
    assert nons.status_code == 404


def test_update_needs_the_current_resource_version(sb):
    obj = sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("b")).json()
    stale = json.loads(json.dumps(obj))
    obj["spec"]["gatewayClassName"] = "d"
    ok = sb.http.put(f"{GW}/namespaces/t/gateways/b", json=obj)
    assert ok.status_code == 200 and ok.json()["metadata"]["generation"] == 2
    stale["spec"]["gatewayClassName"] = "e"
    conflict = sb.http.put(f"{GW}/namespaces/t/gateways/b", json=stale)
    assert conflict.status_code == 409 and conflict.json()["reason"] == "Conflict"


def test_generation_moves_on_spec_changes_only_and_status_is_apart(sb):
    obj = sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("c")).json()
    labelled = sb.http.patch(f"{GW}/namespaces/t/gateways/c", json={"metadata": {"labels": {"x": "y"}}},
                             headers={"Content-Type": "application/merge-patch+json"}).json()
    assert labelled["metadata"]["generation"] == 1
    st = sb.http.patch(f"{GW}/namespaces/t/gateways/c/status", json={"status": {"conditions": [condition("T")]}},
                       headers={"Content-Type": "application/merge-patch+json"}).json()
    assert st["status"]["conditions"] == [condition("T")] and st["metadata"]["generation"] == 1
    # a write to the main resource cannot change status
    put = dict(st, status={"conditions": []})
    kept = sb.http.put(f"{GW}/namespaces/t/gateways/c", json=put).json()
    assert kept["status"]["conditions"] == [condition("T")]
    bumped = sb.http.patch(f"{GW}/namespaces/t/gateways/c", json=[{"op": "replace", "path": "/spec/gatewayClassName", "value": "z"}],
                           headers={"Content-Type": "application/json-patch+json"}).json()
    assert bumped["metadata"]["generation"] == 2 and int(bumped["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])


def test_server_side_apply_owns_fields_and_reports_conflicts(sb):
    apply = {"Content-Type": "application/apply-patch+yaml"}
    url = f"{GW}/namespaces/t/gateways/d"
    r = sb.http.patch(url, params={"fieldManager": "alice"}, json=gateway("d"), headers=apply)
    assert r.status_code == 201
    managers = {m["manager"] for m in r.json()["metadata"]["managedFields"]}
    assert managers == {"alice"}
    bob = gateway("d")
    bob["spec"]["gatewayClassName"] = "bobs"
    conflict = sb.http.patch(url, params={"fieldManager": "bob"}, json=bob, headers=apply)
    assert conflict.status_code == 409
    assert "conflict with \"alice\"" in conflict.json()["message"] and ".spec.gatewayClassName" in conflict.json()["message"]
    forced = sb.http.patch(url, params={"fieldManager": "bob", "force": "true"}, json=bob, headers=apply)
    assert forced.status_code == 200 and forced.json()["spec"]["gatewayClassName"] == "bobs"
    # alice applies again without the field: it stays, bob owns it; alice's own dropped field goes away
    alice = gateway("d", addresses=[{"value": "1.2.3.4"}])
    sb.http.patch(url, params={"fieldManager": "alice", "force": "true"}, json=alice, headers=apply)
    del alice["spec"]["addresses"]
    out = sb.http.patch(url, params={"fieldManager": "alice"}, json=alice, headers=apply).json()
    assert "addresses" not in out["spec"]
    stale = dict(gateway("d"), metadata={"name": "d", "namespace": "t", "resourceVersion": "1"})
    assert sb.http.patch(url, params={"fieldManager": "alice", "force": "true"}, json=stale, headers=apply).status_code == 409


def test_finalizers_hold_deletion(sb):
    gw = gateway("e")
    gw["metadata"]["finalizers"] = ["x.io/hold"]
    sb.http.post(f"{GW}/namespaces/t/gateways", json=gw)
    held = sb.http.delete(f"{GW}/namespaces/t/gateways/e").json()
    assert held["metadata"]["deletionTimestamp"]
    assert sb.http.get(f"{GW}/namespaces/t/gateways/e").status_code == 200
    sb.http.patch(f"{GW}/namespaces/t/gateways/e", json={"metadata": {"finalizers": None}},
                  headers={"Content-Type": "application/merge-patch+json"})
    assert sb.http.get(f"{GW}/namespaces/t/gateways/e").status_code == 404


def _watch_lines(sb, path: str, **params) -> list[dict]:
    with sb.http.stream("GET", path, params={"watch": "true", **params}, timeout=10) as r:
        return [json.loads(line) for line in r.iter_lines() if line]


def test_watch_from_a_version_with_bookmarks_and_timeout(sb):
    rv = sb.http.get(f"{GW}/namespaces/t/gateways").json()["metadata"]["resourceVersion"]

    def later():
        sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("w1"))
        sb.http.delete(f"{GW}/namespaces/t/gateways/w1")

    threading.Timer(0.2, later).start()
    events = _watch_lines(sb, f"{GW}/namespaces/t/gateways", resourceVersion=rv, allowWatchBookmarks="true",
                          timeoutSeconds="1")
    kinds = [(e["type"], e["object"]["metadata"].get("name")) for e in events if e["type"] != "BOOKMARK"]
    assert kinds == [("ADDED", "w1"), ("DELETED", "w1")]
    assert any(e["type"] == "BOOKMARK" and e["object"]["metadata"]["resourceVersion"] for e in events)


def test_a_watch_with_a_label_selector_sees_objects_come_into_it_and_leave_it(sb):
    """As kube-apiserver's watch cache filters events: an object whose labels stop matching is
    DELETED for that watch (its last matching content, at the event's version), one that starts to
    match is ADDED, changes while it matches are MODIFIED, and changes outside it are not sent."""
    path = f"{GW}/namespaces/t/gateways"
    patch = {"Content-Type": "application/merge-patch+json"}
    created = sb.http.post(path, json=dict(gateway("sel"), metadata={"name": "sel", "namespace": "t", "labels": {"team": "a"}}))
    rv = created.json()["metadata"]["resourceVersion"]
    versions: list[str] = []

    def later():
        for body in ({"metadata": {"labels": {"team": "b"}}},  # leaves the selector
                     {"spec": {"gatewayClassName": "d"}},  # changes outside it: not sent
                     {"metadata": {"labels": {"team": "a"}}},  # comes back
                     {"spec": {"gatewayClassName": "e"}}):  # changes inside it
            versions.append(sb.http.patch(f"{path}/sel", content=json.dumps(body), headers=patch).json()["metadata"]["resourceVersion"])
        sb.http.delete(f"{path}/sel")

    threading.Timer(0.2, later).start()
    events = _watch_lines(sb, path, resourceVersion=rv, labelSelector="team=a", timeoutSeconds="1.5")
    seen = [(e["type"], e["object"]["metadata"]["labels"]["team"], e["object"]["spec"]["gatewayClassName"],
             e["object"]["metadata"]["resourceVersion"]) for e in events if e["type"] != "BOOKMARK"]
    assert seen[:3] == [("DELETED", "a", "c", versions[0]), ("ADDED", "a", "d", versions[2]),
                        ("MODIFIED", "a", "e", versions[3])]
    assert [t for t, *_ in seen] == ["DELETED", "ADDED", "MODIFIED", "DELETED"]
    # and a watch of the other label sees the object only while it carried it
    again = _watch_lines(sb, path, resourceVersion=rv, labelSelector="team=b", timeoutSeconds="0.5")
    assert [(e["type"], e["object"]["spec"]["gatewayClassName"]) for e in again if e["type"] != "BOOKMARK"] == \
        [("ADDED", "c"), ("MODIFIED", "d"), ("DELETED", "d")]


def test_watch_from_a_compacted_version_is_410_gone(sb):
    rv = sb.http.get(f"{GW}/namespaces/t/gateways").json()["metadata"]["resourceVersion"]
    sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("g1"))
    sb.http.post("/sandbox/faults", json={"compact": True})
    events = _watch_lines(sb, f"{GW}/namespaces/t/gateways", resourceVersion=rv, timeoutSeconds="1")
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


def test_selectors(sb):
    for name, team in (("s1", "a"), ("s2", "b")):
        gw = gateway(name)
        gw["metadata"]["labels"] = {"team": team}
        sb.http.post(f"{GW}/namespaces/t/gateways", json=gw)
    names = lambda **p: [o["metadata"]["name"] for o in sb.http.get(f"{GW}/namespaces/t/gateways", params=p).json()["items"]]
    assert names(labelSelector="team=a") == ["s1"]
    assert names(labelSelector="team in (a,b),team!=b") == ["s1"]
    assert names(fieldSelector="metadata.name=s2") == ["s2"]


def test_injected_write_failures(sb):
    sb.http.post("/sandbox/faults", json={"failWrites": [[1, 500], [2, 409]]})
    assert sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("f1")).status_code == 500
    assert sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("f1")).status_code == 409
    assert sb.http.post(f"{GW}/namespaces/t/gateways", json=gateway("f1")).status_code == 201


def test_real_kubectl_apply_get_delete_and_watch(sb, tmp_path):
    f = tmp_path / "gw.yaml"
    f.write_text("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: k, namespace: t}\n"
                 "spec:\n  gatewayClassName: c\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n")
    out = sb.kubectl("apply", "--server-side", "-f", str(f))
    assert "gateway.gateway.networking.k8s.io/k serverside-applied" in out.stdout
    table = sb.kubectl("get", "gateways", "-n", "t")
    assert table.stdout.splitlines()[0].split() == ["NAME", "CLASS", "ADDRESS", "PROGRAMMED", "AGE"] and any(l.startswith("k ") for l in table.stdout.splitlines())
    y = sb.kubectl("get", "gateway", "k", "-n", "t", "-o", "yaml")
    assert "gatewayClassName: c" in y.stdout and "uid:" in y.stdout
    jp = sb.kubectl("get", "gateway", "k", "-n", "t", "-o", "jsonpath={.metadata.generation}")
    assert jp.stdout == "1"
    env_cmd = ["kubectl", "--cache-dir", str(sb.cache), "get", "gateways", "-n", "t", "-w", "--request-timeout", "5s"]
    import os
    watcher = subprocess.Popen(env_cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, KUBECONFIG=str(sb.kubeconfig)))
    try:
        wait_for(lambda: sb.http.get("/sandbox/stats").json()["watches"] >= 1, 10)
        sb.kubectl("delete", "gateway", "k", "-n", "t")
        assert sb.kubectl("get", "gateway", "k", "-n", "t", check=False).returncode == 1
    finally:
        watcher.terminate()
        seen = watcher.communicate(timeout=5)[0]
    assert seen.count("\nk ") + seen.startswith("k ") >= 1


def test_real_kubectl_create_generators_send_protobuf(sb):
    """`kubectl create namespace|configmap|secret|serviceaccount|service` send protobuf bodies."""
    sb.kubectl("create", "namespace", "gen")
    assert sb.http.get("/api/v1/namespaces/gen").json()["metadata"]["labels"] == {"kubernetes.io/metadata.name": "gen"}
    sb.kubectl("create", "configmap", "cm", "-n", "gen", "--from-literal=a=b", "--from-literal=c=d")
    assert sb.http.get("/api/v1/namespaces/gen/configmaps/cm").json()["data"] == {"a": "b", "c": "d"}
    sb.kubectl("create", "secret", "generic", "s", "-n", "gen", "--from-literal=k=v")
    assert sb.kubectl("get", "secret", "s", "-n", "gen", "-o", "jsonpath={.data.k}").stdout == "dg=="  # base64 of "v"
    sb.kubectl("create", "serviceaccount", "sa", "-n", "gen")
    sb.kubectl("create", "service", "clusterip", "web", "-n", "gen", "--tcp=80:8080", "--tcp=443:https")
    spec = sb.http.get("/api/v1/namespaces/gen/services/web").json()["spec"]
    assert [(p["name"], p["port"], p["targetPort"], p["protocol"]) for p in spec["ports"]] == [
        ("80-8080", 80, 8080, "TCP"), ("443-https", 443, "https", "TCP")]
    assert spec["selector"] == {"app": "web"} and spec["type"] == "ClusterIP"
    assert sb.kubectl("get", "sa", "sa", "-n", "gen", "-o", "name").stdout.strip() == "serviceaccount/sa"
    # a kind the decoder does not know is a clear error, not a garbled object
    out = sb.kubectl("create", "deployment", "d", "-n", "gen", "--image=nginx", check=False)
    assert out.returncode == 1 and "apps/v1/Deployment in protobuf is not supported by the sandbox" in out.stderr


def test_a_broken_protobuf_body_is_415_naming_the_problem(sb):
    for body in (b"not protobuf", b"k8s\x00\x0a\x05\x0a\x02v1"):  # no magic; a truncated typeMeta
        r = sb.http.post("/api/v1/namespaces", content=body, headers={"Content-Type": "application/vnd.kubernetes.protobuf"})
        assert r.status_code == 415 and r.json()["reason"] == "UnsupportedMediaType"
        assert "protobuf body could not be decoded" in r.json()["message"]


def test_server_dry_run_changes_nothing_and_kubectl_diff_shows_the_change(sb, tmp_path):
    sb.kubectl("create", "namespace", "dry")
    assert sb.kubectl("get", "ns", "dry", "-o", "jsonpath={.status.phase}").stdout == "Active"
    sb.kubectl("create", "configmap", "cm", "-n", "dry", "--from-literal=a=b")
    rv = sb.http.get("/api/v1/namespaces/dry/configmaps/cm").json()["metadata"]["resourceVersion"]
    writes = sb.http.get("/sandbox/stats").json()["writes"]
    sb.kubectl("create", "configmap", "cm2", "-n", "dry", "--from-literal=a=b", "--dry-run=server")
    f = tmp_path / "cm.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: dry}\ndata: {a: z}\n")
    diff = sb.kubectl("diff", "-f", str(f), check=False)
    assert diff.returncode == 1 and "-  a: b" in diff.stdout and "+  a: z" in diff.stdout
    sb.kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", str(f))
    sb.kubectl("delete", "configmap", "cm", "-n", "dry", "--dry-run=server")
    sb.kubectl("delete", "namespace", "dry", "--dry-run=server")
    live = sb.http.get("/api/v1/namespaces/dry/configmaps/cm").json()
    assert live["data"] == {"a": "b"} and live["metadata"]["resourceVersion"] == rv
    assert sb.http.get("/api/v1/namespaces/dry/configmaps/cm2").status_code == 404
    assert sb.http.get("/sandbox/stats").json()["writes"] == writes


@pytest.mark.parametrize("body, code, words", [
    ([1, 2], 400, "must be a JSON or YAML object"),
    # a built-in kind is decoded into its Go type first: a wrong type is 400, in encoding/json's words
    ({"metadata": 5}, 400, 'Namespace in version "v1" cannot be handled as a Namespace: json: cannot unmarshal '
                           "number into Go struct field Namespace.metadata of type v1.ObjectMeta"),
    ({"metadata": {"name": 5}}, 400, "cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string"),
    ({"metadata": {"name": "Bad_Name"}}, 422, 'Namespace "Bad_Name" is invalid: metadata.name'),
    ({"metadata": {"name": "a", "labels": "x"}}, 400,
     "cannot unmarshal string into Go struct field ObjectMeta.metadata.labels of type map[string]string"),
    ({"metadata": {"name": "a", "labels": {"k": "bad value!"}}}, 422, "a valid label must be"),
    ({"metadata": {"name": "a", "finalizers": "x"}}, 400, "ObjectMeta.metadata.finalizers of type []string"),
])
def test_malformed_objects_are_refused_with_the_field_named(sb, body, code, words):
    r = sb.http.post("/api/v1/namespaces", json=body)
    assert r.status_code == code and r.json()["kind"] == "Status" and words in r.json()["message"], r.text
    assert sb.http.get("/api/v1/namespaces/a").status_code == 404
    # and through a patch of an object that exists: refused, the object unchanged
    r = sb.http.patch("/api/v1/namespaces/t", json={"metadata": {"labels": 7}},
                      headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 400 and "metadata.labels of type map[string]string" in r.json()["message"]
    assert sb.http.get("/api/v1/namespaces/t").json()["metadata"]["labels"] == {"kubernetes.io/metadata.name": "t"}


def test_only_the_token_written_in_its_kubeconfig_gets_in_over_tls(sb, tmp_path):
    """Every local user can reach 127.0.0.1: the sandbox answers only the bearer token it wrote into
    its kubeconfig (readable by its owner only), over TLS with its own CA (kubectl sends a token to
    no plain-HTTP server); the probes and /version answer anyone, as kube-apiserver's do."""
    import os
    import ssl
    import stat

    import httpx2 as httpx

    secrets_path = "/api/v1/namespaces/default/secrets"
    assert sb.http.post(secrets_path, json={"metadata": {"name": "s"}, "stringData": {"k": "v"}}).status_code == 201
    assert stat.S_IMODE(os.stat(sb.kubeconfig).st_mode) == 0o600
    verify = sb.client["verify"]
    for headers in ({}, {"Authorization": "Bearer sandbox"}, {"Authorization": "Bearer " + sb.client["headers"]["Authorization"][7:-1]}):
        r = httpx.get(sb.url + secrets_path, headers=headers, verify=verify, timeout=5)
        assert r.status_code == 401 and r.json()["reason"] == "Unauthorized", headers
    assert httpx.get(sb.url + "/healthz", verify=verify, timeout=5).text == "ok"
    assert httpx.get(sb.url + "/version", verify=verify, timeout=5).status_code == 200
    assert sb.http.get(secrets_path).json()["items"][0]["metadata"]["name"] == "s"
    with pytest.raises(httpx.HTTPError):  # no plain HTTP at all
        httpx.get(sb.url.replace("https://", "http://") + secrets_path, timeout=5)
    with pytest.raises((httpx.HTTPError, ssl.SSLError)):  # and not a server any certificate would do for
        httpx.get(sb.url + "/healthz", verify=ssl.create_default_context(), timeout=5)
    other = tmp_path / "other-kubeconfig"  # another user's kubeconfig without the token: kubectl is refused
    other.write_text(sb.kubeconfig.read_text().replace(sb.client["headers"]["Authorization"][7:], "guessed"))
    out = subprocess.run(["kubectl", "--kubeconfig", str(other), "get", "secrets"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and ("Unauthorized" in out.stderr + out.stdout or "credentials" in out.stderr)
    assert "s " in sb.kubectl("get", "secrets").stdout
