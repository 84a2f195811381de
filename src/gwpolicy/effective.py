"""Effective policy per target, path and policy kind (S5.2, S6), computed once per distinct ladder.

Every level of the hierarchy holds, per policy kind, a `LevelEntry`: what the accepted policies
attached there give. A path's result depends only on the sequence of entries along it, so results
are memoised by that sequence: thousands of routes under one Gateway share one computation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gwpolicy.merge.fieldmerge import DEFAULTS, DIRECT, OBJECT, OVERRIDES, Contribution, ladder
from gwpolicy.merge.leaves import LeafPath, field_name, flatten, unflatten
from gwpolicy.merge.strategies import chain, resolve
from gwpolicy.merge.values import dig, is_unset, nest
from gwpolicy.model import ObjectIndex
from gwpolicy.policies import PolicyKind
from gwpolicy.refs import Ref
from gwpolicy.topology import Path, Topology

KindKey = tuple[str, str]


@dataclass(eq=False)
class LevelEntry:
    """The accepted policies of one kind attached to one level (an object or a section)."""

    contributions: dict[str, Contribution] = field(default_factory=dict)  # FieldMerge, per stanza
    inherited: list[tuple[dict[str, Any], str, Ref]] = field(default_factory=list)  # Atomic/Patch, oldest first
    direct: list[tuple[dict[str, Any], str, Ref]] = field(default_factory=list)  # direct policies, oldest first

    @property
    def has_direct(self) -> bool:
        return bool(self.direct) or DIRECT in self.contributions


@dataclass(eq=False)
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
            out = []
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
    target: Ref
    path: Path
    kind: PolicyKind
    result: Result


class Evaluator:
    """Computes effective policies from level entries; holds the memo of distinct ladders."""

    def __init__(self, kinds: dict[KindKey, PolicyKind], entries: dict[tuple[KindKey, Ref], LevelEntry],
                 index: ObjectIndex) -> None:
        self.kinds = kinds
        self.entries = entries
        self.index = index
        self.memo: dict[tuple, Result] = {}
        self._object_values: dict[tuple[Ref, KindKey], Contribution | None] = {}
        self.kinds_at: dict[Ref, list[KindKey]] = {}
        for (kk, ref) in entries:
            self.kinds_at.setdefault(ref, []).append(kk)
        for lst in self.kinds_at.values():
            lst.sort()

    def kinds_on(self, path: Path) -> list[KindKey]:
        found: set[KindKey] = set()
        for level in path:
            ks = self.kinds_at.get(level)
            if ks:
                found.update(ks)
        return sorted(found)

    def evaluate(self, target: Ref, path: Path, kk: KindKey) -> Result:
        kind = self.kinds[kk]
        entries = self.entries
        levels = [entries.get((kk, level)) for level in path]
        n = len(path) - 1
        d = n
        if target.section is not None and not (levels[n] is not None and levels[n].has_direct):
            d = n - 1  # S5.5: the owner's direct policies apply to a section that has none of its own
        if kind.strategy == "FieldMerge":
            return self._fieldmerge(target, kind, levels, d)
        if kind.strategy == "None":
            entry = levels[d] if d >= 0 else None
            winner = entry.direct[:1] if entry is not None else []
            key = ("None", id(entry))
            if key not in self.memo:
                self.memo[key] = Result(resolve(chain(winner, "Atomic")))
            return self.memo[key]
        key_parts: list[tuple[int, bool]] = []
        for i, e in enumerate(levels):
            if e is not None and (e.inherited or (i == d and e.direct)):
                key_parts.append((id(e), i == d))
        key = (kind.strategy, tuple(key_parts))
        res = self.memo.get(key)
        if res is None:
            seq: list[tuple[dict[str, Any], str, Ref]] = []
            for i, e in enumerate(levels):
                if e is None:
                    continue
                level_seq = list(e.inherited) + (list(e.direct) if i == d else [])
                level_seq.sort(key=lambda s: self._age(s[2]))
                seq.extend(level_seq)
            res = self.memo[key] = Result(resolve(chain(seq, kind.strategy)))
        return res

    def _age(self, ref: Ref) -> tuple[str, str, str]:
        return self.index.by_ref[ref].age_key

    def _fieldmerge(self, target: Ref, kind: PolicyKind, levels: list[LevelEntry | None], d: int) -> Result:
        cands: list[Contribution] = []
        n = len(levels) - 1
        for i in range(0, max(d, 0)):
            e = levels[i]
            if e is not None and OVERRIDES in e.contributions:
                cands.append(e.contributions[OVERRIDES])
        e = levels[d] if d >= 0 else None
        if e is not None and DIRECT in e.contributions:
            cands.append(e.contributions[DIRECT])
        for i in range(max(d, 0), n + 1):
            e = levels[i]
            if e is not None and OVERRIDES in e.contributions:
                cands.append(e.contributions[OVERRIDES])
        own = self.object_value(target.object, kind)
        if own is not None:
            cands.append(own)
        for i in range(n, -1, -1):
            e = levels[i]
            if e is not None and DEFAULTS in e.contributions:
                cands.append(e.contributions[DEFAULTS])
        key = tuple(cands)
        res = self.memo.get(key)
        if res is None:
            res = self.memo[key] = Result(ladder(cands))
        return res

    def object_value(self, owner: Ref, kind: PolicyKind) -> Contribution | None:
        """S5.2 rule 4: the target's own value of a setting the kind maps onto its fields."""
        if not kind.field_mappings:
            return None
        key = (owner, kind.key)
        if key in self._object_values:
            return self._object_values[key]
        contrib = None
        obj = self.index.by_ref.get(owner)
        if obj is not None:
            leaves: dict[LeafPath, tuple[Any, Ref | None]] = {}
            for m in kind.field_mappings:
                if (m.target_group, m.target_kind) != (owner.group, owner.kind):
                    continue
                value = dig(obj.raw, m.field)
                if is_unset(value):
                    continue
                for path, v in flatten(nest(m.setting, value), settings_schema(kind, DEFAULTS)).items():
                    leaves[path] = (v, None)
            if leaves:
                contrib = Contribution(OBJECT, leaves)
        self._object_values[key] = contrib
        return contrib


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
