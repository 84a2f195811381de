"""The status writers the controller and the gateway share (controller/writer.py): one worker per
object at a time, a failing write put back and the workers alive, a woken worker starts at once,
and cancellation ends them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from gwpolicy.controller.writer import StatusWriters

WAIT = 5.0  # seconds at most for what must happen (a loaded machine is slow, never this slow)
SLOW = 30.0  # an idle look and a retry pause the tests must never wait for


class Owner:
    """A process with one queue; `write` records what was written and holds each write open until
    the test lets it go (or raises for the objects in `broken`)."""

    def __init__(self, workers: int = 3) -> None:
        self.queue: dict[str, None] = {}
        self.written: list[str] = []
        self.active: dict[str, int] = {}  # object -> writes of it under way now
        self.most_at_once = 0
        self.broken: set[str] = set()
        self.failures = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.writers = StatusWriters(self.take, self.requeue, self.failed, idle_look=SLOW, retry_after=0.01)
        self.workers = workers

    def take(self) -> Any:
        ref = next((r for r in self.queue if r not in self.writers.writing), None)
        if ref is None:
            return None
        del self.queue[ref]
        return ref, lambda: self.write(ref)

    def requeue(self, ref: Any) -> None:
        self.queue[ref] = None

    def failed(self) -> None:
        self.failures += 1

    def put(self, *refs: str) -> None:
        self.queue.update(dict.fromkeys(refs))
        self.writers.wake.set()

    async def write(self, ref: str) -> None:
        self.active[ref] = self.active.get(ref, 0) + 1
        self.most_at_once = max(self.most_at_once, self.active[ref])
        try:
            await self.gate.wait()
            if ref in self.broken:
                self.broken.discard(ref)  # broken once
                raise RuntimeError(f"cannot write {ref}")
            self.written.append(ref)
        finally:
            self.active[ref] -= 1

    async def until(self, what) -> None:
        for _ in range(int(WAIT * 1000)):
            if what():
                return
            await asyncio.sleep(0.001)
        raise AssertionError(f"not reached: queue={self.queue} written={self.written} writing={self.writers.writing}")


def _run(script, workers: int = 3) -> Owner:
    async def main() -> Owner:
        owner = Owner(workers)
        tasks = owner.writers.start(workers)
        try:
            await script(owner)
        finally:
            for t in tasks:
                t.cancel()
            done, pending = await asyncio.wait(tasks, timeout=WAIT)
            assert not pending, "a cancelled worker did not end"
        return owner

    return asyncio.run(main())


def test_an_object_is_written_by_one_worker_at_a_time():
    async def script(owner: Owner) -> None:
        owner.gate.clear()
        owner.put("a")
        await owner.until(lambda: owner.writers.inflight == 1)
        owner.put("a", "b")  # "a" again while a worker holds it, and another object
        await owner.until(lambda: owner.writers.inflight == 2)  # "b" is taken, the second "a" waits
        assert owner.queue == {"a": None} and owner.writers.writing == {"a", "b"}
        owner.gate.set()
        # the second "a" is written once the first is done, long before the idle look (30 s)
        await owner.until(lambda: owner.written.count("a") == 2 and "b" in owner.written)

    owner = _run(script)
    assert owner.most_at_once == 1
    assert sorted(owner.written) == ["a", "a", "b"]


def test_a_failing_write_is_counted_put_back_and_the_workers_go_on(caplog: pytest.LogCaptureFixture):
    async def script(owner: Owner) -> None:
        owner.broken = {"bad"}
        owner.put("bad", "x", "y", "z")
        await owner.until(lambda: sorted(owner.written) == ["bad", "x", "y", "z"])

    with caplog.at_level(logging.ERROR, logger="gwpolicy.writer"):
        owner = _run(script, workers=1)  # one worker: it must survive the failure to write the rest
    assert owner.failures == 1
    assert owner.written.count("bad") == 1, "the failed object was written again, once"
    assert "writing bad failed" in caplog.text


def test_a_woken_worker_starts_at_once_not_at_its_next_look():
    async def script(owner: Owner) -> None:
        await asyncio.sleep(0.05)  # every worker waits now (their next look is 30 s away)
        owner.put("late")
        await owner.until(lambda: owner.written == ["late"])

    _run(script)


def test_nothing_to_take_means_no_write_and_no_spin():
    calls = 0

    async def script(owner: Owner) -> None:
        nonlocal calls
        take = owner.take

        def counting() -> Any:
            nonlocal calls
            calls += 1
            return take()

        owner.writers.take = counting
        owner.writers.wake.set()
        await asyncio.sleep(0.3)

    owner = _run(script)
    assert owner.written == []
    assert calls <= 2 * owner.workers, f"{calls} looks at an empty queue in 0.3 s: the workers spin"
