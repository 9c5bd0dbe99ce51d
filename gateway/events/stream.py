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
from typing import Any

import orjson

from gateway.events.fanout import SharedTail, WriteNow
from gateway.events.log import EventLog, LogBounds, StoreUnavailable
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
    result), or as soon as `stop` is set by a cancellation, an events_gone ProtocolError when retention
    overtook the cursor, and a store_reset one when the store lost the log. While the store cannot be
    read, the stream waits for it (keep-alives every `keepalive_s`). With `write_now` (and no `on_batch`,
    which needs the stream's own task per batch), the task's shared tail writes for the stream while it is
    caught up (`gateway.events.fanout`).
    """
    frames = EventFrames(task_id)
    cursor, delivered = first_seq, 0
    pacer = WritePacer(flush_interval_s)
    caught_up = False
    resets = log.resets
    outage = _Outage(write, keepalive_s, stop)
    join = functools.partial(
        SharedTail.join, log, task_id, keepalive_s=keepalive_s, batch=batch, flush_interval_s=flush_interval_s
    )
    # Joined once the stream has caught up with the log: a replay reads the log at its own pace.
    tail: SharedTail | None = None
    stopped = asyncio.ensure_future(stop.wait())
    direct = write_now if on_batch is None else None
    try:
        while not stop.is_set():
            block = None if tail is None else tail.block
            if block is not None and block.first == cursor and log.resets == resets:
                # Caught up: the task's new frames, encoded once for all its streams, written as they are.
                cursor = block.end
                delivered += block.end - block.first
                await write(block.frames)
                if on_batch is not None:
                    await on_batch(delivered)
                continue
            live = tail is not None and not tail.retired
            if tail is not None and live and cursor >= tail.head:
                # Never read past the tail: the stream would run ahead of its blocks and never share them.
                followed, changed = await _follow(tail, cursor, direct, stopped)
                delivered, cursor = delivered + followed - cursor, followed
                if not changed:
                    await _keepalive(write, stop)
                continue
            if not live and caught_up and (pause := pacer.pause()) > 0:
                # Without a tail, a stream writes at most once per interval, so fan-out to many streams
                # costs a bounded number of writes per second however fast the task produces events.
                await asyncio.sleep(pause)
            try:
                limit = min(batch, tail.head - cursor) if tail is not None and live else batch
                events = await log.read(task_id, cursor - 1, limit)
            except StoreUnavailable:
                await outage.wait()
                continue
            if log.resets != resets:
                return store_reset(task_id)
            caught_up = len(events) < batch
            if events:
                if events[0].seq != cursor:
                    return events_gone(task_id, events[0].seq)
                delivered = await _deliver(frames.frames(events), delivered + len(events), write, on_batch)
                pacer.wrote()
                cursor = events[-1].seq + 1
                if caught_up:  # at the log's end (for now): from here on, the tail reads for the stream
                    tail = _rejoin(tail, join, cursor)
                continue
            try:
                bounds = await log.bounds(task_id)
            except StoreUnavailable:
                await outage.wait()
                continue
            outage.over()
            if bounds is None or log.resets != resets:  # gone without its end: never a normal end
                return store_reset(task_id)
            if bounds.retained_from > cursor:
                return events_gone(task_id, bounds.retained_from)
            if bounds.sealed and cursor >= bounds.next_seq:
                return None
            # Caught up with a log that goes on: wait at its tail (a new one if this one stopped).
            tail = _rejoin(tail, join, cursor)
            followed, changed = await _follow(tail, cursor, direct, stopped)
            delivered, cursor = delivered + followed - cursor, followed
            if not changed:
                await _keepalive(write, stop)
        return None
    finally:
        stopped.cancel()
        if tail is not None:
            tail.leave()


def _rejoin(tail: SharedTail | None, join: Callable[[int], SharedTail], cursor: int) -> SharedTail:
    """The task's live tail for a stream at `cursor`: `tail`, unless the stream has none or it stopped."""
    if tail is not None and not tail.retired:
        return tail
    if tail is not None:
        tail.leave()
    return join(cursor)


async def _follow(
    tail: SharedTail, cursor: int, write_now: WriteNow | None, stopped: asyncio.Future[Any]
) -> tuple[int, bool]:
    """Wait at the tail until the stream must act or `stopped`: the cursor then (past what the tail wrote
    for the stream), and whether something changed (False: a quiet keep-alive interval passed)."""
    follower = tail.follow(cursor, write_now)
    waiter = follower.waiter

    def on_stop(_: object) -> None:
        if not waiter.done():
            waiter.set_result(True)

    stopped.add_done_callback(on_stop)
    try:
        changed = await waiter
    finally:
        stopped.remove_done_callback(on_stop)
        if not waiter.done():  # cancelled: the tail must not write for the stream any more
            waiter.cancel()
    return follower.cursor, changed


async def _keepalive(write: Write, stop: asyncio.Event) -> None:
    if not stop.is_set():
        await write(sse.encode_comment("keepalive"))


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
