"""What the in-place updates share: the object index kept in order (`replace_object`), the path
nodes by level (`nodes_at`) and the walks of the tree of paths, and which routes name which Gateways,
backends and namespaces (`RouteIndex`). `apply.prepare` builds the indexes right after a full
analysis (else the first update that needs one does); every update keeps them up to date."""

from __future__ import annotations

import bisect
from typing import Any

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.kinds import ROUTE_KINDS, split_api_version
from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.engine.topology import PathNode, Topology, parent_gateway


def replace_object(index: ObjectIndex, ref: Ref, raw: dict[str, Any] | None) -> Obj | None:
    """Put the new copy of an object in the index (by reference, and in its kind's sorted list), or take it out."""
    objs = index.by_kind.setdefault((ref.group, ref.kind), [])
    key = ref.sort_key()
    gone = index.by_ref.pop(ref, None)
    if gone is not None:  # the list is sorted by reference: find it by bisection, not by a scan
        i = bisect.bisect_left(objs, key, key=obj_sort_key)
        if i < len(objs) and objs[i] is gone:
            del objs[i]
        else:
            objs[:] = [o for o in objs if o is not gone]
    if raw is None:
        return None
    _, version = split_api_version(raw.get("apiVersion", ""))
    obj = Obj(raw, ref, version, "cluster")
    index.by_ref[ref] = obj
    objs.insert(bisect.bisect(objs, key, key=obj_sort_key), obj)
    return obj


def obj_sort_key(o: Obj) -> tuple[str, str, str, str, str]:
    """An object's place in its kind's list (`ObjectIndex.by_kind` is sorted by reference)."""
    return o.ref.sort_key()


def nodes_at(a: Analysis) -> dict[Ref, dict[PathNode, None]]:
    """Every path node by its level (built by `apply.prepare`, or else on the first incremental update)."""
    topo = a.topology
    idx = topo._nodes_at
    if idx is None:
        idx = {}
        stack = [topo.root]
        while stack:
            n = stack.pop()
            if n.level is not None:
                idx.setdefault(n.level, {})[n] = None
            push_children(stack, n)
        topo._nodes_at = idx
    return idx


def nodes_at_of_full_analysis(topo: Topology) -> dict[Ref, dict[PathNode, None]]:
    """`nodes_at` of a topology as a full analysis leaves it, read off its paths rather than walked
    (at 50k routes the walk of 535k nodes took half a second): there, every leaf of the tree is one
    of the paths, so the tree is the paths and the nodes above them (the Namespace levels `extend`
    places above an object, a Service above a port no route reaches). tests/engine/test_nodes_at.py
    checks that it gives what the walk gives."""
    paths, root = topo.paths, topo.root
    idx = {level: reg.copy() for level, reg in paths.items() if reg}
    for reg in paths.values():
        for n in reg:
            m = n.parent
            # the nodes that are no path of their own are the Namespace levels `extend` places, and a
            # Service right below its root Namespace (above a port no route reaches): below any
            # other node, the parent is a path, indexed already (one test rather than two lookups
            # for most of the 645k nodes at 50k routes)
            if m is None or m.level is None or (m.level[1] != "Namespace" and m.parent.parent is not root):  # type: ignore[union-attr]
                continue
            while m is not None and m.level is not None:  # up to the first node known
                at = idx.get(m.level)
                if at is None:
                    at = idx[m.level] = {}
                elif m in at:
                    break
                at[m] = None
                m = m.parent
    return idx


def push_children(stack: list[PathNode], node: PathNode) -> None:
    """A tree walk's step: the node's children onto the stack, one by one (not
    `stack.extend(children.values())`: mypyc iterates a dict natively, while `extend` of a view goes
    through the generic iterator, 1.7k instructions a call in the compiled core)."""
    ch = node.children
    if ch:
        for c in ch.values():
            stack.append(c)


def subtree_of(node: PathNode) -> list[PathNode]:
    """The node and every node below it, the node first."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        push_children(stack, n)
    return out


class RouteIndex:
    """Which routes name a Gateway in their parentRefs or a backend in their backendRefs, and which
    send to another namespace (by that namespace): what a change to one of those must derive again.
    Built with the first such change (or by `apply.prepare`), then kept up to date by every route update."""

    def __init__(self, index: ObjectIndex) -> None:
        self.naming: dict[Ref, set[Ref]] = {}  # Gateway or backend -> routes naming it
        self.into: dict[str, set[Ref]] = {}  # namespace -> routes with a backendRef into it from another
        # route -> (what it names, the namespaces it sends to, whether it names a backend other
        # than a Service: one that may be a Gateway)
        self._of: dict[Ref, tuple[set[Ref], set[str], bool]] = {}
        # Gateway or backend -> `routes_naming`'s sorted list, kept until a route naming it changes
        # (a Gateway edited twice sorts its thousand routes once)
        self._sorted: dict[Ref, list[Ref]] = {}
        for kind in ROUTE_KINDS:
            for route in index.of_kind(GATEWAY_GROUP, kind):
                self.put(route.ref, route)

    def put(self, ref: Ref, route: Obj | None) -> None:
        """The route's names, replacing those it had (None: it is gone)."""
        names, into, _ = self._of.pop(ref, ((), (), False))
        sorted_ = self._sorted
        if sorted_:  # none while the index is built
            for n in names:
                sorted_.pop(n, None)
        _untie(self.naming, names, ref)
        _untie(self.into, into, ref)
        if route is None:
            return
        names, into, odd = _names_of_route(route)
        self._of[ref] = (names, into, odd)
        for n in names:
            self.naming.setdefault(n, set()).add(ref)
            if sorted_:
                sorted_.pop(n, None)
        for ns in into:
            self.into.setdefault(ns, set()).add(ref)

    def routes_naming(self, ref: Ref) -> list[Ref]:
        """The routes naming `ref`, sorted (the callers' order of work); the list is shared: read it only."""
        got = self._sorted.get(ref)
        if got is None:
            got = self._sorted[ref] = sorted(self.naming.get(ref, ()))  # routes: namespaced, no section (compared as tuples, as by sort_key)
        return got

    def sends_only_to(self, ref: Ref, namespaces: frozenset[str]) -> bool:
        """Does the route name only Services as backends, none in these namespaces? (Then every
        level below its path lives outside them, and none is a Gateway: `edit.Edit.move_routes`.)"""
        got = self._of.get(ref)
        return got is not None and not got[2] and ref.namespace not in namespaces and got[1].isdisjoint(namespaces)


def _untie(held: dict[Any, set[Ref]], keys: Any, ref: Ref) -> None:
    """`ref` taken out of each key's set; a set left empty goes."""
    for k in keys:
        refs = held.get(k)
        if refs is not None:
            refs.discard(ref)
            if not refs:
                del held[k]


def _names_of_route(route: Obj) -> tuple[set[Ref], set[str], bool]:
    """The Gateways and backends a route names (defaulted as attachment defaults them), the
    namespaces other than its own that it sends to, and whether a backendRef names anything but a
    Service (or is malformed)."""
    spec = route.spec if isinstance(route.spec, dict) else {}
    names: set[Ref] = set()
    into: set[str] = set()
    odd = False
    for pref in spec.get("parentRefs") or []:
        if isinstance(pref, dict):
            gw = parent_gateway(route, pref)
            if gw is not None:
                names.add(gw)
    for rule in spec.get("rules") or []:
        if not isinstance(rule, dict):
            continue
        for b in rule.get("backendRefs") or []:
            if not isinstance(b, dict):
                continue
            group, kind = b.get("group") or CORE_GROUP, b.get("kind") or "Service"
            ns, name = b.get("namespace") or route.namespace, b.get("name")
            if all(isinstance(v, str) for v in (group, kind, ns, name)):
                names.add(Ref(group, kind, ns, name))  # type: ignore[arg-type]  # all str: the all() above
                if ns != route.namespace:
                    into.add(ns)  # type: ignore[arg-type]  # as above
            if group != CORE_GROUP or kind != "Service" or not isinstance(ns, str):
                odd = True
    return names, into, odd


def route_index(a: Analysis) -> RouteIndex:
    topo = a.topology
    ri = topo._route_index
    if ri is None:
        ri = RouteIndex(a.index)
        topo._route_index = ri
    return ri
