"""Resolving a policy's targets: group inference (S2.2), scope and security (S3), existence (S1.4, S8.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.kinds import CORE_SPELLED_CORE, default_group, is_known_namespaced
from gwpolicy.engine.mesh import consumer_level, is_external, is_mesh_kind
from gwpolicy.engine.model import ObjectIndex
from gwpolicy.engine.names import is_subdomain
from gwpolicy.engine.policies import Policy
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.engine.shapes import target_ref_problem
from gwpolicy.engine.topology import Topology, extend

ACCEPTED, CONFLICTED, INVALID, NOT_FOUND = "Accepted", "Conflicted", "Invalid", "TargetNotFound"
#: S8.1: the worst result wins when several targets share one status ancestor
SEVERITY = {INVALID: 3, NOT_FOUND: 2, CONFLICTED: 1, ACCEPTED: 0}

_SECTION_WORD = {"Gateway": "listener", "Service": "port"}


@dataclass(slots=True)
class TargetOutcome:
    """What became of one targetRef entry of one policy."""

    policy: Policy
    declared: Ref | None  # the ancestorRef: the target as written, namespace resolved
    reason: str
    message: str
    field: str  # e.g. spec.targetRefs[2]
    winner: Ref | None = None  # the policy that beat this one, when Conflicted
    in_scope: bool = True  # False for S3 breaches: then nothing about the target is revealed
    attached: bool = False  # it resolved and attaches (before conflicts are settled)
    #: where it attaches when not at `declared`: a consumer level, by the mesh rule (engine/mesh.py)
    level: Ref | None = None

    @property
    def at(self) -> Ref | None:
        """The level the policy attaches at: `declared`, or its consumer level under the mesh rule."""
        return self.level if self.level is not None else self.declared

    def reset(self) -> None:
        """Back to Accepted, before the conflicts on its target are settled again."""
        if self.attached:
            self.reason, self.winner = ACCEPTED, None
            self.message = self.accepted_message

    @property
    def accepted_message(self) -> str:
        d = self.declared
        if d is None:
            return "Accepted."
        label = f"{d.namespace}/{d.name}" if d.namespace else d.name
        on = f" {_SECTION_WORD.get(d.kind, 'rule' if d.kind.endswith('Route') else 'section')} {d.section}" if d.section else ""
        if self.level is not None:
            return (f"Attached to {d.kind} {label}{on} for requests from namespace {self.policy.ref.namespace} only: "
                    f"the target is not in the policy's namespace, so it applies to that namespace's requests (the mesh rule).")
        return f"Attached to {d.kind} {label}{on}."

    @property
    def resolved(self) -> Ref | None:
        """The attachment point, when the target exists and the policy may attach to it."""
        return self.declared if self.reason in (ACCEPTED, CONFLICTED) else None


def target_group(policy: Policy, tref: dict[str, Any], kind: str, index: ObjectIndex) -> Any:
    """A targetRef's group: as written (NGF's `core` is the core group for its kinds), else the
    kind's own group, else the group the input holds that kind in, else the core group."""
    group = tref.get("group")
    if group == "core" and policy.kind.group in CORE_SPELLED_CORE:
        return CORE_GROUP
    if group is None:
        group = default_group(kind)
        if group is None:
            group = index.kind_groups.get(kind, CORE_GROUP)
    return group


def target_is_namespaced(group: str, kind: str, index: ObjectIndex) -> bool:
    known = is_known_namespaced(group, kind)
    if known is not None:
        return known
    crd = index.crds.get((group, kind))
    if crd is not None and isinstance(crd.spec, dict):
        return crd.spec.get("scope", "Namespaced") == "Namespaced"
    objs = index.of_kind(group, kind)
    if objs:
        return objs[0].namespace is not None
    return True  # virtual backends (S1.4) live in the route's namespace


def declared_targets(policies: list[Policy], index: ObjectIndex) -> list[tuple[str | None, Ref]]:
    """(policy namespace, target as declared) of every well-formed targetRef: what the mesh reads
    before targets are resolved (its consumers and mesh-rule targets depend on them, M5, M6)."""
    out: list[tuple[str | None, Ref]] = []
    for policy in policies:
        pns = policy.ref.namespace
        for tref in policy.target_refs:
            if not isinstance(tref, dict) or target_ref_problem(tref) is not None:
                continue
            kind, name, section = tref.get("kind"), tref.get("name"), tref.get("sectionName")
            if not isinstance(kind, str) or not isinstance(name, str) or not kind or not name:
                continue
            group = target_group(policy, tref, kind, index)
            ns = (tref.get("namespace") or pns) if target_is_namespaced(group, kind, index) else None
            out.append((pns, Ref(group, kind, ns, name, section if isinstance(section, str) and section else None)))
    return out


def resolve_targets(policy: Policy, index: ObjectIndex, topo: Topology, grants: ReferenceGrants) -> list[TargetOutcome]:
    """One outcome per distinct declared target; a policy-wide problem makes each Invalid."""
    outcomes: list[TargetOutcome] = []
    seen: set[Ref] = set()
    many = policy.target_field == "spec.targetRefs"
    for i, tref in enumerate(policy.target_refs):
        where = f"{policy.target_field}[{i}]" if many else policy.target_field
        out = _resolve_one(policy, tref, where, index, topo, grants)
        if out.declared is not None and out.declared in seen:
            continue
        if out.declared is not None:
            seen.add(out.declared)
        if policy.invalid and out.reason != INVALID:
            out.reason, out.message, out.attached = INVALID, policy.invalid, False
        outcomes.append(out)
    if not outcomes:
        outcomes.append(TargetOutcome(policy, None, INVALID, policy.invalid or "the policy has no target", "spec"))
    return outcomes


def _resolve_one(policy: Policy, tref: dict[str, Any], where: str, index: ObjectIndex,
                 topo: Topology, grants: ReferenceGrants) -> TargetOutcome:
    kind, name = tref.get("kind"), tref.get("name")
    if not kind or not name:
        return TargetOutcome(policy, None, INVALID, f"{where}: kind and name are required", where)
    # a field given with the wrong type is an error, never dropped: without its sectionName or
    # namespace the target would silently widen to the whole object or move to the policy's namespace
    problem = target_ref_problem(tref)
    if problem is not None:
        return TargetOutcome(policy, None, INVALID, f"{where}.{problem}", where)
    for key in ("kind", "name", "namespace", "sectionName"):
        if tref.get(key) == "":
            return TargetOutcome(policy, None, INVALID, f"{where}.{key}: must not be empty; leave it out instead", where)
    group = target_group(policy, tref, kind, index)
    section = tref.get("sectionName")
    pns = policy.ref.namespace
    if target_is_namespaced(group, kind, index):
        ns = tref.get("namespace") or pns
        if ns is None:
            return TargetOutcome(policy, Ref(group, kind, None, name, section), INVALID,
                                 f"{where}: {kind} {name} is namespaced, and a cluster-scoped policy must name its namespace",
                                 where, in_scope=False)
    else:
        ns = None
    declared = Ref(group, kind, ns, name, section)

    def invalid(msg: str) -> TargetOutcome:
        return TargetOutcome(policy, declared, INVALID, f"{where}: {msg}", where, in_scope=False)

    # S3.7: scope first, so that a policy cannot probe other namespaces
    if (kind == "GatewayClass" and group == GATEWAY_GROUP or is_mesh_kind(group, kind)) and pns is not None:
        return invalid(f"{kind} {name} can only be targeted by a cluster-scoped policy; "
                       f"{policy.ref.kind} is namespaced")
    if kind == "Namespace" and group == CORE_GROUP and pns is not None and name != pns:
        return invalid(f"a policy in namespace {pns} may target only its own Namespace, not {name}")
    mesh = topo.mesh
    level: Ref | None = None  # a consumer level, when the mesh rule attaches the policy (M6, M7)
    if ns is not None and pns is not None and ns != pns and not grants.allows(
            policy.ref.group, policy.ref.kind, pns, group, kind, ns, name):
        if mesh is None or declared not in mesh.reach.get(pns, ()):
            return invalid(f"{kind} {ns}/{name} is in another namespace and no ReferenceGrant in {ns} allows "
                           f"{policy.ref.kind} from {pns} to refer to it")
        level = consumer_level(declared, pns)
        if policy.cls == "direct":
            return invalid(f"{kind} {ns}/{name} is in another namespace, and a {policy.ref.kind} applies at its "
                           f"target itself: it cannot apply to the requests of namespace {pns} alone (the mesh rule); "
                           f"a ReferenceGrant in {ns} would make it {ns}'s own")
    if mesh is not None and is_external(group, kind):
        if not is_subdomain(name) or section is not None:
            return invalid(f"{kind} names a DNS hostname (a DNS-1123 subdomain, without sectionName), not {name!r}")
        if pns is not None:
            level = consumer_level(declared, pns)
    if (group, kind) in topo.policy_kinds:
        return TargetOutcome(policy, declared, INVALID,
                             f"{where}: {kind} is a policy kind, and a policy cannot target another policy; "
                             f"target the Gateway API object, Namespace or backend it is about", where)
    allowed = policy.kind.target_kinds
    if allowed is not None and (group, kind) not in allowed:
        names = ", ".join(k for _, k in allowed) or "nothing"
        return TargetOutcome(policy, declared, INVALID,
                             f"{where}: {policy.kind.kind} cannot target {kind}; it targets {names}", where)
    obj_ref = declared.object
    if not topo.exists(obj_ref):
        if obj_ref in index.by_ref:  # S1.4: any object of the input can be a (virtual) target
            topo.add_path(obj_ref, extend(topo.root, obj_ref))
        else:
            label = f"{ns}/{name}" if ns else name
            return TargetOutcome(policy, declared, NOT_FOUND, f"{where}: {kind} {label} does not exist", where)
    if section is not None and not topo.has_section(declared):
        word = _SECTION_WORD.get(kind, "named rule" if kind.endswith("Route") else "section")
        label = f"{ns}/{name}" if ns else name
        return TargetOutcome(policy, declared, NOT_FOUND,
                             f"{where}: {kind} {label} has no {word} named {section!r}", where)
    out = TargetOutcome(policy, declared, ACCEPTED, "", where, attached=True, level=level)
    out.message = out.accepted_message
    return out
