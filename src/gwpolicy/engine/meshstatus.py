"""What the mesh controller writes (M11 of docs/semantics.md): one `status.parents[]` entry per
Service parentRef of each mesh route, and the XMesh's `Accepted` condition."""

from __future__ import annotations

from typing import Any, Callable

from gwpolicy.engine.analysis import Analysis, StatusChange
from gwpolicy.engine.mesh import MESH_CONTROLLER, MESH_ROUTE_KINDS, Mesh, MeshParent
from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref, sort_by_ref
from gwpolicy.engine.status import condition, find_condition

#: the Gateway API mesh features (pkg/features/mesh.go) the mesh supports, for the XMesh's
#: `status.supportedFeatures` (the conformance suite reads them from there when given the mesh's
#: name): each is exercised by a translated conformance case that passes (tests/data/mesh-conformance)
MESH_FEATURES = ("Mesh", "MeshClusterIPMatching", "MeshConsumerRoute", "MeshHTTPRouteBackendRequestHeaderModification",
                 "MeshHTTPRouteNamedRouteRule", "MeshHTTPRouteQueryParamMatching", "MeshHTTPRouteRedirectPath",
                 "MeshHTTPRouteRedirectPort", "MeshHTTPRouteRewritePath", "MeshHTTPRouteSchemeRedirect")


def _controller(mesh: Mesh) -> str:
    spec = mesh.obj.spec if isinstance(mesh.obj.spec, dict) else {}
    return str(spec.get("controllerName", ""))


def resolved_refs(route: Obj, index: ObjectIndex) -> tuple[str, str, str]:
    """(status, reason, message) of a mesh route's `ResolvedRefs`: as for Gateway routes, except
    that a backend in another namespace needs no ReferenceGrant (GEP-1294)."""
    spec = route.spec if isinstance(route.spec, dict) else {}
    for rule in spec.get("rules") or []:
        if not isinstance(rule, dict):
            continue
        for bref in rule.get("backendRefs") or []:
            if not isinstance(bref, dict):
                continue
            group, kind = bref.get("group") or CORE_GROUP, bref.get("kind") or "Service"
            ns, name = bref.get("namespace") or route.namespace, bref.get("name")
            if (group, kind) != (CORE_GROUP, "Service"):
                return "False", "InvalidKind", f"backendRef {kind} {name}: the mesh sends only to Services."
            if not isinstance(name, str) or not isinstance(ns, str) or index.by_ref.get(Ref(CORE_GROUP, "Service", ns, name)) is None:
                return "False", "BackendNotFound", f"backendRef Service {ns}/{name} does not exist."
    return "True", "ResolvedRefs", "All references are resolved."


def _parent_key(pref: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(pref.get(k) for k in ("group", "kind", "namespace", "name", "sectionName", "port"))


def route_status(route: Obj, parents: list[MeshParent], index: ObjectIndex, controller: str, now: str) -> dict[str, Any]:
    """The route's `status` after the mesh controller's write: other controllers' entries kept."""
    raw = route.raw.get("status")
    status = dict(raw) if isinstance(raw, dict) else {}
    existing = [p for p in status.get("parents") or [] if isinstance(p, dict)]
    others = [p for p in existing if p.get("controllerName") != controller]
    previous = {_parent_key(p.get("parentRef") or {}): p for p in existing if p.get("controllerName") == controller}
    resolved = resolved_refs(route, index)
    ours = []
    for parent in parents:
        prev = previous.get(_parent_key(parent.parent_ref)) or {}
        accepted = ("True", "Accepted", parent.message) if parent.accepted else ("False", "NoMatchingParent", parent.message)
        conds = prev.get("conditions")
        ours.append({"parentRef": parent.parent_ref, "controllerName": controller, "conditions": [
            condition("Accepted", *accepted, route.generation, find_condition(conds, "Accepted"), now),
            condition("ResolvedRefs", *resolved, route.generation, find_condition(conds, "ResolvedRefs"), now)]})
    status["parents"] = others + ours
    return status


def mesh_object_status(obj: Obj, now: str) -> dict[str, Any]:
    """The XMesh's `status` after the mesh controller's write: its `Accepted` condition (the others
    kept) and the features it supports, sorted by name as GEP-3949 asks."""
    raw = obj.raw.get("status")
    status = dict(raw) if isinstance(raw, dict) else {}
    conds = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    accepted = condition("Accepted", "True", "Accepted", "Accepted by the mesh controller.", obj.generation,
                         find_condition(conds, "Accepted"), now)
    status["conditions"] = [c for c in conds if c.get("type") != "Accepted"] + [accepted]
    status["supportedFeatures"] = [{"name": f} for f in sorted(MESH_FEATURES)]
    return status


def without_entries_of(route: Obj, controller: str) -> dict[str, Any] | None:
    """The route's `status` with `controller`'s `parents[]` entries taken out; None when it has none."""
    raw = route.raw.get("status")
    status = dict(raw) if isinstance(raw, dict) else {}
    parents = [p for p in status.get("parents") or [] if isinstance(p, dict)]
    kept = [p for p in parents if p.get("controllerName") != controller]
    if len(kept) == len(parents):
        return None
    status["parents"] = kept
    return status


#: the status an object should carry, as a function of its newest copy (other writers' entries and
#: the previous conditions' transition times are read from that copy)
Wanted = Callable[[Obj], dict[str, Any]]


def status_writes(a: Analysis, controller: str = MESH_CONTROLLER) -> dict[Ref, Wanted]:
    """Every object the mesh controller writes, with the status it should carry: the XMesh, each
    mesh route (its Service parents' entries), and each route that holds entries of `controller`
    the mesh does not give it (no Service parent left, or no XMesh of ours: they are taken out)."""
    mesh = a.topology.mesh
    out: dict[Ref, Wanted] = {}
    now = a.now

    def of_route(parents: list[MeshParent], ctl: str) -> Wanted:
        return lambda obj: route_status(obj, parents, a.index, ctl, now)

    def stale(ctl: str) -> Wanted:
        return lambda obj: without_entries_of(obj, ctl) or dict(obj.raw.get("status") or {})

    if mesh is not None:
        controller = _controller(mesh)
        out[mesh.ref] = lambda obj: mesh_object_status(obj, now)
        for ref, parents in mesh.parents.items():
            out[ref] = of_route(parents, controller)
    for kind in MESH_ROUTE_KINDS:
        for route in a.index.of_kind(GATEWAY_GROUP, kind):
            if route.ref not in out and without_entries_of(route, controller) is not None:
                out[route.ref] = stale(controller)
    return out


def mesh_status_changes(a: Analysis) -> list[StatusChange]:
    """What the mesh controller would write, one item per object whose status it changes, sorted;
    nothing when the input turns no mesh on and holds no entries of the mesh controller."""
    out = []
    for ref, wanted in status_writes(a).items():
        obj = a.index.by_ref[ref]
        status = wanted(obj)
        current = obj.raw.get("status")
        if status != (current if isinstance(current, dict) else {}):
            ann = obj.metadata.get("annotations")
            out.append(StatusChange(ref, status, dict(ann) if isinstance(ann, dict) else {}))
    sort_by_ref(out, lambda ch: ch.object)
    return out
