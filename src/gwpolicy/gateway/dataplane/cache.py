"""What building and rendering reuse between in-place updates: per route, what building it gave
(BuildCache), and per effective-policy signature, what policyconf made of it (memo)."""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import Any

from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import policyconf
from gwpolicy.gateway.dataplane.model import Action, MatchRule, RouteFact, Upstream


@dataclass
class RouteEntry:
    """What building one route gave, and the objects it was built from (compared by identity)."""

    inputs: list[Any]  # the route's Obj, its path nodes and the effective-policy list of each node below
    servers: list[Any]  # per path node: (server id, address, port, protocol, hostname) or None
    matches: list[list["MatchRule"] | None]  # per path node: its match rules (None: none were built)
    fact: "RouteFact"
    actions: dict[str, "Action"]
    upstreams: dict[str, "Upstream"]
    secrets: dict[str, bytes]
    #: what it read by reference, each as the index gave it (None: absent): the Services its
    #: backends and mirrors looked up and the ConfigMaps its BackendTLSPolicies' CA refs did
    objects: dict[Ref, Any] = field(default_factory=dict)
    #: per Service whose endpoints it read, the EndpointSlices that had them (namespace, name) -> Objs
    slices: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    #: per namespace it asked a ReferenceGrant about (a backend or mirror in another namespace) and
    #: referrer (its group, kind, namespace), the grants there whose `from` names the referrer
    grants: dict[tuple[str, tuple[str, str, str]], tuple[Any, ...]] = field(default_factory=dict)


class BuildCache:
    """Per route, what building it gave last time (`RouteEntry`), for the gateway's in-place updates.

    A route's part of the data plane is a function of the route object, its path nodes, the
    effective policies on every node below them (the engine replaces a node's list whenever it
    recomputes it, and leaves it alone otherwise), the servers its listeners became, the Services
    its backends and mirrors name with their EndpointSlices, the ConfigMaps its BackendTLSPolicies'
    `caCertificateRefs` name, the ReferenceGrants of the namespaces its cross-namespace backends and
    mirrors are in (those whose `from` names the route), and of the Gateways. All but the last are
    compared by identity with what the entry recorded (it holds the objects, so no id is reused):
    the route object, nodes and lists; each Service and ConfigMap it looked up, as the index holds
    it now (absent stays absent); for each Service whose endpoints it read, the index's
    EndpointSlices labelled with that Service, one by one (a slice created, replaced or deleted
    changes that tuple); and for each namespace it asked a grant about, that namespace's
    ReferenceGrants naming the route's kind and namespace in `from`, one by one. An index replaces
    an object's `Obj` whenever the object changes, so an EndpointSlice, Service, ConfigMap or
    ReferenceGrant change rebuilds exactly the routes that read it, and the caller need not say
    anything about those kinds. A route reads no Secret (a listener's certificate is its server's,
    and servers are made on every build; a route's entry keys on the server's certificate path, not
    its content). A Gateway or Namespace edit needs no epoch: a route's entry keys on its servers
    (ids from the Gateway and listener, `server_id`, so another listener's edit leaves them) and
    on its path nodes and their policy lists, which the engine replaces where the edit reaches
    them. For whatever else the state does not take in place the caller says `epoch`, which it
    changes whenever one may have changed (every entry is dropped)."""

    def __init__(self) -> None:
        self.epoch: Any = None
        self.gateway_addresses: frozenset[str] = frozenset()  # what the entries' endpoints were checked against
        self.routes: dict[Ref, RouteEntry] = {}
        self.hits = 0
        self.misses = 0

    def use(self, epoch: Any) -> "BuildCache":
        if epoch != self.epoch:
            self.routes.clear()
            self.epoch = epoch
        self.hits = self.misses = 0
        return self


@contextlib.contextmanager
def without_gc() -> Any:
    """The cyclic collector paused: building allocates hundreds of thousands of small objects and
    makes no cycles, and every collection would walk the analysis' millions of objects again
    (40% of the build and render time at 10k routes)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_MEMO: dict[Any, Any] = {}  # signature of an effective-policy dict -> what policyconf made of it


def signature(eff: dict[str, dict[str, Any]]) -> tuple[tuple[str, int], ...]:
    """Identity of an effective-policy dict: the engine shares one Result (and its spec) among every
    path with the same ladder, so thousands of backends have a handful of distinct signatures and
    policyconf translates each once (the memo holds the specs, so ids stay unique while cached)."""
    return tuple(sorted((k, id(v)) for k, v in eff.items()))


def memo(kind: str, eff: dict[str, dict[str, Any]], compute: Any, *extra: Any) -> Any:
    key = (kind, signature(eff), extra)
    hit = _MEMO.get(key)
    if hit is None or hit[0] is not eff and any(hit[0].get(k) is not v for k, v in eff.items()):
        if len(_MEMO) > 100_000:
            _MEMO.clear()
        hit = _MEMO[key] = (eff, compute())
    return hit[1]


def programmable(eff: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if not any(k in policyconf.KINDS for k in eff):
        return {}
    return memo("programmable", eff, lambda: programmable_now(eff))


def programmable_now(eff: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The kinds whose effective spec this data plane can honour in full (a safety net: the engine,
    given policyconf.kind_checks(), already leaves policies with such fields out of every path)."""
    return {k: v for k, v in eff.items() if k in policyconf.KINDS and not policyconf.unsupported_fields(k, v)}
