"""The MCP endpoint clients talk to: both eras on one path, each request classified once.

A request whose `MCP-Protocol-Version` header is absent or a handshake version takes the legacy
session path (initialize, Mcp-Session-Id, GET stream, DELETE); any other version takes the stateless
2026-07-28 path. After the transport checks, a request goes one of three ways: `tasks/stream` (answered
from the event log), a task method or task-augmented `tools/call` the gateway hosts because the
upstream has no Tasks, or forwarded to the upstream and relayed back as it is produced. When the
upstream hosts Tasks itself, forwarding maps task ids and learns the tasks it creates (`Passthrough`).

Handlers rely on aiohttp's `handler_cancellation` to learn that a client went away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from gateway.buffers import BufferBudget
from gateway.config import ServerConfig
from gateway.edge import checks
from gateway.edge.rejections import Rejections
from gateway.edge.relay import Transform, relay
from gateway.edge.responder import Responder, SlowClient, json_response
from gateway.edge.task_routes import Call, TaskRoutes
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.envelope import check_modern_request
from gateway.protocol.era import (
    CLIENT_CAPABILITIES_KEY,
    LATEST_HANDSHAKE_VERSION,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    Era,
)
from gateway.protocol.fields import check_fields
from gateway.protocol.jsonrpc import Kind, Message, Overloaded, ProtocolError
from gateway.replay import LAST_EVENT_ID, StreamGap
from gateway.sessions import ResponseRoute, Session, SessionRegistry
from gateway.tasks.hosted import TASKS_EXTENSION, Caller, declares_tasks_extension
from gateway.tasks.passthrough import ROUTED_METHODS, Passthrough
from gateway.tasks.registry import ANONYMOUS
from gateway.upstream.base import Upstream, UpstreamChannel

log = logging.getLogger("gateway.edge")

SESSION_HEADER = "Mcp-Session-Id"

ChannelSource = Callable[[], Awaitable[UpstreamChannel]]
"""How a request gets its upstream channel, only once it needs one."""
_FORWARDED_HEADERS = frozenset({"mcp-protocol-version", "mcp-method", "mcp-name"})


def forwardable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client headers an upstream must see intact; never credentials, cookies or session ids."""
    return {
        name: value
        for name, value in headers.items()
        if name.lower() in _FORWARDED_HEADERS or name.lower().startswith("mcp-param-")
    }


def error_response(error: ProtocolError, era: Era | None = None, *, retry_after_s: int) -> web.Response:
    """Transport errors keep their status; a method-level error (plain 400) takes the era's mapping.
    An overload (503, both eras) says when to come back."""
    message = error.to_message()
    status = error.http_status
    if era is not None and status == 400:
        status = era.status_for_response(message)
    headers = {"Allow": "POST"} if status == 405 else {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(retry_after_s)
    return json_response(message, status, headers)


class McpEndpoint:
    def __init__(
        self,
        config: ServerConfig,
        upstream: Upstream,
        sessions: SessionRegistry,
        task_routes: TaskRoutes,
        passthrough: Passthrough,
        metrics: Metrics,
        rejections: Rejections,
        budget: BufferBudget,
        *,
        events_enabled: bool,
    ) -> None:
        self._config = config
        self._budget = budget
        self._upstream = upstream
        self._sessions = sessions
        self._tasks = task_routes
        self._passthrough = passthrough
        self._metrics = metrics
        self._rejections = rejections
        self._events_enabled = events_enabled
        self._modern_upstream_tasks: bool | None = None
        self._probe_lock = asyncio.Lock()

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
            self._metrics.requests.labels(method="-", outcome="rejected").inc()
            self._rejections.refused(error, request.remote)
            return self._error_response(error)

    def _error_response(self, error: ProtocolError, era: Era | None = None) -> web.Response:
        if isinstance(error, Overloaded):
            self._metrics.rejected.labels(limit=error.limit).inc()
        return error_response(error, era, retry_after_s=self._config.retry_after_s)

    # -- POST ------------------------------------------------------------------------------------

    async def _post(self, request: web.Request, era: Era) -> web.StreamResponse:
        checks.check_content_type(request.headers.get("Content-Type"))
        checks.check_accept_post(request.headers.get("Accept"))
        message = jsonrpc.parse_message(await self._read_body(request), self._config.max_json_depth)
        kind = jsonrpc.classify(message)
        if kind is not Kind.RESPONSE:
            check_fields(message)
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
        session = await self._session_for(request)
        if kind is not Kind.NOTIFICATION or message["method"] != "notifications/initialized":
            session.engaged = True
        if kind is Kind.NOTIFICATION:
            if not self._cancel_local(session, message):
                await session.channel.notify(message, headers)
            return web.Response(status=202)
        if kind is Kind.RESPONSE:
            if message["id"] not in session.pending_server_requests:
                raise ProtocolError(
                    jsonrpc.INVALID_REQUEST,
                    f"Invalid request: no server request with id {message['id']!r} is waiting for a response",
                )
            session.pending_server_requests.discard(message["id"])
            if session.upstream_has_tasks:
                await self._passthrough.answered(session.channel, message)
            await session.respond(message, headers)
            return web.Response(status=202)
        call = Call(request, message, Era.LEGACY, session, headers, Caller(ANONYMOUS, Era.LEGACY))

        async def session_channel() -> UpstreamChannel:
            self._budget.admit(message["id"])
            await session.channel.resume()  # a parked session takes a process back (or gets 503)
            return session.channel

        session.open_streams += 1
        try:
            return await self._dispatch(call, session_channel, hosting=not session.upstream_has_tasks)
        finally:
            session.open_streams -= 1
            session.touch()

    def _cancel_local(self, session: Session, message: Message) -> bool:
        """A notifications/cancelled for a request the gateway serves itself stops it there."""
        if message.get("method") != "notifications/cancelled":
            return False
        stop = session.local_requests.get(jsonrpc.params_of(message).get("requestId"))  # type: ignore[arg-type]
        if stop is None:
            return False
        stop.set()
        return True

    async def _initialize(self, request: web.Request, message: Message, headers: dict[str, str]) -> web.StreamResponse:
        try:
            session = await self._sessions.create()
        except Overloaded as error:
            error.request_id = message["id"]
            raise
        session.open_streams += 1  # the handshake timeout runs once initialize has been answered
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
            exchange.detach()
            await self._sessions.close(session.id)
            raise
        finally:
            session.open_streams -= 1
            session.touch()
        final = messages.pop()
        self._metrics.requests.labels(method="initialize", outcome="error" if "error" in final else "ok").inc()
        if "error" in final or not isinstance(final.get("result"), dict):
            await self._sessions.close(session.id)
            return json_response(final)
        # Priming events are SEP-1699 (2025-11-25): older clients would try to parse their empty data.
        session.streams.priming = str(final["result"].get("protocolVersion")) >= LATEST_HANDSHAKE_VERSION
        capabilities = final["result"].get("capabilities")
        session.upstream_has_tasks = isinstance(capabilities, dict) and "tasks" in capabilities
        if session.upstream_has_tasks:
            session.channel.tap = self._passthrough.observe
        final = {**final, "result": self._tasks.hosted.advertise_legacy(final["result"], session.upstream_has_tasks)}
        responder = Responder(request, self._metrics, headers={SESSION_HEADER: session.id})
        try:
            if messages:
                await responder.send(messages)
            return await responder.finish(final, Era.LEGACY)
        finally:
            responder.close()

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
        call = Call(request, message, Era.MODERN, None, headers, Caller(ANONYMOUS, Era.MODERN))

        leased: list[UpstreamChannel] = []

        async def lease() -> UpstreamChannel:
            # Taken only by requests that reach the upstream, once: a tasks/stream served from the
            # log must not hold a pooled process for as long as it stays open.
            if not leased:
                self._budget.admit(message["id"])
                # The conversation that holds the state: an MRTR retry's requestState, a task's id.
                params = jsonrpc.params_of(message)
                state = params.get("taskId" if message["method"].startswith("tasks/") else "requestState")
                affinity = state if isinstance(state, str) else None
                leased.append(await call.resources.enter_async_context(self._upstream.stateless(affinity)))
            return leased[0]

        try:
            hosting = not await self._modern_upstream_has_tasks()
            return await self._dispatch(call, lease, hosting=hosting)
        except Overloaded as error:  # the upstream probe found no process free
            error.request_id = message["id"]
            raise
        finally:
            if not call.resources_kept:
                await call.resources.aclose()

    # -- one classification per request ------------------------------------------------------------

    async def _dispatch(self, call: Call, channel: ChannelSource, *, hosting: bool) -> web.StreamResponse:
        try:
            if call.method == "tasks/stream":
                return await self._tasks.stream(call, self._events_enabled)
            if not hosting:
                return await self._with_upstream_tasks(call, channel)
            if self._tasks.serves(call):
                return await self._tasks.task_method(call)
            if call.method == "tools/call":
                answer = (
                    await self._tasks.legacy_tool_call(call, await channel())
                    if call.era is Era.LEGACY
                    else await self._tasks.modern_tool_call(call, await channel())
                )
                if answer is not None:
                    return answer
            return await self._forward(call, await channel(), self._transform_for(call, hosting))
        except ProtocolError as error:
            if error.request_id is None:
                error.request_id = call.message["id"]
            outcome = "events_gone" if error.code == -32010 else "error"
            self._metrics.requests.labels(method=call.method, outcome=outcome).inc()
            return self._error_response(error, call.era)

    async def _with_upstream_tasks(self, call: Call, channel_source: ChannelSource) -> web.StreamResponse:
        """The upstream hosts Tasks: forward, on the task's own conversation for requests naming a
        task, with ids mapped (the channel tap) and the tasks a tools/call creates learned."""
        answer_route: ResponseRoute | None = None
        if call.method in ROUTED_METHODS[call.era]:
            task, message, headers = self._passthrough.route(call.caller.owner, call.message, call.headers)
            if task.terminal:
                # Its record holds how it ended (the outcome too) and answers, exactly and even once
                # the upstream conversation that held the task is gone.
                return await self._tasks.task_method(call)
            call = dataclasses.replace(call, message=message, headers=headers)
            channel = task.upstream.channel if call.era is Era.LEGACY else await channel_source()
            if call.session is not None and channel is not call.session.channel:
                # A task of another session of this caller: answers to its requests go back to it.
                answer_route = self._answering(channel)
        else:
            if call.method == "subscriptions/listen":
                listen = self._passthrough.route_listen(call.caller.owner, call.message)
                call = dataclasses.replace(call, message=listen)
            channel = await channel_source()
        channel.tap = self._passthrough.observe
        params = jsonrpc.params_of(call.message)
        if call.method == "tools/call" and (
            "task" in params if call.era is Era.LEGACY else declares_tasks_extension(call.message)
        ):
            observed: list[Message] = []
            return await self._forward(call, channel, self._learning(call, channel, observed), observed)
        return await self._forward(call, channel, self._transform_for(call, hosting=False), answer_route=answer_route)

    def _answering(self, channel: UpstreamChannel) -> ResponseRoute:
        async def answer(message: Message, headers: Mapping[str, str]) -> None:
            await self._passthrough.answered(channel, message)
            await channel.respond(message, headers)

        return answer

    def _learning(self, call: Call, channel: UpstreamChannel, observed: list[Message]) -> Transform:
        """Learn the task the upstream's answer creates (the answer itself passes unchanged)."""
        session = call.session

        async def learn(final: Message) -> Message:
            # A legacy session's upstream channel must outlive the session while the task runs on it.
            hold = session.task_ended if session is not None else None
            task = await self._passthrough.adopt(
                call.caller.owner, channel, call.era, call.message, final, observed, call.headers, hold
            )
            if task is not None and session is not None:
                session.task_started()  # before the task's watcher can run, which releases it
            return final

        return learn

    def _transform_for(self, call: Call, hosting: bool) -> Transform | None:
        """Responses the gateway adds its own capabilities to."""
        hosted = self._tasks.hosted
        if call.method == "server/discover":

            async def discover(final: Message) -> Message:
                result = final.get("result")
                if not isinstance(result, dict):
                    return final
                self._modern_upstream_tasks = upstream_declares_tasks(result)
                return {**final, "result": hosted.advertise_modern(result)}

            return discover
        if call.method == "tools/list" and hosting and call.era is Era.LEGACY:

            async def annotate(final: Message) -> Message:
                result = final.get("result")
                return {**final, "result": hosted.annotate_tools(result)} if isinstance(result, dict) else final

            return annotate
        return None

    async def _forward(
        self,
        call: Call,
        channel: UpstreamChannel,
        transform: Transform | None,
        observed: list[Message] | None = None,
        *,
        answer_route: ResponseRoute | None = None,
    ) -> web.StreamResponse:
        exchange = await channel.request(call.message, call.headers)
        if call.era is Era.MODERN:
            transform = self._pinning(channel, transform)
        streams = call.session.streams if call.session is not None else None
        responder = Responder(
            call.request, self._metrics, write_timeout_s=self._config.write_timeout_s, streams=streams
        )
        return await relay(
            exchange,
            responder,
            call.era,
            self._metrics,
            self._config.keepalive_s,
            session=call.session,
            transform=transform,
            observed=observed,
            answer_route=answer_route,
            flush_interval_s=self._config.flush_interval_ms / 1000,
        )

    def _pinning(self, channel: UpstreamChannel, transform: Transform | None) -> Transform:
        """An input_required answer's retry must reach the channel that issued its requestState."""

        async def pin(final: Message) -> Message:
            result = final.get("result")
            if isinstance(result, dict) and result.get("resultType") == "input_required":
                state = result.get("requestState")
                if isinstance(state, str):
                    self._upstream.pin(state, channel)
            return await transform(final) if transform is not None else final

        return pin

    async def _modern_upstream_has_tasks(self) -> bool:
        """Whether a 2026-07-28 upstream declares the tasks extension, probed once with server/discover."""
        if self._modern_upstream_tasks is not None:
            return self._modern_upstream_tasks
        async with self._probe_lock:  # one probe, however many requests arrive before it answers
            if self._modern_upstream_tasks is None:
                learned = await self._probe_modern_tasks()
                if learned is None:  # the upstream is not usable (yet): learn once it is
                    return False
                self._modern_upstream_tasks = learned
        return self._modern_upstream_tasks

    async def _probe_modern_tasks(self) -> bool | None:
        """Whether the upstream declares the tasks extension; None when it could not be asked."""
        probe = {
            "jsonrpc": "2.0",
            "id": "mcp-task-gateway-discover",
            "method": "server/discover",
            "params": {"_meta": {PROTOCOL_VERSION_KEY: MODERN_VERSIONS[0], CLIENT_CAPABILITIES_KEY: {}}},
        }
        probe_headers = {"MCP-Protocol-Version": MODERN_VERSIONS[0], "Mcp-Method": "server/discover"}
        async with self._upstream.stateless() as channel:
            exchange = await channel.request(probe, probe_headers)
            try:
                async with asyncio.timeout(self._config.initialize_timeout_s):
                    final = (await exchange.collect())[-1]
            except TimeoutError:
                await exchange.cancel()
                log.warning("the upstream did not answer server/discover; assuming it has no tasks")
                return False
        if exchange.failure is not None:
            return None
        result = final.get("result")
        # An upstream that cannot answer discover has no 2026 tasks either; a later discover re-learns.
        return isinstance(result, dict) and upstream_declares_tasks(result)

    # -- GET and DELETE (legacy only) -------------------------------------------------------------

    async def _session_for(self, request: web.Request) -> Session:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                f"Bad Request: missing {SESSION_HEADER} header; start a session with initialize first",
            )
        session = self._sessions.get(session_id)
        if session is not None and session.channel.lost:
            await self._sessions.close(session.id)
            session = None
        if session is None:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                "Session not found: it expired or was deleted; initialize a new session",
                http_status=404,
            )
        return session

    async def _get_stream(self, request: web.Request) -> web.StreamResponse:
        """The standalone stream, or with Last-Event-ID the rest of the stream that id names: the events
        after it, then live to its end (a forwarded response's stream ends with its response)."""
        checks.check_accept_stream(request.headers.get("Accept"))
        session = await self._session_for(request)
        self._budget.admit(None)
        last_event_id = request.headers.get(LAST_EVENT_ID)
        if last_event_id is not None:
            stream, after = session.streams.resume(last_event_id)
        elif (standalone := session.streams.open_standalone()) is not None:
            stream, after = standalone, 0
        else:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST, "Conflict: this session already has an open GET stream", http_status=409
            )
        session.engaged = True
        session.open_streams += 1
        responder = Responder(request, self._metrics, write_timeout_s=self._config.write_timeout_s)
        try:
            opening = stream.opening(after)
            await (responder.write(opening) if opening else responder.keepalive())
            while True:
                frames, after = stream.after(after)
                if frames:
                    await responder.write(frames)
                    stream.written(after)
                elif stream.ended:
                    break
                elif not await stream.grown(self._config.keepalive_s):
                    await responder.keepalive()
            assert responder.stream is not None
            await responder.stream.write_eof()
            if stream is not session.streams.standalone:
                session.streams.forget(stream)  # a response's stream, written to its end
        except (asyncio.CancelledError, ConnectionResetError, SlowClient, StreamGap):
            # A gap: the client lagged beyond what the stream keeps. Cut it; its resume gets 410.
            if responder.stream is None:
                raise
            responder.abandon()
        finally:
            session.streams.detach(stream)
            session.open_streams -= 1
            responder.close()
        assert responder.stream is not None
        return responder.stream

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        session = await self._session_for(request)
        await self._sessions.close(session.id)
        return web.Response(status=200)


def upstream_declares_tasks(discover_result: dict[str, Any]) -> bool:
    capabilities = discover_result.get("capabilities")
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions
