"""TimeoutPolicy (and the route's own rules[].timeouts): proxy timeouts of a location; a read,
send or request timeout also makes the upstream's servers `max_fails=0`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gwpolicy.gateway.policies.generator import LocationWork, UpstreamWork
from gwpolicy.gateway.policies.values import (
    MAX_CONNECT_TIMEOUT_MS,
    NO_TIMEOUT_MS,
    TIMEOUT,
    bounded,
    duration_ms,
    is_set,
    nginx_time,
)

#: the TimeoutPolicy fields that bound a response (a timed-out response counts as a failed attempt)
TIMED_FIELDS = ("readTimeout", "sendTimeout", "_requestTimeout")


class Timeout:
    kind = TIMEOUT

    def location(self, t: Mapping[str, Any], work: LocationWork) -> None:
        request_ms = duration_ms(t["_requestTimeout"], "rules[].timeouts.request") if is_set(t, "_requestTimeout") else None
        if request_ms == 0:  # Gateway API: a zero duration disables the timeout
            request_ms = None
        timed = request_ms is not None
        for fname, directive in (("connectionTimeout", "proxy_connect_timeout"),
                                 ("readTimeout", "proxy_read_timeout"), ("sendTimeout", "proxy_send_timeout")):
            ms = bounded(TIMEOUT, fname, t[fname]) if is_set(t, fname) else None
            if ms == 0:  # no timeout: NGINX has no "off", so its longest useful wait
                ms = MAX_CONNECT_TIMEOUT_MS if fname == "connectionTimeout" else NO_TIMEOUT_MS
            if request_ms is not None:
                ms = request_ms if ms is None else min(ms, request_ms)
            if ms is not None:
                timed = timed or fname != "connectionTimeout"
                work.lines.append(f"{directive} {nginx_time(min(ms, MAX_CONNECT_TIMEOUT_MS) if fname == 'connectionTimeout' else ms)};")
        if is_set(t, "idleTimeout"):
            work.idle.append(bounded(TIMEOUT, "idleTimeout", t["idleTimeout"]))
        work.request_ms = request_ms
        work.timed = timed

    def upstream(self, t: Mapping[str, Any], work: UpstreamWork) -> None:
        if any(is_set(t, f) for f in TIMED_FIELDS):
            work.max_fails_off = True


GENERATOR = Timeout()
