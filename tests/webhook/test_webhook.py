"""The admission webhook: what a review answers (pure, on the parable), and the whole loop as a user
meets it: real kubectl against `gwpolicy sandbox` and against a real kube-apiserver (conftest.py),
which call `gwpolicy webhook` over HTTPS with the caBundle it registered. The webhook runs as deploy/'s
ServiceAccount, under deploy/'s RBAC on kube-apiserver, where the configuration deploy/ installs
points at the webhook's loopback URL (it runs outside the cluster) and the webhook patches it."""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from pathlib import Path

import orjson
import pytest

import live_server
from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.inplace.apply import prepare
from gwpolicy.engine.refs import Ref
from gwpolicy.files.load import load_paths
from gwpolicy.files.output import effective_list
from gwpolicy.webhook.review import MAX_TOTAL, MAX_WARNING, MAX_WARNINGS, Options, fold, review
from helpers import NOW, ROOT
from kube_apiserver import deploy_objects, free_port
from sandbox_proc import BIN, wait_for

PARABLE = ROOT / "examples" / "parable"


def parable_raws() -> list[dict]:
    return load_paths([str(PARABLE)]).objects


@pytest.fixture(scope="module")
def raws():
    return parable_raws()


def analysed(raws):
    a = analyse(copy.deepcopy(raws), default_namespace="default", now=NOW)
    a.status_changes()
    prepare(a)
    return a


def find(raws, kind, ns, name):
    return next(o for o in raws if o["kind"] == kind and o["metadata"]["name"] == name
                and o["metadata"].get("namespace") == ns)


def request(op, obj, old=None):
    return {"uid": str(uuid.uuid4()), "operation": op, "object": obj, "oldObject": old,
            "namespace": (obj or old)["metadata"].get("namespace")}


def effective_items(a) -> list[bytes]:
    """The effective policies, each as JSON, in a canonical order (in-place updates keep content, not order)."""
    return sorted(orjson.dumps(i, option=orjson.OPT_SORT_KEYS) for i in effective_list(a)["items"])


def test_a_route_under_a_namespace_override_is_warned_of_it(raws):
    a = analysed(raws)
    route = copy.deepcopy(find(raws, "HTTPRoute", "baker", "cake"))
    route["metadata"].setdefault("labels", {})["edited"] = "yes"
    verdict, broken = review(a, request("UPDATE", route, find(raws, "HTTPRoute", "baker", "cake")), Options(), lambda: raws)
    assert verdict.allowed and not broken
    text = "\n".join(verdict.warnings)
    assert "HTTPRoute baker/cake is affected by RetryPolicy baker/baker-retries" in text
    assert "overrides" in text and "Namespace/baker" in text and "maxRetries=1" in text


def test_a_policy_that_would_be_conflicted_names_the_older_one_and_can_be_denied(raws):
    a = analysed(raws)
    new = copy.deepcopy(find(raws, "HealthCheckPolicy", "baker", "cake-health"))
    new["metadata"] = {"name": "cake-health-v3", "namespace": "baker", "creationTimestamp": "2026-06-01T00:00:00Z"}
    req = request("CREATE", new)
    verdict, _ = review(a, req, Options(), lambda: raws)
    assert verdict.allowed
    conflict = [w for w in verdict.warnings if "would be Conflicted" in w]
    assert conflict and "HealthCheckPolicy baker/cake-health" in conflict[0], verdict.warnings
    denied, _ = review(a, req, Options(deny_conflicts=True), lambda: raws)
    assert not denied.allowed
    assert "cake-health" in denied.message and "To apply it" in denied.message
    assert denied.response("x")["status"]["code"] == 403


def test_an_invalid_policy_is_warned_and_denied_only_when_asked(raws):
    a = analysed(raws)
    bad = {"apiVersion": "policy.acme.io/v1", "kind": "RetryPolicy",
           "metadata": {"name": "to-a-gatewayclass", "namespace": "baker"},
           "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "acme-lb"}],
                    "defaults": {"maxRetries": 2}}}
    verdict, _ = review(a, request("CREATE", bad), Options(), lambda: raws)
    assert verdict.allowed and any("would be Invalid" in w for w in verdict.warnings), verdict.warnings
    denied, _ = review(a, request("CREATE", bad), Options(deny_invalid=True), lambda: raws)
    assert not denied.allowed and "Invalid" in denied.message


def test_a_policy_beaten_on_every_path_says_which_field_and_by_what(raws):
    a = analysed(raws)
    mine = copy.deepcopy(find(raws, "RetryPolicy", "baker", "cake-retries"))
    verdict, _ = review(a, request("UPDATE", mine, find(raws, "RetryPolicy", "baker", "cake-retries")),
                        Options(), lambda: raws)
    beaten = [w for w in verdict.warnings if "maxRetries is beaten" in w]
    assert beaten and "RetryPolicy baker/baker-retries" in beaten[0], verdict.warnings


def test_a_review_leaves_the_analysis_as_it_was(raws):
    """Every review applies the incoming object and takes it out again: the model the controller and the
    next review read is unchanged (equal to a fresh analysis)."""
    a = analysed(raws)
    before = effective_items(analysed(raws))
    for o in raws:
        if o["kind"] in ("HTTPRoute",) or o["kind"].endswith("Policy"):
            edited = copy.deepcopy(o)
            edited.setdefault("spec", {})["targetRefs"] = [{"group": "", "kind": "Namespace", "name": "grocer"}] \
                if o["kind"].endswith("Policy") else edited["spec"].get("targetRefs")
            for op, obj, old in (("UPDATE", edited, o), ("DELETE", None, o)):
                review(a, request(op, obj, old), Options(), lambda: raws)
    assert effective_items(a) == before


MESH = [
    {"apiVersion": "gateway.networking.x-k8s.io/v1alpha1", "kind": "XMesh", "metadata": {"name": "mesh"},
     "spec": {"controllerName": "gwpolicy.io/mesh-controller"}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "b"},
     "spec": {"ports": [{"name": "http", "port": 80}]}},
]


def _timeout_policy(ns: str, name: str, target: dict) -> dict:
    return {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "TimeoutPolicy", "metadata": {"name": name, "namespace": ns},
            "spec": {"targetRef": target, "defaults": {"readTimeout": "1s"}}}


def test_a_policy_on_another_namespaces_service_is_warned_that_it_applies_to_its_own_requests_only():
    """GEP-713's mesh rule: the policy is Accepted, but only a's requests to b/s get it, which its
    author may not expect; the warning says so and what would make it apply to everyone."""
    from test_gateway_policies import policy_manifests

    raws = policy_manifests() + copy.deepcopy(MESH)
    a = analysed(raws)
    to_s = {"group": "", "kind": "Service", "name": "s", "namespace": "b"}
    verdict, _ = review(a, request("CREATE", _timeout_policy("a", "slow-calls", to_s)), Options(), lambda: raws)
    assert verdict.allowed
    assert verdict.warnings == ["TimeoutPolicy a/slow-calls applies to Service b/s for requests from namespace a only "
                                "(the target is in another namespace: GEP-713's mesh rule); a ReferenceGrant in b "
                                "would make it apply to every namespace's requests"]
    # the Service's own namespace: its policy applies to every request, nothing to warn of
    own = _timeout_policy("b", "own", {"group": "", "kind": "Service", "name": "s"})
    verdict, _ = review(a, request("CREATE", own), Options(), lambda: raws)
    assert not any("mesh rule" in w for w in verdict.warnings), verdict.warnings
    # a ReferenceGrant in b makes a's policy b's own, for every consumer: no warning
    grant = {"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
             "metadata": {"name": "from-a", "namespace": "b"},
             "spec": {"from": [{"group": "gwpolicy.io", "kind": "TimeoutPolicy", "namespace": "a"}],
                      "to": [{"group": "", "kind": "Service"}]}}
    granted = raws + [grant]
    verdict, _ = review(analysed(granted), request("CREATE", _timeout_policy("a", "slow-calls", to_s)), Options(),
                        lambda: granted)
    assert not any("mesh rule" in w for w in verdict.warnings), verdict.warnings


def test_warnings_stay_within_what_kube_apiserver_passes_on():
    ref = Ref("gateway.networking.k8s.io", "HTTPRoute", "ns", "r")
    out = fold([f"warning {i} " + "x" * 400 for i in range(40)], ref)
    assert len(out) <= MAX_WARNINGS and all(len(w) <= MAX_WARNING for w in out)
    assert sum(map(len, out)) <= MAX_TOTAL + MAX_WARNING
    assert out[-1].startswith("and ") and "kubectl gwpolicy describe httproute/r -n ns" in out[-1]


# ---------- the loop through real kubectl ----------

SA = "gwpolicy-webhook"


class Webhook:
    """`gwpolicy webhook` as deploy/'s ServiceAccount, on a port of 127.0.0.1 picked here."""

    def __init__(self, sb: live_server.LiveServer, *flags: str, port: int | None = None) -> None:
        self.port = port or free_port("127.0.0.1")
        self.proc = subprocess.Popen([str(BIN / "gwpolicy"), "webhook", "--kubeconfig", str(sb.identity(SA)),
                                      "--port", str(self.port), "--health-listen", "127.0.0.1:0", *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.sb = sb

    def wait_registered(self) -> None:
        def ready():
            out = self.sb.kubectl("get", "validatingwebhookconfiguration", "gwpolicy", "-o", "json", check=False)
            if out.returncode != 0:
                return False
            hook = json.loads(out.stdout)["webhooks"][0]
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            return hook["clientConfig"]["url"].endswith("/validate") and "policy.acme.io" in groups
        assert wait_for(ready, 30), self.proc.stderr.read() if self.proc.poll() is not None else "not registered"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def install(sb: live_server.LiveServer, port: int) -> None:
    """deploy/60-webhook.yaml as a cluster admin installs it, for a webhook outside the cluster: its
    configuration's clientConfig is the URL where the webhook listens (the webhook then registers its
    caBundle and rules there, with the `patch` its Role allows)."""
    objs = deploy_objects("60-webhook.yaml")
    for o in objs:
        if o["kind"] == "ValidatingWebhookConfiguration":
            for hook in o["webhooks"]:
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate"}
    sb.apply(objs)
    sb.install_deploy(policy_groups=["policy.acme.io"])  # the parable's policy kinds, as deploy/ says to add them


def _installed(server_kind: str, tmp_path: Path, files: list[Path]):
    """An API server with `files`, and the webhook's configuration and RBAC from deploy/; at the
    end, deploy/'s RBAC must have refused the webhook nothing."""
    sb = live_server.start(server_kind, tmp_path, files=files)
    try:
        sb.port = free_port("127.0.0.1")
        install(sb, sb.port)
        yield sb
        assert sb.refused(SA) == [], "deploy/'s RBAC refused the webhook these"
    finally:
        sb.close()


@pytest.fixture
def sandbox(tmp_path, server_kind):
    yield from _installed(server_kind, tmp_path, [PARABLE])


def _edited_route(tmp: Path) -> Path:
    route = copy.deepcopy(find(parable_raws(), "HTTPRoute", "baker", "cake"))
    route["metadata"] = {"name": "cake", "namespace": "baker", "labels": {"edited": "yes"}}
    route.pop("status", None)
    f = tmp / "cake.yaml"
    f.write_text(json.dumps(route))
    return f


def _new_health_policy(tmp: Path) -> Path:
    p = copy.deepcopy(find(parable_raws(), "HealthCheckPolicy", "baker", "cake-health"))
    p["metadata"] = {"name": "cake-health-v3", "namespace": "baker"}
    p.pop("status", None)
    f = tmp / "health.yaml"
    f.write_text(json.dumps(p))
    return f


def test_kubectl_apply_prints_the_webhooks_warnings(sandbox, tmp_path):
    wh = Webhook(sandbox, port=sandbox.port)
    try:
        wh.wait_registered()
        route = _edited_route(tmp_path)

        def warned():
            out = sandbox.kubectl("apply", "-f", str(route))
            return "Warning: HTTPRoute baker/cake is affected by RetryPolicy baker/baker-retries" in out.stderr and out
        out = wait_for(warned, 30)  # the webhook answers once its informers have synced
        assert "httproute.gateway.networking.k8s.io/cake" in out.stdout
        policy = sandbox.kubectl("apply", "-f", str(_new_health_policy(tmp_path)))
        assert "Warning: HealthCheckPolicy baker/cake-health-v3 would be Conflicted" in policy.stderr
        assert "HealthCheckPolicy baker/cake-health" in policy.stderr
    finally:
        wh.close()


MESH_EXAMPLE = ROOT / "examples" / "mesh"
XMESH_CRD = ROOT / "deploy" / "gateway-api" / "experimental" / "gateway.networking.x-k8s.io_xmeshes.yaml"


@pytest.fixture
def mesh_cluster(tmp_path, server_kind):
    """examples/mesh (an XMesh, demo's Service reports) with the XMesh CRD and deploy/'s TimeoutPolicy
    CRD, and the webhook's configuration and RBAC from deploy/."""
    yield from _installed(server_kind, tmp_path, [XMESH_CRD, ROOT / "deploy" / "41-timeoutpolicy.yaml", MESH_EXAMPLE])


def test_kubectl_apply_warns_that_a_policy_on_another_namespaces_service_is_its_own_namespaces(mesh_cluster, tmp_path):
    """The webhook reads the XMesh (deploy/'s RBAC lets it): blog's TimeoutPolicy on demo's Service
    is Accepted by the mesh rule, for blog's requests only, and kubectl prints that at apply time."""
    sb = mesh_cluster
    wh = Webhook(sb, port=sb.port)
    try:
        policy = tmp_path / "blog-calls.yaml"
        policy.write_text(json.dumps(_timeout_policy("blog", "blog-calls", {"group": "", "kind": "Service",
                                                                             "name": "reports", "namespace": "demo"})))

        def warned():  # a dry run is reviewed like a create: until the webhook has its model, no warning
            out = sb.kubectl("create", "--dry-run=server", "-f", str(policy), check=False)
            return "applies to Service demo/reports for requests from namespace blog only" in out.stderr and out
        out = wait_for(warned, 60)
        assert out, "no mesh-rule warning"
        assert "Warning: TimeoutPolicy blog/blog-calls applies to Service demo/reports for requests from namespace " \
               "blog only (the target is in another namespace: GEP-713's mesh rule)" in out.stderr
        assert "Invalid" not in out.stderr
        applied = sb.kubectl("apply", "-f", str(policy))
        stored = json.loads(sb.kubectl("get", "timeoutpolicy", "blog-calls", "-n", "blog", "-o", "json").stdout)
        assert stored["spec"]["targetRef"]["namespace"] == "demo"  # deploy/'s CRD keeps it
        assert "for requests from namespace blog only" in applied.stderr
    finally:
        wh.close()


def test_deny_conflicts_refuses_the_apply_and_says_what_to_change(sandbox, tmp_path):
    wh = Webhook(sandbox, "--deny-conflicts", port=sandbox.port)
    try:
        wh.wait_registered()
        wait_for(lambda: "Warning:" in sandbox.kubectl("apply", "-f", str(_edited_route(tmp_path))).stderr, 30)
        out = sandbox.kubectl("apply", "-f", str(_new_health_policy(tmp_path)), check=False)
        assert out.returncode != 0
        assert 'admission webhook "validate.gwpolicy.io" denied the request' in out.stderr
        assert "To apply it" in out.stderr
        gone = sandbox.kubectl("get", "healthcheckpolicies", "cake-health-v3", "-n", "baker", check=False)
        assert gone.returncode != 0  # nothing was stored
    finally:
        wh.close()


def test_with_the_webhook_down_and_failure_policy_ignore_the_apply_goes_through(sandbox, tmp_path):
    wh = Webhook(sandbox, port=sandbox.port)
    wh.wait_registered()
    wh.close()
    out = sandbox.kubectl("apply", "-f", str(_edited_route(tmp_path)))
    assert out.returncode == 0 and "is affected by" not in out.stderr
    labels = sandbox.kubectl("get", "httproute", "cake", "-n", "baker", "-o", "jsonpath={.metadata.labels.edited}")
    assert labels.stdout == "yes"  # stored: the unreachable webhook was passed over


def test_replicas_share_the_certificate_the_registered_ca_bundle_vouches_for(sandbox, tmp_path):
    """In a cluster every replica must serve a certificate the one caBundle verifies: the first makes it
    and keeps it in --cert-secret, the next one serves that same certificate."""
    import base64
    import re
    import ssl
    import urllib.request

    first = Webhook(sandbox, "--cert-secret", "gwpolicy-system/gwpolicy-webhook-tls", port=sandbox.port)
    second = Webhook(sandbox, "--cert-secret", "gwpolicy-system/gwpolicy-webhook-tls", "--no-register")
    try:
        first.wait_registered()
        line = ""
        while "serving https://" not in line:
            line = second.proc.stderr.readline()
            assert line or second.proc.poll() is None, "the second replica did not start"
        port = int(re.search(r":(\d+)/validate", line).group(1))
        cfg = json.loads(sandbox.kubectl("get", "validatingwebhookconfiguration", "gwpolicy", "-o", "json").stdout)
        ca = base64.b64decode(cfg["webhooks"][0]["clientConfig"]["caBundle"]).decode()
        ctx = ssl.create_default_context(cadata=ca)
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=5) as resp:
            assert resp.read() == b"ok"
    finally:
        first.close()
        second.close()
