"""Composition root: builds the gateway's parts from a Config and runs them on an aiohttp server.

Besides the MCP endpoint it serves `/healthz` (liveness: 200 while the process serves), `/readyz`
(readiness: 200 only while the upstream is usable, see `gateway.readiness`) and `/metrics` (or, with
`[server] metrics_listen`, `/metrics` only on that address: `gateway.metrics_listener`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_never
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.log import server_logger

from gateway import __version__
from gateway.buffers import BufferBudget
from gateway.config import Config, ServerConfig, StoreConfig, parse_listen, url_host
from gateway.deadlines import RequestDeadlines
from gateway.edge.auth import EdgeAuth
from gateway.edge.connections import AcceptErrors, ConnectionCount, GuardedSite, raise_file_limit
from gateway.edge.endpoint import McpEndpoint
from gateway.edge.rejections import FramingErrors, Rejections
from gateway.edge.responder import json_response
from gateway.edge.tokens import OAuthTokens
from gateway.events.capture import Capture
from gateway.events.log import EventLog, MemoryEventLog
from gateway.metrics import CONTENT_TYPE, Metrics
from gateway.metrics_listener import metrics_listener
from gateway.protocol import jsonrpc
from gateway.readiness import Readiness, StoreHealth, upstream_name
from gateway.sessions import SessionRegistry
from gateway.stores.memory import MemoryTaskStore
from gateway.stores.sqlite import SqliteDatabase
from gateway.stores.sqlite_log import SqliteEventLog
from gateway.stores.sqlite_tasks import SqliteTaskStore
from gateway.tasks.hosted import HostedTasks
from gateway.tasks.lease_store import LeaseStore
from gateway.tasks.leases import OwnerLeases
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.registry import TaskRegistry, outcome_cap
from gateway.tasks.service import TaskService
from gateway.tasks.store import TaskStore
from gateway.tasks.takeover import take_over
from gateway.tls import tls_context
from gateway.upstream.base import Upstream
from gateway.upstream.credentials import ClientCredentials
from gateway.upstream.http import HttpUpstream
from gateway.upstream.stdio import StdioUpstream

log = logging.getLogger("gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REGISTRY = web.AppKey("registry", TaskRegistry)
"""The app's task registry, for embedding programs (benchmarks, the demo) that inspect it."""
CONNECTIONS = web.AppKey("connections", ConnectionCount)
"""The client connections `serve` holds against `[server] max_connections`."""
METRICS = web.AppKey("metrics", Metrics)
"""The app's metrics (`serve` counts accept errors in them)."""


def build_upstream(config: Config, metrics: Metrics, budget: BufferBudget) -> Upstream:
    upstream = config.upstream
    deadlines = RequestDeadlines(upstream, config.tasks, metrics)
    if upstream.url:
        credentials = ClientCredentials(upstream.auth, upstream.url) if upstream.auth.mode != "none" else None
        return HttpUpstream(upstream.url, upstream.http, metrics, budget, deadlines, credentials)
    if upstream.command:
        return StdioUpstream(upstream.command, upstream.stdio, metrics, budget, deadlines)
    raise ValueError("no upstream configured: set upstream.url or upstream.command (or --upstream-url/--upstream-cmd)")


@dataclass(frozen=True, slots=True)
class Stores:
    """Where task records and event logs live: one `[store] kind` provides both."""

    tasks: TaskStore
    log: EventLog
    check: Callable[[], Awaitable[list[str]]] | None = None
    """Reaches the store's server and returns warnings about its settings (None: nothing to reach)."""
    leases: LeaseStore | None = None
    """Shared stores (Redis): owner leases tell a dead owner from a live replica, and carry requests to
    the replica that runs a task. None: only this process uses the stores (memory; SQLite holds a lock
    on its file), so every task they hold unfinished at start-up was left by a process that is gone,
    and is taken over then."""
    secret: Callable[[str], Awaitable[bytes]] | None = None
    """A random secret kept in the store, drawn on first use (None: the store keeps nothing across a
    restart, and a key drawn by the process serves as well)."""

    async def open(self) -> None:
        """Check the store at start-up: fails if its server is unreachable, logs a warning per bad setting."""
        if self.check is not None:
            for warning in await self.check():
                log.warning(warning)

    async def close(self) -> None:
        await self.log.close()
        await self.tasks.close()


def build_stores(config: Config, metrics: Metrics | None = None) -> Stores:
    """The stores `[store] kind` names: the one place that knows the kinds. StoreUnavailable when
    a durable store cannot be opened. `metrics` count what the stores find (a Redis data set reset)."""
    retention = config.retention
    kind = config.store.kind
    cap = outcome_cap(retention)
    max_age = retention.max_event_age_s
    # A deleted log's tombstone keeps its next_seq as long as the task's record may still ask.
    tombstone_ttl = config.tasks.max_ttl_ms / 1000
    if kind == "memory":
        memory_log = MemoryEventLog(
            retention.max_events_per_task, max_event_age_s=max_age, tombstone_ttl_s=tombstone_ttl
        )
        return Stores(MemoryTaskStore(cap), memory_log)
    if kind == "sqlite":
        database = SqliteDatabase(config.store.path, config.store.synchronous)
        sqlite_log = SqliteEventLog(
            database, retention.max_events_per_task, max_event_age_s=max_age, tombstone_ttl_s=tombstone_ttl
        )
        return Stores(SqliteTaskStore(database, cap), sqlite_log, secret=database.secret)
    if kind == "redis":
        # Imported only when chosen: the redis client costs about 6 MiB of memory a gateway on another
        # store does not need.
        from gateway.stores.redis import RedisBackend, RedisEventLog, RedisTaskStore
        from gateway.stores.redis_leases import RedisLeases

        backend = RedisBackend(
            config.store.url,
            config.store.key_prefix,
            lease_ttl_s=config.store.lease_ttl_s,
            timeout_s=config.store.timeout_s,
            on_reset=metrics.store_resets.inc if metrics is not None else None,
        )
        redis_log = RedisEventLog(
            backend, retention.max_events_per_task, max_event_age_s=max_age, tombstone_ttl_s=tombstone_ttl
        )
        tasks = RedisTaskStore(backend, cap, terminal_retention_s=retention.terminal_retention_s)
        return Stores(tasks, redis_log, backend.check, leases=RedisLeases(backend), secret=backend.secret)
    assert_never(kind)


def describe_store(store: StoreConfig) -> str:
    """The store's kind and place, for the start-up line (never a Redis password)."""
    if store.kind == "sqlite":
        return f"sqlite {Path(store.path).resolve()}"
    if store.kind == "redis":
        url = urlsplit(store.url)
        where = url.path if url.scheme == "unix" else f"{url.scheme}://{url.hostname}:{url.port or 6379}{url.path}"
        return f"redis {where} (key prefix {store.key_prefix!r})"
    return "memory (lost when the gateway stops)"


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


def build_app(config: Config, upstream: Upstream | None = None) -> web.Application:
    metrics = Metrics()
    budget = BufferBudget(
        stream_messages=config.server.exchange_capacity,
        stream_bytes=config.server.stream_buffer_bytes,
        budget_bytes=config.server.buffered_bytes_budget,
        metrics=metrics,
    )
    upstream = upstream or build_upstream(config, metrics, budget)
    sessions = SessionRegistry(
        upstream,
        metrics,
        config.server.max_sessions,
        config.server.session_idle_timeout_s,
        budget,
        config.server.session_handshake_timeout_s,
        config.server.session_process_idle_s,
        config.server.resume,
    )
    stores = build_stores(config, metrics)
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    registry = TaskRegistry(
        config.tasks,
        config.retention,
        stores.tasks,
        stores.log,
        capture,
        metrics,
        record_events=config.events.enabled,
        outage=config.store,
    )
    hosted = HostedTasks(registry, config.tasks, config.retention, config.events.enabled)
    passthrough = Passthrough(registry, upstream, config.tasks, metrics)
    hosted.leases = stores.leases
    leases = OwnerLeases(stores.leases, registry, hosted, passthrough) if stores.leases is not None else None
    service = TaskService(
        hosted, passthrough, upstream, config.server, config.tasks, metrics, events_enabled=config.events.enabled
    )
    rejections = Rejections(metrics, config.logging.rejected_log_interval_s)
    tokens = OAuthTokens(config.auth) if config.auth.mode == "oauth" else None
    auth = EdgeAuth(config.auth, endpoint_url(config.server), tokens.validate if tokens is not None else None)
    endpoint = McpEndpoint(
        config.server,
        upstream,
        sessions,
        service,
        metrics,
        rejections,
        budget,
        auth,
        stream_write_timeout_s=config.tasks.stream_write_timeout_s,
    )
    metrics.tasks.set_function(lambda: len(registry))
    ceilings = {
        "server.max_sessions": config.server.max_sessions,
        "tasks.max_tasks_total": config.tasks.max_tasks_total,
        "tasks.max_streams_total": config.tasks.max_streams_total,
        "server.buffered_bytes_budget": config.server.buffered_bytes_budget,
        "server.max_connections": config.server.max_connections,
    }
    if isinstance(upstream, StdioUpstream):
        ceilings["upstream.stdio.max_processes"] = config.upstream.stdio.max_processes
    for limit, value in ceilings.items():
        metrics.limits.labels(limit=limit).set(value)
    app = web.Application(middlewares=[request_context], client_max_size=config.server.max_body_bytes + 1)
    app[REGISTRY] = registry
    app[CONNECTIONS] = ConnectionCount(config.server, metrics)
    app[METRICS] = metrics
    readiness = Readiness(
        upstream,
        upstream_name(config.upstream),
        config.upstream.readiness,
        config.server.initialize_timeout_s,
        metrics,
    )
    store_health = StoreHealth(lambda: stores.tasks.find("readyz-probe"), lambda: registry.writes.down)
    service.store_failed = store_health.failed
    serving = asyncio.Event()
    started = time.monotonic()

    async def healthz(_: web.Request) -> web.Response:
        body = {
            "status": "ok" if serving.is_set() else "stopping",
            "version": __version__,
            "uptime_s": round(time.monotonic() - started, 3),
            "upstream": readiness.state.status,
            "sessions": len(sessions),
            "tasks": len(registry),
        }
        return json_response(body, 200 if serving.is_set() else 503)

    async def readyz(_: web.Request) -> web.Response:
        state = readiness.state
        if not serving.is_set():
            return json_response({"status": "stopping"}, 503)
        if (problem := store_health.problem) is not None:
            return json_response({"status": "unready", "store": "down", "reason": problem}, 503)
        return json_response(state.body(), 200 if state.ready else 503)

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # aiohttp logs malformed HTTP with a traceback at error level: make it a counted, quiet warning.
    framing_errors = FramingErrors(rejections)

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        server_logger.addFilter(framing_errors)
        await stores.open()
        if auth.keeps_key_in_store and stores.secret is not None:
            # Callers must hash the same after a restart and on every replica, or their tasks are lost to them.
            auth.use_key(await stores.secret("principal_key"))
        await upstream.start()
        if leases is None:
            await registry.rebuild()
            await take_over(registry, passthrough)
        sessions.start()
        registry.start()
        if leases is not None:
            leases.start()
        readiness.start()
        store_health.start()
        serving.set()
        yield
        serving.clear()
        if leases is not None:
            await leases.stop()
        await readiness.stop()
        await store_health.stop()
        await registry.stop()
        await hosted.stop()
        await passthrough.stop()
        if leases is not None:  # its runs stopped: the other replicas take its tasks over at once
            await leases.hand_over()
        await sessions.stop()
        await upstream.close()
        await stores.close()
        server_logger.removeFilter(framing_errors)

    app.router.add_route("*", config.server.path, endpoint.handle)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if config.server.metrics_listen:
        # First: a metrics port in use stops the start before the upstream or the stores are opened.
        app.cleanup_ctx.append(metrics_listener(config.server.metrics_listen, metrics_handler))
    else:
        app.router.add_get("/metrics", metrics_handler)
    if auth.enabled:
        for path in auth.metadata_paths:
            app.router.add_get(path, auth.metadata)
    app.cleanup_ctx.append(lifecycle)
    if tokens is not None:
        app.on_startup.append(lambda _: tokens.start())
        app.on_cleanup.append(lambda _: tokens.close())
    return app


class ListenError(Exception):
    """The listen address cannot be bound (in use, not this host's, a privileged port)."""


LISTEN_BACKLOG = 128
"""aiohttp's own default backlog."""


async def bind_listeners(listen: str) -> list[socket.socket]:
    """Listening sockets on every address `listen`'s host resolves to, bound as asyncio's create_server
    binds them (SO_REUSEADDR, IPv6 only on IPv6, an address family this host lacks skipped); with port 0,
    the port drawn for the first serves all. Bound before anything else starts, so a port in use stops
    the start before the stores are opened or the upstream is started; a connection arriving meanwhile
    waits in the backlog until the gateway serves."""
    host, port = parse_listen(listen)
    try:
        addresses = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ListenError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    sockets: list[socket.socket] = []
    failure: OSError | None = None
    for family, kind, proto, _, address in dict.fromkeys(addresses):
        if port == 0 and sockets:
            address = (address[0], sockets[0].getsockname()[1], *address[2:])
        try:
            sockets.append(_listening_socket(family, kind, proto, address))
        except OSError as exc:
            failure = exc
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue  # this host lacks the family (an IPv6 "localhost" without IPv6), as asyncio skips it
            break
    if failure is not None and (not sockets or failure.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)):
        for sock in sockets:
            sock.close()
        hint = " (another gateway? stop it, or pass --listen HOST:PORT)" if failure.errno == errno.EADDRINUSE else ""
        raise ListenError(f"cannot listen on {listen}: {failure.strerror or failure}{hint}")
    return sockets


def _listening_socket(
    family: socket.AddressFamily, kind: socket.SocketKind, proto: int, address: tuple[Any, ...]
) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def endpoint_url(server: ServerConfig) -> str:
    """The MCP endpoint's URL as `[server] listen` names it (https when the gateway serves TLS itself)."""
    host, port = parse_listen(server.listen)
    return f"{'https' if server.tls_cert else 'http'}://{url_host(host)}:{port}{server.path}"


async def serve(config: Config, on_ready: Callable[[str], None] | None = None) -> None:
    """Run until cancelled (SIGINT/SIGTERM); `on_ready` gets the client URL once listening. ListenError
    when the listen address cannot be bound, before anything else has started."""
    tls = tls_context(config.server)
    sockets = await bind_listeners(config.server.listen)
    try:
        if (warning := raise_file_limit(config.server, config.upstream)) is not None:
            log.warning(warning)
        app = build_app(config)
        asyncio.get_running_loop().set_exception_handler(
            AcceptErrors(app[METRICS], config.logging.rejected_log_interval_s)
        )
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        # The header timeout is aiohttp's keep-alive timer (gateway.edge.connections says why), applied to
        # every connection before any handler or authentication runs; a TLS handshake gets as long.
        header_timeout = config.server.header_timeout_s
        handler_settings = {"access_log": None, "keepalive_timeout": header_timeout, "lingering_time": header_timeout}
        try:
            for sock in sockets:
                site = GuardedSite(
                    runner,
                    sock,
                    app[CONNECTIONS],
                    handler_settings,
                    ssl_handshake_timeout=header_timeout,
                    shutdown_timeout=2.0,
                    ssl_context=tls,
                )
                await site.start()
            host, _ = parse_listen(config.server.listen)
            port = sockets[0].getsockname()[1]  # the one drawn, for port 0
            url = f"{'https' if tls else 'http'}://{url_host(host)}:{port}{config.server.path}"
            # Listening, not necessarily usable: readiness logs the upstream's state on its own.
            log.info(
                "gateway listening",
                extra={
                    "url": url,
                    "auth": config.auth.mode,
                    "store": describe_store(config.store),
                    "upstream": upstream_name(config.upstream),
                },
            )
            if on_ready is not None:
                on_ready(url)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
    finally:
        for sock in sockets:
            sock.close()
