"""Policy settings -> NGINX directives: one generator per policy kind behind one interface
(generator.Generator; timeout.py, retry.py, client.py, ratelimit.py, upstream.py).

`location_directives` and `upstream_directives` run every generator, in `GENERATORS` order, over
the effective policies of one path; what one kind's lines depend on in another kind (a
RetryPolicy's budget bounded by the TimeoutPolicy's request timeout, one `keepalive_timeout` from
TimeoutPolicy idleTimeout and ClientSettingsPolicy keepAlive.timeout) passes through the shared
LocationWork / UpstreamWork. What each kind accepts and how each field is enforced is policyconf's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gwpolicy.gateway.policies import client, ratelimit, retry, timeout, upstream
from gwpolicy.gateway.policies.generator import (
    Generator,
    LocationConf,
    LocationWork,
    RateZone,
    UpstreamConf,
    UpstreamWork,
)
from gwpolicy.gateway.policies.ratelimit import rate_zone
from gwpolicy.gateway.policies.values import specs_by_kind

__all__ = ["GENERATORS", "PLAIN_UPSTREAM", "Collected", "Generator", "LocationConf", "RateZone", "UpstreamConf", "http_directives",
           "location_directives", "rate_zone", "retry_peer_copies", "upstream_directives"]

#: every kind's generator, in the order their lines appear in a location (retry and client read
#: what timeout left in the work)
GENERATORS: tuple[Generator, ...] = (timeout.GENERATOR, retry.GENERATOR, client.GENERATOR, ratelimit.GENERATOR,
                                     upstream.GENERATOR)


def location_directives(effective: Mapping[Any, Any] | None, *, scope: str = "") -> LocationConf:
    """The directives one location gets from the effective policy of its exact path.

    `effective` maps a kind ("TimeoutPolicy" or (group, kind)) to its effective spec (a dict or the
    engine's Result).  Kinds with unsupported fields must not be passed (the policy is Invalid and
    programs nothing).  `scope` names the rate-limit bucket owner (e.g. the policy supplying the
    rate): locations with equal settings and scope share one zone.
    """
    specs = specs_by_kind(effective)
    work = LocationWork(scope)
    for g in GENERATORS:
        g.location(specs.get(g.kind, {}), work)
    uri = tuple(l for l in work.lines if l.startswith("client_max_body_size "))
    return LocationConf(tuple(work.lines), tuple(work.zones), work.peer_copies, uri)


def upstream_directives(upstream_name: str, effective: Mapping[Any, Any] | None, *,
                        peer_copies: int = 1) -> UpstreamConf:
    """The lines of one upstream block (after its `server` lines) from the Service's policies.

    `effective` is the effective policy of the backend (UpstreamSettingsPolicy is Direct on a
    Service, so all paths to one Service port agree).  `peer_copies` > 1 (from
    LocationConf.peer_copies) makes the data plane list each endpoint that many times; the servers
    then need `max_fails=0` or a retried failure would mark the only endpoint down.  So do
    upstreams of paths with a read, send or request timeout: NGINX counts a timed-out response as
    a failed attempt whatever proxy_next_upstream says, so one slow answer would take an endpoint
    out for 10 s and the next requests would get 502 ("no live upstreams") instead of their own
    answer or 504.
    """
    specs = specs_by_kind(effective)
    work = UpstreamWork(upstream_name, peer_copies, max_fails_off=peer_copies > 1)
    for g in GENERATORS:
        g.upstream(specs.get(g.kind, {}), work)
    return UpstreamConf(tuple(work.lines), work.keepalive, "max_fails=0" if work.max_fails_off else "", work.close)


#: the upstream block of a Service no policy of an enforced kind applies to
PLAIN_UPSTREAM = upstream_directives("", None)


def retry_peer_copies(effective: Mapping[Any, Any] | None) -> int:
    """How many times the upstream of this path must list each endpoint (1 without retries)."""
    return retry.peer_copies(specs_by_kind(effective).get(retry.GENERATOR.kind, {}))


def http_directives(zones: Iterable[RateZone]) -> list[str]:
    """The http-context lines: each distinct rate-limit zone once, sorted (deterministic)."""
    return [z.directive for z in sorted(set(zones), key=lambda z: z.name)]


@dataclass
class Collected:
    """Convenience for a renderer: collects zones while locations are translated."""

    zones: set[RateZone] = field(default_factory=set)

    def location(self, effective: Mapping[Any, Any] | None, *, scope: str = "") -> LocationConf:
        conf = location_directives(effective, scope=scope)
        self.zones.update(conf.zones)
        return conf

    def http(self) -> list[str]:
        return http_directives(self.zones)
