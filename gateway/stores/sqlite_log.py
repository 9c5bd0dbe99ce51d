"""The durable embedded `EventLog`: per-task event logs in the `logs` and `events` tables of a SQLite file.

A task's log is one `logs` row (whether it is sealed, once deleted the time its tombstone expires, and
a `next_seq` written when events are deleted) and its retained events, rows `(task, seq, created,
body)` keyed `(task, seq)`. The log's next seq is the larger of the row's `next_seq` and its last
event's seq + 1: an append writes only its events (the newest event is never trimmed), and whatever
deletes events writes `next_seq` first, so deleting them never resets a sequence. Retention is
exactly the memory log's (`gateway.events.log.MemoryEventLog`): an append trims its task by count and
age in the same transaction, and a read or `bounds` that meets an event older than the age first has
it deleted, so no event past its age is ever handed out and none comes back when a wall clock steps
back.

Each log's state (`next_seq`, sealed, deleted, its earliest event) is kept in memory as the last
committed write left it (this process is the file's only writer: `gateway.stores.sqlite` holds a lock),
so `bounds`, `wait` and a read with nothing after its cursor need no trip to a reader thread; a log not
known yet is read once. The writer thread keeps the same for the writes it runs (the log's row as its
transaction leaves it), so an append reads nothing. One `SqliteEventLog` per database file.

`wait` wakes the waiters in this process when an append, seal, create or delete commits.
"""

from __future__ import annotations

import asyncio
import functools
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.events.log import (
    DEFAULT_TOMBSTONE_TTL_S,
    EventLog,
    LogBounds,
    LogSealed,
    StoredEvent,
    check_retention,
)
from gateway.stores.sqlite import KNOWN_STATES, Committed, SqliteDatabase

__all__ = ["SqliteEventLog"]


_LAST_SEQ_PLUS_1 = "coalesce((SELECT seq FROM events WHERE task = ?1 ORDER BY seq DESC LIMIT 1) + 1, 0)"

_LOG_STATE = f"""
SELECT max(next_seq, {_LAST_SEQ_PLUS_1}), sealed, tombstone_until IS NOT NULL,
    (SELECT seq FROM events WHERE task = ?1 ORDER BY seq LIMIT 1),
    (SELECT created FROM events WHERE task = ?1 ORDER BY seq LIMIT 1),
    (SELECT created FROM events WHERE task = ?1 ORDER BY seq DESC LIMIT 1)
FROM logs WHERE task = ?1
"""
"""A log in one statement (fewer steps, fewer hand-offs of the GIL): its next seq, sealed, deleted,
its earliest event (seq, created) and the `created` of its last event: a `_Row`."""

_KEEP_NEXT_SEQ = f"UPDATE logs SET next_seq = max(next_seq, {_LAST_SEQ_PLUS_1}) WHERE task = ?1"
"""Write the log's next seq into its row: before anything deletes its last event."""

_Row = tuple[int, int, int, int | None, float | None, float | None]


@dataclass(frozen=True, slots=True)
class _LogState:
    """A log as of its last committed write (or a read): its row and its earliest retained event."""

    next_seq: int
    sealed: bool
    deleted: bool
    earliest: int | None
    head_created: float | None

    @classmethod
    def of(cls, row: _Row | None) -> _LogState | None:
        """From a `_LOG_STATE` row (None: the task has no log)."""
        if row is None:
            return None
        next_seq, sealed, deleted, earliest, head_created, _ = row
        return cls(next_seq, bool(sealed), bool(deleted), earliest, head_created)

    def has_after(self, after: int) -> bool:
        """Whether an event with ``seq > after`` was ever appended (retained or not)."""
        return self.next_seq > max(after + 1, 0)


_INSERT_EVENT = "INSERT INTO events (task, seq, created, body) VALUES (?, ?, ?, ?)"


_Done = bool | tuple[_Row]
"""What a write job returns: whether it changed the log (whose state is then read afresh), or (in a
1-tuple) the row it changed the log into (when it knows it without another statement)."""


def _trim_job(task_id: str, cutoff: float) -> Callable[[sqlite3.Connection], _Done]:
    """The write that deletes the task's events created before `cutoff` (it wakes nobody)."""

    def trim(connection: sqlite3.Connection) -> bool:
        _drop_older_than(connection, task_id, cutoff)
        return False

    return trim


class _Waiters:
    """The waiters of one task: an event set (and replaced) on every committed change of its log."""

    __slots__ = ("changed", "count")

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.count = 0


def _drop_older_than(connection: sqlite3.Connection, task_id: str, cutoff: float) -> None:
    """Delete the task's events created before `cutoff`: a prefix, as `created` never decreases by seq."""
    connection.execute(_KEEP_NEXT_SEQ, (task_id,))
    keep_from = None
    for seq, created in connection.execute("SELECT seq, created FROM events WHERE task = ? ORDER BY seq", (task_id,)):
        if created >= cutoff:
            keep_from = seq
            break
    if keep_from is None:
        connection.execute("DELETE FROM events WHERE task = ?", (task_id,))
    else:
        connection.execute("DELETE FROM events WHERE task = ? AND seq < ?", (task_id, keep_from))


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
        self._known: Committed[_LogState] = Committed()
        """Logs' states as last committed here (this process is the file's only writer)."""
        self._rows: dict[str, _Row] = {}
        """Writer thread only: logs' rows as the writes run so far leave them (committed, or in the
        transaction under way), oldest first; forgotten when a batch is rolled back."""
        database.on_rollback(self._rows.clear)
        self._closed = False

    @property
    def max_events_per_task(self) -> int:
        return self._max_events

    def _cutoff(self) -> float | None:
        """Events created before this are past their age (None: no age limit)."""
        return None if self._max_age == math.inf else self._clock() - self._max_age

    async def _write(
        self, task_id: str, job: Callable[[sqlite3.Connection], _Done], *, expire_tombstones: float | None = None
    ) -> None:
        """Run a change of the task's log (first expiring the tombstones due at `expire_tombstones`).
        Once committed, even if the caller was cancelled meanwhile: remember the log's new state and,
        if the job says it changed, wake its waiters."""
        if self._closed:
            raise RuntimeError("the event log is closed")

        def run(connection: sqlite3.Connection) -> tuple[bool, _LogState | None, list[str]]:
            expired: list[str] = []
            if expire_tombstones is not None:
                expired = [
                    task
                    for (task,) in connection.execute(
                        "DELETE FROM logs WHERE tombstone_until <= ? RETURNING task", (expire_tombstones,)
                    )
                ]
                for task in expired:
                    self._rows.pop(task, None)
            done = job(connection)
            if isinstance(done, tuple):
                changed, row = True, done[0]
            else:
                changed, row = done, connection.execute(_LOG_STATE, (task_id,)).fetchone()
            self._rows.pop(task_id, None)
            if row is not None:
                self._rows[task_id] = row
                if len(self._rows) > KNOWN_STATES:
                    del self._rows[next(iter(self._rows))]
            return changed, _LogState.of(row), expired

        await self._db.submit(run, functools.partial(self._committed, task_id))

    def _committed(self, task_id: str, done: tuple[bool, _LogState | None, list[str]]) -> None:
        changed, state, expired = done
        for task in expired:
            self._known.forget(task)
        self._known.committed(task_id, None if self._closed else state)
        if changed:
            self._wake(task_id)

    async def _state(self, task_id: str) -> _LogState | None:
        """The log's state, its events past their age deleted first (None: no log)."""
        while True:
            state = self._known.get(task_id)
            if state is None:
                commits = self._known.commits
                state = _LogState.of(
                    await self._db.read(lambda connection: connection.execute(_LOG_STATE, (task_id,)).fetchone())
                )
                # No write committed meanwhile: what was read is current.
                if commits == self._known.commits and not self._closed:
                    self._known.remember(task_id, state)
            cutoff = self._cutoff()
            if state is None or cutoff is None or state.head_created is None or state.head_created >= cutoff:
                return state
            await self._write(task_id, _trim_job(task_id, cutoff))

    def _wake(self, task_id: str) -> None:
        waiters = self._waiters.get(task_id)
        if waiters is not None:
            waiters.changed.set()
            waiters.changed = asyncio.Event()

    async def append(
        self,
        task_id: str,
        bodies: Sequence[bytes],
        *,
        seal: bool = False,
        epilogue: bool = False,
        key: str | None = None,
    ) -> int:
        rows = list(bodies)
        clock = self._clock()
        cutoff = self._cutoff()
        first = 0

        def append(connection: sqlite3.Connection) -> _Done:
            nonlocal first
            state = self._rows.get(task_id) or connection.execute(_LOG_STATE, (task_id,)).fetchone()
            if state is None:
                connection.execute("INSERT INTO logs (task) VALUES (?)", (task_id,))
                state = (0, False, False, None, None, None)
            next_seq, sealed, deleted, earliest, head_created, last_created = state
            if deleted or (sealed and not epilogue):
                raise LogSealed(
                    f"the log of task {task_id!r} is {'deleted' if deleted else 'sealed'}: it takes no more events"
                )
            first = next_seq
            known = True  # whether the new earliest event is known without reading it back
            if rows:
                # Never older than the last event: `created` never decreases by seq.
                created = last_created = clock if last_created is None else max(clock, last_created)
                events = [(task_id, first + i, created, body) for i, body in enumerate(rows)]
                if len(events) == 1:  # executemany costs about twice as much for one row
                    connection.execute(_INSERT_EVENT, events[0])
                else:
                    connection.executemany(_INSERT_EVENT, events)
                if earliest is None:
                    earliest, head_created = first, created
                keep_from = first + len(rows) - self._max_events
                if earliest < keep_from:
                    connection.execute("DELETE FROM events WHERE task = ? AND seq < ?", (task_id, keep_from))
                    earliest, known = keep_from, keep_from >= first
                    if known:
                        head_created = created
                    # else an older event is the earliest now: its `created` is at least the old
                    # earliest's, so the age check below still errs only towards a scan
                if cutoff is not None and head_created is not None and head_created < cutoff:
                    _drop_older_than(connection, task_id, cutoff)
                    known = False
            if not (rows or seal):
                return False
            if seal and not sealed:
                connection.execute("UPDATE logs SET sealed = 1 WHERE task = ?", (task_id,))
            if not known:
                return True
            return ((first + len(rows), bool(sealed) or seal, False, earliest, head_created, last_created),)

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

    async def bounds(self, task_id: str) -> LogBounds | None:
        if self._closed:
            return None
        state = await self._state(task_id)
        return None if state is None else LogBounds(state.earliest, state.next_seq, state.sealed or state.deleted)

    async def read(self, task_id: str, after: int, limit: int) -> list[StoredEvent]:
        if self._closed or limit <= 0:
            return []
        state = await self._state(task_id)
        if state is None or state.earliest is None or state.next_seq <= after + 1:
            return []
        # Up to the state known on the loop, never past it: a reader thread sees a write as soon as it
        # commits, the loop only once its callback ran; a cursor past `bounds` would be refused.
        stop = state.next_seq

        def select(connection: sqlite3.Connection) -> list[StoredEvent]:
            rows = connection.execute(
                "SELECT seq, created, body FROM events WHERE task = ? AND seq > ? AND seq < ? ORDER BY seq LIMIT ?",
                (task_id, after, stop, limit),
            )
            return [StoredEvent(seq, created, body) for seq, created, body in rows]

        return await self._db.read(select)

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
                log = await self._state(task_id)
                if self._closed or (log is not None and log.deleted):
                    return False
                if log is not None and log.has_after(after):
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
            buried = connection.execute(
                f"UPDATE logs SET sealed = 1, tombstone_until = ?2, next_seq = max(next_seq, {_LAST_SEQ_PLUS_1})"
                " WHERE task = ?1 AND tombstone_until IS NULL",
                (task_id, until),
            )
            if buried.rowcount == 0:
                return False
            connection.execute("DELETE FROM events WHERE task = ?", (task_id,))
            return True

        await self._write(task_id, delete, expire_tombstones=now)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._known.clear()
        for task_id in list(self._waiters):
            self._wake(task_id)
        await self._db.release()
