"""Upstream blocks, the split_clients entries of weighted backends, and the TLS passthrough
`stream {}` configuration (servers that route still encrypted connections by SNI)."""

from __future__ import annotations

import hashlib
from typing import Any

from gwpolicy.gateway.conftext import LineBreakError, comment, joined
from gwpolicy.gateway.dataplane import SOCKET_DIR, DataPlane
from gwpolicy.gateway.dataplane.model import hostport


def upstream_block(name: str, u: Any) -> str:
    """One `upstream {}` block (a block the final guard refuses keeps its name and sends nowhere)."""
    head = [f"upstream {name} {{", "    " + comment(f"Service {u.service.namespace}/{u.service.name} port {u.port}")]
    lines = list(head)
    params = f" {u.server_params}" if u.server_params else ""
    for _ in range(max(1, u.peer_copies)):
        for e in u.endpoints:
            host = f"[{e.address}]" if ":" in e.address else e.address
            lines.append(f"    server {host}:{e.port}{params};")
    lines += [f"    {l}" for l in u.lines]
    try:
        return joined(lines + ["}", "", ""])
    except LineBreakError as e:
        return joined(head + [f"    {comment(str(e))}", "    server 127.0.0.1:9 down;", "}", "", ""])


def split_entries(targets: list) -> list[tuple[str, str]]:
    """split_clients entries for weighted (weight, target) pairs: each share in hundredths of a
    percent, rounded down (a share that rounds to nothing is left out), the last one `*`."""
    total = sum(w for w, _ in targets)
    entries: list[tuple[str, str]] = []
    for i, (w, name) in enumerate(targets):
        if i == len(targets) - 1:
            entries.append(("*", name))
        else:
            pct = int(w * 10000 // total) / 100
            if pct > 0:
                entries.append((f"{pct:.2f}%", name))
    return entries


#: the stream upstream of connections nothing takes: its only server is down, so NGINX closes them
TLS_CLOSED = "gw_tls_closed"


def stream(dp: DataPlane) -> str:
    """TLS passthrough: per address:port a `server` that reads the ClientHello's SNI (`ssl_preread`)
    and forwards the still encrypted connection to the upstream a `map $ssl_preread_server_name`
    names (exact names before the longest wildcard, as for HTTP hosts); a name no route serves, and
    the share of a backend that cannot be reached, is closed before any byte of the backend's."""
    out = [comment("TLS passthrough (TLSRoute): NGINX never terminates these connections") + "\n",
           f"upstream {TLS_CLOSED} {{\n    server 127.0.0.1:9 down;\n}}\n\n"]
    for u in dp.stream_upstreams.values():
        out.append(upstream_block(u.name, u))
    splits: dict[str, str] = {}
    relays: dict[str, str] = {}  # target -> the unix socket of the stream server that strips PROXY for it
    for srv in dp.passthrough:
        var = f"$gw_tls_{srv.id}"
        entries = {h: tls_target(r, splits) for h, r in srv.hosts.items()}
        if srv.https_socket:  # a shared port: every connection leaves with a PROXY header, so TLSRoute
            # backends get theirs through a relay that reads it; the HTTPS servers read it themselves
            https = f"unix:{srv.https_socket}"
            for h in srv.https_names:
                entries.setdefault(h, https)  # a route's name and a listener's cannot be equal (HostnameConflict)
            entries = {h: t if t == https else relays.setdefault(t, f"unix:{SOCKET_DIR}/t{len(relays)}.sock")
                       for h, t in entries.items()}
            entries.setdefault("", https)  # other names: the HTTPS servers (their default refuses the handshake)
        default = entries.pop("", TLS_CLOSED)
        out.append(f"map $ssl_preread_server_name {var} {{\n    hostnames;\n    default {default};\n"
                   + "".join(f"    {h} {t};\n" for h, t in sorted(entries.items())) + "}\n\n")
        names = ", ".join(f"{l.namespace}/{l.name} {l.section}" for l in srv.listeners)
        out.append(joined(["server {", "    " + comment(f"Gateway listeners {names}"), f"    listen {hostport(srv.address, srv.port)};",
                            "    ssl_preread on;", f"    proxy_pass {var};"]
                           + (["    proxy_protocol on;"] if srv.https_socket else []) + ["}", "", ""]))
    for target, sock in sorted(relays.items(), key=lambda kv: kv[1]):
        out.append(joined(["server {", "    " + comment(f"relay to {target}: reads the PROXY header the shared port's server adds"),
                            f"    listen {sock} proxy_protocol;", f"    proxy_pass {target};", "}", "", ""]))
    out.extend(splits[k] for k in sorted(splits))
    return "".join(out)


def tls_target(route: Any, splits: dict[str, str]) -> str:
    """The upstream (or split_clients variable over upstreams) of a TLSRoute's backends."""
    targets = [(b.weight, b.upstream or TLS_CLOSED) for b in route.backends if b.weight > 0]
    if not targets:
        return TLS_CLOSED
    if len({t for _, t in targets}) == 1:
        return targets[0][1]
    entries = split_entries(targets)
    var = "$gw_tls_pick_" + hashlib.sha1(repr(entries).encode()).hexdigest()[:12]
    splits[var] = (f'split_clients "${{remote_addr}}${{remote_port}}${{msec}}" {var} {{\n'
                   + "".join(f"    {p} {t};\n" for p, t in entries) + "}\n")
    return var
