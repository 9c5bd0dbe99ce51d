"""/metrics on a listen address of its own (`[server] metrics_listen`): for a scraper on another network
than the MCP clients, so the main listener need not expose the gateway's metrics to them.

It owns that second listener only: plain HTTP, /metrics and the operator's admin routes (`POST
/admin/reload`: `gateway.assembly.reload`), never served on the main listener; bound when the app
starts (before anything else starts, so a port in use stops the gateway before it spawned an upstream)
and closed when it stops. What /metrics renders is `gateway.metrics`'s.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web

from gateway.config import parse_listen, url_host

log = logging.getLogger("gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CleanupContext = Callable[[web.Application], AsyncIterator[None]]


def metrics_listener(listen: str, handler: Handler, admin: Sequence[web.RouteDef] = ()) -> CleanupContext:
    """A cleanup context (`web.Application.cleanup_ctx`) serving `handler` at /metrics on `listen`, and
    the `admin` routes (read when it starts: routes added while the app is built are served)."""

    async def listening(_: web.Application) -> AsyncIterator[None]:
        host, port = parse_listen(listen)
        app = web.Application()
        app.router.add_get("/metrics", handler)
        app.router.add_routes(admin)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, shutdown_timeout=2.0).start()
        except OSError as exc:
            await runner.cleanup()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)  # asyncio's own text repeats the address
            raise OSError(exc.errno, f"cannot listen on {listen} ([server] metrics_listen): {reason}") from None
        bound = runner.addresses[0][1]  # the port given, or the one drawn for port 0
        log.info("metrics listening", extra={"url": f"http://{url_host(host)}:{bound}/metrics"})
        try:
            yield
        finally:
            await runner.cleanup()

    return listening
