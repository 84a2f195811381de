"""The sandbox's HTTP face (aiohttp): discovery, CRUD, patch and apply, the status subresource,
watch with bookmarks and 410 Gone, Kubernetes Status errors, Table output for kubectl, and a
fault-injection endpoint (`/sandbox/faults`) for tests.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import os
import secrets
import shutil
import ssl
import sys
import tempfile
import time
from contextlib import nullcontext
from typing import Any, Callable

import orjson
import yaml
from aiohttp import web

from gwpolicy.files.load import BoundedLoader
from gwpolicy.sandbox import protobuf
from gwpolicy.sandbox.admission import Admission, Call, warning_header
from gwpolicy.sandbox.clusterips import DEFAULT_SERVICE_CIDR
from gwpolicy.sandbox.faults import FaultRule
from gwpolicy.sandbox.objects import ApiFailure, Event
from gwpolicy.sandbox.persist import DataDirError
from gwpolicy.sandbox.protobuf import ProtobufError
from gwpolicy.sandbox.resources import Resource
from gwpolicy.sandbox.selectors import field_matcher, label_matcher
from gwpolicy.sandbox.store import LIST_EXPIRED, Store
from gwpolicy.sandbox.table import table

log = logging.getLogger("gwpolicy.sandbox")
_YAML_LOADER = BoundedLoader  # PyYAML's safe loader that refuses an alias bomb

MAX_REQUEST_BYTES = 3 * 1024 * 1024  # kube-apiserver's limit on a write's body

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-gwpolicy-sandbox", "gitCommit": "sandbox",
           "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
           "platform": "linux/amd64"}


def _encode(data: Any) -> bytes:
    return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)


def _limit(text: str | None) -> int:
    """`?limit=`: a whole number; 0 or none means no limit (a negative or unreadable one is 400)."""
    if not text:
        return 0
    try:
        n = int(text)
    except ValueError:
        raise ApiFailure(400, "BadRequest", f"invalid limit {text!r}: not a whole number") from None
    if n < 0:
        raise ApiFailure(400, "BadRequest", f"invalid limit {n}: must not be negative")
    return n


def _continue_token(rv: int, after: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"v": "sandbox/1", "rv": rv, "start": list(after)})).decode()


#: what kube-apiserver (storage/etcd3) answers, with 410 Expired, to a continue token whose
#: resourceVersion is compacted away (an exact list's: store.LIST_EXPIRED)
CONTINUE_EXPIRED = ("The provided continue parameter is too old to display a consistent list result. You can start a "
                    "new list without the continue parameter, or use the continue token in this response to retrieve "
                    "the remainder of the results. Continuing with the provided token results in an inconsistent list "
                    "- objects that were created, modified, or deleted between the time the first chunk was returned "
                    "and now may show up in the list.")
LATEST = -1  # a token's resourceVersion that continues at the latest version (the one a 410 hands out)


def _continue_key(token: str) -> tuple[int, tuple[str, str]]:
    """What a continue token holds: the list's resourceVersion (LATEST: none, read now) and the last
    (namespace, name) served."""
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        ns, name = data["start"]
        rv = int(data["rv"])
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError) as exc:
        raise ApiFailure(400, "BadRequest", f"invalid continue token: continue key is not valid: {exc}") from None
    if rv == 0 or rv < LATEST:
        raise ApiFailure(400, "BadRequest", "invalid continue token: continue key is not valid: incorrect encoded "
                         "start resourceVersion (version meta.k8s.io/v1)")
    return rv, (str(ns), str(name))


def _check_list_options(q: Any) -> None:
    """ListOptions as kube-apiserver validates them before a list: 422 on ListOptions.meta.k8s.io."""
    match, rv = q.get("resourceVersionMatch") or "", q.get("resourceVersion") or ""
    errors: list[tuple[str, str]] = []
    if match:
        if not rv:
            errors.append(("FieldValueForbidden", "Forbidden: resourceVersionMatch is forbidden unless resourceVersion "
                           "is provided"))
        if q.get("continue"):
            errors.append(("FieldValueForbidden", "Forbidden: resourceVersionMatch is forbidden when continue is provided"))
        if match not in ("Exact", "NotOlderThan"):
            errors.append(("FieldValueNotSupported", f'Unsupported value: "{match}": supported values: "Exact", '
                           '"NotOlderThan", ""'))
        if match == "Exact" and rv == "0":
            errors.append(("FieldValueForbidden", 'Forbidden: resourceVersionMatch "exact" is forbidden for '
                           'resourceVersion "0"'))
    if errors:
        shown = [f"resourceVersionMatch: {body}" for _, body in errors]
        text = shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"
        raise ApiFailure(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {text}',
                         {"name": "", "group": "meta.k8s.io", "kind": "ListOptions",
                          "causes": [{"reason": reason, "message": body, "field": "resourceVersionMatch"}
                                     for reason, body in errors]})


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encode(data), status=status, content_type="application/json")


def _fail(exc: ApiFailure) -> web.Response:
    return _json(exc.status(), exc.code)


def _wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


class Sandbox:
    """The server: one Store, the aiohttp application, and the watches in flight."""

    def __init__(self, store: Store | None = None, bookmark_interval: float = 1.0, log: bool = False,
                 token: str | None = None) -> None:
        self.log = log
        #: the bearer token every request but the health and version probes must carry (the one
        #: written in the kubeconfig); None: no authentication (a sandbox inside a test's own process)
        self.token = token
        self.store = store or Store()
        self.bookmark_interval = bookmark_interval
        self.too_large_wait = 3.0  # seconds a read from a future resourceVersion waits before 504
        #: each watch's queue, with the resource (group, plural) it watches: an event wakes only the
        #: watches of its own resource, not every watch in flight
        self.watch_queues: dict[asyncio.Queue, tuple[str, str]] = {}
        self.app = web.Application(client_max_size=256 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)
        self.store.listeners.append(self._fanout)
        self.admission = Admission(self.store)
        self.requests = 0

    def _fanout(self, ev: Event) -> None:
        resource = (ev.group, ev.plural)
        for q, watched in list(self.watch_queues.items()):
            if watched == resource:
                q.put_nowait(ev)

    def drop_watches(self) -> None:
        for q in list(self.watch_queues):
            q.put_nowait(None)  # the stream closes without a word, as a broken connection does

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.log:
            print(f"{request.method} {request.path_qs} [{request.headers.get('Content-Type', '')}] "
                  f"accept={request.headers.get('Accept', '')}", file=sys.stderr, flush=True)
        if self.store.faults.latency:
            await asyncio.sleep(self.store.faults.latency)
        path = request.path.rstrip("/") or "/"
        try:
            if self.token is not None and path not in PUBLIC_PATHS and not self._authenticated(request):
                raise ApiFailure(401, "Unauthorized", "Unauthorized")
            if path.startswith("/sandbox/"):
                return await self.control(request, path)
            if path in ("/healthz", "/readyz", "/livez"):
                return web.Response(text="ok")
            if path == "/version":
                return _json(VERSION)
            if path == "/openapi/v2":
                if "protobuf" in request.headers.get("Accept", ""):
                    return web.Response(body=protobuf.openapi_v2_document("Kubernetes", VERSION["gitVersion"]),
                                        content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
                return _json({"swagger": "2.0", "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]},
                              "paths": {}, "definitions": {}})
            if path.startswith("/openapi/v3"):
                return _json(self.openapi_v3(path[len("/openapi/v3"):].strip("/")))
            if path == "/api":
                return _json({"kind": "APIVersions", "versions": ["v1"],
                              "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})
            if path == "/apis":
                groups = []
                versions: list[str] | None  # a group's versions (None: a group not served)
                for g, versions in sorted(self.store.registry.groups().items()):
                    groups.append({"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in versions],
                                   "preferredVersion": {"groupVersion": f"{g}/{versions[0]}", "version": versions[0]}})
                return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            parts = path.strip("/").split("/")
            if parts[0] == "api" and len(parts) >= 2:
                group, version, rest = "", parts[1], parts[2:]
            elif parts[0] == "apis" and len(parts) >= 2:
                group = parts[1]
                if len(parts) == 2:
                    versions = self.store.registry.groups().get(group)
                    if not versions:
                        raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
                    return _json({"kind": "APIGroup", "apiVersion": "v1", "name": group,
                                  "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                                  "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]}})
                version, rest = parts[2], parts[3:]
            else:
                raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
            if not rest:
                resources = self.store.registry.in_version(group, version)
                if not resources and group:
                    raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
                return _json({"kind": "APIResourceList", "apiVersion": "v1",
                              "groupVersion": f"{group}/{version}" if group else version,
                              "resources": [x for r in resources for x in r.to_api_resource()]})
            return await self.resource_request(request, group, version, rest)
        except ApiFailure as exc:
            return _fail(exc)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug of ours: a Status body as kube-apiserver sends, and the log
            log.exception("%s %s failed", request.method, request.path_qs)
            return _fail(ApiFailure(500, "InternalError", f"Internal error occurred: {type(exc).__name__}: {exc}"))

    def _authenticated(self, request: web.Request) -> bool:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), str(self.token).encode())

    def openapi_v3(self, gv: str) -> dict[str, Any]:
        """Just enough OpenAPI v3 for kubectl: the index, and per group-version the paths whose PATCH
        takes `fieldValidation` (so kubectl leaves validation to the server) with CRD schemas."""
        reg = self.store.registry
        if not gv:
            paths: dict[str, Any] = {"api/v1": {"serverRelativeURL": f"/openapi/v3/api/v1?hash={self.store.rv}"}}
            for g, versions in reg.groups().items():
                for v in versions:
                    paths[f"apis/{g}/{v}"] = {"serverRelativeURL": f"/openapi/v3/apis/{g}/{v}?hash={self.store.rv}"}
            return {"paths": paths}
        parts = gv.split("/")
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        if not reg.in_version(group, version):
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        paths = {}
        schemas: dict[str, Any] = {}
        base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        for r in reg.in_version(group, version):
            gvk = {"group": group, "version": version, "kind": r.kind}
            params = [{"name": n, "in": "query", "schema": {"type": "string"}} for n in
                      ("dryRun", "fieldManager", "fieldValidation", "force")]
            op = {"x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {"200": {"description": "OK"}}}
            item = f"{base}/namespaces/{{namespace}}/{r.plural}/{{name}}" if r.namespaced else f"{base}/{r.plural}/{{name}}"
            coll = f"{base}/namespaces/{{namespace}}/{r.plural}" if r.namespaced else f"{base}/{r.plural}"
            paths[item] = {m: dict(op, **{"x-kubernetes-action": a}) for m, a in
                           (("get", "get"), ("put", "put"), ("patch", "patch"), ("delete", "delete"))}
            paths[coll] = {m: dict(op, **{"x-kubernetes-action": a}) for m, a in (("get", "list"), ("post", "post"))}
            name = f"{'.'.join(reversed(group.split('.'))) if group else 'io.k8s.api.core'}.{version}.{r.kind}"
            schema = dict(reg.schemas.get((group, r.plural)) or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
            schema["x-kubernetes-group-version-kind"] = [gvk]
            schemas[name] = schema
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]},
                "paths": paths, "components": {"schemas": schemas}}

    async def control(self, request: web.Request, path: str) -> web.Response:
        if path == "/sandbox/stats":
            return _json({"writes": self.store.writes, "writesByResource": self.store.writes_by,
                          "resourceVersion": self.store.rv, "requests": self.requests,
                          "watches": len(self.watch_queues)})
        if path == "/sandbox/faults" and request.method == "POST":
            spec = await request.json()
            f = self.store.faults
            if spec.get("dropWatches"):
                self.drop_watches()
            if spec.get("compact"):
                self.store.compact()
                if spec.get("dropWatches", True):
                    self.drop_watches()
            if spec.get("clear"):
                f.rules.clear()
            client = {"user_agent": spec.get("userAgent"), "field_manager": spec.get("fieldManager")}
            for nth, code in spec.get("failWrites") or []:  # the nth write from now (of that client) fails once
                f.rules.append(FaultRule(int(code), int(nth), **client))
            for rule in spec.get("failRequests") or []:
                f.rules.append(FaultRule(int(rule["code"]), int(rule.get("nth", 1)), int(rule.get("times", -1)),
                                         rule.get("verb"), rule.get("resource"), rule.get("userAgent"),
                                         rule.get("fieldManager")))
            if "latency" in spec:
                f.latency = float(spec["latency"])
            return _json({"ok": True})
        raise ApiFailure(404, "NotFound", "no such sandbox control")

    async def resource_request(self, request: web.Request, group: str, version: str, rest: list[str]) -> web.StreamResponse:
        """One request on a resource, with the request's field validation and the warnings it earned."""
        fv = request.query.get("fieldValidation") or "Warn"
        if fv not in ("Strict", "Warn", "Ignore"):
            raise ApiFailure(400, "BadRequest", f'fieldValidation parameter unsupported: "{fv}"; '
                             'must be one of "Ignore", "Warn", or "Strict"')
        self._bind(request)
        resp = await self._resource_request(request, group, version, rest)
        warnings = self.store.warnings  # no await since the store call: this request's own
        if warnings and not resp.prepared:
            for w in warnings:
                resp.headers.add("Warning", '299 - "' + w.replace('"', '\\"') + '"')
        return resp

    async def _resource_request(self, request: web.Request, group: str, version: str, rest: list[str]) -> web.StreamResponse:
        registry = self.store.registry
        ns = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        plural = rest[0]
        r = registry.by_plural.get((group, plural))
        if r is None or version not in r.versions:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) >= 3 else None
        if sub not in (None, "status"):
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        if sub == "status" and not r.status_subresource:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        if r.namespaced and name is not None and ns is None:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        q = request.query
        method = request.method
        store = self.store
        manager = q.get("fieldManager")
        if name is None:
            if method == "GET":
                if q.get("watch") in ("true", "1"):
                    store.faults.check("watch", r.plural)
                    return await self.watch(request, r, ns)
                store.faults.check("list", r.plural)
                objs, list_meta = await self.list_objects(request, r, ns)
                for o in objs:
                    o["apiVersion"] = r.api_version(version)
                if _wants_table(request):
                    return _json(table(r, objs, list_meta))
                return _json({"kind": r.list_kind, "apiVersion": r.api_version(version),
                              "metadata": list_meta, "items": objs})
            if method == "POST":
                body = await self._body(request)
                if r.namespaced and ns is None:
                    ns = (body.get("metadata") or {}).get("namespace") or "default"
                meta = body.get("metadata") if isinstance(body, dict) else None
                name = str(meta.get("name") or "") if isinstance(meta, dict) else ""
                return await self._write(request, r, version, None, "CREATE", ns or "", name, bool(q.get("dryRun")),
                                         lambda: store.create(r, ns or "", body, manager, version), lambda out: _json(out, 201))
            raise ApiFailure(405, "MethodNotAllowed", f"{method} is not supported on a collection here")
        ns = ns or ""
        if method == "GET":
            store.faults.check("get", r.plural)
            obj = store.get(r, ns, name)
            obj["apiVersion"] = r.api_version(version)
            if _wants_table(request):
                return _json(table(r, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]}))
            return _json(obj)
        if method == "PUT":
            body = await self._body(request)
            return await self._write(request, r, version, sub, "UPDATE", ns, name, bool(q.get("dryRun")),
                                     lambda: store.update(r, ns, name, body, subresource=sub, manager=manager or "unknown",
                                                          version=version), _json)
        if method == "PATCH":
            body = await self._body(request)
            ct = request.headers.get("Content-Type", "application/merge-patch+json")
            existed = (r.group, r.plural, ns if r.namespaced else "", name) in store.objects
            return await self._write(request, r, version, sub, "UPDATE" if existed else "CREATE", ns, name,
                                     bool(q.get("dryRun")),
                                     lambda: store.patch(r, ns, name, ct, body, subresource=sub, manager=manager,
                                                         force=q.get("force") in ("true", "1"), version=version),
                                     lambda out: _json(out, 200 if existed else 201))
        if method == "DELETE":
            options = await self._body(request)  # DeleteOptions: kubectl sends dryRun here, not in the query
            dry = q.get("dryRun") or (options.get("dryRun") if isinstance(options, dict) else None)
            pending = False

            def delete() -> dict[str, Any]:
                nonlocal pending
                out = store.delete(r, ns, name)
                pending = (r.group, r.plural, ns if r.namespaced else "", name) in store.objects
                return out

            def deleted(out: dict[str, Any]) -> web.Response:
                if pending:
                    return _json(out)  # finalizers pending: the object stays, marked for deletion
                return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                              "details": {"name": name, "group": r.group, "kind": r.plural,
                                          "uid": out["metadata"].get("uid")}})
            return await self._write(request, r, version, None, "DELETE", ns, name, bool(dry), delete, deleted)
        raise ApiFailure(405, "MethodNotAllowed", f"{method} is not supported")

    async def wait_for_version(self, rv_text: str | None) -> int:
        """A resourceVersion this server has not reached yet: wait for it a little, as kube-apiserver's
        watch cache does (3 s), then refuse it as it does: 504 Timeout, cause ResourceVersionTooLarge."""
        try:
            wanted = int(rv_text or 0)
        except ValueError:
            raise ApiFailure(400, "BadRequest", f"invalid resourceVersion {rv_text!r}: must be an integer") from None
        deadline = time.monotonic() + self.too_large_wait
        while wanted > self.store.rv and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if wanted > self.store.rv:
            raise ApiFailure(504, "Timeout", f"Too large resource version: {wanted}, current: {self.store.rv}",
                             {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                              "retryAfterSeconds": 1})
        return wanted

    async def list_objects(self, request: web.Request, r: Resource, ns: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A list, whole or in chunks (`?limit=N`, then `?continue=`: client-go's reflector asks for
        500 at a time, `kubectl get` for --chunk-size), with its ListMeta, as kube-apiserver serves it:

        - the version read: now; or exactly `resourceVersion` with `resourceVersionMatch=Exact`, or
          with a limit and no match (the legacy rule); `NotOlderThan` and a version without a limit
          are read now, once the sandbox has reached it;
        - `resourceVersion=0` is the watch cache's list (kube-apiserver v1.32): whole, the limit
          ignored, no continue token;
        - a chunk with more after it carries `remainingItemCount` (the objects left), but not with a
          label or field selector;
        - every chunk is read at the first chunk's version and carries it, so an object created,
          changed or deleted between two chunks shows in the later chunks as it was then; the store
          rebuilds that version from the objects now and the watch window's events since;
        - a version the window no longer reaches is 410 Expired in etcd3's words; an expired
          continue token gets a token that continues at the latest version (inconsistently), as there."""
        store, q = self.store, request.query
        _check_list_options(q)
        limit = _limit(q.get("limit"))
        token = q.get("continue")
        after: tuple[str, str] | None = None
        if token:
            if q.get("resourceVersion") not in (None, "", "0"):
                raise ApiFailure(400, "BadRequest", "specifying resource version is not allowed when using continue")
            at, after = _continue_key(token)
            if at == LATEST:
                at = store.rv
            elif at > store.rv:
                raise ApiFailure(400, "BadRequest", "invalid continue token: its resourceVersion is in the future")
            elif not store.reaches(at):
                raise ApiFailure(410, "Expired", CONTINUE_EXPIRED, list_meta={"continue": _continue_token(LATEST, after)})
        else:
            wanted = await self.wait_for_version(q.get("resourceVersion"))
            self._bind(request)
            match = q.get("resourceVersionMatch") or ""
            if q.get("resourceVersion") == "0":
                limit = 0  # the watch cache's list: whole, whatever the limit (match "" or NotOlderThan)
            exact = wanted > 0 and (match == "Exact" or (not match and limit > 0))
            at = wanted if exact else store.rv
            if not store.reaches(at):
                raise ApiFailure(410, "Expired", LIST_EXPIRED)
        labels, fields = q.get("labelSelector"), q.get("fieldSelector")
        objs, more = store.page(r, ns, labels, fields, limit or sys.maxsize, after, None if at == store.rv else at)
        meta: dict[str, Any] = {"resourceVersion": str(at)}
        if more and objs:
            last = objs[-1]["metadata"]
            key = (last.get("namespace") or "", last["name"])
            meta["continue"] = _continue_token(at, key)
            if not labels and not fields:  # with a selector etcd's count is not the list's: none is sent
                meta["remainingItemCount"] = store.remaining(r, ns, key, None if at == store.rv else at)
        return objs, meta

    def _bind(self, request: web.Request) -> None:
        """The store's per-request settings: field validation, the client (for fault rules) and a fresh
        list of warnings. Set again after every await, before the store is called: requests interleave
        at awaits, and the store calls themselves never await."""
        self.store.field_validation = request.query.get("fieldValidation") or "Warn"
        self.store.faults.client = (request.headers.get("User-Agent", ""), request.query.get("fieldManager", ""))
        self.store.warnings = []

    async def _write(self, request: web.Request, r: Resource, version: str, sub: str | None, operation: str,
                     ns: str, name: str, dry: bool, do: Callable[[], dict[str, Any]],
                     respond: Callable[[dict[str, Any]], web.Response]) -> web.Response:
        """One write, past the validating admission webhooks first (sandbox/admission.py): what the write
        would store is computed by a dry run and sent to them; their warnings go back as headers."""
        store = self.store
        warnings: list[str] = []
        if self.admission.active():
            key = (r.group, r.plural, ns if r.namespaced else "", name)
            old = store.objects.get(key)
            with store.dry_run():
                preview = do()
            call = Call(r, version, sub, operation, ns if r.namespaced else "", name or preview["metadata"].get("name", ""),
                        None if operation == "DELETE" else preview, old, dry,
                        user=request.headers.get("User-Agent", "sandbox-user"))
            await self.admission.validate(call)
            warnings = call.warnings
            self._bind(request)  # after the await: this request's settings again, and none of the preview's warnings
        with store.dry_run() if dry else nullcontext():
            resp = respond(do())
        for w in warnings:
            resp.headers.add("Warning", warning_header(w))
        return resp

    async def _body(self, request: web.Request) -> Any:
        try:
            return await self._read_body(request)
        finally:
            self._bind(request)

    async def _read_body(self, request: web.Request) -> Any:
        if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
            raise ApiFailure(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_REQUEST_BYTES}")
        if request.content_length is not None:
            raw = await request.read()
        else:  # a chunked body has no Content-Length to check beforehand
            chunks, size = [], 0
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > MAX_REQUEST_BYTES:
                    raise ApiFailure(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_REQUEST_BYTES}")
                chunks.append(chunk)
            raw = b"".join(chunks)
        ct = request.headers.get("Content-Type", "")
        if "protobuf" in ct:  # kubectl's generators (kubectl create namespace ...) send built-in kinds so
            try:
                return protobuf.decode(raw)
            except ProtobufError as exc:
                raise ApiFailure(415, "UnsupportedMediaType", f"the protobuf body could not be decoded: {exc}") from exc
        try:
            if not raw.strip():
                return {}
            try:  # JSON first, also for apply patches: clients send JSON, and YAML's parser is slow
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                if "yaml" not in ct:
                    raise
            return yaml.load(raw, Loader=_YAML_LOADER) or {}
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiFailure(400, "BadRequest", f"the request body could not be decoded: {exc}") from exc

    async def watch(self, request: web.Request, r: Resource, ns: str | None) -> web.StreamResponse:
        q = request.query
        lm, fm = label_matcher(q.get("labelSelector")), field_matcher(q.get("fieldSelector"))
        as_table = _wants_table(request)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(q.get("timeoutSeconds") or 1800)
        rv_text = q.get("resourceVersion") or ""
        queue: asyncio.Queue = asyncio.Queue()
        self.watch_queues[queue] = (r.group, r.plural)  # subscribe before reading history, so nothing falls between
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        await resp.prepare(request)
        version = request.path.split("/")[3] if request.path.startswith("/apis/") else "v1"

        def matches(obj: dict[str, Any], ens: str) -> bool:
            return (ns is None or not r.namespaced or ens == ns) and lm(obj["metadata"].get("labels") or {}) and fm(obj)

        def seen(ev: Any) -> tuple[str, dict[str, Any]] | None:
            """The event as this watch sees it, as kube-apiserver's watch cache filters one: an object
            that comes into the selectors is ADDED, one that leaves them is DELETED (its last matching
            content at the event's version), one that stays in is MODIFIED."""
            if ev.group != r.group or ev.plural != r.plural:
                return None
            now = ev.type != "DELETED" and matches(ev.obj, ev.namespace)
            before = ev.prev is not None and matches(ev.prev, ev.namespace)
            if ev.type == "DELETED":
                return ("DELETED", ev.obj) if before or (ev.prev is None and matches(ev.obj, ev.namespace)) else None
            if now:
                return ("MODIFIED" if before else "ADDED"), ev.obj
            if before:
                meta = dict(ev.prev["metadata"], resourceVersion=ev.obj["metadata"]["resourceVersion"])
                return "DELETED", dict(ev.prev, metadata=meta)
            return None

        async def send(etype: str, obj: dict[str, Any]) -> None:
            obj = dict(obj, apiVersion=r.api_version(version)) if etype != "ERROR" else obj
            if as_table and etype != "ERROR" and etype != "BOOKMARK":
                obj = table(r, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]})
            await resp.write(_encode({"type": etype, "object": obj}) + b"\n")

        try:
            last = 0
            if rv_text in ("", "0"):
                last = self.store.rv  # the list's version: a write while it is sent comes after it, from the queue
                for obj in self.store.list(r, ns, q.get("labelSelector"), q.get("fieldSelector")):
                    await send("ADDED", obj)
            else:
                try:
                    history = self.store.events_since(await self.wait_for_version(rv_text))
                except ApiFailure as exc:  # too old (410) or too large (504): one ERROR event, as there
                    await send("ERROR", exc.status())
                    return resp
                last = int(rv_text)
                for ev in history:
                    got = seen(ev)
                    if got is not None:
                        await send(*got)
                    last = ev.rv
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    ev = await asyncio.wait_for(queue.get(), min(remaining, self.bookmark_interval))
                except asyncio.TimeoutError:
                    if bookmarks:
                        await send("BOOKMARK", {"kind": r.kind, "apiVersion": r.api_version(version),
                                                "metadata": {"resourceVersion": str(self.store.rv)}})
                    continue
                if ev is None:  # injected fault: drop the stream mid-flight
                    request.transport.close() if request.transport else None
                    return resp
                if ev.rv <= last:
                    continue
                last = ev.rv
                got = seen(ev)
                if got is not None:
                    await send(*got)
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        finally:
            self.watch_queues.pop(queue, None)
        try:
            await resp.write_eof()
        except ConnectionResetError:
            pass
        return resp


#: what kube-apiserver answers anyone (system:public-info-viewer): probes and the version
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/livez", "/version"})


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_kubeconfig(path: str, port: int, namespace: str = "default", token: str | None = None,
                     ca_pem: bytes | None = None) -> None:
    """A kubeconfig for the sandbox, readable by its owner only (it holds the token); with `ca_pem`,
    the sandbox serves HTTPS with a certificate that CA signed (kubectl sends a token over TLS only)."""
    user = {"token": token} if token else {}
    cluster: dict[str, Any] = {"server": f"{'https' if ca_pem else 'http'}://127.0.0.1:{port}"}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "gwpolicy-sandbox",
           "clusters": [{"name": "gwpolicy-sandbox", "cluster": cluster}],
           "users": [{"name": "gwpolicy-sandbox", "user": user}],
           "contexts": [{"name": "gwpolicy-sandbox", "context": {"cluster": "gwpolicy-sandbox", "user": "gwpolicy-sandbox",
                                                                  "namespace": namespace}}]}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        yaml.safe_dump(cfg, fh, sort_keys=False)


def client_options(path: str) -> dict[str, Any]:
    """What a raw HTTP client (httpx) of the sandbox needs from the kubeconfig `gwpolicy sandbox`
    wrote: its bearer token as a header, its CA to verify the server with."""
    with open(path, encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh) or {}
    ctx = next((c.get("context") or {} for c in cfg.get("contexts") or [] if c.get("name") == cfg.get("current-context")), {})
    user = next((u.get("user") or {} for u in cfg.get("users") or [] if u.get("name") == ctx.get("user")), {})
    cluster = next((c.get("cluster") or {} for c in cfg.get("clusters") or [] if c.get("name") == ctx.get("cluster")), {})
    out: dict[str, Any] = {"headers": {"Authorization": f"Bearer {user['token']}"} if user.get("token") else {}}
    if cluster.get("certificate-authority-data"):
        out["verify"] = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return out


def tls_context(directory: str, keep: str | None = None) -> tuple[ssl.SSLContext, bytes]:
    """A CA and a serving certificate for 127.0.0.1 and localhost (made with `cryptography`, as the
    webhook's), the key written 0600 in `directory`: the server's SSL context and the CA's PEM.
    `keep`: a directory where the CA is kept (a sandbox restarted on its --data-dir keeps it, as an
    API server keeps its CA, so that clients holding the kubeconfig still trust it)."""
    from gwpolicy.kube import certs

    ca = None
    if keep is not None and os.path.exists(os.path.join(keep, "ca.key")):
        with open(os.path.join(keep, "ca.crt"), "rb") as c, open(os.path.join(keep, "ca.key"), "rb") as k:
            ca = certs.KeyPair(c.read(), k.read())
    if ca is None:
        ca = certs.make_ca("gwpolicy-sandbox-ca")
        if keep is not None:
            certs.write_pair(keep, "ca", ca)
    crt, key = certs.write_pair(directory, "sandbox", certs.make_serving(ca, ["127.0.0.1", "localhost"]))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(crt, key)
    return ctx, ca.cert_pem


class SandboxServer:
    """A sandbox listening on 127.0.0.1; `restart()` (or `stop()` then `start()`) stops and starts the
    HTTP side on the same port with the same storage, as an API server restart does (etcd keeps the
    data), and its watch cache starting again from a list at the current resourceVersion: a watch
    from an older one is 410 Gone (`Store.restart_watch_cache`)."""

    def __init__(self, sandbox: Sandbox, port: int = 0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.sandbox = sandbox
        self.port = port
        self.ssl_context = ssl_context
        self.runner: web.AppRunner | None = None
        self.started = False

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> int:
        if self.started:  # a restart: the watch cache begins at the current resourceVersion
            self.sandbox.store.restart_watch_cache()
        self.started = True
        self.runner = web.AppRunner(self.sandbox.app, access_log=None, handler_cancellation=True, shutdown_timeout=0.2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True, ssl_context=self.ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        self.sandbox.drop_watches()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def restart(self, down: float = 0.3) -> None:
        await self.stop()
        await asyncio.sleep(down)
        await self.start()


async def serve(port: int, kubeconfig_out: str | None, keep_creation_timestamp: bool = False,
                bookmark_interval: float = 1.0, preload: list[dict[str, Any]] | None = None,
                data_dir: str | None = None, loopback_endpoints: bool = False,
                service_cidr: str | None = None) -> None:
    try:
        store = Store(keep_creation_timestamp=keep_creation_timestamp, data_dir=data_dir,
                      loopback_endpoints=loopback_endpoints, service_cidr=service_cidr or DEFAULT_SERVICE_CIDR)
    except DataDirError as exc:
        raise SystemExit(f"Error: {exc}") from None
    # other local users can reach 127.0.0.1 too: only the holder of the kubeconfig (0600) gets in,
    # over TLS, since kubectl sends a token to no server over plain HTTP
    keep = os.path.join(data_dir, "access") if data_dir else None  # a restart on --data-dir keeps both
    token = _kept_token(keep) if keep else new_token()
    sandbox = Sandbox(store, bookmark_interval, log=bool(os.environ.get("GWPOLICY_SANDBOX_LOG")), token=token)
    load_all(sandbox.store, preload)
    keys = tempfile.mkdtemp(prefix="gwpolicy-sandbox-")  # 0700
    ctx, ca_pem = tls_context(keys, keep)
    server = SandboxServer(sandbox, port, ctx)
    try:
        actual = await server.start()
        if kubeconfig_out:
            write_kubeconfig(kubeconfig_out, actual, token=token, ca_pem=ca_pem)
        print(f"gwpolicy sandbox listening on {server.url}" +
              (f"; kubeconfig written to {kubeconfig_out}" if kubeconfig_out else f"; bearer token {token}"), flush=True)
        await asyncio.Event().wait()
    finally:
        await server.stop()
        shutil.rmtree(keys, ignore_errors=True)


def _kept_token(directory: str) -> str:
    """The token kept in `directory` (made and written 0600 the first time)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "token")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token)
    return token


def load_all(store: Store, preload: list[dict[str, Any]] | None) -> None:
    """Store the objects a sandbox starts with (its CRDs, then those of `-f`) in order, emptying the
    list as it goes: once stored, an object as parsed is let go (the store keeps its own version),
    so a 20k-route file is not held twice for the server's life. They are nobody's writes (the
    stats count the clients'). A restored sandbox has its objects already: the list is dropped."""
    pending = preload if preload is not None else []
    if store.restored:
        pending.clear()
    pending.reverse()  # taken from the end, in the given order
    while pending:
        obj = pending.pop()
        try:
            preload_object(store, obj)
        except ApiFailure as exc:
            raise SystemExit(f"Error: cannot load {obj.get('kind')} {(obj.get('metadata') or {}).get('name')}: {exc.message}")
        del obj
    store.writes, store.writes_by = 0, {}


def preload_object(store: Store, obj: dict[str, Any]) -> None:
    from gwpolicy.engine.kinds import split_api_version

    group, version = split_api_version(obj["apiVersion"])
    r = store.registry.by_kind.get((group, obj["kind"]))
    if r is None:
        raise ApiFailure(404, "NotFound", f"no resource for {obj['kind']} in {obj['apiVersion']}")
    ns = (obj["metadata"].get("namespace") or "default") if r.namespaced else ""
    if r.namespaced and ("", "namespaces", "", ns) not in store.objects:
        store.create(store.registry.by_plural[("", "namespaces")], "", {"metadata": {"name": ns}})
    name = obj["metadata"].get("name")
    if not r.namespaced and (r.group, r.plural) == ("", "namespaces") and ("", "namespaces", "", name) in store.objects:
        # a namespace the sandbox starts with (default, kube-system, ...), named by the file or
        # implied by its objects: applied onto the one there, as `kubectl apply` would
        store.apply(r, "", name, obj, subresource=None, manager="gwpolicy-sandbox-preload", force=True, version=version)
        return
    store.create(r, ns, obj, "gwpolicy-sandbox-preload", version)
