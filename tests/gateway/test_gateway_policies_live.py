"""Policies through the whole gateway as a user runs it: `kubectl apply` of a policy to the sandbox,
`gwpolicy gateway` reprograms NGINX, traffic follows within 1 s; deleting it restores the previous
behaviour; a policy with an unsupported field changes nothing and its status names the field.
Loopback only: Gateways from 127.0.32.0/24, the echo backend on 127.0.33.1 (POL's range)."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway_proc import GatewayProcess, wait_until
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER
from helpers import needs_shared
from sandbox_proc import GW_CRDS, SandboxProcess

NS = "poltest"
POOL = "127.0.32.0/24"
BACKEND_IP = "127.0.33.1"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _apply(sb: SandboxProcess, *objs: dict[str, Any]) -> None:
    sb.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(list(objs)))


def _post(address: str, path: str, size: int) -> int:
    conn = http.client.HTTPConnection(address, 80, timeout=10)
    try:
        conn.request("POST", path, body=b"x" * size, headers={"Host": "example.com"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _objects(port: int) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "poltest"},
         "spec": {"controllerName": GATEWAY_CONTROLLER}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": NS},
         "spec": {"gatewayClassName": "poltest", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": NS},
         "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "echo-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "echo"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
         "endpoints": [{"addresses": [BACKEND_IP], "conditions": {"ready": True}}]},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": NS},
         "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "echo", "port": 8080}]}]}},
    ]


BODY_LIMIT = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "ClientSettingsPolicy",
              "metadata": {"name": "body", "namespace": NS},
              "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "r"},
                       "default": {"body": {"maxSize": "1k"}}}}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("polgw")
    sb = SandboxProcess(tmp, "--keep-creation-timestamp")
    gw = None
    echo = EchoServer("echo-pol-abc", NS, address=BACKEND_IP).start()
    try:
        crds = [GW_CRDS / f"gateway.networking.k8s.io_{n}.yaml" for n in ("gatewayclasses", "gateways", "httproutes")]
        crds += [DEPLOY / "10-policykind-crd.yaml"]
        sb.kubectl("apply", "--server-side", *sum((["-f", str(f)] for f in crds), []))
        sb.kubectl("apply", "--server-side", *sum((["-f", str(f)] for f in sorted(DEPLOY.glob("4[0-9]-*.yaml"))), []))
        sb.kubectl("apply", "--server-side", "-k", str(DEPLOY / "policykinds"))
        gw = GatewayProcess(sb.kubeconfig, tmp / "state", pool=POOL)
        _apply(sb, *_objects(echo.port))

        def address() -> str | None:
            o = json.loads(sb.kubectl("get", "gateway", "gw", "-n", NS, "-o", "json").stdout)
            addrs = (o.get("status") or {}).get("addresses") or []
            return addrs[0]["value"] if addrs else None

        addr = wait_until(address, 30, what=f"Gateway address\n{gw.tail() if gw else ''}")
        wait_until(lambda: _post(addr, "/", 10) == 200, 30, what=f"traffic\n{gw.tail()}")
        yield sb, gw, addr
    finally:
        if gw is not None:
            gw.stop()
        echo.stop()
        sb.close()


def _first_within(check: Any, seconds: float) -> float:
    """Seconds until `check()` first holds (polling every 20 ms), failing after `seconds` * 5."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > seconds * 5:
            break
        time.sleep(0.02)
    return time.monotonic() - t0


def test_a_policy_applied_with_kubectl_changes_traffic_within_a_second_and_deleting_restores(env) -> None:
    sb, gw, addr = env
    assert _post(addr, "/", 2048) == 200
    _apply(sb, BODY_LIMIT)
    took = _first_within(lambda: _post(addr, "/", 2048) == 413, 1.0)
    assert took < 1.0, f"413 after {took:.2f} s\n{gw.tail()}"
    assert _post(addr, "/", 512) == 200  # under the limit
    sb.kubectl("delete", "clientsettingspolicy", "body", "-n", NS)
    took = _first_within(lambda: _post(addr, "/", 2048) == 200, 1.0)
    assert took < 1.0, f"still 413 after {took:.2f} s"


def test_an_unsupported_field_changes_nothing_and_the_status_names_it(env) -> None:
    sb, gw, addr = env
    bad = json.loads(json.dumps(BODY_LIMIT))
    bad["metadata"]["name"] = "body-min-timeout"
    bad["spec"]["default"]["keepAlive"] = {"minTimeout": "1s"}
    _apply(sb, bad)

    def condition() -> dict[str, Any] | None:
        o = json.loads(sb.kubectl("get", "clientsettingspolicy", "body-min-timeout", "-n", NS, "-o", "json").stdout)
        for anc in (o.get("status") or {}).get("ancestors") or []:
            for c in anc.get("conditions") or []:
                if c.get("type") == "Accepted":
                    return c
        return None

    cond = wait_until(condition, 15, what=f"policy status\n{gw.tail()}")
    assert cond["status"] == "False" and cond["reason"] == "Invalid"
    assert "spec.default.keepAlive.minTimeout" in cond["message"] and "keepalive_min_timeout" in cond["message"]
    time.sleep(0.5)  # a reload would have happened by now
    assert _post(addr, "/", 2048) == 200  # the body limit of the invalid policy is not programmed
    sb.kubectl("delete", "clientsettingspolicy", "body-min-timeout", "-n", NS)


@needs_shared
def test_the_primers_timeout_policies_are_accepted_by_the_api_server_with_only_apiversion_changed(env) -> None:
    """The primer's manifests (bare seconds, `default`/`override` spellings) are stored as written; a
    value that is not a duration is refused by the API server, as the CRD's schema says, naming the
    field (the gateway's own check, for a server that does not validate, is tested without one)."""
    sb, gw, addr = env
    seed = yaml.safe_load((DEPLOY.parent.parent / "shared" / "conformance" / "seeds" /
                           "seed-timeout-three-levels.yaml").read_text())
    policies = [dict(m, apiVersion="gwpolicy.io/v1alpha1", metadata={**m["metadata"], "namespace": NS})
                for m in seed["manifests"] if m["kind"] == "TimeoutPolicy"]
    _apply(sb, *policies)
    got = json.loads(sb.kubectl("get", "timeoutpolicies", "-n", NS, "-o", "json").stdout)["items"]
    specs = {o["metadata"]["name"]: o["spec"] for o in got}
    assert specs["gateway"]["override"] == {"connectionTimeout": 5}
    assert specs["backend"]["default"] == {"readTimeout": 10}
    bad = dict(policies[0], metadata={"name": "bad", "namespace": NS})
    bad["spec"] = dict(bad["spec"], default={"readTimeout": "ten seconds"})
    sb.kubectl("delete", "timeoutpolicies", "--all", "-n", NS)
    bad["spec"]["targetRef"] = {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "r"}
    refused = sb.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert refused.returncode != 0 and 'The TimeoutPolicy "bad" is invalid' in refused.stderr
    assert "spec.default.readTimeout" in refused.stderr
    assert sb.kubectl("get", "timeoutpolicy", "bad", "-n", NS, check=False).returncode != 0
    assert _post(addr, "/", 10) == 200  # nothing of it is programmed
    sb.kubectl("delete", "timeoutpolicies", "--all", "-n", NS)
