"""Status (S8): PolicyAncestorStatus per ancestor, GEP-1364 conditions, breadcrumbs on affected objects.

Everything here is a function of the analysis and of the status the objects already carry, so
that computing status over objects that carry the computed status changes nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, TypeVar

from gwpolicy.engine.attach import ACCEPTED, NOT_FOUND, SEVERITY, TargetOutcome
from gwpolicy.engine.kinds import ROUTE_KINDS
from gwpolicy.engine.mesh import is_mesh_kind
from gwpolicy.engine.model import Obj
from gwpolicy.engine.policies import Policy
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.engine.topology import Topology, namespace_ref

#: an entry's key in `keep_places_keyed` (a caller's own, e.g. a parentRef's tuple)
EntryKey = TypeVar("EntryKey", bound=Hashable)

DEFAULT_CONTROLLER = "gwpolicy.io/policy-controller"
ANNOTATION = "gwpolicy.io/PolicyAffected"
#: what the Gateway API CRDs allow (maxItems): a status beyond them is rejected by the API server
MAX_ANCESTORS = 16  # a policy's status.ancestors
MAX_PARENTS = 32  # a route's status.parents
MAX_CONDITIONS = 8  # status.conditions of a Gateway or GatewayClass, and of each route parent entry
#: a breadcrumb condition that stands for the kinds whose own condition found no room
SUMMARY_CONDITION = "gwpolicy.io/PolicyAffected"
_NAMED_AT_MOST = 10  # names listed in a message before "and N more" (messages are capped too)


def affected_condition_type(kind: str) -> str:
    return f"gwpolicy.io/{kind}Affected"


def _parent_key(ref: dict[str, Any]) -> tuple:
    """A ParentReference as a comparable key (group defaults to Gateway API, kind to Gateway)."""
    get = ref.get
    group = get("group")
    return (GATEWAY_GROUP if group is None else group, get("kind") or "Gateway", get("namespace") or "",
            get("name") or "", get("sectionName") or "", get("port") or 0)


def keep_places(existing: list[dict[str, Any]], ours: list[dict[str, Any]], is_ours: Callable[[dict[str, Any]], bool],
                key: Callable[[dict[str, Any]], Hashable]) -> list[dict[str, Any]]:
    """`existing` with our entries brought to `ours`: every other writer's entry stays where it is, ours
    are replaced in place (or dropped when gone), new ones are appended. Several controllers share these
    lists (GEP-713); rebuilding them in an order of our own would make two writers undo each other forever."""
    return keep_places_keyed(existing, [key(e) if is_ours(e) else None for e in existing], {key(e): e for e in ours})


def keep_places_keyed(existing: list[dict[str, Any]], keys: list[EntryKey | None],
                      fresh: dict[EntryKey, dict[str, Any]]) -> list[dict[str, Any]]:
    """`keep_places` for a caller that has each entry's key already: `keys[i]` is that of
    `existing[i]` when it is ours, None when another writer's; `fresh`, our entries by key (taken
    from as they are placed)."""
    out = []
    for e, k in zip(existing, keys):
        if k is None:
            out.append(e)
        else:
            mine = fresh.pop(k, None)
            if mine is not None:
                out.append(mine)
    return out + list(fresh.values())


def condition(ctype: str, status: str, reason: str, message: str, generation: int | None,
              previous: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """A metav1.Condition; lastTransitionTime moves only when `status` changes (S8.3)."""
    cond: dict[str, Any] = {"type": ctype, "status": status, "reason": reason, "message": message}
    if generation is not None:
        cond["observedGeneration"] = generation
    if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime"):
        cond["lastTransitionTime"] = previous["lastTransitionTime"]
    else:
        cond["lastTransitionTime"] = now
    return cond


def find_condition(conditions: Any, ctype: str) -> dict[str, Any] | None:
    """The condition of a type in a list that may hold anything."""
    if isinstance(conditions, list):
        for c in conditions:
            if isinstance(c, dict) and c.get("type") == ctype:
                return c
    return None


def ancestor_results(policy: Policy, outcomes: list[TargetOutcome], topo: Topology) -> dict[Ref, TargetOutcome]:
    """S8.1: the ancestor each outcome reports on; when several share one, the worst result shows."""
    result: dict[Ref, TargetOutcome] = {}
    gateway_mode = policy.kind.status_ancestor == "Gateway"
    for o in outcomes:
        ancestors: list[Ref] = []
        if o.declared is None:
            ns = policy.ref.namespace
            ancestors = [namespace_ref(ns) if ns is not None else policy.ref]
        elif gateway_mode and o.in_scope and o.reason != NOT_FOUND and topo.exists(o.declared):
            seen: dict[Ref, None] = {}
            for path in topo.paths_of(o.declared):
                for level in path:
                    if (level.kind == "Gateway" and level.group == GATEWAY_GROUP or is_mesh_kind(level.group, level.kind)) \
                            and level.section is None:  # the XMesh stands for the Gateway on mesh paths (M10)
                        seen[level] = None
            ancestors = list(seen) or [o.declared]
        else:
            ancestors = [o.declared]
        for anc in ancestors:
            prev = result.get(anc)
            if prev is None or SEVERITY[o.reason] > SEVERITY[prev.reason]:
                result[anc] = o
    return result


def policy_status(policy: Policy, outcomes: list[TargetOutcome], topo: Topology,
                  controller: str, now: str) -> dict[str, Any]:
    """The policy's `status` after our write: other controllers' entries kept, ours recomputed."""
    status = policy.obj.raw.get("status")
    status = dict(status) if isinstance(status, dict) else {}
    existing = [e for e in status.get("ancestors") or [] if isinstance(e, dict)]
    others = [e for e in existing if e.get("controllerName") != controller]
    previous = {_parent_key(e.get("ancestorRef") or {}): e for e in existing if e.get("controllerName") == controller}
    ours: list[dict[str, Any]] = []
    results = ancestor_results(policy, outcomes, topo)
    for anc in sorted(results, key=Ref.sort_key):
        o = results[anc]
        aref = anc.to_json()
        prev = previous.get(_parent_key(aref))
        prev_cond = find_condition((prev or {}).get("conditions"), "Accepted")
        status_word = "True" if o.reason == ACCEPTED else "False"
        ours.append({
            "ancestorRef": aref,
            "controllerName": controller,
            "conditions": [condition("Accepted", status_word, o.reason, outcome_message(o, anc),
                                     policy.obj.generation, prev_cond, now)],
        })
    room = max(0, MAX_ANCESTORS - len(others))
    if len(ours) > room > 0:  # the last entry that fits says which ones did not (S8.1: cut in ancestorRef order)
        left_out = [Ref(**_ref_args(e["ancestorRef"])) for e in ours[room:]]
        last = ours[room - 1]["conditions"][0]
        last["message"] += (f" {len(left_out)} more ancestor{'s' if len(left_out) != 1 else ''} of this policy "
                            f"{'are' if len(left_out) != 1 else 'is'} not listed, because status.ancestors holds "
                            f"at most {MAX_ANCESTORS} entries: {_names([_label(r) for r in left_out])}; "
                            f"run 'gwpolicy describe {policy.ref.kind.lower()}/{policy.ref.name}"
                            f"{' -n ' + policy.ref.namespace if policy.ref.namespace else ''}' to see them.")
    status["ancestors"] = keep_places(existing, ours[:room], lambda e: e.get("controllerName") == controller,
                                      lambda e: _parent_key(e.get("ancestorRef") or {}))
    return status


def _ref_args(aref: dict[str, Any]) -> dict[str, Any]:
    return {"group": aref["group"], "kind": aref["kind"], "namespace": aref.get("namespace"),
            "name": aref["name"], "section": aref.get("sectionName")}


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_NAMED_AT_MOST])
    return shown + (f" and {len(names) - _NAMED_AT_MOST} more" if len(names) > _NAMED_AT_MOST else "")


def _affected_conditions(kinds: list[str], room: int, describe: str, gen: int | None,
                         previous: Any, now: str) -> list[dict[str, Any]]:
    """One `gwpolicy.io/<Kind>Affected` condition per kind (S8.4), within `room` conditions: when they
    do not all fit, the last one that fits is `gwpolicy.io/PolicyAffected`, naming the other kinds."""
    return _conditions_of(_affected_messages(kinds, room, describe), gen, previous, now)


def _affected_messages(kinds: list[str], room: int, describe: str) -> list[tuple[str, str]]:
    """(type, message) of each condition `_affected_conditions` gives: the same under every parent of a
    route, so made once per object."""
    if len(kinds) <= room:
        return [(affected_condition_type(k), f"Affected by a {k}; run '{describe}' to see how.") for k in kinds]
    if room <= 0:
        return []
    shown, rest = kinds[:room - 1], kinds[room - 1:]
    out = [(affected_condition_type(k), f"Affected by a {k}; run '{describe}' to see how.") for k in shown]
    out.append((SUMMARY_CONDITION, f"Also affected by {_names(rest)}: conditions hold at most {MAX_CONDITIONS} "
                                   f"entries, so these have no condition of their own; run '{describe}' to see how."))
    return out


def _conditions_of(messages: list[tuple[str, str]], gen: int | None, previous: Any, now: str) -> list[dict[str, Any]]:
    first: dict[str, dict[str, Any]] = {}  # the first condition of each type (as `find_condition` finds it)
    if isinstance(previous, list):
        for c in previous:
            if isinstance(c, dict):
                ctype = c.get("type")
                if isinstance(ctype, str) and ctype not in first:
                    first[ctype] = c
    return [condition(ctype, "True", "PolicyAffected", message, gen, first.get(ctype), now)
            for ctype, message in messages]


def outcome_message(o: TargetOutcome, ancestor: Ref) -> str:
    """S8.2: why, in words a user can act on; for Accepted, where it is attached and where reported."""
    if o.reason == ACCEPTED and o.declared is not None and ancestor != o.declared:
        return f"{o.message[:-1]}; reported on {_label(ancestor)}."
    return o.message


def _label(ref: Ref | None) -> str:
    if ref is None:
        return "nothing"
    name = f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name
    return f"{ref.kind} {name}" + (f" section {ref.section}" if ref.section else "")


def breadcrumbs(obj: Obj, affected_kinds: Iterable[str], topo: Topology, controller: str,
                now: str) -> tuple[dict[str, Any], dict[str, str]]:
    """S8.4: the object's status and annotations after our write."""
    kinds = sorted(set(affected_kinds))
    raw_status = obj.raw.get("status")
    # a shallow copy: only its `conditions` or `parents` list is replaced below (by a new list),
    # nothing inside is changed, and a deep copy was half the status computation once objects carry one
    status = dict(raw_status) if isinstance(raw_status, dict) else {}
    annotations = dict(obj.metadata.get("annotations") or {}) if isinstance(obj.metadata.get("annotations"), dict) else {}
    kind = obj.kind
    if annotation_only(obj):
        _set_annotation(annotations, bool(kinds))  # a Service, a Namespace, a policy: the annotation only
        return status, annotations
    gen = obj.generation
    parent_refs = topo.route_parents.get(obj.ref, [])
    describe = _describe(obj)
    if kind in ("Gateway", "GatewayClass") or is_mesh_kind(obj.group, kind):
        conds = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
        kept = [c for c in conds if not _ours_type(c.get("type"))]
        room = MAX_CONDITIONS - len(kept)
        ours = _affected_conditions(kinds, room, describe, gen, conds, now)
        if ours or len(kept) != len(conds):
            status["conditions"] = keep_places(conds, ours, lambda c: _ours_type(c.get("type")), lambda c: c.get("type"))
        # no room at all in status.conditions: the annotation carries the breadcrumb (S8.4)
        _set_annotation(annotations, bool(kinds) and room <= 0)
        return status, annotations
    if parent_refs:  # a route
        parents = [p for p in status.get("parents") or [] if isinstance(p, dict)]
        # each entry's key made once (None: another controller's entry), for `keep_places_keyed` below
        keys = [_parent_key(p.get("parentRef") or {}) if p.get("controllerName") == controller else None
                for p in parents]
        previous = {k: p for k, p in zip(keys, parents) if k is not None}
        room = max(0, MAX_PARENTS - keys.count(None))
        fresh: dict[tuple, dict[str, Any]] = {}  # our entries, by key
        if kinds:
            messages = _affected_messages(kinds, MAX_CONDITIONS, describe)
            for pref in parent_refs[:room]:
                key = _parent_key(pref)
                prev = previous.get(key)
                fresh[key] = {"parentRef": dict(pref), "controllerName": controller,
                              "conditions": _conditions_of(messages, gen, (prev or {}).get("conditions"), now)}
        if fresh or previous:
            status["parents"] = keep_places_keyed(parents, keys, fresh)
        # parentRefs without an entry of ours (status.parents is full): the annotation carries the breadcrumb
        _set_annotation(annotations, bool(kinds) and len(parent_refs) > room)
        return status, annotations
    _set_annotation(annotations, bool(kinds))
    return status, annotations


def _describe(obj: Obj) -> str:
    """The command a breadcrumb's message names."""
    return f"gwpolicy describe {obj.kind.lower()}/{obj.name}" + (f" -n {obj.namespace}" if obj.namespace else "")


def route_breadcrumbs_hold(obj: Obj, affected_kinds: Iterable[str], topo: Topology, controller: str) -> bool:
    """True only when `breadcrumbs` would leave a route's status and annotations as they are: its
    entry of ours under every parent already says what ours would say. Checked in place with nothing
    built (what a full analysis of routes that carry our status mostly finds: at 50k routes building
    and comparing their breadcrumbs was a second). False is no verdict: `breadcrumbs` decides.
    tests/engine/test_breadcrumbs_hold.py (hypothesis) checks that True always agrees with `breadcrumbs`."""
    kinds = sorted(set(affected_kinds))
    if not kinds or obj.group != GATEWAY_GROUP or obj.kind not in ROUTE_KINDS:
        return False
    parent_refs = topo.route_parents.get(obj.ref)
    raw = obj.raw
    status = raw.get("status")
    if not parent_refs or type(status) is not dict:
        return False
    parents = status.get("parents")
    if type(parents) is not list:
        return False
    ours: dict[tuple, dict[str, Any]] = {}
    others = 0
    for p in parents:
        if type(p) is not dict:
            return False  # `breadcrumbs` drops it: the list changes
        if p.get("controllerName") == controller:
            k = _parent_key(p.get("parentRef") or {})
            if k in ours:
                return False  # the second entry of ours for one parent goes
            ours[k] = p
        else:
            others += 1
    if len(parent_refs) > MAX_PARENTS - others:
        return False  # parentRefs without room for an entry: the annotation speaks for them
    wanted = {_parent_key(pref): pref for pref in parent_refs}  # the last one of a key wins, as in `breadcrumbs`
    if len(wanted) != len(ours):
        return False
    ann = raw["metadata"].get("annotations")
    if isinstance(ann, dict) and ANNOTATION in ann:
        return False  # every parent has its entry: the annotation goes
    gen = obj.generation
    size = 5 if gen is None else 6  # type, status, reason, message, lastTransitionTime[, observedGeneration]
    messages = _affected_messages(kinds, MAX_CONDITIONS, _describe(obj))
    for k, pref in wanted.items():
        p = ours.get(k)
        # parentRef, controllerName (ours: matched above) and conditions, nothing else
        if p is None or len(p) != 3 or p.get("parentRef") != pref:
            return False
        conds = p.get("conditions")
        if type(conds) is not list or len(conds) != len(messages):
            return False
        for c, (ctype, message) in zip(conds, messages):
            # the types are distinct, so `c` is the first of its type and lends its transition time
            if type(c) is not dict or len(c) != size or c.get("type") != ctype or c.get("status") != "True" \
                    or c.get("reason") != "PolicyAffected" or c.get("message") != message \
                    or not c.get("lastTransitionTime") or (gen is not None and c.get("observedGeneration") != gen):
                return False
    return True


def annotation_only(obj: Obj) -> bool:
    """Does the object carry its breadcrumb in the annotation alone (a Service, a Namespace, a
    policy: `breadcrumbs` leaves its status as it is)?"""
    kind = obj.kind
    if is_mesh_kind(obj.group, kind):
        return False  # the XMesh carries conditions, as a Gateway does (S8.4)
    return obj.group != GATEWAY_GROUP or (kind not in ("Gateway", "GatewayClass") and kind not in ROUTE_KINDS)


def annotation_says(obj: Obj, affected: bool) -> bool:
    """Does the object's annotation already say what `breadcrumbs` would make it say (for an
    `annotation_only` object: then our write would change nothing)?"""
    ann = obj.metadata.get("annotations")
    if not isinstance(ann, dict):
        return not affected
    return ann.get(ANNOTATION) == "true" if affected else ANNOTATION not in ann


def _set_annotation(annotations: dict[str, str], affected: bool) -> None:
    if affected:
        annotations[ANNOTATION] = "true"
    else:
        annotations.pop(ANNOTATION, None)


def carries_breadcrumb(obj: Obj, controller: str) -> bool:
    """Whether the object holds a breadcrumb of ours (S8.4); without one and unaffected, `breadcrumbs`
    would return its status and annotations unchanged."""
    ann = obj.metadata.get("annotations")
    if isinstance(ann, dict) and ANNOTATION in ann:
        return True
    status = obj.raw.get("status")
    if not isinstance(status, dict):
        return False
    conds, parents = status.get("conditions"), status.get("parents")
    return (isinstance(conds, list) and any(isinstance(c, dict) and _ours_type(c.get("type")) for c in conds)) or \
        (isinstance(parents, list) and any(isinstance(p, dict) and p.get("controllerName") == controller for p in parents))


def _ours_type(ctype: Any) -> bool:
    return isinstance(ctype, str) and ctype.startswith("gwpolicy.io/") and ctype.endswith("Affected")


