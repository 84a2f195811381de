"""NGINX Gateway Fabric's own manifests apply unchanged to our CRDs for its four kinds
(deploy/crds/gateway.nginx.org/: ClientSettingsPolicy, UpstreamSettingsPolicy, ObservabilityPolicy,
NginxProxy), through real kubectl against the sandbox (`kubectl apply --server-side`, whose field
validation is strict): every example of NGF's documentation (tests/data/ngf/, one file per example,
its `# expect:` line says what NGF's own CRDs do with it), stored as written; the few the pages get
wrong are refused with the field or version named, as NGF's CRDs refuse them; and NGF's validation
rules hold (the messages are NGF's).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox_proc import GW_CRDS, SandboxProcess
from test_sandbox_builtin import _contains, _without_server_fields

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "deploy" / "crds" / "gateway.nginx.org"
DATA = ROOT / "tests" / "data" / "ngf"
GROUP = "gateway.nginx.org"


def examples() -> list[Path]:
    return sorted(DATA.glob("*.yaml"))


def expectation(path: Path) -> str:
    m = re.search(r"^# expect: (.*)$", path.read_text(), re.M)
    assert m, f"{path.name} has no '# expect:' line"
    return m.group(1)


def page_of(path: Path) -> str:
    return re.sub(r"-\d\d[a-z]?-.*$", "", path.stem)


@pytest.fixture(scope="module")
def sb(tmp_path_factory):
    with SandboxProcess(tmp_path_factory.mktemp("ngf")) as s:
        gw = [str(GW_CRDS / f"gateway.networking.k8s.io_{n}.yaml") for n in ("gatewayclasses", "gateways", "httproutes",
                                                                                "grpcroutes")]
        s.kubectl("apply", "--server-side", *sum((["-f", c] for c in gw), []), "-f", str(CRDS))
        for page in sorted({page_of(p) for p in examples()}):
            s.kubectl("create", "namespace", page)
        yield s


def test_the_examples_cover_the_four_kinds():
    kinds: dict[str, int] = {}
    for path in examples():
        for d in yaml.safe_load_all(path.read_text()):
            if d and d["apiVersion"].startswith(GROUP + "/"):
                kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    assert set(kinds) == {"ClientSettingsPolicy", "UpstreamSettingsPolicy", "ObservabilityPolicy", "NginxProxy"}, kinds
    assert sum(kinds.values()) >= 30


@pytest.mark.parametrize("path", examples(), ids=lambda p: p.stem)
def test_every_documented_example_applies_unchanged_or_is_refused_as_by_ngf(sb, path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    # each page runs in a namespace of its own (the pages reuse names); an object that names its
    # namespace keeps it, as `kubectl apply` without -n would
    ns_args = [] if any((d.get("metadata") or {}).get("namespace") for d in docs) else ["-n", page_of(path)]
    out = sb.kubectl("apply", "--server-side", *ns_args, "-f", str(path), check=False)
    expect = expectation(path)
    if expect == "applies unchanged":
        assert out.returncode == 0, out.stderr
        assert "Warning" not in out.stderr, out.stderr
        for d in docs:
            ns = d["metadata"].get("namespace") or page_of(path)
            group, _, version = d["apiVersion"].rpartition("/")
            # read back in the version it was written in (kind.version.group; core kinds by kind)
            what = f"{d['kind'].lower()}.{version}.{group}" if group else d["kind"].lower()
            stored = json.loads(sb.kubectl("get", what, d["metadata"]["name"], "-n", ns, "-o", "json").stdout)
            sent = _without_server_fields(d)
            sent.pop("status", None)  # status is the controllers' (a status subresource ignores it on apply)
            why = _contains(stored, sent)
            assert why is None, f"{path.name}: {d['kind']} {d['metadata']['name']}: {why} not stored as sent"
    else:
        assert out.returncode != 0, f"{path.name} applied, expected: {expect}"
        assert "Traceback" not in out.stderr
        if "spec.disableHTTP" in expect:
            # server-side apply: the typed patch names the undeclared field (kube-apiserver's wording)
            assert ".spec.disableHTTP: field not declared in schema" in out.stderr, out.stderr
        elif "v1alpha1 is not served" in expect:
            assert 'no matches for kind "NginxProxy" in version "gateway.nginx.org/v1alpha1"' in out.stderr, out.stderr
        elif "metadata.name" in expect:
            assert 'metadata.name: Invalid value: "upstream-unset-keepAlive"' in out.stderr, out.stderr
        else:
            pytest.fail(f"{path.name}: no check for {expect!r}")


def _apply(sb: SandboxProcess, obj: dict[str, Any], ns: str = "default"):
    return sb.kubectl("apply", "--server-side", "-n", ns, "-f", "-", input=json.dumps(obj), check=False)


def _obs(version: str, name: str, targets: list[dict[str, str]], tracing: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{version}", "kind": "ObservabilityPolicy", "metadata": {"name": name},
            "spec": {"targetRefs": targets, "tracing": tracing}}


ROUTE = {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "coffee"}


def test_observability_policy_is_served_in_both_versions_with_ngfs_rules(sb):
    ok = _apply(sb, _obs("v1alpha2", "both", [ROUTE, ROUTE | {"kind": "GRPCRoute"}], {"strategy": "ratio", "ratio": 25,
                                                                                    "context": "propagate"}))
    assert ok.returncode == 0, ok.stderr
    # the same object read through the deprecated version: the fields are the same
    old = json.loads(sb.kubectl("get", "observabilitypolicies.v1alpha1.gateway.nginx.org", "both", "-o", "json").stdout)
    assert old["apiVersion"] == f"{GROUP}/v1alpha1" and old["spec"]["tracing"]["ratio"] == 25
    twice = [ROUTE, dict(ROUTE)]
    dup = _apply(sb, _obs("v1alpha2", "dup", twice, {"strategy": "parent"}))
    assert dup.returncode != 0 and "TargetRef Kind and Name combination must be unique" in dup.stderr
    assert _apply(sb, _obs("v1alpha1", "dup", twice, {"strategy": "parent"})).returncode == 0  # v1alpha1 had no such rule
    for tracing, message in (({"strategy": "parent", "ratio": 10}, "ratio can only be specified if strategy is of type ratio"),
                             ({"strategy": "ratio", "ratio": 101}, "spec.tracing.ratio"),
                             ({"strategy": "always"}, "spec.tracing.strategy"),
                             ({"strategy": "ratio", "context": "bogus"}, "spec.tracing.context"),
                             ({"strategy": "ratio", "spanName": "a-$uri"}, "spec.tracing.spanName")):
        out = _apply(sb, _obs("v1alpha2", "bad", [ROUTE], tracing))
        assert out.returncode != 0 and message in out.stderr, (tracing, out.stderr)
    wrong_group = _apply(sb, _obs("v1alpha2", "bad", [ROUTE | {"group": "example.com"}], {"strategy": "ratio"}))
    assert "TargetRef Group must be gateway.networking.k8s.io" in wrong_group.stderr
    none = _apply(sb, _obs("v1alpha2", "bad", [], {"strategy": "ratio"}))
    assert none.returncode != 0 and "spec.targetRefs" in none.stderr


def test_client_and_upstream_settings_policies_keep_ngfs_rules(sb):
    csp = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ClientSettingsPolicy", "metadata": {"name": "csp"},
           "spec": {"targetRef": {"group": "", "kind": "Service", "name": "coffee"}, "body": {"maxSize": "1m"}}}
    out = _apply(sb, csp)
    assert "TargetRef Kind must be one of: Gateway, HTTPRoute, or GRPCRoute" in out.stderr
    assert "TargetRef Group must be gateway.networking.k8s.io." in out.stderr
    header_only = csp | {"spec": {"targetRef": ROUTE, "keepAlive": {"timeout": {"header": "10s"}}}}
    assert "header can only be specified if server is specified" in _apply(sb, header_only).stderr
    big = csp | {"spec": {"targetRef": ROUTE, "body": {"maxSize": "10000m"}}}  # five digits: NGF's pattern allows four
    assert "spec.body.maxSize" in _apply(sb, big).stderr
    usp = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "UpstreamSettingsPolicy", "metadata": {"name": "usp"},
           "spec": {"targetRefs": [{"group": "core", "kind": "Service", "name": "coffee"}], "loadBalancingMethod": "hash"}}
    assert "hashMethodKey is required when loadBalancingMethod is 'hash' or 'hash consistent'" in _apply(sb, usp).stderr
    routes = usp | {"spec": {"targetRefs": [ROUTE]}}
    out = _apply(sb, routes)
    assert "TargetRefs Kind must be: Service" in out.stderr and "TargetRefs Group must be core" in out.stderr
    dup = usp | {"spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "a"}] * 2}}
    assert "TargetRef Name must be unique" in _apply(sb, dup).stderr
    assert "spec.loadBalancingMethod" in _apply(sb, usp | {"spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "a"}],
                                                                   "loadBalancingMethod": "fastest"}}).stderr


def test_nginx_proxy_keeps_ngfs_rules_and_defaults(sb):
    def np(spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/v1alpha2", "kind": "NginxProxy", "metadata": {"name": "np"}, "spec": spec}

    assert "if mode is set, trustedAddresses is a required field" in _apply(sb, np({"rewriteClientIP": {"mode": "XForwardedFor"}})).stderr
    assert "only one of deployment or daemonSet can be set" in _apply(sb, np({"kubernetes": {"deployment": {}, "daemonSet": {}}})).stderr
    assert "JSON-formatted error logs are not supported when errorLevel is debug" in \
        _apply(sb, np({"logging": {"errorLevel": "debug", "errorLogFormat": "json"}})).stderr
    assert "spec.telemetry.exporter.endpoint" in _apply(sb, np({"telemetry": {"exporter": {"endpoint": "grpc://Collector:4317"}}})).stderr
    assert "spec.telemetry.serviceName" in _apply(sb, np({"telemetry": {"serviceName": "my app"}})).stderr
    out = _apply(sb, np({"logging": {"accessLog": {"disable": True}}, "kubernetes": {"service": {}}}))
    assert out.returncode == 0, out.stderr
    stored = json.loads(sb.kubectl("get", "nginxproxies.gateway.nginx.org", "np", "-o", "json").stdout)["spec"]
    # NGF's schema defaults, applied by the API server as for NGF's CRD
    assert stored["logging"]["errorLevel"] == "info" and stored["logging"]["agentLevel"] == "info"
    assert stored["kubernetes"]["service"] == {"type": "LoadBalancer", "externalTrafficPolicy": "Local"}
