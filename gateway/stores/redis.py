"""The Redis Streams stores (`[store] kind = "redis"`): task records and event logs shared by replicas.

One `RedisBackend` (a connection pool, the scripts, the append pipeline and one pub/sub connection)
serves a `RedisTaskStore` and a `RedisEventLog`. Per task, a hash and a stream share the `{t:<id>}` hash
tag, so every per-task operation is one Lua script (`gateway.stores.redis_scripts`), also on Redis
Cluster; an owner's index and counter share `{o:<owner>}`; one sorted set orders records by expiry.

- Appends are one script each (the log exists or is created, not sealed or deleted; with a writer's
  epoch, the task exists and the epoch matches: a fenced writer is refused), `XADD … MAXLEN ~` with the
  id `0-(seq+1)`, then a wake-up `PUBLISH`. The appends of one loop tick go in one pipeline.
- Reads are one script: drop head entries older than the age, then `XRANGE 0-(start+1) + COUNT n` from
  the first retained seq, computed from the data and `next_seq` in the hash (never from a stream that may
  have expired), then a contiguity check here.
- `wait` subscribes this store's pub/sub connection to the task's channel while local waiters exist, and
  reads the hash on every wake-up, on a safety poll every `safety_poll_s` and after a reconnect: a lost
  wake-up costs latency, never an event.
- Terminal retention: the update to a terminal status gives the hash and the stream one expiry; a
  deleted log's hash is its tombstone (`next_seq` kept) for `tombstone_ttl_s`.

The epoch API (`RedisTaskStore.epoch`, `bump_epoch`; `RedisEventLog.append(epoch=…)`) is what owner
leases build on: a takeover bumps the epoch, and the former owner's appends are refused from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.events.log import DEFAULT_TOMBSTONE_TTL_S, EventLog, LogBounds, LogSealed, StoredEvent
from gateway.stores import redis_scripts as lua
from gateway.tasks.records import TaskRecord, TaskStatus
from gateway.tasks.store import InvalidCursor, TaskExists, TaskPage, TaskStore

__all__ = ["RedisBackend", "RedisEventLog", "RedisTaskStore", "StoreUnavailable", "TaskGone", "WriterFenced"]

log = logging.getLogger("gateway.stores.redis")

SAFETY_POLL_S = 3.0
"""How often a waiter reads its task's hash without a wake-up: the most a lost wake-up can cost."""
SWEEP_GRACE_S = 60.0
"""How long past a terminal task's retention Redis keeps its keys, so that a replica's sweep hands the
record to its registry before Redis drops it (after the retention the id already reads as unknown)."""
RECONNECT_DELAY_S = 0.2
MAX_CONNECTIONS = 32
RETRIES = 5
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)
"""What an unreachable or restarting server raises."""
_IMMUTABLE = ("id", "owner", "tool", "dialect", "ttl_ms", "poll_interval_ms", "created_at", "expires_at", "upstream")
"""The record fields that never change after create: stored together as JSON (`rec`)."""
_OWNER_AND_RECORD = ["owner", *lua.RECORD_FIELDS]


class StoreUnavailable(OSError):
    """The Redis server cannot be reached (at start-up, or by `check-config --connect`)."""


class WriterFenced(LogSealed):
    """An append with an epoch the task has moved past: another replica owns the task now."""


class TaskGone(LogSealed):
    """A fenced append to a task whose record does not exist (never did, or expired)."""


_ERRORS: dict[str, type[LogSealed]] = {
    "FENCED": WriterFenced,
    "TASK_GONE": TaskGone,
    "LOG_SEALED": LogSealed,
    "LOG_DELETED": LogSealed,
}


def _mapped(error: BaseException) -> BaseException:
    """A script's error reply as the exception the interfaces promise."""
    if isinstance(error, ResponseError):
        code, _, message = str(error).partition(" ")
        kind = _ERRORS.get(code)
        if kind is not None:
            return kind(message)
    return error


def _raise_if_cancelled() -> None:
    """Re-raise a cancellation redis-py swallowed: a command cancelled on a pooled connection can complete
    and return normally (redis-py 8.1), and a reader must not outlive its cancelled caller (checked on the
    paths a `tasks/stream` reader loops on: read, bounds, wait)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _text(value: str | bytes | None) -> str:
    return value.decode() if isinstance(value, bytes) else value or ""


def _optional(value: str | bytes | None) -> str | bytes:
    """How the scripts take an optional value: `+value`, or `-` for none."""
    if value is None:
        return "-"
    return b"+" + value if isinstance(value, bytes) else "+" + value


@dataclass(frozen=True, slots=True)
class RedisKeys:
    """The key layout under one prefix."""

    prefix: str

    def task(self, task_id: str) -> tuple[str, str]:
        """The task's hash and stream (one hash tag)."""
        base = f"{self.prefix}{{t:{task_id}}}"
        return base + ":h", base + ":s"

    def acks(self, task_id: str) -> str:
        """The answers of the task's appends in the last pipeline (what makes a retried pipeline safe)."""
        return f"{self.prefix}{{t:{task_id}}}:a"

    def channel(self, task_id: str) -> str:
        return f"{self.prefix}{{t:{task_id}}}:w"

    def owned(self, owner: str) -> tuple[str, str]:
        """The owner's index (task ids scored by creation number) and its counter."""
        base = f"{self.prefix}{{o:{owner}}}"
        return base + ":i", base + ":n"

    @property
    def expiry(self) -> str:
        return self.prefix + "expiry"


class _Scripts:
    """The scripts, registered on one client (redis-py reloads one the server has forgotten)."""

    def __init__(self, client: aioredis.Redis) -> None:
        def register(source: str) -> AsyncScript:
            return client.register_script(source)

        self.create_record = register(lua.CREATE_RECORD)
        self.index_owned = register(lua.INDEX_OWNED)
        self.update_status = register(lua.UPDATE_STATUS)
        self.replace_outcome = register(lua.REPLACE_OUTCOME)
        self.advance_next_seq = register(lua.ADVANCE_NEXT_SEQ)
        self.drop_record = register(lua.DROP_RECORD)
        self.bump_epoch = register(lua.BUMP_EPOCH)
        self.append = register(lua.APPEND)
        self.create_log = register(lua.CREATE_LOG)
        self.seal = register(lua.SEAL)
        self.bounds = register(lua.BOUNDS)
        self.read = register(lua.READ)
        self.delete_log = register(lua.DELETE_LOG)


@dataclass(slots=True)
class _Pending:
    keys: list[str]
    args: list[Any]
    done: asyncio.Future[Any]


class _AppendPipeline:
    """Sends the appends queued during one loop tick as one pipeline; while one is in flight, the next
    batch gathers (one pipeline at a time, so a task's appends reach Redis in the order they were made)."""

    def __init__(self, client: aioredis.Redis, script: AsyncScript) -> None:
        self._client = client
        self._script = script
        self._queue: list[_Pending] = []
        self._sender: asyncio.Task[None] | None = None

    async def run(self, keys: list[str], args: list[Any]) -> Any:
        pending = _Pending(keys, args, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send())
        return await pending.done

    async def _send(self) -> None:
        try:
            while self._queue:
                await asyncio.sleep(0)  # let the rest of this tick queue up
                batch, self._queue = self._queue, []
                await self._send_batch(batch)
        finally:
            self._sender = None

    async def _send_batch(self, batch: list[_Pending]) -> None:
        try:
            results = await self._execute(batch)
            if any(isinstance(result, NoScriptError) for result in results):  # the server restarted
                await self._client.script_load(self._script.script)
                results = await self._execute(batch)
        except Exception as error:  # the whole pipeline failed (connection lost): every caller learns it
            results = [error] * len(batch)
        for pending, result in zip(batch, results, strict=True):
            if pending.done.done():
                continue
            if isinstance(result, BaseException):
                pending.done.set_exception(_mapped(result))
            else:
                pending.done.set_result(result)

    async def _execute(self, batch: list[_Pending]) -> list[Any]:
        pipe: Pipeline = self._client.pipeline(transaction=False)
        sha = self._script.sha
        batch_id = secrets.token_hex(8)  # with the index, what a retried pipeline's appends are known by
        for index, pending in enumerate(batch):
            header, *bodies = pending.args
            pipe.evalsha(sha, len(pending.keys), *pending.keys, f"{header} {batch_id} {index}", *bodies)
        return list(await pipe.execute(raise_on_error=False))


@dataclass(slots=True)
class _Channel:
    """The local waiters of one task: a signal set (and replaced) on each wake-up."""

    waiters: int = 0
    signal: asyncio.Event = field(default_factory=asyncio.Event)
    idle_since: float = 0.0
    """When the last waiter left (loop time): the channel is unsubscribed after `SAFETY_POLL_S` idle, so
    a reader going from one wait to the next does not unsubscribe and subscribe again."""

    def wake(self) -> None:
        self.signal.set()
        self.signal = asyncio.Event()


class _WakeUps:
    """One pub/sub connection, subscribed only to the channels of tasks with local waiters."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._channels: dict[str, _Channel] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped = 0
        """Wake-ups ignored on purpose (`drop_next`): what the tests use to lose one."""
        self._drop = 0

    def drop_next(self, count: int = 1) -> None:
        """Ignore the next `count` wake-ups, as if the network had lost them (for tests)."""
        self._drop += count

    @contextlib.asynccontextmanager
    async def watching(self, channel: str) -> AsyncIterator[_Channel]:
        watched = self._channels.get(channel)
        if watched is None:
            watched = self._channels[channel] = _Channel()
            with contextlib.suppress(*UNAVAILABLE):  # the safety poll covers for a failed subscribe
                await self._pubsub.subscribe(channel)
            if self._reader is None:
                self._reader = asyncio.create_task(self._read(), name="redis-wake-ups")
        watched.waiters += 1
        try:
            yield watched
        finally:
            watched.waiters -= 1
            if not watched.waiters:
                watched.idle_since = asyncio.get_running_loop().time()

    async def _unsubscribe_idle(self) -> None:
        """Unsubscribe the channels without waiters for `SAFETY_POLL_S` (only the reader task does this)."""
        cutoff = asyncio.get_running_loop().time() - SAFETY_POLL_S
        idle = [name for name, watched in self._channels.items() if not watched.waiters and watched.idle_since < cutoff]
        if not idle:
            return
        for name in idle:
            del self._channels[name]
        with contextlib.suppress(*UNAVAILABLE):
            await self._pubsub.unsubscribe(*idle)
            revived = [name for name in idle if name in self._channels]  # a waiter came meanwhile
            if revived:
                await self._pubsub.subscribe(*revived)

    def wake_all(self) -> None:
        for watched in self._channels.values():
            watched.wake()

    async def _read(self) -> None:
        lost = False  # warned about a lost connection: once per outage
        swept = asyncio.get_running_loop().time()
        while True:
            try:
                message = await self._pubsub.get_message(timeout=SAFETY_POLL_S)
            except UNAVAILABLE as error:
                if not lost:
                    log.warning(
                        "redis wake-up connection lost; catching up after reconnect", extra={"error": str(error)}
                    )
                lost = True
                await asyncio.sleep(RECONNECT_DELAY_S)
                self.wake_all()  # the catch-up: every waiter reads its task again
                continue
            lost = False
            now = asyncio.get_running_loop().time()
            if now - swept >= SAFETY_POLL_S:
                swept = now
                await self._unsubscribe_idle()
            if message is None or message.get("type") != "message":
                continue
            if self._drop:
                self._drop -= 1
                self.dropped += 1
                continue
            channel = message["channel"]
            watched = self._channels.get(channel.decode() if isinstance(channel, bytes) else channel)
            if watched is not None:
                watched.wake()

    async def close(self) -> None:
        self._closed = True
        self.wake_all()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        with contextlib.suppress(*UNAVAILABLE):
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]


def _pool(url: str, max_connections: int) -> aioredis.BlockingConnectionPool:
    """A bounded pool (many waiting readers share a few connections instead of opening one each) whose
    commands are retried a few times on a lost connection, which covers a server restart of about a
    second (append pipelines too: the acks make a replayed one safe)."""
    return aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        socket_connect_timeout=5.0,
        socket_timeout=30.0,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RETRIES),
    )


class RedisBackend:
    """One Redis server (or cluster entry point) under one key prefix: the client, the scripts, the
    append pipeline and the wake-up connection both stores share."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client: aioredis.Redis = aioredis.Redis(connection_pool=_pool(url, MAX_CONNECTIONS))
        # The append pipeline has a connection of its own: many readers never make a writer wait for one.
        self.writer: aioredis.Redis = aioredis.Redis(connection_pool=_pool(url, 1))
        self.keys = RedisKeys(prefix)
        self.scripts = _Scripts(self.client)
        self.appends = _AppendPipeline(self.writer, self.scripts.append)
        self.wake_ups = _WakeUps(self.client)
        self.closed = False
        self._users = 0

    def use(self) -> RedisBackend:
        """Count one more store on this backend: it closes when the last one does."""
        self._users += 1
        return self

    async def check(self) -> list[str]:
        """Reach the server; warnings about settings the stores need (`maxmemory-policy noeviction`).
        StoreUnavailable if it cannot be reached."""
        try:
            await self.client.ping()
        except UNAVAILABLE as error:
            where = self.client.connection_pool.connection_kwargs
            server = where.get("path") or f"{where.get('host')}:{where.get('port')}"  # never the password
            raise StoreUnavailable(f"the Redis store at {server} cannot be reached: {error}") from error
        try:
            settings = await self.client.config_get("maxmemory-policy")
        except ResponseError as error:  # managed services may refuse CONFIG
            return [f"could not check the Redis maxmemory-policy ({error}); it must be noeviction"]
        policy = next((_text(value) for name, value in settings.items() if _text(name) == "maxmemory-policy"), "")
        if policy != "noeviction":
            return [
                f"Redis maxmemory-policy is {policy!r}, not 'noeviction': under memory pressure Redis may "
                "evict task records and events, and readers would see tasks vanish and logs gone"
            ]
        return []

    async def release(self) -> None:
        self._users -= 1
        if self._users > 0 or self.closed:
            return
        self.closed = True
        await self.wake_ups.close()
        await self.writer.aclose()
        await self.client.aclose()


# ------------------------------------------------------------------------------------------ task store


def _record(values: Sequence[bytes | None]) -> TaskRecord:
    """A record from the hash fields `RECORD_FIELDS` names, in that order."""
    rec, status, msg, updated, summary, rseq, next_seq, _until = values
    assert rec is not None and status is not None and updated is not None
    data = orjson.loads(rec)
    data["status"] = status.decode()
    data["status_message"] = msg.decode() if msg is not None else None
    data["last_updated_at"] = updated.decode()
    data["outcome_summary"] = orjson.loads(summary) if summary is not None else None
    data["next_seq"] = max(int(rseq or 0), int(next_seq or 0))
    return TaskRecord.from_dict(data)


class RedisTaskStore(TaskStore):
    """Task records in their task hashes, each owner's ids in a sorted set by creation number.

    A `list_owned` cursor is the creation number of the last record on the page (per owner). With
    `terminal_retention_s`, a terminal record reads as unknown once that time has passed (and its keys
    expire `SWEEP_GRACE_S` later), as does its log."""

    def __init__(
        self,
        backend: RedisBackend,
        max_outcome_bytes: int,
        *,
        terminal_retention_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(max_outcome_bytes)
        self._backend = backend.use()
        self._keys = backend.keys
        self._scripts = backend.scripts
        self._client: Any = backend.client  # replies are bytes (decode_responses is off); the stubs say str too
        self._retention = terminal_retention_s
        self._clock = clock

    async def create(self, record: TaskRecord) -> None:
        hash_key, _ = self._keys.task(record.id)
        data = record.to_dict()
        rec = orjson.dumps({name: data[name] for name in _IMMUTABLE})
        summary = orjson.dumps(record.outcome_summary) if record.outcome_summary is not None else None
        args: list[Any] = [rec, record.owner, record.status.value, _optional(record.status_message)]
        args += [record.last_updated_at]
        args += [_optional(summary), record.next_seq, repr(record.expires_at)]
        if not await self._scripts.create_record(keys=[hash_key], args=args):
            raise TaskExists(f"a task with id {record.id!r} exists")
        index, counter = self._keys.owned(record.owner)
        await self._scripts.index_owned(keys=[index, counter], args=[record.id])
        await self._client.zadd(self._keys.expiry, {record.id: record.expires_at})

    async def _read(self, task_id: str) -> tuple[str, TaskRecord] | None:
        """The task's owner and record, unless it has none (or its terminal retention is over)."""
        hash_key, _ = self._keys.task(task_id)
        return self._found(await self._client.hmget(hash_key, _OWNER_AND_RECORD))

    async def _read_many(self, task_ids: list[str]) -> list[tuple[str, TaskRecord] | None]:
        """`_read` for each id, in one pipeline."""
        pipe = self._client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self._keys.task(task_id)[0], _OWNER_AND_RECORD)
        return [self._found(values) for values in await pipe.execute()]

    def _found(self, values: list[bytes | None]) -> tuple[str, TaskRecord] | None:
        owner, fields = values[0], values[1:]
        if owner is None or fields[0] is None:
            return None
        until = fields[-1]
        if until is not None and float(until) <= self._clock():
            return None
        return owner.decode(), _record(fields)

    async def get(self, owner: str, task_id: str) -> TaskRecord | None:
        found = await self._read(task_id)
        return found[1] if found is not None and found[0] == owner else None

    async def find(self, task_id: str) -> TaskRecord | None:
        found = await self._read(task_id)
        return found[1] if found is not None else None

    async def list_owned(self, owner: str, cursor: str | None, limit: int) -> TaskPage:
        index, counter = self._keys.owned(owner)
        after = 0
        if cursor is not None:
            last = int(await self._client.get(counter) or 0)
            if not cursor.isdigit() or int(cursor) > last:
                raise InvalidCursor(f"unknown cursor {cursor!r}")
            after = int(cursor)
        page: list[TaskRecord] = []
        numbers: list[int] = []
        batch = max(limit + 1, 16)
        while True:
            entries = await self._client.zrangebyscore(index, f"({after}", "+inf", start=0, num=batch, withscores=True)
            for (_, score), found in zip(entries, await self._read_many([m.decode() for m, _ in entries]), strict=True):
                if found is None or found[0] != owner:
                    continue  # expired (or recreated by another owner): the index entry is stale
                if len(page) == limit:
                    return TaskPage(page, str(numbers[-1]))
                page.append(found[1])
                numbers.append(int(score))
            if len(entries) < batch:
                return TaskPage(page, None)
            after = int(entries[-1][1])

    async def update_status(
        self,
        task_id: str,
        expected: TaskStatus,
        status: TaskStatus,
        message: str | None,
        updated_at: str,
        *,
        outcome: bytes | None = None,
        outcome_summary: dict[str, object] | None = None,
    ) -> TaskRecord | None:
        if outcome is not None and not status.terminal:
            raise ValueError(f"only a terminal status keeps an outcome, not {status.value}")
        self.check_outcome(outcome)
        if await self._read(task_id) is None:
            return None
        keys = list(self._keys.task(task_id))
        summary = orjson.dumps(outcome_summary) if outcome_summary is not None else None
        retention = "" if self._retention is None else str(int(self._retention * 1000))
        until = repr(self._clock() + (self._retention or 0))
        args: list[Any] = [expected.value, status.value, _optional(message), updated_at, _optional(summary)]
        args += [_optional(outcome)]
        args += [retention, until, int(SWEEP_GRACE_S * 1000)]
        values = await self._scripts.update_status(keys=keys, args=args)
        if not values:
            return None
        if status.terminal and self._retention is not None:
            # The sweep drops the record when its retention ends, if that is before its TTL.
            await self._client.zadd(self._keys.expiry, {task_id: float(until)}, lt=True)
        return _record(values)

    async def outcome(self, task_id: str) -> bytes | None:
        if await self._read(task_id) is None:
            return None
        hash_key, _ = self._keys.task(task_id)
        kept: bytes | None = await self._client.hget(hash_key, "outcome")
        return kept

    async def replace_outcome(self, task_id: str, outcome: bytes) -> bool:
        self.check_outcome(outcome)
        hash_key, _ = self._keys.task(task_id)
        return bool(await self._scripts.replace_outcome(keys=[hash_key], args=[outcome]))

    async def advance_next_seq(self, task_id: str, next_seq: int) -> None:
        hash_key, _ = self._keys.task(task_id)
        await self._scripts.advance_next_seq(keys=[hash_key], args=[next_seq])

    async def expire(self, now: float) -> list[TaskRecord]:
        expired: list[TaskRecord] = []
        for member in await self._client.zrangebyscore(self._keys.expiry, "-inf", repr(now)):
            task_id = member.decode()
            hash_key, _ = self._keys.task(task_id)
            dropped = await self._scripts.drop_record(keys=[hash_key], args=[repr(now)])
            await self._client.zrem(self._keys.expiry, task_id)
            if dropped:
                owner = dropped[0].decode()
                index, _ = self._keys.owned(owner)
                await self._client.zrem(index, task_id)
                expired.append(_record(dropped[1:]))
        return expired

    async def epoch(self, task_id: str) -> int | None:
        """The task's writer epoch (0 at create), or None for an unknown task."""
        hash_key, _ = self._keys.task(task_id)
        owner, epoch = await self._client.hmget(hash_key, ["owner", "epoch"])
        return int(epoch) if owner is not None and epoch is not None else None

    async def bump_epoch(self, task_id: str, expected: int) -> int | None:
        """Move the task to epoch `expected + 1` if it is still at `expected` (a takeover); the new epoch,
        or None if another writer moved it first or the task is unknown. Appends with an older epoch are
        refused from then on (`WriterFenced`)."""
        hash_key, _ = self._keys.task(task_id)
        bumped = await self._scripts.bump_epoch(keys=[hash_key], args=[expected])
        return int(bumped) if bumped is not None else None

    async def close(self) -> None:
        await self._backend.release()


# ------------------------------------------------------------------------------------------ event log


class RedisEventLog(EventLog):
    """Each task's log in its stream, its state (`next_seq`, sealed, deleted) in its task hash.

    About 140 bytes of Redis memory per retained ~100-byte event, plus a few KB per stream key (see
    docs/benchmarks.md). Times come from `clock` (clamped per task to be non-decreasing); tombstones
    expire in Redis time."""

    def __init__(
        self,
        backend: RedisBackend,
        max_events_per_task: int,
        clock: Callable[[], float] = time.time,
        *,
        max_event_age_s: float = math.inf,
        tombstone_ttl_s: float = DEFAULT_TOMBSTONE_TTL_S,
        safety_poll_s: float = SAFETY_POLL_S,
    ) -> None:
        if max_events_per_task < 1:
            raise ValueError(f"max_events_per_task must be at least 1, got {max_events_per_task}")
        if not max_event_age_s > 0:
            raise ValueError(f"max_event_age_s must be positive, got {max_event_age_s}")
        self._backend = backend.use()
        self._keys = backend.keys
        self._scripts = backend.scripts
        self._client: Any = backend.client  # replies are bytes (decode_responses is off); the stubs say str too
        self._max_events = max_events_per_task
        self._max_age = max_event_age_s
        self._tombstone_ms = max(1, int(tombstone_ttl_s * 1000))
        self._clock = clock
        self._safety_poll_s = safety_poll_s
        self._closed = False

    @property
    def max_events_per_task(self) -> int:
        return self._max_events

    @property
    def wake_ups(self) -> _WakeUps:
        return self._backend.wake_ups

    def _cutoff(self) -> str:
        return "" if self._max_age == math.inf else repr(self._clock() - self._max_age)

    async def append(
        self,
        task_id: str,
        bodies: Sequence[bytes],
        *,
        seal: bool = False,
        epilogue: bool = False,
        epoch: int | None = None,
    ) -> int:
        """As `EventLog.append`; with `epoch` (a fenced writer), also `TaskGone` if the task's record does
        not exist and `WriterFenced` if its epoch is not `epoch`: nothing is appended either way."""
        if self._closed:
            raise RuntimeError("the event log is closed")
        keys = [*self._keys.task(task_id), self._keys.acks(task_id)]
        fenced = "-" if epoch is None else str(epoch)
        header = f"{self._clock()!r} {self._max_events} {self._cutoff() or '-'} {int(seal)}{int(epilogue)} {fenced}"
        return int(await self._backend.appends.run(keys, [header, *bodies]))

    async def create(self, task_id: str) -> None:
        if self._closed:
            raise RuntimeError("the event log is closed")
        hash_key, _ = self._keys.task(task_id)
        await self._scripts.create_log(keys=[hash_key])

    async def seal(self, task_id: str) -> None:
        hash_key, _ = self._keys.task(task_id)
        await self._scripts.seal(keys=[hash_key], args=[self._keys.channel(task_id)])

    async def bounds(self, task_id: str) -> LogBounds | None:
        found = await self._scripts.bounds(keys=list(self._keys.task(task_id)), args=[self._max_events, self._cutoff()])
        _raise_if_cancelled()
        if not found:
            return None
        next_seq, sealed, earliest = (int(value) for value in found)
        return LogBounds(earliest if earliest >= 0 else None, next_seq, bool(sealed))

    async def read(self, task_id: str, after: int, limit: int) -> list[StoredEvent]:
        if limit <= 0:
            return []
        keys = list(self._keys.task(task_id))
        flat = await self._scripts.read(keys=keys, args=[self._max_events, self._cutoff(), after, limit])
        _raise_if_cancelled()
        events: list[StoredEvent] = []
        for i in range(0, len(flat), 3):
            seq = int(flat[i][2:]) - 1
            if events and seq != events[-1].seq + 1:
                raise RuntimeError(f"task {task_id!r}: the stream skips from seq {events[-1].seq} to {seq}")
            events.append(StoredEvent(seq, float(flat[i + 1]), flat[i + 2]))
        return events

    async def _ready(self, task_id: str, after: int) -> bool | None:
        """True: an event after `after` was appended; False: none ever will be (deleted, sealed, closed);
        None: not yet. An unreachable server is "not yet" (the next poll asks again)."""
        if self._closed:
            return False
        hash_key, _ = self._keys.task(task_id)
        try:
            has_log, next_seq, sealed, deleted = await self._client.hmget(
                hash_key, ["log", "next_seq", "sealed", "deleted"]
            )
        except UNAVAILABLE:
            return None
        _raise_if_cancelled()
        if has_log is None:
            return None
        if deleted == b"1":
            return False
        if int(next_seq) > max(after + 1, 0):
            return True
        return False if sealed == b"1" else None

    async def wait(self, task_id: str, after: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        ready = await self._ready(task_id, after)
        if ready is not None or timeout <= 0:
            return bool(ready)
        async with self._backend.wake_ups.watching(self._keys.channel(task_id)) as watched:
            while True:
                signal = watched.signal  # taken before the read: a wake-up after it is not missed
                ready = await self._ready(task_id, after)
                if ready is not None:
                    return ready
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, self._safety_poll_s)):
                        await signal.wait()

    async def delete(self, task_id: str) -> None:
        keys = list(self._keys.task(task_id))
        await self._scripts.delete_log(keys=keys, args=[self._tombstone_ms, self._keys.channel(task_id)])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.wake_ups.wake_all()
        await self._backend.release()
