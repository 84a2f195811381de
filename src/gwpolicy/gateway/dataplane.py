"""What NGINX must do, from the engine's analysis: the pure data plane model.

One topology, not a second model: which listeners a route is attached to comes from the
analysis' paths, and each location and backend carries the effective policy of its own exact
engine path (GatewayClass > Gateway > listener > route > rule > Service > port).

Shape (chosen so that a reload stays cheap at 10k routes, see docs/gateway.md "Configuration
shape"): one `server` per listener (address, port, listener hostname), never one per route
hostname. Route hostnames become virtual hosts inside the listener's server, dispatched by a
`map $host` with NGINX's hostname matching (exact before the longest wildcard), and each virtual
host's paths are `location`s under a per-host URI prefix (`/_v<id>`), so NGINX's location tree
does the Exact/longest-prefix choice. Header, query and method matches, the fallback from a
longer prefix whose conditions fail to a shorter one, and RegularExpression paths (a condition on
the path, ranked between Exact and PathPrefix) are in each location's candidate list, sorted by
the spec's precedence (render.py makes it a `map`).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import functools
import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gwpolicy import names
from gwpolicy.gateway import backendtls, pathregex, policyconf
from gwpolicy.gateway.listeners import HOSTNAME
from gwpolicy.grants import ReferenceGrants, _from_key as grant_from_key
from gwpolicy.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.topology import PathNode, namespace_ref

if TYPE_CHECKING:  # status imports this module
    from gwpolicy.gateway.status import Cond, ListenerFacts

DEFAULT_CONTROLLER_NAME = "gwpolicy.io/gateway-controller"
DEFAULT_ADDRESS_POOL = "127.0.1.0/24"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: who made an EndpointSlice: the gateway trusts only the EndpointSlice controller's (from the
#: Service's selector and the Pods), unless DataPlaneConfig.allow_unmanaged_endpointslices
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
ENDPOINTSLICE_CONTROLLER = "endpointslice-controller.k8s.io"
POLICY_GROUP = "gwpolicy.io"  # the kinds this data plane enforces (policyconf.GROUP)

# reasons recorded for the status layer (GEP-1364 words where one exists)
BACKEND_NOT_FOUND = "BackendNotFound"
REF_NOT_PERMITTED = "RefNotPermitted"
INVALID_KIND = "InvalidKind"
NO_ENDPOINTS = "NoReadyEndpoints"  # ResolvedRefs stays True; traffic gets 500
BACKEND_TLS_INVALID = "BackendTLSPolicyInvalid"  # the BackendTLSPolicy cannot be programmed: fail closed, 500
UNSUPPORTED_VALUE = "UnsupportedValue"
UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"
PORT_UNAVAILABLE = "PortUnavailable"

BUDGET_EXCEEDED = "NamespaceBudgetExceeded"  # a route of a namespace over its budget (DataPlaneConfig.namespace_budget)

SUPPORTED_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite", "CORS",
                     "RequestMirror")


class DataPlaneError(ValueError):
    """Configuration the data plane cannot be built from (names the object and field)."""


STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"  # Debian's libnginx-mod-stream
#: where the unix sockets of HTTPS servers behind a passthrough port live; the process layer
#: (nginx.py) replaces it with its own short directory when it writes the files
SOCKET_DIR = "@gwpolicy-sockets@"


def endpoint_problem(address: Any, address_type: str, config: DataPlaneConfig,
                     gateways: frozenset[str] = frozenset()) -> tuple[str | None, str]:
    """(None, the address as NGINX is given it) when the gateway may connect to this endpoint
    address, else (why not, the address as written). Only an IP address of the slice's type is
    one (parsed, so nothing else reaches nginx.conf); never link-local (cloud metadata at
    169.254.169.254), multicast, unspecified, the gateway's own or a Gateway's address, nor
    loopback unless the configuration allows it."""
    if not isinstance(address, str):
        return f"{address!r} is not an IP address", repr(address)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{address!r} is not an IP address", repr(address)
    if f"IPv{ip.version}" != address_type:
        return f"{address} is not an {address_type} address (the slice's addressType)", address
    seen = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None else ip
    text = str(ip)
    if seen.is_unspecified or seen.is_multicast:
        return f"{address} is {'unspecified' if seen.is_unspecified else 'a multicast address'}", address
    if seen.is_link_local:
        return f"{address} is link-local (169.254.0.0/16, fe80::/10: node-local and cloud metadata services)", address
    if text in config.own_addresses or str(seen) in config.own_addresses or str(seen) in gateways:
        return f"{address} is the gateway's own address", address
    if seen.is_loopback and not config.allow_loopback_endpoints:
        return f"{address} is a loopback address (gwpolicy gateway --allow-loopback-endpoints allows it)", address
    return None, text


def stream_module_path() -> str | None:
    """Debian's stream module when it is installed (the one file this pure module looks at)."""
    import os

    return STREAM_MODULE if os.path.exists(STREAM_MODULE) else None


@dataclass(frozen=True)
class DataPlaneConfig:
    """How to place the Gateways: what a test or the controller chooses, not the manifests."""

    controller_name: str | None = DEFAULT_CONTROLLER_NAME  # None: every GatewayClass
    addresses: Mapping[Ref, str] = field(default_factory=dict)  # Gateway -> address, wins over all
    address_pool: str = DEFAULT_ADDRESS_POOL  # loopback network new Gateways get addresses from
    port_offset: int = 0  # added to every listener port (tests on high ports)
    #: NGINX's worker processes: "auto" is one per core (a regex a hostile client makes slow, or
    #: any other request's cost, then takes one core, not the whole gateway)
    worker_processes: int | str = "auto"
    worker_shutdown_timeout: str = "10s"
    #: NGINX's stream module (TLS passthrough), `load_module`d when a passthrough listener is
    #: served; None: not installed, such listeners are not programmed (Debian: libnginx-mod-stream)
    stream_module: str | None = field(default_factory=lambda: stream_module_path())
    #: address:port the gateway's process holds itself (its health endpoint), with what holds it: a
    #: listener NGINX would bind there (the same port on the same address, or either a wildcard)
    #: is not programmed (PortUnavailable) rather than failing every listener's reload
    reserved: Mapping[tuple[str, int], str] = field(default_factory=dict)
    #: use EndpointSlices whoever made them (a tenant who may write EndpointSlices then chooses
    #: where the gateway connects); by default only those the EndpointSlice controller manages
    allow_unmanaged_endpointslices: bool = False
    #: use loopback endpoint addresses (tests and demos whose backends run on this machine); never
    #: by default: the gateway's own endpoints, the API server of a sandbox, node-local services
    allow_loopback_endpoints: bool = False
    #: the gateway process' own addresses (its pod's) and endpoints (address, port of its health
    #: and metrics server): never endpoints, whatever is allowed (the Gateways' addresses neither)
    own_addresses: frozenset[str] = frozenset()
    own_endpoints: frozenset[tuple[str, int]] = frozenset()
    #: routes (HTTPRoute, TLSRoute) and listeners (a Gateway Ref with its section) the data plane
    #: leaves out, with (reason, message): those NGINX refused (gateway/isolate.py) and routes over
    #: their namespace's budget; a route left out is built as if it did not exist
    left_out: Mapping[Ref, tuple[str, str]] = field(default_factory=dict)
    #: per namespace, how many route matches (times hostnames) its HTTPRoutes may ask for; over it
    #: the newest routes are left out (`route_cost`); None: no budget
    namespace_budget: int | None = None


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int


@dataclass
class Upstream:
    """One `upstream {}`: a Service port with one set of upstream settings (never shared by two)."""

    name: str
    service: Ref
    port: int
    endpoints: tuple[Endpoint, ...]
    lines: tuple[str, ...] = ()  # from policyconf.upstream_directives
    server_params: str = ""
    peer_copies: int = 1
    keepalive: bool = False
    tls: Any = None  # backendtls.TLSProfile: NGINX talks TLS to it (one profile per upstream)


@dataclass
class Backend:
    """One backendRef of one rule as NGINX sends to it: an upstream, or an error answered 500."""

    ref: Ref
    weight: int
    upstream: str | None
    error: str | None = None  # BACKEND_NOT_FOUND, REF_NOT_PERMITTED, INVALID_KIND, NO_ENDPOINTS
    message: str = ""
    filters: tuple[dict[str, Any], ...] = ()
    effective: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> spec on its path
    path: tuple[Ref, ...] = ()
    tls: Any = None  # backendtls.TLSProfile of its upstream, None: plain HTTP


@dataclass
class Mirror:
    """One RequestMirror filter of a rule: a copy of each request (or of `share` of them) goes to
    `upstream`, whose answer is thrown away. A mirror that cannot be sent (`error`) is left out;
    the request itself is served as if it were not there (Gateway API: the backend is dropped)."""

    ref: Ref
    port: int | None
    share: float  # 0 < share <= 1
    upstream: str | None
    error: str | None = None
    message: str = ""


@dataclass
class Action:
    """What one match of one rule does through one listener: filters, backends, policy."""

    id: str
    route: Ref
    rule: int
    match: int
    listener: Ref
    scheme: str  # of the listener: http | https
    listener_port: int
    path_type: str
    path_value: str
    filters: tuple[dict[str, Any], ...]
    backends: list[Backend]
    effective: dict[str, dict[str, Any]]  # of the rule's (or route's) path: when no backend carries one
    path: tuple[Ref, ...]
    error: str | None = None  # a rule NGINX cannot carry out (unsupported filter): 500
    mirrors: tuple[Mirror, ...] = ()  # RequestMirror filters, in filter order


@dataclass
class MatchRule:
    """One HTTPRouteMatch, with what it takes to sort it by the spec's precedence."""

    action: Action
    method: str | None
    headers: tuple[tuple[str, str, str], ...]  # (type, lower-case name, value), first of each name
    query: tuple[tuple[str, str, str], ...]
    created: str
    route_key: str  # namespace/name

    @property
    def regex(self) -> str | None:
        """The RegularExpression this match's path must match in full (None: Exact or PathPrefix)."""
        a = self.action
        return a.path_value if a.path_type == REGULAR_EXPRESSION else None

    @property
    def unconditional(self) -> bool:
        """Taken by every request that reaches its location (a regex path is a condition too)."""
        return (self.method is None and not self.headers and not self.query
                and self.action.path_type != REGULAR_EXPRESSION)

    def precedence(self) -> tuple[Any, ...]:
        """The spec's order, with RegularExpression (implementation-specific) between Exact and
        PathPrefix, the longer expression first (as the longer prefix; Envoy Gateway's order)."""
        a = self.action
        return (PATH_RANK.get(a.path_type, 3), -len(a.path_value), 0 if self.method else 1,
                -len(self.headers), -len(self.query), self.created, self.route_key, a.rule, a.match)


REGULAR_EXPRESSION = "RegularExpression"
PATH_RANK = {"Exact": 0, REGULAR_EXPRESSION: 1, "PathPrefix": 2}


@dataclass
class Location:
    """One NGINX location of a virtual host: `=` exact or `/` prefix, on the un-prefixed path.
    RegularExpression rules have none of their own: they are candidates of the locations their
    literal prefix can reach (see _locations)."""

    exact: bool
    path: str  # the rule's path: Exact value, or PathPrefix value without trailing slash
    candidates: list[MatchRule]  # precedence order, cut after the first unconditional one


@dataclass
class VirtualHost:
    id: str
    hostname: str  # "" = every host this listener's server takes
    locations: dict[tuple[bool, str], Location] = field(default_factory=dict)


@dataclass
class Server:
    """One listener: `listen address:port [ssl]`, its hostname, certificate, virtual hosts."""

    id: str
    gateway: Ref
    listener: Ref
    address: str
    port: int  # the port NGINX binds (listener port + offset)
    protocol: str
    hostname: str  # "" = no hostname: the default server of its address:port
    certificate: str | None = None  # relative path of the PEM file
    vhosts: list[VirtualHost] = field(default_factory=list)
    client_ca: str | None = None  # relative path of the CA bundle clients' certificates are checked against
    client_mode: str = ""  # frontendtls.ALLOW_VALID_ONLY | ALLOW_INSECURE_FALLBACK (with client_ca)
    #: an HTTPS server on a port shared with TLS passthrough listeners: it listens on this unix
    #: socket (PROXY protocol from the stream server in front), not on address:port
    socket: str | None = None


@dataclass
class PassthroughBackend:
    """One backendRef of a TLSRoute: an upstream, or an error (its share of connections is closed)."""

    ref: Ref
    weight: int
    upstream: str | None
    error: str | None = None
    message: str = ""


@dataclass
class PassthroughRoute:
    route: Ref
    backends: list[PassthroughBackend]


@dataclass
class PassthroughServer:
    """Every TLS passthrough listener of one address:port: one `stream` server that reads the SNI of
    the ClientHello (`ssl_preread`) and forwards the connection, still encrypted, to the route's
    backend. `hosts`: SNI name (exact, `*.` wildcard, "" = any other name or none) -> route."""

    id: str
    gateway: Ref
    address: str
    port: int  # the port NGINX binds (listener port + offset)
    listeners: list[Ref]
    hosts: dict[str, PassthroughRoute] = field(default_factory=dict)
    #: HTTPS listeners on the same address:port: the socket their servers listen on, and the SNI
    #: names (their hostnames; "" = a hostless one) sent to it
    https_socket: str | None = None
    https_names: list[str] = field(default_factory=list)


@dataclass
class ListenerFact:
    programmed: bool
    reason: str = ""
    message: str = ""


@dataclass
class RouteFact:
    """What got programmed of one route, and the backendRefs that did not resolve."""

    listeners: set[Ref] = field(default_factory=set)
    unresolved: list[tuple[int, int, str, str]] = field(default_factory=list)  # (rule, backend, reason, message)
    unsupported: list[tuple[int, str]] = field(default_factory=list)  # (rule, message)


@dataclass
class DataPlane:
    servers: list[Server]
    upstreams: dict[str, Upstream]
    actions: dict[str, Action]
    secrets: dict[str, bytes]  # relative path -> PEM (certificate and key)
    addresses: dict[Ref, str]  # Gateway -> address it is served on
    listeners: dict[Ref, ListenerFact]
    routes: dict[Ref, RouteFact]
    config: DataPlaneConfig
    warnings: list[str] = field(default_factory=list)
    passthrough: list[PassthroughServer] = field(default_factory=list)
    stream_upstreams: dict[str, Upstream] = field(default_factory=dict)  # of the passthrough servers
    #: Gateway -> why nothing of it is served: not ours (no such GatewayClass, another controller's)
    #: or not accepted (its class or itself, as status says)
    unserved: dict[Ref, str] = field(default_factory=dict)
    #: HTTPRoutes left out because their namespace's budget is spent -> (reason, message)
    over_budget: dict[Ref, tuple[str, str]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# hostnames


def intersect_hostname(listener: str, route: str) -> str | None:
    """The hostname a route hostname serves under a listener hostname ("" = all the listener takes)."""
    if not listener:
        return route
    if route == listener:
        return ""
    if listener.startswith("*."):
        suffix = listener[1:]
        if route.startswith("*."):
            if route.endswith(suffix):
                return route  # the route's wildcard is the narrower one
            return "" if listener.endswith(route[1:]) else None
        return route if route.endswith(suffix) and len(route) > len(suffix) else None
    if route.startswith("*."):
        return "" if listener.endswith(route[1:]) and len(listener) > len(route) - 1 else None
    return None


def route_hostnames(listener: str, hostnames: list[str]) -> list[str]:
    """Route hostnames intersected with a listener's: what the route serves there (a hostname that
    is not one, e.g. from a server that did not validate it, serves nothing)."""
    if not hostnames:
        return [""]
    out: list[str] = []
    for h in hostnames:
        if not isinstance(h, str) or not HOSTNAME.fullmatch(h.lower()):
            continue
        got = intersect_hostname(listener, h.lower())
        if got is not None and got not in out:
            out.append(got)
    return out


# ---------------------------------------------------------------------------------------------
# addresses


def gateway_addresses(gateways: list[Any], config: DataPlaneConfig) -> dict[Ref, str]:
    """Each Gateway's address: the config's, else `spec.addresses` (IPAddress), else the one in its
    status (kept across restarts) unless another Gateway holds it already (a status written from an
    allocation that has moved on since), else the lowest free one of the pool, in Gateway order."""
    out: dict[Ref, str] = {}
    pending = []
    held = {config.addresses[gw.ref] for gw in gateways if gw.ref in config.addresses}
    for gw in gateways:
        addr = config.addresses.get(gw.ref) or _spec_address(gw)
        if not addr:
            addr = _status_address(gw)
            if addr in held:
                addr = None
        if addr:
            out[gw.ref] = addr
            held.add(addr)
        else:
            pending.append(gw)
    used = set(out.values())
    hosts = ipaddress.ip_network(config.address_pool, strict=False).hosts()
    for gw in pending:
        for host in hosts:
            if str(host) not in used:
                out[gw.ref] = str(host)
                used.add(str(host))
                break
        else:
            raise DataPlaneError(f"address pool {config.address_pool} has no free address for {gw.ref}")
    return out


_WILDCARDS = ("0.0.0.0", "::", "")


def _reserved(reserved: Mapping[tuple[str, int], str], address: str, port: int) -> str | None:
    """What holds `address:port` already, of `reserved`: the same port on the same address or on a
    wildcard (a wildcard listener meets every address)."""
    for (held_address, held_port), what in reserved.items():
        if held_port == port and (held_address == address or held_address in _WILDCARDS or address in _WILDCARDS):
            return what
    return None


def _spec_address(gw: Any) -> str | None:
    spec = gw.spec if isinstance(gw.spec, dict) else {}
    for a in spec.get("addresses") or []:
        if isinstance(a, dict) and a.get("type", "IPAddress") == "IPAddress" and isinstance(a.get("value"), str):
            return a["value"]
    return None


def _status_address(gw: Any) -> str | None:
    status = gw.raw.get("status") if isinstance(gw.raw.get("status"), dict) else {}
    for a in status.get("addresses") or []:
        if isinstance(a, dict) and a.get("type", "IPAddress") == "IPAddress" and isinstance(a.get("value"), str):
            try:
                if ipaddress.ip_address(a["value"]).is_loopback:
                    return a["value"]
            except ValueError:
                continue
    return None


# ---------------------------------------------------------------------------------------------
# building


def build_dataplane(analysis: Any, config: DataPlaneConfig | None = None, cache: "BuildCache | None" = None) -> DataPlane:
    """The data plane for every Gateway of our GatewayClasses in the analysis. With `cache` (one
    per sequence of in-place updates of one analysis, see BuildCache), what a route gave last time
    is reused while everything it was built from is the same objects."""
    with without_gc():
        return _Builder(analysis, config or DataPlaneConfig(), cache).build()


@dataclass
class _RouteEntry:
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
    """Per route, what building it gave last time (`_RouteEntry`), for the gateway's in-place updates.

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
        self.routes: dict[Ref, _RouteEntry] = {}
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


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


_NONE: dict[Any, Any] = {}


def _copy_fact(f: "RouteFact") -> "RouteFact":
    return RouteFact(set(f.listeners), list(f.unresolved), list(f.unsupported))


def _server_key(s: "Server | None") -> tuple[Any, ...] | None:
    return None if s is None else (s.id, s.listener, s.address, s.port, s.protocol, s.hostname, s.certificate)


def _not_served(fact: Any, ri: int, msg: str) -> None:
    """A rule's match the data plane leaves out, said once in the route's fact (its status says why)."""
    if (ri, msg) not in fact.unsupported:
        fact.unsupported.append((ri, msg))


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


class _Builder:
    def __init__(self, analysis: Any, config: DataPlaneConfig, cache: BuildCache | None = None) -> None:
        self.a = analysis
        self.cache = cache
        self._recording: dict[str, bytes] | None = None  # secrets the route being built adds
        self._new_actions: dict[str, Action] = {}  # and its actions
        self.index = analysis.index
        self.topo = analysis.topology
        self.config = config
        self.grants = ReferenceGrants(self.index)
        self.upstreams: dict[str, Upstream] = {}
        self.stream_upstreams: dict[str, Upstream] = {}  # TLS passthrough backends
        self.actions: dict[str, Action] = {}
        self.secrets: dict[str, bytes] = {}
        self.listener_facts: dict[Ref, ListenerFact] = {}
        self.route_facts: dict[Ref, RouteFact] = {}
        self.warnings: list[str] = []
        self.unserved: dict[Ref, str] = {}  # Gateway -> why none of its listeners is served
        self._slices: dict[tuple[str, str], tuple[Any, ...]] | None = None
        self._grants_by_ns: dict[tuple[str, tuple[str, str, str]], tuple[Any, ...]] | None = None
        #: what the route being built reads by reference, of EndpointSlices and of ReferenceGrants
        #: (see BuildCache); None while no route is recorded
        self._objects_read: dict[Ref, Any] | None = None
        self._slices_read: dict[tuple[str, str], tuple[Any, ...]] | None = None
        self._grants_read: dict[tuple[str, tuple[str, str, str]], tuple[Any, ...]] | None = None
        self._effective = analysis._effective_by_target()
        self._at: dict[int, dict[str, dict[str, Any]]] = {}  # path node -> effective_at (nodes live in the analysis)
        self._specs: dict[int, tuple[Any, Any]] = {}  # id(Result) -> (Result, Effective)
        self._gateway_addresses: frozenset[str] = frozenset()  # never endpoints (see endpoint_problem)
        #: Service (namespace, name) -> why endpoint addresses of its slices were not used
        self._refused: dict[tuple[str, str], list[str]] = {}
        self.over_budget: dict[Ref, tuple[str, str]] = {}

    # -- gateways and listeners ---------------------------------------------------------------

    def _our_gateways(self) -> list[tuple[Any, "Cond"]]:
        """The Gateways of our GatewayClasses, each with its class' Accepted condition (as status
        says it: a Gateway of a class that is not accepted is served nothing); why each other
        Gateway is not ours goes to `unserved`."""
        from gwpolicy.gateway.status import class_acceptance  # status imports this module

        out = []
        for gw in self.index.of_kind(GATEWAY_GROUP, "Gateway"):
            class_name = str(_dict(gw.spec).get("gatewayClassName", ""))
            cls = self.index.by_ref.get(Ref(GATEWAY_GROUP, "GatewayClass", None, class_name))
            if cls is None:
                self.unserved[gw.ref] = f"GatewayClass {class_name!r} does not exist"
                continue
            controller = _dict(cls.spec).get("controllerName")
            if self.config.controller_name is not None and controller != self.config.controller_name:
                self.unserved[gw.ref] = (f"GatewayClass {class_name} belongs to controller {controller!r}, "
                                         f"not {self.config.controller_name!r}")
                continue
            out.append((gw, class_acceptance(cls)))
        return out

    def build(self) -> DataPlane:
        ours = self._our_gateways()
        gateways = [gw for gw, _ in ours]
        addresses = gateway_addresses(gateways, self.config)
        self._gateway_addresses = frozenset(addresses.values())
        if self.cache is not None and self.cache.gateway_addresses != self._gateway_addresses:
            self.cache.routes.clear()  # the endpoints routes were built with may be a Gateway's address now
            self.cache.gateway_addresses = self._gateway_addresses
        servers: list[Server] = []
        owner: dict[tuple[str, int], Ref] = {}  # address:port -> the Gateway serving it
        for gw, class_ok in sorted(ours, key=lambda g: g[0].age_key):  # the older Gateway keeps a shared address:port
            for srv in self._gateway_servers(gw, class_ok, addresses[gw.ref]):
                held = _reserved(self.config.reserved, srv.address, srv.port)
                if held is not None:
                    self.listener_facts[srv.listener] = ListenerFact(
                        False, PORT_UNAVAILABLE, f"{srv.address}:{srv.port - self.config.port_offset} is held by {held}")
                    continue
                first = owner.setdefault((srv.address, srv.port), gw.ref)
                if first != gw.ref:  # two Gateways on one address:port would make NGINX refuse everything
                    self.listener_facts[srv.listener] = ListenerFact(
                        False, PORT_UNAVAILABLE, f"{srv.address}:{srv.port - self.config.port_offset} is already served "
                        f"for Gateway {first.namespace}/{first.name}")
                    continue
                servers.append(srv)
        if len({s.id for s in servers}) != len(servers):  # server_id: cannot be, short of a digest collision
            raise DataPlaneError("two listeners got one server id: " + ", ".join(sorted(s.id for s in servers)))
        passthrough = [s for s in servers if s.protocol == "TLS"]
        servers = [s for s in servers if s.protocol != "TLS"]
        by_listener = {s.listener: s for s in servers}
        self._attach_routes(by_listener)
        for s in servers:
            s.vhosts.sort(key=lambda v: (v.hostname == "", v.hostname))
        streams = self._attach_tls_routes(passthrough)
        by_port = {(p.address, p.port): p for p in streams}
        for s in servers:  # HTTPS on a passthrough port: behind the stream server, on a unix socket
            shared = by_port.get((s.address, s.port)) if s.protocol == "HTTPS" else None
            if shared is not None:
                shared.https_socket = s.socket = f"{SOCKET_DIR}/h_{_address_key(s.address)}_{s.port}.sock"
                if s.hostname not in shared.https_names:
                    shared.https_names.append(s.hostname)
        return DataPlane(servers, dict(sorted(self.upstreams.items())), self.actions, dict(sorted(self.secrets.items())),
                         addresses, self.listener_facts, self.route_facts, self.config, self.warnings,
                         streams, dict(sorted(self.stream_upstreams.items())), self.unserved, self.over_budget)

    def _gateway_servers(self, gw: Any, class_ok: "Cond", address: str) -> list[Server]:
        # which listeners are served is status' verdict (status.listener_verdicts: the one rule,
        # conflicts included); only what needs the data plane itself (the stream module, the
        # certificate file, address:port ownership across Gateways) is decided here on top
        from gwpolicy.gateway.status import gateway_acceptance, listener_verdicts  # status imports this module

        verdicts = listener_verdicts(gw, self.index, self.grants)
        gateway_ok = gateway_acceptance(gw, verdicts, class_ok)
        if not gateway_ok.status:
            self.unserved[gw.ref] = f"it is not accepted ({gateway_ok.reason}): {gateway_ok.message}"
        out = []
        for name, lf in verdicts.items():
            lref = gw.ref.with_section(name)
            if not gateway_ok.status:
                self.listener_facts[lref] = ListenerFact(False, gateway_ok.reason, f"Gateway {gw.namespace}/{gw.name} is "
                                                                                   f"not accepted: {gateway_ok.message}")
                continue
            if not lf.servable:
                # the reference's reason first (InvalidCertificateRef, ...), as the data plane said before
                why = lf.conflicted if lf.conflicted.status else next(c for c in (lf.resolved_refs, lf.accepted) if not c.status)
                self.listener_facts[lref] = ListenerFact(False, why.reason, why.message)
                continue
            assert lf.port is not None  # servable listeners have a port
            port, protocol, hostname = lf.port, lf.protocol, (lf.hostname or "").lower()
            if protocol == "TLS" and self.config.stream_module is None:
                self.listener_facts[lref] = ListenerFact(False, UNSUPPORTED_PROTOCOL,
                                                         f"TLS passthrough needs NGINX's stream module ({STREAM_MODULE}, "
                                                         "Debian package libnginx-mod-stream), which is not installed")
                continue
            cert, client_ca, client_mode = None, None, ""
            if protocol == "HTTPS":  # the certificate and client CAs status resolved (servable: all of them)
                cert = self._certificate(lf)
                if lf.client_cas:  # a listener whose validation has a problem is not servable (fail closed)
                    client_ca = client_ca_path(gw.namespace or "", gw.name, port)
                    client_mode = lf.client_mode
                    self.secrets[client_ca] = lf.client_bundle
            if lref in self.config.left_out:
                self.listener_facts[lref] = ListenerFact(False, *self.config.left_out[lref])
                continue
            sid = server_id(gw.namespace, gw.name, name)
            out.append(Server(sid, gw.ref, lref, address, port + self.config.port_offset, protocol, hostname, cert,
                              client_ca=client_ca, client_mode=client_mode))
            self.listener_facts[lref] = ListenerFact(True)
        return out

    def _certificate(self, lf: "ListenerFacts") -> str:
        """The file of a servable HTTPS listener's certificate: its first certificateRef, as status
        resolved it (status.certificate_secret, the one check of a certificate Secret)."""
        if not lf.certificates:  # status leaves an HTTPS listener without a certificate unservable
            raise DataPlaneError(f"listener {lf.name}: servable HTTPS listener without a resolved certificate")
        cert = lf.certificates[0]
        path = f"secrets/{cert.secret.namespace}_{cert.secret.name}.pem"
        self.secrets[path] = cert.pem
        return path

    # -- TLS passthrough ----------------------------------------------------------------------

    def _attach_tls_routes(self, listeners: list[Server]) -> list[PassthroughServer]:
        """One stream server per address:port of passthrough listeners; each TLSRoute attached to a
        listener (the engine's paths) serves its hostnames intersected with the listener's. Of two
        routes claiming one name on one port, the older route keeps it (as for HTTPRoute rules)."""
        streams: dict[tuple[str, int], PassthroughServer] = {}
        by_listener: dict[Ref, Server] = {}
        for l in listeners:
            key = (l.address, l.port)
            if key not in streams:
                streams[key] = PassthroughServer(f"t{len(streams)}_{_slug(l.address)}_{l.port}", l.gateway, l.address, l.port, [])
            streams[key].listeners.append(l.listener)
            by_listener[l.listener] = l
        if not listeners:
            return []
        for route in sorted(self.index.of_kind(GATEWAY_GROUP, "TLSRoute"), key=lambda o: o.age_key):
            if route.ref in self.config.left_out:
                continue
            attached = [by_listener[lref] for lref in map(_listener_of, self.topo.paths.get(route.ref, {}))
                        if lref is not None and lref in by_listener]
            if not attached:
                continue
            fact = self.route_facts.setdefault(route.ref, RouteFact())
            target = PassthroughRoute(route.ref, self._tls_backends(route, fact))
            hostnames = _list(_dict(route.spec).get("hostnames"))
            for l in attached:
                fact.listeners.add(l.listener)
                hosts = streams[(l.address, l.port)].hosts
                for host in route_hostnames(l.hostname, hostnames):
                    hosts.setdefault(host or l.hostname, target)
        return [streams[k] for k in sorted(streams)]

    def _tls_backends(self, route: Any, fact: RouteFact) -> list[PassthroughBackend]:
        out = []
        rules = [r for r in _list(_dict(route.spec).get("rules")) if isinstance(r, dict)]
        for ri, rule in enumerate(rules):
            for bi, b in enumerate(_list(rule.get("backendRefs"))):
                if not isinstance(b, dict):
                    continue
                weight, ref, port = _backend_ref(b, route)
                group, kind, ns, name = ref.group, ref.kind, ref.namespace, ref.name
                pb = PassthroughBackend(ref, weight, None)
                where = f"TLSRoute {route.namespace}/{route.name} spec.rules[{ri}].backendRefs[{bi}]"
                bad_name = names.reference_problem("Service", ns, name)
                svc = self.index.by_ref.get(ref) if (group, kind) == (CORE_GROUP, "Service") and bad_name is None else None
                sport = _service_port(svc, port) if svc is not None else None
                if (group, kind) != (CORE_GROUP, "Service"):
                    pb.error, pb.message = INVALID_KIND, f"{where}: kind {group or 'core'}/{kind} is not supported (Service is)"
                elif bad_name is not None:
                    pb.error, pb.message = BACKEND_NOT_FOUND, f"{where}: Service {bad_name}"
                elif ns is not None and ns != route.namespace and not self.grants.allows(route.group, route.kind, route.namespace or "", CORE_GROUP, "Service", ns, name):
                    pb.error, pb.message = REF_NOT_PERMITTED, f"{where}: Service {ns}/{name} is in another namespace and no ReferenceGrant allows the reference"
                elif svc is None:
                    pb.error, pb.message = BACKEND_NOT_FOUND, f"{where}: Service {ns}/{name} does not exist"
                elif sport is None:
                    pb.error, pb.message = BACKEND_NOT_FOUND, f"{where}: Service {ns}/{name} has no port {port!r}"
                else:
                    endpoints = self._endpoints(svc, sport)
                    if not endpoints:
                        pb.error, pb.message = NO_ENDPOINTS, f"{where}: {self._no_endpoints(ns, name, port)}"
                    else:
                        uname = tls_upstream_name(ns or "", name, int(port))
                        was = self.stream_upstreams.get(uname)
                        if was is not None and (was.service, was.port) != (ref, int(port)):
                            raise DataPlaneError(f"Service {ns}/{name} port {port} and Service {was.service.namespace}/"
                                                 f"{was.service.name} port {was.port} got one upstream name {uname}")
                        self.stream_upstreams[uname] = Upstream(uname, ref, int(port), endpoints)
                        pb.upstream = uname
                if pb.error and pb.error != NO_ENDPOINTS and not any(u[:2] == (ri, bi) for u in fact.unresolved):
                    fact.unresolved.append((ri, bi, pb.error, pb.message))
                out.append(pb)
        return out

    # -- routes ---------------------------------------------------------------------------------

    def _attach_routes(self, by_listener: dict[Ref, Server]) -> None:
        vhosts: dict[tuple[str, str], VirtualHost] = {}
        rules_of: dict[tuple[str, str], list[MatchRule]] = {}
        routes = sorted((r for r in self.index.of_kind(GATEWAY_GROUP, "HTTPRoute") if r.ref not in self.config.left_out),
                        key=lambda o: o.age_key)
        if self.config.namespace_budget is not None:
            routes = self._within_budget(routes, self.config.namespace_budget)
        for route in routes:
            nodes = list(self.topo.paths.get(route.ref, {}))
            servers = [by_listener.get(lref) if lref is not None else None for lref in map(_listener_of, nodes)]
            entry, inputs = self._cached(route, nodes, servers) if self.cache is not None else (None, None)
            if entry is not None:
                self.route_facts[route.ref] = _copy_fact(entry.fact)
                self.actions.update(entry.actions)
                for name, u in entry.upstreams.items():
                    self.upstreams.setdefault(name, u)
                self.secrets.update(entry.secrets)
                built = entry.matches
            else:
                built = [None] * len(nodes)
                self._recording = {}
                self._new_actions = {}
                self._objects_read, self._slices_read, self._grants_read = {}, {}, {}
            fact = self.route_facts.setdefault(route.ref, RouteFact())
            spec = _dict(route.spec)
            for i, (node, server) in enumerate(zip(nodes, servers)):
                if server is None:
                    continue
                fact.listeners.add(server.listener)
                matches = built[i]
                for host in route_hostnames(server.hostname, _list(spec.get("hostnames"))):
                    key = (server.id, host)
                    if key not in vhosts:
                        vh = VirtualHost(f"{len(vhosts)}", host)
                        vhosts[key] = vh
                        server.vhosts.append(vh)
                    if matches is None:
                        matches = built[i] = self._match_rules(route, node, server, fact)
                    rules_of.setdefault(key, []).extend(matches)
            if entry is None and self.cache is not None:
                actions = self._new_actions
                used = {b.upstream for a in actions.values() for b in a.backends if b.upstream is not None}
                used.update(m.upstream for a in actions.values() for m in a.mirrors if m.upstream is not None)
                self.cache.routes[route.ref] = _RouteEntry(
                    inputs if inputs is not None else self._inputs(route, nodes, servers),
                    [_server_key(sv) for sv in servers], built,
                    _copy_fact(fact), actions, {n: self.upstreams[n] for n in used}, self._recording or {},
                    self._objects_read or {}, self._slices_read or {}, self._grants_read or {})
            self._recording = None
            self._objects_read = self._slices_read = self._grants_read = None
        # actions are shared by every vhost of a listener: build once per (listener, route); the
        # loop above rebuilt them per hostname, so de-duplicate by id
        for key, rules in rules_of.items():
            seen: dict[tuple[str, int], MatchRule] = {}
            for r in rules:
                seen.setdefault((r.action.id, r.action.match), r)
            _locations(vhosts[key], list(seen.values()))

    def _within_budget(self, routes: list[Any], budget: int) -> list[Any]:
        """The routes (oldest first) whose namespace's budget holds them: each namespace's routes
        count, in age order, until the next one would take it over; that one and every newer one of
        the namespace are left out (a route created later can never push an older one out)."""
        used: dict[str, int] = {}
        full: set[str] = set()
        out = []
        for r in routes:
            ns = r.namespace or ""
            cost = route_cost(r.spec)
            if ns not in full and used.get(ns, 0) + cost <= budget:
                used[ns] = used.get(ns, 0) + cost
                out.append(r)
                continue
            full.add(ns)
            self.over_budget[r.ref] = (BUDGET_EXCEEDED, (
                f"over the budget of namespace {ns}: {budget} route matches (older routes of {ns}: {used.get(ns, 0)}, "
                f"this route: {cost}; a match counts once per hostname); this route and the newer ones of {ns} are "
                "not served (gwpolicy gateway --namespace-match-budget)"))
        return out

    def _inputs(self, route: Any, nodes: list[PathNode], servers: list[Server | None]) -> list[Any]:
        """The objects a route's part of the data plane is built from (see BuildCache)."""
        out: list[Any] = [route]
        eff = self._effective
        for node, server in zip(nodes, servers):
            out.append(node)
            if server is None:
                continue
            stack = [node]
            while stack:
                n = stack.pop()
                out.append(n)
                out.append(eff.get(n.levels[-1], _NONE).get(n))
                if n.children:
                    stack.extend(n.children.values())
        return out

    def _cached(self, route: Any, nodes: list[PathNode],
                servers: list[Server | None]) -> tuple[_RouteEntry | None, list[Any] | None]:
        """The route's entry when it may be reused, else None; and the route's inputs where they
        were made for the comparison (building the route reads nothing they are made of, so a new
        entry records them as they are)."""
        assert self.cache is not None
        entry = self.cache.routes.get(route.ref)
        inputs = None
        if entry is not None and entry.servers == [_server_key(sv) for sv in servers]:
            inputs = self._inputs(route, nodes, servers)
            if (len(inputs) == len(entry.inputs) and all(x is y for x, y in zip(inputs, entry.inputs))
                    and self._same_reads(entry)):
                self.cache.hits += 1
                return entry, inputs
        self.cache.misses += 1
        return None, inputs

    def _same_reads(self, entry: _RouteEntry) -> bool:
        """Are the Services, ConfigMaps, EndpointSlices and ReferenceGrants the entry was built
        from still the index's objects?"""
        by_ref = self.index.by_ref
        if any(by_ref.get(ref) is not obj for ref, obj in entry.objects.items()):
            return False
        for key, was in entry.slices.items():
            now = self._slices_of(*key)
            if len(now) != len(was) or any(x is not y for x, y in zip(now, was)):
                return False
        for (ns, referrer), was in entry.grants.items():
            now = self._grants_in(ns, referrer)
            if len(now) != len(was) or any(x is not y for x, y in zip(now, was)):
                return False
        return True

    def get(self, ref: Ref) -> Any:
        """The object `ref` names in the index (None: absent), recorded for the route being built:
        what backendtls.resolve looks its ConfigMaps up with."""
        obj = self.index.by_ref.get(ref.object)
        if self._objects_read is not None:
            self._objects_read[ref.object] = obj
        return obj

    def _service(self, ref: Ref) -> Any:
        """The Service a backend or mirror names (None: absent), recorded for the route being built."""
        return self.get(ref)

    def _allows(self, route: Any, to_ns: str, to_name: str) -> bool:
        """May the route refer to the Service `to_ns`/`to_name` in another namespace (a
        ReferenceGrant there allows it)? The grants there that could, those whose `from` names the
        route's kind and namespace, are recorded for the route being built."""
        if self._grants_read is not None:
            referrer = (route.group, route.kind, route.namespace or "")
            self._grants_read[(to_ns, referrer)] = self._grants_in(to_ns, referrer)
        return self.grants.allows(route.group, route.kind, route.namespace or "", CORE_GROUP, "Service", to_ns, to_name)

    def _grants_in(self, namespace: str, referrer: tuple[str, str, str]) -> tuple[Any, ...]:
        """The ReferenceGrants of a namespace whose `from` names `referrer` (group, kind,
        namespace), in the index's order: the only ones that can let it refer there (grouped once
        per build). A grant created, changed or deleted that names it changes this tuple; one that
        does not (before and after) leaves it as it was."""
        if self._grants_by_ns is None:
            grouped: dict[tuple[str, tuple[str, str, str]], list[Any]] = {}
            for g in self.index.of_kind(GATEWAY_GROUP, "ReferenceGrant"):
                spec = g.spec if isinstance(g.spec, dict) else {}
                for key in {grant_from_key(f) for f in _list(spec.get("from")) if isinstance(f, dict)} - {None}:
                    grouped.setdefault((g.namespace or "", key), []).append(g)  # type: ignore[arg-type]
            self._grants_by_ns = {k: tuple(v) for k, v in grouped.items()}
        return self._grants_by_ns.get((namespace, referrer), ())

    def _slices_of(self, namespace: str, name: str) -> tuple[Any, ...]:
        """The EndpointSlices of a Service (by their `kubernetes.io/service-name` label) the gateway
        trusts (those the EndpointSlice controller manages, unless the configuration allows every
        one), in the index's order; recorded for the route being built."""
        if self._slices is None:
            grouped: dict[tuple[str, str], list[Any]] = {}
            unmanaged = self.config.allow_unmanaged_endpointslices
            for es in self.index.of_kind("discovery.k8s.io", "EndpointSlice"):
                label = es.labels.get(SERVICE_NAME_LABEL)
                if label and (unmanaged or es.labels.get(MANAGED_BY_LABEL) == ENDPOINTSLICE_CONTROLLER):
                    grouped.setdefault((es.namespace or "", label), []).append(es)
            self._slices = {k: tuple(v) for k, v in grouped.items()}
        got = self._slices.get((namespace, name), ())
        if self._slices_read is not None:
            self._slices_read[(namespace, name)] = got
        return got

    def _match_rules(self, route: Any, node: PathNode, server: Server, fact: RouteFact) -> list[MatchRule]:
        out: list[MatchRule] = []
        rules = [r for r in _list(_dict(route.spec).get("rules")) if isinstance(r, dict)]
        for ri, rule in enumerate(rules):
            rule_node = node
            if isinstance(rule.get("name"), str):
                rule_node = _child(node, route.ref.with_section(rule["name"])) or node
            matches = [m for m in _list(rule.get("matches")) if isinstance(m, dict)] or [{}]
            backends = None
            for mi, m in enumerate(matches):
                path = _dict(m.get("path"))
                ptype = path.get("type") or "PathPrefix"
                raw_value = path.get("value")
                pvalue = raw_value if isinstance(raw_value, str) else "/"
                aid = action_id(server.id, route.ref, ri, mi)
                if aid in self.actions:
                    action = self.actions[aid]
                    if action.route != route.ref or action.listener != server.listener:
                        raise DataPlaneError(f"HTTPRoute {route.namespace}/{route.name} and HTTPRoute "
                                             f"{action.route.namespace}/{action.route.name} got one action id {aid}")
                else:
                    if backends is None:
                        backends = self._backends(route, rule, ri, rule_node, fact, server)
                    action = Action(aid, route.ref, ri, mi, server.listener, server.protocol.lower(),
                                    server.port - self.config.port_offset, ptype, pvalue,
                                    tuple(f for f in _list(rule.get("filters")) if isinstance(f, dict)),
                                    backends, policyconf.with_route_fields(self.effective_at(rule_node.levels[-1], rule_node), rule),
                                    tuple(rule_node.levels))
                    self._check_action(action, fact)
                    action.mirrors = self._mirrors(route, rule, ri, fact)
                    self.actions[aid] = self._new_actions[aid] = action
                if ptype == REGULAR_EXPRESSION:
                    why = pathregex.problem(pvalue)
                    if why is not None:  # never reaches NGINX (status: Accepted=False/UnsupportedValue)
                        _not_served(fact, ri, f"rule {ri} match {mi}: path value {pvalue!r} is not served: {why}")
                        continue
                elif ptype not in ("Exact", "PathPrefix") or not pvalue.startswith("/"):
                    _not_served(fact, ri, f"rule {ri} match {mi}: path type {ptype!r} value {pvalue!r} is not supported "
                                          "(Exact, PathPrefix and RegularExpression are)")
                    continue
                if ptype == "PathPrefix" and len(pvalue) > 1:
                    action.path_value = pvalue = pvalue.rstrip("/") or "/"
                bad = pathregex.condition_problem(m)
                if bad is not None:  # never reaches NGINX (status: Accepted=False/UnsupportedValue)
                    _not_served(fact, ri, f"rule {ri} match {mi}: {bad[0]} is not served: {bad[1]}")
                    continue
                method = m.get("method") if isinstance(m.get("method"), str) else None
                out.append(MatchRule(action, method, _conditions(m.get("headers"), lower=True),
                                     _conditions(m.get("queryParams"), lower=False), route.created,
                                     f"{route.namespace}/{route.name}"))
        return out

    def _check_action(self, action: Action, fact: RouteFact) -> None:
        for f in action.filters:
            if f.get("type") not in SUPPORTED_FILTERS:
                action.error = f"filter type {f.get('type')!r} is not supported by this data plane"
                _not_served(fact, action.rule, action.error)
            if f.get("type") == "URLRewrite" or f.get("type") == "RequestRedirect":
                conf = _dict(f.get("urlRewrite") if f.get("type") == "URLRewrite" else f.get("requestRedirect"))
                why = redirect_problem(conf) if f.get("type") == "RequestRedirect" else None
                if why is not None:
                    action.error = why
                    _not_served(fact, action.rule, why)
                p = _dict(conf.get("path"))
                if p.get("type") == "ReplacePrefixMatch" and action.path_type != "PathPrefix":
                    action.error = "ReplacePrefixMatch needs a PathPrefix match"
                    fact.unsupported.append((action.rule, action.error))

    def _mirrors(self, route: Any, rule: dict[str, Any], ri: int, fact: RouteFact) -> tuple[Mirror, ...]:
        """The rule's RequestMirror filters as NGINX sends them (see Mirror). The engine's paths do
        not include mirror targets, so no policy applies to the copies; a Service with a
        BackendTLSPolicy gets no copy rather than one in plain HTTP (fail closed)."""
        out = []
        for fi, f in enumerate(_list(rule.get("filters"))):
            if not isinstance(f, dict) or f.get("type") != "RequestMirror":
                continue
            conf = _dict(f.get("requestMirror"))
            share = _mirror_share(conf)
            b = _dict(conf.get("backendRef"))
            _, ref, port = _backend_ref(b, route)
            m = Mirror(ref, port if isinstance(port, int) else None, share, None)
            where = f"rule {ri} filters[{fi}] requestMirror.backendRef"
            if share <= 0:
                m.error, m.message = UNSUPPORTED_VALUE, f"{where}: percent or fraction of 0 mirrors nothing"
            elif (ref.group, ref.kind) != (CORE_GROUP, "Service"):
                m.error, m.message = INVALID_KIND, f"{where}: kind {ref.group or 'core'}/{ref.kind} is not supported (Service is)"
            elif names.reference_problem("Service", ref.namespace, ref.name) is not None:
                m.error, m.message = BACKEND_NOT_FOUND, f"{where}: Service {names.reference_problem('Service', ref.namespace, ref.name)}"
            elif ref.namespace != route.namespace and not self._allows(route, ref.namespace or "", ref.name):
                m.error, m.message = REF_NOT_PERMITTED, f"{where}: Service {ref.namespace}/{ref.name} is in another namespace and no ReferenceGrant allows the reference"
            else:
                svc = self._service(ref)
                sport = _service_port(svc, port) if svc is not None else None
                if svc is None or sport is None:
                    m.error, m.message = BACKEND_NOT_FOUND, f"{where}: Service {ref.namespace}/{ref.name} port {port!r} does not exist"
                elif self._backend_tls_targets(ref):
                    m.error, m.message = BACKEND_TLS_INVALID, (f"{where}: Service {ref.namespace}/{ref.name} has a BackendTLSPolicy, "
                                                               "which this data plane does not apply to mirrored requests: none is sent")
                else:
                    endpoints = self._endpoints(svc, sport)
                    if not endpoints:
                        m.error, m.message = NO_ENDPOINTS, f"{where}: {self._no_endpoints(ref.namespace, ref.name, port)}"
                    else:
                        m.upstream = self._upstream(ref, int(port), endpoints, {})
            if m.error is not None and m.error != NO_ENDPOINTS:
                _not_served(fact, ri, m.message)
            out.append(m)
        return tuple(out)

    def _backend_tls_targets(self, svc: Ref) -> bool:
        """Does a BackendTLSPolicy target this Service (any port)?"""
        group, kind = backendtls.KIND
        for p in self.index.of_kind(group, kind):
            for t in _list(_dict(p.spec).get("targetRefs")):
                if (isinstance(t, dict) and (t.get("group") or CORE_GROUP) == CORE_GROUP and (t.get("kind") or "Service") == "Service"
                        and p.namespace == svc.namespace and t.get("name") == svc.name):
                    return True
        return False

    def _backends(self, route: Any, rule: dict[str, Any], ri: int, rule_node: PathNode, fact: RouteFact,
                  server: Server) -> list[Backend]:
        out: list[Backend] = []
        record = not any(u[0] == ri for u in fact.unresolved)
        for bi, b in enumerate(_list(rule.get("backendRefs"))):
            if not isinstance(b, dict):
                continue
            weight, ref, port = _backend_ref(b, route)
            group, kind, ns, name = ref.group, ref.kind, ref.namespace, ref.name
            filters = tuple(f for f in _list(b.get("filters")) if isinstance(f, dict))
            backend = Backend(ref, weight, None, filters=filters)
            bad_name = names.reference_problem("Service", ns, name)
            if (group, kind) != (CORE_GROUP, "Service"):
                backend.error, backend.message = INVALID_KIND, f"backendRefs[{bi}] of rule {ri}: kind {group or 'core'}/{kind} is not supported (Service is)"
            elif bad_name is not None:
                backend.error, backend.message = BACKEND_NOT_FOUND, f"backendRefs[{bi}] of rule {ri}: Service {bad_name}"
            elif ns is not None and ns != route.namespace and not self._allows(route, ns, name):
                backend.error, backend.message = REF_NOT_PERMITTED, f"backendRefs[{bi}] of rule {ri}: Service {ns}/{name} is in another namespace and no ReferenceGrant allows the reference"
            else:
                svc = self._service(ref)
                sport = _service_port(svc, port) if svc is not None else None
                if svc is None:
                    backend.error, backend.message = BACKEND_NOT_FOUND, f"backendRefs[{bi}] of rule {ri}: Service {ns}/{name} does not exist"
                elif sport is None:
                    backend.error, backend.message = BACKEND_NOT_FOUND, f"backendRefs[{bi}] of rule {ri}: Service {ns}/{name} has no port {port!r}"
                else:
                    bnode = _descend(rule_node, ref)
                    pnode = _child(bnode, ref.with_section(sport["name"])) if bnode is not None and sport.get("name") else None
                    target_node = pnode or bnode
                    eff = self.effective_at(target_node.levels[-1], target_node) if target_node is not None else {}
                    # the rule's own fields (timeouts, retry) merged in as the kinds' fieldMappings say
                    eff = policyconf.with_route_fields(eff, rule)
                    backend.effective = eff
                    backend.path = tuple(target_node.levels) if target_node is not None else ()
                    endpoints = self._endpoints(svc, sport)
                    tls = self._tls(target_node)
                    if isinstance(tls, backendtls.TLSFailure):
                        backend.error, backend.message = BACKEND_TLS_INVALID, f"Service {ns}/{name} port {port}: {tls.message}"
                    elif not endpoints:
                        backend.error, backend.message = NO_ENDPOINTS, self._no_endpoints(ns, name, port)
                    else:
                        backend.tls = tls
                        backend.upstream = self._upstream(ref, int(port), endpoints, eff, tls)
            if backend.error and backend.error not in (NO_ENDPOINTS, BACKEND_TLS_INVALID) and record:
                fact.unresolved.append((ri, bi, backend.error, backend.message))
            out.append(backend)
        return out

    def effective_at(self, target: Ref, node: PathNode) -> dict[str, dict[str, Any]]:
        """Kind -> effective spec of exactly this path (what POL's policyconf translates)."""
        got = self._at.get(id(node))
        if got is not None:
            return got
        got = self._at[id(node)] = self._effective_at(target, node)
        return got

    def _effective_at(self, target: Ref, node: PathNode) -> dict[str, dict[str, Any]]:
        pairs = self._effective.get(target, {}).get(node, ())
        return {(k.kind if k.group == POLICY_GROUP else f"{k.group}/{k.kind}"): self._spec_of(res)
                for k, res in pairs if res.leaves}

    def _spec_of(self, result: Any) -> Any:
        """policyconf.Effective of an engine Result (knows its overrides and sources), one per Result:
        results are shared by every path with the same ladder, and so are these (memo keys)."""
        got = self._specs.get(id(result))
        if got is None or got[0] is not result:
            got = self._specs[id(result)] = (result, policyconf.Effective.of(result))
        return got[1]

    def _tls(self, node: PathNode | None) -> Any:
        """The BackendTLSPolicy of this backend path (POL's backendtls), from the engine's Result."""
        if node is None:
            return None
        pairs = self._effective.get(node.levels[-1], {}).get(node, ())
        results = {k.key: res for k, res in pairs if k.key == backendtls.KIND and res.leaves}
        if not results:
            return None
        tls = backendtls.for_backend(results, self)  # its ConfigMaps looked up through self.get: recorded
        if isinstance(tls, backendtls.TLSProfile):
            files = tls.files()
            self.secrets.update(files)
            if self._recording is not None:
                self._recording.update(files)
        return tls

    def _upstream(self, svc: Ref, port: int, endpoints: tuple[Endpoint, ...], eff: dict[str, dict[str, Any]],
                  tls: Any = None) -> str:
        base = upstream_base(svc.namespace or "", svc.name, port)
        usable = _programmable(eff)
        if usable:
            copies = memo("copies", usable, lambda: policyconf.retry_peer_copies(usable))
            conf = memo("upstream", usable, lambda: policyconf.upstream_directives(base, usable, peer_copies=copies), base)
        else:  # no policy of a kind this data plane enforces: nothing to ask policyconf
            copies, conf = 1, policyconf.UpstreamConf()
        variant = (conf.lines, conf.server_params, copies)
        name = base if variant == ((), "", 1) else f"{base}_{hashlib.sha1(repr(variant).encode()).hexdigest()[:8]}"
        if tls is not None:
            name = f"{name}_tls{tls.key}"
        # NGINX compares every new upstream's name with all earlier ones (quadratic); names that
        # differ in their first characters make each comparison stop at once: with names sharing
        # the prefix `<namespace>_svc_...`, 20k upstreams cost 7.8 s of `nginx -t`, like this 3.1 s
        name = f"u{hashlib.sha1(name.encode()).hexdigest()[:5]}_{name}"
        was = self.upstreams.get(name)
        lines = tuple(l.replace(f"zone {base} ", f"zone {name} ") for l in conf.lines)
        if was is None:
            self.upstreams[name] = Upstream(name, svc, port, endpoints, lines, conf.server_params, copies,
                                            conf.keepalive, tls)
        elif (was.service, was.port, was.lines, was.server_params, was.peer_copies) != (svc, port, lines, conf.server_params, copies) \
                or (was.tls is None) != (tls is None) or (tls is not None and was.tls.key != tls.key):
            raise DataPlaneError(f"Service {svc.namespace}/{svc.name} port {port} and Service {was.service.namespace}/"
                                 f"{was.service.name} port {was.port} (or their settings) got one upstream name {name}")
        return name

    # -- endpoints ------------------------------------------------------------------------------

    def _endpoints(self, svc: Any, sport: dict[str, Any]) -> tuple[Endpoint, ...]:
        out: dict[Endpoint, None] = {}
        pname = sport.get("name") or ""
        for es in self._slices_of(svc.namespace or "", svc.name):
            address_type = es.raw.get("addressType", "IPv4")
            if address_type not in ("IPv4", "IPv6"):
                continue
            ports = [p for p in _list(es.raw.get("ports")) if isinstance(p, dict)]
            if ports:
                match = [p for p in ports if (p.get("name") or "") == pname and isinstance(p.get("port"), int)]
                if not match:
                    continue
                number = match[0]["port"]
            else:
                tp = sport.get("targetPort")
                number = tp if isinstance(tp, int) else sport.get("port")
            for ep in _list(es.raw.get("endpoints")):
                if not isinstance(ep, dict):
                    continue
                ready = _dict(ep.get("conditions")).get("ready")
                if ready is False:
                    continue
                for addr in _list(ep.get("addresses")):
                    why, text = endpoint_problem(addr, address_type, self.config, self._gateway_addresses)
                    if why is None and isinstance(number, int) and (text, number) in self.config.own_endpoints:
                        why = f"{text}:{number} is the gateway's own health and metrics endpoint"
                    if why is not None:
                        refused = self._refused.setdefault((svc.namespace or "", svc.name), [])
                        if why not in refused:
                            refused.append(why)
                            self.warnings.append(f"EndpointSlice {es.namespace}/{es.name} of Service "
                                                 f"{svc.namespace}/{svc.name}: endpoint {why}: not used")
                        continue
                    out[Endpoint(text, int(number))] = None
        return tuple(sorted(out, key=lambda e: (e.address, e.port)))

    def _no_endpoints(self, ns: str | None, name: str, port: Any) -> str:
        """The message of a Service port without a usable endpoint, with the addresses refused."""
        refused = self._refused.get((ns or "", name))
        return (f"Service {ns}/{name} port {port} has no ready endpoints"
                + (f" (not used: {'; '.join(refused)})" if refused else ""))


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


def _programmable(eff: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if not any(k in policyconf.KINDS for k in eff):
        return {}
    return memo("programmable", eff, lambda: _programmable_now(eff))


def _programmable_now(eff: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The kinds whose effective spec this data plane can honour in full (a safety net: the engine,
    given policyconf.kind_checks(), already leaves policies with such fields out of every path)."""
    return {k: v for k, v in eff.items() if k in policyconf.KINDS and not policyconf.unsupported_fields(k, v)}


def route_cost(spec: Any) -> int:
    """What an HTTPRoute counts against its namespace's budget: its matches (a rule without one
    counts one), times its hostnames (at least one): roughly the locations and map entries it adds."""
    spec = _dict(spec)
    matches = sum(max(1, len(_list(_dict(r).get("matches")))) for r in _list(spec.get("rules"))) or 1
    return matches * max(1, len(_list(spec.get("hostnames"))))


def _conditions(items: Any, *, lower: bool) -> tuple[tuple[str, str, str], ...]:
    out: list[tuple[str, str, str]] = []
    names: set[str] = set()
    for h in _list(items):
        if not isinstance(h, dict) or not isinstance(h.get("name"), str):
            continue
        name = h["name"].lower() if lower else h["name"]
        if name in names:
            continue  # the spec: only the first entry of an equivalent name counts
        names.add(name)
        out.append((str(h.get("type") or "Exact"), name, str(h.get("value", ""))))
    return tuple(out)


#: the schemes a RequestRedirect may name (the API's enum)
REDIRECT_SCHEMES = ("http", "https")


def redirect_problem(conf: dict[str, Any]) -> str | None:
    """Why a requestRedirect cannot be served (None: it can); status says the same."""
    scheme = conf.get("scheme")
    if scheme is not None and scheme not in REDIRECT_SCHEMES:
        return f"requestRedirect.scheme {scheme!r} is not one of {', '.join(REDIRECT_SCHEMES)}"
    return None


def _mirror_share(conf: dict[str, Any]) -> float:
    """The share of requests a RequestMirror copies: `percent`, else `fraction`, else all."""
    percent = conf.get("percent")
    if isinstance(percent, int) and not isinstance(percent, bool):
        return max(0.0, min(1.0, percent / 100))
    fraction = _dict(conf.get("fraction"))
    num, den = fraction.get("numerator"), fraction.get("denominator", 100)
    if isinstance(num, int) and isinstance(den, int) and den > 0:
        return max(0.0, min(1.0, num / den))
    return 1.0


def _backend_ref(b: dict[str, Any], route: Any) -> tuple[int, Ref, Any]:
    """(weight, the object referred to, port) of a route's backendRef, with the API's defaults: weight
    1 (also for a weight that is not a non-negative integer), core Service, the route's namespace."""
    weight = b.get("weight", 1)
    weight = weight if isinstance(weight, int) and not isinstance(weight, bool) and weight >= 0 else 1
    ref = Ref(b.get("group") or CORE_GROUP, b.get("kind") or "Service", b.get("namespace") or route.namespace,
              str(b.get("name", "")))
    return weight, ref, b.get("port")

def _service_port(svc: Any, port: Any) -> dict[str, Any] | None:
    for p in _list(_dict(svc.spec).get("ports")):
        if isinstance(p, dict) and p.get("port") == port:
            return p
    return None


def server_id(namespace: str | None, gateway: str, listener: str) -> str:
    """A server's id, from what identifies it (its Gateway and listener), so that adding, removing
    or editing another listener leaves it (and the BuildCache entries of its routes, which key on
    it) as it was. `[A-Za-z0-9_]` only, as NGINX variable names (`$gw_vh_<id>`) need; the readable
    slugs can meet (`a-b` and `a_b`), so a digest of the exact names ends it: two servers of one
    data plane get one id only if SHA-256 collides on 48 bits, which _Builder.build checks."""
    digest = hashlib.sha256(f"{namespace or ''}/{gateway}/{listener}".encode()).hexdigest()[:12]
    return f"s_{_slug(namespace)}_{_slug(gateway)}_{_slug(listener)}_{digest}"


def _digest(*parts: object) -> str:
    """48 bits of SHA-256 over the exact parts (their repr: one-to-one, whatever characters the
    names hold). Every generated name that comes from object names carries one, so names whose
    readable slugs meet (`team`/`x-api` and `team-x`/`api`) stay apart; _Builder raises if two
    different keys ever give one name."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def action_id(server: str, route: Ref, rule: int, match: int) -> str:
    """The id of one match of one rule of one route through one listener's server."""
    return f"{server}_{_slug(route.namespace)}_{_slug(route.name)}_{_digest(route.namespace, route.name)}_r{rule}_m{match}"


def upstream_base(namespace: str, name: str, port: int) -> str:
    """The readable, one-to-one part of the name of a Service port's upstreams (`_upstream` adds
    what tells its settings and TLS apart)."""
    return f"{_slug(namespace)}_{_slug(name)}_{port}_{_digest(namespace, name, port)}"


def tls_upstream_name(namespace: str, name: str, port: int) -> str:
    """The stream upstream of a TLSRoute backend (a Service port)."""
    return f"tls_{_slug(namespace)}_{_slug(name)}_{port}_{_digest(namespace, name, port)}"


def client_ca_path(namespace: str, gateway: str, port: int) -> str:
    """The file of the CA bundle an HTTPS port of a Gateway checks client certificates against."""
    return f"tls/clientca_{_slug(namespace)}_{_slug(gateway)}_{port}_{_digest(namespace, gateway, port)}.pem"


def _address_key(address: str) -> str:
    """An address as a short name part, one-to-one (the packed bytes in hex; `::ffff:1.2.3.4` and
    `::ffff:1:2:3:4` slug alike)."""
    try:
        return ipaddress.ip_address(address).packed.hex()
    except ValueError:
        return _digest(address)


@functools.lru_cache(maxsize=65536)
def _slug(text: str | None) -> str:
    return "".join(c if c.isalnum() else "_" for c in (text or ""))


def _listener_of(node: PathNode) -> Ref | None:
    for level in reversed(node.levels):
        if level.kind == "Gateway" and level.group == GATEWAY_GROUP and level.section is not None:
            return level
    return None


def _child(node: PathNode | None, ref: Ref) -> PathNode | None:
    if node is None or node.children is None:
        return None
    return node.children.get(ref)


def _descend(node: PathNode, ref: Ref) -> PathNode | None:
    """topology.extend without creating anything: the node one level down, if it exists."""
    ns = ref.namespace
    if ns is not None and ref.section is None and ns not in node.namespaces:
        in_namespace = _child(node, namespace_ref(ns))
        if in_namespace is None:
            return None
        node = in_namespace
    return _child(node, ref)


# ---------------------------------------------------------------------------------------------
# locations and precedence


def _segment_prefix(prefix: str, path: str) -> bool:
    """PathPrefix semantics: `/abc` matches `/abc`, `/abc/`, `/abc/d`, not `/abcd`."""
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def _locations(vh: VirtualHost, rules: list[MatchRule]) -> None:
    """Every location of a virtual host and its candidate rules, in precedence order.

    One location per Exact path and one per PathPrefix (render matches `<path>/` so a prefix
    location is segment-wise). A request reaching the /v2 prefix location has a path under /v2, so
    every PathPrefix rule whose prefix is a segment prefix of /v2 matches it too: those are its
    fallbacks when the /v2 rules' header, query or method conditions fail (the spec's precedence is
    across all rules).

    A RegularExpression rule is a candidate of every location a path it matches can reach (see
    _regex_reach), ranked after the location's Exact rules and before its PathPrefix ones, its
    path a condition NGINX checks at run time; with such rules a virtual host has the `/` prefix
    location, so a path no Exact or PathPrefix rule covers still reaches them.
    """
    keys: set[tuple[bool, str]] = set()
    regex = False
    for r in rules:
        if r.action.path_type == REGULAR_EXPRESSION:
            regex = True
        else:
            keys.add((r.action.path_type == "Exact", r.action.path_value))
    reach: dict[tuple[bool, str], set[int]] = {}
    if regex:
        keys.add((False, "/"))
        reach = _regex_reach([r for r in rules if r.action.path_type == REGULAR_EXPRESSION], keys)
    ordered = sorted(rules, key=MatchRule.precedence)
    for exact, path in sorted(keys):
        if regex:
            got = reach.get((exact, path), _NO_IDS)
            cands = [r for r in ordered if (exact and r.action.path_type == "Exact" and r.action.path_value == path)
                     or (r.action.path_type == REGULAR_EXPRESSION and id(r) in got)
                     or (r.action.path_type == "PathPrefix" and _segment_prefix(r.action.path_value, path))]
        else:  # the common case, kept as cheap as before regex paths
            cands = [r for r in ordered if (exact and r.action.path_type == "Exact" and r.action.path_value == path)
                     or (r.action.path_type == "PathPrefix" and _segment_prefix(r.action.path_value, path))]
        cut: list[MatchRule] = []
        for c in cands:
            cut.append(c)
            if c.unconditional:
                break
        if cut:  # only the `/` added for regex rules can be left without one (all theirs are elsewhere)
            vh.locations[(exact, path)] = Location(exact, path, cut)


_NO_IDS: set[int] = set()


def _regex_reach(regex_rules: list[MatchRule], keys: set[tuple[bool, str]]) -> dict[tuple[bool, str], set[int]]:
    """Location -> the regex rules (ids) that can match a path NGINX sends there. Every path an
    expression matches starts with its literal prefix L (pathregex.literal_prefix), so it can reach
    an Exact location P only if P starts with L, and a prefix location Q only if Q starts with L
    or Q is L's "home": the longest prefix location with L under it segment-wise (`/api` for
    `/api/v1/`, else `/`), which takes every such path that no longer location takes. A prefix
    location shorter than the home never sees one: the home (or a longer one) takes them all."""
    prefixes = sorted(p for e, p in keys if not e)
    prefix_set = set(prefixes)
    exacts = sorted(p for e, p in keys if e)
    out: dict[tuple[bool, str], set[int]] = {}
    for r in regex_rules:
        literal = pathregex.literal_prefix(r.action.path_value)
        home = "/"
        for i in range(1, len(literal)):
            if literal[i] == "/" and literal[:i] in prefix_set:
                home = literal[:i]
        out.setdefault((False, home), set()).add(id(r))
        for exact, sorted_paths in ((False, prefixes), (True, exacts)):
            for p in _starting_with(sorted_paths, literal):
                out.setdefault((exact, p), set()).add(id(r))
    return out


def _starting_with(sorted_paths: list[str], literal: str) -> list[str]:
    """The paths of a sorted list that start with `literal` (a contiguous run of it)."""
    lo = bisect.bisect_left(sorted_paths, literal)
    hi = lo
    while hi < len(sorted_paths) and sorted_paths[hi].startswith(literal):
        hi += 1
    return sorted_paths[lo:hi]
