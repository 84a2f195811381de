"""The loop of every process that watches the cluster (the controller, the webhook, the gateway):
wait for a change, let the rest of its burst of watch events arrive, wait until every informer has
listed, then run one pass that brings the analysis up to date.

Written once so that the three cannot drift apart: a pass on a half-listed cluster would analyse
(and write status from) a cluster seen in part, and a pass per event would analyse a burst of a
thousand events a thousand times. Each process says only what its pass does.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, Protocol

#: seconds between looks at whether every informer has listed
SYNC_POLL = 0.05


class Watching(Protocol):
    """What the loop reads and sets on the process it runs for."""

    wake: asyncio.Event  # set by every event that may change the analysis
    busy: bool  # True while a pass runs (/statusz, `idle`, the tests and benchmarks wait on it)


async def synced_bursts(owner: Watching, debounce: float, synced: Callable[[], bool]) -> AsyncIterator[None]:
    """Yields once per pass, with `owner.busy` True until the caller asks for the next one.

    A pass starts `debounce` seconds after `owner.wake` is set (what arrives meanwhile is part of
    the same pass) and only once `synced()` holds; until then the loop looks again every SYNC_POLL
    seconds. A wake that comes during a pass starts the next one."""
    while True:
        await owner.wake.wait()
        await asyncio.sleep(debounce)  # gather a burst of events into one pass
        owner.wake.clear()
        if not synced():
            await asyncio.sleep(SYNC_POLL)
            owner.wake.set()
            continue
        owner.busy = True
        try:
            yield
        finally:
            owner.busy = False
