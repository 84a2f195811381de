"""What the gateway derives from the cluster's objects, kept up to date in place.

A full pass is: index the objects, compute the status facts (`status.gateway_facts`), turn the
objects into the data plane's view of them (`status.dataplane_objects`: our Gateways keep only the
listeners status accepts, routes only the parentRefs it accepts) and analyse that view. A change of
one object is applied in place instead where that gives the same result:

- a policy: the facts do not read policies and the view passes them through, so the change goes to
  the engine as it is (`incremental.apply_change`);
- a route (HTTPRoute, TLSRoute): its own facts are computed again (nothing else's facts read a route, except the
  `attachedRoutes` counts of the listeners it was or is attached to), and its new view goes to
  `apply_change`;
- an EndpointSlice: nothing status says reads one and the view passes it through, so it goes to
  `apply_change` (which puts it in the analysis' index) and into our index, and nothing else is
  recomputed; `epoch` stays, since the data plane's BuildCache finds the routes that read its
  Service by itself;
- a Service: `apply_change`, our index, and the facts of the routes that name it (the only facts
  that read a Service; the view does not change); `epoch` stays, as for an EndpointSlice;
- any other kind goes to `apply_change` too; when the engine takes it in place, the facts are
  computed again from a fresh index and every Gateway and route whose view changed goes to
  `apply_change` as well.

Whenever `apply_change` answers None (only a full analysis can say), the next `refresh` runs the
full pass. Property tests (tests/test_gateway_inplace.py) hold that the result renders the same
files and the same status as the full pass.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, Mapping

from gwpolicy.analysis import Analysis, analyse
from gwpolicy.grants import ReferenceGrants
from gwpolicy.incremental import apply_change, prepare, replace_object
from gwpolicy.kinds import split_api_version
from gwpolicy.model import ObjectIndex, build_index
from gwpolicy.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.gateway.status import ROUTE_KINDS, Facts, _route, dataplane_objects, gateway_facts, route_objects

Key = tuple[str, str, str, str]


def object_key(raw: dict[str, Any]) -> Key:
    group, _ = split_api_version(raw.get("apiVersion", ""))
    meta = raw.get("metadata") or {}
    return (group, raw.get("kind", ""), meta.get("namespace") or "", meta.get("name") or "")


def key_ref(key: Key) -> Ref:
    return Ref(key[0], key[1], key[2] or None, key[3])


_VIEWED = ("Gateway", *ROUTE_KINDS)  # the kinds dataplane_objects may change


def _names_service(route: Any, svc: Ref) -> bool:
    """Does a route's backendRef or RequestMirror name this Service (as status resolves them)?"""
    spec = route.spec if isinstance(route.spec, dict) else {}
    for rule in spec.get("rules") or []:
        if not isinstance(rule, dict):
            continue
        refs = [b for b in rule.get("backendRefs") or [] if isinstance(b, dict)]
        refs += [(f.get("requestMirror") or {}).get("backendRef") for f in rule.get("filters") or []
                 if isinstance(f, dict) and f.get("type") == "RequestMirror" and isinstance(f.get("requestMirror"), dict)]
        for b in refs:
            if (isinstance(b, dict) and str(b.get("name", "")) == svc.name
                    and (b.get("namespace") or route.namespace or "") == (svc.namespace or "")):
                return True
    return False
ENDPOINT_SLICE = ("discovery.k8s.io", "EndpointSlice")


class GatewayState:
    """The objects (`objects`, shared with the controller, which fills it), the index and facts
    status is computed from, and the analysis of the data plane's view; `changed` records a change,
    `refresh` brings everything up to date."""

    def __init__(self, objects: dict[Key, dict[str, Any]], controller: str,
                 kind_checks: Mapping[Any, Callable[[dict[str, Any]], str | None]] | None = None) -> None:
        self.objects = objects
        self.controller = controller
        self.kind_checks = kind_checks
        self.index: ObjectIndex | None = None
        self.grants: ReferenceGrants | None = None
        self.facts: Facts | None = None
        self.analysis: Analysis | None = None
        self.views: dict[Ref, dict[str, Any]] = {}  # Gateway/route -> the copy the analysis holds
        self.pending: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        self.stale = True
        self.full_passes = 0
        self.in_place = 0  # changes applied in place
        #: bumped whenever something other than a policy, a route or an EndpointSlice changed: the
        #: data plane's caches (dataplane.BuildCache, render.RenderCache) key on routes, policies,
        #: paths, Services and EndpointSlices only
        self.epoch = 0
        self.last_fallback: str | None = None  # the change that needed the full pass, for the log

    # ---------- changes ----------
    def changed(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """An object created (`old` None), changed or deleted (`new` None)."""
        if self.stale:
            return
        raw = old if old is not None else new
        if raw is None:
            return
        self.pending.append((raw, new))

    def invalidate(self) -> None:
        self.stale = True
        self.pending.clear()

    def refresh(self) -> set[Ref] | None:
        """Everything up to date; the objects whose status may have changed, or None after a full
        pass (then every object of ours must be looked at)."""
        if self.stale or self.analysis is None:
            self._full()
            return None
        changes, self.pending = self.pending, []
        touched: set[Ref] = set()
        for raw, new in changes:
            got = self._apply(raw, new)
            if got is None:
                self.last_fallback = f"{raw.get('kind')} {object_key(raw)[2]}/{object_key(raw)[3]}"
                self._full()
                return None
            self.in_place += 1
            touched |= got
        return touched

    # ---------- the full pass ----------
    def _full(self) -> None:
        self.pending.clear()
        self.analysis = None  # let the previous one go before the next is built
        was = gc.isenabled()
        gc.disable()  # an analysis allocates millions of objects and makes no cycles worth a collection
        try:
            raws = self._index_objects()
            view = dataplane_objects(raws, self.facts)
            self.views = {}
            for raw in view:
                if raw.get("kind") in _VIEWED:
                    self.views[key_ref(object_key(raw))] = raw
            # indexed by target and path as it is made: the data plane and the in-place updates read that
            self.analysis = analyse(view, controller=self.controller, kind_checks=self.kind_checks, by_target=True)
            prepare(self.analysis)
        finally:
            if was:
                gc.enable()
        self.stale = False
        self.full_passes += 1
        self.epoch += 1

    def _mirrors(self) -> bool:
        """Does any route of ours have a RequestMirror filter?"""
        assert self.facts is not None
        return any(isinstance(f, dict) and f.get("type") == "RequestMirror"
                   for rf in self.facts.routes.values() for rule in (rf.obj.spec or {}).get("rules") or []
                   if isinstance(rule, dict) for f in rule.get("filters") or [])

    # ---------- one change in place ----------
    def _apply(self, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
        a, index, facts = self.analysis, self.index, self.facts
        assert a is not None and index is not None and facts is not None
        key = object_key(raw)
        ref = key_ref(key)
        if (ref.group, ref.kind) in a.kinds:  # a policy: facts and view are untouched by it
            if ref.kind == "BackendTLSPolicy" and self._mirrors():
                return None  # except a route's mirror facts (a mirror to a TLS Service is not sent): rare, do it all
            got = apply_change(a, raw, new)
            if got is not None:
                replace_object(index, ref, new)
            return got
        if ref.group == GATEWAY_GROUP and ref.kind in ROUTE_KINDS:
            return self._route(ref, raw, new)
        if (ref.group, ref.kind) == ENDPOINT_SLICE:
            return self._endpoint_slice(ref, raw, new)
        if (ref.group, ref.kind) == (CORE_GROUP, "Service"):
            return self._service(ref, raw, new)
        if ref.group == GATEWAY_GROUP and ref.kind in _VIEWED:  # a Gateway: its view needs the new facts
            self._rebuild_facts()
            old_view = self.views.get(ref, raw)
            got = apply_change(a, old_view, self._set_view(ref, new))
            if got is None:
                return None
            return self._rediff(got | {ref})
        got = apply_change(a, raw, new)
        if got is None:
            return None
        self._rebuild_facts()
        return self._rediff(got)

    def _route(self, ref: Ref, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
        a, index, facts = self.analysis, self.index, self.facts
        assert a is not None and index is not None and facts is not None and self.grants is not None
        replace_object(index, ref, new)
        before = facts.routes.get(ref)
        obj = index.by_ref.get(ref)
        rf = _route(obj, facts, index, self.grants) if obj is not None else None
        if rf is None:
            facts.routes.pop(ref, None)
        elif before is not None:
            facts.routes[ref] = rf  # keeps its place
        else:  # the order gateway_facts gives (the index's)
            facts.routes[ref] = rf
            facts.routes = {o.ref: facts.routes[o.ref] for o in route_objects(index) if o.ref in facts.routes}
        gateways = {p.gateway for p in (before.parents if before else [])} | {p.gateway for p in (rf.parents if rf else [])}
        for g in gateways:
            gf = facts.gateways.get(g)
            if gf is not None:
                for lf in gf.listeners.values():
                    lf.attached_routes = len(facts.attached(g, lf.name))
        old_view = self.views.get(ref, raw)
        got = apply_change(a, old_view, self._set_view(ref, new))
        if got is None:
            return None
        backends = {b.ref for f in (before, rf) if f is not None for b in f.backends if b.ref is not None}
        return got | {ref} | gateways | backends  # the policies on its backends may reach other Gateways now

    def _endpoint_slice(self, ref: Ref, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
        """An EndpointSlice (pods coming and going: the change a gateway sees most). The facts
        (status.gateway_facts) read none and the view passes it as it is, so the engine's index and
        ours take the new copy and nothing is computed again; no status changes (a Service without
        ready endpoints is answered 500, ResolvedRefs stays True)."""
        got = apply_change(self.analysis, raw, new)  # type: ignore[arg-type]
        if got is None:
            return None
        replace_object(self.index, ref, new)  # type: ignore[arg-type]
        return got

    def _service(self, ref: Ref, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
        """A Service: the engine derives the paths of the routes that name it again; of the facts
        only those routes' read it (their backends resolve to it, or to none of its ports), and
        the view does not depend on them (a route's accepted parentRefs do not). So only those
        routes' facts are computed again; the data plane's BuildCache rebuilds the routes that
        read the Service by itself."""
        facts, index = self.facts, self.index
        assert facts is not None and index is not None and self.grants is not None
        got = apply_change(self.analysis, raw, new)  # type: ignore[arg-type]
        if got is None:
            return None
        replace_object(index, ref, new)
        routes = [r for r, rf in facts.routes.items() if _names_service(rf.obj, ref)]
        for r in routes:
            obj = index.by_ref.get(r)
            rf = _route(obj, facts, index, self.grants) if obj is not None else None
            if rf is None:  # cannot be: a route's parents do not read a Service; but never keep stale facts
                return None
            facts.routes[r] = rf
        return got | set(routes) | {ref}

    def _set_view(self, ref: Ref, new: dict[str, Any] | None) -> dict[str, Any] | None:
        """The data plane's view of a Gateway or route's new copy (None: deleted), recorded as the
        copy the analysis holds. When the engine then declines it, the full pass that follows
        starts the views afresh."""
        view = dataplane_objects([new], self.facts)[0] if new is not None else None
        if view is None:
            self.views.pop(ref, None)
        else:
            self.views[ref] = view
        return view

    def _rebuild_facts(self) -> None:
        self.epoch += 1
        self._index_objects()

    def _index_objects(self) -> list[dict[str, Any]]:
        """Index, grants and facts made afresh from the objects as they are; the objects, listed."""
        raws = list(self.objects.values())
        self.index = build_index(raws)
        self.grants = ReferenceGrants(self.index)
        self.facts = gateway_facts(self.index, self.controller, self.grants)
        return raws

    def _rediff(self, touched: set[Ref]) -> set[Ref] | None:
        """After a change of another kind that the engine took in place (facts computed again):
        every Gateway and route whose view changed is applied too."""
        a = self.analysis
        assert a is not None and self.facts is not None
        raws = [r for r in self.objects.values() if r.get("kind") in _VIEWED]
        out = set(touched)
        seen: set[Ref] = set()
        for raw in dataplane_objects(raws, self.facts):
            ref = key_ref(object_key(raw))
            seen.add(ref)
            before = self.views.get(ref)
            if before is raw or before == raw:
                self.views[ref] = raw
                continue
            got = apply_change(a, before if before is not None else raw, raw)
            if got is None:
                return None
            self.views[ref] = raw
            out |= got | {ref}
        for ref in [r for r in self.views if r not in seen]:
            got = apply_change(a, self.views.pop(ref), None)
            if got is None:
                return None
            out |= got | {ref}
        return out
