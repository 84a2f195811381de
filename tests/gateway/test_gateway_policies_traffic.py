"""Policies take effect: real HTTP through real NGINX on loopback (127.0.30.0/24, POL's range).

Manifests -> engine analysis (with the gateway's kind checks) -> data plane -> render -> NGINX, one
NGINX master for the module (each test reloads it with its own configuration), echo backends on
127.0.30.x. Every request uses a fresh connection (reloads close idle keep-alive connections) and
a timeout; request counts are small.
"""

from __future__ import annotations

import copy
import http.client
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gwpolicy.engine.analysis import Analysis, analyse
from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import backendtls as bt
from gwpolicy.gateway import policyconf as pc

dataplane = pytest.importorskip("gwpolicy.gateway.dataplane")
render_mod = pytest.importorskip("gwpolicy.gateway.render")
nginx_mod = pytest.importorskip("gwpolicy.gateway.nginx")
echo_mod = pytest.importorskip("gwpolicy.gateway.echo")

from gateway_kit import TEST_ENDPOINTS
from test_gateway_policies import policy_manifests  # noqa: E402
from test_gateway_policies_tls import configmap, make_ca, make_leaf, pem  # noqa: E402

GW = "gateway.networking.k8s.io"
NS = "pol"
GATEWAY_ADDR = "127.0.30.1"
PORT_OFFSET = 30000  # listener port 80 -> 30080
CONTROLLER = "gwpolicy.io/gateway-controller"
_ts = itertools.count(1)


def _meta(name: str, ns: str | None = NS, **extra: Any) -> dict[str, Any]:
    i = next(_ts)  # creation order = call order (conflicts: the older wins)
    m: dict[str, Any] = {"name": name, "creationTimestamp": f"2025-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
                         "generation": 1, **extra}
    if ns:
        m["namespace"] = ns
    return m


def gateway(name: str = "gw", listeners: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [{"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": _meta("pol", None),
             "spec": {"controllerName": CONTROLLER}},
            {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": _meta(name),
             "spec": {"gatewayClassName": "pol",
                      "listeners": listeners or [{"name": "http", "port": 80, "protocol": "HTTP"}]}}]


def route(name: str, backend: str, *, path: str = "/", hostnames: list[str] | None = None, port: int = 8080,
          section: str | None = None, **rule: Any) -> dict[str, Any]:
    parent: dict[str, Any] = {"name": "gw", **({"sectionName": section} if section else {})}
    return {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": _meta(name),
            "spec": {"parentRefs": [parent], **({"hostnames": hostnames} if hostnames else {}),
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],
                                "backendRefs": [{"name": backend, "port": port}], **rule}]}}


def service(name: str, echo: Any, port: int = 8080, pname: str = "http") -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "Service", "metadata": _meta(name),
             "spec": {"ports": [{"name": pname, "port": port}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": _meta(f"{name}-abc", labels={"kubernetes.io/service-name": name}),
             "addressType": "IPv4", "ports": [{"name": pname, "port": echo.port}],
             "endpoints": [{"addresses": [echo.address], "conditions": {"ready": True}}]}]


def policy(kind: str, name: str, target_kind: str, target: str, section: str | None = None,
           **spec: Any) -> dict[str, Any]:
    group = "" if target_kind == "Service" else GW
    ref = {"group": group, "kind": target_kind, "name": target, **({"sectionName": section} if section else {})}
    return {"apiVersion": "gwpolicy.io/v1alpha1", "kind": kind, "metadata": _meta(name),
            "spec": {"targetRef": ref, **spec}}


class Gateway:
    """One NGINX for the module; `program(objects)` makes it serve exactly those objects."""

    def __init__(self, root: Path) -> None:
        self.nginx = nginx_mod.Nginx(root)
        self.analysis: Analysis | None = None
        self.files: dict[str, bytes] = {}

    def program(self, objs: list[dict[str, Any]]) -> Analysis:
        a = analyse(policy_manifests() + copy.deepcopy(objs), kind_checks=pc.kind_checks())
        cfg = dataplane.DataPlaneConfig(**TEST_ENDPOINTS, addresses={Ref(GW, "Gateway", NS, "gw"): GATEWAY_ADDR},
                                        port_offset=PORT_OFFSET)
        dp = dataplane.build_dataplane(a, cfg)
        self.files = render_mod.render(dp)
        old = self._workers()
        result = self.nginx.apply(self.files)
        assert result.ok, result.error
        if result.changed:
            self._wait_gone(old)
        self.analysis = a
        return a

    def _workers(self) -> set[int]:
        pid = self.nginx.pid
        if pid is None:
            return set()
        try:
            return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
        except OSError:
            return set()

    def _wait_gone(self, old: set[int], timeout: float = 10.0) -> None:
        """Old workers keep accepting for a moment after a reload; a test must not reach them."""
        deadline = time.monotonic() + timeout
        while old & self._workers() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not old & self._workers(), "old NGINX workers still running"

    def conf(self) -> str:
        return b"".join(v for k, v in self.files.items() if k.endswith(".conf")).decode()

    def request(self, path: str, *, method: str = "GET", host: str = "example.com", body: bytes | None = None,
                headers: dict[str, str] | None = None, port: int = 80) -> tuple[int, dict[str, Any] | str, float]:
        """(status, echo JSON or text, seconds) over a fresh connection."""
        conn = http.client.HTTPConnection(GATEWAY_ADDR, port + PORT_OFFSET, timeout=10)
        t0 = time.monotonic()
        try:
            conn.request(method, path, body=body, headers={"Host": host, **(headers or {})})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        text = data.decode(errors="replace")
        try:
            parsed: dict[str, Any] | str = json.loads(text)
        except ValueError:
            parsed = text
        return resp.status, parsed, time.monotonic() - t0

    def outcome(self, name: str) -> tuple[str, str]:
        assert self.analysis is not None
        outs = next(o for r, o in self.analysis.outcomes.items() if r.name == name)
        return outs[0].reason, outs[0].message


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    try:
        g = Gateway(tmp_path_factory.mktemp("nginx"))
    except nginx_mod.NginxError as e:
        pytest.skip(str(e))
    try:
        yield g
    finally:
        g.nginx.stop()


@pytest.fixture(scope="module")
def echo() -> Iterator[Any]:
    with echo_mod.EchoServer("infra-backend-v1-abc-xyz", NS, address="127.0.30.2") as e:
        yield e


@pytest.fixture(scope="module")
def echo2() -> Iterator[Any]:
    with echo_mod.EchoServer("infra-backend-v2-abc-xyz", NS, address="127.0.30.3") as e:
        yield e


# ---------------------------------------------------------------------------------------------
# TimeoutPolicy


def test_primer_gateway_override_and_service_default_read_timeout(gw: Gateway, echo: Any) -> None:
    """The primer's example scaled to seconds: the Gateway's override connectionTimeout beats the
    Service's, the Service's default readTimeout 1 beats the route's default 3."""
    objs = gateway() + service("svc", echo) + [
        route("r", "svc"),
        policy("TimeoutPolicy", "route", "HTTPRoute", "r", default={"connectionTimeout": 3, "readTimeout": 3}),
        policy("TimeoutPolicy", "gateway", "Gateway", "gw", override={"connectionTimeout": 5}),
        policy("TimeoutPolicy", "backend", "Service", "svc", default={"readTimeout": 1}, override={"connectionTimeout": 2}),
    ]
    gw.program(objs)
    assert "proxy_connect_timeout 5s;" in gw.conf() and "proxy_read_timeout 1s;" in gw.conf()
    status, _, secs = gw.request("/slow?delay=1500ms")
    assert status == 504 and 0.9 < secs < 1.5
    status, body, _ = gw.request("/fast?delay=100ms")
    assert status == 200 and body["pod"].startswith("infra-backend-v1")
    # without the Service's policy the route's default readTimeout 3 applies: the slow one passes
    gw.program(objs[:-1])
    assert gw.request("/slow?delay=1500ms")[0] == 200


def test_a_conflicted_policy_changes_nothing(gw: Gateway, echo: Any) -> None:
    objs = gateway() + service("svc", echo) + [
        route("r", "svc"),
        policy("TimeoutPolicy", "older", "HTTPRoute", "r", default={"readTimeout": 3}),
        policy("TimeoutPolicy", "newer", "HTTPRoute", "r", default={"readTimeout": 1}),
    ]
    gw.program(objs)
    assert gw.outcome("newer")[0] == "Conflicted"
    assert gw.request("/?delay=1500ms")[0] == 200  # the newer one's 1 s would have cut it


def test_per_path_never_wider(gw: Gateway, echo: Any) -> None:
    """A route's policy applies to that route's paths only; another route to the same Service and a
    second listener's path through the same route keep NGINX's defaults or their own."""
    listeners = [{"name": "http", "port": 80, "protocol": "HTTP"}, {"name": "alt", "port": 81, "protocol": "HTTP"}]
    objs = gateway(listeners=listeners) + service("svc", echo) + [
        route("slow", "svc", path="/slow"), route("other", "svc", path="/other"),
        policy("TimeoutPolicy", "slow", "HTTPRoute", "slow", default={"readTimeout": 1}),
        policy("TimeoutPolicy", "alt", "Gateway", "gw", "alt", override={"readTimeout": 3}),
    ]
    gw.program(objs)
    assert gw.request("/slow?delay=1500ms")[0] == 504
    assert gw.request("/other?delay=1500ms")[0] == 200
    # through listener alt, the listener's override wins over the route's default
    assert gw.request("/slow?delay=1500ms", port=81)[0] == 200


# ---------------------------------------------------------------------------------------------
# RetryPolicy


@pytest.mark.parametrize("attempts, expected_status", [(3, 200), (2, 503)])
def test_retries_with_a_single_endpoint(gw: Gateway, echo: Any, attempts: int, expected_status: int) -> None:
    objs = gateway() + service("svc", echo) + [
        route("r", "svc"), policy("RetryPolicy", "retry", "Service", "svc", default={"attempts": attempts, "codes": [503]})]
    gw.program(objs)
    rid = uuid.uuid4().hex
    status, _, _ = gw.request(f"/retry?fail=2&id={rid}&code=503")
    assert status == expected_status
    assert echo.attempts[rid] == min(attempts, 3)  # exactly the attempts NGINX made


def test_without_a_retry_policy_there_is_no_retry(gw: Gateway, echo: Any) -> None:
    gw.program(gateway() + service("svc", echo) + [route("r", "svc")])
    rid = uuid.uuid4().hex
    assert gw.request(f"/retry?fail=1&id={rid}&code=503")[0] == 503
    assert echo.attempts[rid] == 1


def test_a_policy_with_an_unsupported_field_changes_nothing_and_says_which(gw: Gateway, echo: Any) -> None:
    objs = gateway() + service("svc", echo) + [
        route("r", "svc"),
        policy("RetryPolicy", "retry", "Service", "svc", default={"attempts": 3, "codes": [503], "backoff": "100ms"})]
    gw.program(objs)
    reason, message = gw.outcome("retry")
    assert reason == "Invalid" and message.startswith("spec.default.backoff: NGINX retries immediately")
    rid = uuid.uuid4().hex
    assert gw.request(f"/retry?fail=1&id={rid}&code=503")[0] == 503
    assert echo.attempts[rid] == 1
    assert "proxy_next_upstream" not in gw.conf()


# ---------------------------------------------------------------------------------------------
# ClientSettingsPolicy, RateLimitPolicy, UpstreamSettingsPolicy


def test_body_size_limit_gives_413(gw: Gateway, echo: Any) -> None:
    gw.program(gateway() + service("svc", echo) + [
        route("r", "svc"), route("free", "svc", path="/free"),
        policy("ClientSettingsPolicy", "body", "HTTPRoute", "r", default={"body": {"maxSize": "1k"}})])
    assert gw.request("/upload", method="POST", body=b"x" * 2048)[0] == 413
    assert gw.request("/upload", method="POST", body=b"x" * 512)[0] == 200
    assert gw.request("/free", method="POST", body=b"x" * 2048)[0] == 200  # another route: NGINX's 1m


def test_a_rule_s_body_size_limit_holds_on_a_path_it_shares_with_other_rules(gw: Gateway, echo: Any) -> None:
    """Two routes on one path, told apart by a header: NGINX selects one location for both, which
    lets the larger body in, and the strict rule's own location still refuses it."""
    strict = route("strict", "svc", matches=[{"path": {"type": "PathPrefix", "value": "/"},
                                              "headers": [{"name": "x-tier", "value": "small"}]}])
    gw.program(gateway() + service("svc", echo) + [
        strict, route("free", "svc"),
        policy("ClientSettingsPolicy", "body", "HTTPRoute", "strict", default={"body": {"maxSize": "1k"}})])
    assert gw.request("/upload", method="POST", body=b"x" * 2048, headers={"x-tier": "small"})[0] == 413
    assert gw.request("/upload", method="POST", body=b"x" * 512, headers={"x-tier": "small"})[0] == 200
    assert gw.request("/upload", method="POST", body=b"x" * 2048)[0] == 200


def test_rate_limit_gives_429_past_the_burst(gw: Gateway, echo: Any) -> None:
    gw.program(gateway() + service("svc", echo) + [
        route("r", "svc"),
        policy("RateLimitPolicy", "rl", "HTTPRoute", "r", default={"requests": 1, "unit": "Minute", "burst": 2})])
    statuses = [gw.request("/")[0] for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]


def test_rate_limit_by_header_counts_each_key(gw: Gateway, echo: Any) -> None:
    gw.program(gateway() + service("svc", echo) + [
        route("r", "svc"),
        policy("RateLimitPolicy", "rl", "HTTPRoute", "r",
               default={"requests": 1, "unit": "Minute", "key": {"type": "Header", "header": "X-User"}})])
    assert [gw.request("/", headers={"X-User": "a"})[0] for _ in range(2)] == [200, 429]
    assert gw.request("/", headers={"X-User": "b"})[0] == 200


def test_upstreams_keep_connections_by_default_and_a_policy_of_0_asks_the_backend_to_close(gw: Gateway, echo2: Any) -> None:
    objs = gateway() + service("svc2", echo2) + [route("r", "svc2")]
    gw.program(objs)
    before = echo2.accepted
    for _ in range(6):
        assert gw.request("/")[0] == 200
    assert echo2.accepted - before <= 2  # the default pool: one connection per NGINX worker at most, reused
    gw.program(objs + [policy("UpstreamSettingsPolicy", "pool", "Service", "svc2", keepAlive={"connections": 0})])
    before = echo2.accepted
    for _ in range(6):
        status, echoed, _ = gw.request("/")
        assert status == 200
        assert isinstance(echoed, dict) and echoed["headers"].get("Connection") == ["close"]
    assert echo2.accepted - before == 6  # no pool: a connection per request, closed by the backend
    gw.program(objs + [policy("UpstreamSettingsPolicy", "pool", "Service", "svc2", keepAlive={"connections": 4})])
    before = echo2.accepted
    for _ in range(6):
        assert gw.request("/")[0] == 200
    assert echo2.accepted - before <= 2  # one per NGINX worker at most, reused


# ---------------------------------------------------------------------------------------------
# BackendTLSPolicy


@pytest.fixture(scope="module")
def tls_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca("pol-test-ca")
    cert, key = make_leaf(ca, "abc.example.com")
    (d / "cert.pem").write_bytes(cert)
    (d / "key.pem").write_bytes(key)
    with echo_mod.EchoServer("tls-backend-abc-xyz", NS, address="127.0.30.4", cert=str(d / "cert.pem"),
                             key=str(d / "key.pem")) as e:
        yield e, pem(ca[1])


def _btls(name: str, hostname: str, cm: str = "ca") -> dict[str, Any]:
    return {"apiVersion": f"{GW}/v1", "kind": "BackendTLSPolicy", "metadata": _meta(name),
            "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "tls"}],
                     "validation": {"hostname": hostname,
                                    "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": cm}]}}}


@pytest.mark.parametrize("hostname, ca_name, expected", [
    ("abc.example.com", "ca", 200), ("other.example.com", "ca", 502), ("abc.example.com", "wrong", 502)])
def test_backend_tls(gw: Gateway, tls_backend: tuple[Any, str], hostname: str, ca_name: str, expected: int) -> None:
    backend, ca_pem = tls_backend
    wrong = pem(make_ca("someone-else")[1])
    objs = gateway() + service("tls", backend, port=443, pname="https") + [
        route("r", "tls", port=443), configmap("ca", NS, {"ca.crt": ca_pem}), configmap("wrong", NS, {"ca.crt": wrong}),
        _btls("btls", hostname, ca_name)]
    a = gw.program(objs)
    status, body, _ = gw.request("/tls")
    assert status == expected
    if expected == 200:
        assert body["tls"]["serverName"] == "abc.example.com"
    conds = {c["type"]: c["status"] for c in bt.all_conditions(a)[Ref(GW, "BackendTLSPolicy", NS, "btls")]}
    assert conds == {"Accepted": "True", "ResolvedRefs": "True"}  # valid policies; the backend refuses


def test_backend_tls_with_a_missing_ca_fails_closed_and_says_why(gw: Gateway, tls_backend: tuple[Any, str]) -> None:
    backend, _ = tls_backend
    a = gw.program(gateway() + service("tls", backend, port=443, pname="https") + [
        route("r", "tls", port=443), _btls("btls", "abc.example.com", "missing")])
    assert gw.request("/tls")[0] in (500, 502, 503)
    conds = {c["type"]: (c["status"], c["reason"], c["message"])
             for c in bt.all_conditions(a)[Ref(GW, "BackendTLSPolicy", NS, "btls")]}
    assert conds["Accepted"][:2] == ("False", "NoValidCACertificate")
    assert conds["ResolvedRefs"][:2] == ("False", "InvalidCACertificateRef")
    assert f"ConfigMap {NS}/missing does not exist" in conds["ResolvedRefs"][2]


def test_echo_policy_extensions(echo2: Any) -> None:
    """The backend behaviours the policy tests rely on, seen directly (no NGINX)."""
    def get(path: str) -> int:
        conn = http.client.HTTPConnection(echo2.address, echo2.port, timeout=5)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        finally:
            conn.close()

    before = echo2.accepted
    assert get("/status/418") == 418 and get("/x?status=503") == 503
    rid = uuid.uuid4().hex
    assert [get(f"/r?fail=2&id={rid}&code=500") for _ in range(3)] == [500, 500, 200]
    assert echo2.attempts[rid] == 3
    assert get(f"/r?fail=1&id={rid}x") == 503  # code defaults to 503
    assert echo2.accepted - before == 6  # one connection per request here


def test_a_route_policy_applies_to_its_own_matches_where_routes_share_host_port_and_path(gw: Gateway, echo: Any,
                                                                                          echo2: Any) -> None:
    """NGF rejects such a policy (TargetConflict) because its routes share one NGINX location; here
    each route's match gets its own location, so the engine's answer holds in traffic and the
    policy is accepted: only the route it targets is affected."""
    a_route = route("a", "svc")
    a_route["spec"]["rules"][0]["matches"][0]["headers"] = [{"name": "X-Route", "value": "a"}]
    gw.program(gateway() + service("svc", echo) + service("svc2", echo2) + [
        a_route, route("b", "svc2"),
        policy("TimeoutPolicy", "b-only", "HTTPRoute", "b", default={"readTimeout": 1})])
    assert gw.outcome("b-only")[0] == "Accepted"
    status, body, _ = gw.request("/?delay=1500ms", headers={"X-Route": "a"})
    assert status == 200 and body["pod"].startswith("infra-backend-v1")
    assert gw.request("/?delay=1500ms")[0] == 504  # route b: its policy's 1 s
    status, body, _ = gw.request("/?delay=100ms")
    assert status == 200 and body["pod"].startswith("infra-backend-v2")


# ---------------------------------------------------------------------------------------------
# the route's own fields (HTTPRoute rules[].timeouts, rules[].retry) against policies

@pytest.mark.parametrize("stanza, expected", [(None, 504), ("default", 504), ("override", 200)])
def test_route_backend_request_timeout_beats_a_default_and_loses_to_an_override(
        gw: Gateway, echo: Any, stanza: str | None, expected: int) -> None:
    r = route("r", "svc", timeouts={"backendRequest": "1s"})
    objs = gateway() + service("svc", echo) + [r]
    if stanza:
        objs.append(policy("TimeoutPolicy", "t", "HTTPRoute", "r", **{stanza: {"readTimeout": 3}}))
    gw.program(objs)
    assert gw.request("/?delay=1500ms")[0] == expected


def test_route_request_timeout_is_approximated(gw: Gateway, echo: Any) -> None:
    """HTTPRouteTimeoutRequest's shape: timeouts.request 500ms, a backend answering after 1 s."""
    gw.program(gateway() + service("svc", echo) + [route("r", "svc", timeouts={"request": "500ms"})])
    status, _, secs = gw.request("/?delay=1s")
    assert status == 504 and secs < 0.9
    assert gw.request("/?delay=100ms")[0] == 200


@pytest.mark.parametrize("retries, expected", [(2, 200), (1, 503)])
def test_route_retry_attempts_count_retries(gw: Gateway, echo: Any, retries: int, expected: int) -> None:
    gw.program(gateway() + service("svc", echo) + [
        route("r", "svc", retry={"attempts": retries, "codes": [503]})])
    rid = uuid.uuid4().hex
    assert gw.request(f"/retry?fail=2&id={rid}&code=503")[0] == expected
    assert echo.attempts[rid] == retries + 1
