"""HttpUpstream against a real `mcp` SDK server on Streamable HTTP (tests/servers/http_probe_server.py).

A few behaviours the SDK server cannot be made to show (a static credential winning over a client's,
a stream ending without a response and without ids, a text error page) are checked against a
scripted aiohttp server on loopback instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.config import HttpUpstreamConfig
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.upstream.base import Exchange
from gateway.upstream.http import HttpChannel, HttpUpstream
from tests.conftest import stop_popen

pytestmark = pytest.mark.timeout(60)

SERVER = Path(__file__).resolve().parent / "servers" / "http_probe_server.py"
READY_TIMEOUT_S = 20.0
WAIT_S = 15.0

LEGACY_HEADERS = {"MCP-Protocol-Version": "2025-11-25"}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def probe_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The probe server on a free loopback port, for one test module; always terminated."""
    port = free_port()
    log = tmp_path_factory.mktemp("http-probe") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"probe server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"probe server not listening after {READY_TIMEOUT_S} s:\n{log.read_text()}")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_popen(proc)


async def make_upstream(url: str, metrics: Metrics | None = None, **config: Any) -> HttpUpstream:
    upstream = HttpUpstream(url, HttpUpstreamConfig(**config), metrics or Metrics())
    await upstream.start()
    return upstream


@pytest.fixture
async def upstream(probe_url: str) -> AsyncIterator[HttpUpstream]:
    up = await make_upstream(probe_url)
    try:
        yield up
    finally:
        await up.close()


async def collect(exchange: Exchange) -> list[Message]:
    async with asyncio.timeout(WAIT_S):
        return await exchange.collect()


async def legacy_session(up: HttpUpstream) -> HttpChannel:
    channel = await up.open_session()
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
    }
    messages = await collect(await channel.request(initialize, {}))
    assert messages[-1]["result"]["protocolVersion"] == "2025-11-25"
    await channel.notify({"jsonrpc": "2.0", "method": "notifications/initialized"}, LEGACY_HEADERS)
    return channel


def tool_call(
    request_id: int | str, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
) -> Message:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def modern_headers(name: str) -> dict[str, str]:
    return {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name}


def text_of(message: Message) -> str:
    text: str = message["result"]["content"][0]["text"]
    return text


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def outcome(up: HttpUpstream, label: str) -> str:
    async with up.stateless() as channel:
        exchange = await channel.request(
            tool_call(f"outcome-{uuid.uuid4()}", "outcome", {"label": label}, ENVELOPE), modern_headers("outcome")
        )
        return text_of((await collect(exchange))[-1])


# -- legacy sessions --------------------------------------------------------------------------------


async def test_legacy_session_streams_progress_in_order_before_the_response(upstream: HttpUpstream) -> None:
    channel = await legacy_session(upstream)
    assert channel.session_id
    exchange = await channel.request(
        tool_call(7, "slow", {"steps": 4, "delay": 0.3}, {"progressToken": "tok-7"}), LEGACY_HEADERS
    )
    async with asyncio.timeout(WAIT_S):
        first = await exchange.next_batch()
    # Delivered while the tool still runs: nothing is buffered until the end of the stream.
    assert first is not None and first[0]["method"] == "notifications/progress"
    assert not exchange.finished
    messages = first + await collect(exchange)
    progress = [m["params"] for m in messages[:-1]]
    assert [p["progress"] for p in progress] == [1, 2, 3, 4]
    assert {p["progressToken"] for p in progress} == {"tok-7"}
    assert messages[-1]["id"] == 7
    assert text_of(messages[-1]) == "done 4 steps"


async def test_legacy_resumes_with_last_event_id_when_the_server_closes_the_stream(upstream: HttpUpstream) -> None:
    channel = await legacy_session(upstream)
    # The resume (300 ms after step 1) lands mid-step: the SDK server loses messages produced while a
    # resumed stream is being re-registered, so a step or the response at that instant would vanish.
    exchange = await channel.request(
        tool_call(3, "stream_closer", {"steps": 3, "delay": 0.7}, {"progressToken": 3}), LEGACY_HEADERS
    )
    messages = await collect(exchange)
    assert [m["params"]["progress"] for m in messages[:-1]] == [1, 2, 3]
    assert text_of(messages[-1]) == "survived 3 steps"


async def test_legacy_cancel_stops_the_tool_upstream(upstream: HttpUpstream) -> None:
    channel = await legacy_session(upstream)
    label = f"legacy-{uuid.uuid4()}"
    exchange = await channel.request(
        tool_call(9, "slow", {"steps": 200, "delay": 0.05, "label": label}, {"progressToken": 9}), LEGACY_HEADERS
    )
    async with asyncio.timeout(WAIT_S):
        assert await exchange.next_batch()
    await exchange.cancel()

    async def cancelled() -> bool:
        return (await outcome(upstream, label)).startswith("cancelled")

    await eventually(cancelled, "the legacy tool to be cancelled")


async def test_unsolicited_messages_reach_the_handler(upstream: HttpUpstream) -> None:
    channel = await legacy_session(upstream)
    received: list[Message] = []

    async def handler(message: Message, size: int) -> None:
        received.append(message)

    channel.set_unsolicited_handler(handler)

    # The GET stream opens in the background after `initialized`: announce until it is there.
    async def announced() -> bool:
        await collect(await channel.request(tool_call(str(uuid.uuid4()), "announce", {}), LEGACY_HEADERS))
        return bool(received)

    await eventually(announced, "notifications/tools/list_changed on the GET stream")
    assert received[0] == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


async def test_unsolicited_messages_without_a_handler_are_counted_as_undelivered(probe_url: str) -> None:
    metrics = Metrics()
    up = await make_upstream(probe_url, metrics)
    try:
        channel = await legacy_session(up)

        async def counted() -> bool:
            await collect(await channel.request(tool_call(str(uuid.uuid4()), "announce", {}), LEGACY_HEADERS))
            value = metrics.registry.get_sample_value(
                "mcp_gateway_notifications_undelivered_total",
                {"method": "notifications/tools/list_changed", "reason": "no_session"},
            )
            return bool(value)

        await eventually(counted, "an undelivered list_changed to be counted")
    finally:
        await up.close()


async def test_close_fails_in_flight_exchanges_and_deletes_the_session(upstream: HttpUpstream, probe_url: str) -> None:
    channel = await legacy_session(upstream)
    session_id = channel.session_id
    assert session_id
    exchange = await channel.request(tool_call(11, "slow", {"steps": 100, "delay": 0.05}), LEGACY_HEADERS)
    await channel.close()
    final = (await collect(exchange))[-1]
    assert final["error"] == {"code": jsonrpc.INTERNAL_ERROR, "message": "upstream session closed"}

    later = await collect(await channel.request(tool_call(12, "echo", {"text": "x"}), LEGACY_HEADERS))
    assert later[-1]["error"]["message"] == "upstream session closed"

    headers = {
        "Mcp-Session-Id": session_id,
        "MCP-Protocol-Version": "2025-11-25",
        "Accept": "application/json, text/event-stream",
    }
    async with aiohttp.ClientSession() as client:
        body = tool_call(13, "echo", {"text": "x"})
        async with client.post(probe_url, json=body, headers=headers) as response:
            assert response.status == 404


# -- the modern (2026-07-28) stateless channel ----------------------------------------------------


async def test_modern_stateless_request_returns_the_result(upstream: HttpUpstream) -> None:
    async with upstream.stateless() as channel:
        assert isinstance(channel, HttpChannel) and channel.session_id is None
        exchange = await channel.request(tool_call(1, "echo", {"text": "hello"}, ENVELOPE), modern_headers("echo"))
        messages = await collect(exchange)
    assert len(messages) == 1
    assert messages[0]["id"] == 1
    assert text_of(messages[0]) == "hello"
    assert messages[0]["result"]["resultType"] == "complete"


async def test_modern_http_error_carries_the_json_rpc_error(upstream: HttpUpstream) -> None:
    async with upstream.stateless() as channel:
        message = {"jsonrpc": "2.0", "id": "t1", "method": "tasks/get", "params": {"taskId": "x", "_meta": ENVELOPE}}
        headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": "x"}
        messages = await collect(await channel.request(message, headers))
    assert messages == [
        {"jsonrpc": "2.0", "id": "t1", "error": {"code": -32601, "message": "Method not found", "data": "tasks/get"}}
    ]


async def test_modern_cancel_closes_the_post_and_stops_the_tool(upstream: HttpUpstream) -> None:
    label = f"modern-{uuid.uuid4()}"
    async with upstream.stateless() as channel:
        exchange = await channel.request(
            tool_call(2, "slow", {"steps": 200, "delay": 0.05, "label": label}, {**ENVELOPE, "progressToken": 2}),
            modern_headers("slow"),
        )
        async with asyncio.timeout(WAIT_S):
            batch = await exchange.next_batch()
        assert batch and batch[0]["method"] == "notifications/progress"
        await exchange.cancel()
        assert exchange.finished

    async def cancelled() -> bool:
        return (await outcome(upstream, label)).startswith("cancelled")

    await eventually(cancelled, "the modern tool to be cancelled by the dropped POST")


async def test_unreachable_upstream_fails_the_exchange() -> None:
    port = free_port()
    up = await make_upstream(f"http://127.0.0.1:{port}/mcp", connect_timeout_s=2.0)
    try:
        async with up.stateless() as channel:
            exchange = await channel.request(tool_call(5, "echo", {"text": "x"}, ENVELOPE), modern_headers("echo"))
            messages = await collect(exchange)
        channel_legacy = await up.open_session()
        await channel_legacy.notify({"jsonrpc": "2.0", "method": "notifications/initialized"}, {})  # must not raise
    finally:
        await up.close()
    assert len(messages) == 1
    error = messages[0]["error"]
    assert messages[0]["id"] == 5
    assert error["code"] == jsonrpc.INTERNAL_ERROR
    # The client learns what kind of failure it was, never where the upstream is (the log says).
    assert error["message"] == "upstream unreachable: connection refused", error


# -- a scripted upstream for what the SDK server never does ---------------------------------------


@contextlib.asynccontextmanager
async def scripted(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/mcp", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        await runner.cleanup()


async def test_static_headers_win_and_client_authorization_is_never_forwarded() -> None:
    seen: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append({name.lower(): value for name, value in request.headers.items()})
        body = await request.json()
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {}})

    async with scripted(handler) as url:
        up = await make_upstream(url, headers={"Authorization": "Bearer upstream", "X-Static": "config"})
        try:
            async with up.stateless() as channel:
                client_headers = {
                    **modern_headers("echo"),
                    "Mcp-Param-Region": "eu",
                    "authorization": "Bearer client",
                    "x-static": "client",
                }
                await collect(await channel.request(tool_call(1, "echo", {}, ENVELOPE), client_headers))
            bare = await make_upstream(url)
            try:
                async with bare.stateless() as channel:
                    await collect(await channel.request(tool_call(2, "echo", {}, ENVELOPE), {"Authorization": "x"}))
            finally:
                await bare.close()
        finally:
            await up.close()
    first, second = seen
    assert first["authorization"] == "Bearer upstream"
    assert first["x-static"] == "config"
    assert first["mcp-protocol-version"] == "2026-07-28"
    assert first["mcp-method"] == "tools/call"
    assert first["mcp-name"] == "echo"
    assert first["mcp-param-region"] == "eu"
    assert first["accept"] == "application/json, text/event-stream"
    assert first["content-type"] == "application/json"
    assert "mcp-session-id" not in first
    assert "authorization" not in second


async def test_stream_ending_without_response_or_ids_fails_the_exchange() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\r\n\r\n')
        await response.write_eof()
        return response

    async with scripted(handler) as url:
        up = await make_upstream(url)
        try:
            async with up.stateless() as channel:
                messages = await collect(await channel.request(tool_call(4, "x", {}), {}))
        finally:
            await up.close()
    assert messages[0]["method"] == "notifications/progress"
    assert messages[1] == jsonrpc.error_response(
        4, jsonrpc.INTERNAL_ERROR, "upstream closed the stream without a response"
    )


async def test_http_errors_become_json_rpc_errors_for_the_request() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["id"] == "null-id":
            error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}
            return web.json_response(error, status=404)
        return web.Response(status=502, text="<html>\n  bad   gateway\n</html>", content_type="text/html")

    async with scripted(handler) as url:
        up = await make_upstream(url)
        try:
            async with up.stateless() as channel:
                null_id = await collect(await channel.request(tool_call("null-id", "x", {}), {}))
                page_exchange = await channel.request(tool_call("page", "x", {}), {})
                page = await collect(page_exchange)
        finally:
            await up.close()
    assert null_id == [{"jsonrpc": "2.0", "id": "null-id", "error": {"code": -32600, "message": "Session not found"}}]
    # The body (a proxy's page, maybe a stack trace) is for the log and /readyz, not for the client.
    assert page == [jsonrpc.error_response("page", jsonrpc.INTERNAL_ERROR, "upstream answered HTTP 502")]
    assert page_exchange.failure_detail == "upstream answered HTTP 502: <html> bad gateway </html>"
