"""The `TaskStore` interface: where task records and terminal outcomes live.

Everything a second replica or a restarted process needs to answer `tasks/get`, `tasks/list`,
`tasks/result` (for a terminal task) and `tasks/stream` goes through it: create, get by (owner, id),
list by owner with a cursor, compare-and-set status updates, the terminal outcome (the canonical
`{"result": …}` or `{"error": …}` JSON, within a size cap), the log's `next_seq`, and expiry; and for
a process starting on a store, every live record with the size of its kept outcome (`live`), from which
the registry rebuilds its task counts, results budget and terminal retention. What only the running
process holds (asyncio primitives, the upstream call) stays in the task registry.

Every operation is small enough to be written for memory, SQLite and Redis alike; one contract suite
(`tests/test_task_store.py`) runs against every implementation (`gateway.stores`). This module must
not know JSON-RPC, HTTP or the edge: outcomes are bytes it never parses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from gateway.tasks.records import TaskRecord, TaskStatus

__all__ = ["InvalidCursor", "LiveRecord", "OutcomeTooLarge", "TaskExists", "TaskPage", "TaskStore"]


class TaskExists(Exception):
    """A record with this id already exists (ids are never reused while their record lives)."""


class InvalidCursor(ValueError):
    """A `list` cursor this store never handed out (the caller answers -32602)."""


class OutcomeTooLarge(ValueError):
    """An outcome over the store's `max_outcome_bytes`: nothing was written."""


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of an owner's tasks, oldest first, and the cursor of the next page (None: the last)."""

    records: list[TaskRecord]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class LiveRecord:
    """A record as a starting process finds it, and the bytes of the outcome it keeps as the task ended."""

    record: TaskRecord
    outcome_bytes: int | None
    """The size of the outcome stored with the terminal status; None when the record keeps none, or
    when it was replaced since (`replace_outcome`: an eviction, which no longer counts)."""


class TaskStore(ABC):
    """Task records by id, each bound to an owner. Safe for many concurrent callers on one loop.

    Status changes are compare-and-set on the previous status, and a terminal status never changes:
    of two racing writers exactly one wins, and the loser learns it (None) instead of overwriting.
    """

    def __init__(self, max_outcome_bytes: int) -> None:
        TaskStore.retain(self, max_outcome_bytes)

    def retain(self, max_outcome_bytes: int, terminal_retention_s: float | None = None) -> None:
        """Keep outcomes up to `max_outcome_bytes` from now on (at start, and on a config reload); a
        store that expires terminal records itself (Redis) keeps new ones `terminal_retention_s`."""
        if max_outcome_bytes < 1:
            raise ValueError(f"max_outcome_bytes must be at least 1, got {max_outcome_bytes}")
        self.max_outcome_bytes = max_outcome_bytes
        """The largest outcome (bytes of JSON) the store keeps; the caller bounds outcomes below it."""

    def check_outcome(self, outcome: bytes | None) -> None:
        """Raise OutcomeTooLarge for an outcome over the cap (every store checks before writing)."""
        if outcome is not None and len(outcome) > self.max_outcome_bytes:
            raise OutcomeTooLarge(
                f"an outcome of {len(outcome)} bytes exceeds the store's cap of {self.max_outcome_bytes} bytes"
            )

    def check_update(self, status: TaskStatus, outcome: bytes | None) -> None:
        """Raise before an `update_status` writes: ValueError for an outcome on a non-terminal status,
        OutcomeTooLarge for one over the cap."""
        if outcome is not None and not status.terminal:
            raise ValueError(f"only a terminal status keeps an outcome, not {status.value}")
        self.check_outcome(outcome)

    @abstractmethod
    async def create(self, record: TaskRecord) -> None:
        """Store a new record; TaskExists if its id is taken."""

    @abstractmethod
    async def get(self, owner: str, task_id: str) -> TaskRecord | None:
        """The owner's record, or None: an unknown id and another owner's look the same."""

    @abstractmethod
    async def find(self, task_id: str) -> TaskRecord | None:
        """Any owner's record: only for the gateway's own bookkeeping, never to answer a client."""

    @abstractmethod
    async def list_owned(self, owner: str, cursor: str | None, limit: int) -> TaskPage:
        """Up to `limit` of the owner's records in creation order, after `cursor` (None: from the first).

        The order is stable: records created or expired meanwhile never make a walk repeat or skip a
        record that lives throughout it. InvalidCursor for a cursor this store never gave out."""

    @abstractmethod
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
        """Set status, status message and `last_updated_at` if the status is still `expected` and not
        terminal; the new record, or None (unknown task, or another writer got there first).

        A terminal update may carry the task's `outcome` (stored with the status in one step: whoever
        sees the terminal status can read it) and its `outcome_summary`. OutcomeTooLarge over the cap;
        ValueError for an outcome on a non-terminal status."""

    @abstractmethod
    async def outcome(self, task_id: str) -> bytes | None:
        """The terminal outcome stored for the task, or None (none kept, not terminal, or unknown)."""

    @abstractmethod
    async def replace_outcome(self, task_id: str, outcome: bytes) -> bool:
        """Replace a terminal task's kept outcome (an eviction keeps an error saying so instead);
        False for an unknown or non-terminal task. OutcomeTooLarge over the cap."""

    @abstractmethod
    async def advance_next_seq(self, task_id: str, next_seq: int) -> None:
        """Record that the task's log reached `next_seq`; a lower value than stored changes nothing."""

    @abstractmethod
    async def unfinished(self) -> list[TaskRecord]:
        """Every record not yet terminal, any owner's, in no particular order: what a process starting on
        this store must take over (their runs died with the process that had them)."""

    @abstractmethod
    async def live(self) -> list[LiveRecord]:
        """Every record not yet dropped by `expire`, any owner's, terminal or not, in no particular
        order, each with the size of its kept outcome: what a process starting on this store counts (task
        limits, the results budget, when ended tasks' logs go)."""

    @abstractmethod
    async def expire(self, now: float) -> list[TaskRecord]:
        """Drop every record whose `expires_at` is at or before `now` (wall-clock seconds), with its
        outcome; the records dropped."""

    @abstractmethod
    async def close(self) -> None:
        """Release the store's resources."""
