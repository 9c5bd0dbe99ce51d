"""Resumable SSE streams of 2025-11-25 sessions: event ids, bounded replay, and `Last-Event-ID`.

Every forwarded SSE response and the standalone GET stream of a legacy session is a `ReplayStream`.
Each event written to it gets an id `<stream>_<n>` (unique in the session, naming its stream; `n`
counts from 1, and 0 is the stream's priming event) and is kept, within `buffer_bytes` and
`max_age_s`, so that a GET with `Last-Event-ID` can replay what came after that id and then follow the
stream live. A resume that would skip a dropped event is refused (`events_gone`), never served with a
gap. `SessionStreams` holds one session's streams: it opens and resumes them, owns the relay that goes
on while no connection serves a stream, and forgets a stream no connection has served for
`max_age_s`. Kept bytes count in the gateway's buffer budget. No network I/O here: the edge writes
what these objects return.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

from gateway.buffers import BufferBudget
from gateway.config import ResumeConfig
from gateway.protocol import jsonrpc, sse
from gateway.protocol.jsonrpc import EVENTS_GONE, Message, ProtocolError

log = logging.getLogger("gateway.replay")

LAST_EVENT_ID = "Last-Event-ID"
MAX_ID_DIGITS = 18
"""Digits of each part of an event id (`<stream>_<n>`): more than any stream or event count reaches."""


def events_gone(last_event_id: str, why: str) -> ProtocolError:
    """The answer to a `Last-Event-ID` whose stream or events are no longer kept: HTTP 410."""
    return ProtocolError(
        EVENTS_GONE,
        f"Gone: the events after Last-Event-ID {last_event_id!r} are no longer available ({why}); "
        "send the request again (server.resume.buffer_bytes and max_age_s bound what is kept)",
        http_status=410,
        data={"reason": "events_gone", "lastEventId": last_event_id},
    )


class StreamGap(Exception):
    """Events a connection had not written yet were dropped (the client lagged beyond the buffer)."""


class ReplayStream:
    """One SSE stream's events with their ids, the newest kept for replay."""

    def __init__(self, key: int, limits: ResumeConfig, budget: BufferBudget, *, priming: bool) -> None:
        self.key = key
        self._limits = limits
        self._budget = budget
        self._priming = priming
        self._events: deque[tuple[int, bytes, float]] = deque()
        """(n, the encoded frame, when it was recorded), oldest first."""
        self._bytes = 0
        self._next = 1
        self._written = 0
        """The newest event a connection has written; older ones dropped unwritten count as lost."""
        self._grew = asyncio.Event()
        self.ended = False
        """The stream's last event (its response) is recorded: nothing follows it."""
        self.attached = True
        """A connection serves the stream now."""
        self.runner: asyncio.Task[Any] | None = None
        self.expiry: asyncio.TimerHandle | None = None

    @property
    def last(self) -> int:
        return self._next - 1

    def event_id(self, n: int) -> str:
        return f"{self.key}_{n}"

    def opening(self, after: int = 0) -> bytes:
        """What a connection starts with: a priming event carrying the id it resumes from (0: the
        start), for clients of 2025-11-25 or later; older clients would try to parse its empty data."""
        return sse.encode_priming(self.event_id(after), self._limits.retry_ms) if self._priming else b""

    def record(self, messages: list[Message]) -> bytes:
        """Give each message the next id, keep it for replay, and return the frames to write."""
        now = time.monotonic()
        frames = []
        for message in messages:
            frame = sse.encode_message(jsonrpc.encode(message), self.event_id(self._next))
            self._events.append((self._next, frame, now))
            self._next += 1
            self._bytes += len(frame)
            self._budget.held += len(frame)
            frames.append(frame)
        self._trim(now)
        self._grew.set()
        return b"".join(frames)

    def written(self, n: int) -> None:
        """A connection wrote the events up to `n`."""
        self._written = max(self._written, n)

    def end(self) -> None:
        self.ended = True
        self._grew.set()

    def check(self, after: int, last_event_id: str) -> None:
        """Whether every event after `after` is still kept: ProtocolError if not, or if it names none."""
        if after > self.last:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST, f"Bad Request: Last-Event-ID {last_event_id!r} names no event sent"
            )
        self._trim(time.monotonic())
        if after + 1 < self._earliest():
            raise events_gone(last_event_id, "older than what its stream keeps")

    def after(self, n: int) -> tuple[bytes, int]:
        """The frames of the events after `n`, and the newest event's number; StreamGap if one of them
        was dropped."""
        self._trim(time.monotonic())
        earliest = self._earliest()
        if n + 1 < earliest:
            raise StreamGap(f"stream {self.key}: events {n + 1}..{earliest - 1} were dropped")
        start = n + 1 - earliest
        return b"".join(frame for _, frame, _ in itertools.islice(self._events, start, None)), self.last

    def _earliest(self) -> int:
        return self._events[0][0] if self._events else self._next

    async def grown(self, wait_s: float) -> bool:
        """Wait up to `wait_s` for an event (or the end) after the last `after`; False on timeout."""
        self._grew.clear()
        try:
            async with asyncio.timeout(wait_s):
                await self._grew.wait()
        except TimeoutError:
            return False
        return True

    def release(self) -> None:
        """Drop every kept event (the stream is forgotten)."""
        self._drop(len(self._events))

    def _trim(self, now: float) -> None:
        oldest = now - self._limits.max_age_s
        size = self._bytes
        count = 0
        for _, frame, recorded in self._events:
            # Over the byte bound the newest event still stays, however large, until it ages out.
            over_size = size > self._limits.buffer_bytes and count < len(self._events) - 1
            if recorded >= oldest and not over_size:
                break
            size -= len(frame)
            count += 1
        self._drop(count)

    def _drop(self, count: int) -> None:
        lost = 0
        for _ in range(count):
            n, frame, _ = self._events.popleft()
            self._bytes -= len(frame)
            self._budget.held -= len(frame)
            lost += n > self._written
        self._budget.dropped(lost)


class SessionStreams:
    """A legacy session's resumable streams: the forwarded responses and the standalone GET stream."""

    def __init__(self, limits: ResumeConfig, budget: BufferBudget) -> None:
        self._limits = limits
        self._budget = budget
        self._streams: dict[int, ReplayStream] = {}
        self._keys = itertools.count(1)
        self.priming = True
        """Whether the client negotiated 2025-11-25 or later (set from the initialize result)."""
        self.standalone: ReplayStream | None = None
        """The GET stream: unsolicited messages go here, also while its connection is away."""

    def open(self) -> ReplayStream:
        """A new stream, served by the connection that opens it."""
        stream = ReplayStream(next(self._keys), self._limits, self._budget, priming=self.priming)
        self._streams[stream.key] = stream
        return stream

    def open_standalone(self) -> ReplayStream | None:
        """A new GET stream (a GET without Last-Event-ID), or None while a connection serves one. A GET
        stream whose connection is away is replaced: the client chose not to resume it."""
        if self.standalone is not None:
            if self.standalone.attached:
                return None
            self.forget(self.standalone)
        self.standalone = self.open()
        return self.standalone

    def resume(self, last_event_id: str) -> tuple[ReplayStream, int]:
        """The stream `last_event_id` names, attached to the resuming connection, and the event to
        resume after; ProtocolError when it cannot be resumed (400 malformed, 409 served, 410 gone)."""
        key, _, n = last_event_id.partition("_")
        # Both parts fit in 18 digits: longer ones name no event, and past 4,300 digits int() refuses them.
        if not all(part.isascii() and part.isdigit() and len(part) <= MAX_ID_DIGITS for part in (key, n)):
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                f"Bad Request: Last-Event-ID {last_event_id[:64]!r} is not an event id of this gateway (<stream>_<n>)",
            )
        stream = self._streams.get(int(key))
        if stream is None:
            raise events_gone(last_event_id, "its stream has ended or expired")
        if stream.attached:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                f"Conflict: the stream of Last-Event-ID {last_event_id!r} is being served on another connection",
                http_status=409,
            )
        after = int(n)
        stream.check(after, last_event_id)
        stream.attached = True
        if stream.expiry is not None:
            stream.expiry.cancel()
            stream.expiry = None
        return stream, after

    def detach(self, stream: ReplayStream) -> None:
        """No connection serves `stream` any more: it is forgotten unless resumed within `max_age_s`."""
        if self._streams.get(stream.key) is not stream or not stream.attached:
            return
        stream.attached = False
        loop = asyncio.get_running_loop()
        stream.expiry = loop.call_later(self._limits.max_age_s, self.forget, stream)

    def run_on(self, stream: ReplayStream, relay: Coroutine[Any, Any, object]) -> None:
        """Carry on relaying into `stream` while no connection serves it (the relay records only)."""
        stream.runner = asyncio.create_task(relay, name=f"unattended-stream-{stream.key}")
        stream.runner.add_done_callback(_log_failure)
        self.detach(stream)

    def forget(self, stream: ReplayStream) -> None:
        """Drop `stream` and what it keeps; an unattended relay into it stops (its call runs on upstream,
        as for any dropped 2025-11-25 connection)."""
        if self._streams.pop(stream.key, None) is None:
            return
        if stream.expiry is not None:
            stream.expiry.cancel()
        if stream.runner is not None:
            stream.runner.cancel()
        stream.release()
        stream.end()
        if self.standalone is stream:
            self.standalone = None

    async def close(self) -> None:
        """Forget every stream, and wait until the unattended relays have stopped."""
        runners = [stream.runner for stream in self._streams.values() if stream.runner is not None]
        for stream in list(self._streams.values()):
            self.forget(stream)
        await asyncio.gather(*runners, return_exceptions=True)


def _log_failure(task: asyncio.Task[Any]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        if (failure := task.exception()) is not None:
            log.error("an unattended stream failed", exc_info=failure)
