"""Which listeners of one Gateway conflict: one rule, read by the facts (gateway/facts.py) and the data
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
on their own, which includes a port and hostname check and an HTTPS listener's client-certificate
validation (one without a valid CA is not Accepted, NoValidCACertificate, and conflicts with
nothing). Which listeners are served at all is `status.listener_verdicts`, read by both.
"""

from __future__ import annotations

import base64
import binascii
import re
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


#: a listener hostname (lower case; the CRD's pattern): an optional leading wildcard label, then DNS labels
HOSTNAME = re.compile(r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def valid_hostname(hostname: str) -> bool:
    """Is this a listener hostname the data plane can put in `server_name` (compared lower-cased,
    as NGINX matches names)?"""
    return bool(HOSTNAME.fullmatch(hostname.lower()))


def tls_pem(secret: Any) -> bytes | None:
    """A kubernetes.io/tls Secret's certificate and key as one PEM file (`data`, base64, or
    `stringData`); None when either is missing or not PEM. Status calls a certificate ref
    resolved exactly when this gives a file and `tls_problem` finds nothing wrong with it, and the
    data plane serves this file."""
    parts = _tls_parts(secret)
    if parts is None:
        return None
    crt, key = parts
    return crt.rstrip(b"\n") + b"\n" + key.rstrip(b"\n") + b"\n"


def tls_problem(secret: Any) -> str | None:
    """Why NGINX would refuse a Secret that `tls_pem` reads (a certificate that does not parse, a
    key that is not the certificate's), or None (gateway/pem.py parses them with `cryptography`)."""
    from gwpolicy.gateway.pem import key_pair_problem

    parts = _tls_parts(secret)
    return None if parts is None else key_pair_problem(*parts)


def _tls_parts(secret: Any) -> tuple[bytes, bytes] | None:
    raw = secret.raw
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    string = raw.get("stringData") if isinstance(raw.get("stringData"), dict) else {}
    try:
        crt = base64.b64decode(data["tls.crt"], validate=True) if "tls.crt" in data else str(string.get("tls.crt", "")).encode()
        key = base64.b64decode(data["tls.key"], validate=True) if "tls.key" in data else str(string.get("tls.key", "")).encode()
    except (binascii.Error, TypeError, ValueError):
        return None
    if b"-----BEGIN CERTIFICATE-----" not in crt or b"PRIVATE KEY-----" not in key:
        return None
    return crt, key
