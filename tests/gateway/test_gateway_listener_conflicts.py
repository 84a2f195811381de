"""Conflicted listeners: what status says is served is what NGINX serves (127.0.11.0/24).

Gateway API ("Handling indistinct Listeners"): no conflicting listener is picked as the winner,
every one of them is Conflicted and not served. Status and the data plane read one rule
(gateway/listeners.py); these tests hold them to it: for any set of listeners (property), and
with real requests through NGINX built the way the controller builds it (GatewayState: status's
view of the objects, then the data plane).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gwconformance as gc
from gateway_kit import (
    TEST_ENDPOINTS,
    Echoes,
    backend,
    free_port,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    request,
    route,
    tls_secret,
)
from gwpolicy.analysis import analyse
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlane, DataPlaneConfig, build_dataplane
from gwpolicy.gateway.facts import dataplane_objects, gateway_facts
from gwpolicy.gateway.listeners import Candidate, conflicts
from gwpolicy.gateway.nginx import Nginx
from gwpolicy.gateway.render import render
from gwpolicy.gateway.state import GatewayState, object_key
from gwpolicy.gateway.status import Programming, all_desired
from gwpolicy.model import build_index
from gwpolicy.refs import Ref

GW = "gateway.networking.k8s.io"
GW_REF = Ref(GW, "Gateway", "infra", "gw")
CONTROLLER = "gwpolicy.io/gateway-controller"
ADDR = "127.0.11.1"
BACKENDS = "127.0.11.2"

_CERT = gc.make_cert(["*.test", "a.test", "b.test"])
SECRET = tls_secret("cert", "infra", *_CERT)


def _tls(protocol: str) -> dict:
    if protocol == "HTTPS":
        return {"tls": {"certificateRefs": [{"name": "cert"}]}}
    if protocol == "TLS":
        return {"tls": {"mode": "Passthrough"}}
    return {}


def _served(dp: DataPlane) -> set[str]:
    """Listener names NGINX gets a server for."""
    return {s.listener.section for s in dp.servers} | {l.section for p in dp.passthrough for l in p.listeners}


def _status(objs: list[dict], dp: DataPlane) -> dict[Ref, dict]:
    index = build_index(objs)
    facts = gateway_facts(index)
    prog = Programming({r: 1 for r in facts.gateways}, addresses={r: [ADDR] for r in facts.gateways},
                       listeners={r: (f.programmed, f.reason, f.message) for r, f in dp.listeners.items()})
    return all_desired(index, facts, prog, "2026-12-01T00:00:00Z")


def _conds(entry: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}


def _listener_status(objs: list[dict], dp: DataPlane) -> dict[str, dict[str, tuple[str, str]]]:
    return {l["name"]: _conds(l) for l in _status(objs, dp)[GW_REF]["listeners"]}


def _controller_dataplane(objs: list[dict]) -> DataPlane:
    """As the controller builds it: status's view of the objects, analysed, then the data plane."""
    state = GatewayState({object_key(o): o for o in objs}, CONTROLLER, policyconf.kind_checks())
    state.refresh()
    assert state.analysis is not None
    return build_dataplane(state.analysis, DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}))


# ---------------------------------------------------------------------------------------------
# the rule


def test_every_listener_of_a_conflict_is_conflicted_none_wins():
    got = conflicts([Candidate("http", 80, "HTTP"), Candidate("https", 80, "HTTPS", "a.test"),
                     Candidate("a", 8080, "HTTP", "a.test"), Candidate("a-again", 8080, "HTTP", "A.test"),
                     Candidate("b", 8080, "HTTP", "b.test"),
                     Candidate("tls", 443, "TLS", "a.test"), Candidate("secure", 443, "HTTPS", "b.test"),
                     Candidate("tcp-like", 9000, "HTTP")])
    assert {n: c.reason for n, c in got.items()} == {
        "http": "ProtocolConflict", "https": "ProtocolConflict", "a": "HostnameConflict", "a-again": "HostnameConflict"}
    assert "Port 80" in got["http"].message and "http" in got["http"].message and "https" in got["http"].message
    assert "a, a-again" in got["a"].message and "8080" in got["a"].message


# ---------------------------------------------------------------------------------------------
# status and the data plane agree, for every set of listeners

_listeners = st.lists(
    st.tuples(st.sampled_from([80, 443]), st.sampled_from(["HTTP", "HTTPS", "TLS", "TCP"]),
              st.sampled_from([None, "a.test", "b.test", "*.test"])),
    min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_listeners)
def test_status_says_programmed_exactly_for_the_listeners_nginx_serves(specs):
    ls = [listener(f"l{i}", port, protocol, hostname, **_tls(protocol)) for i, (port, protocol, hostname) in enumerate(specs)]
    objs = [gatewayclass(), gateway("gw", "infra", *ls), SECRET]
    config = DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR})
    alone = build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), config)
    facts = gateway_facts(build_index(objs))
    viewed = build_dataplane(analyse(dataplane_objects(objs, facts), kind_checks=policyconf.kind_checks()), config)
    status = _listener_status(objs, viewed)
    programmed = {n for n, c in status.items() if c["Programmed"][0] == "True"}
    assert _served(viewed) == programmed, status  # the controller's data plane (status's view)
    assert _served(alone) == programmed, status  # the data plane on its own: the same rule
    conflicted = {n: c["Conflicted"][1] for n, c in status.items() if c["Conflicted"][0] == "True"}
    for name, reason in conflicted.items():  # no winner: each has a partner that is conflicted alike
        assert status[name]["Accepted"] == ("False", reason) and name not in programmed
        assert sum(1 for r in conflicted.values() if r == reason) >= 2, status


# ---------------------------------------------------------------------------------------------
# status of one Gateway with each kind of conflict


def _gateway_with_conflicts(ports: dict[str, int]) -> list[dict]:
    """Port `mixed`: HTTP + HTTPS (ProtocolConflict); `twins`: two HTTP listeners with hostname
    a.test (HostnameConflict) beside a b.test one; `secure`: two HTTPS with hostname a.test;
    `ok`: one HTTP listener, not in any conflict."""
    tls = {"tls": {"certificateRefs": [{"name": "cert"}]}}
    return [gatewayclass(), SECRET,
            gateway("gw", "infra",
                    listener("plain", ports["mixed"]), listener("secure", ports["mixed"], "HTTPS", **tls),
                    listener("a-first", ports["twins"], hostname="a.test"),
                    listener("a-second", ports["twins"], hostname="a.test"),
                    listener("b", ports["twins"], hostname="b.test"),
                    listener("sa-first", ports["secure"], "HTTPS", "a.test", **tls),
                    listener("sa-second", ports["secure"], "HTTPS", "a.test", **tls),
                    listener("ok", ports["ok"]))]


def _routes() -> list[dict]:
    """One route per listener (sectionName), each to its own pod name, so a served answer shows
    which listener took it."""
    out = []
    for name in ("plain", "secure", "a-first", "a-second", "b", "sa-first", "sa-second", "ok"):
        out.append(route(f"to-{name}", "infra", [{"backendRefs": [backend("v1")]}], sectionName=name))
    return out


def test_status_of_conflicted_listeners_and_of_their_gateway():
    ports = {"mixed": 80, "twins": 8080, "secure": 8443, "ok": 9090}
    objs = _gateway_with_conflicts(ports) + _routes()
    dp = _controller_dataplane(objs)
    st_ = _status(objs, dp)
    ls = {l["name"]: _conds(l) for l in st_[GW_REF]["listeners"]}
    expect = {"plain": "ProtocolConflict", "secure": "ProtocolConflict", "a-first": "HostnameConflict",
              "a-second": "HostnameConflict", "sa-first": "HostnameConflict", "sa-second": "HostnameConflict"}
    for name, reason in expect.items():
        assert ls[name]["Accepted"] == ("False", reason), name
        assert ls[name]["Conflicted"] == ("True", reason), name
        assert ls[name]["Programmed"] == ("False", reason), name
    for name in ("b", "ok"):
        assert ls[name]["Accepted"] == ("True", "Accepted") and ls[name]["Programmed"] == ("True", "Programmed"), name
        assert ls[name]["Conflicted"] == ("False", "NoConflicts"), name
    gw_conds = {c["type"]: c for c in st_[GW_REF]["conditions"]}
    assert (gw_conds["Accepted"]["status"], gw_conds["Accepted"]["reason"]) == ("True", "ListenersNotValid")
    msg = gw_conds["Accepted"]["message"]
    assert "plain (ProtocolConflict)" in msg and "a-second (HostnameConflict)" in msg and "accepted: b, ok" in msg
    # routes naming a conflicted listener are not accepted; the others are
    by_route = {r.name: _conds(s["parents"][0]) for r, s in st_.items() if r.kind == "HTTPRoute"}
    assert by_route["to-plain"]["Accepted"][0] == "False" and by_route["to-a-first"]["Accepted"][0] == "False"
    assert by_route["to-b"]["Accepted"] == ("True", "Accepted") and by_route["to-ok"]["Accepted"] == ("True", "Accepted")
    assert _served(dp) == {"b", "ok"}


# ---------------------------------------------------------------------------------------------
# traffic


def _refused(port: int) -> bool:
    try:
        with socket.create_connection((ADDR, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
def test_nginx_serves_what_status_says_and_nothing_conflicted(tmp_path: Path):
    echoes = Echoes(BACKENDS).start("v1")
    nginx = Nginx(tmp_path / "nginx", verify_timeout=20)
    try:
        ports = {k: free_port(ADDR) for k in ("mixed", "twins", "secure", "ok")}
        objs = _gateway_with_conflicts(ports) + _routes() + echoes.objects()
        dp = _controller_dataplane(objs)
        result = nginx.apply(render(dp))
        assert result.ok, result.error
        ls = _listener_status(objs, dp)
        assert {n for n, c in ls.items() if c["Programmed"][0] == "True"} == {"b", "ok"}
        # what status says is served, is
        assert request(ADDR, ports["ok"], "/", "anything.test").pod.startswith("v1-")
        assert request(ADDR, ports["twins"], "/", "b.test").pod.startswith("v1-")
        # the conflicted ones are not: neither listener of HTTP + HTTPS on one port (nothing listens)
        assert ls["plain"]["Conflicted"][0] == ls["secure"]["Conflicted"][0] == "True"
        assert _refused(ports["mixed"])
        # nor either of two HTTPS listeners with one hostname (nothing listens on that port either)
        assert _refused(ports["secure"])
        # nor either HTTP listener of a.test: the port is open for b.test, a.test gets no route
        a = request(ADDR, ports["twins"], "/", "a.test")
        assert a.status == 404 and not a.pod
    finally:
        nginx.stop()
        echoes.stop()


def test_a_listener_without_a_valid_client_ca_conflicts_with_nothing_in_render_as_in_status():
    """An HTTPS listener whose client-certificate CAs are all invalid is not Accepted
    (NoValidCACertificate) and so takes no part in conflicts: the HTTP listener on its port is
    served, by `gwpolicy render`'s data plane (the objects as they are) as by the controller's."""
    https = listener("secure", 443, "HTTPS", "b.test", **_tls("HTTPS"))
    gw = gateway("gw", "infra", listener("plain", 443, "HTTP", "a.test"), https)
    gw["spec"]["tls"] = {"frontend": {"default": {"validation": {"caCertificateRefs": [{"kind": "ConfigMap", "name": "absent"}]}}}}
    objs = [gatewayclass(), gw, SECRET]
    alone = build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}))
    status = _listener_status(objs, alone)
    assert status["secure"]["Accepted"] == ("False", "NoValidCACertificate")
    assert status["plain"]["Conflicted"] == ("False", "NoConflicts")
    assert _served(alone) == _served(_controller_dataplane(objs)) == {"plain"}
    assert alone.listeners[GW_REF.with_section("plain")].programmed
