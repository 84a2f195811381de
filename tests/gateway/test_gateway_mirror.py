"""HTTPRoute RequestMirror through real NGINX on loopback (127.0.12.0/24).

The client gets the primary backend's answer; the mirror backend receives a copy (path, query,
method, Host, the rule's request header changes) whose answer is thrown away. A share of the
requests is mirrored by `percent` or `fraction`; a mirror that cannot be sent is dropped and the
route says so, while its requests are still served.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway_kit import (
    TEST_ENDPOINTS,
    Echoes,
    Served,
    backend,
    eventually,
    free_port,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    request,
    route,
)
from gwpolicy.analysis import analyse
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane
from gwpolicy.gateway.facts import gateway_facts
from gwpolicy.gateway.render import render
from gwpolicy.gateway.state import GatewayState, object_key
from gwpolicy.gateway.status import Programming, all_desired
from gwpolicy.model import build_index
from gwpolicy.refs import Ref

ADDR = "127.0.12.1"
BACKENDS = "127.0.12.2"
GW_REF = Ref("gateway.networking.k8s.io", "Gateway", "infra", "gw")


def mirror(name: str, ns: str | None = None, **share) -> dict:
    ref = {"name": name, "port": 8080}
    if ns:
        ref["namespace"] = ns
    return {"type": "RequestMirror", "requestMirror": {"backendRef": ref, **share}}


def rule(prefix: str, *filters: dict, to: str = "v1") -> dict:
    return {"matches": [{"path": {"type": "PathPrefix", "value": prefix}}], "filters": list(filters),
            "backendRefs": [backend(to)]}


def objects(echoes: Echoes, port: int) -> list[dict]:
    return [gatewayclass(), *echoes.objects(), gateway("gw", "infra", listener("http", port)),
            route("mirrored", "infra", [
                rule("/mirror", mirror("m1")),
                rule("/headers", {"type": "RequestHeaderModifier", "requestHeaderModifier": {
                    "set": [{"name": "X-Header-Set", "value": "set"}], "remove": ["X-Header-Remove"]}}, mirror("m1")),
                rule("/two", mirror("m1"), mirror("m2")),
                rule("/half", mirror("m2", percent=50)),
                rule("/quarter", mirror("m1", fraction={"numerator": 1, "denominator": 4})),
                rule("/missing", mirror("nosuch")),
                rule("/plain"),
                rule("/rewritten", {"type": "URLRewrite", "urlRewrite": {
                    "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/new"}}}, mirror("m2")),
            ], hostnames=["mirror.test"])]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not have_nginx():
        pytest.skip("NGINX is not installed (./dev test installs it)")
    echoes = Echoes(BACKENDS).start("v1", "m1", "m2")
    port = free_port(ADDR)
    served = Served(tmp_path_factory.mktemp("mirror") / "nginx", ADDR)
    objs = objects(echoes, port)
    served.apply(objs)
    yield {"served": served, "port": port, "echoes": echoes, "objects": objs}
    served.stop()
    echoes.stop()


def _get(world, path: str, **kw):
    return request(ADDR, world["port"], path, "mirror.test", **kw)


def _received(world, backend_name: str, path: str) -> list[dict]:
    return [e for e in list(world["echoes"].servers[backend_name].seen) if e["path"] == path]


def test_the_client_gets_the_primary_answer_and_the_mirror_a_copy(world):
    a = _get(world, "/mirror/x?q=1", method="POST", headers={"X-Test": "1"})
    assert a.status == 200 and a.pod.startswith("v1-")
    assert eventually(lambda: len(_received(world, "m1", "/mirror/x?q=1")) == 1, timeout=5)
    copy = _received(world, "m1", "/mirror/x?q=1")[0]
    assert (copy["method"], copy["host"], copy["headers"]["X-Test"]) == ("POST", "mirror.test", ["1"])
    assert not _received(world, "v1", "/plain") and not _received(world, "m1", "/plain")
    _get(world, "/plain")
    time.sleep(0.3)
    assert not _received(world, "m1", "/plain") and not _received(world, "m2", "/plain")  # only mirrored rules


def test_the_copy_carries_the_rules_request_header_changes(world):
    a = _get(world, "/headers", headers={"X-Header-Remove": "gone"})
    assert a.echo["headers"]["X-Header-Set"] == ["set"] and "X-Header-Remove" not in a.echo["headers"]
    assert eventually(lambda: len(_received(world, "m1", "/headers")) == 1, timeout=5)
    copy = _received(world, "m1", "/headers")[0]
    assert copy["headers"]["X-Header-Set"] == ["set"] and "X-Header-Remove" not in copy["headers"]


def test_the_copy_has_the_clients_path_where_the_rule_rewrites_it(world):
    assert _get(world, "/rewritten/x?y=1").echo["path"] == "/new/x?y=1"
    assert eventually(lambda: len(_received(world, "m2", "/rewritten/x?y=1")) == 1, timeout=5)


def test_several_mirrors_each_get_a_copy(world):
    assert _get(world, "/two").pod.startswith("v1-")
    assert eventually(lambda: len(_received(world, "m1", "/two")) == 1 and len(_received(world, "m2", "/two")) == 1, timeout=5)


def test_a_share_of_the_requests_is_mirrored(world):
    # n such that the tolerance is five binomial standard deviations (see test_gateway_traffic.sample_size)
    for path, backend_name, share, tolerance in (("/half", "m2", 0.5, 0.15), ("/quarter", "m1", 0.25, 0.13)):
        n = math.ceil(25 * share * (1 - share) / tolerance ** 2)
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda i: _get(world, f"{path}?i={i}"), range(n)))
        assert all(a.status == 200 and a.pod.startswith("v1-") for a in answers)  # every request served
        time.sleep(0.5)
        got = len([e for e in list(world["echoes"].servers[backend_name].seen) if e["path"].startswith(path + "?")])
        assert abs(got / n - share) <= tolerance, (path, got, n)


def test_a_mirror_that_cannot_be_sent_is_dropped_and_the_route_says_so(world):
    assert _get(world, "/missing").pod.startswith("v1-")  # the request itself is served
    dp = world["served"].dataplane
    fact = dp.routes[Ref("gateway.networking.k8s.io", "HTTPRoute", "infra", "mirrored")]
    assert any("nosuch" in msg for _, msg in fact.unsupported)
    servers = render(dp)["servers.conf"].decode()
    assert servers.count("mirror /_gw_mirror_") >= 5 and "nosuch" not in servers
    index = build_index(world["objects"])
    facts = gateway_facts(index)
    status = all_desired(index, facts, Programming({GW_REF: 1}, addresses={GW_REF: [ADDR]}), "2026-12-01T00:00:00Z")
    conds = {c["type"]: c for c in status[Ref("gateway.networking.k8s.io", "HTTPRoute", "infra", "mirrored")]["parents"][0]["conditions"]}
    assert (conds["Accepted"]["status"], conds["ResolvedRefs"]["status"], conds["ResolvedRefs"]["reason"]) == (
        "True", "False", "BackendNotFound")
    assert "spec.rules[5].filters[0].requestMirror.backendRef" in conds["ResolvedRefs"]["message"]


def _tls_mirror_objects() -> list[dict]:
    return [gatewayclass(), gateway("gw", "infra", listener("http", 8080)),
            route("r", "infra", [rule("/", mirror("secure"))], hostnames=["mirror.test"]),
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "v1", "namespace": "infra"},
             "spec": {"ports": [{"name": "http", "port": 8080}]}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "secure", "namespace": "infra"},
             "spec": {"ports": [{"name": "http", "port": 8080}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "v1-1", "namespace": "infra", "labels": {"kubernetes.io/service-name": "v1"}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": 9080}],
             "endpoints": [{"addresses": ["127.0.12.8"], "conditions": {"ready": True}}]},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "secure-1", "namespace": "infra", "labels": {"kubernetes.io/service-name": "secure"}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": 9443}],
             "endpoints": [{"addresses": ["127.0.12.9"], "conditions": {"ready": True}}]},
            {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
             "metadata": {"name": "tls", "namespace": "infra"},
             "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "secure"}],
                      "validation": {"hostname": "secure.test", "wellKnownCACertificates": "System"}}}]


def _accepted(index, facts) -> dict:
    status = all_desired(index, facts, Programming({GW_REF: 1}, addresses={GW_REF: [ADDR]}), "2026-12-01T00:00:00Z")
    return next(c for c in status[Ref("gateway.networking.k8s.io", "HTTPRoute", "infra", "r")]["parents"][0]["conditions"]
                if c["type"] == "Accepted")


def test_a_mirror_to_a_service_with_a_backend_tls_policy_is_not_sent_in_plain_http():
    objs = _tls_mirror_objects()
    dp = build_dataplane(analyse(objs), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}))
    assert "mirror " not in render(dp)["servers.conf"].decode()
    index = build_index(objs)
    accepted = _accepted(index, gateway_facts(index))
    assert accepted["status"] == "True" and "BackendTLSPolicy" in accepted["message"] and "secure" in accepted["message"]


def test_a_backend_tls_policy_added_later_stops_the_mirror_and_status_says_so():
    """The controller's in-place path: a policy change normally leaves the route facts alone."""
    objs = _tls_mirror_objects()
    policy = objs.pop()
    state = GatewayState({object_key(o): o for o in objs}, "gwpolicy.io/gateway-controller", policyconf.kind_checks())
    state.refresh()
    config = DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR})
    assert "mirror " in render(build_dataplane(state.analysis, config))["servers.conf"].decode()
    assert "BackendTLSPolicy" not in _accepted(state.index, state.facts)["message"]
    state.objects[object_key(policy)] = policy
    state.changed(None, policy)
    state.refresh()
    assert "mirror " not in render(build_dataplane(state.analysis, config))["servers.conf"].decode()
    assert "BackendTLSPolicy" in _accepted(state.index, state.facts)["message"]
