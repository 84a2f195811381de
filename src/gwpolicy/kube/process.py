"""The shell of a long-running process that watches the API server (the controller, the gateway, the
webhook): what they share at the end of their life, in one order. Each process supplies what it
watches (its informers) and what it does (its tasks); the shell stops them the same way."""

from __future__ import annotations

import asyncio

from aiohttp import web
from lightkube import AsyncClient

from gwpolicy.kube import client as kube
from gwpolicy.kube.informer import Informer


async def shut_down(tasks: list[asyncio.Task], informers: list[Informer], runner: web.AppRunner | None,
                    client: AsyncClient | None) -> None:
    """The end of a process that watches (the controller, the gateway): its tasks cancelled and
    awaited, its informers stopped, its HTTP endpoints and API client closed."""
    for t in tasks:
        t.cancel()
    for i in informers:
        await i.stop()
    for t in tasks:
        try:
            await t
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping: a task's end is not news
            pass
    if runner:
        await runner.cleanup()
    if client:
        await kube.close_client(client)
