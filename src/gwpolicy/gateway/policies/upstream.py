"""UpstreamSettingsPolicy: the shared-memory zone and the keep-alive pool of an `upstream {}` block.

Every upstream keeps a pool of DEFAULT_KEEPALIVE_CONNECTIONS idle connections per worker unless
the policy says otherwise; `keepAlive.connections: 0` means no pool, and the locations proxying to
it then send `Connection: close` so that the backend closes first (and keeps the TIME_WAIT)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gwpolicy.gateway.policies.generator import LocationWork, UpstreamWork
from gwpolicy.gateway.policies.values import (
    DEFAULT_KEEPALIVE_CONNECTIONS,
    UPSTREAM,
    PolicyValueError,
    bounded,
    field_value,
    is_set,
    nginx_time,
    zone_size,
)

#: the load-balancing methods of NGF's API that NGINX 1.22 (open source) has, as `upstream` lines
#: (round_robin is NGINX's default: no line); the others need NGINX Plus
LB_METHODS: dict[str, str] = {
    "round_robin": "",
    "least_conn": "least_conn",
    "ip_hash": "ip_hash",
    "hash": "hash {key}",
    "hash consistent": "hash {key} consistent",
    "random": "random",
    "random two": "random two",
    "random two least_conn": "random two least_conn",
}
PLUS_ONLY_LB = ("random two least_time=header", "random two least_time=last_byte", "least_time header",
                "least_time last_byte", "least_time header inflight", "least_time last_byte inflight")

#: NGINX variables a hash key may name: what NGINX 1.22 defines in the http context for every
#: request (a name NGINX does not know would make `nginx -t` refuse the whole configuration)
HASH_VARIABLES = frozenset((
    "args", "binary_remote_addr", "content_length", "content_type", "document_uri", "host", "hostname",
    "is_args", "query_string", "remote_addr", "remote_port", "remote_user", "request_method",
    "request_uri", "scheme", "server_addr", "server_name", "server_port", "server_protocol", "uri",
    "upstream_addr",
))
HASH_PREFIXES = ("http_", "cookie_", "arg_")


def hash_key(value: Any) -> str:
    """An NGF hashMethodKey as NGINX takes it: one variable NGINX defines for every request."""
    name = value[1:] if isinstance(value, str) and value.startswith("$") else None
    if name is None or not name.replace("_", "a").isalpha() or not name.islower():
        raise PolicyValueError(f"{UPSTREAM} hashMethodKey: {value!r} is not an NGINX variable such as $remote_addr")
    if name not in HASH_VARIABLES and not (name.startswith(HASH_PREFIXES) and len(name) > len("arg_")):
        raise PolicyValueError(f"{UPSTREAM} hashMethodKey: {value!r} is not a variable this data plane allows "
                               f"({', '.join('$' + v for v in sorted(HASH_VARIABLES))}, $http_*, $cookie_*, $arg_*)")
    return str(value)


def lb_line(u: Mapping[str, Any]) -> str:
    """The upstream's load-balancing line ("" for round robin or none set)."""
    method = u.get("_loadBalancingMethod")
    if method is None:
        return ""
    if method not in LB_METHODS:
        raise PolicyValueError(f"{UPSTREAM} loadBalancingMethod: {method!r} is not supported by the nginx-1.22 data plane")
    template = LB_METHODS[method]
    if "{key}" in template:
        return template.format(key=hash_key(u.get("_hashMethodKey"))) + ";"
    return f"{template};" if template else ""



class UpstreamSettings:
    kind = UPSTREAM

    def location(self, u: Mapping[str, Any], work: LocationWork) -> None:
        pass  # upstream blocks only

    def upstream(self, u: Mapping[str, Any], work: UpstreamWork) -> None:
        lines = work.lines
        lb = lb_line(u)  # NGF's loadBalancingMethod: before `keepalive`, as NGINX requires
        if lb:
            lines.append(lb)
        if is_set(u, "zoneSize"):
            lines.append(f"zone {work.name} {zone_size(bounded(UPSTREAM, 'zoneSize', u['zoneSize']))};")
        n = DEFAULT_KEEPALIVE_CONNECTIONS
        if is_set(u, "keepAlive.connections"):
            n = bounded(UPSTREAM, "keepAlive.connections", field_value(u, "keepAlive.connections"))
        if n > 0:
            work.keepalive = True
            lines.append(f"keepalive {n};")
        else:
            work.close = True
        if work.keepalive:
            if is_set(u, "keepAlive.requests"):
                lines.append(f"keepalive_requests {bounded(UPSTREAM, 'keepAlive.requests', field_value(u, 'keepAlive.requests'))};")
            if is_set(u, "keepAlive.time"):
                lines.append(f"keepalive_time {nginx_time(bounded(UPSTREAM, 'keepAlive.time', field_value(u, 'keepAlive.time')))};")
            if is_set(u, "keepAlive.timeout"):
                lines.append(f"keepalive_timeout {nginx_time(bounded(UPSTREAM, 'keepAlive.timeout', field_value(u, 'keepAlive.timeout')))};")


GENERATOR = UpstreamSettings()
