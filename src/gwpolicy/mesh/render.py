"""A client namespace's proxy configuration: objects -> NGINX files, through the gateway's pipeline
(mesh/routes.py makes its input; the engine analyses it; gateway/dataplane builds; gateway/render.py
renders)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gwpolicy.engine.analysis import analyse
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway.dataplane import DataPlane, DataPlaneConfig, build_dataplane
from gwpolicy.gateway.render import render
from gwpolicy.mesh.routes import MESH_CONTROLLER, gateway_objects, gateway_ref, services


@dataclass(frozen=True)
class MeshConfig:
    """What the proxy's operator chooses (mirrors the gateway's endpoint flags)."""

    allow_unmanaged_endpointslices: bool = False
    allow_loopback_endpoints: bool = False
    worker_processes: int | str = "auto"
    own_endpoints: frozenset[tuple[str, int]] = field(default_factory=frozenset)


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
    return dp, render(dp)
