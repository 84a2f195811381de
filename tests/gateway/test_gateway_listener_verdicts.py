"""Status and the rendered NGINX configuration read ONE rule of which listeners are served
(`status.listener_verdicts`): for generated Gateways read as from files (no CRD validation), every
listener status calls Programmed=True has a server block on its address:port for its hostname, and
every listener it calls not Accepted or not Programmed has none. Before the rule was shared, the
data plane refused listeners by rules of its own (a bad hostname kept out of conflicts, only the
first certificateRef read, `stringData` Secrets, duplicate names, Gateways status does not accept),
and this property found each of them."""

from __future__ import annotations

import base64
import re
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway_kit import TEST_ENDPOINTS, key_pair
from gwpolicy.analysis import analyse
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.facts import GATEWAY_CONTROLLER, gateway_facts
from gwpolicy.gateway.render import render
from gwpolicy.gateway.status import Programming, all_desired
from gwpolicy.refs import GATEWAY_GROUP, Ref

GW = "gateway.networking.k8s.io/v1"
NOW = "2026-12-01T00:00:00Z"
PEM, KEY = (base64.b64encode(x).decode() for x in key_pair())  # a certificate and its key, as `data` holds them
PEM_TEXT, KEY_TEXT = (x.decode() for x in key_pair())

listener = st.fixed_dictionaries({
    "name": st.sampled_from(["l0", "l1", "l2", "l3", "l4", "l0"]),  # duplicates now and then
    "port": st.sampled_from([80, 80, 443, 8443, 0, 70000, "80", True]),
    "protocol": st.sampled_from(["HTTP", "HTTP", "HTTPS", "HTTPS", "TLS", "TCP"]),
    "hostname": st.sampled_from([None, None, "a.example", "A.Example", "*.example", "bad_host", "-x.example"]),
    "mode": st.sampled_from([None, "Terminate", "Passthrough"]),  # HTTPS: Terminate, TLS: Passthrough served
    "certs": st.sampled_from([["good"], ["good"], ["strings"], ["good", "missing"], ["good", "strings"], [], ["missing"],
                              ["malformed"], ["kind"], ["crossns"]]),
})
gateway = st.fixed_dictionaries({
    "listeners": st.lists(listener, min_size=1, max_size=5),
    "address": st.sampled_from([None, None, None, "10.0.0.1"]),
})


def _objects(gateways: list[dict[str, Any]]) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [
        {"apiVersion": GW, "kind": "GatewayClass", "metadata": {"name": "ours"}, "spec": {"controllerName": GATEWAY_CONTROLLER}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "good", "namespace": "a"}, "data": {"tls.crt": PEM, "tls.key": KEY}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "strings", "namespace": "a"},
         "stringData": {"tls.crt": PEM_TEXT, "tls.key": KEY_TEXT}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "malformed", "namespace": "a"}, "data": {"tls.crt": "eA=="}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "good", "namespace": "b"}, "data": {"tls.crt": PEM, "tls.key": KEY}},
    ]
    refs = {"good": {"name": "good"}, "strings": {"name": "strings"}, "missing": {"name": "nope"},
            "malformed": {"name": "malformed"}, "kind": {"kind": "ConfigMap", "name": "good"},
            "crossns": {"name": "good", "namespace": "b"}}  # no ReferenceGrant
    for gi, g in enumerate(gateways):
        ls = []
        for l in g["listeners"]:
            d: dict[str, Any] = {"name": l["name"], "port": l["port"], "protocol": l["protocol"]}
            if l["hostname"]:
                d["hostname"] = l["hostname"]
            if l["protocol"] in ("HTTPS", "TLS"):
                d["tls"] = {"certificateRefs": [refs[c] for c in l["certs"]]}
                if l["mode"]:
                    d["tls"]["mode"] = l["mode"]
            ls.append(d)
        spec: dict[str, Any] = {"gatewayClassName": "ours", "listeners": ls}
        if g["address"]:
            spec["addresses"] = [{"type": "IPAddress", "value": g["address"]}]
        objs.append({"apiVersion": GW, "kind": "Gateway", "metadata": {"name": f"g{gi}", "namespace": "a", "generation": 1},
                     "spec": spec})
    return objs


BLOCK = re.compile(r"server \{\n    # Gateway (\S+)/(\S+) listener (\S+)\n    listen (\S+?)(?: default_server)?(?: ssl)?(?: proxy_protocol)?;"
                   r"\n    server_name (\S+);")


def _served(files: dict[str, bytes]) -> dict[tuple[str, str, str], list[tuple[str, str]]]:
    """(namespace, Gateway, listener) -> the (listen, server_name) of each server block rendered for it."""
    out: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for m in BLOCK.finditer(files["servers.conf"].decode()):
        out.setdefault((m[1], m[2], m[3]), []).append((m[4], m[5]))
    if "stream.conf" in files:  # TLS passthrough: a stream server per address:port (no per-listener block)
        for m in re.finditer(r"# Gateway listeners (.*)\n    listen (\S+);", files["stream.conf"].decode()):
            for one in m[1].split(", "):
                ref, section = one.split(" ")
                ns, name = ref.split("/")
                out.setdefault((ns, name, section), []).append((m[2], "stream"))
    return out


def _status(objs: list[dict[str, Any]], stream_module: str | None) -> tuple[dict[Ref, dict[str, Any]], Any]:
    analysis = analyse(objs, kind_checks=policyconf.kind_checks())
    dp = build_dataplane(analysis, DataPlaneConfig(**TEST_ENDPOINTS, stream_module=stream_module))
    facts = gateway_facts(analysis.index)
    running = {gw.ref: gw.generation for gw in analysis.index.of_kind(GATEWAY_GROUP, "Gateway")}
    programming = Programming(running, None, {r: [a] for r, a in dp.addresses.items()},
                              {ref: (lf.programmed, lf.reason, lf.message) for ref, lf in dp.listeners.items()})
    return all_desired(analysis.index, facts, programming, NOW), render(dp)


def _cond(conds: list[dict[str, Any]], type_: str) -> str:
    return next(c["status"] for c in conds if c["type"] == type_)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(gateway, min_size=1, max_size=2), st.booleans())
def test_status_programmed_is_exactly_what_nginx_serves(gateways: list[dict[str, Any]], with_stream: bool) -> None:
    objs = _objects(gateways)
    desired, files = _status(objs, "/usr/lib/nginx/modules/ngx_stream_module.so" if with_stream else None)
    served = _served(files)
    for gi, g in enumerate(gateways):
        status = desired.get(Ref(GATEWAY_GROUP, "Gateway", "a", f"g{gi}"))
        if status is None:  # a shape the engine skips with a warning (e.g. a port that is a string)
            assert not [k for k in served if k[:2] == ("a", f"g{gi}")]
            continue
        names = [l["name"] for l in g["listeners"]]
        assert [l["name"] for l in status["listeners"]] == list(dict.fromkeys(names))  # one entry per name
        for ls in status["listeners"]:
            blocks = served.get(("a", f"g{gi}", ls["name"]), [])
            accepted, programmed = _cond(ls["conditions"], "Accepted"), _cond(ls["conditions"], "Programmed")
            if programmed == "True":
                assert accepted == "True"
                spec = next(l for l in g["listeners"] if l["name"] == ls["name"])
                if spec["protocol"] == "TLS":
                    assert len(blocks) == 1 and blocks[0][0].endswith(f":{spec['port']}"), (ls, blocks)
                    event("TLS listener programmed")
                    continue
                event(f"{spec['protocol']} listener programmed")
                assert len(blocks) == 1, (ls, blocks)
                listen, server_name = blocks[0]
                assert listen.endswith(f":{spec['port']}") or listen.startswith("unix:"), (ls, listen)
                assert server_name == ((spec["hostname"] or "").lower() or '""'), (ls, server_name)
            else:
                assert blocks == [], (ls, blocks)


def test_examples_the_old_data_plane_disagreed_on() -> None:
    """One Gateway per disagreement found (each was served while status said not Programmed)."""
    def gw(name: str, listeners: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
        return {"apiVersion": GW, "kind": "Gateway", "metadata": {"name": name, "namespace": "a", "generation": 1},
                "spec": {"gatewayClassName": "ours", "listeners": listeners, **spec}}

    https = {"name": "s", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "good"}, {"name": "nope"}]}}
    objs = _objects([]) + [
        # a second certificateRef that does not resolve: ResolvedRefs=False, so not served at all
        gw("tworefs", [https]),
        # the HTTP listener's ProtocolConflict partner has a bad hostname: neither takes part, HTTP is served
        gw("badhost", [{"name": "h", "port": 80, "protocol": "HTTP"},
                       {"name": "x", "port": 80, "protocol": "HTTPS", "hostname": "bad_host",
                        "tls": {"certificateRefs": [{"name": "good"}]}}]),
        # a Secret with stringData: resolved, and served
        gw("strings", [dict(https, tls={"certificateRefs": [{"name": "strings"}]})]),
        # a Gateway status does not accept (a non-loopback address): nothing of it served
        gw("remote", [{"name": "h", "port": 80, "protocol": "HTTP"}], addresses=[{"type": "IPAddress", "value": "10.0.0.1"}]),
        # two listeners with one name: neither
        gw("dup", [{"name": "h", "port": 80, "protocol": "HTTP"}, {"name": "h", "port": 81, "protocol": "HTTP"}]),
    ]
    desired, files = _status(objs, None)
    served = _served(files)

    def verdict(g: str, listener: str) -> tuple[str, str, bool]:
        ls = next(l for l in desired[Ref(GATEWAY_GROUP, "Gateway", "a", g)]["listeners"] if l["name"] == listener)
        return _cond(ls["conditions"], "Accepted"), _cond(ls["conditions"], "Programmed"), ("a", g, listener) in served

    assert verdict("tworefs", "s") == ("True", "False", False)
    assert verdict("badhost", "h") == ("True", "True", True)
    assert verdict("badhost", "x") == ("False", "False", False)
    assert verdict("strings", "s") == ("True", "True", True)
    assert verdict("remote", "h")[1:] == ("False", False)
    assert verdict("dup", "h") == ("False", "False", False)
