"""`GatewayClient`: JSON-RPC over Streamable HTTP in either era, and the SEP-2694 task event stream.

It owns the client side of the wire: the legacy session (initialize, `Mcp-Session-Id`, renewed when
the server forgets it, DELETE on exit), the modern per-request envelope and headers, reading JSON or
SSE responses, `tasks/stream` as an async iterator (`TaskStream`), and `follow`, the resilient consumer
that reconnects, resumes after the last processed seq, de-duplicates and never skips silently.

It must not know the gateway's internals: it speaks the protocol to any endpoint that serves it, and
uses only the sans-I/O SSE parser and protocol constants from this package.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from gateway import __version__
from gateway.protocol.dialect import TASK_EVENT, dialect_of
from gateway.protocol.envelope import NAME_PARAM
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, TASKS_EXTENSION, Era
from gateway.protocol.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, REQUEST_CANCELLED
from gateway.protocol.names import RECORDED_AT_KEY, SESSION_HEADER
from gateway.protocol.sse import SseError, SseParser

Message = dict[str, Any]
OnEvent = Callable[[Message], Awaitable[None] | None]
OnMessage = Callable[[Message], Awaitable[None] | None]
OnReconnect = Callable[[int, int | None, BaseException], None]
"""`on_reconnect(attempt, resume_after, reason)`: called before each reconnect of `follow`."""
OnInput = Callable[[str, Message], Awaitable[Message]]
"""`on_input(method, params)`: the client's answer (a result object) to what a server asks of it: a
2025-11-25 server request (`elicitation/create`...), an input request of a 2026-07-28 round (MRTR) or
of a task in `input_required`. Raise JsonRpcError to answer a server request with that error."""

MAX_INPUT_ROUNDS = 32
"""Bound on the 2026-07-28 input rounds of one call (the gateway's own bound for a task's)."""
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


def recorded_at(event: Mapping[str, Any]) -> datetime | None:
    """When the server recorded `event` (a `notifications/tasks/event`'s params), as an aware UTC datetime.

    mcp-task-gateway puts it in `_meta["io.github.mcp-task-gateway/recordedAt"]` ("2026-12-01T09:43:00.123Z",
    never decreasing within a task); None when the event has none (another SEP-2694 server) or it does
    not parse, so a replayed event's time is never confused with when it arrived."""
    meta = event.get("_meta")
    value = meta.get(RECORDED_AT_KEY) if isinstance(meta, Mapping) else None
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


# -- errors ---------------------------------------------------------------------------------------


class GatewayError(Exception):
    """Anything this client raises on purpose."""


class JsonRpcError(GatewayError):
    """The server answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None, *, http_status: int | None = None) -> None:
        super().__init__(f"{message} (JSON-RPC {code})")
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status


class EventsGone(JsonRpcError):
    """`tasks/stream` could not resume gap-free: events after the cursor were dropped by retention.

    Resume from `earliest_seq - 1` to accept the gap, or treat it as fatal; the client never decides."""

    def __init__(
        self, code: int, message: str, data: dict[str, Any], *, http_status: int | None = None, task_id: str
    ) -> None:
        super().__init__(code, message, data, http_status=http_status)
        self.task_id = str(data.get("taskId", task_id))
        earliest = data.get("earliestSeq")
        self.earliest_seq: int | None = (
            earliest if isinstance(earliest, int) and not isinstance(earliest, bool) else None
        )


class TransportError(GatewayError, ConnectionError):
    """The request did not get a JSON-RPC answer: connection refused or reset, timeout, bad HTTP reply."""


class EndpointNotFound(TransportError):
    """The URL's path answered HTTP 404 with no JSON-RPC in it: something listens there, but not an MCP
    endpoint. `suggestion` is the URL the endpoint probably has (`…/mcp`), or None."""

    def __init__(self, url: str) -> None:
        self.suggestion = suggest_endpoint(url)
        hint = f"; did you mean {self.suggestion}?" if self.suggestion else ""
        super().__init__(f"HTTP 404 from {url}: no MCP endpoint at this path{hint}")


def suggest_endpoint(url: str) -> str | None:
    """`url` with `/mcp` as its path's last segment (the gateway's and the SDKs' default), unless it has it."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/mcp"):
        return None
    return urlunsplit(parts._replace(path=path + "/mcp", query="", fragment=""))


class StreamDropped(TransportError):
    """A response stream ended (or was cut) before its JSON-RPC response arrived."""


class StreamGap(GatewayError):
    """The server delivered a seq other than the next one after the cursor (it must send events_gone)."""

    def __init__(self, task_id: str, expected: int, got: int) -> None:
        super().__init__(f"task {task_id}: expected event seq {expected}, got {got}; the stream skipped events")
        self.task_id = task_id
        self.expected = expected
        self.got = got


def error_from(error: object, *, http_status: int | None = None, task_id: str = "") -> JsonRpcError:
    """The exception for a JSON-RPC `error` member; events_gone is recognised by `data.reason` alone."""
    if not isinstance(error, dict):
        return JsonRpcError(-32603, f"malformed JSON-RPC error: {error!r}", http_status=http_status)
    code = error.get("code")
    code = code if isinstance(code, int) else -32603
    message = str(error.get("message", "error"))
    data = error.get("data")
    if isinstance(data, dict) and data.get("reason") == "events_gone":
        return EventsGone(code, message, data, http_status=http_status, task_id=task_id)
    return JsonRpcError(code, message, data, http_status=http_status)


def header_value(value: object) -> str:
    """A header value as the 2026 transport wants it: plain ASCII as is, anything else base64-wrapped."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable() and text == text.strip():
        return text
    return "=?base64?" + base64.b64encode(text.encode()).decode() + "?="


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if inspect.isawaitable(value):
        await value


@dataclass
class _Cursor:
    """Where `follow` is in a task's events: the last processed seq, and whether the current stream
    moved it (progress resets the reconnect count)."""

    last: int | None
    progressed: bool = False


# -- the client -----------------------------------------------------------------------------------


class GatewayClient:
    """A JSON-RPC client for one MCP endpoint, in the legacy (2025-11-25) or modern (2026-07-28) era.

    Use it as an async context manager: in legacy it opens a session on enter (renewing it whenever
    the server answers 404 for it) and deletes it on exit. Safe to use from several asyncio tasks.

    `capabilities` are the client capabilities it declares (legacy: in initialize; modern: in each
    request's envelope, beside the tasks extension), e.g. `{"elicitation": {"form": {}}}`; `on_input`
    answers what the server asks (`OnInput`). Without `on_input`, server requests get -32601 and a
    2026-07-28 `input_required` round is returned to the caller as it is.
    """

    def __init__(
        self,
        url: str,
        *,
        era: Era = Era.LEGACY,
        headers: Mapping[str, str] | None = None,
        session: aiohttp.ClientSession | None = None,
        idle_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        capabilities: Mapping[str, Any] | None = None,
        on_input: OnInput | None = None,
    ) -> None:
        if not isinstance(era, Era):
            raise TypeError(f"era must be an Era (Era.parse reads 'legacy' or 'modern'), not {era!r}")
        self.url = url
        self.era = era
        self._dialect = dialect_of(era)
        self._extra_headers = dict(headers or {})
        self._capabilities = dict(capabilities or {})
        self._on_input = on_input
        self._http = session
        self._own_http = session is None
        # sock_read bounds silence, not duration: the server sends keep-alive comments on idle streams.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=idle_timeout)
        self._ids = itertools.count(1)
        self._session_id: str | None = None
        self._session_lock = asyncio.Lock()
        self.initialize_result: dict[str, Any] | None = None
        """The legacy server's initialize result (capabilities, serverInfo), once connected."""

    async def __aenter__(self) -> GatewayClient:
        try:
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def session_id(self) -> str | None:
        """The legacy `Mcp-Session-Id` (None in modern, or before `connect`)."""
        return self._session_id

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    async def connect(self) -> None:
        """Legacy: open a session (initialize, then notifications/initialized). Modern: nothing to do."""
        self._client()
        if self.era.has_sessions and self._session_id is None:
            await self._renew_session(None)

    async def close(self) -> None:
        """Legacy: end the session (DELETE), best effort. Closes the HTTP session if this client made it."""
        session_id, self._session_id = self._session_id, None
        if session_id is not None and self._http is not None and not self._http.closed:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with self._http.delete(
                    self.url,
                    headers={**self._extra_headers, SESSION_HEADER: session_id, "MCP-Protocol-Version": self.era.value},
                    timeout=aiohttp.ClientTimeout(total=5),
                ):
                    pass
        if self._own_http and self._http is not None:
            await self._http.close()
            self._http = None

    def next_id(self) -> int:
        return next(self._ids)

    # -- the legacy session -----------------------------------------------------------------------

    async def _initialize(self) -> None:
        message = {
            "jsonrpc": "2.0",
            "id": self.next_id(),
            "method": "initialize",
            "params": {
                "protocolVersion": self.era.value,
                "capabilities": self._capabilities,
                "clientInfo": {"name": "mcp-task-gateway-client", "version": __version__},
            },
        }
        headers = self._base_headers()
        try:
            response = await self._client().post(
                self.url, data=orjson.dumps(message), headers=headers, timeout=self._timeout
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransportError(f"cannot reach {self.url}: {exc or type(exc).__name__}") from exc
        final = await self._final(response, message["id"], None)
        if "error" in final:
            raise error_from(final["error"], http_status=response.status)
        session_id = response.headers.get(SESSION_HEADER)
        if not session_id:
            raise TransportError(f"{self.url} answered initialize without an {SESSION_HEADER} header")
        self._session_id = session_id
        result = final.get("result")
        self.initialize_result = result if isinstance(result, dict) else {}
        # Under the session lock: a 404 here must not try to renew the session again.
        await self._send_only({"jsonrpc": "2.0", "method": "notifications/initialized"}, renew=False)

    async def _renew_session(self, stale: str | None) -> None:
        async with self._session_lock:
            if self._session_id == stale:
                self._session_id = None
                await self._initialize()

    # -- one POST ---------------------------------------------------------------------------------

    def _base_headers(self) -> dict[str, str]:
        return {
            **self._extra_headers,
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }

    def _headers_for(self, message: Message) -> dict[str, str]:
        headers = {**self._base_headers(), "MCP-Protocol-Version": self.era.value}
        if self._session_id is not None:
            headers[SESSION_HEADER] = self._session_id
        method = message.get("method")
        if self.era.has_envelope and isinstance(method, str) and "id" in message:
            headers["Mcp-Method"] = method
            name_param = NAME_PARAM.get(method)
            params = message.get("params")
            if name_param is not None and isinstance(params, dict) and name_param in params:
                headers["Mcp-Name"] = header_value(params[name_param])
        return headers

    def envelope(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """Modern requests carry the protocol version and client capabilities in `params._meta`."""
        body = dict(params or {})
        if self.era.has_envelope:
            meta = {
                PROTOCOL_VERSION_KEY: self.era.value,
                CLIENT_CAPABILITIES_KEY: {"extensions": {TASKS_EXTENSION: {}}, **self._capabilities},
                **(body.get("_meta") or {}),
            }
            body["_meta"] = meta
        return body

    async def post(
        self, message: Message, *, renew: bool = True, headers: Mapping[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """POST `message` as it is (add the modern envelope with `envelope`) with the era's headers,
        `headers` set over them; read the answer with `messages`. In legacy, a 404 for our session opens
        a new one and the POST is sent again (the server refused it before doing anything, so sending
        it again is safe)."""
        if renew and self.era.has_sessions and self._session_id is None:
            await self._renew_session(None)
        for attempt in range(2 if renew else 1):
            session_id = self._session_id
            try:
                response = await self._client().post(
                    self.url,
                    data=orjson.dumps(message),
                    headers={**self._headers_for(message), **(headers or {})},
                    timeout=self._timeout,
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise TransportError(f"cannot reach {self.url}: {exc or type(exc).__name__}") from exc
            # Only a session can be forgotten: an answer about anything else is the caller's.
            if response.status == 404 and session_id is not None and attempt == 0:
                response.close()
                await self._renew_session(session_id)
                continue
            return response
        raise AssertionError("unreachable")

    async def messages(self, response: aiohttp.ClientResponse) -> AsyncIterator[Message]:
        """The JSON-RPC messages of one response, JSON or SSE, as they arrive."""
        content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        try:
            if content_type == "application/json":
                body = await response.read()
                try:
                    message = orjson.loads(body)
                except orjson.JSONDecodeError:
                    raise TransportError(f"HTTP {response.status}: the body is not JSON: {body[:200]!r}") from None
                if isinstance(message, dict):
                    yield message
                return
            if content_type != "text/event-stream":
                if response.status == 404:
                    raise EndpointNotFound(self.url)
                text = (await response.read())[:200].decode(errors="replace")
                raise TransportError(f"HTTP {response.status} {response.reason} ({content_type or 'no body'}): {text}")
            parser = SseParser()
            async for chunk in response.content.iter_any():
                for event in parser.feed(chunk):
                    if event.event != "message" or not event.data:
                        continue
                    try:
                        message = orjson.loads(event.data)
                    except orjson.JSONDecodeError:
                        raise TransportError(f"an SSE event is not JSON: {event.data[:200]!r}") from None
                    if isinstance(message, dict):
                        yield message
        except GatewayError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, SseError) as exc:
            raise StreamDropped(f"the connection dropped mid-response ({type(exc).__name__})") from exc

    async def _final(
        self, response: aiohttp.ClientResponse, request_id: object, on_message: OnMessage | None
    ) -> Message:
        """Read `response` until the JSON-RPC response to `request_id`; pass other messages on."""
        try:
            async for message in self.messages(response):
                if answers(message, request_id):
                    return message
                await self._other(message, on_message)
        finally:
            _close(response)
        raise StreamDropped(f"the response ended before the answer to request {request_id!r}")

    async def _other(self, message: Message, on_message: OnMessage | None) -> None:
        """A message that is not the awaited response: a notification, or a server request to answer."""
        if "method" in message and "id" in message:
            await self._answer(message)
        elif on_message is not None and "method" in message:
            await _maybe_await(on_message(message))

    async def _answer(self, request: Message) -> None:
        """Answer a (legacy) server request with `on_input`'s result; without `on_input`, or when it
        raises JsonRpcError, with an error."""
        if not self.era.has_sessions:
            return
        method = str(request["method"])
        answer: Message = {"jsonrpc": "2.0", "id": request["id"]}
        try:
            if self._on_input is None:
                raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: this client does not serve {method}")
            params = request.get("params")
            answer["result"] = await self._on_input(method, params if isinstance(params, dict) else {})
        except JsonRpcError as exc:
            answer["error"] = {"code": exc.code, "message": exc.message}
        with contextlib.suppress(TransportError):
            await self._send_only(answer)

    async def _send_only(self, message: Message, *, renew: bool = True) -> None:
        response = await self.post(message, renew=renew)
        try:
            if response.status >= 400:
                final = await self._final(response, message.get("id"), None)
                raise error_from(final.get("error"), http_status=response.status)
        finally:
            _close(response)

    # -- JSON-RPC ---------------------------------------------------------------------------------

    async def request(
        self, method: str, params: Mapping[str, Any] | None = None, *, on_message: OnMessage | None = None
    ) -> Message:
        """Send a request and return its JSON-RPC response message (`result` in it).

        Raises JsonRpcError (EventsGone for events_gone) for an error response and TransportError when
        no answer arrives. `on_message` sees the notifications that precede the answer."""
        message = {"jsonrpc": "2.0", "id": self.next_id(), "method": method, "params": self.envelope(params)}
        response = await self.post(message)
        final = await self._final(response, message["id"], on_message)
        if "error" in final:
            raise error_from(final["error"], http_status=response.status, task_id=str((params or {}).get("taskId", "")))
        if not isinstance(final.get("result"), dict):
            raise JsonRpcError(-32603, f"malformed response to {method}: no result object", http_status=response.status)
        return final

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Send a notification (answered 202 with no body)."""
        message: Message = {"jsonrpc": "2.0", "method": method}
        if params is not None or self.era.has_envelope:
            message["params"] = self.envelope(params)
        await self._send_only(message)

    # -- tasks/stream -----------------------------------------------------------------------------

    def stream(self, task_id: str, after: int | None = None, *, on_message: OnMessage | None = None) -> TaskStream:
        """`tasks/stream`: an async iterator over the task's events (each event's `params`), in order.

        Iteration ends when the server sends the empty result; it raises EventsGone when the cursor is
        too old, JsonRpcError for other errors (-32602 for an unknown task or bad `after`) and
        StreamDropped when the connection breaks. Use `async with client.stream(...) as events:` to
        close the stream promptly when you stop early."""
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
            raise ValueError(f"after must be a non-negative integer, not {after!r}")
        return TaskStream(self, task_id, after, on_message)

    async def follow(
        self,
        task_id: str,
        after: int | None = None,
        *,
        on_event: OnEvent,
        max_reconnects: int = 8,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        on_reconnect: OnReconnect | None = None,
    ) -> int | None:
        """Follow a task's events to its end, across dropped connections; return the last processed seq.

        `on_event(params)` (sync or async) is called once per seq, in order; a seq counts as processed
        when it returns. After a drop, the stream is opened again with `after` = the last processed seq
        (a new legacy session if the old one is gone); duplicates are skipped by (taskId, seq). When a
        stream ends, the task is fetched: a terminal task ends `follow`, otherwise it reconnects.
        `max_reconnects` bounds consecutive attempts without progress (delays `backoff`, doubling up to
        `max_backoff`); then the last TransportError is raised. EventsGone for a cursor (`after`, or a
        seq already processed) is raised, never skipped: the caller decides whether to resume from
        `earliest_seq - 1`. Without a cursor the first event may have any seq (the earliest retained).
        StreamGap if the server skips a seq without saying events_gone.
        """
        cursor = _Cursor(after)
        failures = unanchored_gone = 0
        while True:
            cursor.progressed = False
            try:
                await self._deliver(task_id, cursor, on_event)
                status = (await self.get_task(task_id))["result"].get("status")
                if status in TERMINAL_STATUSES:
                    return cursor.last
                reason: BaseException = StreamDropped(f"the stream closed while the task is still {status!r}")
            except TransportError as exc:
                reason = exc
            except EventsGone as exc:
                if cursor.last is not None or unanchored_gone >= 2:
                    raise
                # No cursor yet means "from the earliest retained event": retention moved it while the
                # stream started (a busy task), so ask again; nothing the caller asked for is skipped.
                unanchored_gone += 1
                reason = exc
            except JsonRpcError as exc:
                if not _stream_conflict(exc):
                    raise
                # Our previous stream on this session is not gone yet on the server's side.
                reason = exc
            failures = 1 if cursor.progressed else failures + 1
            if failures > max_reconnects:
                if isinstance(reason, TransportError):
                    raise reason
                raise TransportError(f"gave up on task {task_id} after {max_reconnects} reconnects: {reason}")
            if on_reconnect is not None:
                on_reconnect(failures, cursor.last, reason)
            await asyncio.sleep(min(max_backoff, backoff * 2 ** (failures - 1)))

    async def _deliver(self, task_id: str, cursor: _Cursor, on_event: OnEvent) -> None:
        """One tasks/stream after `cursor.last`: each event not yet processed to `on_event`, in order,
        the cursor moved past it once `on_event` returns."""
        async with self.stream(task_id, after=cursor.last) as events:
            async for event in events:
                seq, last = event["seq"], cursor.last
                if last is not None and seq <= last:
                    continue  # already processed: a replay after reconnecting
                if last is not None and seq != last + 1:
                    raise StreamGap(task_id, last + 1, seq)
                await _maybe_await(on_event(event))
                cursor.last = seq
                cursor.progressed = True

    # -- task helpers -----------------------------------------------------------------------------

    async def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        task: bool = False,
        ttl_ms: int | None = None,
        meta: Mapping[str, Any] | None = None,
        on_message: OnMessage | None = None,
    ) -> dict[str, Any]:
        """`tools/call`; the result object. Legacy with `task=True`: a task-augmented call (CreateTaskResult).

        `meta` goes in `params._meta` (a `progressToken`, a 2026-07-28 log level); `on_message` sees the
        notifications the call's response carries. With `on_input`, a 2026-07-28 `input_required`
        answer is answered and the call retried with `inputResponses` and the echoed `requestState`,
        up to MAX_INPUT_ROUNDS rounds."""
        params: dict[str, Any] = {"name": tool, "arguments": dict(arguments or {})}
        if meta:
            params["_meta"] = dict(meta)
        if task and self.era.client_asks_for_task:
            params["task"] = {} if ttl_ms is None else {"ttl": ttl_ms}
        for _ in range(MAX_INPUT_ROUNDS):
            result: dict[str, Any] = (await self.request("tools/call", params, on_message=on_message))["result"]
            if result.get("resultType") != "input_required" or self._on_input is None:
                return result
            params = {k: v for k, v in params.items() if k not in ("inputResponses", "requestState")}
            requests = result.get("inputRequests")
            if isinstance(requests, dict) and requests:
                params["inputResponses"] = await self.answer_input(requests)
            if "requestState" in result:
                params["requestState"] = result["requestState"]
        raise GatewayError(f"tools/call {tool!r}: still asking for input after {MAX_INPUT_ROUNDS} rounds")

    async def answer_input(self, requests: Mapping[str, Any]) -> dict[str, Any]:
        """A 2026-07-28 `inputRequests` object answered by `on_input`, key by key (`inputResponses`)."""
        assert self._on_input is not None
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                raise GatewayError(f"input request {key!r} is not a request object: {orjson.dumps(request)[:200]!r}")
            params = request.get("params")
            responses[key] = await self._on_input(request["method"], params if isinstance(params, dict) else {})
        return responses

    async def list_tools(self, *, max_pages: int = 1000) -> list[dict[str, Any]]:
        """`tools/list`, every page (following `nextCursor`)."""
        return await self._pages("tools/list", "tools", max_pages)

    async def start_task(
        self, tool: str, arguments: Mapping[str, Any] | None = None, ttl_ms: int | None = None
    ) -> str | None:
        """Start `tool` as a task and return its taskId.

        Legacy: a task-augmented tools/call (an error if no task was created). Modern: the server
        decides; None when it answered with the plain result instead (use `call_tool` to keep it)."""
        result = await self.call_tool(tool, arguments, task=True, ttl_ms=ttl_ms)
        task_id = self.created_task(result)
        if task_id is None and self.era.client_asks_for_task:
            raise GatewayError(f"tools/call {tool!r} did not create a task: {orjson.dumps(result)[:200]!r}")
        return task_id

    def created_task(self, result: Mapping[str, Any]) -> str | None:
        """The taskId a tools/call result created (legacy CreateTaskResult, modern `resultType: "task"`),
        or None when it is the tool's own result."""
        task = self._dialect.created_task({"result": dict(result)})
        return None if task is None else str(task["taskId"])

    async def get_task(self, task_id: str) -> Message:
        """`tasks/get`: the response message; its `result` is the task (modern: with the outcome inlined)."""
        return await self.request("tasks/get", {"taskId": task_id})

    async def cancel_task(self, task_id: str) -> Message:
        return await self.request("tasks/cancel", {"taskId": task_id})

    async def list_tasks(self, *, max_pages: int = 1000) -> list[dict[str, Any]]:
        """`tasks/list`, every page (following `nextCursor`): the caller's tasks. Legacy only: the
        2026-07-28 tasks extension has no tasks/list (a server answers method not found)."""
        return await self._pages("tasks/list", "tasks", max_pages)

    async def _pages(self, method: str, key: str, max_pages: int) -> list[dict[str, Any]]:
        """The objects of a paginated list method's `key`, every page."""
        items: list[dict[str, Any]] = []
        cursor: object = None
        for _ in range(max_pages):
            result = (await self.request(method, None if cursor is None else {"cursor": cursor}))["result"]
            page = result.get(key)
            if isinstance(page, list):
                items.extend(item for item in page if isinstance(item, dict))
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                return items
        raise GatewayError(f"{method}: still more after {max_pages} pages")

    async def task_result(self, task_id: str) -> dict[str, Any]:
        """The task's result once it is terminal (legacy: tasks/result, which blocks; modern: tasks/get
        polled at the task's pollInterval). An error outcome or cancellation raises JsonRpcError.

        With `on_input`, the task's questions are answered meanwhile: legacy server requests on the
        tasks/result stream, modern `inputRequests` of an `input_required` task with tasks/update."""
        if not self._dialect.detailed_views:  # SEP-1686: tasks/result blocks until the outcome
            result: dict[str, Any] = (await self.request("tasks/result", {"taskId": task_id}))["result"]
            return result
        return await self._polled_outcome(task_id)

    async def _polled_outcome(self, task_id: str) -> dict[str, Any]:
        """SEP-2663: tasks/get until the task is terminal (its outcome inlined), answering its input requests."""
        answered: set[str] = set()  # keys are unique over a task's life (the gateway renames reused ones)
        while True:
            task = (await self.get_task(task_id))["result"]
            status = task.get("status")
            requests = task.get("inputRequests")
            if status == "input_required" and self._on_input is not None and isinstance(requests, dict):
                unanswered = {key: request for key, request in requests.items() if key not in answered}
                if unanswered:
                    responses = await self.answer_input(unanswered)
                    await self.request("tasks/update", {"taskId": task_id, "inputResponses": responses})
                    answered.update(responses)
                    continue
            if status in TERMINAL_STATUSES:
                if isinstance(task.get("result"), dict):
                    outcome: dict[str, Any] = task["result"]
                    return outcome
                if "error" in task:
                    raise error_from(task["error"])
                raise JsonRpcError(REQUEST_CANCELLED, f"Task {status}")
            interval = task.get("pollIntervalMs")
            await asyncio.sleep(min(5.0, max(0.1, interval / 1000 if isinstance(interval, int | float) else 1.0)))


class TaskStream:
    """One `tasks/stream` request: iterate it for the events; `async with` closes it when you stop early.

    `last_seq` is the last seq delivered, `result` the final (empty) result once the stream ended
    normally. `aclose()` cancels it the protocol's way (legacy: notifications/cancelled; modern: the
    closed POST); `abort()` just cuts the connection, which is what a network failure looks like.
    """

    def __init__(self, client: GatewayClient, task_id: str, after: int | None, on_message: OnMessage | None) -> None:
        self.client = client
        self.task_id = task_id
        self.after = after
        self.request_id = client.next_id()
        self.last_seq: int | None = None
        self.result: dict[str, Any] | None = None
        self._on_message = on_message
        self._response: aiohttp.ClientResponse | None = None
        self._active = False
        self._gen = self._run()

    def __aiter__(self) -> TaskStream:
        return self

    async def __anext__(self) -> Message:
        return await self._gen.__anext__()

    async def __aenter__(self) -> TaskStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose(cancel=exc_type is not asyncio.CancelledError)

    def abort(self) -> None:
        """Cut the connection without cancelling; the next read raises StreamDropped."""
        response = self._response
        if response is not None:
            response.close()

    async def aclose(self, *, cancel: bool = True) -> None:
        """Stop the stream. If it was still open and `cancel`, tell a legacy server (best effort)."""
        was_active = self._active
        self.abort()
        await self._gen.aclose()
        if cancel and was_active and self.client.era.has_sessions:
            params = {"requestId": self.request_id, "reason": "the client closed the stream"}
            with contextlib.suppress(GatewayError):
                async with asyncio.timeout(5):
                    await self.client.notify("notifications/cancelled", params)

    async def _run(self) -> AsyncGenerator[Message, None]:
        params: dict[str, Any] = {"taskId": self.task_id}
        if self.after is not None:
            params["after"] = self.after
        message = {
            "jsonrpc": "2.0",
            "id": self.request_id,
            "method": "tasks/stream",
            "params": self.client.envelope(params),
        }
        response = await self.client.post(message)
        self._response = response
        self._active = True
        try:
            async for incoming in self.client.messages(response):
                if incoming.get("method") == TASK_EVENT:
                    event = incoming.get("params")
                    if not isinstance(event, dict) or event.get("taskId") != self.task_id:
                        continue
                    seq = event.get("seq")
                    if isinstance(seq, bool) or not isinstance(seq, int):
                        raise StreamDropped(f"an event without an integer seq: {orjson.dumps(event)[:200]!r}")
                    self.last_seq = seq
                    yield event
                elif answers(incoming, self.request_id):
                    self._active = False
                    if "error" in incoming:
                        raise error_from(incoming["error"], http_status=response.status, task_id=self.task_id)
                    result = incoming.get("result")
                    self.result = result if isinstance(result, dict) else {}
                    return
                else:
                    await self.client._other(incoming, self._on_message)
            cursor = "no event" if self.last_seq is None else f"seq {self.last_seq}"
            raise StreamDropped(f"the tasks/stream for task {self.task_id} ended without a response (after {cursor})")
        finally:
            self._active = False
            self._response = None
            _close(response)


def answers(message: Message, request_id: object) -> bool:
    """Whether `message` is the response to `request_id` (or an error the server could not attribute)."""
    if "method" in message:
        return False
    return message.get("id") == request_id or (message.get("id") is None and "error" in message)


def _close(response: aiohttp.ClientResponse) -> None:
    """Give a fully read connection back to the pool; close one that is not (it may carry more)."""
    if response.content.at_eof():
        response.release()
    else:
        response.close()


def _stream_conflict(error: JsonRpcError) -> bool:
    """-32602 because a previous tasks/stream of ours for the task is still active on the server side."""
    return error.code == INVALID_PARAMS and isinstance(error.data, dict) and error.data.get("reason") == "stream_active"
