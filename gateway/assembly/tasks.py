"""Builds the task machinery: capture, the task registry over the stores, hosted and pass-through
tasks, owner leases (shared stores only) and the task service the edge plans with.

At start-up, on stores only this process uses, it rebuilds the registry's counts and takes over the
tasks a previous process left unfinished; on stop it ends the local runs before the sessions and the
upstream close, then hands its leases over so other replicas take its tasks at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from gateway.assembly.stores import Stores
from gateway.config import Config
from gateway.events.capture import Capture
from gateway.metrics import Metrics
from gateway.tasks.hosted import HostedTasks
from gateway.tasks.leases import OwnerLeases
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.registry import TaskRegistry
from gateway.tasks.service import TaskService
from gateway.tasks.takeover import take_over
from gateway.upstream.base import Upstream

REGISTRY = web.AppKey("registry", TaskRegistry)
"""The app's task registry, for embedding programs (benchmarks, the demo) that inspect it."""


@dataclass(frozen=True, slots=True)
class Tasks:
    """The task parts other features use: the registry (counts, store health) and the service (the edge)."""

    registry: TaskRegistry
    service: TaskService


def build_tasks(app: web.Application, config: Config, stores: Stores, upstream: Upstream, metrics: Metrics) -> Tasks:
    events_enabled = config.events.enabled
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    registry = TaskRegistry(
        config.tasks,
        config.retention,
        stores.tasks,
        stores.log,
        capture,
        metrics,
        record_events=events_enabled,
        outage=config.store,
    )
    hosted = HostedTasks(registry, config.tasks, config.retention, events_enabled)
    passthrough = Passthrough(registry, upstream, config.tasks, metrics)
    hosted.leases = stores.leases
    leases = OwnerLeases(stores.leases, registry, hosted, passthrough) if stores.leases is not None else None
    service = TaskService(
        hosted, passthrough, upstream, config.server, config.tasks, metrics, events_enabled=events_enabled
    )
    metrics.tasks.set_function(lambda: len(registry))
    app[REGISTRY] = registry

    async def running(_: web.Application) -> AsyncIterator[None]:
        if leases is None:
            await registry.rebuild()
            await take_over(registry, passthrough)
        registry.start()
        if leases is not None:
            leases.start()
        yield
        if leases is not None:
            await leases.stop()
        await registry.stop()
        await hosted.stop()
        await passthrough.stop()
        if leases is not None:  # its runs stopped: the other replicas take its tasks over at once
            await leases.hand_over()

    app.cleanup_ctx.append(running)
    return Tasks(registry, service)
