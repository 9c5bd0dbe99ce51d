"""What the gateway knows of one task an upstream hosts: where it lives and what was last observed.

Runtime only (the record's `upstream` is what persists), held in the task's runtime while the
pass-through watcher (`gateway.tasks.passthrough`) follows the task. Where the task stands is its
lifecycle phase, not anything here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gateway.protocol.dialect import Dialect, dialect_of
from gateway.protocol.era import Era
from gateway.tasks.records import TaskStatus
from gateway.upstream.base import UpstreamChannel


@dataclass(eq=False)
class UpstreamTask:
    """The upstream side of a pass-through task: its conversation, its id there, what was observed."""

    channel: UpstreamChannel
    upstream_id: str
    era: Era
    headers: dict[str, str]
    """Sent with the gateway's own polls (a legacy session's protocol version)."""
    poll_interval_ms: int
    progress_token: object = None
    heard_at: float = field(default_factory=time.monotonic)
    """When the upstream last pushed a status (monotonic): polls wait while pushes keep coming."""
    polled_at: float = field(default_factory=time.monotonic)
    seen: tuple[TaskStatus, str | None] | None = None
    """The upstream's last view recorded (status, statusMessage); while the outcome is fetched, the
    end it told, which the record turns to once the outcome is in."""
    observing: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a view is compared with `seen` and fed: a push, a poll and a forwarded `tasks/get`
    answer can carry the same view at once, and each must not record it as a change."""
    last_updated_at: str = ""
    input_keys: set[str] = field(default_factory=set)
    failures: int = 0
    """Failed polls in a row."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to poll at once, or to fetch the outcome (the lifecycle's `POLL_UPSTREAM`, `FETCH_OUTCOME`)."""

    @property
    def dialect(self) -> Dialect:
        return dialect_of(self.era)
