"""2025-11-25 clients in front of a 2026-07-28-only upstream: the era bridge `LegacyOverModern`.

The real gateway in front of `tests/servers/modern_only_server.py` (which refuses `initialize`), on stdio
and on Streamable HTTP, one gateway per transport for the module; the official `mcp` SDK client pinned
to the handshake era (`mode="legacy"`), and the repo CLI for a gateway-hosted task. Each client session
is bridged onto stateless 2026-07-28 requests: initialize answered from `server/discover`, progress and
logs relayed in order, an `InputRequiredResult` turned into elicitation and sampling requests the SDK
client's callbacks answer, a dropped call cancelled upstream, a tool-list change reaching the client's
GET stream through the session's `subscriptions/listen`.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CreateMessageResult, ElicitResult, TextContent

from gateway.protocol.era import TASKS_EXTENSION
from gateway.upstream.bridge.legacy_over_modern import (
    legacy_capabilities,
    legacy_result,
    modern_capabilities,
    without_subscription_id,
)
from tests.conftest import ROOT, RunningGateway, serve_http, start_gateway
from tests.test_cli_tasks import cli, json_lines
from tests.test_readiness import ready, readyz_until
from tests.wire import LEGACY, wait_for_marker
from tests.wire import Client as WireClient

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "modern_only_server.py")]
INPUT_TIMEOUT_S = 3
CONFIG = f"""
[upstream.bridge]
input_timeout_s = {INPUT_TIMEOUT_S}

[[tasks.tools]]
match = "count"
task_support = "optional"

[[tasks.tools]]
match = "ask"
task_support = "optional"
"""
pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    # A 2025-11-25 client's ping and logging/setLevel are what the bridge serves; the SDK warns they are gone in 2026.
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["stdio", "http"])
async def bridged(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningGateway]:
    """The gateway in front of the 2026-only server, on stdio or Streamable HTTP."""
    if request.param == "stdio":
        async with start_gateway(upstream_cmd=SERVER, config_text=CONFIG) as gateway:
            gateway.upstream_kind, gateway.upstream_cmd = "stdio", SERVER
            yield gateway
        return
    log = tmp_path_factory.mktemp("modern-only") / "server.log"
    async with serve_http(SERVER, log=log) as url, start_gateway(upstream_url=url, config_text=CONFIG) as gateway:
        gateway.upstream_kind, gateway.upstream_url = "http", url
        yield gateway


async def test_the_shapes_a_legacy_client_gets() -> None:
    """Pure: what the bridge takes out of (and keeps in) the 2026-07-28 shapes it hands a 2025-11-25 client."""
    final = {
        "jsonrpc": "2.0",
        "id": 9,
        "result": {"resultType": "complete", "ttlMs": 0, "cacheScope": "private", "x": 1},
    }
    assert legacy_result(3, final) == {"jsonrpc": "2.0", "id": 3, "result": {"x": 1}}
    error = {"code": -32602, "message": "bad"}
    assert legacy_result(3, {"jsonrpc": "2.0", "id": 9, "error": error}) == {"jsonrpc": "2.0", "id": 3, "error": error}
    declared = {"tools": {"listChanged": True}, "extensions": {TASKS_EXTENSION: {}, "x/y": {}}}
    assert legacy_capabilities(declared) == {"tools": {"listChanged": True}, "extensions": {"x/y": {}}}
    assert legacy_capabilities({"extensions": {TASKS_EXTENSION: {}}}) == {}
    assert modern_capabilities({"tasks": {"list": {}}, "elicitation": {"form": {}}}) == {"elicitation": {"form": {}}}
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/tools/list_changed",
        "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "listen-1"}},
    }
    assert without_subscription_id(note) == {
        "jsonrpc": "2.0",
        "method": "notifications/tools/list_changed",
        "params": {},
    }


def legacy(gateway: RunningGateway, **callbacks: Any) -> Client:
    return Client(streamable_http_client(gateway.url), mode="legacy", cache=None, **callbacks)


def direct(gateway: RunningGateway) -> Client:
    """A 2026-07-28 SDK client straight to the same kind of upstream (no gateway)."""
    if gateway.upstream_url is not None:
        return Client(gateway.upstream_url, mode="2026-07-28", cache=None)
    return Client(StdioServerParameters(command=SERVER[0], args=SERVER[1:]), mode="2026-07-28", cache=None)


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


async def test_readyz_reports_the_modern_era(bridged: RunningGateway) -> None:
    async with aiohttp.ClientSession() as http:
        body = await readyz_until(http, bridged, ready)
    assert body["era"] == "modern", body


async def test_the_server_refuses_a_legacy_client_without_the_gateway(bridged: RunningGateway) -> None:
    """What the bridge is for: the same client straight to the server gets no session."""
    if bridged.upstream_url is None:
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:])
        client = Client(params, mode="legacy", cache=None)
    else:
        client = Client(streamable_http_client(bridged.upstream_url), mode="legacy", cache=None)
    with pytest.raises(BaseExceptionGroup) as caught:
        async with asyncio.timeout(30), client:
            pass
    assert caught.group_contains(Exception, match="this server speaks 2026-07-28 only", depth=None), caught.value


async def test_lists_reads_and_prompts_as_the_server_has_them(bridged: RunningGateway) -> None:
    async with asyncio.timeout(60), legacy(bridged) as client, direct(bridged) as straight:
        assert client.server_info is not None and client.server_info.name == "modern-only-server"
        assert client.server_capabilities.tasks is not None  # the gateway hosts tasks
        tools = [tool.model_dump(exclude={"execution"}) for tool in (await client.list_tools()).tools]
        wanted = [tool.model_dump(exclude={"execution"}) for tool in (await straight.list_tools()).tools]
        assert tools == wanted
        read = await client.read_resource("memo://greeting")
        assert [content.text for content in read.contents] == ["hello from modern-only"]  # type: ignore[union-attr]
        prompt = await client.get_prompt("greet", {"name": "Ann"})
        assert [message.content.text for message in prompt.messages] == ["Say hello to Ann."]  # type: ignore[union-attr]
        assert await client.send_ping() is not None


async def test_every_progress_notification_and_the_log_arrive_in_order(bridged: RunningGateway) -> None:
    steps = 40
    progress: list[tuple[float, float | None, str | None]] = []
    logs: list[Any] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async def on_log(params: Any) -> None:
        logs.append(params.data)

    async with asyncio.timeout(60), legacy(bridged, logging_callback=on_log) as client:
        quiet = await client.call_tool("count", {"n": 2}, progress_callback=on_progress)
        assert text_of(quiet) == "counted to 2" and logs == []  # no logs before logging/setLevel
        progress.clear()
        await client.set_logging_level("info")
        result = await client.call_tool("count", {"n": steps}, progress_callback=on_progress)
    assert text_of(result) == f"counted to {steps}"
    assert progress == [(float(i), float(steps), f"step {i}") for i in range(1, steps + 1)]
    assert logs == [f"counting to {steps}"]


async def test_elicitation_and_sampling_mid_call_are_answered_by_the_client(bridged: RunningGateway) -> None:
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"name": "Ada"})

    async def sample(context: Any, params: Any) -> CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="brief"), model="test")

    async with asyncio.timeout(60), legacy(bridged, elicitation_callback=elicit, sampling_callback=sample) as client:
        result = await client.call_tool("ask", {"question": "Who are you?"})
    assert text_of(result) == "Hello, Ada! brief"
    assert sorted(asked) == ["Summarize", "Who are you?"]


async def test_a_declined_elicitation_reaches_the_tool(bridged: RunningGateway) -> None:
    async def decline(context: Any, params: Any) -> ElicitResult:
        return ElicitResult(action="decline")

    async def sample(context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="-"), model="test")

    async with asyncio.timeout(60), legacy(bridged, elicitation_callback=decline, sampling_callback=sample) as client:
        result = await client.call_tool("ask", {})
    assert text_of(result) == "No name (decline)"


async def test_a_cancelled_call_is_cancelled_upstream(bridged: RunningGateway, tmp_path: Path) -> None:
    marker = tmp_path / "wait.marker"
    async with asyncio.timeout(60), legacy(bridged) as client:
        call = asyncio.create_task(client.call_tool("wait", {"seconds": 30, "marker": str(marker)}))
        assert await wait_for_marker(marker, ("started",), 20) == ["started"]
        call.cancel()  # the SDK client sends notifications/cancelled
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await wait_for_marker(marker, ("cancelled",), 20) == ["started", "cancelled"]
        assert text_of(await client.call_tool("echo", {"text": "still here"})) == "still here"


# On a stdio upstream each stateless request may run in another pooled process, each a server of its
# own: a change one call makes is seen only by a listen in that same process (a documented limit), so
# list changes and resource updates are tested over HTTP.
HTTP_ONLY = pytest.mark.parametrize("bridged", ["http"], indirect=True)


@HTTP_ONLY
async def test_a_tool_list_change_reaches_the_client(bridged: RunningGateway) -> None:
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async with asyncio.timeout(60), legacy(bridged, message_handler=on_message) as client:
        assert text_of(await client.call_tool("add_tool", {"name": "added"})) == "added added"
        await changed.wait()
        assert "added" in [tool.name for tool in (await client.list_tools()).tools]


@HTTP_ONLY
async def test_a_subscribed_resource_update_reaches_the_client(bridged: RunningGateway) -> None:
    updated: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/updated":
            updated.put_nowait(str(message.params.uri))

    async with asyncio.timeout(60), legacy(bridged, message_handler=on_message) as client:
        await client.subscribe_resource("memo://greeting")
        assert text_of(await client.call_tool("touch", {"uri": "memo://other"})) == "touched memo://other"
        await client.call_tool("touch", {"uri": "memo://greeting"})
        assert await updated.get() == "memo://greeting"  # only the subscribed one, first
        await client.unsubscribe_resource("memo://greeting")


async def test_a_hosted_task_followed_with_tasks_stream(bridged: RunningGateway) -> None:
    """`count` as a gateway-hosted task (the bridge declares no Tasks of its own): its progress is in the
    task's log, read back with tasks/stream by `tail`."""
    args = json.dumps({"n": 5, "delay": 0.05})
    code, out, err = await cli("call", bridged.url, "count", "--args", args, "--task", "--follow", "--era", "legacy")
    assert code == 0, err
    assert out.splitlines()[-1] == "counted to 5", out
    started = re.search(r"task (\S+) started", err)
    assert started is not None, err
    code, out, err = await cli("tail", bridged.url, started.group(1), "--json", "--era", "legacy")
    assert code == 0, err
    events = json_lines(out)
    progress = [event["payload"] for event in events if event["type"].endswith(".progress")]
    assert [(p["progress"], p["total"]) for p in progress] == [(i, 5) for i in range(1, 6)], events
    assert events[-1]["payload"]["status"] == "completed", events[-1]


async def test_a_hosted_task_asks_its_question_and_goes_on(bridged: RunningGateway) -> None:
    """`ask` as a gateway-hosted task: the upstream's InputRequiredResult becomes an elicitation request
    of the task (input_required), the CLI answers it, and the bridged call is retried with the answer."""
    args = json.dumps({"question": "Task name?", "sample": False})
    code, out, err = await cli(
        "call", bridged.url, "ask", "--args", args, "--task", "--follow", "--era", "legacy",
        "--answers", '{"name": "Eve"}',
    )  # fmt: skip
    assert code == 0, err
    assert out.splitlines()[-1] == "Hello, Eve!", out


# -- bad input ----------------------------------------------------------------------------------------


async def test_an_answer_to_no_pending_request_is_refused(bridged: RunningGateway) -> None:
    async with aiohttp.ClientSession() as http:
        client = WireClient(http, bridged.url, LEGACY)
        await client.initialize()
        reply = await client.send({"jsonrpc": "2.0", "id": "bridge-0000", "result": {"action": "accept"}})
        await reply.rest()
        assert reply.status == 400, reply.status
        error = reply.final["error"]
        assert error["code"] == -32600 and "no server request with id 'bridge-0000'" in error["message"], error
        await client.delete()


async def test_a_call_whose_input_window_passed_gets_a_clear_error(bridged: RunningGateway) -> None:
    """The client answers the elicitation only after `input_timeout_s`: the call has ended with a
    timeout error naming the setting; the late answer goes nowhere and the session goes on."""
    ended = asyncio.Event()

    async def late(context: Any, params: Any) -> ElicitResult:
        await ended.wait()
        return ElicitResult(action="accept", content={"name": "Late"})

    async def sample(context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="-"), model="test")

    async with asyncio.timeout(60), legacy(bridged, elicitation_callback=late, sampling_callback=sample) as client:
        with pytest.raises(Exception, match=r"input_timeout_s") as caught:
            await client.call_tool("ask", {})
        ended.set()
        assert f"within {INPUT_TIMEOUT_S} s" in str(caught.value)
        assert text_of(await client.call_tool("echo", {"text": "after"})) == "after"
