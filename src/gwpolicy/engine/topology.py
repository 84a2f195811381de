"""The Gateway API hierarchy and its paths (S1.2, S1.3, S4).

A path is a tuple of level references from the most general down to the target:
`GatewayClass > Namespace > Gateway > listener > Namespace > route > rule > Namespace > backend > port`,
with each Namespace level placed directly above the highest object of the path that lives in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterator

from gwpolicy.engine.grants import ReferenceGrants
from gwpolicy.engine.kinds import PROTOCOL_ROUTE_KINDS, ROUTE_KINDS
from gwpolicy.engine.mesh import Mesh, add_paths
from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref

if TYPE_CHECKING:  # effective.py imports this module: for the annotation of `PathNode.summary` only
    from gwpolicy.engine.effective import Summary


class PathNode:
    """One path, as a node in a tree of shared prefixes: a level and the path above it.

    Nodes are interned (a parent has one child per level), so two ways to the same path are the
    same node, and everything computed for a prefix (policies along it, its JSON) is computed once
    for every path below it. A node behaves as the tuple of its levels.
    """

    __slots__ = ("level", "parent", "children", "namespaces", "_levels", "_json", "summary")

    def __init__(self, level: Ref | None, parent: "PathNode | None", namespaces: frozenset[str]) -> None:
        self.level = level
        self.parent = parent
        self.children: dict[Ref, PathNode] | None = None
        self.namespaces = namespaces
        self._levels: tuple[Ref, ...] | None = None
        self._json: list[dict[str, object]] | None = None
        self.summary: Summary | None = None  # filled by the evaluator: policies along this prefix

    def child(self, level: Ref) -> "PathNode":
        """The path one level down. The namespaces a path holds follow from its levels alone, so an
        interned node is right however it was first reached (S4.2: a Namespace is placed once)."""
        children = self.children
        if children is None:
            children = self.children = {}
        else:
            node = children.get(level)
            if node is not None:
                return node
        # a Namespace level (`_is_namespace`, inline: once per node of the tree)
        if level[1] == "Namespace" and level[0] == CORE_GROUP and level[4] is None:
            node = children[level] = PathNode(level, self, self.namespaces | {level[3]})
        else:
            node = children[level] = PathNode(level, self, self.namespaces)
        return node

    @property
    def levels(self) -> tuple[Ref, ...]:
        if self._levels is None:
            self._levels = (self.parent.levels if self.parent is not None else ()) + (
                (self.level,) if self.level is not None else ())
        return self._levels

    def to_json(self) -> list[dict[str, object]]:
        """S9 `path`, built once per node from its parent's; a mesh path's consumer levels (a kind
        `Kind@consumer`, engine/mesh.py) are not objects and are left out."""
        if self._json is not None:
            return self._json
        above = self.parent.to_json() if self.parent is not None else []
        level = self.level
        json = above + [level.to_json()] if level is not None and "@" not in level[1] else above
        if self.children is not None:  # only prefixes are asked again; a leaf's list is used once
            self._json = json
        return json

    def __iter__(self) -> Iterator[Ref]:
        return iter(self.levels)

    def __len__(self) -> int:
        return len(self.levels)

    def __getitem__(self, i: int) -> Ref:
        return self.levels[i]

    def __repr__(self) -> str:
        return " > ".join(map(str, self.levels))


Path = PathNode
new_ref = tuple.__new__


@lru_cache(maxsize=4096)
def namespace_ref(name: str) -> Ref:
    """The Namespace level's reference (asked for on every path step into a namespace: kept)."""
    return Ref(CORE_GROUP, "Namespace", None, name)


def _is_namespace(level: Ref) -> bool:
    return level.kind == "Namespace" and level.group == CORE_GROUP and level.section is None


def extend(path: PathNode, ref: Ref) -> PathNode:
    """The path one level down, with the Namespace level first when the path has none for it yet (S4.2)."""
    ns = ref.namespace
    if ns is not None and ref.section is None and ns not in path.namespaces:
        path = path.child(namespace_ref(ns))
    return path.child(ref)


@dataclass
class Topology:
    """Targetable nodes, their sections, and every path to each (S4.3)."""

    paths: dict[Ref, dict[PathNode, None]] = field(default_factory=dict)
    root: PathNode = field(default_factory=lambda: PathNode(None, None, frozenset()))
    sections: dict[Ref, list[str]] = field(default_factory=dict)
    virtual: set[Ref] = field(default_factory=set)
    route_parents: dict[Ref, list[dict[str, Any]]] = field(default_factory=dict)
    listeners_of: dict[Ref, list[dict[str, Any]]] = field(default_factory=dict)
    ports_of: dict[Ref, list[dict[str, Any]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: (group, kind) of every policy kind: never a target, though its objects are in the input
    policy_kinds: frozenset[tuple[str, str]] = frozenset()
    #: indexes an in-place update makes the first time it needs them and keeps up to date
    #: (inplace.base.nodes_at, inplace.base.route_index); declared, as a compiled class has no others
    _nodes_at: dict[Ref, dict[PathNode, None]] | None = field(default=None, repr=False, compare=False)
    _route_index: Any = field(default=None, repr=False, compare=False)
    #: the mesh (engine/mesh.py) when the input turns it on; its routes have mesh paths only
    mesh: Mesh | None = field(default=None, repr=False, compare=False)

    def exists(self, ref: Ref) -> bool:
        return ref.object in self.paths

    def has_section(self, ref: Ref) -> bool:
        return ref.section in self.sections.get(ref.object, ())

    def targets(self) -> list[Ref]:
        """Every object and section that has paths, in a stable order."""
        return sorted(self.paths, key=Ref.sort_key)

    def add_path(self, ref: Ref, path: Path) -> None:
        self.paths.setdefault(ref, {})[path] = None

    def paths_of(self, ref: Ref) -> list[PathNode]:
        return list(self.paths.get(ref, ()))


def hostnames_intersect(listener: str | None, route_hostnames: list[str]) -> bool:
    """Gateway API hostname matching: none on either side matches all; `*.x` needs one or more extra labels."""
    if not listener or not route_hostnames:
        return True
    return any(_host_match(listener, h) for h in route_hostnames if isinstance(h, str))


def _host_match(a: str, b: str) -> bool:
    if a == b:
        return True
    if a.startswith("*.") and b.startswith("*."):
        return b.endswith(a[1:]) or a.endswith(b[1:])
    if a.startswith("*."):
        return b.endswith(a[1:]) and len(b) > len(a) - 1
    if b.startswith("*."):
        return a.endswith(b[1:]) and len(a) > len(b) - 1
    return False


def selector_matches(selector: Any, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions); an empty selector matches everything."""
    if not isinstance(selector, dict):
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        if not isinstance(expr, dict):
            return False
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:  # type: ignore[arg-type]  # no key: no label, deliberately
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def gateway_listeners(gw: Obj) -> list[dict[str, Any]]:
    spec = gw.spec if isinstance(gw.spec, dict) else {}
    return [l for l in spec.get("listeners") or [] if isinstance(l, dict) and isinstance(l.get("name"), str)]


def _admits(listener: dict[str, Any], gw: Obj, route: Obj, index: ObjectIndex) -> bool:
    """Does the listener's allowedRoutes admit the route's namespace and kind (S1.3)?"""
    allowed = listener.get("allowedRoutes")
    if not isinstance(allowed, dict):
        allowed = {}
    namespaces = allowed.get("namespaces")
    if not isinstance(namespaces, dict):
        namespaces = {}
    frm = namespaces.get("from") or "Same"
    if frm == "Same":
        if route.namespace != gw.namespace:
            return False
    elif frm == "Selector":
        if not selector_matches(namespaces.get("selector"), index.namespace_labels(route.namespace or "")):
            return False
    elif frm != "All":
        return False
    kinds = allowed.get("kinds")
    if kinds:
        return any(isinstance(k, dict) and k.get("kind") == route.kind
                   and (k.get("group") if k.get("group") is not None else GATEWAY_GROUP) == route.group
                   for k in kinds)
    protocol = listener.get("protocol")
    return route.kind in PROTOCOL_ROUTE_KINDS.get(protocol, ROUTE_KINDS) if isinstance(protocol, str) else True


def route_rules(route: Obj) -> list[dict[str, Any]]:
    spec = route.spec if isinstance(route.spec, dict) else {}
    return [r for r in spec.get("rules") or [] if isinstance(r, dict)]


def build_topology(index: ObjectIndex, grants: ReferenceGrants, mesh: Mesh | None = None) -> Topology:
    topo = Topology()
    topo.mesh = mesh
    for ns in sorted(index.namespaces):
        topo.add_path(namespace_ref(ns), extend(topo.root, namespace_ref(ns)))
    for gc in index.of_kind(GATEWAY_GROUP, "GatewayClass"):
        topo.add_path(gc.ref, topo.root.child(gc.ref))

    listeners_of: dict[Ref, list[dict[str, Any]]] = {}
    for gw in index.of_kind(GATEWAY_GROUP, "Gateway"):
        spec = gw.spec if isinstance(gw.spec, dict) else {}
        gc_ref = Ref(GATEWAY_GROUP, "GatewayClass", None, str(spec.get("gatewayClassName", "")))
        base = topo.root.child(gc_ref) if gc_ref in index.by_ref else topo.root
        gw_path = extend(base, gw.ref)
        topo.add_path(gw.ref, gw_path)
        listeners = gateway_listeners(gw)
        listeners_of[gw.ref] = listeners
        topo.sections[gw.ref] = [l["name"] for l in listeners]
        for l in listeners:
            lref = gw.ref.with_section(l["name"])
            topo.add_path(lref, gw_path.child(lref))

    ports_of = {svc.ref: service_ports(svc) for svc in index.of_kind(CORE_GROUP, "Service")}
    topo.listeners_of, topo.ports_of = listeners_of, ports_of
    for kind in ROUTE_KINDS:
        for route in index.of_kind(GATEWAY_GROUP, kind):
            attach_route(topo, route, index, grants)

    if mesh is not None:
        add_paths(mesh, topo, index)
    # Services (and their named ports) that no route reaches: Namespace > Service > port
    for svc in index.of_kind(CORE_GROUP, "Service"):
        ports = ports_of[svc.ref]
        topo.sections[svc.ref] = [p["name"] for p in ports]
        if svc.ref not in topo.paths:
            topo.add_path(svc.ref, extend(topo.root, svc.ref))
        for port in ports:
            pref = svc.ref.with_section(port["name"])
            if pref not in topo.paths:
                topo.add_path(pref, extend(topo.root, svc.ref).child(pref))
    for kind in ("ServiceImport",):
        for obj in index.by_kind.get(("multicluster.x-k8s.io", kind), []):
            if obj.ref not in topo.paths:
                topo.add_path(obj.ref, extend(topo.root, obj.ref))
    return topo


def attach_route(topo: Topology, route: Obj, index: ObjectIndex, grants: ReferenceGrants,
                 listener_paths: dict[Ref, dict[PathNode, None]] | None = None) -> set[Ref]:
    """Add a route, its named rules and its backends (and their ports) to the topology; the backends.
    `listener_paths`: where the listeners' paths are read, when not `topo.paths` (an in-place update
    writes a route's paths to a table of its own, apart from the topology it reads)."""
    reached: set[Ref] = set()
    route_paths = paths_of_route(route, index, topo.listeners_of, topo, None, listener_paths)
    ref = route.ref
    paths = topo.paths
    rules = route_rules(route)
    topo.sections[ref] = [r["name"] for r in rules if isinstance(r.get("name"), str)]
    if not route_paths:
        return reached  # a mesh route with no Gateway parent: its paths are the mesh's
    registry = paths.setdefault(ref, {})
    for p in route_paths:
        registry[p] = None
    ports_of = topo.ports_of
    for rule in rules:
        rname = rule.get("name")
        if rname and isinstance(rname, str):
            rule_ref = new_ref(Ref, (ref[0], ref[1], ref[2], ref[3], rname))
            bases = [p.child(rule_ref) for p in route_paths]
            registry = paths.setdefault(rule_ref, {})
            for b in bases:
                registry[b] = None
        else:
            bases = route_paths
        for bref in rule.get("backendRefs") or []:
            if isinstance(bref, dict):
                add_backend_paths(route, bref, bases, index, grants, topo, reached, ports_of)
    return reached


#: why a parentRef attaches to no listener of its Gateway (GEP-1364 route `Accepted` reasons)
NO_MATCHING_PARENT = "NoMatchingParent"
NOT_ALLOWED_BY_LISTENERS = "NotAllowedByListeners"
NO_MATCHING_LISTENER_HOSTNAME = "NoMatchingListenerHostname"


def names_gateway(pref: dict[str, Any]) -> bool:
    """Does the parentRef name a Gateway (group and kind defaulted as the CRD does)? Mesh parents (a
    Service) are not part of this hierarchy (S4.4)."""
    group = pref.get("group")
    return (group is None or group == GATEWAY_GROUP) and (pref.get("kind") or "Gateway") == "Gateway"


def parent_gateway(route: Obj, pref: dict[str, Any]) -> Ref | None:
    """The Gateway a parentRef names; None for other parents."""
    if not names_gateway(pref):
        return None
    # not through the Python-level __new__: once per parentRef of every route a Gateway edit moves
    return new_ref(Ref, (GATEWAY_GROUP, "Gateway", pref.get("namespace") or route.ref[2], str(pref.get("name", "")), None))


def parent_listeners(route: Obj, pref: dict[str, Any], gw: Obj, listeners: list[dict[str, Any]],
                     index: ObjectIndex, admits: dict[tuple[int, str | None, str], bool] | None = None,
                     ) -> tuple[list[dict[str, Any]], str | None]:
    """The listeners of `gw` a parentRef attaches the route to, and, when there are none, why: the
    first filter that left none (sectionName/port, then allowedRoutes, then hostnames). `admits`:
    what `_admits` said, by listener (its id: the caller keeps the listeners and the namespaces'
    labels as they are while it lives), route namespace and kind (a Gateway edit derives the
    paths of a thousand routes of a few namespaces again)."""
    spec = route.spec
    hostnames = spec.get("hostnames") if isinstance(spec, dict) else None
    if not isinstance(hostnames, list):
        hostnames = []
    section, port = pref.get("sectionName"), pref.get("port")
    named = [l for l in listeners
             if (section is None or section == l["name"]) and (port is None or port == l.get("port"))]
    if not named:
        return [], NO_MATCHING_PARENT
    if admits is None:
        admitting = [l for l in named if _admits(l, gw, route, index)]
    else:
        admitting = []
        for l in named:
            key = (id(l), route.ref[2], route.ref[1])
            ok = admits.get(key)
            if ok is None:
                ok = admits[key] = _admits(l, gw, route, index)
            if ok:
                admitting.append(l)
    if not admitting:
        return [], NOT_ALLOWED_BY_LISTENERS
    matching = [l for l in admitting if hostnames_intersect(l.get("hostname"), hostnames)]
    if not matching:
        return [], NO_MATCHING_LISTENER_HOSTNAME
    return matching, None


def paths_of_route(route: Obj, index: ObjectIndex, listeners_of: dict[Ref, list[dict[str, Any]]],
                 topo: Topology, admits: dict[tuple[int, str | None, str], bool] | None = None,
                 listener_paths: dict[Ref, dict[PathNode, None]] | None = None) -> list[PathNode]:
    """One path per listener the route is attached to; `Namespace > route` when none (S4.3).
    `admits`: as `parent_listeners` takes it; `listener_paths`: as `attach_route` takes it."""
    lpaths = topo.paths if listener_paths is None else listener_paths
    spec = route.spec
    parent_refs = [p for p in spec.get("parentRefs") or [] if isinstance(p, dict)] if isinstance(spec, dict) else []
    topo.route_parents[route.ref] = parent_refs
    paths: dict[PathNode, None] = {}
    for pref in parent_refs:
        gw_ref = parent_gateway(route, pref)
        gw = index.by_ref.get(gw_ref) if gw_ref is not None else None
        if gw_ref is None or gw is None:
            continue
        attached, _ = parent_listeners(route, pref, gw, listeners_of.get(gw_ref, []), index, admits)
        for listener in attached:
            lref = new_ref(Ref, (gw_ref[0], gw_ref[1], gw_ref[2], gw_ref[3], listener["name"]))  # `with_section`
            for lp in lpaths.get(lref, ()):
                paths[extend(lp, route.ref)] = None
    if not paths:
        mesh = topo.mesh
        if mesh is not None and any(p.accepted for p in mesh.parents.get(route.ref, ())):
            return []  # attached to the mesh: its paths are mesh paths (engine/mesh.py)
        paths[extend(topo.root, route.ref)] = None
    return list(paths)


def service_ports(svc: Obj) -> list[dict[str, Any]]:
    spec = svc.spec if isinstance(svc.spec, dict) else {}
    return [p for p in spec.get("ports") or [] if isinstance(p, dict) and isinstance(p.get("name"), str) and p["name"]]


def add_backend_paths(route: Obj, bref: dict[str, Any], bases: list[PathNode], index: ObjectIndex,
                 grants: ReferenceGrants, topo: Topology, services_reached: set[Ref],  # every backend reached
                 ports_of: dict[Ref, list[dict[str, Any]]]) -> None:
    get = bref.get
    group = get("group") or CORE_GROUP
    kind = get("kind") or "Service"
    route_ns = route.ref[2]
    ns = get("namespace") or route_ns
    name = get("name")
    if not isinstance(name, str) or not isinstance(ns, str):
        return
    if ns != route_ns and not grants.allows(route.group, route.kind, route_ns or "", group, kind, ns, name):
        return  # S1.3: a cross-namespace backendRef needs a ReferenceGrant
    ref = new_ref(Ref, (group, kind, ns, name, None))  # not through the Python-level __new__: once per backendRef
    obj = index.by_ref.get(ref)
    if obj is None:
        if group == CORE_GROUP and kind == "Service":
            return  # S1.4: a Service absent from the input is not a node
        topo.virtual.add(ref)
    services_reached.add(ref)
    # the ports this backendRef reaches, each with its registry of paths, found once for all bases
    paths = topo.paths
    registry = paths.setdefault(ref, {})
    ports: list[tuple[Ref, dict[PathNode, None]]] = []
    if obj is not None and kind == "Service" and group == CORE_GROUP:
        port = get("port")
        for p in ports_of[ref]:
            if port is None or p.get("port") == port:
                pref = new_ref(Ref, (group, kind, ns, name, p["name"]))
                ports.append((pref, paths.setdefault(pref, {})))
    for base in bases:
        bpath = extend(base, ref)
        registry[bpath] = None
        for pref, port_registry in ports:
            port_registry[bpath.child(pref)] = None
