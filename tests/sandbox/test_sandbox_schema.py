"""Custom resources as strict as kube-apiserver takes them: every Gateway API CRD (standard and
experimental) compiles, every shipped example is accepted, and what a real server refuses is refused
with the fields named as it names them; kubectl shows the same messages."""

from __future__ import annotations

import copy
import json
import time

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.sandbox.schema import CompiledSchema, crd_schemas
from helpers import GATEWAY_API, GATEWAY_API_CRDS, needs_shared
from sandbox_proc import SandboxProcess

CRD_FILES = sorted(GATEWAY_API_CRDS.glob("*/*.yaml"))
EXAMPLES = sorted((GATEWAY_API / "examples").glob("**/*.yaml"))
GW = "/apis/gateway.networking.k8s.io/v1"


def _crds(channel: str) -> dict[tuple[str, str, str], CompiledSchema]:
    out = {}
    for f in CRD_FILES:
        if f.parent.name != channel:
            continue
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                for version, schema in crd_schemas(doc).items():
                    out[(doc["spec"]["group"], doc["spec"]["names"]["kind"], version)] = schema
    return out


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict[tuple[str, str, str], CompiledSchema]]:
    return {"standard": _crds("standard"), "experimental": _crds("experimental")}


def test_every_crd_compiles_with_every_rule(schemas):
    assert CRD_FILES, f"{GATEWAY_API_CRDS} is missing"
    kinds = {kind for (_, kind, _) in schemas["experimental"]}
    assert {"Gateway", "HTTPRoute", "GRPCRoute", "GatewayClass", "ReferenceGrant", "BackendTLSPolicy",
            "TLSRoute", "TCPRoute", "UDPRoute", "ListenerSet", "XBackendTrafficPolicy", "XMesh"} <= kinds


def _example_objects():
    for f in EXAMPLES:
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and "gateway.networking" in doc.get("apiVersion", ""):
                yield f, doc


@needs_shared
def test_every_shipped_example_is_accepted_unchanged_but_for_defaults(schemas):
    checked = 0
    for f, doc in _example_objects():
        group, _, version = doc["apiVersion"].rpartition("/")
        channel = "experimental" if "experimental" in f.parts else "standard"
        schema = schemas[channel].get((group, doc["kind"], version)) or schemas["experimental"].get((group, doc["kind"], version))
        assert schema is not None, f"{f}: no CRD serves {doc['apiVersion']} {doc['kind']}"
        out = schema.admit(copy.deepcopy(doc))
        assert not out.errors and not out.unknown, f"{f}: {doc['kind']} {doc['metadata']['name']}: " \
            f"{[str(e) for e in out.errors]} unknown {out.unknown}"
        checked += 1
    assert checked >= 80


def route(**spec) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "t"},
            "spec": {"parentRefs": [{"name": "gw"}], **spec}}


def messages(schema: CompiledSchema, obj: dict, old: dict | None = None) -> list[str]:
    return [str(e) for e in schema.admit(obj, old).errors]


def test_defaults_are_applied_as_the_crd_says(schemas):
    s = schemas["standard"][("gateway.networking.k8s.io", "HTTPRoute", "v1")]
    out = s.admit(route(rules=[{"backendRefs": [{"name": "svc", "port": 80}]}])).obj
    assert out["spec"]["parentRefs"] == [{"name": "gw", "group": "gateway.networking.k8s.io", "kind": "Gateway"}]
    rule = out["spec"]["rules"][0]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["backendRefs"] == [{"name": "svc", "port": 80, "group": "", "kind": "Service", "weight": 1}]


def test_what_a_real_server_refuses_is_refused_naming_the_field(schemas):
    s = schemas["standard"][("gateway.networking.k8s.io", "HTTPRoute", "v1")]
    errs = messages(s, route(parentRefs=[{"name": "gw", "port": 0}], hostnames=["Bad_Host"], rules=[
        {"filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}],
         "backendRefs": [{"name": "svc", "port": 80}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "noslash"}}],
         "backendRefs": [{"name": "svc"}]}]))
    assert "spec.parentRefs[0].port: Invalid value: 0: spec.parentRefs[0].port in body should be greater than or equal to 1" in errs
    assert any(e.startswith('spec.hostnames[0]: Invalid value: "Bad_Host": spec.hostnames[0] in body should match') for e in errs)
    assert 'spec.rules[0]: Invalid value: "object": RequestRedirect filter must not be used together with backendRefs' in errs
    assert any(e.startswith('spec.rules[1].matches[0].path: Invalid value: "object": value must be an absolute path') for e in errs)
    assert 'spec.rules[1].backendRefs[0]: Invalid value: "object": Must have port for Service reference' in errs
    errs = messages(s, route(rules=[{"matches": [{"method": "FETCH"}]}]))
    assert errs[0].startswith('spec.rules[0].matches[0].method: Unsupported value: "FETCH": supported values: "GET"')


def test_types_required_sizes_and_list_types(schemas):
    gw = schemas["standard"][("gateway.networking.k8s.io", "Gateway", "v1")]
    base = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "g"},
            "spec": {"gatewayClassName": "c", "listeners": [{"name": "a", "port": 80, "protocol": "HTTP"}]}}
    assert messages(gw, base) == []
    wrong = copy.deepcopy(base)
    wrong["spec"]["listeners"][0]["port"] = "eighty"
    assert messages(gw, wrong)[0] == ('spec.listeners[0].port: Invalid value: "string": spec.listeners[0].port in body '
                                      'must be of type integer: "string"')
    # with a wrong type, the CEL rules are not evaluated, and the answer says so (as kube-apiserver's does)
    assert messages(gw, wrong)[-1] == ('Invalid value: "null": some validation rules were not checked because the '
                                       'object was invalid; correct the existing errors to complete validation')
    missing = copy.deepcopy(base)
    del missing["spec"]["gatewayClassName"]
    assert "spec.gatewayClassName: Required value" in messages(gw, missing)
    dup = copy.deepcopy(base)
    dup["spec"]["listeners"].append({"name": "a", "port": 81, "protocol": "HTTP"})
    assert 'spec.listeners[1]: Duplicate value: {"name":"a"}' in messages(gw, dup)
    many = copy.deepcopy(base)
    many["spec"]["listeners"] = [{"name": f"l{i}", "port": 1000 + i, "protocol": "HTTP"} for i in range(65)]
    assert "spec.listeners: Too many: 65: must have at most 64 items" in messages(gw, many)
    long = copy.deepcopy(base)
    long["spec"]["gatewayClassName"] = "c" * 300
    assert "spec.gatewayClassName: Too long: may not be more than 253 bytes" in messages(gw, long)
    addr = copy.deepcopy(base)
    addr["spec"]["addresses"] = [{"type": "IPAddress", "value": "not-an-ip"}]
    assert any("spec.addresses[0]" in e for e in messages(gw, addr))
    addr["spec"]["addresses"] = [{"value": "10.0.0.1"}]  # type defaults to IPAddress
    assert messages(gw, addr) == []


def test_unknown_fields_are_pruned_and_nulls_dropped(schemas):
    s = schemas["standard"][("gateway.networking.k8s.io", "HTTPRoute", "v1")]
    out = s.admit(route(color="blue", hostnames=None, rules=[{"backendRefs": [{"name": "s", "port": 1, "extra": 1}]}]))
    assert out.unknown == ["spec.color", "spec.rules[0].backendRefs[0].extra"]
    assert "color" not in out.obj["spec"] and "hostnames" not in out.obj["spec"]
    assert "extra" not in out.obj["spec"]["rules"][0]["backendRefs"][0]


def test_transition_rules_see_the_old_object(schemas):
    gc = schemas["standard"][("gateway.networking.k8s.io", "GatewayClass", "v1")]
    old = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "c"},
           "spec": {"controllerName": "example.com/a"}}
    new = copy.deepcopy(old)
    new["spec"]["controllerName"] = "example.com/b"
    assert messages(gc, new) == []  # a create: no old value, the rule does not apply
    assert messages(gc, new, old) == ['spec.controllerName: Invalid value: "string": field is immutable']
    assert messages(gc, copy.deepcopy(old), old) == []


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abc/.-_AZ09 ", max_size=12))
def test_a_path_value_is_refused_exactly_when_the_crd_pattern_or_rule_refuses_it(value):
    s = _STD[("gateway.networking.k8s.io", "HTTPRoute", "v1")]
    errs = messages(s, route(rules=[{"matches": [{"path": {"type": "PathPrefix", "value": value}}]}]))
    expected_ok = value.startswith("/") and "//" not in value and "/./" not in value and "/../" not in value \
        and "%2f" not in value.lower() and "#" not in value and not value.endswith(("/..", "/.")) and " " not in value \
        and len(value) <= 1024
    assert (errs == []) == expected_ok, (value, errs)


_STD = _crds("standard")


def test_admitting_is_fast_enough_for_every_write(schemas):
    s = schemas["standard"][("gateway.networking.k8s.io", "HTTPRoute", "v1")]
    obj = route(hostnames=["a.example.com"], rules=[{"matches": [{"path": {"type": "PathPrefix", "value": f"/p{i}"}}],
                                                     "backendRefs": [{"name": "svc", "port": 80}]} for i in range(4)])
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        s.admit(obj)
    per = (time.perf_counter() - start) / n
    assert per < 0.005, f"{per * 1000:.2f} ms per HTTPRoute"


# ---------- through the server, as kubectl sees it ----------

@pytest.fixture(scope="module")
def sb(tmp_path_factory):
    with SandboxProcess(tmp_path_factory.mktemp("sandbox-schema"), "--crds", "none") as s:  # the CRDs applied here
        s.kubectl("apply", "--server-side", "-f", str(GATEWAY_API_CRDS / "experimental"))
        s.kubectl("create", "namespace", "t")
        yield s


@needs_shared
def test_kubectl_applies_every_example_and_reads_back_defaults(sb, tmp_path):
    namespaces = {(doc.get("metadata") or {}).get("namespace") for _, doc in _example_objects()} - {None, "default"}
    for ns in sorted(namespaces):
        sb.kubectl("create", "namespace", ns, check=False)
    out = sb.kubectl("apply", "--server-side", "-R", "-f", str(GATEWAY_API / "examples"), check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("serverside-applied") >= 80
    got = json.loads(sb.kubectl("get", "httproutes", "-A", "-o", "json").stdout)["items"]
    assert got
    for r in got:
        for ref in r["spec"].get("parentRefs") or []:
            assert ref.get("kind") and "group" in ref, (r["metadata"]["name"], ref)
        for rule in r["spec"].get("rules") or []:
            assert rule.get("matches"), (r["metadata"]["name"], rule)


def test_kubectl_shows_the_fields_a_refused_object_got_wrong(sb):
    bad = route(rules=[{"filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}],
                        "backendRefs": [{"name": "svc", "port": 80}]}])
    bad["metadata"]["name"] = "bad"
    out = sb.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(bad), check=False)
    assert out.returncode != 0
    assert 'The HTTPRoute "bad" is invalid: spec.rules[0]: Invalid value: "object": ' \
           "RequestRedirect filter must not be used together with backendRefs" in out.stderr
    assert sb.http.get(f"{GW}/namespaces/t/httproutes/bad").status_code == 404
    r = sb.http.post(f"{GW}/namespaces/t/httproutes", json=bad)
    body = r.json()
    assert r.status_code == 422 and body["reason"] == "Invalid"
    assert body["message"] == ('HTTPRoute.gateway.networking.k8s.io "bad" is invalid: spec.rules[0]: Invalid value: '
                               '"object": RequestRedirect filter must not be used together with backendRefs')
    assert body["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "spec.rules[0]", "message":
                                          'Invalid value: "object": RequestRedirect filter must not be used together with backendRefs'}]


def test_kubectl_strict_field_validation_refuses_unknown_fields(sb):
    obj = route(colour="blue")
    obj["metadata"]["name"] = "strict"
    out = sb.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)
    assert out.returncode != 0 and 'strict decoding error: unknown field "spec.colour"' in out.stderr
    # server-side apply cannot type the patch, whatever the validation (kube-apiserver's words)
    out = sb.kubectl("apply", "--server-side", "--validate=false", "-f", "-", input=json.dumps(obj), check=False)
    assert out.returncode != 0 and out.stderr == ("Error from server: failed to create typed patch object (t/strict; "
                                                  "gateway.networking.k8s.io/v1, Kind=HTTPRoute): .spec.colour: field "
                                                  "not declared in schema\n"), out.stderr
    r = sb.http.post(f"{GW}/namespaces/t/httproutes", json=obj)  # no fieldValidation: Warn, and pruned
    assert r.status_code == 201 and "colour" not in r.json()["spec"]
    assert 'unknown field \\"spec.colour\\"' in r.headers.get("Warning", "")


def test_the_status_subresource_is_validated_too(sb):
    obj = route()
    obj["metadata"]["name"] = "st"
    assert sb.http.post(f"{GW}/namespaces/t/httproutes", json=obj).status_code == 201
    bad = {"status": {"parents": [{"parentRef": {"name": "gw"}, "controllerName": "example.com/c",
                                   "conditions": [{"type": "Accepted", "status": "Maybe"}]}]}}
    r = sb.http.patch(f"{GW}/namespaces/t/httproutes/st/status", json=bad,
                      headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 422, r.text
    fields = {c["field"] for c in r.json()["details"]["causes"]}
    assert {"status.parents[0].conditions[0].status", "status.parents[0].conditions[0].reason",
            "status.parents[0].conditions[0].lastTransitionTime"} <= fields


def test_a_crd_whose_rule_does_not_compile_is_refused(sb):
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "x-kubernetes-validations": [{"rule": "self.nope("}]}}}]}}
    r = sb.http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    assert r.status_code == 422 and "x-kubernetes-validations[0].rule" in r.json()["message"]
    assert sb.http.get("/apis/example.com/v1").status_code == 404


def test_kubectl_client_side_apply_and_create_show_the_servers_messages(sb, tmp_path):
    f = tmp_path / "r.yaml"
    obj = route(colour="blue", rules=[{"matches": [{"path": {"type": "PathPrefix", "value": "nope"}}],
                                       "backendRefs": [{"name": "s"}]}])
    obj["metadata"]["name"] = "client-side"
    f.write_text(json.dumps(obj))
    out = sb.kubectl("apply", "-f", str(f), check=False)
    assert out.returncode == 1 and 'error when creating "' in out.stderr
    assert 'HTTPRoute in version "v1" cannot be handled as a HTTPRoute: strict decoding error: unknown field "spec.colour"' \
        in out.stderr
    del obj["spec"]["colour"]
    f.write_text(json.dumps(obj))
    for verb in ("apply", "create"):
        out = sb.kubectl(verb, "-f", str(f), check=False)
        assert out.returncode == 1
        assert 'The HTTPRoute "client-side" is invalid: \n' in out.stderr
        assert '* spec.rules[0].backendRefs[0]: Invalid value: "object": Must have port for Service reference' in out.stderr
        assert "* spec.rules[0].matches[0].path: Invalid value: \"object\": value must be an absolute path" in out.stderr


def test_rules_with_message_expression_reason_and_field_path():
    schema = CompiledSchema({"type": "object", "properties": {"spec": {
        "type": "object", "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "self.min <= self.max", "messageExpression": "'min ' + string(self.min) + ' is over max ' + string(self.max)",
             "fieldPath": ".min", "reason": "FieldValueForbidden"}]}}})
    out = schema.admit({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "x"}, "spec": {"min": 5, "max": 2}})
    assert [(e.field, e.reason, e.body) for e in out.errors] == [("spec.min", "FieldValueForbidden", "Forbidden: min 5 is over max 2")]
    assert schema.admit({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "x"}, "spec": {"min": 1, "max": 2}}).errors == []
