"""The status of the policies this gateway enforces: which reach one of its Gateways, and the
ancestor entries it writes under its controllerName (the engine's outcome with this data plane's
checks, and a note where NGINX honours a field only approximately)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gwpolicy.engine.analysis import utc_now
from gwpolicy.engine.model import Obj
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway.status import keep_in_place, policy_status, without_our_entries


def in_place(obj: Obj, status: dict[str, Any], controller: str) -> dict[str, Any]:
    """The engine's policy status with every ancestor entry where the object has it."""
    previous = (obj.raw.get("status") or {}).get("ancestors") if isinstance(obj.raw.get("status"), dict) else None
    status["ancestors"] = keep_in_place(previous, status.get("ancestors") or [], controller, "ancestorRef")
    return status


def with_note(status: dict[str, Any], controller: str, note: str | None) -> dict[str, Any]:
    """Our accepted entries say which fields NGINX honours only approximately, and how."""
    if note:
        for a in status.get("ancestors") or []:
            if a.get("controllerName") != controller:
                continue
            for c in a.get("conditions") or []:
                if c.get("type") == "Accepted" and c.get("status") == "True" and note not in c.get("message", ""):
                    c["message"] = f"{c.get('message', '').rstrip()} {note}".strip()
    return status



def kind_checks() -> Any:
    """This data plane's checks of the policy kinds it enforces (gateway/policyconf.py)."""
    from gwpolicy.gateway import policyconf

    return policyconf.kind_checks()


def policy_ancestors_of(analysis: Any, ref: Ref) -> set[Ref]:
    """The Gateways on the paths of what a policy targets (not through a TLSRoute: passthrough
    connections are never HTTP, so none of the policy kinds this gateway enforces reaches them)."""
    out: set[Ref] = set()
    for o in analysis.outcomes.get(ref, []):
        if o.declared is None or o.declared.kind == "TLSRoute" or not analysis.topology.exists(o.declared):
            continue
        for path in analysis.topology.paths_of(o.declared):
            for level in path:
                if level.kind == "Gateway" and level.group == GATEWAY_GROUP and level.section is None:
                    out.add(level)
    return out


def enforced_here(gateways: set[Ref], facts: Any) -> bool:
    """Whether a policy reaches one of our Gateways (else it is none of this gateway's business)."""
    return any(g in facts.gateways for g in gateways)



def policy_statuses(analysis: Any, index: Any, facts: Any, controller: str,
                    only: set[Ref] | None = None) -> dict[Ref, Any]:
    """Ancestor entries under `controller` for the policies this gateway enforces: the
    BackendTLSPolicy conditions are the engine's rules for it; the gwpolicy.io kinds' are the
    engine's outcome with this data plane's checks (a field NGINX cannot honour makes the policy
    Invalid). `only`: these policies (the others' entries are what they were)."""
    from gwpolicy.engine.status import policy_status as engine_policy_status
    from gwpolicy.gateway import backendtls, ngfpolicies, policyconf

    out: dict[Ref, Any] = {}
    for ref, conds in backendtls.all_conditions(analysis).items():
        if ref in index.by_ref and (only is None or ref in only):
            out[ref] = lambda obj, _c=conds, _f=facts: policy_status(obj, _c, _f, utc_now())
    enforced = ({(policyconf.GROUP, k) for k in policyconf.KINDS} | {(ngfpolicies.GROUP, k) for k in ngfpolicies.KINDS}
                | {(ngfpolicies.GROUP, k) for k in ngfpolicies.REFUSED})  # refused: their status says so
    topo = analysis.topology
    chosen = analysis.policies.items() if only is None else (
        (r, analysis.policies[r]) for r in sorted(only, key=Ref.sort_key) if r in analysis.policies)
    for ref, policy in chosen:
        if (ref.group, ref.kind) not in enforced or ref not in index.by_ref:
            continue
        if not enforced_here(policy_ancestors_of(analysis, ref), facts):
            # if it reached us before, our entries go (judged on its newest copy, which our
            # writes since the last full pass are in)
            out[ref] = lambda obj: without_our_entries(obj, controller)
            continue
        outcomes = analysis.outcomes.get(ref, [])
        note = (ngfpolicies.approximation_message if ref.group == ngfpolicies.GROUP
                else policyconf.approximation_message)(ref.kind, policy.obj.spec)
        out[ref] = lambda obj, _p=policy, _o=outcomes, _n=note: in_place(obj, with_note(engine_policy_status(
            dataclasses.replace(_p, obj=obj), _o, topo, controller, utc_now()), controller, _n), controller)
    return out


def enforced_policy_kinds() -> list[str]:
    """The policy kinds this gateway enforces, for the GatewayClass's policy-kinds annotation."""
    from gwpolicy.gateway import ngfpolicies, policyconf

    return sorted([f"{k}.{policyconf.GROUP}" for k in policyconf.KINDS] + [f"{k}.{ngfpolicies.GROUP}" for k in ngfpolicies.KINDS]
                  + ["BackendTLSPolicy.gateway.networking.k8s.io"])
