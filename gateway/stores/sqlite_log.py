"""The durable embedded `EventLog`: per-task event logs in the `logs`, `events` and `staged` tables of SQLite.

A task's log is one `logs` row (whether it is sealed, once deleted the time its tombstone expires, and
a `next_seq` written when events are deleted) and its retained events, rows `(task, seq, created,
body)`. The log's next seq is the larger of the row's `next_seq` and its last event's seq + 1: an
append writes only its events (the newest event is never trimmed), and whatever deletes events writes
`next_seq` first, so deleting them never resets a sequence.

Events are kept `(task, seq)` in order in `events`, but a small append goes to `staged` first, kept in
insertion order: in `events` a commit of one event for each of 64 tasks writes 64 B-tree pages, in
`staged` one or two. Once `FOLD_ROWS` events are staged, the append that reaches it moves them all
into `events` in one statement (a fold: a few events per task per page). A task's staged seqs are
always above its seqs in `events` (a batch goes straight to `events` after its task's staged events
are moved there, and a fold moves everything), so a read takes each table's first events after its
cursor and joins them. `staged` has an index on `(task, seq)` (its small entries add a few pages per commit, not
one per task): a read never scans it, and a write that deletes a task's staged events by count or
age moves that task's into `events` first. A file opened again folds what an earlier process left
staged, at its first append.

The appends of one log between two of its other writes are one write job (`_Appends`): the writer
thread takes them all, assigns their seqs from each log's row it keeps, and stages their events with
one statement.

Retention is exactly the memory log's (`gateway.events.log.MemoryEventLog`): an append trims its task by count and
age in the same transaction, and a read or `bounds` that meets an event older than the age first has
it deleted, so no event past its age is ever handed out and none comes back when a wall clock steps
back.

Each log's state (`next_seq`, sealed, deleted, its earliest event) is kept in memory as the last
committed write left it (this process is the file's only writer: `gateway.stores.sqlite` holds a lock),
so `bounds`, `wait` and a read with nothing after its cursor need no trip to a reader thread; a log not
known yet is read once. The writer thread keeps the same for the writes it runs (the log's row as its
transaction leaves it), and which tasks have events staged from which seq, so an append reads nothing.
One `SqliteEventLog` per database file.

`wait` wakes the waiters in this process when an append, seal, create or delete commits.
"""

from __future__ import annotations

import asyncio
import functools
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.events.log import (
    DEFAULT_TOMBSTONE_TTL_S,
    EventLog,
    LogBounds,
    LogSealed,
    StoredEvent,
)
from gateway.stores.sqlite import KNOWN_STATES, Committed, SqliteDatabase

__all__ = ["SqliteEventLog", "last_seq_plus_1"]


FOLD_ROWS = 2048
"""Staged events moved into `events` at once: the larger, the fewer pages per event a fold writes (and
the longer the one append that folds waits)."""

DIRECT_ROWS = 16
"""An append of at least this many events goes straight to `events` (it fills its pages there as well
as in `staged`, and would only be moved again), its task's staged events moved there first."""


# A task's staged seqs are above its seqs in events: staged first for the last, events first for the first.
def last_seq_plus_1(task: str) -> str:
    """SQL: the seq after the last event of the log of `task` (an SQL expression), 0 if it has none."""
    return (
        f"coalesce(coalesce((SELECT max(seq) FROM staged WHERE task = {task}),"
        f" (SELECT seq FROM events WHERE task = {task} ORDER BY seq DESC LIMIT 1)) + 1, 0)"
    )


_LAST_SEQ_PLUS_1 = last_seq_plus_1("?1")
_STAGED_FROM = "(SELECT min(seq) FROM staged WHERE task = ?1)"

_LOG_STATE = f"""
SELECT max(next_seq, {_LAST_SEQ_PLUS_1}), sealed, tombstone_until IS NOT NULL,
    coalesce((SELECT seq FROM events WHERE task = ?1 ORDER BY seq LIMIT 1), {_STAGED_FROM}),
    coalesce((SELECT created FROM events WHERE task = ?1 ORDER BY seq LIMIT 1),
        (SELECT created FROM staged WHERE task = ?1 ORDER BY seq LIMIT 1)),
    coalesce((SELECT created FROM staged WHERE task = ?1 ORDER BY seq DESC LIMIT 1),
        (SELECT created FROM events WHERE task = ?1 ORDER BY seq DESC LIMIT 1)),
    {_STAGED_FROM}
FROM logs WHERE task = ?1
"""
"""A log in one statement (fewer steps, fewer hand-offs of the GIL): its next seq, sealed, deleted,
its earliest event (seq, created), the `created` of its last event and its first staged seq: a `_Row`."""

_KEEP_NEXT_SEQ = f"UPDATE logs SET next_seq = max(next_seq, {_LAST_SEQ_PLUS_1}) WHERE task = ?1"
"""Write the log's next seq into its row: before anything deletes its last event."""

_Row = tuple[int, int, int, int | None, float | None, float | None, int | None]

_READ_EVENTS = "SELECT seq, created, body FROM events WHERE task = ?1 AND seq > ?2 AND seq < ?3 ORDER BY seq LIMIT ?4"
_READ_STAGED = "SELECT seq, created, body FROM staged WHERE task = ?1 AND seq > ?2 AND seq < ?3 ORDER BY seq LIMIT ?4"
_READ_BOTH = f"SELECT * FROM ({_READ_EVENTS}) UNION ALL SELECT * FROM ({_READ_STAGED})"
"""One statement, so one snapshot: a fold committed between two statements would hide the moved events."""

_FOLD = "INSERT INTO events (task, seq, created, body) SELECT task, seq, created, body FROM staged ORDER BY task, seq"
_FOLD_TASK = (
    "INSERT INTO events (task, seq, created, body) SELECT task, seq, created, body FROM staged WHERE task = ?"
    " ORDER BY seq"
)


@dataclass(frozen=True, slots=True)
class _LogState:
    """A log as of its last committed write (or a read): its row and its earliest retained event."""

    next_seq: int
    sealed: bool
    deleted: bool
    earliest: int | None
    head_created: float | None
    staged_from: int | None
    """The first seq in `staged` (None: nothing staged); once folded, reading both tables still finds it."""

    @classmethod
    def of(cls, row: _Row | None) -> _LogState | None:
        """From a `_LOG_STATE` row (None: the task has no log)."""
        if row is None:
            return None
        next_seq, sealed, deleted, earliest, head_created, _, staged_from = row
        return cls(next_seq, bool(sealed), bool(deleted), earliest, head_created, staged_from)

    def has_after(self, after: int) -> bool:
        """Whether an event with ``seq > after`` was ever appended (retained or not)."""
        return self.next_seq > max(after + 1, 0)


_INSERT_EVENT = "INSERT INTO events (task, seq, created, body) VALUES (?, ?, ?, ?)"
_STAGE_EVENT = "INSERT INTO staged (task, seq, created, body) VALUES (?, ?, ?, ?)"


_EventRow = tuple[str, int, float, bytes]


@dataclass(slots=True)
class _Append:
    """One `append` call: what the writer thread needs, and the caller's future."""

    task_id: str
    bodies: list[bytes]
    seal: bool
    epilogue: bool
    clock: float
    cutoff: float | None
    future: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


_Appended = tuple[int, "_LogState | None", bool] | LogSealed
"""An append's outcome: its first seq, the log's state after it and whether it changed the log; or its refusal."""


class _Appends:
    """The appends of one log between two of its other writes, until the writer thread takes them: run as
    one write job, in order (fewer jobs and futures, and one statement stages their events). A lock, as
    the loop adds while the writer thread may be taking them; one added too late opens the next."""

    __slots__ = ("_items", "_lock", "_taken")

    def __init__(self, item: _Append) -> None:
        self._items = [item]
        self._lock = threading.Lock()
        self._taken = False

    def add(self, item: _Append) -> bool:
        """Add `item` (False: already taken, or failed)."""
        with self._lock:
            if self._taken:
                return False
            self._items.append(item)
            return True

    def take(self) -> list[_Append]:
        """Every append added, none after: the writer thread runs them; or the loop fails them."""
        with self._lock:
            self._taken = True
            return self._items


def _fail_appends(appends: _Appends, done: asyncio.Future[object]) -> None:
    """The write of `appends` failed (the batch was rolled back, or never ran): each caller gets why."""
    if done.cancelled() or done.exception() is None:
        return
    for item in appends.take():
        if not item.future.done():
            item.future.set_exception(done.exception())  # type: ignore[arg-type]


class _Waiters:
    """The waiters of one task: an event set (and replaced) on every committed change of its log."""

    __slots__ = ("changed", "count")

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.count = 0


def _drop_older_than(connection: sqlite3.Connection, task_id: str, cutoff: float) -> None:
    """Delete the task's events created before `cutoff`: a prefix, as `created` never decreases by seq.
    The task has nothing staged (`SqliteEventLog._unstage`)."""
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
        self.retain(max_events_per_task, max_event_age_s)
        self._db = database.acquire()
        self._tombstone_ttl = tombstone_ttl_s
        self._clock = clock
        self._waiters: dict[str, _Waiters] = {}
        self._known: Committed[_LogState] = Committed()
        """Logs' states as last committed here (this process is the file's only writer)."""
        self._rows: dict[str, _Row] = {}
        """Writer thread only: logs' rows as the writes run so far leave them (committed, or in the
        transaction under way), oldest first; forgotten when a batch is rolled back."""
        self._staged: dict[str, int] | None = None
        """Writer thread only: each task with staged events, its first staged seq, as the writes run so
        far leave `staged` (None: not known, at open and after a rollback: the next write folds)."""
        self._staged_rows = 0
        """Writer thread only: how many events `staged` holds (while `_staged` is known)."""
        self._appends: _Appends | None = None
        """The appends submitted since the last other write of this log, if the writer has not taken them."""
        database.on_rollback(self._forget_writes)
        self._closed = False

    @property
    def max_events_per_task(self) -> int:
        return self._max_events

    def _forget_writes(self) -> None:
        """A batch was rolled back: what the writer thread kept of the file is no longer true."""
        self._rows.clear()
        self._staged = None

    def _fold(self, connection: sqlite3.Connection) -> dict[str, int]:
        """Writer thread: move every staged event into `events`; the (empty) staged tasks."""
        connection.execute(_FOLD)
        connection.execute("DELETE FROM staged")
        self._staged, self._staged_rows = {}, 0
        return self._staged

    def _staging(self, connection: sqlite3.Connection) -> dict[str, int]:
        """Writer thread: the tasks with staged events, first folding what is not known."""
        return self._fold(connection) if self._staged is None else self._staged

    def _unstage(self, connection: sqlite3.Connection, task_id: str, below: float = math.inf) -> None:
        """Writer thread: if the task has staged events below seq `below` (to be deleted, or followed by
        a batch written straight to `events`), move the task's staged events into `events` (its own
        pages only: `staged` is indexed by task)."""
        staged = self._staging(connection)
        if staged.get(task_id, math.inf) < below:
            connection.execute(_FOLD_TASK, (task_id,))
            self._staged_rows -= connection.execute("DELETE FROM staged WHERE task = ?", (task_id,)).rowcount
            del staged[task_id]

    def _trim_job(self, task_id: str, cutoff: float) -> Callable[[sqlite3.Connection], bool]:
        """The write that deletes the task's events created before `cutoff` (it wakes nobody)."""

        def trim(connection: sqlite3.Connection) -> bool:
            self._unstage(connection, task_id)
            _drop_older_than(connection, task_id, cutoff)
            return False

        return trim

    def _cutoff(self) -> float | None:
        """Events created before this are past their age (None: no age limit)."""
        return None if self._max_age == math.inf else self._clock() - self._max_age

    async def _write(
        self, task_id: str, job: Callable[[sqlite3.Connection], bool], *, expire_tombstones: float | None = None
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
            changed = job(connection)
            row = connection.execute(_LOG_STATE, (task_id,)).fetchone()
            self._keep_row(task_id, row)
            return changed, _LogState.of(row), expired

        self._appends = None  # an append submitted after this write runs after it
        await self._db.submit(run, functools.partial(self._committed, task_id))

    def _keep_row(self, task_id: str, row: _Row | None) -> None:
        """Writer thread: the log's row as the write just run leaves it (the least recently kept dropped)."""
        self._rows.pop(task_id, None)
        if row is not None:
            self._rows[task_id] = row
            if len(self._rows) > KNOWN_STATES:
                del self._rows[next(iter(self._rows))]

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
            await self._write(task_id, self._trim_job(task_id, cutoff))

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
        if self._closed:
            raise RuntimeError("the event log is closed")
        item = _Append(task_id, list(bodies), seal, epilogue, self._clock(), self._cutoff())
        appends = self._appends
        if appends is None or not appends.add(item):
            appends = _Appends(item)
            done = self._db.submit(functools.partial(self._run_appends, appends), self._appended)
            done.add_done_callback(functools.partial(_fail_appends, appends))
            self._appends = appends
        return await item.future

    def _run_appends(self, appends: _Appends, connection: sqlite3.Connection) -> list[tuple[_Append, _Appended]]:
        """Writer thread: run the appends of `appends` in order, their staged events in one statement."""
        staging: list[_EventRow] = []

        def flush() -> None:
            """Stage what is waiting: before any other statement, which may depend on it."""
            if staging:
                connection.executemany(_STAGE_EVENT, staging)
                staging.clear()

        outcomes: list[tuple[_Append, _Appended]] = []
        for item in appends.take():
            try:
                outcomes.append((item, self._append(connection, item, staging, flush)))
            except LogSealed as exc:
                outcomes.append((item, exc))
        flush()
        return outcomes

    def _append(
        self, connection: sqlite3.Connection, item: _Append, staging: list[_EventRow], flush: Callable[[], None]
    ) -> _Appended:
        """Writer thread: one append; its events to stage go to `staging`, and `flush` stages them before
        any other statement. LogSealed before it changes anything."""
        task_id, rows = item.task_id, item.bodies
        state = self._rows.get(task_id)
        if state is None:
            flush()
            state = connection.execute(_LOG_STATE, (task_id,)).fetchone()
            if state is None:
                connection.execute("INSERT INTO logs (task) VALUES (?)", (task_id,))
                state = (0, False, False, None, None, None, None)
        next_seq, sealed, deleted, earliest, head_created, last_created, _ = state
        if deleted or (sealed and not item.epilogue):
            raise LogSealed(
                f"the log of task {task_id!r} is {'deleted' if deleted else 'sealed'}: it takes no more events"
            )
        first = next_seq
        known = True  # whether the new earliest event is known without reading it back
        if rows:
            # Never older than the last event: `created` never decreases by seq.
            created = last_created = item.clock if last_created is None else max(item.clock, last_created)
            self._put(connection, [(task_id, first + i, created, body) for i, body in enumerate(rows)], staging, flush)
            if earliest is None:
                earliest, head_created = first, created
            keep_from = first + len(rows) - self._max_events
            if earliest < keep_from:
                flush()
                self._unstage(connection, task_id, keep_from)
                connection.execute("DELETE FROM events WHERE task = ? AND seq < ?", (task_id, keep_from))
                earliest, known = keep_from, keep_from >= first
                if known:
                    head_created = created
                # else an older event is the earliest now: its `created` is at least the old
                # earliest's, so the age check below still errs only towards a scan
            if item.cutoff is not None and head_created is not None and head_created < item.cutoff:
                flush()
                self._unstage(connection, task_id)
                _drop_older_than(connection, task_id, item.cutoff)
                known = False
        if item.seal and not sealed:
            connection.execute("UPDATE logs SET sealed = 1 WHERE task = ?", (task_id,))
        if not (rows or item.seal):
            return first, _LogState.of(state), False
        if known:
            staged_from = self._staging(connection).get(task_id)
            ended = bool(sealed) or item.seal
            state = (first + len(rows), ended, False, earliest, head_created, last_created, staged_from)
        else:
            flush()
            state = connection.execute(_LOG_STATE, (task_id,)).fetchone()
        self._keep_row(task_id, state)
        return first, _LogState.of(state), True

    def _put(
        self,
        connection: sqlite3.Connection,
        events: list[_EventRow],
        staging: list[_EventRow],
        flush: Callable[[], None],
    ) -> None:
        """Writer thread: one append's events (of one task, in seq order) to `staging`, to be staged; or,
        for a batch, straight into `events` (after the task's staged events). Folds once enough are staged."""
        task_id, first = events[0][0], events[0][1]
        if self._staged is None:
            flush()
        staged = self._staging(connection)
        if len(events) < DIRECT_ROWS:
            staging += events
            staged.setdefault(task_id, first)
            self._staged_rows += len(events)
            if self._staged_rows >= FOLD_ROWS:
                flush()
                self._fold(connection)
        else:
            flush()
            self._unstage(connection, task_id)
            connection.executemany(_INSERT_EVENT, events)

    def _appended(self, outcomes: list[tuple[_Append, _Appended]]) -> None:
        """On the loop, once committed: each append's log state remembered, its waiters woken, its caller
        answered (if still waiting)."""
        for item, outcome in outcomes:
            if isinstance(outcome, LogSealed):
                if not item.future.done():
                    item.future.set_exception(outcome)
                continue
            first, state, changed = outcome
            self._known.committed(item.task_id, None if self._closed else state)
            if changed:
                self._wake(item.task_id)
            if not item.future.done():
                item.future.set_result(first)

    def reached(self, task_id: str, next_seq: int) -> bool:
        """Whether the task's log, as last committed here, has a next seq of at least `next_seq`."""
        state = self._known.get(task_id)
        return state is not None and state.next_seq >= next_seq

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

        if state.staged_from is None:  # the common case: every event of this log is in `events`

            def select(connection: sqlite3.Connection) -> list[StoredEvent]:
                rows = connection.execute(_READ_EVENTS, (task_id, after, stop, limit))
                return [StoredEvent(seq, created, body) for seq, created, body in rows]

        else:

            def select(connection: sqlite3.Connection) -> list[StoredEvent]:
                rows = connection.execute(_READ_BOTH, (task_id, after, stop, limit)).fetchall()
                rows.sort(key=lambda row: row[0])  # events' seqs first; SQL promises no order of a UNION ALL
                return [StoredEvent(seq, created, body) for seq, created, body in rows[:limit]]

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
            staged = self._staging(connection)  # before anything is deleted: it may fold
            buried = connection.execute(
                f"UPDATE logs SET sealed = 1, tombstone_until = ?2, next_seq = max(next_seq, {_LAST_SEQ_PLUS_1})"
                " WHERE task = ?1 AND tombstone_until IS NULL",
                (task_id, until),
            )
            if buried.rowcount == 0:
                return False
            connection.execute("DELETE FROM events WHERE task = ?", (task_id,))
            if staged.pop(task_id, None) is not None:
                self._staged_rows -= connection.execute("DELETE FROM staged WHERE task = ?", (task_id,)).rowcount
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
