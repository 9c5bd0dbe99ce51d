"""The Redis Streams stores (`[store] kind = "redis"`): task records and event logs shared by replicas.

One `RedisBackend` (`redis_backend.py`: the connection pools, the scripts, the append pipeline and the
wake-ups of `redis_wakeups.py`) serves a `RedisTaskStore` and a `RedisEventLog`. Per task, a hash and
a stream share the `{t:<id>}` hash tag, so every per-task operation is one Lua script
(`redis_scripts.py`), also on Redis Cluster; an owner's index and counter share `{o:<owner>}`; one
sorted set orders records by expiry.

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

Owner leases (`redis_leases.py`): the replica that creates a task holds it at epoch 0 and leases it; a
replica that claims an expired lease moves it to epoch + 1. Appends and status updates carry the epoch
this replica holds of the task (`RedisBackend.held`), so a former owner's late writes are refused
(`WriterFenced`; a refused status update reads as "another writer changed it first") and the backend
tells the replica (`on_fenced`) to stop working on the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from redis.exceptions import ResponseError

from gateway.events.log import DEFAULT_TOMBSTONE_TTL_S, EventLog, LogBounds, StoredEvent
from gateway.stores import redis_scripts as lua
from gateway.stores.redis_backend import (
    RedisBackend,
    StoreUnreachable,
    TaskGone,
    WriterFenced,
    mapped,
    raise_if_cancelled,
    unavailable_as_store_error,
)
from gateway.stores.redis_wakeups import SAFETY_POLL_S, UNAVAILABLE, WakeUps
from gateway.tasks.records import TaskRecord, TaskStatus
from gateway.tasks.store import InvalidCursor, LiveRecord, TaskExists, TaskPage, TaskStore

__all__ = ["RedisBackend", "RedisEventLog", "RedisTaskStore", "StoreUnreachable", "TaskGone", "WriterFenced"]

SWEEP_GRACE_S = 60.0
"""How long past a terminal task's retention Redis keeps its keys, so that a replica's sweep hands the
record to its registry before Redis drops it (after the retention the id already reads as unknown)."""
_IMMUTABLE = ("id", "owner", "tool", "dialect", "ttl_ms", "poll_interval_ms", "created_at", "expires_at", "upstream")
"""The record fields that never change after create: stored together as JSON (`rec`)."""
_OWNER_AND_RECORD = ["owner", *lua.RECORD_FIELDS]


def _optional(value: str | bytes | None) -> str | bytes:
    """How the scripts take an optional value: `+value`, or `-` for none."""
    if value is None:
        return "-"
    return b"+" + value if isinstance(value, bytes) else "+" + value


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
        self._client: Any = backend.client  # replies are bytes (decode_responses is off); the stubs say str too
        self._retention = terminal_retention_s
        self._clock = clock

    def retain(self, max_outcome_bytes: int, terminal_retention_s: float | None = None) -> None:
        super().retain(max_outcome_bytes)
        self._retention = terminal_retention_s

    @unavailable_as_store_error
    async def create(self, record: TaskRecord) -> None:
        hash_key, _ = self._backend.keys.task(record.id)
        data = record.to_dict()
        rec = orjson.dumps({name: data[name] for name in _IMMUTABLE})
        summary = orjson.dumps(record.outcome_summary) if record.outcome_summary is not None else None
        args: list[Any] = [rec, record.owner, record.status.value, _optional(record.status_message)]
        args += [record.last_updated_at]
        args += [_optional(summary), record.next_seq, repr(record.expires_at)]
        args += [self._backend.replica, self._backend.lease_ttl_ms]
        lease = await self._backend.scripts.create_record(keys=[hash_key], args=args)
        if not lease:
            raise TaskExists(f"a task with id {record.id!r} exists")
        index, counter = self._backend.keys.owned(record.owner)
        await self._backend.scripts.index_owned(keys=[index, counter], args=[record.id])
        pipe = self._client.pipeline(transaction=False)
        pipe.zadd(self._backend.keys.expiry, {record.id: record.expires_at})
        pipe.zadd(self._backend.keys.leases, {record.id: int(lease)})
        await pipe.execute()
        # Held (leased) only now, after the last await: the registry knows the task before the lease
        # loop can see it. A tick between the two would take it for ended and release its lease, which
        # nobody would renew or claim again: the task would outlive its replica, never failed.
        self._backend.hold(record.id, 0)  # this replica runs (or watches) the task it creates

    async def _read(self, task_id: str) -> tuple[str, TaskRecord] | None:
        """The task's owner and record, unless it has none (or its terminal retention is over)."""
        hash_key, _ = self._backend.keys.task(task_id)
        return self._found(await self._client.hmget(hash_key, _OWNER_AND_RECORD))

    async def _read_many(self, task_ids: list[str]) -> list[tuple[str, TaskRecord] | None]:
        """`_read` for each id, in one pipeline."""
        pipe = self._client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self._backend.keys.task(task_id)[0], _OWNER_AND_RECORD)
        return [self._found(values) for values in await pipe.execute()]

    def _found(self, values: list[bytes | None]) -> tuple[str, TaskRecord] | None:
        owner, fields = values[0], values[1:]
        if owner is None or fields[0] is None:
            return None
        until = fields[-1]
        if until is not None and float(until) <= self._clock():
            return None
        return owner.decode(), _record(fields)

    @unavailable_as_store_error
    async def get(self, owner: str, task_id: str) -> TaskRecord | None:
        found = await self._read(task_id)
        return found[1] if found is not None and found[0] == owner else None

    @unavailable_as_store_error
    async def find(self, task_id: str) -> TaskRecord | None:
        found = await self._read(task_id)
        return found[1] if found is not None else None

    @unavailable_as_store_error
    async def list_owned(self, owner: str, cursor: str | None, limit: int) -> TaskPage:
        index, counter = self._backend.keys.owned(owner)
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

    @unavailable_as_store_error
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
        self.check_update(status, outcome)
        if await self._read(task_id) is None:
            return None
        keys = list(self._backend.keys.task(task_id))
        summary = orjson.dumps(outcome_summary) if outcome_summary is not None else None
        retention = "" if self._retention is None else str(int(self._retention * 1000))
        until = repr(self._clock() + (self._retention or 0))
        args: list[Any] = [expected.value, status.value, _optional(message), updated_at, _optional(summary)]
        args += [_optional(outcome)]
        args += [retention, until, int(SWEEP_GRACE_S * 1000)]
        epoch = self._backend.epoch_of(task_id)
        args += ["-" if epoch is None else str(epoch)]
        try:
            values = await self._backend.scripts.update_status(keys=keys, args=args)
        except ResponseError as error:
            if not isinstance(mapped(error), WriterFenced):
                raise
            self._backend.fenced(task_id)
            return None  # another replica took the task over: its status is that replica's to change
        if not values:
            return None
        if status.terminal and self._retention is not None:
            # The sweep drops the record when its retention ends, if that is before its TTL.
            await self._client.zadd(self._backend.keys.expiry, {task_id: float(until)}, lt=True)
        return _record(values)

    @unavailable_as_store_error
    async def outcome(self, task_id: str) -> bytes | None:
        if await self._read(task_id) is None:
            return None
        hash_key, _ = self._backend.keys.task(task_id)
        kept: bytes | None = await self._client.hget(hash_key, "outcome")
        return kept

    @unavailable_as_store_error
    async def replace_outcome(self, task_id: str, outcome: bytes) -> bool:
        self.check_outcome(outcome)
        hash_key, _ = self._backend.keys.task(task_id)
        return bool(await self._backend.scripts.replace_outcome(keys=[hash_key], args=[outcome]))

    @unavailable_as_store_error
    async def advance_next_seq(self, task_id: str, next_seq: int) -> None:
        hash_key, _ = self._backend.keys.task(task_id)
        await self._backend.scripts.advance_next_seq(keys=[hash_key], args=[next_seq])

    @unavailable_as_store_error
    async def unfinished(self) -> list[TaskRecord]:
        return [live.record for live in await self.live() if not live.record.terminal]

    @unavailable_as_store_error
    async def live(self) -> list[LiveRecord]:
        # Every record is in the expiry set: a start-up scan reads them all, in one pipeline.
        members = [member.decode() for member in await self._client.zrange(self._backend.keys.expiry, 0, -1)]
        pipe = self._client.pipeline(transaction=False)
        for task_id in members:
            hash_key, _ = self._backend.keys.task(task_id)
            pipe.hmget(hash_key, _OWNER_AND_RECORD)
            pipe.hstrlen(hash_key, "outcome")
            pipe.hexists(hash_key, "replaced")
        replies = await pipe.execute()
        live: list[LiveRecord] = []
        for i in range(0, len(replies), 3):
            values, outcome_bytes, replaced = replies[i : i + 3]
            found = self._found(values)
            if found is not None:
                live.append(LiveRecord(found[1], None if replaced or not outcome_bytes else int(outcome_bytes)))
        return live

    @unavailable_as_store_error
    async def expire(self, now: float) -> list[TaskRecord]:
        expired: list[TaskRecord] = []
        for member in await self._client.zrangebyscore(self._backend.keys.expiry, "-inf", repr(now)):
            task_id = member.decode()
            hash_key, _ = self._backend.keys.task(task_id)
            dropped = await self._backend.scripts.drop_record(keys=[hash_key], args=[repr(now)])
            await self._client.zrem(self._backend.keys.expiry, task_id)
            await self._client.zrem(self._backend.keys.leases, task_id)
            self._backend.held.pop(task_id, None)
            if dropped:
                owner = dropped[0].decode()
                index, _ = self._backend.keys.owned(owner)
                await self._client.zrem(index, task_id)
                expired.append(_record(dropped[1:]))
        return expired

    @unavailable_as_store_error
    async def epoch(self, task_id: str) -> int | None:
        """The task's writer epoch (0 at create), or None for an unknown task."""
        hash_key, _ = self._backend.keys.task(task_id)
        owner, epoch = await self._client.hmget(hash_key, ["owner", "epoch"])
        return int(epoch) if owner is not None and epoch is not None else None

    @unavailable_as_store_error
    async def bump_epoch(self, task_id: str, expected: int) -> int | None:
        """Move the task to epoch `expected + 1` if it is still at `expected` (a takeover); the new epoch,
        or None if another writer moved it first or the task is unknown. Appends with an older epoch are
        refused from then on (`WriterFenced`)."""
        hash_key, _ = self._backend.keys.task(task_id)
        bumped = await self._backend.scripts.bump_epoch(keys=[hash_key], args=[expected])
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
        self.retain(max_events_per_task, max_event_age_s)
        self._backend = backend.use()
        self._client: Any = backend.client  # replies are bytes (decode_responses is off); the stubs say str too
        self._tombstone_ms = max(1, int(tombstone_ttl_s * 1000))
        self._clock = clock
        self._safety_poll_s = safety_poll_s
        self._closed = False

    @property
    def max_events_per_task(self) -> int:
        return self._max_events

    @property
    def wake_ups(self) -> WakeUps:
        return self._backend.wake_ups

    @property
    def resets(self) -> int:
        return self._backend.resets

    def _cutoff(self) -> str:
        return "" if self._max_age == math.inf else repr(self._clock() - self._max_age)

    @unavailable_as_store_error
    async def append(
        self,
        task_id: str,
        bodies: Sequence[bytes],
        *,
        seal: bool = False,
        epilogue: bool = False,
        key: str | None = None,
        epoch: int | None = None,
    ) -> int:
        """As `EventLog.append`; with `epoch` (a fenced writer; by default the epoch this replica holds of
        the task, if it created or claimed it), also `TaskGone` if the task's record does not exist and
        `WriterFenced` if its epoch is not `epoch`: nothing is appended either way."""
        if self._closed:
            raise RuntimeError("the event log is closed")
        keys = [*self._backend.keys.task(task_id), self._backend.keys.acks(task_id)]
        if epoch is None:
            epoch = self._backend.epoch_of(task_id)
        fenced = "-" if epoch is None else str(epoch)
        header = f"{self._clock()!r} {self._max_events} {self._cutoff() or '-'} {int(seal)}{int(epilogue)} {fenced}"
        try:
            return int(await self._backend.appends.run(keys, [header, *bodies], key))
        except WriterFenced:
            self._backend.fenced(task_id)
            raise

    @unavailable_as_store_error
    async def create(self, task_id: str) -> None:
        if self._closed:
            raise RuntimeError("the event log is closed")
        hash_key, _ = self._backend.keys.task(task_id)
        await self._backend.scripts.create_log(keys=[hash_key])

    @unavailable_as_store_error
    async def seal(self, task_id: str) -> None:
        hash_key, _ = self._backend.keys.task(task_id)
        await self._backend.scripts.seal(keys=[hash_key], args=[self._backend.keys.channel(task_id)])

    @unavailable_as_store_error
    async def bounds(self, task_id: str) -> LogBounds | None:
        found = await self._backend.scripts.bounds(
            keys=list(self._backend.keys.task(task_id)), args=[self._max_events, self._cutoff()]
        )
        raise_if_cancelled()
        if not found:
            return None
        next_seq, sealed, earliest = (int(value) for value in found)
        return LogBounds(earliest if earliest >= 0 else None, next_seq, bool(sealed))

    @unavailable_as_store_error
    async def read(self, task_id: str, after: int, limit: int) -> list[StoredEvent]:
        if limit <= 0:
            return []
        keys = list(self._backend.keys.task(task_id))
        flat = await self._backend.scripts.read(keys=keys, args=[self._max_events, self._cutoff(), after, limit])
        raise_if_cancelled()
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
        hash_key, _ = self._backend.keys.task(task_id)
        try:
            has_log, next_seq, sealed, deleted = await self._client.hmget(
                hash_key, ["log", "next_seq", "sealed", "deleted"]
            )
        except UNAVAILABLE:
            return None
        raise_if_cancelled()
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
        resets = self._backend.resets
        async with self._backend.wake_ups.watching(self._backend.keys.channel(task_id)) as watched:
            while True:
                signal = watched.signal  # taken before the read: a wake-up after it is not missed
                if self._backend.resets != resets:
                    return False  # the data set was replaced: what this waited for is gone
                ready = await self._ready(task_id, after)
                if ready is not None:
                    return ready
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, self._safety_poll_s)):
                        await signal.wait()

    @unavailable_as_store_error
    async def delete(self, task_id: str) -> None:
        keys = list(self._backend.keys.task(task_id))
        await self._backend.scripts.delete_log(
            keys=keys, args=[self._tombstone_ms, self._backend.keys.channel(task_id)]
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.wake_ups.wake_all()
        await self._backend.release()
