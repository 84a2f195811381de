"""Effective policies computed again in place, and with them what affects each object: one policy
kind's below the levels whose entries changed (`recompute_below`: a policy created, edited or
deleted), or every kind's on the paths that came or moved (`recompute_nodes`: a route, a Gateway, a
Service, a Namespace or a ReferenceGrant changed). Within one update each result is computed once
per distinct key, and paths that shared a list of results share its successor."""

from __future__ import annotations

from itertools import chain
from typing import AbstractSet, Any, Iterable, cast

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.effective import EMPTY_TRAIL, Evaluator, KindKey, Pairs, Result, Summary, trail_through
from gwpolicy.engine.inplace.base import nodes_at, push_children
from gwpolicy.engine.policies import PolicyKind
from gwpolicy.engine.refs import Ref
from gwpolicy.engine.topology import PathNode


def recompute_below(a: Analysis, levels: set[Ref], kk: KindKey, summaries_stand: bool = False) -> set[Ref]:
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
    """The `Pairs` one kind's walk (`recompute_below`) gives paths in place of their old lists:
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
        push_children(stack, n)
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


def recompute_nodes(a: Analysis, per_target: dict[Ref, list[PathNode]], lost: dict[Ref, list[Pairs]],
                     owners: dict[Ref, tuple[list[Pairs], list[Pairs]]], fresh_summaries: bool = False) -> set[Ref]:
    """New summaries and effective policies (every kind) for these paths of each target (each node
    listed once, parents before children or not: summaries are derived on demand); objects whose
    affecting policies changed. `lost`: the lists of the paths the caller took away, by
    owner (when the new paths bring at least their policies, the owner is not rescanned: what it
    had, plus what they bring). `owners` receives each owner of a target given (the caller's
    objects to check). `fresh_summaries`: every node's summary already dropped (a subtree moved by
    `edit.Edit.move_routes`).
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
