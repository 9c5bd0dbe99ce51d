"""The shared live tail of a task: its new events read and encoded once per flush tick for every stream.

Without it, each caught-up `tasks/stream` of a task read the log, built its own `StoredEvent`s and
encoded its own frames, and every append woke every stream. A `SharedTail` is the one reader of a
task's new events while it has streams: once per flush tick it reads what was appended, encodes the
frames once (`EventFrames`) and publishes them as a `Block`, one bytes object that every stream at that
seq writes as it is. It then wakes only the streams waiting on it (those that have caught up), once
per tick, not once per event. A stream whose cursor is not where the block starts (a new stream, a
stream that fell behind while writing) reads the log itself, as before, until it is caught up again.

The tail never decides how a stream ends: when it sees the log sealed, deleted, reset or trimmed past
its head, or the store unreadable, it wakes its streams and each runs its own checks on the log. The
byte bounds and slow-reader cuts stay with each stream's writes (`Responder.write`).
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass

from gateway.events.log import EventLog, StoreUnavailable
from gateway.events.stream_frames import EventFrames
from gateway.pacing import WritePacer

RETRY_S = 0.05
"""How long the tail waits before reading a store again that could not be read."""


@dataclass(frozen=True, slots=True)
class Block:
    """The frames of the events `first` to `end - 1`, encoded once and shared by every stream."""

    first: int
    end: int
    frames: bytes


_tails: weakref.WeakKeyDictionary[EventLog, dict[str, SharedTail]] = weakref.WeakKeyDictionary()
"""Each log's live tails by task id, while the task has streams."""


class SharedTail:
    """One task's live tail: the latest block, and the streams waiting for the next tick."""

    def __init__(
        self, log: EventLog, task_id: str, head: int, *, keepalive_s: float, batch: int, flush_interval_s: float
    ) -> None:
        self._log = log
        self._task_id = task_id
        self._frames = EventFrames(task_id)
        self._keepalive_s = keepalive_s
        self._batch = batch
        self._pacer = WritePacer(flush_interval_s)
        self.head = head
        """The seq after the last event published (where the next block starts)."""
        self.block: Block | None = None
        self.ticks = 0
        """Blocks published so far (tests count writes against it)."""
        self._waiting: list[asyncio.Future[bool]] = []
        self._streams = 0
        self.retired = False
        """The log ended, or was lost or trimmed past the head: streams wait on the log themselves."""
        self._runner = asyncio.create_task(self._run(), name=f"shared-tail-{task_id}")

    @classmethod
    def join(cls, log: EventLog, task_id: str, first_seq: int, *, keepalive_s: float, batch: int,
             flush_interval_s: float) -> SharedTail:  # fmt: skip
        """The task's live tail (started at `first_seq` if it has none), counting one more stream."""
        tails = _tails.setdefault(log, {})
        tail = tails.get(task_id)
        if tail is None or tail.retired:
            tail = tails[task_id] = cls(
                log, task_id, first_seq, keepalive_s=keepalive_s, batch=batch, flush_interval_s=flush_interval_s
            )
        tail._streams += 1
        return tail

    def leave(self) -> None:
        """A stream is done with the tail; the last one stops it."""
        self._streams -= 1
        if self._streams == 0:
            self._retire()

    @property
    def waiting(self) -> int:
        """Streams waiting for the next tick now."""
        return sum(not waiter.done() for waiter in self._waiting)

    def waiter(self) -> asyncio.Future[bool]:
        """A future resolved at the next tick: True when something changed (a block, or the log ended), False
        when nothing happened for `keepalive_s` (time for a keep-alive). The stream resolves it itself on stop."""
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        return waiter

    def _wake(self, changed: bool) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(changed)

    def _retire(self) -> None:
        if self.retired:
            return
        self.retired = True
        if asyncio.current_task() is not self._runner:
            self._runner.cancel()
        tails = _tails.get(self._log)
        if tails is not None and tails.get(self._task_id) is self:
            del tails[self._task_id]
        self._wake(True)

    async def _run(self) -> None:
        try:
            await self._follow()
        finally:
            # Whatever stopped the tail (its end, or an error the streams will meet on their own reads),
            # its streams must not wait for a tick that will never come.
            self._retire()

    async def _follow(self) -> None:
        log, task_id = self._log, self._task_id
        resets = log.resets
        while True:
            try:
                if not await log.wait(task_id, self.head - 1, self._keepalive_s):
                    bounds = await log.bounds(task_id)
                    if bounds is None or bounds.sealed or log.resets != resets or bounds.retained_from > self.head:
                        return
                    self._wake(False)
                    continue
                if (pause := self._pacer.pause()) > 0:
                    await asyncio.sleep(pause)
                events = await log.read(task_id, self.head - 1, self._batch)
            except StoreUnavailable:
                # The streams find the outage on their own reads, with their keep-alives.
                self._wake(True)
                await asyncio.sleep(RETRY_S)
                continue
            if not events:
                continue  # trimmed between the wait and the read: the next wait's bounds tell
            self.block = Block(events[0].seq, events[-1].seq + 1, self._frames.frames(events))
            self.head = self.block.end
            self.ticks += 1
            self._pacer.wrote()
            self._wake(True)
