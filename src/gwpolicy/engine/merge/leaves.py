"""Leaves of a settings object (S5.1): what FieldMerge compares, replaces and attributes to a source.

Objects are descended into; lists, scalars, and maps the CRD schema declares as maps
(`additionalProperties`, `x-kubernetes-map-type: atomic`) are leaves. A list with
`x-kubernetes-list-type: map` contributes one leaf per item, keyed by its list-map keys.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gwpolicy.engine.merge.values import set_in


class ListKey(NamedTuple):
    """One item of a `x-kubernetes-list-type: map` list, identified by its key fields."""

    keys: tuple[tuple[str, Any], ...]

    def __str__(self) -> str:
        return "[" + ",".join(f"{k}={v}" for k, v in self.keys) + "]"


LeafPath = tuple[Any, ...]  # str segments, and a ListKey as the last segment of a list-map item


def escape_key(key: str) -> str:
    r"""A settings key as one segment of a dotted name: `.`, `[` and `\` inside it are escaped with `\`
    (as kubectl's JSONPath does), so the key `a.b` (`a\.b`) never reads as the field `b` inside `a`."""
    if "." not in key and "[" not in key and "\\" not in key:
        return key
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def field_name(path: LeafPath) -> str:
    r"""Dotted name of a leaf as S9 prints it: `a.b`, `headers[name=x]`, `annotations.example\.io/x`."""
    out = ""
    for seg in path:
        if isinstance(seg, ListKey):
            out += str(seg)
        else:
            out += ("." if out else "") + escape_key(str(seg))
    return out


def child_schema(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if not schema:
        return None
    props = schema.get("properties")
    if isinstance(props, dict) and isinstance(props.get(key), dict):
        return props[key]
    return None


def _is_map_leaf(schema: dict[str, Any] | None) -> bool:
    if not schema:
        return False
    if schema.get("x-kubernetes-map-type") == "atomic":
        return True
    extra = schema.get("additionalProperties")
    return bool(extra) and not schema.get("properties")


def flatten(settings: dict[str, Any], schema: dict[str, Any] | None) -> dict[LeafPath, Any]:
    """Leaves of `settings`; `null` values are not settings (S2.4) and empty objects hold none."""
    out: dict[LeafPath, Any] = {}
    _walk(settings, schema, (), out)
    return out


def _walk(value: Any, schema: dict[str, Any] | None, path: LeafPath, out: dict[LeafPath, Any]) -> None:
    if isinstance(value, dict) and (not path or not _is_map_leaf(schema)):
        for k, v in value.items():
            if v is None:
                continue
            _walk(v, child_schema(schema, k), path + (k,), out)
        return
    if isinstance(value, list) and schema and schema.get("x-kubernetes-list-type") == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        if keys and all(isinstance(i, dict) for i in value):
            for item in value:
                out[path + (ListKey(tuple((k, item.get(k)) for k in keys)),)] = item
            return
    out[path] = value


def overlaps(a: LeafPath, b: LeafPath) -> bool:
    """Leaves overlap when one path is a prefix of the other (S5.1)."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def unflatten(leaves: dict[LeafPath, Any]) -> dict[str, Any]:
    """Rebuild nested settings from leaves; list-map items come back as a list sorted by their keys."""
    root: dict[Any, Any] = {}
    has_lists = False
    for path, value in leaves.items():
        if isinstance(path[-1], ListKey):
            has_lists = True
        set_in(root, path, value)
    return _lists(root) if has_lists else root


def _sort_key(lk: ListKey) -> tuple:
    return tuple((type(v).__name__, str(v)) for _, v in lk.keys)


def _lists(node: Any) -> Any:
    if isinstance(node, dict):
        if node and all(isinstance(k, ListKey) for k in node):
            return [node[k] for k in sorted(node, key=_sort_key)]
        return {k: _lists(v) for k, v in node.items()}
    return node
