"""Patches and server-side apply: merge patches, the leaves of an object, managedFields
(fieldsV1) and the paths they name."""

from __future__ import annotations

import re
from typing import Any

from gwpolicy.engine.merge.values import set_in
from gwpolicy.sandbox import builtin
from gwpolicy.sandbox.objects import MISSING, clone, is_builtin
from gwpolicy.sandbox.resources import Resource


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return clone(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


FieldPath = tuple[str, ...]
IGNORED = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"),
            ("metadata", "resourceVersion"), ("metadata", "uid"), ("metadata", "creationTimestamp"),
            ("metadata", "generation"), ("metadata", "managedFields")}


def leaf_paths(obj: Any, prefix: FieldPath = ()) -> dict[FieldPath, Any]:
    """Fields a manager owns: every leaf; lists are atomic (one field)."""
    out: dict[FieldPath, Any] = {}
    if isinstance(obj, dict) and (obj or not prefix):
        for k, v in obj.items():
            p = prefix + (k,)
            if p in IGNORED or p[:2] == ("metadata", "managedFields"):
                continue
            out.update(leaf_paths(v, p))
    else:
        out[prefix] = obj
    return out


def fields_v1(paths: set[FieldPath]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for p in sorted(paths):
        node = root
        for seg in p:
            node = node.setdefault(f"f:{seg}", {})
    return root


def paths_from_fields_v1(fv1: dict[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    out: set[FieldPath] = set()
    for k, v in (fv1 or {}).items():
        if not k.startswith("f:"):
            continue
        p = prefix + (k[2:],)
        if isinstance(v, dict) and v:
            out |= paths_from_fields_v1(v, p)
        else:
            out.add(p)
    return out


def get_path(obj: Any, path: FieldPath) -> Any:
    for seg in path:
        if not isinstance(obj, dict) or seg not in obj:
            return MISSING
        obj = obj[seg]
    return obj


def delete_path(obj: dict[str, Any], path: FieldPath) -> None:
    parents = []
    node: Any = obj
    for seg in path[:-1]:
        if not isinstance(node, dict) or seg not in node:
            return
        parents.append((node, seg))
        node = node[seg]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, seg in reversed(parents):  # drop maps the removal emptied
        if parent[seg] == {}:
            del parent[seg]
        else:
            break




def with_defaults(r: Resource, applied: dict[str, Any], live: dict[str, Any]) -> dict[str, Any] | None:
    """An applied configuration of a built-in kind with the defaults the server gives it (None for a
    custom resource, or where they cannot be applied to it)."""
    if not is_builtin(r):
        return None
    out = clone(applied)
    try:
        builtin.convert(r.group, r.kind, out, live)
    except Exception:  # noqa: BLE001 - a malformed configuration is refused later, in its own words
        return None
    return out


def overlap(a: FieldPath, b: FieldPath) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def smd_path(body: Any, path: str) -> str:
    """A field path as the sandbox names it (`spec.listeners[0].x`) as structured-merge-diff does
    (`.spec.listeners[name="http"].x`), reading the list items' names from the applied body."""
    out = []
    node = body
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            i = int(part[1:-1])
            item = node[i] if isinstance(node, list) and i < len(node) else None
            out.append(f'[name="{item["name"]}"]' if isinstance(item, dict) and isinstance(item.get("name"), str) else part)
            node = item
        else:
            out.append("." + part)
            node = node.get(part) if isinstance(node, dict) else None
    return "".join(out)


def set_path(obj: dict[str, Any], path: FieldPath, value: Any) -> None:
    set_in(obj, path, clone(value))
