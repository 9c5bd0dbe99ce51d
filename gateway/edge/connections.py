"""Client connections, before any request handler (or authentication) runs: how many are held, how long
a request head may take, what a malformed request is told, and the file limit they need.

aiohttp's server has no header timeout of its own, but its keep-alive timer is one once set short: it
runs from the moment a connection opens and again after each response, and closes the connection
if, when it fires, no whole request head has been parsed (a half-sent head leaves the connection
waiting exactly as an idle one does, and the timer does not touch a request being handled). So
`[server] header_timeout_s` is aiohttp's `keepalive_timeout`, which also bounds an idle keep-alive
connection, and its `lingering_time`, how long the unread body of a refused request is drained. The
body the gateway reads has its minimum rate in `gateway.edge.endpoint`.

`GuardedRequestHandler` is aiohttp's per-connection protocol with two changes: a connection beyond
`[server] max_connections` is answered 503 and closed before it is read, and the 400 for malformed
HTTP says what was wrong without aiohttp's quote of the offending bytes (which can be a credential).
`GuardedSite` listens with it. `AcceptErrors` keeps the event loop's "socket.accept() out of system
resource" (logged with a traceback every second while file descriptors run out) to a counted,
rate-limited warning. `raise_file_limit` checks the open-file limit at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.config import ServerConfig, UpstreamConfig
from gateway.edge.rejections import RateLimitedLog, describe_malformed
from gateway.metrics import Metrics
from gateway.protocol.jsonrpc import Overloaded

log = logging.getLogger("gateway.edge.connections")

LIMIT_KEY = "server.max_connections"
FILES_RESERVED = 64
"""Open files the gateway needs besides client connections and upstream pipes or sockets: its
listeners, stores, logs, the JWKS and introspection clients."""
ACCEPT_FAILED = "socket.accept() out of system resource"
"""The event loop's message when accepting a connection fails for want of file descriptors or memory."""


class ConnectionCount:
    """The client connections held now, against `[server] max_connections`; the refusal they get beyond it."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.max_connections = config.max_connections
        self.held = 0
        self._metrics = metrics
        body = orjson.dumps(Overloaded(LIMIT_KEY, "too many open connections", "retry later").to_message())
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Retry-After: {config.retry_after_s}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.refusal = head.encode() + body
        metrics.connections.set_function(lambda: self.held)

    def refused(self) -> None:
        self._metrics.rejected.labels(limit=LIMIT_KEY).inc()


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's protocol for one client connection, counted against `max_connections`, and answering
    malformed HTTP without quoting it."""

    def __init__(self, count: ConnectionCount, manager: web.Server, **settings: Any) -> None:
        super().__init__(manager, loop=asyncio.get_running_loop(), **settings)
        self._count = count
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._count.held >= self._count.max_connections:
            # Refused before anything is read or any task started; the file descriptor is freed at once.
            self._count.refused()
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(self._count.refusal)
            transport.close()
            return
        self._count.held += 1
        self._counted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._count.held -= 1
            self._counted = False
        super().connection_lost(exc)

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if isinstance(exc, HttpProcessingError):
            # aiohttp's own text quotes the offending line: part of an Authorization header, say.
            message = f"Bad Request: {describe_malformed(exc)}"
        return super().handle_error(request, status, exc, message)


class GuardedSite(web.SockSite):
    """A listener on a bound socket whose connections are `GuardedRequestHandler`s with `handler_settings`
    (aiohttp's per-connection settings: `keepalive_timeout`, `lingering_time`, `access_log`, ...)."""

    def __init__(
        self,
        runner: web.AppRunner,
        sock: socket.socket,
        count: ConnectionCount,
        handler_settings: dict[str, Any],
        *,
        ssl_handshake_timeout: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(runner, sock, **options)
        self._count = count
        self._handler_settings = handler_settings
        self._ssl_handshake_timeout = ssl_handshake_timeout

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner, as SockSite.start does
        server = self._runner.server
        assert server is not None

        def connection() -> GuardedRequestHandler:
            return GuardedRequestHandler(self._count, server, **self._handler_settings)

        self._server = await asyncio.get_running_loop().create_server(
            connection,
            sock=self._sock,
            ssl=self._ssl_context,
            backlog=self._backlog,
            ssl_handshake_timeout=self._ssl_handshake_timeout if self._ssl_context else None,
        )


class AcceptErrors:
    """The event loop's exception handler: failed accepts are counted and logged at most once per
    `interval_s`, without a traceback; everything else goes to the default handler."""

    def __init__(self, metrics: Metrics, interval_s: float) -> None:
        self._metrics = metrics
        self._log = RateLimitedLog(log, interval_s)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != ACCEPT_FAILED:
            loop.default_exception_handler(context)
            return
        self._metrics.accept_errors.inc()
        self._log.log(
            logging.WARNING,
            "accept",
            f"could not accept a connection: {context.get('exception')!s}; lower [server] max_connections below "
            "the open-file limit, or raise the limit (accepting resumes within a second)",
        )


def raise_file_limit(server: ServerConfig, upstreams: Iterable[UpstreamConfig]) -> str | None:
    """Make the open-file soft limit hold `max_connections` and what the gateway needs besides, for
    every upstream (raising it toward the hard limit if needed); a warning when even the hard limit
    cannot, else None."""
    upstream_files = sum(
        3 * upstream.stdio.max_processes if upstream.command else upstream.http.max_connections
        for upstream in upstreams
    )
    needed = server.max_connections + upstream_files + FILES_RESERVED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        return (
            f"the open-file limit ({soft}, hard {hard}) cannot hold [server] max_connections = "
            f"{server.max_connections} plus {needed - server.max_connections} files for the upstream and the "
            f"gateway itself: lower max_connections to {max(soft - (needed - server.max_connections), 1)} "
            "or raise the limit (ulimit -n, LimitNOFILE=)"
        )
    return None
