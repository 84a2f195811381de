"""Objects, resource versions and the watch log, with the API server's write semantics:
preconditions (409), generation bumps on spec changes only, the status subresource kept apart,
finalizers, merge/JSON/apply patches, and server-side apply with managedFields and conflicts.
"""

from __future__ import annotations

import bisect
import builtins  # for annotations in Store, where its method `list` hides the type
import copy
import heapq
import re
import sys
import uuid
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import jsonpatch
import orjson

from gwpolicy.engine.merge.values import set_in
from gwpolicy.sandbox import builtin, gotypes
from gwpolicy.sandbox.persist import Persistence
from gwpolicy.sandbox.resources import Registry, Resource
from gwpolicy.sandbox.schema import CelError, FieldError, crd_schemas
from gwpolicy.sandbox.strategic import PatchError, strategic_merge

Key = tuple[str, str, str, str]  # group, plural, namespace ("" when cluster-scoped), name


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


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON, types included: Python's == has True == 1 == 1.0, which are three values here."""
    if a != b:
        return False
    try:
        return orjson.dumps(a, option=orjson.OPT_NON_STR_KEYS) == orjson.dumps(b, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return False


def _same_leaf(a: Any, b: Any) -> bool:
    """`_same` for a leaf value (a scalar, or an empty list or map)."""
    return type(a) is type(b) and a == b


def _share_unchanged(new: dict[str, Any], old: dict[str, Any]) -> None:
    """Before `new` replaces `old` in the store: each part of `new` equal to the same part of `old`
    becomes that part of `old` (spec, status, labels, each managedFields entry...). The watch window
    holds both versions, and a status write then costs the window only what it changed. Safe because
    stored objects are never changed in place; `new`'s own dicts (itself, its metadata) stay its own,
    as `_bump` writes the resourceVersion into them next."""
    for k, v in new.items():
        was = old.get(k, _MISSING)
        if was is _MISSING or was is v:
            continue
        if k == "metadata" and isinstance(v, dict) and isinstance(was, dict):
            for mk, mv in v.items():
                mwas = was.get(mk, _MISSING)
                if mk == "managedFields" and isinstance(mv, list) and isinstance(mwas, list):
                    mv[:] = [next((e for e in mwas if _same(e, entry)), entry) for entry in mv]
                elif mwas is not _MISSING and mwas is not mv and _same(mwas, mv):
                    v[mk] = mwas
        elif _same(was, v):
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
class _Then:
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


# ---------- selectors ----------

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


# ---------- patches and server-side apply ----------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return clone(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


FieldPath = tuple[str, ...]
_IGNORED = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"),
            ("metadata", "resourceVersion"), ("metadata", "uid"), ("metadata", "creationTimestamp"),
            ("metadata", "generation"), ("metadata", "managedFields")}


def leaf_paths(obj: Any, prefix: FieldPath = ()) -> dict[FieldPath, Any]:
    """Fields a manager owns: every leaf; lists are atomic (one field)."""
    out: dict[FieldPath, Any] = {}
    if isinstance(obj, dict) and (obj or not prefix):
        for k, v in obj.items():
            p = prefix + (k,)
            if p in _IGNORED or p[:2] == ("metadata", "managedFields"):
                continue
            out.update(leaf_paths(v, p))
    else:
        out[prefix] = obj
    return out


def fields_v1(paths: set[FieldPath]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for p in sorted(paths):
        node = root
        for seg in p:
            node = node.setdefault(f"f:{seg}", {})
    return root


def paths_from_fields_v1(fv1: dict[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    out: set[FieldPath] = set()
    for k, v in (fv1 or {}).items():
        if not k.startswith("f:"):
            continue
        p = prefix + (k[2:],)
        if isinstance(v, dict) and v:
            out |= paths_from_fields_v1(v, p)
        else:
            out.add(p)
    return out


def _get(obj: Any, path: FieldPath) -> Any:
    for seg in path:
        if not isinstance(obj, dict) or seg not in obj:
            return _MISSING
        obj = obj[seg]
    return obj


def _delete(obj: dict[str, Any], path: FieldPath) -> None:
    parents = []
    node: Any = obj
    for seg in path[:-1]:
        if not isinstance(node, dict) or seg not in node:
            return
        parents.append((node, seg))
        node = node[seg]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, seg in reversed(parents):  # drop maps the removal emptied
        if parent[seg] == {}:
            del parent[seg]
        else:
            break


_MISSING = object()


def _with_defaults(r: Resource, applied: dict[str, Any], live: dict[str, Any]) -> dict[str, Any] | None:
    """An applied configuration of a built-in kind with the defaults the server gives it (None for a
    custom resource, or where they cannot be applied to it)."""
    if not is_builtin(r):
        return None
    out = clone(applied)
    try:
        builtin.convert(r.group, r.kind, out, live)
    except Exception:  # noqa: BLE001 - a malformed configuration is refused later, in its own words
        return None
    return out


def _overlap(a: FieldPath, b: FieldPath) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


# ---------- the store ----------

@dataclass
class FaultRule:
    """Fail the `nth` matching request from now (or every one, `times` times; -1: for good) with `code`.
    A rule may be for one client only: by User-Agent (a substring) or by fieldManager (exact)."""

    code: int
    nth: int = 1
    times: int = 1
    verb: str | None = None  # "write" (create/update/patch/delete), "list", "get", "watch"; None: writes
    resource: str | None = None  # plural, e.g. "httproutes"
    user_agent: str | None = None
    field_manager: str | None = None
    seen: int = 0

    def matches(self, verb: str, resource: str, client: tuple[str, str]) -> bool:
        return ((self.verb or "write") == verb and (self.resource is None or self.resource == resource)
                and (self.user_agent is None or self.user_agent in client[0])
                and (self.field_manager is None or self.field_manager == client[1]))


@dataclass
class Faults:
    """Fault injection for tests (POST /sandbox/faults; docs/controller.md)."""

    rules: list[FaultRule] = field(default_factory=list)
    latency: float = 0.0
    client: tuple[str, str] = ("", "")  # the request in hand: (User-Agent, fieldManager)

    def check(self, verb: str, resource: str) -> None:
        due = None
        for rule in self.rules:  # every rule counts the request, so `nth` is from when it was set
            if rule.matches(verb, resource, self.client):
                rule.seen += 1
                if due is None and rule.seen >= rule.nth:
                    due = rule
        if due is not None:
            rule = due
            if rule.times > 0:
                rule.times -= 1
                if rule.times == 0:
                    self.rules.remove(rule)
            if rule.code == 409:
                raise ApiFailure(409, "Conflict", "Operation cannot be fulfilled: the object has been modified; "
                                 "please apply your changes to the latest version and try again (injected)")
            raise ApiFailure(rule.code, "InternalError", f"Internal error occurred: injected failure ({rule.code})")

MAX_OBJECT_BYTES = 1536 * 1024  # etcd's default --max-request-bytes (1.5 MiB)
MAX_DEPTH = 200  # nesting this sandbox serves; kube-apiserver's JSON decoder allows 10,000 (docs/controller.md)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > deepest:
            deepest = d
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return deepest


def _storable(obj: dict[str, Any]) -> None:
    """Refuse, before anything is stored, what would not fit in etcd or could not be served back."""
    if _depth(obj) > MAX_DEPTH:
        raise ApiFailure(422, "Invalid", f"the object nests deeper than {MAX_DEPTH} levels; this sandbox refuses it "
                         "before storing it", {"causes": [{"reason": "FieldValueInvalid", "field": "",
                                                           "message": f"nested deeper than {MAX_DEPTH} levels"}]})
    if len(orjson.dumps(obj)) > MAX_OBJECT_BYTES:
        raise ApiFailure(413, "RequestEntityTooLarge", "etcdserver: request is too large")


#: kube-apiserver's words (storage/etcd3) for a list at a resourceVersion compacted away: 410 Expired
LIST_EXPIRED = "The resourceVersion for the provided list is too old."

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")  # what a new cluster has


class Store:
    def __init__(self, keep_creation_timestamp: bool = False, window: int = 100_000,
                 data_dir: str | None = None, loopback_endpoints: bool = False) -> None:
        self.registry = Registry()
        #: take loopback addresses in EndpointSlices (kube-apiserver refuses them): backends on this
        #: machine's loopback, for a demo or a test (`gwpolicy sandbox --allow-loopback-endpoints`)
        self.loopback_endpoints = loopback_endpoints
        self.objects = Objects()
        self.rv = 0
        self.events: deque[Event] = deque()  # the watch history: the last `window` events
        self.window = window
        self.compacted = 0  # watches from a resourceVersion below this get 410 Gone
        self.watch_floor = 0  # and so do those from below this: where a restarted server's watch cache began
        #: resources at older versions, for the chunks of a list and `resourceVersionMatch=Exact`
        #: (see `_then`), the last few read; rebuilt from the window when one is needed again
        self._then_cache: OrderedDict[tuple[str, str, int], _Then] = OrderedDict()
        self.keep_creation_timestamp = keep_creation_timestamp
        self.faults = Faults()
        self.listeners: list[Callable[[Event], None]] = []
        self.writes = 0
        self.writes_by: dict[str, int] = {}
        #: owner uid -> the keys of objects that named it in their ownerReferences (garbage collection;
        #: an entry whose object no longer names that owner is passed over and dropped when it is read)
        self.owned_by: dict[str, set[tuple[str, str, str, str]]] = {}
        self._dry = False
        self.field_validation = "Warn"  # of the request in hand: Strict, Warn or Ignore (?fieldValidation=)
        self.warnings: list[str] = []  # for the request in hand's Warning headers
        self._applied: tuple[str, str, dict[str, Any]] | None = None  # (ns, name, body) of the apply in hand
        self.persist: Persistence | None = None
        self.restored = False  # came back from a data directory with objects in it
        if data_dir is not None:
            self.persist = Persistence(data_dir)
            self._restore()
        if not self.objects:
            ns = self.registry.by_plural[("", "namespaces")]
            for name in SYSTEM_NAMESPACES:
                self.create(ns, "", {"metadata": {"name": name}})
            self.writes, self.writes_by = 0, {}  # not the clients' writes

    def _restore(self) -> None:
        """Objects and the resourceVersion counter as the data directory has them. The watch history
        starts now, as a restarted API server's watch cache does: a watch from the current version
        resumes, one from an older version gets 410 Gone."""
        assert self.persist is not None
        rv, rows = self.persist.load()
        for key, obj in rows:
            self.objects[key] = obj
        self.restored = bool(self.objects)
        for key, obj in self.objects.items():
            self._index_owners(key, obj)
            if key[:2] == ("apiextensions.k8s.io", "customresourcedefinitions"):
                try:
                    self.registry.apply_crd(obj)
                except CelError:
                    pass  # was accepted by an older sandbox: serve the rest
        self.rv = max([rv] + [int(o["metadata"].get("resourceVersion") or 0) for o in self.objects.values()])
        self.compacted = self.rv + 1

    @contextmanager
    def dry_run(self) -> Iterator[None]:
        """`dryRun=All`: the request runs in full (preconditions, conflicts, apply merging, the answer)
        and leaves nothing behind: no object, no resourceVersion, no event, no registered CRD.
        Stored objects are never changed in place, so a shallow copy of the index restores them."""
        saved = self.objects.copy(), self.rv
        self._dry = True
        try:
            yield
        finally:
            self.objects, self.rv = saved
            self._dry = False

    # -- helpers
    def resource(self, group: str, plural: str) -> Resource:
        r = self.registry.by_plural.get((group, plural))
        if r is None:
            raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({plural}.{group})")
        return r

    def _emit(self, etype: str, r: Resource, ns: str, obj: dict[str, Any], prev: dict[str, Any] | None = None) -> None:
        """Record a write in the watch history. The event holds the object as stored, not a copy:
        stored objects (and every dict and list inside them) are never changed in place, so the
        event keeps the version it was made of, and the window costs no second copy of the store.
        `prev`, the version it replaced, is held the same way (no copy either)."""
        if self._dry:
            return
        ev = Event(self.rv, etype, r.group, r.plural, ns, obj, prev)
        if self.persist is not None:
            self.persist.write(self.rv, (r.group, r.plural, ns, obj["metadata"]["name"]),
                               None if etype == "DELETED" else ev.obj)
        self.events.append(ev)
        if len(self.events) > self.window:
            while len(self.events) > self.window:  # one out at the front (a list's del [:1] moved the whole window)
                self.compacted = self.events.popleft().rv + 1
            self._forget_expired()
        for listener in list(self.listeners):
            listener(ev)

    def compact(self) -> None:
        """Forget the watch history: every watch from an older resourceVersion gets 410 Gone."""
        self.compacted = self.rv + 1
        self.events.clear()
        self._forget_expired()

    def reaches(self, rv: int) -> bool:
        """Whether the watch history holds every event after `rv`: a watch, the next chunk of a list
        or an exact list at `rv` can be served (below it: 410)."""
        return rv >= self.compacted - 1

    def _forget_expired(self) -> None:
        for key in [k for k, then in self._then_cache.items() if not self.reaches(then.rv)]:
            del self._then_cache[key]

    THEN_KEPT = 16  # resources at an older version kept between two reads (each holds only what changed since)

    def _then(self, group: str, plural: str, rv: int) -> _Then:
        """One resource as it was at `rv` (which the window reaches): the objects since changed,
        created or deleted, as they were then. Kept for the next chunk of the same list, which then
        reads only the events written since this one."""
        key = (group, plural, rv)
        then = self._then_cache.get(key)
        if then is None:
            then = self._then_cache[key] = _Then(rv, rv, {})
            while len(self._then_cache) > self.THEN_KEPT:
                self._then_cache.popitem(last=False)
        else:
            self._then_cache.move_to_end(key)
        if then.upto < self.rv:
            newer: dict[tuple[str, str], dict[str, Any] | None] = {}
            for ev in reversed(self.events):  # newest first: a key's earliest event after `upto` is written last
                if ev.rv <= then.upto:
                    break
                if ev.plural == plural and ev.group == group:
                    newer[(ev.namespace, ev.obj["metadata"]["name"])] = ev.prev
            was = then.was
            for k, obj in newer.items():
                if k not in was:  # an event before `upto` already said what the key was at `rv`
                    was[k] = obj
                    then.present = None
            if newer:
                then.existing = None  # a key written since may have come or gone
            then.upto = self.rv
        return then

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _write_check(self, r: Resource) -> None:
        if self._dry:
            return
        self.writes += 1
        self.writes_by[r.plural] = self.writes_by.get(r.plural, 0) + 1
        self.faults.check("write", r.plural)

    def _unknown_fields(self, r: Resource, version: str | None, unknown: list[str]) -> None:
        """Fields no type declares: 400 under `fieldValidation=Strict`, a warning under Warn, nothing
        under Ignore (they are dropped in every case)."""
        if not unknown:
            return
        if self._applied is not None:
            raise self._undeclared(r, version, unknown)
        if self.field_validation == "Strict":
            fields = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise ApiFailure(400, "BadRequest", f'{r.kind} in version "{version or r.versions[0]}" cannot be '
                             f"handled as a {r.kind}: strict decoding error: {fields}")
        if self.field_validation != "Ignore":
            self.warnings.extend(f'unknown field "{u}"' for u in unknown)

    def _undeclared(self, r: Resource, version: str | None, unknown: list[str]) -> ApiFailure:
        """Server-side apply of a field the type does not declare: kube-apiserver cannot build the typed
        patch (structured-merge-diff) and answers 500 whatever `fieldValidation` says, naming each field
        as that library does (`.spec.listeners[name="http"].x`: an item of a list of named objects by its
        name, others by index)."""
        assert self._applied is not None
        ns, name, body = self._applied
        paths = sorted(_smd_path(body, u) for u in unknown)
        where = f"{ns}/{name}" if ns else name
        gv = f"{r.group}/{version or r.versions[0]}"
        head = f"failed to create typed patch object ({where}; {gv}, Kind={r.kind}): "
        text = (f"{paths[0]}: field not declared in schema" if len(paths) == 1 else
                "errors:\n" + "\n".join(f"  {p}: field not declared in schema" for p in paths))
        return ApiFailure(500, "", head + text)

    def _decode(self, r: Resource, obj: dict[str, Any], version: str | None) -> dict[str, Any]:
        """A built-in object read into its Go type, as kube-apiserver's decoder does before anything
        else: a wrong type is 400 BadRequest in encoding/json's words; unknown fields per fieldValidation."""
        if not is_builtin(r):
            return obj
        got = gotypes.decode(r.kind, obj)
        if got.error is not None:
            raise ApiFailure(400, "BadRequest", f'{r.kind} in version "{version or r.versions[0]}" cannot be handled '
                             f"as a {r.kind}: {got.error}")
        self._unknown_fields(r, version, got.unknown)
        return got.obj

    def _admit(self, r: Resource, obj: dict[str, Any], old: dict[str, Any] | None, version: str | None) -> dict[str, Any]:
        """What the API server does between decoding and storage. A built-in kind: its defaults, then
        its validation (builtin.py; 422 naming every field). A custom resource: pruned, defaulted,
        validated against the CRD's schema and CEL rules. A CRD's own rules must compile."""
        if is_builtin(r):
            builtin.convert(r.group, r.kind, obj, old)
            errors = builtin.KINDS[(r.group, r.kind)].validate(obj, old)
            if self.loopback_endpoints and r.kind == "EndpointSlice":
                errors = [e for e in errors if not e.body.endswith(builtin.LOOPBACK_ENDPOINT)]
            if errors:
                raise invalid_fields(r, obj["metadata"].get("name"), errors)
        if r.group == "apiextensions.k8s.io" and r.kind == "CustomResourceDefinition":
            try:
                crd_schemas(obj)
            except CelError as exc:
                raise invalid_fields(r, obj["metadata"].get("name"), [FieldError("", "FieldValueInvalid", str(exc))]) from exc
            return obj
        by_version = self.registry.validators.get((r.group, r.plural))
        if not by_version:
            return obj
        schema = by_version.get(version or r.versions[0]) or by_version.get(r.versions[0])
        if schema is None:
            return obj
        outcome = schema.admit(obj, old)
        self._unknown_fields(r, version, outcome.unknown)
        if outcome.errors:
            raise invalid_fields(r, obj["metadata"].get("name"), outcome.errors)
        return outcome.obj

    def _ns_check(self, r: Resource, ns: str) -> None:
        if r.namespaced and ("", "namespaces", "", ns) not in self.objects:
            raise ApiFailure(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})

    # -- reads
    def get(self, r: Resource, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((r.group, r.plural, ns if r.namespaced else "", name))
        if obj is None:
            raise not_found(r, name)
        return clone(obj)

    def list(self, r: Resource, ns: str | None, labels: str | None = None, fields: str | None = None,
             at: int | None = None) -> list[dict[str, Any]]:
        """Every matching object, in etcd's key order (`etcd_key`): `page` without a limit."""
        return self.page(r, ns, labels, fields, sys.maxsize, None, at)[0]

    def _keys_at(self, r: Resource, ns: str | None, after: tuple[str, str] | None,
                 at: int | None) -> tuple[Iterator[tuple[str, str]], dict[tuple[str, str], dict[str, Any] | None]]:
        """The (namespace, name) of a list's objects after `after`, in etcd's key order, as they are
        now or, with `at`, as they were at that resourceVersion; and the objects changed since `at`
        as they were then (the others are read from the store)."""
        if at is not None and at > self.rv:
            raise ValueError(f"resourceVersion {at} is in the future (now {self.rv})")
        if at is not None and not self.reaches(at):
            raise ApiFailure(410, "Expired", LIST_EXPIRED)
        g, p = r.group, r.plural
        order = self.objects.in_order(g, p)
        lo, hi = self._span(order, ns if r.namespaced else None, after)
        keys: Iterator[tuple[str, str]] = (order[i] for i in range(lo, hi))
        was: dict[tuple[str, str], dict[str, Any] | None] = {}
        if at is not None and at < self.rv:
            then = self._then(g, p, at)
            was = then.was
            if was:
                present = then.present_keys()
                plo, phi = self._span(present, ns if r.namespaced else None, after)
                keys = heapq.merge((k for k in keys if k not in was), (present[i] for i in range(plo, phi)),
                                   key=etcd_key)
        return keys, was

    @staticmethod
    def _span(order: builtins.list[tuple[str, str]], ns: str | None, after: tuple[str, str] | None) -> tuple[int, int]:
        """Where in `order` (sorted by `etcd_key`) a list's keys are: after `after`, within namespace
        `ns` (None: all); a namespace's keys are one run, `<ns>/` being a prefix of each."""
        lo = bisect.bisect_right(order, etcd_key(after), key=etcd_key) if after is not None else 0
        hi = len(order)
        if ns is not None:
            lo = max(lo, bisect.bisect_left(order, ns + "/", key=etcd_key))
            hi = bisect.bisect_left(order, ns + "0", key=etcd_key)  # "0" follows "/": past the run
        return lo, max(lo, hi)

    def page(self, r: Resource, ns: str | None, labels: str | None, fields: str | None, limit: int,
             after: tuple[str, str] | None, at: int | None = None) -> tuple[builtins.list[dict[str, Any]], bool]:
        """One chunk of a list (`?limit=` and `?continue=`): the first `limit` matching objects in
        etcd's key order after `after`, and whether more match, as they are now or, with `at`, as
        they were at that resourceVersion (every chunk of one list is read at the first chunk's
        version, as kube-apiserver reads them from one snapshot). Only the chunk is copied."""
        keys, was = self._keys_at(r, ns, after, at)
        lm, fm = label_matcher(labels), field_matcher(fields)
        objects, g, p = self.objects, r.group, r.plural
        out: list[dict[str, Any]] = []
        for k in keys:
            obj = was.get(k) if was and k in was else objects[(g, p, k[0], k[1])]
            assert obj is not None
            if lm(obj["metadata"].get("labels") or {}) and fm(obj):
                if len(out) == limit:
                    return out, True
                out.append(clone(obj))
        return out, False

    def remaining(self, r: Resource, ns: str | None, after: tuple[str, str], at: int | None = None) -> int:
        """How many objects a list holds after `after` (at `at`): a chunk's `remainingItemCount`, which
        kube-apiserver sends on a chunk of a list without selectors (etcd's count of the keys left).
        Counted by bisection: the keys now, less those written since `at` that exist now, plus those
        that existed at `at`."""
        scope = ns if r.namespaced else None
        lo, hi = self._span(self.objects.in_order(r.group, r.plural), scope, after)
        if at is None or at >= self.rv:
            return hi - lo
        if not self.reaches(at):
            raise ApiFailure(410, "Expired", LIST_EXPIRED)
        then = self._then(r.group, r.plural, at)
        if not then.was:
            return hi - lo
        existing = then.existing_keys(lambda k: (r.group, r.plural, k[0], k[1]) in self.objects)
        now_lo, now_hi = self._span(existing, scope, after)
        then_lo, then_hi = self._span(then.present_keys(), scope, after)
        return hi - lo - (now_hi - now_lo) + (then_hi - then_lo)

    # -- writes
    def create(self, r: Resource, ns: str, obj: dict[str, Any], manager: str | None = None,
               version: str | None = None) -> dict[str, Any]:
        self._write_check(r)
        if not isinstance(obj, dict):
            raise ApiFailure(400, "BadRequest", f"the body of a {r.kind} must be a JSON or YAML object")
        if not isinstance(obj.setdefault("metadata", {}), dict) and not is_builtin(r):
            raise invalid(r, None, "metadata", obj["metadata"], "must be an object")
        obj = self._decode(r, obj, version)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + uuid.uuid4().hex[:5]
            meta["name"] = name
        if not name:
            raise invalid_fields(r, "", [FieldError("metadata.name", "FieldValueRequired",
                                                    "Required value: name or generateName is required")])
        if r.namespaced:
            self._ns_check(r, ns)
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        validate_metadata(r, obj)
        if r.status_subresource and r.group != "apiextensions.k8s.io":
            obj.pop("status", None)  # status is written through the status subresource only (then defaulted)
        obj = self._admit(r, obj, None, version)
        key = (r.group, r.plural, ns if r.namespaced else "", name)
        if key in self.objects:
            plural = f"{r.plural}.{r.group}" if r.group else r.plural
            raise ApiFailure(409, "AlreadyExists", f'{plural} "{name}" already exists',
                             {"name": name, "group": r.group, "kind": r.plural})
        obj["apiVersion"] = r.api_version(version)
        obj["kind"] = r.kind
        meta["uid"] = str(uuid.uuid4())
        if not (self.keep_creation_timestamp and meta.get("creationTimestamp")):
            meta["creationTimestamp"] = now()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        if r.kind == "Namespace" and r.group == "":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        if r.kind == "Namespace" and r.group == "":
            obj["status"] = {"phase": "Active"}  # as the namespace controller would have it
        if manager:
            self._own(obj, manager, "Update", set(leaf_paths(obj)), None, r)
        _storable(obj)
        self._bump(obj)
        self.objects[key] = obj
        self._after_write(r, obj)
        self._emit("ADDED", r, ns if r.namespaced else "", obj)
        return clone(obj)

    def _after_write(self, r: Resource, obj: dict[str, Any], deleted: bool = False) -> None:
        if self._dry:
            return
        if not deleted and obj["metadata"].get("ownerReferences"):
            meta = obj["metadata"]
            self._index_owners((r.group, r.plural, (meta.get("namespace") or "") if r.namespaced else "", meta["name"]), obj)
        if r.group == "apiextensions.k8s.io" and r.kind == "CustomResourceDefinition":
            self.registry.apply_crd(obj, deleted)
            if not deleted and not (obj.get("status") or {}).get("conditions"):
                names = (obj.get("spec") or {}).get("names") or {}
                obj["status"] = {"conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found",
                     "lastTransitionTime": now()},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                     "message": "the initial names have been accepted", "lastTransitionTime": now()}],
                    "acceptedNames": names, "storedVersions": [v["name"] for v in (obj.get("spec") or {}).get("versions") or []
                                                               if v.get("storage")]}

    def update(self, r: Resource, ns: str, name: str, new: dict[str, Any], *, subresource: str | None = None,
               manager: str | None = None, version: str | None = None, check_rv: bool = True,
               operation: str = "Update", owned: set[FieldPath] | None = None) -> dict[str, Any]:
        """PUT semantics: replace the object (or only its status), with a resourceVersion precondition."""
        self._write_check(r)
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise ApiFailure(400, "BadRequest", f"the body of a {r.kind} must be an object, with an object as metadata")
        key = (r.group, r.plural, ns if r.namespaced else "", name)
        live = self.objects.get(key)
        if live is None:
            raise not_found(r, name)
        want_rv = (new.get("metadata") or {}).get("resourceVersion")
        if check_rv and want_rv and want_rv != live["metadata"]["resourceVersion"]:
            plural = f"{r.plural}.{r.group}" if r.group else r.plural
            raise ApiFailure(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                             "modified; please apply your changes to the latest version and try again",
                             {"name": name, "group": r.group, "kind": r.plural})
        result = clone(live)
        if subresource == "status":
            if "status" in new:
                result["status"] = clone(new["status"])
            else:
                result.pop("status", None)
        else:
            keep_status = live.get("status") if r.status_subresource else None
            result = clone(new)
            rm = result.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "generation", "namespace", "name", "deletionTimestamp"):
                if k in live["metadata"]:
                    rm[k] = live["metadata"][k]
                else:
                    rm.pop(k, None)
            if live["metadata"].get("managedFields"):
                rm["managedFields"] = clone(live["metadata"]["managedFields"])  # _own edits its entries
            else:  # none is stored as none (an empty list would make a no-op update a change)
                rm.pop("managedFields", None)
            if r.status_subresource:
                if keep_status is None:
                    result.pop("status", None)
                else:
                    result["status"] = clone(keep_status)
            if r.kind == "Namespace" and r.group == "" and isinstance(rm.setdefault("labels", {}), dict):
                rm["labels"]["kubernetes.io/metadata.name"] = name  # (labels of another shape: 422 below)
        result["apiVersion"] = r.api_version(version)
        result["kind"] = r.kind
        result = self._decode(r, result, version)
        validate_metadata(r, result)
        result = self._admit(r, result, live, version)
        if self._spec_of(result, r) != self._spec_of(live, r):
            result["metadata"]["generation"] = live["metadata"].get("generation", 1) + 1
        if manager:
            changed = owned if owned is not None else {p for p, v in leaf_paths(result).items()
                                                       if _get(live, p) is _MISSING or not _same_leaf(_get(live, p), v)}
            if subresource == "status":
                changed = {p for p in changed if p[:1] == ("status",)}
            self._own(result, manager, operation, changed, subresource, r, replace=owned is not None)
        if _same(result, live):
            return clone(live)  # no change: no new resourceVersion, no event
        return self._store_update(r, key, live, result)

    def _store_update(self, r: Resource, key: Key, live: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
        if result["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers") \
                and r.kind == "CustomResourceDefinition" and r.group == "apiextensions.k8s.io":
            self._drop_custom_resources(live)
        _storable(result)
        _share_unchanged(result, live)
        self._bump(result)
        if result["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers"):
            del self.objects[key]
            self._after_write(r, result, deleted=True)
            self._emit("DELETED", r, key[2], result, live)
            return clone(result)
        self.objects[key] = result
        self._after_write(r, result)
        self._emit("MODIFIED", r, key[2], result, live)
        return clone(result)

    @staticmethod
    def _spec_of(obj: dict[str, Any], r: Resource) -> dict[str, Any]:
        """What bumps metadata.generation: everything but metadata (and status, when it is a subresource)."""
        return {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")
                and not (k == "status" and r.status_subresource)}

    def _own(self, obj: dict[str, Any], manager: str, operation: str, paths: set[FieldPath],
             subresource: str | None, r: Resource, replace: bool = False) -> None:
        """Record `paths` as owned by `manager` and take them away from every other manager."""
        entries = obj["metadata"].setdefault("managedFields", [])
        mine = None
        for e in entries:
            sets = paths_from_fields_v1(e.get("fieldsV1") or {})
            if e.get("manager") == manager and e.get("operation") == operation and e.get("subresource") == subresource:
                mine = e
                continue
            kept = {p for p in sets if not any(_overlap(p, q) for q in paths)}
            if kept != sets:
                e["fieldsV1"] = fields_v1(kept)
        obj["metadata"]["managedFields"] = [e for e in entries if e is mine or paths_from_fields_v1(e.get("fieldsV1") or {})]
        if mine is None:
            mine = {"manager": manager, "operation": operation, "apiVersion": obj.get("apiVersion"), "time": now(),
                    "fieldsType": "FieldsV1", "fieldsV1": {}}
            if subresource:
                mine["subresource"] = subresource
            obj["metadata"]["managedFields"].append(mine)
        current = set() if replace else paths_from_fields_v1(mine.get("fieldsV1") or {})
        owned = fields_v1(current | paths)
        if owned != mine.get("fieldsV1") or not mine.get("time"):
            mine["fieldsV1"] = owned
            mine["time"] = now()  # only when the set changes: a no-op apply must leave the object as it was
        if not paths and replace:
            obj["metadata"]["managedFields"].remove(mine)

    def patch(self, r: Resource, ns: str, name: str, content_type: str, body: Any, *, subresource: str | None = None,
              manager: str | None = None, force: bool = False, version: str | None = None) -> dict[str, Any]:
        ct = content_type.split(";")[0].strip()
        key = (r.group, r.plural, ns if r.namespaced else "", name)
        if ct == "application/apply-patch+yaml":
            return self.apply(r, ns, name, body, subresource=subresource, manager=manager, force=force, version=version)
        live = self.objects.get(key)
        if live is None:
            raise not_found(r, name)
        if ct == "application/json-patch+json":
            try:
                new = jsonpatch.apply_patch(live, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiFailure(422, "Invalid", f"the JSON patch could not be applied: {exc}") from exc
        elif ct == "application/strategic-merge-patch+json":
            if (r.group, r.plural) in self.registry.from_crd.values():
                raise ApiFailure(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                 "accepted media types include: application/json-patch+json, "
                                 "application/merge-patch+json, application/apply-patch+yaml")
            try:
                new = strategic_merge(r.kind, live, body)
            except PatchError as exc:
                raise ApiFailure(400, "BadRequest", str(exc)) from exc
        elif ct == "application/merge-patch+json":
            if not isinstance(body, dict):
                raise ApiFailure(400, "BadRequest", "a merge patch must be a JSON object")
            new = merge_patch(live, body)
        else:
            raise ApiFailure(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ct}")
        return self.update(r, ns, name, new, subresource=subresource, manager=manager or "unknown",
                           version=version, check_rv=bool(isinstance(body, dict) and (body.get("metadata") or {}).get("resourceVersion")))

    def apply(self, r: Resource, ns: str, name: str, applied: Any, *, subresource: str | None, manager: str | None,
              force: bool, version: str | None = None) -> dict[str, Any]:
        """Server-side apply: merge the applied configuration, own its fields, drop fields no longer applied."""
        if not manager:
            raise ApiFailure(422, "Invalid", "PATCH is invalid: fieldManager: Required value: is required for apply patch")
        if not isinstance(applied, dict) or not isinstance(applied.get("metadata") or {}, dict):
            raise ApiFailure(400, "BadRequest", "an apply patch must be an object, with an object as metadata")
        meta = applied.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise ApiFailure(400, "BadRequest", "the name of the object does not match the name on the URL")
        self._applied = (ns if r.namespaced else "", name, applied)
        try:
            return self._apply(r, ns, name, applied, subresource=subresource, manager=manager, force=force,
                               version=version)
        finally:
            self._applied = None

    def _apply(self, r: Resource, ns: str, name: str, applied: dict[str, Any], *, subresource: str | None,
               manager: str, force: bool, version: str | None) -> dict[str, Any]:
        meta = applied.get("metadata") or {}
        key = (r.group, r.plural, ns if r.namespaced else "", name)
        live = self.objects.get(key)
        applied_paths = leaf_paths(applied)
        if subresource == "status":
            applied_paths = {p: v for p, v in applied_paths.items() if p[:1] == ("status",)}
        elif r.status_subresource:
            applied_paths = {p: v for p, v in applied_paths.items() if p[:1] != ("status",)}
        if live is None:
            if subresource == "status":
                raise not_found(r, name)
            obj: dict[str, Any] = {"apiVersion": r.api_version(version), "kind": r.kind, "metadata": {"name": name}}
            if meta.get("creationTimestamp"):  # kept only with the test switch (see create)
                obj["metadata"]["creationTimestamp"] = meta["creationTimestamp"]
            for p, v in applied_paths.items():
                _set(obj, p, v)
            self._own(obj, manager, "Apply", set(applied_paths), None, r, replace=True)
            return self.create(r, ns, obj, None, version)
        if meta.get("resourceVersion") and meta["resourceVersion"] != live["metadata"]["resourceVersion"]:
            plural = f"{r.plural}.{r.group}" if r.group else r.plural
            raise ApiFailure(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                             "modified; please apply your changes to the latest version and try again",
                             {"name": name, "group": r.group, "kind": r.plural})
        conflicts = []
        defaulted = _with_defaults(r, applied, live)
        for e in live["metadata"].get("managedFields") or []:
            if e.get("manager") == manager:
                continue
            for q in paths_from_fields_v1(e.get("fieldsV1") or {}):
                for p, v in applied_paths.items():
                    if _overlap(p, q):
                        cur = _get(live, p)
                        # a list is one field here (kube-apiserver owns a map list's items and their
                        # fields apart): a list applied without the defaults the live one has is the same
                        if cur is _MISSING or (cur != v and (defaulted is None or _get(defaulted, p) != cur)):
                            conflicts.append((e["manager"], p))
        if conflicts and not force:
            causes = [{"type": "FieldManagerConflict", "message": f'conflict with "{m}"', "field": "." + ".".join(p)}
                      for m, p in sorted(set(conflicts))]
            text = "; ".join(f'conflict with "{m}": .{".".join(p)}' for m, p in sorted(set(conflicts)))
            raise ApiFailure(409, "Conflict", f"Apply failed with {len(causes)} conflict{'s' if len(causes) > 1 else ''}: {text}",
                             {"name": name, "group": r.group, "kind": r.plural, "causes": causes})
        result = clone(live)
        previous: set[FieldPath] = set()
        for e in live["metadata"].get("managedFields") or []:
            if e.get("manager") == manager and e.get("operation") == "Apply" and e.get("subresource") == subresource:
                previous = paths_from_fields_v1(e.get("fieldsV1") or {})
        others: set[FieldPath] = set()
        for e in live["metadata"].get("managedFields") or []:
            if not (e.get("manager") == manager and e.get("operation") == "Apply"):
                others |= paths_from_fields_v1(e.get("fieldsV1") or {})
        for p in previous - set(applied_paths):
            if not any(_overlap(p, q) for q in others) and not any(_overlap(p, q) for q in applied_paths):
                _delete(result, p)
        for p, v in applied_paths.items():
            _set(result, p, v)
        return self.update(r, ns, name, result, subresource=subresource, manager=manager, version=version,
                           check_rv=False, operation="Apply", owned=set(applied_paths))

    def delete(self, r: Resource, ns: str, name: str) -> dict[str, Any]:
        self._write_check(r)
        key = (r.group, r.plural, ns if r.namespaced else "", name)
        live = self.objects.get(key)
        if live is None:
            raise not_found(r, name)
        if live["metadata"].get("finalizers"):
            if not live["metadata"].get("deletionTimestamp"):
                result = clone(live)
                result["metadata"]["deletionTimestamp"] = now()
                result["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._store_update(r, key, live, result)
            return clone(live)
        if r.kind == "CustomResourceDefinition" and r.group == "apiextensions.k8s.io":
            self._drop_custom_resources(live)
        if r.kind == "Namespace" and r.group == "":
            for k in [k for k in self.objects if k[2] == name and self.registry.by_plural.get(k[:2], r).namespaced]:
                kr = self.registry.by_plural.get(k[:2])
                if kr is not None:
                    self.delete(kr, k[2], k[3])
        del self.objects[key]
        result = _deleted_version(live)
        self._bump(result)
        self._after_write(r, result, deleted=True)
        self._emit("DELETED", r, key[2], result, live)
        self._collect(live)
        return clone(result)  # the event holds `result`: the caller gets its own copy

    def _index_owners(self, key: tuple[str, str, str, str], obj: dict[str, Any]) -> None:
        for ref in obj["metadata"].get("ownerReferences") or []:
            uid = ref.get("uid") if isinstance(ref, dict) else None
            if isinstance(uid, str) and uid:
                self.owned_by.setdefault(uid, set()).add(key)

    def _owner_there(self, ref: dict[str, Any], namespace: str) -> bool:
        """Whether the owner a reference names exists with that uid (an owner of a kind not served is
        taken as there: kube-controller-manager cannot tell, and deletes nothing on its account)."""
        group = ref.get("apiVersion", "").rpartition("/")[0] if "/" in ref.get("apiVersion", "") else ""
        r = self.registry.by_kind.get((group, ref.get("kind", "")))
        if r is None:
            return True
        owner = self.objects.get((r.group, r.plural, namespace if r.namespaced else "", ref.get("name", "")))
        return owner is not None and owner["metadata"].get("uid") == ref.get("uid")

    def _collect(self, gone: dict[str, Any]) -> None:
        """Garbage collection, as kube-controller-manager's collector does it in the background, here at
        once: an object whose every owner is gone is deleted (and its own dependents after it); one that
        still has an owner loses its references to those that are gone."""
        if self._dry:
            return
        uid = gone["metadata"].get("uid")
        for key in sorted(self.owned_by.pop(uid, ()) if isinstance(uid, str) else ()):
            dep = self.objects.get(key)
            r = self.registry.by_plural.get(key[:2])
            refs = [ref for ref in (dep["metadata"].get("ownerReferences") or []) if isinstance(ref, dict)] if dep else []
            if dep is None or r is None or not any(ref.get("uid") == uid for ref in refs):
                continue
            there = [ref for ref in refs if self._owner_there(ref, key[2])]
            if not there:
                self.delete(r, key[2], key[3])
            elif len(there) < len(refs):
                new = clone(dep)
                new["metadata"]["ownerReferences"] = there
                self.update(r, key[2], key[3], new, manager="generic-garbage-collector", check_rv=False)

    def _drop_custom_resources(self, crd: dict[str, Any]) -> None:
        """A CRD going away takes its custom resources with it, each with a DELETED event (as the
        apiextensions cleanup finalizer has it done; finalizers on the resources are not waited for)."""
        gp = self.registry.from_crd.get(crd["metadata"]["name"])
        cr = self.registry.by_plural.get(gp) if gp else None
        if cr is None:
            return
        for key in sorted(self.objects.keys_of(*gp)):  # type: ignore[misc]  # (cr is not None, so neither is gp)
            live = self.objects.pop(key)
            gone = _deleted_version(live)
            self._bump(gone)
            self._emit("DELETED", cr, key[2], gone, live)
            self._collect(live)

    def events_since(self, rv: int) -> builtins.list[Event]:
        """The events a watch from `rv` replays; 410 Gone in the watch cache's words below the oldest
        version it can resume from (the window's edge, or the version a restart began at)."""
        oldest = max(self.compacted - 1, self.watch_floor)
        if rv < oldest:
            raise ApiFailure(410, "Expired", f"too old resource version: {rv} ({oldest})")
        return [e for e in self.events if e.rv > rv]

    def restart_watch_cache(self) -> None:
        """An API server restart, for watches: its watch cache starts again from a list at the current
        resourceVersion, so a watch from an older one is 410 Gone (the client lists again), never a
        replay of what it may have missed. Lists at an older version and continue tokens are still
        served, as kube-apiserver reads those from etcd."""
        self.watch_floor = self.rv


def _smd_path(body: Any, path: str) -> str:
    """A field path as the sandbox names it (`spec.listeners[0].x`) as structured-merge-diff does
    (`.spec.listeners[name="http"].x`), reading the list items' names from the applied body."""
    out = []
    node = body
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            i = int(part[1:-1])
            item = node[i] if isinstance(node, list) and i < len(node) else None
            out.append(f'[name="{item["name"]}"]' if isinstance(item, dict) and isinstance(item.get("name"), str) else part)
            node = item
        else:
            out.append("." + part)
            node = node.get(part) if isinstance(node, dict) else None
    return "".join(out)


def _deleted_version(live: dict[str, Any]) -> dict[str, Any]:
    """What a DELETED event holds: the last version with a new resourceVersion (written next into
    its own metadata); everything else shared with it, as stored objects are never changed in place."""
    return dict(live, metadata=dict(live["metadata"]))


def _set(obj: dict[str, Any], path: FieldPath, value: Any) -> None:
    set_in(obj, path, clone(value))
