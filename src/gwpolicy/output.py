"""Machine-readable shapes of S9 and their encoders (JSON through orjson, YAML through the C dumper)."""

from __future__ import annotations

from typing import Any

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
    path_json: dict[tuple, list] = {}
    for ep in a.effective:
        if namespace is not None and ep.target.namespace != namespace:
            continue
        pj = path_json.get(ep.path)
        if pj is None:
            pj = path_json[ep.path] = [level.to_json() for level in ep.path]
        items.append({
            "target": ep.target.to_target_json(),
            "path": pj,
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


def encode(doc: Any, fmt: str) -> bytes:
    """`json` (indented, one buffer) or `yaml`."""
    if fmt == "json":
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    if fmt == "yaml":
        return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True).encode()
    raise ValueError(f"unknown output format {fmt!r}")
