"""GRPCRoute in this data plane: its matches, filters and backends as the HTTP matches NGINX
serves, what it cannot have, and the rule between GRPCRoutes and HTTPRoutes on one listener.

Pure. A gRPC call is an HTTP/2 POST to `/<service>/<method>`, so a GRPCRouteMatch is an HTTP
match on that path, which the HTTPRoute machinery (locations, precedence, header maps) serves:

| GRPCMethodMatch                       | path match                                             |
|---------------------------------------|--------------------------------------------------------|
| none                                  | PathPrefix `/`                                         |
| Exact, service and method             | Exact `/<service>/<method>`                            |
| Exact, service only                   | PathPrefix `/<service>` (segment-wise: `/<service>/…`) |
| Exact, method only                    | RegularExpression `/[^/]+/<method>`                    |
| RegularExpression (either or both)    | RegularExpression `/(?:<service>)/(?:<method>)`, an    |
|                                       | absent side `[^/]+`                                    |

Header matches and the RequestHeaderModifier / ResponseHeaderModifier filters are the HTTP ones
(gRPC metadata are HTTP/2 headers); backendRefs and their weights are the same. Exact service and
method names are held to the API's patterns, and regular expressions to the HTTP path dialect
(gateway/pathregex.py), so no value a tenant writes reaches nginx.conf as NGINX syntax.

Precedence between the converted matches is the HTTP one (Exact path, then the longer regex, then
prefix; then more header matches; then the older route), which gives the GRPCRoute order: an exact
method before a regex one before a service-wide one, then the number of header matches.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from gwpolicy.gateway import pathregex

KIND = "GRPCRoute"
#: the filters a GRPCRoute may carry here (RequestMirror and ExtensionRef are not served)
SUPPORTED_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier")
#: the API's patterns for exact names (GRPCMethodMatch validation)
SERVICE_NAME = re.compile(r"\.?[A-Za-z_][A-Za-z_0-9]*(\.[A-Za-z_][A-Za-z_0-9]*)*")
METHOD_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
#: the longest service or method name or expression taken (the API allows 1024)
MAX_LENGTH = 1024


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def method_problem(m: Any) -> str | None:
    """Why a GRPCMethodMatch cannot be served (None: it can)."""
    if m is None:
        return None
    if not isinstance(m, dict):
        return "method is not an object"
    mtype = m.get("type") or "Exact"
    service, method = m.get("service"), m.get("method")
    for field, value in (("service", service), ("method", method)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > MAX_LENGTH):
            return f"method.{field} must be a non-empty string of at most {MAX_LENGTH} characters"
    if service is None and method is None:
        return "method needs a service or a method"
    if mtype == "Exact":
        if service is not None and not SERVICE_NAME.fullmatch(service):
            return f"method.service {service!r} is not a gRPC service name"
        if method is not None and not METHOD_NAME.fullmatch(method):
            return f"method.method {method!r} is not a gRPC method name"
        return None
    if mtype == "RegularExpression":
        for field, value in (("service", service), ("method", method)):
            if value is None:
                continue
            if "/" in value:
                return f"method.{field} {value!r}: a '/' cannot be part of a service or method name"
            why = pathregex.problem("/" + value)
            if why is not None:
                return f"method.{field} {value!r}: {why}"
        return None
    return f"method.type {mtype!r} is not supported (Exact and RegularExpression are)"


def path_match(m: Any) -> dict[str, str]:
    """The HTTP path match of a (valid, see method_problem) GRPCMethodMatch."""
    if not isinstance(m, dict):
        return {"type": "PathPrefix", "value": "/"}
    service, method = m.get("service"), m.get("method")
    if (m.get("type") or "Exact") == "Exact":
        if service is not None and method is not None:
            return {"type": "Exact", "value": f"/{service}/{method}"}
        if service is not None:
            return {"type": "PathPrefix", "value": f"/{service}"}
        return {"type": "RegularExpression", "value": f"/[^/]+/{method}"}
    return {"type": "RegularExpression",
            "value": f"/(?:{service if service is not None else '[^/]+'})/(?:{method if method is not None else '[^/]+'})"}


def http_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """One GRPCRouteRule as the HTTPRouteRule NGINX serves (matches converted; the rest as it is)."""
    out = dict(rule)
    matches = [m for m in _list(rule.get("matches")) if isinstance(m, dict)]
    if matches:
        conv = []
        for m in matches:
            h: dict[str, Any] = {"path": path_match(m.get("method"))}
            if m.get("headers") is not None:
                h["headers"] = m["headers"]
            conv.append(h)
        out["matches"] = conv
    return out


def http_spec(spec: Any) -> dict[str, Any]:
    """A GRPCRoute spec as the HTTPRoute spec the data plane serves."""
    spec = _dict(spec)
    return dict(spec, rules=[http_rule(r) if isinstance(r, dict) else r for r in _list(spec.get("rules"))])


def as_http(route: Any) -> Any:
    """The GRPCRoute object with its spec converted (same identity fields, age and reference)."""
    return dataclasses.replace(route, raw=dict(route.raw, spec=http_spec(route.spec)))


def problem(spec: Any) -> str | None:
    """Why a GRPCRoute cannot be served as written (None: it can): the field and the reason."""
    for i, rule in enumerate(r for r in _list(_dict(spec).get("rules")) if isinstance(r, dict)):
        for mi, m in enumerate(x for x in _list(rule.get("matches")) if isinstance(x, dict)):
            why = method_problem(m.get("method"))
            if why is not None:
                return f"spec.rules[{i}].matches[{mi}].{why}."
        filters = list(_list(rule.get("filters")))
        for b in _list(rule.get("backendRefs")):
            filters += list(_list(_dict(b).get("filters")))
        for f in filters:
            ftype = _dict(f).get("type")
            if ftype not in SUPPORTED_FILTERS:
                return (f"spec.rules[{i}]: filter type {ftype} is not supported for GRPCRoute by this data plane "
                        f"({', '.join(SUPPORTED_FILTERS)} are).")
    return None


def served_hostnames(listener_hostname: str | None, route_spec: Any) -> set[str]:
    """The hostnames a route serves under a listener, as the data plane keys its virtual hosts."""
    from gwpolicy.gateway.dataplane.addresses import route_hostnames

    return set(route_hostnames((listener_hostname or "").lower(), _list(_dict(route_spec).get("hostnames"))))


def conflict(route: Any, gateway: Any, listener: dict[str, Any], index: Any,
             attached_to: Any) -> str | None:
    """A GRPCRoute and an HTTPRoute that serve one hostname through one listener cannot both be
    served (one virtual host speaks one protocol to its backends): the older route keeps it (then
    namespace/name), the newer one is not accepted there. The message when `route` is the newer
    one, else None. `attached_to(other, gateway, listener)` says whether another route attaches to
    that listener."""
    other_kind = "HTTPRoute" if route.kind == KIND else KIND
    mine = served_hostnames(listener.get("hostname"), route.spec)
    if not mine:
        return None
    for other in index.of_kind(route.group, other_kind):
        if other.age_key >= route.age_key:
            continue
        if not attached_to(other, gateway, listener):
            continue
        shared = mine & served_hostnames(listener.get("hostname"), other.spec)
        if shared:
            host = sorted(shared)[0] or listener.get("hostname") or "every hostname"
            return (f"{other_kind} {other.namespace}/{other.name}, which is older, serves {host} through listener "
                    f"{listener.get('name')}: an HTTPRoute and a GRPCRoute cannot share a hostname on one listener.")
    return None
