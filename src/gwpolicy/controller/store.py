"""What the controller keeps of an object: what the analysis reads and what its status writes need,
in a compact form.

An informer hands the controller whole objects; at 50k routes keeping them whole (and, after the
first complete status, the status of 120k objects) is most of its memory. `kept(raw)` is the copy
the controller keeps instead, one pure function per kind of content:

- `metadata` without `managedFields` (nothing reads them), and of `annotations` only the keys a
  `fieldMappings` path could name (no dot in them: a path is split on dots) and ours: this drops
  `kubectl.kubernetes.io/last-applied-configuration`, a whole second copy of the object.
- `spec` whole (a PolicyKind's `fieldMappings` may name any field of a target), except in a
  CustomResourceDefinition, whose schemas lose their `description`s (most of a CRD's bytes; the
  engine reads a schema's structure only, `shapes.JSON_SCHEMA`).
- of `status`, only the lists the controller writes or keeps other writers' entries of:
  `ancestors` (policies), `parents` (routes), `conditions` (Gateways, GatewayClasses). Services,
  Namespaces, ReferenceGrants, PolicyKinds and CRDs keep none: nothing of theirs is written but
  our annotation. A status write is a merge patch between the kept status and the desired one,
  both computed from the kept form, so a key dropped here is never in a patch and the API
  server keeps it as it is.
- every other top-level field as it is.

Every string is interned: the kinds, groups, namespaces, condition types, reasons and timestamps
that repeat across tens of thousands of objects are then held once.
"""

from __future__ import annotations

import sys
from typing import Any

from gwpolicy.kinds import split_api_version
from gwpolicy.refs import CORE_GROUP, GATEWAY_GROUP
from gwpolicy.status import ANNOTATION

#: (group, kind) whose status the controller never reads nor writes (only our annotation)
_NO_STATUS = {(CORE_GROUP, "Service"), (CORE_GROUP, "Namespace"), (GATEWAY_GROUP, "ReferenceGrant"),
              ("gwpolicy.io", "PolicyKind"), ("apiextensions.k8s.io", "CustomResourceDefinition")}
#: the lists of status the controller writes (or keeps the entries of other writers in)
_STATUS_LISTS = ("ancestors", "parents", "conditions")
_CRD = ("apiextensions.k8s.io", "CustomResourceDefinition")
#: strings longer than this are left as they are (a long value is rarely repeated)
_INTERN_UP_TO = 512

_intern = sys.intern


def kept(raw: dict[str, Any]) -> dict[str, Any]:
    """The compact copy of an object the controller keeps (see the module docstring); `raw` is not changed."""
    group, _ = split_api_version(raw.get("apiVersion") or "") if isinstance(raw.get("apiVersion"), str) else ("", "")
    kind = raw.get("kind")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "metadata":
            value = kept_metadata(value)
        elif key == "status":
            value = kept_status(group, kind, value)
            if value is None:
                continue
        elif key == "spec" and (group, kind) == _CRD:
            value = kept_crd_spec(value)
        else:
            value = compact(value)
        out[_intern(key)] = value
    return out


def kept_metadata(meta: Any) -> Any:
    """metadata without managedFields, and only the annotations a field path or the controller reads."""
    if type(meta) is not dict:
        return compact(meta)
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "managedFields":
            continue
        if key == "annotations" and type(value) is dict:
            value = {_intern(k): compact(v) for k, v in value.items()
                     if k == ANNOTATION or type(k) is not str or "." not in k}
            if not value:
                continue
        else:
            value = compact(value)
        out[_intern(key)] = value
    return out


def kept_status(group: str, kind: Any, status: Any) -> Any:
    """The lists of status the controller writes; None when it keeps nothing of it."""
    if (group, kind) in _NO_STATUS:
        return None
    if type(status) is not dict:
        return compact(status)  # not an object: the analysis says so, as it would of the whole object
    return {_intern(k): compact(v) for k, v in status.items() if k in _STATUS_LISTS}


def kept_crd_spec(spec: Any) -> Any:
    """A CRD's spec with the descriptions taken out of its schemas (the engine and the controller read
    their structure: types, properties, items, x-kubernetes-* markers, whether status is declared)."""
    if type(spec) is not dict:
        return compact(spec)
    out = {}
    for key, value in spec.items():
        if key == "versions" and type(value) is list:
            value = [_kept_version(v) for v in value]
        elif key == "validation" and type(value) is dict:  # apiextensions v1beta1
            value = {_intern(k): (_schema(v) if k == "openAPIV3Schema" else compact(v)) for k, v in value.items()}
        else:
            value = compact(value)
        out[_intern(key)] = value
    return out


def _kept_version(version: Any) -> Any:
    if type(version) is not dict:
        return compact(version)
    out = {}
    for key, value in version.items():
        if key == "schema" and type(value) is dict:
            value = {_intern(k): (_schema(v) if k == "openAPIV3Schema" else compact(v)) for k, v in value.items()}
        else:
            value = compact(value)
        out[_intern(key)] = value
    return out


#: schema keywords whose value is one schema, and those whose value is a list or map of schemas
_ONE_SCHEMA = ("items", "additionalProperties", "not", "additionalItems")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "dependencies")


def _schema(schema: Any) -> Any:
    """A JSON schema without `description`s (only where it is a keyword, never a property's name)."""
    if type(schema) is not dict:
        return compact(schema)
    out = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key in _ONE_SCHEMA and type(value) is dict:
            value = _schema(value)
        elif key in _SCHEMA_LISTS and type(value) is list:
            value = [_schema(v) for v in value]
        elif key in _SCHEMA_MAPS and type(value) is dict:
            value = {_intern(k) if type(k) is str else k: _schema(v) for k, v in value.items()}
        else:
            value = compact(value)
        out[_intern(key)] = value
    return out


def compact(value: Any) -> Any:
    """A copy of a JSON value with every string (key or value) interned."""
    t = type(value)
    if t is str:
        return _intern(value) if len(value) <= _INTERN_UP_TO else value
    if t is dict:
        return {(_intern(k) if type(k) is str and len(k) <= _INTERN_UP_TO else k): compact(v) for k, v in value.items()}
    if t is list:
        return [compact(v) for v in value]
    return value
