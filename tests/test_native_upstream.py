"""The gateway in front of an upstream that serves `tasks/stream` itself (SEP-2694 native).

The upstream is examples/native_stream_server.py, on Streamable HTTP and on stdio, keeping 10 events
per task. It advertises `eventStreams` in its tasks capability (2025-11-25 `initialize`, 2026-07-28
`server/discover`), so the gateway advertises the upstream's retention and forwards `tasks/stream` for
its tasks on the task's conversation: the events are the upstream's (`com.example.native.*`, its seqs),
with the client's namespaced task ids in them and in `events_gone`; `after` reaches it unchanged; a
cancelled or dropped stream is cancelled upstream and leaves the task running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.conftest import RunningGateway, serve_http, start_gateway
from tests.test_native_stream_server import NATIVE, error_of, start, stream
from tests.wire import LEGACY, MODERN, RELATED_TASK, TASKS_EXTENSION, Client, Reply, seqs, task_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 20.0
RETENTION = 10
"""The upstream's `--max-events-per-task`: what the gateway must advertise, and what events_gone shows."""
SHORT = {"steps": 3, "delay": 0.1}
"""slow_build emitting 9 events (created, a log, a progress and a log per step, the status): all retained."""
LONG = {"steps": 6, "delay": 0.1}
"""15 events: the first 5 are dropped by the upstream's retention."""
RUNNING = {"steps": 40, "delay": 0.25}
"""A task that runs for 10 s, long after its stream was cancelled."""


@dataclass
class Front:
    transport: str
    gateway: RunningGateway


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["http", "stdio"])
async def front(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Front]:
    transport: str = request.param
    retention = ("--max-events-per-task", str(RETENTION))
    async with contextlib.AsyncExitStack() as stack:
        if transport == "stdio":
            gw = await stack.enter_async_context(start_gateway(upstream_cmd=[*NATIVE, "--stdio", *retention]))
        else:
            log = tmp_path_factory.mktemp("native-upstream") / "server.log"
            url = await stack.enter_async_context(serve_http(NATIVE, *retention, log=log, port_option="--port"))
            gw = await stack.enter_async_context(start_gateway(upstream_url=url))
        yield Front(transport, gw)


@pytest_asyncio.fixture(loop_scope="module", params=[LEGACY, MODERN])
async def client(request: pytest.FixtureRequest, http: aiohttp.ClientSession, front: Front) -> AsyncIterator[Client]:
    session = Client(http, front.gateway.url, request.param)
    if session.era == LEGACY:
        await asyncio.wait_for(session.initialize(), WAIT)
    yield session
    if session.era == LEGACY:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await asyncio.wait_for(session.delete(), WAIT)


async def ended(client: Client, arguments: dict[str, Any]) -> tuple[str, Reply]:
    """slow_build as a task, streamed live to its end through the gateway: its id and the stream."""
    task_id = await start(client, arguments)
    async with asyncio.timeout(WAIT):
        return task_id, await stream(client, task_id)


async def status(client: Client, task_id: str) -> str:
    result = await client.result("tasks/get", {"taskId": task_id})
    return str(result["status"])


async def first_event(reply: Reply) -> dict[str, Any]:
    async with asyncio.timeout(WAIT):
        message = await reply.next()
    assert message is not None and message.get("method") == "notifications/tasks/event", reply.messages
    params: dict[str, Any] = message["params"]
    return params


async def test_the_upstreams_event_streams_and_retention_are_advertised(
    http: aiohttp.ClientSession, front: Front
) -> None:
    legacy = Client(http, front.gateway.url, LEGACY)
    initialized = await asyncio.wait_for(legacy.initialize(), WAIT)
    tasks = initialized["result"]["capabilities"]["tasks"]
    assert tasks["eventStreams"]["maxEventsPerTask"] == RETENTION, tasks  # the upstream's, not the gateway's 10,000
    assert tasks["requests"] == {"tools": {"call": {}}}
    await legacy.delete()
    discovered = await Client(http, front.gateway.url, MODERN).result("server/discover")
    extension = discovered["capabilities"]["extensions"][TASKS_EXTENSION]
    assert extension["eventStreams"]["maxEventsPerTask"] == RETENTION, extension


async def test_a_forwarded_stream_is_the_upstreams_with_the_clients_task_ids(client: Client) -> None:
    task_id, live = await ended(client, SHORT)
    assert "." in task_id  # a pass-through id: <channel tag>.<upstream id>
    events = task_events(live.messages)
    assert [event["seq"] for event in events] == list(range(9))
    assert {event["type"].rsplit(".", 1)[0] for event in events} >= {"com.example.native", "com.example.native.task"}
    for event in events:
        assert event["taskId"] == task_id, event
        assert event["_meta"][RELATED_TASK] == {"taskId": task_id}, event
    assert events[-1]["payload"] == {"status": "completed"}
    # The upstream's empty result, as it sent it (an SDK adds its serverInfo `_meta` at 2026-07-28).
    assert {k: v for k, v in live.final["result"].items() if k != "_meta"} == (
        {} if client.era == LEGACY else {"resultType": "complete"}
    )
    # The upstream's seqs are the stream's: `after` reaches it unchanged.
    resumed = await stream(client, task_id, after=3)
    assert seqs(resumed.messages) == list(range(4, 9))
    assert task_events(resumed.messages) == events[4:]
    assert seqs((await stream(client, task_id, after=8)).messages) == []


async def test_events_gone_from_the_upstream_names_the_clients_task(client: Client) -> None:
    task_id, live = await ended(client, LONG)
    assert seqs(live.messages) == list(range(15))
    gone = error_of(await stream(client, task_id, after=0))
    assert gone["code"] == -32010, gone
    assert gone["data"] == {"reason": "events_gone", "taskId": task_id, "earliestSeq": 15 - RETENTION}
    resumed = await stream(client, task_id, after=15 - RETENTION - 1)
    assert seqs(resumed.messages) == list(range(15 - RETENTION, 15))


async def test_a_cancelled_stream_leaves_the_task_running(client: Client) -> None:
    task_id = await start(client, RUNNING)
    request_id = client.next_id()
    reply = await client.open("tasks/stream", {"taskId": task_id}, request_id=request_id)
    assert (await first_event(reply))["taskId"] == task_id
    # Other requests about the task are answered while its stream is open (on a stdio pool the
    # stream runs beside them on the process that holds the task).
    assert await status(client, task_id) == "working"
    if client.era == LEGACY:  # notifications/cancelled reaches the upstream, which ends the stream
        assert await client.notify("notifications/cancelled", {"requestId": request_id}) == 202
        async with asyncio.timeout(WAIT):
            await reply.rest()
        assert reply.final["error"]["code"] == -32800, reply.final
    reply.close()  # 2026-07-28: closing the POST is the cancel
    assert await status(client, task_id) == "working"
    # It runs on: a new stream (after what was delivered) gets its later events.
    again = await client.open("tasks/stream", {"taskId": task_id, "after": 0})
    assert (await first_event(again))["seq"] == 1
    again.close()
    await client.request("tasks/cancel", {"taskId": task_id})


async def test_a_dropped_legacy_stream_is_cancelled_upstream(http: aiohttp.ClientSession, front: Front) -> None:
    """A 2025-11-25 call outlives its client's POST, but a stream is worth nothing without its reader:
    the gateway cancels it upstream, so the upstream frees the connection's one stream of the task and
    the client can resume on the same session while the task still runs."""
    client = Client(http, front.gateway.url, LEGACY)
    await asyncio.wait_for(client.initialize(), WAIT)
    task_id = await start(client, RUNNING)
    reply = await client.open("tasks/stream", {"taskId": task_id})
    await first_event(reply)
    reply.close()
    async with asyncio.timeout(WAIT):
        while True:  # the upstream frees the slot once the gateway's cancel reaches it
            again = await client.open("tasks/stream", {"taskId": task_id, "after": 0})
            message = await again.next()
            again.close()
            assert message is not None, again.messages
            if message.get("method") == "notifications/tasks/event":
                break
            assert message["error"]["code"] == -32602, message  # still the upstream's active stream
            await asyncio.sleep(0.1)
    assert message["params"]["seq"] == 1
    assert await status(client, task_id) == "working"
    await client.request("tasks/cancel", {"taskId": task_id})
    await client.delete()


async def test_streams_are_forwarded_with_the_gateways_events_disabled(
    http: aiohttp.ClientSession, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`[events] enabled = false` turns off the gateway's own log and streams, not the upstream's."""
    log = tmp_path_factory.mktemp("native-no-events") / "server.log"
    async with (
        serve_http(NATIVE, log=log, port_option="--port") as url,
        start_gateway(upstream_url=url, config_text="[events]\nenabled = false\n") as gw,
    ):
        client = Client(http, gw.url, LEGACY)
        initialized = await asyncio.wait_for(client.initialize(), WAIT)
        assert "eventStreams" in initialized["result"]["capabilities"]["tasks"]
        task_id, live = await ended(client, SHORT)
        assert seqs(live.messages) == list(range(9))
        assert {event["taskId"] for event in task_events(live.messages)} == {task_id}
        await client.delete()
