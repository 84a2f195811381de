"""Machine-readable shapes of S9 and their encoders (JSON through orjson, YAML through the C dumper)."""

from __future__ import annotations

from typing import Any, BinaryIO

import orjson
import yaml

from gwpolicy.analysis import Analysis

try:
    _Dumper: Any = yaml.CSafeDumper
except AttributeError:  # pragma: no cover
    _Dumper = yaml.SafeDumper

API_VERSION = "gwpolicy.io/v1alpha1"


def effective_list(a: Analysis, namespace: str | None = None) -> dict[str, Any]:
    """S9 EffectivePolicyList; `namespace` keeps the targets that live in it."""
    items = []
    for ep in a.effective:
        if namespace is not None and ep.target.namespace != namespace:
            continue
        items.append({
            "target": ep.target.to_target_json(),
            "path": ep.path.to_json(),
            "policyKind": ep.kind.to_json(),
            "spec": ep.result.spec,
            "sources": ep.result.sources,
        })
    return {"apiVersion": API_VERSION, "kind": "EffectivePolicyList", "items": items}


def status_list(a: Analysis, namespace: str | None = None) -> dict[str, Any]:
    """S9 StatusList: what the controller would write, one item per object that changes."""
    items = []
    for ch in a.status_changes():
        if namespace is not None and ch.object.namespace != namespace:
            continue
        ref = ch.object
        obj: dict[str, Any] = {"group": ref.group, "kind": ref.kind}
        if ref.namespace is not None:
            obj["namespace"] = ref.namespace
        obj["name"] = ref.name
        items.append({"object": obj, "status": ch.status, "annotations": ch.annotations})
    return {"apiVersion": API_VERSION, "kind": "StatusList", "items": items}


_IND = orjson.OPT_INDENT_2
_ITEM_FIELD = b"\n      "  # fields of an item sit at depth 3 of the document
_TARGET = _ITEM_FIELD + b'"target": '
_PATH = b"," + _ITEM_FIELD + b'"path": '
_KIND = b"," + _ITEM_FIELD + b'"policyKind": '
_END = b"\n    }"


def _part(value: Any) -> bytes:
    """A value encoded as it appears inside an item of an indented list document."""
    return orjson.dumps(value, option=_IND).replace(b"\n", _ITEM_FIELD)


def write_effective(a: Analysis, out: BinaryIO, fmt: str, namespace: str | None = None,
                    chunk: int = 1 << 22) -> None:
    """Write the S9 EffectivePolicyList in a few large writes, without building it in memory.

    Shared parts are encoded once: the target and path once for the items that follow each other
    with them, the spec and sources once per distinct result; an item is their concatenation. The bytes are
    exactly what encoding the whole document at once gives (a test holds that).
    """
    if fmt != "json":
        doc = effective_list(a, namespace)
        items = doc.pop("items")
        head = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
        out.write(head.encode() + (b"items:\n" if items else b"items: []\n"))
        for i in range(0, len(items), 2000):
            out.write(yaml.dump(items[i:i + 2000], Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                allow_unicode=True).encode())
        return
    out.write(b'{\n  "apiVersion": "' + API_VERSION.encode() + b'",\n  "kind": "EffectivePolicyList",\n  "items": [')
    last_target: Any = None
    last_path: Any = None
    t = p = b""
    kinds: dict[Any, bytes] = {}
    results: dict[int, bytes] = {}
    buf: list[bytes] = []
    size = 0
    sep = b"\n    {"
    any_item = False
    for ep in a.effective:
        if namespace is not None and ep.target.namespace != namespace:
            continue
        if ep.target is not last_target:  # items come grouped by target, then path: keep only the last
            last_target, t = ep.target, _part(ep.target.to_target_json())
        if ep.path is not last_path:
            last_path, p = ep.path, _part(ep.path.to_json())
        k = kinds.get(ep.kind.key)
        if k is None:
            k = kinds[ep.kind.key] = _part(ep.kind.to_json())
        r = results.get(id(ep.result))
        if r is None:
            r = results[id(ep.result)] = (b"," + _ITEM_FIELD + b'"spec": ' + _part(ep.result.spec) + b"," + _ITEM_FIELD
                                          + b'"sources": ' + _part(ep.result.sources))
        buf += (sep, _TARGET, t, _PATH, p, _KIND, k, r, _END)
        sep = b",\n    {"
        any_item = True
        size += len(p) + len(r) + 200
        if size >= chunk:
            out.write(b"".join(buf))
            buf, size = [], 0
    buf.append(b"\n  ]\n}\n" if any_item else b"]\n}\n")
    out.write(b"".join(buf))


def encode(doc: Any, fmt: str) -> bytes:
    """`json` (indented, one buffer) or `yaml`."""
    if fmt == "json":
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    if fmt == "yaml":
        return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True).encode()
    raise ValueError(f"unknown output format {fmt!r}")
