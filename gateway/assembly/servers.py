"""Builds what a config reload does to the list of several upstreams (`[[upstreams]]`).

An added upstream gets what one has at start, from the same builders: its link and legacy sessions in
a group of their own (`gateway.assembly.parts`), its task service, its readiness, its endpoint at
`/servers/NAME/mcp`; then it joins the aggregate. A removed one leaves the aggregate, /readyz and its
path at once (new requests there get 404; the aggregate's sessions drop their sessions with it), while
its open legacy sessions drain: they go on until they end or are closed idle, and the tasks running on
it until they finish; then its link stops. An entry whose settings changed keeps its old ones until a
restart (`gateway.reload.served_upstreams`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from gateway.assembly.auth import Auth
from gateway.assembly.edge import MCP_PATHS, SERVER_PATHS, build_endpoint
from gateway.assembly.health import Health
from gateway.assembly.parts import Groups
from gateway.assembly.routes import Route, upstream_route
from gateway.assembly.sessions import build_sessions
from gateway.assembly.tasks import TaskCore, Tasks, build_tasks
from gateway.buffers import BufferBudget
from gateway.config import Config
from gateway.drain import Drain
from gateway.edge.endpoint import McpEndpoint
from gateway.edge.rejections import Rejections
from gateway.metrics import Metrics
from gateway.sessions import SessionRegistry
from gateway.upstream.aggregate.link import AggregateUpstream
from gateway.upstream.aggregate.naming import Names

log = logging.getLogger("gateway")

DRAINED_CHECK_S = 1.0
"""How often a removed upstream is checked for having drained (no session, no task running on it)."""


@dataclass(frozen=True, slots=True)
class Shared:
    """What every endpoint is built with besides its own config and upstream."""

    app: web.Application
    groups: Groups
    metrics: Metrics
    budget: BufferBudget
    core: TaskCore
    drain: Drain
    auth: Auth
    rejections: Rejections
    health: Health


@dataclass(frozen=True, slots=True)
class Server:
    """One upstream's own endpoint and what it is built from."""

    route: Route
    sessions: SessionRegistry


@dataclass(frozen=True, slots=True)
class Change:
    """A reload's change to the upstream list: the added upstreams built and started, the removed named."""

    config: Config
    added: list[Server]
    removed: list[str]


def build_servers(
    shared: Shared,
    routes: list[Route],
    sessions: dict[str | None, SessionRegistry],
    registries: list[SessionRegistry],
    tasks: dict[str | None, Tasks],
    endpoints: dict[str | None, McpEndpoint],
) -> Servers | None:
    """With several upstreams, what a reload changes the list with (see `Servers`); None with one."""
    if not isinstance(aggregate := routes[-1].upstream, AggregateUpstream):
        return None
    return Servers(shared, aggregate, routes, sessions, registries, tasks, endpoints)


class Servers:
    """The upstreams served now, and those removed that are still draining."""

    def __init__(
        self,
        shared: Shared,
        aggregate: AggregateUpstream,
        routes: list[Route],
        sessions: dict[str | None, SessionRegistry],
        registries: list[SessionRegistry],
        tasks: dict[str | None, Tasks],
        endpoints: dict[str | None, McpEndpoint],
    ) -> None:
        """`routes` (the page's endpoints), `registries` (/healthz's count), `tasks` (the task machinery's)
        and `endpoints` (what a reload reconfigures) are kept current as upstreams come and go."""
        self._shared = shared
        self._aggregate = aggregate
        self._routes = routes
        self._served = {route.name: Server(route, sessions[route.name]) for route in routes if route.name is not None}
        self._registries = registries
        self._tasks = tasks
        self._endpoints = endpoints
        self._draining: set[asyncio.Task[None]] = set()

        async def running(_: web.Application) -> AsyncIterator[None]:
            yield
            # A removed upstream still draining stops with the app (its group, after the task runs).
            for drain in list(self._draining):
                drain.cancel()
            await asyncio.gather(*self._draining, return_exceptions=True)

        shared.app.cleanup_ctx.append(running)

    async def prepare(self, config: Config) -> Change:
        """The added upstreams of `config` built and started (raises having changed nothing)."""
        shared = self._shared
        wanted = [upstream.name for upstream in config.upstreams]
        added: list[Server] = []
        try:
            for name in (name for name in wanted if name not in self._served):
                route = upstream_route(shared.app, config, name, shared.metrics, shared.budget)
                assert route.group is not None
                sessions = build_sessions(route.group, route.config, route.upstream, shared.metrics, shared.budget)
                await shared.groups.start(route.group)
                added.append(Server(route, sessions))
        except BaseException:
            for server in added:
                assert server.route.group is not None
                await shared.groups.stop(server.route.group)
            raise
        return Change(config, added, [name for name in self._served if name not in wanted])

    async def abandon(self, change: Change) -> None:
        """The reload failed after `prepare`: the added upstreams stop, unserved."""
        for server in change.added:
            assert server.route.group is not None
            await self._shared.groups.stop(server.route.group)

    async def commit(self, change: Change) -> None:
        """Serve the added upstreams and retire the removed ones; the aggregate follows."""
        shared = self._shared
        for server in change.added:
            route, name = server.route, server.route.name
            assert name is not None
            tasks = build_tasks(shared.core, route.config, route.upstream, shared.metrics, shared.drain.started)
            shared.health.add(route, change.config, shared.metrics)
            shared.health.serve(tasks)
            self._endpoints[name] = build_endpoint(
                shared.app,
                route,
                server.sessions,
                tasks,
                shared.auth.edge,
                shared.metrics,
                shared.rejections,
                shared.budget,
                shared.health.unavailable(name),
                shared.drain,
            )
            self._tasks[name] = tasks
            self._registries.append(server.sessions)
            self._routes.append(route)
            self._served[name] = server
            log.info("upstream added", extra={"upstream": name})
        names = self._aggregate.names  # as they were: the removed upstreams' aggregate tasks name them
        for name in change.removed:
            server = self._served.pop(name)
            shared.app[SERVER_PATHS].retire(name, server.sessions)
            del self._endpoints[name]
            self._routes.remove(server.route)
            await shared.health.remove(name)
            drain = asyncio.create_task(self._drain(server, self._tasks[name], names), name=f"drain-upstream-{name}")
            self._draining.add(drain)
            drain.add_done_callback(self._draining.discard)
        order = [upstream.name for upstream in change.config.upstreams]
        if tuple(order) != self._aggregate.names.upstreams:
            upstreams = {name: self._served[name].route.upstream for name in order}
            added = [name for name in order if any(server.route.name == name for server in change.added)]
            await self._aggregate.serve(upstreams, added + change.removed)

    async def _drain(self, server: Server, tasks: Tasks, names: Names) -> None:
        """Wait until the removed upstream has no session and runs no task, then stop it."""
        shared, name = self._shared, server.route.name
        assert name is not None and server.route.group is not None
        log.info("upstream removed; its sessions drain", extra={"upstream": name, "sessions": len(server.sessions)})
        while len(server.sessions) or shared.core.registry.runs_on(name, names.owner):  # noqa: ASYNC110 - no event says so
            await asyncio.sleep(DRAINED_CHECK_S)
        shared.app[SERVER_PATHS].forget(name, server.sessions)
        if name not in self._served:
            shared.app[MCP_PATHS].discard(server.route.path)
        self._registries.remove(server.sessions)
        if self._tasks.get(name) is tasks:
            del self._tasks[name]
        await tasks.passthrough.stop()
        await shared.groups.stop(server.route.group)
        log.info("removed upstream drained and stopped", extra={"upstream": name})
