"""NginxProxy `ipFamily` in the rendered configuration, for every family and every mix of a
Gateway's spec.addresses: NGINX listens on exactly the addresses of the Gateway's family, sends
to exactly the endpoints of that family, and status says which addresses are not used. The same
route on Gateways of different families gets an upstream of each family. Traffic:
tests/gateway/test_gateway_nginxproxy_traffic.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_kit import TEST_ENDPOINTS, analyse, backend, gateway, gatewayclass, listener, route, service
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.facts import GATEWAY_GROUP, Ref, dataplane_objects, gateway_facts
from gwpolicy.gateway.render import render
from gwpolicy.gateway.state import build_index

V4, V6 = ["127.0.30.1", "127.0.30.2"], ["::1"]
EP4, EP6 = "10.0.0.4", "fd00::6"


def _world(family: str | None, addresses: list[str], gateways: tuple[str, ...] = ("gw",)) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [gatewayclass(), service("web", "app"),
                                  route("r", "app", [{"backendRefs": [backend("web")]}])]
    objs[2]["spec"]["parentRefs"] = [{"name": g, "namespace": "infra"} for g in gateways]
    for i, g in enumerate(gateways):
        gw = gateway(g, "infra", listener("http", 8080 + i))
        gw["spec"]["addresses"] = [{"type": "IPAddress", "value": a} for a in addresses] if i == 0 else []
        fam = family if i == 0 else "ipv6"
        if fam is not None:
            gw["spec"]["infrastructure"] = {"parametersRef": {"group": "gateway.nginx.org", "kind": "NginxProxy", "name": g}}
            objs.append({"apiVersion": "gateway.nginx.org/v1alpha2", "kind": "NginxProxy",
                         "metadata": {"name": g, "namespace": "infra"}, "spec": {"ipFamily": fam}})
        objs.append(gw)
    for fam, ep in (("IPv4", EP4), ("IPv6", EP6)):
        objs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": f"web-{fam}", "namespace": "app", "labels": {"kubernetes.io/service-name": "web"}},
                     "addressType": fam, "ports": [{"name": "http", "port": 3000}],
                     "endpoints": [{"addresses": [ep], "conditions": {"ready": True}}]})
    return objs


def _served(objs: list[dict[str, Any]]) -> tuple[dict[str, bytes], Any, Any]:
    facts = gateway_facts(build_index(objs))
    view = dataplane_objects(objs, facts)
    dp = build_dataplane(analyse(view, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS))
    return render(dp), dp, facts


def _listens(files: dict[str, bytes]) -> set[str]:
    return set(re.findall(r"^\s*listen (\S+?)(?: default_server)?;", files["servers.conf"].decode(), re.M))


def _fam(a: str) -> str:
    return "ipv6" if ":" in a else "ipv4"


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from([None, "dual", "ipv4", "ipv6"]),
       addresses=st.lists(st.sampled_from(V4 + V6), unique=True, max_size=3))
def test_listens_and_sends_only_in_the_gateways_family(family, addresses):
    files, dp, facts = _served(_world(family, addresses))
    fam = family or "dual"
    usable = [a for a in addresses if fam == "dual" or _fam(a) == fam]
    firsts = {a for f in ("ipv4", "ipv6") for a in [next((u for u in usable if _fam(u) == f), None)] if a}
    if fam == "ipv6":
        expect = firsts or {"::1"}
    else:
        expect = firsts or {"127.0.1.1"}  # the pool's first address
    assert _listens(files) == {f"[{a}]:8080" if ":" in a else f"{a}:8080" for a in expect}
    gw = Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")
    assert set(dp.listen[gw]) == expect and dp.addresses[gw] in expect
    upstreams = files["upstreams.conf"].decode()
    assert (EP4 in upstreams) == (fam != "ipv6") and (f"[{EP6}]" in upstreams) == (fam != "ipv4")
    unusable = [a for a in addresses if a not in usable]
    message = facts.gateways[gw].unusable_addresses
    assert (message is not None) == bool(unusable)
    assert all(a in (message or "") for a in unusable)


def test_one_route_on_an_ipv4_and_an_ipv6_gateway_gets_an_upstream_of_each_family():
    files, dp, _ = _served(_world("ipv4", ["127.0.30.1"], gateways=("gw", "gw6")))
    assert _listens(files) == {"127.0.30.1:8080", "[::1]:8081"}
    by_family = {u.name: {e.address for e in u.endpoints} for u in dp.upstreams.values()}
    assert sorted(by_family.values(), key=sorted) == [{EP4}, {EP6}]


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_an_endpoint_of_the_other_family_only_leaves_the_service_without_endpoints(family):
    objs = [o for o in _world(family, []) if o.get("metadata", {}).get("name") != f"web-IPv{4 if family == 'ipv4' else 6}"]
    files, dp, _ = _served(objs)
    assert not dp.upstreams
    assert "return 500" in files["servers.conf"].decode()



def test_a_listener_one_of_whose_addresses_an_older_gateway_holds_is_served_on_none():
    objs = _world("dual", ["127.0.30.1", "::1"], gateways=("new", "old"))
    for o in objs:  # the ipv6 Gateway is older and takes ::1 on the same port
        if o["kind"] == "Gateway":
            o["metadata"]["creationTimestamp"] = "2023-01-01T00:00:00Z" if o["metadata"]["name"] == "old" else "2024-01-01T00:00:00Z"
            o["spec"]["listeners"][0]["port"] = 8080
    files, dp, _ = _served(objs)
    assert _listens(files) == {"[::1]:8080"}  # the older Gateway's; nothing of the newer on 127.0.30.1
    fact = dp.listeners[Ref(GATEWAY_GROUP, "Gateway", "infra", "new").with_section("http")]
    assert (fact.programmed, fact.reason) == (False, "PortUnavailable") and "infra/old" in fact.message


@pytest.mark.parametrize("family,expect", [("dual", {"0.0.0.0:8080", "[::]:8080"}), ("ipv4", {"0.0.0.0:8080"}),
                                           ("ipv6", {"[::]:8080"})])
def test_on_every_pod_address_each_family_listens_on_its_wildcards(family, expect):
    from gwpolicy.gateway.driver import EVERY_ADDRESS

    objs = _world(family, [])
    view = dataplane_objects(objs, gateway_facts(build_index(objs), any_address=True))
    dp = build_dataplane(analyse(view, kind_checks=policyconf.kind_checks()),
                         DataPlaneConfig(**TEST_ENDPOINTS, addresses=EVERY_ADDRESS, any_address=True))
    assert _listens(render(dp)) == expect
