"""Server-side printing (`Accept: application/json;as=Table`), as kube-apiserver does it for custom
resources: a Name column, then the CRD's `additionalPrinterColumns` (each a JSONPath of the subset
CRDs use: `.a.b`, `[*]`, `[n]`, `[?(@.k=="v")]`), or Name and Age when the CRD lists none; and for
the built-in kinds, as its table printers do (sandbox/printers.py)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Callable

import orjson

from gwpolicy.sandbox.printers import NAMELESS, PRINTERS
from gwpolicy.sandbox.resources import Resource

_STEP = re.compile(r"""\.([A-Za-z0-9_\-]+)|\[\*\]|\[(-?\d+)\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*==\s*["']([^"']*)["']\)\]""")

DEFAULT_COLUMNS = ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},)


def compile_path(path: str) -> Callable[[Any], list[Any]]:
    """A JSONPath of the CRD subset as a function from an object to the values it selects."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    steps: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        m = _STEP.match(text, pos)
        if not m:
            raise ValueError(f"unsupported JSONPath {path!r} at {text[pos:]!r}")
        if m.group(1) is not None:
            steps.append(("field", m.group(1)))
        elif m.group(2) is not None:
            steps.append(("index", int(m.group(2))))
        elif m.group(3) is not None:
            steps.append(("filter", (m.group(3).split("."), m.group(4))))
        else:
            steps.append(("all", None))
        pos = m.end()

    def select(obj: Any) -> list[Any]:
        current = [obj]
        for kind, arg in steps:
            nxt: list[Any] = []
            for v in current:
                if kind == "field" and isinstance(v, dict) and arg in v:
                    nxt.append(v[arg])
                elif kind == "index" and isinstance(v, list) and -len(v) <= arg < len(v):
                    nxt.append(v[arg])
                elif kind == "all" and isinstance(v, list):
                    nxt.extend(v)
                elif kind == "filter" and isinstance(v, list):
                    keys, want = arg
                    for item in v:
                        got: Any = item
                        for k in keys:
                            got = got.get(k) if isinstance(got, dict) else None
                        if got is not None and str(got) == want:
                            nxt.append(item)
            current = nxt
        return current

    return select


def _age(ts: Any) -> str:
    from gwpolicy.files.printers import age

    return age(ts if isinstance(ts, str) else "", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


def _cell(column: dict[str, Any], values: list[Any]) -> Any:
    if not values:
        return None
    if column.get("type") == "date":
        return _age(values[0])
    shown = [v if isinstance(v, (str, int, float, bool)) else orjson.dumps(v).decode() for v in values]
    if len(shown) == 1:
        return shown[0]
    return ",".join(str(v) for v in shown)


_COMPILED: dict[str, Callable[[Any], list[Any]]] = {}


def _partial(obj: dict[str, Any]) -> dict[str, Any]:
    """A row's object: its metadata (kubectl asks for it with `includeObject=Metadata`, the default)."""
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


NAME_COLUMN = {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a "
               "namespace.", "priority": 0}


def table(r: Resource, objs: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """A Table (`Accept: ...;as=Table`, what `kubectl get` asks for) of `objs`, with the list's metadata:
    its resourceVersion, and the continue token of a chunk (kubectl asks for the next chunk with it).
    A built-in kind gets kube-apiserver's own columns (sandbox/printers.py)."""
    printer = PRINTERS.get((r.group, r.kind)) if not r.printer_columns else None
    if printer is not None:
        columns, cells = printer
        if (r.group, r.kind) in NAMELESS:
            rows = [{"cells": cells(o), "object": _partial(o)} for o in objs]
        else:
            columns = [NAME_COLUMN, *columns]
            rows = [{"cells": [o["metadata"]["name"], *cells(o)], "object": _partial(o)} for o in objs]
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": dict(meta),
                "columnDefinitions": columns, "rows": rows}
    columns = list(r.printer_columns) or list(DEFAULT_COLUMNS)
    defs = [NAME_COLUMN]
    selectors = []
    for c in columns:
        defs.append({"name": c.get("name", ""), "type": c.get("type", "string"), "format": c.get("format", ""),
                     "description": c.get("description", ""), "priority": int(c.get("priority", 0))})
        path = c.get("jsonPath", "")
        if path not in _COMPILED:
            try:
                _COMPILED[path] = compile_path(path)
            except ValueError:
                _COMPILED[path] = lambda obj: []
        selectors.append(_COMPILED[path])
    rows = [{"cells": [o["metadata"]["name"], *(_cell(c, sel(o)) for c, sel in zip(columns, selectors))],
             "object": _partial(o)} for o in objs]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": dict(meta),
            "columnDefinitions": defs, "rows": rows}
