"""A policy created, changed or deleted in place (`update_policy`), and a policy resolved again
when its targets may have come or gone (`resolve_again`): the conflicts on the targets it had and
has settled again, then that kind's effective policies below them (`recompute.recompute_below`).
Here too the counts of the policies' targetRefs by kind and by namespace that other updates read
(`kinds_targeted`, `named_across`), kept as policies come and go."""

from __future__ import annotations

import bisect
from collections import Counter
from itertools import filterfalse
from typing import Any

from gwpolicy.engine.analysis import Analysis, level_entry
from gwpolicy.engine.attach import TargetOutcome, resolve_targets
from gwpolicy.engine.effective import Evaluator, KindKey, LevelEntry
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.inplace.base import replace_object
from gwpolicy.engine.inplace.recompute import recompute_below
from gwpolicy.engine.merge.fieldmerge import Contribution
from gwpolicy.engine.policies import TARGET_FIELDS, Policy, PolicyKind, parse_policy
from gwpolicy.engine.refs import Ref
from gwpolicy.engine.shapes import list_map_problem, object_problem


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
    check |= recompute_below(a, touched_levels, kk, summaries_stand=bool(refreshed))
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


def _misfits_schema(raw: dict[str, Any], kind: PolicyKind) -> bool:
    spec_schema = ((kind.schema or {}).get("properties") or {}).get("spec")
    return isinstance(spec_schema, dict) and list_map_problem(raw.get("spec"), spec_schema, "spec") is not None


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


def kinds_targeted(a: Analysis) -> Counter[Any]:
    """How many targetRefs of the policies name each kind: made with the first unread object's
    change (a Secret renewed: at 10k routes, 4,000 policies scanned each time), then kept by
    `update_policy`."""
    got: Counter[Any] | None = a._kinds_targeted
    if got is None:
        got = Counter(t.get("kind") for p in a.policies.values() for t in p.target_refs if isinstance(t, dict))
        a._kinds_targeted = got
    return got


def named_across(a: Analysis) -> dict[str, set[Ref]]:
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
    """`kinds_targeted` and `named_across` kept up to date as a policy goes (-1) or comes (+1),
    once they are made."""
    got: Counter[Any] | None = a._kinds_targeted
    if got is not None:
        for t in p.target_refs:
            if isinstance(t, dict):
                got[t.get("kind")] += by
    across: dict[str, set[Ref]] | None = a._named_across
    if across is not None:
        _name_across(across, p, by > 0)
