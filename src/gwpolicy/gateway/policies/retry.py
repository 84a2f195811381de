"""RetryPolicy (and the route's own rules[].retry): proxy_next_upstream and its bounds; the
upstream lists each endpoint once per attempt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gwpolicy.gateway.policies.generator import LocationWork, UpstreamWork
from gwpolicy.gateway.policies.values import (
    DEFAULT_RETRY_ON,
    MAX_ATTEMPTS,
    RETRY,
    RETRY_CONDITIONS,
    RETRYABLE_CODES,
    PolicyValueError,
    bounded,
    int_in,
    is_set,
    nginx_time,
)


def peer_copies(r: Mapping[str, Any]) -> int:
    """How many times the upstream must list each endpoint (1 without retries)."""
    if not is_set(r, "attempts"):
        return 1
    return int_in(r["attempts"], f"{RETRY} attempts", 1, MAX_ATTEMPTS)


class Retry:
    kind = RETRY

    def location(self, r: Mapping[str, Any], work: LocationWork) -> None:
        if not is_set(r, "attempts"):
            if work.timed:
                # without a RetryPolicy a timeout is the answer (504), not a reason to try another
                # endpoint (NGINX's default `error timeout` would double the wait and mark the
                # endpoint down, so the next requests would get 502 "no live upstreams")
                work.lines.append("proxy_next_upstream error;")
            return
        attempts = int_in(r["attempts"], f"{RETRY} attempts", 1, MAX_ATTEMPTS)
        conds: list[str] = []
        for c in (r.get("retryOn") or list(DEFAULT_RETRY_ON)):
            d = RETRY_CONDITIONS.get(c)
            if d is None:
                raise PolicyValueError(f"{RETRY} retryOn: {c!r} is not one of {', '.join(RETRY_CONDITIONS)}")
            if d not in conds:
                conds.append(d)
        for code in r.get("codes") or []:
            if code not in RETRYABLE_CODES:
                raise PolicyValueError(f"{RETRY} codes: {code!r} cannot be retried by NGINX")
            if f"http_{code}" not in conds:
                conds.append(f"http_{code}")
        if r.get("nonIdempotent") is True:
            conds.append("non_idempotent")
        if attempts == 1:
            # no retry of the request; `error` still lets NGINX replace a pooled connection the
            # backend closed while idle (that costs no try: tries stays 1), which `off` would answer 502
            work.lines.append("proxy_next_upstream error;")
        else:
            work.lines.append(f"proxy_next_upstream {' '.join(conds)};")
        work.lines.append(f"proxy_next_upstream_tries {attempts};")
        budget = bounded(RETRY, "retryBudget", r["retryBudget"]) if is_set(r, "retryBudget") else None
        if work.request_ms is not None:
            budget = work.request_ms if budget is None else min(budget, work.request_ms)
        if budget is not None:
            work.lines.append(f"proxy_next_upstream_timeout {nginx_time(budget)};")
        work.peer_copies = attempts

    def upstream(self, r: Mapping[str, Any], work: UpstreamWork) -> None:
        pass  # the caller's peer_copies (retry_peer_copies) already says how often to list each endpoint


GENERATOR = Retry()
