"""NGINX Gateway Fabric's ClientSettingsPolicy and UpstreamSettingsPolicy (`gateway.nginx.org`) as
this data plane enforces them: each NGF field named by the gwpolicy.io field (or the gateway's own
internal setting) that writes the same NGINX directive, the fields NGINX 1.22 cannot honour, and
the precedence between an NGF policy and a gwpolicy.io policy that set the same field on one path.

NGF's fields are defaults (NGF's inherited policies have no overrides). Per field, on one path:

1. a gwpolicy.io `overrides` value wins;
2. else the value of the policy whose target is the more specific level of the path wins
   (a route's beats its Gateway's, a listener's beats its Gateway's, a Service port's beats its
   Service's), whichever group it is in;
3. on the same level, the gwpolicy.io policy's value wins.

Pure: no I/O. docs/coming-from-ngf.md says the same for users.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gwpolicy.gateway.policies import location_directives, upstream_directives
from gwpolicy.gateway.policies.upstream import LB_METHODS, PLUS_ONLY_LB
from gwpolicy.gateway.policies.values import (
    CLIENT,
    ENFORCED,
    UNSUPPORTED,
    UPSTREAM,
    Effective,
    PolicyValueError,
    field_value,
    is_set,
    spec_leaves,
)

GROUP = "gateway.nginx.org"
VERSION = "v1alpha1"
KINDS = (CLIENT, UPSTREAM)  # the same kind names as ours, in NGF's group
#: NGF's kinds that write raw NGINX configuration: refused (Invalid) wherever they attach, since a
#: tenant's directives would reach every tenant's NGINX (SnippetsFilter, a route filter, is refused
#: by the route's status: gateway/facts.py)
REFUSED = ("SnippetsPolicy",)
REFUSED_MESSAGE = ("{kind} ({group}) writes raw NGINX configuration, which tenants may not do on this gateway; "
                   "nothing of it is programmed. Use the policy kinds the gateway enforces "
                   "(the GatewayClass's gateway.gwpolicy.io/supported-policy-kinds annotation).")

@dataclass(frozen=True)
class NGFField:
    """One NGF field: the setting of our kind it becomes (a gwpolicy.io field, or `_...`, the
    gateway's own), the directive, and whether this data plane honours it."""

    setting: str
    directive: str
    support: str
    note: str = ""


FIELDS: dict[str, dict[str, NGFField]] = {
    CLIENT: {
        "body.maxSize": NGFField("body.maxSize", "client_max_body_size", ENFORCED,
                                 "as gwpolicy.io ClientSettingsPolicy body.maxSize"),
        "body.bufferSize": NGFField("_bodyBufferSize", "client_body_buffer_size", ENFORCED,
                                    "at most 1m (NGINX allocates it for each request with a body)"),
        "body.timeout": NGFField("body.timeout", "client_body_timeout", "approximated",
                                 "as gwpolicy.io ClientSettingsPolicy body.timeout"),
        "keepAlive.requests": NGFField("keepAlive.requests", "keepalive_requests", ENFORCED),
        "keepAlive.time": NGFField("keepAlive.time", "keepalive_time", ENFORCED),
        "keepAlive.timeout.server": NGFField("keepAlive.timeout", "keepalive_timeout", ENFORCED),
        "keepAlive.timeout.header": NGFField("_keepAliveHeader", "keepalive_timeout (second value)", ENFORCED,
                                             "the Keep-Alive: timeout= response header; used with server"),
        "keepAlive.minTimeout": NGFField("", "", UNSUPPORTED, "keepalive_min_timeout does not exist in NGINX 1.22"),
    },
    UPSTREAM: {
        "zoneSize": NGFField("zoneSize", "zone", ENFORCED, "32k to 16m"),
        "keepAlive.connections": NGFField("keepAlive.connections", "keepalive", ENFORCED),
        "keepAlive.requests": NGFField("keepAlive.requests", "keepalive_requests", ENFORCED),
        "keepAlive.time": NGFField("keepAlive.time", "keepalive_time", ENFORCED),
        "keepAlive.timeout": NGFField("keepAlive.timeout", "keepalive_timeout", ENFORCED),
        "loadBalancingMethod": NGFField("_loadBalancingMethod", "least_conn, ip_hash, hash, random", ENFORCED,
                                        "least_time methods need NGINX Plus and are not supported"),
        "hashMethodKey": NGFField("_hashMethodKey", "hash", ENFORCED,
                                  "an NGINX variable of the request; used with loadBalancingMethod hash"),
        "useClusterIP": NGFField("", "", UNSUPPORTED,
                                 "this data plane proxies to the Service's ready endpoints (EndpointSlices), "
                                 "never to its cluster IP"),
    },
}
_BY_SETTING = {kind: {f.setting: name for name, f in table.items() if f.setting} for kind, table in FIELDS.items()}


def _put(out: dict[str, Any], dotted: str, value: Any) -> None:
    cur = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = cur[p] = {}
        cur = nxt
    cur[parts[-1]] = value


def translate(kind: str, spec: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """An NGF policy's settings (its spec without targetRef/targetRefs) as the settings of our kind
    of the same name, and (NGF field, why) for each field that cannot be honoured or is unknown."""
    out: dict[str, Any] = {}
    bad: list[tuple[str, str]] = []
    table = FIELDS.get(kind, {})
    for leaf in sorted(spec_leaves(spec or {})):
        if leaf in ("targetRef", "targetRefs") or leaf.startswith(("targetRef.", "targetRefs.")):
            continue
        if not is_set(spec or {}, leaf):
            continue
        info = table.get(leaf)
        if info is None:
            bad.append((leaf, f"{kind} ({GROUP}) has no field {leaf!r}; the nginx-1.22 data plane would ignore it"))
        elif info.support == UNSUPPORTED:
            bad.append((leaf, f"{info.note}; not supported by the nginx-1.22 data plane"))
        else:
            _put(out, info.setting, field_value(spec or {}, leaf))
    if kind == UPSTREAM:
        bad.extend(_lb_problems(out))
    if kind == CLIENT and "_keepAliveHeader" in out and "timeout" not in (out.get("keepAlive") or {}):
        bad.append(("keepAlive.timeout.header", "is used with keepAlive.timeout.server, which is not set"))
    return out, bad


def _lb_problems(u: Mapping[str, Any]) -> list[tuple[str, str]]:
    method = u.get("_loadBalancingMethod")
    if method is None:
        return []
    if method in PLUS_ONLY_LB:
        return [("loadBalancingMethod", f"{method!r} needs NGINX Plus; not supported by the nginx-1.22 data plane "
                                        f"(it has {', '.join(LB_METHODS)})")]
    if method not in LB_METHODS:
        return [("loadBalancingMethod", f"{method!r} is not a load-balancing method ({', '.join(LB_METHODS)})")]
    if LB_METHODS[method].startswith("hash"):
        key = u.get("_hashMethodKey")
        if not isinstance(key, str) or not key:
            return [("hashMethodKey", f"is required with loadBalancingMethod {method!r}")]
    return []


def unsupported_in_policy(kind: str, policy_spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(spec.field, why) for an NGF policy: fields NGINX 1.22 cannot honour, unknown fields, and
    values the translation refuses (named as NGF names them)."""
    if not isinstance(policy_spec, Mapping) or kind not in FIELDS:
        return []
    settings, bad = translate(kind, policy_spec)
    if not bad:
        try:  # the generators refuse what NGINX or the per-tenant caps cannot take
            if kind == UPSTREAM:
                upstream_directives("u", {kind: settings})
            else:
                location_directives({kind: settings})
        except PolicyValueError as e:
            text = str(e)
            fname = text.split(":", 1)[0].removeprefix(f"{kind} ")
            why = text.split(":", 1)[1].strip() if ":" in text else text
            bad.append((_BY_SETTING[kind].get(fname, fname), why))
    return [(f"spec.{f}", why.replace(f"{kind} ", f"{kind} ({GROUP}) ", 1)) for f, why in bad]


def invalid_message(kind: str, policy_spec: Mapping[str, Any] | None) -> str | None:
    bad = unsupported_in_policy(kind, policy_spec)
    if not bad:
        return None
    return "; ".join(f"{f}: {why}" for f, why in bad) + ". Nothing of this policy is programmed."


def kind_checks() -> dict[tuple[str, str], Any]:
    """For `analyse(kind_checks=...)`: an NGF policy this data plane cannot honour in full is Invalid."""
    checks: dict[tuple[str, str], Any] = {(GROUP, k): (lambda spec, _k=k: invalid_message(_k, spec)) for k in KINDS}
    for k in REFUSED:
        checks[(GROUP, k)] = lambda spec, _k=k: REFUSED_MESSAGE.format(kind=_k, group=GROUP)
    return checks


def approximation_message(kind: str, policy_spec: Mapping[str, Any] | None) -> str | None:
    if kind != CLIENT or not isinstance(policy_spec, Mapping) or not is_set(policy_spec, "body.timeout"):
        return None
    return ("spec.body.timeout is approximated by the nginx-1.22 data plane: longest wait between two "
            "successive reads of the request body.")


def enforcement(kind: str, dotted_field: str) -> str:
    info = FIELDS.get(kind, {}).get(dotted_field)
    return info.support if info is not None else UNSUPPORTED


# ---------------------------------------------------------------------------------------------
# precedence on one path


def depth_on(levels: tuple[Any, ...], outcomes: Mapping[Any, Any]) -> Callable[[Any], int]:
    """`depth(policy)` for `fold` and `winners` on a path of `levels` (Refs, GatewayClass first):
    the deepest level one of the policy's targets (`outcomes`: policy Ref -> its TargetOutcomes) is,
    -1 when none is on the path."""
    from gwpolicy.engine.refs import Ref

    def depth(policy: Any) -> int:
        if not isinstance(policy, Mapping):
            return -1
        ref = Ref(str(policy.get("group") or ""), str(policy.get("kind") or ""), policy.get("namespace"),
                  str(policy.get("name") or ""))
        declared = {o.declared for o in outcomes.get(ref, ()) if o.declared is not None}
        return max((i for i, level in enumerate(levels) if level in declared), default=-1)

    return depth


def _ref_key(policy: Any) -> tuple[str, str, str | None, str] | None:
    if not isinstance(policy, Mapping):
        return None
    return (str(policy.get("group") or ""), str(policy.get("kind") or ""), policy.get("namespace"), str(policy.get("name") or ""))


def fold(effective: dict[Any, Any], results: Mapping[tuple[str, str], Any], depth: Callable[[Any], int]) -> dict[Any, Any]:
    """The effective specs of one path with each NGF kind's result folded into our kind of the
    same name, field by field (the precedence in this module's docstring).

    `effective`: kind -> Effective as the data plane builds it (our kinds by name, others as
    "group/Kind"); `results`: (group, kind) -> the engine's Result on this path; `depth(policy)`:
    the level of the path (0 = GatewayClass, larger = more specific) that policy (a source's
    `policy` reference) targets. The NGF entries are taken out of the returned mapping."""
    out = dict(effective)
    for kind in KINDS:
        ngf = results.get((GROUP, kind))
        out.pop(f"{GROUP}/{kind}", None)
        if ngf is None:
            continue
        ours_res = results.get(("gwpolicy.io", kind))
        current = out.get(kind)
        ours = current if isinstance(current, Effective) else Effective.of(current or {})
        settings, _ = translate(kind, getattr(ngf, "spec", {}) or {})
        ngf_depth: dict[str, int] = {}
        for s in getattr(ngf, "sources", None) or ():
            info = FIELDS[kind].get(s["field"])
            if info is not None and info.setting:
                ngf_depth[info.setting] = depth(s.get("policy"))
        ours_depth: dict[str, int] = {}
        for s in (getattr(ours_res, "sources", None) or ()) if ours_res is not None else ():
            ours_depth[s["field"]] = depth(s.get("policy"))
        merged: dict[str, Any] = {}
        for leaf in spec_leaves(ours):
            merged[leaf] = field_value(ours, leaf)
        taken: list[str] = []
        for leaf in spec_leaves(settings):
            value = field_value(settings, leaf)
            if leaf in merged:
                if leaf in ours.overridden:
                    continue
                if ngf_depth.get(leaf, -1) <= ours_depth.get(leaf, -1):
                    continue
            merged[leaf] = value
            taken.append(leaf)
        if "_keepAliveHeader" in merged and "keepAlive.timeout" not in taken:
            merged.pop("_keepAliveHeader")  # the header goes with NGF's server timeout only
        spec: dict[str, Any] = {}
        for leaf, value in merged.items():
            _put(spec, leaf, value)
        new = Effective(spec)
        new.overridden = ours.overridden
        ngf_origin = {s["field"]: s.get("policy") for s in getattr(ngf, "sources", None) or ()}
        new.origin = {**ours.origin, **{leaf: _origin(ngf_origin.get(_BY_SETTING[kind].get(leaf, leaf))) for leaf in taken}}
        out[kind] = new
    return out


def _origin(policy: Any) -> str:
    key = _ref_key(policy)
    return f"{GROUP}/{key[1]}/{key[2] or ''}/{key[3]}" if key else GROUP


def winners(kind: str, ours: Any, ngf: Any, depth: Callable[[Any], int]) -> list[dict[str, Any]]:
    """Per field of our kind's naming that either sets on one path: both sources and which wins
    (for `describe` and `effective`)."""
    out: list[dict[str, Any]] = []
    ours_src = {s["field"]: s for s in (getattr(ours, "sources", None) or ())}
    ngf_src: dict[str, dict[str, Any]] = {}
    for s in getattr(ngf, "sources", None) or ():
        info = FIELDS.get(kind, {}).get(s["field"])
        if info is not None and info.setting:
            ngf_src[info.setting] = s
    for leaf in sorted(set(ours_src) | set(ngf_src)):
        o, n = ours_src.get(leaf), ngf_src.get(leaf)
        if o is not None and n is not None:
            if o.get("stanza") == "overrides" or depth(n.get("policy")) <= depth(o.get("policy")):
                win = "gwpolicy.io"
            else:
                win = GROUP
        else:
            win = "gwpolicy.io" if o is not None else GROUP
        out.append({"field": leaf, "gwpolicy.io": o.get("policy") if o else None,
                    GROUP: n.get("policy") if n else None, "ngfField": n.get("field") if n else None, "wins": win})
    return out
