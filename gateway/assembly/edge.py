"""Builds the edge: the MCP endpoint at `[server] path`, the request context every HTTP request runs in
(an id for the logs, an unexpected failure answered as a JSON-RPC error), the client connection count,
and the counting of refused requests, malformed HTTP included."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.log import server_logger

from gateway.assembly.tasks import Tasks
from gateway.buffers import BufferBudget
from gateway.config import Config
from gateway.edge.auth import EdgeAuth
from gateway.edge.connections import ConnectionCount
from gateway.edge.endpoint import McpEndpoint
from gateway.edge.rejections import FramingErrors, Rejections
from gateway.edge.responder import json_response
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.sessions import SessionRegistry
from gateway.upstream.base import Upstream

log = logging.getLogger("gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CONNECTIONS = web.AppKey("connections", ConnectionCount)
"""The client connections `serve` holds against `[server] max_connections`."""


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give each HTTP request an id for the logs, and turn an unexpected failure into a JSON-RPC error."""
    request_id = secrets.token_hex(6)
    started = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("request failed", extra={"request_id": request_id, "path": request.path})
        response = json_response(jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, "Internal error"), 500)
    if not response.prepared:
        response.headers["X-Request-Id"] = request_id
    log.debug(
        "http request",
        extra={
            "request_id": request_id,
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "ms": round((time.perf_counter() - started) * 1000, 2),
        },
    )
    return response


def build_edge(
    app: web.Application,
    config: Config,
    upstream: Upstream,
    sessions: SessionRegistry,
    tasks: Tasks,
    auth: EdgeAuth,
    metrics: Metrics,
    budget: BufferBudget,
) -> None:
    """The MCP endpoint routed, and malformed HTTP counted while the app runs."""
    rejections = Rejections(metrics, config.logging.rejected_log_interval_s)
    endpoint = McpEndpoint(
        config.server,
        upstream,
        sessions,
        tasks.service,
        metrics,
        rejections,
        budget,
        auth,
        stream_write_timeout_s=config.tasks.stream_write_timeout_s,
    )
    app.router.add_route("*", config.server.path, endpoint.handle)
    app[CONNECTIONS] = ConnectionCount(config.server, metrics)
    # aiohttp logs malformed HTTP with a traceback at error level: make it a counted, quiet warning.
    framing_errors = FramingErrors(rejections)

    async def quieted(_: web.Application) -> AsyncIterator[None]:
        server_logger.addFilter(framing_errors)
        yield
        server_logger.removeFilter(framing_errors)

    app.cleanup_ctx.append(quieted)
