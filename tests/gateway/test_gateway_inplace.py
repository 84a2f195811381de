"""The gateway's in-place path gives what a full pass gives: after any sequence of changes (routes,
policies, Services, EndpointSlices, Gateways; one at a time or in bursts), the gateway that applied
them in place (gateway/state.py, the data plane's and the renderer's caches) renders the same
files, wants the same status for every object, and has queued every write that status needs, as a
gateway that analyses everything afresh. No processes: the controller's reconcile without NGINX.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import random
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_kit import TEST_ENDPOINTS
from gwpolicy.bench.gateway import _cert, gateway_cluster
from gwpolicy.bench.gateway_policies import gateway_policies, policy_kinds
from gwpolicy.controller.kube import Kind
from gwpolicy.gateway.controller import GatewayController, GatewayOptions, Renderer
from gwpolicy.gateway.state import key_ref, object_key
from gwpolicy.kinds import split_api_version
from gwpolicy.refs import Ref

OURS = "gwpolicy.io/gateway-controller"
OPTS = GatewayOptions(controller_name=OURS, address_pool="127.0.40.0/24", port_offset=20000, **TEST_ENDPOINTS)
CHANGES = ["route-backend", "route-hostname", "route-path", "route-parent", "route-delete", "route-new",
           "policy-value", "policy-delete", "policy-new", "policy-retarget", "service-port", "slice", "gateway",
           "tls-backend", "tls-hostname", "tls-parent", "tls-delete", "tls-new",
           "gateway-listener-add", "gateway-listener-remove", "gateway-allowed", "namespace-labels"]


@functools.lru_cache(maxsize=1)
def certificate() -> tuple[bytes, bytes]:
    """The HTTPS listeners' certificate (made once; without it those listeners are not served)."""
    return _cert(Path(tempfile.mkdtemp(prefix="gwinc-cert-")))


def base_cluster(routes: int, seed: int) -> list[dict[str, Any]]:
    objs = list(gateway_cluster(routes, certificate(), seed=seed))
    objs += policy_kinds() + gateway_policies(objs)
    for o in list(objs):
        if o["kind"] == "GatewayClass":
            o["spec"]["controllerName"] = OURS  # both classes ours: every Gateway is served
        if o["kind"] == "BackendTLSPolicy" and seed % 2 == 0:  # a CA bundle of its own: a file in the tree
            ns = o["metadata"]["namespace"]
            o["spec"]["validation"] = {"hostname": "auth.example.com",
                                       "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "auth-ca"}]}
            objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "auth-ca", "namespace": ns},
                         "data": {"ca.crt": certificate()[0].decode()}})
    # TLS passthrough: a listener on every Gateway and a TLSRoute for the first Services
    for o in objs:
        if o["kind"] == "Gateway":
            https = next(l for l in o["spec"]["listeners"] if l["protocol"] == "HTTPS")
            o["spec"]["listeners"] += [  # TLS passthrough, and HTTPS behind it on the same port
                {"name": "tls", "port": 9443, "protocol": "TLS", "hostname": "*.example.com",
                 "tls": {"mode": "Passthrough"}, "allowedRoutes": {"namespaces": {"from": "All"}}},
                dict(copy.deepcopy(https), name="https-9443", port=9443, hostname="route-000001.example.com")]
    services = [o for o in objs if o["kind"] == "Service"][:2]
    for i, svc in enumerate(services):
        objs.append({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
                     "metadata": {"name": f"tls-{i}", "namespace": svc["metadata"]["namespace"], "generation": 1,
                                  "creationTimestamp": f"2025-02-0{i + 1}T00:00:00Z"},
                     "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw-000",
                                              "namespace": "infra", "sectionName": "tls"}],
                              "hostnames": [f"tls{i}.example.com"],
                              "rules": [{"backendRefs": [{"group": "", "kind": "Service", "name": svc["metadata"]["name"],
                                                          "port": 8080, "weight": 1}]}]}})
    return objs


def kind_of(raw: dict[str, Any]) -> Kind:
    group, version = split_api_version(raw.get("apiVersion", ""))
    k = raw["kind"]
    return Kind(group, version, k, k.lower() + "s", bool((raw.get("metadata") or {}).get("namespace")))


def bump(raw: dict[str, Any]) -> None:
    raw["metadata"]["generation"] = raw["metadata"].get("generation", 1) + 1


def change(objects: dict[Any, dict[str, Any]], what: str, rnd: random.Random) -> tuple[str, dict[str, Any]] | None:
    """One edit of the cluster (in `objects`): the watch event it makes, or None when it has nothing to edit."""
    def pick(kind: str, pred: Any = lambda o: True) -> dict[str, Any] | None:
        got = sorted((k for k, o in objects.items() if k[1] == kind and pred(o)))
        return copy.deepcopy(objects[rnd.choice(got)]) if got else None

    services = sorted(k for k in objects if k[1] == "Service")
    ours = ("TimeoutPolicy", "RetryPolicy", "ClientSettingsPolicy", "UpstreamSettingsPolicy", "RateLimitPolicy")
    if what.startswith("route-"):
        r = pick("HTTPRoute")
        if r is None:
            return None
        rules = r["spec"]["rules"]
        if what == "route-backend":
            svc = rnd.choice(services)
            rule = rnd.choice(rules)
            rule["backendRefs"] = [{"group": "", "kind": "Service", "name": rnd.choice([svc[3], "missing"]),
                                    "namespace": svc[2], "port": rnd.choice([8080, 9090, 1234]), "weight": 1}]
        elif what == "route-hostname":
            r["spec"]["hostnames"] = rnd.choice([[], ["shared.example.com"], [f"x{rnd.randrange(3)}.example.com"],
                                                 r["spec"].get("hostnames", []) + ["more.example.com"]])
        elif what == "route-path":
            rule = rnd.choice(rules)
            rule["matches"] = [{"path": {"type": rnd.choice(["PathPrefix", "Exact"]), "value": rnd.choice(["/", "/api", "/v2"])}}]
        elif what == "route-parent":
            p = rnd.choice(r["spec"]["parentRefs"])
            p["sectionName"] = rnd.choice(["http", "https", "api", "nope"])
        elif what == "route-delete":
            objects.pop(object_key(r))
            return "DELETED", r
        elif what == "route-new":
            r["metadata"]["name"] += f"-copy{rnd.randrange(100)}"
            r["metadata"]["creationTimestamp"] = "2025-03-01T00:00:00Z"
            r["spec"]["hostnames"] = [f"{r['metadata']['name']}.example.com"]
        bump(r)
    elif what.startswith("policy-"):
        p = pick(rnd.choice(ours), lambda o: o["apiVersion"].startswith("gwpolicy.io/"))
        if p is None:
            return None
        if what == "policy-value":
            p["spec"][rnd.choice(["default", "override"])] = rnd.choice(
                [{"readTimeout": "1s"}, {"connectionTimeout": 3}, {"attempts": 4}, {"requests": 5, "burst": 1},
                 {"body": {"maxSize": "1m"}}, {}])
        elif what == "policy-delete":
            objects.pop(object_key(p))
            return "DELETED", p
        elif what == "policy-new":
            target = pick(rnd.choice(["HTTPRoute", "Service", "Gateway"]))
            if target is None:
                return None
            p["metadata"]["name"] = f"new-{rnd.randrange(1000)}"
            p["metadata"]["namespace"] = target["metadata"]["namespace"]
            p["metadata"]["creationTimestamp"] = "2025-03-01T00:00:00Z"
            group = "" if target["kind"] == "Service" else "gateway.networking.k8s.io"
            p["spec"]["targetRef"] = {"group": group, "kind": target["kind"], "name": target["metadata"]["name"]}
        elif what == "policy-retarget":
            t = p["spec"]["targetRef"]
            same = [k for k in objects if k[1] == t["kind"] and k[2] == p["metadata"]["namespace"]]
            if not same:
                return None
            t["name"] = rnd.choice(same)[3]
        bump(p)
        return "MODIFIED", p
    elif what.startswith("tls-"):
        r = pick("TLSRoute")
        if r is None:
            return None
        if what == "tls-backend":
            svc = rnd.choice(services)
            r["spec"]["rules"][0]["backendRefs"] = [{"group": "", "kind": "Service", "name": rnd.choice([svc[3], "missing"]),
                                                     "namespace": svc[2], "port": rnd.choice([8080, 1234]), "weight": 1}]
        elif what == "tls-hostname":
            r["spec"]["hostnames"] = rnd.choice([["shared.example.com"], ["*.example.com"], ["other.test"],
                                                 [f"tls{rnd.randrange(3)}.example.com"]])
        elif what == "tls-parent":
            r["spec"]["parentRefs"][0]["sectionName"] = rnd.choice(["tls", "http", "nope"])
            r["spec"]["parentRefs"][0]["name"] = rnd.choice(["gw-000", "gw-001"])
        elif what == "tls-delete":
            objects.pop(object_key(r))
            return "DELETED", r
        elif what == "tls-new":
            r["metadata"]["name"] += f"-copy{rnd.randrange(100)}"
            r["metadata"]["creationTimestamp"] = "2025-03-01T00:00:00Z"
        bump(r)
    elif what == "service-port":
        s = pick("Service")
        s["spec"]["ports"][0]["port"] = rnd.choice([8080, 8081])
        r = s
    elif what == "slice":
        r = pick("EndpointSlice")
        if r is None:
            return None
        r["endpoints"] = [{"addresses": [f"127.0.41.{rnd.randrange(1, 250)}"], "conditions": {"ready": rnd.random() < 0.8}}]
    elif what == "gateway":
        r = pick("Gateway")
        l = rnd.choice(r["spec"]["listeners"])
        l["hostname"] = rnd.choice(["*.example.com", "route-000001.example.com", None])
        if l["hostname"] is None:
            del l["hostname"]
        bump(r)
    elif what == "gateway-listener-add":  # one listener more: a new port, or a hostname beside an existing one
        r = pick("Gateway")
        name = f"extra{rnd.randrange(3)}"
        if any(l["name"] == name for l in r["spec"]["listeners"]):
            return None
        r["spec"]["listeners"].append({"name": name, "port": rnd.choice([80, 8081]), "protocol": "HTTP",
                                       "hostname": rnd.choice(["route-000002.example.com", "*.example.com", "x.test"]),
                                       "allowedRoutes": {"namespaces": {"from": rnd.choice(["All", "Same"])}}})
        bump(r)
    elif what == "gateway-listener-remove":
        r = pick("Gateway")
        if len(r["spec"]["listeners"]) < 2:
            return None
        r["spec"]["listeners"].pop(rnd.randrange(len(r["spec"]["listeners"])))
        bump(r)
    elif what == "gateway-allowed":  # which namespaces a listener admits
        r = pick("Gateway")
        l = rnd.choice(r["spec"]["listeners"])
        l["allowedRoutes"] = rnd.choice([{"namespaces": {"from": "All"}}, {"namespaces": {"from": "Same"}},
                                         {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"tier": "api"}}}},
                                         {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"tier": "web"}}}}])
        bump(r)
    elif what == "namespace-labels":  # moves its routes in or out of Selector listeners
        r = pick("Namespace", lambda o: o["metadata"]["name"] != "infra")
        if r is None:
            return None
        r["metadata"]["labels"] = {"tier": rnd.choice(["api", "web", "none"])}
    else:  # pragma: no cover
        raise AssertionError(what)
    objects[object_key(r)] = r
    return "MODIFIED", r


def without_times(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: without_times(x) for k, x in v.items() if k != "lastTransitionTime"}
    if isinstance(v, list):
        return [without_times(x) for x in v]
    return v


async def loaded(objects: dict[Any, dict[str, Any]]) -> GatewayController:
    c = GatewayController(OPTS)
    for raw in objects.values():
        await c.on_event("ADDED", kind_of(raw), copy.deepcopy(raw))
    return c


async def started(objects: dict[Any, dict[str, Any]]) -> tuple[GatewayController, Renderer]:
    """A controller with the objects loaded, reconciled, built and its status written, and the
    renderer that built it (whose caches the in-place steps after it use)."""
    c = await loaded(objects)
    renderer = Renderer(OPTS)
    await c.reconcile()
    renderer.build(c.state.analysis, c.state.epoch)
    write_queued(c)
    return c, renderer


def write_queued(c: GatewayController) -> None:
    """What the write workers would do: each queued object gets the status it should carry (its
    echo changes status only, which the state does not see)."""
    for ref in list(c.queue):
        key = (ref.group, ref.kind, ref.namespace or "", ref.name)
        want = c.desired(ref)
        if key in c.objects and want is not None:
            c.objects[key] = dict(c.objects[key], status=want)
    c.queue.clear()


async def check(c: GatewayController, renderer: Renderer) -> None:
    full = await loaded(c.objects)
    await full.reconcile()
    assert full.state.full_passes == 1
    _, in_place = renderer.build(c.state.analysis, c.state.epoch)
    _, afresh = Renderer(OPTS).build(full.state.analysis)
    assert in_place.keys() == afresh.keys()
    for name in afresh:
        assert in_place[name] == afresh[name], f"{name} differs"
    refs = set(c.wanted) | set(full.wanted)
    for ref in sorted(refs, key=Ref.sort_key):
        assert without_times(c.desired(ref)) == without_times(full.desired(ref)), ref
    # and every status that differs from what the object carries was queued (and is now written)
    for ref in sorted(full.wanted, key=Ref.sort_key):
        want = full.desired(ref)
        raw = c.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))
        if want is not None and raw is not None:
            assert without_times(raw.get("status") or {}) == without_times(want), f"{ref} was not written"


def run(routes: int, seed: int, steps: list[tuple[str, int, bool]], make: Any = None,
        cluster: Any = None) -> GatewayController:
    """Apply the steps (change, its seed, reconcile right after?) in place and check the end against
    a full pass; `make(objects, what, rnd)` draws a change (`change` by default), on the objects
    `cluster(routes, seed)` gives (`base_cluster` by default)."""
    make = make or change
    cluster = cluster or base_cluster

    async def go() -> GatewayController:
        objects = {object_key(o): o for o in cluster(routes, seed)}
        c, renderer = await started(objects)
        version, files = c.state.dataplane_version, renderer.build(c.state.analysis, c.state.epoch)[1]
        for what, r, now in steps:
            ev = make(objects, what, random.Random(r))
            if ev is not None:
                await c.on_event(ev[0], kind_of(ev[1]), copy.deepcopy(ev[1]))
            if now:
                await c.reconcile()
                _, built = renderer.build(c.state.analysis, c.state.epoch)  # the caches follow every reconcile
                # what lets the controller skip the build: the version kept means the same files
                assert c.state.dataplane_version != version or built == files, what
                version, files = c.state.dataplane_version, built
                write_queued(c)
        await c.reconcile()
        write_queued(c)
        await check(c, renderer)
        return c
    return asyncio.run(go())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routes=st.integers(4, 14), seed=st.integers(1, 5),
       steps=st.lists(st.tuples(st.sampled_from(CHANGES), st.integers(0, 10**6), st.booleans()), min_size=1, max_size=6))
def test_in_place_renders_and_wants_what_a_full_pass_does(routes: int, seed: int, steps: list[tuple[str, int, bool]]) -> None:
    run(routes, seed, steps)


def test_route_and_policy_edits_are_applied_in_place_and_reuse_the_rest() -> None:
    """The two edits platform teams make most stay off the full pass, and rebuild only what they touch."""
    async def go() -> None:
        objects = {object_key(o): o for o in base_cluster(40, 1)}
        c, renderer = await started(objects)
        for what, r in (("route-backend", 3), ("policy-value", 4), ("route-hostname", 5)):
            ev = change(objects, what, random.Random(r))
            assert ev is not None
            await c.on_event(ev[0], kind_of(ev[1]), copy.deepcopy(ev[1]))
            await c.reconcile()
            assert c.state.full_passes == 1, (what, c.state.last_fallback)
            write_queued(c)
            renderer.build(c.state.analysis, c.state.epoch)
            assert renderer.build_cache.misses <= 2 and renderer.build_cache.hits >= 38, what
        assert c.state.in_place == 3
        await check(c, renderer)
    asyncio.run(go())


def test_an_endpoint_change_is_taken_in_place_and_a_class_change_runs_the_full_pass() -> None:
    """An EndpointSlice change (what changes most in a cluster) is not re-analysed: the engine puts
    it in its index in place; a GatewayClass change, which the engine does not take in place, runs
    the full pass. Either way the result is what a full pass gives."""
    async def go() -> None:
        objects = {object_key(o): o for o in base_cluster(6, 2)}
        c = await loaded(objects)
        await c.reconcile()
        write_queued(c)
        ev = change(objects, "slice", random.Random(1))
        assert ev is not None
        await c.on_event(ev[0], kind_of(ev[1]), copy.deepcopy(ev[1]))
        await c.reconcile()
        assert c.state.full_passes == 1, c.state.last_fallback
        write_queued(c)
        await check(c, Renderer(OPTS))
        cls_key = next(k for k in objects if k[1] == "GatewayClass")
        cls = copy.deepcopy(objects[cls_key])
        cls.setdefault("spec", {})["description"] = "changed"
        objects[cls_key] = cls
        await c.on_event("MODIFIED", kind_of(cls), copy.deepcopy(cls))
        await c.reconcile()
        assert c.state.full_passes == 2 and "GatewayClass" in (c.state.last_fallback or "")
        write_queued(c)
        await check(c, Renderer(OPTS))
    asyncio.run(go())


def test_key_ref_round_trips() -> None:
    raw = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "a"}}
    assert key_ref(object_key(raw)) == Ref("gateway.networking.k8s.io", "HTTPRoute", "a", "r")
