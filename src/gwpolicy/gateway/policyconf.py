"""Effective policy settings -> NGINX directives, per context, and what NGINX 1.22 cannot honour.

The engine already merged every policy along one exact path (GatewayClass > Gateway > listener >
route > rule > Service > port); this module only translates that one result.  Nothing here relies
on NGINX inheritance: every location gets the full set of directives of its own path, so list
directives (`limit_req`) are never lost to NGINX's "inherit only if the lower level sets none".

Contexts:
- location: TimeoutPolicy, RetryPolicy, ClientSettingsPolicy, RateLimitPolicy (`limit_req`),
  BackendTLSPolicy (`proxy_ssl_*`, see backendtls.py);
- upstream: UpstreamSettingsPolicy, and the peer repetition that makes retries work with one endpoint;
- http: the `limit_req_zone` declarations the locations refer to (collected from every location).

Honest limits: `unsupported_fields` (and `kind_checks()` for the engine) name every field this data
plane cannot honour, unknown fields and values the translation refuses, so such a policy is Invalid
and programs nothing; the translation itself raises PolicyValueError naming kind and field rather
than writing a broken nginx.conf.  Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP = "gwpolicy.io"
VERSION = "v1alpha1"
DATA_PLANE = "the nginx-1.22 data plane"

TIMEOUT, RETRY, CLIENT, UPSTREAM, RATELIMIT = (
    "TimeoutPolicy", "RetryPolicy", "ClientSettingsPolicy", "UpstreamSettingsPolicy", "RateLimitPolicy")
BACKEND_TLS = "BackendTLSPolicy"
KINDS = (TIMEOUT, RETRY, CLIENT, UPSTREAM, RATELIMIT)

# NGINX's proxy_next_upstream can only retry these statuses.
RETRYABLE_CODES = (403, 404, 429, 500, 502, 503, 504)
RETRY_CONDITIONS = {"connect-failure": "error", "reset": "error", "timeout": "timeout",
                    "invalid-header": "invalid_header"}
DEFAULT_RETRY_ON = ("connect-failure", "reset", "timeout")
MAX_ATTEMPTS = 10
MAX_CONNECT_TIMEOUT_MS = 75_000  # the kernel's connect() limit NGINX runs into
NO_TIMEOUT_MS = 86_400_000  # what a zero duration ("no timeout") becomes for reads and writes
DEFAULT_ZONE_SIZE = "10m"


class PolicyValueError(ValueError):
    """A setting whose value cannot become a directive; the message names kind and field."""


# Field -> (directive, context, how faithful, note).  The docs, the CRD descriptions, `describe`
# and unsupported_fields() all read this one table.
ENFORCED, APPROXIMATED, UNSUPPORTED = "enforced", "approximated", "not supported"


#: what NGINX 1.22 and the per-tenant caps take (docs/gateway.md's tables and docs/security.md say
#: the same): a duration, a size, a shared memory zone (NGINX takes k and m only; below 32k, eight
#: pages, it refuses the zone) or a count; milliseconds, bytes or a number
DURATION, SIZE, ZONE, COUNT = "duration", "size", "zone", "count"
INT32_MAX = 2**31 - 1
DAY_MS = 86_400_000
KIB, MIB, GIB = 1024, 1024**2, 1024**3


@dataclass(frozen=True)
class Bounds:
    """The values a field may take: `kind` says the unit (DURATION ms, SIZE and ZONE bytes, COUNT)."""

    kind: str
    minimum: int
    maximum: int

    def describe(self) -> str:
        shows: dict[str, Callable[[int], str]] = {DURATION: _show_ms, SIZE: _show_bytes, ZONE: _show_bytes, COUNT: str}
        show = shows[self.kind]
        if self.kind == DURATION and self.minimum == 0:
            return f"at most {show(self.maximum)}"
        return f"{show(self.minimum)} to {show(self.maximum)}"


def _show_ms(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _show_bytes(n: int) -> str:
    for unit, size in (("g", GIB), ("m", MIB), ("k", KIB)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


@dataclass(frozen=True)
class FieldInfo:
    directive: str
    context: str
    support: str
    note: str = ""
    #: None: no numeric value (an enum, a list, a name); the translation refuses what is outside
    bounds: Bounds | None = None

    @property
    def limit(self) -> str:
        return self.bounds.describe() if self.bounds is not None else "-"


def _timeout(maximum_ms: int = DAY_MS) -> Bounds:
    return Bounds(DURATION, 0, maximum_ms)


#: the caps one tenant's policy may ask for, chosen so that what one policy costs everyone is small:
#: NGINX allocates `keepalive` connections' cache per upstream and worker at load time (20 million
#: took 2.9 GB), and a zone is shared memory mapped at load (20 zones of 2048m mapped 40 GB)
MAX_KEEPALIVE_CONNECTIONS = 1024
MAX_RATE_LIMIT_ZONE = 64 * MIB
MAX_UPSTREAM_ZONE = 16 * MIB
MIN_ZONE = 32 * KIB
MAX_BODY_SIZE = 64 * GIB


FIELDS: dict[str, dict[str, FieldInfo]] = {
    TIMEOUT: {
        "connectionTimeout": FieldInfo("proxy_connect_timeout", "location", APPROXIMATED,
                                       "time to open the TCP (and TLS) connection to one backend peer; "
                                       "at most 75 s (NGINX cannot wait longer; a larger value makes "
                                       "the policy Invalid); a reused keep-alive connection does not "
                                       "connect again", _timeout(75_000)),
        "readTimeout": FieldInfo("proxy_read_timeout", "location", APPROXIMATED,
                                 "longest wait for the backend's response headers and between two "
                                 "successive reads of the body, not a deadline for the whole response", _timeout()),
        "sendTimeout": FieldInfo("proxy_send_timeout", "location", APPROXIMATED,
                                 "longest wait between two successive writes of the request to the backend", _timeout()),
        "idleTimeout": FieldInfo("keepalive_timeout", "location", ENFORCED,
                                 "how long an idle client keep-alive connection stays open "
                                 "(the smaller value wins if ClientSettingsPolicy keepAlive.timeout is also set)", _timeout()),
        "requestTimeout": FieldInfo("", "", UNSUPPORTED,
                                    "a whole-request deadline does not exist in NGINX 1.22 (nginx/nginx#1262)"),
    },
    RETRY: {
        "attempts": FieldInfo("proxy_next_upstream_tries", "location", ENFORCED,
                              "total number of tries including the first; each endpoint is listed "
                              "`attempts` times in a separate upstream with max_fails=0, because NGINX "
                              "retries only on another peer; retries stop once the response has started",
                              Bounds(COUNT, 1, 10)),
        "retryOn": FieldInfo("proxy_next_upstream", "location", APPROXIMATED,
                             "connect-failure and reset both become `error` (NGINX cannot tell them apart), "
                             "timeout -> `timeout`, invalid-header -> `invalid_header`"),
        "codes": FieldInfo("proxy_next_upstream", "location", ENFORCED,
                           "only 403, 404, 429, 500, 502, 503 and 504 can be retried by NGINX"),
        "nonIdempotent": FieldInfo("proxy_next_upstream", "location", ENFORCED,
                                   "`non_idempotent`: also retry POST, LOCK and PATCH"),
        "retryBudget": FieldInfo("proxy_next_upstream_timeout", "location", ENFORCED,
                                 "total time allowed for the first try and all retries", _timeout()),
        "backoff": FieldInfo("", "", UNSUPPORTED, "NGINX retries immediately; it has no backoff"),
        "perTryTimeout": FieldInfo("", "", UNSUPPORTED,
                                   "NGINX has no per-try deadline (use TimeoutPolicy readTimeout)"),
    },
    CLIENT: {
        "body.maxSize": FieldInfo("client_max_body_size", "location", ENFORCED,
                                  "larger request bodies are answered with 413; 0 disables the check",
                                  Bounds(SIZE, 0, MAX_BODY_SIZE)),
        "body.timeout": FieldInfo("client_body_timeout", "location", APPROXIMATED,
                                  "longest wait between two successive reads of the request body", _timeout()),
        "keepAlive.requests": FieldInfo("keepalive_requests", "location", ENFORCED,
                                        "requests served on one client connection before it is closed",
                                        Bounds(COUNT, 0, INT32_MAX)),
        "keepAlive.time": FieldInfo("keepalive_time", "location", ENFORCED,
                                    "longest lifetime of one client keep-alive connection", _timeout()),
        "keepAlive.timeout": FieldInfo("keepalive_timeout", "location", ENFORCED,
                                       "how long an idle client keep-alive connection stays open", _timeout()),
        "keepAlive.minTimeout": FieldInfo("", "", UNSUPPORTED,
                                          "keepalive_min_timeout does not exist in NGINX 1.22"),
    },
    UPSTREAM: {
        "keepAlive.connections": FieldInfo("keepalive", "upstream", ENFORCED,
                                           "idle connections to the backend kept per NGINX worker (NGINX "
                                           "allocates their cache when it loads the configuration)",
                                           Bounds(COUNT, 0, MAX_KEEPALIVE_CONNECTIONS)),
        "keepAlive.requests": FieldInfo("keepalive_requests", "upstream", ENFORCED,
                                        "requests sent on one backend connection before it is closed",
                                        Bounds(COUNT, 1, INT32_MAX)),
        "keepAlive.time": FieldInfo("keepalive_time", "upstream", ENFORCED,
                                    "longest lifetime of one backend keep-alive connection", _timeout()),
        "keepAlive.timeout": FieldInfo("keepalive_timeout", "upstream", ENFORCED,
                                       "how long an idle backend connection stays in the pool", _timeout()),
        "zoneSize": FieldInfo("zone", "upstream", ENFORCED,
                              "shared memory for the upstream's state, shared by all workers",
                              Bounds(ZONE, MIN_ZONE, MAX_UPSTREAM_ZONE)),
    },
    RATELIMIT: {
        "requests": FieldInfo("limit_req_zone rate=", "http", ENFORCED,
                              "requests per `unit` allowed per key (leaky bucket, per NGINX instance)",
                              Bounds(COUNT, 1, INT32_MAX)),
        "unit": FieldInfo("limit_req_zone rate=", "http", ENFORCED, "Second (r/s) or Minute (r/m)"),
        "burst": FieldInfo("limit_req burst=", "location", ENFORCED,
                           "requests above the rate that are still accepted; later ones get 429",
                           Bounds(COUNT, 0, INT32_MAX)),
        "noDelay": FieldInfo("limit_req nodelay", "location", ENFORCED,
                             "true (the default): burst requests are served at once; false: they are "
                             "delayed to the rate"),
        "key.type": FieldInfo("limit_req_zone key", "http", ENFORCED,
                              "ClientAddress ($binary_remote_addr) or Header ($http_<name>; requests "
                              "without the header are not limited)"),
        "key.header": FieldInfo("limit_req_zone key", "http", ENFORCED, "the header name for key.type Header"),
        "zoneSize": FieldInfo("limit_req_zone zone=", "http", ENFORCED,
                              "shared memory holding the per-key state (about 16,000 client addresses per "
                              "megabyte)", Bounds(ZONE, MIN_ZONE, MAX_RATE_LIMIT_ZONE)),
    },
}


@dataclass(frozen=True)
class RateZone:
    """One `limit_req_zone`; locations with the same zone share one bucket per key."""

    name: str
    key: str
    size: str
    rate: str

    @property
    def directive(self) -> str:
        return f"limit_req_zone {self.key} zone={self.name}:{self.size} rate={self.rate};"


@dataclass(frozen=True)
class LocationConf:
    """The directives of one location (external and its internal locations alike)."""

    lines: tuple[str, ...] = ()
    zones: tuple[RateZone, ...] = ()
    peer_copies: int = 1  # how often the upstream must list each endpoint (RetryPolicy attempts)
    # lines that only work in the location NGINX selects by URI: NGINX checks a request's
    # Content-Length against client_max_body_size in its find-config phase, which a jump to a
    # named location (error_page, r.internalRedirect('@x')) skips; they are in `lines` too
    uri_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class UpstreamConf:
    """The directives inside one `upstream {}` block after the `server` lines, and server parameters."""

    lines: tuple[str, ...] = ()
    keepalive: bool = False  # locations must then send `proxy_set_header Connection ""` (HTTP/1.1)
    server_params: str = ""  # appended to every `server` line, e.g. "max_fails=0"


# ---------------------------------------------------------------------------------------------
# values

_DURATION = re.compile(r"^(?:(\d{1,5})(h|ms|m|s))+$")
_DURATION_PART = re.compile(r"(\d{1,5})(h|ms|m|s)")
_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_SIZE = re.compile(r"^(\d+)([kKmMgG]?)$")


def duration_ms(value: Any, where: str) -> int:
    """A Gateway API duration ("500ms", "1m30s") or a bare number of seconds, in milliseconds."""
    if isinstance(value, bool):
        raise PolicyValueError(f"{where}: {value!r} is not a duration (use e.g. 10s, 500ms or a number of seconds)")
    if isinstance(value, (int, float)):
        if value < 0:
            raise PolicyValueError(f"{where}: {value!r} is negative")
        return int(round(value * 1000))
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return int(round(float(text) * 1000))
        if _DURATION.fullmatch(text):
            return sum(int(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(text))
    raise PolicyValueError(f"{where}: {value!r} is not a duration (use e.g. 10s, 500ms or a number of seconds)")


def nginx_time(ms: int) -> str:
    """Milliseconds in NGINX's time syntax, whole seconds when exact."""
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def nginx_size(value: Any, where: str) -> str:
    """A size ("1m", "512k", 1048576 bytes) in NGINX's syntax; also accepts Kubernetes "1Mi"."""
    if isinstance(value, bool):
        raise PolicyValueError(f"{where}: {value!r} is not a size (use e.g. 1m, 512k or a number of bytes)")
    if isinstance(value, int) and value >= 0:
        return str(value)
    if isinstance(value, str):
        text = value.strip()
        m = re.fullmatch(r"(\d+)([KMG])i", text)
        if m:
            return f"{m.group(1)}{m.group(2).lower()}"
        if _SIZE.fullmatch(text):
            return text.lower()
    raise PolicyValueError(f"{where}: {value!r} is not a size (use e.g. 1m, 512k or a number of bytes)")


def size_bytes(value: Any, where: str) -> int:
    """A size as nginx_size reads it, in bytes."""
    text = nginx_size(value, where)
    number, unit = (text[:-1], text[-1]) if text[-1:] in "kmg" else (text, "")
    return int(number) * {"": 1, "k": KIB, "m": MIB, "g": GIB}[unit]


def zone_size(n: int) -> str:
    """A shared memory zone's size in NGINX 1.22's units (its zones take k and m, not g), rounded up to a KiB."""
    return f"{n // MIB}m" if n % MIB == 0 else f"{-(-n // KIB)}k"


def bounded(kind: str, fname: str, value: Any) -> int:
    """A numeric field's value in its unit (milliseconds, bytes, a count), held to FIELDS' bounds;
    PolicyValueError naming kind, field and the range otherwise."""
    b = FIELDS[kind][fname].bounds
    assert b is not None, (kind, fname)
    where = f"{kind} {fname}"
    if b.kind == COUNT:
        return _int(value, where, b.minimum, b.maximum)
    n = duration_ms(value, where) if b.kind == DURATION else size_bytes(value, where)
    if not b.minimum <= n <= b.maximum:
        raise PolicyValueError(f"{where}: {value!r} is out of range ({b.describe()})")
    return n


def _int(value: Any, where: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f"({lo} to {hi})" if hi is not None else f"(at least {lo})"
        raise PolicyValueError(f"{where}: {value!r} is out of range: an integer {bound}")
    return value


def _get(spec: Mapping[str, Any], dotted: str) -> Any:
    if "." not in dotted:  # the common case, fast (the renderer asks thousands of times)
        return spec.get(dotted) if isinstance(spec, dict) else None
    cur: Any = spec
    for seg in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(seg)
    return cur


def _set(spec: Mapping[str, Any], dotted: str) -> bool:
    v = _get(spec, dotted)
    return not (v is None or (isinstance(v, (str, list, dict)) and len(v) == 0))


def _leaves(spec: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for k, v in spec.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from _leaves(v, name + ".")
        else:
            yield name


# ---------------------------------------------------------------------------------------------
# honest limits


def unsupported_fields(kind: str, spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(field, why) for every field that is set and that this data plane cannot honour.

    `spec` is either a policy's settings (a stanza or a direct policy's spec without targetRefs) or
    an effective spec.  A policy with any of these gets Accepted=False, reason Invalid, and nothing
    of it is programmed.  Unknown fields of a kind we enforce are reported too: they would
    otherwise be dropped silently.
    """
    if not spec or kind not in FIELDS:
        return []
    table = FIELDS[kind]
    out: list[tuple[str, str]] = []
    for leaf in sorted(_leaves(spec)):
        if leaf.startswith("_") or not _set(spec, leaf):  # "_...": the gateway's own, from the route
            continue
        info = table.get(leaf) or next((table[f] for f in table if leaf.startswith(f + ".")), None)
        if info is None:
            if not any(f.startswith(leaf + ".") for f in table):
                out.append((leaf, f"{kind} has no field {leaf!r}; {DATA_PLANE} would ignore it"))
            continue
        if info.support == UNSUPPORTED:
            out.append((leaf, f"{info.note}; not supported by {DATA_PLANE}"))
    out.extend(_unsupported_values(kind, spec))
    if not out:
        out.extend(_bad_values(kind, spec))
    return out


def _bad_values(kind: str, spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Values the translation refuses (a duration that is not one, a negative count): the CRD
    schema says the same, but an API server that does not validate lets them through."""
    try:
        if kind == UPSTREAM:
            upstream_directives("u", {kind: dict(spec)})
        else:
            location_directives({kind: dict(spec)})
    except PolicyValueError as e:
        text = str(e)
        fname = text.split(":", 1)[0].removeprefix(f"{kind} ")
        return [(fname, text.split(":", 1)[1].strip() if ":" in text else text)]
    return []


STANZA_NAMES = ("default", "defaults", "override", "overrides")
TARGET_FIELDS = ("targetRef", "targetRefs")


def unsupported_in_policy(kind: str, policy_spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """unsupported_fields over a whole policy's spec, fields named from `spec.` (every stanza).

    BackendTLSPolicy is checked too (subjectAltNames, options, unknown wellKnownCACertificates).
    """
    if not isinstance(policy_spec, Mapping):
        return []
    if kind == BACKEND_TLS:
        from gwpolicy.gateway.backendtls import unsupported_fields as btls_unsupported

        return btls_unsupported(policy_spec)
    if kind not in FIELDS:
        return []
    stanzas = [s for s in STANZA_NAMES if isinstance(policy_spec.get(s), Mapping)]
    if stanzas:
        return [(f"spec.{s}.{f}", why) for s in stanzas for f, why in unsupported_fields(kind, policy_spec[s])]
    rest = {k: v for k, v in policy_spec.items() if k not in TARGET_FIELDS and k not in STANZA_NAMES}
    return [(f"spec.{f}", why) for f, why in unsupported_fields(kind, rest)]


def invalid_message(kind: str, policy_spec: Mapping[str, Any] | None) -> str | None:
    """The Accepted=False/Invalid message for a policy with unsupported fields, or None."""
    bad = unsupported_in_policy(kind, policy_spec)
    if not bad:
        return None
    return "; ".join(f"{f}: {why}" for f, why in bad) + ". Nothing of this policy is programmed."


def approximation_message(kind: str, policy_spec: Mapping[str, Any] | None) -> str | None:
    """For an accepted policy's message: the fields it sets that NGINX honours only approximately,
    and how (the CRD descriptions say the same)."""
    if kind not in FIELDS or not isinstance(policy_spec, Mapping):
        return None
    stanzas = [s for s in STANZA_NAMES if isinstance(policy_spec.get(s), Mapping)]
    blocks = [(f"spec.{s}.", policy_spec[s]) for s in stanzas] or [
        ("spec.", {k: v for k, v in policy_spec.items() if k not in TARGET_FIELDS})]
    notes = [f"{prefix}{f} is approximated by {DATA_PLANE}: {how}" for prefix, block in blocks
             for f, how in approximations(kind, block)]
    return "; ".join(notes) + "." if notes else None


def kind_checks() -> dict[tuple[str, str], Any]:
    """For `analyse(..., kind_checks=...)`: a policy of our kinds with a field this data plane cannot
    honour becomes Invalid in the engine, so it contributes to no path (it "changes nothing") and
    its status says which field."""
    return {(GROUP, k): (lambda spec, _k=k: invalid_message(_k, spec)) for k in KINDS}


def _unsupported_values(kind: str, spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if kind == RETRY:
        codes = _get(spec, "codes")
        if isinstance(codes, list):
            bad = [c for c in codes if c not in RETRYABLE_CODES]
            if bad:
                out.append(("codes", f"NGINX can retry only {', '.join(map(str, RETRYABLE_CODES))}; "
                                     f"{', '.join(map(str, bad))} cannot be retried by {DATA_PLANE}"))
        on = _get(spec, "retryOn")
        if isinstance(on, list):
            bad_on = [c for c in on if c not in RETRY_CONDITIONS]
            if bad_on:
                out.append(("retryOn", f"{', '.join(map(str, bad_on))}: not a condition NGINX can retry on "
                                       f"(it knows {', '.join(RETRY_CONDITIONS)})"))
    if kind == TIMEOUT and _set(spec, "connectionTimeout"):
        try:
            if duration_ms(_get(spec, "connectionTimeout"), "connectionTimeout") > MAX_CONNECT_TIMEOUT_MS:
                out.append(("connectionTimeout", "NGINX cannot wait longer than 75 s for a connection "
                                                  f"({FIELDS[TIMEOUT]['connectionTimeout'].limit})"))
        except PolicyValueError:
            pass
    if kind == RATELIMIT and _set(spec, "unit") and _get(spec, "unit") not in ("Second", "Minute"):
        out.append(("unit", f"{_get(spec, 'unit')!r}: NGINX limits per second or per minute only"))
    return out


def approximations(kind: str, spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(field, how) for set fields that NGINX honours only approximately (for status messages)."""
    if not spec or kind not in FIELDS:
        return []
    table = FIELDS[kind]
    return [(f, info.note) for f, info in table.items() if info.support == APPROXIMATED and _set(spec, f)]


def enforcement(kind: str, dotted_field: str) -> str:
    """enforced | approximated | not supported | not this data plane's kind (for `describe`)."""
    if kind == BACKEND_TLS:
        return ENFORCED if not dotted_field.startswith(("validation.subjectAltNames", "options")) else UNSUPPORTED
    info = FIELDS.get(kind, {}).get(dotted_field)
    if info is None:
        parent = next((f for f in FIELDS.get(kind, {}) if dotted_field.startswith(f + ".")), None)
        info = FIELDS[kind][parent] if parent else None
    if info is None:
        return "not enforced by this data plane" if kind not in FIELDS else UNSUPPORTED
    return info.support


# ---------------------------------------------------------------------------------------------
# translation


def kind_name(key: Any) -> str | None:
    """"TimeoutPolicy" or ("gwpolicy.io", "TimeoutPolicy") -> "TimeoutPolicy"; other groups -> None."""
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and len(key) == 2:
        return key[1] if key[0] == GROUP else None
    return None


def _specs(effective: Mapping[Any, Any] | None) -> dict[str, dict[str, Any]]:
    """Normalise DP's input: keys kind names or (group, kind); values a spec dict or an engine Result."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in (effective or {}).items():
        name = kind_name(key)
        if name is None:
            continue
        spec = value if isinstance(value, Effective) else getattr(value, "spec", value)
        if isinstance(spec, Mapping) and spec:
            out[name] = spec if isinstance(spec, Effective) else dict(spec)
    return out


# ---------------------------------------------------------------------------------------------
# the route's own fields (HTTPRoute rules[].timeouts, rules[].retry) as the kinds' fieldMappings

class Effective(dict[str, Any]):
    """An effective spec (a plain dict to every reader) that also knows which fields an `overrides`
    stanza supplied: those beat the route's own fields, everything else loses to them."""

    overridden: frozenset[str] = frozenset()
    origin: dict[str, str] = {}  # field -> the policy that supplied it ("Kind/ns/name")

    @classmethod
    def of(cls, result: Any) -> "Effective":
        """From the engine's Result (its `.spec` and `.sources`), or a plain dict (no overrides)."""
        spec = getattr(result, "spec", result)
        out = cls(spec if isinstance(spec, Mapping) else {})
        sources = getattr(result, "sources", None) or ()
        out.overridden = frozenset(s["field"] for s in sources if s.get("stanza") == "overrides")
        out.origin = {s["field"]: _policy_id(s.get("policy")) for s in sources if s.get("policy")}
        return out


def _policy_id(ref: Any) -> str:
    if isinstance(ref, Mapping):
        return f"{ref.get('kind', '')}/{ref.get('namespace') or ''}/{ref.get('name', '')}"
    return str(ref)


def _plus_one(n: Any) -> Any:
    """retries -> tries, at most MAX_ATTEMPTS (route_field_notes says when it is cut)."""
    return min(n + 1, MAX_ATTEMPTS) if isinstance(n, int) and not isinstance(n, bool) else n


# (kind, setting, the rule's field, value conversion): `retry.attempts` counts retries, RetryPolicy
# `attempts` counts tries, hence +1.  Declared in the PolicyKinds' fieldMappings as
# `spec.rules[].<field>` ("the rule of this path"); the engine leaves list paths alone, so the
# gateway applies them here, where the rule is known.
ROUTE_FIELDS: tuple[tuple[str, str, tuple[str, ...], Any], ...] = (
    (TIMEOUT, "readTimeout", ("timeouts", "backendRequest"), None),
    (RETRY, "attempts", ("retry", "attempts"), _plus_one),
    (RETRY, "codes", ("retry", "codes"), None),
)
REQUEST_TIMEOUT_NOTE = ("NGINX 1.22 has no whole-request deadline; it is approximated by limiting the "
                        "connect, each read and each write to the backend, and all retries together, "
                        "to this duration, so a backend that keeps sending slowly is not cut off")


def with_route_fields(effective: Mapping[Any, Any] | None, rule: Mapping[str, Any] | None) -> dict[str, Any]:
    """The effective policies of a rule's path with the rule's own fields merged in (S5.2 rule 4):
    a policy override beats the rule's value, the rule's value beats every policy default.

    Values of `effective` may be Effective (from the engine's Result) or plain dicts (then no field
    counts as overridden).  `rules[].timeouts.request` becomes the internal setting
    `TimeoutPolicy._requestTimeout`, which location_directives approximates."""
    out: dict[str, Any] = {}
    for key, value in (effective or {}).items():
        name = kind_name(key) or key
        out[name] = value if isinstance(value, Effective) else Effective.of(value)
    if not isinstance(rule, Mapping):
        return out
    for kind, setting, path, convert in ROUTE_FIELDS:
        value = _get(rule, ".".join(path))
        if value is None or (isinstance(value, (str, list, dict)) and not value):
            continue
        cur = out.get(kind) or Effective()
        if setting in cur.overridden and _set(cur, setting):
            continue
        if setting == "codes" and isinstance(value, list):
            value = [c for c in value if c in RETRYABLE_CODES]  # the others: route_field_notes
            if not value:
                continue
        new = Effective({**cur, setting: convert(value) if convert else value})
        new.overridden, new.origin = cur.overridden, {**cur.origin, setting: "route"}
        out[kind] = new
    request = _get(rule, "timeouts.request")
    if isinstance(request, str) and request:
        cur = out.get(TIMEOUT) or Effective()
        new = Effective({**cur, "_requestTimeout": request})
        new.overridden, new.origin = cur.overridden, cur.origin
        out[TIMEOUT] = new
    return out


def route_field_notes(rule: Mapping[str, Any] | None, where: str = "rules[]") -> list[tuple[str, str]]:
    """(field, how) for the rule's own fields NGINX honours only approximately or not at all, for the
    route's status (Accepted stays True; the message says it)."""
    out: list[tuple[str, str]] = []
    if not isinstance(rule, Mapping):
        return out
    if _set(rule, "timeouts.request"):
        out.append((f"{where}.timeouts.request", REQUEST_TIMEOUT_NOTE))
    if _set(rule, "timeouts.backendRequest"):
        out.append((f"{where}.timeouts.backendRequest", FIELDS[TIMEOUT]["readTimeout"].note))
    attempts = _get(rule, "retry.attempts")
    if isinstance(attempts, int) and attempts + 1 > MAX_ATTEMPTS:
        out.append((f"{where}.retry.attempts", f"at most {MAX_ATTEMPTS - 1} retries ({MAX_ATTEMPTS} tries) are made"))
    if _set(rule, "retry.backoff"):
        out.append((f"{where}.retry.backoff", FIELDS[RETRY]["backoff"].note + "; retries are immediate"))
    codes = _get(rule, "retry.codes")
    if isinstance(codes, list) and any(c not in RETRYABLE_CODES for c in codes):
        bad = ", ".join(str(c) for c in codes if c not in RETRYABLE_CODES)
        out.append((f"{where}.retry.codes", f"NGINX cannot retry {bad}; those responses are passed on"))
    return out


def location_directives(effective: Mapping[Any, Any] | None, *, scope: str = "") -> LocationConf:
    """The directives one location gets from the effective policy of its exact path.

    `effective` maps a kind ("TimeoutPolicy" or (group, kind)) to its effective spec (a dict or the
    engine's Result).  Kinds with unsupported fields must not be passed (the policy is Invalid and
    programs nothing).  `scope` names the rate-limit bucket owner (e.g. the policy supplying the
    rate): locations with equal settings and scope share one zone.
    """
    specs = _specs(effective)
    lines: list[str] = []
    zones: list[RateZone] = []
    copies = 1
    idle: list[int] = []
    t = specs.get(TIMEOUT, {})
    request_ms = duration_ms(t["_requestTimeout"], "rules[].timeouts.request") if _set(t, "_requestTimeout") else None
    if request_ms == 0:  # Gateway API: a zero duration disables the timeout
        request_ms = None
    timed = request_ms is not None
    for fname, directive in (("connectionTimeout", "proxy_connect_timeout"),
                             ("readTimeout", "proxy_read_timeout"), ("sendTimeout", "proxy_send_timeout")):
        ms = bounded(TIMEOUT, fname, t[fname]) if _set(t, fname) else None
        if ms == 0:  # no timeout: NGINX has no "off", so its longest useful wait
            ms = MAX_CONNECT_TIMEOUT_MS if fname == "connectionTimeout" else NO_TIMEOUT_MS
        if request_ms is not None:
            ms = request_ms if ms is None else min(ms, request_ms)
        if ms is not None:
            timed = timed or fname != "connectionTimeout"
            lines.append(f"{directive} {nginx_time(min(ms, MAX_CONNECT_TIMEOUT_MS) if fname == 'connectionTimeout' else ms)};")
    if _set(t, "idleTimeout"):
        idle.append(bounded(TIMEOUT, "idleTimeout", t["idleTimeout"]))
    r = specs.get(RETRY, {})
    if _set(r, "attempts"):
        attempts = _int(r["attempts"], f"{RETRY} attempts", 1, MAX_ATTEMPTS)
        conds: list[str] = []
        for c in (r.get("retryOn") or list(DEFAULT_RETRY_ON)):
            d = RETRY_CONDITIONS.get(c)
            if d is None:
                raise PolicyValueError(f"{RETRY} retryOn: {c!r} is not one of {', '.join(RETRY_CONDITIONS)}")
            if d not in conds:
                conds.append(d)
        for code in r.get("codes") or []:
            if code not in RETRYABLE_CODES:
                raise PolicyValueError(f"{RETRY} codes: {code!r} cannot be retried by NGINX")
            if f"http_{code}" not in conds:
                conds.append(f"http_{code}")
        if r.get("nonIdempotent") is True:
            conds.append("non_idempotent")
        if attempts == 1:
            lines.append("proxy_next_upstream off;")
        else:
            lines.append(f"proxy_next_upstream {' '.join(conds)};")
        lines.append(f"proxy_next_upstream_tries {attempts};")
        budget = bounded(RETRY, "retryBudget", r["retryBudget"]) if _set(r, "retryBudget") else None
        if request_ms is not None:
            budget = request_ms if budget is None else min(budget, request_ms)
        if budget is not None:
            lines.append(f"proxy_next_upstream_timeout {nginx_time(budget)};")
        copies = attempts
    elif timed:
        # without a RetryPolicy a timeout is the answer (504), not a reason to try another endpoint
        # (NGINX's default `error timeout` would double the wait and mark the endpoint down, so
        # the next requests would get 502 "no live upstreams")
        lines.append("proxy_next_upstream error;")
    c = specs.get(CLIENT, {})
    if _set(c, "body.maxSize"):
        bounded(CLIENT, "body.maxSize", _get(c, "body.maxSize"))
        lines.append(f"client_max_body_size {nginx_size(_get(c, 'body.maxSize'), f'{CLIENT} body.maxSize')};")
    if _set(c, "body.timeout"):
        lines.append(f"client_body_timeout {nginx_time(bounded(CLIENT, 'body.timeout', _get(c, 'body.timeout')))};")
    if _set(c, "keepAlive.requests"):
        lines.append(f"keepalive_requests {bounded(CLIENT, 'keepAlive.requests', _get(c, 'keepAlive.requests'))};")
    if _set(c, "keepAlive.time"):
        lines.append(f"keepalive_time {nginx_time(bounded(CLIENT, 'keepAlive.time', _get(c, 'keepAlive.time')))};")
    if _set(c, "keepAlive.timeout"):
        idle.append(bounded(CLIENT, "keepAlive.timeout", _get(c, "keepAlive.timeout")))
    if idle:
        lines.append(f"keepalive_timeout {nginx_time(min(idle))};")
    rl = specs.get(RATELIMIT, {})
    if _set(rl, "requests"):
        # one bucket per policy that sets the rate: two routes with equal but separate policies
        # do not share one (DP may pass its own scope; Effective knows the supplying policy)
        zone = rate_zone(rl, scope or getattr(rl, "origin", {}).get("requests", ""))
        zones.append(zone)
        burst = bounded(RATELIMIT, "burst", rl.get("burst", 0))
        parts = [f"zone={zone.name}"] + ([f"burst={burst}"] if burst else [])
        if rl.get("noDelay", True) is not False:
            parts.append("nodelay")
        lines.append(f"limit_req {' '.join(parts)};")
        lines.append("limit_req_status 429;")
    uri = tuple(l for l in lines if l.startswith("client_max_body_size "))
    return LocationConf(tuple(lines), tuple(zones), copies, uri)


def rate_zone(spec: Mapping[str, Any], scope: str = "") -> RateZone:
    """The zone a RateLimitPolicy effective spec needs; named by a hash of settings and scope."""
    requests = bounded(RATELIMIT, "requests", spec.get("requests"))
    unit = spec.get("unit", "Second")
    if unit not in ("Second", "Minute"):
        raise PolicyValueError(f"{RATELIMIT} unit: {unit!r} must be Second or Minute")
    rate = f"{requests}r/{'s' if unit == 'Second' else 'm'}"
    key_spec = spec.get("key") or {}
    ktype = key_spec.get("type", "ClientAddress") if isinstance(key_spec, Mapping) else "ClientAddress"
    if ktype == "ClientAddress":
        key = "$binary_remote_addr"
    elif ktype == "Header":
        header = key_spec.get("header")
        if not isinstance(header, str) or not re.fullmatch(r"[A-Za-z0-9-]+", header):
            raise PolicyValueError(f"{RATELIMIT} key.header: {header!r} must be a header name (letters, digits, -)")
        key = "$http_" + header.lower().replace("-", "_")
    else:
        raise PolicyValueError(f"{RATELIMIT} key.type: {ktype!r} must be ClientAddress or Header")
    size = zone_size(bounded(RATELIMIT, "zoneSize", spec.get("zoneSize", DEFAULT_ZONE_SIZE)))
    digest = hashlib.sha256(f"{scope}|{key}|{rate}|{size}".encode()).hexdigest()[:12]
    return RateZone(f"rl_{digest}", key, size, rate)


def upstream_directives(upstream_name: str, effective: Mapping[Any, Any] | None, *,
                        peer_copies: int = 1) -> UpstreamConf:
    """The lines of one upstream block (after its `server` lines) from the Service's policies.

    `effective` is the effective policy of the backend (UpstreamSettingsPolicy is Direct on a
    Service, so all paths to one Service port agree).  `peer_copies` > 1 (from
    LocationConf.peer_copies) makes DP list each endpoint that many times; the servers then need
    `max_fails=0` or a retried failure would mark the only endpoint down.  So do upstreams of paths
    with a read, send or request timeout: NGINX counts a timed-out response as a failed attempt
    whatever proxy_next_upstream says, so one slow answer would take an endpoint out for 10 s and
    the next requests would get 502 ("no live upstreams") instead of their own answer or 504.
    """
    specs = _specs(effective)
    u = specs.get(UPSTREAM, {})
    t = specs.get(TIMEOUT, {})
    timed = any(_set(t, f) for f in ("readTimeout", "sendTimeout", "_requestTimeout"))
    lines: list[str] = []
    if _set(u, "zoneSize"):
        lines.append(f"zone {upstream_name} {zone_size(bounded(UPSTREAM, 'zoneSize', u['zoneSize']))};")
    keepalive = False
    if _set(u, "keepAlive.connections"):
        n = bounded(UPSTREAM, "keepAlive.connections", _get(u, "keepAlive.connections"))
        if n > 0:
            keepalive = True
            lines.append(f"keepalive {n};")
    if keepalive:
        if _set(u, "keepAlive.requests"):
            lines.append(f"keepalive_requests {bounded(UPSTREAM, 'keepAlive.requests', _get(u, 'keepAlive.requests'))};")
        if _set(u, "keepAlive.time"):
            lines.append(f"keepalive_time {nginx_time(bounded(UPSTREAM, 'keepAlive.time', _get(u, 'keepAlive.time')))};")
        if _set(u, "keepAlive.timeout"):
            lines.append(f"keepalive_timeout {nginx_time(bounded(UPSTREAM, 'keepAlive.timeout', _get(u, 'keepAlive.timeout')))};")
    return UpstreamConf(tuple(lines), keepalive, "max_fails=0" if peer_copies > 1 or timed else "")


def retry_peer_copies(effective: Mapping[Any, Any] | None) -> int:
    """How many times the upstream of this path must list each endpoint (1 without retries)."""
    r = _specs(effective).get(RETRY, {})
    if not _set(r, "attempts"):
        return 1
    return _int(r["attempts"], f"{RETRY} attempts", 1, MAX_ATTEMPTS)


def http_directives(zones: Iterable[RateZone]) -> list[str]:
    """The http-context lines: each distinct rate-limit zone once, sorted (deterministic)."""
    return [z.directive for z in sorted(set(zones), key=lambda z: z.name)]


@dataclass
class Collected:
    """Convenience for a renderer: collects zones while locations are translated."""

    zones: set[RateZone] = field(default_factory=set)

    def location(self, effective: Mapping[Any, Any] | None, *, scope: str = "") -> LocationConf:
        conf = location_directives(effective, scope=scope)
        self.zones.update(conf.zones)
        return conf

    def http(self) -> list[str]:
        return http_directives(self.zones)
