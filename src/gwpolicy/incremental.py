"""One policy or one route created, changed or deleted, applied to an analysis in place (the
controller's fast path).

Only what the change can affect is recomputed: for a policy, the conflicts on the targets it had and
has; for a route, its paths and those of its backends through it; then the path nodes below (their
summaries and effective policies), the breadcrumbs of the objects whose affecting policies change,
and the status of the policies on those targets. Anything else (a new policy kind, a new namespace,
other topology changes) returns None: the caller runs a full analysis. Property tests hold that the
result equals a full analysis of the same objects.
"""

from __future__ import annotations

import bisect
from itertools import chain
from typing import Any

from gwpolicy.analysis import Analysis, _level_entry, policies_by_kind
from gwpolicy.attach import resolve_targets
from gwpolicy.effective import EffectivePolicy
from gwpolicy.grants import ReferenceGrants
from gwpolicy.kinds import ROUTE_KINDS, split_api_version
from gwpolicy.model import Obj, ObjectIndex
from gwpolicy.policies import TARGET_FIELDS, Policy, PolicyKind, parse_policy
from gwpolicy.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.shapes import list_map_problem, object_problem
from gwpolicy.topology import PathNode, attach_route, extend


def replace_object(index: ObjectIndex, ref: Ref, raw: dict[str, Any] | None) -> Obj | None:
    """Put the new copy of an object in the index (by reference, and in its kind's sorted list), or take it out."""
    objs = index.by_kind.setdefault((ref.group, ref.kind), [])
    key = ref.sort_key()
    gone = index.by_ref.pop(ref, None)
    if gone is not None:  # the list is sorted by reference: find it by bisection, not by a scan
        i = bisect.bisect_left(objs, key, key=_sort_key)
        if i < len(objs) and objs[i] is gone:
            del objs[i]
        else:
            objs[:] = [o for o in objs if o is not gone]
    if raw is None:
        return None
    _, version = split_api_version(raw.get("apiVersion", ""))
    obj = Obj(raw, ref, version, "cluster")
    index.by_ref[ref] = obj
    objs.insert(bisect.bisect(objs, key, key=_sort_key), obj)
    return obj


def _sort_key(o: Obj) -> tuple[str, str, str, str, str]:
    return o.ref.sort_key()


def policy_ref(a: Analysis, raw: dict[str, Any]) -> Ref | None:
    """The reference of a raw object if it is (or was) a policy of a known kind, else None."""
    group, _ = split_api_version(raw.get("apiVersion", ""))
    kind = raw.get("kind", "")
    if (group, kind) not in a.kinds:
        return None
    meta = raw.get("metadata") or {}
    ns = meta.get("namespace") or None
    same_kind = a.index.of_kind(group, kind)
    if same_kind and (same_kind[0].namespace is not None) != (ns is not None):
        return None  # scope differs from the kind's other objects: let a full analysis decide
    return Ref(group, kind, ns, meta.get("name", ""))


def apply_change(a: Analysis, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
    """One object created, changed (`new` its new copy) or deleted (`new` None; `raw` the last copy
    known), applied to the analysis in place: the objects whose status may change, or None when only
    a full analysis can say (the caller runs one). The single entry point the controller, the webhook
    and the gateway use, whatever the kind."""
    ref = policy_ref(a, raw)
    if ref is not None:
        return update_policy(a, ref, new)
    group, _ = split_api_version(raw.get("apiVersion", ""))
    meta = raw.get("metadata") or {}
    obj = Ref(group, raw.get("kind", ""), meta.get("namespace") or None, meta.get("name") or "")
    if obj.kind in ROUTE_KINDS:
        return update_route(a, obj, new)
    return None


def _misfits_schema(raw: dict[str, Any], kind: PolicyKind) -> bool:
    spec_schema = ((kind.schema or {}).get("properties") or {}).get("spec")
    return isinstance(spec_schema, dict) and list_map_problem(raw.get("spec"), spec_schema, "spec") is not None


def update_policy(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """Replace (or delete, with raw None) one policy; the objects whose status may change, or None."""
    kind = a.kinds.get((ref.group, ref.kind))
    if kind is None:
        return None
    if raw is not None and (object_problem(raw) is not None or _misfits_schema(raw, kind)):
        return None  # malformed: a full analysis leaves it out and says why (gwpolicy.shapes)
    if raw is not None:
        spec = raw.get("spec")
        if kind.recognized_by == "name-heuristic" and not (isinstance(spec, dict) and any(f in spec for f in TARGET_FIELDS)):
            return None  # it stops being a policy: a full analysis decides what it is
        if ref.namespace is not None and ref.namespace not in a.index.namespaces:
            return None  # a new namespace is a new level of the hierarchy
    old = a.policies.get(ref)
    if old is None and raw is None:
        return set()
    if old is None and kind.recognized_by == "name-heuristic" and not a.index.of_kind(ref.group, ref.kind):
        return None
    index = a.index
    a.affected  # noqa: B018 - materialise it (and the effective policies by target) before anything changes
    paths_before = len(a.topology.paths)
    obj = replace_object(index, ref, raw)
    new: Policy | None = parse_policy(obj, kind) if obj is not None else None
    # its targets, old and new
    touched_levels: set[Ref] = set()
    declaring = a._declaring
    if old is not None:
        touched_levels |= {o.declared for o in a.outcomes.get(ref, []) if o.attached and o.declared is not None}
        del a.policies[ref]
        for o in a.outcomes.pop(ref, []):
            if declaring is not None and o.declared is not None:
                declaring.get(o.declared.object, set()).discard(ref)
    if new is not None:
        outs = resolve_targets(new, index, a.topology, ReferenceGrants(index) if _needs_grants(new) else _NO_GRANTS)
        if len(a.topology.paths) != paths_before:
            return None  # it targets an object the hierarchy did not hold (S1.4): analyse it all
        a.policies[ref] = new
        a.outcomes[ref] = outs
        if declaring is not None:
            for o in outs:
                if o.declared is not None:
                    declaring.setdefault(o.declared.object, set()).add(ref)
        touched_levels |= {o.declared for o in outs if o.attached and o.declared is not None}
    kk = kind.key
    check: set[Ref] = {ref} if new is not None else set()
    for level in touched_levels:
        key = (kk, level)
        members = [p for p in a.attached.get(key, []) if p.ref != ref]
        if new is not None and any(o.attached and o.declared == level for o in a.outcomes[ref]):
            members.append(new)
        members.sort(key=lambda p: (p.obj.age_key, p.ref.kind, p.ref.group))
        for p in members:
            for o in a.outcomes[p.ref]:
                if o.declared == level:
                    o.reset()
            check.add(p.ref)
        if members:
            a.attached[key] = members
            a.entries[key] = _level_entry(kind, members, a.outcomes, level)
        else:
            a.attached.pop(key, None)
            a.entries.pop(key, None)
        _reindex_level(a, kk, level)
    check |= _recompute_below(a, touched_levels)
    a._status = None
    a._status_by_ref = None
    a._affects = None
    a._by_target = None
    ev = a.evaluator
    if ev.memo_base is None:
        ev.memo_base = len(ev.memo)
    elif len(ev.memo) > 2 * ev.memo_base + 10_000:  # results of ladders no path uses any more pile up
        ev.memo.clear()
        ev.memo_base = 0
    return check


class _NoGrants:
    def allows(self, *args: Any) -> bool:
        return False


_NO_GRANTS: Any = _NoGrants()


def _needs_grants(p: Policy) -> bool:
    ns = p.ref.namespace
    return any(isinstance(t.get("namespace"), str) and t.get("namespace") not in (None, "", ns) for t in p.target_refs)


def _reindex_level(a: Analysis, kk: tuple[str, str], level: Ref) -> None:
    ev = a.evaluator
    entry = a.entries.get((kk, level))
    at = ev.entries_at.setdefault(level, {})
    kinds = ev.kinds_at.setdefault(level, [])
    if entry is None:
        at.pop(kk, None)
        if kk in kinds:
            kinds.remove(kk)
    else:
        at[kk] = entry
        if kk not in kinds:
            bisect.insort(kinds, kk)
    if not at:
        ev.entries_at.pop(level, None)
        ev.kinds_at.pop(level, None)


def prepare(a: Analysis) -> None:
    """Build, right after a full analysis, the indexes the first incremental update would otherwise
    build on its own time (at 50k routes, tens of milliseconds of the first edit)."""
    nodes_at(a)
    a.affected  # noqa: B018 - and with it the effective policies by target
    a._declaring_index()
    a._effective = None  # the flat list: every update drops it (and letting go of a million items takes ms)


def nodes_at(a: Analysis) -> dict[Ref, dict[PathNode, None]]:
    """Every path node by its level (built once, on the first incremental update)."""
    topo = a.topology
    idx = getattr(topo, "_nodes_at", None)
    if idx is None:
        idx = {}
        stack = [topo.root]
        while stack:
            n = stack.pop()
            if n.level is not None:
                idx.setdefault(n.level, {})[n] = None
            if n.children:
                stack.extend(n.children.values())
        topo._nodes_at = idx  # type: ignore[attr-defined]
    return idx


def _recompute_below(a: Analysis, levels: set[Ref], dirty: set[Ref] = frozenset()) -> set[Ref]:  # type: ignore[assignment]
    """New summaries and effective policies for every node at or below the levels; objects whose
    affecting policies changed (`dirty`: owners to check in any case)."""
    idx = nodes_at(a)
    seen: set[int] = set()
    nodes: list[PathNode] = []
    for level in levels:
        stack = list(idx.get(level, ()))
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            nodes.append(n)
            if n.children:
                stack.extend(n.children.values())
    return _recompute_nodes(a, nodes, dirty)


def _recompute_nodes(a: Analysis, nodes: list[PathNode], dirty: set[Ref] = frozenset(),  # type: ignore[assignment]
                     lost: dict[Ref, list[EffectivePolicy]] | None = None, in_order: bool = True) -> set[Ref]:
    """New summaries and effective policies for these nodes (each listed once, parents before
    children or not: summaries are derived on demand); objects whose affecting policies changed.
    `dirty`: owners to check in any case; `lost`: the effective policies of paths the caller took
    away, by owner (when the new paths bring at least their policies, the owner is not rescanned);
    `in_order`: keep a target's paths in the order a full analysis lists them (a route change lists a
    backend's paths as routes reach it in any case: sorting its thousands of paths would buy nothing)."""
    for n in nodes:
        n.summary = None
    by = a._by_effective_target
    assert by is not None
    paths = a.topology.paths
    kinds = a.kinds
    per_target: dict[Ref, list[PathNode]] = {}
    for n in nodes:
        target = n.level
        if target is not None and n in paths.get(target, ()):  # a Namespace level inside a path is no target's path
            per_target.setdefault(target, []).append(n)
    owners: set[Ref] = set(dirty)
    gone: dict[Ref, list[EffectivePolicy]] = {o: list(eps) for o, eps in (lost or {}).items()}
    gained: dict[Ref, list[EffectivePolicy]] = {}
    for target, fresh_nodes in per_target.items():  # each target once, however many of its paths changed
        fresh: dict[PathNode, list[EffectivePolicy]] = {
            n: [EffectivePolicy(target, n, kinds[kk], res) for kk, res in a.evaluator.evaluate_node(target, n) if res.leaves]
            for n in fresh_nodes}
        per_path = by.get(target)
        if per_path is None:
            per_path = by[target] = {}
        replaced = [ep for n in fresh for ep in per_path.get(n, ())]
        added = False
        for n, eps in fresh.items():
            if eps:
                added = added or n not in per_path
                per_path[n] = eps  # an existing path keeps its place
            else:
                per_path.pop(n, None)
        if added and in_order:  # paths that had no effective policy before: the order a full analysis gives
            order = {node: i for i, node in enumerate(paths[target])}
            by[target] = per_path = dict(sorted(per_path.items(), key=lambda kv: order.get(kv[0], 0)))
        if not per_path:
            by.pop(target, None)
        # the policies the owner's other paths bring stay; if these paths bring the same ones as
        # before, what affects the owner is unchanged (a Service behind many routes: no rescan)
        if policies_by_kind(replaced) != policies_by_kind(chain.from_iterable(fresh.values())):
            owners.add(target.object)
            gone.setdefault(target.object, []).extend(replaced)
            gained.setdefault(target.object, []).extend(chain.from_iterable(fresh.values()))
    a._effective = None
    changed: set[Ref] = set()
    affected = a.affected  # computed from scratch the first time, then kept up to date here
    for owner in owners:
        before = affected.get(owner, {})
        if owner in gone:
            # what the owner loses, it gets back from the new paths: it keeps all it had, plus what they bring
            lost_kinds, got = policies_by_kind(gone[owner]), policies_by_kind(gained.get(owner, ()))
            if all(refs <= got.get(kk, set()) for kk, refs in lost_kinds.items()):
                now = {kk: before.get(kk, set()) | got.get(kk, set()) for kk in set(before) | set(got)}
                if now != before:
                    changed.add(owner)
                    affected[owner] = now
                continue
        targets = [owner] + [owner.with_section(s) for s in a.topology.sections.get(owner, [])]
        now = policies_by_kind(chain.from_iterable(eps for t in targets for eps in by.get(t, {}).values()))
        if now != affected.get(owner, {}):
            changed.add(owner)
            if now:
                affected[owner] = now
            else:
                affected.pop(owner, None)
    return changed


def _subtree(node: PathNode) -> list[PathNode]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        if n.children:
            stack.extend(n.children.values())
    return out


def update_route(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """Replace (or delete) one route: its paths, its rules, and the paths of its backends through it.

    The route's subtrees of path nodes are cut out and grown again; Services a route no longer
    reaches get back their `Namespace > Service > port` paths; the policies on the route, its rules
    and its backends are resolved again (their targets may have appeared or gone); what lies on
    the new and changed paths is recomputed. Returns the objects to check, or None.
    """
    if ref.group != GATEWAY_GROUP or ref.kind not in ROUTE_KINDS or ref.namespace is None:
        return None
    if raw is not None and object_problem(raw) is not None:
        return None  # malformed: a full analysis leaves it out and says why (gwpolicy.shapes)
    if ref.namespace not in a.index.namespaces:
        return None
    topo, index = a.topology, a.index
    a.affected  # noqa: B018 - materialise it (and the effective policies by target) before anything changes
    idx = nodes_at(a)
    # 1. cut the route's subtrees out
    changed: set[Ref] = {ref}
    old_backends: set[Ref] = set()
    existed: dict[Ref, bool] = {}  # backends and whether the hierarchy held them before the edit
    for node in list(topo.paths.get(ref, ())):
        for m in _subtree(node):
            lv = m.level
            if lv is None:
                continue
            reg = topo.paths.get(lv)
            if reg is not None and m in reg:
                del reg[m]
                changed.add(lv)
                if lv.object != ref and lv.section is None:
                    old_backends.add(lv)
                    existed.setdefault(lv, True)
            at = idx.get(lv)
            if at is not None:
                at.pop(m, None)
        if node.parent is not None and node.parent.children:
            node.parent.children.pop(node.level, None)
    for s in topo.sections.pop(ref, []):
        changed.add(ref.with_section(s))
        topo.paths.pop(ref.with_section(s), None)
    topo.paths.pop(ref, None)
    topo.route_parents.pop(ref, None)
    # 2. the object
    obj = replace_object(index, ref, raw)
    new_backends: set[Ref] = set()
    if obj is not None:
        for b in _backend_refs(obj):
            existed.setdefault(b, b in topo.paths)
        new_backends = attach_route(topo, obj, index, ReferenceGrants(index))
        for s in topo.sections.get(ref, []):
            changed.add(ref.with_section(s))
    # 3. backends: standalone paths where no route reaches, none where one does; virtual ones may vanish
    grown: list[PathNode] = []  # standalone paths put back: new to the effective policies
    for b in old_backends | new_backends:
        changed.add(b)
        svc = b.group == CORE_GROUP and b.kind == "Service" and b in index.by_ref
        standalone = extend(topo.root, b)
        via_routes = [n for n in topo.paths.get(b, {}) if n is not standalone]
        if svc:
            if via_routes:
                topo.paths.get(b, {}).pop(standalone, None)
            elif standalone not in topo.paths.get(b, {}):
                topo.add_path(b, standalone)
                grown.append(standalone)
            for p in topo.ports_of.get(b, []):
                pref = b.with_section(p["name"])
                changed.add(pref)
                own = standalone.child(pref)
                reg = topo.paths.get(pref, {})
                others = [n for n in reg if n is not own]
                if others:
                    reg.pop(own, None)
                elif own not in reg:
                    topo.add_path(pref, own)
                    grown.append(own)
        elif not topo.paths.get(b):
            topo.paths.pop(b, None)
            topo.virtual.discard(b)
        elif b not in index.by_ref:
            topo.virtual.add(b)
    for t in list(changed):
        if t in topo.paths and not topo.paths[t]:
            del topo.paths[t]
    # 4. the node index: new nodes below the route's new paths, and standalone ones
    for t in changed:
        for n in topo.paths.get(t, ()):
            idx.setdefault(n.level, {})[n] = None
            if n.parent is not None and n.parent.level is not None:  # a Namespace level the route added
                idx.setdefault(n.parent.level, {})[n.parent] = None
    for node in topo.paths.get(ref, ()):
        for m in _subtree(node):
            idx.setdefault(m.level, {})[m] = None
    # 5. effective policies of what changed: drop those of paths that are gone, compute the rest
    by = a._by_effective_target
    assert by is not None
    trimmed: set[Ref] = set()  # owners that lost effective policies with their paths
    lost: dict[Ref, list[EffectivePolicy]] = {}
    for t in changed:
        live = topo.paths.get(t, {})
        per_path = by.get(t)
        if per_path is None:
            continue
        gone = [n for n in per_path if n not in live]
        if gone:
            trimmed.add(t.object)
            taken = lost.setdefault(t.object, [])
            for n in gone:
                taken.extend(per_path.pop(n))
            if not per_path:
                del by[t]
    # only the nodes the edit grew are new: the paths of a backend through other routes, and their
    # summaries, do not depend on this route (a Service behind a thousand routes is not recomputed)
    fresh = [m for node in topo.paths.get(ref, ()) for m in _subtree(node)] + grown
    check = _recompute_nodes(a, fresh, trimmed, lost, in_order=False) | {ref} | {t.object for t in changed if t.object in index.by_ref}
    affected = a.affected
    for t in changed:  # owners whose every path went away
        owner = t.object
        if owner not in topo.paths and owner in affected:
            del affected[owner]
            check.add(owner)
    # 6. policies on the route, its rules, and on backends that came into or went out of the hierarchy:
    #    their targets may have come or gone (a backend there before and after is the same target)
    moved = {b for b, before in existed.items() if before != (b in topo.paths)}
    declared = set(a.policies_declaring(ref)).union(*(a.policies_declaring(b) for b in moved))
    for pref in sorted(declared, key=Ref.sort_key):
        sub = update_policy(a, pref, a.index.by_ref[pref].raw)
        if sub is None:
            return None
        check |= sub
    a._status = a._status_by_ref = a._affects = a._by_target = None
    a._effective = None
    return check


def _backend_refs(route: Obj) -> set[Ref]:
    """The backends a route's rules name (before attachment decides which it reaches)."""
    out: set[Ref] = set()
    spec = route.spec if isinstance(route.spec, dict) else {}
    for rule in spec.get("rules") or []:
        if not isinstance(rule, dict):
            continue
        for b in rule.get("backendRefs") or []:
            if isinstance(b, dict) and isinstance(b.get("name"), str):
                group = b.get("group") or CORE_GROUP
                ns = b.get("namespace") if isinstance(b.get("namespace"), str) else route.namespace
                out.add(Ref(group if isinstance(group, str) else CORE_GROUP, b.get("kind") or "Service", ns, b["name"]))
    return out
