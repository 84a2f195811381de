"""Informers: list, then watch from the list's resourceVersion with bookmarks; resume after a dropped
stream from the last version seen; on 410 Gone list again and report what disappeared as deletions;
reconnect with exponential backoff.

An API server that lost or reset its storage (restarted without etcd's data, or with a new etcd)
hands out smaller resourceVersions than the ones we hold. A watch from our old version is then
either refused as "too large resource version" (kube-apiserver) or, by a lax server, accepted and
answered with bookmarks and events below it. Both mean: list again, and compare every object by
content, since a version string no longer tells old from new. An optional periodic relist (`resync`)
catches whatever a watch missed without saying so.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from typing import Any, Awaitable, Callable

import httpx2 as httpx  # the HTTP client lightkube is built on
import orjson
from lightkube import ApiError, AsyncClient

from gwpolicy.kube import client as kube
from gwpolicy.kube.client import Kind

log = logging.getLogger("gwpolicy.informer")

Handler = Callable[[str, Kind, dict[str, Any]], Awaitable[None] | None]
#: what the cache holds of an object: its resourceVersion and a digest of its content
Seen = tuple[str | None, int]
STUCK_AFTER = 3  # failed watch attempts in a row (without an event between) before we call it stuck


def obj_key(o: dict[str, Any]) -> tuple[str, str]:
    """(namespace, name), interned: the model's compact copy holds the same strings (controller/store.py
    interns its own), so the cache of 150k objects adds no copy of them."""
    m = o.get("metadata") or {}
    return (sys.intern(m.get("namespace") or ""), sys.intern(m.get("name") or ""))


def _rv_int(rv: str | None) -> int | None:
    """resourceVersions are opaque to clients, but every server we know (etcd revisions) issues
    increasing integers; when both are integers, a smaller one means the server's history restarted."""
    try:
        return int(rv) if rv else None
    except ValueError:
        return None


def seen(o: dict[str, Any]) -> Seen:
    """What an informer remembers of an object: its resourceVersion (a changed one is a change), and a
    digest of its whole content, for the relist after a storage reset, when versions say nothing.
    The handler keeps what it needs of the object itself; a second whole copy here was, after the
    first status, half the controller's memory. Equal contents serialise alike (an API server
    writes an object's fields in one order); a different order only reports an unchanged object."""
    rv = (o.get("metadata") or {}).get("resourceVersion")
    return (sys.intern(rv) if type(rv) is str else rv, hash(orjson.dumps(o)))


def tombstone(kind: Kind, key: tuple[str, str], rv: str | None = None) -> dict[str, Any]:
    """The object a deletion is reported with when only its key is known (a relist found it gone)."""
    meta: dict[str, Any] = {"name": key[1]}
    if key[0]:
        meta["namespace"] = key[0]
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}


class VersionWentBack(Exception):
    """The server answered with a resourceVersion below the one we hold: its storage was reset."""


class Informer:
    def __init__(self, client: AsyncClient, kind: Kind, handler: Handler, namespace: str | None = None,
                 metrics: Any = None, watch_timeout: int = 300, resync: float = 0.0) -> None:
        self.client = client
        self.kind = kind
        self.handler = handler
        self.namespace = (namespace or "*") if kind.namespaced else None  # "*": every namespace, in lightkube
        self.metrics = metrics
        self.watch_timeout = watch_timeout
        self.resync = resync  # seconds between full relists; 0: never (trust the watch)
        self.cache: dict[tuple[str, str], Seen] = {}  # (namespace, name) -> `seen(object)`
        self.rv: str | None = None
        self.synced = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.relists = 0
        self.reconnects = 0
        self.resets = 0  # times the server's resourceVersions went back
        self.failures = 0  # failed attempts in a row
        self.error: str | None = None  # why the informer cannot make progress now; None when it can
        self._listed_at = 0.0
        self._kicked = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"informer {self.kind.plural}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping: a task's end is not news
                pass

    @property
    def stuck(self) -> bool:
        """True while the informer cannot make progress: its list fails, or its watch failed
        several times in a row, or it is listing again after the server's versions went back."""
        return self.error is not None

    def _set_error(self, why: str | None) -> None:
        self.error = why
        if self.metrics is not None and hasattr(self.metrics, "informer_stuck"):
            self.metrics.informer_stuck.labels(self.kind.plural).set(0 if why is None else 1)

    async def _emit(self, etype: str, obj: dict[str, Any]) -> None:
        if self.metrics:
            self.metrics.events.labels(self.kind.plural, etype).inc()
        out = self.handler(etype, self.kind, obj)
        if asyncio.iscoroutine(out):
            await out

    def _went_back(self, rv: str | None, by_content: bool) -> bool:
        """Whether a list at `rv` must compare by content: asked for, or the server's versions went
        back below ours (its storage was reset)."""
        old_rv, new_rv = _rv_int(self.rv), _rv_int(rv)
        if old_rv is not None and new_rv is not None and new_rv < old_rv and not by_content:
            log.warning("%s: the list's resourceVersion %s is below ours (%s): the API server's storage "
                        "was reset; comparing every object", self.kind.plural, rv, self.rv)
            self.resets += 1
            return True
        return by_content

    async def relist(self, by_content: bool = False) -> None:
        """List everything; report changes against the cache, and deletions of what is gone. With
        `by_content` (after a reset of the server's versions) an object whose version is unchanged
        is still reported when its content differs."""
        # chunk by chunk, each object handed on as it comes (kube.list_chunked): the whole list is
        # never held at once
        it = kube.list_chunked(self.client, self.kind, self.namespace)
        listed: dict[tuple[str, str], Seen] = {}
        checked = False
        async for item in it:
            if not checked:  # the list's version is known from its first chunk on
                by_content, checked = self._went_back(it.resourceVersion, by_content), True
            o = kube.to_dict(item)
            o.setdefault("apiVersion", self.kind.api_version)
            o.setdefault("kind", self.kind.kind)
            key = obj_key(o)
            now = listed[key] = seen(o)  # before the handler, which may change the object
            old = self.cache.get(key)
            if old is None:
                await self._emit("ADDED", o)
            elif old[0] != now[0] or (by_content and old[1] != now[1]):
                await self._emit("MODIFIED", o)
        rv = it.resourceVersion
        if not checked:
            self._went_back(rv, by_content)
        for key in [k for k in self.cache if k not in listed]:
            await self._emit("DELETED", tombstone(self.kind, key, self.cache[key][0]))
        self.cache = listed
        self.rv = rv
        self.relists += 1
        self._listed_at = time.monotonic()
        self.synced.set()

    async def _watch(self) -> bool:
        """Follow the watch until it fails, ends (False) or a resync is due (True). Only the wait for
        the next event is bounded by the resync, never the handling of one."""
        start = _rv_int(self.rv)
        stream = kube.watch(self.client, self.kind, self.rv or "0", self.namespace, self.watch_timeout)
        try:
            while True:
                left = self._listed_at + self.resync - time.monotonic() if self.resync > 0 else None
                try:
                    # asyncio.timeout, not wait_for: in Python 3.11 wait_for can swallow a cancellation
                    # that comes as the next event does, and then stop() would wait forever
                    async with asyncio.timeout(None if left is None else max(0.0, left)):
                        etype, obj = await anext(stream)
                except StopAsyncIteration:
                    return False
                except TimeoutError:
                    return True
                o = kube.to_dict(obj)
                rv = (o.get("metadata") or {}).get("resourceVersion")
                n = _rv_int(rv)
                if start is not None and n is not None and n < start:
                    raise VersionWentBack(f"{etype} at resourceVersion {rv}, below the {start} we watch from")
                if rv:
                    self.rv = rv
                if self.failures or self.error:
                    self.failures = 0
                    self._set_error(None)
                if etype == "BOOKMARK":
                    continue
                o.setdefault("apiVersion", self.kind.api_version)
                o.setdefault("kind", self.kind.kind)
                key = obj_key(o)
                if etype == "DELETED":
                    self.cache.pop(key, None)
                else:
                    self.cache[key] = seen(o)
                await self._emit(etype, o)
        finally:
            await stream.aclose()

    async def run(self) -> None:
        backoff = 0.1
        need_list, by_content = True, False
        while True:
            try:
                if need_list:
                    await self.relist(by_content)
                    need_list, by_content = False, False
                    self.failures = 0
                    self._set_error(None)
                need_list = await self._watch()  # True: a resync is due
                continue
            except asyncio.CancelledError:
                raise
            except VersionWentBack as exc:
                log.warning("%s: %s: the API server's storage was reset; listing again", self.kind.plural, exc)
                self.resets += 1
                need_list, by_content = True, True
                self._set_error("the API server's resourceVersions went back; listing again")
                continue
            except ApiError as exc:
                code = exc.status.code
                if code == 410:  # our resourceVersion was compacted away: list again
                    log.info("%s: 410 Gone, listing again", self.kind.plural)
                    need_list = True
                    continue
                if kube.too_large_resource_version(exc):
                    log.warning("%s: the API server has not reached our resourceVersion %s (%s): its storage "
                                "was reset; listing again", self.kind.plural, self.rv, exc.status.message)
                    self.resets += 1
                    need_list, by_content = True, True
                    self._set_error("the API server has not reached our resourceVersion; listing again")
                    continue
                log.warning("%s: API error %s on %s, retrying in %.1fs", self.kind.plural, code,
                            "list" if need_list else "watch", backoff)
                self._failed(f"{'list' if need_list else 'watch'} failed: HTTP {code}: {exc.status.message}", need_list)
                need_list = need_list or code == 404
            except (httpx.HTTPError, OSError) as exc:
                log.info("%s: stream ended (%s), resuming from %s in %.1fs", self.kind.plural,
                         type(exc).__name__, self.rv, backoff)
                self._failed(f"{'list' if need_list else 'watch'} failed: {type(exc).__name__}: {exc}", need_list)
            except Exception as exc:  # noqa: BLE001 - keep the informer alive whatever a decode does
                log.exception("%s: unexpected error", self.kind.plural)
                self._failed(f"unexpected error: {exc}", True)
                need_list = True
            self.reconnects += 1
            if self.metrics:
                self.metrics.errors.labels("watch").inc()
            try:
                async with asyncio.timeout(backoff * (1 + random.random() / 2)):
                    await self._kicked.wait()
            except TimeoutError:
                pass
            if self._kicked.is_set():  # the kind is back (its CRD created again): list at once
                self._kicked.clear()
                need_list, backoff = True, 0.1
                continue
            backoff = min(backoff * 2, 10.0)

    def tombstones(self) -> list[dict[str, Any]]:
        """A deletion for every object the informer knows (its kind is no longer served)."""
        return [tombstone(self.kind, key, rv) for key, (rv, _) in self.cache.items()]

    def kick(self) -> None:
        """Cut a failing informer's backoff short and list again (its resource may be served again)."""
        if self.failures:
            self._kicked.set()

    def _failed(self, why: str, listing: bool) -> None:
        self.failures += 1
        if self.metrics is not None and hasattr(self.metrics, "informer_failures"):
            self.metrics.informer_failures.labels(self.kind.plural, "list" if listing else "watch").inc()
        if listing or self.failures >= STUCK_AFTER:
            self._set_error(why)
