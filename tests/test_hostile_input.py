"""Hostile input against a real gateway: thousands of generated bodies, headers and broken HTTP, both eras.

One gateway (in front of `examples/build_server.py` on stdio) serves the whole module. Hypothesis
(derandomized, so CI sees the same inputs every run) generates random JSON values, valid messages of
both eras with fields the gateway reads replaced by values of the wrong type, random header sets,
bodies that are not UTF-8 or JSON, deep nesting, and mutated raw HTTP requests sent over a socket.
Every answer must come within `DEADLINE_S` and never be a 5xx; an error from the MCP endpoint is a
JSON-RPC error. The last test checks the whole run: enough inputs were sent, the gateway logged no
traceback and nothing at error level, it counted the refusals in /metrics, and an ordinary
`tools/call` still works in both eras. The tests share state and run in file order, as one module.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.protocol.envelope import NAME_PARAM
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.wire import LEGACY, MODERN, Client, envelope

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEADLINE_S = 15.0
"""Longest any one request may take; a request still unanswered then is a hang."""
MAX_BODY_BYTES = 256 * 1024
MAX_JSON_DEPTH = 64
CONFIG = f"""
[server]
max_body_bytes = {MAX_BODY_BYTES}
max_json_depth = {MAX_JSON_DEPTH}

[tasks]
max_tasks_per_owner = 100000
default_ttl_ms = 60000

[logging]
format = "json"
# Longer than the module runs: each reason is logged once, whatever the load.
rejected_log_interval_s = 600
"""
ACCEPT = "application/json, text/event-stream"
JSONRPC_CODES = {-32700, -32600, -32601, -32602, -32603, -32800, -32010, -32020, -32021, -32022}
FUZZ = settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)

sent: Counter[str] = Counter()
"""Inputs sent, by kind, across the module (the last test checks the total)."""


class Target:
    """The module's gateway, an HTTP session to it, and one live legacy session on it."""

    def __init__(self, gw: RunningGateway, http: aiohttp.ClientSession, legacy: Client, task_id: str) -> None:
        self.gw = gw
        self.http = http
        self.legacy = legacy
        self.task_id = task_id
        """A finished legacy hosted task, so task methods also reach their real paths."""

    async def post(self, body: bytes, headers: dict[str, str], kind: str) -> int:
        """POST `body` and check the answer; returns the HTTP status."""
        sent[kind] += 1
        try:
            async with asyncio.timeout(DEADLINE_S):
                async with self.http.post(self.gw.url, data=body, headers=headers) as response:
                    raw = await response.read()
                    status, response_headers = response.status, response.headers
        except TimeoutError:
            pytest.fail(f"no answer within {DEADLINE_S} s to {headers!r} {body[:300]!r}")
        assert status < 500 or (status == 503 and "Retry-After" in response_headers), (status, raw[:500], body[:300])
        if status >= 400:
            content_type = response_headers.get("Content-Type", "")
            assert content_type.startswith("application/json"), (status, content_type, raw[:300])
            error = orjson.loads(raw)["error"]
            assert error["code"] in JSONRPC_CODES and isinstance(error["message"], str) and error["message"], error
            # The one 5xx allowed: a documented ceiling (mutated initializes open sessions and processes).
            assert status != 503 or error["data"]["reason"] == "overloaded", error
        session = response_headers.get("Mcp-Session-Id")
        if session is not None and session != self.legacy.session_id:
            # A mutated message that was still a valid initialize opened a session (and a process): end it.
            async with self.http.delete(self.gw.url, headers={"Mcp-Session-Id": session}) as ended:
                await ended.read()
        return status


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def target() -> AsyncIterator[Target]:
    async with (
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        legacy = Client(http, gw.url, LEGACY)
        await legacy.initialize()
        created = await legacy.result("tools/call", {"name": "echo", "arguments": {"text": "seed"}, "task": {}})
        task_id = created["task"]["taskId"]
        await legacy.result("tasks/result", {"taskId": task_id})
        yield Target(gw, http, legacy, task_id)


# ------------------------------------------------------------------------------------------- strategies

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)

METHODS = [
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "prompts/get",
    "tasks/get",
    "tasks/result",
    "tasks/list",
    "tasks/cancel",
    "tasks/stream",
    "tasks/update",
    "server/discover",
    "initialize",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/initialized",
]


def seed_messages(task_id: str) -> list[dict[str, Any]]:
    """Valid requests and notifications whose fields the mutations replace (ids are set per request)."""
    return [
        {"method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}},
        {"method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}, "task": {"ttl": 5000}}},
        {"method": "tools/call", "params": {"name": "whoami", "arguments": {}, "_meta": {"progressToken": "p"}}},
        {"method": "tools/list", "params": {"cursor": "c"}},
        {"method": "tasks/get", "params": {"taskId": task_id}},
        {"method": "tasks/result", "params": {"taskId": task_id}},
        {"method": "tasks/cancel", "params": {"taskId": task_id}},
        {"method": "tasks/list", "params": {"cursor": "x"}},
        {"method": "tasks/stream", "params": {"taskId": task_id, "after": 0}},
        {"method": "tasks/update", "params": {"taskId": task_id, "inputResponses": {}, "requestState": "s"}},
        {"method": "resources/read", "params": {"uri": "build://logs/latest"}},
        {"method": "prompts/get", "params": {"name": "review_code", "arguments": {"code": "x"}}},
        {"method": "ping"},
        {"method": "server/discover"},
        {"method": "notifications/cancelled", "params": {"requestId": 1, "reason": "r"}},
        {"method": "notifications/progress", "params": {"progressToken": "p", "progress": 1}},
    ]


PATHS: list[tuple[str, ...]] = [
    ("jsonrpc",),
    ("id",),
    ("method",),
    ("params",),
    ("params", "name"),
    ("params", "arguments"),
    ("params", "task"),
    ("params", "task", "ttl"),
    ("params", "_meta"),
    ("params", "_meta", "progressToken"),
    ("params", "_meta", "io.modelcontextprotocol/protocolVersion"),
    ("params", "_meta", "io.modelcontextprotocol/clientCapabilities"),
    ("params", "_meta", "io.modelcontextprotocol/clientCapabilities", "extensions"),
    ("params", "taskId"),
    ("params", "after"),
    ("params", "cursor"),
    ("params", "requestId"),
    ("params", "progressToken"),
    ("params", "inputResponses"),
    ("params", "requestState"),
    ("params", "uri"),
    ("result",),
    ("error",),
]
DELETE = object()


def mutate(message: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    """Set (or with DELETE remove) `path` in `message`, creating objects on the way only where there are
    none (a non-object on the way is left alone: the mutation then has nothing to change)."""
    node: Any = message
    for key in path[:-1]:
        if not isinstance(node, dict):
            return
        node = node.setdefault(key, {})
    if not isinstance(node, dict):
        return
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


@st.composite
def mutated_messages(draw: st.DrawFn, task_id: str, era: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        **orjson.loads(orjson.dumps(draw(st.sampled_from(seed_messages(task_id))))),
    }
    if not message["method"].startswith("notifications/"):
        message["id"] = draw(st.integers(1, 10**6) | st.text(max_size=6))
    if era == MODERN:
        message.setdefault("params", {}).setdefault("_meta", {}).update(envelope())
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        value = draw(st.just(DELETE) | st.sampled_from(METHODS) | json_values)
        mutate(message, path, value)
    return message


def headers_for(message: object, era: str, session_id: str | None) -> dict[str, str]:
    """The headers a correct client would send with `message`."""
    headers = {"Content-Type": "application/json", "Accept": ACCEPT}
    if era == LEGACY:
        if session_id is not None:
            headers |= {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": LEGACY}
        return headers
    headers["MCP-Protocol-Version"] = MODERN
    if isinstance(message, dict):
        method, params = message.get("method"), message.get("params")
        if isinstance(method, str) and method.isascii() and method.isprintable():
            headers["Mcp-Method"] = method
        name_param = NAME_PARAM.get(method) if isinstance(method, str) else None
        name = params.get(name_param) if isinstance(params, dict) and name_param else None
        if isinstance(name, str | int) and str(name).isascii() and str(name).isprintable():
            headers["Mcp-Name"] = str(name)
    return headers


HEADER_NAMES = [
    "MCP-Protocol-Version",
    "Mcp-Session-Id",
    "Mcp-Method",
    "Mcp-Name",
    "Mcp-Param-Region",
    "Content-Type",
    "Accept",
    "Origin",
    "Host",
    "Last-Event-ID",
]
HEADER_VALUES = st.sampled_from(
    [LEGACY, MODERN, "2024-11-05", "2099-01-01", "", "tools/call", "echo", "application/json", "*/*", ACCEPT]
)
header_sets = st.dictionaries(st.sampled_from(HEADER_NAMES), HEADER_VALUES | header_text, max_size=6)


# ------------------------------------------------------------------------------------- JSON bodies


@settings(FUZZ, max_examples=350)
@given(value=json_values, era=st.sampled_from([LEGACY, MODERN]))
async def test_random_json_values(target: Target, value: object, era: str) -> None:
    await target.post(orjson.dumps(value), headers_for(value, era, target.legacy.session_id), "json")


@settings(FUZZ, max_examples=550)
@given(data=st.data())
async def test_mutated_legacy_messages_on_a_real_session(target: Target, data: st.DataObject) -> None:
    message = data.draw(mutated_messages(target.task_id, LEGACY))
    await target.post(orjson.dumps(message), headers_for(message, LEGACY, target.legacy.session_id), "legacy")


@settings(FUZZ, max_examples=450)
@given(data=st.data())
async def test_mutated_modern_messages(target: Target, data: st.DataObject) -> None:
    message = data.draw(mutated_messages(target.task_id, MODERN))
    await target.post(orjson.dumps(message), headers_for(message, MODERN, None), "modern")


@settings(FUZZ, max_examples=300)
@given(data=st.data(), era=st.sampled_from([LEGACY, MODERN]), overrides=header_sets)
async def test_hostile_header_sets(target: Target, data: st.DataObject, era: str, overrides: dict[str, str]) -> None:
    message = data.draw(mutated_messages(target.task_id, era))
    headers = {**headers_for(message, era, target.legacy.session_id), **overrides}
    await target.post(orjson.dumps(message), headers, "headers")


@settings(FUZZ, max_examples=200)
@given(
    raw=st.binary(max_size=200)
    | st.builds(lambda head, tail: head + tail, st.just(b'{"jsonrpc":"2.0","id":1,"method":"'), st.binary(max_size=40))
    | st.builds(lambda text: b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"' + text + b'"}}', st.binary()),
    era=st.sampled_from([LEGACY, MODERN]),
)
async def test_bodies_that_are_not_utf8_or_json(target: Target, raw: bytes, era: str) -> None:
    # Random bytes, NUL bytes, bad UTF-8, control characters inside strings, truncated messages.
    headers = headers_for({"method": "ping"}, era, target.legacy.session_id)
    await target.post(raw, headers, "bytes")


@pytest.mark.parametrize("era", [LEGACY, MODERN])
@pytest.mark.parametrize("levels", [30, 60, 62, 100, 200, 250, 252, 500, 1020, 1022, 1030, 20_000])
async def test_deep_nesting_is_refused_up_front(target: Target, era: str, levels: int) -> None:
    # params.arguments.text sits at depth 3: a value `levels` deep takes the message to levels + 3.
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    message["params"] = {"name": "echo", "arguments": {"text": "DEEP"}}
    if era == MODERN:
        message["params"]["_meta"] = envelope()
    # Built as text: beyond 1,024 levels orjson can neither write nor read it.
    deep = b'{"k":[' * (levels // 2) + b"1" + b"]}" * (levels // 2)
    body = orjson.dumps(message).replace(b'"DEEP"', deep)
    status = await target.post(body, headers_for(message, era, target.legacy.session_id), "deep")
    if levels + 3 <= MAX_JSON_DEPTH:
        assert status == 200
    else:
        assert status == 400


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_huge_strings_near_the_body_limit(target: Target, era: str) -> None:
    for size, status in ((MAX_BODY_BYTES - 400, 200), (MAX_BODY_BYTES + 1, 413)):
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": 8, "method": "tools/call"}
        message["params"] = {"name": "echo", "arguments": {"text": ""}}
        if era == MODERN:
            message["params"]["_meta"] = envelope()
        pad = size - len(orjson.dumps(message))
        message["params"]["arguments"]["text"] = "\u00e9" * (pad // 2) + "x" * (pad % 2)
        body = orjson.dumps(message)
        assert abs(len(body) - size) <= 1
        assert await target.post(body, headers_for(message, era, target.legacy.session_id), "huge") == status


# ------------------------------------------------------------------------------------------ raw HTTP


def request_bytes(port: int, body: bytes) -> bytes:
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: {ACCEPT}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


async def send_raw(target: Target, data: bytes, *, half_close: bool) -> None:
    """Send bytes on a fresh connection; the server must answer without a 5xx and close once we are done."""
    sent["raw"] += 1
    port = int(target.gw.base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(0.3 if not half_close else DEADLINE_S):
                while chunk := await reader.read(65536):
                    received += chunk
        if not reader.at_eof():
            # The server may rightly wait for the rest of a request; once we end ours it must close.
            with contextlib.suppress(ConnectionError):
                writer.write_eof()
            try:
                async with asyncio.timeout(DEADLINE_S):
                    while chunk := await reader.read(65536):
                        received += chunk
            except ConnectionError:
                pass
            except TimeoutError:
                pytest.fail(f"the connection stayed open {DEADLINE_S} s after the client ended it: {data[:300]!r}")
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    statuses = [int(code) for code in STATUS_LINE.findall(received)]
    assert all(status < 500 for status in statuses), (statuses, received[:500], data[:300])


def framing_cases(port: int) -> list[bytes]:
    host = f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: {ACCEPT}\r\n".encode()
    post = b"POST /mcp HTTP/1.1\r\n" + host
    return [
        b"GARBAGE\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(64)),  # a TLS ClientHello
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        post + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        post + b"Transfer-Encoding: chunked\r\n\r\n5;x=\x00\r\nabcde\r\n0\r\n\r\n",
        post + b"Transfer-Encoding: chunked\r\n\r\n100\r\nabc",
        post + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n",
        post + b"Content-Length: 10\r\n\r\n" + PING,
        post + b"Content-Length: 100\r\n\r\n" + PING,
        post + b"Content-Length: abc\r\n\r\n" + PING,
        post + b"Content-Length: -1\r\n\r\n" + PING,
        post + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n" + PING,
        post + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + PING,
        b"POST /mcp HTTP/1.1\r\nHo st: x\r\n\r\n",
        b"POST /mcp HTTP/1.1\r\n" + host + b"X-Bad: \xff\xfe\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /mcp HTTP/1.1\r\n" + host + b"Mcp-Session-Id: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
        b"POST /mcp HTTP/1.1\r\n" + host + b"X-Long: " + b"a" * 100_000 + b"\r\n\r\n",
        b"POST /mcp HTTP/9.9\r\n" + host + b"Content-Length: 2\r\n\r\n{}",
        b"POST /mcp\r\n\r\n",
        request_bytes(port, PING) + b"\x00\x01garbage after a complete request\r\n\r\n",
    ]


@pytest.mark.parametrize("half_close", [False, True])
async def test_framing_errors_on_a_raw_socket(target: Target, half_close: bool) -> None:
    port = int(target.gw.base.rsplit(":", 1)[1])
    for data in framing_cases(port):
        await send_raw(target, data, half_close=half_close)


@settings(FUZZ, max_examples=150)
@given(
    edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 8), st.binary(max_size=8)), min_size=1, max_size=4),
    half_close=st.booleans(),
)
async def test_mutated_raw_requests(target: Target, edits: list[tuple[int, int, bytes]], half_close: bool) -> None:
    port = int(target.gw.base.rsplit(":", 1)[1])
    data = request_bytes(port, PING)
    for at, remove, insert in edits:
        at = at % (len(data) + 1)
        data = data[:at] + insert + data[at + remove :]
    await send_raw(target, data, half_close=half_close)


# ----------------------------------------------------------------------------------------- the whole run


async def test_the_gateway_came_through(target: Target) -> None:
    total = sum(sent.values())
    assert total >= 2000, sent

    # An ordinary call still works, in both eras.
    legacy = await target.legacy.result("tools/call", {"name": "echo", "arguments": {"text": "still here"}})
    assert legacy["content"][0]["text"] == "still here", legacy
    modern = await Client(target.http, target.gw.url, MODERN).result(
        "tools/call", {"name": "echo", "arguments": {"text": "still here"}}
    )
    assert modern["content"][0]["text"] == "still here", modern

    # Refusals were counted by reason, and logged quietly: no traceback, nothing at error level, and at
    # most one line per reason (the run is shorter than the default one-minute interval).
    async with target.http.get(f"{target.gw.base}/metrics") as response:
        metrics = await response.text()
    reasons = dict(re.findall(r'mcp_gateway_rejected_requests_total\{reason="(\w+)"\} (\S+)', metrics))
    assert {"framing", "parse_error", "invalid_request", "header_mismatch", "body_too_large"} <= reasons.keys(), reasons
    records = [orjson.loads(line) for line in target.gw.output if line.startswith("{")]
    # The upstream's stderr is relayed line by line; its own tracebacks (a prompt given bad arguments)
    # are not the gateway's.
    own = [r for r in records if not (r["logger"] == "gateway.upstream.stdio" and r["msg"].startswith("upstream: "))]
    tracebacks = [r for r in own if "Traceback" in r["msg"] or "exc" in r]
    tracebacks += [line for line in target.gw.output if not line.startswith("{") and "Traceback" in line]
    assert not tracebacks, tracebacks[:5]
    errors = [r for r in own if r["level"] in ("error", "critical")]
    assert not errors, errors[:10]
    refusal_lines = Counter(r["reason"] for r in own if r["logger"] == "gateway.edge.rejected")
    assert refusal_lines and max(refusal_lines.values()) == 1, refusal_lines
