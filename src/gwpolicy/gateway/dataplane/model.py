"""The data plane model: what NGINX must do, as plain data (servers, virtual hosts, locations,
match rules, actions, upstreams, passthrough routes), its names and its limits.

Shape (chosen so that a reload stays cheap at 10k routes, see docs/gateway.md "Configuration
shape"): one `server` per listener (address, port, listener hostname), never one per route
hostname. Route hostnames become virtual hosts inside the listener's server, dispatched by a
`map $host` with NGINX's hostname matching (exact before the longest wildcard), and each virtual
host's paths are `location`s under a per-host URI prefix (`/_v<id>`), so NGINX's location tree
does the Exact/longest-prefix choice. Header, query and method matches, the fallback from a
longer prefix whose conditions fail to a shorter one, and RegularExpression paths (a condition on
the path, ranked between Exact and PathPrefix) are in each location's candidate list, sorted by
the spec's precedence (order.py; render.py makes it a `map`).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gwpolicy.engine.refs import Ref

DEFAULT_CONTROLLER_NAME = "gwpolicy.io/gateway-controller"


DEFAULT_ADDRESS_POOL = "127.0.1.0/24"


SERVICE_NAME_LABEL = "kubernetes.io/service-name"


#: who made an EndpointSlice: the gateway trusts only the EndpointSlice controller's (from the
#: Service's selector and the Pods), unless DataPlaneConfig.allow_unmanaged_endpointslices
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"


ENDPOINTSLICE_CONTROLLER = "endpointslice-controller.k8s.io"


POLICY_GROUP = "gwpolicy.io"  # the kinds this data plane enforces (policyconf.GROUP)


def spec_key(group: str, kind: str) -> str:
    """A policy kind's key among a path's effective specs: our kinds by name, others' with their group."""
    return kind if group == POLICY_GROUP else f"{group}/{kind}"


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
    any_address: bool = False  # spec.addresses may name any IP address or hostname (facts.Facts.any_address)
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
    #: host:port of the span relay NGINX logs sampled requests to (gateway/tracing.py)
    trace_relay: str = "127.0.0.1:5140"


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
    lines: tuple[str, ...] = ()  # from policies.upstream_directives
    server_params: str = ""
    peer_copies: int = 1
    keepalive: bool = False
    tls: Any = None  # backendtls.TLSProfile: NGINX talks TLS to it (one profile per upstream)
    close: bool = False  # no keep-alive pool: locations proxying to it send Connection: close


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
    literal prefix can reach (see place_locations)."""

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
    family: str = "dual"  # its Gateway's NginxProxy ipFamily: the endpoints its routes send to


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
    #: Gateway -> the telemetry exporter its NginxProxy configures (nginxproxy.Exporter); only
    #: their routes are traced (gateway/tracing.py)
    exporters: dict[Ref, Any] = field(default_factory=dict)
    #: Gateway -> the server-block lines of its NginxProxy (nginxproxy.server_lines)
    server_lines: dict[Ref, tuple[str, ...]] = field(default_factory=dict)
    #: Gateway -> every address it is served on, `addresses`' first (addresses.listen_addresses)
    listen: dict[Ref, tuple[str, ...]] = field(default_factory=dict)


def server_id(namespace: str | None, gateway: str, listener: str) -> str:
    """A server's id, from what identifies it (its Gateway and listener), so that adding, removing
    or editing another listener leaves it (and the BuildCache entries of its routes, which key on
    it) as it was. `[A-Za-z0-9_]` only, as NGINX variable names (`$gw_vh_<id>`) need; the readable
    slugs can meet (`a-b` and `a_b`), so a digest of the exact names ends it: two servers of one
    data plane get one id only if SHA-256 collides on 48 bits, which _Builder.build checks."""
    digest = hashlib.sha256(f"{namespace or ''}/{gateway}/{listener}".encode()).hexdigest()[:12]
    return f"s_{slug(namespace)}_{slug(gateway)}_{slug(listener)}_{digest}"


def _digest(*parts: object) -> str:
    """48 bits of SHA-256 over the exact parts (their repr: one-to-one, whatever characters the
    names hold). Every generated name that comes from object names carries one, so names whose
    readable slugs meet (`team`/`x-api` and `team-x`/`api`) stay apart; _Builder raises if two
    different keys ever give one name."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def action_id(server: str, route: Ref, rule: int, match: int) -> str:
    """The id of one match of one rule of one route through one listener's server."""
    if route.kind == "GRPCRoute":  # a GRPCRoute and an HTTPRoute may have one name
        return f"{server}_g_{slug(route.namespace)}_{slug(route.name)}_{_digest(route.kind, route.namespace, route.name)}_r{rule}_m{match}"
    return f"{server}_{slug(route.namespace)}_{slug(route.name)}_{_digest(route.namespace, route.name)}_r{rule}_m{match}"


def upstream_base(namespace: str, name: str, port: int) -> str:
    """The readable, one-to-one part of the name of a Service port's upstreams (`_upstream` adds
    what tells its settings and TLS apart)."""
    return f"{slug(namespace)}_{slug(name)}_{port}_{_digest(namespace, name, port)}"


def tls_upstream_name(namespace: str, name: str, port: int) -> str:
    """The stream upstream of a TLSRoute backend (a Service port)."""
    return f"tls_{slug(namespace)}_{slug(name)}_{port}_{_digest(namespace, name, port)}"


def client_ca_path(namespace: str, gateway: str, port: int) -> str:
    """The file of the CA bundle an HTTPS port of a Gateway checks client certificates against."""
    return f"tls/clientca_{slug(namespace)}_{slug(gateway)}_{port}_{_digest(namespace, gateway, port)}.pem"


def address_key(address: str) -> str:
    """An address as a short name part, one-to-one (the packed bytes in hex; `::ffff:1.2.3.4` and
    `::ffff:1:2:3:4` slug alike)."""
    try:
        return ipaddress.ip_address(address).packed.hex()
    except ValueError:
        return _digest(address)


def hostport(address: str, port: int) -> str:
    """address:port as NGINX's `listen` takes it (an IPv6 address in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@functools.lru_cache(maxsize=65536)
def slug(text: str | None) -> str:
    return "".join(c if c.isalnum() else "_" for c in (text or ""))


def as_dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []
