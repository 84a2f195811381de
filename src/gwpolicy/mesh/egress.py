"""The egress port of a client namespace's proxy: its requests to hosts outside the cluster, with the
policies that target those hosts (gwpolicy's virtual kind ExternalService, M9 of docs/semantics.md;
docs/mesh.md, "External services").

The port is an HTTP forward proxy: a workload sets `http_proxy`/`HTTP_PROXY` to it, and its client
then sends every plain-HTTP request there with an absolute URI (`GET http://api.example.com/v1
HTTP/1.1`, RFC 9112 3.2.2), from which NGINX takes the host (`$host`) and picks the server:

- every host an ExternalService of the input names gets a server of its own. Its location carries
  the effective policies of requests from the client namespace to that host (`effective_from`, the
  engine's mesh paths), written by the gateway's own policy generators (gateway/policies), and its
  upstreams list the host's addresses on each egress port (`EgressConfig.ports`), as often as a
  RetryPolicy's attempts need (NGINX tries each listed server once). A port of such a host that is
  not an egress port is refused (403): no upstream of it exists, and passing it on would leave the
  host's policies out;
  Of a host's addresses, those the gateway would never take as a Service's endpoint are left out
  (link-local: cloud metadata; multicast, unspecified; loopback unless the proxy allows loopback
  endpoints; `endpoint_problem`);
- every other host is passed through unchanged, to the URI's host and port, through NGINX's resolver
  (the nameservers of /etc/resolv.conf), as a forward proxy does;
- a request without an absolute `http://` URI (an origin-form request, an `https://` URI) gets 400;
  so does `CONNECT` (NGINX 1.22 cannot tunnel), before any configuration is read. A URI naming the
  proxy itself cannot loop: NGINX sends every request on in origin form, which the proxy refuses.

Addresses. NGINX 1.22 resolves an upstream's `server` names once, when it loads the configuration, and
refuses the whole configuration when one does not resolve. So the proxy process resolves the hosts
(`resolve`: getaddrinfo, which reads /etc/hosts and asks DNS as every program of the pod does),
keeps the answers in `HostAddresses`, and renders addresses; it resolves them again every few seconds
and renders anew when an answer changes (mesh/proxy.py). Rendering itself is pure: it reads the
addresses known and records the hosts it asked for (`HostAddresses.asked`); a host without an answer
yet answers 502.

Hostnames are tenants' text: a host reaches the configuration only when it is an RFC 1123 hostname
(`is_hostname`, checked here again whatever the engine did), and then only through the quoting helpers
(conftext.quote) or inside a generated name made of its own characters.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.mesh import EXTERNAL_GROUP, EXTERNAL_KIND, effective_from
from gwpolicy.engine.names import is_subdomain
from gwpolicy.engine.refs import Ref
from gwpolicy.gateway import policies, policyconf
from gwpolicy.gateway.conftext import RenderError, comment, joined, quote
from gwpolicy.gateway.dataplane.cache import programmable
from gwpolicy.gateway.dataplane.model import DataPlaneConfig, endpoint_problem, hostport, spec_key

#: where the egress port listens unless told otherwise (3128: the usual port of an HTTP proxy)
DEFAULT_LISTEN = ("127.0.0.1", 3128)
#: the ports of an ExternalService's host the proxy makes upstreams for unless told otherwise
DEFAULT_PORTS = (80,)
#: at most this many addresses of one host are used (in address order)
MAX_ADDRESSES = 16
#: at most this many nameservers for the pass-through (as glibc reads resolv.conf)
MAX_NAMESERVERS = 3
#: what the proxy adds to `Via` (RFC 9110 7.6.3)
VIA = "1.1 gwpolicy-egress"


@dataclass
class HostAddresses:
    """The addresses of the ExternalService hosts, as the proxy process last resolved them, and the
    hosts the last rendering asked for (the proxy resolves those)."""

    known: dict[str, tuple[str, ...]] = field(default_factory=dict)
    asked: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """The hosts asked for that were never resolved."""
        return [h for h in self.asked if h not in self.known]


@dataclass(frozen=True)
class EgressConfig:
    """The egress port of a proxy: where it listens, the ports of each ExternalService's host it
    serves, the nameservers of the pass-through, the addresses of the hosts."""

    listen: tuple[str, int] = DEFAULT_LISTEN
    ports: tuple[int, ...] = DEFAULT_PORTS
    nameservers: tuple[str, ...] = ()
    addresses: HostAddresses = field(default_factory=HostAddresses)
    allow_loopback: bool = False  # a host's loopback addresses are used (tests, demos)


def is_hostname(name: object) -> bool:
    """An RFC 1123 hostname, lower case: DNS-1123 labels of at most 63 characters, joined by dots,
    at most 253 in all (a DNS-1123 subdomain whose labels are no longer than DNS allows)."""
    return is_subdomain(name) and all(len(label) <= 63 for label in str(name).split("."))


# ---------------------------------------------------------------------------------------------
# I/O at the edge: the proxy process calls these (mesh/proxy.py), rendering never does

def resolve(host: str) -> tuple[str, ...]:
    """The host's IPv4 and IPv6 addresses as the system resolves them (getaddrinfo), in address
    order, at most MAX_ADDRESSES; () when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and "%" not in str(sockaddr[0]):  # NGINX takes no scope
            try:
                found.add(ipaddress.ip_address(sockaddr[0]))
            except ValueError:
                continue
    return tuple(str(a) for a in sorted(found, key=lambda a: (a.version, int(a))))[:MAX_ADDRESSES]


def nameservers(path: str | Path = "/etc/resolv.conf") -> tuple[str, ...]:
    """The `nameserver` addresses of a resolv.conf (the first MAX_NAMESERVERS); () without one."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ()
    out: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                out.append(str(ipaddress.ip_address(words[1])))
            except ValueError:
                continue
    return tuple(dict.fromkeys(out))[:MAX_NAMESERVERS]


# ---------------------------------------------------------------------------------------------
# rendering (pure)

def hosts(a: Analysis) -> list[str]:
    """The hosts the input's ExternalServices name (those the engine gave mesh paths), in order."""
    mesh = a.topology.mesh
    return sorted(r.name for r in mesh.external if is_hostname(r.name)) if mesh is not None else []


def effective(a: Analysis, client: str, host: str) -> dict[str, Any]:
    """Kind -> effective spec of requests from namespace `client` to `host` (its mesh path), the
    kinds this data plane can honour in full only."""
    out: dict[str, Any] = {}
    for ep in effective_from(a, client, Ref(EXTERNAL_GROUP, EXTERNAL_KIND, None, host)):
        if ep.result.leaves:
            key = spec_key(ep.kind.group, ep.kind.kind)
            out.setdefault(key, policyconf.Effective.of(ep.result))
    return programmable(out)


def upstream_name(host: str, port: int) -> str:
    """The upstream of `host`:`port`: one-to-one (the host and the port are in it; a hostname has no
    `_`), never a gateway upstream's (those start with `u`)."""
    return f"e{hashlib.sha1(f'{host}:{port}'.encode()).hexdigest()[:5]}_{host}_{port}"


MAPS = r'''# egress port (docs/mesh.md "Requests to external services"): the absolute http:// URI of the request line
map $request $egress_authority {
    "~*^[A-Z]+ http://(?<egress_a>(?:\[[0-9a-f:.]+\]|[^\]\[/?#@: ]+)(?::[0-9]*)?)(?:[/?#]| |$)" $egress_a;
    default "";
}
map $request $egress_host {
    "~*^[A-Z]+ http://(?<egress_h>\[[0-9a-f:.]+\]|[^\]\[/?#@: ]+)(?::[0-9]*)?(?:[/?#]| |$)" $egress_h;
    default "";
}
map $request $egress_port {
    "~*^[A-Z]+ http://(?:\[[0-9a-f:.]+\]|[^\]\[/?#@: ]+):(?<egress_p>[0-9]{1,5})(?:[/?#]| |$)" $egress_p;
    default 80;
}
map $http_via $egress_via {
    "" "%(via)s";
    default "$http_via, %(via)s";
}
map $http_upgrade $egress_connection_close {
    default upgrade;
    "" close;
}
'''

GUARDS = [
    'if ($egress_authority = "") {',
    '    return 400 "gwpolicy egress: send plain-HTTP requests with an absolute http:// URI (http_proxy); '
    'https:// is not proxied";',
    "}",
]


def _headers(connection: str) -> list[str]:
    """The request headers to the host: the URI's authority as Host (RFC 9112 3.2.2), this proxy
    added to Via; nothing about the client (no X-Forwarded-*)."""
    return ["proxy_set_header Host $egress_authority;", "proxy_set_header Via $egress_via;",
            "proxy_set_header Upgrade $http_upgrade;", f"proxy_set_header Connection {connection};"]


@dataclass
class Rendered:
    """The egress port's text: http-context lines (maps, rate-limit zones), upstreams, servers."""

    http: list[str] = field(default_factory=list)
    upstreams: list[str] = field(default_factory=list)
    servers: list[str] = field(default_factory=list)


def _listen(cfg: EgressConfig) -> str:
    return hostport(cfg.listen[0], cfg.listen[1])


def _host_server(a: Analysis, client: str, host: str, cfg: EgressConfig, out: Rendered,
                 upstream_map: list[str]) -> None:
    """The server of one ExternalService's host, its upstreams and its entries in `$egress_up`."""
    eff = effective(a, client, host)
    who = ", ".join(f"{k} from {', '.join(sorted(set(getattr(v, 'origin', {}).values()))) or 'defaults'}"
                    for k, v in sorted(eff.items())) or "no policy"
    head = ["server {", f"    listen {_listen(cfg)};", f"    server_name {quote(host)};",
            "    " + comment(f"ExternalService {host} for requests from namespace {client}: {who}")]
    head += [f"    {l}" for l in GUARDS]
    usable = DataPlaneConfig(allow_loopback_endpoints=cfg.allow_loopback)
    addresses, left_out = [], []
    for x in cfg.addresses.known.get(host, ()):
        problem, shown = endpoint_problem(x, f"IPv{6 if ':' in x else 4}", usable)
        if problem is None:
            addresses.append(shown)
        else:
            left_out.append(problem)
    head += ["    " + comment(f"left out: {why}") for why in left_out]
    if not addresses:
        why = "is not resolved yet" if host not in cfg.addresses.known else \
            "has no address the proxy may use" if left_out else "does not resolve"
        out.servers.append(joined(head + ["    " + comment(f"{host} {why}"),
                                          f"    return 502 {quote(f'gwpolicy egress: {host} {why}')};", "}", "", ""]))
        return
    try:
        conf = policies.location_directives(eff or None, scope=f"egress|{host}")  # a rate-limit bucket per host
        copies = policies.retry_peer_copies(eff)
        upstreams, entries = [], []
        close = False
        for port in cfg.ports:
            name = upstream_name(host, port)
            up = policies.upstream_directives(name, eff, peer_copies=copies)
            close = close or up.close
            params = f" {up.server_params}" if up.server_params else ""
            block = [f"upstream {name} {{", "    " + comment(f"ExternalService {host} port {port}")]
            block += [f"    server {hostport(x, port)}{params};" for _ in range(max(1, copies)) for x in addresses]
            block += [f"    {l}" for l in up.lines] + ["}", "", ""]
            upstreams.append(joined(block))
            entries.append(f"    {quote(f'{host}:{port}')} {name};")
        location = list(conf.lines) + _headers("$egress_connection_close" if close else "$gw_connection")
        body = joined(head + ['    if ($egress_up = "") {',
                              '        return 403 "gwpolicy egress: not an egress port of this proxy";', "    }",
                              "    location / {", *(f"        {l}" for l in location),
                              "        proxy_pass http://$egress_up$request_uri;", "    }", "}", "", ""])
    except (RenderError, policyconf.PolicyValueError) as e:  # fail closed, as a gateway rule does
        out.servers.append(joined(head + ["    " + comment(f"ExternalService {host}: {e}"), "    return 500;", "}", "", ""]))
        return
    out.upstreams += upstreams
    upstream_map += entries
    out.http += [z.directive for z in conf.zones]
    out.servers.append(body)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return "%" not in text


def _pass_through(cfg: EgressConfig) -> str:
    """The default server: hosts no ExternalService names, sent on unchanged."""
    servers = " ".join(f"[{n}]" if ":" in n else n for n in cfg.nameservers if _is_address(n))
    resolver = [f"resolver {servers} valid=30s;", "resolver_timeout 5s;"] if servers else \
        [comment("no nameserver in resolv.conf: only IP addresses are passed through (a name answers 502)")]
    return joined(["server {", f"    listen {_listen(cfg)} default_server;",
                   "    " + comment("hosts no ExternalService names: passed through unchanged"),
                   *(f"    {l}" for l in GUARDS), "    location / {", *(f"        {l}" for l in resolver),
                   *(f"        {l}" for l in _headers("$gw_connection")),
                   "        proxy_pass http://$egress_host:$egress_port$request_uri;", "    }", "}", "", ""])


def render(a: Analysis, client: str, cfg: EgressConfig) -> Rendered:
    """The egress port of namespace `client`'s proxy (the module docstring)."""
    out = Rendered()
    named = hosts(a)
    cfg.addresses.asked = tuple(named)
    upstream_map: list[str] = []
    for host in named:
        _host_server(a, client, host, cfg, out, upstream_map)
    out.http = [MAPS % {"via": VIA}, joined(['map "$host:$egress_port" $egress_up {', *upstream_map, '    default "";', "}", "", ""]),
                *sorted(set(out.http))]
    out.servers.append(_pass_through(cfg))
    return out


def add(files: dict[str, bytes], rendered: Rendered) -> None:
    """Add the egress port to a proxy's NGINX files: its maps and rate-limit zones to maps.conf (the
    http context; the zones' names are the egress port's own, scoped by host), its upstreams and
    servers to upstreams.conf and servers.conf."""
    http = [l if l.endswith("\n") else l + "\n" for l in rendered.http]
    files["maps.conf"] = files.get("maps.conf", b"") + "".join(http).encode()
    files["upstreams.conf"] = files.get("upstreams.conf", b"") + "".join(rendered.upstreams).encode()
    files["servers.conf"] = files.get("servers.conf", b"") + "".join(rendered.servers).encode()


def config_of(listen: tuple[str, int] | None, ports: tuple[int, ...], addresses: HostAddresses,
              allow_loopback: bool = False, resolv_conf: str | Path = "/etc/resolv.conf") -> EgressConfig | None:
    """The proxy's egress configuration (None: no egress port), with resolv.conf's nameservers as it is."""
    if listen is None:
        return None
    return EgressConfig(listen, ports, nameservers(resolv_conf), addresses, allow_loopback)


def parse_listen(text: str) -> tuple[str, int] | None:
    """`ADDRESS:PORT` (an IPv6 address in brackets) or `off`; ValueError saying what is wrong."""
    if text == "off":
        return None
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not _is_address(host) \
            or (":" in host) != bracketed:
        raise ValueError(f"{text!r} is not ADDRESS:PORT (an IP address, an IPv6 one in brackets, a port 1-65535) or off")
    return str(ipaddress.ip_address(host)), int(port)


def parse_ports(text: str) -> tuple[int, ...]:
    """A comma-separated list of ports (1-65535), in order, each once; ValueError saying what is wrong."""
    out: list[int] = []
    for word in text.split(","):
        word = word.strip()
        if not word.isdigit() or not 0 < int(word) < 65536:
            raise ValueError(f"{text!r}: {word!r} is not a port (1-65535); give ports separated by commas, e.g. 80,8080")
        if int(word) not in out:
            out.append(int(word))
    return tuple(out)


__all__ = ["DEFAULT_LISTEN", "DEFAULT_PORTS", "EgressConfig", "HostAddresses", "Rendered", "add", "config_of",
           "effective", "hosts", "is_hostname", "nameservers", "parse_listen", "parse_ports", "render", "resolve",
           "upstream_name"]
