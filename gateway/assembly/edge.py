"""Builds the edge: the MCP endpoints (`[server] path`, and with several upstreams each one's
`/servers/NAME/mcp`, one route dispatching by name: `gateway.edge.servers`), the request context every
HTTP request runs in (an id for the logs, a span while tracing is on, an unexpected failure answered
as a JSON-RPC error), the client connection count, and the counting of refused requests, malformed
HTTP included."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from aiohttp.log import server_logger

from gateway import telemetry
from gateway.assembly.routes import SERVERS_PATH, Route
from gateway.assembly.tasks import Tasks
from gateway.buffers import BufferBudget
from gateway.config import Config
from gateway.drain import Drain
from gateway.edge.auth import EdgeAuth
from gateway.edge.connections import ConnectionCount
from gateway.edge.endpoint import EndpointScope, McpEndpoint
from gateway.edge.rejections import FramingErrors, Rejections
from gateway.edge.responder import json_response
from gateway.edge.servers import Handler, ServerPaths
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import ProtocolError
from gateway.sessions import SessionRegistry

log = logging.getLogger("gateway")

CONNECTIONS = web.AppKey("connections", ConnectionCount)
"""The client connections `serve` holds against `[server] max_connections`."""

MCP_PATHS = web.AppKey("mcp_paths", set[str])
"""The MCP endpoints' paths: the requests that get a span (probes and /metrics get none)."""

SERVER_PATHS = web.AppKey("server_paths", ServerPaths)
"""With several upstreams, each one's endpoint at `/servers/NAME/mcp`, by name."""


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give each HTTP request an id for the logs and (tracing on) a span, and turn an unexpected failure
    into a JSON-RPC error."""
    request_id = secrets.token_hex(6)
    started = time.perf_counter()
    traced = (
        telemetry.request_span(request.method, request.path, request.headers)
        if telemetry.active() and request.path in request.app[MCP_PATHS]
        else telemetry.UNTRACED
    )
    with traced:
        try:
            response = await handler(request)
        except web.HTTPException:
            raise
        except Exception:
            log.exception("request failed", extra={"request_id": request_id, "path": request.path})
            response = json_response(jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR, "Internal error"), 500)
        traced.respond(response.status)
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


def build_edge(app: web.Application, config: Config, metrics: Metrics) -> Rejections:
    """What every MCP endpoint shares: the client connection count, and malformed HTTP counted while
    the app runs; with several upstreams, the route to each one's endpoint. Returns the refusal counter
    the endpoints report to."""
    rejections = Rejections(metrics, config.logging.rejected_log_interval_s)
    app[CONNECTIONS] = ConnectionCount(config.server, metrics)
    app[MCP_PATHS] = set()
    if config.aggregating:
        paths = app[SERVER_PATHS] = ServerPaths()
        app.router.add_route("*", SERVERS_PATH, paths.handle)
    # aiohttp logs malformed HTTP with a traceback at error level: make it a counted, quiet warning.
    framing_errors = FramingErrors(rejections)

    async def quieted(_: web.Application) -> AsyncIterator[None]:
        server_logger.addFilter(framing_errors)
        yield
        server_logger.removeFilter(framing_errors)

    app.cleanup_ctx.append(quieted)
    return rejections


def build_endpoint(
    app: web.Application,
    route: Route,
    sessions: SessionRegistry,
    tasks: Tasks,
    auth: EdgeAuth,
    metrics: Metrics,
    rejections: Rejections,
    budget: BufferBudget,
    unavailable: Callable[[], ProtocolError | None],
    drain: Drain,
) -> McpEndpoint:
    """The MCP endpoint of `route`, built from its own config; `unavailable` refuses its requests while
    its upstream cannot serve, `drain` once the replica drains."""
    config = route.config
    # The aggregate's endpoint fronts several upstreams: its requests' spans name none.
    upstream = route.name or (None if config.aggregating else config.upstream.name)
    endpoint = McpEndpoint(
        config.server,
        route.upstream,
        sessions,
        tasks.service,
        metrics,
        rejections,
        budget,
        auth,
        stream_write_timeout_s=config.tasks.stream_write_timeout_s,
        scope=EndpointScope(
            route.name,
            config.auth,
            unavailable,
            drain,
            hands_down_caller=config.exchanges_caller_tokens,
            upstream=upstream,
        ),
    )
    if route.name is None:
        app.router.add_route("*", route.path, endpoint.handle)
    else:  # one of several upstreams: it may come and go with a config reload
        app[SERVER_PATHS].mount(route.name, endpoint.handle)
    app[MCP_PATHS].add(route.path)
    return endpoint
