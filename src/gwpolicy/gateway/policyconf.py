"""What NGINX 1.22 can honour of each policy kind, said before anything is programmed.

`unsupported_fields` (and `kind_checks()` for the engine) name every field this data plane cannot
honour, unknown fields and values the translation refuses, so such a policy is Invalid and
programs nothing; `approximations` and `enforcement` say how an approximated field is enforced.
The route's own fields (HTTPRoute rules[].timeouts, rules[].retry) join the effective policy here
(`with_route_fields`). The translation itself is the generators' (gateway/policies/), which raise
PolicyValueError naming kind and field rather than write a broken nginx.conf; the values and
bounds of every field are policies/values.py's, re-exported here for the callers. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gwpolicy.gateway.policies import location_directives, upstream_directives
from gwpolicy.gateway.policies.values import (
    APPROXIMATED,
    BACKEND_TLS,
    DATA_PLANE,
    ENFORCED,
    FIELDS,
    GROUP,
    KINDS,
    MAX_ATTEMPTS,
    MAX_CONNECT_TIMEOUT_MS,
    RATELIMIT,
    RETRY,
    RETRY_CONDITIONS,
    RETRYABLE_CODES,
    TIMEOUT,
    UNSUPPORTED,
    UPSTREAM,
    Effective,
    PolicyValueError,
    duration_ms,
    field_value,
    is_set,
    kind_name,
    spec_leaves,
)

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
    for leaf in sorted(spec_leaves(spec)):
        if leaf.startswith("_") or not is_set(spec, leaf):  # "_...": the gateway's own, from the route
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
    from gwpolicy.gateway import ngfpolicies  # NGF's kinds of the same names (gateway.nginx.org)

    return {**{(GROUP, k): (lambda spec, _k=k: invalid_message(_k, spec)) for k in KINDS}, **ngfpolicies.kind_checks()}


def _unsupported_values(kind: str, spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if kind == RETRY:
        codes = field_value(spec, "codes")
        if isinstance(codes, list):
            bad = [c for c in codes if c not in RETRYABLE_CODES]
            if bad:
                out.append(("codes", f"NGINX can retry only {', '.join(map(str, RETRYABLE_CODES))}; "
                                     f"{', '.join(map(str, bad))} cannot be retried by {DATA_PLANE}"))
        on = field_value(spec, "retryOn")
        if isinstance(on, list):
            bad_on = [c for c in on if c not in RETRY_CONDITIONS]
            if bad_on:
                out.append(("retryOn", f"{', '.join(map(str, bad_on))}: not a condition NGINX can retry on "
                                       f"(it knows {', '.join(RETRY_CONDITIONS)})"))
    if kind == TIMEOUT and is_set(spec, "connectionTimeout"):
        try:
            if duration_ms(field_value(spec, "connectionTimeout"), "connectionTimeout") > MAX_CONNECT_TIMEOUT_MS:
                out.append(("connectionTimeout", "NGINX cannot wait longer than 75 s for a connection "
                                                  f"({FIELDS[TIMEOUT]['connectionTimeout'].limit})"))
        except PolicyValueError:
            pass
    if kind == RATELIMIT and is_set(spec, "unit") and field_value(spec, "unit") not in ("Second", "Minute"):
        out.append(("unit", f"{field_value(spec, 'unit')!r}: NGINX limits per second or per minute only"))
    return out


def approximations(kind: str, spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(field, how) for set fields that NGINX honours only approximately (for status messages)."""
    if not spec or kind not in FIELDS:
        return []
    table = FIELDS[kind]
    return [(f, info.note) for f, info in table.items() if info.support == APPROXIMATED and is_set(spec, f)]


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
# the route's own fields (HTTPRoute rules[].timeouts, rules[].retry) as the kinds' fieldMappings

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
        value = field_value(rule, ".".join(path))
        if value is None or (isinstance(value, (str, list, dict)) and not value):
            continue
        cur = out.get(kind) or Effective()
        if setting in cur.overridden and is_set(cur, setting):
            continue
        if setting == "codes" and isinstance(value, list):
            value = [c for c in value if c in RETRYABLE_CODES]  # the others: route_field_notes
            if not value:
                continue
        new = Effective({**cur, setting: convert(value) if convert else value})
        new.overridden, new.origin = cur.overridden, {**cur.origin, setting: "route"}
        out[kind] = new
    request = field_value(rule, "timeouts.request")
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
    if is_set(rule, "timeouts.request"):
        out.append((f"{where}.timeouts.request", REQUEST_TIMEOUT_NOTE))
    if is_set(rule, "timeouts.backendRequest"):
        out.append((f"{where}.timeouts.backendRequest", FIELDS[TIMEOUT]["readTimeout"].note))
    attempts = field_value(rule, "retry.attempts")
    if isinstance(attempts, int) and attempts + 1 > MAX_ATTEMPTS:
        out.append((f"{where}.retry.attempts", f"at most {MAX_ATTEMPTS - 1} retries ({MAX_ATTEMPTS} tries) are made"))
    if is_set(rule, "retry.backoff"):
        out.append((f"{where}.retry.backoff", FIELDS[RETRY]["backoff"].note + "; retries are immediate"))
    codes = field_value(rule, "retry.codes")
    if isinstance(codes, list) and any(c not in RETRYABLE_CODES for c in codes):
        bad = ", ".join(str(c) for c in codes if c not in RETRYABLE_CODES)
        out.append((f"{where}.retry.codes", f"NGINX cannot retry {bad}; those responses are passed on"))
    return out
