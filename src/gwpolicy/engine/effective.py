"""Effective policy per target, path and policy kind (S5.2, S6), computed once per distinct ladder.

Every level of the hierarchy holds, per policy kind, a `LevelEntry`: what the accepted policies
attached there give. A path's result depends only on the sequence of entries along it, so results
are memoised by that sequence: thousands of routes under one Gateway share one computation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple

from gwpolicy.engine.merge.fieldmerge import DEFAULTS, DIRECT, OBJECT, OVERRIDES, Contribution, ladder
from gwpolicy.engine.merge.leaves import LeafPath, field_name, flatten, unflatten
from gwpolicy.engine.merge.strategies import chain, resolve
from gwpolicy.engine.merge.values import dig, is_unset, nest
from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.policies import PolicyKind
from gwpolicy.engine.refs import Ref
from gwpolicy.engine.topology import PathNode

KindKey = tuple[str, str]


@dataclass(eq=False, slots=True)
class LevelEntry:
    """The accepted policies of one kind attached to one level (an object or a section)."""

    contributions: dict[str, Contribution] = field(default_factory=dict)  # FieldMerge, per stanza
    inherited: list[tuple[dict[str, Any], str, Ref]] = field(default_factory=list)  # Atomic/Patch, oldest first
    direct: list[tuple[dict[str, Any], str, Ref]] = field(default_factory=list)  # direct policies, oldest first

    @property
    def has_direct(self) -> bool:
        return bool(self.direct) or DIRECT in self.contributions


@dataclass(eq=False, slots=True)
class Result:
    """One effective policy: leaves with their sources; shared by every path with the same ladder."""

    leaves: dict[LeafPath, tuple[Any, str, Ref | None]]
    _spec: dict[str, Any] | None = None
    _sources: list[dict[str, Any]] | None = None
    _policies: frozenset[Ref] | None = None

    @property
    def spec(self) -> dict[str, Any]:
        if self._spec is None:
            ordered = sorted(self.leaves.items(), key=lambda kv: field_name(kv[0]))
            self._spec = unflatten({p: v for p, (v, _, _) in ordered})
        return self._spec

    @property
    def sources(self) -> list[dict[str, Any]]:
        """S9 `sources`, sorted by field."""
        if self._sources is None:
            out: list[dict[str, Any]] = []
            for path, (_, stanza, source) in self.leaves.items():
                if not stanza:
                    continue
                out.append({"field": field_name(path), "stanza": stanza,
                            "policy": source.to_json() if source is not None else None})
            out.sort(key=lambda s: s["field"])
            self._sources = out
        return self._sources

    @property
    def policies(self) -> frozenset[Ref]:
        """The policies that supply at least one leaf (S8.4)."""
        if self._policies is None:
            self._policies = frozenset(s for _, st, s in self.leaves.values() if s is not None and st)
        return self._policies


@dataclass(slots=True)
class EffectivePolicy:
    """One effective policy as readers see it (S9 `effective` item): made on demand from a path's
    `Pairs` (`Analysis.effective`, `effective_of`), never kept by the analysis itself."""

    target: Ref
    path: PathNode
    kind: PolicyKind
    result: Result


#: One path's effective policies: (kind, result) for each kind with leaves, kinds sorted. The full
#: analysis and the in-place updates share one list among every path with the same results (at 20k
#: routes 192k paths hold 49k distinct lists) and never change one in place: a path with other
#: results gets another list, and readers (the gateway's build cache) take an unchanged list, by
#: identity, for an unchanged path. Keeping these rather than an `EffectivePolicy` per item saves
#: 1.8M objects at 50k routes, and the young collections that walk them after an edit.
Pairs = list[tuple[PolicyKind, Result]]


def effective_policies(target: Ref, node: PathNode, pairs: Pairs) -> list[EffectivePolicy]:
    """The `EffectivePolicy` items of one path, from its pairs."""
    return [EffectivePolicy(target, node, k, r) for k, r in pairs]


class Trail(NamedTuple):
    """What the levels of a path prefix give for one policy kind, in the orders the ladder reads them.
    A tuple: equal trails of different paths (a Service below many routes) are compared and hashed
    by value in C, as the in-place updates key their results on them."""

    ov: tuple[Contribution, ...] = ()  # overrides, most general first
    df_rev: tuple[Contribution, ...] = ()  # defaults, most specific first
    inh: tuple[LevelEntry, ...] = ()  # entries with inherited policies (Atomic/Patch), most general first


EMPTY_TRAIL = Trail()
_new_tuple = tuple.__new__


def trail_through(t: Trail, e: LevelEntry) -> Trail:
    """The trail of a prefix one level longer, the level's entry of the kind being `e`."""
    c = e.contributions
    return _new_tuple(Trail, (t.ov + (c[OVERRIDES],) if OVERRIDES in c else t.ov,
                              (c[DEFAULTS],) + t.df_rev if DEFAULTS in c else t.df_rev,
                              t.inh + (e,) if e.inherited else t.inh))


@dataclass(frozen=True, slots=True, eq=False)
class Summary:
    """What the policies along a path prefix give, per kind (shared by every node below that adds
    none; compared and hashed by identity, as the full analysis' memo of node results keys on it)."""

    trails: dict[KindKey, Trail]
    kinds: tuple[KindKey, ...]


EMPTY_SUMMARY = Summary({}, ())
_NO_ENTRIES: dict = {}


class Evaluator:
    """Computes effective policies from level entries; holds the memo of distinct ladders.

    Each path node carries a `Summary` of the policies along its prefix, derived from its parent's,
    so a ladder is assembled from two summaries and the target's own level, whatever the path length.
    """

    def __init__(self, kinds: dict[KindKey, PolicyKind], entries: dict[tuple[KindKey, Ref], LevelEntry],
                 index: ObjectIndex) -> None:
        self.kinds = kinds
        self.entries = entries
        self.index = index
        # results by ladder, one memo per kind (a value edit in place drops the stale ones of its kind alone)
        self.memos: dict[KindKey, dict[tuple, Result]] = {kk: {} for kk in kinds}
        self.memo_base: int | None = None  # memo size after the full analysis (engine/inplace/)
        self._object_values: dict[tuple[Ref, KindKey], tuple[Obj | None, Contribution | None]] = {}
        # a kind's mapped values (scalars, each with its type) -> their contribution, one for every
        # object that holds the same values: its contexts, and so its nodes' results, are shared
        self._value_contributions: dict[tuple, Contribution | None] = {}
        # `contexts`: (object -> (its copy, its context), owner -> (its copy, whether it holds
        # policies, its sections' context), the interned contexts, the mapped kinds)
        self._kept: tuple[dict[Ref, tuple[Obj | None, tuple]], dict[Ref, tuple[Obj | None, bool, tuple]],
                          dict[tuple, tuple], dict[KindKey, tuple[PolicyKind, ...]]] | None = None  # typed: read natively
        self.kinds_at: dict[Ref, list[KindKey]] = {}
        self.entries_at: dict[Ref, dict[KindKey, LevelEntry]] = {}
        for (kk, ref), entry in entries.items():
            self.kinds_at.setdefault(ref, []).append(kk)
            self.entries_at.setdefault(ref, {})[kk] = entry
        for lst in self.kinds_at.values():
            lst.sort()

    def summary(self, node: PathNode | None, shared: dict[tuple[Summary, Ref], Summary] | None = None) -> Summary:
        """The node's summary, derived from its parent's where it has none. `shared`: summaries
        derived during one batch of nodes (nothing changes meanwhile), by the parent's summary and
        the level, so that equal prefixes below many routes share one (and so one memoised result)."""
        if node is None or node.level is None:
            return EMPTY_SUMMARY
        s = node.summary
        if s is not None:
            return s
        above = self.summary(node.parent, shared)
        kks = self.kinds_at.get(node.level)
        if not kks:
            node.summary = above
            return above
        if shared is not None:
            s = shared.get((above, node.level))
            if s is not None:
                node.summary = s
                return s
        trails = dict(above.trails)
        at = self.entries_at[node.level]
        for kk in kks:
            trails[kk] = trail_through(trails.get(kk, EMPTY_TRAIL), at[kk])
        s = node.summary = Summary(trails, tuple(sorted(trails)))
        if shared is not None:
            shared[(above, node.level)] = s
        return s

    def kinds_on(self, path: PathNode) -> tuple[KindKey, ...]:
        return self.summary(path).kinds

    def evaluate_node(self, target: Ref, node: PathNode,
                      kks: tuple[KindKey, ...] | None = None) -> list[tuple[KindKey, Result]]:
        """Effective policy of `target` on the path `node`, for every kind along it (or those given).

        This is the hot loop of the engine: one call per path, with the summaries looked up once.
        """
        here = node.summary  # a node's summary, once made, is kept on it: `summary` only when it is not
        if here is None:
            here = self.summary(node)
        if kks is None:
            kks = here.kinds
        if not kks:
            return []
        memos = self.memos
        kinds = self.kinds
        level = node.level
        parent = node.parent
        own_at = self.entries_at.get(level, _NO_ENTRIES)  # type: ignore[arg-type]  # a path's node is never the root: it has a level
        parent_at: dict[KindKey, LevelEntry] | None = None
        is_section = target[4] is not None
        owner = _new_tuple(Ref, (target[0], target[1], target[2], target[3], None)) if is_section else target
        above_node = parent.summary if parent is not None else None  # used when D is the node itself
        if above_node is None:
            above_node = self.summary(parent)
        above_owner: Summary | None = None  # used when D is the section's owner
        out: list[tuple[KindKey, Result]] = []
        for kk in kks:
            kind = kinds[kk]
            memo = memos.get(kk)
            if memo is None:
                memo = memos[kk] = {}
            own = own_at.get(kk)
            if is_section and not (own is not None and (own.direct or DIRECT in own.contributions)):  # has_direct
                d_is_node = False
                if parent_at is None:
                    parent_at = self.entries_at.get(parent.level, _NO_ENTRIES)  # type: ignore[arg-type, union-attr]  # a section's node has its owner's above it
                d_entry = parent_at.get(kk)  # S5.5: the owner's direct policies apply
            else:
                d_is_node = True
                d_entry = own
            strategy = kind.strategy
            if strategy == "FieldMerge":
                if d_is_node:
                    t = above_node.trails.get(kk)
                else:
                    if above_owner is None:
                        above_owner = self.summary(parent.parent)  # type: ignore[union-attr]  # as above
                    t = above_owner.trails.get(kk)
                key = list(t.ov) if t is not None else []
                if d_entry is not None:
                    c = d_entry.contributions
                    if c:
                        if DIRECT in c:
                            key.append(c[DIRECT])
                        if OVERRIDES in c:
                            key.append(c[OVERRIDES])
                if not d_is_node and own is not None and OVERRIDES in own.contributions:
                    key.append(own.contributions[OVERRIDES])
                if kind.field_mappings:
                    obj = self.object_value(owner, kind)
                    if obj is not None:
                        key.append(obj)
                t = here.trails.get(kk)
                if t is not None:
                    key.extend(t.df_rev)
                tkey = tuple(key)
                res = memo.get(tkey)
                if res is None:
                    res = memo[tkey] = Result(ladder(tkey))
            elif strategy == "None":
                # the entry itself, not its id(): a memo outlives entries an incremental update
                # replaces, and a new entry may get a freed one's id (LevelEntry hashes by identity)
                key2 = ("None", d_entry)
                res = memo.get(key2)
                if res is None:
                    winner = d_entry.direct[:1] if d_entry is not None else []
                    res = memo[key2] = Result(resolve(chain(winner, "Atomic")))
            else:
                direct = d_entry if d_entry is not None and d_entry.direct else None
                t = here.trails.get(kk)
                key3 = (strategy, t.inh if t is not None else (), direct, d_is_node)
                res = memo.get(key3)
                if res is None:
                    res = memo[key3] = Result(resolve(chain(self._sequence(node, kk, level if d_is_node else parent.level),  # type: ignore[arg-type, union-attr]  # as above
                                                            strategy)))
            out.append((kk, res))
        return out

    def effective_list(self, targets: Iterable[Ref], paths: dict[Ref, dict[PathNode, None]],
                       by_target: dict[Ref, dict[PathNode, Pairs]] | None = None,
                       results_of: dict[Ref, dict[Result, PolicyKind]] | None = None) -> list[EffectivePolicy]:
        """Every effective policy, by target (in the order given), path (the topology's order) and
        kind (sorted): what the full analysis computes. `by_target`, when given, receives them by
        target and path instead, as each path's `Pairs` (`Analysis._by_effective_target`: no
        `EffectivePolicy` made), and the list returned is empty; `results_of`, the distinct results
        of each object and its sections (what `Analysis.affected` is made of), read once per
        distinct context rather than once per item.

        A node whose own level holds no policy gets a result fixed by its own summary, its parent's
        summary, whether it is a section (and then its owner's level, when that holds policies)
        and the owner's mapped values (see `evaluate_node`): at 20k routes 192k paths have 49k
        distinct such contexts, so results are looked up by context. The memo lives for this call
        only: nothing changes while it runs, so no entry can go stale (incremental updates
        evaluate nodes one by one)."""
        kinds = self.kinds
        entries_at = self.entries_at
        kinds_at = self.kinds_at
        summary = self.summary
        evaluate_node = self.evaluate_node
        context_of = self.contexts()
        memo: dict[tuple, list[tuple[PolicyKind, Result]]] = {}
        # the flat list only when it is asked for: the index by target is what the controller reads,
        # and a list of 1.8M items at 50k routes is 14 MB and its own time to make and to free
        out: list[EffectivePolicy] = []
        add = out.extend if by_target is None else None
        EP = EffectivePolicy
        pairs: Pairs | None  # an annotation alone: no code
        for target in targets:
            per_path: dict[PathNode, Pairs] = {}
            used: dict[int, list[tuple[PolicyKind, Result]]] = {}  # the distinct contexts' results, in order
            # policies at the target itself: each node is a context of its own, evaluated unshared
            own = target in entries_at
            context = None if own else id(context_of(target))
            for node in paths[target]:
                if own:
                    pairs = [(kinds[kk], res) for kk, res in evaluate_node(target, node) if res.leaves]
                else:
                    above = node.parent.summary  # type: ignore[union-attr]
                    if above is None:
                        above = summary(node.parent)
                    here = node.summary
                    if here is None:  # made here when its level holds no policy (`summary`, inline: once per node)
                        if kinds_at.get(node.level):  # type: ignore[arg-type]  # never the root
                            here = summary(node)
                        else:
                            here = node.summary = above
                    if not here.kinds:
                        continue
                    key = (here, above, context)
                    pairs = memo.get(key)
                    if pairs is None:
                        pairs = memo[key] = [(kinds[kk], res) for kk, res in evaluate_node(target, node) if res.leaves]
                if pairs:
                    if add is not None:
                        add([EP(target, node, k, r) for k, r in pairs])
                    else:
                        per_path[node] = pairs  # shared by every node of the context: never changed in place
                        used[id(pairs)] = pairs
            if per_path:
                if by_target is not None:
                    by_target[target] = per_path
                if results_of is not None:
                    owner = target.object
                    seen = results_of.get(owner)
                    if seen is None:
                        seen = results_of[owner] = {}
                    for pairs in used.values():
                        for k, r in pairs:
                            seen[r] = k
        return out

    def mapped_kinds(self) -> dict[KindKey, tuple[PolicyKind, ...]]:
        """An owner's (group, kind) -> the policy kinds that map settings onto its fields."""
        mapped_for: dict[KindKey, tuple[PolicyKind, ...]] = {}
        for k in self.kinds.values():
            for m in k.field_mappings:
                got = mapped_for.setdefault((m.target_group, m.target_kind), ())
                if k not in got:
                    mapped_for[(m.target_group, m.target_kind)] = got + (k,)
        return mapped_for

    def contexts(self) -> Callable[..., tuple]:
        """`context` for one batch of evaluations (nothing changes meanwhile), made once per object
        and once per owner of sections (all a section's depends on), and interned, so that a memo
        of node results may key on its identity (hashing a context per node costs more than the
        lookup). Kept from one batch to the next, the full analysis' included (a Gateway edit
        moving 1,000 routes asks for 4,000 contexts, none of them changed): an object's is taken
        again while the index holds the same copy of it (its mapped values are read from that copy)
        and a section's while its owner still holds policies or still holds none. The table is
        made afresh once it has grown to twice its size with contexts no object holds any more."""
        kept = self._kept
        if kept is None:
            kept = self._kept = ({}, {}, {}, self.mapped_kinds())
        of_object, of_sections, interned, mapped_for = kept
        by_ref, entries_at, context = self.index.by_ref, self.entries_at, self.context
        if len(interned) > 2 * (len(of_object) + len(of_sections)) + 1024:
            of_object.clear()
            of_sections.clear()
            interned.clear()

        def of(target: Ref, owner: Ref | None = None) -> tuple:
            """`owner`: the section's owner, when the caller holds it (its node's parent's level)."""
            if target[4] is None:
                seen = of_object.get(target)
                obj = by_ref.get(target)
                if seen is not None and seen[0] is obj:
                    return seen[1]
                c = context(target, mapped_for)
                c = interned.setdefault(c, c)
                of_object[target] = (obj, c)
                return c
            if owner is None:
                owner = _new_tuple(Ref, (target[0], target[1], target[2], target[3], None))
            got = of_sections.get(owner)
            obj = by_ref.get(owner)
            held = owner in entries_at
            if got is not None and got[0] is obj and got[1] is held:
                return got[2]
            c = context(target, mapped_for)
            c = interned.setdefault(c, c)
            of_sections[owner] = (obj, held, c)
            return c
        return of

    def context(self, target: Ref, mapped_for: dict[KindKey, tuple[PolicyKind, ...]]) -> tuple:
        """What a node's results read besides its own summary and its parent's (`evaluate_node`):
        a section's node hangs below its owner's, whose direct policies apply to it (S5.5): the
        owner is part of the context when it holds policies (its summary alone is shared by every
        node below it that adds none); and the owner's own values of mapped fields."""
        owner = target.object
        is_section = target.section is not None
        mapped = mapped_for.get((owner.group, owner.kind)) if mapped_for else None
        return (is_section, tuple(self.object_value(owner, k) for k in mapped) if mapped else (),
                owner if is_section and owner in self.entries_at else None)

    def _sequence(self, node: PathNode, kk: KindKey, d_level: Ref) -> list[tuple[dict[str, Any], str, Ref]]:
        """S6 order along a path: by level, then older first; direct policies only at D."""
        seq: list[tuple[dict[str, Any], str, Ref]] = []
        for level in node.levels:
            e = self.entries.get((kk, level))
            if e is None:
                continue
            level_seq = list(e.inherited) + (list(e.direct) if level == d_level else [])
            level_seq.sort(key=lambda s: self._age(s[2]))
            seq.extend(level_seq)
        return seq

    def _age(self, ref: Ref) -> tuple[str, str, str]:
        return self.index.by_ref[ref].age_key

    def object_value(self, owner: Ref, kind: PolicyKind) -> Contribution | None:
        """S5.2 rule 4: the target's own value of a setting the kind maps onto its fields."""
        if not kind.field_mappings:
            return None
        key = (owner, kind.key)
        obj = self.index.by_ref.get(owner)
        known = self._object_values.get(key)
        # kept with the copy of the object it was read from: an in-place update puts a new copy in
        # the index, and its fields must be read again
        if known is not None and known[0] is obj:
            return known[1]
        contrib = None
        if obj is not None:
            mapped = []
            parts: list[Any] | None = [kind.key, owner.group, owner.kind]
            for m in kind.field_mappings:
                if (m.target_group, m.target_kind) != (owner.group, owner.kind):
                    continue
                value = dig(obj.raw, m.field)
                mapped.append((m, value))
                if parts is not None:
                    if type(value) in _SCALARS:
                        parts += (type(value), value)
                    else:
                        parts = None  # a map or a list: a contribution of its own
            shared_key = tuple(parts) if parts is not None else None
            if shared_key is not None:
                hit = self._value_contributions.get(shared_key, _UNSHARED)
                if hit is not _UNSHARED:
                    self._object_values[key] = (obj, hit)
                    return hit
            leaves: dict[LeafPath, tuple[Any, Ref | None]] = {}
            for m, value in mapped:
                if is_unset(value):
                    continue
                for path, v in flatten(nest(m.setting, value), settings_schema(kind, DEFAULTS)).items():
                    leaves[path] = (v, None)
            if leaves:
                contrib = Contribution(OBJECT, leaves)
            if shared_key is not None:
                self._value_contributions[shared_key] = contrib
        self._object_values[key] = (obj, contrib)
        return contrib


#: the types of mapped values shared by value (`Evaluator.object_value`): hashable, and unchanged in place
_SCALARS = frozenset((str, int, bool, type(None)))  # not float: -0.0 equals 0.0 but is written otherwise
_UNSHARED: Any = object()  # a sentinel; Any, so that `.get(key, _UNSHARED)` keeps the table's value type


def settings_schema(kind: PolicyKind, stanza: str, spelling: str | None = None) -> dict[str, Any] | None:
    """The CRD schema of a stanza's settings (S5.1), or of the whole spec for direct policies."""
    schema = kind.schema
    if not schema:
        return None
    spec = (schema.get("properties") or {}).get("spec")
    if not isinstance(spec, dict):
        return None
    if stanza == DIRECT:
        return spec
    props = spec.get("properties") or {}
    names = [spelling] if spelling else []
    names += [stanza, stanza.rstrip("s")]
    for name in names:
        if isinstance(props.get(name), dict):
            return props[name]
    return None
