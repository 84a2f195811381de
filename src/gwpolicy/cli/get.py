"""`gwpolicy get policies|policykinds|TYPE`: kubectl-style lists with what policy attachment adds."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from gwpolicy.attach import ACCEPTED, SEVERITY
from gwpolicy.cli.context import Ctx, label
from gwpolicy.cli.printers import age, table
from gwpolicy.cli.resources import NotFound, ResourceType, find_object, plural_of, resolve_type
from gwpolicy.output import encode
from gwpolicy.refs import Ref

MAX_TARGETS = 2


def accepted_column(outcomes) -> tuple[str, str]:
    """(ACCEPTED, REASON): True, False, or k/n accepted, and the worst reason."""
    ok = sum(1 for o in outcomes if o.reason == ACCEPTED)
    worst = max(outcomes, key=lambda o: SEVERITY[o.reason]).reason if outcomes else ACCEPTED
    if ok == len(outcomes):
        return "True", worst
    if ok == 0:
        return "False", worst
    return f"{ok}/{len(outcomes)}", worst


def _targets_text(outcomes, home: str | None, wide: bool) -> str:
    names = [label(o.declared, home) if o.declared is not None else "<none>" for o in outcomes]
    if not wide and len(names) > MAX_TARGETS:
        return ",".join(names[:MAX_TARGETS]) + f",+{len(names) - MAX_TARGETS} more"
    return ",".join(names)


def get_policies(ctx: Ctx, kind_filter: tuple[str, str] | None = None, name: str | None = None) -> tuple[bytes, str | None]:
    a = ctx.analysis
    refs = [r for r in sorted(a.policies, key=lambda r: (r.namespace or "", r.name, r.kind))
            if ctx.in_scope(r) and (kind_filter is None or a.policies[r].kind.key == kind_filter)
            and (name is None or r.name == name)]
    if not refs and name is not None:
        raise NotFound(f'policies "{name}" not found')
    if not refs:
        return b"", ctx.none_found()
    if ctx.output in ("json", "yaml"):
        items = [_with_status(ctx, r) for r in refs]
        return encode({"apiVersion": "v1", "kind": "List", "items": items}, ctx.output), None
    if ctx.output == "name":
        return "".join(f"{_qualified(a, r)}/{r.name}\n" for r in refs).encode(), None
    wide = ctx.output == "wide"
    headers = (["NAMESPACE"] if ctx.all_namespaces else []) + ["NAME", "KIND", "TARGETS", "ACCEPTED", "AFFECTS", "AGE"]
    if wide:
        headers += ["CLASS", "STRATEGY", "REASON"]
    rows = []
    for r in refs:
        p = a.policies[r]
        outs = a.outcomes[r]
        acc, reason = accepted_column(outs)
        row = ([r.namespace or ""] if ctx.all_namespaces else []) + [
            r.name, p.kind.kind, _targets_text(outs, r.namespace, wide), acc,
            str(len(a.objects_affected_by(r))), age(p.obj.created, a.now)]
        if wide:
            row += [p.cls, p.kind.strategy, reason]
        rows.append(row)
    return table(headers, rows).encode(), None


def _qualified(a, ref: Ref) -> str:
    return f"{ref.kind.lower()}.{ref.group}" if ref.group else ref.kind.lower()


def _with_status(ctx: Ctx, ref: Ref) -> dict[str, Any]:
    """The object as it would read after the controller's write."""
    raw = copy.deepcopy(ctx.analysis.index.by_ref[ref].raw)
    ch = ctx.analysis.status_change_of(ref)
    if ch is not None:
        raw["status"] = ch.status
        if ch.annotations:
            raw["metadata"]["annotations"] = ch.annotations
    return raw


def get_policykinds(ctx: Ctx) -> tuple[bytes, str | None]:
    a = ctx.analysis
    kinds = sorted(a.kinds.values(), key=lambda k: (k.kind, k.group))
    counts = Counter(p.kind.key for p in a.policies.values())
    if ctx.output in ("json", "yaml"):
        items = [{"group": k.group, "kind": k.kind, "recognizedBy": k.recognized_by,
                  "attachment": k.attachment, "mergeStrategy": k.strategy, "statusAncestor": k.status_ancestor,
                  "targetKinds": [{"group": g, "kind": kk} for g, kk in k.target_kinds] if k.target_kinds is not None else None,
                  "policies": counts[k.key]} for k in kinds]
        return encode({"apiVersion": "gwpolicy.io/v1alpha1", "kind": "PolicyKindList", "items": items}, ctx.output), None
    if ctx.output == "name":
        return "".join(f"policykind/{plural_of(k.kind)}.{k.group}\n" for k in kinds).encode(), None
    headers = ["KIND", "GROUP", "RECOGNIZED-BY", "CLASS", "STRATEGY", "STATUS-ANCESTOR", "POLICIES"]
    if ctx.output == "wide":
        headers.append("TARGET-KINDS")
    rows = []
    for k in kinds:
        cls = {"Inherited": "inherited", "Direct": "direct"}.get(k.attachment or "", "by stanza")
        if k.strategy == "None":
            cls = "direct"
        row = [k.kind, k.group or "(core)", k.recognized_by, cls, k.strategy, k.status_ancestor, str(counts[k.key])]
        if ctx.output == "wide":
            row.append(",".join(kk for _, kk in k.target_kinds) if k.target_kinds is not None else "any")
        rows.append(row)
    return table(headers, rows).encode(), None


def get_type(ctx: Ctx, rt: ResourceType, name: str | None = None) -> tuple[bytes, str | None]:
    """Targetable (or any) objects of one type with the policies that affect them."""
    a = ctx.analysis
    if (rt.group, rt.kind) in a.kinds:
        return get_policies(ctx, (rt.group, rt.kind), name)
    refs = [o.ref for o in a.index.of_kind(rt.group, rt.kind) if ctx.in_scope(o.ref)]
    if rt.kind == "Namespace" and rt.group == "":
        refs = sorted({Ref("", "Namespace", None, n) for n in a.index.namespaces}, key=Ref.sort_key)
    if name is not None:
        refs = [r for r in refs if r.name == name]
    if not refs:
        return b"", ctx.none_found()
    if ctx.output in ("json", "yaml"):
        items = [_with_status(ctx, r) for r in refs if r in a.index.by_ref]
        return encode({"apiVersion": "v1", "kind": "List", "items": items}, ctx.output), None
    if ctx.output == "name":
        return "".join(f"{rt.qualified}/{r.name}\n" for r in refs).encode(), None
    headers = (["NAMESPACE"] if ctx.all_namespaces and rt.namespaced else []) + ["NAME", "POLICIES", "AGE"]
    if ctx.output == "wide":
        headers += ["PATHS", "POLICY-KINDS"]
    rows = []
    for r in refs:
        obj = a.index.by_ref.get(r)
        row = ([r.namespace or ""] if ctx.all_namespaces and rt.namespaced else []) + [
            r.name, str(len(a.policies_affecting(r))), age(obj.created, a.now) if obj else "<unknown>"]
        if ctx.output == "wide":
            row += [str(len(a.topology.paths.get(r, ()))),
                    ",".join(sorted(k for _, k in a.affected.get(r, {}))) or "<none>"]
        rows.append(row)
    return table(headers, rows).encode(), None


def cmd_get(ctx: Ctx, what: str, name: str | None = None) -> tuple[bytes, str | None]:
    low = what.lower()
    if low in ("policies", "policy", "pol"):
        return get_policies(ctx, name=name)
    if low in ("policykinds", "policykind"):
        return get_policykinds(ctx)
    rt = resolve_type(what, ctx.analysis)
    if name is not None:
        find_object(ctx.analysis, f"{what}/{name}", ctx.namespace)
    return get_type(ctx, rt, name)
