"""Changes to the hierarchy applied in place: a route (`update_route`), a Gateway, a Service, a
Namespace, a ReferenceGrant. Each derives again the paths of the routes the change may move (those
`base.RouteIndex` finds naming the object), as one `edit.Edit`, and settles it (`edit.finish`)."""

from __future__ import annotations

import bisect
from typing import Any

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.inplace.base import obj_sort_key, replace_object, route_index
from gwpolicy.engine.inplace.edit import Edit, finish, forget_object
from gwpolicy.engine.inplace.policies import named_across
from gwpolicy.engine.kinds import ROUTE_KINDS
from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.engine.shapes import object_problem
from gwpolicy.engine.topology import (
    extend,
    gateway_listeners,
    names_gateway,
    namespace_ref,
    parent_gateway,
    service_ports,
)


def update_route(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """Replace (or delete) one route: its paths, its rules, and the paths of its backends through it.

    The route's paths are derived again and compared with those it had: only the paths that came
    are evaluated (a hostname edit that leaves the route on the same listeners moves nothing, and a
    Service behind a thousand routes is not recomputed); Services a route no longer reaches get back
    their `Namespace > Service > port` paths; the policies on the route, its rules and on backends
    that came into or went out of the hierarchy are resolved again (their targets may have appeared
    or gone). Returns the objects to check, or None.
    """
    if ref.group != GATEWAY_GROUP or ref.kind not in ROUTE_KINDS or ref.namespace is None:
        return None
    if raw is not None and object_problem(raw) is not None:
        return None  # malformed: a full analysis leaves it out and says why (gwpolicy.engine.shapes)
    if ref.namespace not in a.index.namespaces:
        return None
    index = a.index
    if raw is None and ref not in index.by_ref:
        return set()
    edit = Edit(a)
    edit.take_route(ref)
    obj = replace_object(index, ref, raw)
    ri = a.topology._route_index
    if ri is not None:
        ri.put(ref, obj)
    if obj is not None:
        edit.put_route(obj, ReferenceGrants(index))
    forget_object(a, edit, ref)
    edit.settle_backends()
    return finish(a, edit, ref, {ref})


def _known_namespace(a: Analysis, ref: Ref) -> bool:
    """A namespaced object in a namespace the hierarchy holds (a new namespace is left to a full analysis)."""
    return ref.namespace is not None and ref.namespace in a.index.namespaces


def update_gateway(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """Create, change or delete a Gateway: its path and its listeners', then the paths of every route
    that names it (in its parentRefs), derived again; the policies on it resolved again (listeners
    may have come or gone). A change that leaves its class and listeners as they were moves no path."""
    if not _known_namespace(a, ref):
        return None
    index, topo = a.index, a.topology
    old = index.by_ref.get(ref)
    if old is None and raw is None:
        return set()
    edit = Edit(a)
    shapes = (_gateway_shape(old.raw), _gateway_shape(raw)) if old is not None and raw is not None else None
    if shapes is not None and shapes[0] == shapes[1]:
        replace_object(index, ref, raw)
        forget_object(a, edit, ref)
        return finish(a, edit, ref, set())
    naming = route_index(a).routes_naming(ref)
    if shapes is not None and shapes[0][0] == shapes[1][0]:
        # same class: only the routes that may hang from a listener that changed
        before = {l["name"]: l for l in topo.listeners_of.get(ref, [])}
        after = {l["name"]: l for l in gateway_listeners(Obj(raw, ref, "", ""))}  # type: ignore[arg-type]  # shapes: raw is there
        changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
        naming = _may_attach_to(a, naming, ref, changed)
    for t in [ref] + [ref.with_section(s) for s in topo.sections.pop(ref, [])]:
        for n in list(topo.paths.get(t, ())):
            edit.remove(t, n)
    topo.listeners_of.pop(ref, None)
    obj = replace_object(index, ref, raw)
    if obj is not None:
        spec = obj.spec if isinstance(obj.spec, dict) else {}
        gc_ref = Ref(GATEWAY_GROUP, "GatewayClass", None, str(spec.get("gatewayClassName", "")))
        gw_path = extend(topo.root.child(gc_ref) if gc_ref in index.by_ref else topo.root, ref)
        edit.add(ref, gw_path)
        listeners = gateway_listeners(obj)
        topo.listeners_of[ref] = listeners
        topo.sections[ref] = [l["name"] for l in listeners]
        for l in listeners:
            lref = ref.with_section(l["name"])
            edit.add(lref, gw_path.child(lref))
    forget_object(a, edit, ref)
    # every route that may hang from a listener that changed: one whose paths stay as they were
    # costs a derivation of its paths and nothing more (`Edit.move_routes`)
    edit.move_routes(naming, ref)
    edit.settle_backends()
    return finish(a, edit, ref, {ref})


def _may_attach_to(a: Analysis, routes: list[Ref], gw: Ref, listeners: set[str]) -> list[Ref]:
    """The routes one of these listeners of the Gateway could be a parent of (a parentRef to the
    Gateway without a sectionName, or naming one of them), in their order; a route no longer in
    the index is kept (one loop: the thousands of routes naming a Gateway)."""
    by_ref, route_parents = a.index.by_ref, a.topology.route_parents
    gw_ns, gw_name = gw.namespace, gw.name
    out = []
    for route in routes:
        if route not in by_ref:
            out.append(route)
            continue
        for pref in route_parents.get(route, ()):
            section = pref.get("sectionName")
            # `parent_gateway(route, pref) == gw`, without a Ref made for each of thousands of parentRefs
            if (section is None or section in listeners) and str(pref.get("name", "")) == gw_name \
                    and (pref.get("namespace") or route.namespace) == gw_ns and names_gateway(pref):
                out.append(route)
                break
    return out


def _gateway_shape(raw: dict[str, Any]) -> Any:
    """What the hierarchy reads of a Gateway: its class and its listeners."""
    # a dict: mypy does not narrow a `.get()` by the isinstance of a second one
    spec: dict[str, Any] = raw.get("spec") if isinstance(raw.get("spec"), dict) else {}  # type: ignore[assignment]
    return spec.get("gatewayClassName"), spec.get("listeners")


def update_service(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """Create, change or delete a Service: the paths of every route that names it derived again (a
    Service absent from the input is no node, S1.4; its ports are sections), its own
    `Namespace > Service > port` paths as the routes leave them, the policies on it resolved again."""
    if not _known_namespace(a, ref):
        return None
    index, topo = a.index, a.topology
    old = index.by_ref.get(ref)
    if old is None and raw is None:
        return set()
    edit = Edit(a)
    ports_before_after = (service_ports(old), service_ports(Obj(raw, ref, "", ""))) if old is not None and raw is not None else None
    if ports_before_after is not None and ports_before_after[0] == ports_before_after[1]:
        replace_object(index, ref, raw)
        forget_object(a, edit, ref)
        return finish(a, edit, ref, set())
    routes = route_index(a).routes_naming(ref)
    if ports_before_after is not None:  # its ports changed: only routes whose backendRefs pick other ports
        before, after = ports_before_after
        routes = [r for r in routes if r not in index.by_ref or any(
            _picked(before, port) != _picked(after, port) for port in _ports_asked(index.by_ref[r], ref))]
    for r in routes:
        edit.take_route(r)
    standalone = extend(topo.root, ref)
    for t in [ref] + [ref.with_section(s) for s in topo.sections.pop(ref, [])]:
        for n in list(topo.paths.get(t, ())):
            if n is standalone or n.parent is standalone:
                edit.remove(t, n)
    edit.spare.append(standalone)
    obj = replace_object(index, ref, raw)
    if obj is not None:
        ports = service_ports(obj)
        topo.ports_of[ref] = ports
        topo.sections[ref] = [p["name"] for p in ports]
    else:
        topo.ports_of.pop(ref, None)
    forget_object(a, edit, ref)
    grants = ReferenceGrants(index)
    for r in routes:
        robj = index.by_ref.get(r)
        if robj is not None:
            edit.put_route(robj, grants)
    edit.backends.add(ref)
    edit.settle_backends()
    return finish(a, edit, ref, {ref})


def _ports_asked(route: Obj, svc: Ref) -> list[Any]:
    """The `port` of each of the route's backendRefs to the Service (None: every port)."""
    spec = route.spec if isinstance(route.spec, dict) else {}
    out = []
    for rule in spec.get("rules") or []:
        for b in (rule.get("backendRefs") or []) if isinstance(rule, dict) else []:
            if isinstance(b, dict) and (b.get("group") or CORE_GROUP, b.get("kind") or "Service", b.get("namespace") or route.namespace,
                                        b.get("name")) == (svc.group, svc.kind, svc.namespace, svc.name):
                out.append(b.get("port"))
    return out


def _picked(ports: list[dict[str, Any]], port: Any) -> list[str]:
    """The named ports a backendRef's `port` reaches (as attachment picks them)."""
    return [p["name"] for p in ports if port is None or p.get("port") == port]


def update_namespace(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """Create, change or delete a Namespace object: a namespace no object lives in any more leaves
    the hierarchy, a new one enters it (S4.5); new labels derive again the paths of the routes in it
    that a listener selects by namespace labels (allowedRoutes `from: Selector`)."""
    if ref.namespace is not None or ref.section is not None:
        return None
    index, topo = a.index, a.topology
    old = index.by_ref.get(ref)
    if old is None and raw is None:
        return set()
    edit = Edit(a)
    name = ref.name
    labels_before = index.namespace_labels(name)
    in_use_before = name in index.namespaces
    obj = replace_object(index, ref, raw)
    forget_object(a, edit, ref)
    in_use = obj is not None or _lives_in(index, name)
    nsref = namespace_ref(name)
    if in_use and not in_use_before:
        index.namespaces.add(name)
        edit.add(nsref, extend(topo.root, nsref))
    elif in_use_before and not in_use:
        index.namespaces.discard(name)
        for n in list(topo.paths.get(nsref, ())):
            edit.remove(nsref, n)
    if index.namespace_labels(name) != labels_before:
        edit.move_routes(_selected_routes(a, name))
        edit.settle_backends()
    return finish(a, edit, ref, {nsref} if in_use != in_use_before else set())


def _lives_in(index: ObjectIndex, ns: str) -> bool:
    """Does any object of the input live in the namespace (S4.5)? A scan: only when a Namespace
    object is deleted."""
    return any(r.namespace == ns for r in index.by_ref)


def _routes_in(index: ObjectIndex, ns: str) -> list[Obj]:
    out: list[Obj] = []
    for kind in ROUTE_KINDS:
        objs = index.of_kind(GATEWAY_GROUP, kind)
        i = bisect.bisect_left(objs, (GATEWAY_GROUP, kind, ns, "", ""), key=obj_sort_key)
        while i < len(objs) and objs[i].ref.namespace == ns:
            out.append(objs[i])
            i += 1
    return out


def _selected_routes(a: Analysis, ns: str) -> list[Ref]:
    """Routes in the namespace with a parentRef that a listener selecting namespaces by label may admit."""
    topo = a.topology
    out: list[Ref] = []
    for route in _routes_in(a.index, ns):
        for pref in topo.route_parents.get(route.ref, []):
            gw = parent_gateway(route, pref)
            if gw is not None and any(_selects(l) and (pref.get("sectionName") is None or pref.get("sectionName") == l["name"])
                                      and (pref.get("port") is None or pref.get("port") == l.get("port"))
                                      for l in topo.listeners_of.get(gw, [])):
                out.append(route.ref)
                break
    return out


def _selects(listener: dict[str, Any]) -> bool:
    allowed = listener.get("allowedRoutes")
    namespaces = allowed.get("namespaces") if isinstance(allowed, dict) else None
    return isinstance(namespaces, dict) and namespaces.get("from") == "Selector"


def update_grant(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """Create, change or delete a ReferenceGrant: the paths of the routes in the namespaces it names
    (before or after) that send into its namespace derived again (S1.3), and the policies from
    those namespaces with a target in its namespace resolved again (S3.4)."""
    if not _known_namespace(a, ref):
        return None
    index = a.index
    old = index.by_ref.get(ref)
    if old is None and raw is None:
        return set()
    edit = Edit(a)
    froms = _grant_namespaces(old.raw if old is not None else None) | _grant_namespaces(raw)
    replace_object(index, ref, raw)
    ns = ref.namespace
    routes = sorted((r for r in route_index(a).into.get(ns or "", ()) if r.namespace in froms), key=Ref.sort_key)
    edit.derive_backends(routes, ns or "")
    edit.settle_backends()
    policies = set()  # the policies of `froms` that declare a target in its namespace
    outcomes = a.outcomes
    for p in named_across(a).get(ns or "", ()):
        if p[2] in froms and any(o.declared is not None and o.declared[2] == ns for o in outcomes.get(p, ())):
            policies.add(p)
    return finish(a, edit, ref, set(), policies)


def _grant_namespaces(raw: dict[str, Any] | None) -> set[str]:
    spec: dict[str, Any] = raw.get("spec") if isinstance(raw, dict) and isinstance(raw.get("spec"), dict) else {}  # type: ignore[assignment]  # as `_gateway_shape`
    return {f["namespace"] for f in spec.get("from") or [] if isinstance(f, dict) and isinstance(f.get("namespace"), str)}
