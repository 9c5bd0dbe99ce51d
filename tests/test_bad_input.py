"""Bad input at the edge: every malformed or disallowed request gets its documented status and JSON-RPC error.

Each case is a raw aiohttp request (headers set explicitly) against one gateway per upstream transport,
shared by the module so the gateway also has to survive the whole set: afterwards `/healthz` is 200, a
normal legacy initialize + tools/call works, and the gateway printed no traceback.

The table (status, JSON-RPC code) is the gateway's documented contract for bad input:
malformed JSON 400/-32700; batch 400/-32600; Content-Type 415/-32600; Accept 406/-32600; Origin
403/-32600; Host 421/-32600; body size 413/-32600; legacy missing session 400/-32600, unknown or
deleted session 404/-32600, unmatched posted response 400/-32600, GET without session 400/-32600;
modern missing envelope 400/-32602, header mismatch 400/-32020, unsupported version 400/-32022,
GET/DELETE 405 with `Allow: POST`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client

from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

ACCEPT = "application/json, text/event-stream"
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
MAX_BODY_BYTES = 4 * 1024 * 1024  # server.max_body_bytes default
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022
TIMEOUT = aiohttp.ClientTimeout(total=30)

Json = dict[str, Any]


# --------------------------------------------------------------------------------------------- helpers


def legacy_headers(session_id: str | None = None, **extra: str) -> dict[str, str]:
    headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
    if session_id is not None:
        headers["Mcp-Session-Id"] = session_id
        headers["MCP-Protocol-Version"] = LEGACY
    headers.update(extra)
    return headers


def modern_headers(method: str, name: str | None = None, version: str = MODERN, **extra: str) -> dict[str, str]:
    headers = {
        "Accept": ACCEPT,
        "Content-Type": "application/json",
        "MCP-Protocol-Version": version,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    headers.update(extra)
    return headers


def envelope(version: str = MODERN) -> Json:
    return {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientInfo": {"name": "bad-input-test", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }


def modern_body(method: str, params: Json | None = None, *, request_id: int = 7, version: str = MODERN) -> Json:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**(params or {}), "_meta": envelope(version)},
    }


def initialize_body(request_id: int = 1) -> Json:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "bad-input-test", "version": "0"},
        },
    }


def dumps(body: object) -> bytes:
    return json.dumps(body).encode()


async def read_messages(resp: aiohttp.ClientResponse) -> list[Json]:
    """Every JSON-RPC message of a response, whether it came as one JSON body or as SSE."""
    content_type = resp.headers.get("Content-Type", "")
    raw = await resp.read()
    if content_type.startswith("application/json"):
        return [json.loads(raw)]
    assert content_type.startswith("text/event-stream"), f"unexpected Content-Type {content_type!r}: {raw!r}"
    messages: list[Json] = []
    for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))
        if data.strip():
            messages.append(json.loads(data))
    return messages


async def open_legacy_session(http: aiohttp.ClientSession, url: str) -> str:
    """initialize + notifications/initialized; returns the Mcp-Session-Id."""
    async with http.post(url, data=dumps(initialize_body()), headers=legacy_headers()) as resp:
        assert resp.status == 200, f"initialize: HTTP {resp.status}: {await resp.text()}"
        session_id = resp.headers.get("Mcp-Session-Id")
        assert session_id, f"initialize answered without Mcp-Session-Id: {dict(resp.headers)}"
        messages = await read_messages(resp)
    assert any(m.get("id") == 1 and "result" in m for m in messages), messages
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with http.post(url, data=dumps(notification), headers=legacy_headers(session_id)) as resp:
        assert resp.status == 202, f"notifications/initialized: HTTP {resp.status}: {await resp.text()}"
    return session_id


# ----------------------------------------------------------------------------------------------- cases


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")


@dataclass
class Ctx:
    http: aiohttp.ClientSession
    gw: RunningGateway

    @property
    def url(self) -> str:
        return self.gw.url

    async def send(
        self,
        method: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        skip_auto_headers: list[str] | None = None,
    ) -> Answer:
        async with self.http.request(
            method, self.url, data=body, headers=headers or {}, skip_auto_headers=skip_auto_headers
        ) as resp:
            return Answer(resp.status, dict(resp.headers), await resp.read())


Sender = Callable[[Ctx], Awaitable[Answer]]


@dataclass
class Case:
    name: str
    send: Sender
    status: int
    code: int | None  # None: no JSON-RPC body required (405)
    request_id: object = None  # the id the error may echo (None: only null is acceptable)
    check: Callable[[Answer, Json | None], None] | None = None


def _post(body: bytes | Json, headers: dict[str, str], skip: list[str] | None = None) -> Sender:
    raw = body if isinstance(body, bytes) else dumps(body)

    async def send(ctx: Ctx) -> Answer:
        return await ctx.send("POST", raw, headers, skip)

    return send


def _with_session(
    build: Callable[[str], tuple[str, bytes | None, dict[str, str]]],
) -> Sender:
    """A request that needs a live legacy session: `build(session_id)` gives (method, body, headers)."""

    async def send(ctx: Ctx) -> Answer:
        session_id = await open_legacy_session(ctx.http, ctx.url)
        method, body, headers = build(session_id)
        try:
            return await ctx.send(method, body, headers)
        finally:
            await ctx.send("DELETE", None, legacy_headers(session_id))

    return send


async def _deleted_session(ctx: Ctx) -> Answer:
    session_id = await open_legacy_session(ctx.http, ctx.url)
    deleted = await ctx.send("DELETE", None, legacy_headers(session_id))
    assert deleted.status in (200, 202, 204), f"DELETE of a live session: HTTP {deleted.status} {deleted.body!r}"
    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
    return await ctx.send("POST", dumps(body), legacy_headers(session_id))


def _unsupported_version_data(answer: Answer, message: Json | None) -> None:
    assert message is not None
    data = message["error"].get("data")
    assert isinstance(data, dict), message
    assert data.get("requested") == "2099-01-01", data
    assert MODERN in data.get("supported", []), data


def _allow_post(answer: Answer, message: Json | None) -> None:
    allow = [m.strip().upper() for m in answer.headers.get("Allow", "").split(",")]
    assert "POST" in allow, f"405 without Allow: POST: {answer.headers}"


PING = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 6, "method": "tools/list"}
BIG_PAD = "x" * (MAX_BODY_BYTES + 1024)

CASES: list[Case] = [
    # -- any era: body syntax
    Case("malformed-json-legacy", _post(b'{"jsonrpc": "2.0", "id": 1, "method": ', legacy_headers()), 400, PARSE_ERROR),
    Case(
        "malformed-json-modern",
        _post(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", ', modern_headers("tools/list")),
        400,
        PARSE_ERROR,
    ),
    Case("not-json-at-all", _post(b"hello", legacy_headers()), 400, PARSE_ERROR),
    Case("batch-legacy", _post(dumps([initialize_body()]), legacy_headers()), 400, INVALID_REQUEST),
    Case(
        "batch-modern",
        _post(dumps([modern_body("tools/list")]), modern_headers("tools/list")),
        400,
        INVALID_REQUEST,
    ),
    # -- any era: HTTP hygiene
    Case(
        "content-type-text-plain",
        _post(initialize_body(), legacy_headers(**{"Content-Type": "text/plain"})),
        415,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "content-type-missing",
        _post(initialize_body(), {"Accept": ACCEPT}, skip=["Content-Type"]),
        415,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "content-type-text-plain-modern",
        _post(modern_body("tools/list"), modern_headers("tools/list", **{"Content-Type": "text/plain"})),
        415,
        INVALID_REQUEST,
        request_id=7,
    ),
    Case(
        "accept-missing",
        _post(initialize_body(), {"Content-Type": "application/json"}, skip=["Accept"]),
        406,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "accept-json-only",
        _post(initialize_body(), legacy_headers(Accept="application/json")),
        406,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "accept-sse-only",
        _post(initialize_body(), legacy_headers(Accept="text/event-stream")),
        406,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "accept-html",
        _post(initialize_body(), legacy_headers(Accept="text/html")),
        406,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "accept-json-only-modern",
        _post(modern_body("tools/list"), modern_headers("tools/list", Accept="application/json")),
        406,
        INVALID_REQUEST,
        request_id=7,
    ),
    Case(
        "origin-foreign",
        _post(initialize_body(), legacy_headers(Origin="http://evil.example")),
        403,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "origin-foreign-port-lookalike",
        _post(initialize_body(), legacy_headers(Origin="http://localhost.evil.example:80")),
        403,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "origin-foreign-modern",
        _post(modern_body("tools/list"), modern_headers("tools/list", Origin="https://evil.example")),
        403,
        INVALID_REQUEST,
        request_id=7,
    ),
    Case(
        "host-foreign",
        _post(initialize_body(), legacy_headers(Host="evil.example:8765")),
        421,
        INVALID_REQUEST,
        request_id=1,
    ),
    Case(
        "host-foreign-modern",
        _post(modern_body("tools/list"), modern_headers("tools/list", Host="evil.example")),
        421,
        INVALID_REQUEST,
        request_id=7,
    ),
    Case(
        "body-too-large",
        _post({**PING, "params": {"pad": BIG_PAD}}, legacy_headers()),
        413,
        INVALID_REQUEST,
        request_id=5,
    ),
    Case(
        "body-too-large-modern",
        _post(modern_body("tools/list", {"pad": BIG_PAD}), modern_headers("tools/list")),
        413,
        INVALID_REQUEST,
        request_id=7,
    ),
    # -- legacy sessions
    Case("legacy-request-before-initialize", _post(TOOLS_LIST, legacy_headers()), 400, INVALID_REQUEST, 6),
    Case(
        "legacy-request-without-session-after-version-header",
        _post(TOOLS_LIST, legacy_headers(**{"MCP-Protocol-Version": LEGACY})),
        400,
        INVALID_REQUEST,
        6,
    ),
    Case(
        "legacy-unknown-session",
        _post(TOOLS_LIST, legacy_headers("0123456789abcdef0123456789abcdef")),
        404,
        INVALID_REQUEST,
        6,
    ),
    Case("legacy-deleted-session", _deleted_session, 404, INVALID_REQUEST, 3),
    Case(
        "legacy-get-unknown-session",
        lambda ctx: ctx.send(
            "GET",
            None,
            {"Accept": "text/event-stream", "Mcp-Session-Id": "nope-nope-nope", "MCP-Protocol-Version": LEGACY},
        ),
        404,
        INVALID_REQUEST,
    ),
    Case(
        "legacy-response-matching-nothing",
        _with_session(
            lambda sid: ("POST", dumps({"jsonrpc": "2.0", "id": "no-such-request", "result": {}}), legacy_headers(sid))
        ),
        400,
        INVALID_REQUEST,
        "no-such-request",
    ),
    Case(
        "legacy-error-response-matching-nothing",
        _with_session(
            lambda sid: (
                "POST",
                dumps({"jsonrpc": "2.0", "id": 424242, "error": {"code": -1, "message": "x"}}),
                legacy_headers(sid),
            )
        ),
        400,
        INVALID_REQUEST,
        424242,
    ),
    Case(
        "legacy-get-without-session",
        lambda ctx: ctx.send("GET", None, {"Accept": "text/event-stream"}),
        400,
        INVALID_REQUEST,
    ),
    # -- modern envelope and headers
    Case(
        "modern-no-meta",
        _post({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}, modern_headers("tools/list")),
        400,
        INVALID_PARAMS,
        7,
    ),
    Case(
        "modern-no-params",
        _post({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}, modern_headers("tools/list")),
        400,
        INVALID_PARAMS,
        7,
    ),
    Case(
        "modern-meta-without-capabilities",
        _post(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/list",
                "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}},
            },
            modern_headers("tools/list"),
        ),
        400,
        INVALID_PARAMS,
        7,
    ),
    Case(
        "modern-version-header-mismatch",
        _post(modern_body("tools/list", version="2099-01-01"), modern_headers("tools/list")),
        400,
        HEADER_MISMATCH,
        7,
    ),
    Case(
        "modern-method-header-mismatch",
        _post(modern_body("tools/list"), modern_headers("prompts/list")),
        400,
        HEADER_MISMATCH,
        7,
    ),
    Case(
        "modern-method-header-missing",
        _post(
            modern_body("tools/list"),
            {"Accept": ACCEPT, "Content-Type": "application/json", "MCP-Protocol-Version": MODERN},
        ),
        400,
        HEADER_MISMATCH,
        7,
    ),
    Case(
        "modern-name-header-mismatch",
        _post(
            modern_body("tools/call", {"name": "echo", "arguments": {"text": "hi"}}),
            modern_headers("tools/call", name="slow_build"),
        ),
        400,
        HEADER_MISMATCH,
        7,
    ),
    Case(
        "modern-name-header-missing",
        _post(modern_body("tools/call", {"name": "echo", "arguments": {"text": "hi"}}), modern_headers("tools/call")),
        400,
        HEADER_MISMATCH,
        7,
    ),
    Case(
        "modern-unsupported-version",
        _post(modern_body("tools/list", version="2099-01-01"), modern_headers("tools/list", version="2099-01-01")),
        400,
        UNSUPPORTED_VERSION,
        7,
        check=_unsupported_version_data,
    ),
    Case(
        "modern-get",
        lambda ctx: ctx.send("GET", None, {"Accept": "text/event-stream", "MCP-Protocol-Version": MODERN}),
        405,
        None,
        check=_allow_post,
    ),
    Case(
        "modern-delete",
        lambda ctx: ctx.send("DELETE", None, {"MCP-Protocol-Version": MODERN}),
        405,
        None,
        check=_allow_post,
    ),
]


def assert_answer(case: Case, answer: Answer) -> None:
    where = f"{case.name}: HTTP {answer.status} {answer.content_type!r} {answer.body[:500]!r}"
    assert answer.status == case.status, where
    message: Json | None = None
    if case.code is not None:
        assert answer.content_type.split(";")[0].strip() == "application/json", where
        message = json.loads(answer.body)
        assert isinstance(message, dict), where
        assert message.get("jsonrpc") == "2.0", where
        assert "result" not in message, where
        assert "id" in message and message["id"] in (None, case.request_id), where
        error = message.get("error")
        assert isinstance(error, dict), where
        assert error.get("code") == case.code, where
        assert isinstance(error.get("message"), str) and error["message"], where
    if case.check is not None:
        case.check(answer, message)


# -------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=["stdio", "http"])
def upstream(request: pytest.FixtureRequest) -> Iterator[Json]:
    """start_gateway() keyword arguments for each upstream transport."""
    if request.param == "stdio":
        yield {"upstream_cmd": EXAMPLE_SERVER}
    else:
        yield {"upstream_url": request.getfixturevalue("example_http_url")}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(upstream: Json) -> AsyncIterator[RunningGateway]:
    """One gateway per upstream transport, shared by every case (it has to survive them all)."""
    async with start_gateway(**upstream) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def ctx(gw: RunningGateway) -> AsyncIterator[Ctx]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        yield Ctx(http, gw)


# ----------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_bad_input_gets_documented_error(ctx: Ctx, case: Case) -> None:
    assert_answer(case, await case.send(ctx))


@pytest.mark.parametrize(
    "headers",
    [
        {"Accept": "*/*", "Content-Type": "application/json"},
        {"Accept": "application/json, text/event-stream", "Content-Type": "application/json; charset=utf-8"},
        {"Accept": ACCEPT, "Content-Type": "application/json", "Origin": "http://localhost:6274"},
        {"Accept": ACCEPT, "Content-Type": "application/json", "Origin": "http://127.0.0.1:3000"},
        {"Accept": ACCEPT, "Content-Type": "application/json", "Host": "localhost:1234"},
    ],
    ids=["accept-star", "content-type-charset", "origin-localhost", "origin-loopback", "host-localhost"],
)
async def test_allowed_variants_pass(ctx: Ctx, headers: dict[str, str]) -> None:
    """The checks are not over-eager: what the contract allows gets through to a normal initialize."""
    answer = await ctx.send("POST", dumps(initialize_body()), headers)
    assert answer.status == 200, f"HTTP {answer.status} {answer.body[:500]!r}"
    session_id = answer.headers.get("Mcp-Session-Id")
    assert session_id, answer.headers
    assert (await ctx.send("DELETE", None, legacy_headers(session_id))).status < 300


async def test_gateway_survives_all_bad_input(ctx: Ctx) -> None:
    """Replay the whole table on one gateway, then it is healthy, serves a real client and logged no traceback."""
    failures = []
    for case in CASES:
        try:
            assert_answer(case, await case.send(ctx))
        except AssertionError as exc:
            failures.append(f"{case.name}: {exc}")
    assert ctx.gw.proc.returncode is None, f"the gateway exited:\n{ctx.gw.output_text()}"

    async with ctx.http.get(f"{ctx.gw.base}/healthz") as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers.get("Content-Type", "").startswith("application/json")
        await resp.json()

    # A normal legacy session still works end to end, raw ...
    session_id = await open_legacy_session(ctx.http, ctx.url)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "ok"}}}
    async with ctx.http.post(ctx.url, data=dumps(call), headers=legacy_headers(session_id)) as resp:
        assert resp.status == 200, await resp.text()
        messages = await read_messages(resp)
    final = [m for m in messages if m.get("id") == 2]
    assert final and final[0]["result"]["content"][0]["text"] == "ok", messages
    assert (await ctx.send("DELETE", None, legacy_headers(session_id))).status < 300

    # ... and with the SDK client.
    async with Client(ctx.url, mode="legacy", cache=None, read_timeout_seconds=30) as client:
        result = await client.call_tool("echo", {"text": "still serving"})
        assert not result.is_error
        assert result.content[0].text == "still serving"  # type: ignore[union-attr]

    assert not failures, "\n".join(failures)
    output = ctx.gw.output_text()
    assert "Traceback" not in output, output
