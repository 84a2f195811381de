"""Generated NGINX names never collide (docs/security.md "Generated NGINX names never collide").

Every identifier the data plane makes from object names (upstreams, action ids, TLS passthrough
upstreams, client CA files, the sockets of HTTPS servers behind a passthrough port) is one-to-one
on what it names. `team/x-api` and `team-x/api` are different Services, and so are `web.v1` and
`web-v1`: traffic through real NGINX on loopback (127.0.71.0/24) reaches each one's own backend,
whichever route is older; random names over [a-z0-9.-] never share a name; and the builder
refuses to go on if two different keys ever gave one name.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_kit import (
    TEST_ENDPOINTS,
    Echoes,
    Served,
    backend,
    endpoints,
    free_port,
    gateway,
    gatewayclass,
    have_nginx,
    listener,
    meta,
    request,
    route,
    service,
)
from gwpolicy.analysis import analyse
from gwpolicy.gateway import dataplane, policyconf
from gwpolicy.gateway.dataplane import DataPlaneConfig, DataPlaneError, build_dataplane
from gwpolicy.refs import GATEWAY_GROUP, Ref

ADDR = "127.0.71.1"
BACKENDS = "127.0.71.2"
GW_REF = Ref(GATEWAY_GROUP, "Gateway", "infra", "gw")


def _rule(to: str) -> dict[str, Any]:
    return {"backendRefs": [backend(to)]}


class World:
    def __init__(self, served: Served, echoes: Echoes, port: int) -> None:
        self.served, self.echoes, self.port = served, echoes, port

    def serve(self, *objs: dict[str, Any]) -> None:
        self.served.apply([gatewayclass(), gateway("gw", "infra", listener("http", self.port)),
                           *self.echoes.objects(), *objs])

    def pod(self, host: str, **headers: str) -> str:
        a = request(ADDR, self.port, "/", host, headers=headers)
        return a.pod if a.status == 200 else str(a.status)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if not have_nginx():
        pytest.skip("NGINX is not installed (./dev test installs it)")
    echoes = Echoes(BACKENDS)
    echoes.start("x-api", "web", namespace="team").start("api", "evil", namespace="team-x")
    served = Served(tmp_path_factory.mktemp("names") / "nginx", ADDR, GW_REF)
    try:
        yield World(served, echoes, free_port(ADDR))
    finally:
        served.stop()
        echoes.stop()


def _victim_and_attacker(world: World, victim: tuple[str, str], attacker: tuple[str, str], victim_first: bool) -> None:
    """Routes (name, Service) in team (victim.example) and team-x (attacker.example), the
    victim's created first or last."""
    old, new = "2024-01-01T00:00:00Z", "2024-06-01T00:00:00Z"
    world.serve(route(victim[0], "team", [_rule(victim[1])], hostnames=["victim.example"], ts=old if victim_first else new),
                route(attacker[0], "team-x", [_rule(attacker[1])], hostnames=["attacker.example"],
                      ts=new if victim_first else old))


@pytest.mark.parametrize("victim_first", [True, False])
def test_services_whose_namespace_and_name_join_alike_get_their_own_upstreams(world: World, victim_first: bool) -> None:
    """team/x-api and team-x/api: each route reaches its own namespace's Service, with the
    victim's credentials never at the other namespace's pod."""
    _victim_and_attacker(world, ("victim", "x-api"), ("attacker", "api"), victim_first)
    assert world.pod("victim.example", Cookie="sid=victim-secret").startswith("x-api-")
    assert world.pod("attacker.example").startswith("api-")


@pytest.mark.parametrize("victim_first", [True, False])
def test_routes_whose_namespace_and_name_join_alike_keep_their_own_rules(world: World, victim_first: bool) -> None:
    """Route team/x-api (to Service web) and route team-x/api (to Service evil): whichever is
    older, each host is served by its own route's backend."""
    _victim_and_attacker(world, ("x-api", "web"), ("api", "evil"), victim_first)
    assert world.pod("victim.example", Authorization="Basic dmljdGltOnB3").startswith("web-")
    assert world.pod("attacker.example").startswith("evil-")


def test_a_dot_and_a_dash_in_one_namespace_are_different_routes(world: World) -> None:
    world.serve(route("web.v1", "team", [_rule("web")], hostnames=["dot.example"]),
                route("web-v1", "team", [_rule("x-api")], hostnames=["dash.example"]))
    assert world.pod("dot.example").startswith("web-")
    assert world.pod("dash.example").startswith("x-api-")


# ---------------------------------------------------------------------------------------------
# the TLS passthrough upstreams, in the rendered stream map


def _tls_route(name: str, ns: str, host: str, svc: str) -> dict[str, Any]:
    return {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "TLSRoute", "metadata": meta(name, ns),
            "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}], "hostnames": [host],
                     "rules": [{"backendRefs": [backend(svc, 443)]}]}}


def _tls_service(name: str, ns: str, port: int) -> list[dict[str, Any]]:
    svc = service(name, ns, 443)
    return [svc, *endpoints(name, ns, [(BACKENDS, port)])]


def test_tls_passthrough_services_whose_names_join_alike_get_their_own_upstreams() -> None:
    objs = [gatewayclass(), gateway("gw", "infra", listener("tls", 443, "TLS", tls={"mode": "Passthrough"})),
            *_tls_service("x-db", "team", 1001), *_tls_service("db", "team-x", 1002),
            _tls_route("victim", "team", "victim.example", "x-db"), _tls_route("attacker", "team-x", "attacker.example", "db")]
    dp = build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()),
                         DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}, stream_module="/dev/null"))
    hosts = dp.passthrough[0].hosts
    ports = {h: {e.port for b in r.backends for e in dp.stream_upstreams[b.upstream].endpoints}  # type: ignore[index]
             for h, r in hosts.items()}
    assert ports == {"victim.example": {1001}, "attacker.example": {1002}}


# ---------------------------------------------------------------------------------------------
# properties over random names

LABELS = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?", fullmatch=True)
SUBDOMAINS = st.lists(LABELS, min_size=1, max_size=3).map(".".join)


@settings(max_examples=300, deadline=None)
@given(st.tuples(LABELS, LABELS, st.integers(1, 65535)), st.tuples(LABELS, LABELS, st.integers(1, 65535)))
def test_upstream_and_passthrough_names_differ_for_different_service_ports(a: tuple[str, str, int],
                                                                         b: tuple[str, str, int]) -> None:
    if a != b:
        assert dataplane.upstream_base(*a) != dataplane.upstream_base(*b)
        assert dataplane.tls_upstream_name(*a) != dataplane.tls_upstream_name(*b)


@settings(max_examples=300, deadline=None)
@given(st.tuples(LABELS, SUBDOMAINS, st.integers(0, 3), st.integers(0, 3)),
       st.tuples(LABELS, SUBDOMAINS, st.integers(0, 3), st.integers(0, 3)))
def test_action_ids_differ_for_different_route_matches(a: tuple[str, str, int, int], b: tuple[str, str, int, int]) -> None:
    ra = Ref(GATEWAY_GROUP, "HTTPRoute", a[0], a[1])
    rb = Ref(GATEWAY_GROUP, "HTTPRoute", b[0], b[1])
    if a != b:
        assert dataplane.action_id("s", ra, a[2], a[3]) != dataplane.action_id("s", rb, b[2], b[3])


@settings(max_examples=200, deadline=None)
@given(st.tuples(LABELS, SUBDOMAINS, st.integers(1, 65535)), st.tuples(LABELS, SUBDOMAINS, st.integers(1, 65535)))
def test_client_ca_files_differ_for_different_gateway_ports(a: tuple[str, str, int], b: tuple[str, str, int]) -> None:
    if a != b:
        assert dataplane.client_ca_path(*a) != dataplane.client_ca_path(*b)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(LABELS, LABELS), min_size=2, max_size=8, unique=True))
def test_built_from_random_names_no_two_services_or_routes_share_an_upstream_or_action(pairs: list[tuple[str, str]]) -> None:
    """Each (namespace, name) is a Service and a route to it with its own hostname; in the built
    data plane every route's actions are its own and every upstream serves one Service."""
    objs: list[dict[str, Any]] = [gatewayclass(), gateway("gw", "infra", listener("http", 80))]
    for i, (ns, name) in enumerate(pairs):
        objs += [service(name, ns), *endpoints(name, ns, [(BACKENDS, 2000 + i)]),
                 route(name, ns, [_rule(name)], hostnames=[f"h{i}.example"])]
    dp = build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}))
    owners: dict[str, set[tuple[str | None, str]]] = {}
    for a in dp.actions.values():
        owners.setdefault(a.id, set()).add((a.route.namespace, a.route.name))
        for b in a.backends:
            assert b.upstream is not None
            u = dp.upstreams[b.upstream]
            assert (u.service.namespace, u.service.name) == (a.route.namespace, a.route.name)
            assert [e.port for e in u.endpoints] == [2000 + pairs.index((a.route.namespace or "", a.route.name))]
    assert all(len(o) == 1 for o in owners.values())
    assert len({(a.route.namespace, a.route.name) for a in dp.actions.values()}) == len(pairs)


def test_the_builder_refuses_two_keys_that_give_one_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were the digest ever to collide, building stops with an error naming both, instead of
    letting one object's traffic take the other's upstream or rules."""
    monkeypatch.setattr(dataplane.model, "_digest", lambda *parts: "0" * 12)
    objs = [gatewayclass(), gateway("gw", "infra", listener("http", 80)),
            service("x-api", "team"), *endpoints("x-api", "team", [(BACKENDS, 1)]),
            service("api", "team-x"), *endpoints("api", "team-x", [(BACKENDS, 2)]),
            route("victim", "team", [_rule("x-api")], hostnames=["v.example"]),
            route("attacker", "team-x", [_rule("api")], hostnames=["a.example"])]
    with pytest.raises(DataPlaneError, match="team-x/api|team/x-api"):
        build_dataplane(analyse(objs, kind_checks=policyconf.kind_checks()), DataPlaneConfig(**TEST_ENDPOINTS, addresses={GW_REF: ADDR}))
