"""JSON value helpers shared by the merge strategies: strict equality and the S5.3 notion of unset."""

from __future__ import annotations

from typing import Any


def same(a: Any, b: Any) -> bool:
    """JSON equality: `true` is not `1`, `1` is `1.0` only as numbers are in JSON."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b and (isinstance(a, (int, float)) == isinstance(b, (int, float)))


def is_unset(value: Any) -> bool:
    """S5.3: absent, null, "", [] and {} are unset; 0 and false are values."""
    return value is None or (isinstance(value, (str, list, dict)) and len(value) == 0)


def dig(obj: Any, path: tuple[str, ...]) -> Any:
    """The value at a dotted path inside an object, or None."""
    for seg in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(seg)
    return obj


def nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """`("a", "b"), v` -> `{"a": {"b": v}}`."""
    out: Any = value
    for seg in reversed(path):
        out = {seg: out}
    return out


def set_in(root: dict[Any, Any], path: tuple[Any, ...], value: Any) -> None:
    """Set `value` at `path`, making (or replacing non-object values with) objects on the way."""
    node = root
    for seg in path[:-1]:
        nxt = node.get(seg)
        if not isinstance(nxt, dict):
            nxt = node[seg] = {}
        node = nxt
    node[path[-1]] = value
