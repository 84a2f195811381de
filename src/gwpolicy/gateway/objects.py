"""The objects as the gateway holds them: with the CRD defaults a server may not have applied, and
what of them counts as a change (an event that changes only status or bookkeeping is no reason for
a new analysis)."""

from __future__ import annotations

import copy
from typing import Any

from gwpolicy.engine.kinds import split_api_version
from gwpolicy.engine.refs import GATEWAY_GROUP

_VOLATILE_META = ("resourceVersion", "managedFields", "generation")


def with_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """The CRD defaults the gateway relies on, for objects from a server that did not apply them
    (parentRef group/kind, backendRef group/kind/weight, a rule's default match, a match's default
    path, a listener's allowedRoutes). Objects that carry them come back equal."""
    group, _ = split_api_version(raw.get("apiVersion", ""))
    if group != GATEWAY_GROUP or not isinstance(raw.get("spec"), dict):
        return raw
    kind = raw.get("kind")
    if kind not in ("HTTPRoute", "Gateway"):
        return raw
    raw = copy.deepcopy(raw)
    spec = raw["spec"]
    if kind == "Gateway":
        for l in spec.get("listeners") or []:
            if isinstance(l, dict):
                ar = l.setdefault("allowedRoutes", {})
                if isinstance(ar, dict):
                    ns = ar.setdefault("namespaces", {})
                    if isinstance(ns, dict):
                        ns.setdefault("from", "Same")
        return raw
    for p in spec.get("parentRefs") or []:
        if isinstance(p, dict):
            p.setdefault("group", GATEWAY_GROUP)
            p.setdefault("kind", "Gateway")
    rules = spec.get("rules")
    if rules is None:
        rules = spec["rules"] = [{}]
    for rule in rules if isinstance(rules, list) else []:
        if not isinstance(rule, dict):
            continue
        if not rule.get("matches"):
            rule["matches"] = [{"path": {"type": "PathPrefix", "value": "/"}}]
        for m in rule["matches"]:
            if isinstance(m, dict):
                path = m.setdefault("path", {"type": "PathPrefix", "value": "/"})
                if isinstance(path, dict):
                    path.setdefault("type", "PathPrefix")
                    path.setdefault("value", "/")
                for h in m.get("headers") or []:
                    if isinstance(h, dict):
                        h.setdefault("type", "Exact")
                for q in m.get("queryParams") or []:
                    if isinstance(q, dict):
                        q.setdefault("type", "Exact")
        for b in rule.get("backendRefs") or []:
            if isinstance(b, dict):
                b.setdefault("group", "")
                b.setdefault("kind", "Service")
                b.setdefault("weight", 1)
    return raw


def essence(raw: dict[str, Any]) -> Any:
    meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k not in _VOLATILE_META}
    return (raw.get("spec"), meta, {k: v for k, v in raw.items() if k not in ("spec", "metadata", "status")})

