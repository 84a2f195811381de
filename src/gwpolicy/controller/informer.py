"""Informers: list, then watch from the list's resourceVersion with bookmarks; resume after a dropped
stream from the last version seen; on 410 Gone list again and report what disappeared as deletions;
reconnect with exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, Awaitable, Callable

import httpx2 as httpx  # the HTTP client lightkube is built on
from lightkube import ApiError, AsyncClient

from gwpolicy.controller import kube
from gwpolicy.controller.kube import Kind

log = logging.getLogger("gwpolicy.informer")

Handler = Callable[[str, Kind, dict[str, Any]], Awaitable[None] | None]


def obj_key(o: dict[str, Any]) -> tuple[str, str]:
    m = o.get("metadata") or {}
    return (m.get("namespace") or "", m.get("name") or "")


class Informer:
    def __init__(self, client: AsyncClient, kind: Kind, handler: Handler, namespace: str | None = None,
                 metrics: Any = None, watch_timeout: int = 300) -> None:
        self.client = client
        self.kind = kind
        self.handler = handler
        self.namespace = (namespace or "*") if kind.namespaced else None  # "*": every namespace, in lightkube
        self.metrics = metrics
        self.watch_timeout = watch_timeout
        self.cache: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv: str | None = None
        self.synced = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.relists = 0
        self.reconnects = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"informer {self.kind.plural}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _emit(self, etype: str, obj: dict[str, Any]) -> None:
        if self.metrics:
            self.metrics.events.labels(self.kind.plural, etype).inc()
        out = self.handler(etype, self.kind, obj)
        if asyncio.iscoroutine(out):
            await out

    async def relist(self) -> None:
        """List everything; report changes against the cache, and deletions of what is gone."""
        items, rv = await kube.list_objects(self.client, self.kind, self.namespace)
        seen = {}
        for o in items:
            o.setdefault("apiVersion", self.kind.api_version)
            o.setdefault("kind", self.kind.kind)
            key = obj_key(o)
            seen[key] = o
            old = self.cache.get(key)
            if old is None:
                await self._emit("ADDED", o)
            elif (old.get("metadata") or {}).get("resourceVersion") != o["metadata"].get("resourceVersion"):
                await self._emit("MODIFIED", o)
        for key in [k for k in self.cache if k not in seen]:
            await self._emit("DELETED", self.cache[key])
        self.cache = seen
        self.rv = rv
        self.relists += 1
        self.synced.set()

    async def run(self) -> None:
        backoff = 0.1
        need_list = True
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                async for etype, obj in kube.watch(self.client, self.kind, self.rv or "0", self.namespace, self.watch_timeout):
                    o = kube.to_dict(obj)
                    rv = (o.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.rv = rv
                    if etype == "BOOKMARK":
                        continue
                    o.setdefault("apiVersion", self.kind.api_version)
                    o.setdefault("kind", self.kind.kind)
                    key = obj_key(o)
                    if etype == "DELETED":
                        self.cache.pop(key, None)
                    else:
                        self.cache[key] = o
                    await self._emit(etype, o)
                    backoff = 0.1
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.status.code == 410:  # our resourceVersion was compacted away: list again
                    log.info("%s: 410 Gone, listing again", self.kind.plural)
                    need_list = True
                    continue
                log.warning("%s: API error %s, retrying in %.1fs", self.kind.plural, exc.status.code, backoff)
                need_list = need_list or exc.status.code == 404
            except (httpx.HTTPError, OSError) as exc:
                log.info("%s: stream ended (%s), resuming from %s in %.1fs", self.kind.plural,
                         type(exc).__name__, self.rv, backoff)
            except Exception:  # noqa: BLE001 - keep the informer alive whatever a decode does
                log.exception("%s: unexpected error", self.kind.plural)
                need_list = True
            self.reconnects += 1
            if self.metrics:
                self.metrics.errors.labels("watch").inc()
            await asyncio.sleep(backoff * (1 + random.random() / 2))
            backoff = min(backoff * 2, 10.0)
