"""The tasks/stream cursor: validating the request, deciding replay-or-events_gone, and one loop that
serves the replay and the live tail alike (so nothing is lost or doubled at the handover).

A stream holds only (task, next seq). It reads the log at its own pace and sleeps on the log's wake-up
when it is caught up; a slow client costs a blocked write, never a growing buffer. Whether the stream is
over comes from the log alone: it is sealed (the task ended, or the log was deleted) and the cursor has
reached its end. A store that cannot be read for a while (`StoreUnavailable`) holds the stream open,
with keep-alives, until it can; a store whose data set was replaced under it (`EventLog.resets`), or a
log that vanished without its end, ends the stream with a `store_reset` error, never as if complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.events.fanout import Block, SharedTail, WriteNow
from gateway.events.log import EventLog, LogBounds, StoredEvent, StoreUnavailable
from gateway.events.stream_frames import EventFrames
from gateway.pacing import WritePacer
from gateway.protocol import jsonrpc, sse
from gateway.protocol.jsonrpc import EVENTS_GONE, Message, ProtocolError

MAX_SEQ = 2**63 - 1
"""The largest sequence number (stores keep seqs as signed 64-bit integers)."""
EVENTS_GONE_MESSAGE = "Task events are no longer available"
STORE_RESET = "store_reset"
"""`data.reason` of the error that ends a stream whose log the store lost (its data set replaced)."""
STORE_RETRY_INITIAL_S = 0.05
STORE_RETRY_MAX_S = 1.0


def parse_stream_params(message: Message) -> tuple[str, int | None]:
    """`taskId` and `after` of a tasks/stream request, or ProtocolError -32602 saying what is wrong."""
    params = jsonrpc.params_of(message)
    request_id = message.get("id")
    task_id = params.get("taskId")
    if not isinstance(task_id, str):
        raise ProtocolError(jsonrpc.INVALID_PARAMS, "Invalid params: taskId must be a string", request_id=request_id)
    if "after" not in params:
        return task_id, None
    after = params["after"]
    if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= MAX_SEQ:
        raise ProtocolError(
            jsonrpc.INVALID_PARAMS,
            f"Invalid params: after must be a non-negative integer sequence number (at most {MAX_SEQ}), "
            f"got {orjson.dumps(after).decode()[:64]}",
            request_id=request_id,
        )
    return task_id, after


def events_gone(task_id: str, earliest_seq: int, request_id: Any = None) -> ProtocolError:
    return ProtocolError(
        EVENTS_GONE,
        EVENTS_GONE_MESSAGE,
        data={"reason": "events_gone", "taskId": task_id, "earliestSeq": earliest_seq},
        http_status=200,
        request_id=request_id,
    )


def store_reset(task_id: str, request_id: Any = None) -> ProtocolError:
    """The end of a stream whose task's log the store lost: the data set was replaced under the gateway."""
    return ProtocolError(
        jsonrpc.INTERNAL_ERROR,
        "Internal error: the task store lost this task and its events (its data set was replaced); "
        "the task's outcome is unknown",
        data={"reason": STORE_RESET, "taskId": task_id},
        http_status=200,
        request_id=request_id,
    )


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Where a stream starts: the first seq to deliver, or None to return the empty result at once."""

    first_seq: int | None


def plan_stream(task_id: str, after: int | None, bounds: LogBounds) -> StreamStart:
    """SEP-2694's replay-or-events_gone decision, given the log's bounds (sealed: the task has ended).
    Raises ProtocolError."""
    next_seq = bounds.next_seq
    terminal = bounds.sealed
    if after is None:
        if bounds.earliest is None:
            return StreamStart(None if terminal else next_seq)
        return StreamStart(bounds.earliest)
    if after >= next_seq:
        last = "it has no events yet" if next_seq == 0 else f"its last event is seq {next_seq - 1}"
        raise ProtocolError(
            jsonrpc.INVALID_PARAMS, f"Invalid params: after={after} is beyond the task's events ({last})"
        )
    if after == next_seq - 1:
        return StreamStart(None if terminal else next_seq)
    retained_from = bounds.retained_from
    if after + 1 < retained_from:
        raise events_gone(task_id, retained_from)
    return StreamStart(after + 1)


Write = Callable[[bytes], Awaitable[None]]


async def run_stream(
    log: EventLog,
    task_id: str,
    first_seq: int,
    write: Write,
    *,
    stop: asyncio.Event,
    keepalive_s: float,
    batch: int,
    on_batch: Callable[[int], Awaitable[None]] | None = None,
    flush_interval_s: float,
    write_now: WriteNow | None = None,
) -> ProtocolError | None:
    """Deliver events from `first_seq` on, replay then live, in one loop.

    Returns None once the log is sealed and everything in it was delivered (the caller sends the empty
    result) or `stop` is set (a cancellation); an events_gone ProtocolError when retention overtook the
    cursor, a store_reset one when the store lost the log. While the store cannot be read, the stream
    waits for it (keep-alives every `keepalive_s`). Once caught up, it waits at the task's shared tail,
    which writes for it with `write_now` if given (and no `on_batch`): `gateway.events.fanout`.
    """
    frames = EventFrames(task_id)
    cursor, delivered = first_seq, 0
    pacer = WritePacer(flush_interval_s)
    caught_up = False
    resets = log.resets
    outage = _Outage(write, keepalive_s, stop)
    # The tail writes for the stream only without on_batch (it moves the cursor, `delivered` is not told).
    seat = _Seat(log, task_id, write_now if on_batch is None else None, stop, keepalive_s, batch, flush_interval_s)
    try:
        while not stop.is_set():
            block = seat.block_at(cursor)
            if block is not None and log.resets == resets:
                # Caught up: the task's new frames, encoded once for all its streams, written as they are.
                delivered = await _deliver(block.frames, delivered + block.end - cursor, write, on_batch)
                cursor = block.end
                continue
            if seat.ahead(cursor):
                # Never read past the tail: the stream would run ahead of its blocks and never share them.
                cursor = await seat.wait(cursor, write)
                continue
            if seat.live is None and caught_up and (pause := pacer.pause()) > 0:
                # Without a tail, at most one write per interval: a bounded number of writes per second.
                await asyncio.sleep(pause)
            read = await _read(log, task_id, cursor, seat.limit(cursor, batch), resets, outage)
            if isinstance(read, ProtocolError) or read == "ended":
                return None if read == "ended" else read
            if read == "goes_on":
                seat.join(cursor)
                cursor = await seat.wait(cursor, write)
            elif read != "retry":
                caught_up = len(read) < batch
                delivered = await _deliver(frames.frames(read), delivered + len(read), write, on_batch)
                pacer.wrote()
                cursor = read[-1].seq + 1
                if caught_up:  # at the log's end (for now): from here on, the tail reads for the stream
                    seat.join(cursor)
        return None
    finally:
        seat.leave()


async def _read(
    log: EventLog, task_id: str, cursor: int, limit: int, resets: int, outage: _Outage
) -> list[StoredEvent] | ProtocolError | Literal["ended", "goes_on", "retry"]:
    """The next events from `cursor` (at most `limit`); if there are none, whether the stream ends (with
    an error, or as complete) or waits for the log that goes on; "retry" after waiting out a store it
    cannot read."""
    try:
        events = await log.read(task_id, cursor - 1, limit)
        if log.resets != resets:
            return store_reset(task_id)
        if events:
            return events_gone(task_id, events[0].seq) if events[0].seq != cursor else events
        bounds = await log.bounds(task_id)
    except StoreUnavailable:
        await outage.wait()
        return "retry"
    outage.over()
    if bounds is None or log.resets != resets:  # gone without its end: never a normal end
        return store_reset(task_id)
    if bounds.retained_from > cursor:
        return events_gone(task_id, bounds.retained_from)
    return "ended" if bounds.sealed and cursor >= bounds.next_seq else "goes_on"


class _Seat:
    """A stream's place at its task's shared tail, taken once the stream has caught up with the log (a
    replay reads the log at its own pace), and taken again at a new tail if the one it had stopped."""

    def __init__(
        self,
        log: EventLog,
        task_id: str,
        write_now: WriteNow | None,
        stop: asyncio.Event,
        keepalive_s: float,
        batch: int,
        flush_interval_s: float,
    ) -> None:
        self._join = functools.partial(
            SharedTail.join, log, task_id, keepalive_s=keepalive_s, batch=batch, flush_interval_s=flush_interval_s
        )
        self._write_now = write_now
        self._stop = stop
        self._stopped = asyncio.ensure_future(stop.wait())
        self.tail: SharedTail | None = None

    @property
    def live(self) -> SharedTail | None:
        """The tail while it runs (None before the stream caught up, or once the tail stopped)."""
        return self.tail if self.tail is not None and not self.tail.retired else None

    def block_at(self, cursor: int) -> Block | None:
        """The tail's latest block if it starts at `cursor`."""
        block = None if self.tail is None else self.tail.block
        return block if block is not None and block.first == cursor else None

    def ahead(self, cursor: int) -> bool:
        """Whether `cursor` is at or past the live tail's head: nothing to read that the tail has not."""
        return (tail := self.live) is not None and cursor >= tail.head

    def limit(self, cursor: int, batch: int) -> int:
        """Events to read from `cursor`: up to the live tail's head, never past it."""
        return min(batch, tail.head - cursor) if (tail := self.live) is not None else batch

    def join(self, cursor: int) -> None:
        if self.live is not None:
            return
        if self.tail is not None:
            self.tail.leave()
        self.tail = self._join(cursor)

    async def wait(self, cursor: int, write: Write) -> int:
        """Wait at the tail until the stream must act or stop; the cursor then (past what the tail wrote
        for the stream). A quiet keep-alive interval writes a keep-alive."""
        assert self.tail is not None
        follower = self.tail.follow(cursor, self._write_now)
        waiter = follower.waiter

        def on_stop(_: object) -> None:
            if not waiter.done():
                waiter.set_result(True)

        self._stopped.add_done_callback(on_stop)
        try:
            changed = await waiter
        finally:
            self._stopped.remove_done_callback(on_stop)
            if not waiter.done():  # cancelled: the tail must not write for the stream any more
                waiter.cancel()
        if not changed and not self._stop.is_set():
            await write(sse.encode_comment("keepalive"))
        return follower.cursor

    def leave(self) -> None:
        self._stopped.cancel()
        if self.tail is not None:
            self.tail.leave()


async def _deliver(
    frames: bytes, delivered: int, write: Write, on_batch: Callable[[int], Awaitable[None]] | None
) -> int:
    """Write one batch's frames; `delivered` (the events delivered with it) is told to `on_batch`."""
    await write(frames)
    if on_batch is not None:
        await on_batch(delivered)
    # A replay can run far ahead of a fast client without the socket ever pushing back; yield so one
    # long replay never starves the other streams on the loop.
    await asyncio.sleep(0)
    return delivered


class _Outage:
    """A stream's wait for a store it cannot read: capped backoff, a keep-alive every `keepalive_s`."""

    def __init__(self, write: Write, keepalive_s: float, stop: asyncio.Event) -> None:
        self._write = write
        self._keepalive_s = keepalive_s
        self._stop = stop
        self._delay = STORE_RETRY_INITIAL_S
        self._quiet = 0.0

    async def wait(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._delay):
                await self._stop.wait()
        self._quiet += self._delay
        self._delay = min(self._delay * 2, STORE_RETRY_MAX_S)
        if self._quiet >= self._keepalive_s and not self._stop.is_set():
            self._quiet = 0.0
            await self._write(sse.encode_comment("keepalive"))

    def over(self) -> None:
        self._delay = STORE_RETRY_INITIAL_S
