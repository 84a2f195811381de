"""NGINX Gateway Fabric's ClientSettingsPolicy and UpstreamSettingsPolicy (gateway.nginx.org) as the
gateway renders them: NGF's documented examples (tests/data/ngf/) unchanged become the directives
our kinds of the same names write; what NGINX 1.22 cannot honour makes the policy Invalid; and
where an NGF policy and a gwpolicy.io policy set one field on one path, the documented precedence
decides (docs/coming-from-ngf.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_kit import TEST_ENDPOINTS
from gwpolicy.engine.analysis import analyse
from gwpolicy.gateway import ngfpolicies, policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.policystatus import enforced_policy_kinds
from gwpolicy.gateway.render import render
from test_gateway_policies import policy_manifests
from test_gateway_render import nginx_t

ROOT = Path(__file__).resolve().parents[2]
NGF = ROOT / "tests" / "data" / "ngf"
NGF_CRDS = ROOT / "deploy" / "crds" / "gateway.nginx.org"
CONTROLLER = "gwpolicy.io/gateway-controller"


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def ngf_crds() -> list[dict[str, Any]]:
    return [d for n in ("clientsettingspolicies", "upstreamsettingspolicies") for d in _load(NGF_CRDS / f"{n}.yaml")]


def _in_default(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As `kubectl apply` puts them: namespaced objects without a namespace go to `default`."""
    for o in objs:
        if o["kind"] not in ("GatewayClass", "CustomResourceDefinition", "Namespace", "PolicyKind"):
            o["metadata"].setdefault("namespace", "default")
    return objs


def slices(*services: tuple[str, list[str]]) -> list[dict[str, Any]]:
    return [{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": f"{svc}-1", "namespace": "default", "labels": {"kubernetes.io/service-name": svc}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
             "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addrs]}
            for svc, addrs in services]


def cafe(page: str, *examples: str, extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The objects of an NGF page's walkthrough: its app, Gateway and routes, then `examples`."""
    base = (["client-settings-00a-app", "client-settings-00b-gateway", "client-settings-00c-httproutes"]
            if page == "client-settings" else
            ["upstream-settings-01-coffee", "upstream-settings-02-gateway", "upstream-settings-03-coffee"])
    objs: list[dict[str, Any]] = [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                                   "metadata": {"name": "nginx"}, "spec": {"controllerName": CONTROLLER}}]
    for name in base + list(examples):
        objs += _load(NGF / f"{name}.yaml")
    objs += slices(("coffee", ["127.0.40.2", "127.0.40.3"]), ("tea", ["127.0.40.4", "127.0.40.5"]))
    return policy_manifests() + ngf_crds() + _in_default(objs + (extra or []))


def analysed(objs: list[dict[str, Any]]) -> Any:
    return analyse(objs, kind_checks=policyconf.kind_checks(), now="2026-01-01T00:00:00Z")


def files(objs: list[dict[str, Any]]) -> dict[str, str]:
    a = analysed(objs)
    out = render(build_dataplane(a, DataPlaneConfig(controller_name=CONTROLLER, **TEST_ENDPOINTS)))
    return {k: v.decode() for k, v in out.items() if k.endswith(".conf")}


def location(conf: str, path: str) -> str:
    """The body of the internal location a route match of `path` is served by."""
    m = re.search(r"location (?:= )?/_v\d+" + re.escape(path) + r"/ \{(.*?)\n    \}", conf, re.S)
    assert m, f"no location for {path} in\n{conf}"
    return m.group(1)


def upstream(conf: str, service: str) -> str:
    blocks = re.findall(r"upstream (\S*_default_" + service + r"_\S*) \{(.*?)\n\}", conf, re.S)
    assert blocks, f"no upstream for {service} in\n{conf}"
    return "\n".join(b for _, b in blocks)


def outcome(a: Any, name: str) -> list[tuple[str, str]]:
    return [(o.reason, o.message) for ref, os_ in a.outcomes.items() if ref.name == name for o in os_]


def test_client_settings_examples_set_the_body_limit_per_gateway_and_route() -> None:
    conf = files(cafe("client-settings", "client-settings-01-gateway-client-settings",
                      "client-settings-02-tea-client-settings"))["servers.conf"]
    assert "client_max_body_size 50;" in location(conf, "/coffee")  # the Gateway's
    assert "client_max_body_size 75;" in location(conf, "/tea")  # the route's beats the Gateway's


def test_the_grpc_route_example_names_a_route_that_does_not_exist() -> None:
    a = analysed(cafe("client-settings", "client-settings-03-grpc-client-settings"))
    [(reason, _)] = outcome(a, "grpc-client-settings")
    assert reason == "TargetNotFound"


def test_the_grpc_route_example_reaches_the_grpc_locations_once_the_route_exists() -> None:
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute", "metadata": {"name": "my-grpc-route"},
             "spec": {"parentRefs": [{"name": "gateway"}], "hostnames": ["grpc.example.com"],
                      "rules": [{"backendRefs": [{"name": "tea", "port": 80}]}]}}
    objs = cafe("client-settings", "client-settings-03-grpc-client-settings", extra=[route])
    [(reason, _)] = outcome(analysed(objs), "grpc-client-settings")
    assert reason == "Accepted"
    grpc = [b for b in files(objs)["servers.conf"].split("location ") if "grpc_pass" in b]
    assert grpc and all("client_max_body_size 75;" in b for b in grpc)


def test_upstream_settings_examples_become_upstream_directives() -> None:
    conf = files(cafe("upstream-settings", "upstream-settings-05-lb-method-hash", "upstream-settings-06-1m-zone-size",
                      "upstream-settings-07-upstream-keepalives"))["upstreams.conf"]
    tea, coffee = upstream(conf, "tea"), upstream(conf, "coffee")
    assert "hash $upstream_addr consistent;" in tea and "zone " in tea and " 1m;" in tea
    assert "keepalive 32;" in coffee and " 1m;" in coffee
    # the balancing method comes before keepalive, as NGINX requires
    assert tea.index("hash ") < tea.index("keepalive ")


def test_nginx_accepts_what_the_examples_render(tmp_path: Path) -> None:
    objs = cafe("upstream-settings", "upstream-settings-05-lb-method-hash", "upstream-settings-06-1m-zone-size",
                "upstream-settings-07-upstream-keepalives")
    a = analysed(objs)
    out = render(build_dataplane(a, DataPlaneConfig(controller_name=CONTROLLER, **TEST_ENDPOINTS)))
    r = nginx_t(tmp_path, out)
    assert r.returncode == 0, r.stderr


def test_a_plus_only_balancing_method_is_invalid_and_programs_nothing() -> None:
    objs = cafe("upstream-settings", "upstream-settings-04-lb-method")
    a = analysed(objs)
    [(reason, message)] = outcome(a, "lb-method")
    assert reason == "Invalid"
    assert "spec.loadBalancingMethod" in message and "NGINX Plus" in message
    assert "least_time" not in files(objs)["upstreams.conf"]


NGF_POLICY = {"apiVersion": "gateway.nginx.org/v1alpha1", "metadata": {"name": "p"}}


@pytest.mark.parametrize(("kind", "spec", "field", "words"), [
    ("ClientSettingsPolicy", {"keepAlive": {"minTimeout": "1s"}}, "spec.keepAlive.minTimeout", "keepalive_min_timeout"),
    ("UpstreamSettingsPolicy", {"useClusterIP": True}, "spec.useClusterIP", "endpoints"),
    ("UpstreamSettingsPolicy", {"loadBalancingMethod": "hash", "hashMethodKey": "$gw_routed"}, "spec.hashMethodKey",
     "not a variable this data plane allows"),
    ("UpstreamSettingsPolicy", {"zoneSize": "1g"}, "spec.zoneSize", "out of range"),
    ("ClientSettingsPolicy", {"body": {"bufferSize": "2m"}}, "spec.body.bufferSize", "out of range"),
    ("UpstreamSettingsPolicy", {"keepAlive": {"connections": 5000}}, "spec.keepAlive.connections", "out of range"),
    ("ClientSettingsPolicy", {"keepAlive": {"timeout": {"header": "5s"}}}, "spec.keepAlive.timeout.header",
     "keepAlive.timeout.server"),
    ("ClientSettingsPolicy", {"body": {"maxSize": "1m", "size": "2m"}}, "spec.body.size", "has no field"),
])
def test_what_nginx_cannot_honour_is_named_in_ngf_terms(kind: str, spec: dict[str, Any], field: str, words: str) -> None:
    message = ngfpolicies.invalid_message(kind, spec)
    assert message is not None and message.startswith(field) and words in message, message


def test_every_ngf_field_translates_to_the_directive_our_kind_writes() -> None:
    client, bad = ngfpolicies.translate("ClientSettingsPolicy", {
        "body": {"maxSize": "10m", "bufferSize": "16k", "timeout": "30s"},
        "keepAlive": {"requests": 50, "time": "1h", "timeout": {"server": "20s", "header": "15s"}}})
    assert bad == []
    from gwpolicy.gateway import policies

    lines = policies.location_directives({"ClientSettingsPolicy": client}).lines
    assert set(lines) == {"client_max_body_size 10m;", "client_body_buffer_size 16k;", "client_body_timeout 30s;",
                          "keepalive_requests 50;", "keepalive_time 3600s;", "keepalive_timeout 20s 15s;"}
    up, bad = ngfpolicies.translate("UpstreamSettingsPolicy", {
        "zoneSize": "512k", "loadBalancingMethod": "random two least_conn",
        "keepAlive": {"connections": 8, "requests": 100, "time": "1m", "timeout": "5s"}})
    assert bad == []
    conf = policies.upstream_directives("u", {"UpstreamSettingsPolicy": up})
    assert conf.lines == ("random two least_conn;", "zone u 512k;", "keepalive 8;", "keepalive_requests 100;",
                          "keepalive_time 60s;", "keepalive_timeout 5s;")


def test_the_gateway_says_it_enforces_the_ngf_kinds() -> None:
    kinds = enforced_policy_kinds()
    assert "ClientSettingsPolicy.gateway.nginx.org" in kinds and "UpstreamSettingsPolicy.gateway.nginx.org" in kinds


# ---------------------------------------------------------------------------------------------
# precedence between the two groups on one path

LEVELS = ("Gateway", "HTTPRoute")


def _client(group: str, name: str, level: str, size: str, stanza: str | None) -> dict[str, Any]:
    target = {"group": "gateway.networking.k8s.io", "kind": level, "name": "gateway" if level == "Gateway" else "tea"}
    settings_ = {"body": {"maxSize": size}}
    spec: dict[str, Any] = {"targetRef": target}
    if group == "gwpolicy.io":
        spec[stanza or "default"] = settings_
    else:
        spec.update(settings_)
    return {"apiVersion": f"{group}/v1alpha1", "kind": "ClientSettingsPolicy",
            "metadata": {"name": name, "creationTimestamp": "2025-01-01T00:00:00Z"}, "spec": spec}


def expected_winner(ours_level: str, stanza: str, ngf_level: str) -> str:
    """docs/coming-from-ngf.md: an override of ours wins; else the more specific level; on one level, ours."""
    if stanza == "override":
        return "ours"
    return "ngf" if LEVELS.index(ngf_level) > LEVELS.index(ours_level) else "ours"


@settings(max_examples=12, deadline=None)
@given(ours_level=st.sampled_from(LEVELS), stanza=st.sampled_from(["default", "override"]),
       ngf_level=st.sampled_from(LEVELS))
def test_one_field_set_by_both_groups_follows_the_documented_precedence(ours_level: str, stanza: str,
                                                                         ngf_level: str) -> None:
    extra = [_client("gwpolicy.io", "ours", ours_level, "111", stanza),
             _client("gateway.nginx.org", "theirs", ngf_level, "222", None)]
    conf = files(cafe("client-settings", extra=extra))["servers.conf"]
    tea = location(conf, "/tea")
    want = "111" if expected_winner(ours_level, stanza, ngf_level) == "ours" else "222"
    assert f"client_max_body_size {want};" in tea, tea


def test_fields_only_one_group_sets_both_apply() -> None:
    ours = _client("gwpolicy.io", "ours", "Gateway", "111", "default")
    ours["spec"]["default"] = {"body": {"timeout": "7s"}}
    conf = files(cafe("client-settings", "client-settings-02-tea-client-settings", extra=[ours]))["servers.conf"]
    tea = location(conf, "/tea")
    assert "client_max_body_size 75;" in tea and "client_body_timeout 7s;" in tea


# ---------------------------------------------------------------------------------------------
# raw NGINX configuration is refused

SNIPPETS_POLICY = {"apiVersion": "gateway.nginx.org/v1alpha1", "kind": "SnippetsPolicy",
                   "metadata": {"name": "raw", "namespace": "default"},
                   "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gateway"},
                            "snippets": [{"context": "http", "value": "client_max_body_size 1;"}]}}


def test_a_snippets_policy_is_invalid_and_writes_nothing() -> None:
    objs = cafe("client-settings", extra=[SNIPPETS_POLICY])
    a = analysed(objs)
    [(reason, message)] = outcome(a, "raw")
    assert reason == "Invalid" and "raw NGINX configuration" in message
    assert "client_max_body_size 1;" not in "".join(files(objs).values())


def test_a_route_with_a_snippets_filter_is_not_served_and_says_why() -> None:
    from gwpolicy.engine.model import build_index
    from gwpolicy.gateway.facts import gateway_facts

    objs = cafe("client-settings")
    tea = next(o for o in objs if o["kind"] == "HTTPRoute" and o["metadata"]["name"] == "tea")
    tea["spec"]["rules"][0]["filters"] = [{"type": "ExtensionRef", "extensionRef": {
        "group": "gateway.nginx.org", "kind": "SnippetsFilter", "name": "raw"}}]
    facts = gateway_facts(build_index(objs))
    route = next(r for ref, r in facts.routes.items() if ref.name == "tea")
    assert route.unsupported is not None and "SnippetsFilter raw is refused" in route.unsupported
    tea_location = location(files(objs)["servers.conf"], "/tea")
    assert "return 500;" in tea_location and "proxy_pass" not in tea_location


def test_the_gateway_and_the_controller_may_read_the_ngf_kinds_and_write_their_status() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "72-ngf-policies-rbac.yaml").read_text()) if d]
    [role] = docs
    labels = role["metadata"]["labels"]
    assert labels["gwpolicy.io/aggregate-to-gateway"] == "true" and labels["gwpolicy.io/aggregate-to-controller"] == "true"
    granted = {(res, verb) for r in role["rules"] if "gateway.nginx.org" in r["apiGroups"]
               for res in r["resources"] for verb in r["verbs"]}
    for plural in ("clientsettingspolicies", "upstreamsettingspolicies"):
        assert {(plural, v) for v in ("get", "list", "watch")} <= granted
        assert (f"{plural}/status", "patch") in granted


def test_describe_shows_both_sources_and_what_nginx_gets(tmp_path: Path) -> None:
    from helpers import run_cli

    ours = _client("gwpolicy.io", "ours", "Gateway", "1k", "default")
    ours["spec"]["default"]["body"]["timeout"] = "7s"
    objs = cafe("client-settings", "client-settings-01-gateway-client-settings",
                "client-settings-02-tea-client-settings", extra=[ours])
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump_all(objs))
    run = run_cli("describe", "httproute/tea", "-n", "default", "-f", str(f), "--now", "2026-01-01T00:00:00Z")
    assert run.code == 0, run.err
    assert "ClientSettingsPolicy.gateway.nginx.org (FieldMerge)" in run.out
    rows = {line.split()[0]: line.split() for line in run.out.splitlines()
            if line.strip().startswith(("body.maxSize", "body.timeout")) and "PROGRAMMED" not in line}
    both = [line.split() for line in run.out.split("together")[1].splitlines() if line.strip().startswith("body.")]
    assert ["body.maxSize", "ClientSettingsPolicy/default/ours", "ClientSettingsPolicy/default/tea-client-settings",
            "gateway.nginx.org"] in both
    assert ["body.timeout", "ClientSettingsPolicy/default/ours", "-", "gwpolicy.io"] in both
    assert rows
