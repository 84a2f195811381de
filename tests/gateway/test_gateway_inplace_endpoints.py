"""EndpointSlice and Service changes are taken in place and rebuild only the routes that read them.

An EndpointSlice created, changed, relabelled or deleted goes into the indexes without new facts
and without emptying the data plane's caches (GatewayState keeps `epoch`); a Service created,
changed or deleted has the facts of the routes naming it computed again, nothing else. The
BuildCache finds the routes whose backends or mirrors read that Service or its slices by itself.
The property test holds the result (files, status, queued writes) to a gateway that analysed
everything afresh, after any sequence of such edits mixed with route, policy and Gateway edits; the
example tests count what was rebuilt.
"""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy.gateway.controller import Renderer
from gwpolicy.gateway.state import key_ref, object_key
from test_gateway_inplace import CHANGES, base_cluster, change, check, kind_of, run, started, write_queued

SLICE_CHANGES = ["slice-endpoints", "slice-add", "slice-new", "slice-delete", "slice-relabel", "slice-ports",
                 "slice-fqdn", "route-mirror", "service-new", "service-delete", "service-ports", "service-label"]
SERVICE_LABEL = "kubernetes.io/service-name"


def slice_change(objects: dict[Any, dict[str, Any]], what: str, rnd: random.Random) -> tuple[str, dict[str, Any]] | None:
    """One EndpointSlice edit (or a route gaining a mirror, whose copies read endpoints too): the
    watch event it makes, or None when there is nothing to edit."""
    slices = sorted(k for k in objects if k[1] == "EndpointSlice")
    services = sorted(k for k in objects if k[1] == "Service")
    if what == "route-mirror":
        routes = sorted(k for k in objects if k[1] == "HTTPRoute")
        if not routes:
            return None
        r = copy.deepcopy(objects[rnd.choice(routes)])
        svc = rnd.choice([s for s in services if s[2] == r["metadata"]["namespace"]] or services)
        rule = rnd.choice(r["spec"]["rules"])
        rule["filters"] = [{"type": "RequestMirror", "requestMirror": {
            "backendRef": {"group": "", "kind": "Service", "name": svc[3], "namespace": svc[2], "port": 8080}}}]
        r["metadata"]["generation"] = r["metadata"].get("generation", 1) + 1
        objects[object_key(r)] = r
        return "MODIFIED", r
    if what.startswith("service-"):
        if what == "service-new":  # "missing" is the name route-backend edits send to; or a Service nothing names
            ns = rnd.choice(sorted({k[2] for k in services}))
            svc = {"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": rnd.choice(["missing", "unread"]), "namespace": ns},
                   "spec": {"ports": [{"name": "http", "port": rnd.choice([8080, 1234])}]}}
            old = objects.get(object_key(svc))
            objects[object_key(svc)] = svc
            return ("MODIFIED" if old is not None else "ADDED"), svc
        svc = copy.deepcopy(objects[rnd.choice(services)])
        if what == "service-delete":
            objects.pop(object_key(svc))
            return "DELETED", svc
        if what == "service-ports":
            svc["spec"]["ports"] = rnd.choice([[{"name": "http", "port": 8080}], [{"name": "metrics", "port": 8080}],
                                               [{"name": "http", "port": 8080}, {"name": "grpc", "port": 1234}],
                                               [{"name": "http", "port": 9090}]])
        else:  # a change nothing reads
            svc["metadata"].setdefault("labels", {})["tier"] = rnd.choice(["a", "b"])
        objects[object_key(svc)] = svc
        return "MODIFIED", svc
    if what == "slice-new":
        svc = rnd.choice(services)
        name = f"{svc[3]}-extra{rnd.randrange(3)}"
        old = objects.get(("discovery.k8s.io", "EndpointSlice", svc[2], name))
        es = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": name, "namespace": svc[2], "labels": {SERVICE_LABEL: svc[3]}},
              "addressType": "IPv4", "ports": [{"name": rnd.choice(["http", "metrics", "other"]), "port": rnd.choice([3000, 3001])}],
              "endpoints": [{"addresses": [f"127.0.42.{rnd.randrange(1, 250)}"]}]}
        objects[object_key(es)] = es
        return ("MODIFIED" if old is not None else "ADDED"), es
    if not slices:
        return None
    es = copy.deepcopy(objects[rnd.choice(slices)])
    if what == "slice-delete":
        objects.pop(object_key(es))
        return "DELETED", es
    if what == "slice-endpoints":
        es["endpoints"] = [{"addresses": [f"127.0.41.{rnd.randrange(1, 250)}"],
                            "conditions": {"ready": rnd.choice([True, False, None])}} for _ in range(rnd.randrange(3))]
    elif what == "slice-add":
        es.setdefault("endpoints", []).append({"addresses": [f"127.0.43.{rnd.randrange(1, 250)}"], "conditions": {"ready": True}})
    elif what == "slice-relabel":
        es["metadata"].setdefault("labels", {})[SERVICE_LABEL] = rnd.choice(services)[3]
    elif what == "slice-ports":
        es["ports"] = rnd.choice([[], [{"name": "http", "port": 3002}], [{"name": "metrics", "port": 3003}],
                                  [{"port": 3004}]])
    elif what == "slice-fqdn":
        es["addressType"] = rnd.choice(["FQDN", "IPv6", "IPv4"])
        if es["addressType"] == "IPv6":
            es["endpoints"] = [{"addresses": ["::1"]}]
    objects[object_key(es)] = es
    return "MODIFIED", es


def any_change(objects: dict[Any, dict[str, Any]], what: str, rnd: random.Random) -> tuple[str, dict[str, Any]] | None:
    """An EndpointSlice or Service change of this module, or one of test_gateway_inplace's."""
    return slice_change(objects, what, rnd) if what in SLICE_CHANGES else change(objects, what, rnd)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routes=st.integers(3, 10), seed=st.integers(1, 4),
       steps=st.lists(st.tuples(st.sampled_from(SLICE_CHANGES * 3 + CHANGES), st.integers(0, 10**6), st.booleans()),
                      min_size=1, max_size=8))
def test_slice_edits_in_place_render_what_a_full_pass_does(routes: int, seed: int, steps: list[tuple[str, int, bool]]) -> None:
    run(routes, seed, steps, any_change)


def _routes_reading(objects: dict[Any, dict[str, Any]], ns: str, svc: str) -> set[str]:
    """HTTPRoutes with a backendRef or a mirror to Service ns/svc."""
    out = set()
    for k, o in objects.items():
        if k[1] != "HTTPRoute":
            continue
        for rule in o["spec"].get("rules") or []:
            refs = list(rule.get("backendRefs") or []) + [
                (f.get("requestMirror") or {}).get("backendRef") or {} for f in rule.get("filters") or []]
            if any(b.get("name") == svc and (b.get("namespace") or k[2]) == ns for b in refs):
                out.add(k[3])
    return out


async def edited_in_place(c: Any, renderer: Renderer, objects: dict[Any, dict[str, Any]], event: str,
                          raw: dict[str, Any]) -> None:
    """One watch event applied and reconciled, which must stay off the full pass and keep `epoch`
    and the facts object; its status written and the data plane built again."""
    epoch, facts = c.state.epoch, c.state.facts
    if event == "DELETED":
        objects.pop(object_key(raw))
    else:
        objects[object_key(raw)] = raw
    await c.on_event(event, kind_of(raw), copy.deepcopy(raw))
    await c.reconcile()
    assert c.state.full_passes == 1, c.state.last_fallback
    assert c.state.epoch == epoch and c.state.facts is facts
    write_queued(c)
    renderer.build(c.state.analysis, c.state.epoch)


def test_a_slice_edit_rebuilds_only_the_routes_of_its_service() -> None:
    """40 routes: an edit of one route's Service's slice rebuilds that route alone; of the Service
    every twentieth route also sends to (in another namespace), those routes; a new slice, a
    relabelled one and a deleted one likewise. No full pass, no new facts, `epoch` unchanged, and
    nothing else rendered again; the files are those of a full pass."""
    async def go() -> None:
        objects = {object_key(o): o for o in base_cluster(40, 1)}
        c, renderer = await started(objects)
        key = next(k for k in objects if k[1] == "EndpointSlice" and k[3] == "svc-000003-slice")
        shared = next(k for k in objects if k[1] == "EndpointSlice" and k[3] == "shared-auth-slice")

        async def edit(event: str, raw: dict[str, Any], services: list[tuple[str, str]]) -> None:
            await edited_in_place(c, renderer, objects, event, raw)
            reading = set().union(*(_routes_reading(objects, ns, s) for ns, s in services))
            cache = renderer.build_cache
            assert cache.misses == len(reading) and cache.hits == 40 - len(reading), (raw["metadata"]["name"], reading)
            assert renderer.render_cache.hits > renderer.render_cache.misses
            await check(c, renderer)

        es = copy.deepcopy(objects[key])
        es["endpoints"].append({"addresses": ["127.0.43.9"]})
        await edit("MODIFIED", es, [(key[2], "svc-000003")])
        es = copy.deepcopy(objects[shared])
        es["endpoints"] = [{"addresses": ["127.0.43.10"], "conditions": {"ready": False}}]
        await edit("MODIFIED", es, [(shared[2], "shared-auth")])
        extra = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": "svc-000005-b", "namespace": key[2], "labels": {SERVICE_LABEL: "svc-000005"}},
                 "addressType": "IPv4", "ports": [{"name": "http", "port": 3001}], "endpoints": [{"addresses": ["127.0.43.11"]}]}
        ns5 = next(k for k in objects if k[1] == "Service" and k[3] == "svc-000005")[2]
        extra["metadata"]["namespace"] = ns5
        await edit("ADDED", extra, [(ns5, "svc-000005")])
        moved = copy.deepcopy(extra)
        moved["metadata"]["labels"][SERVICE_LABEL] = "svc-000010"
        ns10 = next(k for k in objects if k[1] == "Service" and k[3] == "svc-000010")[2]
        await edit("MODIFIED", moved, [(ns5, "svc-000005")] + ([(ns10, "svc-000010")] if ns10 == ns5 else []))
        await edit("DELETED", copy.deepcopy(objects[key]), [(key[2], "svc-000003")])
        assert c.state.in_place == 5
    asyncio.run(go())


def test_a_mirror_reads_its_services_slices() -> None:
    """A route whose rule mirrors to another route's Service is rebuilt when that Service's
    EndpointSlice changes (its mirror upstream has the endpoints), and only the two routes are."""
    async def go() -> None:
        objects = {object_key(o): o for o in base_cluster(20, 3)}
        route_key = next(k for k in objects if k[1] == "HTTPRoute" and k[3] == "route-000002")
        svc = next(k[3] for k in sorted(objects) if k[1] == "Service" and k[2] == route_key[2]
                   and k[3] not in ("svc-000002", "shared-auth"))  # another route's, in the same namespace
        r = objects[route_key]
        r["spec"]["rules"][1]["filters"] = [{"type": "RequestMirror", "requestMirror": {
            "backendRef": {"group": "", "kind": "Service", "name": svc, "port": 8080}}}]
        c, renderer = await started(objects)
        skey = next(k for k in objects if k[1] == "EndpointSlice" and k[3] == f"{svc}-slice")
        es = copy.deepcopy(objects[skey])
        es["endpoints"] = [{"addresses": ["127.0.43.12"]}, {"addresses": ["127.0.43.13"]}]
        objects[skey] = es
        await c.on_event("MODIFIED", kind_of(es), copy.deepcopy(es))
        await c.reconcile()
        assert c.state.full_passes == 1, c.state.last_fallback
        write_queued(c)
        _, files = renderer.build(c.state.analysis, c.state.epoch)
        reading = _routes_reading(objects, skey[2], svc)
        assert "route-000002" in reading and len(reading) == 2
        assert renderer.build_cache.misses == len(reading)
        assert b"127.0.43.13" in files["upstreams.conf"]
        await check(c, renderer)
    asyncio.run(go())


def test_a_service_edit_rebuilds_only_the_routes_naming_it() -> None:
    """A Service's ports changed, its labels changed, a Service nothing names created and
    changed, a Service a route names but that did not exist created, then deleted: in place, `epoch` and the facts object kept, only the
    routes naming the Service rebuilt; files and status those of a full pass after each."""
    async def go() -> None:
        objects = {object_key(o): o for o in base_cluster(40, 2)}
        route = next(o for k, o in objects.items() if k[1] == "HTTPRoute" and k[3] == "route-000007")
        route["spec"]["rules"][0]["backendRefs"].append({"group": "", "kind": "Service", "name": "later", "port": 8080})
        c, renderer = await started(objects)
        ns = route["metadata"]["namespace"]

        async def edit(event: str, raw: dict[str, Any], rebuilt: int) -> None:
            await edited_in_place(c, renderer, objects, event, raw)
            assert (renderer.build_cache.misses, renderer.build_cache.hits) == (rebuilt, 40 - rebuilt), raw["metadata"]["name"]
            await check(c, renderer)

        key = next(k for k in objects if k[1] == "Service" and k[3] == "svc-000003")
        svc = copy.deepcopy(objects[key])
        svc["spec"]["ports"] = [{"name": "http", "port": 9999}]  # route-000003's backends: no port 8080 now
        await edit("MODIFIED", svc, 1)
        assert "has no port 8080" in str(c.desired(key_ref(("gateway.networking.k8s.io", "HTTPRoute", key[2], "route-000003"))))
        svc = copy.deepcopy(objects[next(k for k in objects if k[1] == "Service" and k[3] == "svc-000004")])
        svc["metadata"]["labels"] = {"tier": "web"}  # read by route-000004: a new object, so rebuilt (by identity)
        await edit("MODIFIED", svc, 1)
        unread = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "unread", "namespace": ns},
                  "spec": {"ports": [{"name": "http", "port": 8080}]}}
        await edit("ADDED", unread, 0)
        unread = copy.deepcopy(unread)
        unread["spec"]["ports"][0]["port"] = 8081
        await edit("MODIFIED", unread, 0)
        later = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "later", "namespace": ns},
                 "spec": {"ports": [{"name": "http", "port": 8080}]}}
        await edit("ADDED", later, 1)
        await edit("DELETED", copy.deepcopy(later), 1)
        assert c.state.in_place == 6
    asyncio.run(go())
