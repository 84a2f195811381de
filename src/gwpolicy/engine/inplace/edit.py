"""The paths one change to the hierarchy takes away and adds (`Edit`: a route's paths derived
again, or moved as they are below another parent), settled together; `finish` settles an edit and
resolves again the policies whose targets may have come or gone."""

from __future__ import annotations

from typing import AbstractSet, Any

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.effective import Pairs
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.inplace.base import RouteIndex, nodes_at, push_children, route_index, subtree_of
from gwpolicy.engine.inplace.policies import resolve_again
from gwpolicy.engine.inplace.recompute import recompute_nodes
from gwpolicy.engine.model import Obj
from gwpolicy.engine.refs import CORE_GROUP, Ref
from gwpolicy.engine.topology import (
    PathNode,
    Topology,
    add_backend_paths,
    attach_route,
    extend,
    namespace_ref,
    new_ref,
    paths_of_route,
    route_rules,
)


class Edit:
    """The path registrations (target -> its path nodes) one change takes away and adds, settled
    together at the end: a path taken away and put back is no change, so a route derived again to
    the same paths costs no evaluation. Settling drops the effective policies of the paths that
    went, computes those of the paths that came, keeps the node index, and cuts out the nodes no
    path holds any more."""

    def __init__(self, a: Analysis) -> None:
        # what affects each object (and the effective policies by target) materialised before anything
        # changes: an edit keeps them up to date
        a.affected  # noqa: B018
        self.a = a
        self.topo = a.topology
        self.before: dict[Ref, dict[PathNode, None]] = {}
        self.spare: list[PathNode] = []  # nodes that may hold no path any more
        self.backends: set[Ref] = set()  # backends that may have come into or gone out of the hierarchy
        self.routes: set[Ref] = set()
        self.refresh: list[PathNode] = []  # nodes to evaluate again though their paths stay
        self.moved: dict[Ref, list[PathNode]] = {}  # targets' paths moved in place (`move_routes`)
        self.route_index: RouteIndex | None = None

    def _touch(self, t: Ref) -> None:
        if t not in self.before:
            self.before[t] = dict(self.topo.paths.get(t) or {})

    def add(self, t: Ref, n: PathNode) -> None:
        self._touch(t)
        self.topo.paths.setdefault(t, {})[n] = None

    def remove(self, t: Ref, n: PathNode) -> None:
        self._touch(t)
        reg = self.topo.paths.get(t)
        if reg is not None:
            reg.pop(n, None)
        self.spare.append(n)

    def take_route(self, ref: Ref) -> None:
        """Every path in the route's subtrees taken away (to be derived again, or not: it is gone)."""
        paths = self.topo.paths
        self.routes.add(ref)
        for node in list(paths.get(ref, ())):
            for m in subtree_of(node):
                lv = m.level
                if lv is not None and m in paths.get(lv, ()):
                    self.remove(lv, m)
                    if lv.object != ref and lv.section is None:
                        self.backends.add(lv)
                else:
                    self.spare.append(m)
        for s in self.topo.sections.pop(ref, []):
            self._touch(ref.with_section(s))
        self._touch(ref)
        self.topo.route_parents.pop(ref, None)

    def put_route(self, route: Obj, grants: ReferenceGrants) -> None:
        """The route's paths derived from the objects as they are now."""
        topo = self.topo
        # the route's paths written to a table of their own (the listeners' read from the topology's)
        shadow = Topology(paths={}, root=topo.root, listeners_of=topo.listeners_of, ports_of=topo.ports_of)
        self.backends |= attach_route(shadow, route, self.a.index, grants, topo.paths)
        for t, nodes in shadow.paths.items():
            for n in nodes:
                self.add(t, n)
        topo.sections[route.ref] = shadow.sections.get(route.ref, [])
        topo.route_parents[route.ref] = shadow.route_parents.get(route.ref, [])

    def move_routes(self, routes: list[Ref], changed: Ref | None = None) -> None:
        """Routes whose parents alone may have changed (a Gateway's listeners, a namespace's
        labels): their paths derived again and, where one path went and another came, the subtree
        below the one that went moved, as it is, to where the new one hangs (`_graft`); only those
        nodes are evaluated again, and no registration, node or index entry below them is made
        again. The others (a path that came with none gone, a subtree whose shape would differ
        there, or one holding `changed` itself) are derived from scratch (`derive_routes`)."""
        index, topo = self.a.index, self.topo
        # what a route's paths are derived on: the topology's listener paths, only read (`paths_of_route`
        # writes the route's parents alone, to the shadow's own table)
        shadow = Topology(paths=topo.paths, root=topo.root, listeners_of=topo.listeners_of, ports_of=topo.ports_of)
        rest = []
        admits: dict[tuple[int, str | None, str], bool] = {}  # listeners and labels stand meanwhile
        for r in routes:
            obj = index.by_ref.get(r)
            if obj is None or not self._move_route(obj, changed, shadow, admits):
                rest.append(r)
        self.derive_routes(rest)

    def _move_route(self, route: Obj, changed: Ref | None, shadow: Topology,
                    admits: dict[tuple[int, str | None, str], bool]) -> bool:
        """Move the route's paths that went to the places of those that came, one for one; False
        (nothing done) when that cannot give what deriving it again gives."""
        topo = self.topo
        ref = route.ref
        old = list(topo.paths.get(ref, ()))
        new = paths_of_route(route, self.a.index, topo.listeners_of, shadow, admits)
        if new == old:
            return True
        if len(old) == 1 and len(new) == 1:  # the common case: one path, another now
            gone, came = old, new
        else:
            kept, now = set(old), set(new)
            gone = [n for n in old if n not in now]
            came = [n for n in new if n not in kept]
            if not gone and not came:
                return True
        # the nodes that came were interned by the derivation: empty unless they held something
        # before (then derive it all, which reuses them)
        self.spare.extend(came)
        if len(gone) != len(came) or any(n.children for n in came):
            return False
        ri = self.route_index
        if ri is None:
            ri = self.route_index = route_index(self.a)
        for g, c in zip(gone, came):
            differ = g.parent.namespaces ^ c.parent.namespaces  # type: ignore[union-attr]
            # alike below when the route alone tells (no level below it lives in a namespace one
            # parent holds and the other not, none is a Gateway), else when its nodes tell
            if not ri.sends_only_to(ref, differ) and not _same_shape_below(g, differ, changed):
                return False
        idx = nodes_at(self.a)
        for g, c in zip(gone, came):
            self.spare.append(_graft(g, c, idx, topo.paths, self.moved))  # the old parent, left empty maybe
        topo.route_parents[ref] = shadow.route_parents[ref]
        return True

    def derive_backends(self, routes: list[Ref], ns: str) -> None:
        """Routes whose backendRefs into the namespace `ns` (another than theirs) may have come or
        gone (a ReferenceGrant there changed, S1.3): the subtrees of those backends below the
        routes' paths taken away and derived again; the rest of each route stands as it is."""
        index, topo = self.a.index, self.topo
        paths = topo.paths
        nsref = namespace_ref(ns)
        grants = ReferenceGrants(index)
        shadow = Topology(paths={}, root=topo.root, listeners_of=topo.listeners_of, ports_of=topo.ports_of)
        for r in routes:
            route = index.by_ref.get(r)
            if route is None or r.namespace == ns:
                continue
            route_paths = list(paths.get(r, ()))
            for rp in route_paths:
                for base in [rp, *(c for lv, c in (rp.children or {}).items() if lv.section is not None and lv.object == r)]:
                    for lv, c in list((base.children or {}).items()):
                        if lv == nsref:  # behind the Namespace level the path had none for
                            for b in list((c.children or {}).values()):
                                self._take_below(b)
                            self.spare.append(c)
                        elif lv.namespace == ns and lv.section is None:
                            self._take_below(c)
            for rule in route_rules(route):
                rname = rule.get("name") if isinstance(rule.get("name"), str) else None
                bases = [rp.child(r.with_section(rname)) for rp in route_paths] if rname else route_paths
                for bref in rule.get("backendRefs") or []:
                    if isinstance(bref, dict) and (bref.get("namespace") or r.namespace) == ns:
                        add_backend_paths(route, bref, bases, index, grants, shadow, self.backends, topo.ports_of)
        for t, nodes in shadow.paths.items():
            for n in nodes:
                self.add(t, n)

    def _take_below(self, node: PathNode) -> None:
        """Every path in the subtree taken away; the backends in it may leave the hierarchy."""
        paths = self.topo.paths
        for m in subtree_of(node):
            lv = m.level
            if lv is not None and m in paths.get(lv, ()):
                self.remove(lv, m)
                if lv.section is None:
                    self.backends.add(lv)
            else:
                self.spare.append(m)

    def derive_routes(self, routes: list[Ref]) -> None:
        index = self.a.index
        for r in routes:
            self.take_route(r)
        grants = ReferenceGrants(index)
        for r in routes:
            obj = index.by_ref.get(r)
            if obj is not None:
                self.put_route(obj, grants)

    def settle_backends(self) -> None:
        """As the full analysis leaves them: `Namespace > Service > port` for a Service (and a port) no
        route reaches, and none where one does; a virtual backend only while a route reaches it."""
        topo, index = self.topo, self.a.index
        for b in sorted(self.backends, key=Ref.sort_key):
            self._touch(b)
            if b.group == CORE_GROUP and b.kind == "Service" and b in index.by_ref:
                standalone = extend(topo.root, b)
                self._standalone(b, standalone)
                for p in topo.ports_of.get(b, []):
                    pref = b.with_section(p["name"])
                    self._touch(pref)
                    self._standalone(pref, standalone.child(pref))
                self.spare.append(standalone)
            elif not topo.paths.get(b):
                topo.paths.pop(b, None)
                topo.virtual.discard(b)
            elif b not in index.by_ref:
                topo.virtual.add(b)

    def _standalone(self, t: Ref, own: PathNode) -> None:
        reg = self.topo.paths.get(t) or {}
        if any(n is not own for n in reg):
            if own in reg:
                self.remove(t, own)
        elif own not in reg:
            self.add(t, own)
        self.spare.append(own)

    def settle(self) -> tuple[set[Ref], set[Ref], set[Ref]]:
        """Apply it all: the objects to check, the objects with a target (the object or one of its
        sections) whose paths changed, and the objects that came into or went out of the hierarchy."""
        a, topo = self.a, self.topo
        paths = topo.paths
        by = a._by_effective_target
        assert by is not None
        idx = nodes_at(a)
        fresh: list[PathNode] = []
        per_target: dict[Ref, list[PathNode]] = {}
        lost: dict[Ref, list[Pairs]] = {}
        changed: set[Ref] = set()
        moved: set[Ref] = set()
        for t, before in self.before.items():
            now = paths.get(t)
            if now is not None and not now:
                del paths[t]
                now = None
            if now is None:
                now = {}
            came = [n for n in now if n not in before]
            gone = [n for n in before if n not in now]
            if t.section is None and bool(before) != bool(now):
                moved.add(t)
            if not came and not gone:
                if before:
                    paths[t] = before  # the order it had
                continue
            changed.add(t)
            if came:
                fresh.extend(came)
                per_target[t] = came
            per_path = by.get(t)
            if per_path is not None and gone:
                for n in gone:
                    pairs = per_path.pop(n, None)
                    if pairs:
                        lost.setdefault(t.object, []).append(pairs)
                if not per_path:
                    del by[t]
        if not per_target:  # only paths moved in place: the same registrations, other paths
            per_target = self.moved
            changed.update(per_target)
        else:
            for t, nodes in self.moved.items():
                changed.add(t)
                got = per_target.get(t)
                per_target[t] = nodes if got is None else got + nodes
        for n in fresh:  # the node index: new nodes, and the Namespace levels above them they brought
            _index_upward(idx, n)
        self._prune(idx)
        if self.refresh:  # paths that stay, evaluated again (the object's mapped values changed)
            known = {n for nodes in per_target.values() for n in nodes}
            for n in self.refresh:
                if n not in known and n in paths.get(n.level, ()):  # type: ignore[arg-type]
                    known.add(n)
                    per_target.setdefault(n.level, []).append(n)  # type: ignore[arg-type]
        batch: dict[Ref, Any] = {}  # the owners of the targets evaluated
        check = recompute_nodes(a, per_target, lost, batch, fresh_summaries=per_target is self.moved and not self.refresh)
        affected = a.affected
        if self.refresh:  # targets evaluated again whose paths stay: not changed
            owners = {t if t[4] is None else new_ref(Ref, (t[0], t[1], t[2], t[3], None)) for t in changed}  # `t.object`
        else:  # each target evaluated changed: their owners, and those of the targets that only lost paths
            owners = set(batch)
            if len(changed) != len(per_target):  # only moved paths: every changed target was evaluated
                owners.update(t if t[4] is None else new_ref(Ref, (t[0], t[1], t[2], t[3], None))
                              for t in changed if t not in per_target)
        for owner in owners:  # owners whose every path went away
            if owner not in paths and owner in affected:
                del affected[owner]
                check.add(owner)
        by_ref = a.index.by_ref
        check.update(filter(by_ref.__contains__, owners))
        return check, owners, moved

    def _prune(self, idx: dict[Ref, dict[PathNode, None]]) -> None:
        """Cut out of the tree every node left holding no path and no node below (interned nodes
        would otherwise come back with what they held, and memory would only grow)."""
        paths = self.topo.paths
        work = self.spare
        while work:
            n = work.pop()
            p = n.parent
            if p is None or n.children or n in paths.get(n.level, ()):  # type: ignore[arg-type]
                continue
            if p.children is None or p.children.get(n.level) is not n:  # type: ignore[arg-type]
                continue  # cut already
            del p.children[n.level]  # type: ignore[arg-type]
            at = idx.get(n.level)  # type: ignore[arg-type]
            if at is not None:
                at.pop(n, None)
                if not at:
                    del idx[n.level]  # type: ignore[arg-type]
            work.append(p)


def _same_shape_below(node: PathNode, differ: frozenset[str], changed: Ref | None) -> bool:
    """Would the subtree of `node` (a route's path and all below it) be derived alike below
    another parent, whose namespaces differ from its parent's by `differ`? The levels below a route
    follow from the route and its backends alone, except where a Namespace level goes (S4.2: above
    the highest object of the path in that namespace): so no level may name a namespace of
    `differ`. Nor may one be the object that changed (a Gateway a backendRef names)."""
    name = changed[3] if changed is not None else None
    stack = [node]
    while stack:  # levels read by index (`Ref` fields): thousands of nodes after a Gateway edit
        m = stack.pop()
        lv = m.level
        if (lv[3] if lv[1] == "Namespace" and lv[0] == CORE_GROUP and lv[2] is None else lv[2]) in differ:  # type: ignore[index, operator]
            return False
        if lv[3] == name and lv[:4] == changed[:4]:  # type: ignore[index]  # the object or one of its sections
            return False
        push_children(stack, m)
    return True


def _graft(node: PathNode, place: PathNode, idx: dict[Ref, dict[PathNode, None]],
           paths: dict[Ref, dict[PathNode, None]], moved: dict[Ref, list[PathNode]]) -> PathNode:
    """Put `node` (with its subtree) where the empty node `place` is, in its stead; its levels,
    JSON, namespaces and summaries derived again below; the new parent and the nodes above it put
    in the node index; each node that is a target's path listed in `moved` under its target.
    Returns the old parent."""
    old, new = node.parent, place.parent
    assert old is not None and new is not None and new.children is not None and old.children is not None
    lv = node.level
    if old.children.get(lv) is node:  # type: ignore[arg-type]
        del old.children[lv]  # type: ignore[arg-type]
    new.children[lv] = node  # type: ignore[index]
    node.parent = new
    at = idx.get(lv)  # type: ignore[arg-type]
    if at is not None:
        at.pop(place, None)
    stack = [node]
    while stack:  # each node before those below it: its namespaces are its parent's and its level's
        m = stack.pop()
        push_children(stack, m)
        lv = m.level
        m.namespaces = (m.parent.namespaces | {lv[3]}  # type: ignore[union-attr, index, operator]  # below a route: never the root
                        if lv[1] == "Namespace" and lv[0] == CORE_GROUP and lv[2] is None and lv[4] is None  # type: ignore[index]
                        else m.parent.namespaces)  # type: ignore[union-attr]
        m._levels = None
        m._json = None
        m.summary = None
        reg = paths.get(lv)  # type: ignore[arg-type]
        if reg is not None and m in reg:
            moved.setdefault(lv, []).append(m)  # type: ignore[arg-type]
    _index_upward(idx, new)
    return old


def _index_upward(idx: dict[Ref, dict[PathNode, None]], node: PathNode | None) -> None:
    """The node and those above it into the node index (level -> its nodes), up to the first one
    the index already holds: a new or moved node may bring Namespace levels above it."""
    while node is not None and node.level is not None:
        at = idx.setdefault(node.level, {})
        if node in at:
            break
        at[node] = None
        node = node.parent


def forget_object(a: Analysis, edit: Edit, ref: Ref) -> None:
    """The object's own values of mapped fields are read again (S5.2 rule 4), and the paths of the
    object and its sections evaluated again when a kind maps a field of its kind."""
    values = a.evaluator._object_values
    mapped = False
    for kind in a.kinds.values():
        values.pop((ref, kind.key), None)
        mapped = mapped or any((m.target_group, m.target_kind) == (ref.group, ref.kind) for m in kind.field_mappings or ())
    if mapped:
        topo = a.topology
        for t in [ref] + [ref.with_section(s) for s in topo.sections.get(ref, [])]:
            edit.refresh.extend(topo.paths.get(t, ()))


def finish(a: Analysis, edit: Edit, obj: Ref, reresolve: set[Ref], policies: AbstractSet[Ref] = frozenset()) -> set[Ref] | None:
    """Settle the edit; resolve again the policies given and those declaring the objects given or any
    that came into or went out of the hierarchy (their targets may have appeared or gone); the
    objects to check, among them the policies on every target whose paths changed (their status
    ancestors follow paths)."""
    check, owners, moved = edit.settle()
    check.add(obj)
    again = set(policies).union(*(a.policies_declaring(o) for o in reresolve | moved))
    for pref in sorted(again, key=Ref.sort_key):
        sub = resolve_again(a, pref)
        if sub is None:
            return None
        check |= sub
    declaring = a._declaring_index()
    for owner in owners:
        got = declaring.get(owner)
        if got:
            check |= got
    a._status = a._status_by_ref = a._affects = a._by_target = None
    a._effective = None
    return check
