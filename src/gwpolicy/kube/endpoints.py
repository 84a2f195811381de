"""(edge) The HTTP endpoints of every process that watches the cluster (the controller, the webhook,
the gateway): `/healthz`, `/metrics` and what else each serves (`/readyz`, `/statusz`) on one
HOST:PORT, and one clear error when that address cannot be listened on, never a traceback."""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ListenError(Exception):
    """The health and metrics address cannot be listened on."""


async def healthz(_: web.Request) -> web.Response:
    """Alive: the event loop answers."""
    return web.Response(text="ok")


def metrics(registry: CollectorRegistry) -> Handler:
    """The registry's metrics in the Prometheus text format."""
    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    return handler


async def serve_endpoints(listen: str, routes: dict[str, Handler], flag: str = "--listen") -> tuple[web.AppRunner, int]:
    """Serve GET `routes` (path -> handler) on `listen` (HOST:PORT; an IPv6 host in brackets, an empty
    one for every interface, port 0 for any free port): the runner to clean up and the port bound.
    ListenError, naming `flag`, when the address is malformed or cannot be bound."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    try:
        site = web.TCPSite(runner, host.strip("[]") or "0.0.0.0", int(port))
        await site.start()
    except ValueError as exc:
        await runner.cleanup()
        raise ListenError(f"{flag} {listen!r}: expected HOST:PORT with a numeric port") from exc
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(f"cannot listen on {listen} for {', '.join(routes)}: {exc.strerror or exc}; "
                          f"choose another address with {flag} HOST:PORT (port 0: any free port)") from exc
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
