"""Test kit for the gateway: manifest builders, echo backends and NGINX on loopback, an HTTP client.

Traffic goes only to 127.0.0.0/8. Each test module picks its own /24 (127.0.10-39.x for the
gateway's modules) so modules run in parallel never collide; ports are picked free at run time.
"""

from __future__ import annotations

import base64
import functools
import http.client
import json
import random
import re
import shutil
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlane, DataPlaneConfig, Location, MatchRule, VirtualHost, build_dataplane
from gwpolicy.gateway.dataplane.order import segment_prefix
from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.nginx import Nginx, ReloadResult
from gwpolicy.gateway.render import render

GW = "gateway.networking.k8s.io"
CONTROLLER = "gwpolicy.io/gateway-controller"
#: the tests' backends run on loopback, published as EndpointSlices the tests write themselves: the
#: data plane's two opt-ins (`--allow-unmanaged-endpointslices --allow-loopback-endpoints`), which
#: a gateway in a cluster leaves off
TEST_ENDPOINTS: dict[str, Any] = {"allow_unmanaged_endpointslices": True, "allow_loopback_endpoints": True}
TEST_ENDPOINT_FLAGS = ("--allow-unmanaged-endpointslices", "--allow-loopback-endpoints")


def have_nginx() -> bool:
    return shutil.which("nginx") is not None


def nginx_choice(vh: VirtualHost, path: str, method: str, headers: set[str]) -> MatchRule | None:
    """The rule NGINX serves a request with, as the rendered configuration picks it: the location
    (exact, else the longest prefix: render matches `/_v<id><path>/` against `<prefix>/`, i.e.
    segment-wise), then its candidate list in order, a regex candidate's path tested at run time
    as its map does."""
    loc: Location | None = vh.locations.get((True, path))
    if loc is None:
        prefixes = [p for (exact, p) in vh.locations if not exact and segment_prefix(p, path)]
        loc = vh.locations[(False, max(prefixes, key=len))] if prefixes else None
    if loc is None:
        return None
    for c in loc.candidates:
        if c.regex is not None and re.fullmatch(c.regex, path) is None:
            continue
        if (c.method is None or c.method == method) and all(h[1] in headers for h in c.headers):
            return c
    return None


def free_port_offset(addresses: tuple[str, ...], ports: tuple[int, ...]) -> int:
    """A port offset at which every one of these ports is free on every one of these addresses."""
    for _ in range(50):
        offset = random.randrange(20000, 50000)
        try:
            for addr in addresses:
                for port in ports:
                    with socket.socket() as s:
                        s.bind((addr, port + offset))
        except OSError:
            continue
        return offset
    raise AssertionError("no free ports")


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# manifests


def meta(name: str, ns: str | None = None, ts: str = "2024-01-01T00:00:00Z", **extra: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "creationTimestamp": ts, "generation": 1, **extra}
    if ns:
        m["namespace"] = ns
    return m


def gatewayclass(name: str = "gwpolicy") -> dict[str, Any]:
    return {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": meta(name), "spec": {"controllerName": CONTROLLER}}


def gateway(name: str, ns: str, *listeners: dict[str, Any], cls: str = "gwpolicy") -> dict[str, Any]:
    return {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": meta(name, ns),
            "spec": {"gatewayClassName": cls, "listeners": list(listeners)}}


def listener(name: str, port: int, protocol: str = "HTTP", hostname: str | None = None, **extra: Any) -> dict[str, Any]:
    l: dict[str, Any] = {"name": name, "port": port, "protocol": protocol,
                         "allowedRoutes": {"namespaces": {"from": "All"}}, **extra}
    if hostname:
        l["hostname"] = hostname
    return l


def route(name: str, ns: str, rules: list[dict[str, Any]], *, gw: str = "gw", gw_ns: str = "infra",
          hostnames: list[str] | None = None, ts: str = "2024-01-01T00:00:00Z", **parent: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"parentRefs": [{"name": gw, "namespace": gw_ns, **parent}], "rules": rules}
    if hostnames:
        spec["hostnames"] = hostnames
    return {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": meta(name, ns, ts), "spec": spec}


def backend(name: str, port: int = 8080, ns: str | None = None, **extra: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"name": name, "port": port, **extra}
    if ns:
        b["namespace"] = ns
    return b


def service(name: str, ns: str, port: int = 8080) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns),
            "spec": {"ports": [{"name": "http", "port": port, "targetPort": 3000}]}}


def endpoints(name: str, ns: str, addresses: list[tuple[str, int]], ready: bool = True) -> list[dict[str, Any]]:
    """One EndpointSlice per endpoint port (the echo servers listen on different ports)."""
    out = []
    for i, (addr, port) in enumerate(addresses):
        out.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": meta(f"{name}-{i}", ns, labels={"kubernetes.io/service-name": name}),
                    "addressType": "IPv4", "ports": [{"name": "http", "port": port}],
                    "endpoints": [{"addresses": [addr], "conditions": {"ready": ready}}]})
    return out


def reference_grant(name: str, ns: str, from_ns: str, to_kind: str = "Service", to_name: str | None = None,
                    from_kind: str = "HTTPRoute") -> dict[str, Any]:
    to: dict[str, Any] = {"group": "", "kind": to_kind}
    if to_name:
        to["name"] = to_name
    return {"apiVersion": f"{GW}/v1beta1", "kind": "ReferenceGrant", "metadata": meta(name, ns),
            "spec": {"from": [{"group": GW, "kind": from_kind, "namespace": from_ns}], "to": [to]}}


def tls_secret(name: str, ns: str, cert_pem: bytes, key_pem: bytes) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta(name, ns), "type": "kubernetes.io/tls",
            "data": {"tls.crt": base64.b64encode(cert_pem).decode(), "tls.key": base64.b64encode(key_pem).decode()}}


@functools.lru_cache(maxsize=None)
def key_pair(cn: str = "test.example") -> tuple[bytes, bytes]:
    """A certificate for `cn` and its private key (EC P-256, signed by a CA of its own, made with the
    webhook's `cryptography` helpers), as PEM: what NGINX loads (the gateway parses every
    certificate and key before it renders one)."""
    from gwpolicy.kube import certs

    pair = certs.make_serving(certs.make_ca(f"{cn}-ca"), [cn])
    return pair.cert_pem, pair.key_pem


def self_signed(tmp: Path, name: str, hosts: list[str]) -> tuple[Path, Path]:
    """A self-signed certificate for `hosts` (openssl), as (cert, key) files."""
    cert, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    san = ",".join(f"DNS:{h}" for h in hosts)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={hosts[0]}",
                    "-addext", f"subjectAltName={san}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


# ---------------------------------------------------------------------------------------------
# backends, NGINX, client


@dataclass
class Echoes:
    """Echo backends by name; `objects()` publishes them as Services + EndpointSlices."""

    address: str
    namespace: str = "infra"
    servers: dict[str, EchoServer] = field(default_factory=dict)

    def start(self, *names: str, namespace: str | None = None) -> "Echoes":
        for n in names:
            ns = namespace or self.namespace
            self.servers[n] = EchoServer(f"{n}-6d9f7c5b8-x4k2p", ns, address=self.address).start()
        return self

    def objects(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for n, s in sorted(self.servers.items()):
            out.append(service(n, s.namespace))
            out.extend(endpoints(n, s.namespace, [(s.address, s.port)]))
        return out

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def echo(self) -> dict[str, Any]:
        return json.loads(self.body) if self.headers.get("content-type") == "application/json" else {}

    @property
    def pod(self) -> str:
        return self.echo.get("pod", "")


def request(address: str, port: int, path: str = "/", host: str = "example.com", method: str = "GET",
            headers: dict[str, str] | None = None, timeout: float = 5.0, tls: bool = False,
            sni: str | None = None) -> Answer:
    """One request on a fresh connection (so a reload never races a reused one)."""
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        if tls:  # SNI may differ from the address: wrap the socket ourselves
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            conn.sock = ctx.wrap_socket(socket.create_connection((address, port), timeout=timeout),
                                        server_hostname=sni or host)
        conn.request(method, path, headers={"Host": host, **(headers or {})})
        resp = conn.getresponse()
        body = resp.read()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
    finally:
        conn.close()


class Served:
    """Manifests -> analysis -> data plane -> render -> NGINX, on one loopback address."""

    def __init__(self, root: Path, address: str, gateway: Ref | None = None) -> None:
        self.address = address
        self.gateway = gateway or Ref(GW, "Gateway", "infra", "gw")
        self.nginx = Nginx(root, verify_timeout=20)
        self.dataplane: DataPlane | None = None

    def files(self, objects: list[dict[str, Any]]) -> dict[str, bytes]:
        self.dataplane = build_dataplane(analyse(objects, kind_checks=policyconf.kind_checks()),
                                         DataPlaneConfig(addresses={self.gateway: self.address}, **TEST_ENDPOINTS))
        return render(self.dataplane)

    def apply(self, objects: list[dict[str, Any]]) -> ReloadResult:
        result = self.nginx.apply(self.files(objects))
        assert result.ok, result.error
        return result

    def stop(self) -> None:
        self.nginx.stop()


def eventually(check: Callable[[], bool], timeout: float = 10.0, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll)
    return check()
