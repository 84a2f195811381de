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
  engine reads a schema's structure only, `shapes.JSON_SCHEMA`). In routes, Gateways and Services
  the spec's lists are held once across objects (`kept_spec`).
- of `status`, only the lists the controller writes or keeps other writers' entries of:
  `ancestors` (policies), `parents` (routes), `conditions` (Gateways, GatewayClasses). Services,
  Namespaces, ReferenceGrants, PolicyKinds and CRDs keep none: nothing of theirs is written but
  our annotation. A status write is a merge patch between the kept status and the desired one,
  both computed from the kept form, so a key dropped here is never in a patch and the API
  server keeps it as it is.
- every other top-level field as it is.

Every string is interned: the kinds, groups, namespaces, condition types, reasons and timestamps
that repeat across tens of thousands of objects are then held once. In status, equal objects and
lists are held once too (`shared`): a route's breadcrumb repeats the same conditions under each of
its parents, and a parentRef is the same in every route of a listener. Only status is shared so:
the code that reads it (`status.py`, the writes) copies before it changes anything, while a spec's
values travel into merges.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from gwpolicy.engine.kinds import ROUTE_KINDS, split_api_version
from gwpolicy.engine.refs import CORE_GROUP, GATEWAY_GROUP
from gwpolicy.engine.status import ANNOTATION

#: (group, kind) whose status the controller never reads nor writes (only our annotation)
_NO_STATUS = {(CORE_GROUP, "Service"), (CORE_GROUP, "Namespace"), (GATEWAY_GROUP, "ReferenceGrant"),
              ("gwpolicy.io", "PolicyKind"), ("apiextensions.k8s.io", "CustomResourceDefinition")}
#: the lists of status the controller writes (or keeps the entries of other writers in)
_STATUS_LISTS = ("ancestors", "parents", "conditions")
_CRD = ("apiextensions.k8s.io", "CustomResourceDefinition")
#: kinds whose spec lists are held once across objects (`kept_spec`): built-in kinds, never policies
_SHARED_LIST_ITEMS = {*((GATEWAY_GROUP, k) for k in ROUTE_KINDS), (GATEWAY_GROUP, "Gateway"), (CORE_GROUP, "Service")}
#: strings longer than this are left as they are (a long value is rarely repeated)
_INTERN_UP_TO = 512

_intern = sys.intern
_OURS_ONLY = {ANNOTATION: "true"}


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
        elif key == "spec" and (group, kind) in _SHARED_LIST_ITEMS:
            value = kept_spec(value)
        else:
            value = compact(value)
        out[_intern(key)] = value
    return out


def kept_metadata(meta: Any) -> Any:
    """metadata without managedFields, and only the annotations a field path or the controller reads."""
    return _rebuilt(meta, _metadata_value)


def _metadata_value(key: str, value: Any) -> Any:
    if key == "managedFields":
        return _LEFT_OUT
    if key == "annotations" and type(value) is dict:
        value = {_intern(k): compact(v) for k, v in value.items() if k == ANNOTATION or type(k) is not str or "." not in k}
        if not value:
            return _LEFT_OUT
        return _OURS_ONLY if value == _OURS_ONLY else value  # the breadcrumb of most objects we write, held once
    return compact(value)


def kept_status(group: str, kind: Any, status: Any) -> Any:
    """The lists of status the controller writes; None when it keeps nothing of it."""
    if (group, kind) in _NO_STATUS:
        return None
    if type(status) is not dict:
        return compact(status)  # not an object: the analysis says so, as it would of the whole object
    return {_intern(k): shared(v) for k, v in status.items() if k in _STATUS_LISTS}


def kept_spec(value: Any) -> Any:
    """A route's, Gateway's or Service's spec with its lists shared (parentRefs, rules, backendRefs,
    matches, ports repeat across thousands of objects). Only lists and what is inside them: a
    fieldMappings path (keys only) can reach a list but nothing inside one, and a merge never
    changes a list, so a shared value never changes."""
    t = type(value)
    if t is dict:
        return {(_intern(k) if type(k) is str and len(k) <= _INTERN_UP_TO else k): kept_spec(v) for k, v in value.items()}
    if t is list:
        return shared(value)
    return compact(value)


def kept_crd_spec(spec: Any) -> Any:
    """A CRD's spec with the descriptions taken out of its schemas (the engine and the controller read
    their structure: types, properties, items, x-kubernetes-* markers, whether status is declared)."""
    return _rebuilt(spec, _crd_spec_value)


def _crd_spec_value(key: str, value: Any) -> Any:
    if key == "versions" and type(value) is list:
        return [_rebuilt(v, _crd_version_value) for v in value]
    if key == "validation" and type(value) is dict:  # apiextensions v1beta1
        return _rebuilt(value, _schema_holder_value)
    return compact(value)


def _crd_version_value(key: str, value: Any) -> Any:
    if key == "schema" and type(value) is dict:
        return _rebuilt(value, _schema_holder_value)
    return compact(value)


def _schema_holder_value(key: str, value: Any) -> Any:
    return _schema(value) if key == "openAPIV3Schema" else compact(value)


#: schema keywords whose value is one schema, and those whose value is a list or map of schemas
_ONE_SCHEMA = ("items", "additionalProperties", "not", "additionalItems")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "dependencies")


#: what `_rebuilt`'s `value_of` answers for a key to leave out
_LEFT_OUT = object()


def _rebuilt(obj: Any, value_of: Callable[[str, Any], Any]) -> Any:
    """A JSON object rebuilt key by key: each key interned, each value `value_of(key, value)` (a key
    whose answer is _LEFT_OUT is left out); anything but an object compacted whole. The one loop of
    every kept form that treats some keys apart (metadata, CRD specs and their schemas)."""
    if type(obj) is not dict:
        return compact(obj)
    out = {}
    for key, value in obj.items():
        value = value_of(key, value)
        if value is not _LEFT_OUT:
            out[_intern(key)] = value
    return out


def _schema(schema: Any) -> Any:
    """A JSON schema without `description`s (only where it is a keyword, never a property's name)."""
    return _rebuilt(schema, _schema_value)


def _schema_value(key: str, value: Any) -> Any:
    if key == "description":
        return _LEFT_OUT
    if key in _ONE_SCHEMA and type(value) is dict:
        return _schema(value)
    if key in _SCHEMA_LISTS and type(value) is list:
        return [_schema(v) for v in value]
    if key in _SCHEMA_MAPS and type(value) is dict:
        return {_intern(k) if type(k) is str else k: _schema(v) for k, v in value.items()}
    return compact(value)


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


def share_unchanged(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Make `new` (the next copy of an object) hold `old`'s values wherever they are equal, its spec
    above all. The analysis keeps the copy it analysed until a change it must see: after a status
    write the model holds the answer and the analysis the copy before, and without this both
    would hold a spec of their own."""
    for key, value in new.items():
        was = old.get(key)
        if _equal_apart(was, value):
            new[key] = was
        elif key == "metadata" and type(was) is dict and type(value) is dict:
            for mkey, mvalue in value.items():
                mwas = was.get(mkey)
                if _equal_apart(mwas, mvalue):
                    value[mkey] = mwas


def _equal_apart(was: Any, value: Any) -> bool:
    """Equal values held twice (of one type: True == 1 must not share)."""
    return was is not None and was is not value and type(was) is type(value) and was == value


class _Shared:
    """Equal JSON objects and lists, held once: a table from content to the one copy kept of it.

    A content is keyed by its keys and, for each value, the value itself (strings are interned),
    a marker of its type where equality would mix types (True == 1 == 1.0), or the identity of a
    nested object or list, which is already the one copy kept. The table forgets everything once it
    holds `limit` entries (dicts cannot be weakly referenced): copies handed out stay shared, and
    the contents met again are met with a new copy each, so the table stays small whatever the
    cluster's size while the contents most repeated are still held once per generation.
    """

    __slots__ = ("objects", "lists", "limit")

    def __init__(self, limit: int = 1 << 12) -> None:  # as much sharing at 20k routes as 1 << 20, in 1/1000 of the table
        self.objects: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.lists: dict[tuple[Any, ...], list[Any]] = {}
        self.limit = limit

    def __call__(self, value: Any) -> Any:
        t = type(value)
        if t is str:
            return _intern(value) if len(value) <= _INTERN_UP_TO else value
        out: Any  # a dict or a list, and the table of its kind (annotations only: this runs per value)
        table: dict[tuple[Any, ...], Any]
        if t is dict:
            out = {}
            key: list[Any] = []
            for k, v in value.items():
                k = _intern(k) if type(k) is str and len(k) <= _INTERN_UP_TO else k
                v = self(v)
                out[k] = v
                key.append(k)
                key.append(_mark(v))
            table = self.objects
        elif t is list:
            out = [self(v) for v in value]
            key = [_mark(v) for v in out]
            table = self.lists
        else:
            return value
        frozen = tuple(key)
        try:
            found = table.get(frozen)
        except TypeError:  # an unhashable key (a key of a type JSON has not): keep it apart
            return out
        if found is not None:
            return found
        if len(table) >= self.limit:
            table.clear()
        table[frozen] = out
        return out


def _mark(v: Any) -> Any:
    t = type(v)
    if t is str or t is int or v is None:
        return v
    if t is dict or t is list:
        return (id(v),)  # the one copy kept of it (a tuple: never equal to a number)
    return (t, v)  # bool and float: True == 1 == 1.0 must not share


#: the table `kept_status` shares through (one per process; the controller runs one event loop)
shared = _Shared()
