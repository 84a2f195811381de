"""The interface every policy kind's generator implements, and the work the generators of one
location or one upstream block share (policies/__init__.py runs them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class RateZone:
    """One `limit_req_zone`; locations with the same zone share one bucket per key."""

    name: str
    key: str
    size: str
    rate: str

    @property
    def directive(self) -> str:
        return f"limit_req_zone {self.key} zone={self.name}:{self.size} rate={self.rate};"


@dataclass(frozen=True)
class LocationConf:
    """The directives of one location (external and its internal locations alike)."""

    lines: tuple[str, ...] = ()
    zones: tuple[RateZone, ...] = ()
    peer_copies: int = 1  # how often the upstream must list each endpoint (RetryPolicy attempts)
    # lines that only work in the location NGINX selects by URI: NGINX checks a request's
    # Content-Length against client_max_body_size in its find-config phase, which a jump to a
    # named location (error_page, r.internalRedirect('@x')) skips; they are in `lines` too
    uri_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class UpstreamConf:
    """The directives inside one `upstream {}` block after the `server` lines, and server parameters."""

    lines: tuple[str, ...] = ()
    keepalive: bool = False  # locations must then send `proxy_set_header Connection ""` (HTTP/1.1)
    server_params: str = ""  # appended to every `server` line, e.g. "max_fails=0"


@dataclass
class LocationWork:
    """One location's directives as the generators write them, and what they tell each other."""

    scope: str  # the rate-limit bucket owner the caller names ("" : the policy that sets the rate)
    lines: list[str] = field(default_factory=list)
    zones: list[RateZone] = field(default_factory=list)
    peer_copies: int = 1
    request_ms: int | None = None  # the route's whole-request timeout (TimeoutPolicy), if any
    timed: bool = False  # a read, send or request timeout is set (TimeoutPolicy)
    idle: list[int] = field(default_factory=list)  # idle timeouts of client connections, ms


@dataclass
class UpstreamWork:
    """One upstream block's lines as the generators write them."""

    name: str
    peer_copies: int
    lines: list[str] = field(default_factory=list)
    keepalive: bool = False
    max_fails_off: bool = False  # the servers need max_fails=0 (see upstream_directives)


class Generator(Protocol):
    """The NGINX directives of one policy kind. `spec` is the kind's effective spec on the path
    ({} when no policy of the kind applies: a generator may still write lines then)."""

    kind: str

    def location(self, spec: Mapping[str, Any], work: LocationWork) -> None: ...

    def upstream(self, spec: Mapping[str, Any], work: UpstreamWork) -> None: ...
