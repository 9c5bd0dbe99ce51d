"""Builds the health of the gateway: `Readiness` (is each upstream usable), `StoreHealth` (can the task
store be used), /healthz (liveness: 200 while the process serves, draining too) and /readyz (200 only
while the replica is not draining (`gateway.drain`), the store is usable and the upstream is, or with
several upstreams, any or all of them: `[server] ready_when`). Started last and stopped first: the
gateway serves, for these routes, only while all else runs. Each upstream's readiness also gates its
own endpoint and the aggregate's view of its tools (`Health`, `wire_aggregate`). A config reload adds
and removes upstreams here too (`Health.add`, `Health.remove`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.assembly.routes import Route
from gateway.assembly.stores import Stores
from gateway.assembly.tasks import Tasks
from gateway.config import Config
from gateway.drain import DRAINING, Drain
from gateway.edge.responder import json_response
from gateway.metrics import Metrics
from gateway.protocol.jsonrpc import ProtocolError
from gateway.readiness import (
    ChangeListener,
    Readiness,
    ReadinessSet,
    StoreHealth,
    UpstreamState,
    unavailable_error,
    upstream_name,
)
from gateway.sessions import SessionRegistry
from gateway.upstream.aggregate.link import AggregateUpstream


@dataclass(frozen=True, slots=True)
class Health:
    """Each upstream's readiness, by name, for the endpoints that refuse requests while theirs is down."""

    readiness: dict[str, Readiness]
    every: ReadinessSet
    single: Readiness | None
    """The one upstream's (`[upstream]`), whose /readyz body is its own as it always was."""
    store_health: StoreHealth
    config_digest: Callable[[], str | None] = lambda: None
    """The short hash of the config file in use, /readyz's `config` (None: no file, none shown)."""
    aggregate_listener: ChangeListener | None = None
    """What tells the aggregate an upstream's usability changed (`wire_aggregate`)."""

    def serve(self, *tasks: Tasks) -> None:
        """The endpoints' task services report the store failures they meet (/readyz's "store down")."""
        for each in tasks:
            each.service.store_failed = self.store_health.failed

    def add(self, route: Route, config: Config, metrics: Metrics) -> None:
        """Upstream `route` joins (a config reload added it): its readiness checked, the aggregate told
        of its changes."""
        readiness = self.readiness[route.config.upstream.name] = readiness_of(route, config, metrics)
        if self.aggregate_listener is not None:
            readiness.on_change(self.aggregate_listener)
        self.every.add(readiness)

    async def remove(self, name: str) -> None:
        """Upstream `name` is served no more (a config reload removed it): /readyz leaves it out, the
        aggregate finds it unusable, and its checks stop."""
        del self.readiness[name]
        await self.every.remove(name)

    def statuses(self) -> object:
        """/healthz's `upstream`: the one upstream's status, or each one's by name."""
        if self.single is not None:
            return self.single.state.status
        return {name: each.state.status for name, each in self.readiness.items()}

    def ready(self) -> tuple[dict[str, Any], bool]:
        """/readyz's body, and whether it says ready (any or all upstreams: `[server] ready_when`)."""
        if self.single is not None:
            body, ready = self.single.state.body(), self.single.state.ready
        else:
            body, ready = self.every.body(), self.every.ready
        if (digest := self.config_digest()) is not None:
            body = {**body, "config": digest}
        return body, ready

    def unavailable(self, route: str | None) -> Callable[[], ProtocolError | None]:
        """What the endpoint of `route` answers while its upstream is found unusable (a 503 naming it,
        as /readyz answers; before the first check ends it forwards, as the single endpoint does, and
        the link answers for an upstream that is down). The main endpoint is never refused here: the
        aggregate leaves an unusable upstream's tools out instead, and the single upstream's endpoint
        forwards as it always has."""
        if route is None or (readiness := self.readiness.get(route)) is None:
            return lambda: None
        name = route  # bound as a str for the closure

        def refusal() -> ProtocolError | None:
            state = readiness.state
            return unavailable_error(name, state) if state.status == "unready" else None

        return refusal


def build_health(
    app: web.Application,
    config: Config,
    routes: list[Route],
    stores: Stores,
    sessions: list[SessionRegistry],
    tasks: list[Tasks],
    metrics: Metrics,
    drain: Drain,
    config_digest: Callable[[], str | None] = lambda: None,
) -> Health:
    readiness, listener = build_readiness(config, routes, metrics)
    every = ReadinessSet(list(readiness.values()), config.server.ready_when)
    store_health = StoreHealth(lambda: stores.tasks.find("readyz-probe"), lambda: tasks[0].registry.writes.down)
    single = None if config.aggregating else next(iter(readiness.values()))
    health = Health(readiness, every, single, store_health, config_digest, listener)
    health.serve(*tasks)
    serving, started = asyncio.Event(), time.monotonic()

    async def healthz(_: web.Request) -> web.Response:
        body = {
            "status": (DRAINING if drain.draining else "ok") if serving.is_set() else "stopping",
            "version": __version__,
            "uptime_s": round(time.monotonic() - started, 3),
            "upstream": health.statuses(),
            "sessions": sum(len(each) for each in sessions),
            "tasks": len(tasks[0].registry),  # one registry, shared by every endpoint
        }
        return json_response(body, 200 if serving.is_set() else 503)

    async def readyz(_: web.Request) -> web.Response:
        if not serving.is_set():
            return json_response({"status": "stopping"}, 503)
        if (unready := drain.unready() or store_health.unready()) is not None:
            return json_response(unready, 503)
        body, ready = health.ready()
        return json_response(body, 200 if ready else 503)

    async def checking(_: web.Application) -> AsyncIterator[None]:
        every.start()
        store_health.start()
        serving.set()
        yield
        serving.clear()
        await every.stop()
        await store_health.stop()

    app.router.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    app.cleanup_ctx.append(checking)
    return health


def readiness_of(route: Route, config: Config, metrics: Metrics) -> Readiness:
    """The readiness of the upstream of `route` (not the aggregate's)."""
    upstream = route.config.upstream
    return Readiness(
        route.upstream,
        upstream_name(upstream),
        upstream.readiness,
        config.server.initialize_timeout_s,
        metrics,
        name=upstream.name,
    )


def build_readiness(
    config: Config, routes: list[Route], metrics: Metrics
) -> tuple[dict[str, Readiness], ChangeListener | None]:
    """Each upstream's readiness, by name; the aggregate's view of their tools follows it (through the
    listener returned)."""
    readiness = {
        route.config.upstream.name: readiness_of(route, config, metrics)
        for route in routes
        if not isinstance(route.upstream, AggregateUpstream)
    }
    listener = None
    for route in routes:
        if isinstance(aggregate := route.upstream, AggregateUpstream):
            listener = wire_aggregate(aggregate, readiness)
    return readiness, listener


def wire_aggregate(aggregate: AggregateUpstream, readiness: dict[str, Readiness]) -> ChangeListener:
    """The aggregate leaves out the tools of an upstream found unusable (or no longer served), and tells
    its clients each time one leaves or comes back (`list_changed`); returns what tells it."""
    aggregate.usable = lambda name: (each := readiness.get(name)) is not None and each.state.status != "unready"
    changes: set[asyncio.Future[None]] = set()

    def changed(name: str, _: UpstreamState) -> None:  # called in the readiness task: schedule, never wait
        future = asyncio.ensure_future(aggregate.upstream_changed(name))
        changes.add(future)
        future.add_done_callback(changes.discard)

    for each in readiness.values():
        each.on_change(changed)
    return changed
