"""Atomic, Patch (RFC 7386) and None (S6): whole-settings strategies, with the source of every leaf.

Values are carried as annotated trees: objects stay dicts, every other value is a `Sourced`
leaf, so that the result of a chain of merges still tells which policy each leaf came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from gwpolicy.engine.merge.leaves import LeafPath
from gwpolicy.engine.refs import Ref


@dataclass(frozen=True, slots=True)
class Sourced:
    value: Any
    stanza: str
    source: Ref


def annotate(value: Any, stanza: str, source: Ref) -> Any:
    if isinstance(value, dict):
        return {k: annotate(v, stanza, source) for k, v in value.items()}
    return Sourced(value, stanza, source)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 on annotated trees, except that a null in the patch is kept, so it travels down the chain (S6.0)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if isinstance(v, Sourced) and v.value is None:
            out[k] = v
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def chain(entries: Sequence[tuple[dict[str, Any], str, Ref]], strategy: str) -> Any:
    """S6: p1..pm most established first; acc = settings(pm), then acc = merge(pi, acc) for i = m-1..1.

    `entries` are (settings, stanza, policy); direct policies come with stanza "direct" and merge like defaults.
    """
    if not entries:
        return {}
    settings, stanza, source = entries[-1]
    acc = annotate(settings, stanza, source)
    for settings, stanza, source in reversed(entries[:-1]):
        established = annotate(settings, stanza, source)
        if strategy == "Atomic":
            if stanza == "overrides" or not acc:
                acc = established
        elif stanza == "overrides":
            acc = merge_patch(acc, established)
        else:
            acc = merge_patch(established, acc)
    return acc


def resolve(tree: Any) -> dict[LeafPath, tuple[Any, str, Ref | None]]:
    """Apply the annotated result as a merge patch to `{}` and list its leaves with their sources.

    Objects emptied by nulls stay `{}`; they are kept as leaves with no single source.
    """
    out: dict[LeafPath, tuple[Any, str, Ref | None]] = {}
    _resolve(tree, (), out)
    return out


def _resolve(node: Any, path: LeafPath, out: dict) -> None:
    if isinstance(node, dict):
        kept = {k: v for k, v in node.items() if not (isinstance(v, Sourced) and v.value is None)}
        if not kept and path:
            out[path] = ({}, "", None)
            return
        for k, v in kept.items():
            _resolve(v, path + (k,), out)
    else:
        out[path] = (node.value, node.stanza, node.source)
