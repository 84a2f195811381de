"""A route whose entries of ours already say what they should is found so without building them
(`route_breadcrumbs_hold`): whenever it says so, `breadcrumbs` gives the route's status and
annotations exactly as they are; and it does say so of a route carrying the breadcrumbs
`breadcrumbs` wrote, so a full analysis of routes that carry our status builds none of them."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwpolicy.analysis import analyse
from gwpolicy.model import Obj
from gwpolicy.refs import GATEWAY_GROUP, Ref
from gwpolicy.status import ANNOTATION, MAX_PARENTS, breadcrumbs, route_breadcrumbs_hold
from gwpolicy.topology import Topology
from helpers import interpreted

ME, OTHER = "gwpolicy.io/policy-controller", "example.com/other"
NOW, LATER = "2026-01-01T00:00:00Z", "2026-02-02T00:00:00Z"
_REFS = st.fixed_dictionaries({"name": st.sampled_from(["gw0", "gw1"])},
                              optional={"sectionName": st.sampled_from(["http", "https"]), "namespace": st.just("a"),
                                        "group": st.just(GATEWAY_GROUP), "port": st.sampled_from([80, 443])})
_KINDS = st.lists(st.sampled_from(["RetryPolicy", "TimeoutPolicy", "TLSPolicy", "HeaderPolicy", "AuthPolicy",
                                   "CorsPolicy", "RateLimitPolicy", "WafPolicy", "CachePolicy", "LogPolicy"]),
                  max_size=10)
_FOREIGN = st.fixed_dictionaries({"parentRef": _REFS, "controllerName": st.just(OTHER),
                                  "conditions": st.just([{"type": "Accepted", "status": "True"}])})


def _route(status: dict | None, generation: int | None, annotations: dict | None) -> Obj:
    meta: dict = {"name": "r", "namespace": "a"}
    if generation is not None:
        meta["generation"] = generation
    if annotations is not None:
        meta["annotations"] = annotations
    raw = {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "HTTPRoute", "metadata": meta, "spec": {}}
    if status is not None:
        raw["status"] = status
    return Obj(raw, Ref(GATEWAY_GROUP, "HTTPRoute", "a", "r"), "v1", "test")


def _topology(parent_refs: list[dict]) -> Topology:
    topo = Topology()
    topo.route_parents[Ref(GATEWAY_GROUP, "HTTPRoute", "a", "r")] = parent_refs
    return topo


def _mutations(draw, status: dict, kinds: list[str], meta: dict) -> tuple[list[str], int | None | str]:
    """Apply a few random changes to a route's written status (and to what it should carry)."""
    parents = status.setdefault("parents", [])
    generation_change: int | None | str = "same"
    for what in draw(st.lists(st.sampled_from(range(16)), max_size=2)):
        ours = [p for p in parents if isinstance(p, dict) and p.get("controllerName") == ME]
        conds = [c for p in ours for c in p.get("conditions", []) if isinstance(c, dict)]
        if what == 0 and conds:
            c = draw(st.sampled_from(conds))
            c.pop(draw(st.sampled_from(sorted(c))))
        elif what == 1 and conds:
            draw(st.sampled_from(conds))["message"] = "old words"
        elif what == 2 and conds:
            draw(st.sampled_from(conds))["status"] = "False"
        elif what == 3 and conds:
            draw(st.sampled_from(conds))["extra"] = 1
        elif what == 4 and ours:
            parents.append(copy.deepcopy(draw(st.sampled_from(ours))))  # ours twice for one parent
        elif what == 5:
            parents.insert(draw(st.integers(0, len(parents))), "junk")
        elif what == 6:
            parents.insert(draw(st.integers(0, len(parents))), draw(_FOREIGN))
        elif what == 7:
            generation_change = draw(st.one_of(st.none(), st.integers(1, 3)))
        elif what == 8:
            meta.setdefault("annotations", {})[ANNOTATION] = "true"
        elif what == 9 and conds:
            draw(st.sampled_from(conds))["lastTransitionTime"] = ""
        elif what == 10 and ours:
            draw(st.sampled_from(ours))["parentRef"]["port"] = 8080
        elif what == 11 and ours:
            parents.remove(draw(st.sampled_from(ours)))
        elif what == 12:
            kinds = draw(_KINDS)
        elif what == 13:
            parents.extend({"parentRef": {"name": f"other-{i}"}, "controllerName": OTHER, "conditions": []}
                           for i in range(MAX_PARENTS))
        elif what == 14 and ours:
            draw(st.sampled_from(ours))["parentRef"]["kind"] = "Gateway"  # the same parent, spelled otherwise
        elif what == 15 and ours:
            draw(st.sampled_from(ours))["extra"] = 1
    return kinds, generation_change


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.lists(_FOREIGN, max_size=3), st.lists(_REFS, min_size=1, max_size=4), _KINDS,
       st.one_of(st.none(), st.integers(1, 3)))
def test_hold_only_when_breadcrumbs_change_nothing(data, foreign, parent_refs, kinds, generation) -> None:
    # what `breadcrumbs` writes on a route that carries only other writers' entries, as it comes back
    first = _route({"parents": foreign}, generation, None)
    written, annotations = breadcrumbs(first, kinds, _topology(parent_refs), ME, NOW)
    status = orjson.loads(orjson.dumps(written))
    meta = {"annotations": dict(annotations)} if annotations else {}
    kinds, generation_change = _mutations(data.draw, status, list(kinds), meta)
    if generation_change != "same":
        generation = generation_change  # type: ignore[assignment]
    route = _route(status, generation, meta.get("annotations"))
    topo = _topology(parent_refs)
    if route_breadcrumbs_hold(route, kinds, topo, ME):
        again = breadcrumbs(route, kinds, topo, ME, LATER)
        assert again == (route.raw["status"], dict(route.raw["metadata"].get("annotations") or {}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_FOREIGN, max_size=3), st.lists(_REFS, min_size=1, max_size=4), _KINDS.filter(bool),
       st.one_of(st.none(), st.integers(1, 3)))
def test_hold_on_what_breadcrumbs_wrote(foreign, parent_refs, kinds, generation) -> None:
    first = _route({"parents": foreign}, generation, None)
    topo = _topology(parent_refs)
    written, annotations = breadcrumbs(first, kinds, topo, ME, NOW)
    route = _route(orjson.loads(orjson.dumps(written)), generation, annotations or None)
    assert route_breadcrumbs_hold(route, kinds, topo, ME)
    assert not route_breadcrumbs_hold(route, kinds, topo, OTHER)  # another controller's view: not ours


def _statused(objects: list[dict]) -> tuple[list[dict], set[str]]:
    """The objects after our first complete status, then four routes changed by hand or by others
    (their names), and one given another writer's entry, which changes nothing of ours."""
    a = analyse(objects, now=NOW)
    by_ref = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    for ch in a.status_changes():
        raw = by_ref[(ch.object.kind, ch.object.namespace, ch.object.name)]
        raw["status"] = orjson.loads(orjson.dumps(ch.status))
        raw["metadata"]["annotations"] = dict(ch.annotations)
    routes = [o for o in objects if o["kind"] == "HTTPRoute" and (o.get("status") or {}).get("parents")]
    assert len(routes) >= 5
    routes[0]["metadata"]["generation"] = 7
    routes[1]["status"]["parents"][0]["conditions"][0]["message"] = "edited"
    del routes[2]["status"]["parents"][-1]["conditions"][0]["lastTransitionTime"]
    routes[3]["metadata"]["annotations"][ANNOTATION] = "true"
    routes[4]["status"]["parents"].insert(0, {"parentRef": {"name": "x"}, "controllerName": OTHER, "conditions": []})
    return objects, {r["metadata"]["name"] for r in routes[:4]}


def test_full_analysis_of_statused_routes_is_what_building_every_breadcrumb_gives(monkeypatch) -> None:
    from gwpolicy.bench.generate import cluster

    objects, changed = _statused(orjson.loads(orjson.dumps(list(cluster(60)))))
    fast = analyse(copy.deepcopy(objects), now=LATER).status_changes()
    plain = interpreted("gwpolicy.analysis")  # the shortcut patched where it is called, compiled or not
    asked: list[Any] = []
    monkeypatch.setattr(plain, "route_breadcrumbs_hold", lambda *args: asked.append(args) or False)
    built = plain.analyse(copy.deepcopy(objects), now=LATER).status_changes()
    assert asked  # the shortcut was asked, and said no: every breadcrumb was built
    assert [dataclasses.astuple(c) for c in fast] == [dataclasses.astuple(c) for c in built]  # the copy's own class
    assert {ch.object.name for ch in fast if ch.object.kind == "HTTPRoute"} == changed


def _ours(status: dict) -> list[dict]:
    return [p for p in status["parents"] if isinstance(p, dict) and p.get("controllerName") == ME]


_EDITS = {
    "a condition's key gone": lambda s, m: _ours(s)[0]["conditions"][1].pop("reason"),
    "a message changed": lambda s, m: _ours(s)[1]["conditions"][0].update(message="old words"),
    "a condition False": lambda s, m: _ours(s)[0]["conditions"][0].update(status="False"),
    "a condition with a key more": lambda s, m: _ours(s)[0]["conditions"][0].update(extra=1),
    "no transition time": lambda s, m: _ours(s)[0]["conditions"][0].update(lastTransitionTime=""),
    "ours twice for a parent": lambda s, m: s["parents"].append(copy.deepcopy(_ours(s)[0])),
    "an entry that is no object": lambda s, m: s["parents"].insert(1, "junk"),
    "our entry with a key more": lambda s, m: _ours(s)[1].update(extra=1),
    "the parentRef spelled otherwise": lambda s, m: _ours(s)[0]["parentRef"].update(kind="Gateway"),
    "an entry of ours gone": lambda s, m: s["parents"].remove(_ours(s)[1]),
    "ours for a parent no longer named": lambda s, m: s["parents"].append(
        dict(copy.deepcopy(_ours(s)[0]), parentRef={"name": "gw9"})),
    "our annotation": lambda s, m: m.update(annotations={ANNOTATION: "true"}),
    "a condition gone": lambda s, m: _ours(s)[0]["conditions"].pop(),
    "another writer's entry": lambda s, m: s["parents"].insert(0, {"parentRef": {"name": "x"}, "controllerName": OTHER}),
}


def test_each_edit_of_a_written_breadcrumb_is_found_as_building_finds_it() -> None:
    parent_refs = [{"name": "gw0", "sectionName": "http"}, {"name": "gw1", "namespace": "a"}]
    kinds = ["RetryPolicy", "TimeoutPolicy"]
    topo = _topology(parent_refs)
    written, _ = breadcrumbs(_route({"parents": []}, 2, None), kinds, topo, ME, NOW)
    for name, edit in _EDITS.items():
        status, meta = orjson.loads(orjson.dumps(written)), {}
        edit(status, meta)
        route = _route(status, 2, meta.get("annotations"))
        unchanged = breadcrumbs(route, kinds, topo, ME, LATER) == (status, dict(meta.get("annotations") or {}))
        assert route_breadcrumbs_hold(route, kinds, topo, ME) == unchanged, name
        assert unchanged == (name == "another writer's entry"), name
    assert not route_breadcrumbs_hold(_route(orjson.loads(orjson.dumps(written)), 3, None), kinds, topo, ME)
