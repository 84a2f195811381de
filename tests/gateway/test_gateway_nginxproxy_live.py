"""NginxProxy through the whole gateway, on both API servers: `gwpolicy gateway` watches NginxProxies,
says in status when a GatewayClass's or a Gateway's parametersRef does not resolve (reason
InvalidParameters), takes the Gateway's NginxProxy over its class's field by field, and holds an
ObservabilityPolicy at NginxProxyNotSet until an exporter is configured for the route's Gateway.

Addresses: Gateways from 127.0.98.128/25.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

import live_server
from gateway_kit import backend, listener, meta
from gateway_proc import GatewayProcess, wait_until
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER

NS = "nptest"
POOL = "127.0.98.128/25"
GW = "gateway.networking.k8s.io"
NGF = "gateway.nginx.org/v1alpha2"
CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds" / "gateway.nginx.org"


def _proxy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": NGF, "kind": "NginxProxy", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def _gateway(infra: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"gatewayClassName": "np", "listeners": [listener("http", 80)]}
    if infra:
        spec["infrastructure"] = infra
    return {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta("gw", NS), "spec": spec}


def _get(server: Any, resource: str, name: str, ns: str | None = NS) -> dict[str, Any]:
    got = server.kubectl("get", resource, name, "-o", "json", *(["-n", ns] if ns else []), check=False)
    return json.loads(got.stdout) if got.returncode == 0 else {}


def _accepted(obj: dict[str, Any]) -> tuple[str, str, str]:
    """An object's Accepted condition, or an ancestor entry's."""
    conds = obj["conditions"] if "conditions" in obj else (obj.get("status") or {}).get("conditions") or []
    c = next((c for c in conds if c.get("type") == "Accepted"), {})
    return c.get("status", ""), c.get("reason", ""), c.get("message", "")


def _policy(server: Any) -> tuple[str, str, str]:
    anc = (_get(server, "observabilitypolicies.gateway.nginx.org", "trace").get("status") or {}).get("ancestors") or []
    ours = [a for a in anc if a.get("controllerName") == GATEWAY_CONTROLLER]
    return _accepted(ours[0]) if ours else ("", "", "")


def test_parameters_resolve_merge_and_gate_tracing(tmp_path: Path, server_kind: str):
    server = live_server.start(server_kind, tmp_path)
    gw = None
    try:
        crds = [d for f in ("nginxproxies.yaml", "observabilitypolicies.yaml") for d in yaml.safe_load_all((CRDS / f).read_text()) if d]
        server.apply((live_server.gateway_api_crds() if server_kind == "sandbox" else []) + crds)
        server.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("np"),
             "spec": {"controllerName": GATEWAY_CONTROLLER,
                      "parametersRef": {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": "proxy", "namespace": NS}}},
            _gateway(),
            {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta("r", NS),
             "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [backend("echo")]}]}},
            {"apiVersion": NGF, "kind": "ObservabilityPolicy", "metadata": {"name": "trace", "namespace": NS},
             "spec": {"targetRefs": [{"group": GW, "kind": "HTTPRoute", "name": "r"}], "tracing": {"strategy": "ratio"}}},
        ])
        gw = GatewayProcess(server.kubeconfig, tmp_path / "state", pool=POOL)

        def gc() -> tuple[str, str, str]:
            return _accepted(_get(server, f"gatewayclasses.{GW}", "np", None))

        # the class names an NginxProxy that does not exist: not accepted, and its Gateway waits
        got = wait_until(lambda: gc() if gc()[:2] == ("False", "InvalidParameters") else None, timeout=60,
                         what="GatewayClass InvalidParameters")
        assert f"spec.parametersRef gateway.nginx.org/NginxProxy {NS}/proxy: not found" in got[2]
        wait_until(lambda: _accepted(_get(server, f"gateways.{GW}", "gw"))[:2] == ("False", "Pending"), timeout=30,
                   what="Gateway Pending")

        # it appears, without an exporter: accepted, and the policy relies on what is not there
        server.apply([_proxy("proxy", {"telemetry": {"serviceName": "cafe"}})])
        wait_until(lambda: gc()[:2] == ("True", "Accepted"), timeout=30, what="GatewayClass Accepted")
        wait_until(lambda: _policy(server)[:2] == ("False", "NginxProxyNotSet"), timeout=30,
                   what="ObservabilityPolicy NginxProxyNotSet")
        assert f"{NS}/gw" in _policy(server)[2]

        # the Gateway names one of its own that does not exist: the Gateway is rejected
        server.apply([_gateway({"parametersRef": {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": "own"}})])
        got = wait_until(lambda: (lambda a: a if a[:2] == ("False", "InvalidParameters") else None)(
            _accepted(_get(server, f"gateways.{GW}", "gw"))), timeout=30, what="Gateway InvalidParameters")
        assert f"spec.infrastructure.parametersRef gateway.nginx.org/NginxProxy {NS}/own: not found" in got[2]

        # its own sets the exporter (the class's serviceName stays): accepted, and the policy too
        server.apply([_proxy("own", {"telemetry": {"exporter": {"endpoint": "127.0.0.1:4317"}}})])
        wait_until(lambda: _accepted(_get(server, f"gateways.{GW}", "gw"))[:2] == ("True", "Accepted"), timeout=30,
                   what="Gateway Accepted")
        wait_until(lambda: _policy(server)[:2] == ("True", "Accepted"), timeout=30, what="ObservabilityPolicy Accepted")
    finally:
        if gw is not None:
            gw.stop()
        server.close()
