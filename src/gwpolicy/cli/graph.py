"""`gwpolicy graph`: the topology with policies drawn on what they target (Graphviz dot, Mermaid, SVG)."""

from __future__ import annotations

import re
import shutil
import subprocess

from gwpolicy.analysis import Analysis
from gwpolicy.attach import ACCEPTED
from gwpolicy.cli.context import Ctx
from gwpolicy.cli.resources import NotFound
from gwpolicy.refs import Ref


def _nodes_and_edges(a: Analysis, ctx: Ctx) -> tuple[list[Ref], list[tuple[Ref, Ref]]]:
    nodes: dict[Ref, None] = {}
    edges: dict[tuple[Ref, Ref], None] = {}
    for ref, paths in a.topology.paths.items():
        if ref.section is not None or ref.kind == "Namespace":
            continue
        for path in paths:
            chain = [lv for lv in path if lv.section is None and lv.kind != "Namespace"]
            if not ctx.all_namespaces and not any(ctx.in_scope(lv) and lv.namespace for lv in chain) and ref.namespace:
                continue
            for lv in chain:
                nodes[lv] = None
            for up, down in zip(chain, chain[1:]):
                edges[(up, down)] = None
    return sorted(nodes, key=Ref.sort_key), sorted(edges, key=lambda e: (e[0].sort_key(), e[1].sort_key()))


def _policies(a: Analysis, ctx: Ctx):
    for ref in sorted(a.policies, key=Ref.sort_key):
        if ctx.in_scope(ref):
            yield ref, a.outcomes[ref]


def _namespaced_blocks(by_ns: dict[str | None, list[str]], open_block, close: str) -> list[str]:
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


def _id(ref: Ref) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", f"{ref.kind}_{ref.namespace or ''}_{ref.name}")


def to_dot(a: Analysis, ctx: Ctx) -> str:
    nodes, edges = _nodes_and_edges(a, ctx)
    lines = ["digraph gwpolicy {", '  rankdir=TB;', '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    by_ns: dict[str | None, list[str]] = {}
    for n in nodes:
        sections = a.topology.sections.get(n, [])
        extra = ("\\n" + ", ".join(sections)) if sections else ""
        by_ns.setdefault(n.namespace, []).append(f'"{_id(n)}" [label="{n.kind}\\n{n.name}{extra}"];')
    for ref, outs in _policies(a, ctx):
        ok = all(o.reason == ACCEPTED for o in outs)
        by_ns.setdefault(ref.namespace, []).append(
            f'"{_id(ref)}" [shape=note, style=filled, fillcolor="{"#d9f2d9" if ok else "#f7d4d4"}", '
            f'label="{ref.kind}\\n{ref.name}"];')
    lines += _namespaced_blocks(by_ns, lambda ns: f'  subgraph "cluster_{ns}" {{ label="namespace {ns}"; style=dashed;', "  }")
    for up, down in edges:
        lines.append(f'  "{_id(up)}" -> "{_id(down)}";')
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
            lines.append(f'  "{_id(ref)}" -> "{_id(tgt)}" [style={style}, color="{color}", label="{lbl.strip()}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(a: Analysis, ctx: Ctx) -> str:
    nodes, edges = _nodes_and_edges(a, ctx)
    lines = ["flowchart TD"]
    by_ns: dict[str | None, list[str]] = {}
    for n in nodes:
        by_ns.setdefault(n.namespace, []).append(f'{_id(n)}["{n.kind} {n.name}"]')
    pols = list(_policies(a, ctx))
    for ref, outs in pols:
        by_ns.setdefault(ref.namespace, []).append(f'{_id(ref)}[/"{ref.kind} {ref.name}"/]')
    lines += _namespaced_blocks(by_ns, lambda ns: f'  subgraph ns_{re.sub("[^A-Za-z0-9_]", "_", ns)}["namespace {ns}"]',
                                "  end")
    for up, down in edges:
        lines.append(f"  {_id(up)} --> {_id(down)}")
    node_set = set(nodes)
    for ref, outs in pols:
        for o in outs:
            if o.declared is None or o.declared.object not in node_set:
                continue
            text = (o.declared.section or "") + ("" if o.reason == ACCEPTED else f" {o.reason}")
            arrow = f"-.->|{text.strip()}|" if text.strip() else "-.->"
            lines.append(f"  {_id(ref)} {arrow} {_id(o.declared.object)}")
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
