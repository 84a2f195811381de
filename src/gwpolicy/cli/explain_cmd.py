"""`gwpolicy explain TYPE/NAME FIELD`: the whole precedence ladder of one field on every path."""

from __future__ import annotations

from typing import Any

from gwpolicy.cli.context import Ctx, from_line, label, short
from gwpolicy.cli.describe import indent, path_text, show
from gwpolicy.cli.resources import NotFound
from gwpolicy.engine.explain import ladder
from gwpolicy.engine.refs import Ref
from gwpolicy.files.output import encode
from gwpolicy.files.printers import table


def _matches(candidate_field: str, wanted: str) -> bool:
    return candidate_field == wanted or candidate_field.startswith((wanted + ".", wanted + "["))


def cmd_explain(ctx: Ctx, target: Ref, fieldname: str, kind: str | None) -> bytes:
    a = ctx.analysis
    blocks: list[dict[str, Any]] = []
    rf = ctx.requests_from
    for ep in a.effective_of(target):
        if kind and ep.kind.kind.lower() != kind.lower() or not ctx.keeps(ep.path):
            continue
        cands = [c for c in ladder(a, ep) if _matches(c.field, fieldname)]
        if not cands:
            continue
        effective = {c.field: c.value for c in cands if c.verdict == "effective"}
        blocks.append({"path": ep.path, "kind": ep.kind, "candidates": cands, "effective": effective})
    if not blocks:
        raise NotFound(f'field "{fieldname}" is not set by any policy on {label(target)}'
                       + ("" if rf is None else f" for requests from namespace {rf.namespace}"))
    if ctx.output in ("json", "yaml"):
        doc = {"apiVersion": "gwpolicy.io/v1alpha1", "kind": "FieldExplanation", "target": target.to_target_json(),
               "field": fieldname, **({} if rf is None else {"from": rf.namespace}),
               "paths": [{"path": [lv.to_json() for lv in b["path"]], "policyKind": b["kind"].to_json(),
                          "strategy": b["kind"].strategy, "effective": b["effective"],
                          "candidates": [c.to_json() for c in b["candidates"]]} for b in blocks]}
        return encode(doc, ctx.output)
    s = ctx.style
    out = from_line(ctx, None if rf is None else rf.namespace)
    for b in blocks:
        out += s.bold(f"{b['kind'].kind} ({b['kind'].strategy})") + f" on {label(target)}\n"
        out += s.dim("Path: ") + path_text(b["path"], target.namespace) + ctx.path_note(b["path"]) + "\n"
        rows = []
        for i, c in enumerate(b["candidates"], 1):
            rank = str(i) if c.verdict != "conflicted" else "-"
            rows.append([rank, c.field, show(c.value), c.stanza, f"{c.policy.kind}/{short(c.policy)}" if c.policy else "object",
                         label(c.level, target.namespace) if c.level else "-",
                         s.state(c.verdict) if c.verdict == "effective" else s.bad(c.verdict), c.why])
        out += indent(table(["#", "FIELD", "VALUE", "STANZA", "FROM", "LEVEL", "VERDICT", "WHY"], rows)) + "\n"
    return out.encode()
