"""input_required for gateway-hosted tasks, in both eras, with the example server's resolver-style `deploy`.

`deploy(environment, confirm: Annotated[ElicitationResult[Confirm], Resolve(ask_confirmation)])` asks for a
confirmation the SDK way: at 2025-11-25 a mid-call `elicitation/create`, at 2026-07-28 an
`InputRequiredResult` the call is retried with. In front of it the gateway hosts the task:

* 2025-11-25: the task goes `input_required` (tasks/get, `notifications/tasks/status` on the GET stream);
  the request reaches the client with the related-task `_meta` on an open `tasks/result` stream, else on
  the GET stream, else on the next `tasks/result`; the client's response (202) goes upstream and the task
  returns to `working`.
* 2026-07-28: `tasks/get` shows `inputRequests`; `tasks/update` answers them (unknown keys ignored); the
  gateway retries the call upstream and the task completes with the result inlined.

Every step is an event in the task's log, checked through `tasks/stream`. The same flows run over an HTTP
upstream, and a scripted 2026-07-28 upstream checks multi-round input (a key reused by a later round is
shown as `r2.<key>` and mapped back). Every wait is bounded; everything listens on loopback.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gateway.client import GatewayClient
from gateway.protocol.era import Era
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.wire import LEGACY, RELATED_TASK, Client, Message, Reply

pytestmark = pytest.mark.asyncio(loop_scope="module")

PREFIX = "com.example.input"
CONFIG = f"""
[events]
prefix = "{PREFIX}"

[[tasks.tools]]
match = "deploy"
task_support = "optional"
modern = "after_ms"
after_ms = 0

[[tasks.tools]]
match = "*"
task_support = "optional"
"""
WAIT = 20.0
"""Seconds any single step may take."""
ELICITATION = {"elicitation": {"form": {}}}
MODERN_CAPABILITIES = {
    "io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}},
        **ELICITATION,
    }
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw_http(example_http_url: str) -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_url=example_http_url, config_text=CONFIG) as gateway:
        yield gateway


@pytest_asyncio.fixture(loop_scope="module")
async def legacy(gw: RunningGateway, http: aiohttp.ClientSession) -> AsyncIterator[Client]:
    """A legacy session that declares form elicitation (the SDK refuses to elicit from a client without it)."""
    client = Client(http, gw.url)
    await client.initialize(ELICITATION)
    yield client
    await client.delete()


def kind(event: dict[str, Any]) -> str:
    """An event's type without the vendor prefix, with the status for task.status (`status:working`)."""
    name = str(event["type"]).removeprefix(PREFIX + ".")
    return f"status:{event['payload']['status']}" if name == "task.status" else name


async def open_get_stream(client: Client) -> Reply:
    assert client.session_id is not None
    headers = {"Accept": "text/event-stream", "Mcp-Session-Id": client.session_id, "MCP-Protocol-Version": LEGACY}
    response = await client.http.get(client.url, headers=headers)
    assert response.status == 200, response.status
    return Reply(response)


async def next_where(reply: Reply, wanted: Callable[[Message], bool], what: str) -> Message:
    """The next message of `reply` that is `wanted` (earlier ones stay in `reply.messages`)."""
    async with asyncio.timeout(WAIT):
        while (message := await reply.next()) is not None:
            if wanted(message):
                return message
    raise AssertionError(f"the stream ended before {what}: {reply.messages}")


def is_status(status: str) -> Callable[[Message], bool]:
    return lambda m: m.get("method") == "notifications/tasks/status" and m["params"]["status"] == status


def is_elicitation(message: Message) -> bool:
    return message.get("method") == "elicitation/create" and "id" in message


async def start_deploy(client: Client, environment: str, **arguments: Any) -> str:
    params = {"name": "deploy", "arguments": {"environment": environment, "delay": 0.05, **arguments}, "task": {}}
    result = await client.result("tools/call", params)
    task_id: str = result["task"]["taskId"]
    assert result["task"]["status"] == "working", result
    return task_id


async def answer(client: Client, request: Message, result: dict[str, Any]) -> int:
    reply = await client.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
    await reply.response.read()
    reply.close()
    return reply.status


async def task_status(client: Client, task_id: str) -> str:
    status: str = (await client.result("tasks/get", {"taskId": task_id}))["status"]
    return status


async def all_events(gw: RunningGateway, task_id: str, era: str = "legacy") -> list[dict[str, Any]]:
    """The task's whole log through tasks/stream (on a client of its own), once the task has ended."""
    async with GatewayClient(gw.url, era=Era.parse(era)) as client:
        async with asyncio.timeout(WAIT):
            return [event async for event in client.stream(task_id)]


def assert_in_order(kinds: list[str], expected: list[str]) -> None:
    """`expected` occurs in `kinds` in this order (other events may come between)."""
    position = 0
    for name in expected:
        assert name in kinds[position:], f"{name} missing after position {position}: {kinds}"
        position = kinds.index(name, position) + 1


def check_legacy_log(events: list[dict[str, Any]], request: Message, action: str) -> None:
    kinds = [kind(event) for event in events]
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert_in_order(
        kinds,
        [
            "task.created",
            "status:input_required",
            "input.requested",
            "input.answered",
            "status:working",
            "status:completed",
            "task.terminal",
        ],
    )
    # Input happens exactly once, and nothing of the deployment runs before the answer.
    assert kinds.count("input.requested") == kinds.count("input.answered") == 1
    assert "progress" not in kinds[: kinds.index("input.answered")]
    by_kind = {kind(event): event["payload"] for event in events}
    requested = by_kind["input.requested"]
    assert requested["method"] == "elicitation/create" and requested["requestId"] == request["id"]
    assert requested["fields"] == ["confirm", "note"] and requested["message"] == request["params"]["message"]
    answered = by_kind["input.answered"]
    assert answered["method"] == "elicitation/create" and answered["requestId"] == request["id"]
    assert answered["action"] == action
    assert by_kind["status:input_required"]["statusMessage"].startswith("waiting for the client")


# -- 2025-11-25 -------------------------------------------------------------------------------------------


async def test_legacy_request_rides_the_open_tasks_result_stream(gw: RunningGateway, legacy: Client) -> None:
    get_stream = await open_get_stream(legacy)
    try:
        # preflight: the question comes half a second in, once tasks/result is open.
        task_id = await start_deploy(legacy, "staging", preflight=0.5)
        result_reply = await legacy.open("tasks/result", {"taskId": task_id})
        try:
            assert result_reply.is_sse
            request = await next_where(result_reply, is_elicitation, "the elicitation")
            assert request["params"]["_meta"][RELATED_TASK] == {"taskId": task_id}
            assert request["params"]["message"] == "Deploy to staging?"
            assert set(request["params"]["requestedSchema"]["properties"]) == {"confirm", "note"}

            assert await task_status(legacy, task_id) == "input_required"
            status = await next_where(get_stream, is_status("input_required"), "the input_required status")
            assert status["params"]["taskId"] == task_id

            assert (
                await answer(legacy, request, {"action": "accept", "content": {"confirm": True, "note": "go"}}) == 202
            )
            async with asyncio.timeout(WAIT):
                await result_reply.rest()
        finally:
            result_reply.close()
        final = result_reply.final
        assert final["result"]["content"][0]["text"] == "deployed to staging", final
        assert final["result"]["_meta"][RELATED_TASK] == {"taskId": task_id}
        await next_where(get_stream, is_status("working"), "the working status")
        await next_where(get_stream, is_status("completed"), "the completed status")
        assert not any(is_elicitation(message) for message in get_stream.messages), get_stream.messages
    finally:
        get_stream.close()
    check_legacy_log(await all_events(gw, task_id), request, "accept")


async def test_legacy_request_goes_to_the_get_stream_without_tasks_result(gw: RunningGateway, legacy: Client) -> None:
    get_stream = await open_get_stream(legacy)
    try:
        task_id = await start_deploy(legacy, "production")
        status = await next_where(get_stream, is_status("input_required"), "the input_required status")
        assert status["params"]["taskId"] == task_id
        request = await next_where(get_stream, is_elicitation, "the elicitation")
        assert request["params"]["_meta"][RELATED_TASK] == {"taskId": task_id}
        assert await task_status(legacy, task_id) == "input_required"

        # An answer to a request nobody sent is refused; the right one is accepted once.
        assert await answer(legacy, {"id": "no-such-request"}, {"action": "accept"}) == 400
        assert await answer(legacy, request, {"action": "accept", "content": {"confirm": True}}) == 202
        await next_where(get_stream, is_status("working"), "the working status")
        async with asyncio.timeout(WAIT):
            result = await legacy.result("tasks/result", {"taskId": task_id})
        assert result["content"][0]["text"] == "deployed to production", result
        assert await answer(legacy, request, {"action": "accept", "content": {"confirm": True}}) == 400
    finally:
        get_stream.close()
    check_legacy_log(await all_events(gw, task_id), request, "accept")


async def test_legacy_decline_from_another_session(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    """No stream open when the question comes: it waits, and the next tasks/result carries it, here on a
    later session of the same caller after the creating session was deleted."""
    creator = Client(http, gw.url)
    await creator.initialize(ELICITATION)
    task_id = await start_deploy(creator, "production")
    deadline = time.monotonic() + WAIT
    while await task_status(creator, task_id) != "input_required":
        assert time.monotonic() < deadline, "the task never became input_required"
        await asyncio.sleep(0.05)
    assert await creator.delete() == 200

    later = Client(http, gw.url)
    await later.initialize(ELICITATION)
    try:
        result_reply = await later.open("tasks/result", {"taskId": task_id})
        try:
            request = await next_where(result_reply, is_elicitation, "the elicitation")
            assert request["params"]["_meta"][RELATED_TASK] == {"taskId": task_id}
            assert await answer(later, request, {"action": "decline"}) == 202
            async with asyncio.timeout(WAIT):
                await result_reply.rest()
        finally:
            result_reply.close()
        final = result_reply.final
        assert final["result"]["content"][0]["text"] == "deployment cancelled", final
        assert final["result"].get("isError", False) is False
        assert await task_status(later, task_id) == "completed"
    finally:
        await later.delete()
    events = await all_events(gw, task_id)
    check_legacy_log(events, request, "decline")
    assert "progress" not in [kind(event) for event in events]


# -- 2026-07-28 -------------------------------------------------------------------------------------------


async def wait_for_status(client: GatewayClient, task_id: str, wanted: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while True:
        task: dict[str, Any] = (await client.get_task(task_id))["result"]
        if task["status"] == wanted:
            return task
        assert time.monotonic() < deadline, f"the task stayed {task['status']!r}, never {wanted!r}: {task}"
        await asyncio.sleep(0.05)


async def modern_deploy(client: GatewayClient, environment: str) -> dict[str, Any]:
    """tools/call deploy from a client that declares the tasks extension and form elicitation."""
    params = {"name": "deploy", "arguments": {"environment": environment, "delay": 0.05}, "_meta": MODERN_CAPABILITIES}
    result: dict[str, Any] = (await client.request("tools/call", params))["result"]
    return result


async def test_modern_input_requests_answered_with_tasks_update(gw: RunningGateway) -> None:
    async with GatewayClient(gw.url, era=Era.MODERN) as client:
        created = await modern_deploy(client, "prod")
        assert created["resultType"] == "task", created
        task_id = created["taskId"]

        task = await wait_for_status(client, task_id, "input_required")
        assert task["resultType"] == "complete"
        requests = task["inputRequests"]
        assert len(requests) == 1, requests
        ((key, request),) = requests.items()
        assert request["method"] == "elicitation/create"
        assert request["params"]["message"] == "Deploy to prod?"
        assert set(request["params"]["requestedSchema"]["properties"]) == {"confirm", "note"}

        # Unknown keys are ignored: still waiting, same requests.
        ignored = {"taskId": task_id, "inputResponses": {"no-such-key": {"action": "accept", "content": {}}}}
        assert (await client.request("tasks/update", ignored))["result"] == {"resultType": "complete"}
        still = (await client.get_task(task_id))["result"]
        assert still["status"] == "input_required" and still["inputRequests"] == requests

        accept = {"action": "accept", "content": {"confirm": True, "note": "ship it"}}
        update = {"taskId": task_id, "inputResponses": {key: accept}}
        assert (await client.request("tasks/update", update))["result"] == {"resultType": "complete"}

        done = await wait_for_status(client, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "deployed to prod", done
        assert "inputRequests" not in done
        # Answering again, after the fact, is ignored as well.
        assert (await client.request("tasks/update", update))["result"] == {"resultType": "complete"}
        assert (await client.get_task(task_id))["result"]["status"] == "completed"

    events = await all_events(gw, task_id, "modern")
    kinds = [kind(event) for event in events]
    assert_in_order(
        kinds,
        [
            "task.created",
            "status:input_required",
            "input.requested",
            "input.answered",
            "status:working",
            "progress",
            "status:completed",
            "task.terminal",
        ],
    )
    assert kinds.count("input.requested") == kinds.count("input.answered") == 1
    by_kind = {kind(event): event["payload"] for event in events}
    assert by_kind["input.requested"] == {
        "key": key,
        "method": "elicitation/create",
        "mode": "form",
        "message": "Deploy to prod?",
        "fields": ["confirm", "note"],
    }
    assert by_kind["input.answered"] == {
        "key": key,
        "method": "elicitation/create",
        "action": "accept",
        "fields": ["confirm", "note"],
    }


async def test_modern_malformed_input_responses_are_refused(gw: RunningGateway) -> None:
    async with GatewayClient(gw.url, era=Era.MODERN) as client:
        task_id = (await modern_deploy(client, "qa"))["taskId"]
        task = await wait_for_status(client, task_id, "input_required")
        with pytest.raises(Exception) as refused:
            await client.request("tasks/update", {"taskId": task_id, "inputResponses": ["accept"]})
        assert getattr(refused.value, "code", None) == -32602
        ((key, _),) = task["inputRequests"].items()
        update = {"taskId": task_id, "inputResponses": {key: {"action": "decline"}}}
        await client.request("tasks/update", update)
        done = await wait_for_status(client, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "deployment cancelled", done


async def test_modern_cancel_while_waiting_for_input(gw: RunningGateway) -> None:
    async with GatewayClient(gw.url, era=Era.MODERN) as client:
        task_id = (await modern_deploy(client, "staging"))["taskId"]
        task = await wait_for_status(client, task_id, "input_required")
        assert (await client.cancel_task(task_id))["result"] == {"resultType": "complete"}
        cancelled = await wait_for_status(client, task_id, "cancelled")
        assert "inputRequests" not in cancelled
        ((key, _),) = task["inputRequests"].items()
        update = {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}}}
        assert (await client.request("tasks/update", update))["result"] == {"resultType": "complete"}
        assert (await client.get_task(task_id))["result"]["status"] == "cancelled"
    kinds = [kind(event) for event in await all_events(gw, task_id, "modern")]
    assert "input.answered" not in kinds
    assert kinds[-2:] == ["status:cancelled", "task.terminal"], kinds


async def test_legacy_cancel_while_waiting_for_input(gw: RunningGateway, legacy: Client) -> None:
    get_stream = await open_get_stream(legacy)
    try:
        task_id = await start_deploy(legacy, "staging")
        request = await next_where(get_stream, is_elicitation, "the elicitation")
        cancelled = await legacy.result("tasks/cancel", {"taskId": task_id})
        assert cancelled["status"] == "cancelled"
        # The request died with the task: its answer is no longer expected.
        assert await answer(legacy, request, {"action": "accept", "content": {"confirm": True}}) == 400
    finally:
        get_stream.close()
    kinds = [kind(event) for event in await all_events(gw, task_id)]
    assert "input.answered" not in kinds and "progress" not in kinds
    assert kinds[-2:] == ["status:cancelled", "task.terminal"], kinds


# -- an HTTP upstream -------------------------------------------------------------------------------------


async def test_both_eras_over_an_http_upstream(gw_http: RunningGateway, http: aiohttp.ClientSession) -> None:
    client = Client(http, gw_http.url)
    await client.initialize(ELICITATION)
    get_stream = await open_get_stream(client)
    try:
        task_id = await start_deploy(client, "edge")
        request = await next_where(get_stream, is_elicitation, "the elicitation")
        assert request["params"]["_meta"][RELATED_TASK] == {"taskId": task_id}
        assert await answer(client, request, {"action": "accept", "content": {"confirm": True}}) == 202
        async with asyncio.timeout(WAIT):
            result = await client.result("tasks/result", {"taskId": task_id})
        assert result["content"][0]["text"] == "deployed to edge", result
    finally:
        get_stream.close()
        await client.delete()
    check_legacy_log(await all_events(gw_http, task_id), request, "accept")

    async with GatewayClient(gw_http.url, era=Era.MODERN) as modern:
        task_id = (await modern_deploy(modern, "edge"))["taskId"]
        task = await wait_for_status(modern, task_id, "input_required")
        ((key, _),) = task["inputRequests"].items()
        update = {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}}}
        await modern.request("tasks/update", update)
        done = await wait_for_status(modern, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "deployed to edge", done


# -- several rounds (a scripted 2026-07-28 upstream) ------------------------------------------------------

SCRIPTED_SERVER = r"""
import json, sys

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

def ask(text):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    return {"method": "elicitation/create", "params": {"mode": "form", "message": text, "requestedSchema": schema}}

for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message or "method" not in message:
        continue
    params = message.get("params") or {}
    if message["method"] == "server/discover":
        result = {"resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "scripted", "version": "0"}}
    elif message["method"] == "tools/call":
        state, answers = params.get("requestState"), params.get("inputResponses") or {}
        if state is None:
            result = {"resultType": "input_required", "inputRequests": {"q": ask("first?"), "p": ask("also?")},
                      "requestState": "round-1"}
        elif state == "round-1":
            seen = answers["q"]["action"] + "," + answers["p"]["action"]
            result = {"resultType": "input_required", "inputRequests": {"q": ask("second?")},
                      "requestState": "round-2:" + seen}
        else:
            text = state + "|" + answers["q"]["action"] + "|" + ",".join(sorted(answers))
            result = {"resultType": "complete", "content": [{"type": "text", "text": text}]}
    else:
        send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "Method not found"}})
        continue
    send({"jsonrpc": "2.0", "id": message["id"], "result": result})
"""
SCRIPTED_CONFIG = f"""
[events]
prefix = "{PREFIX}"

# input_window_ms = 0: the task exists before the first round, so every round is answered through it.
[[tasks.tools]]
match = "*"
modern = "always"
input_window_ms = 0
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw_scripted(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningGateway]:
    script = tmp_path_factory.mktemp("scripted") / "scripted_server.py"
    script.write_text(SCRIPTED_SERVER, encoding="utf-8")
    async with start_gateway(upstream_cmd=[sys.executable, str(script)], config_text=SCRIPTED_CONFIG) as gateway:
        yield gateway


async def test_modern_rounds_partial_answers_and_reused_keys(gw_scripted: RunningGateway) -> None:
    async with GatewayClient(gw_scripted.url, era=Era.MODERN) as client:
        created = (await client.request("tools/call", {"name": "ask", "arguments": {}}))["result"]
        assert created["resultType"] == "task", created
        task_id = created["taskId"]

        async def update(responses: dict[str, Any]) -> None:
            params = {"taskId": task_id, "inputResponses": responses}
            assert (await client.request("tasks/update", params))["result"] == {"resultType": "complete"}

        task = await wait_for_status(client, task_id, "input_required")
        assert set(task["inputRequests"]) == {"q", "p"}
        # A partial set: only the outstanding request remains.
        await update({"q": {"action": "accept", "content": {"ok": True}}})
        task = (await client.get_task(task_id))["result"]
        assert task["status"] == "input_required" and set(task["inputRequests"]) == {"p"}
        # `q` again is already answered (ignored); `p` completes the round and the call is retried.
        await update({"q": {"action": "cancel"}, "p": {"action": "decline"}})

        deadline = time.monotonic() + WAIT
        while "r2.q" not in (task := (await client.get_task(task_id))["result"]).get("inputRequests", {}):
            assert time.monotonic() < deadline, task
            await asyncio.sleep(0.05)
        assert task["status"] == "input_required" and set(task["inputRequests"]) == {"r2.q"}
        assert task["inputRequests"]["r2.q"]["params"]["message"] == "second?"
        await update({"q": {"action": "decline"}})  # a key of the finished round: ignored
        assert (await client.get_task(task_id))["result"]["status"] == "input_required"
        await update({"r2.q": {"action": "accept", "content": {"ok": True}}})

        done = await wait_for_status(client, task_id, "completed")
        # The upstream got its own keys back, and its requestState echoed each round.
        assert done["result"]["content"][0]["text"] == "round-2:accept,decline|accept|q", done

    events = await all_events(gw_scripted, task_id, "modern")
    steps = [
        (kind(event), event["payload"].get("key"))
        for event in events
        if kind(event).startswith("input.") or kind(event).startswith("status:")
    ]
    assert steps == [
        ("status:input_required", None),
        ("input.requested", "q"),
        ("input.requested", "p"),
        ("input.answered", "q"),
        ("input.answered", "p"),
        ("status:working", None),
        ("status:input_required", None),
        ("input.requested", "r2.q"),
        ("input.answered", "r2.q"),
        ("status:working", None),
        ("status:completed", None),
    ], steps
