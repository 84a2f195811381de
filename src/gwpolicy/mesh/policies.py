"""What the mesh proxy (`gwpolicy mesh`) does with each policy kind on mesh paths, field by field
(docs/mesh.md, "Policies on mesh paths"): `describe`'s NGINX column on a mesh path reads it, in the
words north-south uses (gateway/policyconf.py).

Every field of the gwpolicy.io kinds is a location, upstream or http setting of NGINX, and the
proxy serves one client namespace: on a mesh path a field is enforced or approximated exactly as
north-south, with one difference. A proxy counts only the requests it carries, so a
RateLimitPolicy keyed by a header limits each client namespace's requests (each pod's, where
every pod has its own proxy) separately; keyed by the client address (the default) it is what
north-south gives, as one address's requests all pass one proxy. The kinds the gateway enforces
but the proxy does not (NGINX Gateway Fabric's, BackendTLSPolicy) are not applied on mesh
paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gwpolicy.engine.mesh import path_consumer
from gwpolicy.gateway import backendtls, ngfpolicies, policyconf, tracing

NOT_APPLIED = "not applied on mesh paths"
#: (kind, field) -> how a field north-south enforces is approximated on mesh paths
APPROXIMATED_ON_MESH: dict[tuple[str, str], str] = {
    (policyconf.RATELIMIT, "key.type"): (
        "each client namespace's proxy counts the requests it carries: keyed by a header, the limit "
        "holds per client namespace (per pod with a proxy in every pod), not for all clients together"),
}
#: the kinds `gwpolicy gateway` applies and the mesh proxy does not: (group, kind)
NOT_ON_MESH: frozenset[tuple[str, str]] = frozenset(
    {(ngfpolicies.GROUP, k) for k in ngfpolicies.KINDS} | {(tracing.GROUP, tracing.KIND), backendtls.KIND})


def on_mesh_path(levels: Any) -> bool:
    """Is this path a mesh path (its consumer namespace is one of its levels)?"""
    return path_consumer(levels) is not None


def enforcement(group: str, kind: str, dotted_field: str) -> str | None:
    """enforced | approximated | not supported | not applied on mesh paths, for a field on a mesh
    path; None for a kind no NGINX data plane of gwpolicy knows (no column)."""
    if (group, kind) in NOT_ON_MESH:
        return NOT_APPLIED
    if group != policyconf.GROUP or kind not in policyconf.KINDS:
        return None
    if (kind, dotted_field) in APPROXIMATED_ON_MESH:
        return policyconf.APPROXIMATED
    return policyconf.enforcement(kind, dotted_field)


def enforcement_of(group: str, kind: str) -> Callable[[str], str] | None:
    """field -> `enforcement` for one kind; None when there is no column to show."""
    if enforcement(group, kind, "") is None:
        return None
    return lambda f: enforcement(group, kind, f) or "-"
