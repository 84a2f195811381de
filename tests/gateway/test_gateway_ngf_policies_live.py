"""NGINX Gateway Fabric's documented ClientSettingsPolicy and UpstreamSettingsPolicy examples
(tests/data/ngf/), applied unchanged with `kubectl apply -f`, take effect in traffic through
`gwpolicy gateway` and real NGINX: the request body limits answer 413, the hash balancing method
sends every request to one endpoint, upstream connections are reused; a method that needs NGINX
Plus is Invalid and changes nothing; and a gwpolicy.io policy on the same field follows the
documented precedence (docs/coming-from-ngf.md). Loopback only: Gateways from 127.0.58.0/24,
the echo backends on 127.0.59.1-4."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

import backend_hosts
from gateway_proc import GatewayProcess, wait_until
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER
from live_server import start
from sandbox_proc import GW_CRDS

ROOT = Path(__file__).resolve().parents[2]
NGF = ROOT / "tests" / "data" / "ngf"
DEPLOY = ROOT / "deploy"
POOL = "127.0.58.0/24"
HOST = "cafe.example.com"


def _free_port(addresses: list[str]) -> int:
    """A port free on every one of `addresses` (one EndpointSlice port for all endpoints)."""
    for _ in range(50):
        s = socket.socket()
        s.bind((addresses[0], 0))
        port = s.getsockname()[1]
        s.close()
        try:
            for a in addresses:
                t = socket.socket()
                t.bind((a, port))
                t.close()
            return int(port)
        except OSError:
            continue
    raise AssertionError("no common free port")


def _request(address: str, path: str, size: int = 0, user: str | None = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection(address, 80, timeout=10)
    headers = {"Host": HOST, **({"X-User": user} if user else {})}
    try:
        conn.request("POST" if size else "GET", path, body=b"x" * size if size else None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        try:
            body = json.loads(data) if resp.status == 200 else {}
        except ValueError:
            body = {}
        return resp.status, body
    finally:
        conn.close()


def _status(address: str, path: str, size: int) -> int:
    return _request(address, path, size)[0]


def _slice(service: str, port: int, addresses: list[str]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-echo", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses]}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, module_server_kind: str):
    """The walkthrough's objects with two echo endpoints per Service: on loopback beside the sandbox,
    on a test host (tests/backend_hosts.py) against kube-apiserver, which refuses loopback endpoints."""
    if module_server_kind == "kube" and backend_hosts.missing():
        pytest.skip(backend_hosts.missing())
    tmp = tmp_path_factory.mktemp("ngfpol")
    server = start(module_server_kind, tmp_path_factory.mktemp("ngfsrv"))
    gw = None
    host = None
    echoes: list[EchoServer] = []
    try:
        if module_server_kind == "kube":
            host = backend_hosts.BackendHost()
            coffee_ips, tea_ips = [host.address(1), host.address(2)], [host.address(3), host.address(4)]
            port = 8080
        else:
            coffee_ips, tea_ips = ["127.0.59.1", "127.0.59.2"], ["127.0.59.3", "127.0.59.4"]
            port = _free_port(coffee_ips + tea_ips)
        specs = [{"pod": f"{svc}-{i}", "namespace": "default", "address": a, "port": port}
                 for svc, ips in (("coffee", coffee_ips), ("tea", tea_ips)) for i, a in enumerate(ips)]
        if host is not None:
            host.serve(specs)
        else:
            echoes += [EchoServer(s["pod"], s["namespace"], address=s["address"], port=s["port"]).start() for s in specs]

        def apply(*files: Path) -> None:
            server.kubectl("apply", "--server-side", "--force-conflicts", *sum((["-f", str(f)] for f in files), []))

        if module_server_kind == "sandbox":
            apply(*[GW_CRDS / f"gateway.networking.k8s.io_{n}.yaml"
                    for n in ("gatewayclasses", "gateways", "httproutes", "grpcroutes")], DEPLOY / "10-policykind-crd.yaml")
        apply(*sorted(DEPLOY.glob("4[0-9]-*.yaml")), DEPLOY / "crds" / "gateway.nginx.org")
        server.kubectl("apply", "--server-side", "-k", str(DEPLOY / "policykinds"))
        server.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([
            {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "nginx"},
             "spec": {"controllerName": GATEWAY_CONTROLLER}},
            _slice("coffee", port, coffee_ips), _slice("tea", port, tea_ips)]))
        # the walkthrough's app, Gateway and routes, unchanged
        apply(NGF / "client-settings-00a-app.yaml", NGF / "client-settings-00b-gateway.yaml",
              NGF / "client-settings-00c-httproutes.yaml")
        gw = GatewayProcess(server.kubeconfig, tmp / "state", pool=POOL)

        def address() -> str | None:
            o = json.loads(server.kubectl("get", "gateway", "gateway", "-n", "default", "-o", "json").stdout)
            addrs = (o.get("status") or {}).get("addresses") or []
            return addrs[0]["value"] if addrs else None

        addr = wait_until(address, 60, what=f"Gateway address\n{gw.tail() if gw else ''}")
        wait_until(lambda: _status(addr, "/coffee", 10) == 200 and _status(addr, "/tea", 10) == 200, 60,
                   what=f"traffic\n{gw.tail()}")
        yield server, gw, addr, apply, echoes
    finally:
        if gw is not None:
            gw.stop()
        for e in echoes:
            e.stop()
        if host is not None:
            host.stop()
        server.close()


def _accepted(server: Any, resource: str, name: str) -> dict[str, Any] | None:
    o = json.loads(server.kubectl("get", resource, name, "-n", "default", "-o", "json").stdout)
    for anc in (o.get("status") or {}).get("ancestors") or []:
        if anc.get("controllerName") != GATEWAY_CONTROLLER:
            continue
        for c in anc.get("conditions") or []:
            if c.get("type") == "Accepted":
                return c  # type: ignore[no-any-return]
    return None


def _ours(name: str, level: str, stanza: str, size: str) -> str:
    target = {"group": "gateway.networking.k8s.io", "kind": level, "name": "gateway" if level == "Gateway" else "tea"}
    return yaml.safe_dump({"apiVersion": "gwpolicy.io/v1alpha1", "kind": "ClientSettingsPolicy",
                           "metadata": {"name": name, "namespace": "default"},
                           "spec": {"targetRef": target, stanza: {"body": {"maxSize": size}}}})


def test_client_settings_examples_limit_request_bodies(env) -> None:
    server, gw, addr, apply, _ = env
    assert _status(addr, "/coffee", 100) == 200 and _status(addr, "/tea", 100) == 200
    apply(NGF / "client-settings-01-gateway-client-settings.yaml")  # 50 bytes on the Gateway
    wait_until(lambda: _status(addr, "/coffee", 100) == 413, 30, what=f"413 on /coffee\n{gw.tail()}")
    assert _status(addr, "/coffee", 40) == 200 and _status(addr, "/tea", 60) == 413
    apply(NGF / "client-settings-02-tea-client-settings.yaml")  # 75 bytes on the tea route
    wait_until(lambda: _status(addr, "/tea", 60) == 200, 30, what=f"75 bytes on /tea\n{gw.tail()}")
    assert _status(addr, "/tea", 100) == 413 and _status(addr, "/coffee", 60) == 413
    for name in ("gateway-client-settings", "tea-client-settings"):
        cond = wait_until(lambda n=name: _accepted(server, "clientsettingspolicies.gateway.nginx.org", n), 30,
                          what=f"status of {name}\n{gw.tail()}")
        assert cond["status"] == "True" and cond["reason"] == "Accepted", cond


def test_a_gwpolicy_policy_on_the_same_field_follows_the_precedence(env) -> None:
    server, gw, addr, apply, _ = env
    apply(NGF / "client-settings-01-gateway-client-settings.yaml", NGF / "client-settings-02-tea-client-settings.yaml")
    wait_until(lambda: _status(addr, "/tea", 60) == 200 and _status(addr, "/coffee", 60) == 413, 30,
               what=f"NGF limits\n{gw.tail()}")
    try:
        # a default of ours on the Gateway: on one level ours wins (coffee); the NGF route's is more specific (tea)
        server.kubectl("apply", "-f", "-", input=_ours("ours", "Gateway", "default", "1k"))
        wait_until(lambda: _status(addr, "/coffee", 100) == 200, 30, what=f"ours on coffee\n{gw.tail()}")
        assert _status(addr, "/tea", 100) == 413
        # an override of ours wins everywhere
        server.kubectl("apply", "-f", "-", input=_ours("ours", "Gateway", "override", "20"))
        wait_until(lambda: _status(addr, "/tea", 60) == 413, 30, what=f"override on tea\n{gw.tail()}")
        assert _status(addr, "/coffee", 30) == 413 and _status(addr, "/tea", 10) == 200
    finally:
        server.kubectl("delete", "clientsettingspolicies.gwpolicy.io", "ours", "-n", "default", "--ignore-not-found")
    wait_until(lambda: _status(addr, "/tea", 60) == 200, 30, what=f"NGF limits again\n{gw.tail()}")


def test_upstream_settings_examples_take_effect(env) -> None:
    server, gw, addr, apply, echoes = env
    apply(NGF / "upstream-settings-05-lb-method-hash.yaml", NGF / "upstream-settings-06-1m-zone-size.yaml",
          NGF / "upstream-settings-07-upstream-keepalives.yaml")
    for name in ("lb-method-hash", "1m-zone-size", "upstream-keepalives"):
        cond = wait_until(lambda n=name: _accepted(server, "upstreamsettingspolicies.gateway.nginx.org", n), 30,
                          what=f"status of {name}\n{gw.tail()}")
        assert cond["status"] == "True", cond
    # the example hashes $upstream_addr, which is empty when the peer is chosen: NGINX then balances
    # round robin, so both endpoints still answer
    assert {_request(addr, "/tea")[1].get("pod") for _ in range(20)} == {"tea-0", "tea-1"}
    # keepalive 32 on coffee: 40 requests over few connections (counted where the backends run in
    # this process, beside the sandbox)
    before = sum(e.accepted for e in echoes[:2])
    for _ in range(40):
        assert _status(addr, "/coffee", 10) == 200
    if echoes:
        assert sum(e.accepted for e in echoes[:2]) - before <= 8


HASH_BY_USER = {"apiVersion": "gateway.nginx.org/v1alpha1", "kind": "UpstreamSettingsPolicy",
                "metadata": {"name": "hash-by-user", "namespace": "default"},
                "spec": {"targetRefs": [{"group": "core", "kind": "Service", "name": "coffee"}],
                         "loadBalancingMethod": "hash", "hashMethodKey": "$http_x_user"}}


def test_hash_on_a_request_header_pins_each_user_to_one_endpoint(env) -> None:
    server, gw, addr, _, _ = env
    server.kubectl("delete", "upstreamsettingspolicies.gateway.nginx.org", "upstream-keepalives", "-n", "default",
                   "--ignore-not-found")
    server.kubectl("apply", "-f", "-", input=yaml.safe_dump(HASH_BY_USER))
    try:
        pods = lambda user: {_request(addr, "/coffee", user=user)[1].get("pod") for _ in range(10)}  # noqa: E731
        wait_until(lambda: all(len(pods(u)) == 1 for u in ("alice", "bob", "carol")), 30,
                   what=f"hash balancing\n{gw.tail()}")
        assert {p for u in "abcdefghijklmnopqrst" for p in pods(u)} == {"coffee-0", "coffee-1"}
    finally:
        server.kubectl("delete", "upstreamsettingspolicies.gateway.nginx.org", "hash-by-user", "-n", "default",
                       "--ignore-not-found")


def test_a_plus_only_method_is_invalid_and_changes_nothing(env) -> None:
    server, gw, addr, apply, _ = env
    apply(NGF / "upstream-settings-04-lb-method.yaml")
    cond = wait_until(lambda: _accepted(server, "upstreamsettingspolicies.gateway.nginx.org", "lb-method"), 30,
                      what=f"status of lb-method\n{gw.tail()}")
    assert cond["status"] == "False" and cond["reason"] == "Invalid", cond
    assert "spec.loadBalancingMethod" in cond["message"] and "NGINX Plus" in cond["message"]
    assert _status(addr, "/coffee", 10) == 200
