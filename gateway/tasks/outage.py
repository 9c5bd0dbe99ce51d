"""Held writes: what the running tasks write while the store cannot take it.

A task's write (an append to its log, a status change) is an async step. When a step raises
`StoreUnavailable` (a server down, a disk full, an I/O error), it and every later write of that task
are held here, in order, and retried with capped backoff by one background task: the runner carries
on, nothing is reordered, and seqs stay gap-free (the store numbers events as they land). A step
that fails midway resumes where it failed when retried.

Held writes are bounded: all tasks' together in bytes (`[store] outage_buffer_bytes`), each task's in
time (`outage_hold_s`). Past either, the task's held writes are dropped and replaced by the steps that
fail it (`Overflow`, the registry's), written as soon as the store takes writes again; later writes of
that task are dropped. This module knows nothing of tasks' states, only of ordered steps per task.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.events.log import StoreUnavailable
from gateway.metrics import Metrics

__all__ = ["HeldWrites", "Step"]

log = logging.getLogger("gateway.tasks.outage")

Step = Callable[[], Awaitable[None]]
Overflow = Callable[[str, str], list[tuple[Step, int]]]
"""Given a task id and why its writes can no longer be held, the steps that end the task instead (each
with its size in bytes); the caller's local view of the task ends there and then."""

RETRY_INITIAL_S = 0.05
RETRY_MAX_S = 1.0
"""The backoff between attempts to write held steps: short, so a store back within a second or two
costs the tasks little; capped, so an outage costs one attempt a second."""


@dataclass(slots=True)
class _Held:
    steps: collections.deque[tuple[Step, int]]
    since: float
    """When (loop time) the first of these writes was held."""
    size: int = 0
    doomed: bool = False
    """Replaced by the steps that fail the task: later writes of the task are dropped."""


@dataclass(slots=True)
class _State:
    held: dict[str, _Held] = field(default_factory=dict)
    size: int = 0
    down: bool = False
    """The store refused the last write tried: an outage is under way (logged and counted once)."""


class HeldWrites:
    def __init__(self, buffer_bytes: int, hold_s: float, metrics: Metrics, overflow: Overflow) -> None:
        self._buffer_bytes = buffer_bytes
        self._hold_s = hold_s
        self._metrics = metrics
        self._overflow = overflow
        self._state = _State()
        self._retrier: asyncio.Task[None] | None = None

    def holds(self, task_id: str) -> bool:
        """Whether writes of the task wait for the store."""
        return task_id in self._state.held

    @property
    def size(self) -> int:
        return self._state.size

    @property
    def down(self) -> bool:
        """The store refused the last held write tried: writes are held until it takes them."""
        return self._state.down

    async def write(self, task_id: str, size: int, step: Step) -> bool:
        """Run `step` now (True), or hold it for later (False): the task has held writes already, or the
        store refuses it now. Any other error of the step is the caller's."""
        if task_id in self._state.held:
            self._hold(task_id, size, step)
            return False
        try:
            await step()
        except StoreUnavailable as error:
            self._went_down(error)
            self._hold(task_id, size, step)
            return False
        return True

    def _went_down(self, error: StoreUnavailable) -> None:
        if not self._state.down:
            self._state.down = True
            self._metrics.store_outages.inc()
            log.warning("the store takes no writes; holding the writes of running tasks", extra={"error": str(error)})

    def _hold(self, task_id: str, size: int, step: Step) -> None:
        state = self._state
        held = state.held.get(task_id)
        if held is None:
            held = state.held[task_id] = _Held(collections.deque(), asyncio.get_running_loop().time())
        if held.doomed:
            return
        if state.size + size > self._buffer_bytes:
            self._doom(task_id, f"its writes would exceed the {self._buffer_bytes} bytes held while the store is down")
            return
        held.steps.append((step, size))
        held.size += size
        self._grew(size)
        if self._retrier is None:
            self._retrier = asyncio.create_task(self._retry(), name="held-writes")

    def _grew(self, size: int) -> None:
        self._state.size += size
        self._metrics.held_write_bytes.set(self._state.size)

    def _doom(self, task_id: str, why: str) -> None:
        """Drop the task's held writes for the steps that fail it (`overflow`)."""
        held = self._state.held[task_id]
        self._grew(-held.size)
        steps = self._overflow(task_id, why)
        held.steps = collections.deque(steps)
        held.size = sum(size for _, size in steps)
        held.doomed = True
        self._grew(held.size)

    def _doom_overdue(self) -> None:
        cutoff = asyncio.get_running_loop().time() - self._hold_s
        for task_id, held in list(self._state.held.items()):
            if not held.doomed and held.since <= cutoff:
                self._doom(task_id, f"its writes were held {self._hold_s:g} s while the store was down")

    async def _retry(self) -> None:
        delay = RETRY_INITIAL_S
        try:
            while self._state.held:
                await asyncio.sleep(delay)
                self._doom_overdue()
                try:
                    await self._flush()
                except StoreUnavailable:
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                if self._state.down:
                    self._state.down = False
                    log.warning("the store takes writes again; the held writes are written")
                delay = RETRY_INITIAL_S
        finally:
            self._retrier = None

    async def _flush(self) -> None:
        """Write every held step in order, task by task; StoreUnavailable when the store still refuses."""
        state = self._state
        while state.held:
            for task_id, held in list(state.held.items()):
                while state.held.get(task_id) is held and held.steps:
                    step, size = held.steps[0]
                    try:
                        await step()
                    except StoreUnavailable:
                        raise
                    except Exception:  # a bug, or the task gone from the store: never block the others
                        log.exception("a held write of a task failed; it is dropped", extra={"task": task_id})
                    if held.steps and held.steps[0][0] is step:
                        held.steps.popleft()
                        held.size -= size
                        self._grew(-size)
                if state.held.get(task_id) is held and not held.steps:
                    del state.held[task_id]

    async def stop(self) -> None:
        """Stop retrying (at shutdown): what is still held is lost with this process, and its tasks are
        taken over as a dead process's are."""
        retrier, self._retrier = self._retrier, None
        if retrier is not None:
            retrier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retrier
        if self._state.held:
            log.warning(
                "stopping with task writes the store never took; their tasks are taken over as a dead process's",
                extra={"tasks": len(self._state.held)},
            )
