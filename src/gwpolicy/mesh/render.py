"""A client namespace's proxy configuration: objects -> NGINX files, through the gateway's pipeline
(mesh/routes.py makes its input; the engine analyses it; gateway/dataplane builds; gateway/render.py
renders). The policies come from the engine's mesh paths of the real objects (engine/mesh.py): each
backend of each rule gets the effective policy of its mesh path for the client namespace, and an
upstream made with it, so a policy applies on mesh paths by GEP-713's mesh rule, not by the
gateway's (what applies of each kind: mesh/policies.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gwpolicy.engine.analysis import Analysis, analyse
from gwpolicy.engine.kinds import split_api_version
from gwpolicy.engine.mesh import MESH_KINDS, effective_from
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane import DataPlane, DataPlaneConfig, build_dataplane
from gwpolicy.gateway.dataplane.backends import upstream_for
from gwpolicy.gateway.dataplane.model import spec_key
from gwpolicy.gateway.render import render
from gwpolicy.mesh import egress
from gwpolicy.mesh.routes import MESH_CONTROLLER, gateway_objects, gateway_ref, services

#: the mesh the engine's analysis is given when the input has none of the mesh controller (the
#: proxy is the mesh's data plane: it needs no XMesh to serve, and neither do its policies)
IMPLIED_MESH: dict[str, Any] = {"apiVersion": "gateway.networking.x-k8s.io/v1alpha1", "kind": "XMesh",
                "metadata": {"name": "gwpolicy-mesh"}, "spec": {"controllerName": MESH_CONTROLLER}}


@dataclass(frozen=True)
class MeshConfig:
    """What the proxy's operator chooses (mirrors the gateway's endpoint flags)."""

    allow_unmanaged_endpointslices: bool = False
    allow_loopback_endpoints: bool = False
    worker_processes: int | str = "auto"
    own_endpoints: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    #: the egress port to ExternalServices' hosts (mesh/egress.py); None: the proxy has none
    egress: egress.EgressConfig | None = None


def build(objects: Iterable[Mapping[str, Any]], client: str, config: MeshConfig = MeshConfig()) -> tuple[DataPlane, dict[str, bytes]]:
    """The data plane and the NGINX files of namespace `client`'s proxy."""
    objects = list(objects)
    view = gateway_objects(objects, client)
    addresses = {Ref(GATEWAY_GROUP, "Gateway", *gateway_ref(s)): s.cluster_ip for s in services(objects)}
    analysis = analyse(view, controller=MESH_CONTROLLER, by_target=True)
    dp = build_dataplane(analysis, DataPlaneConfig(
        controller_name=MESH_CONTROLLER, addresses=addresses, any_address=True,
        allow_unmanaged_endpointslices=config.allow_unmanaged_endpointslices,
        allow_loopback_endpoints=config.allow_loopback_endpoints, worker_processes=config.worker_processes,
        own_endpoints=config.own_endpoints))
    mesh_analysis = _mesh_analysis(objects)
    _attach_policies(dp, mesh_analysis, client)
    _policy_upstreams(dp)
    files = render(dp)
    if config.egress is not None:
        egress.add(files, egress.render(mesh_analysis, client, config.egress))
    return dp, files


def mesh_on(objects: Iterable[Mapping[str, Any]]) -> bool:
    """Does an XMesh (or Mesh) of the mesh controller exist among `objects`?"""
    return any((split_api_version(str(o.get("apiVersion", "")))[0], o.get("kind")) in MESH_KINDS
               and isinstance(o.get("spec"), dict) and o["spec"].get("controllerName") == MESH_CONTROLLER
               for o in objects)


def _mesh_analysis(objects: list[Mapping[str, Any]]) -> Analysis:
    """The engine's analysis of the real objects, with the mesh on."""
    given = [dict(o) for o in objects] + ([] if mesh_on(objects) else [copy.deepcopy(IMPLIED_MESH)])
    return analyse(given, controller=MESH_CONTROLLER, kind_checks=policyconf.kind_checks(), by_target=True)


def _attach_policies(dp: DataPlane, a: Analysis, client: str) -> None:
    """Each backend of each rule (and each rule) gets the effective policy of the engine's mesh path
    of the same client namespace, Service port, route, rule and backend, with the rule's own fields
    merged in as the kinds say (as the gateway's builder does for its paths)."""
    mesh = a.topology.mesh
    if mesh is None:
        return
    for action in dp.actions.values():
        gw = action.listener
        frontend = Ref(CORE_GROUP, "Service", gw.namespace, gw.name)
        port = int(str(gw.section)[1:])
        fport = _port_level(a, frontend, port)
        route = action.route if action.route in mesh.routes_for(client, frontend, port) else None
        rule = _rule_of(a, route, action.rule)
        need = {frontend, fport} | ({route} if route is not None else set())
        if route is not None and isinstance(rule.get("name"), str):
            need.add(route.with_section(rule["name"]))
        action.effective = policyconf.with_route_fields(_effective(a, client, fport, need, route is None), rule)
        for b in action.backends:
            if b.upstream is None:
                continue
            target = fport if route is None else _port_level(a, b.ref, dp.upstreams[b.upstream].port)
            b.effective = policyconf.with_route_fields(_effective(a, client, target, need, route is None), rule)
            b.path = b.path or (target,)


def _port_level(a: Analysis, service: Ref, port: int) -> Ref:
    """The level of a Service port on mesh paths: the port's own when it is named (M4), else the
    Service's."""
    service = Ref(service.group, service.kind, service.namespace, service.name)
    mesh = a.topology.mesh
    named = [n for p, n in (mesh.frontends.get(service, []) if mesh is not None else []) if p == port and n]
    return service.with_section(named[0]) if named else service


def _policy_upstreams(dp: DataPlane) -> None:
    """Each backend's upstream made again from the effective policy of its mesh path (the view's
    paths carry none): the Service port's endpoints with the path's UpstreamSettingsPolicy settings
    and the RetryPolicy's copies of each endpoint, one upstream per distinct set of settings (a
    Service reached with and without retries from this namespace gets two); upstreams no backend
    or mirror uses any more are left out."""
    for action in dp.actions.values():
        for b in action.backends:
            was = dp.upstreams.get(b.upstream) if b.upstream is not None else None
            if was is None:
                continue
            u = upstream_for(was.service, was.port, was.endpoints, b.effective, was.tls)
            dp.upstreams.setdefault(u.name, u)
            b.upstream = u.name
    used = {b.upstream for a in dp.actions.values() for b in a.backends} | \
        {m.upstream for a in dp.actions.values() for m in a.mirrors}
    dp.upstreams = {n: u for n, u in sorted(dp.upstreams.items()) if n in used}


def _rule_of(a: Analysis, route: Ref | None, index: int) -> dict[str, Any]:
    obj = a.index.by_ref.get(route) if route is not None else None
    rules = (obj.spec or {}).get("rules") if obj is not None and isinstance(obj.spec, dict) else None
    rule = rules[index] if isinstance(rules, list) and 0 <= index < len(rules) else None
    return rule if isinstance(rule, dict) else {}


def _effective(a: Analysis, client: str, target: Ref, need: set[Ref], routeless: bool) -> dict[str, Any]:
    """Kind -> effective spec on the first mesh path of `target` for `client` through every level of
    `need` (and through no route when `routeless`)."""
    by_path: dict[int, dict[str, Any]] = {}
    for ep in effective_from(a, client, target):
        levels = set(ep.path.levels)
        if not need <= levels or (routeless and any(lv.kind == "HTTPRoute" for lv in levels)) or not ep.result.leaves:
            continue
        key = spec_key(ep.kind.group, ep.kind.kind)
        by_path.setdefault(id(ep.path), {})[key] = policyconf.Effective.of(ep.result)
    return next(iter(by_path.values()), {})
