"""ClientSettingsPolicy: request body limits and client keep-alive of a location; also writes the
one `keepalive_timeout`, the shorter of its keepAlive.timeout and TimeoutPolicy idleTimeout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gwpolicy.gateway.policies.generator import LocationWork, UpstreamWork
from gwpolicy.gateway.policies.values import (
    CLIENT,
    KIB,
    PolicyValueError,
    bounded,
    field_value,
    is_set,
    nginx_size,
    nginx_time,
    size_bytes,
)

#: the largest request body buffer a policy may ask for (NGINX allocates it per request with a body)
MAX_BODY_BUFFER = 1024 * KIB


class ClientSettings:
    kind = CLIENT

    def location(self, c: Mapping[str, Any], work: LocationWork) -> None:
        lines = work.lines
        if is_set(c, "body.maxSize"):
            bounded(CLIENT, "body.maxSize", field_value(c, "body.maxSize"))
            lines.append(f"client_max_body_size {nginx_size(field_value(c, 'body.maxSize'), f'{CLIENT} body.maxSize')};")
        if is_set(c, "_bodyBufferSize"):  # NGF's body.bufferSize (gateway/ngfpolicies.py)
            where = f"{CLIENT} body.bufferSize"
            if not 1 <= size_bytes(c["_bodyBufferSize"], where) <= MAX_BODY_BUFFER:
                raise PolicyValueError(f"{where}: {c['_bodyBufferSize']!r} is out of range (1 to 1m)")
            lines.append(f"client_body_buffer_size {nginx_size(c['_bodyBufferSize'], where)};")
        if is_set(c, "body.timeout"):
            lines.append(f"client_body_timeout {nginx_time(bounded(CLIENT, 'body.timeout', field_value(c, 'body.timeout')))};")
        if is_set(c, "keepAlive.requests"):
            lines.append(f"keepalive_requests {bounded(CLIENT, 'keepAlive.requests', field_value(c, 'keepAlive.requests'))};")
        if is_set(c, "keepAlive.time"):
            lines.append(f"keepalive_time {nginx_time(bounded(CLIENT, 'keepAlive.time', field_value(c, 'keepAlive.time')))};")
        if is_set(c, "keepAlive.timeout"):
            work.idle.append(bounded(CLIENT, "keepAlive.timeout", field_value(c, "keepAlive.timeout")))
        if work.idle:
            header = ""
            if is_set(c, "_keepAliveHeader"):  # NGF's keepAlive.timeout.header (gateway/ngfpolicies.py)
                ms = bounded(CLIENT, "keepAlive.timeout", c["_keepAliveHeader"])
                header = f" {max(1, ms // 1000)}s"  # NGINX sends it in whole seconds
            lines.append(f"keepalive_timeout {nginx_time(min(work.idle))}{header};")

    def upstream(self, c: Mapping[str, Any], work: UpstreamWork) -> None:
        pass  # client connections only


GENERATOR = ClientSettings()
