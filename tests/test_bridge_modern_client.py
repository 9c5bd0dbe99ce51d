"""2026-07-28 clients in front of a legacy-only upstream: the gateway's modern bridge, end to end.

The real gateway in front of the real `@modelcontextprotocol/server-everything` (2025-11-25 only), on
stdio (its stdin teed to a file, so the test sees what reached the upstream) and on Streamable HTTP,
driven by the official `mcp` SDK client pinned to 2026-07-28 and compared with one in legacy mode
through the same gateway: tools/list, tools/call with progress, resources/read, prompts/get,
elicitation and sampling mid-call as MRTR rounds answered by the SDK's callbacks, a dropped POST
cancelling the upstream call, a list change on `subscriptions/listen`, and a gateway-hosted task
followed with tasks/stream. Bad input on the MRTR path (raw HTTP, two principals) is in
`test_bridge_mrtr.py`.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

from gateway.protocol.era import CLIENT_INFO_KEY, SERVER_INFO_KEY
from tests.conftest import RunningGateway, start_gateway
from tests.test_per_tool_hosting import CONFIG, runs_as_a_gateway_task
from tests.test_upstream_with_tasks import http_upstream, node_command
from tests.wire import MODERN
from tests.wire import Client as WireClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 60.0
LONG = "trigger-long-running-operation"
GZIP_DATA = "data:text/plain;base64,aGVsbG8="


def teed_command(log: Path) -> list[str]:
    """server-everything on stdio, with every line the gateway writes to it appended to `log`."""
    node = shlex.join(node_command())
    return ["sh", "-c", f"tee -a {shlex.quote(str(log))} | exec {node} stdio"]


def sent_upstream(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]


async def until_sent(log: Path, wanted: Any, timeout: float = WAIT) -> list[dict[str, Any]]:
    """The messages written to the upstream once one satisfies `wanted` (bounded)."""
    async with asyncio.timeout(timeout):
        while True:  # a file the upstream's stdin is teed into has no event to wait on: poll it
            sent = sent_upstream(log)
            if any(wanted(message) for message in sent):
                return sent
            await asyncio.sleep(0.05)


class Upstreams:
    def __init__(self, stdio: RunningGateway, http: RunningGateway, log: Path) -> None:
        self.by_kind = {"stdio": stdio, "http": http}
        self.log = log


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateways(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Upstreams]:
    tmp = tmp_path_factory.mktemp("bridge")
    log = tmp / "upstream-stdin.jsonl"
    log.touch()
    async with (
        start_gateway(upstream_cmd=teed_command(log), config_text=CONFIG) as stdio,
        http_upstream(tmp) as (url, _),
        start_gateway(upstream_url=url, config_text=CONFIG) as http,
    ):
        yield Upstreams(stdio, http, log)


KINDS = pytest.mark.parametrize("kind", ["stdio", "http"])


def modern(url: str, **kw: Any) -> Client:
    return Client(streamable_http_client(url), mode=MODERN, **kw)


@KINDS
async def test_the_startup_learns_a_legacy_upstream_and_discover_is_the_bridges(
    gateways: Upstreams, kind: str, http: aiohttp.ClientSession
) -> None:
    url = gateways.by_kind[kind].url
    async with asyncio.timeout(WAIT):
        async with http.get(url.removesuffix("/mcp") + "/readyz") as response:
            assert (await response.json())["era"] == "legacy"
        result = await WireClient(http, url, MODERN).result("server/discover")
    assert result["supportedVersions"] == [MODERN] and result["resultType"] == "complete", result
    assert "tasks" not in result["capabilities"], result  # the upstream's SEP-1686 tasks: not bridged
    assert "io.modelcontextprotocol/tasks" in result["capabilities"]["extensions"], result  # the gateway hosts
    assert (result["ttlMs"], result["cacheScope"]) == (0, "private"), result
    assert result["_meta"][SERVER_INFO_KEY]["name"] == "mcp-servers/everything", result


@KINDS
async def test_tools_list_resources_and_prompts_match_a_legacy_client(gateways: Upstreams, kind: str) -> None:
    url = gateways.by_kind[kind].url
    async with asyncio.timeout(WAIT), modern(url) as new, Client(streamable_http_client(url), mode="legacy") as old:
        tools = await new.list_tools()
        assert (tools.result_type, tools.ttl_ms, tools.cache_scope) == ("complete", 0, "private")
        assert tools.meta is not None and tools.meta[SERVER_INFO_KEY]["name"] == "mcp-servers/everything"
        assert [tool.name for tool in tools.tools] == [tool.name for tool in (await old.list_tools()).tools]
        read = await new.read_resource("demo://resource/dynamic/text/1")
        assert read.cache_scope == "private"
        (contents,) = read.contents
        assert isinstance(contents, types.TextResourceContents) and contents.text.startswith("Resource 1:"), read
        prompt = await new.get_prompt("args-prompt", {"city": "Lisbon"})
        assert prompt.messages == (await old.get_prompt("args-prompt", {"city": "Lisbon"})).messages


@KINDS
async def test_progress_reaches_the_client_every_step_in_order(gateways: Upstreams, kind: str) -> None:
    url = gateways.by_kind[kind].url
    args = {"duration": 0.5, "steps": 5}
    seen: dict[str, list[tuple[float, float | None]]] = {"modern": [], "legacy": []}

    def recorder(era: str) -> Any:
        async def progress(value: float, total: float | None, _message: str | None) -> None:
            seen[era].append((value, total))

        return progress

    async with asyncio.timeout(WAIT), modern(url) as new, Client(streamable_http_client(url), mode="legacy") as old:
        result = await new.call_tool(LONG, args, progress_callback=recorder("modern"))
        legacy = await old.call_tool(LONG, args, progress_callback=recorder("legacy"))
    assert result.content == legacy.content and result.result_type == "complete"
    assert seen["modern"] == seen["legacy"] == [(step, 5) for step in range(1, 6)], seen


@KINDS
async def test_elicitation_and_sampling_mid_call_complete_through_mrtr(gateways: Upstreams, kind: str) -> None:
    asked: list[str] = []

    async def elicit(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def sample(_context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        (message,) = params.messages
        assert isinstance(message.content, types.TextContent)
        asked.append(message.content.text)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="kelp forests"), model="test"
        )

    url = gateways.by_kind[kind].url
    async with asyncio.timeout(WAIT), modern(url, elicitation_callback=elicit, sampling_callback=sample) as client:
        elicited = await client.call_tool("trigger-elicitation-request", {})
        sampled = await client.call_tool("trigger-sampling-request", {"prompt": "what grows?"})
    texts = [block.text for block in [*elicited.content, *sampled.content] if isinstance(block, types.TextContent)]
    assert any("Name: Ada" in text for text in texts), texts
    assert any("kelp forests" in text for text in texts), texts
    assert asked == [
        "Please provide inputs for the following fields:",
        "Resource trigger-sampling-request context: what grows?",
    ]


async def test_the_upstream_sees_a_legacy_session_without_the_envelope(gateways: Upstreams) -> None:
    """The session's handshake carries the client's legacy capabilities and clientInfo; no request
    carries the 2026 envelope, and ids are the bridge's own."""
    async with asyncio.timeout(WAIT), modern(gateways.by_kind["stdio"].url) as client:
        await client.call_tool("echo", {"message": "envelope?"})
    sent = sent_upstream(gateways.log)
    initializes = [message for message in sent if message.get("method") == "initialize"]
    assert initializes and all(m["params"]["protocolVersion"] == "2025-11-25" for m in initializes), initializes
    assert all("extensions" not in m["params"]["capabilities"] for m in initializes), initializes
    echo = next(m for m in sent if m.get("method") == "tools/call" and m["params"]["name"] == "echo")
    assert not any(key.startswith("io.modelcontextprotocol/") for key in echo["params"].get("_meta", {})), echo
    assert CLIENT_INFO_KEY not in json.dumps(sent)


async def test_a_dropped_post_cancels_the_upstream_call(gateways: Upstreams, http: aiohttp.ClientSession) -> None:
    # Without the tasks extension: the call stays a plain call (never handed to a gateway task).
    client = WireClient(http, gateways.by_kind["stdio"].url, MODERN, tasks=False)
    params = {"name": LONG, "arguments": {"duration": 30, "steps": 30}, "_meta": {"progressToken": "drop-me"}}
    async with asyncio.timeout(WAIT):
        reply = await client.open("tools/call", params)
        first = await reply.next()
        assert first is not None and first["method"] == "notifications/progress", first
        assert first["params"]["progressToken"] == "drop-me", first
        reply.close()
        sent = await until_sent(gateways.log, lambda m: m.get("method") == "notifications/cancelled")
    call = next(m for m in sent if m.get("params", {}).get("arguments") == params["arguments"])
    cancels = [m for m in sent if m.get("method") == "notifications/cancelled"]
    assert call["id"] in [m["params"]["requestId"] for m in cancels], (call, cancels)


@KINDS
async def test_a_list_change_reaches_subscriptions_listen(gateways: Upstreams, kind: str) -> None:
    """gzip-file-as-resource registers a session resource: the session's resources/list_changed
    reaches the client's listen stream (the same principal and capabilities: the same session)."""
    url = gateways.by_kind[kind].url
    async with asyncio.timeout(WAIT), modern(url) as client:
        async with client.listen(resources_list_changed=True) as subscription:
            assert subscription.honored.resources_list_changed is True
            await client.call_tool("gzip-file-as-resource", {"name": f"listen-{kind}", "data": GZIP_DATA})
            event = await anext(aiter(subscription))
        assert type(event).__name__ == "ResourcesListChanged", event
        listed = await client.list_resources()
    assert f"demo://resource/session/listen-{kind}" in [resource.uri for resource in listed.resources]


@KINDS
async def test_a_gateway_hosted_task_is_followed_with_tasks_stream(gateways: Upstreams, kind: str) -> None:
    await runs_as_a_gateway_task(gateways.by_kind[kind].url, "modern")


async def test_a_subscribed_resources_updates_reach_subscriptions_listen(gateways: Upstreams) -> None:
    """resourceSubscriptions become resources/subscribe on the session; toggle-subscriber-updates makes
    the upstream send notifications/resources/updated for them (every 5 s), tagged onto the stream."""
    uri = "demo://resource/dynamic/text/2"
    async with (
        asyncio.timeout(WAIT),
        modern(gateways.by_kind["stdio"].url) as client,
        client.listen(resource_subscriptions=[uri]) as subscription,
    ):
        assert subscription.honored is not None and subscription.honored.resource_subscriptions == [uri]
        await client.call_tool("toggle-subscriber-updates", {})
        try:
            event = await anext(aiter(subscription))
        finally:
            await client.call_tool("toggle-subscriber-updates", {})
    assert type(event).__name__ == "ResourceUpdated" and getattr(event, "uri", None) == uri, event
    subscribes = [m for m in sent_upstream(gateways.log) if m.get("method") == "resources/subscribe"]
    assert [m["params"] for m in subscribes] == [{"uri": uri}], subscribes


async def test_a_legacy_clients_list_change_and_cancel_are_forwarded(gateways: Upstreams) -> None:
    """The matrix's forwarded cell beside the bridged one: a 2025-11-25 client of the same legacy upstream
    hears its session's resources/list_changed (on the GET stream), and its notifications/cancelled
    reaches the upstream for the call it cancels, whose POST is answered with -32800."""
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/list_changed":
            changed.set()

    url = gateways.by_kind["stdio"].url
    async with (
        asyncio.timeout(WAIT),
        Client(streamable_http_client(url), mode="legacy", message_handler=on_message) as client,
    ):
        await client.call_tool("gzip-file-as-resource", {"name": "legacy-cell", "data": GZIP_DATA})
        await changed.wait()
    # The cancel is sent by hand so the test can read the cancelled POST's answer: the SDK client stops
    # reading it, and its answer then races the client's teardown.
    arguments = {"duration": 29, "steps": 29}
    async with asyncio.timeout(WAIT), aiohttp.ClientSession() as http:
        wire = WireClient(http, url)
        await wire.initialize()
        call_id = wire.next_id()
        call = asyncio.create_task(
            wire.request("tools/call", {"name": LONG, "arguments": arguments}, request_id=call_id)
        )
        sent = await until_sent(gateways.log, lambda m: m.get("params", {}).get("arguments") == arguments)
        upstream_id = next(m["id"] for m in sent if m.get("params", {}).get("arguments") == arguments)
        assert await wire.notify("notifications/cancelled", {"requestId": call_id}) == 202
        answer = (await call).final
        await until_sent(
            gateways.log,
            lambda m: m.get("method") == "notifications/cancelled" and m["params"]["requestId"] == upstream_id,
        )
        assert answer["id"] == call_id and answer["error"]["code"] == -32800, answer
        await wire.delete()
