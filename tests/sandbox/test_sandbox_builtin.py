"""Built-in kinds refused as kube-apiserver refuses them, seen through real kubectl: a wrong type is
400 in encoding/json's words, an invalid value 422 with every field named, unknown fields per
`--validate` (strict: refused, warn: a warning, false: dropped); and everything this project applies
(examples/, deploy/, the Gateway API examples and CRDs, the conformance manifests, a 1k-route
synthetic cluster) is still accepted, stored as sent plus kube-apiserver's defaults."""

from __future__ import annotations

import copy
import glob
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy.bench.generate import cluster
from gwpolicy.engine.kinds import split_api_version
from gwpolicy.sandbox import builtin, gotypes
from gwpolicy.sandbox.store import ApiFailure, Store, is_builtin
from helpers import needs_shared
from sandbox_proc import SandboxProcess

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="module")
def sb(tmp_path_factory):
    with SandboxProcess(tmp_path_factory.mktemp("builtin")) as s:
        yield s


def apply(sb: SandboxProcess, obj: dict[str, Any], *extra: str):
    return sb.kubectl("apply", *extra, "-f", "-", input=json.dumps(obj), check=False)


def svc(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def obj(api: str, kind: str, name: str, **body: Any) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name}, **body}


RBAC = "rbac.authorization.k8s.io/v1"
ADM = "admissionregistration.k8s.io/v1"
DNS1123_LABEL = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                 "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
DNS1123_SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                     "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                     "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
CONFIG_KEY = ("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
              "'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')")


def hook(name: str = "check.example.com", **over: Any) -> dict[str, Any]:
    h = {"name": name, "clientConfig": {"url": "https://127.0.0.1:9443/validate"}, "sideEffects": "None",
         "admissionReviewVersions": ["v1"],
         "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]}
    h.update(over)
    return h


def crd(**over: Any) -> dict[str, Any]:
    spec = {"group": "example.com", "scope": "Namespaced", "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object"}}}}}]}
    spec.update(over)
    return obj("apiextensions.k8s.io/v1", "CustomResourceDefinition", "widgets.example.com", spec=spec)


def lease(name: str, **spec: Any) -> dict[str, Any]:
    return obj("coordination.k8s.io/v1", "Lease", name, spec=spec)


# (object, what kubectl prints: kube-apiserver's Status as kubectl shows it). One or more per kind.
REFUSED = [
    (obj("v1", "Namespace", "team.a"),
     f'The Namespace "team.a" is invalid: metadata.name: Invalid value: "team.a": {DNS1123_LABEL}'),
    (svc("web", ports=[{"port": 80, "protocol": "HTTP"}]),
     'The Service "web" is invalid: spec.ports[0].protocol: Unsupported value: "HTTP": supported values: "SCTP", "TCP", "UDP"'),
    (svc("web", ports=[{"port": 80}, {"port": 443}]),
     'The Service "web" is invalid: \n* spec.ports[0].name: Required value\n* spec.ports[1].name: Required value'),
    (svc("web", ports=[{"name": "a", "port": 80}, {"name": "a", "port": 81}]),
     'The Service "web" is invalid: spec.ports[1].name: Duplicate value: "a"'),
    (svc("web", ports=[{"port": 70000, "targetPort": 8080}]),
     'The Service "web" is invalid: spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive'),
    (svc("web", ports=[{"port": 80, "targetPort": "web_port"}]),
     'The Service "web" is invalid: spec.ports[0].targetPort: Invalid value: "web_port": must contain only '
     "alpha-numeric characters (a-z, 0-9), and hyphens (-)"),
    (svc("web", type="Internal", ports=[{"port": 80}]),
     'The Service "web" is invalid: spec.type: Unsupported value: "Internal": supported values: "ClusterIP", '
     '"ExternalName", "LoadBalancer", "NodePort"'),
    (svc("web"), 'The Service "web" is invalid: spec.ports: Required value'),
    (svc("web", ports=[{"port": "http"}]),
     'Error from server (BadRequest): error when creating "STDIN": Service in version "v1" cannot be handled as a '
     "Service: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32"),
    (svc("Web", ports=[{"port": 80}]),
     'The Service "Web" is invalid: metadata.name: Invalid value: "Web": a DNS-1035 label must consist of lower case '
     "alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character "
     "(e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"),
    (obj("v1", "Secret", "s", data={"key": "abc!"}),
     'Error from server (BadRequest): error when creating "STDIN": Secret in version "v1" cannot be handled as a '
     "Secret: illegal base64 data at input byte 3"),
    (obj("v1", "Secret", "s", data={"a key": "YQ=="}),
     f'The Secret "s" is invalid: data[a key]: Invalid value: "a key": {CONFIG_KEY}'),
    (obj("v1", "Secret", "tls", type="kubernetes.io/tls", data={"tls.crt": "YQ=="}),
     'The Secret "tls" is invalid: data[tls.key]: Required value'),
    (obj("v1", "ConfigMap", "c", data={"../x": "y"}),
     f'The ConfigMap "c" is invalid: \n* data[../x]: Invalid value: "../x": {CONFIG_KEY}\n'
     '* data[../x]: Invalid value: "../x": must not start with \'..\''),
    (obj("v1", "ConfigMap", "c", data={"n": 1}),
     'Error from server (BadRequest): error when creating "STDIN": ConfigMap in version "v1" cannot be handled as a '
     "ConfigMap: json: cannot unmarshal number into Go struct field ConfigMap.data of type string"),
    (obj("v1", "ServiceAccount", "robot", automountServiceAccountToken="yes"),
     'Error from server (BadRequest): error when creating "STDIN": ServiceAccount in version "v1" cannot be handled '
     "as a ServiceAccount: json: cannot unmarshal string into Go struct field "
     "ServiceAccount.automountServiceAccountToken of type bool"),
    (obj("v1", "ServiceAccount", "Robot"),
     f'The ServiceAccount "Robot" is invalid: metadata.name: Invalid value: "Robot": {DNS1123_SUBDOMAIN}'),
    (obj("v1", "Event", "e", count="many"),
     'Error from server (BadRequest): error when creating "STDIN": Event in version "v1" cannot be handled as a '
     "Event: json: cannot unmarshal string into Go struct field Event.count of type int32"),
    (obj("discovery.k8s.io/v1", "EndpointSlice", "eps", addressType="IPv5", endpoints=[]),
     'The EndpointSlice "eps" is invalid: addressType: Unsupported value: "IPv5": supported values: "FQDN", "IPv4", "IPv6"'),
    (obj("discovery.k8s.io/v1", "EndpointSlice", "eps", addressType="IPv4", endpoints=[{"addresses": ["::1"]}]),
     'The EndpointSlice "eps" is invalid: endpoints[0].addresses[0]: Invalid value: "::1": must be a valid IPv4 address'),
    (obj("discovery.k8s.io/v1", "EndpointSlice", "eps", endpoints=[]),
     'The EndpointSlice "eps" is invalid: addressType: Required value'),
    (lease("l", leaseDurationSeconds=0),
     'The Lease "l" is invalid: spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0'),
    (lease("l", holderIdentity=5),
     'Error from server (BadRequest): error when creating "STDIN": Lease in version "v1" cannot be handled as a Lease: '
     "json: cannot unmarshal number into Go struct field LeaseSpec.spec.holderIdentity of type string"),
    (obj(RBAC, "ClusterRole", "reader", rules=[{"apiGroups": [""], "resources": ["pods"]}]),
     'The ClusterRole "reader" is invalid: rules[0].verbs: Required value: verbs must contain at least one value'),
    (obj(RBAC, "Role", "reader", rules=[{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]),
     'The Role "reader" is invalid: rules[0].nonResourceURLs: Invalid value: []string{"/healthz"}: namespaced rules '
     "cannot apply to non-resource URLs"),
    (obj(RBAC, "ClusterRoleBinding", "b", roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
         subjects=[{"kind": "ServiceAccount", "name": "robot", "namespace": "default"}]),
     'The ClusterRoleBinding "b" is invalid: roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole"'),
    (obj(RBAC, "RoleBinding", "b", roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
         subjects=[{"kind": "Robot", "name": "x"}]),
     'The RoleBinding "b" is invalid: subjects[0].kind: Unsupported value: "Robot": supported values: '
     '"ServiceAccount", "User", "Group"'),
    (obj("apps/v1", "Deployment", "d", spec={"selector": {"matchLabels": {"app": "a"}},
                                             "template": {"metadata": {"labels": {"app": "b"}}, "spec": {}}}),
     'The Deployment "d" is invalid: spec.template.metadata.labels: Invalid value: map[string]string{"app":"b"}: '
     "`selector` does not match template `labels`"),
    (crd(versions=[{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {"type": "object"}}},
                   {"name": "v2", "served": True, "storage": True, "schema": {"openAPIV3Schema": {"type": "object"}}}]),
     'The CustomResourceDefinition "widgets.example.com" is invalid: spec.versions: Invalid value: '
     "[]apiextensions.CustomResourceDefinitionVersion{...}: must have exactly one version marked as storage version"),
    (crd(group="example"),
     'The CustomResourceDefinition "widgets.example.com" is invalid: \n* metadata.name: Invalid value: '
     '"widgets.example.com": must be spec.names.plural+"."+spec.group\n* spec.group: Invalid value: "example": '
     "should be a domain with at least one dot"),
    (crd(versions=[{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
        "type": "object", "properties": {"spec": {"properties": {"size": {"type": "integer"}}}}}}}]),
     'The CustomResourceDefinition "widgets.example.com" is invalid: spec.versions[0].schema.openAPIV3Schema'
     ".properties[spec].type: Required value: must not be empty for specified object fields"),
    (crd(versions=[{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
        "type": "object", "properties": {"tags": {"type": "array"}}}}}]),
     'The CustomResourceDefinition "widgets.example.com" is invalid: spec.versions[0].schema.openAPIV3Schema'
     ".properties[tags].items: Required value: must be specified"),
    (crd(scope="Global"),
     'The CustomResourceDefinition "widgets.example.com" is invalid: spec.scope: Unsupported value: "Global": '
     'supported values: "Cluster", "Namespaced"'),
    (obj(ADM, "ValidatingWebhookConfiguration", "v", webhooks=[hook(clientConfig={})]),
     'The ValidatingWebhookConfiguration "v" is invalid: webhooks[0].clientConfig: Required value: exactly one of '
     "url or service is required"),
    (obj(ADM, "ValidatingWebhookConfiguration", "v", webhooks=[hook(clientConfig={"url": "http://127.0.0.1:9443/v"})]),
     'The ValidatingWebhookConfiguration "v" is invalid: webhooks[0].clientConfig.url: Invalid value: "http": '
     "'https' is the only allowed URL scheme; desired format: https://host[/path]"),
    (obj(ADM, "ValidatingWebhookConfiguration", "v", webhooks=[hook(clientConfig={"service": {
        "name": "hooks", "namespace": "default", "path": "/v1//check"}})]),
     'The ValidatingWebhookConfiguration "v" is invalid: webhooks[0].clientConfig.service.path: Invalid value: '
     '"/v1//check": segment[1] may not be empty'),
    (obj(ADM, "ValidatingWebhookConfiguration", "v", webhooks=[hook(name="check")]),
     'The ValidatingWebhookConfiguration "v" is invalid: webhooks[0].name: Invalid value: "check": should be a '
     "domain with at least three segments separated by dots"),
    (obj(ADM, "ValidatingWebhookConfiguration", "v", webhooks=[hook(timeoutSeconds=60)]),
     'The ValidatingWebhookConfiguration "v" is invalid: webhooks[0].timeoutSeconds: Invalid value: 60: the timeout '
     "value must be between 1 and 30 seconds"),
    (obj(ADM, "MutatingWebhookConfiguration", "m", webhooks=[{k: v for k, v in hook().items() if k != "sideEffects"}]),
     'The MutatingWebhookConfiguration "m" is invalid: webhooks[0].sideEffects: Required value: must specify one of '
     "None, NoneOnDryRun"),
    (obj(ADM, "ValidatingAdmissionPolicyBinding", "b", spec={"validationActions": ["Deny"]}),
     'The ValidatingAdmissionPolicyBinding "b" is invalid: spec.policyName: Required value'),
    (obj(ADM, "ValidatingAdmissionPolicy", "p", spec={"matchConstraints": {"resourceRules": [
        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]},
        "validations": [{"message": "no"}]}),
     'The ValidatingAdmissionPolicy "p" is invalid: spec.validations[0].expression: Required value: expression is '
     "not specified"),
]


def _ids() -> list[str]:
    return [f"{o['kind']}-{i}" for i, (o, _) in enumerate(REFUSED)]


@pytest.mark.parametrize("body, printed", REFUSED, ids=_ids())
def test_kubectl_shows_the_refusal_kube_apiserver_would_give(sb, body, printed):
    out = apply(sb, body)
    assert out.returncode == 1 and out.stderr.rstrip("\n") == printed, out.stderr
    kind = body["kind"]
    got = sb.kubectl("get", kind.lower(), body["metadata"]["name"], "--ignore-not-found", "-o", "name", check=False)
    assert got.stdout == "", f"a refused {kind} was stored"


def test_every_served_built_in_kind_has_a_type_and_a_table():
    from gwpolicy.sandbox.resources import BUILTINS

    for r in BUILTINS:
        assert gotypes.has_type(r.kind) and (r.group, r.kind) in builtin.KINDS, r.kind
    assert {b["kind"] for b, _ in REFUSED} >= {r.kind for r in BUILTINS}  # a refusal shown for each


def test_unknown_fields_follow_kubectl_validate(sb):
    body = svc("unknown", ports=[{"port": 80, "portt": 81}], clusterIPP="x")
    strict = apply(sb, body)  # kubectl's default: --validate=strict
    assert strict.returncode == 1
    # (kubectl sends the fields sorted, and the decoder names them in the order it meets them)
    assert strict.stderr.rstrip() == ('Error from server (BadRequest): error when creating "STDIN": Service in version '
                                      '"v1" cannot be handled as a Service: strict decoding error: unknown field '
                                      '"spec.clusterIPP", unknown field "spec.ports[0].portt"')
    warn = apply(sb, body, "--validate=warn")
    assert warn.returncode == 0, warn.stderr
    assert 'Warning: unknown field "spec.clusterIPP"' in warn.stderr
    assert 'Warning: unknown field "spec.ports[0].portt"' in warn.stderr
    stored = sb.http.get("/api/v1/namespaces/default/services/unknown").json()
    assert stored["spec"]["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}] and "clusterIPP" not in stored["spec"]
    body["metadata"]["name"] = "ignored"
    ignore = apply(sb, body, "--validate=false")
    assert ignore.returncode == 0 and "Warning" not in ignore.stderr, ignore.stderr
    assert "clusterIPP" not in sb.http.get("/api/v1/namespaces/default/services/ignored").json()["spec"]


def test_unknown_fields_by_the_query_parameter_and_in_metadata(sb):
    body = obj("v1", "ConfigMap", "q", data={"a": "b"}, extra=1)
    body["metadata"]["labelz"] = {"a": "b"}
    r = sb.http.post("/api/v1/namespaces/default/configmaps", params={"fieldValidation": "Strict"}, json=body)
    assert r.status_code == 400 and r.json()["reason"] == "BadRequest"
    # in the order the decoder meets them
    assert r.json()["message"] == ('ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: '
                                   'unknown field "metadata.labelz", unknown field "extra"')
    r = sb.http.post("/api/v1/namespaces/default/configmaps", params={"fieldValidation": "Warn"}, json=body)
    assert r.status_code == 201 and r.headers.get_list("Warning") == ['299 - "unknown field \\"metadata.labelz\\""',
                                                                      '299 - "unknown field \\"extra\\""']
    assert "extra" not in r.json() and "labelz" not in r.json()["metadata"]


def test_a_missing_name_is_refused_as_kube_apiserver_refuses_it(sb):
    r = sb.http.post("/api/v1/namespaces/default/configmaps", json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}})
    assert r.status_code == 422
    assert r.json()["message"] == 'ConfigMap "" is invalid: metadata.name: Required value: name or generateName is required'
    assert r.json()["details"]["causes"] == [{"reason": "FieldValueRequired", "field": "metadata.name",
                                              "message": "Required value: name or generateName is required"}]


def test_a_422_names_every_field_in_details_causes(sb):
    r = sb.http.post("/api/v1/namespaces/default/services", json=svc("two", ports=[{"port": 0, "protocol": "X"}]))
    assert r.status_code == 422
    st = r.json()
    assert st["reason"] == "Invalid" and st["details"]["kind"] == "Service" and st["details"]["name"] == "two"
    assert [(c["field"], c["reason"]) for c in st["details"]["causes"]] == [
        ("spec.ports[0].port", "FieldValueInvalid"), ("spec.ports[0].protocol", "FieldValueNotSupported"),
        ("spec.ports[0].targetPort", "FieldValueInvalid")]


def test_immutable_fields_are_refused_on_update(sb, tmp_path):
    base = svc("fixed", clusterIP="10.96.0.10", ports=[{"port": 80}])
    assert apply(sb, base).returncode == 0
    moved = copy.deepcopy(base)
    moved["spec"]["clusterIP"] = "10.96.0.11"
    out = sb.kubectl("replace", "-f", "-", input=json.dumps(moved), check=False)
    assert out.stderr.rstrip() == ('The Service "fixed" is invalid: spec.clusterIPs[0]: Invalid value: '
                                   '[]string{"10.96.0.11"}: may not change once set')
    # leaving the cluster IP out keeps it (as kube-apiserver's registry does)
    del moved["spec"]["clusterIP"]
    assert sb.kubectl("replace", "-f", "-", input=json.dumps(moved), check=False).returncode == 0
    assert sb.http.get("/api/v1/namespaces/default/services/fixed").json()["spec"]["clusterIP"] == "10.96.0.10"

    eps = obj("discovery.k8s.io/v1", "EndpointSlice", "fixed", addressType="IPv4",
              endpoints=[{"addresses": ["10.0.0.1"]}], ports=[{"name": "http", "port": 8080}])
    assert apply(sb, eps).returncode == 0
    eps["addressType"] = "FQDN"
    eps["endpoints"] = [{"addresses": ["a.example.com"]}]
    out = apply(sb, eps)
    assert out.stderr.rstrip() == 'The EndpointSlice "fixed" is invalid: addressType: Invalid value: "FQDN": field is immutable'

    binding = obj(RBAC, "RoleBinding", "fixed", roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "a"},
                  subjects=[{"kind": "User", "name": "jane"}])
    assert apply(sb, binding).returncode == 0
    binding["roleRef"]["name"] = "b"
    out = apply(sb, binding)
    assert out.stderr.rstrip() == ('The RoleBinding "fixed" is invalid: roleRef: Invalid value: rbac.RoleRef{'
                                   'APIGroup:"rbac.authorization.k8s.io", Kind:"Role", Name:"b"}: cannot change roleRef')
    stored = sb.http.get("/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings/fixed").json()
    assert stored["subjects"] == [{"kind": "User", "name": "jane", "apiGroup": "rbac.authorization.k8s.io"}]  # defaulted


def test_a_secret_keeps_string_data_as_base64_data(sb):
    out = apply(sb, obj("v1", "Secret", "creds", stringData={"user": "admin"}))
    assert out.returncode == 0, out.stderr
    stored = sb.http.get("/api/v1/namespaces/default/secrets/creds").json()
    assert stored["data"] == {"user": "YWRtaW4="} and stored["type"] == "Opaque" and "stringData" not in stored


def test_rbac_names_may_hold_colons_as_kube_apiserver_allows(sb):
    out = apply(sb, obj(RBAC, "ClusterRole", "system:gwpolicy:reader",
                        rules=[{"apiGroups": [""], "resources": ["services"], "verbs": ["get"]}]))
    assert out.returncode == 0, out.stderr
    # kubectl itself refuses such a name in a URL; a client that sends it in a body gets kube-apiserver's answer
    r = sb.http.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", json=obj(RBAC, "ClusterRole", "a%b", rules=[]))
    assert r.status_code == 422
    assert r.json()["message"] == 'ClusterRole.rbac.authorization.k8s.io "a%b" is invalid: metadata.name: Invalid value: ' \
                                  '"a%b": may not contain \'%\''


# ---------- what this project applies is still accepted ----------

def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader) if isinstance(d, dict)]


def project_objects() -> list[tuple[str, dict[str, Any]]]:
    """Every built-in object the project's manifests, the shared Gateway API material and the
    conformance cases hold (with the Secrets and ConfigMaps the conformance harness generates)."""
    import gwconformance

    files = [Path(f) for pattern in ("examples/**/*.yaml", "deploy/**/*.yaml", "tests/data/**/*.yaml")
             for f in glob.glob(str(ROOT / pattern), recursive=True)]
    files += [Path(f) for f in glob.glob(str(SHARED / "gateway-api" / "**" / "*.yaml"), recursive=True)]
    out = [(str(f), d) for f in sorted(files) for d in _documents(f)]
    for f in sorted((SHARED / "gateway-conformance").glob("*.yaml")):
        for d in _documents(f):
            out += [(str(f), m) for m in d.get("manifests") or [] if isinstance(m, dict)]
    generated, _ = gwconformance.generated_objects(gwconformance.load_base())
    out += [("gateway-conformance generated", o) for o in generated]
    # the synthetic cluster of `gwpolicy bench` at 1k routes, made here: the built-in objects it
    # holds (Namespaces, Services) are most of what this test counts
    out += [("gwpolicy bench generate --routes 1000", o) for o in cluster(1000)]
    return out


def _resource(store: Store, o: dict[str, Any]):
    if not isinstance(o.get("apiVersion"), str) or not isinstance(o.get("kind"), str):
        return None
    group, _ = split_api_version(o["apiVersion"])
    r = store.registry.by_kind.get((group, o["kind"]))
    return r if r is not None and is_builtin(r) else None


def _without_server_fields(o: dict[str, Any]) -> dict[str, Any]:
    o = copy.deepcopy(o)
    meta = o.get("metadata") or {}
    for k in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "namespace"):
        meta.pop(k, None)
    (meta.get("labels") or {}).pop("kubernetes.io/metadata.name", None)
    if meta.get("labels") == {}:
        meta.pop("labels")
    return o


def _contains(stored: Any, sent: Any, path: str = "") -> str | None:
    """None when every field sent is stored unchanged; else where it is not."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return path
        for k, v in sent.items():
            if v is None:
                continue
            if k not in stored:
                return f"{path}.{k}"
            why = _contains(stored[k], v, f"{path}.{k}")
            if why:
                return why
        return None
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            return path
        for i, (a, b) in enumerate(zip(stored, sent)):
            why = _contains(a, b, f"{path}[{i}]")
            if why:
                return why
        return None
    return None if stored == sent else path


@needs_shared
def test_everything_the_project_applies_is_accepted_with_no_unknown_field():
    store = Store()
    store.field_validation = "Strict"
    checked: dict[str, int] = {}
    for where, o in project_objects():
        r = _resource(store, o)
        if r is None:
            continue
        sent = copy.deepcopy(o)
        ns = (o.get("metadata") or {}).get("namespace") or "default"
        if r.namespaced and ("", "namespaces", "", ns) not in store.objects:
            store.create(store.registry.by_plural[("", "namespaces")], "", {"metadata": {"name": ns}})
        if (r.group, r.plural, ns if r.namespaced else "", o["metadata"]["name"]) in store.objects:
            continue  # the same object in two files (the standard and experimental CRDs)
        try:
            stored = store.create(r, ns, copy.deepcopy(o))
        except ApiFailure as exc:
            pytest.fail(f"{where}: {o['kind']} {o['metadata'].get('name')}: {exc.code} {exc.message}")
        assert not store.warnings, f"{where}: {store.warnings}"
        if r.kind == "Secret":
            sent.pop("stringData", None)
        why = _contains(stored, _without_server_fields(sent))
        assert why is None, f"{where}: {o['kind']} {o['metadata']['name']}: {why} not stored as sent"
        checked[r.kind] = checked.get(r.kind, 0) + 1
    assert sum(checked.values()) > 1000 and {"Namespace", "Service", "Secret", "ConfigMap", "ClusterRole",
                                             "CustomResourceDefinition", "Deployment",
                                             "ValidatingWebhookConfiguration"} <= set(checked), checked


def test_kubectl_applies_the_examples_and_deploy_unchanged(tmp_path):
    from sandbox_proc import GW_CRDS

    s = SandboxProcess(tmp_path)
    try:
        deploy = [f for f in sorted((ROOT / "deploy").glob("*.yaml")) if f.name != "kustomization.yaml"]
        files = [GW_CRDS] + deploy + sorted((ROOT / "examples" / "parable").glob("*.yaml"))
        for f in files:  # one by one: a file's kinds come from the CRDs of the files before it
            out = s.kubectl("apply", "--server-side", "-f", str(f), check=False)
            assert out.returncode == 0 and "Warning" not in out.stderr, f"{f}: {out.stderr}"
    finally:
        s.close()


# ---------- property: what the declared shapes accept is stored as sent, plus defaults ----------

_NAMES = st.from_regex(r"[a-z]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
_KEYS = st.from_regex(r"[-._a-zA-Z0-9]{1,12}", fullmatch=True).filter(lambda k: k != "." and not k.startswith(".."))
_LABELS = st.dictionaries(st.from_regex(r"[a-z]([-a-z0-9.]{0,8}[a-z0-9])?", fullmatch=True),
                          st.from_regex(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,8}[A-Za-z0-9])?)?", fullmatch=True), max_size=3)


@st.composite
def services(draw) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    numbers = draw(st.lists(st.integers(1, 65535), min_size=n, max_size=n, unique=True))
    names = draw(st.lists(_NAMES.filter(lambda x: len(x) <= 15), min_size=n, max_size=n, unique=True))
    ports = []
    for i, p in enumerate(numbers):
        port: dict[str, Any] = {"port": p}
        if n > 1 or draw(st.booleans()):
            port["name"] = names[i]
        if draw(st.booleans()):
            port["protocol"] = draw(st.sampled_from(["TCP", "UDP", "SCTP"]))
        if draw(st.booleans()):
            port["targetPort"] = draw(st.integers(1, 65535) | st.sampled_from(["http", "web-8080", "grpc"]))
        ports.append(port)
    spec: dict[str, Any] = {"ports": ports}
    if draw(st.booleans()):
        spec["selector"] = draw(_LABELS)
    if draw(st.booleans()):
        spec["type"] = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
    return svc(draw(_NAMES), **spec)


@st.composite
def config_maps(draw) -> dict[str, Any]:
    body: dict[str, Any] = {"data": draw(st.dictionaries(_KEYS, st.text(max_size=20), max_size=4))}
    if draw(st.booleans()):
        body["binaryData"] = {k + "-bin": "YWJj" for k in draw(st.lists(_KEYS, max_size=2, unique=True))
                              if k + "-bin" not in body["data"]}
    return obj("v1", "ConfigMap", draw(_NAMES), **body)


@st.composite
def endpoint_slices(draw) -> dict[str, Any]:
    # a pod's address: kube-apiserver refuses unspecified, loopback and link-local ones
    ips = st.ip_addresses(v=4).filter(lambda ip: not (ip.is_unspecified or ip.is_loopback or ip.is_link_local
                                                       or ip in ipaddress.ip_network("224.0.0.0/24"))).map(str)
    eps = [{"addresses": draw(st.lists(ips, min_size=1, max_size=3)),
            "conditions": {"ready": draw(st.booleans())}} for _ in range(draw(st.integers(0, 3)))]
    ports = [{"name": name, "port": draw(st.integers(1, 65535))} for name in draw(st.lists(_NAMES, max_size=3, unique=True))]
    return obj("discovery.k8s.io/v1", "EndpointSlice", draw(_NAMES), addressType="IPv4", endpoints=eps, ports=ports)


@st.composite
def leases(draw) -> dict[str, Any]:
    return lease(draw(_NAMES), holderIdentity=draw(st.text(max_size=10)),
                 leaseDurationSeconds=draw(st.integers(1, 3600)), leaseTransitions=draw(st.integers(0, 100)),
                 renewTime="2026-01-01T00:00:00.000000Z")


@st.composite
def roles(draw) -> dict[str, Any]:
    rules = [{"apiGroups": draw(st.lists(st.sampled_from(["", "apps", "gateway.networking.k8s.io"]), min_size=1, max_size=2)),
              "resources": draw(st.lists(_NAMES, min_size=1, max_size=2)),
              "verbs": draw(st.lists(st.sampled_from(["get", "list", "watch", "patch"]), min_size=1, max_size=3))}
             for _ in range(draw(st.integers(0, 3)))]
    return obj(RBAC, draw(st.sampled_from(["Role", "ClusterRole"])), draw(_NAMES), rules=rules)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(services(), config_maps(), endpoint_slices(), leases(), roles()))
def test_what_the_shapes_accept_is_stored_as_sent_plus_defaults(body):
    store = Store()
    store.field_validation = "Strict"
    r = _resource(store, body)
    stored = store.create(r, "default", copy.deepcopy(body))
    assert not store.warnings
    assert _contains(stored, _without_server_fields(body)) is None
    # and what was added is only what the kind declares as defaults
    table = builtin.KINDS[(r.group, r.kind)]
    default_paths = {p for p, _ in table.defaults}
    if r.kind == "Service":  # and the cluster IP allocation (sandbox/clusterips.py)
        default_paths |= {"spec.clusterIP", "spec.clusterIPs", "spec.ipFamilies", "spec.ipFamilyPolicy"}
    added = _added(stored, body)
    assert all(any(_pattern_covers(p, a) for p in default_paths) for a in added), (added, default_paths)
    # the stored object is accepted again unchanged (a no-op replace)
    again = store.update(r, "default", stored["metadata"]["name"], copy.deepcopy(stored))
    assert again == stored


def _added(stored: Any, sent: Any, path: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(stored, dict) and isinstance(sent, dict):
        for k, v in stored.items():
            if path == "" and k in ("metadata", "apiVersion", "kind"):
                continue
            p = f"{path}.{k}" if path else k
            out += [p] if k not in sent else _added(v, sent[k], p)
    elif isinstance(stored, list) and isinstance(sent, list):
        for i, (a, b) in enumerate(zip(stored, sent)):
            out += _added(a, b, f"{path}[{i}]")
    return out


def _pattern_covers(pattern: str, path: str) -> bool:
    import re

    rx = re.escape(pattern).replace(r"\[\*\]", r"\[\d+\]")
    return re.fullmatch(rx, path) is not None


# ---------- property: the Go types read every well-typed object unchanged ----------

def _typed(t: str, depth: int = 0) -> st.SearchStrategy:
    """Values of the declared type `t` (nested structs to a small depth)."""
    if t in ("string", "Time"):
        return st.text(max_size=8)
    if t in ("int32", "int64"):
        return st.integers(-1000, 1000)
    if t == "float64":
        return st.floats(allow_nan=False, allow_infinity=False, width=32)
    if t == "bool":
        return st.booleans()
    if t == "IntOrString":
        return st.integers(0, 65535) | st.text(max_size=8)
    if t == "[]byte":
        return st.binary(max_size=12).map(lambda b: __import__("base64").b64encode(b).decode())
    if t in ("JSON", "Object"):
        return st.just({"any": [1, "two"]})
    if t.startswith("[]"):
        return st.lists(_typed(t[2:], depth + 1), max_size=2)
    if t.startswith("map[string]"):
        return st.dictionaries(st.text(min_size=1, max_size=6), _typed(t[len("map[string]"):], depth + 1), max_size=2)
    if t in gotypes._EITHER:  # noqa: SLF001 - the declared either-types
        return _typed(gotypes._EITHER[t][0], depth)  # noqa: SLF001
    fields = gotypes.STRUCTS.get(t, {})
    if depth > 3:
        return st.just({})
    return st.fixed_dictionaries({}, optional={k: _typed(v, depth + 1) for k, v in fields.items()})


_TOP_KINDS = sorted(k for k in gotypes.STRUCTS if gotypes.has_type(k))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_TOP_KINDS).flatmap(lambda k: st.tuples(st.just(k), _typed(k))))
def test_the_go_types_read_every_well_typed_object_unchanged(kind_and_body):
    kind, body = kind_and_body
    got = gotypes.decode(kind, copy.deepcopy(body))
    assert got.error is None and got.unknown == []
    assert got.obj == body


def _sites(t: str, v: Any, struct: str, names: tuple[str, ...], holder: Any, key: Any) -> list[tuple]:
    """Every field of a well-typed value, at any depth: (struct, JSON names from the root, declared
    type, the container holding it, its key there), as encoding/json names a field in its errors."""
    out: list[tuple] = []
    if t in gotypes._EITHER:  # noqa: SLF001
        t = gotypes._EITHER[t][0]  # noqa: SLF001
    if t in gotypes.STRUCTS and isinstance(v, dict):
        for k, x in v.items():
            sub = gotypes.STRUCTS[t].get(k)
            if sub is not None:
                out.append((t, names + (k,), sub, v, k))
                out += _sites(sub, x, t, names + (k,), v, k)
    elif t.startswith("[]") and isinstance(v, list):
        for i, x in enumerate(v):
            out += [(st_, n, ty, h, k) for st_, n, ty, h, k in _sites(t[2:], x, struct, names, v, i)]
    elif t.startswith("map[string]") and isinstance(v, dict):
        for k, x in v.items():
            out += _sites(t[len("map[string]"):], x, struct, names, v, k)
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_TOP_KINDS).flatmap(lambda k: st.tuples(st.just(k), _typed(k))),
       st.sampled_from([{"x": 1}, ["x"], "x", 1.5, True]), st.data())
def test_a_wrong_type_anywhere_is_named_by_its_field(kind_and_body, wrong, data):
    """Replace one field's value, at any depth, by a value of another JSON type: the decoder refuses
    the object naming that field as encoding/json does (`Struct.path.to.field of type T`)."""
    kind, body = kind_and_body
    sites = [x for x in _sites(kind, body, kind, (), None, None) if x[2] != "JSON" and not _accepts(x[2], wrong)]
    if not sites:
        return
    struct, names, t, holder, key = data.draw(st.sampled_from(sites))
    holder[key] = wrong
    got = gotypes.decode(kind, body)
    if t == "[]byte" and isinstance(wrong, str):
        assert got.error == "illegal base64 data at input byte 0"
        return
    want = f"Go struct field {struct}.{'.'.join(names)} of type "
    assert got.error is not None and want in got.error, (got.error, want)
    if t != "Object":  # a list or map of the right shape is refused at its element, as there
        elem = t[2:] if t.startswith("[]") and isinstance(wrong, list) else \
            t[len("map[string]"):] if t.startswith("map[string]") and isinstance(wrong, dict) else t
        assert got.error.endswith(f"of type {gotypes.go_name(elem)}"), got.error


def _accepts(t: str, v: Any) -> bool:
    """Whether `v` is a well-typed value of the declared type `t` (so no error is due)."""
    if t in ("string", "Time"):
        return isinstance(v, str)
    if t == "bool":
        return isinstance(v, bool)
    if t in ("int32", "int64"):
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "float64":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "IntOrString":
        return isinstance(v, str) or _accepts("int32", v)
    if t == "[]byte":
        return isinstance(v, str) and gotypes.base64_error(v) is None
    if t.startswith("[]"):
        return isinstance(v, list) and all(_accepts(t[2:], x) for x in v)
    if t.startswith("map[string]"):
        return isinstance(v, dict) and all(_accepts(t[len("map[string]"):], x) for x in v.values())
    if t in gotypes._EITHER:  # noqa: SLF001
        return any(_accepts(u, v) for u in gotypes._EITHER[t])  # noqa: SLF001
    if t in gotypes.STRUCTS or t == "Object":  # unknown fields are no type error
        fields = gotypes.STRUCTS.get(t, {})
        return isinstance(v, dict) and all(_accepts(fields[k], x) for k, x in v.items() if k in fields)
    return True
