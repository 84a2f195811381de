"""When NGINX refuses a configuration all the same, the objects responsible are left out and the rest
is served (127.0.54.0/24, real NGINX, the gateway's controller in process): a route NGINX refuses
(its value made to slip past the checks, as a value no check knows would) is found by `nginx -t`,
its status says why, every other route (a new one of another tenant included) is served, and the
Gateway stays Programmed; a gateway restarted on that state starts with everything else instead of
nothing; a listener whose port another process holds is left out (PortUnavailable) and served once
the port is free. Also the bisection itself, property-tested."""

from __future__ import annotations

import asyncio
import copy
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from freezing import base_objects, freezing_objects, route
from gateway_kit import TEST_ENDPOINTS, Echoes, eventually, free_port, have_nginx, key_pair, request
from gwpolicy.gateway import conftext, isolate, routevalues
from gwpolicy.refs import Ref
from test_gateway_inplace import kind_of
from test_gateway_policies import policy_manifests

ADDR_POOL = "127.0.54.0/25"
BACKENDS = "127.0.54.200"
GW = "gateway.networking.k8s.io"
SHARED = Ref(GW, "Gateway", "infra", "shared")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.data())
def test_bisection_finds_exactly_the_units_whose_presence_fails(n: int, data: Any) -> None:
    bad = set(data.draw(st.lists(st.integers(0, n - 1), max_size=4)))
    calls = []

    def fails(out: frozenset[int]) -> str | None:
        calls.append(out)
        present = bad - out
        return f"refused {sorted(present)}" if present else None

    found = isolate.isolate([list(range(n))], [], fails)
    assert found is not None and set(found) == bad
    assert all(f"{u}" in why for u, why in found.items())
    assert len(calls) <= 2 + 2 * max(1, len(bad)) * (n.bit_length() + 1)


def test_suspects_are_searched_first_and_nothing_is_found_when_the_base_fails() -> None:
    calls: list[frozenset[int]] = []

    def fails(out: frozenset[int]) -> str | None:
        calls.append(out)
        return None if 7 in out else "refused 7"

    assert isolate.isolate([list(range(1000))], [7, 8], fails) == {7: "refused 7"}
    assert len(calls) <= 6
    assert isolate.isolate([[1], [2]], [], lambda out: "the base fails") is None
    assert isolate.unbindable("[emerg] bind() to 127.0.54.1:20080 failed (98: Address already in use)") == \
        {("127.0.54.1", 20080): "Address already in use"}
    assert isolate.without_paths('open() "/tmp/x/state/gen-4/servers.conf" failed in /tmp/x/state/gen-4/servers.conf:66') == \
        'open() "servers.conf" failed in servers.conf:66'


def _cond(status: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    assert status is not None
    entries = status.get("parents") or []
    return next(c for c in entries[0]["conditions"] if c["type"] == ctype) if entries else \
        next(c for c in status["conditions"] if c["type"] == ctype)


class Live:
    """The gateway's controller with real NGINX, fed the objects directly."""

    def __init__(self, tmp: Path, offset: int) -> None:
        from gwpolicy.gateway.controller import DataPlaneDriver, GatewayController, GatewayOptions

        self.opts = GatewayOptions(address_pool=ADDR_POOL, port_offset=offset, state_dir=str(tmp / "state"),
                                   leader_election=False, **TEST_ENDPOINTS)
        self.driver = DataPlaneDriver(self.opts)
        self.c = GatewayController(self.opts, self.driver)

    async def put(self, *objs: dict[str, Any]) -> None:
        for raw in objs:
            raw = dict(raw, metadata={"generation": 1, "creationTimestamp": "2024-01-01T00:00:00Z",
                                      "resourceVersion": "1", **raw["metadata"]})
            await self.c.on_event("ADDED", kind_of(raw), copy.deepcopy(raw))
        await self.c.reconcile()

    def status(self, ref: Ref) -> dict[str, Any] | None:
        return self.c.desired(ref)

    def stop(self) -> None:
        self.driver.stop()
        self.c.nginx_thread.shutdown(wait=True)


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
def test_a_route_nginx_refuses_is_left_out_and_everything_else_is_served_also_after_a_restart(tmp_path, monkeypatch) -> None:
    echoes = Echoes(BACKENDS).start("a", namespace="tenant-a").start("b", namespace="tenant-b")
    ports = {ns: (s.address, s.port) for ns, s in (("tenant-a", echoes.servers["a"]), ("tenant-b", echoes.servers["b"]))}
    http, https = free_port("127.0.54.1"), free_port("127.0.54.1")
    offset = 0
    objs = policy_manifests() + base_objects(http, https, key_pair("a.example"), ports)
    address = "127.0.54.1"
    # a value no check knows: the checks of route values and the renderer's own are switched off, so NGINX sees it
    monkeypatch.setattr(routevalues, "problems", lambda spec: [])
    monkeypatch.setattr(conftext, "MAX_PARAMETER", 10**9)
    bad = next(c for c in freezing_objects(key_pair("x.example"), key_pair("a.example")) if c.name == "set-4k")
    live = Live(tmp_path, offset)
    try:
        async def first() -> None:
            await live.put(*objs)
            assert live.c.error is None, live.c.error
            assert request(address, http, "/", "b.example").status == 200
            await live.put(*bad.objects, route("b-new", "tenant-b", "b-new.example"))
        asyncio.run(first())
        assert live.c.error is None, live.c.error
        assert eventually(lambda: request(address, http, "/", "b-new.example").status == 200, timeout=5)
        assert request(address, http, "/", "a.example").status == 200  # tenant-a's other route too
        assert request(address, http, "/set-4k", "a.example").pod.startswith("a-")  # its path: a-route's `/`
        accepted = _cond(live.status(Ref(GW, "HTTPRoute", "tenant-a", "a-set-4k")), "Accepted")
        assert (accepted["status"], accepted["reason"]) == ("False", "UnsupportedValue")
        assert "NGINX refused the configuration with this HTTPRoute in it" in accepted["message"]
        assert "too long parameter" in accepted["message"] and "/gen-" not in accepted["message"]
        assert _cond(live.status(Ref(GW, "HTTPRoute", "tenant-b", "b-new")), "Accepted")["status"] == "True"
        assert _cond(live.status(SHARED), "Programmed")["status"] == "True"
    finally:
        live.stop()
    # a restart on the same state: nothing loads until the refused route is left out again, then all the rest
    again = Live(tmp_path, offset)
    try:
        asyncio.run(again.put(*objs, *bad.objects, route("b-new", "tenant-b", "b-new.example")))
        assert again.c.error is None, again.c.error
        assert request(address, http, "/", "b-new.example").status == 200
        assert request(address, http, "/", "b.example").status == 200
        assert _cond(again.status(Ref(GW, "HTTPRoute", "tenant-a", "a-set-4k")), "Accepted")["status"] == "False"
    finally:
        again.stop()
        echoes.stop()


@pytest.mark.skipif(not have_nginx(), reason="NGINX is not installed (./dev test installs it)")
def test_a_listener_whose_port_another_process_holds_is_left_out_until_the_port_is_free(tmp_path) -> None:
    echoes = Echoes(BACKENDS).start("a", namespace="tenant-a").start("b", namespace="tenant-b")
    ports = {ns: (s.address, s.port) for ns, s in (("tenant-a", echoes.servers["a"]), ("tenant-b", echoes.servers["b"]))}
    address = "127.0.54.1"
    http, https = free_port(address), free_port(address)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind((address, https))
    holder.listen()
    live = Live(tmp_path, 0)
    try:
        asyncio.run(live.put(*policy_manifests(), *base_objects(http, https, key_pair("a.example"), ports)))
        assert live.c.error is None, live.c.error
        assert request(address, http, "/", "b.example").status == 200
        listener = next(l for l in live.status(SHARED)["listeners"] if l["name"] == "https")  # type: ignore[index]
        conds = {c["type"]: c for c in listener["conditions"]}
        assert (conds["Accepted"]["status"], conds["Accepted"]["reason"]) == ("False", "PortUnavailable")
        assert f"{address}:{https}" in conds["Accepted"]["message"] and conds["Programmed"]["status"] == "False"
        holder.close()
        asyncio.run(live.put())  # the next pass (a change, or the gateway's own retry) takes it again
        listener = next(l for l in live.status(SHARED)["listeners"] if l["name"] == "https")  # type: ignore[index]
        assert {c["type"]: c["status"] for c in listener["conditions"]}["Programmed"] == "True"
        assert request(address, https, "/", "a.example", tls=True).status == 404  # served: TLS, no route on it
    finally:
        holder.close()
        live.stop()
        echoes.stop()


def test_statusz_gives_a_summary_not_nginx_s_own_words() -> None:
    """/statusz answers whoever reaches it: NGINX's message (state-dir paths, a piece of a tenant's
    value) stays in the log and in the status of the object concerned."""
    import json
    import urllib.request

    from gwpolicy.gateway.controller import GatewayController, GatewayOptions

    async def go() -> dict[str, Any]:
        c = GatewayController(GatewayOptions(listen="127.0.0.1:0"))
        c.error = 'NGINX exited: [emerg] too long parameter "aaaa-tenant-secret" in /var/lib/state/gen-7/servers.conf:66'
        await c.http()
        try:
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{c.port}/statusz", timeout=5).read())
            return json.loads(body)
        finally:
            assert c.runner is not None
            await c.runner.cleanup()
    got = asyncio.run(go())
    assert got["nginxError"] == "NGINX did not load the newest configuration; the gateway's log says why"
    assert "tenant-secret" not in json.dumps(got) and "/var/lib" not in json.dumps(got)
