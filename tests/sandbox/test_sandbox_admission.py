"""The sandbox calls validating admission webhooks as kube-apiserver does: rules, selectors, TLS against
caBundle, failurePolicy, timeoutSeconds, dryRun, denials and warnings."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gwpolicy.webhook import certs
from sandbox_proc import SandboxProcess


class FakeWebhook:
    """An HTTPS webhook on loopback that records reviews and answers as told."""

    def __init__(self, tmp) -> None:
        self.ca = certs.make_ca()
        crt, key = certs.write_pair(str(tmp), "wh", certs.make_serving(self.ca, ["127.0.0.1"]))
        self.reviews: list[dict[str, Any]] = []
        self.answer: dict[str, Any] = {"allowed": True}
        self.delay = 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.reviews.append(body["request"])
                time.sleep(outer.delay)
                out = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": body["request"]["uid"], **outer.answer}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(crt, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def config(self, **hook: Any) -> dict[str, Any]:
        base = {"name": "check.example.io", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}/validate",
                                 "caBundle": base64.b64encode(self.ca.cert_pem).decode()},
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["configmaps"], "scope": "Namespaced"}]}
        base.update(hook)
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "check"}, "webhooks": [base]}

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def env(tmp_path):
    sb = SandboxProcess(tmp_path)
    sb.http.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    wh = FakeWebhook(tmp_path)
    try:
        yield sb, wh
    finally:
        wh.close()
        sb.close()


def configure(sb, cfg) -> None:
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    sb.http.delete(f"{path}/check")
    assert sb.http.post(path, json=cfg).status_code == 201


def cm(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"a": "b"}}


CMS = "/api/v1/namespaces/default/configmaps"


def test_a_matching_write_is_reviewed_and_its_warnings_come_back_as_headers(env):
    sb, wh = env
    configure(sb, wh.config())
    wh.answer = {"allowed": True, "warnings": ['mind the "gap"']}
    resp = sb.http.post(CMS, json=cm("one"))
    assert resp.status_code == 201
    assert resp.headers.get_list("Warning") == ['299 - "mind the \\"gap\\""']
    (review,) = wh.reviews
    assert review["operation"] == "CREATE" and review["namespace"] == "default" and review["dryRun"] is False
    assert review["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert review["object"]["metadata"]["name"] == "one" and review["object"]["metadata"].get("uid")
    # what does not match the rules is not sent: another resource, another operation
    sb.http.post("/api/v1/namespaces/default/secrets", json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}})
    sb.http.delete(f"{CMS}/one")
    assert len(wh.reviews) == 1


def test_a_denial_answers_as_kube_apiserver_and_stores_nothing(env):
    sb, wh = env
    configure(sb, wh.config())
    wh.answer = {"allowed": False, "status": {"code": 403, "message": "no configmaps today"}}
    resp = sb.http.post(CMS, json=cm("two"))
    assert resp.status_code == 403
    assert resp.json()["message"] == 'admission webhook "check.example.io" denied the request: no configmaps today'
    assert sb.http.get(f"{CMS}/two").status_code == 404


def test_selectors_choose_what_is_sent(env):
    sb, wh = env
    configure(sb, wh.config(objectSelector={"matchLabels": {"checked": "yes"}},
                            namespaceSelector={"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                                     "operator": "In", "values": ["default"]}]}))
    sb.http.post(CMS, json=cm("plain"))
    assert wh.reviews == []
    sb.http.post(CMS, json=cm("checked", {"checked": "yes"}))
    assert [r["name"] for r in wh.reviews] == ["checked"]
    sb.http.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    sb.http.post("/api/v1/namespaces/other/configmaps", json=cm("elsewhere", {"checked": "yes"}))
    assert [r["name"] for r in wh.reviews] == ["checked"]


def test_tls_is_verified_against_the_ca_bundle_and_failure_policy_decides(env):
    sb, wh = env
    other_ca = base64.b64encode(certs.make_ca().cert_pem).decode()
    cfg = wh.config(failurePolicy="Fail")
    cfg["webhooks"][0]["clientConfig"]["caBundle"] = other_ca
    configure(sb, cfg)
    resp = sb.http.post(CMS, json=cm("three"))
    assert resp.status_code == 500 and 'failed calling webhook "check.example.io"' in resp.json()["message"]
    assert sb.http.get(f"{CMS}/three").status_code == 404
    cfg["webhooks"][0]["failurePolicy"] = "Ignore"
    configure(sb, cfg)
    assert sb.http.post(CMS, json=cm("three")).status_code == 201
    assert wh.reviews == []  # the certificate was refused: nothing reached it


def test_a_slow_webhook_times_out_within_timeout_seconds(env):
    sb, wh = env
    configure(sb, wh.config(timeoutSeconds=1, failurePolicy="Fail"))
    wh.delay = 2.5
    t = time.monotonic()
    resp = sb.http.post(CMS, json=cm("slow"))
    assert resp.status_code == 500 and time.monotonic() - t < 2.4


def test_dry_run_is_passed_through_and_needs_side_effects_none(env):
    sb, wh = env
    configure(sb, wh.config())
    assert sb.http.post(CMS + "?dryRun=All", json=cm("dry")).status_code == 201
    assert wh.reviews[-1]["dryRun"] is True
    assert sb.http.get(f"{CMS}/dry").status_code == 404
    # a webhook with side effects cannot be registered in admissionregistration.k8s.io/v1 at all
    resp = sb.http.post("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", json=wh.config(sideEffects="Some"))
    assert resp.status_code == 422, resp.text
    assert 'webhooks[0].sideEffects: Unsupported value: "Some": supported values: "None", "NoneOnDryRun"' in resp.json()["message"]
