"""A Gateway edit (a listener's hostname, say) computes again the facts of that Gateway and of the
routes that name it, not of every Gateway and route of the cluster: before, the gateway's state
made its whole index and every route's status facts afresh for each Gateway edit (O(cluster): at
3,000 routes about 1.3 s of the 2 s such an edit cost, see docs/gateway.md). What it then serves and
the status it wants are still exactly a full pass' (`check`, as in test_gateway_inplace)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from gwpolicy.gateway import state as gateway_state
from gwpolicy.refs import GATEWAY_GROUP, Ref
from test_gateway_inplace import base_cluster, check, kind_of, object_key, started, write_queued


def _names(route: dict[str, Any], gateway: str) -> bool:
    return any(p.get("name") == gateway for p in route["spec"].get("parentRefs") or [])


@pytest.mark.parametrize("edit", ["hostname", "remove-listener", "gateway-class-gone", "listener-to-tls"])
def test_a_gateway_edit_reads_only_that_gateway_and_its_routes(monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    async def go() -> None:
        objects = {object_key(o): o for o in base_cluster(40, 2)}
        c, renderer = await started(objects)
        renderer.build(c.state.analysis, c.state.epoch)
        gw_key = next(k for k in objects if k[1] == "Gateway" and k[3] == "gw-000")
        naming = {Ref(GATEWAY_GROUP, o["kind"], o["metadata"]["namespace"], o["metadata"]["name"])
                  for o in objects.values() if o["kind"] in ("HTTPRoute", "TLSRoute") and _names(o, "gw-000")}
        routes = [o for o in objects.values() if o["kind"] in ("HTTPRoute", "TLSRoute")]
        assert naming and len(naming) < len(routes)
        gw = copy.deepcopy(objects[gw_key])
        if edit == "hostname":
            gw["spec"]["listeners"][0]["hostname"] = "edited.example.com"
        elif edit == "remove-listener":
            gw["spec"]["listeners"].pop()
        elif edit == "listener-to-tls":
            # the routes' listener made TLS, its allowedRoutes naming HTTPRoute: the engine's own
            # attachment lets the routes hang there, status does not (NotAllowedByListeners: no
            # HTTPRoute on a TLS listener), so their views (what the analysis reads) change: the
            # in-place step must give the analysis those views too (`_gateway_edit`'s route loop)
            https = next(l for l in gw["spec"]["listeners"] if l["name"] == "https")
            https["protocol"], https["tls"] = "TLS", {"mode": "Passthrough"}
            https["allowedRoutes"]["kinds"] = [{"kind": "HTTPRoute"}]
        else:  # its class named another (no such GatewayClass): no longer ours, the full facts again
            gw["spec"]["gatewayClassName"] = "nowhere"
        gw["metadata"]["generation"] += 1
        objects[gw_key] = gw
        facts_of: list[Ref] = []  # routes whose facts the state computes one by one
        full_facts = [0]  # status.gateway_facts: every Gateway's and route's
        route_facts, all_facts = gateway_state.route_fact, gateway_state.gateway_facts

        def one_route(route: Any, *args: Any) -> Any:
            facts_of.append(route.ref)
            return route_facts(route, *args)

        def every_route(*args: Any, **kw: Any) -> Any:
            full_facts[0] += 1
            return all_facts(*args, **kw)

        monkeypatch.setattr(gateway_state, "route_fact", one_route)
        monkeypatch.setattr(gateway_state, "gateway_facts", every_route)
        await c.on_event("MODIFIED", kind_of(gw), copy.deepcopy(gw))
        await c.reconcile()
        monkeypatch.setattr(gateway_state, "route_fact", route_facts)
        monkeypatch.setattr(gateway_state, "gateway_facts", all_facts)
        assert c.state.full_passes == 1, c.state.last_fallback
        if edit == "gateway-class-gone":  # no longer ours: not this path, everything's facts afresh (in place still)
            assert full_facts[0] == 1
        else:
            assert full_facts[0] == 0
            assert sorted(facts_of, key=Ref.sort_key) == sorted(naming, key=Ref.sort_key)
        write_queued(c)
        renderer.build(c.state.analysis, c.state.epoch)
        await check(c, renderer)
    asyncio.run(go())
