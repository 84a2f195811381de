"""GEP-1364 status of the objects the gateway serves, computed from the facts (gateway/facts.py)
and what the edge reports about NGINX.

Pure: `Programming` is what the edge reports about NGINX (which objects, at which generation, the
running configuration holds, and the last failure); `desired_status` turns the facts and it into
the `status` an object should carry, keeping what other controllers wrote (their `status.parents`
entries, the policy controller's `gwpolicy.io/*Affected` conditions) where it is. Computing it over
an object that already carries it changes nothing: transition times move only when a condition's
status changes.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from gwpolicy.engine.model import Obj, ObjectIndex
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP, Ref
from gwpolicy.gateway import frontendtls
from gwpolicy.gateway.facts import (
    GATEWAY_CONDITION_TYPES,
    SUPPORTED_FEATURES,
    Cond,
    Facts,
    GatewayFacts,
    RouteFacts,
    is_ip_address,
    route_objects,
)
from gwpolicy.gateway.isolate import without_paths

#: GEP-713 "GatewayClass status Extension Types listing": the API has no field yet, so an annotation
#: on the GatewayClass lists the policy kinds this gateway enforces, as `Kind.group`, comma-separated
POLICY_KINDS_ANNOTATION = "gateway.gwpolicy.io/supported-policy-kinds"


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}

@dataclass
class Programming:
    """What NGINX runs, as the edge saw it after its last apply.

    `generations`: each object the running configuration was built from, with its
    metadata.generation then; `error`: why the last configuration could not be applied (the previous
    one keeps serving), or None; `addresses`: Gateway -> the addresses it is served on;
    `listeners`: listener Ref -> (rendered, reason, message) as the data plane model built it (a
    listener the data plane could not render is not Programmed, whatever the rest says).
    """

    generations: dict[Ref, int | None] = field(default_factory=dict)
    error: str | None = None
    addresses: dict[Ref, list[str]] = field(default_factory=dict)
    listeners: dict[Ref, tuple[bool, str, str]] = field(default_factory=dict)
    #: routes the data plane left out (NGINX refused them, or their namespace's budget is spent):
    #: route -> (reason, message) of their parents' Accepted=False
    left_out: dict[Ref, tuple[str, str]] = field(default_factory=dict)

    def runs(self, obj: Obj) -> bool:
        return obj.ref in self.generations and self.generations[obj.ref] == obj.generation


# ---------------------------------------------------------------- status

def policy_kinds_annotation(kinds: Iterable[str]) -> str:
    return ",".join(sorted(set(kinds)))


def desired_status(obj: Obj, facts: Facts, programming: Programming, now: str) -> dict[str, Any] | None:
    """The `status` the object should carry after our write; None when it is none of ours."""
    ref = obj.ref
    if ref in facts.classes:
        return _class_status(obj, facts, now)
    if ref in facts.gateways:
        return _gateway_status(obj, facts.gateways[ref], facts, programming, now)
    if ref in facts.routes:
        return _route_status(obj, facts.routes[ref], facts, now, programming.left_out.get(ref))
    return without_our_entries(obj, facts.controller)


def without_our_entries(obj: Obj, controller: str) -> dict[str, Any] | None:
    """For an object that is no longer ours (its parentRefs no longer name our Gateways, a policy
    that no longer reaches one): its status without the entries we wrote; None when it has none."""
    status = _dict(obj.raw.get("status"))
    for key in ("parents", "ancestors"):
        entries = status.get(key)
        if isinstance(entries, list) and any(isinstance(e, dict) and e.get("controllerName") == controller for e in entries):
            out = copy.deepcopy(status)
            out[key] = [e for e in entries if not (isinstance(e, dict) and e.get("controllerName") == controller)]
            return out
    return None


def _merge_conditions(prev: Any, ours: list[dict[str, Any]], owned: Iterable[str]) -> list[dict[str, Any]]:
    """Our conditions replace ours where they are, new ones go last, others' stay where they are: a
    controller that appends its own after everyone else's then sees the same list (no ping-pong)."""
    owned = set(owned)
    by_type = {c["type"]: c for c in ours}
    out = []
    for c in prev or []:
        if not isinstance(c, dict):
            continue
        if c.get("type") in owned:
            if c["type"] in by_type:
                out.append(by_type.pop(c["type"]))
        else:
            out.append(c)
    return out + [c for c in ours if c["type"] in by_type]


def _class_status(gc: Obj, facts: Facts, now: str) -> dict[str, Any]:
    status = copy.deepcopy(_dict(gc.raw.get("status")))
    prev = status.get("conditions")
    gen = gc.generation
    ours = [facts.classes[gc.ref], facts.class_versions[gc.ref]]
    status["conditions"] = _merge_conditions(prev, [c.to_json(gen, prev, now) for c in ours], GATEWAY_CONDITION_TYPES)
    status["supportedFeatures"] = [{"name": n} for n in sorted(SUPPORTED_FEATURES)]
    return status


def _gateway_status(gw: Obj, gf: GatewayFacts, facts: Facts, programming: Programming, now: str) -> dict[str, Any]:
    """`gw` is the newest copy (its status is what we merge into); `gf` what its spec gave."""
    status = copy.deepcopy(_dict(gw.raw.get("status")))
    prev = status.get("conditions")
    gen = gw.generation
    running = programming.runs(gw)
    addresses = programming.addresses.get(gf.ref, [])
    if not gf.accepted.status:
        programmed = Cond("Programmed", False, "Invalid", "The Gateway is not accepted: " + gf.accepted.message)
    elif programming.error and not running:
        programmed = Cond("Programmed", False, "Invalid", "The Gateway is not programmed due to a failure to reload nginx "
                                                          f"with the configuration: {without_paths(programming.error)}")
    elif programming.error:  # the Gateway is as NGINX last loaded it, but other objects changed since
        programmed = Cond("Programmed", False, "Pending",
                          "NGINX serves an older configuration: it did not load the newest one, which nothing could be "
                          f"left out of to make it load: {without_paths(programming.error)}")
    elif not addresses:
        programmed = Cond("Programmed", False, "AddressNotAssigned", "No address is assigned yet.")
    elif gf.listeners and all(programming.listeners.get(gf.ref.with_section(n), (True, "", ""))[1] == "PortUnavailable"
                              for n in gf.listeners):  # NGINX could bind none of its ports: it serves nothing of it
        ports = "; ".join(f"{n}: {programming.listeners[gf.ref.with_section(n)][2]}" for n in gf.listeners)
        programmed = Cond("Programmed", False, "Invalid", f"No listener of this Gateway is served: {ports}")
    elif running and gf.unusable_addresses:  # served, on the addresses of its family only
        programmed = Cond("Programmed", False, "AddressNotUsable", gf.unusable_addresses)
    elif running:
        programmed = Cond("Programmed", True, "Programmed", "NGINX serves the configuration of this Gateway.")
    else:
        programmed = Cond("Programmed", False, "Pending", "Waiting for NGINX to load the configuration.")
    ours = [gf.accepted, programmed] + ([gf.resolved_refs] if gf.resolved_refs is not None else [])
    insecure = sorted(lf.name for lf in gf.listeners.values()
                      if lf.client_cas and lf.client_mode == frontendtls.ALLOW_INSECURE_FALLBACK)
    if insecure:  # GEP-91: said on the Gateway while any listener lets unverified clients in
        ours.append(Cond("InsecureFrontendValidationMode", True, "ConfigurationChanged",
                         f"Listeners {', '.join(insecure)} accept clients whose certificate is missing or does not "
                         "verify (spec.tls.frontend validation mode AllowInsecureFallback)."))
    status["conditions"] = _merge_conditions(prev, [c.to_json(gen, prev, now) for c in ours], GATEWAY_CONDITION_TYPES)
    status["addresses"] = ([{"type": "IPAddress" if is_ip_address(a) else "Hostname", "value": a} for a in addresses]
                           if gf.accepted.status else [])
    old_listeners = {l.get("name"): l for l in status.get("listeners") or [] if isinstance(l, dict)}
    listeners = []
    for lf in gf.listeners.values():
        lprev = (old_listeners.get(lf.name) or {}).get("conditions")
        if lf.conflicted.status:  # the conflict's reason, as the upstream suite's conflict tests expect
            lprog = Cond("Programmed", False, lf.conflicted.reason, f"The listener is not programmed: {lf.conflicted.message}")
        elif not lf.servable:
            why = next(c for c in (lf.accepted, lf.resolved_refs) if not c.status)
            lprog = Cond("Programmed", False, "Invalid", f"The listener is not programmed: {why.message}")
        elif not programming.listeners.get(gf.ref.with_section(lf.name), (True, "", ""))[0]:
            _, reason, message = programming.listeners[gf.ref.with_section(lf.name)]
            lprog = Cond("Programmed", False, "Invalid", f"The data plane does not serve this listener ({reason}): {message}")
        elif programmed.status or programmed.reason == "AddressNotUsable":
            lprog = Cond("Programmed", True, "Programmed", "NGINX serves this listener.")
        else:
            lprog = Cond("Programmed", False, programmed.reason, programmed.message)
        accepted = lf.accepted
        rendered = programming.listeners.get(gf.ref.with_section(lf.name))
        if rendered is not None and not rendered[0] and rendered[1] == "PortUnavailable":
            accepted = Cond("Accepted", False, "PortUnavailable", rendered[2])  # GEP-1364 says it with Accepted
        conds = [accepted, lprog, lf.resolved_refs, lf.conflicted]
        listeners.append({
            "name": lf.name,
            "supportedKinds": [dict(k) for k in lf.supported_kinds],
            "attachedRoutes": lf.attached_routes,
            "conditions": [c.to_json(gen, lprev, now) for c in conds],
        })
    status["listeners"] = listeners
    return status


def _route_status(route: Obj, rf: RouteFacts, facts: Facts, now: str,
                  left_out: tuple[str, str] | None = None) -> dict[str, Any]:
    status = copy.deepcopy(_dict(route.raw.get("status")))
    existing = [p for p in status.get("parents") or [] if isinstance(p, dict)]
    gen = route.generation
    ours: dict[tuple, dict[str, Any]] = {}
    for pf in rf.parents:
        key = _pkey(pf.parent_ref, route)
        prev = next((p.get("conditions") for p in existing
                     if p.get("controllerName") == facts.controller and _pkey(_dict(p.get("parentRef")), route) == key), None)
        accepted = pf.accepted
        if left_out is not None and accepted.status:  # the data plane serves nothing of it
            accepted = Cond("Accepted", False, *left_out)
        ours[key] = {"parentRef": pf.parent_ref, "controllerName": facts.controller,
                     "conditions": [accepted.to_json(gen, prev, now), rf.resolved_refs.to_json(gen, prev, now)]}
    parents = []
    for p in existing:  # others' entries stay where they are; ours are replaced in place or dropped
        if p.get("controllerName") != facts.controller:
            parents.append(p)
            continue
        key = _pkey(_dict(p.get("parentRef")), route)
        if key in ours:
            parents.append(ours.pop(key))
    parents.extend(ours.values())
    status["parents"] = parents
    return status


def _pkey(pref: dict[str, Any], route: Obj) -> tuple:
    return (pref.get("group") if pref.get("group") is not None else GATEWAY_GROUP, pref.get("kind") or "Gateway",
            pref.get("namespace") or route.namespace or "", pref.get("name") or "",
            pref.get("sectionName") or "", pref.get("port") or 0)


def class_annotations(gc: Obj, policy_kinds: Iterable[str]) -> dict[str, str]:
    """The annotations the GatewayClass should carry: ours set, others kept."""
    ann = dict(gc.metadata.get("annotations") or {}) if isinstance(gc.metadata.get("annotations"), dict) else {}
    ann[POLICY_KINDS_ANNOTATION] = policy_kinds_annotation(policy_kinds)
    return ann


def all_desired(index: ObjectIndex, facts: Facts, programming: Programming, now: str) -> dict[Ref, dict[str, Any]]:
    """Every object of ours -> the status it should carry; and routes that carry an entry of ours
    but no longer name our Gateways -> their status without it."""
    out: dict[Ref, dict[str, Any]] = {}
    for refs in (facts.classes, facts.gateways, facts.routes, stale_routes(index, facts)):
        for ref in refs:
            obj = index.by_ref.get(ref)
            if obj is not None:
                st = desired_status(obj, facts, programming, now)
                if st is not None:
                    out[ref] = st
    return out


def stale_routes(index: ObjectIndex, facts: Facts) -> list[Ref]:
    """Routes that are not ours (now) but carry a `status.parents` entry of ours."""
    return [r.ref for r in route_objects(index)
            if r.ref not in facts.routes and without_our_entries(r, facts.controller) is not None]


# ---------------------------------------------------------------- policies the gateway enforces

def policy_ancestors(policy: Obj, facts: Facts) -> list[Ref]:
    """Our Gateways that send traffic to a Service the policy targets (through an accepted parent of
    an HTTPRoute or a GRPCRoute: a TLSRoute's connections pass through untouched, no backend policy applies)."""
    spec = _dict(policy.spec)
    targets = {Ref(CORE_GROUP, "Service", policy.namespace, str(t.get("name", "")))
               for t in spec.get("targetRefs") or [] if isinstance(t, dict)
               and (t.get("group") or CORE_GROUP) == CORE_GROUP and (t.get("kind") or "Service") == "Service"}
    out: dict[Ref, None] = {}
    for rf in facts.routes.values():
        if rf.ref.kind not in ("HTTPRoute", "GRPCRoute") or not any(b.ref in targets for b in rf.backends):
            continue
        for p in rf.parents:
            if p.accepted.status:
                out[p.gateway] = None
    return sorted(out, key=Ref.sort_key)


def policy_status(policy: Obj, conditions: list[dict[str, str]], facts: Facts, now: str) -> dict[str, Any]:
    """A policy's `status.ancestors` with our entries (one per Gateway of ours it takes effect
    through, with `conditions`) and everyone else's kept in place."""
    status = copy.deepcopy(_dict(policy.raw.get("status")))
    existing = [a for a in status.get("ancestors") or [] if isinstance(a, dict)]
    gen = policy.generation
    ours: dict[tuple, dict[str, Any]] = {}
    for gw in policy_ancestors(policy, facts):
        aref = {"group": GATEWAY_GROUP, "kind": "Gateway", "namespace": gw.namespace, "name": gw.name}
        key = _pkey(aref, policy)
        prev = next((a.get("conditions") for a in existing if a.get("controllerName") == facts.controller
                     and _pkey(_dict(a.get("ancestorRef")), policy) == key), None)
        ours[key] = {"ancestorRef": aref, "controllerName": facts.controller,
                     "conditions": [Cond(c["type"], c["status"] == "True", c["reason"], c.get("message", "")).to_json(gen, prev, now)
                                    for c in conditions]}
    ancestors = []
    for a in existing:
        if a.get("controllerName") != facts.controller:
            ancestors.append(a)
            continue
        key = _pkey(_dict(a.get("ancestorRef")), policy)
        if key in ours:
            ancestors.append(ours.pop(key))
    ancestors.extend(ours.values())
    status["ancestors"] = ancestors[:16]
    return status


def keep_in_place(previous: Any, computed: list[dict[str, Any]], controller: str, key: str) -> list[dict[str, Any]]:
    """`computed` (others' entries and ours, in any order) laid out like `previous`: every entry stays
    where it was, ours replaced in place, new ones of ours last. Two controllers that each append
    their own entries after the others' would otherwise swap the order on every write."""
    def k(e: dict[str, Any]) -> tuple:
        return (e.get("controllerName"), json_key(e.get(key)))

    fresh = {k(e): e for e in computed if isinstance(e, dict)}
    out = []
    for e in previous or []:
        if isinstance(e, dict) and k(e) in fresh:
            out.append(fresh.pop(k(e)))
    return out + [e for e in computed if isinstance(e, dict) and k(e) in fresh]


def json_key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)
