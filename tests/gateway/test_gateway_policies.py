"""Policy kinds the gateway enforces: CRDs, translation to NGINX directives, honest limits.

Pure tests (no NGINX); traffic through NGINX is in test_gateway_policies_traffic.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gwpolicy.engine.analysis import analyse
from gwpolicy.gateway import policies
from gwpolicy.gateway import policyconf as pc
from gwpolicy.gateway.policies import values as pv
from helpers import needs_shared

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT.parent / "shared" / "conformance" / "seeds"
POLICY_FILES = sorted((ROOT / "deploy").glob("4[0-9]-*.yaml")) + sorted((ROOT / "deploy" / "policykinds").glob("4[0-9]-*.yaml"))


def policy_manifests() -> list[dict[str, Any]]:
    """The CRDs (deploy/4x) and PolicyKinds (deploy/policykinds/4x), as the gateway's input gets them."""
    out: list[dict[str, Any]] = []
    for f in POLICY_FILES:
        out.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return out


def crds() -> dict[str, dict[str, Any]]:
    return {d["spec"]["names"]["kind"]: d for d in policy_manifests() if d["kind"] == "CustomResourceDefinition"}


def _schema_leaves(props: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    out = {}
    for name, sch in props.items():
        if sch.get("type") == "object" and "properties" in sch:
            out.update(_schema_leaves(sch["properties"], f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = sch
    return out


# ---------------------------------------------------------------------------------------------
# CRDs and PolicyKinds


def test_one_crd_and_one_policykind_per_kind_with_the_policy_label() -> None:
    docs = policy_manifests()
    kinds = [d["spec"]["kind"] for d in docs if d["kind"] == "PolicyKind"]
    assert sorted(kinds) == sorted(pc.KINDS)
    for kind, crd in crds().items():
        assert crd["spec"]["group"] == "gwpolicy.io"
        assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1"]
        assert crd["metadata"]["labels"]["gateway.networking.k8s.io/policy"] in ("inherited", "direct")


@pytest.mark.parametrize("kind", pc.KINDS)
def test_every_field_is_in_the_schema_and_its_description_names_the_directive(kind: str) -> None:
    spec = crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    stanzas = [s for s in ("default", "defaults", "override", "overrides") if s in spec]
    blocks = [spec[s]["properties"] for s in stanzas] or [{k: v for k, v in spec.items() if k not in ("targetRef", "targetRefs")}]
    for block in blocks:
        leaves = _schema_leaves(block)
        assert set(leaves) == set(pc.FIELDS[kind])
        for fname, info in pc.FIELDS[kind].items():
            desc = leaves[fname]["description"]
            if info.support == pc.UNSUPPORTED:
                assert "NOT SUPPORTED" in desc and "Invalid" in desc
            else:
                assert f"`{info.directive}`" in desc and info.context in desc


def test_the_schemas_are_structural_enough_for_the_api_server() -> None:
    """Every leaf has a type (or is int-or-string with anyOf), as a structural schema needs."""
    for kind, crd in crds().items():
        root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        stack = [root]
        while stack:
            sch = stack.pop()
            assert "type" in sch or sch.get("x-kubernetes-int-or-string") is True, (kind, sch)
            stack.extend((sch.get("properties") or {}).values())
            if isinstance(sch.get("items"), dict):
                stack.append(sch["items"])


def _mesh_input() -> list[dict[str, Any]]:
    """An XMesh, Service b/s with a producer route b/rp, and a Gateway b/gw: targets in namespace b."""
    return [
        {"apiVersion": "gateway.networking.x-k8s.io/v1alpha1", "kind": "XMesh", "metadata": {"name": "mesh"},
         "spec": {"controllerName": "gwpolicy.io/mesh-controller"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "b"},
         "spec": {"ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "rp", "namespace": "b"},
         "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "s"}],
                  "rules": [{"backendRefs": [{"name": "s", "port": 80}]}]}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "b"},
         "spec": {"gatewayClassName": "c", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
    ]


@pytest.mark.parametrize("kind", pc.KINDS)
def test_the_crds_keep_a_targetrefs_namespace_and_say_what_the_engine_does_with_it(kind: str) -> None:
    """A structural schema prunes what it does not declare (kube-apiserver does, and the sandbox's
    schema code as well): the mesh rule needs `namespace` in targetRef and targetRefs. Its
    description says what the engine does with a target in another namespace: by the mesh rule,
    an inherited kind applies to its own namespace's requests; a direct kind is Invalid."""
    from gwpolicy.engine.attach import ACCEPTED, INVALID
    from gwpolicy.sandbox.schema import crd_schemas

    crd = crds()[kind]
    schema = crd_schemas(crd)["v1alpha1"]
    descriptor = next(d for d in policy_manifests() if d["kind"] == "PolicyKind" and d["spec"]["kind"] == kind)
    direct = descriptor["spec"]["attachment"] == "Direct"
    target_kinds = {k["kind"] for k in descriptor["spec"]["targetKinds"]}
    mesh_target = ({"group": "", "kind": "Service", "name": "s", "namespace": "b"} if "Service" in target_kinds
                   else {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "rp", "namespace": "b"})
    gateway = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw", "namespace": "b"}
    single = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind, "metadata": {"name": "one", "namespace": "a"},
              "spec": {"targetRef": mesh_target}}
    several = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind, "metadata": {"name": "many", "namespace": "a"},
               "spec": {"targetRefs": [mesh_target]}}
    stored = []
    for policy in (single, several):
        out = schema.admit(copy.deepcopy(policy))
        assert out.errors == [] and out.unknown == [], (out.errors, out.unknown)
        assert out.obj["spec"] == policy["spec"]  # the namespace is kept, not pruned
        stored.append(out.obj)
    bad = schema.admit({**single, "spec": {"targetRef": {**mesh_target, "namespace": "Not_A_Namespace"}}})
    assert [e for e in bad.errors if "targetRef.namespace" in str(e)], bad.errors
    to_gateway = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind, "metadata": {"name": "gw", "namespace": "a"},
                  "spec": {"targetRef": gateway}}
    a = analyse(policy_manifests() + _mesh_input() + stored + [to_gateway], now="2026-01-01T00:00:00Z")
    by_name = {ref.name: outs for ref, outs in a.outcomes.items() if ref.kind == kind}
    for name in ("one", "many"):
        [o] = by_name[name]
        if direct:
            assert o.reason == INVALID and "mesh rule" in o.message, o.message
        else:
            assert o.reason == ACCEPTED and "for requests from namespace a only" in o.message, o.message
    [o] = by_name["gw"]
    assert o.reason == INVALID and "ReferenceGrant" in o.message
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for field in (spec["targetRef"], spec["targetRefs"]["items"]):
        desc = field["properties"]["namespace"]["description"]
        assert "ReferenceGrant" in desc and "mesh rule" in desc and "Invalid" in desc
        assert ("requests from its own namespace" in desc) is not direct


# ---------------------------------------------------------------------------------------------
# the primer's TimeoutPolicy with only its apiVersion changed


def _seed(name: str) -> dict[str, Any]:
    return yaml.safe_load((SEEDS / f"{name}.yaml").read_text())


def _with_gwpolicy_api(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(manifests)
    for m in out:
        if m["kind"] == "TimeoutPolicy":
            m["apiVersion"] = "gwpolicy.io/v1alpha1"
    return out


def _effective(analysis, target_kind: str, name: str) -> list[dict[str, Any]]:
    return [{ep.kind.kind: ep.result.spec} for ep in analysis.effective
            if ep.target.kind == target_kind and ep.target.name == name and ep.target.section is None]


@needs_shared
def test_primer_timeout_seed_works_with_only_the_api_version_changed() -> None:
    seed = _seed("seed-timeout-three-levels")
    a = analyse(policy_manifests() + _with_gwpolicy_api(seed["manifests"]), now="2026-01-01T00:00:00Z")
    backend = _effective(a, "Service", "example")
    assert backend == [{"TimeoutPolicy": {"connectionTimeout": 5, "readTimeout": 10}}]
    conf = policies.location_directives(backend[0])
    assert conf.lines == ("proxy_connect_timeout 5s;", "proxy_read_timeout 10s;", "proxy_next_upstream error;")
    # the seed's other expectations hold too (the kinds' descriptors do not change the engine's answer)
    for exp in seed["expect"]["effective"]:
        kind, name = exp["target"].split("/")[0], exp["target"].split("/")[-1]
        assert {"TimeoutPolicy": exp["spec"]} in _effective(a, kind, name)


# ---------------------------------------------------------------------------------------------
# translation


def test_every_kind_translates_to_its_directives() -> None:
    conf = policies.location_directives({
        ("gwpolicy.io", "TimeoutPolicy"): {"connectionTimeout": "500ms", "readTimeout": "1m30s", "sendTimeout": 2,
                                           "idleTimeout": "75s"},
        "RetryPolicy": {"attempts": 3, "retryOn": ["connect-failure", "reset"], "codes": [502, 503],
                        "nonIdempotent": True, "retryBudget": "10s"},
        "ClientSettingsPolicy": {"body": {"maxSize": "1Mi", "timeout": "5s"},
                                 "keepAlive": {"requests": 50, "time": "1h", "timeout": "30s"}},
        "RateLimitPolicy": {"requests": 5, "unit": "Minute", "burst": 2, "key": {"type": "Header", "header": "X-User-Id"}},
        ("other.io", "TimeoutPolicy"): {"connectionTimeout": 1},  # another group: not ours
    }, scope="RateLimitPolicy/ns/a")
    zone = conf.zones[0]
    assert conf.lines == (
        "proxy_connect_timeout 500ms;", "proxy_read_timeout 90s;", "proxy_send_timeout 2s;",
        "proxy_next_upstream error http_502 http_503 non_idempotent;", "proxy_next_upstream_tries 3;",
        "proxy_next_upstream_timeout 10s;",
        "client_max_body_size 1m;", "client_body_timeout 5s;", "keepalive_requests 50;", "keepalive_time 3600s;",
        "keepalive_timeout 30s;",  # the smaller of idleTimeout 75s and keepAlive.timeout 30s
        f"limit_req zone={zone.name} burst=2 nodelay;", "limit_req_status 429;")
    assert conf.peer_copies == 3
    assert conf.uri_lines == ("client_max_body_size 1m;",)
    assert policies.http_directives(conf.zones) == [f"limit_req_zone $http_x_user_id zone={zone.name}:10m rate=5r/m;"]


def test_rate_zones_are_shared_by_equal_settings_and_scope_only() -> None:
    rl = {"RateLimitPolicy": {"requests": 10, "burst": 5}}
    a, b = policies.location_directives(rl, scope="p1"), policies.location_directives(rl, scope="p1")
    c = policies.location_directives(rl, scope="p2")
    d = policies.location_directives({"RateLimitPolicy": {"requests": 11, "burst": 5}}, scope="p1")
    assert a.zones == b.zones
    assert a.zones[0].name != c.zones[0].name != d.zones[0].name
    assert len(policies.http_directives(a.zones + b.zones + c.zones + d.zones)) == 3
    assert "nodelay" not in policies.location_directives({"RateLimitPolicy": {"requests": 1, "noDelay": False}}).lines[0]


def test_upstream_keepalive_zone_and_retry_peers() -> None:
    up = policies.upstream_directives("default_svc_80", {"UpstreamSettingsPolicy": {
        "keepAlive": {"connections": 16, "requests": 100, "time": "1h", "timeout": "60s"}, "zoneSize": "512k"}},
        peer_copies=3)
    assert up.lines == ("zone default_svc_80 512k;", "keepalive 16;", "keepalive_requests 100;",
                        "keepalive_time 3600s;", "keepalive_timeout 60s;")
    assert up.keepalive and up.server_params == "max_fails=0"
    plain = policies.upstream_directives("u", {})
    assert plain == policies.UpstreamConf(("keepalive 16;",), True) and policies.retry_peer_copies({}) == 1
    assert policies.retry_peer_copies({"RetryPolicy": {"attempts": 4}}) == 4


def test_one_attempt_means_no_retry_but_a_closed_pooled_connection_is_replaced() -> None:
    assert policies.location_directives({"RetryPolicy": {"attempts": 1}}).lines == (
        "proxy_next_upstream error;", "proxy_next_upstream_tries 1;")


def test_upstreams_keep_16_idle_connections_unless_a_policy_says_otherwise() -> None:
    assert policies.upstream_directives("u", None).lines == ("keepalive 16;",)
    few = policies.upstream_directives("u", {"UpstreamSettingsPolicy": {"keepAlive": {"connections": 2, "timeout": "5s"}}})
    assert few.lines == ("keepalive 2;", "keepalive_timeout 5s;") and few.keepalive and not few.close
    # the pool's limits apply to the default pool too
    assert policies.upstream_directives("u", {"UpstreamSettingsPolicy": {"keepAlive": {"timeout": "5s"}}}).lines == (
        "keepalive 16;", "keepalive_timeout 5s;")
    none = policies.upstream_directives("u", {"UpstreamSettingsPolicy": {"keepAlive": {"connections": 0}}})
    assert none.lines == () and not none.keepalive and none.close


@pytest.mark.parametrize("effective, field", [
    ({"TimeoutPolicy": {"readTimeout": "ten"}}, "TimeoutPolicy readTimeout"),
    ({"TimeoutPolicy": {"readTimeout": True}}, "TimeoutPolicy readTimeout"),
    ({"RetryPolicy": {"attempts": 0}}, "RetryPolicy attempts"),
    ({"RetryPolicy": {"attempts": 2, "codes": [409]}}, "RetryPolicy codes"),
    ({"ClientSettingsPolicy": {"body": {"maxSize": "1 MB"}}}, "ClientSettingsPolicy body.maxSize"),
    ({"RateLimitPolicy": {"requests": 1, "key": {"type": "Header", "header": "a b"}}}, "RateLimitPolicy key.header"),
    ({"RateLimitPolicy": {"requests": 1, "unit": "Hour"}}, "RateLimitPolicy unit"),
])
def test_bad_values_raise_an_error_naming_kind_and_field(effective: dict[str, Any], field: str) -> None:
    with pytest.raises(pc.PolicyValueError, match=field):
        policies.location_directives(effective)


# ---------------------------------------------------------------------------------------------
# honest limits


def test_unsupported_fields_are_named_with_why() -> None:
    assert pc.unsupported_fields("TimeoutPolicy", {"connectionTimeout": 5, "readTimeout": 10}) == []
    got = dict(pc.unsupported_fields("TimeoutPolicy", {"requestTimeout": "10s", "connectionTimeout": "90s"}))
    assert "whole-request deadline" in got["requestTimeout"] and "75 s" in got["connectionTimeout"]
    got = dict(pc.unsupported_fields("RetryPolicy", {"attempts": 3, "backoff": "1s", "codes": [500, 409],
                                                    "retryOn": ["gateway-error"], "jitter": True}))
    assert set(got) == {"backoff", "codes", "retryOn", "jitter"}
    assert "409" in got["codes"] and "500" not in got["codes"].split(";")[1]
    assert dict(pc.unsupported_fields("ClientSettingsPolicy", {"keepAlive": {"minTimeout": "1s"}})) \
        .keys() == {"keepAlive.minTimeout"}
    assert dict(pc.unsupported_fields("RateLimitPolicy", {"requests": 1, "unit": "Day"})).keys() == {"unit"}
    assert pc.unsupported_fields("SomethingElsePolicy", {"x": 1}) == []


def test_approximations_and_enforcement() -> None:
    approx = dict(pc.approximations("TimeoutPolicy", {"readTimeout": 10, "idleTimeout": 5}))
    assert set(approx) == {"readTimeout"}
    assert pc.enforcement("TimeoutPolicy", "idleTimeout") == pc.ENFORCED
    assert pc.enforcement("TimeoutPolicy", "readTimeout") == pc.APPROXIMATED
    assert pc.enforcement("RetryPolicy", "backoff") == pc.UNSUPPORTED
    assert pc.enforcement("BackendTLSPolicy", "validation.subjectAltNames") == pc.UNSUPPORTED
    assert pc.enforcement("HeaderPolicy", "headers.x") == "not enforced by this data plane"


# ---------------------------------------------------------------------------------------------
# properties

_parts = st.lists(st.tuples(st.integers(0, 99999), st.sampled_from(["h", "m", "s", "ms"])), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(_parts)
def test_gateway_api_durations_sum_their_parts(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{u}" for n, u in parts)
    ms = pc.duration_ms(text, "f")
    assert ms == sum(n * {"h": 3600000, "m": 60000, "s": 1000, "ms": 1}[u] for n, u in parts)
    rendered = pv.nginx_time(ms)
    number, unit = int(rendered.rstrip("ms")), "ms" if rendered.endswith("ms") else "s"
    assert number * (1 if unit == "ms" else 1000) == ms  # NGINX gets exactly the same amount of time


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 99999))
def test_bare_seconds_equal_the_duration_in_seconds(n: int) -> None:
    assert pc.duration_ms(n, "f") == pc.duration_ms(f"{n}s", "f") == pc.duration_ms(str(n), "f")


def test_unsupported_fields_of_a_whole_policy_are_named_from_spec() -> None:
    spec = {"targetRef": {"group": "", "kind": "Service", "name": "s"}, "default": {"attempts": 2, "backoff": "1s"},
            "overrides": {"perTryTimeout": "1s"}}
    assert [f for f, _ in pc.unsupported_in_policy("RetryPolicy", spec)] == ["spec.default.backoff",
                                                                             "spec.overrides.perTryTimeout"]
    msg = pc.invalid_message("RetryPolicy", spec)
    assert msg.startswith("spec.default.backoff: NGINX retries immediately") and "Nothing of this policy" in msg
    direct = {"targetRef": {"group": "", "kind": "Service", "name": "s"}, "keepAlive": {"connections": 2}}
    assert pc.invalid_message("UpstreamSettingsPolicy", direct) is None
    assert pc.unsupported_in_policy("UpstreamSettingsPolicy", {**direct, "loadBalancingMethod": "ip_hash"}) == [
        ("spec.loadBalancingMethod", "UpstreamSettingsPolicy has no field 'loadBalancingMethod'; "
                                     "the nginx-1.22 data plane would ignore it")]
    btls = {"validation": {"hostname": "a.example.com", "wellKnownCACertificates": "System",
                           "subjectAltNames": [{"type": "Hostname", "hostname": "b.example.com"}]}}
    assert [f for f, _ in pc.unsupported_in_policy("BackendTLSPolicy", btls)] == ["spec.validation.subjectAltNames"]


@needs_shared
def test_a_policy_with_an_unsupported_field_is_invalid_and_changes_nothing() -> None:
    """The engine, given the gateway's kind checks, drops the whole policy; the other policy of the
    same kind still applies, and the invalid one's status names the field."""
    seed = _seed("seed-timeout-three-levels")
    objs = policy_manifests() + _with_gwpolicy_api(seed["manifests"])
    bad = next(m for m in objs if m["kind"] == "TimeoutPolicy" and m["metadata"]["name"] == "backend")
    bad["spec"]["default"]["requestTimeout"] = "30s"
    plain = analyse(objs, now="2026-01-01T00:00:00Z")
    assert _effective(plain, "Service", "example") == [{"TimeoutPolicy": {"connectionTimeout": 5, "readTimeout": 10,
                                                                          "requestTimeout": "30s"}}]
    checked = analyse(objs, now="2026-01-01T00:00:00Z", kind_checks=pc.kind_checks())
    # without the backend policy: the gateway override 5 and the route default readTimeout 5
    assert _effective(checked, "Service", "example") == [{"TimeoutPolicy": {"connectionTimeout": 5, "readTimeout": 5}}]
    outs = [o for ref, os_ in checked.outcomes.items() if ref.name == "backend" for o in os_]
    assert [o.reason for o in outs] == ["Invalid"]
    assert outs[0].message.startswith("spec.default.requestTimeout: a whole-request deadline")


# ---------------------------------------------------------------------------------------------
# the route's own fields


class _Result:
    """Stands in for the engine's Result: a spec and its sources."""

    def __init__(self, spec: dict[str, Any], overridden: tuple[str, ...] = ()) -> None:
        self.spec = spec
        self.sources = [{"field": f, "stanza": "overrides" if f in overridden else "defaults"} for f in spec]


def test_the_route_value_beats_a_default_and_an_override_beats_it() -> None:
    rule = {"timeouts": {"backendRequest": "2s"}, "retry": {"attempts": 2, "codes": [502, 409]}}
    merged = pc.with_route_fields({"TimeoutPolicy": _Result({"readTimeout": 10, "connectionTimeout": 5}),
                                   "RetryPolicy": _Result({"attempts": 5, "codes": [503]}, overridden=("attempts",))},
                                  rule)
    assert dict(merged["TimeoutPolicy"]) == {"readTimeout": "2s", "connectionTimeout": 5}  # route beats default
    assert dict(merged["RetryPolicy"]) == {"attempts": 5, "codes": [502]}  # override beats route; 409 dropped
    lines = policies.location_directives(merged).lines
    assert "proxy_read_timeout 2s;" in lines and "proxy_next_upstream_tries 5;" in lines
    assert "proxy_next_upstream error timeout http_502;" in lines
    notes = dict(pc.route_field_notes(rule, "rules[0]"))
    assert "409" in notes["rules[0].retry.codes"] and "rules[0].timeouts.backendRequest" in notes
    # the rule's fields alone, no policy: retry.attempts counts retries, RetryPolicy attempts tries
    alone = pc.with_route_fields({}, {"retry": {"attempts": 2}})
    assert policies.location_directives(alone).peer_copies == 3 and policies.retry_peer_copies(alone) == 3


def test_request_timeout_is_approximated_and_said() -> None:
    rule = {"timeouts": {"request": "500ms"}}
    merged = pc.with_route_fields({"TimeoutPolicy": {"readTimeout": 10}, "RetryPolicy": {"attempts": 2}}, rule)
    lines = policies.location_directives(merged).lines
    assert "proxy_read_timeout 500ms;" in lines and "proxy_connect_timeout 500ms;" in lines
    assert "proxy_send_timeout 500ms;" in lines and "proxy_next_upstream_timeout 500ms;" in lines
    assert "whole-request deadline" in dict(pc.route_field_notes(rule))["rules[].timeouts.request"]
    assert pc.with_route_fields({"TimeoutPolicy": {"readTimeout": 1}}, None) == {"TimeoutPolicy": {"readTimeout": 1}}


@needs_shared
def test_effective_of_an_engine_result_keeps_the_overridden_fields() -> None:
    seed = _seed("seed-timeout-three-levels")
    a = analyse(policy_manifests() + _with_gwpolicy_api(seed["manifests"]), now="2026-01-01T00:00:00Z")
    ep = next(ep for ep in a.effective if ep.target.kind == "Service")
    eff = pc.Effective.of(ep.result)
    assert eff == {"connectionTimeout": 5, "readTimeout": 10} and eff.overridden == {"connectionTimeout"}
    merged = pc.with_route_fields({"TimeoutPolicy": eff}, {"timeouts": {"backendRequest": "1s"}})
    assert merged["TimeoutPolicy"] == {"connectionTimeout": 5, "readTimeout": "1s"}


def test_route_field_mappings_are_declared_in_the_policykinds() -> None:
    mappings = {(d["spec"]["kind"], m["setting"]): m["field"] for d in policy_manifests() if d["kind"] == "PolicyKind"
                for m in d["spec"].get("fieldMappings", [])}
    assert mappings == {(k, s): "spec.rules[]." + ".".join(f) for k, s, f, _ in pc.ROUTE_FIELDS}
    assert pc.unsupported_fields("TimeoutPolicy", {"readTimeout": 1, "_requestTimeout": "1s"}) == []


@needs_shared
def test_describe_httproute_says_what_nginx_enforces(tmp_path: Path) -> None:
    from helpers import run_cli

    seed = _seed("seed-timeout-three-levels")
    objs = policy_manifests() + _with_gwpolicy_api(seed["manifests"])
    route = next(m for m in objs if m["kind"] == "TimeoutPolicy" and m["metadata"]["name"] == "route")
    route["spec"]["default"]["idleTimeout"] = "30s"
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump_all(objs))
    run = run_cli("describe", "httproute/example", "-n", "default", "-f", str(f), "--now", "2026-01-01T00:00:00Z")
    assert run.code == 0, run.err
    rows = {line.split()[0]: line for line in run.out.splitlines() if line.strip().startswith(
        ("connectionTimeout", "readTimeout", "idleTimeout", "FIELD"))}
    assert rows["FIELD"].rstrip().endswith("NGINX")
    assert rows["connectionTimeout"].rstrip().endswith("approximated")
    assert rows["idleTimeout"].rstrip().endswith("enforced")


def test_an_accepted_policy_with_approximated_fields_has_a_message_saying_how() -> None:
    msg = pc.approximation_message("TimeoutPolicy", {"targetRef": {}, "default": {"readTimeout": 5, "idleTimeout": 3}})
    assert msg.startswith("spec.default.readTimeout is approximated by the nginx-1.22 data plane: longest wait")
    assert "idleTimeout" not in msg
    assert pc.approximation_message("UpstreamSettingsPolicy", {"keepAlive": {"connections": 2}}) is None


@pytest.mark.parametrize("kind, spec, field", [
    ("TimeoutPolicy", {"readTimeout": "ten seconds"}, "readTimeout"),
    ("ClientSettingsPolicy", {"body": {"maxSize": "lots"}}, "body.maxSize"),
    ("UpstreamSettingsPolicy", {"keepAlive": {"connections": -1}}, "keepAlive.connections"),
    ("RateLimitPolicy", {"requests": 0}, "requests"),
])
def test_a_value_the_translation_refuses_makes_the_policy_invalid(kind: str, spec: dict[str, Any], field: str) -> None:
    """Never a 500 in traffic for a typo: the policy is Invalid and the message names the field."""
    got = pc.unsupported_fields(kind, spec)
    assert [f for f, _ in got] == [field]
    assert "Nothing of this policy is programmed" in pc.invalid_message(kind, {"default": spec} if kind != "UpstreamSettingsPolicy" else spec)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(pc.ROUTE_FIELDS), st.sampled_from([None, "defaults", "overrides"]), st.booleans(),
       st.integers(1, 5))
def test_route_fields_precedence_override_then_route_then_default(mapping: tuple, stanza: str | None, route_set: bool,
                                                                n: int) -> None:
    kind, setting, path, convert = mapping
    value = {"readTimeout": n, "attempts": n, "codes": [500 + n % 5]}[setting]
    route_value = {"readTimeout": f"{n + 10}s", "attempts": n + 3, "codes": [502]}[setting]
    effective = {kind: _Result({setting: value}, overridden=(setting,) if stanza == "overrides" else ())} if stanza else {}
    rule: dict[str, Any] = {}
    if route_set:
        rule[path[0]] = {path[1]: route_value}
    got = pc.with_route_fields(effective, rule).get(kind, {}).get(setting)
    if stanza == "overrides":
        assert got == value
    elif route_set:
        assert got == (convert(route_value) if convert else route_value)
    elif stanza == "defaults":
        assert got == value
    else:
        assert got is None


def test_equal_rate_limits_of_different_policies_get_their_own_buckets() -> None:
    class R:
        def __init__(self, name: str) -> None:
            self.spec = {"requests": 10, "burst": 5}
            self.sources = [{"field": f, "stanza": "defaults", "policy": {"kind": "RateLimitPolicy", "namespace": "ns",
                                                                           "name": name}} for f in self.spec]

    a = policies.location_directives({"RateLimitPolicy": pc.Effective.of(R("a"))})
    a2 = policies.location_directives({"RateLimitPolicy": pc.Effective.of(R("a"))})
    b = policies.location_directives({"RateLimitPolicy": pc.Effective.of(R("b"))})
    assert a.zones == a2.zones and a.zones != b.zones


def test_the_policykinds_are_valid_against_the_policykind_crd() -> None:
    """deploy/policykinds holds objects of our own CRD (deploy/10): checked against its schema here,
    since a generic Kubernetes validator does not know the kind."""
    crd = yaml.safe_load((ROOT / "deploy" / "10-policykind-crd.yaml").read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for d in policy_manifests():
        if d["kind"] != "PolicyKind":
            continue
        assert set(d["spec"]) <= set(spec_schema["properties"]), d["metadata"]["name"]
        assert d["spec"]["attachment"] in spec_schema["properties"]["attachment"]["enum"]
        for m in d["spec"].get("fieldMappings", []):
            assert set(m) <= set(spec_schema["properties"]["fieldMappings"]["items"]["properties"])


def test_zero_means_no_timeout_and_a_timeout_alone_does_not_retry() -> None:
    lines = policies.location_directives(pc.with_route_fields({}, {"timeouts": {"backendRequest": "0s", "request": "0s"}})).lines
    assert lines == ("proxy_read_timeout 86400s;", "proxy_next_upstream error;")
    assert policies.location_directives({"TimeoutPolicy": {"connectionTimeout": 0}}).lines == ("proxy_connect_timeout 75s;",)
    with_retry = policies.location_directives({"TimeoutPolicy": {"readTimeout": 1}, "RetryPolicy": {"attempts": 2}}).lines
    assert "proxy_next_upstream error timeout;" in with_retry and "proxy_next_upstream error;" not in with_retry


def test_an_upstream_behind_a_timeout_never_marks_its_endpoints_down() -> None:
    assert policies.upstream_directives("u", {"TimeoutPolicy": {"readTimeout": 1}}).server_params == "max_fails=0"
    assert policies.upstream_directives("u", pc.with_route_fields({}, {"timeouts": {"request": "1s"}})).server_params == "max_fails=0"
    assert policies.upstream_directives("u", {"TimeoutPolicy": {"connectionTimeout": 1}}).server_params == ""


def test_docs_policies_section_lists_every_field_as_the_code_treats_it() -> None:
    docs = (ROOT / "docs" / "gateway.md").read_text()
    section = docs[docs.index("\n## Policies"):]
    for kind, fields in pc.FIELDS.items():
        assert f"#### {kind}" in section
        for fname, info in fields.items():
            directive = f"`{info.directive}`" if info.directive else "none"
            assert (f"| `{fname}` | {directive} | {info.context or '-'} | {info.support} | {info.limit} | {info.note} |"
                    in section), fname


@needs_shared
@pytest.mark.parametrize("default, override", [("default", "override"), ("defaults", "overrides")])
def test_both_stanza_spellings_give_the_same_directives(default: str, override: str) -> None:
    seed = _seed("seed-timeout-three-levels")
    objs = _with_gwpolicy_api(seed["manifests"])
    for m in objs:
        if m["kind"] == "TimeoutPolicy":
            spec = m["spec"]
            for old, new in (("default", default), ("override", override)):
                if old in spec:
                    spec[new] = spec.pop(old)
    a = analyse(policy_manifests() + objs, now="2026-01-01T00:00:00Z", kind_checks=pc.kind_checks())
    backend = _effective(a, "Service", "example")
    assert policies.location_directives(backend[0]).lines[:2] == ("proxy_connect_timeout 5s;", "proxy_read_timeout 10s;")
