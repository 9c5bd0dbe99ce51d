"""The embedded, in-memory `TaskStore`: every record in this process's memory, lost on restart.

For tests, throw-away runs and a single process. Records are immutable, so a reader's record is never
changed under it, and no method awaits: each one is atomic on the event loop.
"""

from __future__ import annotations

import dataclasses

from gateway.tasks.records import TaskRecord, TaskStatus
from gateway.tasks.store import InvalidCursor, LiveRecord, TaskExists, TaskPage, TaskStore

__all__ = ["MemoryTaskStore"]


class MemoryTaskStore(TaskStore):
    """Records by id, each owner's ids in creation order, and the kept outcomes beside them.

    A `list_owned` cursor is the creation number of the last record on the page: records that expire
    meanwhile cannot shift a walk, as an offset would."""

    def __init__(self, max_outcome_bytes: int) -> None:
        super().__init__(max_outcome_bytes)
        self._records: dict[str, TaskRecord] = {}
        self._numbers: dict[str, int] = {}
        """Task id -> its creation number (from 1): the `list_owned` order and cursor."""
        self._owned: dict[str, dict[str, None]] = {}
        """Owner -> their task ids in creation order (a dict as an ordered set)."""
        self._outcomes: dict[str, bytes] = {}
        self._replaced: set[str] = set()
        """Tasks whose outcome `replace_outcome` replaced (`live` reports none kept for them)."""
        self._next_seqs: dict[str, int] = {}
        """Task id -> the log's next_seq as last advanced: kept apart, as appends advance it far more
        often than anyone reads a record, and written into the record on its next read."""
        self._last_number = 0

    async def create(self, record: TaskRecord) -> None:
        if record.id in self._records:
            raise TaskExists(f"a task with id {record.id!r} exists")
        self._records[record.id] = record
        self._next_seqs[record.id] = record.next_seq
        self._last_number += 1
        self._numbers[record.id] = self._last_number
        self._owned.setdefault(record.owner, {})[record.id] = None

    def _current(self, record: TaskRecord) -> TaskRecord:
        """`record` with the latest `next_seq` in it."""
        next_seq = self._next_seqs[record.id]
        if record.next_seq != next_seq:
            record = self._records[record.id] = dataclasses.replace(record, next_seq=next_seq)
        return record

    def _lookup(self, task_id: str) -> TaskRecord | None:
        record = self._records.get(task_id)
        return None if record is None else self._current(record)

    async def get(self, owner: str, task_id: str) -> TaskRecord | None:
        record = self._lookup(task_id)
        return record if record is not None and record.owner == owner else None

    async def find(self, task_id: str) -> TaskRecord | None:
        return self._lookup(task_id)

    async def list_owned(self, owner: str, cursor: str | None, limit: int) -> TaskPage:
        after = 0
        if cursor is not None:
            if not cursor.isdigit() or int(cursor) > self._last_number:
                raise InvalidCursor(f"unknown cursor {cursor!r}")
            after = int(cursor)
        page: list[TaskRecord] = []
        more = False
        for task_id in self._owned.get(owner, {}):
            if self._numbers[task_id] <= after:
                continue
            if len(page) == limit:
                more = True
                break
            page.append(self._current(self._records[task_id]))
        next_cursor = str(self._numbers[page[-1].id]) if more and page else None
        return TaskPage(page, next_cursor)

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
        record = self._lookup(task_id)
        if record is None or record.terminal or record.status is not expected:
            return None
        record = self._records[task_id] = dataclasses.replace(
            record,
            status=status,
            status_message=message,
            last_updated_at=updated_at,
            outcome_summary=outcome_summary if status.terminal else record.outcome_summary,
        )
        if outcome is not None:
            self._outcomes[task_id] = outcome
        return record

    async def outcome(self, task_id: str) -> bytes | None:
        return self._outcomes.get(task_id)

    async def replace_outcome(self, task_id: str, outcome: bytes) -> bool:
        self.check_outcome(outcome)
        record = self._records.get(task_id)
        if record is None or not record.terminal:
            return False
        self._outcomes[task_id] = outcome
        self._replaced.add(task_id)
        return True

    async def advance_next_seq(self, task_id: str, next_seq: int) -> None:
        known = self._next_seqs.get(task_id)
        if known is not None and next_seq > known:
            self._next_seqs[task_id] = next_seq

    async def unfinished(self) -> list[TaskRecord]:
        return [self._current(record) for record in self._records.values() if not record.terminal]

    async def live(self) -> list[LiveRecord]:
        return [
            LiveRecord(self._current(record), None if task_id in self._replaced else _size(self._outcomes.get(task_id)))
            for task_id, record in self._records.items()
        ]

    async def expire(self, now: float) -> list[TaskRecord]:
        expired = [self._current(record) for record in list(self._records.values()) if record.expires_at <= now]
        for record in expired:
            del self._records[record.id], self._numbers[record.id], self._next_seqs[record.id]
            self._outcomes.pop(record.id, None)
            self._replaced.discard(record.id)
            owned = self._owned[record.owner]
            del owned[record.id]
            if not owned:
                del self._owned[record.owner]
        return expired

    async def close(self) -> None:
        self._records.clear()
        self._numbers.clear()
        self._owned.clear()
        self._outcomes.clear()
        self._replaced.clear()
        self._next_seqs.clear()


def _size(outcome: bytes | None) -> int | None:
    return None if outcome is None else len(outcome)
