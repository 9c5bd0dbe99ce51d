"""Unit tests of the tasks/stream cursor (``gateway.events.stream``) over a real in-memory log, no sockets.

Whether a stream is over comes from the log alone: sealed and delivered to its end. A tombstone or an
age trim that overtakes the cursor ends it with ``events_gone``, never with a silent end or a spin.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.events.log import LogBounds, MemoryEventLog
from gateway.events.stream import plan_stream, run_stream
from gateway.protocol.jsonrpc import ProtocolError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sink:
    """What a stream wrote: event frames (counted by seq) and keep-alive comments."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    async def write(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    @property
    def seqs(self) -> list[int]:
        joined = b"".join(self.chunks)
        return [int(part.split(b",", 1)[0]) for part in joined.split(b'"params":{"seq":')[1:]]

    @property
    def keepalives(self) -> int:
        return sum(chunk.count(b": keepalive") for chunk in self.chunks)


async def stream(
    log: MemoryEventLog, first_seq: int, sink: Sink, stop: asyncio.Event | None = None
) -> ProtocolError | None:
    outcome = await run_stream(
        log,
        "t",
        first_seq,
        sink.write,
        stop=stop or asyncio.Event(),
        keepalive_s=0.05,
        batch=3,
        flush_interval_s=0,
    )
    assert not isinstance(outcome, dict)
    return outcome


def body(n: int) -> bytes:
    return b'"n":%d' % n


def test_plan_stream_takes_the_end_from_the_seal() -> None:
    assert plan_stream("t", None, LogBounds(None, 3, sealed=True)).first_seq is None
    assert plan_stream("t", None, LogBounds(None, 3)).first_seq == 3
    assert plan_stream("t", 2, LogBounds(0, 3, sealed=True)).first_seq is None
    assert plan_stream("t", 2, LogBounds(0, 3)).first_seq == 3
    with pytest.raises(ProtocolError) as gone:
        plan_stream("t", 0, LogBounds(None, 3, sealed=True))  # a tombstone keeps counting
    assert gone.value.data == {"reason": "events_gone", "taskId": "t", "earliestSeq": 3}


async def test_a_stream_ends_when_the_log_is_sealed_with_its_last_events() -> None:
    log = MemoryEventLog(100, Clock())
    await log.append("t", [body(0), body(1)])
    sink = Sink()
    running = asyncio.create_task(stream(log, 0, sink))
    await asyncio.sleep(0.01)
    assert not running.done()
    await log.append("t", [body(2), body(3)], seal=True)
    assert await asyncio.wait_for(running, 5) is None
    assert sink.seqs == [0, 1, 2, 3]


async def test_a_sealed_log_delivered_to_its_end_ends_at_once() -> None:
    log = MemoryEventLog(100, Clock())
    await log.append("t", [body(0)], seal=True)
    sink = Sink()
    assert await asyncio.wait_for(stream(log, 0, sink), 5) is None
    assert sink.seqs == [0] and sink.keepalives == 0


async def test_a_sealed_log_without_a_sealing_append_ends_the_stream() -> None:
    log = MemoryEventLog(100, Clock())
    await log.append("t", [body(0)])
    sink = Sink()
    running = asyncio.create_task(stream(log, 1, sink))
    await asyncio.sleep(0.01)
    await log.seal("t")
    assert await asyncio.wait_for(running, 5) is None
    assert sink.seqs == []


async def test_a_deleted_log_ends_a_stream_behind_it_with_events_gone() -> None:
    log = MemoryEventLog(100, Clock())
    await log.append("t", [body(0), body(1), body(2)])
    sink = Sink()
    running = asyncio.create_task(stream(log, 3, sink))
    await asyncio.sleep(0.01)
    await log.append("t", [body(3)])
    await log.delete("t")  # before the stream read seq 3
    outcome = await asyncio.wait_for(running, 5)
    assert isinstance(outcome, ProtocolError)
    assert outcome.data == {"reason": "events_gone", "taskId": "t", "earliestSeq": 4}


async def test_an_age_trim_of_everything_after_the_cursor_is_events_gone_not_a_spin() -> None:
    clock = Clock()
    log = MemoryEventLog(100, clock, max_event_age_s=10)
    await log.append("t", [body(0), body(1)])
    clock.now += 60
    sink = Sink()
    outcome = await asyncio.wait_for(stream(log, 0, sink), 5)
    assert isinstance(outcome, ProtocolError)
    assert outcome.data == {"reason": "events_gone", "taskId": "t", "earliestSeq": 2}
    assert sink.seqs == []


async def test_stop_ends_a_stream_on_a_running_task() -> None:
    log = MemoryEventLog(100, Clock())
    await log.create("t")
    stop = asyncio.Event()
    sink = Sink()
    running = asyncio.create_task(stream(log, 0, sink, stop))
    await asyncio.sleep(0.12)
    assert not running.done() and sink.keepalives >= 1  # alive, with keep-alives while nothing comes
    stop.set()
    assert await asyncio.wait_for(running, 5) is None
