"""Unit tests of the shared live tail (``gateway.events.fanout``) behind many tasks/stream cursors of one
task, over a real in-memory log, no sockets.

Caught-up streams write the same bytes object, encoded once per tick, equal to what each stream encoded
for itself before; each writes at most once per tick; an append wakes the tail alone, not every
stream; a stream that falls behind catches up from the log without a gap or a duplicate.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.events import fanout
from gateway.events.fanout import SharedTail
from gateway.events.log import MemoryEventLog
from gateway.events.stream import run_stream
from gateway.events.stream_frames import EventFrames, recorded_at
from gateway.protocol import sse
from gateway.protocol.jsonrpc import ProtocolError
from gateway.protocol.names import RECORDED_AT_KEY, RELATED_TASK_KEY

TASK = "task-1"
STREAMS = 5
WAIT_S = 10


class Sink:
    """What one stream wrote, chunk by chunk; a closed gate holds its writes (a client not reading)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.written_now = 0
        """Chunks the shared tail wrote for the stream (`write_now`), without waking its task."""

    async def write(self, chunk: bytes) -> None:
        await self.gate.wait()
        self.chunks.append(chunk)

    def write_now(self, chunk: bytes) -> bool:
        """Like a connection: takes the bytes at once unless its buffer is full (the gate closed)."""
        if not self.gate.is_set():
            return False
        self.chunks.append(chunk)
        self.written_now += 1
        return True

    @property
    def seqs(self) -> list[int]:
        return [int(frame.split(b",", 1)[0]) for frame in b"".join(self.chunks).split(b'"params":{"seq":')[1:]]


def body(n: int) -> bytes:
    return b'"type":"t","payload":{"n":%d}' % n


def tail_of(log: MemoryEventLog) -> SharedTail:
    return fanout._tails[log][TASK]


async def until(condition: object) -> None:
    """Let the loop run until `condition()` holds (no timed sleep: each turn is one loop iteration)."""
    assert callable(condition)
    async with asyncio.timeout(WAIT_S):
        while not condition():  # noqa: ASYNC110 - the state polled has no event of its own
            await asyncio.sleep(0)


async def start(
    log: MemoryEventLog, sinks: list[Sink], first_seq: int = 0, *, direct: bool = False
) -> list[asyncio.Task[object]]:
    """One stream per sink from `first_seq`, each caught up and waiting on the shared tail; `direct`: the
    tail writes for them (`write_now`)."""
    tasks: list[asyncio.Task[object]] = [
        asyncio.create_task(
            run_stream(
                log,
                TASK,
                first_seq,
                sink.write,
                stop=asyncio.Event(),
                keepalive_s=3600,
                batch=64,
                flush_interval_s=0,
                write_now=sink.write_now if direct else None,
            )
        )
        for sink in sinks
    ]
    await until(lambda: TASK in fanout._tails.get(log, {}) and tail_of(log).waiting == len(sinks))
    return tasks


async def finish(log: MemoryEventLog, tasks: list[asyncio.Task[object]]) -> None:
    await log.seal(TASK)
    async with asyncio.timeout(WAIT_S):
        outcomes = await asyncio.gather(*tasks)
    assert outcomes == [None] * len(tasks)
    assert TASK not in fanout._tails.get(log, {}), "the tail stops with its last stream"


def reference_frame(seq: int, created: float, event_body: bytes) -> bytes:
    """The frame as a JSON encoder would write the notification (the shape every era delivers)."""
    params = {"seq": seq, "taskId": TASK, **orjson.loads(b"{" + event_body + b"}")}
    params["_meta"] = {RELATED_TASK_KEY: {"taskId": TASK}, RECORDED_AT_KEY: recorded_at(created).decode()}
    message = {"jsonrpc": "2.0", "method": "notifications/tasks/event", "params": params}
    return sse.encode_message(orjson.dumps(message))


async def test_caught_up_streams_share_one_encoding_equal_to_the_per_stream_one() -> None:
    log = MemoryEventLog(1000)
    await log.create(TASK)
    sinks = [Sink() for _ in range(STREAMS)]
    tasks = await start(log, sinks)
    await log.append(TASK, [body(n) for n in range(10)])
    await until(lambda: all(sink.chunks for sink in sinks))
    shared = sinks[0].chunks[0]
    assert all(sink.chunks == [shared] and sink.chunks[0] is shared for sink in sinks), "one bytes object"
    events = await log.read(TASK, -1, 100)
    assert shared == EventFrames(TASK).frames(events), "the bytes each stream encoded for itself before"
    assert shared == b"".join(reference_frame(e.seq, e.created, e.body) for e in events)
    await finish(log, tasks)


@pytest.mark.parametrize("direct", [False, True], ids=["own-task", "written-by-the-tail"])
async def test_each_stream_writes_at_most_once_per_tick(direct: bool) -> None:
    log = MemoryEventLog(10_000)
    await log.create(TASK)
    sinks = [Sink() for _ in range(STREAMS)]
    tasks = await start(log, sinks, direct=direct)
    tail = tail_of(log)
    for tick in range(1, 6):
        for n in range(7):  # a burst of appends in one loop step: one tick
            await log.append(TASK, [body(n)])
        await until(lambda tick=tick: tail.ticks == tick and tail.waiting == STREAMS)
    await finish(log, tasks)
    for sink in sinks:
        assert len(sink.chunks) == tail.ticks == 5, "one write per tick"
        assert sink.seqs == list(range(35))
        assert sink.written_now == (5 if direct else 0)


async def test_an_append_wakes_the_tail_not_every_stream() -> None:
    log = MemoryEventLog(1000)
    await log.create(TASK)
    sinks = [Sink() for _ in range(STREAMS)]
    tasks = await start(log, sinks)
    await until(lambda: log._logs[TASK].changed is not None)
    changed = log._logs[TASK].changed
    assert changed is not None
    # asyncio.Event keeps one future per waiting task: only the tail waits on the log itself.
    assert len(changed._waiters) == 1
    await log.append(TASK, [body(0)])
    await finish(log, tasks)


@pytest.mark.parametrize("direct", [False, True], ids=["own-task", "written-by-the-tail"])
async def test_a_stream_that_falls_behind_catches_up_from_the_log_without_gap_or_duplicate(direct: bool) -> None:
    log = MemoryEventLog(1000)
    await log.create(TASK)
    fast, slow = Sink(), Sink()
    tasks = await start(log, [fast, slow], direct=direct)
    tail = tail_of(log)
    slow.gate.clear()  # the slow stream's next write blocks, as on a full socket
    for tick in range(1, 4):
        await log.append(TASK, [body(tick), body(tick)])
        await until(lambda tick=tick: tail.ticks == tick and len(fast.chunks) == tick)
    assert slow.chunks == []
    slow.gate.set()
    await log.append(TASK, [body(9)])
    await until(lambda: slow.seqs[-1:] == [6] and fast.seqs[-1:] == [6])
    await finish(log, tasks)
    assert fast.seqs == slow.seqs == list(range(7))


@pytest.mark.parametrize("first_seq", [0, 3])
async def test_a_late_stream_replays_then_joins_the_shared_tail(first_seq: int) -> None:
    log = MemoryEventLog(1000)
    await log.append(TASK, [body(n) for n in range(5)])
    early = Sink()
    tasks = await start(log, [early], first_seq=5)
    late = Sink()
    tasks.append(
        asyncio.create_task(
            run_stream(
                log, TASK, first_seq, late.write, stop=asyncio.Event(), keepalive_s=3600, batch=2, flush_interval_s=0
            )
        )
    )
    tail = tail_of(log)
    await until(lambda: tail.waiting == 2)
    await log.append(TASK, [body(5), body(6)])
    await until(lambda: late.seqs[-1:] == [6] and early.seqs[-1:] == [6])
    assert late.chunks[-1] is early.chunks[-1], "once caught up, the late stream shares the block"
    await finish(log, tasks)
    assert late.seqs == list(range(first_seq, 7))


async def test_events_trimmed_before_the_tail_reads_them_end_its_streams_with_events_gone() -> None:
    now = [1000.0]
    log = MemoryEventLog(1000, clock=lambda: now[0], max_event_age_s=10)
    await log.create(TASK)
    sinks = [Sink() for _ in range(STREAMS)]
    tasks = await start(log, sinks, direct=True)
    await log.append(TASK, [body(0)])
    now[0] += 60  # aged out before the tail's read: it must neither spin nor publish
    async with asyncio.timeout(WAIT_S):
        outcomes = await asyncio.gather(*tasks)
    for outcome in outcomes:
        assert isinstance(outcome, ProtocolError) and outcome.data == {
            "reason": "events_gone",
            "taskId": TASK,
            "earliestSeq": 1,
        }, outcome
    assert all(sink.seqs == [] for sink in sinks)
