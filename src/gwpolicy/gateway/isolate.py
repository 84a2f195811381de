"""When NGINX refuses a configuration: which objects to leave out so that it takes the rest.

Every value is checked before it is rendered (policyconf's bounds, routevalues, pem), so NGINX should
never refuse a configuration; when it does all the same, one object must not take every tenant's
traffic with it. The configuration is made of units that can be left out one by one: routes
(HTTPRoute, TLSRoute: everything of them) and listeners (their server, certificate and client CA).
A refusal that names an address and port NGINX could not bind leaves out the listeners served
there; any other is bisected with `nginx -t`: the units whose part of the configuration changed
since NGINX last took one are tried first (a change is almost always what broke it), all of them
when leaving those out does not help. The units found are left out with NGINX's message, their
status says so (GEP-1364: a route's parent `Accepted=False`, a listener's `Programmed=False`), and
the rest is loaded.

Pure: the caller supplies `fails(left_out) -> NGINX's error or None`, which builds, renders and
runs `nginx -t` (or reloads) without those units.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

from gwpolicy.engine.refs import GATEWAY_GROUP, Ref

T = TypeVar("T", bound=Hashable)

#: the reason a unit NGINX refused is left out with (a listener whose port another process holds: PortUnavailable)
REFUSED = "UnsupportedValue"
PORT_UNAVAILABLE = "PortUnavailable"
_BIND = re.compile(r"bind\(\) to ([0-9A-Fa-f.:\[\]]+):(\d+) failed(?: \(\d+: ([^)]*)\))?")
_PATHS = re.compile(r"(?:/[^\s\"'()]*)?/(?:gen-\d+|check)/")


def find(candidates: Sequence[T], fails: Callable[[frozenset[T]], str | None],
         base: frozenset[T] = frozenset()) -> dict[T, str]:
    """The candidates to leave out (each with the error NGINX gave with it in), given that the
    configuration without `base` and without every candidate loads: adaptive bisection, about
    2 k log2(n) tests for k culprits among n. With the result and `base` left out, it loads."""
    error = fails(base)
    if error is None:
        return {}
    if len(candidates) == 1:
        return {candidates[0]: error}
    half = len(candidates) // 2
    first, second = list(candidates[:half]), list(candidates[half:])
    found = find(first, fails, base | frozenset(second))
    found.update(find(second, fails, base | frozenset(found)))
    return found


def isolate(groups: Sequence[Sequence[T]], suspects: Sequence[T],
            fails: Callable[[frozenset[T]], str | None]) -> dict[T, str] | None:
    """The units to leave out so that the rest loads, or None when leaving out every unit of every
    group does not help (what is wrong is not any one object's). Groups are tried in order, the
    suspects of each first: routes before listeners, since leaving a listener out takes its routes
    along and would hide which route it was."""
    chosen = set(suspects)
    for group in groups:
        for pool in ([u for u in group if u in chosen], list(group)):
            if pool and fails(frozenset(pool)) is None:
                return find(pool, fails)
    return None


def unbindable(error: str) -> dict[tuple[str, int], str]:
    """The address:port pairs NGINX says it could not bind, with why (`Address already in use`:
    another process holds it; `Permission denied`: a port below 1024 without the privilege)."""
    return {(m.group(1).strip("[]"), int(m.group(2))): m.group(3) or "" for m in _BIND.finditer(error)}


def without_paths(text: str) -> str:
    """NGINX's message without the gateway's state directory (`servers.conf:66`, not the whole path)."""
    return _PATHS.sub("", text)


def fingerprints(dp: Any) -> dict[Ref, tuple[Any, ...]]:
    """Each unit of a data plane and what its part of the configuration was made of, compared by
    identity: a route's actions (the data plane's BuildCache hands out the same objects while the
    route's inputs are the same) or its passthrough entries, a listener's server."""
    out: dict[Ref, list[Any]] = {}
    for a in dp.actions.values():
        out.setdefault(a.route, []).append(a)
    for p in dp.passthrough:
        for route in p.hosts.values():
            out.setdefault(route.route, []).append(route)
    for s in dp.servers:
        out.setdefault(s.listener, []).extend([s.id, s.address, s.port, s.protocol, s.hostname, s.certificate, s.client_ca])
    for p in dp.passthrough:
        for lref in p.listeners:
            out.setdefault(lref, []).extend([p.id, p.address, p.port])
    return {ref: tuple(v) for ref, v in out.items()}


def changed(now: Mapping[Ref, tuple[Any, ...]], before: Mapping[Ref, tuple[Any, ...]]) -> list[Ref]:
    """The units whose part differs from the configuration NGINX last took."""
    def same(a: tuple[Any, ...], b: tuple[Any, ...] | None) -> bool:
        return b is not None and len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b))

    return [ref for ref, fp in now.items() if not same(fp, before.get(ref))]


def grouped(refs: Any) -> list[list[Ref]]:
    """Units as isolate tries them: routes, then listeners, each in a stable order."""
    units = sorted(refs, key=Ref.sort_key)
    listeners = [r for r in units if r.kind == "Gateway" and r.group == GATEWAY_GROUP]
    return [[r for r in units if r not in listeners], listeners]
