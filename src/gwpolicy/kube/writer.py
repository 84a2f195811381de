"""The status writers of every process that writes status (the controller, the gateway, the mesh): a few
workers that take the next object to write from their owner's queues, write it, and go on.

Written once so that the two cannot drift apart. What it keeps for both:
- one object is written by one worker at a time (a second worker skips it while it is held: two
  writes of one object at once would race on its resourceVersion and the loser would 409);
- a write that raises is logged and counted, the object goes back to its owner's queue, and the
  worker lives on (one object's trouble never stops the writes of the others);
- a worker with nothing to do waits for its owner's event, looking again every IDLE_LOOK seconds at
  most (an owner may have work that no event announces: leadership won, the model fresh again);
- cancellation ends a waiting worker at once (asyncio.timeout: in Python 3.11 `wait_for` can
  swallow a cancellation that comes as the event does, and a process' stop() would then hang).
Each owner says only how it picks the next object and how it writes one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Generic, Hashable, Mapping, Optional, Tuple, TypeVar

log = logging.getLogger("gwpolicy.writer")

#: seconds a worker with nothing to do waits before it looks at its owner's queues again
IDLE_LOOK = 0.2
#: seconds a worker pauses after a write raised (the object is back in its owner's queue)
RETRY_AFTER = 0.2

#: what an owner names the objects it writes by (a Ref for both owners)
K = TypeVar("K", bound=Hashable)
#: the next write: the object (held while it is written) and the coroutine that writes it
Job = Tuple[K, Callable[[], Awaitable[None]]]


class StatusWriters(Generic[K]):
    """`start(n)` runs n workers. `take()` returns the next job, never one whose object is in
    `writing`, or None when there is nothing to write now; `requeue(ref)` puts back an object whose
    write raised; `failed()` counts such a write (the owner's metrics); `after()`, when given, runs
    after every write (the owner's queue gauges)."""

    def __init__(self, take: Callable[[], Optional[Job[K]]], requeue: Callable[[K], None],
                 failed: Callable[[], None], wake: asyncio.Event | None = None,
                 after: Callable[[], None] | None = None,
                 idle_look: float = IDLE_LOOK, retry_after: float = RETRY_AFTER) -> None:
        self.take, self.requeue, self.failed, self.after = take, requeue, failed, after
        self.wake = wake if wake is not None else asyncio.Event()  # the owner sets it when it queues
        self.writing: set[K] = set()  # objects a worker holds
        self.idle_look, self.retry_after = idle_look, retry_after

    @property
    def inflight(self) -> int:
        """Writes under way."""
        return len(self.writing)

    def start(self, workers: int, name: str = "write") -> list[asyncio.Task]:
        """The workers as tasks (at least one), each named `name` (the owner's stop() may look for it)."""
        return [asyncio.create_task(self.worker(), name=name) for _ in range(max(1, workers))]

    async def worker(self) -> None:
        while True:
            job = self.take()
            if job is None:
                self.wake.clear()
                try:
                    async with asyncio.timeout(self.idle_look):
                        await self.wake.wait()
                except TimeoutError:
                    pass
                continue
            ref, write = job
            self.writing.add(ref)
            try:
                await write()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the writer must outlive any one object's trouble
                log.exception("writing %s failed; it stays queued", ref)
                self.failed()
                self.requeue(ref)
                await asyncio.sleep(self.retry_after)
            finally:
                self.writing.discard(ref)  # its own next take() may pick `ref` again: no one waits for it
            if self.after is not None:
                self.after()


def desired_of(objects: Mapping[tuple[str, str, str, str], dict[str, Any]],
               wanted: Mapping[Any, Callable[[Any], Optional[dict[str, Any]]]], ref: Any) -> Optional[dict[str, Any]]:
    """The status the object `ref` (an engine Ref) should carry: its owner's function of the newest
    copy (`wanted[ref]`) applied to the copy in `objects` (keyed group, kind, namespace, name);
    None when either is missing."""
    from gwpolicy.engine.kinds import split_api_version
    from gwpolicy.engine.model import Obj

    raw = objects.get((ref.group, ref.kind, ref.namespace or "", ref.name))
    fn = wanted.get(ref)
    if raw is None or fn is None:
        return None
    return fn(Obj(raw, ref, split_api_version(str(raw.get("apiVersion", "")))[1], "api"))


def take_first(queue: dict[K, None], writing: set[K], write: Callable[[K], Awaitable[None]],
               depth: Callable[[int], None]) -> Optional[Job[K]]:
    """The next job of an owner with one ordered queue: its first object that no worker holds, taken
    out of the queue (`depth` is told the queue's new length), with `write` of it; None when none."""
    ref = next((r for r in queue if r not in writing), None)
    if ref is None:
        return None
    del queue[ref]
    depth(len(queue))
    return ref, lambda: write(ref)


async def patch_status_or_reread(client: Any, kind: Any, raw: dict[str, Any], want: dict[str, Any], manager: str,
                                 seen: Callable[[dict[str, Any]], Awaitable[None]]) -> str:
    """Bring `raw`'s status to `want` by a merge patch of its status subresource, with the
    resourceVersion it was computed from as a precondition, and give the object the server returns
    to `seen`. A 409 means another writer came in between: the object is read again and given to
    `seen`, which computes again from it (their entries survive). A 404 means it is gone. Returns
    "ok", "conflict" or "gone"; any other error raises (the worker puts the object back in its
    owner's queue)."""
    from lightkube import ApiError

    from gwpolicy.kube import client as kube

    meta = raw.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), meta.get("namespace") or None
    try:
        out = await kube.patch_status(client, kind, name, namespace, str(meta.get("resourceVersion") or ""),
                                      raw.get("status") or {}, want, manager)
    except ApiError as exc:
        if exc.status.code == 404:
            return "gone"
        if exc.status.code != 409:
            raise
        try:
            fresh = await kube.get_object(client, kind, name, namespace)
        except ApiError as again:
            if again.status.code == 404:
                return "gone"
            raise
        await seen(fresh)
        return "conflict"
    await seen(out)
    return "ok"
