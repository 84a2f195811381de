"""Policy values as NGINX takes them: the kinds this data plane enforces, each field's bounds and
how it is enforced (FIELDS), durations and sizes parsed and written in NGINX's units, and the
effective spec of each kind on one path. Read by the generators (policies/<kind>.py) and by
policyconf's checks."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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
#: idle connections to each backend an upstream keeps per worker when no UpstreamSettingsPolicy sets
#: keepAlive.connections (0 there: no pool, and the backend is asked to close)
DEFAULT_KEEPALIVE_CONNECTIONS = 16
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
                                           "allocates their cache when it loads the configuration); "
                                           "16 when unset, 0: none (each request opens a connection, "
                                           "sent with Connection: close)",
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


# ---------------------------------------------------------------------------------------------
# values

_DURATION = re.compile(r"^(?:(\d{1,5})(h|ms|m|s))+$")
_DURATION_PART = re.compile(r"(\d{1,5})(h|ms|m|s)")
_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_SIZE = re.compile(r"^(\d+)([kKmMgG]?)$")


def spec_leaves(spec: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    """The dotted names of a policy spec's leaves (`keepAlive.timeout.server`); an empty object is a leaf."""
    for k, v in spec.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from spec_leaves(v, name + ".")
        else:
            yield name


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
        return int_in(value, where, b.minimum, b.maximum)
    n = duration_ms(value, where) if b.kind == DURATION else size_bytes(value, where)
    if not b.minimum <= n <= b.maximum:
        raise PolicyValueError(f"{where}: {value!r} is out of range ({b.describe()})")
    return n


def int_in(value: Any, where: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f"({lo} to {hi})" if hi is not None else f"(at least {lo})"
        raise PolicyValueError(f"{where}: {value!r} is out of range: an integer {bound}")
    return value


def field_value(spec: Mapping[str, Any], dotted: str) -> Any:
    if "." not in dotted:  # the common case, fast (the renderer asks thousands of times)
        return spec.get(dotted) if isinstance(spec, dict) else None
    cur: Any = spec
    for seg in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(seg)
    return cur


def is_set(spec: Mapping[str, Any], dotted: str) -> bool:
    v = field_value(spec, dotted)
    return not (v is None or (isinstance(v, (str, list, dict)) and len(v) == 0))


# ---------------------------------------------------------------------------------------------
# translation


def kind_name(key: Any) -> str | None:
    """"TimeoutPolicy" or ("gwpolicy.io", "TimeoutPolicy") -> "TimeoutPolicy"; other groups -> None."""
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and len(key) == 2:
        return key[1] if key[0] == GROUP else None
    return None


def specs_by_kind(effective: Mapping[Any, Any] | None) -> dict[str, dict[str, Any]]:
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
