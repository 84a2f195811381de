"""`gwpolicy graph`: the topology with policies drawn on what they target (Graphviz dot, Mermaid, SVG)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Callable, Iterator

from gwpolicy.cli.context import Ctx
from gwpolicy.cli.resources import NotFound
from gwpolicy.engine.analysis import Analysis
from gwpolicy.engine.attach import ACCEPTED, TargetOutcome
from gwpolicy.engine.refs import Ref


def _nodes_and_edges(a: Analysis, ctx: Ctx) -> tuple[list[Ref], list[tuple[Ref, Ref]]]:
    nodes: dict[Ref, None] = {}
    edges: dict[tuple[Ref, Ref], None] = {}
    for ref, paths in a.topology.paths.items():
        if ref.section is not None or ref.kind == "Namespace":
            continue
        for path in paths:
            chain = [lv for lv in path if lv.section is None and lv.kind != "Namespace" and "@" not in lv.kind]  # not a mesh consumer level
            if not ctx.all_namespaces and not any(ctx.in_scope(lv) and lv.namespace for lv in chain) and ref.namespace:
                continue
            for lv in chain:
                nodes[lv] = None
            for up, down in zip(chain, chain[1:]):
                edges[(up, down)] = None
    return sorted(nodes, key=Ref.sort_key), sorted(edges, key=lambda e: (e[0].sort_key(), e[1].sort_key()))


def _policies(a: Analysis, ctx: Ctx) -> Iterator[tuple[Ref, list[TargetOutcome]]]:
    for ref in sorted(a.policies, key=Ref.sort_key):
        if ctx.in_scope(ref):
            yield ref, a.outcomes[ref]


def _namespaced_blocks(by_ns: dict[str | None, list[str]], open_block: Callable[[str], str], close: str) -> list[str]:
    """Cluster-scoped lines first, then one block per namespace (a dot cluster, a mermaid subgraph)."""
    lines: list[str] = []
    for ns in sorted(by_ns, key=lambda n: n or ""):
        if ns is None:
            lines += ["  " + x for x in by_ns[ns]]
            continue
        lines.append(open_block(ns))
        lines += ["    " + x for x in by_ns[ns]]
        lines.append(close)
    return lines


def _part(text: str) -> str:
    """One part of a reference, with the characters that separate parts escaped as in a URL."""
    return text.replace("%", "%25").replace("/", "%2F").replace("@", "%40")


def _kinds_of_several_groups(a: Analysis) -> frozenset[str]:
    """Kinds that objects of more than one group share: only their ids need the group."""
    groups: dict[str, set[str]] = {}
    for ref in list(a.topology.paths) + list(a.policies):
        groups.setdefault(ref.kind, set()).add(ref.group)
    return frozenset(k for k, gs in groups.items() if len(gs) > 1)


def _ref_text(ref: Ref, shared: frozenset[str]) -> str:
    """`Kind/namespace/name` (`Kind/name` when cluster-scoped), and `@group` for a kind that several
    groups share: one text per object, so that no two nodes share an id."""
    parts = [ref.kind] + ([ref.namespace] if ref.namespace is not None else []) + [ref.name]
    text = "/".join(_part(p) for p in parts)
    return f"{text}@{_part(ref.group)}" if ref.kind in shared else text


def _dot_id(ref: Ref, shared: frozenset[str]) -> str:
    """A dot id is a quoted string: the reference itself."""
    return '"' + _ref_text(ref, shared).replace("\\", "\\\\").replace('"', '\\"') + '"'


_MERMAID_CODES = {"-": "_d", ".": "_p", "/": "_s", "_": "_u", "@": "_a", "%": "_c"}


def _mermaid_code(text: str) -> str:
    """Mermaid ids are letters, digits and `_`: each other character becomes `_` and a code letter
    (a prefix-free code, so distinct texts keep distinct ids, and `__` never occurs in one)."""
    return "".join(c if c.isascii() and c.isalnum() else _MERMAID_CODES.get(c, f"_x{ord(c):06x}") for c in text)


def _mermaid_id(ref: Ref, shared: frozenset[str]) -> str:
    return _mermaid_code(_ref_text(ref, shared))


def to_dot(a: Analysis, ctx: Ctx) -> str:
    nodes, edges = _nodes_and_edges(a, ctx)
    shared = _kinds_of_several_groups(a)

    def node_id(ref: Ref) -> str:
        return _dot_id(ref, shared)
    lines = ["digraph gwpolicy {", '  rankdir=TB;', '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    by_ns: dict[str | None, list[str]] = {}
    for n in nodes:
        sections = a.topology.sections.get(n, [])
        extra = ("\\n" + ", ".join(sections)) if sections else ""
        by_ns.setdefault(n.namespace, []).append(f'{node_id(n)} [label="{n.kind}\\n{n.name}{extra}"];')
    for ref, outs in _policies(a, ctx):
        ok = all(o.reason == ACCEPTED for o in outs)
        by_ns.setdefault(ref.namespace, []).append(
            f'{node_id(ref)} [shape=note, style=filled, fillcolor="{"#d9f2d9" if ok else "#f7d4d4"}", '
            f'label="{ref.kind}\\n{ref.name}"];')
    lines += _namespaced_blocks(by_ns, lambda ns: f'  subgraph "cluster_{ns}" {{ label="namespace {ns}"; style=dashed;', "  }")
    for up, down in edges:
        lines.append(f'  {node_id(up)} -> {node_id(down)};')
    for ref, outs in _policies(a, ctx):
        for o in outs:
            if o.declared is None or (o.declared.object not in set(nodes) and o.declared.kind != "Namespace"):
                continue
            style = "dashed" if o.reason == ACCEPTED else "dotted"
            color = "#2e7d32" if o.reason == ACCEPTED else "#c62828"
            tgt = o.declared.object
            lbl = (o.declared.section or "") + ("" if o.reason == ACCEPTED else f" {o.reason}")
            if tgt.kind == "Namespace":
                continue
            lines.append(f'  {node_id(ref)} -> {node_id(tgt)} [style={style}, color="{color}", label="{lbl.strip()}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(a: Analysis, ctx: Ctx) -> str:
    nodes, edges = _nodes_and_edges(a, ctx)
    shared = _kinds_of_several_groups(a)

    def node_id(ref: Ref) -> str:
        return _mermaid_id(ref, shared)
    lines = ["flowchart TD"]
    by_ns: dict[str | None, list[str]] = {}
    for n in nodes:
        by_ns.setdefault(n.namespace, []).append(f'{node_id(n)}["{n.kind} {n.name}"]')
    pols = list(_policies(a, ctx))
    for ref, outs in pols:
        by_ns.setdefault(ref.namespace, []).append(f'{node_id(ref)}[/"{ref.kind} {ref.name}"/]')
    lines += _namespaced_blocks(by_ns, lambda ns: f'  subgraph ns__{_mermaid_code(ns)}["namespace {ns}"]',
                                "  end")
    for up, down in edges:
        lines.append(f"  {node_id(up)} --> {node_id(down)}")
    node_set = set(nodes)
    for ref, outs in pols:
        for o in outs:
            if o.declared is None or o.declared.object not in node_set:
                continue
            text = (o.declared.section or "") + ("" if o.reason == ACCEPTED else f" {o.reason}")
            arrow = f"-.->|{text.strip()}|" if text.strip() else "-.->"
            lines.append(f"  {node_id(ref)} {arrow} {node_id(o.declared.object)}")
    return "\n".join(lines) + "\n"


def cmd_graph(ctx: Ctx) -> bytes:
    a = ctx.analysis
    if ctx.output == "mermaid":
        return to_mermaid(a, ctx).encode()
    dot = to_dot(a, ctx)
    if ctx.output == "svg":
        exe = shutil.which("dot")
        if exe is None:
            raise NotFound("-o svg needs Graphviz's dot (apt-get install graphviz); -o dot prints its input")
        return subprocess.run([exe, "-Tsvg"], input=dot.encode(), capture_output=True, check=True).stdout
    return dot.encode()
