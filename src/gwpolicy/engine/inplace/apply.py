"""Any object created, changed or deleted, applied to an analysis in place (the controller's, the
webhook's and the gateway's fast path): `apply_change` is the one entry point;
`prepare` builds, right after a full analysis, the indexes the updates keep.

Only what the change can affect is recomputed: for a policy, the conflicts on the targets it had and
has; for a route, its paths and those of its backends through it; for a Gateway (listeners,
hostnames, allowedRoutes, its class), a Service (created, deleted, its ports), a Namespace (labels,
created, deleted) and a ReferenceGrant, the paths of the routes that name it, or that it lets
through, derived again and compared with the ones they had; then the path nodes that came (their
summaries and effective policies), the breadcrumbs of the objects whose affecting policies change,
and the status of the policies on the targets whose paths or existence changed.

What still returns None (the caller runs a full analysis), being rare and costly to follow: while
the mesh is on, any change but of a kind the analysis never reads (EndpointSlices, Secrets,
ConfigMaps; docs/semantics.md, "Mesh (east-west)"); a GatewayClass (every Gateway of the class
moves), a CustomResourceDefinition or PolicyKind (a new policy kind, or a kind's schema and rules),
an object in a namespace the analysis does not know yet,
a malformed object (a full analysis leaves it out and says why), an object deleted from a
namespace no Namespace object names (it may be the last that makes the namespace exist, S4.5; a
live cluster always has the Namespace object), and objects of other kinds.
Property tests hold that the result equals a full analysis of the same objects.
"""

from __future__ import annotations

import gc
from typing import Any

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.inplace.base import nodes_at_of_full_analysis, replace_object, route_index
from gwpolicy.engine.inplace.hierarchy import (
    update_gateway,
    update_grant,
    update_namespace,
    update_route,
    update_service,
)
from gwpolicy.engine.inplace.policies import kinds_targeted, named_across, update_policy
from gwpolicy.engine.kinds import ROUTE_KINDS, split_api_version
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.engine.shapes import object_problem
from gwpolicy.engine.topology import namespace_ref


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
    if a.topology.mesh is not None and _group_kind(raw) not in UNREAD_KINDS:
        # mesh paths (engine/mesh.py) depend on routes, Services and policies together, and a
        # policy by the mesh rule attaches at a consumer level, which the updates here do not
        # follow; an object the analysis never reads changes no mesh path
        return None
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


def _group_kind(raw: dict[str, Any]) -> tuple[str, str]:
    group, _ = split_api_version(raw.get("apiVersion", ""))
    return group, raw.get("kind", "")


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
    if kinds_targeted(a)[ref.kind]:
        return None
    replace_object(a.index, ref, raw)
    return set()


def prepare(a: Analysis) -> None:
    """Build, right after a full analysis, the indexes the first incremental update would otherwise
    build on its own time (at 50k routes, tens of milliseconds of the first edit)."""
    topo = a.topology
    if topo._nodes_at is None:
        topo._nodes_at = nodes_at_of_full_analysis(topo)
    route_index(a)
    a.affected  # noqa: B018 - and with it the effective policies by target
    a._declaring_index()
    kinds_targeted(a)  # the first Secret renewed
    named_across(a)  # the first ReferenceGrant changed (about 4 ms at 20k routes)
    a._effective = None  # the flat list: every update drops it (and letting go of a million items takes ms)
