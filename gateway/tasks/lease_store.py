"""The interface of owner leases: what a shared store (Redis) gives the replicas that run its tasks.

A replica leases every unfinished task it runs or watches and renews the leases together; a replica
that finds a lease expired claims the task (which fences the former owner's writes) and takes it over.
Requests that need the process running a task (a cancel, 2026-07-28 input answers) are recorded with
the task for its owner, which is told at once and also finds them when it renews. Exclusive stores
(memory, SQLite) have no leases: a process there owns every task, and takes over at start-up.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

__all__ = ["Claim", "LeaseStore", "Renewal"]


@dataclass(frozen=True, slots=True)
class Renewal:
    """What renewing a task's lease found: requests waiting for this replica (the owner)."""

    cancel_requested: bool
    input_waiting: bool


@dataclass(frozen=True, slots=True)
class Claim:
    """A task this replica claimed after its owner's lease expired."""

    task_id: str
    cancel_requested: bool


class LeaseStore(ABC):
    ttl_s: float
    """How long a lease lasts without renewal: renew every third of it."""
    on_lost: Callable[[str], None] | None
    """Told (once per task) when this replica learns that another took one of its tasks over."""

    @abstractmethod
    def leased(self) -> list[str]:
        """The tasks this replica holds a lease of."""

    @abstractmethod
    async def renew(self, task_ids: list[str]) -> dict[str, Renewal]:
        """Renew the leases of `task_ids` (one round trip for all); the unfinished ones still held. A task
        another replica took over is reported to `on_lost` and leased no more."""

    @abstractmethod
    async def give_up(self) -> None:
        """Let every lease this replica holds expire now (a graceful stop, once its runs are stopped):
        other replicas take the tasks over at their next scan instead of a lease TTL later."""

    @abstractmethod
    async def release(self, task_ids: list[str]) -> None:
        """The tasks ended here: no lease to renew or claim any more."""

    @abstractmethod
    def forget(self, task_id: str) -> None:
        """Stop renewing a task's lease without giving it up: it expires, and a scan claims the task again."""

    @abstractmethod
    async def claim_expired(self) -> list[Claim]:
        """Claim the unfinished tasks of other replicas whose leases have expired (never by idle time)."""

    @abstractmethod
    async def next_expiry_s(self) -> float | None:
        """Seconds until the earliest lease not yet expired expires, by the store's clock (None: no
        lease): when the next `claim_expired` may find something, if its owner stops renewing it."""

    @abstractmethod
    async def request_cancel(self, task_id: str) -> bool:
        """Record a cancel for the replica running the task and tell it; False if the task has ended."""

    @abstractmethod
    async def request_input(self, task_id: str, responses: dict[str, Any]) -> bool:
        """Record input answers for the replica running the task and tell it; False if it has ended."""

    @abstractmethod
    async def take_input(self, task_id: str) -> list[dict[str, Any]]:
        """The input answers recorded for a task this replica runs, oldest first (taken: asked once)."""

    @abstractmethod
    def requests(self) -> AbstractAsyncContextManager[Callable[[], asyncio.Event]]:
        """While entered, this replica hears of requests for it: the callable gives the event that is set
        by the next one (take it before checking, so that a request meanwhile is not missed)."""
