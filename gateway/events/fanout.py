"""The shared live tail of a task: its new events read and encoded once per flush tick for every stream.

Without it, each caught-up `tasks/stream` of a task read the log, built its own `StoredEvent`s and
encoded its own frames, and every append woke every stream. A `SharedTail` is the one reader of a
task's new events while it has streams: once per flush tick it reads what was appended, encodes the
frames once (`EventFrames`) and publishes them as a `Block`, one bytes object that every stream at that
seq writes as it is. It then wakes only the streams waiting on it (those that have caught up), once
per tick, not once per event. A stream whose cursor is not where the block starts (a new stream, a
stream that fell behind while writing) reads the log itself, as before, until it is caught up again.

A stream that can write without waiting (`WriteNow`: its connection takes the bytes at once, or says
it cannot) follows the tail instead: the tail writes each block for it while it stays caught up, and
its task sleeps until the tail cannot (the connection's buffer is at its high-water mark, the block
does not start at its cursor) or the stream must act (stop, keep-alive, the log's end). A stream costs
the tail one write per tick then, with no task switch, no future and no timer.

The tail never decides how a stream ends: when it sees the log sealed, deleted, reset or trimmed past
its head, or the store unreadable, it wakes its streams and each runs its own checks on the log. The
byte bounds and slow-reader cuts stay with each stream's writes (`Responder.write`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from gateway.events.log import EventLog, StoreUnavailable
from gateway.events.stream_frames import EventFrames
from gateway.pacing import WritePacer

WriteNow = Callable[[bytes], bool]
"""Write bytes if the connection takes them at once (True), else write nothing and say False."""


@dataclass(frozen=True, slots=True)
class Block:
    """The frames of the events `first` to `end - 1`, encoded once and shared by every stream."""

    first: int
    end: int
    frames: bytes


class Follower:
    """A stream waiting at the tail: its cursor (moved by the tail as it writes for the stream) and the
    future its task sleeps on, resolved with True when something changed, False for a keep-alive."""

    __slots__ = ("cursor", "waiter", "write_now")

    def __init__(self, cursor: int, write_now: WriteNow | None, waiter: asyncio.Future[bool]) -> None:
        self.cursor = cursor
        self.write_now = write_now
        self.waiter = waiter


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
        self._waiting: list[Follower] = []
        self._streams = 0
        self.retired = False
        """The log ended, or was lost or trimmed past the head: streams wait on the log themselves."""
        self._runner = asyncio.create_task(self._run(), name=f"shared-tail-{task_id}")

    @classmethod
    def join(cls, log: EventLog, task_id: str, first_seq: int, *, keepalive_s: float, batch: int,
             flush_interval_s: float) -> SharedTail:  # fmt: skip
        """The task's live tail (started at `first_seq` if it has none or it stopped), counting one more
        stream."""
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
        """Streams waiting at the tail now."""
        return sum(not follower.waiter.done() for follower in self._waiting)

    def follow(self, cursor: int, write_now: WriteNow | None) -> Follower:
        """Wait at the tail from `cursor`: with `write_now`, the tail writes the blocks that start at the
        cursor for the stream, and wakes it only when it cannot; without, it wakes it at the next tick.
        The stream resolves the waiter itself to stop waiting."""
        follower = Follower(cursor, write_now, asyncio.get_running_loop().create_future())
        self._waiting.append(follower)
        return follower

    def _wake(self, changed: bool) -> None:
        waiting, self._waiting = self._waiting, []
        for follower in waiting:
            if not follower.waiter.done():
                follower.waiter.set_result(changed)

    def _publish(self, block: Block) -> None:
        """Write `block` for the followers that can take it at once; wake the others."""
        following: list[Follower] = []
        for follower in self._waiting:
            if follower.waiter.done():
                continue
            write_now = follower.write_now
            if write_now is not None and follower.cursor == block.first and _wrote(write_now, block.frames):
                follower.cursor = block.end
                following.append(follower)
            else:
                follower.waiter.set_result(True)
        self._waiting = following

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
                # The streams meet the outage on their own reads, with their keep-alives, and start a new
                # tail once the store answers again.
                return
            if log.resets != resets:
                return  # the data set was replaced: each stream ends with its own store_reset
            if not events:
                return  # appended and trimmed already: each stream meets events_gone on its own read
            self.block = Block(events[0].seq, events[-1].seq + 1, self._frames.frames(events))
            self.head = self.block.end
            self.ticks += 1
            self._pacer.wrote()
            self._publish(self.block)


def _wrote(write_now: WriteNow, data: bytes) -> bool:
    """`write_now(data)`; a connection that fails is left to the stream, whose own write meets it."""
    try:
        return write_now(data)
    except (ConnectionError, RuntimeError):
        return False
