"""NginxProxy's `ipFamily` and `disableHTTP2` in traffic, on both API servers, through
`gwpolicy gateway` and real NGINX.

- ipFamily: three Gateways name the same two addresses, `127.0.96.x` and `::1`, each with its own
  NginxProxy (ipv4, ipv6, dual). The ipv4 one answers on its IPv4 address and nobody listens on
  `::1` for it; the ipv6 one the reverse; the dual one on both. The echo Service has an IPv4 and an
  IPv6 EndpointSlice (a test host's addresses, tests/backend_hosts.py): the ipv4 Gateway sends only
  to the IPv4 endpoint, the ipv6 one only to the IPv6 endpoint, the dual one to both. A Gateway
  whose address is of a family it does not use says so: Programmed=False, AddressNotUsable.
- disableHTTP2: a Gateway whose NginxProxy sets it speaks HTTP/1.1 only, to a client with
  HTTP/2 prior knowledge on its cleartext port and to a TLS client offering `h2` by ALPN, while a
  Gateway without it speaks HTTP/2 to both; its listeners do not list GRPCRoute in supportedKinds.

Addresses: Gateways on 127.0.96.0/24 and `::1` (ports picked free), backends on a test host.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

import backend_hosts
import live_server
from gateway_kit import backend, key_pair, listener, meta, service, tls_secret
from gateway_proc import GatewayProcess, wait_until

NS = "npfam"
POOL = "127.0.96.128/25"
GW = "gateway.networking.k8s.io"
NGF = "gateway.nginx.org/v1alpha2"
CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds" / "gateway.nginx.org"
V4 = {"ipv4": "127.0.96.1", "ipv6": "127.0.96.2", "dual": "127.0.96.3"}  # each Gateway's IPv4 address
PLAIN, NOH2 = "127.0.96.10", "127.0.96.11"  # the HTTP/2 Gateways: with and without disableHTTP2
TLS_HOST = "h2.example"

pytestmark = pytest.mark.skipif(backend_hosts.missing() is not None, reason=str(backend_hosts.missing()))


def _ipv6_loopback() -> str | None:
    """Why `::1` cannot be used here, or None."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as e:
        return f"IPv6 loopback ::1 is not usable here: {e}"
    return None


def _free_port(addresses: list[str]) -> int:
    """A port free on every one of `addresses` (IPv4 and IPv6)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = int(s.getsockname()[1])
        try:
            for a in addresses:
                with socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET) as t:
                    t.bind((a, port))
            return port
        except OSError:
            continue
    raise AssertionError("no common free port")


def _proxy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": NGF, "kind": "NginxProxy", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def _gateway(name: str, addresses: list[str], listeners: list[dict[str, Any]], proxy: str) -> dict[str, Any]:
    return {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta(name, NS),
            "spec": {"gatewayClassName": "npfam", "addresses": [{"type": "IPAddress", "value": a} for a in addresses],
                     "listeners": listeners,
                     "infrastructure": {"parametersRef": {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": proxy}}}}


def _route(name: str, gw: str, kind: str = "HTTPRoute", svc: str = "echo", host: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"parentRefs": [{"name": gw}], "rules": [{"backendRefs": [backend(svc)]}]}
    if host:
        spec["hostnames"] = [host]
    return {"apiVersion": f"{GW}/v1", "kind": kind, "metadata": meta(name, NS), "spec": spec}


def _slice(name: str, family: str, address: str) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": meta(name, NS, labels={"kubernetes.io/service-name": "echo"}),
            "addressType": family, "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]}


def _get(server: Any, resource: str, name: str) -> dict[str, Any]:
    got = server.kubectl("get", resource, name, "-n", NS, "-o", "json", check=False)
    return json.loads(got.stdout) if got.returncode == 0 else {}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """An object's condition of that type, or a status entry's (a listener's)."""
    conds = obj["conditions"] if "conditions" in obj else (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == kind), {})


def _pod(address: str, port: int, host: str = "www.example") -> str:
    """The echo pod that answered a GET through the Gateway at address:port."""
    conn = http.client.HTTPConnection(address, port, timeout=10)
    try:
        conn.request("GET", "/", headers={"Host": host})
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, (r.status, body[:200])
        return str(json.loads(body)["pod"])
    finally:
        conn.close()


def _refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, module_server_kind: str):
    why = _ipv6_loopback()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("npfam")
    host = backend_hosts.BackendHost()
    server = live_server.start(module_server_kind, tmp)
    gw = None
    try:
        v4, v6 = host.address(1), host.address6(1)
        host.serve([{"pod": "echo-v4", "namespace": NS, "address": v4, "port": 8080},
                    {"pod": "echo-v6", "namespace": NS, "address": v6, "port": 8080}])
        ports = {fam: _free_port([V4[fam], "::1"]) for fam in V4}
        cert, key = key_pair(TLS_HOST)
        crds = [d for d in yaml.safe_load_all((CRDS / "nginxproxies.yaml").read_text()) if d]
        server.apply((live_server.gateway_api_crds() if module_server_kind == "sandbox" else []) + crds)
        h2_listeners = [listener("http", 80), listener("https", 443, "HTTPS", tls={
            "mode": "Terminate", "certificateRefs": [{"kind": "Secret", "name": "h2-cert"}]})]
        objs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta("npfam"),
             "spec": {"controllerName": "gwpolicy.io/gateway-controller"}},
            service("echo", NS), _slice("echo-v4", "IPv4", v4), _slice("echo-v6", "IPv6", v6),
            service("grpc-echo", NS), tls_secret("h2-cert", NS, cert, key),
            _proxy("noh2", {"disableHTTP2": True}), _proxy("h2", {}),
            _gateway("plain", [PLAIN], h2_listeners, "h2"), _gateway("noh2", [NOH2], h2_listeners, "noh2"),
        ]
        for fam in V4:
            objs += [_proxy(fam, {"ipFamily": fam}),
                     _gateway(fam, [V4[fam], "::1"], [listener("http", ports[fam])], fam), _route(fam, fam)]
        for gw_name in ("plain", "noh2"):
            objs += [_route(f"{gw_name}-web", gw_name, host="www.example"),
                     _route(f"{gw_name}-grpc", gw_name, kind="GRPCRoute", svc="grpc-echo", host="grpc.example")]
        server.apply(objs)
        gw = GatewayProcess(server.kubeconfig, tmp / "state", pool=POOL)
        try:
            for fam in ("ipv4", "dual"):
                wait_until(lambda f=fam: _pod(V4[f], ports[f]), timeout=60, what=f"Gateway {fam} serves")
            wait_until(lambda: _pod("::1", ports["ipv6"]), timeout=60, what="Gateway ipv6 serves")
            for address in (PLAIN, NOH2):
                wait_until(lambda a=address: _pod(a, 80), timeout=60, what=f"Gateway at {address} serves")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{gw.tail(30)}") from None
        yield {"server": server, "ports": ports, "gw": gw}
    finally:
        if gw is not None:
            gw.stop()
        server.close()
        host.stop()


# ---------------------------------------------------------------------------------------- ipFamily

def test_ipv4_listens_on_its_ipv4_address_only_and_sends_to_ipv4_endpoints(plane):
    port = plane["ports"]["ipv4"]
    assert {_pod(V4["ipv4"], port) for _ in range(12)} == {"echo-v4"}
    assert _refused("::1", port)


def test_ipv6_listens_on_its_ipv6_address_only_and_sends_to_ipv6_endpoints(plane):
    port = plane["ports"]["ipv6"]
    assert {_pod("::1", port) for _ in range(12)} == {"echo-v6"}
    assert _refused(V4["ipv6"], port)


def test_dual_listens_on_both_and_sends_to_both_families(plane):
    port = plane["ports"]["dual"]
    pods = [_pod(a, port) for a in (V4["dual"], "::1") for _ in range(8)]
    assert set(pods) == {"echo-v4", "echo-v6"}


@pytest.mark.parametrize("family,other", [("ipv4", "::1"), ("ipv6", V4["ipv6"])])
def test_an_address_of_the_other_family_is_not_usable_and_status_says_which(plane, family, other):
    server = plane["server"]

    def programmed() -> dict[str, Any] | None:
        c = _condition(_get(server, f"gateways.{GW}", family), "Programmed")
        return c if c.get("reason") == "AddressNotUsable" else None

    c = wait_until(programmed, timeout=30, what=f"Gateway {family} Programmed=False/AddressNotUsable")
    assert c["status"] == "False" and other in c["message"] and f"ipFamily {family}" in c["message"]
    gw = _get(server, f"gateways.{GW}", family)
    assert _condition(gw, "Accepted")["status"] == "True"
    assert [a["value"] for a in gw["status"]["addresses"]] == ["::1" if family == "ipv6" else V4[family]]
    # the listener itself is served
    assert [_condition(l, "Programmed")["status"] for l in gw["status"]["listeners"]] == ["True"]


def test_a_dual_gateway_is_programmed_on_both_addresses(plane):
    def done() -> dict[str, Any] | None:
        gw = _get(plane["server"], f"gateways.{GW}", "dual")
        return gw if _condition(gw, "Programmed").get("status") == "True" else None

    gw = wait_until(done, timeout=30, what="Gateway dual Programmed")
    assert [a["value"] for a in gw["status"]["addresses"]] == [V4["dual"], "::1"]


# ------------------------------------------------------------------------------------ disableHTTP2

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _prior_knowledge(address: str) -> bytes:
    """What the Gateway's cleartext port answers a client that starts with the HTTP/2 preface and
    an empty SETTINGS frame (curl --http2-prior-knowledge does this)."""
    with socket.create_connection((address, 80), timeout=10) as s:
        s.sendall(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        got = b""
        while len(got) < 9:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got


def _alpn(address: str) -> tuple[str | None, int]:
    """The protocol ALPN picks when the client offers h2 and http/1.1, and the status of an HTTP/1.1
    request on that connection."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection((address, 443), timeout=10) as raw, ctx.wrap_socket(raw, server_hostname=TLS_HOST) as s:
        chosen = s.selected_alpn_protocol()
        if chosen == "h2":
            return chosen, 0
        s.sendall("GET / HTTP/1.1\r\nHost: www.example\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(64)
        return chosen, int(head.split()[1])


def test_with_disablehttp2_prior_knowledge_clients_get_http1_and_http1_is_served(plane):
    # the Gateway without it: its cleartext port (a GRPCRoute on it) answers the preface with SETTINGS
    got = _prior_knowledge(PLAIN)
    assert got[3] == 0x04, got[:40]  # frame type SETTINGS
    got = _prior_knowledge(NOH2)
    assert got.startswith(b"HTTP/1.1 400"), got[:40]  # the preface read as a malformed HTTP/1.1 request
    assert _pod(NOH2, 80) in ("echo-v4", "echo-v6")  # HTTP/1.1 is served


def test_with_disablehttp2_alpn_picks_http1_and_http1_is_served(plane):
    assert _alpn(PLAIN) == ("h2", 0)
    assert _alpn(NOH2) == ("http/1.1", 200)


def test_with_disablehttp2_listeners_do_not_list_grpcroute_and_grpcroutes_are_not_accepted(plane):
    server = plane["server"]

    def kinds(name: str) -> list[list[str]]:
        gw = _get(server, f"gateways.{GW}", name)
        return [sorted(k["kind"] for k in l.get("supportedKinds") or []) for l in (gw.get("status") or {}).get("listeners") or []]

    wait_until(lambda: kinds("noh2") == [["HTTPRoute"], ["HTTPRoute"]], timeout=30, what="noh2 supportedKinds")
    assert kinds("plain") == [["GRPCRoute", "HTTPRoute"], ["GRPCRoute", "HTTPRoute"]]
    parents = (_get(server, f"grpcroutes.{GW}", "noh2-grpc").get("status") or {}).get("parents") or []
    accepted = [c for p in parents for c in p.get("conditions") or [] if c.get("type") == "Accepted"]
    assert [(c["status"], c["reason"]) for c in accepted] == [("False", "NotAllowedByListeners")]


# ------------------------------------------------------------------------------- an edit, in place

def test_an_nginxproxy_edited_to_dual_adds_the_other_family_without_a_restart(plane):
    server, port = plane["server"], plane["ports"]["ipv4"]
    server.kubectl("patch", "nginxproxies.gateway.nginx.org", "-n", NS, "ipv4", "--type", "merge",
                   "-p", json.dumps({"spec": {"ipFamily": "dual"}}))

    def both() -> bool:
        return not _refused("::1", port) and {_pod(a, port) for a in (V4["ipv4"], "::1") for _ in range(6)} == {
            "echo-v4", "echo-v6"}

    wait_until(both, timeout=30, what="Gateway ipv4, its NginxProxy edited to dual, on ::1 and sending to both families")
    wait_until(lambda: _condition(_get(server, f"gateways.{GW}", "ipv4"), "Programmed").get("status") == "True",
               timeout=30, what="Gateway ipv4 Programmed: every address usable")
