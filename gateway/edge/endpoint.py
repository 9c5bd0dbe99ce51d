"""The MCP endpoint clients talk to: both eras on one path, routed per request.

A request whose `MCP-Protocol-Version` header is absent or a handshake version takes the legacy
session path (initialize, Mcp-Session-Id, GET stream, DELETE); any other version takes the stateless
2026-07-28 path. Every forwarded request becomes an Exchange upstream, relayed back as a single JSON
body when its response comes first, else as an SSE stream written as the upstream produces it.

A dropped client connection cancels the upstream request in the modern era and only detaches it in
the legacy era (there `notifications/cancelled` is the cancel). Handlers rely on aiohttp's
`handler_cancellation` to learn of the disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import orjson
from aiohttp import web

from gateway import sse
from gateway.config import ServerConfig
from gateway.edge import checks
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.envelope import check_modern_request
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Kind, Message, ProtocolError
from gateway.sessions import Session, SessionLimitReached, SessionRegistry
from gateway.upstream.base import Exchange, Upstream
from gateway.upstream.stdio import UpstreamBusy

log = logging.getLogger("gateway.edge")

SESSION_HEADER = "Mcp-Session-Id"
_FORWARDED_HEADERS = frozenset({"mcp-protocol-version", "mcp-method", "mcp-name"})
_SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
}


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client headers an upstream must see intact; never credentials, cookies or session ids."""
    return {
        name: value
        for name, value in headers.items()
        if name.lower() in _FORWARDED_HEADERS or name.lower().startswith("mcp-param-")
    }


def json_response(message: Message, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(message), status=status, content_type="application/json", headers=headers)


def error_response(error: ProtocolError) -> web.Response:
    headers = {"Allow": "POST"} if error.http_status == 405 else None
    return json_response(error.to_message(), error.http_status, headers)


class McpEndpoint:
    def __init__(self, config: ServerConfig, upstream: Upstream, sessions: SessionRegistry, metrics: Metrics) -> None:
        self._config = config
        self._upstream = upstream
        self._sessions = sessions
        self._metrics = metrics

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            checks.check_host(request.headers.get("Host"), self._config.allowed_hosts)
            checks.check_origin(request.headers.get("Origin"), self._config.allowed_origins)
            era = Era.for_header(request.headers.get("MCP-Protocol-Version"))
            if request.method == "POST":
                return await self._post(request, era)
            if era is Era.MODERN or request.method not in ("GET", "DELETE"):
                raise ProtocolError(
                    jsonrpc.INVALID_REQUEST,
                    f"Method Not Allowed: {request.method} is not served on the 2026-07-28 path; use POST",
                    http_status=405,
                )
            if request.method == "GET":
                return await self._get_stream(request)
            return await self._delete(request)
        except ProtocolError as error:
            return error_response(error)

    # -- POST ------------------------------------------------------------------------------------

    async def _post(self, request: web.Request, era: Era) -> web.StreamResponse:
        checks.check_content_type(request.headers.get("Content-Type"))
        checks.check_accept_post(request.headers.get("Accept"))
        message = jsonrpc.parse_message(await self._read_body(request))
        kind = jsonrpc.classify(message)
        headers = forwardable_headers(request.headers)
        if era is Era.LEGACY:
            return await self._legacy_post(request, message, kind, headers)
        return await self._modern_post(request, message, kind, headers)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self._config.max_body_bytes
        too_large = ProtocolError(
            jsonrpc.INVALID_REQUEST, f"Payload Too Large: the body exceeds {limit} bytes", http_status=413
        )
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    async def _legacy_post(
        self, request: web.Request, message: Message, kind: Kind, headers: dict[str, str]
    ) -> web.StreamResponse:
        if kind is Kind.REQUEST and message["method"] == "initialize":
            return await self._initialize(request, message, headers)
        session = self._session_for(request)
        if kind is Kind.NOTIFICATION:
            await session.channel.notify(message, headers)
            return web.Response(status=202)
        if kind is Kind.RESPONSE:
            if message["id"] not in session.pending_server_requests:
                raise ProtocolError(
                    jsonrpc.INVALID_REQUEST,
                    f"Invalid request: no server request with id {message['id']!r} is waiting for a response",
                )
            session.pending_server_requests.discard(message["id"])
            await session.channel.respond(message, headers)
            return web.Response(status=202)
        exchange = await session.channel.request(message, headers)
        session.open_streams += 1
        try:
            return await self._relay(request, exchange, Era.LEGACY, session)
        finally:
            session.open_streams -= 1
            session.touch()

    async def _initialize(self, request: web.Request, message: Message, headers: dict[str, str]) -> web.StreamResponse:
        try:
            session = await self._sessions.create()
        except (SessionLimitReached, UpstreamBusy) as exc:
            raise ProtocolError(
                jsonrpc.INTERNAL_ERROR, f"Service Unavailable: {exc}", http_status=503, request_id=message["id"]
            ) from None
        exchange = await session.channel.request(message, headers)
        try:
            async with asyncio.timeout(self._config.initialize_timeout_s):
                messages = await exchange.collect()
        except TimeoutError:
            await exchange.cancel()
            await self._sessions.close(session.id)
            raise ProtocolError(
                jsonrpc.INTERNAL_ERROR,
                f"the upstream did not answer initialize within {self._config.initialize_timeout_s} s",
                http_status=504,
                request_id=message["id"],
            ) from None
        except asyncio.CancelledError:
            await self._sessions.close(session.id)
            raise
        final = messages[-1]
        self._count(message["method"], final)
        if "error" in final:
            await self._sessions.close(session.id)
            return json_response(final)
        session_header = {SESSION_HEADER: session.id}
        if len(messages) == 1:
            return json_response(final, headers=session_header)
        response = await self._open_sse(request, session_header)
        await response.write(self._encode(messages))
        await response.write_eof()
        self._metrics.open_streams.dec()
        return response

    async def _modern_post(
        self, request: web.Request, message: Message, kind: Kind, headers: dict[str, str]
    ) -> web.StreamResponse:
        if kind is Kind.RESPONSE:
            raise ProtocolError(jsonrpc.INVALID_REQUEST, "Invalid request: 2026-07-28 clients do not send responses")
        if kind is Kind.NOTIFICATION:
            # The 2026-07-28 HTTP transport defines no client notifications (closing a POST is the
            # cancel); like the reference SDK, accept and drop them.
            return web.Response(status=202)
        check_modern_request(message, lambda name: request.headers.getall(name, []))
        if message["method"] == "initialize":
            raise ProtocolError(
                jsonrpc.METHOD_NOT_FOUND,
                "Method not found: initialize does not exist in 2026-07-28",
                http_status=404,
                request_id=message["id"],
            )
        try:
            async with self._upstream.stateless() as channel:
                exchange = await channel.request(message, headers)
                return await self._relay(request, exchange, Era.MODERN, None)
        except UpstreamBusy as exc:
            raise ProtocolError(
                jsonrpc.INTERNAL_ERROR, f"Service Unavailable: {exc}", http_status=503, request_id=message["id"]
            ) from None

    # -- relaying an exchange --------------------------------------------------------------------

    async def _relay(
        self, request: web.Request, exchange: Exchange, era: Era, session: Session | None
    ) -> web.StreamResponse:
        """Relay one exchange: JSON if the response is the first thing to arrive, else SSE."""
        started = time.perf_counter()
        response: web.StreamResponse | None = None
        try:
            while (batch := await exchange.next_batch(self._config.keepalive_s)) is not None:
                if session is not None:
                    for message in batch:
                        session.note_outgoing(message)
                if response is None and len(batch) == 1 and jsonrpc.is_final(batch[0]):
                    self._finish(exchange, batch[0], started)
                    return json_response(batch[0], era.status_for_response(batch[0]))
                if response is None:
                    response = await self._open_sse(request)
                await response.write(self._encode(batch) if batch else sse.encode_comment("keepalive"))
                if batch and jsonrpc.is_final(batch[-1]):
                    self._finish(exchange, batch[-1], started)
            if response is None:  # the link ended the exchange without a response: never expected
                raise ProtocolError(jsonrpc.INTERNAL_ERROR, "upstream ended without a response", http_status=502)
            await response.write_eof()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            await self._client_gone(exchange, era)
            if response is None:
                raise
            return response
        finally:
            if response is not None:
                self._metrics.open_streams.dec()

    async def _client_gone(self, exchange: Exchange, era: Era) -> None:
        if exchange.finished:
            return
        if era is Era.MODERN:
            self._metrics.requests.labels(method=exchange.method, outcome="cancelled").inc()
            await exchange.cancel()
        else:
            self._metrics.requests.labels(method=exchange.method, outcome="disconnected").inc()
            exchange.detach()

    def _finish(self, exchange: Exchange, final: Message, started: float) -> None:
        self._metrics.latency.labels(method=exchange.method).observe(time.perf_counter() - started)
        self._count(exchange.method, final)

    def _count(self, method: str, final: Message) -> None:
        self._metrics.requests.labels(method=method, outcome="error" if "error" in final else "ok").inc()

    def _encode(self, batch: list[Message]) -> bytes:
        for message in batch:
            if "method" in message:
                self._metrics.notifications_forwarded.labels(method=message["method"]).inc()
        return b"".join(sse.encode_message(orjson.dumps(message)) for message in batch)

    async def _open_sse(
        self, request: web.Request, extra_headers: Mapping[str, str] | None = None
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={**_SSE_HEADERS, **(extra_headers or {})})
        await response.prepare(request)
        self._metrics.open_streams.inc()
        return response

    # -- GET and DELETE (legacy only) -------------------------------------------------------------

    def _session_for(self, request: web.Request) -> Session:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                f"Bad Request: missing {SESSION_HEADER} header; start a session with initialize first",
            )
        session = self._sessions.get(session_id)
        if session is None:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                "Session not found: it expired or was deleted; initialize a new session",
                http_status=404,
            )
        return session

    async def _get_stream(self, request: web.Request) -> web.StreamResponse:
        checks.check_accept_stream(request.headers.get("Accept"))
        session = self._session_for(request)
        stream = session.open_get_stream()
        if stream is None:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST, "Conflict: this session already has an open GET stream", http_status=409
            )
        session.open_streams += 1
        response = None
        try:
            response = await self._open_sse(request)
            while (batch := await stream.next_batch(self._config.keepalive_s)) is not None:
                await response.write(self._encode(batch) if batch else sse.encode_comment("keepalive"))
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            if response is None:
                raise
        finally:
            session.close_get_stream(stream)
            session.open_streams -= 1
            if response is not None:
                self._metrics.open_streams.dec()
        return response

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        session = self._session_for(request)
        await self._sessions.close(session.id)
        return web.Response(status=200)
