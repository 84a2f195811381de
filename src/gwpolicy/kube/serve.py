"""(edge) Running one of gwpolicy's long-lived processes (`controller`, `webhook`, `gateway`): logging,
start, a line on stderr that says where it serves, SIGTERM/SIGINT, stop; an expected failure (no
kubeconfig, a busy port, no NGINX) is one `Error:` line and exit 1, never a traceback."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Callable, Protocol


class Server(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.DEBUG if verbose else logging.WARNING)


async def serve(server: Server, banner: Callable[[], str]) -> None:
    """Start, say where, wait for SIGTERM or SIGINT, stop (also when the start fails half-way)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        print(banner(), file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await server.stop()


def run(server: Server, banner: Callable[[], str], expected: tuple[type[BaseException], ...]) -> int:
    """`serve` in an event loop; 0 after a signal, 1 with `Error: ...` for an expected failure."""
    from lightkube.core.exceptions import ConfigError  # no kubeconfig, an unknown context, no service account

    try:
        asyncio.run(serve(server, banner))
    except KeyboardInterrupt:
        pass
    except (ConfigError, *expected) as exc:  # type: ignore[misc]  # mypy reads no star in an except tuple
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0
