"""A raw-protocol MCP client for tests: exact requests, and every message of a response in order.

`Client` speaks either era to one gateway URL over an `aiohttp.ClientSession` and adds only the
transport boilerplate (headers, the legacy session id, the 2026-07-28 `_meta` envelope); the body of
each request is the test's. `open()` returns a `Reply` that is read incrementally (`next()`), so a
test can take N messages and then drop the connection; `request()` reads a reply to its end.
SSE is parsed with the gateway's own `SseParser`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import itertools
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gateway.protocol.sse import SseParser

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
ACCEPT = "application/json, text/event-stream"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
RECORDED_AT = "io.github.mcp-task-gateway/recordedAt"

Message = dict[str, Any]

# Which param `Mcp-Name` mirrors on the 2026-07-28 path.
_NAME_PARAM = {
    "tools/call": "name",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
    "tasks/stream": "taskId",
}


def envelope(*, tasks: bool = True) -> dict[str, Any]:
    """The 2026-07-28 `_meta` envelope; `tasks` declares the tasks extension."""
    extensions: dict[str, Any] = {TASKS_EXTENSION: {}} if tasks else {}
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
    }


class Reply:
    """One HTTP response: status, headers, and its JSON-RPC messages, read as they arrive."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.status = response.status
        self.headers = response.headers
        self.messages: list[Message] = []
        """Every message returned by `next()` so far, in order."""
        self.is_sse = response.headers.get("Content-Type", "").startswith("text/event-stream")
        self._parser = SseParser()
        self._pending: collections.deque[Message] = collections.deque()
        self._eof = False
        self.cut = False
        """True when the server dropped the connection before the response ended cleanly."""

    async def next(self) -> Message | None:
        """The next JSON-RPC message, or None once the response has ended."""
        while not self._pending and not self._eof:
            if not self.is_sse:
                body = await self.response.read()
                self._eof = True
                if body.strip():
                    self._pending.append(orjson.loads(body))
                break
            try:
                chunk = await self.response.content.readany()
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                self.cut = True
                chunk = b""
            if not chunk:
                self._eof = True
                break
            self._pending.extend(orjson.loads(event.data) for event in self._parser.feed(chunk) if event.data)
        if not self._pending:
            return None
        message = self._pending.popleft()
        self.messages.append(message)
        return message

    async def rest(self) -> Reply:
        """Read to the end of the response."""
        while await self.next() is not None:
            pass
        return self

    @property
    def complete(self) -> bool:
        """Whether the JSON-RPC response (the last message) has arrived."""
        last = self.messages[-1] if self.messages else {}
        return "id" in last and "method" not in last

    @property
    def final(self) -> Message:
        """The JSON-RPC response (the last message); fails the test if there is none."""
        assert self.messages and "id" in self.messages[-1] and "method" not in self.messages[-1], self.messages
        return self.messages[-1]

    @property
    def notifications(self) -> list[Message]:
        return [message for message in self.messages if "method" in message and "id" not in message]

    def close(self) -> None:
        """Drop the connection (a stream's client going away)."""
        self.response.close()


class Client:
    """One MCP client of one era. Legacy clients call `initialize()` first (it opens a session)."""

    def __init__(self, http: aiohttp.ClientSession, url: str, era: str = LEGACY, *, tasks: bool = True) -> None:
        self.http = http
        self.url = url
        self.era = era
        self.tasks = tasks
        self.session_id: str | None = None
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def via(self, http: aiohttp.ClientSession) -> Client:
        """This client (same session id, same request ids) over another aiohttp session."""
        other = Client(http, self.url, self.era, tasks=self.tasks)
        other.session_id, other._ids = self.session_id, self._ids
        return other

    async def initialize(self, capabilities: dict[str, Any] | None = None) -> Message:
        assert self.era == LEGACY
        params = {
            "protocolVersion": LEGACY,
            "capabilities": capabilities or {},
            "clientInfo": {"name": "wire", "version": "0"},
        }
        reply = await self.request("initialize", params)
        assert reply.status == 200 and "Mcp-Session-Id" in reply.headers, (reply.status, reply.messages)
        self.session_id = reply.headers["Mcp-Session-Id"]
        await self.notify("notifications/initialized")
        return reply.final

    def headers(self, message: Message) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        if self.era == LEGACY:
            if self.session_id is not None:
                headers |= {"Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": LEGACY}
            return headers
        headers |= {"MCP-Protocol-Version": MODERN, "Mcp-Method": message["method"]}
        name = message.get("params", {}).get(_NAME_PARAM.get(message["method"], ""))
        if isinstance(name, str):  # values that are not plain ASCII travel base64-encoded
            headers["Mcp-Name"] = name if name.isascii() else f"=?base64?{base64.b64encode(name.encode()).decode()}?="
        return headers

    def message(self, method: str, params: dict[str, Any] | None = None, request_id: Any = None) -> Message:
        """A request with the next id (or `request_id`); `notifications/*` methods get no id."""
        message: Message = {"jsonrpc": "2.0", "method": method}
        if not method.startswith("notifications/"):
            message["id"] = self.next_id() if request_id is None else request_id
        params = dict(params or {})
        if self.era == MODERN:
            params["_meta"] = {**envelope(tasks=self.tasks), **params.get("_meta", {})}
        if params:
            message["params"] = params
        return message

    async def send(self, message: Message, headers: dict[str, str | None] | None = None) -> Reply:
        """POST `message` as it is; `headers` override the computed ones (None values remove one)."""
        merged: dict[str, str | None] = {**self.headers(message), **(headers or {})}
        sent = {name: value for name, value in merged.items() if value is not None}
        return Reply(await self.http.post(self.url, data=orjson.dumps(message), headers=sent))

    async def open(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Reply:
        """Send a request and return its reply unread (read it with `next()`, drop it with `close()`)."""
        headers = kw.pop("headers", None)
        return await self.send(self.message(method, params, **kw), headers)

    async def request(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Reply:
        reply = await self.open(method, params, **kw)
        try:
            return await reply.rest()
        finally:
            reply.close()

    async def result(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """The `result` of a request that must succeed."""
        final = (await self.request(method, params, **kw)).final
        assert "result" in final, final
        result: dict[str, Any] = final["result"]
        return result

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send a notification; the HTTP status (202 when accepted)."""
        reply = await self.send(self.message(method, params))
        await reply.response.read()
        reply.close()
        return reply.status

    async def delete(self) -> int:
        async with self.http.delete(self.url, headers=self.headers({"method": "-"})) as response:
            return response.status


def task_events(messages: list[Message]) -> list[dict[str, Any]]:
    """The params of every `notifications/tasks/event` among `messages`, in order."""
    return [message["params"] for message in messages if message.get("method") == "notifications/tasks/event"]


def seqs(messages: list[Message]) -> list[int]:
    return [event["seq"] for event in task_events(messages)]


def marker_lines(path: Path) -> list[str]:
    """The lines `slow_build(marker=PATH)` wrote so far (started, step i, finished|cancelled)."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


async def wait_for_marker(path: Path, wanted: tuple[str, ...], timeout: float) -> list[str]:
    """Poll the marker until its last line is one of `wanted` or `timeout` s pass; return its lines."""
    deadline = time.monotonic() + timeout
    while True:
        lines = marker_lines(path)
        if (lines and lines[-1] in wanted) or time.monotonic() >= deadline:
            return lines
        await asyncio.sleep(0.05)
