"""What a task is, as plain data: its status and its record.

A `TaskRecord` is everything a restarted process or a second replica needs to answer for a task
(`tasks/get`, `tasks/list`, `tasks/stream`, and with the outcome a `TaskStore` keeps beside it,
`tasks/result`): immutable, and serializable to a JSON-ready dict and back. What only the process
running the task holds (asyncio primitives, pending input, the upstream call) is runtime, elsewhere.

This module must not import the protocol, HTTP or asyncio layers: stores build on it.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["RecordView", "TaskRecord", "TaskStatus", "UpstreamTaskRef", "iso_now"]


class TaskStatus(enum.StrEnum):
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class UpstreamTaskRef:
    """Where a task the upstream hosts lives: its id there and the conversation that holds it."""

    upstream_id: str
    """The upstream's own task id (clients see `<channel_tag>.<upstream_id>`)."""
    channel_tag: str
    """The tag of the upstream conversation (stdio process, HTTP session) the task belongs to."""
    session: str | None = None
    """The conversation's handle beyond the gateway process (a 2025-11-25 HTTP upstream's
    `Mcp-Session-Id`), for a restarted gateway to watch the task again; None where none outlives it."""


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task as stored: who owns it, where it stands, and how long it lives.

    Changes are new records (`dataclasses.replace`), written through a `TaskStore`."""

    id: str
    owner: str
    """The caller the task is bound to: only they may see it."""
    tool: str
    dialect: str
    """The protocol version whose Tasks shapes its client sees: "2025-11-25" (SEP-1686) or
    "2026-07-28" (SEP-2663)."""
    ttl_ms: int
    poll_interval_ms: int
    created_at: str
    """ISO 8601 (the upstream's time for a task it hosts)."""
    last_updated_at: str
    expires_at: float
    """Wall-clock seconds since the epoch after which the record is dropped (created + ttl)."""
    status: TaskStatus = TaskStatus.WORKING
    status_message: str | None = None
    outcome_summary: dict[str, Any] | None = None
    """Once terminal: the outcome's shape (status, error code/message, content types and sizes), the
    payload of the task's terminal event, bounded by the registry; the outcome itself is kept by the
    store beside the record."""
    upstream: UpstreamTaskRef | None = None
    """For a task the upstream hosts (pass-through); None for a gateway-hosted one."""
    next_seq: int = 0
    """The seq the task's next event gets: never goes back, so a seq is never reused, even once
    retention has deleted the task's events."""

    @property
    def terminal(self) -> bool:
        return self.status.terminal

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values (what a durable store writes)."""
        return {**asdict(self), "status": self.status.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskRecord:
        """The record `to_dict` gave."""
        upstream = data.get("upstream")
        return cls(
            **{
                **data,
                "status": TaskStatus(data["status"]),
                "upstream": UpstreamTaskRef(**upstream) if upstream is not None else None,
            }
        )


class RecordView:
    """Read-only views of a `record`'s fields, for objects built around one (the registry's `Task`, a
    task read back from the stores): a change is a new record, written through the registry."""

    record: TaskRecord

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def owner(self) -> str:
        return self.record.owner

    @property
    def tool(self) -> str:
        return self.record.tool

    @property
    def ttl_ms(self) -> int:
        return self.record.ttl_ms

    @property
    def poll_interval_ms(self) -> int:
        return self.record.poll_interval_ms

    @property
    def status(self) -> TaskStatus:
        return self.record.status

    @property
    def status_message(self) -> str | None:
        return self.record.status_message

    @property
    def created_at(self) -> str:
        return self.record.created_at

    @property
    def last_updated_at(self) -> str:
        return self.record.last_updated_at

    @property
    def terminal(self) -> bool:
        return self.status.terminal
