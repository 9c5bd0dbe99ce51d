"""Builds the task machinery: capture, the task registry over the stores and hosted tasks, shared by
every endpoint (`build_task_core`); per endpoint, the pass-through watcher of its upstream's tasks and
the task service the edge plans with (`build_tasks`); owner leases (shared stores only) (`run_tasks`).

At start-up, on stores only this process uses, it rebuilds the registry's counts and takes over the
tasks a previous process left unfinished; on stop it ends the local runs before the sessions and the
upstream close, then hands its leases over so other replicas take its tasks at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from aiohttp import web

from gateway.assembly.stores import Stores
from gateway.config import Config
from gateway.events.capture import Capture
from gateway.metrics import Metrics
from gateway.principal import route_of
from gateway.tasks.hosted import HostedTasks
from gateway.tasks.leases import OwnerLeases
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.registry import Task, TaskRegistry
from gateway.tasks.service import TaskService
from gateway.tasks.takeover import take_over
from gateway.upstream.aggregate.link import AggregateUpstream
from gateway.upstream.base import Upstream

REGISTRY = web.AppKey("registry", TaskRegistry)
"""The app's task registry, for embedding programs (benchmarks, the demo) that inspect it."""


@dataclass(frozen=True, slots=True)
class TaskCore:
    """What every endpoint shares: one registry over the stores (one count of tasks, one sweeper) and
    the gateway-hosted tasks."""

    registry: TaskRegistry
    hosted: HostedTasks


@dataclass(frozen=True, slots=True)
class Tasks:
    """One endpoint's task parts: the shared registry (counts, store health), the service the endpoint
    plans with, and the watcher of the tasks its upstream hosts."""

    registry: TaskRegistry
    service: TaskService
    passthrough: Passthrough


def make_capture(config: Config) -> Capture:
    """What task events record (`[[rules]]`); made anew on a config reload."""
    return Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)


def build_task_core(app: web.Application, config: Config, stores: Stores, metrics: Metrics) -> TaskCore:
    capture = make_capture(config)
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
    hosted.leases = stores.leases
    metrics.tasks.set_function(lambda: len(registry))
    app[REGISTRY] = registry
    return TaskCore(registry, hosted)


def build_tasks(core: TaskCore, config: Config, upstream: Upstream, metrics: Metrics, draining: asyncio.Event) -> Tasks:
    """The task parts of one endpoint, from its own config (`Config.for_route`) and upstream; its hosted
    streams end when `draining` is set."""
    if isinstance(upstream, AggregateUpstream):  # the aggregate's tasks are each one upstream's tool's
        core.registry.upstream_of_tool = upstream.upstream_of
    passthrough = Passthrough(core.registry, upstream, config.tasks, metrics)
    service = TaskService(
        core.hosted,
        passthrough,
        upstream,
        config.server,
        config.tasks,
        metrics,
        events_enabled=config.events.enabled,
        draining=draining,
    )
    return Tasks(core.registry, service, passthrough)


def run_tasks(app: web.Application, core: TaskCore, stores: Stores, routes: Mapping[str | None, Tasks]) -> None:
    """Start the shared registry, taking over what a previous process left (each pass-through task by
    the watcher of the endpoint it was made on, `route_of` its owner), and stop every endpoint's runs."""
    registry, hosted = core.registry, core.hosted

    def passthrough_for(task: Task) -> Passthrough | None:
        tasks = routes.get(route_of(task.record.owner))
        return tasks.passthrough if tasks is not None else None

    leases = OwnerLeases(stores.leases, registry, hosted, passthrough_for) if stores.leases is not None else None

    async def running(_: web.Application) -> AsyncIterator[None]:
        if leases is None:
            await registry.rebuild()
            await take_over(registry, passthrough_for)
        registry.start()
        if leases is not None:
            leases.start()
        yield
        if leases is not None:
            await leases.stop()
        await registry.stop()
        await hosted.stop()
        for tasks in routes.values():
            await tasks.passthrough.stop()
        if leases is not None:  # its runs stopped: the other replicas take its tasks over at once
            await leases.hand_over()

    app.cleanup_ctx.append(running)
