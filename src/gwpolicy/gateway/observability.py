"""The status of ObservabilityPolicies (gateway.nginx.org) this gateway enforces.

The engine says where each policy attaches (a Direct policy on HTTPRoutes and GRPCRoutes; its
ancestors are its targets, as NGINX Gateway Fabric writes them); on top of that, per ancestor:
a spec this gateway cannot honour is `Accepted=False`, reason `Invalid`, naming the field; a route
none of whose Gateways (of ours) has an NginxProxy with a telemetry exporter is `Accepted=False`,
reason `NginxProxyNotSet`. Either way nothing of the policy is programmed there (render traces a
route only where its Gateway has an exporter and the policy's tracing is valid: gateway/tracing.py).

Pure: the analysis and facts in, functions of an object's newest copy out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gwpolicy.engine.analysis import utc_now
from gwpolicy.engine.refs import GATEWAY_GROUP, Ref
from gwpolicy.gateway import nginxproxy, tracing
from gwpolicy.gateway.policystatus import enforced_here, in_place, policy_ancestors_of
from gwpolicy.gateway.status import without_our_entries

NGINX_PROXY_NOT_SET = "NginxProxyNotSet"
INVALID = "Invalid"


def _exporting(route: Ref, facts: Any, index: Any) -> tuple[list[str], list[str]]:
    """(Gateways of ours the route attaches to that export spans, those that do not), as names."""
    yes, no = [], []
    rf = facts.routes.get(route)
    for gw_ref in sorted({p.gateway for p in rf.parents} if rf is not None else set(), key=Ref.sort_key):
        gw = index.get(gw_ref)
        name = f"{gw_ref.namespace}/{gw_ref.name}"
        if gw is not None and nginxproxy.exporter(nginxproxy.effective(gw, index), gw) is not None:
            yes.append(name)
        else:
            no.append(name)
    return yes, no


def _verdict(entry: dict[str, Any], problems: list[str], facts: Any, index: Any) -> None:
    """Our Accepted condition of one ancestor entry, with this data plane's checks on top."""
    cond = next((c for c in entry.get("conditions") or [] if c.get("type") == "Accepted"), None)
    if cond is None or cond.get("status") != "True":
        return
    aref = entry.get("ancestorRef") or {}
    if problems:
        cond.update(status="False", reason=INVALID,
                    message="The policy is not accepted: " + "; ".join(problems) + ". Nothing of it is programmed.")
        return
    if aref.get("kind") not in tracing.TARGET_KINDS:
        return
    route = Ref(aref.get("group") or GATEWAY_GROUP, str(aref.get("kind")), aref.get("namespace"), str(aref.get("name")))
    yes, no = _exporting(route, facts, index)
    if not yes:
        cond.update(status="False", reason=NGINX_PROXY_NOT_SET, message=(
            "The policy is not accepted: it relies on the NginxProxy of the route's Gateways, which sets no "
            f"telemetry exporter (spec.telemetry.exporter.endpoint) or is missing or invalid: {', '.join(no) or 'none'}. "
            "Nothing of it is programmed."))
    elif no:
        cond["message"] = (f"{cond.get('message', '').rstrip()} Traced through {', '.join(yes)}; not through "
                           f"{', '.join(no)}, whose NginxProxy sets no telemetry exporter.").strip()


def _ancestors(obj: Any) -> list[dict[str, Any]]:
    st = obj.raw.get("status")
    return [e for e in (st.get("ancestors") or []) if isinstance(e, dict)] if isinstance(st, dict) else []


def _keep_transition(entry: dict[str, Any], prev: dict[str, Any] | None) -> None:
    """lastTransitionTime moves only when the condition's status does (a verdict changed here after
    the engine's condition was made must not look like a transition on every pass)."""
    prev_cond = next((c for c in (prev or {}).get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Accepted"), None)
    cond = next((c for c in entry.get("conditions") or [] if c.get("type") == "Accepted"), None)
    if cond is not None and prev_cond is not None and prev_cond.get("status") == cond.get("status") \
            and prev_cond.get("lastTransitionTime"):
        cond["lastTransitionTime"] = prev_cond["lastTransitionTime"]


def statuses(analysis: Any, index: Any, facts: Any, controller: str, only: set[Ref] | None = None) -> dict[Ref, Any]:
    """Ancestor entries under `controller` for the ObservabilityPolicies that reach our Gateways
    (`only`: these policies); a policy that no longer does loses our entries."""
    from gwpolicy.engine.status import policy_status as engine_policy_status

    out: dict[Ref, Any] = {}
    topo = analysis.topology
    chosen = analysis.policies.items() if only is None else (
        (r, analysis.policies[r]) for r in sorted(only, key=Ref.sort_key) if r in analysis.policies)
    for ref, policy in chosen:
        if (ref.group, ref.kind) != (tracing.GROUP, tracing.KIND) or ref not in index.by_ref:
            continue
        if not enforced_here(policy_ancestors_of(analysis, ref), facts):
            out[ref] = lambda obj: without_our_entries(obj, controller)
            continue
        outcomes = analysis.outcomes.get(ref, [])

        def status(obj: Any, _p: Any = policy, _o: Any = outcomes) -> dict[str, Any]:
            st = engine_policy_status(dataclasses.replace(_p, obj=obj), _o, topo, controller, utc_now())
            problems = tracing.spec_problems(obj.spec)
            before = {repr(e.get("ancestorRef")): e for e in _ancestors(obj) if e.get("controllerName") == controller}
            for entry in st.get("ancestors") or []:
                if entry.get("controllerName") == controller:
                    _verdict(entry, problems, facts, index)
                    _keep_transition(entry, before.get(repr(entry.get("ancestorRef"))))
            return in_place(obj, st, controller)

        out[ref] = status
    return out
