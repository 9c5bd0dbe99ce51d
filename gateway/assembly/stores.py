"""Builds the stores `[store] kind` names (the one place that knows the kinds): the task store and the
event log, opened before anything else starts and closed after everything else has stopped."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import assert_never
from urllib.parse import urlsplit

from aiohttp import web

from gateway.config import Config, StoreConfig
from gateway.events.log import EventLog, MemoryEventLog
from gateway.metrics import Metrics
from gateway.stores.memory import MemoryTaskStore
from gateway.stores.sqlite import SqliteDatabase
from gateway.stores.sqlite_log import SqliteEventLog
from gateway.stores.sqlite_tasks import SqliteTaskStore
from gateway.tasks.lease_store import LeaseStore
from gateway.tasks.registry import outcome_cap
from gateway.tasks.store import TaskStore

log = logging.getLogger("gateway")


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
    """The stores `[store] kind` names. StoreUnavailable when a durable store cannot be opened.
    `metrics` count what the stores find (a Redis data set reset)."""
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
        return Stores(SqliteTaskStore(database, cap, sqlite_log), sqlite_log, secret=database.secret)
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


def retain(stores: Stores, config: Config) -> None:
    """Bound the open stores by `[retention]` (a config reload; `build_stores` bounds them at start)."""
    retention = config.retention
    stores.log.retain(retention.max_events_per_task, retention.max_event_age_s)
    stores.tasks.retain(outcome_cap(retention), retention.terminal_retention_s)


def describe_store(store: StoreConfig) -> str:
    """The store's kind and place, for the start-up line (never a Redis password)."""
    if store.kind == "sqlite":
        return f"sqlite {Path(store.path).resolve()}"
    if store.kind == "redis":
        url = urlsplit(store.url)
        where = url.path if url.scheme == "unix" else f"{url.scheme}://{url.hostname}:{url.port or 6379}{url.path}"
        return f"redis {where} (key prefix {store.key_prefix!r})"
    return "memory (lost when the gateway stops)"


def open_stores(app: web.Application, config: Config, metrics: Metrics) -> Stores:
    """The stores, opened when the app starts and closed when it stops."""
    stores = build_stores(config, metrics)

    async def opened(_: web.Application) -> AsyncIterator[None]:
        await stores.open()
        yield
        await stores.close()

    app.cleanup_ctx.append(opened)
    return stores
