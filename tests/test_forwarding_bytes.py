"""Parse-free forwarding: a message the gateway does not rewrite reaches the client as the upstream's
own bytes; a message it rewrites is serialised again, with the rewrite.

In-process checks of the decision (`jsonrpc.received` / `encode`, the SSE parser's undecoded data), then
the real gateway process in front of a scripted HTTP upstream on loopback, whose frames are written in a
form `orjson` would not reproduce (spaces, key order, escapes, `1.50`), so only a pass-through of the
bytes can deliver them unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from gateway.protocol import jsonrpc
from gateway.protocol.sse import SseParser
from gateway.tasks.task_ids import map_task_ids
from gateway.upstream.http import UpstreamLog, _decode_event
from tests.conftest import start_gateway
from tests.test_http_upstream import scripted
from tests.wire import ACCEPT, MODERN, envelope

LOG = UpstreamLog(logging.getLogger("tests.forwarding_bytes"), {"upstream": "default"})

# Written as no serialiser of the gateway's would: spaces, `id` last, an escaped é, a trailing zero.
PROGRESS = (
    b'{ "method" : "notifications/progress", '
    b'"params": {"progressToken": "t", "progress": 1.50, "message": "caf\\u00e9"}, "jsonrpc": "2.0" }'
)
RESULT = (
    b'{"result": {"content": [{"type": "text", "text": "d\\u00e9j\\u00e0"}], "isError": false}, '
    b'"jsonrpc": "2.0", "id": 7}'
)


def sse_frame(data: bytes) -> bytes:
    return b"event: message\r\ndata: " + data + b"\r\n\r\n"


# -- the decision, in process ----------------------------------------------------------------------


def test_an_unchanged_message_encodes_as_the_bytes_it_came_as() -> None:
    message = jsonrpc.received(PROGRESS)
    assert message == orjson.loads(PROGRESS)
    assert jsonrpc.encode(message) == PROGRESS
    assert orjson.dumps(message) != PROGRESS  # re-serialising would have changed the bytes


def test_a_change_in_place_drops_the_bytes() -> None:
    changes: list[Callable[[jsonrpc.Message], object]] = [
        lambda m: m.__setitem__("id", 8),
        lambda m: m.pop("jsonrpc"),
        lambda m: m.update(id=8),
        lambda m: m.setdefault("extra", 1),
        lambda m: m.__delitem__("jsonrpc"),
    ]
    for change in changes:
        message = jsonrpc.received(RESULT)
        assert message is not None
        change(message)
        assert jsonrpc.encode(message) == orjson.dumps(message)


def test_a_rewrite_is_a_new_dict_and_is_serialised_with_the_rewrite() -> None:
    message = jsonrpc.received(RESULT)
    assert message is not None
    rewritten = {**message, "id": "client-7"}
    assert orjson.loads(jsonrpc.encode(rewritten))["id"] == "client-7"
    # The task id mapping of a passthrough upstream copies what it changes, and keeps what it does not.
    status = jsonrpc.received(b'{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":"u1"}}')
    assert status is not None
    mapped = map_task_ids(status, None, lambda task_id: f"tag.{task_id}")
    assert orjson.loads(jsonrpc.encode(mapped))["params"]["taskId"] == "tag.u1"
    untouched = jsonrpc.received(PROGRESS)
    assert untouched is not None
    assert jsonrpc.encode(map_task_ids(untouched, None, lambda task_id: f"tag.{task_id}")) == PROGRESS


def test_a_copy_is_a_plain_dict() -> None:
    message = jsonrpc.received(RESULT)
    for duplicate in (copy.copy(message), copy.deepcopy(message)):
        assert type(duplicate) is dict
        assert duplicate == message


def test_a_message_over_several_lines_is_serialised_again() -> None:
    # Its bytes would not fit one SSE data field.
    for raw in (b'{"jsonrpc": "2.0",\n "id": 1, "result": {}}', b'{"jsonrpc": "2.0",\r "id": 1, "result": {}}'):
        message = jsonrpc.received(raw)
        assert message == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert jsonrpc.encode(message) == b'{"jsonrpc":"2.0","id":1,"result":{}}'


def test_what_is_not_a_json_object_is_no_message() -> None:
    assert jsonrpc.received(b"[1, 2]") is None
    assert jsonrpc.received(b"{nope") is None


def test_the_sse_parser_hands_over_data_undecoded() -> None:
    parser = SseParser()
    frame = sse_frame(PROGRESS)
    events = [event for byte in range(len(frame)) for event in parser.feed(frame[byte : byte + 1])]
    assert [event.raw for event in events] == [PROGRESS]
    assert events[0].data == PROGRESS.decode()
    (message,) = [_decode_event(event, LOG) for event in events]
    assert message is not None
    assert jsonrpc.encode(message) == PROGRESS


def test_sse_data_that_is_not_utf8_is_read_as_text_and_relayed_as_utf8() -> None:
    (event,) = SseParser().feed(b'data: {"jsonrpc":"2.0","method":"m","params":{"x":"\xff"}}\n\n')
    message = _decode_event(event, LOG)
    assert message == {"jsonrpc": "2.0", "method": "m", "params": {"x": "\ufffd"}}
    assert jsonrpc.encode(message) == orjson.dumps(message)


# -- the real gateway in front of a scripted upstream ----------------------------------------------

Answer = Callable[[web.Request, jsonrpc.Message], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def scripted_upstream(tools_call: Answer) -> AsyncIterator[str]:
    """An upstream that answers `tools/call` with `tools_call` and anything else with an empty result."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405)
        message = await request.json()
        if "id" not in message:
            return web.Response(status=202)
        if message["method"] == "tools/call":
            return await tools_call(request, message)
        result = {"protocolVersion": message.get("params", {}).get("protocolVersion", MODERN), "capabilities": {}}
        result["serverInfo"] = {"name": "scripted", "version": "1"}
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})

    async with scripted(handler) as url:
        yield url


async def call_through_gateway(tools_call: Answer) -> tuple[int, str, bytes]:
    """One 2026-07-28 `tools/call` (id 7) through a real gateway: status, content type and body bytes."""
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    body["params"]["_meta"] = {**envelope(tasks=False), "progressToken": "t"}
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": MODERN}
    headers |= {"Mcp-Method": "tools/call", "Mcp-Name": "t"}
    async with (
        scripted_upstream(tools_call) as upstream_url,
        start_gateway(upstream_url=upstream_url) as gw,
        aiohttp.ClientSession() as http,
        http.post(gw.url, json=body, headers=headers) as response,
    ):
        return response.status, response.content_type, await response.read()


async def test_sse_frames_that_need_no_rewrite_reach_the_client_byte_for_byte() -> None:
    async def stream(request: web.Request, message: jsonrpc.Message) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse_frame(PROGRESS))
        await response.write(sse_frame(RESULT))
        await response.write_eof()
        return response

    status, content_type, body = await call_through_gateway(stream)
    assert (status, content_type) == (200, "text/event-stream")
    assert body == sse_frame(PROGRESS) + sse_frame(RESULT)


async def test_a_json_body_that_needs_no_rewrite_reaches_the_client_byte_for_byte() -> None:
    async def json_body(request: web.Request, message: jsonrpc.Message) -> web.StreamResponse:
        return web.Response(body=RESULT, content_type="application/json")

    status, content_type, body = await call_through_gateway(json_body)
    assert (status, content_type) == (200, "application/json")
    assert body == RESULT


async def test_an_error_with_a_null_id_gets_the_request_id() -> None:
    # The SDK answers transport errors with id null: the gateway rewrites the id, so the bytes are new.
    error = b'{"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "Bad Request: caf\\u00e9"}}'

    async def refused(request: web.Request, message: jsonrpc.Message) -> web.StreamResponse:
        return web.Response(body=error, status=400, content_type="application/json")

    _, content_type, body = await call_through_gateway(refused)
    assert content_type == "application/json"
    assert orjson.loads(body) == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": "Bad Request: café"}}
