"""Builds the health of the gateway: `Readiness` (is each upstream usable), `StoreHealth` (can the task
store be used), /healthz (liveness: 200 while the process serves, draining too) and /readyz (200 only
while the replica is not draining (`gateway.drain`), the store is usable and the upstream is, or with
several upstreams, any or all of them: `[server] ready_when`). Started last and stopped first: the
gateway serves, for these routes, only while all else runs. Each upstream's readiness also gates its
own endpoint and the aggregate's view of its tools (`Health`, `wire_aggregate`)."""

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
from gateway.readiness import Readiness, ReadinessSet, StoreHealth, UpstreamState, unavailable_error, upstream_name
from gateway.sessions import SessionRegistry
from gateway.upstream.aggregate.link import AggregateUpstream


@dataclass(frozen=True, slots=True)
class Health:
    """Each upstream's readiness, by name, for the endpoints that refuse requests while theirs is down."""

    readiness: dict[str, Readiness]
    every: ReadinessSet
    single: Readiness | None
    """The one upstream's (`[upstream]`), whose /readyz body is its own as it always was."""
    config_digest: Callable[[], str | None] = lambda: None
    """The short hash of the config file in use, /readyz's `config` (None: no file, none shown)."""

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
    readiness = build_readiness(config, routes, metrics)
    every = ReadinessSet(list(readiness.values()), config.server.ready_when)
    health = Health(readiness, every, None if config.aggregating else next(iter(readiness.values())), config_digest)
    store_health = StoreHealth(lambda: stores.tasks.find("readyz-probe"), lambda: tasks[0].registry.writes.down)
    for each in tasks:
        each.service.store_failed = store_health.failed
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


def build_readiness(config: Config, routes: list[Route], metrics: Metrics) -> dict[str, Readiness]:
    """Each upstream's readiness, by name; the aggregate's view of their tools follows it."""
    readiness = {
        route.config.upstream.name: Readiness(
            route.upstream,
            upstream_name(route.config.upstream),
            route.config.upstream.readiness,
            config.server.initialize_timeout_s,
            metrics,
            name=route.config.upstream.name,
        )
        for route in routes
        if not isinstance(route.upstream, AggregateUpstream)
    }
    for route in routes:
        if isinstance(aggregate := route.upstream, AggregateUpstream):
            wire_aggregate(aggregate, readiness)
    return readiness


def wire_aggregate(aggregate: AggregateUpstream, readiness: dict[str, Readiness]) -> None:
    """The aggregate leaves out the tools of an upstream found unusable, and tells its clients each
    time one leaves or comes back (`list_changed`)."""
    aggregate.usable = lambda name: readiness[name].state.status != "unready"
    changes: set[asyncio.Future[None]] = set()

    def changed(name: str, _: UpstreamState) -> None:  # called in the readiness task: schedule, never wait
        future = asyncio.ensure_future(aggregate.upstream_changed(name))
        changes.add(future)
        future.add_done_callback(changes.discard)

    for each in readiness.values():
        each.on_change(changed)
