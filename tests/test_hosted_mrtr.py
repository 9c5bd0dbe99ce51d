"""SEP-2663 fidelity of gateway-hosted 2026-07-28 tasks: `required` tools and MRTR rounds before a task.

In front of the example server (written with the `mcp` SDK, no Tasks of its own, so the gateway hosts),
whose `deploy` asks for a confirmation through an SDK resolver: at 2026-07-28 its first round answers
with an `InputRequiredResult` and the client retries with `inputResponses` and the echoed `requestState`.

* `required` (`modern = "required"`, implied by and implying `task_support = "required"`): a 2026-07-28
  client that did not declare the tasks extension gets `-32021` (HTTP 400) naming the extension; a
  2025-11-25 client that calls without `params.task` gets `-32601`; a declaring client always gets a task.
* `always`: a first round that asks for input within `input_window_ms` reaches the client synchronously
  (no task); one that fails within it (a JSON-RPC error) is a `failed` task with the error inlined; any
  retried round (with `inputResponses`) is a task at once, whose result reflects the answers; a first
  round still running at the end of the window is a task.
* `after_ms`: the first round is synchronous as well; a retried round that outlives `after_ms` becomes
  a task, a faster one is a plain result.

Two gateways (one per policy for `deploy`) serve the module; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.wire import MODERN, TASKS_EXTENSION, Client, Message, envelope, marker_lines

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 30.0
"""Seconds any single step may take."""
AFTER_MS = 3000
"""The `after_ms` gateway's deadline: far above a first round that asks at once, far below SLOW_DEPLOY."""
SLOW_DEPLOY = {"steps": 8, "delay": 1.0}
"""A deploy whose confirmed round runs 8 s: well past AFTER_MS, well within the `always` window."""
FAST_DEPLOY = {"steps": 1, "delay": 0.0}

ALWAYS_CONFIG = """
[[tasks.tools]]
match = "run_tests"
modern = "required"
input_window_ms = 10000

[[tasks.tools]]
match = "deploy"
modern = "always"
input_window_ms = 10000

[[tasks.tools]]
match = "slow_build"
modern = "always"
input_window_ms = 200

[[tasks.tools]]
match = "*"
"""
AFTER_MS_CONFIG = f"""
[[tasks.tools]]
match = "deploy"
modern = "after_ms"
after_ms = {AFTER_MS}
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw_always() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=ALWAYS_CONFIG) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw_after() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=AFTER_MS_CONFIG) as gateway:
        yield gateway


def eliciting(*, tasks: bool = True) -> dict[str, Any]:
    """The 2026-07-28 envelope of a client that declares form elicitation (the SDK asks only such clients)."""
    meta = envelope(tasks=tasks)
    capabilities = meta["io.modelcontextprotocol/clientCapabilities"]
    meta["io.modelcontextprotocol/clientCapabilities"] = {**capabilities, "elicitation": {"form": {}}}
    return meta


async def call_tool(client: Client, name: str, arguments: dict[str, Any], **retry: Any) -> Message:
    """A 2026-07-28 tools/call (plus `inputResponses`/`requestState` for a retried round): its response."""
    params = {"name": name, "arguments": arguments, "_meta": eliciting(tasks=client.tasks), **retry}
    async with asyncio.timeout(WAIT):
        reply = await client.request("tools/call", params)
    return {"status": reply.status, **reply.final}


def result_of(response: Message) -> dict[str, Any]:
    assert response["status"] == 200 and "result" in response, response
    result: dict[str, Any] = response["result"]
    return result


async def first_round(client: Client, environment: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """deploy's first round, which must reach the client synchronously: the InputRequiredResult."""
    asked = result_of(await call_tool(client, "deploy", {"environment": environment, **arguments}))
    assert asked["resultType"] == "input_required" and "taskId" not in asked, asked
    ((_, request),) = asked["inputRequests"].items()
    assert request["method"] == "elicitation/create", asked
    assert request["params"]["message"] == f"Deploy to {environment}?", asked
    return asked


async def final_round(
    client: Client, environment: str, arguments: dict[str, Any], asked: dict[str, Any], confirm: bool
) -> dict[str, Any]:
    """deploy retried with the answer to `asked`'s one request (and its echoed requestState): the result."""
    ((key, _),) = asked["inputRequests"].items()
    retry: dict[str, Any] = {"inputResponses": {key: {"action": "accept", "content": {"confirm": confirm}}}}
    if "requestState" in asked:
        retry["requestState"] = asked["requestState"]
    return result_of(await call_tool(client, "deploy", {"environment": environment, **arguments}, **retry))


async def completed(client: Client, task_id: str) -> dict[str, Any]:
    """tasks/get until the task is terminal; it must have completed."""
    deadline = time.monotonic() + WAIT
    while True:
        task = result_of(await get_task(client, task_id))
        if task["status"] not in ("working", "input_required"):
            assert task["status"] == "completed", task
            return task
        assert time.monotonic() < deadline, f"the task is still {task['status']}: {task}"
        await asyncio.sleep(0.1)


async def get_task(client: Client, task_id: str) -> Message:
    reply = await client.request("tasks/get", {"taskId": task_id})
    return {"status": reply.status, **reply.final}


def text_of(result: dict[str, Any]) -> str:
    text: str = result["content"][0]["text"]
    return text


# -- required ---------------------------------------------------------------------------------------------


async def test_required_tool_refuses_a_modern_client_without_the_extension(
    gw_always: RunningGateway, http: aiohttp.ClientSession
) -> None:
    plain = Client(http, gw_always.url, MODERN, tasks=False)
    refused = await call_tool(plain, "run_tests", {"count": 1, "delay": 0})
    assert refused["status"] == 400, refused
    assert refused["error"]["code"] == -32021, refused
    assert refused["error"]["data"] == {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}, refused
    # Only the required tool: an optional one still answers such a client with the plain result.
    assert text_of(result_of(await call_tool(plain, "echo", {"text": "hi"}))) == "hi"


async def test_required_tool_is_always_a_task_for_a_declaring_client(
    gw_always: RunningGateway, http: aiohttp.ClientSession
) -> None:
    client = Client(http, gw_always.url, MODERN)
    # Done well within the window, and still a task (one that has already completed).
    created = result_of(await call_tool(client, "run_tests", {"count": 1, "delay": 0}))
    assert created["resultType"] == "task" and created["status"] == "completed", created
    assert "result" not in created, created
    done = await completed(client, created["taskId"])
    assert text_of(done["result"]) == "unit: 1 passed, 0 failed", done


async def test_required_tool_needs_params_task_from_a_legacy_client(
    gw_always: RunningGateway, http: aiohttp.ClientSession
) -> None:
    legacy = Client(http, gw_always.url)
    await legacy.initialize()
    try:
        tools = {tool["name"]: tool for tool in (await legacy.result("tools/list"))["tools"]}
        assert tools["run_tests"]["execution"]["taskSupport"] == "required"
        refused = await legacy.request("tools/call", {"name": "run_tests", "arguments": {"count": 1, "delay": 0}})
        assert refused.status == 200 and refused.final["error"]["code"] == -32601, refused.messages
        params = {"name": "run_tests", "arguments": {"count": 1, "delay": 0}, "task": {}}
        created = await legacy.result("tools/call", params)
        assert created["task"]["status"] == "working", created
    finally:
        await legacy.delete()


# -- always -----------------------------------------------------------------------------------------------


async def test_always_first_round_is_synchronous_and_the_retry_is_a_task(
    gw_always: RunningGateway, http: aiohttp.ClientSession
) -> None:
    client = Client(http, gw_always.url, MODERN)
    # A deploy that runs 8 s, within the 10 s window: only a task made at once is still working.
    asked = await first_round(client, "prod", SLOW_DEPLOY)
    created = await final_round(client, "prod", SLOW_DEPLOY, asked, True)
    assert created["resultType"] == "task" and created["status"] == "working", created
    done = await completed(client, created["taskId"])
    assert text_of(done["result"]) == "deployed to prod", done

    # The answers decide the outcome: a refusal completes the task with the tool's refusal.
    asked = await first_round(client, "qa", FAST_DEPLOY)
    created = await final_round(client, "qa", FAST_DEPLOY, asked, False)
    assert created["resultType"] == "task", created
    assert text_of((await completed(client, created["taskId"]))["result"]) == "deployment cancelled"


async def test_always_first_round_without_input_becomes_a_task_after_the_window(
    gw_always: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    client = Client(http, gw_always.url, MODERN)
    marker = tmp_path / "marker"
    arguments = {"steps": 20, "delay": 0.5, "marker": str(marker)}
    created = result_of(await call_tool(client, "slow_build", arguments))
    assert created["resultType"] == "task" and created["status"] == "working", created
    assert "finished" not in marker_lines(marker), "the call was answered only when the tool had finished"
    cancelled = await client.request("tasks/cancel", {"taskId": created["taskId"]})
    assert cancelled.final["result"] == {"resultType": "complete"}, cancelled.messages


async def test_always_makes_an_upstream_error_within_the_window_a_failed_task(
    gw_always: RunningGateway, http: aiohttp.ClientSession
) -> None:
    """SEP-2663: only an InputRequiredResult comes before a task; a JSON-RPC error the upstream answers
    at once is a task that failed, the error inlined. Here the SDK refuses, with -32021, to ask a client
    that declares no elicitation for deploy's confirmation."""
    client = Client(http, gw_always.url, MODERN)
    params = {"name": "deploy", "arguments": {"environment": "prod"}, "_meta": envelope()}
    async with asyncio.timeout(WAIT):
        reply = await client.request("tools/call", params)
    created = result_of({"status": reply.status, **reply.final})
    assert created["resultType"] == "task" and created["status"] == "failed", created
    assert "error" not in created and "result" not in created, created
    failed = result_of(await get_task(client, created["taskId"]))
    assert failed["status"] == "failed" and "result" not in failed, failed
    assert failed["error"]["code"] == -32021, failed


async def test_always_relays_a_request_the_gateway_refuses(
    gw_always: RunningGateway, http: aiohttp.ClientSession
) -> None:
    """A call the gateway itself refuses (arguments not an object) never reaches the upstream: no task."""
    client = Client(http, gw_always.url, MODERN)
    params = {"name": "deploy", "arguments": "not an object"}
    async with asyncio.timeout(WAIT):
        reply = await client.request("tools/call", params)
    assert reply.status == 400 and reply.final["error"]["code"] == -32602, reply.messages


# -- after_ms ---------------------------------------------------------------------------------------------


async def test_after_ms_slow_retry_becomes_a_task(gw_after: RunningGateway, http: aiohttp.ClientSession) -> None:
    client = Client(http, gw_after.url, MODERN)
    asked = await first_round(client, "prod", SLOW_DEPLOY)
    created = await final_round(client, "prod", SLOW_DEPLOY, asked, True)
    assert created["resultType"] == "task" and created["status"] == "working", created
    done = await completed(client, created["taskId"])
    assert text_of(done["result"]) == "deployed to prod", done


async def test_after_ms_fast_retry_is_a_plain_result(gw_after: RunningGateway, http: aiohttp.ClientSession) -> None:
    client = Client(http, gw_after.url, MODERN)
    asked = await first_round(client, "edge", FAST_DEPLOY)
    result = await final_round(client, "edge", FAST_DEPLOY, asked, True)
    assert result["resultType"] == "complete" and "taskId" not in result, result
    assert text_of(result) == "deployed to edge", result
