"""Keeping EffectivePolicy objects (`--effective-policy-objects`) equal to the analysis, with the
breadcrumbs' discipline: after policy status, paced by the same --breadcrumb-qps budget, a write only
when the content changes, owner references to the targets (deleting the last target deletes it), a
delete when no policy affects the object any more, and never a touch of another controller's object.

Their own informer feeds them here, not into the model: they are our output, never the analysis' input.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lightkube import ApiError

from gwpolicy.engine import effectiveobjects as eo
from gwpolicy.kube import client as kube
from gwpolicy.kube.client import Kind
from gwpolicy.kube.informer import Informer

log = logging.getLogger("gwpolicy.effectivepolicies")
KIND = Kind(eo.GROUP, eo.VERSION, eo.KIND, eo.PLURAL, True, False)


class EffectivePolicySync:
    def __init__(self, controller: Any, home_namespace: str) -> None:
        self.c = controller  # the Controller: client, model, options, pacing, leadership
        self.home = home_namespace
        self.live: dict[eo.Key, dict[str, Any]] = {}
        self.prints: dict[eo.Key, tuple] = {}
        self.owners: dict[eo.Key, list] = {}
        self.queue: dict[eo.Key, None] = {}
        self.wake = asyncio.Event()
        self.writes = 0
        self.informer: Informer | None = None
        self.task: asyncio.Task | None = None

    # ---------- what should be ----------
    def refresh(self) -> None:
        """After an analysis pass: queue the places whose document changes (compared by the identity of
        the shared results on every path, not by building every document)."""
        a = self.c.model.analysis
        if a is None:
            return
        by_key = eo.owners_by_key(a, self.home)
        for key, owners in by_key.items():
            fp = eo.fingerprint(a, owners)
            if self.prints.get(key) != fp:
                self.prints[key] = fp
                self.queue[key] = None
        for key in [k for k in self.prints if k not in by_key]:
            del self.prints[key]
            self.queue[key] = None
        for key, obj in self.live.items():  # ours, left from before, and no longer wanted
            if key not in by_key and eo.ours(obj, self.c.opts.controller_name):
                self.queue[key] = None
        self.owners = by_key
        if self.queue:
            self.wake.set()

    async def on_event(self, etype: str, kind: Kind, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        if etype == "DELETED":
            self.live.pop(key, None)
            if key in self.owners:  # someone deleted one we want: write it again
                self.prints.pop(key, None)
                self.queue[key] = None
                self.wake.set()
            return
        meta.pop("managedFields", None)
        self.live[key] = raw

    # ---------- writing ----------
    async def run(self) -> None:
        while True:
            if not self.queue or not self.c.leading or self.c.model.stale or self.c.high:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), 0.2)
                except asyncio.TimeoutError:
                    pass
                continue
            key = next(iter(self.queue))
            del self.queue[key]
            try:
                await self.sync(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one object's trouble must not stop the others
                log.exception("writing EffectivePolicy %s/%s failed; it stays queued", *key)
                self.queue[key] = None
                await asyncio.sleep(0.5)

    async def sync(self, key: eo.Key) -> None:
        a = self.c.model.analysis
        client = self.c.client
        if a is None or client is None:
            return
        controller = self.c.opts.controller_name
        live = self.live.get(key)
        if live is not None and not eo.ours(live, controller):
            return  # another controller's: never touched
        owners = self.owners.get(key)
        want = eo.document(a, key, owners, controller) if owners else None
        if want is not None and not want["spec"]["targets"]:
            want = None
        ns, name = key
        res = kube.resource_class(KIND)
        if want is None:
            if live is None:
                return
            await self.c._pace()  # the breadcrumbs' --breadcrumb-qps schedule, shared
            try:
                await client.delete(res, name, namespace=ns)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
            self.writes += 1
            self.c.metrics.writes.labels("effectivepolicy", "ok").inc()
            return
        if live is not None and eo.same_content(live, want):
            return
        await self.c._pace()  # the breadcrumbs' --breadcrumb-qps schedule, shared
        try:
            out = kube.to_dict(await client.patch(res, name, want, namespace=ns, patch_type=kube.PatchType.APPLY,
                                                  field_manager=self.c.opts.field_manager, force=True))
        except ApiError as exc:
            if exc.status.code == 404:  # its namespace is going away
                return
            raise
        self.writes += 1
        self.c.metrics.writes.labels("effectivepolicy", "ok").inc()
        out.get("metadata", {}).pop("managedFields", None)
        self.live[key] = out

    # ---------- lifecycle ----------
    def start(self) -> None:
        assert self.c.client is not None
        self.informer = Informer(self.c.client, KIND, self.on_event, None, self.c.metrics)
        self.informer.start()
        self.task = asyncio.create_task(self.run(), name="effectivepolicies")

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
        if self.informer:
            await self.informer.stop()
