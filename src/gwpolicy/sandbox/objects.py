"""The sandbox's storage: stored objects in etcd's key order, the API's failures and metadata
checks, events, and an older resourceVersion's view of one resource."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import orjson

from gwpolicy.sandbox import builtin, gotypes
from gwpolicy.sandbox.resources import Resource
from gwpolicy.sandbox.schema import FieldError

Key = tuple[str, str, str, str]  # group, plural, namespace ("" when cluster-scoped), name


MISSING = object()  # a key absent, told apart from a key holding None


def etcd_key(key: tuple[str, str]) -> str:
    """What orders a resource's objects in a list: their etcd key after the resource's prefix,
    `<namespace>/<name>` (`/<name>` cluster-scoped), compared as bytes, as etcd ranges over it. Not
    (namespace, name): namespace `a-b` sorts before `a` (`-` < `/`), and so do all of its objects."""
    return key[0] + "/" + key[1]  # names are ASCII (DNS names, path segments): code points are bytes


class Objects(dict[Key, dict[str, Any]]):
    """The stored objects by key, and the keys of each resource (group, plural) in order of arrival:
    a list, an admission check or a CRD's deletion reads one resource without a scan of every object
    (at 50k routes a scan per write made the writes of a first status quadratic)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_resource: dict[tuple[str, str], dict[Key, None]] = {}
        self._sorted: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (namespace, name) in order, per resource

    def __setitem__(self, key: Key, obj: dict[str, Any]) -> None:
        if key not in self:
            self.by_resource.setdefault(key[:2], {})[key] = None
            self._sorted.pop(key[:2], None)
        super().__setitem__(key, obj)

    def __delitem__(self, key: Key) -> None:
        super().__delitem__(key)
        self._unindex(key)

    def pop(self, key: Key, *default: Any) -> Any:
        if key not in self:
            return super().pop(key, *default)
        obj = super().pop(key)
        self._unindex(key)
        return obj

    def _unindex(self, key: Key) -> None:
        self._sorted.pop(key[:2], None)
        keys = self.by_resource[key[:2]]
        del keys[key]
        if not keys:
            del self.by_resource[key[:2]]

    def keys_of(self, group: str, plural: str) -> list[Key]:
        """The keys of one resource's objects (a copy: the caller may write while it walks them)."""
        return list(self.by_resource.get((group, plural), ()))

    def in_order(self, group: str, plural: str) -> list[tuple[str, str]]:
        """(namespace, name) of one resource's objects in etcd's order (`etcd_key`); kept until one is
        added or removed, so the chunks of one list (`Store.page`) sort once."""
        gp = (group, plural)
        out = self._sorted.get(gp)
        if out is None:
            out = self._sorted[gp] = sorted(((k[2], k[3]) for k in self.by_resource.get(gp, ())), key=etcd_key)
        return out

    def has(self, group: str, plural: str) -> bool:
        return (group, plural) in self.by_resource

    def copy(self) -> Objects:
        out = Objects()
        dict.update(out, self)
        out.by_resource = {gp: dict(keys) for gp, keys in self.by_resource.items()}
        out._sorted = dict(self._sorted)  # lists never changed in place, only dropped
        return out

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise TypeError("Objects keeps an index: set, delete or pop one key at a time")

    update = setdefault = popitem = clear = __ior__ = _refuse


class ApiFailure(Exception):
    """An error the server answers with a Kubernetes Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 list_meta: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}
        self.list_meta = list_meta or {}  # the Status's metadata (a continue token, for an expired one)

    def status(self) -> dict[str, Any]:
        out = {"kind": "Status", "apiVersion": "v1", "metadata": dict(self.list_meta), "status": "Failure",
               "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}
        if not self.reason:  # an internal error has none (omitempty)
            del out["reason"], out["details"]
        return out


def qualified_kind(r: Resource) -> str:
    """`HTTPRoute.gateway.networking.k8s.io`, `Service`: the kind as kube-apiserver's messages name it."""
    return f"{r.kind}.{r.group}" if r.group else r.kind


def invalid_fields(r: Resource, name: Any, errors: list[FieldError]) -> ApiFailure:
    """422 Invalid in kube-apiserver's words: `Kind.group "name" is invalid: field: why` (several in [...]),
    with one details.causes entry per field."""
    subject = f'{qualified_kind(r)} "{name}"' if isinstance(name, str) else qualified_kind(r)
    text = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    return ApiFailure(422, "Invalid", f"{subject} is invalid: {text}",
                      {"name": name if isinstance(name, str) else "", "group": r.group, "kind": r.kind,
                       "causes": [{"reason": e.reason, "message": e.body, "field": e.field} for e in errors]})


def invalid(r: Resource, name: Any, field: str, value: Any, why: str) -> ApiFailure:
    shown = orjson.dumps(value, default=str).decode()
    return invalid_fields(r, name, [FieldError(field, "FieldValueInvalid", f"Invalid value: {shown}: {why}")])


MAX_ANNOTATION_BYTES = 256 * 1024  # all of an object's annotations (TotalAnnotationSizeLimitB)


def validate_metadata(r: Resource, obj: dict[str, Any]) -> None:
    """What kube-apiserver checks of every object's metadata (ObjectMeta validation), so that no
    malformed object reaches storage or the watchers."""
    meta = obj["metadata"]
    name = meta.get("name")
    kind = builtin.KINDS.get((r.group, r.kind)) if is_builtin(r) else None
    if not isinstance(name, str):
        raise invalid(r, name, "metadata.name", name, builtin.DNS1123_SUBDOMAIN_MSG)
    errors = kind.name("metadata.name", name) if kind is not None else builtin.dns1123_subdomain("metadata.name", name)
    if errors:
        raise invalid_fields(r, name, errors)
    for part in ("labels", "annotations"):
        value = meta.get(part)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise invalid(r, name, f"metadata.{part}", value, "must be a map of strings to strings")
        errors = builtin.labels_map("metadata.labels", value) if part == "labels" else \
            [e for k in value for e in builtin.qualified_name("metadata.annotations", k)]
        if part == "annotations" and sum(len(k) + len(v) for k, v in value.items()) > MAX_ANNOTATION_BYTES:
            errors.append(builtin.too_long("metadata.annotations", MAX_ANNOTATION_BYTES))
        if errors:
            raise invalid_fields(r, name, errors)
    finalizers = meta.get("finalizers")
    if finalizers is not None and not (isinstance(finalizers, list) and all(isinstance(f, str) for f in finalizers)):
        raise invalid(r, name, "metadata.finalizers", finalizers, "must be a list of strings")


def is_builtin(r: Resource) -> bool:
    """A kind kube-apiserver itself serves (not one a CRD added)."""
    return (r.group, r.kind) in builtin.KINDS and gotypes.has_type(r.kind)


def not_found(r: Resource, name: str) -> ApiFailure:
    plural = f"{r.plural}.{r.group}" if r.group else r.plural
    return ApiFailure(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "group": r.group, "kind": r.plural})


def clone(value: Any) -> Any:
    """A deep copy of JSON-like data: an orjson round trip is ~10x faster than copy.deepcopy, and
    every object the store hands out or keeps is copied (callers must never share its dicts)."""
    try:
        return orjson.loads(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, orjson.JSONEncodeError):  # not JSON-like (a YAML date, ...): the slow way
        return copy.deepcopy(value)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON, types included: Python's == has True == 1 == 1.0, which are three values here."""
    if a != b:
        return False
    try:
        return orjson.dumps(a, option=orjson.OPT_NON_STR_KEYS) == orjson.dumps(b, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return False


def same_leaf(a: Any, b: Any) -> bool:
    """`same` for a leaf value (a scalar, or an empty list or map)."""
    return type(a) is type(b) and a == b


def share_unchanged(new: dict[str, Any], old: dict[str, Any]) -> None:
    """Before `new` replaces `old` in the store: each part of `new` equal to the same part of `old`
    becomes that part of `old` (spec, status, labels, each managedFields entry...). The watch window
    holds both versions, and a status write then costs the window only what it changed. Safe because
    stored objects are never changed in place; `new`'s own dicts (itself, its metadata) stay its own,
    as `_bump` writes the resourceVersion into them next."""
    for k, v in new.items():
        was = old.get(k, MISSING)
        if was is MISSING or was is v:
            continue
        if k == "metadata" and isinstance(v, dict) and isinstance(was, dict):
            for mk, mv in v.items():
                mwas = was.get(mk, MISSING)
                if mk == "managedFields" and isinstance(mv, list) and isinstance(mwas, list):
                    mv[:] = [next((e for e in mwas if same(e, entry)), entry) for entry in mv]
                elif mwas is not MISSING and mwas is not mv and same(mwas, mv):
                    v[mk] = mwas
        elif same(was, v):
            new[k] = was


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class Event:
    """One write in the watch history. `obj` is the object as stored by it; `prev` the object as
    stored before it (None for ADDED), which a list at an older resourceVersion serves instead
    (kube-apiserver's watch cache keeps the previous object in each event too)."""

    rv: int
    type: str
    group: str
    plural: str
    namespace: str
    obj: dict[str, Any]
    prev: dict[str, Any] | None = None


@dataclass(slots=True)
class Then:
    """One resource at an older resourceVersion, as its difference from the objects now: (namespace,
    name) -> the object as it was at `rv`, or None where there was none; every other key was then
    as it is now. Built from the window's events newer than `rv` (the first event of a key after
    `rv` holds, as `prev`, what the key was at `rv`), and extended by the events after `upto` when
    it is read again, so the chunks of one list read each event once."""

    rv: int
    upto: int  # the newest resourceVersion whose event is in `was`
    was: dict[tuple[str, str], dict[str, Any] | None]
    present: list[tuple[str, str]] | None = None  # the keys of `was` that existed at `rv`, sorted (None: to sort)
    existing: list[tuple[str, str]] | None = None  # the keys of `was` that exist now, sorted (None: to sort)

    def present_keys(self) -> list[tuple[str, str]]:
        """The keys that existed at `rv` and were written since, in etcd's order."""
        if self.present is None:
            self.present = sorted((k for k, obj in self.was.items() if obj is not None), key=etcd_key)
        return self.present

    def existing_keys(self, exists: Callable[[tuple[str, str]], bool]) -> list[tuple[str, str]]:
        """The keys written since `rv` that exist now, in etcd's order."""
        if self.existing is None:
            self.existing = sorted((k for k in self.was if exists(k)), key=etcd_key)
        return self.existing
