"""The durable embedded `TaskStore`: task records and kept outcomes in the `tasks` table of a SQLite file.

One row per task: the record as JSON (`TaskRecord.to_dict`), with the columns the store queries or
changes on its own beside it (owner, status, expiry, the log's `next_seq`) and the terminal outcome's
bytes (and whether an eviction replaced them). A record's `next_seq` is read as the larger of its
column and the next seq of the task's log in the same file (`SqliteEventLog`), so an append that
advances it needs no write of its own: `advance_next_seq` writes the column only for a seq the log
(as this process last committed it) has not reached. The row's autoincrement `number` is the creation
order: `list_owned`'s order and cursor, never reused, also across restarts. Compare-and-set updates
are atomic because one writer runs them all (`gateway.stores.sqlite`).

Records are also kept in memory as the last committed write left them (this process is the file's
only writer), so `get` of a known task (every tasks/get, tasks/stream and tasks/result) costs no trip
to a reader thread; a record not known yet is read once. Every id in the file is known too (read once,
on the writer, at the first lookup; then kept by the commits), so an unknown id is answered from
memory as a known one is: how long a lookup takes tells nothing of whether the id exists.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3

import orjson

from gateway.stores.sqlite import Committed, SqliteDatabase
from gateway.stores.sqlite_log import SqliteEventLog, last_seq_plus_1
from gateway.tasks.records import TaskRecord, TaskStatus
from gateway.tasks.store import InvalidCursor, LiveRecord, TaskExists, TaskPage, TaskStore

__all__ = ["SqliteTaskStore"]

_COLUMNS = (
    "record, status,"
    f" max(next_seq, coalesce((SELECT max(logs.next_seq, {last_seq_plus_1('tasks.id')})"
    " FROM logs WHERE logs.task = tasks.id), 0))"
)
"""What a record is read back from (`_record`): its `next_seq` the larger of the column's and its log's."""


def _record(row: tuple[bytes, str, int]) -> TaskRecord:
    data, status, next_seq = row
    return TaskRecord.from_dict({**orjson.loads(data), "status": status, "next_seq": next_seq})


class SqliteTaskStore(TaskStore):
    """Records by id in one SQLite file, each owner's in creation order, the kept outcomes beside them."""

    def __init__(self, database: SqliteDatabase, max_outcome_bytes: int, log: SqliteEventLog | None = None) -> None:
        """`log`: the event log in the same file, whose next seqs make the records' (None: every
        `advance_next_seq` writes)."""
        super().__init__(max_outcome_bytes)
        self._db = database.acquire()
        self._log = log
        self._known: Committed[TaskRecord] = Committed()
        """Records as last committed here (this process is the file's only writer)."""
        self._ids: set[str] | None = None
        """Every task id in the file, once read (`_every_id`); creates and expiries keep it."""
        self._reading_ids: asyncio.Future[set[str]] | None = None

    async def create(self, record: TaskRecord) -> None:
        def insert(connection: sqlite3.Connection) -> None:
            inserted = connection.execute(
                "INSERT INTO tasks (id, owner, status, expires_at, next_seq, record) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO NOTHING",
                (
                    record.id,
                    record.owner,
                    record.status.value,
                    record.expires_at,
                    record.next_seq,
                    orjson.dumps(record.to_dict()),
                ),
            )
            if inserted.rowcount == 0:
                raise TaskExists(f"a task with id {record.id!r} exists")

        def committed(_: None) -> None:
            self._known.committed(record.id, record)
            if self._ids is not None:
                self._ids.add(record.id)

        await self._db.submit(insert, committed)

    async def _every_id(self) -> set[str]:
        """Every task id in the file. Read once on the writer, in order with the writes: the commits
        after it (whose hooks run after its own) keep it."""
        if self._ids is not None:
            return self._ids
        if self._reading_ids is None:

            def select(connection: sqlite3.Connection) -> set[str]:
                return {row[0] for row in connection.execute("SELECT id FROM tasks")}

            def read(ids: set[str]) -> None:
                self._ids = ids

            self._reading_ids = self._db.submit(select, read)
        try:
            return await asyncio.shield(self._reading_ids)
        except Exception:
            self._reading_ids = None  # a failed read is tried again by the next lookup
            raise

    async def get(self, owner: str, task_id: str) -> TaskRecord | None:
        record = await self.find(task_id)
        return record if record is not None and record.owner == owner else None

    async def find(self, task_id: str) -> TaskRecord | None:
        known = self._known.get(task_id)
        if known is not None:
            return known
        if task_id not in await self._every_id():
            return None  # from memory, as a known record is: no trip to a reader thread

        def select(connection: sqlite3.Connection) -> TaskRecord | None:
            row = connection.execute(f"SELECT {_COLUMNS} FROM tasks WHERE id = ?", (task_id,)).fetchone()
            return None if row is None else _record(row)

        commits = self._known.commits
        record = await self._db.read(select)
        if commits == self._known.commits:  # no write committed meanwhile: what was read is current
            self._known.remember(task_id, record)
        return record

    async def list_owned(self, owner: str, cursor: str | None, limit: int) -> TaskPage:
        def select(connection: sqlite3.Connection) -> TaskPage:
            after = 0
            if cursor is not None:
                last = connection.execute("SELECT seq FROM sqlite_sequence WHERE name = 'tasks'").fetchone()
                if not cursor.isdigit() or int(cursor) > (last[0] if last else 0):
                    raise InvalidCursor(f"unknown cursor {cursor!r}")
                after = int(cursor)
            rows = connection.execute(
                f"SELECT number, {_COLUMNS} FROM tasks WHERE owner = ? AND number > ? ORDER BY number LIMIT ?",
                (owner, after, limit + 1),
            ).fetchall()
            page = [_record(row[1:]) for row in rows[:limit]]
            more = len(rows) > limit and limit > 0
            return TaskPage(page, str(rows[limit - 1][0]) if more else None)

        return await self._db.read(select)

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

        def update(connection: sqlite3.Connection) -> TaskRecord | None:
            row = connection.execute(f"SELECT {_COLUMNS} FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if row is None:
                return None
            record = _record(row)
            if record.terminal or record.status is not expected:
                return None
            record = dataclasses.replace(
                record,
                status=status,
                status_message=message,
                last_updated_at=updated_at,
                outcome_summary=outcome_summary if status.terminal else record.outcome_summary,
            )
            connection.execute(
                "UPDATE tasks SET status = ?, record = ?, outcome = coalesce(?, outcome) WHERE id = ?",
                (status.value, orjson.dumps(record.to_dict()), outcome, task_id),
            )
            return record

        def committed(record: TaskRecord | None) -> None:
            if record is not None:  # a refused compare-and-set (or a missing task) changed nothing
                self._known.committed(task_id, record)

        return await self._db.submit(update, committed)

    async def outcome(self, task_id: str) -> bytes | None:
        def select(connection: sqlite3.Connection) -> bytes | None:
            row = connection.execute("SELECT outcome FROM tasks WHERE id = ?", (task_id,)).fetchone()
            return None if row is None else row[0]

        return await self._db.read(select)

    async def replace_outcome(self, task_id: str, outcome: bytes) -> bool:
        self.check_outcome(outcome)
        terminal = tuple(status.value for status in TaskStatus if status.terminal)

        def update(connection: sqlite3.Connection) -> bool:
            changed = connection.execute(
                "UPDATE tasks SET outcome = ?, outcome_replaced = 1 WHERE id = ? AND status IN (?, ?, ?)",
                (outcome, task_id, *terminal),
            )
            return changed.rowcount > 0

        return await self._db.write(update)

    async def advance_next_seq(self, task_id: str, next_seq: int) -> None:
        def update(connection: sqlite3.Connection) -> None:
            connection.execute(
                "UPDATE tasks SET next_seq = ? WHERE id = ? AND next_seq < ?", (next_seq, task_id, next_seq)
            )

        def committed(_: None) -> None:
            known = self._known.get(task_id)
            if known is not None and known.next_seq < next_seq:
                known = dataclasses.replace(known, next_seq=next_seq)
            self._known.committed(task_id, known)

        if self._log is not None and self._log.reached(task_id, next_seq):
            committed(None)  # the log's committed events hold it: a read of the row derives it from them
            return
        await self._db.submit(update, committed)

    async def unfinished(self) -> list[TaskRecord]:
        running = tuple(status.value for status in TaskStatus if not status.terminal)

        def select(connection: sqlite3.Connection) -> list[TaskRecord]:
            # The partial index `tasks_unfinished` holds exactly these rows.
            rows = connection.execute(
                f"SELECT {_COLUMNS} FROM tasks WHERE status IN (?, ?) ORDER BY number", running
            ).fetchall()
            return [_record(row) for row in rows]

        return await self._db.read(select)

    async def live(self) -> list[LiveRecord]:
        def select(connection: sqlite3.Connection) -> list[LiveRecord]:
            rows = connection.execute(
                f"SELECT {_COLUMNS}, CASE WHEN outcome_replaced THEN NULL ELSE length(outcome) END"
                " FROM tasks ORDER BY number"
            ).fetchall()
            return [LiveRecord(_record(row[:3]), row[3]) for row in rows]

        return await self._db.read(select)

    async def expire(self, now: float) -> list[TaskRecord]:
        def delete(connection: sqlite3.Connection) -> list[TaskRecord]:
            rows = connection.execute(
                f"SELECT {_COLUMNS} FROM tasks WHERE expires_at <= ? ORDER BY number", (now,)
            ).fetchall()
            if rows:
                connection.execute("DELETE FROM tasks WHERE expires_at <= ?", (now,))
            return [_record(row) for row in rows]

        def committed(expired: list[TaskRecord]) -> None:
            for record in expired:
                self._known.committed(record.id, None)
                if self._ids is not None:
                    self._ids.discard(record.id)

        return await self._db.submit(delete, committed)

    async def close(self) -> None:
        await self._db.release()
