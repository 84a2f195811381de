"""What an admission review answers (GEP-713 discoverability): the policies an applied object will be
affected by, and what becomes of an applied policy (Conflicted, Invalid, TargetNotFound, beaten).

Pure: it reads an analysis of the cluster and the incoming object. The answer is computed on the
cluster state plus the incoming object, as `gwpolicy whatif` does: the object is applied to the
analysis in place (`inplace.apply.apply_change`, whatever its kind), read, and taken back out; a change
that cannot be applied in place is analysed whole on a copy of the objects. The caller serialises
reviews (one event loop), so nobody sees the analysis while the incoming object is in it.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from gwpolicy.engine.analysis import Analysis, analyse
from gwpolicy.engine.attach import ACCEPTED, CONFLICTED, TargetOutcome
from gwpolicy.engine.effective import EffectivePolicy, effective_policies
from gwpolicy.engine.inplace.apply import apply_change, policy_ref
from gwpolicy.engine.inplace.base import nodes_at, subtree_of
from gwpolicy.engine.kinds import split_api_version
from gwpolicy.engine.merge.leaves import field_name
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref

# kube-apiserver: "Individual warning messages over 256 characters may be truncated by the API server
# before being returned to clients. If more than 4096 characters of warning messages are added (from
# all sources), additional warning messages are ignored." Keep each short and the whole well inside.
MAX_WARNING = 250
MAX_TOTAL = 3000
MAX_WARNINGS = 8
CORE_KINDS = {"Service", "Namespace"}


@dataclass
class Options:
    deny_invalid: bool = False
    deny_conflicts: bool = False
    # above this many objects a change that cannot be applied in place is answered from the cluster
    # state as it is (a whole analysis would not fit in an admission timeout)
    full_analysis_limit: int = 20_000


@dataclass
class Verdict:
    allowed: bool = True
    warnings: list[str] = field(default_factory=list)
    message: str = ""  # why it is denied, and what to change

    def response(self, uid: str) -> dict[str, Any]:
        out: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if self.warnings:
            out["warnings"] = self.warnings
        if not self.allowed:
            out["status"] = {"code": 403, "reason": "Forbidden", "message": self.message}
        return out


def name_of(ref: Ref) -> str:
    return f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name


def label(ref: Ref) -> str:
    """`Kind ns/name` (and its section): how a warning names an object."""
    return f"{ref.kind} {name_of(ref)}" + (f" section {ref.section}" if ref.section else "")


def describe_command(ref: Ref) -> str:
    ns = f" -n {ref.namespace}" if ref.namespace else ""
    return f"kubectl gwpolicy describe {ref.kind.lower()}/{ref.name}{ns}"


def _short(text: str, limit: int = MAX_WARNING) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _value(v: Any) -> str:
    s = v if isinstance(v, str) else repr(v) if not isinstance(v, (dict, list)) else "{...}" if isinstance(v, dict) else "[...]"
    return _short(str(s), 40)


def fold(warnings: list[str], more_ref: Ref | None) -> list[str]:
    """At most MAX_WARNINGS warnings and MAX_TOTAL characters; the rest folded into one line."""
    out: list[str] = []
    total = 0
    for i, w in enumerate(warnings):
        w = _short(w)
        rest = len(warnings) - i
        if len(out) == MAX_WARNINGS - 1 and rest > 1 or total + len(w) > MAX_TOTAL:
            see = f"; see `{describe_command(more_ref)}`" if more_ref is not None else ""
            out.append(f"and {rest} more{see}")
            break
        out.append(w)
        total += len(w)
    return out


# ---------- the incoming object, applied ----------

def ref_of_raw(raw: dict[str, Any]) -> Ref:
    group, _ = split_api_version(raw.get("apiVersion", ""))
    meta = raw.get("metadata") or {}
    return Ref(group, raw.get("kind", ""), meta.get("namespace") or None, meta.get("name") or "")


class Fallback(Exception):
    """The change cannot be applied in place; `broken` when the analysis was left half-changed."""

    def __init__(self, broken: bool) -> None:
        super().__init__("in-place update not possible")
        self.broken = broken


@contextmanager
def applied(a: Analysis, ref: Ref, new: dict[str, Any] | None) -> Iterator[Analysis]:
    """The analysis with the incoming object in place of the stored one (None: deleted), for the
    duration of the block; afterwards exactly as before. Every kind goes through
    `inplace.apply.apply_change`, as the controller's and the gateway's changes do; raises Fallback
    where it cannot apply the object in place."""
    before = a.index.by_ref.get(ref)
    old_raw = before.raw if before is not None else None
    probe = new if new is not None else old_raw
    if probe is None:  # the deletion of what the analysis does not hold
        yield a
        return
    if apply_change(a, probe, new) is None:
        # Every in-place update puts the object's new copy in the index before anything it may leave
        # half-done; one that declined before that changed nothing (a new namespace, a malformed
        # object, a kind it does not take). Half-done is taken back by the caller's full analysis.
        raise Fallback(a.index.by_ref.get(ref) is not before)
    try:
        yield a
    finally:
        if apply_change(a, probe if old_raw is None else old_raw, old_raw) is None:
            raise Fallback(True)


# ---------- what affects an object ----------

@dataclass
class Contribution:
    policy: Ref
    kind: str
    levels: set[Ref] = field(default_factory=set)  # where it is attached, on the object's paths
    stanzas: set[str] = field(default_factory=set)
    fields: dict[str, Any] = field(default_factory=dict)


def contributions(a: Analysis, obj: Ref) -> list[Contribution]:
    """Each policy that supplies a leaf to the object or its sections: where it is attached and what it sets."""
    targets = [obj] + [obj.with_section(s) for s in a.topology.sections.get(obj, [])]
    out: dict[Ref, Contribution] = {}
    for t in targets:
        for ep in a.effective_of(t):
            for leaf, (value, stanza, source) in ep.result.leaves.items():
                if source is None or not stanza:
                    continue
                c = out.get(source)
                if c is None:
                    c = out[source] = Contribution(source, ep.kind.kind)
                c.stanzas.add(stanza)
                c.fields.setdefault(field_name(leaf), value)
                for o in a.outcomes.get(source, []):
                    if o.reason == ACCEPTED and o.at is not None and o.at in ep.path.levels:
                        c.levels.add(o.at)
    return sorted(out.values(), key=lambda c: c.policy.sort_key())


def affected_warnings(a: Analysis, obj: Ref) -> list[str]:
    out = []
    for c in contributions(a, obj):
        where = ", ".join(sorted(str(lv) for lv in c.levels)) or "a level above"
        sets = ", ".join(f"{k}={_value(v)}" for k, v in sorted(c.fields.items())[:4])
        if len(c.fields) > 4:
            sets += f", +{len(c.fields) - 4} more"
        out.append(f"{label(obj)} is affected by {c.kind} {name_of(c.policy)} "
                   f"({'/'.join(sorted(c.stanzas))}, attached to {where}): {sets}")
    return out


# ---------- what becomes of a policy ----------

def items_below(a: Analysis, levels: Iterable[Ref]) -> Iterator[EffectivePolicy]:
    """The effective policies of every path through one of the levels (not a scan of all of them)."""
    by_level = nodes_at(a)
    by_target = a._effective_by_target()  # noqa: SLF001 - the per-path index the engine keeps
    seen: set[int] = set()
    for level in levels:
        for node in by_level.get(level, {}):
            for m in subtree_of(node):
                if id(m) in seen or m.level is None:
                    continue
                seen.add(id(m))
                pairs = by_target.get(m.level, {}).get(m)
                if pairs:
                    yield from effective_policies(m.level, m, pairs)


def beaten(a: Analysis, pref: Ref) -> tuple[int, int, dict[str, set[Ref | None]]]:
    """On how many of the paths where the policy is attached it loses some field; of how many; and
    for each lost field, what beat it (None: the object's own value)."""
    policy = a.policies[pref]
    levels = {o.at for o in a.outcomes.get(pref, []) if o.reason == ACCEPTED and o.at is not None}
    own_fields: set[str] = set()
    from gwpolicy.engine.effective import settings_schema
    from gwpolicy.engine.merge.leaves import flatten

    own = {st: flatten(s, settings_schema(policy.kind, st)) for st, s in policy.stanzas.items()}
    for leaves in own.values():
        own_fields |= {field_name(leaf) for leaf in leaves}
    total = lost_on = 0
    by_field: dict[str, set[Ref | None]] = {}
    kk = policy.kind.key
    for ep in items_below(a, levels):
        if ep.kind.key != kk:
            continue
        total += 1
        lost_here = False
        for leaves in own.values():
            for leaf in leaves:
                got = ep.result.leaves.get(leaf)
                if got is not None and got[2] == pref:
                    continue
                lost_here = True
                by_field.setdefault(field_name(leaf), set()).add(got[2] if got is not None else None)
        lost_on += lost_here
    return lost_on, total, by_field


def _outcome_warning(policy_label: str, o: TargetOutcome) -> str:
    target = label(o.declared) if o.declared is not None else o.field
    return f"{policy_label} would be {o.reason} on {target}: {o.message}"


def _mesh_rule_warning(policy_label: str, pref: Ref, target: Ref) -> str:
    """A target in another namespace that the policy reaches by GEP-713's mesh rule: it applies to the
    requests of the policy's namespace only, which whoever wrote it may not expect."""
    return (f"{policy_label} applies to {label(target)} for requests from namespace {pref.namespace} only "
            f"(the target is in another namespace: GEP-713's mesh rule); a ReferenceGrant in {target.namespace} "
            f"would make it apply to every namespace's requests")


def policy_verdict(a: Analysis, pref: Ref, opts: Options) -> Verdict:
    v = Verdict()
    policy = a.policies.get(pref)
    if policy is None:
        return v
    plabel = f"{pref.kind} {name_of(pref)}"
    outs = a.outcomes.get(pref, [])
    conflicted = [o for o in outs if o.reason == CONFLICTED]
    invalid = [o for o in outs if o.reason == "Invalid"]
    o: TargetOutcome | None  # each outcome in turn, then the one a denial names (None: the policy's own fault)
    for o in outs:
        if o.reason != ACCEPTED:
            v.warnings.append(_outcome_warning(plabel, o))
        elif o.level is not None and o.declared is not None and o.declared.namespace not in (None, pref.namespace):
            v.warnings.append(_mesh_rule_warning(plabel, pref, o.declared))
    lost_on, total, by_field = beaten(a, pref)
    if total and lost_on:
        scope = "every path" if lost_on == total else f"{lost_on} of {total} paths"
        for fname, winners in sorted(by_field.items()):
            who = ", ".join(sorted("the object's own value" if w is None else f"{w.kind} {name_of(w)}"
                                   for w in winners))
            v.warnings.append(f"{plabel}: {fname} is beaten on {scope} by {who}")
    if opts.deny_conflicts and conflicted:
        o = conflicted[0]
        older = f"{o.winner.kind} {name_of(o.winner)}" if o.winner is not None else "an older policy"
        v.allowed = False
        v.message = (f"{plabel} would be Conflicted on {label(o.declared) if o.declared else o.field}: "
                     f"{o.message} To apply it, merge its settings into {older}, target another object or "
                     f"section, or delete {older} first (this cluster's gwpolicy webhook denies conflicts).")
    elif opts.deny_invalid and (invalid or policy.invalid):
        o = invalid[0] if invalid else None
        why = o.message if o is not None else policy.invalid
        v.allowed = False
        v.message = (f"{plabel} is Invalid: {why} Correct {o.field if o is not None else 'the spec'} and apply it "
                     f"again (this cluster's gwpolicy webhook denies invalid policies).")
    v.warnings = fold(v.warnings, pref)
    return v


# ---------- the review ----------

def _is_reviewed_kind(ref: Ref) -> bool:
    return ref.group == GATEWAY_GROUP or (ref.group == CORE_GROUP and ref.kind in CORE_KINDS)


def review(a: Analysis | None, request: dict[str, Any], opts: Options,
           objects: Callable[[], Iterable[dict[str, Any]]]) -> tuple[Verdict, bool]:
    """The verdict on one AdmissionReview request, and whether the analysis was left half-changed (the
    caller must then analyse anew). `objects` gives the cluster's objects for a whole analysis."""
    op = request.get("operation")
    new = request.get("object") if op in ("CREATE", "UPDATE") else None
    old = request.get("oldObject")
    raw = new if isinstance(new, dict) else old if isinstance(old, dict) else None
    if a is None or raw is None or op not in ("CREATE", "UPDATE", "DELETE"):
        return Verdict(), False
    raw = copy.deepcopy(raw)
    meta = raw.setdefault("metadata", {})
    if request.get("namespace") and not meta.get("namespace"):
        meta["namespace"] = request["namespace"]
    ref = ref_of_raw(raw)
    if new is None:  # DELETE
        return _delete_verdict(a, ref), False
    try:
        with applied(a, ref, raw) as now:
            return _verdict(now, ref, opts), False
    except Fallback as fb:
        broken = fb.broken
    if not (_is_reviewed_kind(ref) or policy_ref(a, raw) is not None):
        return Verdict(), broken
    raws = [o for o in objects() if ref_of_raw(o) != ref]
    if len(raws) > opts.full_analysis_limit:
        return (_verdict(a, ref, opts) if not broken else Verdict()), broken
    after = analyse([*raws, raw], default_namespace=request.get("namespace") or "default",
                    controller=a.controller, now=a.now)
    return _verdict(after, ref, opts), broken


def _verdict(a: Analysis, ref: Ref, opts: Options) -> Verdict:
    if ref in a.policies:
        return policy_verdict(a, ref, opts)
    return Verdict(warnings=fold(affected_warnings(a, ref), ref))


def _delete_verdict(a: Analysis, ref: Ref) -> Verdict:
    if ref not in a.policies:
        return Verdict()
    levels = {o.at for o in a.outcomes.get(ref, []) if o.reason == ACCEPTED and o.at is not None}
    owners = {ep.target.object for ep in items_below(a, levels) if ref in ep.result.policies}
    if not owners:
        return Verdict()
    return Verdict(warnings=[f"deleting {ref.kind} {name_of(ref)} changes the effective policy of "
                             f"{len(owners)} object(s); see `kubectl gwpolicy impact {ref.kind.lower()}/{ref.name}"
                             f"{' -n ' + ref.namespace if ref.namespace else ''}`"])
