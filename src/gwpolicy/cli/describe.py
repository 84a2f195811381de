"""`gwpolicy describe TYPE/NAME`: for a target, which policies and what settings, field by field and
from where; for a policy, its targets, status in words, what it affects and which of its fields survive.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import orjson

from gwpolicy.cli.context import Ctx, from_words, label, short
from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.attach import ACCEPTED
from gwpolicy.engine.effective import EffectivePolicy
from gwpolicy.engine.effectiveobjects import kept_for
from gwpolicy.engine.explain import Candidate, fates, ladder
from gwpolicy.engine.merge.leaves import field_name
from gwpolicy.engine.mesh import path_consumer
from gwpolicy.engine.refs import Ref
from gwpolicy.engine.status import ancestor_results
from gwpolicy.engine.topology import Path
from gwpolicy.files.printers import age, table


def show(value: Any) -> str:
    """A JSON value as one short line: strings bare, the rest as compact JSON."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


#: the widest setting (field name, value, values beaten) a table of `describe` shows; a longer one is cut
#: (`effective -o json` has it whole). Messages and names are the engine's own and of bounded size: never cut.
MAX_CELL = 80
CUT_NOTE = f"(values longer than {MAX_CELL} characters are cut: `gwpolicy effective -o json` has them whole)"


def cell(text: str, limit: int = MAX_CELL) -> str:
    """One line (a newline would break the columns) of at most `limit` characters, ending in `...` if cut."""
    if len(text) > limit:
        return text[: limit - 3].replace("\n", " ") + "..."
    return text.replace("\n", " ") if "\n" in text else text


def indent(text: str, n: int = 2) -> str:
    pad = " " * n
    return "".join(pad + line + "\n" if line else "\n" for line in text.splitlines())


def path_text(path: Path, home: str | None = None) -> str:
    return " > ".join(label(level, home) for level in path)


def header(ctx: Ctx, pairs: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in pairs) + 2
    return "".join(f"{ctx.style.bold((k + ':').ljust(width))}{v}\n" for k, v in pairs)


def policies_around(a: Analysis, obj: Ref, keep: Callable[[Path], bool] | None = None) -> list[tuple[Any, Ref]]:
    """Every policy outcome declared on a level of any path of the object or of its sections (the
    paths `keep` holds true of); a policy the mesh rule attaches is seen where its consumer's paths are."""
    levels: dict[Ref, None] = {}
    for ref in [obj] + [obj.with_section(s) for s in a.topology.sections.get(obj, [])]:
        for path in a.topology.paths.get(ref, ()):
            if keep is not None and not keep(path):
                continue
            for level in path:
                levels[level] = None
    levels[obj] = None
    seen = []
    for level in levels:
        for o in a.outcomes_at(level):
            if keep is None or o.at in levels:
                seen.append((o, level))
    seen.sort(key=lambda ol: (ol[0].policy.kind.kind, ol[0].policy.obj.age_key))
    return seen


def effective_policy_object(a: Analysis, obj: Ref) -> str | None:
    """The EffectivePolicy object a controller keeps for this object (live mode reads them), in words."""
    kept = kept_for(a, obj)
    if kept is None:
        return None
    (ns, name), controller = kept
    return f"{ns}/{name} (kept by {controller}; kubectl get effectivepolicy {name} -n {ns} -o yaml)"


def describe_target(ctx: Ctx, obj: Ref) -> str:
    a = ctx.analysis
    s = ctx.style
    o = a.index.by_ref.get(obj)
    sections = a.topology.sections.get(obj, [])
    targets = [obj] + [obj.with_section(sec) for sec in sections]
    rf = ctx.requests_from
    shown = {t: [ep for ep in a.effective_of(t) if ctx.keeps(ep.path)] for t in targets}
    affecting = a.policies_affecting(obj) if rf is None else {p for items in shown.values() for ep in items
                                                              for p in ep.result.policies}
    kinds = sorted({k for _, k in a.affected.get(obj, {})})
    pairs = [("Name", obj.name)]
    if obj.namespace:
        pairs.append(("Namespace", obj.namespace))
    pairs.append(("Kind", f"{obj.kind}.{obj.group}" if obj.group else obj.kind))
    if o is None:
        pairs.append(("Virtual", "yes: named by a backendRef, not an object of the input"))
    else:
        pairs.append(("Created", f"{o.created} ({age(o.created, a.now)} ago)" if o.created[:4] != "9999" else "<unknown>"))
    if rf is not None:
        kinds = sorted({ep.kind.kind for items in shown.values() for ep in items})
        pairs.append(("Requests from", from_words(rf.namespace)))
    pairs.append(("Affected", s.state("yes") + f": {len(affecting)} {'policy' if len(affecting) == 1 else 'policies'} of "
                  f"{len(kinds)} {'kind' if len(kinds) == 1 else 'kinds'} ({', '.join(kinds)}) supply settings"
                  if affecting else s.bad("no") + ": no policy supplies a setting"))
    if sections:
        pairs.append(("Sections", ", ".join(sections)))
    kept = effective_policy_object(a, obj)
    if kept is not None:
        pairs.append(("EffectivePolicy", kept))
    out = header(ctx, pairs)

    around = policies_around(a, obj, None if rf is None else ctx.keeps)
    out += "\n" + s.bold("Policies:") + "\n"
    if not around:
        out += "  <none>\n"
    else:
        rows = []
        for outcome, level in around:
            p = outcome.policy
            where = "this object" if level == obj else ("this " + _section_word(obj) + f" {level.section}" if level.object == obj
                                                      else f"inherited from {label(level, obj.namespace)}")
            status = "True" if outcome.reason == ACCEPTED else f"False ({outcome.reason})"
            supplies = "yes" if p.ref in affecting else "no"
            rows.append([f"{p.kind.kind}/{short(p.ref)}", where, p.cls + ("" if p.cls == "direct" else f" ({'+'.join(p.stanzas)})"),
                         status, supplies])
        out += indent(table(["POLICY", "ATTACHED", "CLASS", "ACCEPTED", "SUPPLIES"], rows))
        problems = [(o, lv) for o, lv in around if o.reason != ACCEPTED]
        for outcome, _ in problems:
            out += f"  {s.bad('!')} {outcome.policy.kind.kind}/{short(outcome.policy.ref)}: {outcome.message}\n"

    for t in targets:
        items = shown[t]
        title = "Effective policy" if t.section is None else f"Effective policy of {_section_word(obj)} {t.section}"
        out += "\n" + s.bold(title + ":") + "\n"
        if not items:
            out += "  <none>" + ("" if rf is None else f" for requests from namespace {rf.namespace}: "
                                 + _no_path_of(a, t)) + "\n"
            continue
        out += indent(_effective_block(ctx, a, t, items))
    return out


def _no_path_of(a: Analysis, target: Ref) -> str:
    """Why --from shows no effective policy of `target`."""
    if not any(path_consumer(p.levels) is not None for p in a.topology.paths.get(target, ())):
        return f"{label(target)} is on no mesh path (--from shows mesh paths only)"
    return f"no mesh path of theirs reaches {label(target)}, or no policy supplies a setting on one"


def _section_word(obj: Ref) -> str:
    return {"Gateway": "listener", "Service": "port"}.get(obj.kind, "rule")


def _effective_block(ctx: Ctx, a: Analysis, target: Ref, items: list[EffectivePolicy]) -> str:
    """Per policy kind, each distinct result once with the paths that share it: every field with its
    source, stanza and level, and the values it beat."""
    groups: dict[tuple, list[EffectivePolicy]] = {}
    for ep in items:
        groups.setdefault((ep.kind.kind, ep.kind.group, id(ep.result)), []).append(ep)
    out = ""
    for (_, _, _), eps in sorted(groups.items(), key=lambda kv: kv[0][:2]):
        ep = eps[0]
        paths = [e.path for e in eps]
        title = ep.kind.kind if ep.kind.group != _NGF_GROUP else f"{ep.kind.kind}.{ep.kind.group}"
        out += f"{ctx.style.bold(title)} ({ep.kind.strategy}), on {len(paths)} path{'s' if len(paths) > 1 else ''}:\n"
        for p in paths:
            out += f"  {ctx.style.dim(path_text(p, target.namespace))}{ctx.path_note(p)}\n"
        cands = ladder(a, ep)
        rows = []
        fields = []  # the whole field names (a table cell may cut them)
        cut = False
        for path_leaf, (value, stanza, source) in sorted(ep.result.leaves.items(), key=lambda kv: field_name(kv[0])):
            fname = field_name(path_leaf)
            fields.append(fname)
            level = next((label(c.level, target.namespace) for c in cands
                          if c.field == fname and c.verdict == "effective" and c.level), "-")
            src = f"{source.kind}/{short(source)}" if source else "object"
            beat = [f"{cell(show(c.value))} ({_who(c)}" + (", Conflicted)" if c.verdict == "conflicted" else ")")
                    for c in cands if c.field == fname and c.verdict in ("beaten", "conflicted")]
            value_text = show(value)
            cut = cut or len(fname) > MAX_CELL or len(value_text) > MAX_CELL or any(
                len(show(c.value)) > MAX_CELL for c in cands if c.field == fname and c.verdict in ("beaten", "conflicted"))
            rows.append([cell(fname), cell(value_text), src, stanza or "-", level, "; ".join(beat) or "-"])
        headers = ["FIELD", "VALUE", "SOURCE", "STANZA", "LEVEL", "BEAT"]
        nginx = _gateway_enforcement(ep)
        if nginx is not None:  # a kind the gateway's NGINX data plane knows: say what it does
            headers.append("NGINX")
            for row, fname in zip(rows, fields):
                row.append(nginx(fname))
        out += indent(table(headers, rows))
        if cut:
            out += indent(CUT_NOTE + "\n")
    out += _both_groups(ctx, a, target, items)
    return out


_NGF_GROUP = "gateway.nginx.org"


def _both_groups(ctx: Ctx, a: Analysis, target: Ref, items: list[EffectivePolicy]) -> str:
    """Where an NGINX Gateway Fabric kind and ours of the same name both set fields on one path:
    per field, both sources and the one the gateway programs (gateway/ngfpolicies.py). Not on mesh
    paths, where NGF's kinds are not applied."""
    from gwpolicy.gateway import ngfpolicies
    from gwpolicy.mesh.policies import on_mesh_path

    by_path: dict[int, dict[tuple[str, str], EffectivePolicy]] = {}
    for ep in items:
        if on_mesh_path(ep.path.levels):  # the mesh proxy applies none of NGF's kinds
            continue
        by_path.setdefault(id(ep.path), {})[ep.kind.key] = ep
    out = ""
    seen: set[tuple[Any, ...]] = set()
    for eps in by_path.values():
        for kind in ngfpolicies.KINDS:
            ours, ngf = eps.get(("gwpolicy.io", kind)), eps.get((ngfpolicies.GROUP, kind))
            if ours is None or ngf is None:
                continue
            depth = ngfpolicies.depth_on(tuple(ngf.path.levels), a.outcomes)
            rows = [[w["field"], _policy_cell(w["gwpolicy.io"]), _policy_cell(w[ngfpolicies.GROUP]), w["wins"]]
                    for w in ngfpolicies.winners(kind, ours.result, ngf.result, depth)]
            key = (kind, tuple(map(tuple, rows)))
            if key in seen:
                continue
            seen.add(key)
            out += (f"{ctx.style.bold(kind)} on NGINX, gwpolicy.io and {ngfpolicies.GROUP} together "
                    f"(override of ours, then the more specific level, then ours):\n")
            out += f"  {ctx.style.dim(path_text(ngf.path, target.namespace))}\n"
            out += indent(table(["FIELD", "GWPOLICY.IO", ngfpolicies.GROUP.upper(), "PROGRAMMED"], rows))
    return out


def _policy_cell(policy: Any) -> str:
    if not isinstance(policy, dict):
        return "-"
    ns = policy.get("namespace")
    return f"{policy.get('kind')}/{ns + '/' if ns else ''}{policy.get('name')}"


def _gateway_enforcement(ep: EffectivePolicy) -> Callable[[str], str] | None:
    """For the gateway's kinds (gwpolicy.io, BackendTLSPolicy): field -> whether NGINX enforces it;
    on a mesh path, whether the mesh proxy does (mesh/policies.py)."""
    from gwpolicy.gateway import ngfpolicies, policyconf
    from gwpolicy.mesh import policies as mesh_policies

    if mesh_policies.on_mesh_path(ep.path.levels):  # the mesh proxy's, not the gateway's
        return mesh_policies.enforcement_of(ep.kind.group, ep.kind.kind)
    if ep.kind.group == ngfpolicies.GROUP and ep.kind.kind in ngfpolicies.KINDS:
        return lambda fname: ngfpolicies.enforcement(ep.kind.kind, fname)
    if ep.kind.group != policyconf.GROUP and ep.kind.kind != policyconf.BACKEND_TLS:
        return None
    if ep.kind.group == policyconf.GROUP and ep.kind.kind not in policyconf.KINDS:
        return None
    return lambda fname: policyconf.enforcement(ep.kind.kind, fname)


def _who(c: Candidate) -> str:
    return f"{c.stanza} {c.policy.kind}/{short(c.policy)}" if c.policy else "the object's own value"


def affected_from(ctx: Ctx, policy: Ref) -> list[Ref]:
    """The objects (not sections) the policy supplies a leaf to on the paths `ctx` keeps, sorted."""
    return sorted({ep.target.object for ep in ctx.analysis.effective
                   if policy in ep.result.policies and ctx.keeps(ep.path)}, key=Ref.sort_key)


def describe_policy(ctx: Ctx, ref: Ref) -> str:
    a = ctx.analysis
    s = ctx.style
    p = a.policies[ref]
    o = p.obj
    pairs = [("Name", ref.name)]
    if ref.namespace:
        pairs.append(("Namespace", ref.namespace))
    pairs += [("Kind", f"{ref.kind}.{ref.group}"),
              ("Policy kind", f"{p.kind.strategy}, recognised by {p.kind.recognized_by}, status on {p.kind.status_ancestor}"),
              ("Class", p.cls + ("" if p.cls == "direct" else f" ({', '.join(p.stanzas)})")),
              ("Created", f"{o.created} ({age(o.created, a.now)} ago)" if o.created[:4] != "9999" else "<unknown>")]
    rf = ctx.requests_from
    if rf is not None:
        pairs.append(("Requests from", from_words(rf.namespace)))
    out = header(ctx, pairs)
    out += "\n" + s.bold("Settings:") + "\n"
    for stanza, settings in p.stanzas.items():
        text = show(settings)
        out += f"  {stanza}: {cell(text, 4 * MAX_CELL)}\n" + (f"  {CUT_NOTE}\n" if len(text) > 4 * MAX_CELL else "")
    out += "\n" + s.bold("Targets:") + "\n"
    rows = []
    for t in a.outcomes[ref]:
        rows.append([label(t.declared, ref.namespace) if t.declared else "<none>",
                     "True" if t.reason == ACCEPTED else "False", t.reason, t.message])
    out += indent(table(["TARGET", "ACCEPTED", "REASON", "MESSAGE"], rows))
    anc = ancestor_results(p, a.outcomes[ref], a.topology)
    out += "\n" + s.bold("Status (one entry per ancestor):") + "\n"
    rows = [[label(r, ref.namespace), "True" if t.reason == ACCEPTED else "False", t.reason]
            for r, t in sorted(anc.items(), key=lambda kv: kv[0].sort_key())]
    out += indent(table(["ANCESTOR", "ACCEPTED", "REASON"], rows))
    affected = a.objects_affected_by(ref) if rf is None else affected_from(ctx, ref)
    counts = Counter(r.kind for r in affected)
    out += "\n" + s.bold("Affects:") + f" {len(affected)} object{'s' if len(affected) != 1 else ''}"
    out += (" (" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ")\n") if affected else "\n"
    for r in affected:
        out += f"  {label(r, ref.namespace)}\n"
    fs = [f for f in fates(a, ref) if ctx.keeps(f.item.path)]
    tally = Counter(f.fate for f in fs)
    out += "\n" + s.bold("Fields:") + (f" effective on {tally['effective']} paths, partially on {tally['partially']}, "
                                               f"overridden on {tally['overridden']}\n" if fs else " takes part in no effective policy\n")
    if fs:
        paths_by_row: dict[tuple[str, ...], int] = {}
        for f in fs:
            via = next((label(level, ref.namespace) for level in f.item.path if level.kind == "Gateway" and level.section is None), "-")
            key = (label(f.item.target, ref.namespace), via, f.fate, ",".join(f.survived) or "-", ",".join(f.lost) or "-")
            paths_by_row[key] = paths_by_row.get(key, 0) + 1
        out += indent(table(["TARGET", "VIA", "FATE", "SURVIVES", "LOST", "PATHS"], [list(k) + [str(n)] for k, n in paths_by_row.items()]))
    return out
