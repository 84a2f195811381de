"""The mesh (east-west): GAMMA routes, consumer namespaces and GEP-713's mesh rule (M1-M11 of
docs/semantics.md, "Mesh (east-west)").

The mesh is on when the input holds an XMesh of the mesh controller (M1). Then a route whose
parentRefs name a Service is a mesh route of that Service (M2), and every Service with a cluster IP
gets mesh paths, one set per consumer namespace (M4, M5):

    XMesh > Namespace/C > [consumer route > rule] > Namespace/P > [producer route > rule]
          > Service/F > F's port > Namespace/Q > Service/K > K's port

A policy that applies by the mesh rule (M6: its target is in another namespace, no ReferenceGrant
admits it) attaches at a *consumer level*: its target's reference with the consumer written into
the kind (`Service@a`), placed on the consumer's paths only, right below the consumer's own levels
(M8). Consumer levels are never shown as levels of a path (`PathNode.to_json` leaves them out);
`str()` shows them as `Service/b/s [for requests from namespace a]`.

What a data plane asks: `Mesh.routes_for(namespace, service, port)`, the routes a request takes
in precedence order; `Mesh.consumer_of(namespace, service)`, the consumer whose paths hold a
request's effective policies; and `effective_from(analysis, namespace, target)`, those policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.names import is_subdomain
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref

if TYPE_CHECKING:  # topology.py imports this module (and analysis.py topology.py): for annotations only
    from gwpolicy.engine.analysis import Analysis
    from gwpolicy.engine.effective import EffectivePolicy
    from gwpolicy.engine.topology import PathNode, Topology

MESH_CONTROLLER = "gwpolicy.io/mesh-controller"
MESH_GROUP = "gateway.networking.x-k8s.io"
#: the kinds that turn the mesh on: XMesh, and Mesh once it graduates to the standard group
MESH_KINDS = ((MESH_GROUP, "XMesh"), (GATEWAY_GROUP, "Mesh"))
EXTERNAL_GROUP, EXTERNAL_KIND = "gwpolicy.io", "ExternalService"
#: the consumer of every namespace without paths of its own (`Namespace/*`)
ANY = "*"
MESH_ROUTE_KINDS = ("HTTPRoute", "GRPCRoute")
#: why a Service parentRef attaches to nothing (M11)
NO_MATCHING_PARENT = "NoMatchingParent"


def is_mesh_kind(group: str, kind: str) -> bool:
    return (group, kind) in MESH_KINDS


def is_external(group: str, kind: str) -> bool:
    return group == EXTERNAL_GROUP and kind == EXTERNAL_KIND


def names_service(pref: dict[str, Any]) -> bool:
    """Is the parentRef a Service (group "" written out, kind Service)?"""
    return pref.get("group") == CORE_GROUP and pref.get("kind") == "Service"


def consumer_level(ref: Ref, consumer: str) -> Ref:
    """The level at which a policy applying by the mesh rule attaches (M8): `ref` seen by `consumer`."""
    return Ref(ref.group, f"{ref.kind}@{consumer}", ref.namespace, ref.name, ref.section)


def split_consumer_level(level: Ref) -> tuple[Ref, str] | None:
    """(the target, the consumer) of a consumer level; None for any other level."""
    if "@" not in level[1]:
        return None
    kind, consumer = level[1].split("@", 1)
    return Ref(level.group, kind, level.namespace, level.name, level.section), consumer


def path_consumer(levels: Any) -> str | None:
    """The consumer of a mesh path (its second level is `Namespace/C`); None for other paths."""
    if len(levels) >= 2 and is_mesh_kind(levels[0].group, levels[0].kind):
        second = levels[1]
        if second.kind == "Namespace" and second.group == CORE_GROUP:
            return str(second.name)
    return None


class RequestsFrom:
    """Which mesh paths hold the requests of one namespace (M5): its own paths, and the paths of `*`
    to each frontend (a Service, an ExternalService) it has no paths of its own to. A path of `*`
    that ends above its frontend (a producer route, its rule) holds them when some frontend below
    it does. North-south paths, the XMesh's own and other consumers' hold none."""

    def __init__(self, mesh: Mesh, namespace: str) -> None:
        self.mesh = mesh
        self.namespace = namespace
        self._below: dict[PathNode, bool] = {}

    def holds(self, path: PathNode) -> bool:
        consumer = path_consumer(path.levels)
        if consumer is None or consumer != ANY:
            return consumer == self.namespace
        return self.borrows(path)

    def borrows(self, path: PathNode) -> bool:
        """Is `path` a path of `*` that holds the namespace's requests (it has none of its own there)?"""
        if path_consumer(path.levels) != ANY:
            return False
        for level in path.levels[2:]:
            verdict = self._frontend(level)
            if verdict is not None:
                return verdict
        return self._any_below(path)

    def _frontend(self, level: Ref) -> bool | None:
        """None when `level` is no frontend; else whether the namespace takes `*`'s paths to it."""
        consumers = self.mesh.consumers.get(level)
        if consumers is None:
            consumers = self.mesh.external.get(level)
        return None if consumers is None else self.namespace not in consumers

    def _any_below(self, node: PathNode) -> bool:
        known = self._below.get(node)
        if known is not None:
            return known
        found = False
        for level, child in (node.children or {}).items():
            verdict = self._frontend(level)
            if verdict if verdict is not None else self._any_below(child):
                found = True
                break
        self._below[node] = found
        return found


def seen_from(levels: tuple[Ref, ...], namespace: str) -> tuple[Ref, ...]:
    """The objects of a mesh path that holds the requests of `namespace`, as that namespace sees
    them: `Namespace/*` written as it, consumer levels left out (they are not objects), so that its
    path to an object is the same whether it takes the paths of `*` or has its own."""
    objects = tuple(level for level in levels if "@" not in level[1])
    if path_consumer(objects) == ANY:
        return (objects[0], _namespace(namespace)) + objects[2:]
    return objects


def effective_from(a: Analysis, namespace: str, target: Ref) -> list[EffectivePolicy]:
    """The effective policies of `target` (a Service, its port, a route, a rule, a backend, an
    ExternalService) on the mesh paths of requests from `namespace` (`RequestsFrom`). Empty when
    the mesh is off."""
    mesh = a.topology.mesh
    if mesh is None:
        return []
    view = RequestsFrom(mesh, namespace)
    return [ep for ep in a.effective_of(target) if view.holds(ep.path)]


def find_mesh(index: ObjectIndex, controller: str = MESH_CONTROLLER) -> Obj | None:
    """The XMesh (or Mesh) of the mesh controller, the oldest when there are several (M1)."""
    found = [o for gk in MESH_KINDS for o in index.of_kind(*gk)
             if isinstance(o.spec, dict) and o.spec.get("controllerName") == controller]
    return min(found, key=lambda o: o.age_key) if found else None


def has_cluster_ip(svc: Obj) -> bool:
    spec = svc.spec if isinstance(svc.spec, dict) else {}
    return spec.get("clusterIP") != "None" and spec.get("type") != "ExternalName"


def mesh_ports(svc: Obj) -> list[tuple[int, str | None]]:
    """(port, name or None) of each port of a Service."""
    spec = svc.spec if isinstance(svc.spec, dict) else {}
    out: list[tuple[int, str | None]] = []
    for p in spec.get("ports") or []:
        if isinstance(p, dict) and isinstance(p.get("port"), int) and not isinstance(p.get("port"), bool):
            name = p.get("name")
            out.append((p["port"], name if isinstance(name, str) and name else None))
    return out


@dataclass
class MeshParent:
    """One Service parentRef of a mesh route, as the mesh controller reports it (M11)."""

    parent_ref: dict[str, Any]  # as written, with its namespace
    service: Ref
    ports: list[int]  # the ports it attaches to; empty: it attaches to nothing
    message: str

    @property
    def accepted(self) -> bool:
        return bool(self.ports)


@dataclass
class Mesh:
    """The mesh model of one input (M1-M11): routes by frontend, consumers, mesh-rule targets."""

    obj: Obj
    ref: Ref
    #: Services with a cluster IP -> their ports (port, name)
    frontends: dict[Ref, list[tuple[int, str | None]]] = field(default_factory=dict)
    #: route -> its Service parentRefs (every mesh route, accepted or not)
    parents: dict[Ref, list[MeshParent]] = field(default_factory=dict)
    #: (frontend, port) -> route namespace -> the routes attached there, oldest first
    attached: dict[tuple[Ref, int], dict[str, list[Obj]]] = field(default_factory=dict)
    #: namespace -> what its policies target in other namespaces (the mesh rule's candidates)
    rule_targets: dict[str, set[Ref]] = field(default_factory=dict)
    #: namespaces a policy targets the Namespace of (M5)
    targeted_namespaces: set[str] = field(default_factory=set)
    #: frontend -> its consumers with paths of their own, `*` last
    consumers: dict[Ref, list[str]] = field(default_factory=dict)
    #: consumer -> every level (object or section) on its paths (M7)
    reach: dict[str, set[Ref]] = field(default_factory=dict)
    #: ExternalService -> its consumers (M9)
    external: dict[Ref, list[str]] = field(default_factory=dict)

    def routes_for(self, namespace: str, service: Ref, port: int) -> list[Ref]:
        """The routes a request from `namespace` to `service`:`port` takes (M3), in precedence
        order (oldest first, then namespace/name): the namespace's consumer routes if it has any,
        else the producer's routes, else none."""
        return [r.ref for r in self.routes_taken(namespace, service.object, port)]

    def consumer_of(self, namespace: str, service: Ref) -> str:
        """The consumer whose mesh paths hold the requests of `namespace` to `service` (M5)."""
        return namespace if namespace in self.consumers.get(service.object, ()) else ANY

    def routes_taken(self, consumer: str, service: Ref, port: int) -> list[Obj]:
        """The route objects of `routes_for`."""
        by_ns = self.attached.get((service, port), {})
        producer = service.namespace or ""
        routes = by_ns.get(consumer) if consumer != producer else None
        return routes or by_ns.get(producer) or []


def service_parent(route: Obj, pref: dict[str, Any], index: ObjectIndex) -> MeshParent:
    """What a Service parentRef attaches to (M2)."""
    ns = pref.get("namespace") or route.namespace or ""
    name = str(pref.get("name", ""))
    written = dict(pref)
    written["namespace"] = ns
    ref = Ref(CORE_GROUP, "Service", ns, name)
    svc = index.by_ref.get(ref)
    if svc is None:
        return MeshParent(written, ref, [], f"Service {ns}/{name} does not exist.")
    if not has_cluster_ip(svc):
        return MeshParent(written, ref, [], f"Service {ns}/{name} has no cluster IP (headless or ExternalName), "
                                            "so the mesh has no address of it to serve.")
    port, section = pref.get("port"), pref.get("sectionName")
    ports = [p for p, pname in mesh_ports(svc) if (port is None or port == p) and (section is None or section == pname)]
    if not ports:
        want = " and ".join(x for x in (f"port {port}" if port is not None else "",
                                          f"a port named {section!r}" if section is not None else "") if x)
        return MeshParent(written, ref, [], f"Service {ns}/{name} has no {want}.")
    return MeshParent(written, ref, ports, "Accepted by the mesh.")


def build_mesh(index: ObjectIndex, policy_targets: list[tuple[str | None, Ref]],
               controller: str = MESH_CONTROLLER) -> Mesh | None:
    """The mesh of an input, or None when no XMesh of the controller turns it on (M1).
    `policy_targets`: (policy namespace, declared target) of every targetRef of every policy."""
    obj = find_mesh(index, controller)
    if obj is None:
        return None
    mesh = Mesh(obj, obj.ref)
    for svc in index.of_kind(CORE_GROUP, "Service"):
        if has_cluster_ip(svc):
            mesh.frontends[svc.ref] = mesh_ports(svc)
    for kind in MESH_ROUTE_KINDS:
        for route in index.of_kind(GATEWAY_GROUP, kind):
            spec = route.spec if isinstance(route.spec, dict) else {}
            prefs = [p for p in spec.get("parentRefs") or [] if isinstance(p, dict) and names_service(p)]
            if not prefs:
                continue
            parents = mesh.parents[route.ref] = [service_parent(route, p, index) for p in prefs]
            for parent in parents:
                for port in parent.ports:
                    routes = mesh.attached.setdefault((parent.service, port), {}).setdefault(route.namespace or "", [])
                    if route not in routes:
                        routes.append(route)
    for by_ns in mesh.attached.values():
        for routes in by_ns.values():
            routes.sort(key=lambda r: r.age_key)
    for pns, target in policy_targets:
        if target.kind == "Namespace" and target.group == CORE_GROUP:
            mesh.targeted_namespaces.add(target.name)
        if pns is not None and (target.namespace not in (None, pns) or is_external(target.group, target.kind)):
            mesh.rule_targets.setdefault(pns, set()).add(target)
        if is_external(target.group, target.kind) and is_subdomain(target.name) and target.section is None:
            consumers = mesh.external.setdefault(target, [])
            if pns is not None and pns not in consumers:
                consumers.append(pns)
    for consumers in mesh.external.values():
        consumers.sort()
        consumers.append(ANY)
    return mesh


def _namespace(name: str) -> Ref:
    return Ref(CORE_GROUP, "Namespace", None, name)


def _rules(route: Obj) -> list[dict[str, Any]]:
    spec = route.spec if isinstance(route.spec, dict) else {}
    return [r for r in spec.get("rules") or [] if isinstance(r, dict)]


def _backend(index: ObjectIndex, route: Obj, bref: dict[str, Any]) -> tuple[Ref, Ref | None] | None:
    """A backendRef's level and its port's level (None: an unnamed port or none); None when the
    backend is a Service absent from the input. A backend in another namespace needs no
    ReferenceGrant on a mesh route (GEP-1294)."""
    group, kind = bref.get("group") or CORE_GROUP, bref.get("kind") or "Service"
    ns, name = bref.get("namespace") or route.namespace, bref.get("name")
    if not isinstance(name, str) or not isinstance(ns, str) or not isinstance(group, str) or not isinstance(kind, str):
        return None
    ref = Ref(group, kind, ns, name)
    if (group, kind) != (CORE_GROUP, "Service"):
        return ref, None
    svc = index.by_ref.get(ref)
    if svc is None:
        return None
    port = bref.get("port")
    named = [pname for p, pname in mesh_ports(svc) if p == port and pname]
    return ref, ref.with_section(named[0]) if named else None


def _levels(mesh: Mesh, consumer: str, route: Obj | None, rule: Ref | None, frontend: Ref, fport: Ref | None,
            backend: tuple[Ref, Ref | None] | None) -> tuple[list[Ref], int]:
    """The levels of one mesh path (M4), most general first, and where the consumer's own levels end."""
    levels = [mesh.ref, _namespace(consumer)]
    on = set(levels)

    def add(r: Ref) -> None:
        if r not in on:
            on.add(r)
            levels.append(r)

    def add_object(r: Ref) -> None:
        if r.namespace is not None:
            add(_namespace(r.namespace))
        add(r)

    is_consumer_route = route is not None and route.namespace != frontend.namespace
    if route is not None and is_consumer_route:
        add_object(route.ref)
        if rule is not None:
            add(rule)
    k = len(levels)
    if route is not None and not is_consumer_route:
        add_object(route.ref)
        if rule is not None:
            add(rule)
    add_object(frontend)
    if fport is not None:
        add(fport)
    if backend is not None:
        add_object(backend[0])
        if backend[1] is not None:
            add(backend[1])
    return levels, k


def _sequences(mesh: Mesh, consumer: str, frontend: Ref, index: ObjectIndex) -> list[tuple[list[Ref], int]]:
    """Every mesh path of requests from `consumer` to `frontend`, as `_levels` gives them."""
    out = []
    for port, pname in mesh.frontends[frontend]:
        fport = frontend.with_section(pname) if pname else None
        routes = mesh.routes_taken(consumer, frontend, port)
        if not routes:
            out.append(_levels(mesh, consumer, None, None, frontend, fport, None))
        for route in routes:
            rules = _rules(route)
            if not rules:
                out.append(_levels(mesh, consumer, route, None, frontend, fport, None))
            for rule in rules:
                rname = rule.get("name")
                rule_ref = route.ref.with_section(rname) if isinstance(rname, str) and rname else None
                backends = [b for b in (_backend(index, route, bref) for bref in rule.get("backendRefs") or []
                                        if isinstance(bref, dict)) if b is not None]
                if not backends:
                    out.append(_levels(mesh, consumer, route, rule_ref, frontend, fport, None))
                for backend in backends:
                    out.append(_levels(mesh, consumer, route, rule_ref, frontend, fport, backend))
    return out


def _emit(topo: Topology, mesh: Mesh, consumer: str, levels: list[Ref], k: int) -> None:
    """Register the path of each level of `levels` (every prefix is the path of its last level;
    a Namespace's only path is its own, as on north-south paths), with the consumer levels of the
    mesh-rule targets on it placed after the first `k` (M8)."""
    reach = mesh.reach.setdefault(consumer, set())
    hidden = mesh.rule_targets.get(consumer) if consumer != ANY else None
    node: PathNode = topo.root
    if not hidden or not any(level in hidden for level in levels[k:]):
        for level in levels:
            node = node.child(level)
            if level.kind != "Namespace":
                topo.add_path(level, node)
            reach.add(level)
        return
    for i, level in enumerate(levels):
        below = levels[k:i + 1]
        node = topo.root
        for lv in levels[:min(i + 1, k)] + [consumer_level(x, consumer) for x in below if x in hidden] + below:
            node = node.child(lv)
        if level.kind != "Namespace":
            topo.add_path(level, node)
        reach.add(level)


def add_paths(mesh: Mesh, topo: Topology, index: ObjectIndex) -> None:
    """Every mesh path (M4) of every frontend and ExternalService, for each of its consumers (M5)."""
    topo.add_path(mesh.ref, topo.root.child(mesh.ref))
    with_routes: dict[Ref, set[str]] = {}
    for (frontend, _), by_ns in mesh.attached.items():
        with_routes.setdefault(frontend, set()).update(by_ns)
    for frontend in sorted(mesh.frontends, key=Ref.sort_key):
        producer = frontend.namespace or ""
        own = with_routes.get(frontend, set()) | mesh.targeted_namespaces | {producer}
        consumers = []
        for consumer in sorted(own | set(mesh.rule_targets)) + [ANY]:
            sequences = _sequences(mesh, consumer, frontend, index)
            if consumer not in own and consumer != ANY:  # a consumer by the mesh rule alone
                targets = mesh.rule_targets[consumer]
                if not any(level in targets for levels, _ in sequences for level in levels):
                    continue
            consumers.append(consumer)
            for levels, k in sequences:
                _emit(topo, mesh, consumer, levels, k)
        mesh.consumers[frontend] = consumers
    for external in sorted(mesh.external, key=Ref.sort_key):
        for consumer in mesh.external[external]:
            _emit(topo, mesh, consumer, [mesh.ref, _namespace(consumer), external], 2)
