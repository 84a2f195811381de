"""A new `gwpolicy sandbox` takes a Gateway, a route and a policy at once: it starts with the Gateway
API CRDs the project ships (deploy/gateway-api, unchanged) and gwpolicy's own CRDs and PolicyKinds;
`--crds none` starts it empty, `--crds experimental` with the other channel, and a CRD given with -f
replaces ours. The bundle is parsed once and read back from a cache afterwards."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gwpolicy.sandbox import bundled
from helpers import GATEWAY_API, ROOT
from sandbox_proc import SandboxProcess

FIRST_RUN = """
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: gwpolicy}
spec: {controllerName: gwpolicy.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: demo, namespace: default}
spec:
  gatewayClassName: gwpolicy
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop, namespace: default}
spec:
  parentRefs: [{name: demo}]
  rules: [{backendRefs: [{name: shop, port: 8080}]}]
---
apiVersion: gwpolicy.io/v1alpha1
kind: TimeoutPolicy
metadata: {name: gateway-timeouts, namespace: default}
spec:
  targetRef: {group: gateway.networking.k8s.io, kind: Gateway, name: demo}
  override: {connectionTimeout: 5s}
"""


def _crds(sb: SandboxProcess) -> set[str]:
    return set(sb.kubectl("get", "crd", "-o", "name").stdout.split())


def test_a_new_sandbox_takes_a_gateway_a_route_and_a_policy_at_once(tmp_path: Path) -> None:
    with SandboxProcess(tmp_path) as sb:
        out = sb.kubectl("apply", "-f", "-", input=FIRST_RUN)
        assert "gateway.gateway.networking.k8s.io/demo created" in out.stdout
        assert "timeoutpolicy.gwpolicy.io/gateway-timeouts created" in out.stdout
        crds = _crds(sb)
        standard = {f"customresourcedefinition.apiextensions.k8s.io/{d['metadata']['name']}"
                    for f in (ROOT / "deploy" / "gateway-api" / "standard").glob("*.yaml")
                    for d in yaml.safe_load_all(f.read_text()) if d and d["kind"] == "CustomResourceDefinition"}
        assert standard <= crds and "customresourcedefinition.apiextensions.k8s.io/xmeshes.gateway.networking.x-k8s.io" not in crds
        for ours in ("policykinds.gwpolicy.io", "timeoutpolicies.gwpolicy.io", "ratelimitpolicies.gwpolicy.io",
                     "effectivepolicies.gwpolicy.io"):
            assert f"customresourcedefinition.apiextensions.k8s.io/{ours}" in crds
        kinds = sb.kubectl("get", "policykinds", "-o", "name").stdout.split()
        assert "policykind.gwpolicy.io/timeoutpolicies.gwpolicy.io" in kinds and len(kinds) == 5
        # the CRDs' own defaults and validation apply (the schema is the release's)
        route = sb.kubectl("get", "httproute", "shop", "-o", "jsonpath={.spec.parentRefs[0].kind}").stdout
        assert route == "Gateway"
        bad = sb.kubectl("apply", "-f", "-", check=False,
                         input=FIRST_RUN.split("---")[1].replace("port: 80", "port: 0"))
        assert bad.returncode != 0 and "spec.listeners[0].port" in bad.stderr


def test_crds_none_starts_with_built_in_kinds_only(tmp_path: Path) -> None:
    with SandboxProcess(tmp_path, "--crds", "none") as sb:
        assert _crds(sb) == set()
        out = sb.kubectl("apply", "-f", "-", input=FIRST_RUN, check=False)
        assert out.returncode != 0 and "GatewayClass" in out.stderr


def test_crds_experimental_and_a_crd_given_with_f_replaces_ours(tmp_path: Path) -> None:
    exp = ROOT / "deploy" / "gateway-api" / "experimental"
    (tmp_path / "a").mkdir()
    with SandboxProcess(tmp_path / "a", "--crds", "experimental") as sb:
        assert "customresourcedefinition.apiextensions.k8s.io/xbackendtrafficpolicies.gateway.networking.x-k8s.io" in _crds(sb)
        channel = sb.kubectl("get", "crd", "httproutes.gateway.networking.k8s.io", "-o",
                             r"jsonpath={.metadata.annotations.gateway\.networking\.k8s\.io/channel}").stdout
        assert channel == "experimental"
    (tmp_path / "b").mkdir()
    with SandboxProcess(tmp_path / "b", "-f", str(exp / "gateway.networking.k8s.io_httproutes.yaml"),
                        "-f", str(ROOT / "examples" / "parable")) as sb:
        channel = sb.kubectl("get", "crd", "httproutes.gateway.networking.k8s.io", "-o",
                             r"jsonpath={.metadata.annotations.gateway\.networking\.k8s\.io/channel}").stdout
        assert channel == "experimental"  # the file's, not ours
        assert "customresourcedefinition.apiextensions.k8s.io/gateways.gateway.networking.k8s.io" in _crds(sb)
        assert "cake" in sb.kubectl("get", "httproutes", "-n", "baker", "-o", "name").stdout
        # the parable's own RetryPolicy and TimeoutPolicy kinds (policy.acme.io) replace ours of the same
        # kind, so that kubectl's short names find its objects; our other kinds stay
        assert "retrypolicy.policy.acme.io/baker-retries" in sb.kubectl("get", "retrypolicies", "-A", "-o", "name").stdout
        crds = _crds(sb)
        assert not {f"customresourcedefinition.apiextensions.k8s.io/{k}.gwpolicy.io"
                    for k in ("retrypolicies", "timeoutpolicies")} & crds
        assert "customresourcedefinition.apiextensions.k8s.io/ratelimitpolicies.gwpolicy.io" in crds
        kinds = sb.kubectl("get", "policykinds", "-o", "name").stdout.split()
        assert "policykind.gwpolicy.io/ratelimitpolicies.gwpolicy.io" in kinds
        assert "policykind.gwpolicy.io/timeoutpolicies.gwpolicy.io" not in kinds


def test_the_bundle_is_the_tested_release_unchanged() -> None:
    """deploy/gateway-api holds the CRD files of the release the tests use (../shared), byte for byte."""
    if not (GATEWAY_API / "crd").is_dir():
        pytest.skip(f"{GATEWAY_API} is not beside this checkout")
    for channel in ("standard", "experimental"):
        ours = ROOT / "deploy" / "gateway-api" / channel
        theirs = GATEWAY_API / "crd" / channel
        assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
        for p in theirs.iterdir():
            assert (ours / p.name).read_bytes() == p.read_bytes(), p.name
    notes = (ROOT / "deploy" / "gateway-api" / "README.md").read_text()
    assert "4564255" in notes and "Apache License 2.0" in notes
    assert "Apache License" in (ROOT / "deploy" / "gateway-api" / "LICENSE").read_text()


def test_the_bundle_is_parsed_once_then_read_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deploy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", deploy)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    parses = []
    real = yaml.load_all
    monkeypatch.setattr(yaml, "load_all", lambda *a, **k: (parses.append(1), real(*a, **k))[1])
    first = bundled.objects("standard", deploy)
    n = len(parses)
    assert n > 10 and [o["kind"] for o in first].count("PolicyKind") == 5
    assert bundled.objects("standard", deploy) == first and len(parses) == n  # read back, not parsed
    # an edited file is parsed again, and the old cache entry goes
    f = deploy / "41-timeoutpolicy.yaml"
    f.write_text(f.read_text().replace("name: timeoutpolicies.gwpolicy.io", "name: timeoutpolicies.gwpolicy.io\n  "
                                       "annotations: {edited: 'yes'}", 1))
    again = bundled.objects("standard", deploy)
    assert len(parses) > n
    crd = next(o for o in again if o["metadata"]["name"] == "timeoutpolicies.gwpolicy.io")
    assert crd["metadata"]["annotations"] == {"edited": "yes"}
    assert len(list((tmp_path / "cache" / "gwpolicy").glob("sandbox-standard-*.json"))) == 1
    # a cache that cannot be read is passed over
    for p in (tmp_path / "cache" / "gwpolicy").glob("sandbox-standard-*.json"):
        p.write_text("{not json")
    assert bundled.objects("standard", deploy) == again


def test_a_sandbox_without_the_bundle_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bundled, "DEPLOY", tmp_path / "nowhere")
    from gwpolicy.cli.main import sandbox_main

    assert sandbox_main(["--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and str(tmp_path / "nowhere") in err and "--crds none" in err


def test_nothing_a_user_runs_reads_the_shared_directory() -> None:
    """../shared is the project's test data; what a user's clone runs (the examples, ./dev, the
    package, the install files) never names it."""
    out = subprocess.run(["git", "grep", "-n", "-E", r"\.\./shared|/shared/", "--", "dev", "examples", "src", "deploy"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.stdout == "", out.stdout
