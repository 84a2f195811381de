"""A namespace's budget of route matches (`--namespace-match-budget`): over it, its newest routes are
not served and say so (Accepted=False/NamespaceBudgetExceeded); no other namespace's route, and no
older route of its own, is touched. Offline (the gateway's controller without NGINX; 127.0.56.0/24
is only written)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from freezing import route
from gateway_kit import TEST_ENDPOINT_FLAGS, TEST_ENDPOINTS
from gwpolicy.gateway.controller import GatewayController, GatewayOptions
from gwpolicy.gateway.dataplane import BUDGET_EXCEEDED, route_cost
from gwpolicy.refs import Ref
from helpers import run_cli
from test_gateway_bad_values import cluster
from test_gateway_inplace import kind_of

GW = "gateway.networking.k8s.io"


def big(name: str, ns: str, matches: int, ts: str) -> dict[str, Any]:
    r = route(name, ns, f"{name}.example", {"matches": [{"path": {"type": "Exact", "value": f"/{name}/{i}"}}
                                                        for i in range(matches)]})
    r["metadata"]["creationTimestamp"] = ts
    return r


def run(objs: list[dict[str, Any]], budget: int | None) -> GatewayController:
    opts = GatewayOptions(address_pool="127.0.56.0/24", port_offset=20000, namespace_budget=budget, **TEST_ENDPOINTS)

    async def go() -> GatewayController:
        c = GatewayController(opts)
        for raw in objs:
            raw = dict(raw, metadata={"generation": 1, "creationTimestamp": "2024-01-01T00:00:00Z", **raw["metadata"]})
            await c.on_event("ADDED", kind_of(raw), copy.deepcopy(raw))
        await c.reconcile()
        return c
    c = asyncio.run(go())
    return c


def accepted(c: GatewayController, ns: str, name: str) -> dict[str, Any]:
    status = c.desired(Ref(GW, "HTTPRoute", ns, name))
    assert status is not None
    return next(x for x in status["parents"][0]["conditions"] if x["type"] == "Accepted")


def test_over_its_budget_a_namespace_s_newest_routes_are_refused_and_no_one_else_s() -> None:
    from gwpolicy.gateway.controller import Renderer

    objs = cluster(big("old", "tenant-a", 40, "2024-01-02T00:00:00Z"), big("mid", "tenant-a", 40, "2024-01-03T00:00:00Z"),
                   big("new", "tenant-a", 10, "2024-01-04T00:00:00Z"), big("b-big", "tenant-b", 50, "2024-01-05T00:00:00Z"))
    c = run(objs, 60)
    dp, files = Renderer(c.opts).build(c.state.analysis)  # what the driver builds
    assert set(dp.over_budget) == {Ref(GW, "HTTPRoute", "tenant-a", "mid"), Ref(GW, "HTTPRoute", "tenant-a", "new")}
    maps = files["maps.conf"].decode()
    assert "old.example" in maps and "b-big.example" in maps and "mid.example" not in maps and "new.example" not in maps
    c.over_budget = dict(dp.over_budget)  # as _program keeps it from the build; status follows on the next pass
    asyncio.run(c.reconcile())
    got = accepted(c, "tenant-a", "new")
    assert (got["status"], got["reason"]) == ("False", BUDGET_EXCEEDED), got
    assert "budget of namespace tenant-a: 60 route matches (older routes of tenant-a: 41, this route: 10" in got["message"]
    assert accepted(c, "tenant-a", "mid")["reason"] == BUDGET_EXCEEDED
    assert accepted(c, "tenant-a", "old")["status"] == "True" and accepted(c, "tenant-b", "b-big")["status"] == "True"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["tenant-a", "tenant-b"]), st.integers(1, 30)), min_size=1, max_size=8),
       st.integers(1, 80))
def test_a_route_is_never_refused_for_a_newer_one_and_each_namespace_stays_within(routes: list[tuple[str, int]],
                                                                                 budget: int) -> None:
    from gwpolicy.analysis import analyse
    from gwpolicy.gateway import policyconf
    from gwpolicy.gateway.dataplane import DataPlaneConfig, build_dataplane

    made = [big(f"r{i}", ns, n, f"2024-01-{i + 2:02d}T00:00:00Z") for i, (ns, n) in enumerate(routes)]
    config = DataPlaneConfig(namespace_budget=budget, **TEST_ENDPOINTS)
    dp = build_dataplane(analyse(cluster(*made), kind_checks=policyconf.kind_checks()), config)
    for ns in ("tenant-a", "tenant-b"):
        mine = [r for r in made if r["metadata"]["namespace"] == ns]
        refused = [Ref(GW, "HTTPRoute", ns, r["metadata"]["name"]) in dp.over_budget for r in mine]
        assert refused == sorted(refused)  # refused ones are the newest: none before a served one
        served = 1 + sum(route_cost(r["spec"]) for r, out in zip(mine, refused) if not out)  # and the base's route
        assert served <= budget
        nxt = next((r for r, out in zip(mine, refused) if out), None)
        assert nxt is None or served + route_cost(nxt["spec"]) > budget  # the first one refused did not fit


def test_render_f_takes_the_same_budget_and_says_which_routes_it_leaves_out(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all(cluster(big("old", "tenant-a", 30, "2024-01-02T00:00:00Z"),
                                               big("new", "tenant-a", 30, "2024-01-03T00:00:00Z"))))
    run_ = run_cli("render", "-f", str(path), "--file", "maps.conf", "--namespace-match-budget", "40", *TEST_ENDPOINT_FLAGS)
    assert run_.code == 0, run_.err
    assert "old.example" in run_.out and "new.example" not in run_.out
    assert f"Warning: HTTPRoute tenant-a/new is not served ({BUDGET_EXCEEDED})" in run_.err
    assert "new.example" in run_cli("render", "-f", str(path), "--file", "maps.conf", *TEST_ENDPOINT_FLAGS).out
