"""`impact` (what deleting a policy would change) and `whatif` (what an edit or deletion would change)."""

from __future__ import annotations

from typing import Any, Callable

from gwpolicy.cli.context import Ctx, from_line, label, requests_from
from gwpolicy.cli.describe import affected_from, indent, show
from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.explain import diff_effective, diff_status
from gwpolicy.engine.model import build_index
from gwpolicy.engine.refs import Ref
from gwpolicy.files.output import encode
from gwpolicy.files.printers import table


def _ref_of(j: dict[str, Any]) -> Ref:
    return Ref(j["group"], j["kind"], j.get("namespace"), j["name"], j.get("sectionName"))


def _changes_table(changes: list[dict[str, Any]], home: str | None) -> str:
    """One row per target, kind, field and change, with how many paths it happens on."""
    rows: dict[tuple, int] = {}
    for ch in changes:
        key = (label(_ref_of(ch["target"]), home), ch["policyKind"]["kind"], ch["field"],
               "<unset>" if ch["before"] is None else show(ch["before"]),
               "<unset>" if ch["after"] is None else show(ch["after"]))
        rows[key] = rows.get(key, 0) + 1
    return table(["TARGET", "KIND", "FIELD", "BEFORE", "AFTER", "PATHS"], [list(k) + [str(n)] for k, n in rows.items()])


def cmd_impact(ctx: Ctx, policy: Ref, reanalyse: Callable[[list[dict[str, Any]]], Analysis]) -> bytes:
    """The blast radius of a policy: what it affects, and what deleting it would change."""
    before = ctx.analysis
    rf = ctx.requests_from
    after: Analysis = reanalyse([o.raw for r, o in before.index.by_ref.items() if r != policy])
    changes = diff_effective(before, after, None if rf is None else rf.namespace)
    affected = before.objects_affected_by(policy) if rf is None else affected_from(ctx, policy)
    if ctx.output in ("json", "yaml"):
        return encode({"policy": policy.to_json(), **({} if rf is None else {"from": rf.namespace}),
                       "affected": [r.to_json() for r in affected], "changes": changes}, ctx.output)
    s = ctx.style
    out = from_line(ctx, None if rf is None else rf.namespace)
    out += s.bold(label(policy)) + f" affects {len(affected)} object{'s' if len(affected) != 1 else ''}"
    out += ":\n" + "".join(f"  {label(r, policy.namespace)}\n" for r in affected) if affected else ".\n"
    out += "\n" + s.bold(f"Deleting it would change {len(changes)} effective setting{'s' if len(changes) != 1 else ''}") + (":\n" if changes else ".\n")
    if changes:
        out += indent(_changes_table(changes, policy.namespace))
    return out.encode()


#: set by the API server, never by the client: an update keeps them from the stored object
_SERVER_FIELDS = ("creationTimestamp", "uid")


def as_update(stored: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    """The object the API server would store when `edit` updates `stored` (same identity).

    It keeps creationTimestamp and uid (so the age order, S5.4, does not change), bumps generation
    when the spec changes (as for custom resources: everything but metadata and status), and keeps
    the stored status, which an update of the main resource cannot change.
    """
    out = dict(edit)
    old_meta: Any = stored.get("metadata") if isinstance(stored.get("metadata"), dict) else {}
    meta = dict(edit.get("metadata") or {})
    for key in _SERVER_FIELDS:
        if key in old_meta:
            meta[key] = old_meta[key]
        else:
            meta.pop(key, None)
    generation = old_meta.get("generation")
    if isinstance(generation, int) and not isinstance(generation, bool):
        changed = {k: v for k, v in edit.items() if k not in ("metadata", "status", "apiVersion")} != \
            {k: v for k, v in stored.items() if k not in ("metadata", "status", "apiVersion")}
        meta["generation"] = generation + 1 if changed else generation
    else:
        meta.pop("generation", None)
    out["metadata"] = meta
    if "status" in stored:
        out["status"] = stored["status"]
    else:
        out.pop("status", None)
    return out


def cmd_whatif(ctx: Ctx, apply_raws: list[dict[str, Any]] | None, delete: Ref | None,
               reanalyse: Callable[[list[dict[str, Any]]], Analysis], from_namespace: str | None = None) -> bytes:
    """The difference in effective policy and in status between the current objects and the changed ones.

    An applied object with the identity of an existing one is an update of it (`as_update`); any
    other is created now, so it is the newest. With `from_namespace` (--from), the effective policy
    of that namespace's requests on mesh paths only (either side must have a mesh); status is not
    per namespace and is shown whole.
    """
    before = ctx.analysis
    replaced: set[Ref] = set()
    if apply_raws:
        edits = build_index(apply_raws, default_namespace=ctx.namespace)
        replaced = set(edits.by_ref)
        apply_raws = [as_update(before.index.by_ref[r].raw, o.raw) if r in before.index.by_ref else o.raw
                      for r, o in edits.by_ref.items()]
    if delete is not None:
        replaced.add(delete)
    raws = [o.raw for r, o in before.index.by_ref.items() if r not in replaced] + list(apply_raws or [])
    after: Analysis = reanalyse(raws)
    if from_namespace is not None and before.topology.mesh is None:
        requests_from(after, from_namespace)  # an error when neither side has a mesh
    effective = diff_effective(before, after, from_namespace)
    status = diff_status(before, after)
    if ctx.output in ("json", "yaml"):
        return encode({**({} if from_namespace is None else {"from": from_namespace}),
                       "effective": effective, "status": status}, ctx.output)
    s = ctx.style
    out = from_line(ctx, from_namespace) + s.bold(f"Effective policy: {len(effective)} setting{'s' if len(effective) != 1 else ''} would change") + (":\n" if effective else ".\n")
    if effective:
        out += indent(_changes_table(effective, None))
    out += "\n" + s.bold(f"Status: {len(status)} change{'s' if len(status) != 1 else ''}") + (":\n" if status else ".\n")
    rows = []
    for ch in status:
        obj = label(_ref_of(ch["object"]))
        if ch.get("breadcrumb"):
            rows.append([obj, "(breadcrumb)", ",".join(ch["before"]) or "<none>", ",".join(ch["after"]) or "<none>"])
        else:
            fmt = lambda c: "<none>" if c is None else f"{c['status']}/{c['reason']}"  # noqa: E731
            rows.append([obj, label(_ref_of(ch["ancestor"])), fmt(ch["before"]), fmt(ch["after"])])
    if rows:
        out += indent(table(["OBJECT", "ANCESTOR", "BEFORE", "AFTER"], rows))
    return out.encode()
