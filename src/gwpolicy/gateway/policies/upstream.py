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
    bounded,
    field_value,
    is_set,
    nginx_time,
    zone_size,
)


class UpstreamSettings:
    kind = UPSTREAM

    def location(self, u: Mapping[str, Any], work: LocationWork) -> None:
        pass  # upstream blocks only

    def upstream(self, u: Mapping[str, Any], work: UpstreamWork) -> None:
        lines = work.lines
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
