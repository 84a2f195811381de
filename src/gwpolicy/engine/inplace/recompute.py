"""Any object created, changed or deleted, applied to an analysis in place (the controller's, the
webhook's and the gateway's fast path): `apply_change` is the one entry point.

Only what the change can affect is recomputed: for a policy, the conflicts on the targets it had and
has; for a route, its paths and those of its backends through it; for a Gateway (listeners,
hostnames, allowedRoutes, its class), a Service (created, deleted, its ports), a Namespace (labels,
created, deleted) and a ReferenceGrant, the paths of the routes that name it, or that it lets
through, derived again and compared with the ones they had; then the path nodes that came (their
summaries and effective policies), the breadcrumbs of the objects whose affecting policies change,
and the status of the policies on the targets whose paths or existence changed.

What still returns None (the caller runs a full analysis), being rare and costly to follow: a
GatewayClass (every Gateway of the class moves), a CustomResourceDefinition or PolicyKind (a new
policy kind, or a kind's schema and rules), an object in a namespace the analysis does not know yet,
a malformed object (a full analysis leaves it out and says why), an object deleted from a
namespace no Namespace object names (it may be the last that makes the namespace exist, S4.5; a
live cluster always has the Namespace object), and objects of other kinds.
Property tests hold that the result equals a full analysis of the same objects.
"""

from __future__ import annotations

import bisect
import gc
from collections import Counter
from itertools import chain, filterfalse
from typing import AbstractSet, Any, Iterable, cast

from gwpolicy.engine.analysis import Analysis, level_entry
from gwpolicy.engine.attach import TargetOutcome, resolve_targets
from gwpolicy.engine.effective import EMPTY_TRAIL, Evaluator, KindKey, LevelEntry, Pairs, Result, Summary, trail_through
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.kinds import ROUTE_KINDS, split_api_version
from gwpolicy.engine.merge.fieldmerge import Contribution
from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.policies import TARGET_FIELDS, Policy, PolicyKind, parse_policy
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.engine.shapes import list_map_problem, object_problem
from gwpolicy.engine.topology import (
    PathNode,
    Topology,
    add_backend_paths,
    attach_route,
    extend,
    gateway_listeners,
    names_gateway,
    namespace_ref,
    new_ref,
    parent_gateway,
    paths_of_route,
    route_rules,
    service_ports,
)


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
    and the gateway use, whatever the kind.

    The cyclic collector is kept off while it runs: a change that moves a thousand routes allocates
    tens of thousands of objects that live on (effective policies and their lists, summaries) and
    makes no reference cycle (a node cut out of the tree is freed by reference counting), so the
    collections their allocation would trigger (every 700 objects, each older generation in turn)
    would find nothing; one young collection follows, at the caller's next allocation."""
    was = gc.isenabled()
    gc.disable()
    try:
        return _apply_change(a, raw, new)
    finally:
        if was:
            gc.enable()


def _apply_change(a: Analysis, raw: dict[str, Any], new: dict[str, Any] | None) -> set[Ref] | None:
    if new is None:
        ns = (raw.get("metadata") or {}).get("namespace")
        if ns and namespace_ref(ns) not in a.index.by_ref:
            return None  # it may be the last object that makes its namespace exist (S4.5): whatever its kind
    ref = policy_ref(a, raw)
    if ref is not None:
        return update_policy(a, ref, new)
    group, _ = split_api_version(raw.get("apiVersion", ""))
    meta = raw.get("metadata") or {}
    obj = Ref(group, raw.get("kind", ""), meta.get("namespace") or None, meta.get("name") or "")
    if obj.kind in ROUTE_KINDS:
        return update_route(a, obj, new)
    if new is not None and object_problem(new) is not None:
        return None  # malformed: a full analysis leaves it out and says why (gwpolicy.engine.shapes)
    if (obj.group, obj.kind) == (GATEWAY_GROUP, "Gateway"):
        return update_gateway(a, obj, new)
    if (obj.group, obj.kind) == (CORE_GROUP, "Service"):
        return update_service(a, obj, new)
    if (obj.group, obj.kind) == (CORE_GROUP, "Namespace"):
        return update_namespace(a, obj, new)
    if (obj.group, obj.kind) == (GATEWAY_GROUP, "ReferenceGrant"):
        return update_grant(a, obj, new)
    if (obj.group, obj.kind) in UNREAD_KINDS:
        return update_unread(a, obj, new)
    return None


# Kinds the policy analysis holds in its index but never reads: a gateway's data plane reads
# endpoints, certificates and CA bundles from there. They change far more often than anything
# else (every pod that comes or goes changes an EndpointSlice).
UNREAD_KINDS = {("discovery.k8s.io", "EndpointSlice"), (CORE_GROUP, "Secret"), (CORE_GROUP, "ConfigMap")}


def update_unread(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """An object of a kind the analysis does not read: its new copy put in the index, nothing to
    recompute. A full analysis when a policy names the kind as a target (the object may be one),
    when the kind or the namespace would be new to the index, or when the kind's last object goes
    (and, as for every kind, `_apply_change`, when a deleted object may be all that makes its
    namespace exist)."""
    if ref.namespace is not None and ref.namespace not in a.index.namespaces:
        return None
    same_kind = a.index.of_kind(ref.group, ref.kind)
    if not same_kind or (raw is None and len(same_kind) == 1):
        return None
    if _kinds_targeted(a)[ref.kind]:
        return None
    replace_object(a.index, ref, raw)
    return set()


def _kinds_targeted(a: Analysis) -> Counter[Any]:
    """How many targetRefs of the policies name each kind: made with the first unread object's
    change (a Secret renewed: at 10k routes, 4,000 policies scanned each time), then kept by
    `update_policy`."""
    got: Counter[Any] | None = a._kinds_targeted
    if got is None:
        got = Counter(t.get("kind") for p in a.policies.values() for t in p.target_refs if isinstance(t, dict))
        a._kinds_targeted = got
    return got


def _named_across(a: Analysis) -> dict[str, set[Ref]]:
    """Namespace -> the policies of other namespaces with a targetRef naming it (a ReferenceGrant
    there may change what they attach to, S3.4): made with the first grant change (at 20k routes,
    a scan of every policy's outcomes was a tenth of a grant edit), then kept by `update_policy`."""
    got: dict[str, set[Ref]] | None = a._named_across
    if got is None:
        got = {}
        for p in a.policies.values():
            _name_across(got, p, True)
        a._named_across = got
    return got


def _name_across(got: dict[str, set[Ref]], p: Policy, add: bool) -> None:
    own = p.ref[2]
    for t in p.target_refs:
        ns = t.get("namespace") if isinstance(t, dict) else None
        if isinstance(ns, str) and ns != own:
            if add:
                got.setdefault(ns, set()).add(p.ref)
            else:
                got.get(ns, set()).discard(p.ref)


def _count_targets(a: Analysis, p: Policy, by: int) -> None:
    """`_kinds_targeted` and `_named_across` kept up to date as a policy goes (-1) or comes (+1),
    once they are made."""
    got: Counter[Any] | None = a._kinds_targeted
    if got is not None:
        for t in p.target_refs:
            if isinstance(t, dict):
                got[t.get("kind")] += by
    across: dict[str, set[Ref]] | None = a._named_across
    if across is not None:
        _name_across(across, p, by > 0)


def _misfits_schema(raw: dict[str, Any], kind: PolicyKind) -> bool:
    spec_schema = ((kind.schema or {}).get("properties") or {}).get("spec")
    return isinstance(spec_schema, dict) and list_map_problem(raw.get("spec"), spec_schema, "spec") is not None


def update_policy(a: Analysis, ref: Ref, raw: dict[str, Any] | None) -> set[Ref] | None:
    """Replace (or delete, with raw None) one policy; the objects whose status may change, or None."""
    kind = a.kinds.get((ref.group, ref.kind))
    if kind is None:
        return None
    if raw is not None and (object_problem(raw) is not None or _misfits_schema(raw, kind)):
        return None  # malformed: a full analysis leaves it out and says why (gwpolicy.engine.shapes)
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
        _count_targets(a, a.policies.pop(ref), -1)
        for o in a.outcomes.pop(ref, []):
            if declaring is not None and o.declared is not None:
                declaring.get(o.declared.object, set()).discard(ref)
    if new is not None:
        outs = resolve_targets(new, index, a.topology, ReferenceGrants(index) if _needs_grants(new) else _NO_GRANTS)
        if len(a.topology.paths) != paths_before:
            return None  # it targets an object the hierarchy did not hold (S1.4): analyse it all
        a.policies[ref] = new
        _count_targets(a, new, +1)
        a.outcomes[ref] = outs
        if declaring is not None:
            for o in outs:
                if o.declared is not None:
                    declaring.setdefault(o.declared.object, set()).add(ref)
        touched_levels |= {o.declared for o in outs if o.attached and o.declared is not None}
    kk = kind.key
    check: set[Ref] = {ref} if new is not None else set()
    refreshed: set[Contribution] = set()  # contributions given new leaves in place
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
            entry = level_entry(kind, members, a.outcomes, level)
            before = a.entries.get(key)
            if len(touched_levels) == 1 and level.kind in _WIDE_LEVELS and _same_stanzas(before, entry):
                # the same stanzas as before (a value edit): the entry and its contributions stay,
                # with the new leaves, so the summary of every node below stands as it is
                for stanza, c in entry.contributions.items():
                    kept = before.contributions[stanza]  # type: ignore[union-attr]
                    kept.leaves = c.leaves
                    refreshed.add(kept)
            else:
                a.entries[key] = entry
        else:
            a.attached.pop(key, None)
            a.entries.pop(key, None)
        _reindex_level(a, kk, level)
    if refreshed:
        _forget_results(a.evaluator, kk, refreshed)
    check |= _recompute_below(a, touched_levels, kk, summaries_stand=bool(refreshed))
    a._status = None
    a._status_by_ref = None
    a._affects = None
    a._by_target = None
    ev = a.evaluator
    size = sum(map(len, ev.memos.values()))
    if ev.memo_base is None:
        ev.memo_base = size
    elif size > 2 * ev.memo_base + 10_000:  # results of ladders no path uses any more pile up
        for memo in ev.memos.values():
            memo.clear()
        ev.memo_base = 0
    return check


#: levels with thousands of nodes below, where deriving no summary again pays for the scan of the
#: kind's memo that a refresh in place needs (a few ms at 50k routes: more than a route's policy
#: edit costs in all, which keeps the plain replacement)
_WIDE_LEVELS = frozenset({"Namespace", "Gateway", "GatewayClass"})


def _same_stanzas(before: LevelEntry | None, after: LevelEntry) -> bool:
    """Does a FieldMerge level entry give what it gave in the same stanzas (only the leaves may
    differ)? Then the summaries of the paths through it, which hold its contributions by identity
    and read only which stanzas it has, stand once the contributions take the new leaves."""
    return (before is not None and not (before.inherited or before.direct or after.inherited or after.direct)
            and before.contributions.keys() == after.contributions.keys())


def _forget_results(ev: Evaluator, kk: KindKey, contributions: set[Contribution]) -> None:
    """Drop the memoised results of every ladder holding one of these contributions (given new
    leaves in place: those results are stale); only the kind's own memo holds them."""
    memo = ev.memos.get(kk, {})
    for k in list(filterfalse(contributions.isdisjoint, memo)):  # read in C: tens of thousands of keys
        del memo[k]


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
    topo = a.topology
    if topo._nodes_at is None:
        topo._nodes_at = _nodes_at_of_full_analysis(topo)
    route_index(a)
    a.affected  # noqa: B018 - and with it the effective policies by target
    a._declaring_index()
    _kinds_targeted(a)  # the first Secret renewed
    _named_across(a)  # the first ReferenceGrant changed (about 4 ms at 20k routes)
    a._effective = None  # the flat list: every update drops it (and letting go of a million items takes ms)


def _nodes_at_of_full_analysis(topo: Topology) -> dict[Ref, dict[PathNode, None]]:
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


def nodes_at(a: Analysis) -> dict[Ref, dict[PathNode, None]]:
    """Every path node by its level (built by `prepare`, or else on the first incremental update)."""
    topo = a.topology
    idx = topo._nodes_at
    if idx is None:
        idx = {}
        stack = [topo.root]
        while stack:
            n = stack.pop()
            if n.level is not None:
                idx.setdefault(n.level, {})[n] = None
            _push_children(stack, n)
        topo._nodes_at = idx
    return idx


def _push_children(stack: list[PathNode], node: PathNode) -> None:
    """A tree walk's step: the node's children onto the stack, one by one (not
    `stack.extend(children.values())`: mypyc iterates a dict natively, while `extend` of a view goes
    through the generic iterator, 1.7k instructions a call in the compiled core)."""
    ch = node.children
    if ch:
        for c in ch.values():
            stack.append(c)


def _recompute_below(a: Analysis, levels: set[Ref], kk: KindKey, summaries_stand: bool = False) -> set[Ref]:
    """New summaries and effective policies of one policy kind (the one whose entries at these
    levels changed: a policy created, edited or deleted) for every node at or below the levels;
    objects whose affecting policies changed.

    One walk down from the levels does it all: each node's summary brought up to date, and, on a
    target's path, that kind's result alone computed again (the other kinds' results stand) and put
    in place of the one it had. An owner is looked at again only where a path's result of that kind
    comes from other policies than before (a value edit of a namespace-wide policy changes
    thousands of results and no owner's affecting policies). `summaries_stand`: the level's entry
    kept its contributions (given new leaves in place), so no summary changes."""
    idx = nodes_at(a)
    paths = a.topology.paths
    ev = a.evaluator
    kind = a.kinds[kk]
    only = (kk,)
    by = a._by_effective_target
    assert by is not None
    owners: set[Ref] = set()
    resort: set[Ref] = set()  # targets with a path that had no effective policy before
    # One level: its nodes' subtrees never overlap (S4.2) and the walk meets parents first, so each
    # summary is brought up to date from its parent's as the walk goes (`_resummarise`). Several
    # levels (a Gateway and its listener) may overlap: summaries are dropped first, then derived on
    # demand.
    # One kind's result on a path is fixed by that kind's trails here and above (and above the
    # owner, for a section), the entries of the kind at the target and its owner, and the owner's
    # mapped value (see `Evaluator.evaluate_node`): at 50k routes a namespace-wide edit meets 13k
    # paths with about 1.1k distinct such keys, so each result is computed once per key (for this
    # update only: the trails it keys on are the ones this walk leaves).
    entries_at = ev.entries_at
    done: dict[tuple, Result | None] = {}
    differ: dict[tuple[Result, Result], bool] = {}  # (old, new) result -> from other policies?
    remap: dict[Result, Result | None] = {}  # where summaries stand: a node's old result -> its new one
    values: dict[Ref, Any] = {}
    mapped = bool(kind.field_mappings)
    last_old = last_res = other = None
    lists = _NewLists(kind)
    swapped, inserted = lists.swapped, lists.inserted
    one = len(levels) == 1
    stack = [n for level in levels for n in idx.get(level, ())]
    if not one:
        stack = _drop_summaries(stack)
    pop, extend = stack.pop, stack.extend
    while stack:
        n = pop()
        if one:
            if not summaries_stand:
                _resummarise(ev, n, kk)
            if n.children:
                extend(n.children.values())
        target = n.level
        per_path = by.get(target)  # type: ignore[arg-type]
        eps = per_path.get(n) if per_path is not None else None
        if eps is None and n not in paths.get(target, _NO_PATHS):  # type: ignore[arg-type]
            continue  # a Namespace level inside a path is no target's path (a node with effective policies is one)
        at = -1
        if eps:
            for i, item in enumerate(eps):
                if item[0] is kind:
                    at = i
                    break
        res = _UNSEEN
        if summaries_stand and at >= 0:
            # summaries stand and the contributions kept their identity: the node's ladder is the
            # one its old result was computed from, so the new result follows from the old one
            was = eps[at][1]  # type: ignore[index]
            res = remap.get(was, _UNSEEN)
        if res is not _UNSEEN:
            pass
        elif (t_here := (n.summary or ev.summary(n)).trails.get(kk)) is None:
            res = None
        else:
            parent = n.parent
            above = parent.summary  # type: ignore[union-attr]
            if above is None:
                above = ev.summary(parent)
            if mapped:
                value = values.get(target, _UNSEEN)  # type: ignore[arg-type]
                if value is _UNSEEN:
                    value = values[target] = ev.object_value(target.object, kind)  # type: ignore[index, union-attr]
            else:
                value = None
            at_target = entries_at.get(target)  # type: ignore[arg-type]
            own = at_target.get(kk) if at_target is not None else None
            # what `Evaluator.evaluate_node` reads for this kind, trails compared by value (the same
            # Service below many routes has equal trails on each path)
            if target.section is None:  # type: ignore[union-attr]
                key: tuple[Any, ...] = (t_here, above.trails.get(kk), own, value)
            else:
                grand = parent.parent  # type: ignore[union-attr]
                above_owner = grand.summary  # type: ignore[union-attr]
                if above_owner is None:
                    above_owner = ev.summary(grand)
                at_owner = entries_at.get(parent.level)  # type: ignore[union-attr, arg-type]
                key = (t_here, above.trails.get(kk), above_owner.trails.get(kk), own,
                       at_owner.get(kk) if at_owner is not None else None, value)
            res = done.get(key, _UNSEEN)
            if res is _UNSEEN:
                res = ev.evaluate_node(target, n, only)[0][1]  # type: ignore[arg-type]
                if not res.leaves:
                    res = None
                done[key] = res
            if summaries_stand and at >= 0:
                remap[was] = res
        if at >= 0:
            was = eps[at][1]  # type: ignore[index]
            if was is res:
                continue
            # a new list, never the old one changed: readers (the gateway's build cache) take an
            # unchanged list, by identity, for an unchanged node; the paths that shared the old
            # list share the new one
            if res is None:
                fresh = swapped(eps, at, None)  # type: ignore[arg-type]
                if fresh:
                    per_path[n] = fresh  # type: ignore[index]
                else:
                    del per_path[n]  # type: ignore[union-attr]
                    if not per_path:
                        del by[target]  # type: ignore[arg-type]
                owners.add(target.object)  # type: ignore[union-attr]
                continue
            per_path[n] = swapped(eps, at, res)  # type: ignore[index, arg-type]
            if was is not last_old or res is not last_res:  # runs of paths with the same pair: no lookup
                pair = last_old, last_res = was, res  # a few distinct pairs among thousands of paths: compared once each
                other = differ.get(pair)
                if other is None:
                    other = differ[pair] = was.policies != res.policies
            if other:
                owners.add(target.object)  # type: ignore[union-attr]
        elif res is not None:
            fresh = inserted(eps or _NO_PAIRS, res)
            if eps:
                per_path[n] = fresh  # type: ignore[index]
            elif per_path is None:
                by[target] = {n: fresh}  # type: ignore[index]
            else:
                per_path[n] = fresh
                resort.add(target)  # type: ignore[arg-type]
            if res.policies:
                owners.add(target.object)  # type: ignore[union-attr]
    for target in resort:  # the order a full analysis gives
        order = {node: i for i, node in enumerate(paths[target])}
        by[target] = dict(sorted(by[target].items(), key=lambda kv: order.get(kv[0], 0)))
    a._effective = None
    a.affected  # noqa: B018 - computed from scratch the first time, kept up to date below
    return {owner for owner in owners if _refresh_affected(a, owner)}


class _NewLists:
    """The `Pairs` one kind's walk (`_recompute_below`) gives paths in place of their old lists:
    made once per distinct old list and new result, so that the paths which shared a list share
    its successor (a namespace-wide edit meets 13k paths at 50k routes with a few hundred distinct
    lists). A made list holds its old one, whose id keys it, so no id is reused meanwhile."""

    def __init__(self, kind: PolicyKind) -> None:
        self.kind = kind
        self.made: dict[tuple[int, int], tuple[Pairs, Pairs]] = {}

    def swapped(self, old: Pairs, at: int, res: Result | None) -> Pairs:
        """`old` with its item `at` (this kind's) given result `res`, or taken out when None."""
        key = (id(old), id(res))
        got = self.made.get(key)
        if got is None:
            new = old[:at] + old[at + 1:] if res is None else old[:at] + [(self.kind, res)] + old[at + 1:]
            got = self.made[key] = (old, new)
        return got[1]

    def inserted(self, old: Pairs, res: Result) -> Pairs:
        """`old` (holding no item of this kind) with one of result `res`, in kind order."""
        key = (id(old), id(res))
        got = self.made.get(key)
        if got is None:
            kk = self.kind.key
            at = next((i for i, (k, _) in enumerate(old) if k.key > kk), len(old))
            got = self.made[key] = (old, old[:at] + [(self.kind, res)] + old[at:])
        return got[1]


_NO_TABLES: dict = {}  # `_lists_of` with no batch: every table read from `by`


def _refresh_affected(a: Analysis, owner: Ref) -> bool:
    """What affects `owner` (on itself and its sections) gathered again from its paths' effective
    policies, each distinct list read once however many paths share it; True when that changed."""
    by = a._by_effective_target
    assert by is not None
    lists = _lists_of(by, a.topology.sections, owner)
    return _set_affected(a, owner, _policies_of_pairs({id(pairs): pairs for pairs in lists}.values()))


def _lists_of(by: dict[Ref, dict[PathNode, Pairs]], sections: dict[Ref, list[str]], owner: Ref,
              fetched: dict[Ref, dict[PathNode, Pairs]] = _NO_TABLES) -> list[Pairs]:
    """The list of every path of `owner` and of its sections (one list per path: paths share lists).
    `fetched`: the targets' tables the caller has just read from `by` (a small table, in the cache:
    `by` is one entry per target of the cluster, and reading it is most of the cost here); an empty
    one there is one `by` no longer holds, so `by` is asked again and gives none."""
    lists: list[Pairs] = []
    pp = fetched.get(owner) or by.get(owner)
    if pp:
        for pairs in pp.values():  # appended one by one: mypyc walks a dict natively, `+=` of a view does not
            lists.append(pairs)
    secs = sections.get(owner)
    if secs:
        for s in secs:
            # `owner.with_section(s)`, as a plain tuple: only looked up (a tuple equals the Ref with
            # its fields, and hashes alike), and half the cost of making a Ref, for thousands of owners
            sec = cast(Ref, (owner[0], owner[1], owner[2], owner[3], s))
            pp = fetched.get(sec) or by.get(sec)
            if pp:
                for pairs in pp.values():
                    lists.append(pairs)
    return lists


def _policies_of_pairs(lists: Iterable[Pairs]) -> dict[KindKey, AbstractSet[Ref]]:
    """Policy kind -> the policies these (kind, result) lists draw on (S8.4), kinds in the order
    they first appear. A kind's set is the result's own (frozen) set where one result gives it
    all: no copy per owner (what affects an object is only read, and replaced as a whole)."""
    now: dict[KindKey, Any] = {}
    for pairs in lists:
        for kind, res in pairs:
            if res.policies:
                _fold(now, kind.key, res.policies)
    return now


def _fold(now: dict[KindKey, Any], kk: KindKey, pol: Any) -> None:
    """Add the policies `pol` of kind `kk` to `now`, keeping the set already there when it holds
    them all (the first result's own frozen set stays shared until another adds to it)."""
    got = now.get(kk)
    if got is None:
        now[kk] = pol
    elif not pol <= got:
        now[kk] = got | pol


def _set_affected(a: Analysis, owner: Ref, now: dict[KindKey, AbstractSet[Ref]]) -> bool:
    """What affects `owner` set to `now`; True when that changed."""
    if now == a.affected.get(owner, {}):
        return False
    if now:
        a.affected[owner] = now
    else:
        a.affected.pop(owner, None)
    return True


def _drop_summaries(starts: list[PathNode]) -> list[PathNode]:
    """Every node at or below these, once, its summary dropped (to be derived again on demand)."""
    seen: set[int] = set()
    out: list[PathNode] = []
    stack = list(starts)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        n.summary = None
        out.append(n)
        _push_children(stack, n)
    out.reverse()  # popped from the end: parents first, as a walk would meet them
    return out


_NO_PATHS: dict[PathNode, None] = {}
_UNSEEN: Any = object()



def _resummarise(ev: Evaluator, n: PathNode, kk: KindKey) -> None:
    """The node's summary after a change to the entries of one kind (its parent's summary already
    up to date): where the level holds none of that kind, the summary it had with that kind's trail
    taken from the parent's, or, where it holds some, the parent's trail carried through them (the
    other kinds' trails stand either way)."""
    p = n.parent
    above = p.summary if p is not None and p.summary is not None else ev.summary(p)
    if not ev.kinds_at.get(n.level):  # type: ignore[arg-type]
        n.summary = above
        return
    old = n.summary
    if old is None:
        ev.summary(n)
        return
    trails = dict(old.trails)
    t = above.trails.get(kk)
    entry = ev.entries_at[n.level].get(kk)  # type: ignore[index]
    if entry is not None:
        t = trails[kk] = trail_through(t if t is not None else EMPTY_TRAIL, entry)
    elif t is None:
        trails.pop(kk, None)
    else:
        trails[kk] = t
    kinds = old.kinds if (kk in old.trails) == (t is not None) else tuple(sorted(trails))
    n.summary = Summary(trails, kinds)


def _recompute_nodes(a: Analysis, per_target: dict[Ref, list[PathNode]], lost: dict[Ref, list[Pairs]],
                     owners: dict[Ref, tuple[list[Pairs], list[Pairs]]], fresh_summaries: bool = False) -> set[Ref]:
    """New summaries and effective policies (every kind) for these paths of each target (each node
    listed once, parents before children or not: summaries are derived on demand); objects whose
    affecting policies changed. `lost`: the lists of the paths the caller took away, by
    owner (when the new paths bring at least their policies, the owner is not rescanned: what it
    had, plus what they bring). `owners` receives each owner of a target given (the caller's
    objects to check). `fresh_summaries`: every node's summary already dropped (`_graft`).
    A path new to a target is listed after its others, not in the
    order a full analysis lists them (what shows them sorts them: an EffectivePolicy object's
    `paths`; sorting a backend's thousands of paths on every route change would buy nothing)."""
    if not fresh_summaries:
        for nodes in per_target.values():
            for n in nodes:
                n.summary = None
    by = a._by_effective_target
    assert by is not None
    ev = a.evaluator
    context_of = ev.contexts()
    kinds, kinds_at = ev.kinds, ev.kinds_at  # `ev.summary` and `ev.evaluate_node` called as methods: compiled, a native call
    # Results by context for this batch (nothing changes while it runs): summaries derived through
    # `shared` (`Evaluator.summary`), so that a node's summary and its parent's fix its level (a
    # level holding policies gets summaries of its own) and, with the target's context
    # (`Evaluator.contexts`: interned, keyed by identity), every result
    memo: dict[tuple, Pairs] = {}
    shared: dict = {}
    # a context's id kept as an object: boxed once per target, not once per node's memo key
    of_sections: dict[Ref, object] = {}
    fetched: dict[Ref, dict[PathNode, Pairs]] = {}  # target -> its table in `by` (empty: taken out of `by`)
    # owner -> what its paths in the batch had and have: (the old lists those paths replaced, the
    # (kind, result) lists of the paths that changed), appended as the nodes come. What affects
    # an owner with a few paths (a route, its Service) is read again from them all; one with many
    # (a Service behind many routes) keeps what it had, plus what these bring, when they bring
    # back all that the replaced ones gave
    for target, fresh_nodes in per_target.items():  # each target once, however many of its paths changed
        per_path = by.get(target)
        if per_path is None:
            per_path = by[target] = {}
        fetched[target] = per_path  # `by` is not written again meanwhile: what `_lists_of` reads below
        is_section = target[4] is not None
        owner: Ref
        cid: object
        if is_section:  # a section's node hangs from its owner's (S5.5): the owner is its parent's level
            owner = fresh_nodes[0].parent.level  # type: ignore[union-attr,assignment]  # a section's node has a parent with a level
            cid = of_sections.get(owner)  # a section's context is its owner's sections': one per owner
            if cid is None:
                cid = of_sections[owner] = id(context_of(target, owner))
        else:
            owner = target
            cid = id(context_of(target))
        rec = owners.get(owner)
        if rec is None:
            rec = owners[owner] = ([], [])
        replaced, brought = rec
        for n in fresh_nodes:
            here = n.summary
            if here is None:
                here = n.parent.summary  # type: ignore[union-attr]
                if here is not None and not kinds_at.get(n.level):  # type: ignore[arg-type]  # a level holding no policy: its parent's summary
                    n.summary = here
                else:
                    here = ev.summary(n, shared)
            if not here.kinds:
                pairs: list = _NO_PAIRS
            else:
                parent = n.parent
                above = parent.summary  # type: ignore[union-attr]
                if above is None:
                    above = ev.summary(parent, shared)
                if is_section:  # the owner's summary above is read too: derive it shared
                    grand = parent.parent  # type: ignore[union-attr]
                    if grand is not None and grand.summary is None:
                        ev.summary(grand, shared)
                key = (here, above, cid)
                got_pairs = memo.get(key)
                if got_pairs is not None:
                    pairs = got_pairs
                else:
                    pairs = memo[key] = [(kinds[kk], res) for kk, res in ev.evaluate_node(target, n) if res.leaves]
            old = per_path.get(n)
            if old is not None:
                if len(old) == len(pairs):
                    for (_, o), (_, r) in zip(old, pairs):
                        if o is not r:
                            break
                    else:  # the same results: the batch's list all the same (readers take an unchanged list by identity)
                        per_path[n] = pairs
                        continue
                replaced.append(old)
            if pairs:
                per_path[n] = pairs  # an existing path keeps its place
                brought.append(pairs)
            elif old is not None:
                del per_path[n]
        if not per_path:
            by.pop(target, None)
    a._effective = None
    changed: set[Ref] = set()
    affected = a.affected  # computed from scratch the first time, then kept up to date here
    sections = a.topology.sections
    of_lists = _PoliciesOfLists()
    visit = list(lost)
    visit.extend(o for o, rec in owners.items() if (rec[0] or rec[1]) and o not in lost)
    for owner in visit:
        lists = _lists_of(by, sections, owner, fetched)
        if len(lists) <= _FEW_PATHS:  # a handful of paths: what affects it gathered again at once
            now = of_lists(lists)
            if now != affected.get(owner, _NO_POLICIES):  # `_set_affected`, inline: thousands of owners
                if now:
                    affected[owner] = now
                else:
                    affected.pop(owner, None)
                changed.add(owner)
            continue
        before = affected.get(owner, {})
        # what the owner loses, it gets back from the new paths (a Service behind many routes, one
        # of them derived again): it keeps all it had, plus what they bring, and is not rescanned
        rec = owners.get(owner)
        gone = chain(lost.get(owner, ()), rec[0]) if rec is not None else lost.get(owner, ())
        lost_kinds = _policies_of_pairs(gone)
        got = of_lists(rec[1]) if rec is not None else {}
        if all(refs <= got.get(kk, set()) for kk, refs in lost_kinds.items()):
            now = {kk: before.get(kk, set()) | got.get(kk, set()) for kk in set(before) | set(got)}
            if now != before:
                changed.add(owner)
                affected[owner] = now
            continue
        if _refresh_affected(a, owner):
            changed.add(owner)
    return changed


_NO_PAIRS: list = []
_NO_POLICIES: dict = {}


class _PoliciesOfLists:
    """`_policies_of_pairs` of lists of (kind, result) lists (those an owner's paths have in one
    batch; the batch's memo keeps each alive, so its id names it):
    each list read once in the batch, and each set of lists merged once (the owners with the same
    lists, a Service behind routes of one namespace that no policy of their own sets apart, share
    one dict, as after a full analysis: what affects an object is only read, and replaced as a
    whole). A kind's set is the result's own (frozen) set where one result gives it all."""

    def __init__(self) -> None:
        self.of_list: dict[object, dict[KindKey, Any]] = {}
        self.of_set: dict[tuple[object, ...], dict[KindKey, Any]] = {}

    def __call__(self, lists: list[Pairs]) -> dict[KindKey, Any]:
        # the lists' ids as objects: each boxed once (a native int is boxed again each time it is a key)
        ids: list[object] = [id(pairs) for pairs in lists]
        key = tuple(ids)  # the lists as they come: owners alike come with them alike
        now = self.of_set.get(key)
        if now is not None:
            return now
        of_list = self.of_list
        now = {}
        owned = False  # `now` a copy of our own, not one list's dict
        distinct: dict[object, Pairs] = {}  # one list is shared by many nodes
        for j in range(len(lists)):  # not dict(zip(...)): a zip object and a tuple for each item
            distinct[ids[j]] = lists[j]
        for i, pairs in distinct.items():
            one = of_list.get(i)
            if one is None:  # one list holds one result per kind: nothing to fold
                one = of_list[i] = {k.key: pol for k, r in pairs if (pol := r.policies)}
            if not one or one is now:
                continue
            if not now:
                now = one
                continue
            if not owned:
                now = dict(now)  # merged into a copy: the list's own dict stays as it is
                owned = True
            for kk, pol in one.items():
                _fold(now, kk, pol)
        self.of_set[key] = now
        return now


#: an owner with no more paths than this (on itself and its sections) has what affects it gathered
#: again from them all, rather than from what its changed paths lost and brought
_FEW_PATHS = 8


def subtree_of(node: PathNode) -> list[PathNode]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        _push_children(stack, n)
    return out


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
    edit = _Edit(a)
    edit.take_route(ref)
    obj = replace_object(index, ref, raw)
    ri = a.topology._route_index
    if ri is not None:
        ri.put(ref, obj)
    if obj is not None:
        edit.put_route(obj, ReferenceGrants(index))
    _forget_object(a, edit, ref)
    edit.settle_backends()
    return _finish(a, edit, ref, {ref})


# --- changes to the hierarchy itself: Gateways, Services, Namespaces, ReferenceGrants -------------


class RouteIndex:
    """Which routes name a Gateway in their parentRefs or a backend in their backendRefs, and which
    send to another namespace (by that namespace): what a change to one of those must derive again.
    Built with the first such change (or by `prepare`), then kept up to date by every route update."""

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
        level below its path lives outside them, and none is a Gateway: `_Edit._move_route`.)"""
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


class _Edit:
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
        check = _recompute_nodes(a, per_target, lost, batch, fresh_summaries=per_target is self.moved and not self.refresh)
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
        _push_children(stack, m)
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
        _push_children(stack, m)
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


def _forget_object(a: Analysis, edit: _Edit, ref: Ref) -> None:
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


def _finish(a: Analysis, edit: _Edit, obj: Ref, reresolve: set[Ref], policies: AbstractSet[Ref] = frozenset()) -> set[Ref] | None:
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


def resolve_again(a: Analysis, ref: Ref) -> set[Ref] | None:
    """A policy whose targets may have appeared or gone, resolved again: when every targetRef
    resolves as before, nothing it gives changes (its status may: it is to be checked); else it is
    updated as if it had been edited."""
    policy = a.policies.get(ref)
    if policy is not None:
        topo = a.topology
        paths_before = len(topo.paths)
        outs = resolve_targets(policy, a.index, topo, ReferenceGrants(a.index) if _needs_grants(policy) else _NO_GRANTS)
        if len(topo.paths) != paths_before:
            return None  # it targets an object the hierarchy did not hold (S1.4): analyse it all
        if _same_resolution(outs, a.outcomes.get(ref, [])):
            return {ref}
    return update_policy(a, ref, a.index.by_ref[ref].raw)


def _same_resolution(new: list[TargetOutcome], old: list[TargetOutcome]) -> bool:
    """The same targets, attached alike; those not attached refused for the same reason, in the same words."""
    return len(new) == len(old) and all(
        n.declared == o.declared and n.attached == o.attached and n.field == o.field
        and (n.attached or (n.reason, n.message, n.in_scope) == (o.reason, o.message, o.in_scope))
        for n, o in zip(new, old))


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
    edit = _Edit(a)
    shapes = (_gateway_shape(old.raw), _gateway_shape(raw)) if old is not None and raw is not None else None
    if shapes is not None and shapes[0] == shapes[1]:
        replace_object(index, ref, raw)
        _forget_object(a, edit, ref)
        return _finish(a, edit, ref, set())
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
    _forget_object(a, edit, ref)
    # every route that may hang from a listener that changed: one whose paths stay as they were
    # costs a derivation of its paths and nothing more (`_Edit.move_routes`)
    edit.move_routes(naming, ref)
    edit.settle_backends()
    return _finish(a, edit, ref, {ref})


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
    edit = _Edit(a)
    ports_before_after = (service_ports(old), service_ports(Obj(raw, ref, "", ""))) if old is not None and raw is not None else None
    if ports_before_after is not None and ports_before_after[0] == ports_before_after[1]:
        replace_object(index, ref, raw)
        _forget_object(a, edit, ref)
        return _finish(a, edit, ref, set())
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
    _forget_object(a, edit, ref)
    grants = ReferenceGrants(index)
    for r in routes:
        robj = index.by_ref.get(r)
        if robj is not None:
            edit.put_route(robj, grants)
    edit.backends.add(ref)
    edit.settle_backends()
    return _finish(a, edit, ref, {ref})


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
    edit = _Edit(a)
    name = ref.name
    labels_before = index.namespace_labels(name)
    in_use_before = name in index.namespaces
    obj = replace_object(index, ref, raw)
    _forget_object(a, edit, ref)
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
    return _finish(a, edit, ref, {nsref} if in_use != in_use_before else set())


def _lives_in(index: ObjectIndex, ns: str) -> bool:
    """Does any object of the input live in the namespace (S4.5)? A scan: only when a Namespace
    object is deleted."""
    return any(r.namespace == ns for r in index.by_ref)


def _routes_in(index: ObjectIndex, ns: str) -> list[Obj]:
    out: list[Obj] = []
    for kind in ROUTE_KINDS:
        objs = index.of_kind(GATEWAY_GROUP, kind)
        i = bisect.bisect_left(objs, (GATEWAY_GROUP, kind, ns, "", ""), key=_sort_key)
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
    edit = _Edit(a)
    froms = _grant_namespaces(old.raw if old is not None else None) | _grant_namespaces(raw)
    replace_object(index, ref, raw)
    ns = ref.namespace
    routes = sorted((r for r in route_index(a).into.get(ns or "", ()) if r.namespace in froms), key=Ref.sort_key)
    edit.derive_backends(routes, ns or "")
    edit.settle_backends()
    policies = set()  # the policies of `froms` that declare a target in its namespace
    outcomes = a.outcomes
    for p in _named_across(a).get(ns or "", ()):
        if p[2] in froms and any(o.declared is not None and o.declared[2] == ns for o in outcomes.get(p, ())):
            policies.add(p)
    return _finish(a, edit, ref, set(), policies)


def _grant_namespaces(raw: dict[str, Any] | None) -> set[str]:
    spec: dict[str, Any] = raw.get("spec") if isinstance(raw, dict) and isinstance(raw.get("spec"), dict) else {}  # type: ignore[assignment]  # as `_gateway_shape`
    return {f["namespace"] for f in spec.get("from") or [] if isinstance(f, dict) and isinstance(f.get("namespace"), str)}
