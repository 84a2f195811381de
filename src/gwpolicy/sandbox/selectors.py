"""Label and field selectors as the API server takes them on lists and watches."""

from __future__ import annotations

import re
from typing import Any, Callable

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_matcher(text: str | None) -> Callable[[dict[str, str]], bool]:
    """A Kubernetes label selector string (`a=b,c!=d,e,!f,g in (x,y)`) as a predicate on labels."""
    if not text:
        return lambda labels: True
    tests: list[Callable[[dict[str, str]], bool]] = []
    for part in _split_selector(text):
        m = _SET_RE.match(part)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            tests.append((lambda k, vs: lambda l: l.get(k) in vs)(key, vals) if op == "in"
                         else (lambda k, vs: lambda l: l.get(k) not in vs)(key, vals))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            tests.append((lambda k, v: lambda l: l.get(k) != v)(k.strip(), v.strip()))
        elif "=" in part:
            k, v = part.split("==", 1) if "==" in part else part.split("=", 1)
            tests.append((lambda k, v: lambda l: l.get(k) == v)(k.strip(), v.strip()))
        elif part.startswith("!"):
            tests.append((lambda k: lambda l: k not in l)(part[1:].strip()))
        else:
            tests.append((lambda k: lambda l: k in l)(part))
    return lambda labels: all(t(labels) for t in tests)


def field_matcher(text: str | None) -> Callable[[dict[str, Any]], bool]:
    """Field selectors on metadata.name and metadata.namespace (what list and watch clients use)."""
    if not text:
        return lambda obj: True
    tests = []
    for part in _split_selector(text):
        neg = "!=" in part
        k, v = part.split("!=" if neg else ("==" if "==" in part else "="), 1)
        path = k.strip().split(".")

        def get(obj: Any, path: list[str] = path) -> Any:  # an object, then each value on the path (None past its end)
            for seg in path:
                obj = obj.get(seg) if isinstance(obj, dict) else None
            return "" if obj is None else str(obj)

        tests.append((lambda g, v, neg: lambda o: (g(o) != v) if neg else (g(o) == v))(get, v.strip(), neg))
    return lambda obj: all(t(obj) for t in tests)
