"""Which endpoints the gateway sends to: only EndpointSlices the EndpointSlice controller manages,
and never a loopback, link-local, multicast, unspecified or the gateway's own address, unless the
platform opts in (`--allow-unmanaged-endpointslices`, `--allow-loopback-endpoints`); every address
is parsed, so nothing but an IP address reaches nginx.conf. `gwpolicy render -f` applies the same
rules with the same flags. No NGINX needed (127.0.0.0/8 is only written, never connected to).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_kit import TEST_ENDPOINT_FLAGS, backend, gateway, gatewayclass, listener, meta, route, service
from gwpolicy.analysis import analyse
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import ENDPOINTSLICE_CONTROLLER, MANAGED_BY_LABEL, DataPlaneConfig, build_dataplane
from gwpolicy.gateway.render import render
from gwpolicy.refs import Ref
from helpers import run_cli

GW_REF = Ref("gateway.networking.k8s.io", "Gateway", "infra", "gw")
GW_ADDR = "127.0.52.1"


def slice_(name: str, addresses: list[Any], *, managed: bool = True, address_type: str = "IPv4",
           port: int = 8080) -> dict[str, Any]:
    labels = {"kubernetes.io/service-name": "web"}
    if managed:
        labels[MANAGED_BY_LABEL] = ENDPOINTSLICE_CONTROLLER
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": meta(name, "tenant-a", labels=labels), "addressType": address_type,
            "ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses]}


def objects(*slices: dict[str, Any]) -> list[dict[str, Any]]:
    return [gatewayclass(), gateway("gw", "infra", listener("http", 80)), service("web", "tenant-a"),
            route("r", "tenant-a", [{"backendRefs": [backend("web")]}], hostnames=["a.example"]), *slices]


def build(objs: list[dict[str, Any]], **config: Any) -> Any:
    return build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()),
                           DataPlaneConfig(addresses={GW_REF: GW_ADDR}, **config))


def servers(dp: Any) -> list[str]:
    return sorted(f"{e.address}:{e.port}" for u in dp.upstreams.values() for e in u.endpoints)


def test_only_slices_the_endpointslice_controller_manages_are_used_unless_the_platform_allows_every_one():
    objs = objects(slice_("by-controller", ["10.1.0.1"]), slice_("by-tenant", ["10.1.0.2"], managed=False))
    assert servers(build(objs)) == ["10.1.0.1:8080"]
    assert servers(build(objs, allow_unmanaged_endpointslices=True)) == ["10.1.0.1:8080", "10.1.0.2:8080"]


REFUSED = {
    "127.0.0.1": "loopback", "127.9.9.9": "loopback", "169.254.169.254": "link-local", "224.0.0.1": "multicast",
    "0.0.0.0": "unspecified", GW_ADDR: "the gateway's own address", "10.9.9.9": "the gateway's own address",
    "not-an-ip": "is not an IP address", "127.0.0.1;\n}\nserver { listen 19998; return 200 eps; }": "is not an IP address",
    "2001:db8::1": "is not an IPv4 address",
}


def test_loopback_link_local_multicast_unspecified_own_and_malformed_addresses_are_never_endpoints():
    objs = objects(slice_("s", ["10.1.0.1", *REFUSED]))
    dp = build(objs, own_addresses=frozenset({"10.9.9.9"}))
    assert servers(dp) == ["10.1.0.1:8080"]
    for address, why in REFUSED.items():
        assert any(repr(address) in w or address in w for w in dp.warnings if why in w), (address, dp.warnings)
    files = render(dp)
    assert b"eps" not in files["upstreams.conf"] and b"not-an-ip" not in files["upstreams.conf"]
    # v4-mapped and link-local IPv6 are what they map to
    v6 = build(objects(slice_("s6", ["::ffff:127.0.0.1", "fe80::1", "::1", "2001:db8::5"], address_type="IPv6")))
    assert servers(v6) == ["2001:db8::5:8080"]


def test_loopback_is_used_only_when_allowed_and_then_never_the_gateway_s_own_addresses_or_endpoints():
    objs = objects(slice_("s", ["127.0.0.1", GW_ADDR], port=8081), slice_("t", ["127.0.0.2"], port=9000))
    allowed = build(objs, allow_loopback_endpoints=True, own_endpoints=frozenset({("127.0.0.1", 8081)}))
    assert servers(allowed) == ["127.0.0.2:9000"]
    assert any("127.0.0.1:8081 is the gateway's own health and metrics endpoint" in w for w in allowed.warnings)


def test_a_service_with_only_refused_endpoints_answers_500_and_says_why():
    dp = build(objects(slice_("s", ["127.0.0.1"])))
    servers_conf = render(dp)["servers.conf"].decode()
    assert "has no ready endpoints (not used: 127.0.0.1 is a loopback address" in servers_conf
    assert "return 500;" in servers_conf


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.ip_addresses(v=4).map(str), st.text(max_size=40)), min_size=1, max_size=5))
def test_whatever_a_slice_holds_only_usable_ip_addresses_reach_nginx_conf(addresses: list[str]) -> None:
    dp = build(objects(slice_("s", addresses)), allow_loopback_endpoints=True)
    used = {e.address for u in dp.upstreams.values() for e in u.endpoints}
    for a in used:
        ip = ipaddress.ip_address(a)  # parsed: the text NGINX gets is an address, nothing else
        assert not (ip.is_link_local or ip.is_multicast or ip.is_unspecified) and a != GW_ADDR
    text = render(dp)["upstreams.conf"].decode()
    servers_lines = [l.strip() for l in text.splitlines() if l.strip().startswith("server ")]
    assert all(l.split()[1].rsplit(":", 1)[0] in used for l in servers_lines)


def test_render_f_applies_the_same_rules_with_the_same_flags(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all(objects(slice_("mine", ["127.0.0.1"], managed=False))))
    default = run_cli("render", "-f", str(path), "--file", "upstreams.conf")
    assert default.code == 0, default.err
    assert "server 127.0.0.1" not in default.out
    opted = run_cli("render", "-f", str(path), "--file", "upstreams.conf", *TEST_ENDPOINT_FLAGS)
    assert "server 127.0.0.1:8080;" in opted.out
    loopback_only = run_cli("render", "-f", str(path), "--file", "servers.conf", "--allow-unmanaged-endpointslices")
    assert ("Warning: EndpointSlice tenant-a/mine of Service tenant-a/web: endpoint 127.0.0.1 is a loopback address "
            "(gwpolicy gateway --allow-loopback-endpoints allows it): not used") in loopback_only.err
