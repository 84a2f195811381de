"""A Gateway edit that adds, removes or edits one listener, and a Namespace label change, are taken
in place by the gateway and rebuild only the routes whose part of the data plane can change: server
ids are the Gateway's and listener's (`dataplane.server_id`), not positions, so dropping a listener
leaves every other server, and the BuildCache entries of its routes, as they were."""

from __future__ import annotations

import asyncio
import copy
import random
import re

from gwpolicy.gateway.dataplane import server_id
from gwpolicy.refs import GATEWAY_GROUP, Ref
from test_gateway_inplace import base_cluster, change, check, kind_of, object_key, started, write_queued


def test_dropping_one_listener_rebuilds_only_the_routes_it_served() -> None:
    async def go() -> None:
        objects = {object_key(o): o for o in base_cluster(40, 1)}
        c, renderer = await started(objects)
        dp, _ = renderer.build(c.state.analysis, c.state.epoch)
        gw_key = next(k for k in objects if k[1] == "Gateway" and k[3] == "gw-000")
        first = objects[gw_key]["spec"]["listeners"][0]["name"]  # every later server was renumbered before
        served = {r for r, f in dp.routes.items() if Ref(GATEWAY_GROUP, "Gateway", "infra", "gw-000", first) in f.listeners}
        total = len(renderer.build_cache.routes)
        assert served and len(served) < total
        gw = copy.deepcopy(objects[gw_key])
        gw["spec"]["listeners"].pop(0)
        gw["metadata"]["generation"] += 1
        objects[gw_key] = gw
        await c.on_event("MODIFIED", kind_of(gw), copy.deepcopy(gw))
        await c.reconcile()
        assert c.state.full_passes == 1, c.state.last_fallback
        write_queued(c)
        renderer.build(c.state.analysis, c.state.epoch)
        # the routes it served are built again (they now have no server there or another one), no other
        assert renderer.build_cache.misses == len(served), (renderer.build_cache.misses, sorted(served))
        assert renderer.build_cache.hits == total - len(served)
        await check(c, renderer)
    asyncio.run(go())


def test_listener_and_namespace_edits_stay_off_the_full_pass() -> None:
    async def go() -> None:
        objects = {object_key(o): o for o in base_cluster(30, 2)}
        c, renderer = await started(objects)
        renderer.build(c.state.analysis, c.state.epoch)
        total = len(renderer.build_cache.routes)
        for what, seed in (("gateway-listener-add", 1), ("gateway-allowed", 2), ("gateway", 3), ("namespace-labels", 4),
                           ("gateway-listener-remove", 5)):
            ev = change(objects, what, random.Random(seed))
            assert ev is not None, what
            await c.on_event(ev[0], kind_of(ev[1]), copy.deepcopy(ev[1]))
            await c.reconcile()
            assert c.state.full_passes == 1, (what, c.state.last_fallback)
            write_queued(c)
            renderer.build(c.state.analysis, c.state.epoch)
            assert renderer.build_cache.hits > 0 and renderer.build_cache.misses < total, (what, renderer.build_cache.misses)
        await check(c, renderer)
    asyncio.run(go())


def test_server_ids_are_stable_distinct_and_nginx_names() -> None:
    ids = {server_id(ns, gw, l) for ns in ("a", "a-b", "a_b") for gw in ("g", "g.x", "g-x") for l in ("l", "l-1", "l_1")}
    assert len(ids) == 27  # slugs meet (a-b, a_b), the digest keeps them apart
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", i) for i in ids)
    assert server_id("a", "g", "l") == server_id("a", "g", "l")


def test_namespace_labels_after_a_selector_listener_match_a_full_pass() -> None:
    """A listener made to select namespaces by label, then those labels changed, in place: the
    random steps of test_gateway_inplace rarely meet in this order, which is where leaving the
    facts alone after a Namespace change shows (attachedRoutes, route status)."""
    from test_gateway_inplace import run

    for r in range(12):
        run(10, 1 + r % 3, [("gateway-allowed", r, True), ("namespace-labels", r * 7 + 1, True),
                            ("namespace-labels", r * 7 + 2, True)])
