"""Which listeners of one Gateway conflict: one rule, read by status (gateway/status.py) and the data
plane (gateway/dataplane.py), so that what status calls Conflicted is what NGINX does not serve.

Pure. Gateway API ("Handling indistinct Listeners" in the Gateway CRD): an implementation MUST
NOT pick one conflicting listener as the winner; ALL of them are not accepted, and a conflicted
listener's port "should not be configured". So every listener of a conflict is Conflicted, the
earlier one as much as the later (NGF does the same for listeners of one Gateway):

- `ProtocolConflict`: a port whose listeners use more than one protocol, except HTTPS with TLS
  passthrough (this data plane serves those two behind one stream server): HTTP cannot share a
  port with HTTPS or TLS, so every listener of that port is conflicted;
- `HostnameConflict`: otherwise, listeners of one port with the same hostname (none counts as one
  hostname, and an HTTPS and a TLS listener's equal names too: SNI cannot tell them apart).

Only listeners that are otherwise valid take part (a TCP listener this gateway does not serve does
not conflict with anything, as the CRD says for implementations without TCP): those status accepts
on their own (`takes_part`), which includes an HTTPS listener's client-certificate validation (one
without a valid CA is not Accepted, NoValidCACertificate, and conflicts with nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PROTOCOL_CONFLICT = "ProtocolConflict"
HOSTNAME_CONFLICT = "HostnameConflict"
SHARED_PROTOCOLS = frozenset({"HTTPS", "TLS"})  # one port, behind the stream server (TLS passthrough)


@dataclass(frozen=True)
class Candidate:
    """A listener that is valid on its own: name, port, protocol, hostname ("" for none)."""

    name: str
    port: int
    protocol: str
    hostname: str = ""


@dataclass(frozen=True)
class Conflict:
    reason: str  # PROTOCOL_CONFLICT | HOSTNAME_CONFLICT
    message: str


def conflicts(listeners: Iterable[Candidate]) -> dict[str, Conflict]:
    """Listener name -> its conflict, for every listener in one (none picked as the winner)."""
    by_port: dict[int, list[Candidate]] = {}
    for c in listeners:
        by_port.setdefault(c.port, []).append(c)
    out: dict[str, Conflict] = {}
    for port, group in by_port.items():
        protocols = {c.protocol for c in group}
        if len(protocols) > 1 and protocols != SHARED_PROTOCOLS:
            uses = "; ".join(f"{p}: {', '.join(c.name for c in group if c.protocol == p)}" for p in sorted(protocols))
            conflict = Conflict(PROTOCOL_CONFLICT, f"Port {port} is used with more than one protocol ({uses}); "
                                                   "HTTP cannot share a port with HTTPS or TLS, so none of these "
                                                   "listeners is served.")
            for c in group:
                out[c.name] = conflict
            continue
        by_hostname: dict[str, list[Candidate]] = {}
        for c in group:
            by_hostname.setdefault(c.hostname.lower(), []).append(c)
        for hostname, same in by_hostname.items():
            if len(same) > 1:
                conflict = Conflict(HOSTNAME_CONFLICT, f"Listeners {', '.join(c.name for c in same)} have port {port} "
                                                       f"and hostname {hostname or '(none)'} in common, so none of "
                                                       "them is served.")
                for c in same:
                    out[c.name] = conflict
    return out


def takes_part(gw: Any, listener: dict[str, Any], index: Any, grants: Any) -> bool:
    """Does this listener of `gw` take part in conflicts: does status accept it on its own
    (`status._listener`, before conflicts are looked for)? Status applies the rule to the facts it
    makes; the data plane asks it here for the listeners it would serve, so `gwpolicy render` (the
    objects as they are, no status view) finds the conflicts status finds."""
    from gwpolicy.gateway.status import _listener  # status imports this module

    return bool(_listener(gw, listener, index, grants).accepted.status)
