"""DataPlane -> NGINX configuration files: `render(dataplane) -> {relative path: bytes}`.

Deterministic (sorted, no clock), so an unchanged cluster renders byte-identical files and the
process layer can skip the reload. Paths inside are relative to the directory the files are
written to (NGINX runs with `-p` that directory); `../run` and `../logs` hold the pid, temp files
and logs outside the generation directories (see nginx.py). The quirks of NGINX 1.22 live here:
`proxy_http_version 1.1` (its default is 1.0), list directives that are not inherited once a
location sets one (so a location that changes one request header gets the full list), and
variables that need a `map`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from gwpolicy.gateway import policies, policyconf, rendergrpc, tracing
from gwpolicy.gateway.conftext import (
    EMPTY,
    TOKEN,
    RenderError,
    comment,
    conf_string,
    filters_of,
    header_name,
    joined,
    pcre_literal,
    put,
    quote,
    regex_literal,
    request_headers,
    response_header_directives,
)
from gwpolicy.gateway.dataplane import Action, Backend, DataPlane, Location, Server, VirtualHost, memo, without_gc
from gwpolicy.gateway.dataplane.cache import programmable
from gwpolicy.gateway.dataplane.model import hostport
from gwpolicy.gateway.facts import redirect_problem
from gwpolicy.gateway.frontendtls import ALLOW_INSECURE_FALLBACK
from gwpolicy.gateway.rendermaps import chunks, match_map
from gwpolicy.gateway.renderupstreams import split_entries, stream, upstream_block

NOT_FOUND = "/_gw_404/"  # the internal location of a request no rule matches
NO_VHOST = "x"  # the map value when no route serves the Host: `/_vx/...` reaches only the 404 location

BASE_HEADERS: tuple[tuple[str, str], ...] = (
    ("Host", "$gw_host"),
    ("X-Forwarded-For", "$proxy_add_x_forwarded_for"),
    ("X-Real-IP", "$remote_addr"),
    ("X-Forwarded-Proto", "$scheme"),
    ("X-Forwarded-Host", "$host"),
    ("X-Forwarded-Port", "$gw_server_port"),
    ("Upgrade", "$http_upgrade"),
    ("Connection", "$gw_connection"),
)


@dataclass
class _State:
    maps: dict[str, str] = field(default_factory=dict)  # variable -> map block
    splits: dict[str, str] = field(default_factory=dict)
    zones: set[policies.RateZone] = field(default_factory=set)
    named: dict[str, list[str]] = field(default_factory=dict)  # per server: internal location blocks
    uri_lines: list[tuple[str, ...]] = field(default_factory=list)  # of the location being rendered
    system_ca: bool = False  # some backend verifies against the system store: its bundle goes to http
    inline: bool = False  # the rule being rendered owns its location: it may proxy there itself
    grpc: rendergrpc.Ports = field(default_factory=rendergrpc.Ports)  # the ports that carry a GRPCRoute
    exporters: dict[Any, Any] = field(default_factory=dict)  # DataPlane.exporters: whose routes are traced
    relay: str = ""  # DataPlaneConfig.trace_relay


@dataclass
class _Rendered:
    """One location as rendered: its text and what it added to the shared state."""

    candidates: tuple[Any, ...]  # the MatchRules it was rendered from (held: compared by identity)
    text: str
    maps: dict[str, str]
    splits: dict[str, str]
    zones: set[Any]
    system_ca: bool
    named: list[tuple[str, str]]  # (name, block) of the internal locations it used, in order


class RenderCache:
    """Rendered locations and upstreams, reused while they come from the same objects.

    A location's text is a function of its server's id, its virtual host's id, its path and its
    candidate MatchRules; an upstream's of its Upstream. The data plane's BuildCache hands out the
    very same MatchRule and Upstream objects for what did not change, so comparing them by identity
    finds what must be rendered again; the rest is copied, with what it added to the maps, zones
    and internal locations replayed in order (the output is the same bytes as a render without cache,
    which tests/gateway/test_gateway_inplace.py checks)."""

    def __init__(self) -> None:
        self.locations: dict[tuple[str, str, bool, str, Any], _Rendered] = {}
        self.upstreams: dict[str, tuple[Any, str]] = {}
        self.hits = 0
        self.misses = 0
        self.used: set[tuple[str, str, bool, str, Any]] = set()

    def clear(self) -> None:
        self.locations.clear()
        self.upstreams.clear()


def render(dp: DataPlane, cache: RenderCache | None = None) -> dict[str, bytes]:
    with without_gc():
        return _render(dp, cache)


def _render(dp: DataPlane, cache: RenderCache | None = None) -> dict[str, bytes]:
    st = _State(grpc=rendergrpc.ports(dp), exporters=dp.exporters, relay=dp.config.trace_relay)
    if cache is not None:
        cache.hits = cache.misses = 0
        cache.used = set()
    servers: list[str] = []
    for s in sorted(dp.servers, key=lambda s: (s.address, s.port, s.hostname == "", s.hostname, s.id)):
        servers.append(_server(s, dp, st, cache))
    defaults = _default_servers(dp, st.grpc)
    files: dict[str, bytes] = {}
    files["nginx.conf"] = _main(dp, st).encode()
    files["maps.conf"] = ("".join(st.maps[k] for k in sorted(st.maps)) + "".join(st.splits[k] for k in sorted(st.splits))).encode()
    files["upstreams.conf"] = _upstreams(dp, cache).encode()
    if cache is not None and len(cache.locations) > 2 * len(cache.used) + 1000:  # virtual hosts renumbered, paths gone
        cache.locations = {k: cache.locations[k] for k in cache.used}
    files["servers.conf"] = ("".join(servers) + defaults).encode()
    if dp.passthrough:
        files["stream.conf"] = stream(dp).encode()
    files.update(rendergrpc.files(st.grpc))
    files.update(dp.secrets)
    return dict(sorted(files.items()))


REQUEST_MAPS = '# set to 1 by the first pass of a request through the server\'s rewrite phase\nmap "" $gw_routed {\n    default "";\n}\n# the path the backend must get, if a static proxy_pass can send it exactly: the client\'s raw path\n# when NGINX\'s escaping leaves it unchanged; else NGINX\'s decoded path when escaping it gives the\n# raw path back (every %XX one NGINX would write itself, no // or dot segment); else "" (fallback)\nmap $request_uri $gw_send_path {\n    "~^(?<gw_raw>[^?%\\x00-\\x20\\"#<>\\\\\\\\^`{|}\\x7f-\\xff]*)(?:\\?.|$)" $gw_raw;\n    "~^(?![^?]*//)(?![^?]*/\\.\\.?(?:[/?]|$))(?:[^?%\\x00-\\x20\\"#<>\\\\\\\\^`{|}\\x7f-\\xff]|%(?:[01][0-9A-F]|2[0235]|3[CEF]|5[CE]|60|7[BCDF]|[89A-F][0-9A-F]))*(?:\\?.|$)" $gw_uri;\n    default "";\n}\n'


def _request_maps(st: _State) -> None:
    """$gw_routed, set once a request has its virtual host's prefix (see _server), and
    $gw_send_path, the path a static `proxy_pass` is made to send by `rewrite ^ $gw_send_path break`
    (see _proxy)."""
    put(st.maps, "$gw_routed", REQUEST_MAPS)


def _connection_maps(dp: DataPlane) -> list[str]:
    """`$gw_connection`, the Connection header to backends: `upgrade` for an upgrade request, else
    empty (HTTP/1.1 keep-alive into the upstream's pool); `close` instead for upstreams without a
    pool (UpstreamSettingsPolicy keepAlive.connections 0), so that the backend closes first."""
    closing = sorted(name for name, u in dp.upstreams.items() if u.close)
    if not closing:
        return ["map $http_upgrade $gw_connection { default upgrade; \"\" \"\"; }"]
    return [comment("$gw_up: the upstream a proxying location sets (declared here: some configurations set it nowhere)"),
            "map \"\" $gw_up { default \"\"; }",
            "map $http_upgrade $gw_connection_pooled { default upgrade; \"\" \"\"; }",
            "map $http_upgrade $gw_connection_close { default upgrade; \"\" close; }",
            "map $gw_up $gw_connection {", "    default $gw_connection_pooled;",
            *(f"    {name} $gw_connection_close;" for name in closing), "}"]


def _main(dp: DataPlane, st: _State) -> str:
    c = dp.config
    out = [comment("generated by gwpolicy from the cluster's Gateways and HTTPRoutes; do not edit") + "\n"]
    if dp.passthrough and c.stream_module:
        out.append(f"load_module {c.stream_module};  {comment('TLS passthrough listeners')}\n")
    grpc_loads, grpc_streams = rendergrpc.main_lines(dp, st.grpc)
    out += grpc_loads
    out.append(f"worker_processes {c.worker_processes};\n"
               # RegularExpression matches compiled to machine code: several times faster, a hostile
               # path or header included (docs/gateway.md "Regular expression paths")
               "pcre_jit on;\n"
               f"pid ../run/nginx.pid;\nerror_log ../logs/error.log notice;\n"
               f"worker_shutdown_timeout {c.worker_shutdown_timeout};\n\nevents {{\n    worker_connections 4096;\n}}\n\nhttp {{\n")
    http = [
        "access_log off;", "server_tokens off;", "default_type text/plain;",
        "client_body_temp_path ../run/client_body;", "proxy_temp_path ../run/proxy;",
        "fastcgi_temp_path ../run/fastcgi;", "uwsgi_temp_path ../run/uwsgi;", "scgi_temp_path ../run/scgi;",
        "server_names_hash_bucket_size 256;", "server_names_hash_max_size 65536;",
        "map_hash_bucket_size 256;", "map_hash_max_size 262144;",
        "variables_hash_bucket_size 512;", "variables_hash_max_size 65536;",
        "proxy_headers_hash_bucket_size 512;", "proxy_headers_hash_max_size 4096;",
        "",
        comment("the Host the client sent (with its port), HTTP/1.0 clients fall back to $host"),
        "map $http_host $gw_host { \"\" $host; default $http_host; }",
        *_connection_maps(dp),
        comment("the port the client connected to, also behind a TLS passthrough port's stream server (PROXY protocol)"),
        "map $proxy_protocol_server_port $gw_server_port { \"\" $server_port; default $proxy_protocol_server_port; }",
        "",
        comment("NGINX 1.22 talks HTTP/1.0 to backends unless told otherwise"),
        "proxy_http_version 1.1;",
    ]
    http += [f"proxy_set_header {n} {v};" for n, v in BASE_HEADERS]
    if st.system_ca:
        from gwpolicy.gateway.backendtls import SYSTEM_CA_FILE

        http += ["", comment("backends verified against the system store share one SSL context"),
                 f"proxy_ssl_trusted_certificate {SYSTEM_CA_FILE};", "proxy_ssl_verify_depth 4;"]
    if dp.exporters:
        http += ["", comment("ObservabilityPolicy tracing: sampled requests logged to the gateway's span relay")]
        http += list(tracing.HTTP_LINES)
    zones = policies.http_directives(st.zones)
    if zones:
        http += [""] + zones
    http += ["", "include maps.conf;", "include upstreams.conf;", "include servers.conf;",
             comment("the process layer adds its generation probe here"), "include control*.conf;"]
    out.extend(f"    {l}\n" if l else "\n" for l in http)
    out.append("}\n")
    streams = (["include stream.conf;"] if dp.passthrough else []) + grpc_streams
    if streams:
        out.append("\nstream {\n" + "".join(f"    {l}\n" for l in streams) + "}\n")
    return "".join(out)


def _upstreams(dp: DataPlane, cache: RenderCache | None = None) -> str:
    out = []
    for name, u in dp.upstreams.items():
        if cache is not None:
            hit = cache.upstreams.get(name)
            if hit is None or hit[0] is not u:
                hit = cache.upstreams[name] = (u, upstream_block(name, u))
            out.append(hit[1])
        else:
            out.append(upstream_block(name, u))
    if cache is not None and len(cache.upstreams) > 2 * len(dp.upstreams) + 1000:
        cache.upstreams = {n: cache.upstreams[n] for n in dp.upstreams}
    return "".join(out)


def _default_servers(dp: DataPlane, grpc: rendergrpc.Ports) -> str:
    """Per address:port without a hostless listener: a server that answers 404 (HTTPS: refuses the
    handshake, there is no certificate for an unknown name)."""
    bound: dict[tuple[str, int], list[Server]] = {}
    for s in dp.servers:
        bound.setdefault((s.address, s.port), []).append(s)
    out = []
    for (addr, port), ss in sorted(bound.items()):
        if any(s.hostname == "" for s in ss):
            continue
        ssl = ss[0].protocol == "HTTPS"
        sock = ss[0].socket
        listen = rendergrpc.listen_lines(addr, port, sock, ssl, True, grpc)
        out.append(f"server {{\n    {comment(f'no listener without hostname on {addr}:{port}: unknown hosts get 404')}\n"
                   + ("".join(l + "\n" for l in listen) if listen else
                      f"    listen {_listen(addr, port, sock)} default_server{' ssl' if ssl else ''}{' proxy_protocol' if sock else ''};\n")
                   + "".join(l + "\n" for l in (_behind_stream(addr, port) if sock else []))
                   + ("    ssl_reject_handshake on;\n" if ssl else "") + "    return 404;\n}\n\n")
    return "".join(out)


def _listen(address: str, port: int, socket: str | None) -> str:
    return f"unix:{socket}" if socket else hostport(address, port)


def _behind_stream(address: str, port: int) -> list[str]:
    """An HTTPS server behind a passthrough port's stream server: the client's address comes in the
    PROXY protocol header (rate limits, X-Forwarded-For and X-Real-IP see the client, not the socket)."""
    return ["    " + comment(f"{address}:{port} is shared with TLS passthrough listeners: the stream server hands this"),
            "    " + comment("server the connections whose SNI is not a TLSRoute's, with the client's address"),
            "    set_real_ip_from unix:;", "    real_ip_header proxy_protocol;"]


def _server(s: Server, dp: DataPlane, st: _State, cache: RenderCache | None = None) -> str:
    hostless = s.hostname == ""
    listen = rendergrpc.listen_lines(s.address, s.port, s.socket, s.protocol == "HTTPS", hostless, st.grpc)
    lines = ["server {", "    " + comment(f"Gateway {s.gateway.namespace}/{s.gateway.name} listener {s.listener.section}"),
             *(listen or [f"    listen {_listen(s.address, s.port, s.socket)}{' default_server' if hostless else ''}"
                          f"{' ssl' if s.protocol == 'HTTPS' else ''}{' proxy_protocol' if s.socket else ''};"]),
             f"    server_name {s.hostname or EMPTY};"]
    # its NginxProxy's (gateway/nginxproxy.py); behind a stream server (a TLS passthrough port, or
    # cleartext HTTP/2 for a GRPCRoute) the client's address is the PROXY protocol's, so
    # rewriteClientIP does not apply there
    behind = bool(s.socket) or any("proxy_protocol" in l for l in listen or [])
    lines += [f"    {l}" for l in dp.server_lines.get(s.gateway, ()) if not (behind and "real_ip" in l)]
    if s.socket:
        lines += _behind_stream(s.address, s.port)
    if s.certificate:
        lines += [f"    ssl_certificate {s.certificate};", f"    ssl_certificate_key {s.certificate};"]
    if s.client_ca:
        lines += _client_verification(s)
    var = f"$gw_vh_{s.id}"
    entries = [f"    {v.hostname} {v.id};" for v in s.vhosts if v.hostname]
    default = next((v.id for v in s.vhosts if v.hostname == ""), NO_VHOST)
    put(st.maps, var, f"map $host {var} {{\n    hostnames;\n    default {default};\n" + "".join(e + "\n" for e in entries) + "}\n")
    _request_maps(st)
    lines += ["    " + comment("every URI gets its virtual host's prefix and a trailing slash: locations below match on"),
              "    " + comment("/_v<host><path>/, so one prefix location /_v<host><prefix>/ is a segment-wise PathPrefix;"),
              "    " + comment("once per request: internal redirects and subrequests keep the request's variables"),
              "    if ($gw_routed = \"\") {", "        set $gw_uri $uri;", f"        rewrite ^ /_v{var}$uri/;", "    }",
              "    set $gw_routed 1;", "", "    location / {", "        return 404;", "    }"]
    head = joined(lines)  # the Gateway's own text: a line break there fails the whole render
    st.named[s.id] = []
    named_done: set[str] = set()
    # in NGINX's own location order: it sorts them with an insertion sort, so any other order costs
    # it quadratic time (24k locations: 11 s of `nginx -t` unsorted, a fraction of a second sorted)
    blocks = []
    for v in s.vhosts:
        for loc in v.locations.values():
            uri = _location_uri(v, loc)
            blocks.append(((uri.replace("/", "\0"), 0 if loc.exact else 1), v, loc))
    blocks.sort(key=lambda b: b[0])
    located = []
    for _, v, loc in blocks:
        located.append(_location(s, v, loc, st, named_done) if cache is None else _location_cached(s, v, loc, st, named_done, cache))
    # the internal locations (/_gw_...) sort before every /_v... one: NGINX's order again
    internal = sorted(st.named[s.id] + [joined(["    location = /_gw_404/ {", "        internal;", "        return 404;", "    }"])],
                      key=lambda b: b.split("{", 1)[0].split()[-1].replace("/", "\0"))
    lines = [head] + internal + located
    if s.client_ca and s.client_mode != ALLOW_INSECURE_FALLBACK:
        lines += ["    location @gw_client_certificate_refused {", "        return 444;", "    }"]
    lines.append("}\n")
    return "\n".join(lines) + "\n"


def _client_verification(s: Server) -> list[str]:
    """Frontend client-certificate validation (GEP-91) of an HTTPS listener's server.

    NGINX completes the handshake whatever the client presents and answers 400 over HTTP (its
    internal 495/496) when the certificate is missing or not signed by the CA; Gateway API clients
    expect the connection to fail instead, so those two codes go to a location that closes the
    connection without a response (444). `AllowInsecureFallback` asks for a certificate and
    lets every client in (`optional_no_ca`), leaving the decision to the backend. NGINX picks the
    SSL settings by SNI and the server by Host, and answers 421 when the two differ on a server
    that verifies clients, so a certificate checked for one listener is never taken to another."""
    if s.client_mode == ALLOW_INSECURE_FALLBACK:
        return [f"    ssl_client_certificate {s.client_ca};", "    ssl_verify_client optional_no_ca;", "    ssl_verify_depth 4;"]
    return [f"    ssl_client_certificate {s.client_ca};", "    ssl_verify_client on;", "    ssl_verify_depth 4;",
            f"    {comment('495: the certificate does not verify, 496: none was sent')}",
            "    error_page 495 496 = @gw_client_certificate_refused;"]


def _location_cached(s: Server, v: VirtualHost, loc: Location, st: _State, named_done: set[str],
                     cache: RenderCache) -> str:
    """_location, or the text it gave for the same candidates, with its additions to `st` replayed."""
    key = (s.id, v.id, loc.exact, loc.path, st.exporters.get(s.gateway))  # the exporter: whether it is traced
    cache.used.add(key)
    got = cache.locations.get(key)
    cands = loc.candidates
    if got is None or len(got.candidates) != len(cands) or any(x is not y for x, y in zip(got.candidates, cands)):
        cache.misses += 1
        sub = _State(exporters=st.exporters, relay=st.relay)
        sub.named[s.id] = []
        text = _location(s, v, loc, sub, set())
        named = [(block.split("{", 1)[0].split()[-1], block) for block in sub.named[s.id]]  # `location [=] <name> {`
        got = cache.locations[key] = _Rendered(tuple(cands), text, sub.maps, sub.splits, sub.zones, sub.system_ca, named)
    else:
        cache.hits += 1
    st.maps.update(got.maps)
    st.splits.update(got.splits)
    st.zones |= got.zones
    st.system_ca = st.system_ca or got.system_ca
    mine = st.named[s.id]
    for name, block in got.named:
        if name not in named_done:
            named_done.add(name)
            mine.append(block)
    return got.text


def _location_uri(v: VirtualHost, loc: Location) -> str:
    """What the location matches: /_v<host><path>/ (see _server)."""
    return f"/_v{v.id}{loc.path}/" if loc.exact else f"/_v{v.id}{loc.path.rstrip('/')}/"


def _location(s: Server, v: VirtualHost, loc: Location, st: _State, named_done: set[str]) -> str:
    prefix = f"/_v{v.id}"
    uri = _location_uri(v, loc)
    if rendergrpc.is_grpc(loc):
        st.uri_lines = []
        return rendergrpc.render_location(s, v, loc, uri, st, named_done, _uri_lines)
    if not re.fullmatch(r"[A-Za-z0-9/._~%-]+", uri):
        uri = conf_string(uri)
    head = f"    location {'= ' if loc.exact else ''}{uri} {{"
    first = loc.candidates[0]
    st.uri_lines = []
    try:
        if first.unconditional:
            st.inline = True
            try:
                body = _action(s, first.action, prefix, st, named_done)
            finally:
                st.inline = False
            # the rule's own lines, when it proxies here, hold what _uri_lines would repeat
            own = {l.split()[0] for l in body if l.strip()}
            body = [comment(_who(first.action))] + [l for l in _uri_lines(st.uri_lines)
                                                    if l.startswith("#") or l.split()[0] not in own] + body
            return joined([head] + [f"        {l}" for l in body] + ["    }"])
        targets = [(c, _named_action(s, c.action, prefix, st, named_done)) for c in loc.candidates]
        var = ""
        for chunk in reversed(chunks([(c.method, c.headers, c.query, t, c.regex) for c, t in targets])):
            default = NOT_FOUND if not var else _shared(s, _jump(var), f"{_who(first.action)}: the next {len(chunk)} rules",
                                                        st, named_done, "c")
            var = match_map(chunk, st.maps, default)
        uri_lines = [f"        {l}" for l in _uri_lines(st.uri_lines)]
        return joined([head, "        " + comment(f"{len(targets)} rules, in precedence order: {var} names the first that matches")]
                       + uri_lines + [f"        {l}" for l in _jump(var)] + ["    }"])
    except RenderError as e:  # the location fails closed (the rules' own internal locations answer 500 likewise)
        return joined([head, "        " + comment(f"{_who(first.action)}: {e}"), "        return 500;", "    }"])


_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


def _size(line: str) -> float:
    value = line.split()[1].rstrip(";").lower()
    number, unit = (value[:-1], value[-1]) if value[-1:] in "kmg" else (value, "")
    n = float(number) * _SIZE_UNITS[unit]
    return float("inf") if n == 0 else n  # 0 = no limit


def _uri_lines(collected: list[tuple[str, ...]]) -> list[str]:
    """Lines NGINX honours only in the location it selects by URI (policies.LocationConf.uri_lines:
    client_max_body_size is checked when NGINX selects a location, before the jump to the rule's
    internal location, where it is checked again). When the rules this location serves disagree,
    NGINX cannot know the rule yet: the most permissive value applies here, and the location says
    so; each rule's own location carries, and enforces, its own."""
    by_name: dict[str, set[str]] = {}
    for lines in collected:
        for l in lines:
            by_name.setdefault(l.split()[0], set()).add(l)
    if not by_name and not any(collected):
        return []
    out: list[str] = []
    for name, variants in sorted(by_name.items()):
        unset = any(not any(l.split()[0] == name for l in c) for c in collected)
        if len(variants) == 1 and not unset:
            out.extend(variants)
            continue
        if name == "client_max_body_size":
            chosen = max(variants, key=_size)
            if unset and _size(chosen) < 1024 ** 2:
                chosen = "client_max_body_size 1m;"  # NGINX's default, which the other rules have
            out += [comment(f"the rules of this location differ in {name}; NGINX checks it before it knows the rule,"),
                    comment("so the most permissive value applies here"), chosen]
    return out


def _who(a: Action) -> str:
    return f"HTTPRoute {a.route.namespace}/{a.route.name} rule {a.rule} match {a.match}"


def _named_action(s: Server, a: Action, prefix: str, st: _State, named_done: set[str]) -> str:
    st.inline = True  # the rule's own internal location proxies
    try:
        return _shared(s, _action(s, a, prefix, st, named_done), _who(a), st, named_done)
    finally:
        st.inline = False


def _shared(s: Server, body: list[str], who: str, st: _State, named_done: set[str], kind: str = "a") -> str:
    """An internal location holding `body`, one per distinct body in a server (content-addressed):
    `/_gw_<kind>_<hash>/`, which a request reaches by `rewrite ... last` (_jump). NGINX finds it in
    its location tree, where a named location would be found by walking every named one."""
    lines = [l for l in body if not l.startswith("#")]
    uri = f"/_gw_{kind}_" + hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12] + "/"
    if uri not in named_done:
        named_done.add(uri)
        st.named[s.id].append(joined([f"    location = {uri} {{", "        internal;", "        " + comment(f"first used by {who}")]
                                      + [f"        {l}" for l in body] + ["    }"]))
    return uri


def _jump(target: str) -> list[str]:
    """Hand the request on to an internal location (a URI, or a variable naming one); the request's
    URI is kept in $gw_uri and its arguments stay."""
    return [f"rewrite ^ {target} last;"]


def _weighted(backends: list[Backend]) -> list[Backend]:
    return [b for b in backends if b.weight > 0]


def _action(s: Server, a: Action, prefix: str, st: _State, named_done: set[str]) -> list[str]:
    """The directives of one rule match: policy, redirect or rewrite, headers, backend choice."""
    if a.error:
        return [comment(a.error), "return 500;"]
    try:
        lines = _action_lines(s, a, prefix, st, named_done)
        joined(lines)  # the final guard, for this rule alone
        return lines
    except (RenderError, policyconf.PolicyValueError) as e:
        return [comment(f"{_who(a)}: {e}"), "return 500;"]


def _policy_lines(eff: dict[str, dict[str, Any]], st: _State) -> tuple[list[str], int]:
    usable = programmable(eff)
    if not usable:
        st.uri_lines.append(())
        return [], 1
    conf = memo("location", usable, lambda: policies.location_directives(usable, scope=""))
    st.uri_lines.append(conf.uri_lines)
    st.zones.update(conf.zones)
    return list(conf.lines), conf.peer_copies


def _trace_lines(a: Action, eff: dict[str, dict[str, Any]], st: _State,
                 header_directive: str = "proxy_set_header") -> tuple[list[str], list[str]]:
    """ObservabilityPolicy tracing of one rule (gateway/tracing.py): (its lines, its request headers)."""
    if not st.exporters:
        return [], []
    got = tracing.action_trace(a, eff, st.exporters)
    if got is None:
        return [], []
    return tracing.location_lines(got[0], got[1], st.relay, st.splits, header_directive)


def _action_lines(s: Server, a: Action, prefix: str, st: _State, named_done: set[str]) -> list[str]:
    redirect = filters_of(a.filters, "RequestRedirect", "requestRedirect")
    rewrite = filters_of(a.filters, "URLRewrite", "urlRewrite")
    if redirect:
        return _redirect(a, redirect[0], prefix)
    cors = filters_of(a.filters, "CORS", "cors")
    preflight, cors_lines = _cors(cors[0], st) if cors else ([], [])
    live = _weighted(a.backends)
    if not live:
        return preflight + [comment("no backend to send to (none, or all of weight 0)"), "return 500;"]
    per_backend = []
    rewrites = []
    for b in live:
        # backendRefs[].filters: a RequestRedirect answers that backend's share; a URLRewrite adds to the rule's
        b_redirect = filters_of(b.filters, "RequestRedirect", "requestRedirect")
        b_rewrite = rewrite + filters_of(b.filters, "URLRewrite", "urlRewrite")
        rewrites.append(b_rewrite)
        if b_redirect:
            per_backend.append([comment("RequestRedirect of the backendRef")] + _redirect(a, b_redirect[0], prefix))
            continue
        eff = b.effective if b.path else a.effective
        pl, _ = _policy_lines(eff, st)
        traced, trace_headers = _trace_lines(a, a.effective, st)  # the rule's path: the route's policies
        hl = _header_lines(a.filters + b.filters, b_rewrite, st)
        if trace_headers and not any(l.startswith("proxy_set_header ") for l in hl):
            hl = [f"proxy_set_header {n} {v};" for n, v in BASE_HEADERS] + hl  # a location's own replace the inherited
        per_backend.append(traced + pl + hl + trace_headers + cors_lines + _tls_lines(b.tls, st))
    redirects = [p[0].startswith("# RequestRedirect") for p in per_backend if p]
    if len(live) == 1 and redirects and redirects[0]:
        return preflight + per_backend[0]
    if len(live) > 1 and (any(redirects) or any(p != per_backend[0] for p in per_backend[1:])
                          or any(r != rewrites[0] for r in rewrites[1:])):
        # backends whose own policy, filters or TLS differ: an internal location each, picked by weight
        targets = []
        for b, pl, rw in zip(live, per_backend, rewrites):
            body = pl if pl and pl[0].startswith("# RequestRedirect") else _dispatch(s, [b], pl, rw, a, prefix, st, named_done, True)
            targets.append([b.weight, _shared(s, body, f"{_who(a)} backend {b.ref.namespace}/{b.ref.name}", st, named_done)])
        return preflight + _pick(targets, st)
    return preflight + _dispatch(s, live, per_backend[0], rewrites[0], a, prefix, st, named_done, st.inline)


def _cors(c: dict[str, Any], st: _State) -> tuple[list[str], list[str]]:
    """The CORS filter: a preflight (OPTIONS with Origin and Access-Control-Request-Method) is
    answered here with 204, never sent to the backend; other requests get the allow-origin,
    credentials and expose headers on the backend's answer. An origin not allowed gets no CORS
    header at all (the variables are empty, and NGINX sends no header with an empty value)."""
    origins = [o for o in c.get("allowOrigins") or [] if isinstance(o, str)]
    patterns = []
    for o in origins:
        if o == "*":
            patterns.append("~.")
        else:
            patterns.append("~*" + "^" + ".*".join(pcre_literal(part) for part in o.split("*")) + "$")
    key = hashlib.sha1(json.dumps(c, sort_keys=True).encode()).hexdigest()[:12]
    origin = f"$gw_cors_o_{key}"
    put(st.maps, origin, f"map $http_origin {origin} {{\n" + "".join(f"    {conf_string(p)} $http_origin;\n" for p in patterns)
         + "    default \"\";\n}\n")

    def when_allowed(name: str, value: str) -> str:
        var = f"$gw_cors_{name}_{key}"
        put(st.maps, var, f"map {origin} {var} {{\n    \"\" \"\";\n    default {value};\n}}\n")
        return var

    methods = [m for m in c.get("allowMethods") or [] if isinstance(m, str)]
    headers = [h for h in c.get("allowHeaders") or [] if isinstance(h, str)]
    expose = [h for h in c.get("exposeHeaders") or [] if isinstance(h, str)]
    for h in headers + expose:
        if h != "*":
            header_name(h)
    for m in methods:
        if m != "*" and not TOKEN.fullmatch(m):
            raise RenderError(f"CORS allowMethods {m!r} is not a method")
    common = [f"add_header Access-Control-Allow-Origin {origin} always;", "add_header Vary Origin always;"]
    if c.get("allowCredentials") is True:
        common.append(f"add_header Access-Control-Allow-Credentials {when_allowed('c', 'true')} always;")
    if expose:
        common.append(f"add_header Access-Control-Expose-Headers {when_allowed('e', quote(', '.join(expose)))} always;")
    pre = list(common)
    if methods:
        value = "$http_access_control_request_method" if "*" in methods else quote(", ".join(methods))
        pre.append(f"add_header Access-Control-Allow-Methods {when_allowed('m', value)} always;")
    if headers:
        value = "$http_access_control_request_headers" if "*" in headers else quote(", ".join(headers))
        pre.append(f"add_header Access-Control-Allow-Headers {when_allowed('h', value)} always;")
    max_age = c.get("maxAge", 5)
    if isinstance(max_age, int) and not isinstance(max_age, bool):
        pre.append(f"add_header Access-Control-Max-Age {when_allowed('a', str(max_age))} always;")
    put(st.maps, "$gw_cors_preflight", "map \"$request_method\\n$http_origin\\n$http_access_control_request_method\" "
         "$gw_cors_preflight {\n    \"~^OPTIONS\\n[^\\n]+\\n[^\\n]+$\" 1;\n    default \"\";\n}\n")
    preflight = [comment("CORS: preflight requests are answered here"), "if ($gw_cors_preflight) {"] + \
        [f"    {l}" for l in pre] + ["    return 204;", "}"]
    return preflight, common


def _dispatch(s: Server, live: list[Backend], lines: list[str], rewrite: list[dict[str, Any]], a: Action,
              prefix: str, st: _State, named_done: set[str], inline: bool = False) -> list[str]:
    """The directives that send the request to its backend. Each proxying location names its
    upstream statically (`proxy_pass http://<upstream>`), so NGINX never looks an upstream up by
    name at run time (that lookup walks every upstream). One backend: the proxying lines, in the
    location itself when `inline` (an http backend: a location with an https `proxy_pass` has an
    SSL context of its own, so those are shared) or in a shared internal location; several: an
    internal location per backend, picked by weight (split_clients)."""
    if len(live) == 1 and live[0].upstream is None:
        return [comment(live[0].message), "return 500;"]
    scheme = "https" if live[0].tls is not None else "http"  # backends sharing one location share its TLS
    body = lines + _mirror_lines(s, a, prefix, st, named_done)
    if len(live) > 1:
        targets: list[list[Any]] = []
        for b in live:
            proxy = [comment(b.message), "return 500;"] if b.upstream is None else \
                _proxy(s, b.upstream, scheme, body, rewrite, a, prefix, st, named_done)
            targets.append([b.weight, _shared(s, proxy, f"{_who(a)} backend {b.ref.namespace}/{b.ref.name}", st, named_done, "p")])
        return _pick(targets, st)
    upstream = live[0].upstream
    assert upstream is not None
    proxy = _proxy(s, upstream, scheme, body, rewrite, a, prefix, st, named_done)
    if inline and scheme == "http":
        return proxy
    return _jump(_shared(s, proxy, _who(a), st, named_done, "p"))


def _proxy(s: Server, upstream: str, scheme: str, lines: list[str], rewrite: list[dict[str, Any]], a: Action,
           prefix: str, st: _State, named_done: set[str]) -> list[str]:
    """Proxy to one upstream, named statically. The request's URI has been rewritten on its way
    here; the backend gets the client's (`$gw_send_path`: the raw path whenever NGINX's escaping
    of the decoded one gives it back, which is nearly always) or, for the odd URI that does not,
    an internal location that sends `$request_uri` with a variable `proxy_pass`. A URLRewrite
    path modifier rewrites the client's path, restored from $gw_uri, and NGINX sends the result."""
    head = lines + [f"set $gw_up {upstream};"]
    if any(isinstance(r.get("path"), dict) for r in rewrite):
        return head + [f"rewrite ^ {prefix}$gw_uri/;"] + _rewrite_lines(rewrite, a, prefix) + [f"proxy_pass {scheme}://{upstream};"]
    fallback = _shared(s, head + [f"proxy_pass {scheme}://$gw_up$request_uri;"], _who(a), st, named_done, "x")
    return head + ["if ($gw_send_path = \"\") {", f"    rewrite ^ {fallback} last;", "}",
                   "rewrite ^ $gw_send_path break;", f"proxy_pass {scheme}://{upstream};"]


def _mirror_lines(s: Server, a: Action, prefix: str, st: _State, named_done: set[str]) -> list[str]:
    """RequestMirror: NGINX's `mirror` sends a background subrequest per mirror, whose answer it
    discards, from the location that proxies. A subrequest shares the request's variables, so the
    server's rewrite (once per request, see _server) leaves `/_gw_mirror_<key>` as it is: one
    internal location per server and mirror proxies
    the original URI (`$request_uri`) to the mirror's upstream, with the rule's request header
    modifications (its answer is discarded, so response ones do not matter). A share below 100% is a
    split_clients over $request_id; the copies it leaves out end at once (204, never sent)."""
    out: list[str] = []
    headers = [l for l in _header_lines(a.filters, [], st) if l.startswith("proxy_set_header ")] if a.mirrors else []
    for m in a.mirrors:
        pct = int(m.share * 10000) / 100
        if m.upstream is None or pct <= 0:
            continue
        key = hashlib.sha1("\n".join([m.upstream, f"{pct:.2f}", *headers]).encode()).hexdigest()[:12]
        out.append(f"mirror /_gw_mirror_{key};")
        where = f"/_gw_mirror_{key}"  # a subrequest keeps the request's variables: no prefix (see _server)
        if where in named_done:
            continue
        named_done.add(where)
        body = ["internal;"]
        if pct < 100:
            var = f"$gw_mirror_{key}"
            put(st.splits, var, f"split_clients $request_id {var} {{\n    {pct:.2f}% 1;\n    * \"\";\n}}\n")
            body += [f"if ({var} = \"\") {{", "    return 204;", "}"]
        body += headers + [f"proxy_pass http://{m.upstream}$request_uri;"]
        st.named[s.id].append(joined([f"    location = {where} {{",
                                       "        " + comment(f"RequestMirror of {_who(a)} to Service {m.ref.namespace}/{m.ref.name}"
                                                           f" ({pct:g}% of requests)")] + [f"        {l}" for l in body] + ["    }"]))
    return out

def _pick(targets: list[list[Any]], st: _State) -> list[str]:
    """Weighted backends that need different locations: split_clients picks the internal location."""
    entries = split_entries(targets)
    var = "$gw_pick_" + hashlib.sha1(repr(entries).encode()).hexdigest()[:12]
    put(st.splits, var, f"split_clients $request_id {var} {{\n" + "".join(f"    {p} {t};\n" for p, t in entries) + "}\n")
    return _jump(var)


def _tls_lines(tls: Any, st: _State) -> list[str]:
    """A backend's TLS lines. The system CA bundle (~150 certificates) is loaded once, in the http
    context: NGINX builds one SSL context per location that names a bundle, which cost 70 ms per
    location (7 s of `nginx -t` at 1k routes); locations that name none share the inherited one."""
    if tls is None:
        return []
    lines = tls.directives()
    if tls.ca_pem is None:
        st.system_ca = True
        lines = [l for l in lines if not l.startswith(("proxy_ssl_trusted_certificate ", "proxy_ssl_verify_depth "))]
    return lines


def _header_lines(fs: tuple[dict[str, Any], ...], rewrite: list[dict[str, Any]], st: _State) -> list[str]:
    out: list[str] = []
    req = filters_of(fs, "RequestHeaderModifier", "requestHeaderModifier")
    host = next((r.get("hostname") for r in rewrite if isinstance(r.get("hostname"), str)), None)
    if req or host:
        out += [f"proxy_set_header {n} {v};" for n, v in request_headers(BASE_HEADERS, req, st.maps, host).values()]
    out += response_header_directives(filters_of(fs, "ResponseHeaderModifier", "responseHeaderModifier"), "proxy")
    return out


def _rewrite_lines(rewrite: list[dict[str, Any]], a: Action, prefix: str, flag: str = " break") -> list[str]:
    for r in rewrite:
        p = r.get("path") if isinstance(r.get("path"), dict) else None
        if p:
            return _path_rewrite(p, a, prefix, flag)
    return []


def _path_rewrite(p: dict[str, Any], a: Action, prefix: str, flag: str) -> list[str]:
    ptype = p.get("type")
    if ptype == "ReplaceFullPath":
        new = str(p.get("replaceFullPath") or "/")
        return [f"rewrite ^ {quote(new)}{flag};"]
    if ptype == "ReplacePrefixMatch":
        # the URI here is /_v<host><path>/ (see _server): strip the prefix and the trailing slash
        new = str(p.get("replacePrefixMatch") or "/")
        matched = "" if a.path_value == "/" else a.path_value
        base = regex_literal(prefix + matched)
        stripped = new.rstrip("/")
        # the expression through conf_string: a `"` or `\\` of the path stays inside the string
        if matched == "":
            return [f"rewrite {conf_string(f'^{base}(/.*)/$')} {quote(stripped)[:-1]}$1\"{flag};"]
        return [f"rewrite {conf_string(f'^{base}/$')} {quote(new)}{flag};",
                f"rewrite {conf_string(f'^{base}(/.*)/$')} {quote(stripped)[:-1]}$1\"{flag};"]
    raise RenderError(f"{_who(a)}: path modifier type {ptype!r} is not supported")


def _redirect(a: Action, r: dict[str, Any], prefix: str) -> list[str]:
    code = r.get("statusCode", 302)
    if code not in (301, 302, 303, 307, 308):
        raise RenderError(f"{_who(a)}: requestRedirect.statusCode {code!r} is not a redirect code")
    why = redirect_problem(r)
    if why is not None:  # the data plane leaves such a rule out (status: UnsupportedValue); never write one
        raise RenderError(why)
    scheme = r.get("scheme") if isinstance(r.get("scheme"), str) else None
    port = r.get("port") if isinstance(r.get("port"), int) else None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme, 443) if scheme else a.listener_port
    out_scheme = scheme or a.scheme
    host = quote(r["hostname"])[1:-1] if isinstance(r.get("hostname"), str) else "$host"
    port_part = "" if (out_scheme, port) in (("http", 80), ("https", 443)) else f":{port}"
    lines = [comment("RequestRedirect")]
    p = r.get("path") if isinstance(r.get("path"), dict) else None
    if p:
        lines += [f"rewrite ^ {prefix}$gw_uri/;"] + _path_rewrite(p, a, prefix, "")
        target = "$uri$is_args$args"
    else:
        target = "$request_uri"
    return lines + [f"return {code} \"{out_scheme}://{host}{port_part}{target}\";"]
