"""The MCP endpoint clients talk to: both eras on one path, each request classified once.

A request whose `MCP-Protocol-Version` header is absent or a handshake version takes the legacy
session path (initialize, Mcp-Session-Id, GET stream, DELETE); any other version takes the stateless
2026-07-28 path. After the transport checks, the task service (`gateway.tasks.service`) decides what
a request means and returns a plan, which the endpoint carries out over HTTP: a reply now, a forward
to the upstream relayed back as it is produced, a `tasks/stream` served from the event log, or a legacy
`tasks/result` that waits for its task. The endpoint decides no task semantics itself.

Handlers rely on aiohttp's `handler_cancellation` to learn that a client went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from gateway import telemetry
from gateway.buffers import BufferBudget
from gateway.config import AuthConfig, ServerConfig
from gateway.drain import Drain
from gateway.edge import checks
from gateway.edge.auth import AuthRefused, EdgeAuth, presented_token
from gateway.edge.limits import PrincipalLimits, RateLimited
from gateway.edge.rejections import UNKNOWN_TASK_MESSAGE, Rejections
from gateway.edge.relay import RelaySettings, relay
from gateway.edge.responder import Responder, SlowClient, json_response
from gateway.edge.task_routes import await_result, stream_events
from gateway.metrics import Metrics
from gateway.principal import Principal, on_route, with_caller
from gateway.protocol import jsonrpc
from gateway.protocol.envelope import check_modern_request
from gateway.protocol.era import Era
from gateway.protocol.fields import check_fields
from gateway.protocol.jsonrpc import Kind, Message, Overloaded, ProtocolError, Unavailable
from gateway.protocol.names import SESSION_HEADER
from gateway.replay import LAST_EVENT_ID, ReplayStream, StreamGap
from gateway.sessions import Session, SessionRegistry
from gateway.tasks.plans import AwaitResult, Forward, Plan, RelayHooks, Reply, StreamEvents, TaskCall
from gateway.tasks.service import TaskService
from gateway.upstream.base import Upstream, UpstreamChannel

log = logging.getLogger("gateway.edge")


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
    if isinstance(error, AuthRefused) and error.challenge is not None:
        headers["WWW-Authenticate"] = error.challenge
    if isinstance(error, RateLimited):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, Overloaded | Unavailable):
        headers["Retry-After"] = str(retry_after_s)
    return json_response(message, status, headers)


def _not_allowed(method: str) -> ProtocolError:
    return ProtocolError(
        jsonrpc.INVALID_REQUEST,
        f"Method Not Allowed: {method} is not served on the 2026-07-28 path; use POST",
        http_status=405,
    )


@dataclass(frozen=True, slots=True)
class EndpointScope:
    """Which endpoint this is: the gateway's main one (`name` None), or one upstream's own
    (`/servers/NAME/mcp`), whose callers' tasks and sessions are its alone (`on_route`)."""

    name: str | None
    rules: AuthConfig
    """The `[[auth.rules]]` that apply here (`Config.for_route`)."""
    unavailable: Callable[[], ProtocolError | None] = lambda: None
    """The error every request gets while the endpoint's upstream is not usable (503, as /readyz)."""
    drain: Drain = dataclasses.field(default_factory=lambda: Drain(0.0))
    """The replica's drain: its POSTs are counted in flight; once it begins, new requests get 503."""
    hands_down_caller: bool = False
    """An upstream here acts for the caller (`token_exchange`): each call carries the caller's validated
    token down to it (`gateway.principal.with_caller`)."""
    upstream: str | None = None
    """The name of the one upstream behind it, for traces; None for the aggregate of several."""


PostHandler = Callable[[web.Request, Era, Message, Kind, dict[str, str], Principal], Awaitable[web.StreamResponse]]
"""Serves a checked and parsed POST in its era's way (in a session, or on its own)."""


class McpEndpoint:
    def __init__(
        self,
        config: ServerConfig,
        upstream: Upstream,
        sessions: SessionRegistry,
        service: TaskService,
        metrics: Metrics,
        rejections: Rejections,
        budget: BufferBudget,
        auth: EdgeAuth,
        *,
        stream_write_timeout_s: float,
        scope: EndpointScope | None = None,
    ) -> None:
        self._config = config
        self._auth = auth
        self._scope = scope or EndpointScope(None, auth.config)
        rules = self._scope.rules
        self._limits = PrincipalLimits(rules.limits, rules=rules.rules) if auth.enabled else None
        self._budget = budget
        self._upstream = upstream
        self._sessions = sessions
        self._service = service
        self._metrics = metrics
        self._rejections = rejections
        self._stream_write_timeout_s = stream_write_timeout_s
        self._relay = RelaySettings(metrics, config.keepalive_s, config.flush_interval_ms / 1000)

    def reconfigure(self, auth: EdgeAuth, rules: AuthConfig) -> None:
        """Authenticate with `auth` and apply `rules` (`[[auth.rules]]`, `[auth.limits]`) to the requests
        that come from now on (a config reload); requests under way finish under what they started with,
        and what principals hold against their limits is kept."""
        before, self._auth = self._scope.rules, auth
        self._scope = dataclasses.replace(self._scope, rules=rules)
        if self._limits is not None and (rules.limits, rules.rules) != (before.limits, before.rules):
            self._limits.configure(rules.limits, rules.rules)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":  # a GET stream lasts as long as its session: never waited for
            return await self._handle(request)
        with self._scope.drain.track():
            return await self._handle(request)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        principal: Principal | None = None
        try:
            checks.check_host(request.headers.get("Host"), self._config.allowed_hosts)
            checks.check_origin(request.headers.get("Origin"), self._config.allowed_origins)
            principal = await self._auth.authenticate(request)
            if self._limits is not None:
                self._limits.admit(principal.owner)
            if (unavailable := self._scope.unavailable()) is not None:
                raise unavailable
            principal = on_route(principal, self._scope.name)
            era = Era.for_header(request.headers.get("MCP-Protocol-Version"))
            # Era branch: 2025-11-25 requests live in sessions (handshake, GET stream, DELETE, client
            # responses); 2026-07-28 ones stand alone, on POST only.
            if era.has_sessions:
                return await self._in_session(request, era, principal)
            if request.method != "POST":
                raise _not_allowed(request.method)
            return await self._post(request, era, principal, self._modern_post)
        except ProtocolError as error:
            return self._refused(request, error, principal)

    async def _in_session(self, request: web.Request, era: Era, principal: Principal) -> web.StreamResponse:
        if request.method == "POST":
            return await self._post(request, era, principal, self._legacy_post)
        if request.method == "GET":
            if (draining := self._scope.drain.refusal()) is not None:
                raise draining
            return await self._get_stream(request, principal)
        if request.method == "DELETE":
            return await self._delete(request, principal)
        raise _not_allowed(request.method)

    def _refused(
        self, request: web.Request, error: ProtocolError, principal: Principal | None, message: Message | None = None
    ) -> web.Response:
        """The answer to a request refused before the task service saw it, counted and logged."""
        self._metrics.requests.labels(method="-", outcome="rejected").inc()
        self._rejections.refused(error, request.remote, principal.owner if principal else None, message)
        return self._error_response(error)

    def _error_response(self, error: ProtocolError, era: Era | None = None) -> web.Response:
        telemetry.annotate(telemetry.ERROR_CODE, error.code)
        if isinstance(error, Overloaded):
            self._metrics.rejected.labels(limit=error.limit).inc()
        return error_response(error, era, retry_after_s=self._config.retry_after_s)

    # -- POST ------------------------------------------------------------------------------------

    async def _post(
        self, request: web.Request, era: Era, principal: Principal, serve: PostHandler
    ) -> web.StreamResponse:
        checks.check_content_type(request.headers.get("Content-Type"))
        checks.check_accept_post(request.headers.get("Accept"))
        message = jsonrpc.parse_message(await self._read_body(request), self._config.max_json_depth)
        telemetry.join(
            message,
            **{
                telemetry.ERA: era.value,
                telemetry.PRINCIPAL: principal.owner,
                telemetry.UPSTREAM: self._scope.upstream,
            },
        )
        try:
            kind = jsonrpc.classify(message)
            # Draining: a new request is refused; a response or notification (an answer to a running
            # call's question, a cancel) still reaches what is in flight.
            if kind is Kind.REQUEST and (draining := self._scope.drain.refusal(message["id"])) is not None:
                raise draining
            if kind is not Kind.RESPONSE:
                check_fields(message)
            if kind is Kind.REQUEST:
                self._check_call(principal, message)
            headers = forwardable_headers(request.headers)
            if self._scope.hands_down_caller:
                headers = with_caller(headers, principal, presented_token(request.headers))
            return await serve(request, era, message, kind, headers, principal)
        except ProtocolError as error:
            return self._refused(request, error, principal, message)

    def _check_call(self, principal: Principal, message: Message) -> None:
        """A `tools/call` the tool's `[[auth.rules]]` entry refuses (403), or over its per-tool rate (429)."""
        rule = self._auth.check_call(principal, message, self._scope.rules)
        if rule is None or self._limits is None:
            return
        try:
            self._limits.admit_call(principal.owner, str(jsonrpc.params_of(message).get("name")), rule)
        except RateLimited as error:
            error.request_id = message["id"]
            raise

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self._config.max_body_bytes
        too_large = ProtocolError(
            jsonrpc.INVALID_REQUEST, f"Payload Too Large: the body exceeds {limit} bytes", http_status=413
        )
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        body = bytearray()
        rate = self._config.min_body_rate_bytes_s
        try:
            async with asyncio.timeout(self._config.header_timeout_s) as deadline:
                async for chunk in request.content.iter_any():
                    body += chunk
                    if len(body) > limit:
                        raise too_large
                    # Each chunk buys the time it takes at the slowest rate accepted: a body that trickles
                    # cannot hold a connection (and its buffered bytes) for long.
                    deadline.reschedule((deadline.when() or 0.0) + len(chunk) / rate)
        except TimeoutError:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                f"Request Timeout: the body arrived slower than {rate} bytes/s "
                f"(server.min_body_rate_bytes_s, after {self._config.header_timeout_s} s)",
                http_status=408,
            ) from None
        return bytes(body)

    async def _legacy_post(
        self,
        request: web.Request,
        era: Era,
        message: Message,
        kind: Kind,
        headers: dict[str, str],
        principal: Principal,
    ) -> web.StreamResponse:
        if kind is Kind.REQUEST and message["method"] == "initialize":
            return await self._initialize(request, era, message, headers, principal)
        session = await self._session_for(request, principal)
        if kind is not Kind.NOTIFICATION or message["method"] != "notifications/initialized":
            session.engage()
        if kind is Kind.NOTIFICATION:
            await self._service.client_notification(session, message, headers)
            return web.Response(status=202)
        if kind is Kind.RESPONSE:
            await self._service.client_response(session, message, headers)
            return web.Response(status=202)

        async def session_channel() -> UpstreamChannel:
            self._budget.admit(message["id"])
            await self._sessions.resume(session)  # a parked session takes a process back (or gets 503)
            return session.channel

        call = TaskCall(message, era, headers, session, session_channel, owner=principal.owner)
        with session.serving():
            return await self._dispatch(request, call, principal)

    async def _initialize(
        self, request: web.Request, era: Era, message: Message, headers: dict[str, str], principal: Principal
    ) -> web.StreamResponse:
        try:
            if self._limits is not None:
                held = self._sessions.held_by(principal.owner)
                self._limits.check_sessions(principal.owner, held, self._config.retry_after_s)
            session = await self._sessions.create(principal.owner)
        except (Overloaded, RateLimited) as error:
            error.request_id = message["id"]
            raise
        with session.serving():  # the handshake timeout runs once initialize has been answered
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
        final = messages.pop()
        self._metrics.requests.labels(method="initialize", outcome="error" if "error" in final else "ok").inc()
        if "error" in final or not isinstance(final.get("result"), dict):
            await self._sessions.close(session.id)
            return json_response(final)
        session.agreed_version(str(final["result"].get("protocolVersion")))
        final = {**final, "result": self._service.initialized(session, final["result"])}
        responder = Responder(request, self._metrics, headers={SESSION_HEADER: session.id})
        try:
            if messages:
                await responder.send(messages)
            return await responder.finish(final, era)
        finally:
            responder.close()

    async def _modern_post(
        self,
        request: web.Request,
        era: Era,
        message: Message,
        kind: Kind,
        headers: dict[str, str],
        principal: Principal,
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
                # A forwarded tasks/stream (the upstream serves it) lasts as long as its task: beside the rest.
                beside = message["method"] == "tasks/stream"
                stateless = self._upstream.stateless(affinity, beside=beside, owner=principal.owner)
                leased.append(await call.resources.enter_async_context(stateless))
            return leased[0]

        call = TaskCall(message, era, headers, None, lease, owner=principal.owner)
        return await self._dispatch(request, call, principal)

    # -- carrying out the service's plan -----------------------------------------------------------

    async def _dispatch(self, request: web.Request, call: TaskCall, principal: Principal) -> web.StreamResponse:
        limits = self._limits
        names_task = call.method.startswith("tasks/") and "taskId" in jsonrpc.params_of(call.message)
        reserved: Callable[[], None] | None = None
        """Gives back the failed lookup taken before the task is looked up, unless it is not found."""
        no_such_task = False
        try:
            with contextlib.ExitStack() as held:
                if limits is not None and names_task:
                    reserved = limits.reserve_lookup(call.owner)
                if limits is not None and call.method == "tasks/stream":
                    held.enter_context(limits.stream(call.owner, self._config.retry_after_s))
                facts = await self._service.upstream_facts(call)
                plan = await self._service.plan(call, facts)
                if reserved is not None:
                    reserved()  # found: a stream or a wait that follows must not hold the budget
                    reserved = None
                return await self._carry_out(request, call, plan, principal)
        except ProtocolError as error:
            # An unknown (or another principal's) task id: a failed lookup for `[auth.limits]`.
            no_such_task = names_task and error.message == UNKNOWN_TASK_MESSAGE
            if limits is not None and no_such_task and reserved is None:
                limits.lookup_failed(call.owner)
            if error.request_id is None:
                error.request_id = call.message["id"]
            outcome = "events_gone" if error.code == -32010 else "error"
            self._metrics.requests.labels(method=call.method, outcome=outcome).inc()
            response = self._error_response(error, call.era)
            if isinstance(error, RateLimited) or no_such_task:
                self._rejections.refused(error, request.remote, call.owner, call.message, response.status)
            return response
        finally:
            if reserved is not None and not no_such_task:
                reserved()
            if not call.resources_kept:
                await call.resources.aclose()

    async def _carry_out(
        self, request: web.Request, call: TaskCall, plan: Plan, principal: Principal
    ) -> web.StreamResponse:
        if isinstance(plan, Reply):
            return await Responder(request, self._metrics).finish(plan.message, call.era)
        if isinstance(plan, Forward):
            exchange = await plan.channel.request(plan.message, plan.headers)
            streams = call.session.streams if call.session is not None else None
            responder = Responder(request, self._metrics, write_timeout_s=self._config.write_timeout_s, streams=streams)
            hooks = self._hide_tools(plan.hooks, principal) if call.method == "tools/list" else plan.hooks
            return await relay(exchange, responder, call.era, self._relay, hooks)
        if isinstance(plan, StreamEvents):
            return await stream_events(
                plan, Responder(request, self._metrics, write_timeout_s=self._stream_write_timeout_s)
            )
        assert isinstance(plan, AwaitResult)
        return await await_result(plan, Responder(request, self._metrics), call.era, self._config.keepalive_s)

    def _hide_tools(self, hooks: RelayHooks, principal: Principal) -> RelayHooks:
        """The forward's hooks, with the tools `[[auth.rules]]` hide from this caller taken out of the list."""
        if not self._auth.enabled:
            return hooks
        transform = hooks.transform

        async def visible(final: Message) -> Message:
            if transform is not None:
                final = await transform(final)
            result = final.get("result")
            if not isinstance(result, dict):
                return final
            return {**final, "result": self._auth.visible_tools(principal, result, self._scope.rules)}

        return dataclasses.replace(hooks, transform=visible)

    # -- GET and DELETE (legacy only) -------------------------------------------------------------

    async def _session_for(self, request: web.Request, principal: Principal) -> Session:
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
        # Another principal's session is not theirs to find: the same 404 as an unknown id.
        if session is None or session.owner != principal.owner:
            raise ProtocolError(
                jsonrpc.INVALID_REQUEST,
                "Session not found: it expired or was deleted; initialize a new session",
                http_status=404,
            )
        return session

    async def _get_stream(self, request: web.Request, principal: Principal) -> web.StreamResponse:
        """The standalone stream, or with Last-Event-ID the rest of the stream that id names: the events
        after it, then live to its end (a forwarded response's stream ends with its response)."""
        checks.check_accept_stream(request.headers.get("Accept"))
        session = await self._session_for(request, principal)
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
        session.engage()
        responder = Responder(request, self._metrics, write_timeout_s=self._config.write_timeout_s)
        with session.serving():
            try:
                await self._replay(stream, after, responder)
                if stream is not session.streams.standalone:
                    session.streams.forget(stream)  # a response's stream, written to its end
            except (asyncio.CancelledError, ConnectionResetError, SlowClient, StreamGap):
                # A gap: the client lagged beyond what the stream keeps. Cut it; its resume gets 410.
                if responder.stream is None:
                    raise
                responder.abandon()
            finally:
                session.streams.detach(stream)
                responder.close()
        assert responder.stream is not None
        return responder.stream

    async def _replay(self, stream: ReplayStream, after: int, responder: Responder) -> None:
        """The stream's events after `after`, then live until it ends (a response's stream ends with it)."""
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

    async def _delete(self, request: web.Request, principal: Principal) -> web.StreamResponse:
        session = await self._session_for(request, principal)
        await self._sessions.close(session.id)
        return web.Response(status=200)
