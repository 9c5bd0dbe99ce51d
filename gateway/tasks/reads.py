"""Reading a task back for its caller: the record from the `TaskStore`, the outcome kept beside it, and
the bounds of its log, the same for a task this process runs and for one it does not.

A task another process created (a second replica sharing the stores, or this process before a
restart) has no `Task` in this process's registry; every client read starts from the store
(`record`), so such a task answers `tasks/get`, `tasks/result` (once ended) and `tasks/stream` exactly
as a local one. A record another caller owns reads exactly like one that does not exist. What only the
process running a task holds (a 2026-07-28 round's open input requests, a 2025-11-25 task's pending
server requests, the call to cancel) the caller adds from the registry when the task is local.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.events.log import EventLog, LogBounds
from gateway.protocol.jsonrpc import Message
from gateway.tasks.records import RecordView, TaskRecord
from gateway.tasks.store import TaskStore


@dataclass(frozen=True, eq=False)
class StoredTask(RecordView):
    """A task as the stores hold it, with what a 2026-07-28 DetailedTask adds (`dialect.TaskDetails`)."""

    record: TaskRecord
    outcome: Message | None = None
    """Once terminal, `{"result": …}` or `{"error": …}` as the store keeps it (None: none kept, or not read)."""
    input_requests: dict[str, Any] = field(default_factory=dict)
    """The open input requests of the current round: only the process running the task has them; a
    task another process runs shows none (answer them through that process)."""


class TaskReads:
    """The client-facing reads of the task store and the event log."""

    def __init__(self, store: TaskStore, log: EventLog) -> None:
        self.store = store
        self.log = log

    async def record(self, owner: str, task_id: object) -> TaskRecord | None:
        """The caller's record, or None: an unknown id and another caller's look the same."""
        return await self.store.get(owner, task_id) if isinstance(task_id, str) else None

    async def outcome(self, record: TaskRecord) -> Message | None:
        """The outcome kept for an ended task (None: none kept, or it has not ended)."""
        kept = await self.store.outcome(record.id) if record.terminal else None
        return None if kept is None else orjson.loads(kept)

    async def stored(
        self, record: TaskRecord, *, with_outcome: bool, input_requests: dict[str, Any] | None = None
    ) -> StoredTask:
        """The task for a view: its outcome read only when the view shows it."""
        outcome = await self.outcome(record) if with_outcome else None
        return StoredTask(record, outcome, input_requests if input_requests is not None else {})

    async def bounds(self, record: TaskRecord) -> LogBounds:
        """The task's log bounds; after retention deleted the log, its tombstone's (empty, still
        counting). A log with no tombstone left (the store closed) reads as ended at the record's
        `next_seq`, so a seq the task gave out is never taken for one beyond its events."""
        bounds = await self.log.bounds(record.id)
        return bounds if bounds is not None else LogBounds(None, record.next_seq, sealed=True)
