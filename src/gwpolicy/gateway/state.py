"""What the gateway derives from the cluster's objects, kept up to date in place.

A full pass is: index the objects, compute the status facts (`facts.gateway_facts`), turn the
objects into the data plane's view of them (`status.dataplane_objects`: our Gateways keep only the
listeners status accepts, routes only the parentRefs it accepts) and analyse that view. A change of
one object is applied in place instead where that gives the same result:

- a policy: the facts do not read policies and the view passes them through, so the change goes to
  the engine as it is (`inplace.apply.apply_change`);
- a route (HTTPRoute, TLSRoute; while there is no GRPCRoute, whose conflict rule with HTTPRoutes
  reads other routes, so that a full pass follows): its own facts are computed again (nothing else's facts read a route, except the
  `attachedRoutes` counts of the listeners it was or is attached to), and its new view goes to
  `apply_change`;
- an EndpointSlice: nothing status says reads one and the view passes it through, so it goes to
  `apply_change` (which puts it in the analysis' index) and into our index, and nothing else is
  recomputed; `epoch` stays, since the data plane's BuildCache finds the routes that read its
  Service by itself;
- a Service: `apply_change`, our index, and the facts of the routes that name it (the only facts
  that read a Service; the view does not change); `epoch` stays, as for an EndpointSlice;
- a Secret or ConfigMap: the engine puts it in its index (it reads neither), and of the facts only
  those of the Gateways that name it (`status.gateway_references`: listener certificates, the
  backend client certificate, frontend CA bundles) are computed again; when that changes which of a
  Gateway's listeners are accepted (the view), the facts of the routes attached to it are computed
  again and the Gateway's and their new views go to `apply_change`. The BackendTLSPolicies naming
  a ConfigMap are touched (their conditions read it); the data plane's BuildCache finds the routes
  whose TLS read it by itself;
- a ReferenceGrant: `apply_change`, then the facts of the routes and Gateways in the namespaces
  its `from` names (before or after) that refer into its namespace, as above;
- a Gateway: the facts are computed again from a fresh index, its new view goes to
  `apply_change`, then every route whose view changed (a route whose view differs only in the
  status we wrote keeps the analysis' copy); `epoch` stays, so the BuildCache rebuilds only the
  routes whose servers, path nodes or policies the edit changed (adding, removing or editing one
  listener rebuilds the routes of that listener);
- a Namespace: as any other kind below, but `epoch` stays, as for a Gateway (its labels change
  which routes Selector listeners admit, i.e. those routes' nodes);
- any other kind goes to `apply_change` too; when the engine takes it in place, the facts are
  computed again from a fresh index and every Gateway and route whose view changed goes to
  `apply_change` as well.

Whenever `apply_change` answers None (only a full analysis can say), the next `refresh` runs the
full pass. Property tests (tests/gateway/test_gateway_inplace.py) hold that the result renders the same
files and the same status as the full pass.
"""

from __future__ import annotations

import gc
from typing import AbstractSet, Any, Callable, Iterator, Mapping

from gwpolicy.engine.analysis import Analysis, analyse
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.inplace.apply import apply_change, prepare
from gwpolicy.engine.inplace.base import replace_object
from gwpolicy.engine.kinds import split_api_version
from gwpolicy.engine.model import ObjectIndex, build_index
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.gateway.backendtls import KIND as BACKEND_TLS
from gwpolicy.gateway.backendtls import ca_configmaps
from gwpolicy.gateway.facts import (
    ROUTE_KINDS,
    Facts,
    GatewayFacts,
    dataplane_objects,
    gateway_fact,
    gateway_facts,
    gateway_references,
    route_fact,
    route_objects,
)

Key = tuple[str, str, str, str]


def object_key(raw: dict[str, Any]) -> Key:
    group, _ = split_api_version(raw.get("apiVersion", ""))
    meta = raw.get("metadata") or {}
    return (group, raw.get("kind", ""), meta.get("namespace") or "", meta.get("name") or "")


def key_ref(key: Key) -> Ref:
    return Ref(key[0], key[1], key[2] or None, key[3])


_VIEWED = ("Gateway", *ROUTE_KINDS)  # the kinds dataplane_objects may change


def _sent_refs(route: Any) -> Iterator[dict[str, Any]]:
    """A route's backendRefs and the backendRefs of its RequestMirror filters, as status resolves them."""
    spec = route.spec if isinstance(route.spec, dict) else {}
    for rule in spec.get("rules") or []:
        if not isinstance(rule, dict):
            continue
        for b in rule.get("backendRefs") or []:
            if isinstance(b, dict):
                yield b
        for f in rule.get("filters") or []:
            if isinstance(f, dict) and f.get("type") == "RequestMirror" and isinstance(f.get("requestMirror"), dict):
                b = f["requestMirror"].get("backendRef")
                if isinstance(b, dict):
                    yield b


def _names_service(route: Any, svc: Ref) -> bool:
    """Does a route's backendRef or RequestMirror name this Service?"""
    return any(str(b.get("name", "")) == svc.name and (b.get("namespace") or route.namespace or "") == (svc.namespace or "")
               for b in _sent_refs(route))


ENDPOINT_SLICE = ("discovery.k8s.io", "EndpointSlice")
REFERENCED = {(CORE_GROUP, "Secret"), (CORE_GROUP, "ConfigMap")}  # read by reference only
GRANT = (GATEWAY_GROUP, "ReferenceGrant")


def _refers_into(route: Any, namespace: str) -> bool:
    """Does a route have a backendRef or RequestMirror to another namespace, this one (what a
    ReferenceGrant there decides)?"""
    if route.namespace == namespace:
        return False
    return any((b.get("namespace") or route.namespace) == namespace for b in _sent_refs(route))


def _grant_from_namespaces(obj: Any) -> set[str]:
    """The namespaces a ReferenceGrant's `from` names (an Obj, or None)."""
    spec = obj.spec if obj is not None and isinstance(obj.spec, dict) else {}
    return {f["namespace"] for f in spec.get("from") or [] if isinstance(f, dict) and isinstance(f.get("namespace"), str)}


def _view_of(gf: GatewayFacts) -> tuple[Any, ...]:
    """What the facts of routes and the data plane's view read of a Gateway's facts: whether it and
    each listener are accepted (and why not: a route's message says it)."""
    return (gf.accepted, tuple((name, lf.accepted, lf.protocol) for name, lf in gf.listeners.items()))


def _class_name(gateway: dict[str, Any]) -> str:
    """The GatewayClass a Gateway names, as facts.gateway_facts reads it."""
    spec = gateway.get("spec")
    return str((spec if isinstance(spec, dict) else {}).get("gatewayClassName", ""))


#: no object to check: a view that is the same as the copy the analysis holds
_NOTHING: frozenset[Ref] = frozenset()


def _same_but_status(before: dict[str, Any], now: dict[str, Any]) -> bool:
    """Are two views of a route equal but for `status`? Nothing the data plane or the engine
    builds reads a route's status (a Gateway's is read: its address), so a route whose status we
    wrote keeps the analysis' copy, and its BuildCache entry, when a Gateway or Namespace edit
    looks at every view again."""
    if now.get("kind") not in ROUTE_KINDS or before.keys() - {"status"} != now.keys() - {"status"}:
        return False
    return all(before[k] == now[k] for k in now if k != "status")


class GatewayState:
    """The objects (`objects`, shared with the controller, which fills it), the index and facts
    status is computed from, and the analysis of the data plane's view; `changed` records a change,
    `refresh` brings everything up to date."""

    def __init__(self, objects: dict[Key, dict[str, Any]], controller: str,
                 kind_checks: Mapping[Any, Callable[[dict[str, Any]], str | None]] | None = None,
                 any_address: bool = False) -> None:
        self.objects = objects
        self.controller = controller
        self.any_address = any_address  # facts.Facts.any_address
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
        #: bumped whenever something other than a policy, a route, an EndpointSlice, a Service, a
        #: Secret, a ConfigMap, a ReferenceGrant, a Gateway or a Namespace changed (and when one of
        #: Secret, ConfigMap and ReferenceGrant changed which listeners a Gateway has): the data
        #: plane's caches (dataplane.BuildCache, render.RenderCache) key on routes, policies, paths,
        #: servers and the objects routes read by reference
        self.epoch = 0
        self.last_fallback: str | None = None  # the change that needed the full pass, for the log
        #: bumped by every change the data plane may read (every one but a Secret or ConfigMap that
        #: no Gateway and no BackendTLSPolicy names): while it stays, building the data plane again
        #: would give the same files, and the controller does not
        self.dataplane_version = 0
        self._read_by_dataplane = True  # what the change being applied is (see _referenced)

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
            self._read_by_dataplane = True
            got = self._apply(raw, new)
            if got is None:
                self.last_fallback = f"{raw.get('kind')} {object_key(raw)[2]}/{object_key(raw)[3]}"
                self._full()
                return None
            self.in_place += 1
            if self._read_by_dataplane:
                self.dataplane_version += 1
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
            assert self.facts is not None  # _index_objects made them
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
        self.dataplane_version += 1

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
        if (ref.group, ref.kind) in REFERENCED:
            return self._referenced(ref, raw, new)
        if (ref.group, ref.kind) == GRANT:
            return self._grant(ref, raw, new)
        if ref.group == GATEWAY_GROUP and ref.kind in _VIEWED:  # a Gateway: its view needs the new facts
            before = facts.gateways.get(ref)
            if before is not None and new is not None and _class_name(new) == before.gateway_class.name:
                return self._gateway_edit(ref, before, raw, new)
            # created, deleted, or its class changed: everything afresh; epoch stays: what a route's build reads of a Gateway is its servers (BuildCache keys
            # on each, and server ids are the Gateway's and listener's, not positions) and its path
            # nodes and effective policies, which the engine replaces where the edit reaches them
            self._index_objects()
            old_view = self.views.get(ref, raw)
            got = apply_change(a, old_view, self._set_view(ref, new))
            if got is None:
                return None
            return self._rediff(got | {ref})
        got = apply_change(a, raw, new)
        if got is None:
            return None
        if (ref.group, ref.kind) == (CORE_GROUP, "Namespace"):  # labels: which routes Selector listeners
            self._index_objects()  # admit, i.e. those routes' views and nodes, which the BuildCache compares
        else:
            self._rebuild_facts()
        return self._rediff(got)

    def _gateway_edit(self, ref: Ref, before: GatewayFacts, raw: dict[str, Any], new: dict[str, Any]) -> set[Ref] | None:
        """A Gateway of ours edited, still of the same GatewayClass (so still ours): of the facts only
        its own (facts.gateway_fact reads no other Gateway) and those of the routes that name it
        (every such route has a parent entry for it) read it, and of the views only its own and
        those routes'. Those are computed again, not every Gateway's and route's (the full
        `_index_objects`, O(cluster), which a listener's hostname edit paid before). The epoch
        stays, as for every Gateway edit (see `_apply`)."""
        a, index, facts = self.analysis, self.index, self.facts
        assert a is not None and index is not None and facts is not None and self.grants is not None
        obj = replace_object(index, ref, new)
        assert obj is not None  # `new` is a copy, not a deletion
        facts.gateways[ref] = gateway_fact(obj, before.gateway_class, facts, index, self.grants)
        routes = [r for r, rf in facts.routes.items() if any(p.gateway == ref for p in rf.parents)]
        for r in routes:
            if not self._route_facts_again(r):
                return None
        gateways = {ref} | {p.gateway for r in routes for p in facts.routes[r].parents}
        for g in gateways:  # attachedRoutes: the routes that name it may have moved
            gf = facts.gateways.get(g)
            if gf is not None:
                for lf in gf.listeners.values():
                    lf.attached_routes = len(facts.attached(g, lf.name))
        got = apply_change(a, self.views.get(ref, raw), self._set_view(ref, new))
        if got is None:
            return None
        out = got | gateways | set(routes)
        for r in routes:  # the views that may have changed
            route = index.by_ref.get(r)  # the copy its facts were computed from
            if route is None:  # cannot be: what the facts hold is in the index
                return None
            checks = self._view_again(r, dataplane_objects([route.raw], facts)[0], route.raw)
            if checks is None:
                return None
            out |= checks
        return out

    def _route(self, ref: Ref, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
        a, index, facts = self.analysis, self.index, self.facts
        assert a is not None and index is not None and facts is not None and self.grants is not None
        if ref.kind == "GRPCRoute" or index.of_kind(GATEWAY_GROUP, "GRPCRoute"):
            return None  # an HTTPRoute and a GRPCRoute on one hostname: the older wins, which reads other routes
        replace_object(index, ref, new)
        before = facts.routes.get(ref)
        obj = index.by_ref.get(ref)
        rf = route_fact(obj, facts, index, self.grants) if obj is not None else None
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
        (facts.gateway_facts) read none and the view passes it as it is, so the engine's index and
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
            rf = route_fact(obj, facts, index, self.grants) if obj is not None else None
            if rf is None:  # cannot be: a route's parents do not read a Service; but never keep stale facts
                return None
            facts.routes[r] = rf
        return got | set(routes) | {ref}

    def _referenced(self, ref: Ref, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
        """A Secret or ConfigMap. The engine never reads one (`update_unread` puts it in its
        index); of the facts only the Gateways that name it read it, and of the policies' conditions
        only the BackendTLSPolicies whose CA refs name a ConfigMap. A Secret or ConfigMap no one
        names costs the two index updates and a look at our Gateways' and those policies' specs."""
        a, index, facts = self.analysis, self.index, self.facts
        assert a is not None and index is not None and facts is not None
        got = apply_change(a, raw, new)
        if got is None:
            return None
        replace_object(index, ref, new)
        gateways = [g for g, gf in facts.gateways.items() if ref in gateway_references(gf.obj)]
        policies = {p.ref for p in index.of_kind(*BACKEND_TLS)
                    if ref.kind == "ConfigMap" and p.namespace == ref.namespace and ref in ca_configmaps(p)}
        # the data plane reads Secrets and ConfigMaps through these references only (listener
        # certificates and client CAs of any Gateway it serves, BackendTLSPolicy CA bundles)
        self._read_by_dataplane = bool(policies) or any(ref in gateway_references(gw)
                                                        for gw in index.of_kind(GATEWAY_GROUP, "Gateway"))
        return self._gateways_again(gateways, got | {ref} | policies)

    def _grant(self, ref: Ref, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
        """A ReferenceGrant in namespace N: the engine derives again the paths of the routes that
        send into N from the namespaces the grant's `from` names (before or after) and resolves
        those namespaces' policy targets again. Of the facts, only the routes of those namespaces
        with a backendRef or mirror into N (ResolvedRefs) and the Gateways there that name a Secret
        or ConfigMap in N read the grant; those are computed again. The data plane's BuildCache
        finds the routes that asked N's grants by itself."""
        a, index, facts = self.analysis, self.index, self.facts
        assert a is not None and index is not None and facts is not None
        ns = ref.namespace or ""
        froms = _grant_from_namespaces(index.by_ref.get(ref))
        got = apply_change(a, raw, new)
        if got is None:
            return None
        obj = replace_object(index, ref, new)
        froms |= _grant_from_namespaces(obj)
        self.grants = ReferenceGrants(index)
        routes = [r for r, rf in facts.routes.items() if r.namespace in froms and _refers_into(rf.obj, ns)]
        for r in routes:
            if not self._route_facts_again(r):
                return None
        gateways = [g for g, gf in facts.gateways.items()
                    if g.namespace in froms and any(x.namespace == ns for x in gateway_references(gf.obj))]
        return self._gateways_again(gateways, got | {ref} | set(routes))

    def _route_facts_again(self, ref: Ref) -> bool:
        """One route's facts computed again in place (False: it has none now, which a change of what
        it refers to cannot do: its parents do not read it; the caller runs the full pass)."""
        assert self.facts is not None and self.index is not None and self.grants is not None
        obj = self.index.by_ref.get(ref)
        rf = route_fact(obj, self.facts, self.index, self.grants) if obj is not None else None
        if rf is None:
            return False
        self.facts.routes[ref] = rf
        return True

    def _gateways_again(self, gateways: list[Ref], touched: set[Ref]) -> set[Ref] | None:
        """These Gateways' facts computed again in place (something they refer to changed). Where
        that leaves which listeners are accepted as it was, nothing else reads the change (routes'
        facts and the view read only that of a Gateway's facts); otherwise the routes attached to
        it are computed again too and the Gateway's and their new views go to the engine, with a
        new `epoch` (unlike a Gateway's own edit, which keeps it: see `_apply`)."""
        a, index, facts = self.analysis, self.index, self.facts
        assert a is not None and index is not None and facts is not None and self.grants is not None
        moved: list[Ref] = []
        before_facts = {g: facts.gateways[g] for g in gateways}
        for g in gateways:
            before = before_facts[g]
            gw = index.by_ref.get(g)
            if gw is None:  # cannot be: a Gateway of the facts is in the index
                return None
            gf = facts.gateways[g] = gateway_fact(gw, before.gateway_class, facts, index, self.grants)
            if _view_of(gf) != _view_of(before):
                moved.append(g)
        routes = [r for r, rf in facts.routes.items() if any(p.gateway in moved for p in rf.parents)] if moved else []
        for r in routes:
            if not self._route_facts_again(r):
                return None
        for g in gateways:  # attachedRoutes: counted again where routes moved, else as they were
            gf, was = facts.gateways[g], before_facts[g]
            for lf in gf.listeners.values():
                old = was.listeners.get(lf.name)
                lf.attached_routes = len(facts.attached(g, lf.name)) if moved or old is None else old.attached_routes
        out = touched | set(gateways) | set(routes)
        if not moved:
            return out
        self.epoch += 1
        for ref in [*moved, *routes]:
            raw = self.objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))
            if raw is None:  # cannot be: what the facts hold is in the objects
                return None
            before_view = self.views.get(ref)
            view = self._set_view(ref, raw)
            if before_view is view or before_view == view:
                continue
            got = apply_change(a, before_view if before_view is not None else raw, view)
            if got is None:
                return None
            out |= got
        return out

    def _set_view(self, ref: Ref, new: dict[str, Any] | None) -> dict[str, Any] | None:
        """The data plane's view of a Gateway or route's new copy (None: deleted), recorded as the
        copy the analysis holds. When the engine then declines it, the full pass that follows
        starts the views afresh."""
        assert self.facts is not None  # made by every pass before any view
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
        self.facts = gateway_facts(self.index, self.controller, self.grants, any_address=self.any_address)
        return raws

    def _view_again(self, ref: Ref, view: dict[str, Any], raw: dict[str, Any]) -> AbstractSet[Ref] | None:
        """A Gateway's or route's new view given to the engine where it differs from the copy the
        analysis holds (`raw`: the old copy to give when none is recorded): the objects to check
        (none when it is the same), None when the engine declines it."""
        a = self.analysis
        assert a is not None
        before = self.views.get(ref)
        if before is view or before == view:
            self.views[ref] = view
            return _NOTHING
        if before is not None and _same_but_status(before, view):
            return _NOTHING  # the analysis keeps its copy: a status write (whose echo the state is not told) changed nothing it reads
        got = apply_change(a, before if before is not None else raw, view)
        if got is None:
            return None
        self.views[ref] = view
        return got | {ref}

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
            got = self._view_again(ref, raw, raw)
            if got is None:
                return None
            out |= got
        for ref in [r for r in self.views if r not in seen]:
            got = apply_change(a, self.views.pop(ref), None)
            if got is None:
                return None
            out |= got | {ref}
        return out
