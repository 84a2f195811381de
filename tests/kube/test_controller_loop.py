"""The loop the controller, the webhook and the gateway share (controller/loop.py): one pass per
burst of events, none before every informer has listed, `busy` exactly while a pass runs."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Coroutine

from gwpolicy.controller.loop import SYNC_POLL, synced_bursts

WAIT = 5.0  # seconds at most for what must happen (a loaded machine is slow, never this slow)


class Process:
    """A watching process whose passes the test holds open until it lets them end."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.busy = False
        self.listed = True
        self.passes: list[bool] = []  # `busy` as each pass saw it
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def loop(self, debounce: float) -> None:
        async for _ in synced_bursts(self, debounce, lambda: self.listed):
            self.passes.append(self.busy)
            self.started.set()
            await self.release.wait()
            self.release.clear()

    async def next_pass(self) -> None:
        await asyncio.wait_for(self.started.wait(), WAIT)
        self.started.clear()

    async def end_pass(self) -> None:
        self.release.set()
        for _ in range(int(WAIT * 1000)):
            if not self.busy:
                return
            await asyncio.sleep(0.001)
        raise AssertionError("the pass did not end")


@contextlib.asynccontextmanager
async def running(coro: Coroutine[None, None, None]) -> AsyncIterator[asyncio.Task[None]]:
    """The coroutine as a task for the length of the block; cancelled and awaited after it."""
    task = asyncio.create_task(coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _run(debounce: float, script) -> Process:
    proc = Process()

    async def main() -> None:
        async with running(proc.loop(debounce)):
            await script(proc)

    asyncio.run(main())
    return proc


def test_a_burst_of_events_is_one_pass_and_busy_holds_only_during_it():
    async def script(proc: Process) -> None:
        for _ in range(50):  # fifty events inside the debounce window
            proc.wake.set()
            await asyncio.sleep(0)
        await proc.next_pass()
        assert proc.busy
        await proc.end_pass()
        assert not proc.busy
        await asyncio.sleep(0.1)  # no second pass comes of the same burst
        assert not proc.started.is_set()

    assert _run(0.05, script).passes == [True]


def test_no_pass_before_every_informer_has_listed():
    async def script(proc: Process) -> None:
        proc.listed = False
        proc.wake.set()
        await asyncio.sleep(0.01 + 5 * SYNC_POLL)
        assert proc.passes == [] and not proc.busy
        proc.listed = True
        await proc.next_pass()  # the loop looked again by itself
        await proc.end_pass()

    assert _run(0.01, script).passes == [True]


def test_a_change_during_a_pass_gets_a_pass_of_its_own():
    async def script(proc: Process) -> None:
        proc.wake.set()
        await proc.next_pass()
        proc.wake.set()  # an event while the pass runs
        await proc.end_pass()
        await proc.next_pass()
        await proc.end_pass()

    assert _run(0.01, script).passes == [True, True]
