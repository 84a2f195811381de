"""Machine-readable shapes of S9 and their encoders (JSON through orjson, YAML through the C dumper)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, BinaryIO, Callable

import orjson
import yaml

from gwpolicy.engine.analysis import Analysis, StatusChange

if TYPE_CHECKING:
    from gwpolicy.engine.topology import PathNode

#: which paths an output keeps (`--from`: the mesh paths of one namespace's requests)
KeepPath = Callable[["PathNode"], bool]

try:
    _Dumper: Any = yaml.CSafeDumper
except AttributeError:  # pragma: no cover
    _Dumper = yaml.SafeDumper

API_VERSION = "gwpolicy.io/v1alpha1"


def effective_list(a: Analysis, namespace: str | None = None, keep: KeepPath | None = None) -> dict[str, Any]:
    """S9 EffectivePolicyList; `namespace` keeps the targets that live in it, `keep` the paths it holds true of."""
    items = []
    for ep in a.effective:
        if namespace is not None and ep.target.namespace != namespace or keep is not None and not keep(ep.path):
            continue
        items.append({
            "target": ep.target.to_target_json(),
            "path": ep.path.to_json(),
            "policyKind": ep.kind.to_json(),
            "spec": ep.result.spec,
            "sources": ep.result.sources,
        })
    return {"apiVersion": API_VERSION, "kind": "EffectivePolicyList", "items": items}


def status_list(a: Analysis, namespace: str | None = None, changes: list[StatusChange] | None = None) -> dict[str, Any]:
    """S9 StatusList: what the controller would write (or the `changes` given: the mesh
    controller's), one item per object that changes."""
    items = []
    for ch in a.status_changes() if changes is None else changes:
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
_NEXT = b",\n    {"


def _part(value: Any) -> bytes:
    """A value encoded as it appears inside an item of an indented list document."""
    return orjson.dumps(value, option=_IND).replace(b"\n", _ITEM_FIELD)


def write_effective(a: Analysis, out: BinaryIO, fmt: str, namespace: str | None = None,
                    chunk: int = 1 << 22, keep: KeepPath | None = None) -> None:
    """Write the S9 EffectivePolicyList in a few large writes, without building it in memory.

    Shared parts are encoded once: the target and path once for the items that follow each other
    with them, the spec and sources once per distinct result; an item is their concatenation. The bytes are
    exactly what encoding the whole document at once gives (a test holds that).
    """
    if fmt != "json":
        doc = effective_list(a, namespace, keep)
        items = doc.pop("items")
        header = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
        out.write(header.encode() + (b"items:\n" if items else b"items: []\n"))
        for i in range(0, len(items), 2000):
            out.write(yaml.dump(items[i:i + 2000], Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                allow_unicode=True).encode())
        return
    out.write(b'{\n  "apiVersion": "' + API_VERSION.encode() + b'",\n  "kind": "EffectivePolicyList",\n  "items": [')
    last_target: Any = None
    last_path: Any = None
    t = head = b""
    kinds: dict[Any, bytes] = {}
    tails: dict[tuple[int, Any], bytes] = {}  # (result, kind): everything of an item after its path
    buf: list[bytes] = []
    size = 0
    first = True
    for ep in a.effective:
        if namespace is not None and ep.target.namespace != namespace or keep is not None and not keep(ep.path):
            continue
        if ep.path is not last_path or ep.target is not last_target:
            if ep.target is not last_target:  # items come grouped by target, then path: keep only the last
                last_target, t = ep.target, _part(ep.target.to_target_json())
            last_path = ep.path
            head = _NEXT + _TARGET + t + _PATH + _part(ep.path.to_json())
        kk = ep.kind.key
        tail = tails.get((id(ep.result), kk))
        if tail is None:
            k = kinds.get(kk)
            if k is None:
                k = kinds[kk] = _part(ep.kind.to_json())
            tail = tails[(id(ep.result), kk)] = (
                _KIND + k + b"," + _ITEM_FIELD + b'"spec": ' + _part(ep.result.spec) + b"," + _ITEM_FIELD
                + b'"sources": ' + _part(ep.result.sources) + _END)
        if first:
            buf += (head[1:], tail)  # the first item has no comma before it
            first = False
        else:
            buf += (head, tail)
        size += len(head) + len(tail)
        if size >= chunk:
            out.write(b"".join(buf))
            buf, size = [], 0
    buf.append(b"]\n}\n" if first else b"\n  ]\n}\n")
    out.write(b"".join(buf))


def encode(doc: Any, fmt: str) -> bytes:
    """`json` (indented, one buffer) or `yaml`."""
    if fmt == "json":
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    if fmt == "yaml":
        return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True).encode()
    raise ValueError(f"unknown output format {fmt!r}")
