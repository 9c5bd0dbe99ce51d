"""Builds the health of the gateway: `Readiness` (is the upstream usable), `StoreHealth` (can the task
store be used), /healthz (liveness: 200 while the process serves) and /readyz (200 only while both
are). Started last and stopped first: the gateway serves, for these routes, only while all else runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from aiohttp import web

from gateway import __version__
from gateway.assembly.stores import Stores
from gateway.assembly.tasks import Tasks
from gateway.config import Config
from gateway.edge.responder import json_response
from gateway.metrics import Metrics
from gateway.readiness import Readiness, StoreHealth, upstream_name
from gateway.sessions import SessionRegistry
from gateway.upstream.base import Upstream


def build_health(
    app: web.Application,
    config: Config,
    upstream: Upstream,
    stores: Stores,
    sessions: SessionRegistry,
    tasks: Tasks,
    metrics: Metrics,
) -> None:
    registry = tasks.registry
    readiness = Readiness(
        upstream, upstream_name(config.upstream), config.upstream.readiness, config.server.initialize_timeout_s, metrics
    )
    store_health = StoreHealth(lambda: stores.tasks.find("readyz-probe"), lambda: registry.writes.down)
    tasks.service.store_failed = store_health.failed
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

    async def checking(_: web.Application) -> AsyncIterator[None]:
        readiness.start()
        store_health.start()
        serving.set()
        yield
        serving.clear()
        await readiness.stop()
        await store_health.stop()

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.cleanup_ctx.append(checking)
