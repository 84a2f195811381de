"""`analyse(objects) -> Analysis`: the one entry point of the pure core.

Load order never matters: objects are indexed by reference and every list the analysis
walks is sorted, so a shuffled input gives the same effective policies and status.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from operator import attrgetter
from typing import AbstractSet, Any, Callable, Iterable, Mapping

from gwpolicy.engine.attach import ACCEPTED, CONFLICTED, TargetOutcome, declared_targets, resolve_targets
from gwpolicy.engine.effective import (
    EffectivePolicy,
    Evaluator,
    KindKey,
    LevelEntry,
    Pairs,
    Result,
    effective_policies,
    settings_schema,
)
from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.merge.fieldmerge import Candidate, settle_conflicts
from gwpolicy.engine.merge.leaves import flatten
from gwpolicy.engine.mesh import MESH_CONTROLLER, MESH_KINDS, build_mesh, split_consumer_level
from gwpolicy.engine.model import Obj, ObjectIndex, build_index
from gwpolicy.engine.policies import Policy, PolicyKind, build_kinds, policy_objects
from gwpolicy.engine.refs import Ref, sort_by_ref
from gwpolicy.engine.status import (
    DEFAULT_CONTROLLER,
    annotation_only,
    annotation_says,
    breadcrumbs,
    carries_breadcrumb,
    policy_status,
    route_breadcrumbs_hold,
)
from gwpolicy.engine.topology import PathNode, Topology, build_topology


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _by_kind(distinct: dict[Result, PolicyKind]) -> dict[KindKey, AbstractSet[Ref]]:
    """Distinct results (a result with leaves belongs to one kind: its ladder holds that kind's
    entries) -> the policies they draw on, by kind, in the order the kinds first appear."""
    kinds: dict[KindKey, set[Ref]] = {}
    for res, kind in distinct.items():
        kk = kind.key
        refs = kinds.get(kk)
        if refs is None:
            refs = kinds[kk] = set()
        refs |= res.policies
    return {kk: refs for kk, refs in kinds.items() if refs}


def _affected_of(distinct: dict[Ref, dict[Result, PolicyKind]]) -> dict[Ref, dict[KindKey, AbstractSet[Ref]]]:
    """Object -> the policies of each kind its distinct results draw on. Objects with the same
    results (the routes of a listener that no policy of their own sets apart) share one dict: its
    users read it, and in-place updates replace an object's dict rather than change it."""
    memo: dict[tuple[Result, ...], dict[KindKey, AbstractSet[Ref]]] = {}
    affected: dict[Ref, dict[KindKey, AbstractSet[Ref]]] = {}
    for owner, seen in distinct.items():
        key = tuple(seen)
        kinds = memo.get(key)
        if kinds is None:
            kinds = memo[key] = _by_kind(seen)
        if kinds:
            affected[owner] = kinds
    return affected


@dataclass
class StatusChange:
    """What the controller would write to one object (S9 `status` item)."""

    object: Ref
    status: dict[str, Any]
    annotations: dict[str, str]


@dataclass
class Analysis:
    index: ObjectIndex
    topology: Topology
    kinds: dict[KindKey, PolicyKind]
    policies: dict[Ref, Policy]
    outcomes: dict[Ref, list[TargetOutcome]]
    entries: dict[tuple[KindKey, Ref], LevelEntry]
    evaluator: Evaluator
    _effective: list[EffectivePolicy] | None
    controller: str
    now: str
    warnings: list[str] = field(default_factory=list)
    attached: dict[tuple[KindKey, Ref], list[Policy]] = field(default_factory=dict)  # before conflicts, oldest first
    _status: list[StatusChange] | None = None
    _affected: dict[Ref, dict[KindKey, AbstractSet[Ref]]] | None = None
    _by_target: dict[Ref, list[TargetOutcome]] | None = None
    _declaring: dict[Ref, set[Ref]] | None = None  # object -> policies declaring it or a section of it
    _affects: dict[Ref, set[Ref]] | None = None
    _status_by_ref: dict[Ref, StatusChange] | None = None
    # target -> path -> its effective policies as `Pairs` (in the topology's path order, kinds
    # sorted; one list shared by the paths with the same results): an incremental update replaces
    # one path's list without walking a target's other paths
    _by_effective_target: dict[Ref, dict[PathNode, Pairs]] | None = None
    # made by inplace.apply.prepare and kept by the updates (`kinds_targeted`, `named_across` of inplace.policies)
    _kinds_targeted: Counter[Any] | None = None
    _named_across: dict[str, set[Ref]] | None = None

    @property
    def effective(self) -> list[EffectivePolicy]:
        """Every effective policy, by target (sorted), path and kind."""
        if self._effective is None:
            by = self._by_effective_target or {}
            EP = EffectivePolicy
            self._effective = [EP(t, n, k, r) for t in sorted(by, key=Ref.sort_key) for n, pairs in by[t].items()
                               for k, r in pairs]
        return self._effective

    @property
    def affected(self) -> dict[Ref, dict[KindKey, AbstractSet[Ref]]]:
        """Object -> policy kind -> the policies that supply at least one leaf to it or its sections (S8.4)."""
        if self._affected is None:
            distinct: dict[Ref, dict[Result, PolicyKind]] = {}
            for target, per_path in self._effective_by_target().items():
                owner = target.object
                seen = distinct.get(owner)
                if seen is None:
                    seen = distinct[owner] = {}
                for pairs in per_path.values():
                    for k, r in pairs:  # a plain loop: at 50k routes it beats dict.update
                        seen[r] = k
            self._affected = _affected_of(distinct)
        return self._affected

    def effective_of(self, target: Ref) -> list[EffectivePolicy]:
        """Effective policies of one object or section, every path and kind."""
        return [ep for n, pairs in self._effective_by_target().get(target, {}).items()
                for ep in effective_policies(target, n, pairs)]

    def _effective_by_target(self) -> dict[Ref, dict[PathNode, Pairs]]:
        """Target -> path -> its `Pairs` (made from the list on first use when the analysis was not
        run `by_target`)."""
        if self._by_effective_target is None:
            by: dict[Ref, dict[PathNode, Pairs]] = {}
            for ep in self.effective:
                per_path = by.get(ep.target)
                if per_path is None:
                    per_path = by[ep.target] = {}
                pairs = per_path.get(ep.path)
                if pairs is None:
                    per_path[ep.path] = [(ep.kind, ep.result)]
                else:
                    pairs.append((ep.kind, ep.result))
            self._by_effective_target = by
        return self._by_effective_target

    def status_change_of(self, ref: Ref) -> StatusChange | None:
        if self._status_by_ref is None:
            self._status_by_ref = {ch.object: ch for ch in self.status_changes()}
        return self._status_by_ref.get(ref)

    def outcomes_at(self, target: Ref) -> list[TargetOutcome]:
        """Outcomes of every policy that declares `target` (object or section), oldest policy first."""
        if self._by_target is None:
            by: dict[Ref, list[TargetOutcome]] = {}
            for outs in self.outcomes.values():
                for o in outs:
                    if o.declared is not None:
                        by.setdefault(o.declared, []).append(o)
            self._by_target = by
        return self._by_target.get(target, [])

    def policies_declaring(self, obj: Ref) -> set[Ref]:
        """Policies with a targetRef to the object or to one of its sections, accepted or not (kept up
        to date by incremental updates, so a route edit finds its policies without a scan)."""
        return self._declaring_index().get(obj, set())

    def _declaring_index(self) -> dict[Ref, set[Ref]]:
        if self._declaring is None:
            d: dict[Ref, set[Ref]] = {}
            for pref, outs in self.outcomes.items():
                for o in outs:
                    if o.declared is not None:
                        d.setdefault(o.declared.object, set()).add(pref)
            self._declaring = d
        return self._declaring

    def policies_affecting(self, obj: Ref) -> set[Ref]:
        """Policies that supply at least one leaf to the object or one of its sections (S8.4)."""
        out: set[Ref] = set()
        for refs in self.affected.get(obj, {}).values():
            out |= refs
        return out

    def objects_affected_by(self, policy: Ref) -> list[Ref]:
        """Objects (not sections) the policy supplies a leaf to, sorted."""
        if self._affects is None:
            rev: dict[Ref, set[Ref]] = {}
            for obj, kinds in self.affected.items():
                for refs in kinds.values():
                    for p in refs:
                        rev.setdefault(p, set()).add(obj)
            self._affects = rev
        return sorted(self._affects.get(policy, ()), key=Ref.sort_key)

    def status_changes(self) -> list[StatusChange]:
        """S9 `status`: one item per object whose status or annotations our write would change."""
        if self._status is None:
            self._status = compute_status(self)
        return self._status


def analyse(raws: Iterable[dict[str, Any]], origins: Iterable[str] | None = None, *,
            default_namespace: str = "default", controller: str = DEFAULT_CONTROLLER,
            now: str | None = None, timings: dict[str, float] | None = None,
            kind_checks: Mapping[KindKey, Callable[[dict[str, Any]], str | None]] | None = None,
            by_target: bool = False, mesh_controller: str = MESH_CONTROLLER) -> Analysis:
    """Analyse objects; `timings`, when given, receives seconds per phase (for the benchmark);
    `kind_checks` (kind -> check of a policy's spec) lets a data plane make policies it cannot
    honour Invalid (the gateway's policyconf.kind_checks()); `by_target`: index the effective
    policies by target and path, and what affects each object, as they are made (what status and
    in-place updates read), rather than from the list on first use (a second at 50k routes;
    `effective` alone needs only the list)."""
    clock = _Clock(timings)
    index = build_index(raws, origins, default_namespace)
    grants = ReferenceGrants(index)
    clock.lap("index")
    kinds = build_kinds(index)
    for key, check in (kind_checks or {}).items():
        if key in kinds:
            kinds[key].check = check
    policies = policy_objects(index, kinds)
    # the mesh (M1) only when the input holds a mesh object: its paths depend on the policies' targets
    mesh = build_mesh(index, declared_targets(policies, index), mesh_controller) \
        if any(gk in index.by_kind for gk in MESH_KINDS) else None
    topo = build_topology(index, grants, mesh)
    topo.policy_kinds = frozenset(kinds)
    clock.lap("topology")
    warnings = list(index.warnings) + list(topo.warnings)
    for pk in sorted(kinds.values(), key=lambda k: k.key):
        warnings.extend(pk.warnings)
    outcomes: dict[Ref, list[TargetOutcome]] = {}
    attached: dict[tuple[KindKey, Ref], list[Policy]] = {}
    for p in policies:  # oldest first, so each attachment list is in S5.4 order
        outs = resolve_targets(p, index, topo, grants)
        outcomes[p.ref] = outs
        for o in outs:
            at = o.at
            if o.reason == ACCEPTED and at is not None:
                attached.setdefault((p.kind.key, at), []).append(p)
    entries = {key: level_entry(kinds[key[0]], ps, outcomes, key[1]) for key, ps in attached.items()}
    clock.lap("attachment")
    evaluator = Evaluator(kinds, entries, index)
    per_target: dict[Ref, dict[PathNode, Pairs]] | None = {} if by_target else None
    results_of: dict[Ref, dict[Result, PolicyKind]] | None = {} if by_target else None
    # the list in target order is what `effective` prints; the index needs no order of targets (the
    # list is then made from it on first use, sorted), and sorting 300k targets at 50k routes is 0.3 s
    effective: list[EffectivePolicy] | None = evaluator.effective_list(
        topo.paths if by_target else topo.targets(), topo.paths, per_target, results_of)
    if by_target:
        effective = None
    clock.lap("merge")
    return Analysis(index, topo, kinds, {p.ref: p for p in policies}, outcomes, entries, evaluator,
                    effective, controller, now or utc_now(), warnings, attached=attached,
                    _by_effective_target=per_target,
                    _affected=_affected_of(results_of) if results_of is not None else None)


class _Clock:
    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings = timings
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[name] = self.timings.get(name, 0.0) + now - self.t
            self.t = now


def level_entry(kind: PolicyKind, policies: list[Policy], outcomes: dict[Ref, list[TargetOutcome]],
                 target: Ref) -> LevelEntry:
    """Settle conflicts among the policies of one kind on one target and keep what they give."""
    entry = LevelEntry()
    if kind.strategy == "FieldMerge":
        candidates = []
        for p in policies:
            cands = [Candidate(p.ref, stanza, flatten(settings, settings_schema(kind, stanza)))
                     for stanza, settings in p.stanzas.items()]
            candidates.append((p.ref, cands))
        entry.contributions, losers = settle_conflicts(candidates)
        by_ref = {p.ref: p for p in policies}
        for loser, winner in losers.items():
            _conflicted(outcomes[loser], target, winner,
                        f"Conflicts with {_name(winner)}, which sets the same fields to other values on "
                        f"{_where(target)} and {_why_first(by_ref[winner], by_ref[loser])}; this policy is not "
                        f"applied there. Change or remove one of them.")
        return entry
    if kind.strategy == "None":
        chosen, *rest = policies  # not `winner`: the Ref of the loop above
        entry.direct = [(chosen.stanzas.get("direct", {}), "direct", chosen.ref)]
        for p in rest:
            _conflicted(outcomes[p.ref], target, chosen.ref,
                        f"Conflicts with {_name(chosen.ref)}, which also targets {_where(target)} and "
                        f"{_why_first(chosen, p)}; only one {kind.kind} applies per target.")
        return entry
    for p in policies:
        for stanza, settings in p.stanzas.items():
            (entry.direct if stanza == "direct" else entry.inherited).append((settings, stanza, p.ref))
    return entry


def _why_first(winner: Policy, loser: Policy) -> str:
    """Why the winner comes first in the age order (S5.4), with the times as RFC 3339 UTC."""
    won, lost = winner.obj.created_at, loser.obj.created_at
    if won is not None and lost is None:
        return f"is older (created {won}; this policy has no creationTimestamp, so it counts as the newest)"
    if won is not None and winner.obj.time.sort_key != loser.obj.time.sort_key:
        return f"is older ({won} before {lost})"
    if won is None:
        return "comes first by namespace/name (neither has a creationTimestamp)"
    return "was created at the same time and comes first by namespace/name"


def _conflicted(outs: list[TargetOutcome], target: Ref, winner: Ref, message: str) -> None:
    for o in outs:
        if o.at == target:
            o.reason, o.winner, o.message = CONFLICTED, winner, message


def _name(ref: Ref) -> str:
    return f"{ref.kind} {ref.namespace}/{ref.name}" if ref.namespace else f"{ref.kind} {ref.name}"


def _where(ref: Ref) -> str:
    seen = split_consumer_level(ref)
    if seen is not None:
        return f"{_where(seen[0])} for requests from namespace {seen[1]}"
    return _name(ref.object) + (f" section {ref.section}" if ref.section else "")


def compute_status(a: Analysis) -> list[StatusChange]:
    """What our write would change, object by object, sorted by reference. Each object's status is
    computed and compared with what it carries; only the ones that differ become `StatusChange`s
    and are sorted (once objects carry our status, that is few or none of 120k at 50k routes)."""
    changes: dict[Ref, tuple[dict[str, Any], dict[str, str]]] = {}
    topo, controller, now = a.topology, a.controller, a.now
    for ref, policy in a.policies.items():
        changes[ref] = (policy_status(policy, a.outcomes[ref], topo, controller, now), _annotations(policy.obj.metadata))
    affected = a.affected
    paths = topo.paths
    by_ref = a.index.by_ref
    for ref, obj in by_ref.items():  # the objects of the hierarchy (virtual ones carry no breadcrumb, S8.4)
        if ref not in paths:
            continue
        kinds = affected.get(ref)
        prior = changes.get(ref)
        if not kinds and prior is None and not carries_breadcrumb(obj, controller):
            continue  # nothing to add and nothing of ours to take away: the common case, made cheap
        if prior is None and annotation_only(obj) and annotation_says(obj, bool(kinds)):
            continue  # a Service or Namespace whose annotation already says it: nothing to write
        if kinds and prior is None and route_breadcrumbs_hold(obj, [kk[1] for kk in kinds], topo, controller):
            continue  # a route whose entries of ours already say it: nothing to write
        if prior is not None:  # a policy that is itself a target: one write holds both
            obj = _with(obj, *prior)
        changes[ref] = breadcrumbs(obj, [kk[1] for kk in kinds] if kinds else [], topo, controller, now)
    out = []
    for ref, (status, wanted_annotations) in changes.items():  # not `annotations`: the __future__ import
        raw = by_ref[ref].raw
        current = raw.get("status")
        if status != (current if isinstance(current, dict) else {}) or wanted_annotations != _annotations(raw["metadata"]):
            out.append(StatusChange(ref, status, wanted_annotations))
    sort_by_ref(out, _CHANGED_OBJECT)
    return out


_CHANGED_OBJECT = attrgetter("object")


def _annotations(meta: dict[str, Any]) -> dict[str, str]:
    ann = meta.get("annotations")
    return dict(ann) if isinstance(ann, dict) else {}


def _with(obj: Obj, status: dict[str, Any], annotations: dict[str, str]) -> Obj:
    raw = dict(obj.raw)
    raw["status"] = status
    raw["metadata"] = dict(obj.metadata, annotations=annotations)
    return Obj(raw, obj.ref, obj.version, obj.origin)
