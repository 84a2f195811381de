"""Objects, resource versions and the watch log, with the API server's write semantics:
preconditions (409), generation bumps on spec changes only, the status subresource kept apart,
finalizers, merge/JSON/apply patches, and server-side apply with managedFields and conflicts.
"""

from __future__ import annotations

import bisect
import builtins  # for annotations in Store, where its method `list` hides the type
import heapq
import json
import sys
import uuid
from collections import OrderedDict, deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import jsonpatch
import orjson

from gwpolicy.sandbox import builtin, clusterips, gotypes
from gwpolicy.sandbox.faults import Faults
from gwpolicy.sandbox.fields import (
    FieldPath,
    delete_path,
    fields_v1,
    get_path,
    leaf_paths,
    merge_patch,
    overlap,
    paths_from_fields_v1,
    set_path,
    smd_path,
    with_defaults,
)
from gwpolicy.sandbox.objects import (
    MISSING,
    ApiFailure,
    Event,
    Key,
    Objects,
    Then,
    clone,
    etcd_key,
    invalid,
    invalid_fields,
    is_builtin,
    not_found,
    now,
    same,
    same_leaf,
    share_unchanged,
    validate_metadata,
)
from gwpolicy.sandbox.persist import Persistence
from gwpolicy.sandbox.resources import Registry, Resource
from gwpolicy.sandbox.schema import CelError, FieldError, crd_schemas
from gwpolicy.sandbox.selectors import field_matcher, label_matcher
from gwpolicy.sandbox.strategic import PatchError, strategic_merge

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
                 data_dir: str | None = None, loopback_endpoints: bool = False,
                 service_cidr: str = clusterips.DEFAULT_SERVICE_CIDR) -> None:
        self.registry = Registry()
        #: where Services get their cluster IPs (sandbox/clusterips.py; `gwpolicy sandbox --service-cidr`)
        self.service_range = clusterips.parse_range(service_cidr)
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
        self._then_cache: OrderedDict[tuple[str, str, int], Then] = OrderedDict()
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

    def _then(self, group: str, plural: str, rv: int) -> Then:
        """One resource as it was at `rv` (which the window reaches): the objects since changed,
        created or deleted, as they were then. Kept for the next chunk of the same list, which then
        reads only the events written since this one."""
        key = (group, plural, rv)
        then = self._then_cache.get(key)
        if then is None:
            then = self._then_cache[key] = Then(rv, rv, {})
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
        paths = sorted(smd_path(body, u) for u in unknown)
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

    def _cluster_ip(self, r: Resource, obj: dict[str, Any], name: str) -> None:
        """A Service that should have a cluster IP gets one (sandbox/clusterips.py; 422 as
        kube-apiserver's allocator says when the one it asks for cannot be given)."""
        if (r.group, r.kind) != ("", "Service") or not isinstance(obj.get("spec"), dict) \
                or not clusterips.wants_ip(obj["spec"]):
            return
        services = (self.objects[k] for k in self.objects.by_resource.get(("", "services"), {})
                    if k[2:] != (obj["metadata"].get("namespace", ""), name))
        try:
            clusterips.allocate(obj["spec"], self.service_range, clusterips.in_use(services))
        except clusterips.RangeError as exc:
            raise invalid_fields(r, name, [FieldError(exc.field, "FieldValueInvalid", "Invalid value: "
                                                      f"{json.dumps(exc.value)}: {exc}")]) from None

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
        self._cluster_ip(r, obj, name)
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
        if not ((live.get("spec") or {}).get("clusterIPs")):  # a Service that had none (ExternalName before)
            self._cluster_ip(r, result, name)
        if self._spec_of(result, r) != self._spec_of(live, r):
            result["metadata"]["generation"] = live["metadata"].get("generation", 1) + 1
        if manager:
            changed = owned if owned is not None else {p for p, v in leaf_paths(result).items()
                                                       if get_path(live, p) is MISSING or not same_leaf(get_path(live, p), v)}
            if subresource == "status":
                changed = {p for p in changed if p[:1] == ("status",)}
            self._own(result, manager, operation, changed, subresource, r, replace=owned is not None)
        if same(result, live):
            return clone(live)  # no change: no new resourceVersion, no event
        return self._store_update(r, key, live, result)

    def _store_update(self, r: Resource, key: Key, live: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
        if result["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers") \
                and r.kind == "CustomResourceDefinition" and r.group == "apiextensions.k8s.io":
            self._drop_custom_resources(live)
        _storable(result)
        share_unchanged(result, live)
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
            kept = {p for p in sets if not any(overlap(p, q) for q in paths)}
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
                set_path(obj, p, v)
            self._own(obj, manager, "Apply", set(applied_paths), None, r, replace=True)
            return self.create(r, ns, obj, None, version)
        if meta.get("resourceVersion") and meta["resourceVersion"] != live["metadata"]["resourceVersion"]:
            plural = f"{r.plural}.{r.group}" if r.group else r.plural
            raise ApiFailure(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                             "modified; please apply your changes to the latest version and try again",
                             {"name": name, "group": r.group, "kind": r.plural})
        conflicts = []
        defaulted = with_defaults(r, applied, live)
        for e in live["metadata"].get("managedFields") or []:
            if e.get("manager") == manager:
                continue
            for q in paths_from_fields_v1(e.get("fieldsV1") or {}):
                for p, v in applied_paths.items():
                    if overlap(p, q):
                        cur = get_path(live, p)
                        # a list is one field here (kube-apiserver owns a map list's items and their
                        # fields apart): a list applied without the defaults the live one has is the same
                        if cur is MISSING or (cur != v and (defaulted is None or get_path(defaulted, p) != cur)):
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
            if not any(overlap(p, q) for q in others) and not any(overlap(p, q) for q in applied_paths):
                delete_path(result, p)
        for p, v in applied_paths.items():
            set_path(result, p, v)
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


def _deleted_version(live: dict[str, Any]) -> dict[str, Any]:
    """What a DELETED event holds: the last version with a new resourceVersion (written next into
    its own metadata); everything else shared with it, as stored objects are never changed in place."""
    return dict(live, metadata=dict(live["metadata"]))
