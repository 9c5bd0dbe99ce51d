"""The Streamable HTTP upstream link: one aiohttp client session, channels per legacy session or shared.

Each request is its own POST whose answer (JSON or an SSE stream) is read by a background task owned by
the channel and delivered to the request's Exchange as it arrives. A legacy channel owns an upstream
`Mcp-Session-Id`, the standalone GET stream of that session and its DELETE; the modern channel has none.
Upstream failures end exchanges with JSON-RPC errors and are logged; they never raise out of a channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp
from multidict import CIMultiDict

from gateway import telemetry
from gateway.buffers import BufferBudget
from gateway.config import HttpUpstreamConfig
from gateway.metrics import DEFAULT_UPSTREAM, Metrics
from gateway.principal import CALLER_OWNER, CALLER_TOKEN, Caller, caller_of
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.protocol.names import SESSION_HEADER
from gateway.protocol.sse import SseError, SseEvent, SseParser
from gateway.upstream.base import (
    DeadlineRule,
    Exchange,
    FailureListener,
    UnsolicitedHandler,
    Upstream,
    UpstreamChannel,
)
from gateway.upstream.credentials import CredentialRefused, UpstreamCredentials

logger = logging.getLogger("gateway.upstream.http")
UpstreamLog = logging.LoggerAdapter[logging.Logger]
"""The link's logger, stamping each line with the upstream's configured name (`upstream`)."""

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
DEFAULT_RETRY_MS = 1000
# After the response, read on briefly so the server's end of stream arrives and the connection is reused.
DRAIN_TIMEOUT_S = 1.0
SEND_TIMEOUT_S = 30.0
DELETE_TIMEOUT_S = 5.0
LISTEN_MAX_FAILURES = 5
LISTEN_BACKOFF_S = 0.5
LISTEN_BACKOFF_MAX_S = 10.0
# A GET stream open this long is healthy even if it carried nothing, so its end is not a failure.
LISTEN_HEALTHY_S = 10.0

ACCEPT_BOTH = "application/json, text/event-stream"
SSE = "text/event-stream"
JSON = "application/json"
VERSION_HEADER = "MCP-Protocol-Version"
# Headers the channel sets itself; a client value for them is never forwarded.
_RESERVED_HEADERS = frozenset(
    {
        "authorization",
        "mcp-session-id",
        "last-event-id",
        "accept",
        "content-type",
        "content-length",
        "host",
        "connection",
        "transfer-encoding",
        CALLER_TOKEN,
        CALLER_OWNER,
    }
)


class _Call:
    """One request in flight: its exchange, the task reading its answer, and where a resume starts."""

    __slots__ = ("exchange", "last_event_id", "messages", "response", "retry_ms", "task")

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.task: asyncio.Task[None] | None = None
        self.response: aiohttp.ClientResponse | None = None
        self.last_event_id: str | None = None
        self.retry_ms = DEFAULT_RETRY_MS
        self.messages = 0

    def abort(self) -> None:
        if self.response is not None:
            self.response.close()
        if self.task is not None:
            self.task.cancel()


class HttpChannel(UpstreamChannel):
    """One upstream conversation over Streamable HTTP: a legacy session, or the shared modern channel."""

    def __init__(
        self,
        client: aiohttp.ClientSession,
        url: str,
        config: HttpUpstreamConfig,
        metrics: Metrics,
        session: bool,
        budget: BufferBudget,
        on_close: Callable[[HttpChannel], None] | None = None,
        on_failure: FailureListener | None = None,
        deadlines: DeadlineRule | None = None,
        credentials: UpstreamCredentials | None = None,
        *,
        name: str,
    ) -> None:
        self.session = session
        """A 2025-11-25 upstream session (`Mcp-Session-Id`, GET stream, DELETE); else 2026-07-28 stateless."""
        self._on_close = on_close
        self._on_failure = on_failure
        self._deadlines = deadlines
        self._client = client
        self._url = url
        self._config = config
        self._credentials = credentials
        """`[upstream.auth]`: the Authorization of each request, asked for each one."""
        self._caller: Caller | None = None
        """A legacy session's caller (its requests carry it): whom its own GET stream and DELETE act for.
        Each POST still takes the caller its own call carries."""
        self._metrics = metrics
        self._budget = budget
        self._session_id: str | None = None
        self._protocol_version: str | None = None
        self._handler: UnsolicitedHandler | None = None
        self._calls: set[_Call] = set()
        self._listener: asyncio.Task[None] | None = None
        self._closed = False
        self._left_open = False
        """Closed without its DELETE: another process watches its tasks on from here (`leave_open`)."""
        self._name = name
        self._log = UpstreamLog(logger, {"upstream": name})

    @property
    def session_id(self) -> str | None:
        """The upstream `Mcp-Session-Id` (legacy channels, once `initialize` succeeded)."""
        return self._session_id

    @property
    def rejoin_handle(self) -> str | None:
        return self._session_id

    def rejoined(self, session_id: str, protocol_version: str) -> None:
        """Continue the upstream session `session_id` a previous gateway process opened."""
        self._session_id, self._protocol_version = session_id, protocol_version

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        deadline = self._deadlines(message) if self._deadlines is not None else None
        exchange = Exchange(message["id"], message["method"], self._budget, self, deadline)
        if self._closed:
            exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream session closed")
            return exchange
        self._remember_version(headers)
        call = _Call(exchange)
        self._calls.add(call)
        exchange.span = telemetry.start_span(
            telemetry.UPSTREAM_SPAN, **{telemetry.METHOD: exchange.method, telemetry.UPSTREAM: self._name}
        )
        with telemetry.current(exchange.span):  # the call's task runs under it: its headers name it
            call.task = asyncio.create_task(
                self._run_call(call, message, headers), name=f"upstream-http-{message['id']}"
            )
        call.task.add_done_callback(lambda _: self._calls.discard(call))

        async def cancel(reason: str) -> None:
            await self._cancel(call, reason)

        exchange.on_cancel(cancel)
        return exchange

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        self._remember_version(headers)
        sent = await self._send(message, headers)
        if sent and self.session and message.get("method") == "notifications/initialized":
            self._start_listening()

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        self._remember_version(headers)
        await self._send(message, headers)

    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        self._handler = handler

    def leave_open(self) -> None:
        self._left_open = True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._on_close is not None:
            self._on_close(self)
        tasks: list[asyncio.Task[None]] = []
        if self._listener is not None:
            self._listener.cancel()
            tasks.append(self._listener)
        calls = list(self._calls)
        for call in calls:
            call.abort()
            if call.task is not None:
                tasks.append(call.task)
        await asyncio.gather(*tasks, return_exceptions=True)
        for call in calls:
            call.exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream session closed")
        if self.session and self._session_id is not None and not self._left_open:
            await self._delete_session()

    # -- requests -----------------------------------------------------------------------------------

    async def _run_call(self, call: _Call, message: Message, headers: Mapping[str, str]) -> None:
        try:
            await self._exchange(call, message, headers)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log.exception("upstream request %r failed in the link", call.exchange.request_id)
            call.exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream link error (the gateway's log has the cause)")

    async def _exchange(self, call: _Call, message: Message, headers: Mapping[str, str]) -> None:
        exchange = call.exchange
        is_initialize = message["method"] == "initialize"
        try:
            authorization = await self._authorization(headers)
        except CredentialRefused as refused:
            exchange.fail(jsonrpc.INTERNAL_ERROR, f"upstream credentials: {refused}", {"reason": refused.reason})
            return
        request_headers = self._headers(headers, authorization, accept=ACCEPT_BOTH, with_session=not is_initialize)
        request_headers["Content-Type"] = JSON
        telemetry.inject_headers(request_headers)
        message = telemetry.with_trace_meta(message, always=False)
        try:
            response = await self._client.post(self._url, data=jsonrpc.dumps(message), headers=request_headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # aiohttp's text names the upstream's host and port: the log has it, the client gets the kind.
            self._log.debug("upstream request %r: %s unreachable: %s", exchange.request_id, self._url, _describe(exc))
            cause = f"upstream unreachable: {_unreachable_reason(exc)}"
            exchange.fail(jsonrpc.INTERNAL_ERROR, cause)
            if self._on_failure is not None:
                self._on_failure(cause)
            return
        if is_initialize and self.session and 200 <= response.status < 300:
            session_id = response.headers.get(SESSION_HEADER)
            if session_id:
                self._session_id = session_id
        if await self._consume(call, response):
            return
        attempts = 0
        while call.last_event_id and attempts < self._config.max_reconnects and not self._closed:
            attempts += 1
            await asyncio.sleep(call.retry_ms / 1000)
            resume_headers = self._headers({}, authorization, accept=SSE, with_session=True)
            resume_headers["Last-Event-ID"] = call.last_event_id
            try:
                response = await self._client.get(self._url, headers=resume_headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._log.info("resuming upstream request %r failed: %s", exchange.request_id, _describe(exc))
                continue
            before = call.messages
            if await self._consume(call, response):
                return
            if call.messages > before:
                # A resume that brought messages is SEP-1699 polling, not a failure: only fruitless
                # resumes in a row count against max_reconnects.
                attempts = 0
        exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream closed the stream without a response")

    async def _consume(self, call: _Call, response: aiohttp.ClientResponse) -> bool:
        """Deliver one HTTP answer to the exchange; True when the exchange is finished."""
        exchange = call.exchange
        call.response = response
        try:
            async with response:
                if not 200 <= response.status < 300:
                    if response.status == 404 and self._session_id is not None and not self.lost:
                        self.lost = True
                        await self.report_loss("the upstream ended its session (HTTP 404)")
                    await self._deliver_http_error(exchange, response)
                    return True
                content_type = response.content_type.lower()
                if content_type == SSE:
                    return await self._read_stream(call, response)
                if content_type == JSON:
                    await self._deliver_json(exchange, response)
                    return True
                exchange.fail(
                    jsonrpc.INTERNAL_ERROR, f"upstream answered with unsupported content type {content_type!r}"
                )
                return True
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, SseError) as exc:
            self._log.info("upstream stream of request %r broke: %s", exchange.request_id, _describe(exc))
            return exchange.finished
        finally:
            call.response = None

    async def _read_stream(self, call: _Call, response: aiohttp.ClientResponse) -> bool:
        exchange = call.exchange
        parser = SseParser(MAX_MESSAGE_BYTES)
        async for chunk in response.content.iter_any():
            for event in parser.feed(chunk):
                if event.id is not None:
                    call.last_event_id = event.id
                if event.retry is not None:
                    call.retry_ms = event.retry
                message = _decode_event(event, self._log)
                if message is None:
                    continue
                call.messages += 1
                if exchange.method == "initialize":
                    self._remember_negotiated(message)
                await exchange.deliver(message, event.size)
                if jsonrpc.is_final(message):
                    await _drain(response)
                    return True
        return exchange.finished

    async def _deliver_json(self, exchange: Exchange, response: aiohttp.ClientResponse) -> None:
        body = await _read_limited(response, MAX_MESSAGE_BYTES)
        if body is None:
            exchange.fail(jsonrpc.INTERNAL_ERROR, f"upstream response larger than {MAX_MESSAGE_BYTES} bytes")
            return
        message = jsonrpc.received(body)
        if message is None:
            exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream answered with a body that is not a JSON-RPC message")
            return
        if exchange.method == "initialize":
            self._remember_negotiated(message)
        await exchange.deliver(message, len(body))
        if not jsonrpc.is_final(message):
            exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream answered with a JSON body that is not a response")

    async def _deliver_http_error(self, exchange: Exchange, response: aiohttp.ClientResponse) -> None:
        body = await _read_limited(response, MAX_ERROR_BODY_BYTES, truncate=True) or b""
        message = jsonrpc.received(body)
        if message is not None and isinstance(message.get("error"), dict) and "method" not in message:
            # The SDK answers transport errors with id null; the error belongs to this request.
            message["id"] = exchange.request_id
            message["jsonrpc"] = "2.0"
            await exchange.deliver(message, len(body))
            return
        # The body may be a proxy's page or a stack trace: the log and /readyz get it, the client only the status.
        text = " ".join(body.decode("utf-8", errors="replace").split())[:200] or (response.reason or "")
        exchange.fail(jsonrpc.INTERNAL_ERROR, f"upstream answered HTTP {response.status}", detail=text)

    async def _cancel(self, call: _Call, reason: str) -> None:
        call.abort()
        # A dropped POST is the cancel at 2026-07-28; a legacy upstream keeps running the tool without this.
        if self.session and call.exchange.method != "initialize" and not self._closed:
            cancelled: Message = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": call.exchange.request_id, "reason": reason},
            }
            await self._send(cancelled, {})

    # -- notifications, responses, session end ------------------------------------------------------

    async def _send(self, message: Message, headers: Mapping[str, str]) -> bool:
        """POST a notification or response; True when the upstream accepted it."""
        if self._closed:
            self._log.warning("not forwarding %s: upstream session closed", _label(message))
            return False
        try:
            authorization = await self._authorization(headers)
        except CredentialRefused as refused:
            self._log.warning("not forwarding %s: upstream credentials: %s", _label(message), refused)
            return False
        request_headers = self._headers(headers, authorization, accept=ACCEPT_BOTH, with_session=True)
        request_headers["Content-Type"] = JSON
        telemetry.inject_headers(request_headers)
        timeout = aiohttp.ClientTimeout(total=SEND_TIMEOUT_S, connect=self._config.connect_timeout_s)
        try:
            async with self._client.post(
                self._url, data=jsonrpc.dumps(message), headers=request_headers, timeout=timeout
            ) as response:
                if 200 <= response.status < 300:
                    await response.read()
                    return True
                body = await _read_limited(response, MAX_ERROR_BODY_BYTES, truncate=True) or b""
                self._log.warning(
                    "upstream refused %s: HTTP %d %s",
                    _label(message),
                    response.status,
                    " ".join(body.decode("utf-8", errors="replace").split())[:200],
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._log.warning("could not forward %s upstream: %s", _label(message), _describe(exc))
        return False

    async def _delete_session(self) -> None:
        try:
            headers = self._headers({}, await self._authorization({}), accept=ACCEPT_BOTH, with_session=True)
        except CredentialRefused as refused:
            self._log.info("not ending upstream session %s: upstream credentials: %s", self._session_id, refused)
            return
        timeout = aiohttp.ClientTimeout(total=DELETE_TIMEOUT_S)
        try:
            async with self._client.delete(self._url, headers=headers, timeout=timeout) as response:
                await response.read()
                self._log.debug("upstream session %s ended: HTTP %d", self._session_id, response.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._log.info("ending upstream session %s failed: %s", self._session_id, _describe(exc))

    # -- the standalone GET stream (legacy) ---------------------------------------------------------

    def _start_listening(self) -> None:
        if self._closed or (self._listener is not None and not self._listener.done()):
            return
        self._listener = asyncio.create_task(self._listen(), name="upstream-http-get-stream")

    async def _listen(self) -> None:
        try:
            await self._listen_loop()
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log.exception("upstream GET stream failed in the link")

    async def _listen_loop(self) -> None:
        last_event_id: str | None = None
        failures = 0
        while not self._closed:
            try:
                headers = self._headers({}, await self._authorization({}), accept=SSE, with_session=True)
            except CredentialRefused as refused:
                self._log.warning("no upstream GET stream: upstream credentials: %s", refused)
                return
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            started = asyncio.get_running_loop().time()
            healthy = False
            parser = SseParser(MAX_MESSAGE_BYTES)
            try:
                async with self._client.get(self._url, headers=headers) as response:
                    if response.status == 405:
                        self._log.debug("upstream offers no GET stream (HTTP 405)")
                        return
                    if 400 <= response.status < 500:
                        self._log.warning("upstream refused the GET stream: HTTP %d", response.status)
                        return
                    if 200 <= response.status < 300 and response.content_type.lower() == SSE:
                        healthy = await self._read_unsolicited(parser, response)
                    else:
                        self._log.warning(
                            "upstream GET stream answered HTTP %d %s", response.status, response.content_type
                        )
                        # An SDK server without an EventStore answers any Last-Event-ID with 500.
                        last_event_id = None
            except (aiohttp.ClientError, TimeoutError, SseError) as exc:
                self._log.info("upstream GET stream broke: %s", _describe(exc))
            if parser.last_event_id is not None:
                last_event_id = parser.last_event_id
            if self._closed:
                return
            if healthy or asyncio.get_running_loop().time() - started >= LISTEN_HEALTHY_S:
                failures = 0
            else:
                failures += 1
                if failures > LISTEN_MAX_FAILURES:
                    self._log.warning("giving up on the upstream GET stream after %d failures", failures)
                    return
            delay = min(LISTEN_BACKOFF_S * 2 ** max(failures - 1, 0), LISTEN_BACKOFF_MAX_S)
            await asyncio.sleep(delay)

    async def _read_unsolicited(self, parser: SseParser, response: aiohttp.ClientResponse) -> bool:
        """Deliver what the GET stream carries until it ends; True if it carried any message."""
        delivered = False
        async for chunk in response.content.iter_any():
            for event in parser.feed(chunk):
                message = _decode_event(event, self._log)
                if message is None:
                    continue
                delivered = True
                await self._deliver_unsolicited(message, event.size)
        return delivered

    async def _deliver_unsolicited(self, message: Message, size: int) -> None:
        message = await self.tapped(None, message)
        handler = self._handler
        if handler is None:
            method = str(message.get("method", "(response)"))
            self._metrics.notifications_undelivered.labels(method=method, reason="no_session").inc()
            return
        try:
            await handler(message, size)
        except Exception:
            self._log.exception("unsolicited message handler failed on %s", _label(message))

    # -- helpers ------------------------------------------------------------------------------------

    async def _authorization(self, client_headers: Mapping[str, str]) -> Mapping[str, str]:
        """The credential of a request carrying `client_headers` (the call's caller, else a legacy
        session's); CredentialRefused when it must not be sent."""
        if self._credentials is None:
            return {}
        caller = caller_of(client_headers)
        if self.session:
            self._caller = caller = caller or self._caller
        return await self._credentials.authorization(caller)

    def _headers(
        self,
        client_headers: Mapping[str, str],
        authorization: Mapping[str, str],
        *,
        accept: str,
        with_session: bool,
    ) -> CIMultiDict[str]:
        headers: CIMultiDict[str] = CIMultiDict()
        headers["Accept"] = accept
        if self._protocol_version is not None:
            headers[VERSION_HEADER] = self._protocol_version
        for name, value in client_headers.items():
            if name.lower() not in _RESERVED_HEADERS:
                headers[name] = value
        if with_session and self._session_id is not None:
            headers[SESSION_HEADER] = self._session_id
        for name, value in self._config.headers.items():
            headers[name] = value
        for name, value in authorization.items():
            headers[name] = value
        return headers

    def _remember_version(self, headers: Mapping[str, str]) -> None:
        """Keep the client's protocol version for the requests the link makes on its own (GET, DELETE)."""
        if not self.session:
            return
        for name, value in headers.items():
            if name.lower() == "mcp-protocol-version":
                self._protocol_version = value

    def _remember_negotiated(self, message: Message) -> None:
        result = message.get("result")
        if self.session and isinstance(result, dict):
            version = result.get("protocolVersion")
            if isinstance(version, str) and self._protocol_version is None:
                self._protocol_version = version


class HttpUpstream(Upstream):
    """An MCP server reached over Streamable HTTP at `url`."""

    shared_stateless = True
    outlives_gateway = True

    def __init__(
        self,
        url: str,
        config: HttpUpstreamConfig,
        metrics: Metrics,
        budget: BufferBudget | None = None,
        deadlines: DeadlineRule | None = None,
        credentials: UpstreamCredentials | None = None,
        *,
        name: str = DEFAULT_UPSTREAM,
    ) -> None:
        self.name = name
        """The upstream's configured name: the `upstream` field of its log lines."""
        self.url = url
        self._config = config
        self._credentials = credentials
        self._metrics = metrics
        self._budget = budget or BufferBudget()
        self._deadlines = deadlines
        self._client: aiohttp.ClientSession | None = None
        self._shared: HttpChannel | None = None
        self._channels: set[HttpChannel] = set()

    async def start(self) -> None:
        if self._client is not None:
            return
        connector = aiohttp.TCPConnector(limit=self._config.max_connections)
        self._client = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=self._config.connect_timeout_s),
            # One client session serves every gateway client: upstream cookies must not leak between them.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        if self._credentials is not None:
            await self._credentials.start()
        self._shared = self._channel(session=False)

    async def close(self) -> None:
        channels = list(self._channels)
        self._channels.clear()
        if self._shared is not None:
            channels.append(self._shared)
            self._shared = None
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._credentials is not None:
            await self._credentials.close()

    async def open_session(self) -> HttpChannel:
        channel = self._channel(session=True)
        self._channels.add(channel)
        return channel

    @contextlib.asynccontextmanager
    async def probe_session(self) -> AsyncIterator[HttpChannel]:
        channel = self._channel(session=True, probe=True)
        self._channels.add(channel)
        try:
            yield channel
        finally:
            await channel.close()

    def rejoin(self, handle: str, protocol_version: str) -> HttpChannel:
        channel = self._channel(session=True)
        channel.rejoined(handle, protocol_version)
        self._channels.add(channel)
        return channel

    @contextlib.asynccontextmanager
    async def stateless(
        self, affinity: str | None = None, *, beside: bool = False, owner: str | None = None
    ) -> AsyncIterator[HttpChannel]:
        if self._shared is None:
            raise RuntimeError("HttpUpstream.start() was not awaited")
        yield self._shared

    def pin(self, affinity: str, channel: UpstreamChannel) -> None:
        """Nothing to do: every stateless request reaches the same upstream endpoint."""

    def _channel(self, *, session: bool, probe: bool = False) -> HttpChannel:
        """A channel; a readiness probe's reports no failures (the probe reads them from its exchange)."""
        if self._client is None:
            raise RuntimeError("HttpUpstream.start() was not awaited")
        return HttpChannel(
            self._client,
            self.url,
            self._config,
            self._metrics,
            session,
            self._budget,
            on_close=self._channels.discard,
            on_failure=None if probe else self.report_failure,
            deadlines=self._deadlines,
            credentials=self._credentials,
            name=self.name,
        )


def _decode_event(event: SseEvent, log: UpstreamLog) -> Message | None:
    """The JSON-RPC message in an SSE event, or None for priming events and anything unusable."""
    if not event.raw:
        return None
    if event.event != "message":
        log.debug("ignoring upstream SSE event of type %r", event.event)
        return None
    # Parsed from the bytes as received, which it keeps for the relay; text that is not UTF-8 is
    # read as decoded (with replacement characters), as the gateway always did, and serialised again.
    message = jsonrpc.received(event.raw)
    if message is None and not event.data.isascii():
        message = jsonrpc.received(event.data.encode())
    if message is None:
        log.warning("ignoring upstream SSE event that is not a JSON-RPC message: %.200s", event.data)
    return message


async def _read_limited(response: aiohttp.ClientResponse, limit: int, *, truncate: bool = False) -> bytes | None:
    """The body up to `limit` bytes; beyond it the truncated body, or None when `truncate` is False."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts)[:limit] if truncate else None
    return b"".join(parts)


async def _drain(response: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in response.content.iter_any():
                pass


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _unreachable_reason(exc: BaseException) -> str:
    """Why a connection failed, in words that name no host, port or address."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "its host name does not resolve"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "TLS handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.errno:
        return os.strerror(exc.errno).lower()
    if isinstance(exc, TimeoutError):  # aiohttp's connect and read timeouts are TimeoutErrors too
        return "timed out"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the connection was closed"
    return type(exc).__name__


def _label(message: Message) -> str:
    method = message.get("method")
    return str(method) if method is not None else f"response to {message.get('id')!r}"
