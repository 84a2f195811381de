"""What the engine knows about kinds before it reads any CRD: groups, scope, names, route kinds (S1.2)."""

from __future__ import annotations

GATEWAY_GROUP = "gateway.networking.k8s.io"
CORE_GROUP = ""
#: policy groups whose APIs write the core group as "core" in targetRefs (NGINX Gateway Fabric's
#: UpstreamSettingsPolicy targets `group: core` Services); for them "core" is the core group
CORE_SPELLED_CORE = frozenset({"gateway.nginx.org"})

ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute")

#: kind -> (group, namespaced, plural, short names)
KNOWN_KINDS: dict[str, tuple[str, bool, str, tuple[str, ...]]] = {
    "GatewayClass": (GATEWAY_GROUP, False, "gatewayclasses", ("gc",)),
    "Gateway": (GATEWAY_GROUP, True, "gateways", ("gtw",)),
    "HTTPRoute": (GATEWAY_GROUP, True, "httproutes", ()),
    "GRPCRoute": (GATEWAY_GROUP, True, "grpcroutes", ()),
    "TLSRoute": (GATEWAY_GROUP, True, "tlsroutes", ()),
    "TCPRoute": (GATEWAY_GROUP, True, "tcproutes", ()),
    "UDPRoute": (GATEWAY_GROUP, True, "udproutes", ()),
    "ReferenceGrant": (GATEWAY_GROUP, True, "referencegrants", ("refgrant",)),
    "BackendTLSPolicy": (GATEWAY_GROUP, True, "backendtlspolicies", ("btlspolicy",)),
    "ListenerSet": (GATEWAY_GROUP, True, "listenersets", ()),
    "Namespace": (CORE_GROUP, False, "namespaces", ("ns",)),
    "Service": (CORE_GROUP, True, "services", ("svc",)),
    "Secret": (CORE_GROUP, True, "secrets", ()),
    "ConfigMap": (CORE_GROUP, True, "configmaps", ("cm",)),
    "ServiceImport": ("multicluster.x-k8s.io", True, "serviceimports", ()),
    "CustomResourceDefinition": ("apiextensions.k8s.io", False, "customresourcedefinitions", ("crd", "crds")),
    "PolicyKind": ("gwpolicy.io", False, "policykinds", ()),
}

#: protocol -> route kinds a listener admits when allowedRoutes.kinds is unset (S1.2)
PROTOCOL_ROUTE_KINDS: dict[str, tuple[str, ...]] = {
    "HTTP": ("HTTPRoute", "GRPCRoute"),
    "HTTPS": ("HTTPRoute", "GRPCRoute"),
    "TLS": ("TLSRoute", "TCPRoute"),
    "TCP": ("TCPRoute",),
    "UDP": ("UDPRoute",),
}


def default_group(kind: str) -> str | None:
    """Group inferred for a kind without one (S2.2): Gateway API kinds, then core kinds."""
    known = KNOWN_KINDS.get(kind)
    return known[0] if known else None


def is_known_namespaced(group: str, kind: str) -> bool | None:
    """True/False for kinds we know; None for kinds only a CRD can tell about."""
    known = KNOWN_KINDS.get(kind)
    if known and known[0] == group:
        return known[1]
    return None


def split_api_version(api_version: str) -> tuple[str, str]:
    """`group/version` -> (group, version); `v1` -> ("", "v1")."""
    if "/" in api_version:
        group, version = api_version.rsplit("/", 1)
        return group, version
    return CORE_GROUP, api_version


def plural_of(kind: str) -> str:
    """The plural a CRD would most likely give a kind (`RetryPolicy` -> `retrypolicies`)."""
    low = kind.lower()
    if low.endswith("y") and not low.endswith(("ay", "ey", "oy", "uy")):
        return low[:-1] + "ies"
    if low.endswith(("s", "x", "ch", "sh")):
        return low + "es"
    return low + "s"
