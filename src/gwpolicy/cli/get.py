"""`gwpolicy get`: kubectl-style lists of policies, policy kinds, or objects with the policies that affect them.

What kubectl users reach for works as in kubectl: several names (`get TYPE A B`, `get T/A T/B`),
`-l/--selector`, `--show-labels`, `--sort-by`, `--no-headers`, `-o jsonpath=`/`custom-columns=`,
an empty `List` for `-o json` of nothing, and a missing name as an error while the others print.
Every listing is first a list of entries (the JSON object, its `-o name` line, its table cells);
the output format is then one choice over those entries.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

from gwpolicy.cli.context import Ctx, label
from gwpolicy.cli.jsonpath import column_cell, parse_columns, parse_template, relaxed, sort_key, unquote
from gwpolicy.cli.resources import NotFound, ResourceType, plural_of, resolve_type, split_ref
from gwpolicy.cli.selector import Selector
from gwpolicy.engine.attach import ACCEPTED, SEVERITY, TargetOutcome
from gwpolicy.engine.effectiveobjects import GROUP as EP_GROUP
from gwpolicy.engine.effectiveobjects import KIND as EP_KIND
from gwpolicy.engine.effectiveobjects import kept_for
from gwpolicy.engine.refs import Ref
from gwpolicy.files.output import encode
from gwpolicy.files.printers import age, table

MAX_TARGETS = 2
#: what kubectl prints for `-o json` of a list: the items and an empty resourceVersion
LIST_METADATA = {"resourceVersion": ""}


class PartialResult(Exception):
    """Some names were found and printed, others were not: stdout still goes out, then the errors, exit 1."""

    code = 1

    def __init__(self, out: bytes, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.out = out
        self.errors = errors

    def report(self) -> str:
        """One `Error:` line per name not found, as kubectl prints them."""
        return "\n".join(f"Error: {e}" for e in self.errors)


@dataclass
class GetOptions:
    """The printing flags of `get`, as kubectl names them."""

    output: str = "table"  # table, wide, json, yaml, name, jsonpath=..., custom-columns=...
    selector: Selector | None = None
    show_labels: bool = False
    sort_by: str | None = None
    no_headers: bool = False
    ignore_not_found: bool = False


@dataclass
class Entry:
    make: Callable[[], dict[str, Any]]  # the object as -o json prints it (after the controller's write)
    name_line: str  # `kind.group/name`, as -o name prints it
    cells: list[str]  # table cells (wide ones included for -o wide)
    namespace: str | None
    labels: dict[str, str] = field(default_factory=dict)  # metadata.labels (our write changes none)
    _item: dict[str, Any] | None = None

    @property
    def item(self) -> dict[str, Any]:
        """Made on first use: a table of 50,000 policies needs no copies with status."""
        if self._item is None:
            self._item = self.make()
        return self._item


@dataclass
class Listing:
    """Entries of one resource type; a table of its own in table output."""

    headers: list[str]
    namespaced: bool
    entries: list[Entry] = field(default_factory=list)
    name_first: bool = True  # the first cell is the name (kubectl qualifies it when several types print)
    list_kind: tuple[str, str] = ("v1", "List")  # apiVersion and kind of its -o json document


def accepted_column(outcomes: Sequence[TargetOutcome]) -> tuple[str, str]:
    """(ACCEPTED, REASON): True, False, or k/n accepted, and the worst reason."""
    ok = sum(1 for o in outcomes if o.reason == ACCEPTED)
    worst = max(outcomes, key=lambda o: SEVERITY[o.reason]).reason if outcomes else ACCEPTED
    if ok == len(outcomes):
        return "True", worst
    if ok == 0:
        return "False", worst
    return f"{ok}/{len(outcomes)}", worst


def _targets_text(outcomes: Sequence[TargetOutcome], wide: bool) -> str:
    names = [label(o.declared) if o.declared is not None else "<none>" for o in outcomes]
    if not wide and len(names) > MAX_TARGETS:
        return ",".join(names[:MAX_TARGETS]) + f",+{len(names) - MAX_TARGETS} more"
    return ",".join(names)


def _qualified(ref: Ref) -> str:
    return f"{ref.kind.lower()}.{ref.group}" if ref.group else ref.kind.lower()


def _labels_of(ctx: Ctx, ref: Ref) -> dict[str, str]:
    obj = ctx.analysis.index.by_ref.get(ref)
    return _labels(obj.raw) if obj is not None else {}


def _with_status(ctx: Ctx, ref: Ref) -> dict[str, Any]:
    """The object as it would read after the controller's write."""
    obj = ctx.analysis.index.by_ref.get(ref)
    if obj is None:  # a Namespace known only from the objects that live in it
        return {"apiVersion": "v1", "kind": ref.kind, "metadata": {"name": ref.name}}
    raw = copy.deepcopy(obj.raw)
    ch = ctx.analysis.status_change_of(ref)
    if ch is not None:
        raw["status"] = ch.status
        if ch.annotations:
            raw["metadata"]["annotations"] = ch.annotations
    return raw


# ---------------------------------------------------------------- listings of each type


def _policy_listing(ctx: Ctx, refs: list[Ref]) -> Listing:
    a = ctx.analysis
    wide = ctx.output == "wide"
    headers = ["NAME", "KIND", "TARGETS", "ACCEPTED", "AFFECTS", "AGE"] + (["CLASS", "STRATEGY", "REASON"] if wide else [])
    listing = Listing(headers, True)
    for r in refs:
        p = a.policies[r]
        outs = a.outcomes[r]
        acc, reason = accepted_column(outs)
        cells = [r.name, p.kind.kind, _targets_text(outs, wide), acc, str(len(a.objects_affected_by(r))),
                 age(p.obj.created, a.now)]
        if wide:
            cells += [p.cls, p.kind.strategy, reason]
        listing.entries.append(Entry(partial(_with_status, ctx, r), f"{_qualified(r)}/{r.name}", cells, r.namespace,
                                     _labels_of(ctx, r)))
    return listing


def _policy_refs(ctx: Ctx, kind: tuple[str, str] | None) -> list[Ref]:
    a = ctx.analysis
    return [r for r in sorted(a.policies, key=lambda r: (r.namespace or "", r.name, r.kind))
            if ctx.in_scope(r) and (kind is None or a.policies[r].kind.key == kind)]


def _policykind_listing(ctx: Ctx, names: list[str] | None, errors: list[str]) -> Listing:
    a = ctx.analysis
    kinds = sorted(a.kinds.values(), key=lambda k: (k.kind, k.group))
    if names is not None:
        chosen = []
        for n in names:
            low = n.lower()
            hit = [k for k in kinds if low in (k.kind.lower(), plural_of(k.kind), f"{plural_of(k.kind)}.{k.group}",
                                               f"{k.kind.lower()}.{k.group}")]
            if not hit:
                errors.append(f'policykinds "{n}" not found')
            chosen += [k for k in hit if k not in chosen]
        kinds = chosen
    counts = Counter(p.kind.key for p in a.policies.values())
    headers = ["KIND", "GROUP", "RECOGNIZED-BY", "CLASS", "STRATEGY", "STATUS-ANCESTOR", "POLICIES"]
    wide = ctx.output == "wide"
    if wide:
        headers.append("TARGET-KINDS")
    listing = Listing(headers, False, name_first=False, list_kind=("gwpolicy.io/v1alpha1", "PolicyKindList"))
    for k in kinds:
        item = {"group": k.group, "kind": k.kind, "recognizedBy": k.recognized_by,
                "attachment": k.attachment, "mergeStrategy": k.strategy, "statusAncestor": k.status_ancestor,
                "targetKinds": [{"group": g, "kind": kk} for g, kk in k.target_kinds] if k.target_kinds is not None else None,
                "policies": counts[k.key]}
        cls = {"Inherited": "inherited", "Direct": "direct"}.get(k.attachment or "", "by stanza")
        if k.strategy == "None":
            cls = "direct"
        cells = [k.kind, k.group or "(core)", k.recognized_by, cls, k.strategy, k.status_ancestor, str(counts[k.key])]
        if wide:
            cells.append(",".join(kk for _, kk in k.target_kinds) if k.target_kinds is not None else "any")
        listing.entries.append(Entry(partial(dict, item), f"policykind/{plural_of(k.kind)}.{k.group}", cells, None))
    return listing


def _object_listing(ctx: Ctx, rt: ResourceType, refs: list[Ref]) -> Listing:
    a = ctx.analysis
    wide = ctx.output == "wide"
    # in live mode with EffectivePolicy objects in the cluster, -o wide names each object's
    kept = wide and bool(a.index.of_kind(EP_GROUP, EP_KIND))
    listing = Listing(["NAME", "POLICIES", "AGE"] + (["PATHS", "POLICY-KINDS"] if wide else [])
                      + (["EFFECTIVEPOLICY"] if kept else []), rt.namespaced)
    for r in refs:
        obj = a.index.by_ref.get(r)
        cells = [r.name, str(len(a.policies_affecting(r))), age(obj.created, a.now) if obj else "<unknown>"]
        if wide:
            cells += [str(len(a.topology.paths.get(r, ()))),
                      ",".join(sorted(k for _, k in a.affected.get(r, {}))) or "<none>"]
        if kept:
            found = kept_for(a, r)
            cells.append(f"{found[0][0]}/{found[0][1]}" if found else "<none>")
        listing.entries.append(Entry(partial(_with_status, ctx, r), f"{rt.qualified}/{r.name}", cells, r.namespace,
                                     _labels_of(ctx, r)))
    return listing


def _type_refs(ctx: Ctx, rt: ResourceType) -> list[Ref]:
    a = ctx.analysis
    if rt.kind == "Namespace" and rt.group == "":
        return sorted({Ref("", "Namespace", None, n) for n in a.index.namespaces}, key=Ref.sort_key)
    return [o.ref for o in a.index.of_kind(rt.group, rt.kind) if ctx.in_scope(o.ref)]


def _pick(refs: list[Ref], names: list[str] | None, plural: str, errors: list[str]) -> list[Ref]:
    """The refs of `names` in the order given (all refs when no names); a missing name is an error."""
    if names is None:
        return refs
    out: list[Ref] = []
    for n in names:
        hit = [r for r in refs if r.name == n]
        if not hit:
            errors.append(f'{plural} "{n}" not found')
        out += [r for r in hit if r not in out]
    return out


def listing_of(ctx: Ctx, what: str, names: list[str] | None, errors: list[str]) -> Listing:
    """The entries of one type: `policies`, `policykinds`, or any type kubectl spelling names."""
    low = what.lower()
    if low in ("policies", "policy", "pol"):
        return _policy_listing(ctx, _pick(_policy_refs(ctx, None), names, "policies", errors))
    if low in ("policykinds", "policykind"):
        return _policykind_listing(ctx, names, errors)
    rt = resolve_type(what, ctx.analysis)
    if (rt.group, rt.kind) in ctx.analysis.kinds:
        return _policy_listing(ctx, _pick(_policy_refs(ctx, (rt.group, rt.kind)), names, rt.plural, errors))
    return _object_listing(ctx, rt, _pick(_type_refs(ctx, rt), names, rt.plural, errors))


# ---------------------------------------------------------------- arguments and printing


def requests_of(args: list[str]) -> tuple[list[tuple[str, list[str] | None]], bool]:
    """kubectl's argument forms -> ([(type, names or None)], a single object was named).

    `TYPE`, `TYPE NAME...`, or `TYPE/NAME...` (types may differ); the two forms do not mix.
    """
    if not args:
        raise NotFound("you must specify the type of resource to get (policies, policykinds, httproutes, ...)")
    if any("/" in a for a in args):
        if not all("/" in a for a in args):
            raise NotFound("there is no need to specify a resource type as a separate argument when passing "
                           f"arguments in resource/name form (e.g. 'gwpolicy get resource/<resource_name>' "
                           f"instead of 'gwpolicy get resource resource/<resource_name>'): {' '.join(args)}")
        grouped: dict[str, list[str]] = {}
        for a in args:
            t, n = split_ref(a)
            grouped.setdefault(t, []).append(n)
        return list(grouped.items()), len(args) == 1
    if "," in args[0] and len(args) == 1:
        return [(t, None) for t in args[0].split(",") if t], False
    return [(args[0], args[1:] or None)], len(args) == 2


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) if labels else "<none>"


def _labels(item: dict[str, Any]) -> dict[str, str]:
    meta = item.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def _table(ctx: Ctx, listing: Listing, opts: GetOptions, qualify: bool) -> str:
    """One type's table; `qualify`: several types print, so NAME reads `kind.group/name` as in kubectl."""
    ns_col = ctx.all_namespaces and listing.namespaced
    headers = (["NAMESPACE"] if ns_col else []) + listing.headers + (["LABELS"] if opts.show_labels else [])
    rows = [([e.namespace or ""] if ns_col else [])
            + ([e.name_line] + e.cells[1:] if qualify and listing.name_first else e.cells)
            + ([_labels_text(e.labels)] if opts.show_labels else [])
            for e in listing.entries]
    return table(headers, rows, show_headers=not opts.no_headers, min_width=6)


def render(ctx: Ctx, listings: list[Listing], opts: GetOptions, single: bool) -> tuple[bytes, str | None]:
    """One output format over the entries; `single`: one object was named, so -o json prints it alone."""
    entries = [e for listing in listings for e in listing.entries]
    fmt = opts.output
    if fmt in ("json", "yaml") or fmt.startswith("jsonpath="):
        api, kind = listings[0].list_kind if len({listing.list_kind for listing in listings}) == 1 else ("v1", "List")
        doc: Any = entries[0].item if single and len(entries) == 1 else (
            {"apiVersion": "v1", "items": [e.item for e in entries], "kind": "List", "metadata": dict(LIST_METADATA)}
            if kind == "List" else {"apiVersion": api, "kind": kind, "items": [e.item for e in entries]})
        if fmt.startswith("jsonpath="):
            return parse_template(unquote(fmt[len("jsonpath="):])).render(doc).encode(), None
        return encode(doc, fmt), None
    if not entries:
        return b"", ctx.none_found()
    if fmt == "name":
        return "".join(e.name_line + "\n" for e in entries).encode(), None
    if fmt.startswith("custom-columns="):
        cols = parse_columns(fmt[len("custom-columns="):])
        rows = [[column_cell(c, e.item) for c in cols] for e in entries]
        return table([c.header for c in cols], rows, show_headers=not opts.no_headers, min_width=6).encode(), None
    shown = [listing for listing in listings if listing.entries]
    tables = [_table(ctx, listing, opts, qualify=len(listings) > 1) for listing in shown]
    return "\n".join(tables).encode(), None


def cmd_get(ctx: Ctx, args: list[str], opts: GetOptions) -> tuple[bytes, str | None]:
    requests, single = requests_of(args)
    if opts.selector is not None and any(names is not None for _, names in requests):
        raise NotFound("name cannot be provided when a selector is specified")
    errors: list[str] = []
    listings = [listing_of(ctx, what, names, errors) for what, names in requests]
    if opts.ignore_not_found:  # kubectl: names that are not there print nothing, and nothing is said
        if errors and not any(listing.entries for listing in listings):
            return b"", None
        errors = []
    keep: Callable[[Entry], bool] = (lambda e: True) if opts.selector is None else (
        lambda e: opts.selector.matches(e.labels))  # type: ignore[union-attr]
    for listing in listings:
        listing.entries = [e for e in listing.entries if keep(e)]
        if opts.sort_by:
            path = relaxed(opts.sort_by)
            listing.entries.sort(key=lambda e: sort_key(path, e.item))
    if errors and not any(listing.entries for listing in listings):
        raise PartialResult(b"", errors)  # kubectl prints nothing, not even an empty List
    out, note = render(ctx, listings, opts, single and not errors)
    if errors:
        raise PartialResult(out, errors)
    return out, note
