"""The gateway's own health and metrics endpoint never takes a port a Gateway's listener asks for:
out of a cluster it listens on loopback only (127.0.0.1:8081), where no Gateway of the address pool
is served, so a listener on port 8081 gets its traffic; and a listener that would meet it (the same
port on its address, or a wildcard) is refused with PortUnavailable, saying what holds the port,
while the Gateway's other listeners are served."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from gateway_proc import GatewayProcess, request, wait_until
from gwpolicy.gateway.echo import EchoServer
from sandbox_proc import SandboxProcess
from test_process_defaults import REDIRECT, Command, gateway_objects, machine_wide, redirected  # noqa: F401 - the fixture

GATEWAY_ADDRESS = "127.0.71.1"  # this module's /24 (tests/gateway_kit.py)
ECHO_ADDRESS = "127.0.71.2"
GW = "gateway.networking.k8s.io"

pytestmark = pytest.mark.skipif(not Path("/usr/sbin/nginx").exists(), reason="the gateway needs NGINX")


def _objects(address: str, listeners: list[dict], echo_port: int, rule: dict | None = None) -> list[dict]:
    rule = rule or {"backendRefs": [{"name": "shop", "port": 8080}]}
    return gateway_objects(address, listeners, ECHO_ADDRESS, echo_port) + [
        {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": "shop", "namespace": "default"},
         "spec": {"parentRefs": [{"name": "demo"}], "rules": [rule]}}]


def _listeners(sb: SandboxProcess) -> dict[str, dict[str, dict]]:
    gw = sb.http.get(f"/apis/{GW}/v1/namespaces/default/gateways/demo").json()
    return {l["name"]: {c["type"]: c for c in l.get("conditions") or []}
            for l in (gw.get("status") or {}).get("listeners") or []}


def test_a_listener_on_the_gateways_own_default_port_gets_traffic(tmp_path: Path, machine_wide: None) -> None:
    """`gwpolicy gateway --kubeconfig F` listens on 127.0.0.1:8081; a Gateway's listener on port 8081
    (of its own address) is served."""
    with SandboxProcess(tmp_path) as sb:  # a redirect: with its defaults the gateway uses no loopback backend
        sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(
            _objects(GATEWAY_ADDRESS, [{"name": "http", "port": 8081, "protocol": "HTTP"}], 8080, REDIRECT)))
        gateway = Command("gateway", sb.kubeconfig, tmp_path / "gateway.log")
        try:
            assert "on port 8081" in gateway.wait_started()
            try:
                wait_until(lambda: redirected(GATEWAY_ADDRESS, 8081, "/"), 30,
                           what="traffic through the listener on port 8081")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; listeners: {_listeners(sb)}\n{gateway.tail()}") from None
            wait_until(lambda: _listeners(sb).get("http", {}).get("Programmed", {}).get("status") == "True", 30,
                       what="the listener's status")  # written after NGINX serves it
            assert request("127.0.0.1", 8081, "/healthz")[2] == b"ok"  # and the gateway's own endpoint answers
        finally:
            gateway.stop()


def test_a_listener_on_the_gateways_own_address_and_port_is_refused_with_a_reason(tmp_path: Path) -> None:
    """A Gateway on 127.0.0.1 asks for the gateway's health port: that listener is not programmed
    (PortUnavailable, naming what holds the port); the Gateway's other listener is served, and
    NGINX's reloads do not fail on the address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        other = s.getsockname()[1]
    with SandboxProcess(tmp_path) as sb, EchoServer("shop-abc-xyz", "default", address=ECHO_ADDRESS) as echo:
        gw = GatewayProcess(sb.kubeconfig, tmp_path / "state", pool="127.0.71.0/24")
        try:
            own = gw.port
            sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(_objects(
                "127.0.0.1", [{"name": "own", "port": own, "protocol": "HTTP"},
                              {"name": "other", "port": other, "protocol": "HTTP"}], echo.port)))
            try:
                status, _, body = wait_until(lambda: (r := request("127.0.0.1", other, "/"))[0] == 200 and r, 30,
                                             what="traffic through the other listener")
                wait_until(lambda: _listeners(sb).get("own", {}).get("Programmed", {}).get("status") == "False", 30,
                           what="the listener on the gateway's port refused")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; listeners: {_listeners(sb)}\n{gw.tail()}") from None
            assert json.loads(body)["pod"] == "shop-abc-xyz"
            conds = _listeners(sb)
            accepted, programmed = conds["own"]["Accepted"], conds["own"]["Programmed"]
            assert (accepted["status"], accepted["reason"]) == ("False", "PortUnavailable"), accepted
            assert (programmed["status"], programmed["reason"]) == ("False", "Invalid"), programmed  # GEP-1364's words
            assert f"127.0.0.1:{own} is held by the gateway's own health and metrics endpoint" in conds["own"]["Accepted"]["message"]
            assert "--listen" in conds["own"]["Accepted"]["message"]
            assert conds["other"]["Programmed"]["status"] == "True"
            assert request("127.0.0.1", own, "/healthz")[2] == b"ok"
            assert "Address already in use" not in (tmp_path / "state.log").read_text()
        finally:
            gw.stop()
