"""SEP-2694 `tasks/stream` conformance: the gateway in front of the example server, over real HTTP.

One test per numbered rule (`test_rule<N>_...`, both eras where the era matters):

1. `after` must be a non-negative integer and `taskId` a string; an unknown task is -32602.
2. `after = N` delivers the retained events with seq > N in order, then the live ones.
3. Without `after` the stream starts at the earliest retained event.
4. A terminal task with nothing after the cursor: the empty result at once; a live stream ends with
   the result right after the last event.
5. Every notification is exactly {seq, taskId, type, payload, _meta}, related-task == taskId, the type
   under the configured vendor prefix, the payload an object; `_meta` also carries the time the event
   was recorded (not served), which never decreases within a task.
6. At most one active stream per task per (legacy) session: a second one is -32602.
7. Cancelling the stream stops delivery, not the task.
8. Progress on the stream's own token is not a task event and leaves seq contiguous.
9. A slow reader costs nothing unbounded and loses nothing: resuming with `after` completes the history.
10. The 2026-07-28 envelope, `Mcp-Name` and the tasks extension are checked.

Then the guarantees that span reconnects: 200 random disconnect/resume cycles against a running task
(in both eras, their history equal to a late joiner's), late joiners, two
concurrent readers, retention (`events_gone`, never a silent jump), oversized payloads, a task
outliving its session, 2026-07-28 streams not holding upstream processes, and the `[events]` /
`[[rules]]` configuration. Tasks are created in the legacy dialect (at once); the
streams run in both eras, since a task belongs to its caller, not to a session or an era.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import re
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.wire import (
    LEGACY,
    MODERN,
    RECORDED_AT,
    RELATED_TASK,
    Client,
    Message,
    Reply,
    envelope,
    marker_lines,
    seqs,
    task_events,
    wait_for_marker,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

PREFIX = "com.example.conformance"
CONFIG = f"""
[events]
prefix = "{PREFIX}"

[tasks]
stream_write_timeout_s = 2
max_streams_per_task = 4  # small: a dropped stream that kept its slot would soon lock a task out
"""
EMPTY = {LEGACY: {}, MODERN: {"resultType": "complete"}}
ERAS = pytest.mark.parametrize("era", [LEGACY, MODERN])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def legacy(gw: RunningGateway, http: aiohttp.ClientSession) -> AsyncIterator[Client]:
    """The module's legacy session (sessions cost an upstream process each); it creates the tasks."""
    client = Client(http, gw.url)
    await client.initialize()
    yield client
    await client.delete()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def second(gw: RunningGateway, http: aiohttp.ClientSession) -> AsyncIterator[Client]:
    """A second legacy session of the same caller."""
    client = Client(http, gw.url)
    await client.initialize()
    yield client
    await client.delete()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def done_task(legacy: Client) -> tuple[str, list[Message]]:
    """A completed task and the messages of a full stream of it."""
    task_id = await create_task(legacy, "slow_build", {"steps": 4, "delay": 0.01})
    await legacy.request("tasks/result", {"taskId": task_id})
    reply = await legacy.request("tasks/stream", {"taskId": task_id})
    assert reply.final == {"jsonrpc": "2.0", "id": reply.final["id"], "result": {}}, reply.messages
    return task_id, reply.messages


def client_for(era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession) -> Client:
    return legacy if era == LEGACY else Client(http, gw.url, MODERN)


async def create_task(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """A legacy task-augmented tools/call; the new task's id."""
    result = await client.result("tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": 300_000}})
    task_id: str = result["task"]["taskId"]
    return task_id


async def stream(client: Client, task_id: str, after: int | None = None, **meta: Any) -> Reply:
    """Open a tasks/stream (unread)."""
    params: dict[str, Any] = {"taskId": task_id}
    if after is not None:
        params["after"] = after
    if meta:
        params["_meta"] = meta
    return await client.open("tasks/stream", params)


async def take(reply: Reply, n: int) -> list[Message]:
    """Read up to `n` more messages (fewer if the response ends)."""
    taken = []
    while len(taken) < n and (message := await reply.next()) is not None:
        taken.append(message)
    return taken


def error_of(message: Message) -> dict[str, Any]:
    assert "error" in message, message
    error: dict[str, Any] = message["error"]
    return error


def assert_contiguous(seq_list: list[int], first: int) -> None:
    """`seq_list` is first, first+1, ... (no gap, duplicate or reordering); the message shows the first break."""
    for i, seq in enumerate(seq_list):
        assert seq == first + i, f"expected seq {first + i} at index {i}, got ...{seq_list[max(0, i - 3) : i + 3]}..."


def short(name: str) -> str:
    return name.removeprefix(PREFIX + ".")


# -- rule 1: validation --------------------------------------------------------------------------


@ERAS
async def test_rule1_after_must_be_a_non_negative_integer(
    era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession, done_task: tuple[str, list[Message]]
) -> None:
    async with asyncio.timeout(30):
        client = client_for(era, legacy, gw, http)
        task_id, _ = done_task
        for bad in (-1, 1.5, True, False, "3", None, [1], {"seq": 1}, 2**63, 2**64 - 1):
            reply = await client.request("tasks/stream", {"taskId": task_id, "after": bad})
            assert error_of(reply.final)["code"] == -32602, (bad, reply.messages)
            assert reply.status == (400 if era == MODERN else 200), (bad, reply.status)
            assert not task_events(reply.messages), reply.messages


async def test_rule1_task_id_must_be_a_string(legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with asyncio.timeout(30):
        for params in ({}, {"taskId": 7}, {"taskId": None}, {"taskId": ["x"]}, {"after": 0}):
            reply = await legacy.request("tasks/stream", params)
            assert error_of(reply.final)["code"] == -32602, (params, reply.messages)
        modern = Client(http, gw.url, MODERN)
        reply = await modern.request("tasks/stream", {"taskId": 7}, headers={"Mcp-Name": "7"})
        assert reply.status == 400 and error_of(reply.final)["code"] == -32602, reply.messages


@ERAS
async def test_rule1_unknown_task_is_invalid_params_like_tasks_get(
    era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30):
        client = client_for(era, legacy, gw, http)
        for unknown in ("0" * 32, "no-such-task", "ünïcode:_id"):
            streamed = await client.request("tasks/stream", {"taskId": unknown})
            got = await client.request("tasks/get", {"taskId": unknown})
            assert error_of(streamed.final)["code"] == -32602, streamed.messages
            # One answer for every task the caller cannot see, so ids cannot be probed.
            assert error_of(streamed.final)["message"] == error_of(got.final)["message"], (streamed, got)


# -- rules 2-4: where a stream starts and ends -----------------------------------------------------


@ERAS
async def test_rule2_after_n_delivers_later_events_in_order_then_live(
    era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(60):
        task_id = await create_task(legacy, "slow_build", {"steps": 12, "delay": 0.15})
        probe = await stream(legacy, task_id)
        first = await take(probe, 6)  # seq 0..5 exist now
        probe.close()
        assert seqs(first) == list(range(6)), first
        client = client_for(era, legacy, gw, http)
        reply = await stream(client, task_id, after=3)
        assert (await client.result("tasks/get", {"taskId": task_id}))["status"] == "working"
        await reply.rest()
        got = seqs(reply.messages)
        assert got[0] == 4, got
        assert_contiguous(got, 4)
        assert short(task_events(reply.messages)[-1]["type"]) == "task.terminal", reply.messages[-3:]
        assert got[-1] == 2 * 12 + 3  # created, log, (progress, log) x 12, status, terminal: seq 0..27
        assert reply.final["result"] == EMPTY[era], reply.final


@ERAS
async def test_rule3_no_after_starts_at_the_earliest_retained_event(
    era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(60):
        task_id = await create_task(legacy, "slow_build", {"steps": 6, "delay": 0.1})
        client = client_for(era, legacy, gw, http)
        reply = await (await stream(client, task_id)).rest()
        got = seqs(reply.messages)
        assert_contiguous(got, 0)
        events = task_events(reply.messages)
        assert short(events[0]["type"]) == "task.created" and short(events[-1]["type"]) == "task.terminal", events
        assert reply.final["result"] == EMPTY[era], reply.final


@ERAS
async def test_rule4_terminal_with_nothing_left_is_the_empty_result_at_once(
    era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession, done_task: tuple[str, list[Message]]
) -> None:
    async with asyncio.timeout(30):
        client = client_for(era, legacy, gw, http)
        task_id, messages = done_task
        last = seqs(messages)[-1]
        started = time.monotonic()
        reply = await (await stream(client, task_id, after=last)).rest()
        assert time.monotonic() - started < 2.0
        assert reply.status == 200 and reply.messages == [
            {"jsonrpc": "2.0", "id": reply.final["id"], "result": EMPTY[era]}
        ], reply.messages


@ERAS
async def test_rule4_a_live_stream_ends_with_the_result_after_the_last_event(
    era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(60):
        task_id = await create_task(legacy, "slow_build", {"steps": 5, "delay": 0.2})
        client = client_for(era, legacy, gw, http)
        reply = await stream(client, task_id)
        await reply.rest()
        assert not reply.cut and reply.is_sse, reply.messages
        *events, final = reply.messages
        assert all(message.get("method") == "notifications/tasks/event" for message in events), events
        assert short(events[-1]["params"]["type"]) == "task.terminal", events[-1]
        assert final["result"] == EMPTY[era], final
        assert (await client.result("tasks/get", {"taskId": task_id}))["status"] == "completed"


# -- rule 5: the event envelope ----------------------------------------------------------------------


@ERAS
async def test_rule5_every_notification_is_an_exact_task_event(
    era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession, done_task: tuple[str, list[Message]]
) -> None:
    async with asyncio.timeout(30):
        task_id, _ = done_task
        opened = datetime.datetime.now(datetime.UTC)
        reply = await (await stream(client_for(era, legacy, gw, http), task_id)).rest()
        notifications = reply.messages[:-1]
        assert notifications and reply.notifications == notifications, reply.messages
        for message in notifications:
            assert set(message) == {"jsonrpc", "method", "params"}, message
            assert message["method"] == "notifications/tasks/event", message
            params = message["params"]
            assert set(params) == {"seq", "taskId", "type", "payload", "_meta"}, params
            assert params["taskId"] == task_id, params
            assert params["_meta"] == {RELATED_TASK: {"taskId": task_id}, RECORDED_AT: params["_meta"][RECORDED_AT]}
            assert isinstance(params["type"], str) and params["type"].startswith(PREFIX + "."), params
            assert len(params["type"]) > len(PREFIX) + 1, params
            assert isinstance(params["payload"], dict), params
            assert isinstance(params["seq"], int) and not isinstance(params["seq"], bool), params
        assert_contiguous(seqs(notifications), 0)
        recorded = [recorded_at(message) for message in notifications]
        assert recorded == sorted(recorded), recorded
        # The task finished before this stream opened: a time taken when serving would be later.
        assert recorded[-1] <= opened, (recorded[-1], opened)


def recorded_at(message: Message) -> datetime.datetime:
    """The event's recording time, checked to be UTC ISO 8601 with milliseconds (`...T09:43:00.123Z`)."""
    text = message["params"]["_meta"][RECORDED_AT]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text), text
    return datetime.datetime.fromisoformat(text)


# -- rule 6: one stream per task per session --------------------------------------------------------


async def test_rule6_a_second_stream_on_the_same_session_is_rejected(legacy: Client, second: Client) -> None:
    async with asyncio.timeout(60):
        task_id = await create_task(legacy, "slow_build", {"steps": 20, "delay": 0.1})
        active = await stream(legacy, task_id)
        other_session = None
        try:
            assert seqs(await take(active, 1)) == [0]
            duplicate = await legacy.request("tasks/stream", {"taskId": task_id, "after": 0})
            assert duplicate.status == 200 and error_of(duplicate.final)["code"] == -32602, duplicate.messages
            assert not task_events(duplicate.messages), duplicate.messages
            # Another session of the same caller may stream the same task at the same time.
            other_session = await stream(second, task_id)
            assert seqs(await take(other_session, 2)) == [0, 1]
            # The first stream is unaffected by the rejected one.
            assert seqs(await take(active, 2)) == [1, 2]
        finally:
            active.close()
            if other_session is not None:
                other_session.close()
        # Let the task end here: on a stdio session, logs of concurrent calls cannot be attributed.
        await legacy.request("tasks/result", {"taskId": task_id})


# -- rule 7: cancelling a stream -----------------------------------------------------------------------


async def test_rule7_legacy_cancelled_notification_stops_the_stream_not_the_task(
    legacy: Client, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        marker = tmp_path / "marker"
        task_id = await create_task(legacy, "slow_build", {"steps": 30, "delay": 0.1, "marker": str(marker)})
        request_id = legacy.next_id()
        reply = await legacy.open("tasks/stream", {"taskId": task_id}, request_id=request_id)
        first = seqs(await take(reply, 3))
        assert first == [0, 1, 2], first
        assert await legacy.notify("notifications/cancelled", {"requestId": request_id, "reason": "test"}) == 202
        async with asyncio.timeout(5):
            await reply.rest()
        reply.close()
        got = seqs(reply.messages)
        assert_contiguous(got, 0)
        assert (await legacy.result("tasks/get", {"taskId": task_id}))["status"] == "working"
        assert "cancelled" not in marker_lines(marker)

        # As SEP-2694 advises for a new cursor: cancel, then open a new stream at once; it is accepted.
        resumed = await (await stream(legacy, task_id, after=got[-1])).rest()
        assert "result" in resumed.final, resumed.messages
        assert_contiguous(got + seqs(resumed.messages), 0)
        assert short(task_events(resumed.messages)[-1]["type"]) == "task.terminal"
        assert (await wait_for_marker(marker, ("finished", "cancelled"), 10))[-1:] == ["finished"]
        assert (await legacy.result("tasks/get", {"taskId": task_id}))["status"] == "completed"


async def test_rule7_modern_closing_the_post_stops_the_stream_not_the_task(
    legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        marker = tmp_path / "marker"
        task_id = await create_task(legacy, "slow_build", {"steps": 15, "delay": 0.1, "marker": str(marker)})
        client = Client(http, gw.url, MODERN)
        reply = await stream(client, task_id)
        got = seqs(await take(reply, 3))
        reply.close()
        assert got == [0, 1, 2], got
        assert (await wait_for_marker(marker, ("finished", "cancelled"), 15))[-1:] == ["finished"]
        done = await client.result("tasks/get", {"taskId": task_id})
        assert done["status"] == "completed", done
        resumed = await (await stream(client, task_id, after=2)).rest()
        assert_contiguous(got + seqs(resumed.messages), 0)
        assert resumed.final["result"] == EMPTY[MODERN], resumed.final


# -- rule 8: progress on the stream request ----------------------------------------------------------


@ERAS
async def test_rule8_progress_on_the_stream_is_not_a_task_event(
    era: str, legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(60):
        task_id = await create_task(legacy, "slow_build", {"steps": 8, "delay": 0.05})
        client = client_for(era, legacy, gw, http)
        reply = await (await stream(client, task_id, progressToken="stream-progress-1")).rest()
        progress = [message for message in reply.notifications if message["method"] == "notifications/progress"]
        others = [message["method"] for message in reply.notifications if message not in progress]
        assert progress, "no progress notification for the stream's progressToken"
        assert set(others) == {"notifications/tasks/event"}, others
        values = [message["params"]["progress"] for message in progress]
        assert all(message["params"]["progressToken"] == "stream-progress-1" for message in progress), progress
        assert all("seq" not in message["params"] for message in progress), progress
        assert values == sorted(set(values)), f"progress must increase: {values}"
        assert_contiguous(seqs(reply.messages), 0)
        assert short(task_events(reply.messages)[-1]["type"]) == "task.terminal"
        assert reply.final["result"] == EMPTY[era], reply.final


# -- rule 9: a slow reader -------------------------------------------------------------------------


def _small_buffer_socket(addr_info: Any) -> socket.socket:
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


async def test_rule9_a_slow_reader_resumes_to_the_complete_history(
    legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    """A stream of ~5 MB of events to a client that stalls with a 4 KB receive buffer.

    The gateway holds a cursor per stream, not a queue: a stalled client costs a blocked write, and
    past `stream_write_timeout_s` (2 s here) the gateway drops it. Whatever happens, the client that
    comes back with `after` completes the exact history, and nobody else waits meanwhile.
    """
    async with asyncio.timeout(90):
        arguments = {"suite": "s" * 8000, "count": 600, "delay": 0}  # ~8 KB per log event
        task_id = await create_task(legacy, "run_tests", arguments)
        await legacy.request("tasks/result", {"taskId": task_id})
        connector = aiohttp.TCPConnector(socket_factory=_small_buffer_socket)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as slow_http:
            slow = Client(slow_http, gw.url, MODERN)
            reply = await stream(slow, task_id)
            assert_contiguous(seqs(await take(reply, 50)), 0)
            stall = asyncio.create_task(asyncio.sleep(3.5))
            started = time.monotonic()
            assert (await legacy.result("tasks/get", {"taskId": task_id}))["status"] == "completed"
            assert time.monotonic() - started < 2.0, "tasks/get waited on a stalled stream"
            fast = await (await stream(Client(http, gw.url, MODERN), task_id)).rest()
            assert fast.final["result"] == EMPTY[MODERN], fast.final
            await stall
            await reply.rest()  # what was in flight, then the end (or the gateway's drop)
            reply.close()
            got = seqs(reply.messages)
            resumes = 0
            while not reply.complete:
                resumes += 1
                assert resumes < 20, "no end after 20 resumes"
                reply = await (await stream(slow, task_id, after=got[-1])).rest()
                got += seqs(reply.messages)
            assert reply.final["result"] == EMPTY[MODERN], reply.final
            assert_contiguous(got, 0)
            assert got == seqs(fast.messages), "the slow reader's history differs from the fast reader's"
            assert len(got) == 2 * 600 + 4, len(got)


# -- rule 10: the 2026-07-28 request checks ------------------------------------------------------------


async def test_rule10_modern_envelope_name_and_extension_are_checked(
    gw: RunningGateway, http: aiohttp.ClientSession, done_task: tuple[str, list[Message]]
) -> None:
    async with asyncio.timeout(30):
        task_id, _ = done_task
        client = Client(http, gw.url, MODERN)
        bare = {"jsonrpc": "2.0", "id": 1, "method": "tasks/stream", "params": {"taskId": task_id}}
        reply = await (await client.send(bare)).rest()
        assert reply.status == 400 and error_of(reply.final)["code"] == -32602, reply.messages

        reply = await client.request("tasks/stream", {"taskId": task_id}, headers={"Mcp-Name": "another-task"})
        assert reply.status == 400 and error_of(reply.final)["code"] == -32020, reply.messages
        reply = await client.request("tasks/stream", {"taskId": task_id}, headers={"Mcp-Name": None})
        assert reply.status == 400 and error_of(reply.final)["code"] == -32020, reply.messages

        undeclared = Client(http, gw.url, MODERN, tasks=False)
        reply = await undeclared.request("tasks/stream", {"taskId": task_id})
        assert reply.status == 400 and error_of(reply.final)["code"] == -32021, reply.messages
        assert not task_events(reply.messages)

        # The same request with everything in order streams.
        ok = await client.request("tasks/stream", {"taskId": task_id, "_meta": envelope()})
        assert ok.final["result"] == EMPTY[MODERN] and task_events(ok.messages), ok.messages


# -- across reconnects --------------------------------------------------------------------------------


@ERAS
async def test_200_random_disconnect_resume_cycles_assemble_exactly_a_late_joiners_history(
    era: str, legacy: Client, second: Client, gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    """Cuts at random points (after 0-5 messages, half of them a few ms later, so some land mid-write)
    while the task emits ~200 events/s; it runs until cancelled after the last cycle, so every cut
    hits a live stream. What the reconnecting reader assembles must equal a late joiner's replay, event
    for event: 0 lost, 0 duplicated, 0 reordered."""
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    async with asyncio.timeout(60):
        task_id = await create_task(legacy, "slow_build", {"steps": 1_000_000, "delay": 0.01})
        client = client_for(era, legacy, gw, http)
        assembled: list[dict[str, Any]] = []
        try:
            for cycle in range(200):
                reply = await stream(client, task_id, after=assembled[-1]["seq"] if assembled else None)
                try:
                    messages = await take(reply, rng.randint(0, 5))
                    if rng.random() < 0.5:
                        await asyncio.sleep(rng.random() * 0.01)
                finally:
                    reply.close()  # the client goes away mid-stream, without a word
                assert not (messages and "error" in messages[-1]), f"cycle {cycle} (seed {seed}): {messages[-1]}"
                new = seqs(messages)
                assert new == list(range(len(assembled), len(assembled) + len(new))), (
                    f"cycle {cycle} (seed {seed}): after {assembled[-1]['seq'] if assembled else None} came {new}"
                )
                assembled += task_events(messages)
        finally:
            await legacy.result("tasks/cancel", {"taskId": task_id})
        rest = await (await stream(client, task_id, after=assembled[-1]["seq"] if assembled else None)).rest()
        assert rest.final["result"] == EMPTY[era], rest.final
        assembled += task_events(rest.messages)

        late = second if era == LEGACY else Client(http, gw.url, MODERN)
        replay = task_events((await (await stream(late, task_id)).rest()).messages)
        assert assembled == replay, f"seed {seed}: the assembled history differs from the late joiner's"
        assert [event["seq"] for event in replay] == list(range(len(replay))), f"seed {seed}"
        assert len(replay) > 200, f"seed {seed}: only {len(replay)} events"  # the cuts fell among live events
        assert [short(event["type"]) for event in replay[-2:]] == ["task.status", "task.terminal"], replay[-3:]


async def test_a_late_joiner_gets_the_whole_retained_history(
    legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession, done_task: tuple[str, list[Message]]
) -> None:
    async with asyncio.timeout(30):
        task_id, first_reader = done_task
        late = await (await stream(Client(http, gw.url, MODERN), task_id)).rest()
        again = await (await stream(legacy, task_id)).rest()
        assert task_events(late.messages) == task_events(again.messages) == task_events(first_reader)
        events = task_events(late.messages)
        assert [short(event["type"]) for event in events] == [
            "task.created",
            "log",
            *["progress", "log"] * 4,
            "task.status",
            "task.terminal",
        ], events
        assert events[-2]["payload"]["status"] == "completed", events[-2]


async def test_two_concurrent_streams_of_one_task_see_the_same_sequence(legacy: Client, second: Client) -> None:
    async with asyncio.timeout(60):
        task_id = await create_task(legacy, "slow_build", {"steps": 20, "delay": 0.05})
        one, two = await asyncio.gather(stream(legacy, task_id), stream(second, task_id))
        await asyncio.gather(one.rest(), two.rest())
        assert one.final["result"] == two.final["result"] == {}, (one.final, two.final)
        assert task_events(one.messages) == task_events(two.messages)
        assert_contiguous(seqs(one.messages), 0)
        assert len(seqs(one.messages)) == 2 * 20 + 4


async def test_a_task_outlives_the_session_that_created_it(
    legacy: Client, gw: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        marker = tmp_path / "marker"
        creator = Client(http, gw.url)
        await creator.initialize()
        task_id = await create_task(creator, "slow_build", {"steps": 10, "delay": 0.15, "marker": str(marker)})
        assert await creator.delete() == 200
        gone = await creator.request("tasks/get", {"taskId": task_id})
        assert gone.status == 404, gone.messages
        reply = await (await stream(legacy, task_id)).rest()
        assert_contiguous(seqs(reply.messages), 0)
        assert short(task_events(reply.messages)[-1]["type"]) == "task.terminal"
        assert reply.final["result"] == {}, reply.final
        result = (await legacy.request("tasks/result", {"taskId": task_id})).final["result"]
        assert result["content"] == [{"type": "text", "text": "built 10 steps"}], result
        assert marker_lines(marker)[-1:] == ["finished"], marker_lines(marker)


@contextlib.asynccontextmanager
async def gateway_session(config: str, seconds: float = 90) -> AsyncIterator[tuple[Client, Message]]:
    """A gateway started with `config` and a legacy client on it, initialized (and its result)."""
    async with (
        asyncio.timeout(seconds),
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gateway,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
    ):
        client = Client(session, gateway.url)
        yield client, await client.initialize()


# -- configuration: retention, payload limit, [events], [[rules]] -------------------------------------


async def test_retention_trimming_reports_events_gone_with_the_exact_earliest_seq() -> None:
    config = f'[events]\nprefix = "{PREFIX}"\n[retention]\nmax_events_per_task = 50\n'
    async with gateway_session(config) as (client, init):
        assert init["result"]["capabilities"]["tasks"]["eventStreams"]["maxEventsPerTask"] == 50
        task_id = await create_task(client, "burst", {"n": 500})
        # A reader that starts at once either keeps up or is told events_gone: never a silent jump.
        # (It starts at the earliest event still retained, which need not be seq 0 any more.)
        racing = await (await stream(client, task_id)).rest()
        raced = seqs(racing.messages) or [-1]
        assert_contiguous(raced, raced[0])
        if "error" in racing.final:
            assert error_of(racing.final)["code"] == -32010, racing.final
            assert error_of(racing.final)["data"]["earliestSeq"] > raced[-1] + 1, racing.final
        else:
            assert racing.final["result"] == {} and raced[-1] == 502, racing.final

        await client.request("tasks/result", {"taskId": task_id})
        next_seq = 500 + 3  # created, 500 progress, status, terminal
        earliest = next_seq - 50
        for after in (0, earliest - 2):
            reply = await client.request("tasks/stream", {"taskId": task_id, "after": after})
            assert reply.status == 200 and not task_events(reply.messages), reply.messages
            error = error_of(reply.final)
            assert error["code"] == -32010, error
            assert error["data"] == {"reason": "events_gone", "taskId": task_id, "earliestSeq": earliest}, error
        modern = Client(client.http, client.url, MODERN)
        reply = await modern.request("tasks/stream", {"taskId": task_id, "after": 5})
        assert error_of(reply.final)["data"]["earliestSeq"] == earliest, reply.messages

        resumed = await (await stream(client, task_id, after=earliest - 1)).rest()
        assert seqs(resumed.messages) == list(range(earliest, next_seq)), seqs(resumed.messages)
        assert resumed.final["result"] == {}, resumed.final
        fresh = await (await stream(modern, task_id)).rest()
        assert seqs(fresh.messages) == list(range(earliest, next_seq)), seqs(fresh.messages)
        assert task_events(fresh.messages) == task_events(resumed.messages)

        # A reader that stalls (4 KB receive buffer, ~8 KB events) while retention overtakes its
        # cursor: when it reads on, the stream ends with events_gone; it never jumps over the gap.
        big = await create_task(client, "run_tests", {"suite": "s" * 8000, "count": 600, "delay": 0})
        connector = aiohttp.TCPConnector(socket_factory=_small_buffer_socket)
        async with aiohttp.ClientSession(connector=connector) as slow_http:
            stalled = await stream(client.via(slow_http), big)
            assert len(seqs(await take(stalled, 1))) == 1, stalled.messages
            await client.request("tasks/result", {"taskId": big})
            await stalled.rest()
        overtaken = seqs(stalled.messages)
        assert_contiguous(overtaken, overtaken[0])
        assert error_of(stalled.final)["code"] == -32010, (overtaken[-3:], stalled.messages[-1])
        assert error_of(stalled.final)["data"]["earliestSeq"] > overtaken[-1] + 1, stalled.final


async def test_modern_streams_do_not_hold_upstream_processes() -> None:
    """A 2026-07-28 tasks/stream is served from the event log: open streams must not use up the
    upstream's process pool (here 3 processes) and lock every other 2026-07-28 request out."""
    config = "[upstream.stdio]\nmax_processes = 3\nacquire_timeout_s = 2\n"
    async with gateway_session(config) as (client, _):
        task_id = await create_task(client, "slow_build", {"steps": 30, "delay": 0.1})
        modern = Client(client.http, client.url, MODERN)
        streams: list[Reply] = []
        try:
            for _ in range(4):
                streams.append(await stream(modern, task_id))
                first = await take(streams[-1], 1)
                assert streams[-1].status == 200 and seqs(first) == [0], (len(streams), streams[-1].status, first)
            echo = await modern.request("tools/call", {"name": "echo", "arguments": {"text": "still served"}})
            assert echo.status == 200 and echo.final["result"]["content"][0]["text"] == "still served", echo.messages
        finally:
            for reply in streams:
                reply.close()
        await client.request("tasks/result", {"taskId": task_id})


AUDIT_FIELDS = {"principal", "argumentsSha256"}


async def test_an_oversized_payload_becomes_payload_omitted_and_seq_stays_gap_free() -> None:
    limit = 64
    config = f'[events]\nprefix = "{PREFIX}"\n[retention]\nmax_payload_bytes = {limit}\n'
    async with gateway_session(config) as (client, _):
        task_id = await create_task(client, "slow_build", {"steps": 2, "delay": 0.01})
        await client.request("tasks/result", {"taskId": task_id})
        reply = await (await stream(client, task_id)).rest()
        events = task_events(reply.messages)
        assert_contiguous(seqs(reply.messages), 0)
        assert len(events) == 2 * 2 + 4, events
        big_log = {"level": "info", "logger": "builder", "data": "build started: 2 steps"}
        assert len(orjson.dumps(big_log)) > limit
        omitted = [event["payload"] for event in events if event["type"] == f"{PREFIX}.payload.omitted"]
        assert {"originalType": f"{PREFIX}.log", "size": len(orjson.dumps(big_log))}.items() <= omitted[0].items()
        assert events[1]["type"] == f"{PREFIX}.payload.omitted", events[1]  # the log that was too big
        for event in events:
            if event["type"] == f"{PREFIX}.payload.omitted":
                assert event["payload"]["size"] > limit and event["payload"]["originalType"].startswith(PREFIX + ".")
            else:
                # task.created's audit fields are added outside the bound, so a small bound keeps them.
                bounded = {key: value for key, value in event["payload"].items() if key not in AUDIT_FIELDS}
                assert len(orjson.dumps(bounded)) <= limit, event
        assert events[0]["type"] == f"{PREFIX}.task.created" and events[0]["payload"].keys() >= AUDIT_FIELDS, events[0]
        kept_logs = [event["payload"]["data"] for event in events if event["type"] == f"{PREFIX}.log"]
        assert kept_logs == ["finished step 1", "finished step 2"], kept_logs


async def test_events_disabled_means_no_tasks_stream() -> None:
    config = "[events]\nenabled = false\n"
    async with gateway_session(config, 60) as (client, init):
        assert "eventStreams" not in init["result"]["capabilities"]["tasks"], init
        task_id = await create_task(client, "echo", {"text": "x"})
        reply = await client.request("tasks/stream", {"taskId": task_id})
        assert reply.status == 200 and error_of(reply.final)["code"] == -32601, reply.messages
        reply = await Client(client.http, client.url, MODERN).request("tasks/stream", {"taskId": task_id})
        assert reply.status == 404 and error_of(reply.final)["code"] == -32601, reply.messages
        # Tasks themselves still work.
        assert (await client.result("tasks/result", {"taskId": task_id}))["content"][0]["text"] == "x"


async def test_custom_rules_drop_log_events_and_keep_progress() -> None:
    config = f"""
[events]
prefix = "{PREFIX}"

[[rules]]
method = "notifications/message"
drop = true

[[rules]]
method = "notifications/progress"
type = "step"
fields = ["progress", "total"]
"""
    async with gateway_session(config, 60) as (client, _):
        task_id = await create_task(client, "slow_build", {"steps": 3, "delay": 0.01})
        await client.request("tasks/result", {"taskId": task_id})
        reply = await (await stream(client, task_id)).rest()
        events = task_events(reply.messages)
        assert_contiguous(seqs(reply.messages), 0)
        assert [short(event["type"]) for event in events] == [
            "task.created",
            "step",
            "step",
            "step",
            "task.status",
            "task.terminal",
        ], events
        assert [event["payload"] for event in events[1:4]] == [{"progress": i, "total": 3} for i in (1, 2, 3)]
