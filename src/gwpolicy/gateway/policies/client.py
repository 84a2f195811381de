"""ClientSettingsPolicy: request body limits and client keep-alive of a location; also writes the
one `keepalive_timeout`, the shorter of its keepAlive.timeout and TimeoutPolicy idleTimeout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gwpolicy.gateway.policies.generator import LocationWork, UpstreamWork
from gwpolicy.gateway.policies.values import CLIENT, bounded, field_value, is_set, nginx_size, nginx_time


class ClientSettings:
    kind = CLIENT

    def location(self, c: Mapping[str, Any], work: LocationWork) -> None:
        lines = work.lines
        if is_set(c, "body.maxSize"):
            bounded(CLIENT, "body.maxSize", field_value(c, "body.maxSize"))
            lines.append(f"client_max_body_size {nginx_size(field_value(c, 'body.maxSize'), f'{CLIENT} body.maxSize')};")
        if is_set(c, "body.timeout"):
            lines.append(f"client_body_timeout {nginx_time(bounded(CLIENT, 'body.timeout', field_value(c, 'body.timeout')))};")
        if is_set(c, "keepAlive.requests"):
            lines.append(f"keepalive_requests {bounded(CLIENT, 'keepAlive.requests', field_value(c, 'keepAlive.requests'))};")
        if is_set(c, "keepAlive.time"):
            lines.append(f"keepalive_time {nginx_time(bounded(CLIENT, 'keepAlive.time', field_value(c, 'keepAlive.time')))};")
        if is_set(c, "keepAlive.timeout"):
            work.idle.append(bounded(CLIENT, "keepAlive.timeout", field_value(c, "keepAlive.timeout")))
        if work.idle:
            lines.append(f"keepalive_timeout {nginx_time(min(work.idle))};")

    def upstream(self, c: Mapping[str, Any], work: UpstreamWork) -> None:
        pass  # client connections only


GENERATOR = ClientSettings()
