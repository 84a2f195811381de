"""Hostnames and addresses: which hostnames a route serves under a listener, and the address each
Gateway is served on (from its spec, its status, or the configured pool)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from gwpolicy.engine.refs import Ref
from gwpolicy.gateway.dataplane.model import DataPlaneConfig, DataPlaneError
from gwpolicy.gateway.listeners import HOSTNAME
from gwpolicy.gateway.nginxproxy import address_family, family_allows


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


def gateway_addresses(gateways: list[Any], config: DataPlaneConfig,
                      families: Mapping[Ref, str] | None = None) -> dict[Ref, str]:
    """Each Gateway's address: the config's, else its first `spec.addresses` IPAddress of a family
    its `families` entry (NginxProxy ipFamily, default dual) allows, else the one in its status
    (kept across restarts) unless another Gateway holds it already (a status written from an
    allocation that has moved on since), else the lowest free one of the pool, in Gateway order;
    an `ipv6` Gateway without an IPv6 address of its own gets `::1`, the one IPv6 loopback address
    (a wildcard config address becomes `::`)."""
    out: dict[Ref, str] = {}
    pending = []
    held = {config.addresses[gw.ref] for gw in gateways if gw.ref in config.addresses}
    for gw in gateways:
        family = (families or {}).get(gw.ref, "dual")
        addr = config.addresses.get(gw.ref)
        if addr in _WILDCARDS and family == "ipv6":
            addr = "::"
        addr = addr or _spec_address(gw, family)
        if not addr and family == "ipv6":
            addr = "::1"
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


def listen_addresses(gw: Any, primary: str, family: str) -> tuple[str, ...]:
    """Every address NGINX listens on for a Gateway, its `primary` (gateway_addresses) first: a
    `dual` Gateway listens on the first `spec.addresses` IPAddress of each family (on both
    wildcards, `0.0.0.0` and `::`, when the primary is a wildcard); any other on its primary only."""
    if family != "dual":
        return (primary,)
    if primary in _WILDCARDS:
        return (primary, "::") if primary == "0.0.0.0" else (primary,)
    out = [primary]
    for fam in ("ipv4", "ipv6"):
        got = _spec_address(gw, fam)
        if got and got not in out and address_family(primary) != fam:
            out.append(got)
    return tuple(out)


_WILDCARDS = ("0.0.0.0", "::", "")


def reserved(reserved: Mapping[tuple[str, int], str], address: str, port: int) -> str | None:
    """What holds `address:port` already, of `reserved`: the same port on the same address or on a
    wildcard (a wildcard listener meets every address)."""
    for (held_address, held_port), what in reserved.items():
        if held_port == port and (held_address == address or held_address in _WILDCARDS or address in _WILDCARDS):
            return what
    return None


def _spec_address(gw: Any, family: str = "dual") -> str | None:
    spec = gw.spec if isinstance(gw.spec, dict) else {}
    for a in spec.get("addresses") or []:
        if isinstance(a, dict) and a.get("type", "IPAddress") == "IPAddress" and isinstance(a.get("value"), str) \
                and family_allows(family, address_family(a["value"])):
            return a["value"]
    return None


def _status_address(gw: Any) -> str | None:
    status = gw.raw.get("status") if isinstance(gw.raw.get("status"), dict) else {}
    for a in status.get("addresses") or []:
        if isinstance(a, dict) and a.get("type", "IPAddress") == "IPAddress" and isinstance(a.get("value"), str):
            try:
                if ipaddress.ip_address(a["value"]).is_loopback and ipaddress.ip_address(a["value"]).version == 4:
                    return a["value"]
            except ValueError:
                continue
    return None
