"""The durable embedded `EventLog`: per-task event logs in the `logs` and `events` tables of a SQLite file.

A task's log is one `logs` row (its `next_seq`, whether it is sealed, and once deleted the time its
tombstone expires) and its retained events, rows `(task, seq, created, body)` keyed `(task, seq)`.
The row outlives the events: deleting them never resets a sequence. Retention is exactly the memory
log's (`gateway.events.log.MemoryEventLog`): an append trims its task by count and age in the same
transaction, and a read or `bounds` that meets an event older than the age first has it deleted, so
no event past its age is ever handed out and none comes back when a wall clock steps back.

`wait` wakes the waiters in this process when an append, seal, create or delete commits; another
process writing the same file wakes nobody here.
"""

from __future__ import annotations

import asyncio
import functools
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gateway.events.log import (
    DEFAULT_TOMBSTONE_TTL_S,
    EventLog,
    LogBounds,
    LogSealed,
    StoredEvent,
    check_retention,
)
from gateway.stores.sqlite import SqliteDatabase

__all__ = ["SqliteEventLog"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _LogRow:
    next_seq: int
    sealed: bool
    deleted: bool


_LOG_STATE = """
SELECT next_seq, sealed, tombstone_until IS NOT NULL,
    (SELECT seq FROM events WHERE task = ?1 ORDER BY seq LIMIT 1),
    (SELECT created FROM events WHERE task = ?1 ORDER BY seq LIMIT 1),
    (SELECT created FROM events WHERE task = ?1 ORDER BY seq DESC LIMIT 1)
FROM logs WHERE task = ?1
"""
"""A log in one statement (fewer steps, fewer hand-offs of the GIL): its row, its earliest event
(seq, created) and the `created` of its last event."""

_READ_EVENTS = """
SELECT seq, created, body, (SELECT created FROM events WHERE task = ?1 ORDER BY seq LIMIT 1)
FROM events WHERE task = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3
"""
"""Events after a cursor, each row with the `created` of the task's earliest event (for the age check)."""


_INSERT_EVENT = "INSERT INTO events (task, seq, created, body) VALUES (?, ?, ?, ?)"


class _NeedsTrim(Exception):
    """A read met an event older than the age: the writer deletes it first (reads cannot)."""

    def __init__(self, cutoff: float) -> None:
        super().__init__(cutoff)
        self.cutoff = cutoff

    def drop(self, task_id: str) -> Callable[[sqlite3.Connection], bool]:
        """The write that deletes the task's events created before the cutoff (it wakes nobody)."""

        def drop(connection: sqlite3.Connection) -> bool:
            _drop_older_than(connection, task_id, self.cutoff)
            return False

        return drop


class _Waiters:
    """The waiters of one task: an event set (and replaced) on every committed change of its log."""

    __slots__ = ("changed", "count")

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.count = 0


def _log_row(connection: sqlite3.Connection, task_id: str) -> _LogRow | None:
    row = connection.execute(
        "SELECT next_seq, sealed, tombstone_until IS NOT NULL FROM logs WHERE task = ?", (task_id,)
    ).fetchone()
    return None if row is None else _LogRow(row[0], bool(row[1]), bool(row[2]))


def _first_created(connection: sqlite3.Connection, task_id: str) -> float | None:
    row = connection.execute("SELECT created FROM events WHERE task = ? ORDER BY seq LIMIT 1", (task_id,)).fetchone()
    return None if row is None else row[0]


def _drop_older_than(connection: sqlite3.Connection, task_id: str, cutoff: float) -> None:
    """Delete the task's events created before `cutoff`: a prefix, as `created` never decreases by seq."""
    keep_from = None
    for seq, created in connection.execute("SELECT seq, created FROM events WHERE task = ? ORDER BY seq", (task_id,)):
        if created >= cutoff:
            keep_from = seq
            break
    if keep_from is None:
        connection.execute("DELETE FROM events WHERE task = ?", (task_id,))
    else:
        connection.execute("DELETE FROM events WHERE task = ? AND seq < ?", (task_id, keep_from))


def _check_age(head_created: float | None, cutoff: float | None) -> None:
    """Raise _NeedsTrim if the task's earliest event (created at `head_created`) is past its age."""
    if cutoff is not None and head_created is not None and head_created < cutoff:
        raise _NeedsTrim(cutoff)


class SqliteEventLog(EventLog):
    """Per-task logs in one SQLite file; see the module docstring for what a log is made of."""

    def __init__(
        self,
        database: SqliteDatabase,
        max_events_per_task: int,
        clock: Callable[[], float] = time.time,
        *,
        max_event_age_s: float = math.inf,
        tombstone_ttl_s: float = DEFAULT_TOMBSTONE_TTL_S,
    ) -> None:
        check_retention(max_events_per_task, max_event_age_s)
        self._db = database.acquire()
        self._max_events = max_events_per_task
        self._max_age = max_event_age_s
        self._tombstone_ttl = tombstone_ttl_s
        self._clock = clock
        self._waiters: dict[str, _Waiters] = {}
        self._closed = False

    @property
    def max_events_per_task(self) -> int:
        return self._max_events

    def _cutoff(self) -> float | None:
        """Events created before this are past their age (None: no age limit)."""
        return None if self._max_age == math.inf else self._clock() - self._max_age

    async def _write(self, task_id: str, job: Callable[[sqlite3.Connection], bool]) -> None:
        """Run a change of the task's log; wake its waiters once committed if the job says it changed."""
        if self._closed:
            raise RuntimeError("the event log is closed")
        if await self._db.write(job):
            self._wake(task_id)

    def _wake(self, task_id: str) -> None:
        waiters = self._waiters.get(task_id)
        if waiters is not None:
            waiters.changed.set()
            waiters.changed = asyncio.Event()

    async def append(self, task_id: str, bodies: Sequence[bytes], *, seal: bool = False, epilogue: bool = False) -> int:
        rows = list(bodies)
        clock = self._clock()
        cutoff = self._cutoff()
        first = 0

        def append(connection: sqlite3.Connection) -> bool:
            nonlocal first
            state = connection.execute(_LOG_STATE, (task_id,)).fetchone()
            if state is None:
                connection.execute("INSERT INTO logs (task) VALUES (?)", (task_id,))
                state = (0, False, False, None, None, None)
            next_seq, sealed, deleted, earliest, head_created, last_created = state
            if deleted or (sealed and not epilogue):
                raise LogSealed(
                    f"the log of task {task_id!r} is {'deleted' if deleted else 'sealed'}: it takes no more events"
                )
            first = next_seq
            if rows:
                created = clock if last_created is None else max(clock, last_created)  # never older than the last
                events = [(task_id, first + i, created, body) for i, body in enumerate(rows)]
                if len(events) == 1:  # executemany costs about twice as much for one row
                    connection.execute(_INSERT_EVENT, events[0])
                else:
                    connection.executemany(_INSERT_EVENT, events)
                keep_from = first + len(rows) - self._max_events
                if (first if earliest is None else earliest) < keep_from:
                    connection.execute("DELETE FROM events WHERE task = ? AND seq < ?", (task_id, keep_from))
                if cutoff is not None and head_created is not None and head_created < cutoff:
                    _drop_older_than(connection, task_id, cutoff)
            if not (rows or seal):
                return False
            connection.execute(
                "UPDATE logs SET next_seq = ?, sealed = sealed OR ? WHERE task = ?",
                (first + len(rows), seal, task_id),
            )
            return True

        await self._write(task_id, append)
        return first

    async def create(self, task_id: str) -> None:
        def create(connection: sqlite3.Connection) -> bool:
            inserted = connection.execute("INSERT INTO logs (task) VALUES (?) ON CONFLICT DO NOTHING", (task_id,))
            return inserted.rowcount > 0

        await self._write(task_id, create)

    async def seal(self, task_id: str) -> None:
        def seal(connection: sqlite3.Connection) -> bool:
            changed = connection.execute(
                "INSERT INTO logs (task, sealed) VALUES (?, 1) ON CONFLICT DO UPDATE SET sealed = 1 WHERE NOT sealed",
                (task_id,),
            )
            return changed.rowcount > 0

        await self._write(task_id, seal)

    async def _read(self, query: Callable[[float | None, sqlite3.Connection], T], task_id: str) -> T:
        """`query(cutoff, connection)` on a reader; when it finds events past their age (_NeedsTrim),
        the writer deletes them first and the query runs again."""
        while True:
            try:
                return await self._db.read(functools.partial(query, self._cutoff()))
            except _NeedsTrim as trim:
                await self._write(task_id, trim.drop(task_id))

    async def bounds(self, task_id: str) -> LogBounds | None:
        if self._closed:
            return None

        def select(cutoff: float | None, connection: sqlite3.Connection) -> LogBounds | None:
            state = connection.execute(_LOG_STATE, (task_id,)).fetchone()
            if state is None:
                return None
            next_seq, sealed, deleted, earliest, head_created, _ = state
            _check_age(head_created, cutoff)
            return LogBounds(earliest, next_seq, bool(sealed or deleted))

        return await self._read(select, task_id)

    async def read(self, task_id: str, after: int, limit: int) -> list[StoredEvent]:
        if self._closed or limit <= 0:
            return []

        def select(cutoff: float | None, connection: sqlite3.Connection) -> list[StoredEvent]:
            rows = connection.execute(_READ_EVENTS, (task_id, after, limit)).fetchall()
            _check_age(rows[0][3] if rows else _first_created(connection, task_id), cutoff)
            return [StoredEvent(seq, created, body) for seq, created, body, _ in rows]

        return await self._read(select, task_id)

    async def wait(self, task_id: str, after: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        waiters = self._waiters.get(task_id)
        if waiters is None:
            waiters = self._waiters[task_id] = _Waiters()
        waiters.count += 1
        try:
            while not self._closed:
                # Take the event before reading: a change committed after the read sets it.
                changed = waiters.changed
                log = await self._db.read(lambda connection: _log_row(connection, task_id))
                if self._closed or (log is not None and log.deleted):
                    return False
                if log is not None and log.next_seq > max(after + 1, 0):
                    return True
                remaining = deadline - loop.time()
                if (log is not None and log.sealed) or remaining <= 0:
                    return False
                try:
                    async with asyncio.timeout(remaining):
                        await changed.wait()
                except TimeoutError:
                    pass
            return False
        finally:
            waiters.count -= 1
            if waiters.count == 0 and self._waiters.get(task_id) is waiters:
                del self._waiters[task_id]

    async def delete(self, task_id: str) -> None:
        now = self._clock()
        until = now + self._tombstone_ttl

        def delete(connection: sqlite3.Connection) -> bool:
            connection.execute("DELETE FROM logs WHERE tombstone_until <= ?", (now,))
            buried = connection.execute(
                "UPDATE logs SET sealed = 1, tombstone_until = ? WHERE task = ? AND tombstone_until IS NULL",
                (until, task_id),
            )
            if buried.rowcount == 0:
                return False
            connection.execute("DELETE FROM events WHERE task = ?", (task_id,))
            return True

        await self._write(task_id, delete)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task_id in list(self._waiters):
            self._wake(task_id)
        await self._db.release()
