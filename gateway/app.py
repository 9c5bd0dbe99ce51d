"""Composition root: builds the gateway from a Config, feature by feature, and runs it on an aiohttp server.

`build_app` calls one builder per feature (`gateway.assembly`: metrics, telemetry, stores, auth, upstream, sessions,
tasks, edge, health, ui); each owns its parts, routes, start and stop. Besides the MCP endpoint the app
serves `/ui` (the task timeline page, `gateway.assembly.ui`), `/healthz` (liveness: 200 while the process
serves), `/readyz` (readiness: 200 only while the upstream is usable, see `gateway.readiness`) and
`/metrics` (or, with `[server] metrics_listen`, `/metrics` only on that address:
`gateway.metrics_listener`). `serve` binds the listeners and runs it, draining it after SIGTERM before
it stops (`gateway.drain`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.assembly.auth import build_auth
from gateway.assembly.edge import CONNECTIONS, build_edge, build_endpoint, request_context
from gateway.assembly.health import build_health
from gateway.assembly.metrics import METRICS, build_metrics
from gateway.assembly.parts import Groups
from gateway.assembly.reload import build_reload
from gateway.assembly.routes import build_routes
from gateway.assembly.servers import Shared, build_servers
from gateway.assembly.sessions import build_sessions
from gateway.assembly.stores import Stores, build_stores, describe_store, open_stores
from gateway.assembly.tasks import REGISTRY, build_task_core, build_tasks, run_tasks
from gateway.assembly.telemetry import build_telemetry
from gateway.assembly.ui import build_ui
from gateway.assembly.upstream import build_budget
from gateway.config import Config, parse_listen, url_host
from gateway.drain import Drain
from gateway.edge.connections import AcceptErrors, GuardedSite, raise_file_limit
from gateway.readiness import upstream_name
from gateway.reload import ConfigReloader
from gateway.tls import tls_context
from gateway.upstream.base import Upstream

log = logging.getLogger("gateway")

# What embedding programs (bench/, the demo), the CLI and the tests import from here.
__all__ = [
    "CONNECTIONS",
    "DRAIN",
    "METRICS",
    "REGISTRY",
    "ListenError",
    "Stores",
    "build_app",
    "build_stores",
    "serve",
]

DRAIN = web.AppKey("drain", Drain)
"""The app's drain: begun and waited for by `serve` after SIGTERM."""


def build_app(
    config: Config, upstream: Upstream | None = None, reloader: ConfigReloader | None = None
) -> web.Application:
    """The gateway as an aiohttp app: each feature's builder adds its parts, routes and cleanup context,
    in start-up order (`gateway.assembly` says what each owns). `upstream`: the one upstream to front,
    used as it is (embedding programs). `reloader`: the config file `config` was read from, reloaded on
    request (`gateway.assembly.reload`)."""
    app = web.Application(middlewares=[request_context], client_max_size=config.server.max_body_bytes + 1)
    admin: list[web.RouteDef] = []
    metrics = build_metrics(app, config, admin)
    build_telemetry(app, config)  # started before, and stopped after, everything that makes spans
    stores = open_stores(app, config, metrics)
    auth = build_auth(app, config, stores)
    budget = build_budget(config, metrics)
    groups = Groups(app)  # each of several upstreams' link and sessions: started and stopped here
    routes = build_routes(app, groups, config, metrics, budget, upstream)
    sessions = {
        route.name: build_sessions(route.group or app, route.config, route.upstream, metrics, budget)
        for route in routes
    }
    registries = list(sessions.values())
    drain = app[DRAIN] = Drain(config.server.drain_timeout_s)
    core = build_task_core(app, config, stores, metrics)
    tasks = {route.name: build_tasks(core, route.config, route.upstream, metrics, drain.started) for route in routes}
    run_tasks(app, core, stores, tasks)
    rejections = build_edge(app, config, metrics)
    digest = (lambda: reloader.current.digest) if reloader is not None else (lambda: None)
    health = build_health(app, config, routes, stores, registries, list(tasks.values()), metrics, drain, digest)
    endpoints = {
        route.name: build_endpoint(
            app,
            route,
            sessions[route.name],
            tasks[route.name],
            auth.edge,
            metrics,
            rejections,
            budget,
            health.unavailable(route.name),
            drain,
        )
        for route in routes
    }
    if reloader is not None:
        shared = Shared(app, groups, metrics, budget, core, drain, auth, rejections, health)
        servers = build_servers(shared, routes, sessions, registries, tasks, endpoints)
        build_reload(reloader, admin, metrics, auth, stores, core, endpoints, tasks, servers)
    build_ui(app, config, routes)
    return app


def upstreams_named(config: Config) -> dict[str, object]:
    """How the start-up line names the upstreams: `upstream` (one), or `upstreams` by name."""
    if not config.aggregating:
        return {"upstream": upstream_name(config.upstream)}
    return {"upstreams": {upstream.name: upstream_name(upstream) for upstream in config.upstreams}}


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


async def serve(
    config: Config,
    on_ready: Callable[[str], None] | None = None,
    reloader: ConfigReloader | None = None,
    drain_requested: asyncio.Event | None = None,
) -> None:
    """Run until cancelled (SIGINT, a second SIGTERM), or until `drain_requested` is set (SIGTERM) and the
    drain has settled (`gateway.drain`); `on_ready` gets the client URL once listening. ListenError when
    the listen address cannot be bound, before anything else has started. `reloader`: the config file
    `config` was read from, to reload on request (SIGHUP, POST /admin/reload)."""
    tls = tls_context(config.server)
    sockets = await bind_listeners(config.server.listen)
    try:
        if (warning := raise_file_limit(config.server, config.named_upstreams())) is not None:
            log.warning(warning)
        app = build_app(config, reloader=reloader)
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
                    **upstreams_named(config),
                },
            )
            if on_ready is not None:
                on_ready(url)
            await (drain_requested or asyncio.Event()).wait()
            await app[DRAIN].settle()
        finally:
            await runner.cleanup()
    finally:
        for sock in sockets:
            sock.close()
