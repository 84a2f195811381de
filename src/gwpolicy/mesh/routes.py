"""Which mesh routes apply to the requests of one client namespace, and the gateway input that
serves them (pure: objects in, objects out).

GAMMA (GEP-1294, GEP-1426): an HTTPRoute whose `parentRefs` name a Service (`group: ""`, `kind:
Service`, an optional `port`) is a mesh route. A **producer route** lives in the Service's namespace
and applies to every request to the Service; a **consumer route** lives in another namespace and
applies only to requests from that namespace, in place of the producer routes. `routes_for` is the
one function that decides, per client namespace, Service and Service port:

1. the consumer routes of the client namespace attached to that Service port, if there is any;
2. else the producer routes attached to it;
3. else none: the proxy sends the request to the Service's endpoints as they are.

`gateway_objects` turns that decision into the input of the gateway's own pipeline (the engine's
analysis, gateway/dataplane's builder, gateway/render.py), so matching, filters, redirects,
rewrites, weights and endpoints are the gateway's, rendered by the same code and through the same
quoting: each Service with a cluster IP becomes a Gateway of the mesh's own GatewayClass on that
address, one hostless HTTP listener per HTTP port; each applying route is attached to the listeners
of the Service ports it applies to (its `hostnames` dropped: a mesh route matches whatever Host the
client sends); a Service port without routes gets a route that sends everything to that port; the
routes' references across namespaces are granted (mesh routes need no ReferenceGrant). Nothing else
of the input is passed on: policies reach mesh paths through the engine, not through this view.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MESH_CONTROLLER = "gwpolicy.io/mesh-controller"
GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = f"{GATEWAY_GROUP}/v1"
#: the GatewayClass of the view `gateway_objects` makes (never written to a cluster)
MESH_CLASS = "gwpolicy-mesh"
#: appProtocols the proxy serves as HTTP/1.1 (any other appProtocol is not intercepted)
HTTP_APP_PROTOCOLS = ("http", "kubernetes.io/http")
#: port name prefixes (`<protocol>[-<suffix>]`) that say a port is not plain HTTP
NOT_HTTP_NAMES = ("https", "tls", "tcp", "udp", "grpc", "grpcs", "h2c", "http2", "mongo", "mysql", "redis", "sctp")


@dataclass(frozen=True)
class ServicePort:
    namespace: str
    service: str
    port: int

    @property
    def listener(self) -> str:
        return f"p{self.port}"


@dataclass
class Service:
    """A Service the proxy serves: its cluster IP and its HTTP ports."""

    namespace: str
    name: str
    cluster_ip: str
    ports: list[int] = field(default_factory=list)


def _meta(o: Mapping[str, Any]) -> dict[str, Any]:
    m = o.get("metadata")
    return m if isinstance(m, dict) else {}


def _spec(o: Mapping[str, Any]) -> dict[str, Any]:
    s = o.get("spec")
    return s if isinstance(s, dict) else {}


def http_port(port: Mapping[str, Any]) -> bool:
    """Is this Service port served as HTTP? Its appProtocol when it has one; else its name's
    protocol prefix, when not one that says otherwise (an unnamed port is HTTP)."""
    if port.get("protocol", "TCP") != "TCP" or not isinstance(port.get("port"), int):
        return False
    app = port.get("appProtocol")
    if isinstance(app, str) and app:
        return app.lower() in HTTP_APP_PROTOCOLS
    name = str(port.get("name") or "")
    return name.split("-", 1)[0].lower() not in NOT_HTTP_NAMES


def services(objects: Iterable[Mapping[str, Any]]) -> list[Service]:
    """The Services with an IPv4 cluster IP and at least one HTTP port, in (namespace, name) order."""
    out = []
    for o in objects:
        if o.get("kind") != "Service" or o.get("apiVersion") != "v1":
            continue
        spec = _spec(o)
        ip = spec.get("clusterIP")
        if not isinstance(ip, str) or not ip or ip == "None" or ":" in ip or spec.get("type") == "ExternalName":
            continue
        ports = sorted({p["port"] for p in spec.get("ports") or [] if isinstance(p, dict) and http_port(p)})
        if ports:
            out.append(Service(str(_meta(o).get("namespace") or "default"), str(_meta(o).get("name")), ip, ports))
    return sorted(out, key=lambda s: (s.namespace, s.name))


def service_parents(route: Mapping[str, Any]) -> list[tuple[str, str, int | None]]:
    """The Services a route names in its parentRefs: (namespace, name, port or None for every port)."""
    ns = str(_meta(route).get("namespace") or "default")
    out = []
    for ref in _spec(route).get("parentRefs") or []:
        if not isinstance(ref, dict) or ref.get("group") != "" or ref.get("kind") != "Service" or not ref.get("name"):
            continue
        port = ref.get("port") if isinstance(ref.get("port"), int) else None
        out.append((str(ref.get("namespace") or ns), str(ref["name"]), port))
    return out


def mesh_routes(objects: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The HTTPRoutes with at least one Service parent."""
    return [o for o in objects if o.get("kind") == "HTTPRoute" and str(o.get("apiVersion", "")).startswith(GATEWAY_GROUP + "/")
            and service_parents(o)]


def _key(route: Mapping[str, Any]) -> tuple[str, str]:
    return (str(_meta(route).get("namespace") or "default"), str(_meta(route).get("name")))


def routes_for(client: str, target: ServicePort, routes: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The mesh routes that apply to requests from namespace `client` to `target` (the module
    docstring's rule), oldest first. The seam for the engine: a data plane that enforces policies
    on mesh paths asks the same question of the engine's mesh paths."""
    consumer, producer = [], []
    for r in routes:
        ns = _key(r)[0]
        if not any((pns, name) == (target.namespace, target.service) and port in (None, target.port)
                   for pns, name, port in service_parents(r)):
            continue
        if ns == target.namespace:
            producer.append(r)
        elif ns == client:
            consumer.append(r)
    chosen = consumer or producer
    return sorted(chosen, key=lambda r: (str(_meta(r).get("creationTimestamp") or ""), _key(r)))


def gateway_ref(svc: Service) -> tuple[str, str]:
    """The (namespace, name) of the Gateway that stands for a Service in the view."""
    return (svc.namespace, svc.name)


def gateway_objects(objects: Iterable[Mapping[str, Any]], client: str) -> list[dict[str, Any]]:
    """The gateway input that serves namespace `client`'s requests to every Service (the module
    docstring): a GatewayClass, a Gateway per Service, the applying routes re-attached, a default
    route per Service port without one, grants, and the Namespaces, Services and EndpointSlices."""
    objects = list(objects)
    svcs = services(objects)
    routes = mesh_routes(objects)
    out: list[dict[str, Any]] = [{"apiVersion": GATEWAY_VERSION, "kind": "GatewayClass", "metadata": {"name": MESH_CLASS},
                                  "spec": {"controllerName": MESH_CONTROLLER}}]
    out += [copy.deepcopy(dict(o)) for o in objects
            if (o.get("apiVersion"), o.get("kind")) in (("v1", "Namespace"), ("v1", "Service"))
            or o.get("kind") == "EndpointSlice"]
    attach: dict[tuple[str, str], list[dict[str, Any]]] = {}  # route -> its parentRefs in the view
    by_key = {_key(r): r for r in routes}
    for svc in svcs:
        gw_ns, gw_name = gateway_ref(svc)
        out.append({"apiVersion": GATEWAY_VERSION, "kind": "Gateway", "metadata": {"name": gw_name, "namespace": gw_ns},
                    "spec": {"gatewayClassName": MESH_CLASS,
                             "listeners": [{"name": ServicePort(svc.namespace, svc.name, p).listener, "port": p,
                                            "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}
                                           for p in svc.ports]}})
        for p in svc.ports:
            target = ServicePort(svc.namespace, svc.name, p)
            chosen = routes_for(client, target, routes)
            parent = {"group": GATEWAY_GROUP, "kind": "Gateway", "namespace": gw_ns, "name": gw_name,
                      "sectionName": target.listener}
            for r in chosen:
                attach.setdefault(_key(r), []).append(parent)
            if not chosen:
                out.append(_default_route(target, parent))
    grants: set[tuple[str, str]] = set()  # (from namespace, to namespace)
    for key, parents in sorted(attach.items()):
        route = copy.deepcopy(dict(by_key[key]))
        route.pop("status", None)
        spec = route.setdefault("spec", {})
        spec["parentRefs"] = parents
        spec.pop("hostnames", None)
        out.append(route)
        for rule in spec.get("rules") or []:
            if not isinstance(rule, dict):
                continue
            refs = list(rule.get("backendRefs") or [])
            for f in rule.get("filters") or []:
                if isinstance(f, dict) and isinstance(f.get("requestMirror"), dict):
                    refs.append(f["requestMirror"].get("backendRef") or {})
            for b in refs:
                if isinstance(b, dict) and b.get("namespace") and b["namespace"] != key[0]:
                    grants.add((key[0], str(b["namespace"])))
    for src, dst in sorted(grants):
        out.append({"apiVersion": f"{GATEWAY_GROUP}/v1beta1", "kind": "ReferenceGrant",
                    "metadata": {"name": f"gwpolicy-mesh-from-{src}", "namespace": dst},
                    "spec": {"from": [{"group": GATEWAY_GROUP, "kind": "HTTPRoute", "namespace": src}],
                             "to": [{"group": "", "kind": "Service"}]}})
    return out


def _default_route(target: ServicePort, parent: dict[str, Any]) -> dict[str, Any]:
    """Everything sent to a Service port without mesh routes goes to that port's endpoints."""
    return {"apiVersion": GATEWAY_VERSION, "kind": "HTTPRoute",
            "metadata": {"name": f"{target.service}.{target.port}.mesh-default", "namespace": target.namespace},
            "spec": {"parentRefs": [parent],
                     "rules": [{"backendRefs": [{"name": target.service, "port": target.port}]}]}}
