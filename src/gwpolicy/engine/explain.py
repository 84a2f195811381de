"""Why the effective policy is what it is: the precedence ladder per leaf, how each policy fares
on each path (S6.2), and the difference between two analyses (what an edit or a deletion changes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.attach import CONFLICTED, TargetOutcome
from gwpolicy.engine.effective import EffectivePolicy, KindKey, settings_schema
from gwpolicy.engine.merge.fieldmerge import DEFAULTS, DIRECT, OBJECT, OVERRIDES
from gwpolicy.engine.merge.leaves import LeafPath, field_name, flatten, overlaps
from gwpolicy.engine.merge.values import same
from gwpolicy.engine.mesh import RequestsFrom, seen_from, split_consumer_level
from gwpolicy.engine.refs import Ref
from gwpolicy.engine.status import ancestor_results
from gwpolicy.engine.topology import Path

RULE_WORDS = {
    1: "an override above the target's level: the least specific level wins",
    2: "a direct policy that applies to the target: it beats inherited ones on it",
    3: "an override at the target's level",
    4: "the target's own value: it beats every default",
    5: "a default: the most specific level wins",
}


@dataclass
class Candidate:
    """One value offered for one leaf on one path, and what became of it."""

    field: str
    value: Any
    stanza: str
    policy: Ref | None
    level: Ref | None
    rule: int  # S5.2 rung (1-5), or the position in an S6 chain
    verdict: str = ""  # effective | beaten | overlapped | conflicted | not applied
    why: str = ""
    leaf: LeafPath = ()  # the leaf itself: names are for people, leaves are what is compared

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "value": self.value, "stanza": self.stanza,
                "policy": self.policy.to_json() if self.policy else None,
                "level": _level_json(self.level) if self.level else None,
                "rule": self.rule, "verdict": self.verdict, "why": self.why}


def _level_json(level: Ref) -> dict[str, Any]:
    """A level as S9 refers to objects; a consumer level as its target with `forRequestsFrom`."""
    seen = split_consumer_level(level)
    if seen is None:
        return level.to_json()
    return {**seen[0].to_json(), "forRequestsFrom": seen[1]}


def levels_d(a: Analysis, target: Ref, path: Path, kk: KindKey) -> int:
    """Index of D on the path (S5.2, S5.5)."""
    n = len(path) - 1
    entry = a.entries.get((kk, path[n]))
    if target.section is not None and not (entry is not None and entry.has_direct):
        return n - 1
    return n


def _outcomes_on(a: Analysis, level: Ref) -> list[TargetOutcome]:
    """Outcomes of the policies that attach at `level` (a mesh path's consumer level included)."""
    seen = split_consumer_level(level)
    return [o for o in a.outcomes_at(seen[0] if seen is not None else level) if o.at == level]


def _accepted_at(a: Analysis, kk: KindKey, level: Ref) -> list[tuple[Ref, dict[str, dict[str, Any]]]]:
    """Policies of the kind accepted on `level`, oldest first, with their stanzas."""
    out = []
    for o in _outcomes_on(a, level):
        p = o.policy
        if p.kind.key == kk and o.reason == "Accepted":
            out.append((p.ref, p.stanzas))
    return out


def _conflicted_at(a: Analysis, kk: KindKey, level: Ref) -> list[TargetOutcome]:
    return [o for o in _outcomes_on(a, level) if o.policy.kind.key == kk and o.reason == CONFLICTED]


def ladder(a: Analysis, ep: EffectivePolicy) -> list[Candidate]:
    """Every candidate value for every leaf of one effective policy, in precedence order, with verdicts."""
    kind = ep.kind
    kk = kind.key
    path, target = ep.path, ep.target
    d = levels_d(a, target, path, kk)
    n = len(path) - 1
    order: list[tuple[int, int, str]] = []  # (rule, level index, stanza)
    if kind.strategy == "FieldMerge":
        order += [(1, i, OVERRIDES) for i in range(0, max(d, 0))]
        order += [(2, d, DIRECT)]
        order += [(3, i, OVERRIDES) for i in range(max(d, 0), n + 1)]
        order += [(4, n, OBJECT)]
        order += [(5, i, DEFAULTS) for i in range(n, -1, -1)]
    else:
        order += [(i + 1, i, "*") for i in range(n + 1)]
    result = ep.result.leaves
    cands: list[Candidate] = []
    for rule, i, stanza in order:
        level = path[i]
        if stanza == OBJECT:
            own = a.evaluator.object_value(target.object, kind)
            for leaf, (value, _) in (own.leaves.items() if own else ()):
                cands.append(Candidate(field_name(leaf), value, OBJECT, None, target.object, rule, leaf=leaf))
            continue
        for pref, stanzas in _accepted_at(a, kk, level):
            for st, settings in stanzas.items():
                if stanza != "*" and st != stanza:
                    continue
                if st == DIRECT and i != d:
                    continue
                for leaf, value in flatten(settings, settings_schema(kind, st)).items():
                    cands.append(Candidate(field_name(leaf), value, st, pref, level, rule, leaf=leaf))
    conflicted = {id(o): o for i, level in enumerate(path) for o in _conflicted_at(a, kk, level)
                  if o.policy.cls != DIRECT or i == d}  # a direct policy takes part only at D (S5.5)
    for o in conflicted.values():
        for st, settings in o.policy.stanzas.items():
            for leaf, value in flatten(settings, settings_schema(kind, st)).items():
                cands.append(Candidate(field_name(leaf), value, st, o.policy.ref, o.at, 0,
                                       "conflicted", o.message, leaf=leaf))
    for c in cands:
        if c.verdict:
            continue
        won = result.get(c.leaf)
        if won is not None:
            value, stanza, source = won
            if source == c.policy and stanza == c.stanza and same(value, c.value):
                c.verdict, c.why = "effective", _win_reason(kind.strategy, c.rule)
                continue
            c.verdict = "beaten"
            c.why = f"{_source_label(stanza, source)} takes precedence" + (
                f" ({_win_reason(kind.strategy, _rule_of(cands, c.leaf, source, stanza))})" if kind.strategy == "FieldMerge" else
                f" ({kind.strategy} merge strategy)")
            continue
        if any(overlaps(c.leaf, leaf) for leaf in result):
            c.verdict, c.why = "overlapped", "a higher-ranked value overlaps this one (a field and a field inside it)"
        else:
            c.verdict, c.why = "not applied", (f"dropped by the {kind.strategy} merge strategy" if kind.strategy != "FieldMerge"
                                               else "deleted or replaced")
    return cands


def _rule_of(cands: list[Candidate], leaf: LeafPath, source: Ref | None, stanza: str) -> int:
    for c in cands:
        if c.leaf == leaf and c.policy == source and c.stanza == stanza:
            return c.rule
    return 0


def _win_reason(strategy: str, rule: int) -> str:
    if strategy == "FieldMerge":
        return RULE_WORDS.get(rule, "precedence")
    if strategy == "None":
        return "the oldest direct policy on the target applies"
    return f"{strategy} merge: what survives the chain of policies, most established first"


def _source_label(stanza: str, source: Ref | None) -> str:
    return "the object's own value" if source is None else f"{stanza} of {source}"


@dataclass
class Fate:
    """How one policy fares on one path (S6.2)."""

    item: EffectivePolicy
    fate: str  # effective | partially | overridden
    survived: list[str]
    lost: list[str]


def fates(a: Analysis, policy_ref: Ref) -> list[Fate]:
    """S6.2 on every path where the policy takes part: effective, partially, or overridden."""
    policy = a.policies[policy_ref]
    kk = policy.kind.key
    levels = {o.at for o in a.outcomes[policy_ref] if o.reason == "Accepted" and o.at is not None}
    if not levels:
        return []
    own: dict[str, dict[LeafPath, Any]] = {st: flatten(s, settings_schema(policy.kind, st)) for st, s in policy.stanzas.items()}
    out = []
    for ep in a.effective:
        if ep.kind.key != kk or not any(level in levels for level in ep.path):
            continue
        if policy.cls == "direct":
            d = levels_d(a, ep.target, ep.path, kk)
            if ep.path[d] not in levels:
                continue
        survived: list[str]
        lost: list[str]
        survived, lost = [], []
        for st, leaves in own.items():
            for leaf in leaves:
                got = ep.result.leaves.get(leaf)
                (survived if got is not None and got[2] == policy_ref else lost).append(field_name(leaf))
        fate = "effective" if not lost else ("partially" if survived else "overridden")
        out.append(Fate(ep, fate, sorted(set(survived)), sorted(set(lost))))
    return out


def leaf_map(items: Iterable[EffectivePolicy]) -> dict[tuple[Ref, tuple[Ref, ...], KindKey], dict[str, Any]]:
    return {(ep.target, ep.path.levels, ep.kind.key): {field_name(p): v for p, (v, _, _) in ep.result.leaves.items()}
            for ep in items}


def _seen_from(a: Analysis, namespace: str) -> tuple[dict[tuple[Ref, tuple[Ref, ...], KindKey], dict[str, Any]],
                                                  dict[tuple[Ref, ...], tuple[Ref, ...]]]:
    """`leaf_map` of the mesh paths that hold the requests of `namespace`, keyed by the path as that
    namespace sees it (`Namespace/*` written as it), and each such key's path as the engine has it."""
    mesh = a.topology.mesh
    if mesh is None:
        return {}, {}
    view = RequestsFrom(mesh, namespace)
    out: dict[tuple[Ref, tuple[Ref, ...], KindKey], dict[str, Any]] = {}
    paths: dict[tuple[Ref, ...], tuple[Ref, ...]] = {}
    for ep in a.effective:
        if view.holds(ep.path):
            levels = seen_from(ep.path.levels, namespace)
            paths[levels] = ep.path.levels
            out[(ep.target, levels, ep.kind.key)] = {field_name(p): v for p, (v, _, _) in ep.result.leaves.items()}
    return out, paths


def diff_effective(before: Analysis, after: Analysis, from_namespace: str | None = None) -> list[dict[str, Any]]:
    """Every effective value that an edit changes (null where it is gone or new).

    On a path both analyses have, each field whose value differs is a change. A path that only one
    of them has (a Gateway deleted, a route attached elsewhere) is a change of topology, not of
    values: a value on it counts only when the target has it on no path of the other analysis, so
    a setting that stays the same is never counted because the path to it moved.

    With `from_namespace`, only the mesh paths that hold that namespace's requests count, each as
    that namespace sees it: a request that took the paths of `*` before and its own after (it gained
    a consumer route or policy) is one path whose values change.
    """
    if from_namespace is None:
        b, af = leaf_map(before.effective), leaf_map(after.effective)
        engine_paths: dict[tuple[Ref, ...], tuple[Ref, ...]] = {}
    else:
        b, engine_paths = _seen_from(before, from_namespace)
        af, after_paths = _seen_from(after, from_namespace)
        engine_paths.update(after_paths)
    kinds = {**{k.key: k for k in after.kinds.values()}, **{k.key: k for k in before.kinds.values()}}
    moved = {(k[0], k[2]) for k in set(b).symmetric_difference(af)}  # targets with a path on one side only
    values_before, values_after = _values_by_target(b, moved), _values_by_target(af, moved)
    changes = []
    for key in sorted(set(b) | set(af), key=lambda k: (k[0].sort_key(), [l.sort_key() for l in k[1]], k[2])):
        old, new = b.get(key), af.get(key)
        if old == new:
            continue
        target, path, kk = key
        if old is None or new is None:  # a path only one side has: compare with the other side's values
            mine = new if old is None else old  # never None: old != new, so not both are None
            others = (values_before if old is None else values_after).get((target, kk), {})
            fields = [f for f in sorted(mine) if _canon(mine[f]) not in others.get(f, ())]  # type: ignore[arg-type, index]
            old, new = old or {}, new or {}
        else:
            fields = [f for f in sorted(set(old) | set(new))
                      if not (f in old and f in new and same(old[f], new[f]))]
        for fieldname in fields:
            changes.append({"target": target.to_target_json(),
                            "path": [l.to_json() for l in engine_paths.get(path, path) if "@" not in l.kind],
                            "policyKind": kinds[kk].to_json(), "field": fieldname,
                            "before": old.get(fieldname), "after": new.get(fieldname)})
    return changes


def _values_by_target(leaves: dict[tuple[Ref, tuple[Ref, ...], KindKey], dict[str, Any]],
                      wanted: set[tuple[Ref, KindKey]]) -> dict[tuple[Ref, KindKey], dict[str, set[Any]]]:
    """(target, kind) -> field -> the values it has on the target's paths (as `_canon` keys), for
    the wanted (target, kind) pairs only."""
    out: dict[tuple[Ref, KindKey], dict[str, set[Any]]] = {}
    for (target, _, kk), fields in leaves.items():
        if (target, kk) not in wanted:
            continue
        per = out.setdefault((target, kk), {})
        for f, v in fields.items():
            per.setdefault(f, set()).add(_canon(v))
    return out


def _canon(value: Any) -> Any:
    """A hashable key equal for two JSON values exactly when `same` holds (true is not 1; 1 is 1.0)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _canon(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(_canon(v) for v in value))
    return ("other", value)


def diff_status(before: Analysis, after: Analysis) -> list[dict[str, Any]]:
    """Policy conditions and breadcrumbs that an edit would change."""
    out: list[dict[str, Any]] = []
    refs = sorted(set(before.policies) | set(after.policies), key=Ref.sort_key)
    for ref in refs:
        old = _conditions(before, ref)
        new = _conditions(after, ref)
        for anc in sorted(set(old) | set(new), key=Ref.sort_key):
            if old.get(anc) != new.get(anc):
                out.append({"object": ref.to_json(), "ancestor": anc.to_json(),
                            "before": _cond_json(old.get(anc)), "after": _cond_json(new.get(anc))})
    for obj in sorted(set(before.affected) | set(after.affected), key=Ref.sort_key):
        old_k = sorted(k for _, k in before.affected.get(obj, {}))
        new_k = sorted(k for _, k in after.affected.get(obj, {}))
        if old_k != new_k:
            out.append({"object": obj.to_json(), "breadcrumb": True, "before": old_k, "after": new_k})
    return out


def _conditions(a: Analysis, ref: Ref) -> dict[Ref, tuple[str, str]]:
    if ref not in a.policies:
        return {}
    res = ancestor_results(a.policies[ref], a.outcomes[ref], a.topology)
    return {anc: ("True" if o.reason == "Accepted" else "False", o.reason) for anc, o in res.items()}


def _cond_json(c: tuple[str, str] | None) -> dict[str, str] | None:
    return {"status": c[0], "reason": c[1]} if c else None
