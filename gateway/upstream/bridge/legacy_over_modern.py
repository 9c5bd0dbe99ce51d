"""`LegacyOverModern`: 2025-11-25 client sessions carried onto an upstream that speaks only 2026-07-28.

Each legacy client session gets a `BridgedSession` channel that keeps the session's state itself (the
agreed version, the client's capabilities and info, the log level, the subscribed resources) and sends
every request upstream as a stateless 2026-07-28 request with the `_meta` envelope and its headers.
`initialize` is answered from the upstream's `server/discover`; `ping`, `logging/setLevel` and
`resources/(un)subscribe` are answered here. An upstream `InputRequiredResult` (MRTR) becomes
server-to-client requests on the client's response stream, and the client's answers go into the
retried call (`inputResponses`, the echoed `requestState`) on the same upstream channel. List changes
and resource updates come from one `subscriptions/listen` per session, to the session's GET stream.

It declares no Tasks to the client (the gateway hosts them: a legacy client's SEP-1686 requests have
no counterpart on a stateless upstream without translating the whole tasks dialect), and it never
declares the tasks extension upstream, so the upstream answers every call itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Coroutine, Mapping
from typing import Any

from gateway.buffers import BufferBudget
from gateway.principal import caller_entries
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import LOG_LEVEL_KEY, MODERN
from gateway.protocol.era import (
    CLIENT_INFO_KEY,
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    SERVER_INFO_KEY,
    SUBSCRIPTION_ID_KEY,
    TASKS_EXTENSION,
)
from gateway.protocol.jsonrpc import Message, Overloaded, RequestId
from gateway.upstream.base import Exchange, UnsolicitedHandler, Upstream, UpstreamChannel

log = logging.getLogger("gateway.upstream.bridge")

MODERN_ONLY_FIELDS = ("resultType", "ttlMs", "cacheScope")
"""Result fields a 2025-11-25 client has no use for (and a strict one would refuse)."""
MAX_INPUT_ROUNDS = 16
"""How many `input_required` answers one call may give before the bridge ends it with an error."""
INPUT_TIMEOUT = "input_timeout"
"""`data.reason` of the error a call gets when the client did not answer its input requests in time."""
LIST_CHANGES = (("tools", "toolsListChanged"), ("prompts", "promptsListChanged"), ("resources", "resourcesListChanged"))
"""Which `subscriptions/listen` filter key each list-changed capability of the upstream asks for."""


class LegacyOverModern:
    """The `LegacyBridge` of the era seam: one `BridgedSession` per 2025-11-25 client session."""

    def __init__(
        self, link: Upstream, input_timeout_s: float, discover_timeout_s: float, budget: BufferBudget | None = None
    ) -> None:
        self._link = link
        self._input_timeout_s = input_timeout_s
        self._discover_timeout_s = discover_timeout_s
        self._budget = budget
        self._sessions: set[BridgedSession] = set()

    async def open_session(self) -> UpstreamChannel:
        session = BridgedSession(
            self._link, self._input_timeout_s, self._discover_timeout_s, self._sessions.discard, self._budget
        )
        self._sessions.add(session)
        return session

    async def close(self) -> None:
        for session in list(self._sessions):
            await session.close()


def modern_capabilities(legacy: Mapping[str, Any]) -> dict[str, Any]:
    """A 2025-11-25 client's capabilities as its 2026-07-28 envelope declares them: without `tasks`, so
    the upstream runs every call itself (the gateway hosts the client's tasks)."""
    return {key: value for key, value in legacy.items() if key != "tasks"}


def legacy_capabilities(modern: Mapping[str, Any]) -> dict[str, Any]:
    """The upstream's `server/discover` capabilities as an `initialize` result declares them: without the
    2026-07-28 tasks extension, which a 2025-11-25 client cannot use."""
    capabilities = dict(modern)
    extensions = capabilities.get("extensions")
    if isinstance(extensions, dict) and TASKS_EXTENSION in extensions:
        rest = {key: value for key, value in extensions.items() if key != TASKS_EXTENSION}
        if rest:
            capabilities["extensions"] = rest
        else:
            del capabilities["extensions"]
    return capabilities


def legacy_result(request_id: RequestId, final: Message) -> Message:
    """The upstream's answer as a 2025-11-25 client expects it: its id, the 2026-only fields gone."""
    result = final.get("result")
    if not isinstance(result, dict):
        return {"jsonrpc": "2.0", "id": request_id, "error": final.get("error")}
    kept = {key: value for key, value in result.items() if key not in MODERN_ONLY_FIELDS}
    return {"jsonrpc": "2.0", "id": request_id, "result": kept}


def without_subscription_id(message: Message) -> Message:
    """A `subscriptions/listen` notification as a 2025-11-25 GET stream carries it (no subscriptionId)."""
    params = jsonrpc.params_of(message)
    meta = {key: value for key, value in jsonrpc.meta_of(message).items() if key != SUBSCRIPTION_ID_KEY}
    params = {key: value for key, value in params.items() if key != "_meta"}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "method": message["method"], "params": params}


class BridgedSession(UpstreamChannel):
    """One 2025-11-25 client session over stateless 2026-07-28 requests (see the module docstring).

    Every request runs as a task of this session; closing it cancels them all (each cancels its
    upstream request) and ends its `subscriptions/listen`."""

    def __init__(
        self,
        link: Upstream,
        input_timeout_s: float,
        discover_timeout_s: float,
        on_close: Any = None,
        budget: BufferBudget | None = None,
    ) -> None:
        self._link = link
        self._budget = budget
        self._input_timeout_s = input_timeout_s
        self._discover_timeout_s = discover_timeout_s
        self._on_close = on_close
        self._capabilities: dict[str, Any] = {}
        """The client's capabilities, as each upstream request's envelope declares them."""
        self._client_info: dict[str, Any] | None = None
        self._caller: dict[str, str] = {}
        """The caller of the session's latest request (`caller_entries`): whom its upstream requests,
        each a new stateless one, act for (one principal holds the session)."""
        self._log_level: str | None = None
        self._subscribed: set[str] = set()
        self._upstream_capabilities: dict[str, Any] = {}
        self._unsolicited: UnsolicitedHandler | None = None
        self._calls: dict[RequestId, tuple[Exchange, asyncio.Task[None]]] = {}
        """The client's requests in flight, by id (for `notifications/cancelled`)."""
        self._asked: dict[RequestId, asyncio.Future[Message]] = {}
        """Server-to-client requests made from an upstream's `inputRequests`, by the id the gateway gave."""
        self._work: set[asyncio.Task[None]] = set()
        self._listen: asyncio.Task[None] | None = None
        self._parked = False
        """The listen was ended to give its pooled stdio process back (`park`); `resume` reopens it."""
        self._closed = False

    # -- the channel -------------------------------------------------------------------------------

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        exchange = Exchange(message["id"], message["method"], self._budget, channel=self)
        if self._closed:
            exchange.fail(jsonrpc.INTERNAL_ERROR, "the bridged upstream session is closed")
            return exchange
        self._caller = caller_entries(headers) or self._caller
        task = self._spawn(self._serve(exchange, message))
        self._calls[message["id"]] = (exchange, task)

        async def cancel(reason: str) -> None:
            task.cancel()

        exchange.on_cancel(cancel)
        return exchange

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        """`notifications/cancelled` cancels the upstream request; every other client notification
        (initialized, progress, roots/list_changed) has no 2026-07-28 counterpart and ends here."""
        if message.get("method") != "notifications/cancelled":
            return
        call = self._calls.get(jsonrpc.params_of(message).get("requestId"))  # type: ignore[arg-type]
        if call is not None:
            exchange, task = call
            task.cancel()
            # As the stdio link does: the client's stream ends as its HTTP transport would end it.
            exchange.fail(jsonrpc.REQUEST_CANCELLED, "Request cancelled")

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        """The client's answer to one of the input requests made of an upstream's `inputRequests`; one
        that comes after its call stopped waiting is dropped (the call already ended with an error)."""
        answer = self._asked.get(message.get("id"))  # type: ignore[arg-type]
        if answer is not None and not answer.done():
            answer.set_result(message)

    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        self._unsolicited = handler

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for exchange, _ in list(self._calls.values()):
            exchange.fail(jsonrpc.INTERNAL_ERROR, "the session closed")
        for task in list(self._work):
            task.cancel()
        await asyncio.gather(*self._work, return_exceptions=True)
        if self._on_close is not None:
            self._on_close(self)

    async def park(self) -> bool:
        """An idle session on a stdio upstream gives back the process its `subscriptions/listen` holds
        (list changes meanwhile are lost, as a parked 2025-11-25 session loses its process's state)."""
        listen = self._listen
        if self._link.shared_stateless or listen is None or self._calls:
            return False
        self._listen, self._parked = None, True
        listen.cancel()
        await asyncio.gather(listen, return_exceptions=True)
        return True

    async def resume(self) -> None:
        if self._parked:
            self._parked = False
            await self._listen_again()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)
        return task

    # -- one client request --------------------------------------------------------------------------

    async def _serve(self, exchange: Exchange, message: Message) -> None:
        request_id, method = message["id"], message["method"]
        try:
            if method == "initialize":
                final = await self._initialize(message)
            elif method == "ping":
                final = {"jsonrpc": "2.0", "id": request_id, "result": {}}
            elif method == "logging/setLevel":
                level = jsonrpc.params_of(message).get("level")
                self._log_level = level if isinstance(level, str) else None
                final = {"jsonrpc": "2.0", "id": request_id, "result": {}}
            elif method in ("resources/subscribe", "resources/unsubscribe"):
                final = await self._subscribe(message)
            else:
                final = await self._forward(exchange, message)
            await exchange.deliver(final)
        except Overloaded as error:  # no pooled upstream process free in time: the client may retry
            exchange.fail(error.code, error.message, error.data)
        except Exception:
            log.exception("the era bridge failed to serve %s", method)
            exchange.fail(jsonrpc.INTERNAL_ERROR, f"Internal error: the gateway could not bridge {method}")
        finally:
            if self._calls.get(request_id, (None,))[0] is exchange:
                del self._calls[request_id]

    def _enveloped(
        self, request_id: RequestId, method: str, params: Mapping[str, Any]
    ) -> tuple[Message, dict[str, str]]:
        """`method` as a 2026-07-28 request of this session: the `_meta` envelope (the client's own
        `_meta` kept, e.g. its progressToken) and the headers that mirror it."""
        meta: dict[str, Any] = dict(params.get("_meta") or {})
        if self._client_info is not None:
            meta[CLIENT_INFO_KEY] = self._client_info
        if self._log_level is not None:
            meta[LOG_LEVEL_KEY] = self._log_level
        message, headers = MODERN.gateway_request(request_id, method, {**params, "_meta": meta}, self._capabilities)
        return message, {**headers, **self._caller}

    async def _initialize(self, message: Message) -> Message:
        """Answered from the upstream's `server/discover`, in the client's version when it is a
        handshake version (else the latest); the session's state starts here."""
        request_id, params = message["id"], jsonrpc.params_of(message)
        asked = params.get("protocolVersion")
        capabilities = params.get("capabilities")
        self._capabilities = modern_capabilities(capabilities if isinstance(capabilities, dict) else {})
        client_info = params.get("clientInfo")
        self._client_info = client_info if isinstance(client_info, dict) else None
        discover, headers = self._enveloped(request_id, "server/discover", {})
        async with self._link.stateless() as channel:
            upstream = await channel.request(discover, headers)
            try:
                async with asyncio.timeout(self._discover_timeout_s):
                    final = (await upstream.collect())[-1]
            except TimeoutError:
                await upstream.cancel()
                return jsonrpc.error_response(
                    request_id, jsonrpc.INTERNAL_ERROR, "the upstream did not answer server/discover in time"
                )
        result = final.get("result")
        if not isinstance(result, dict):
            return legacy_result(request_id, final)
        declared = result.get("capabilities")
        self._upstream_capabilities = declared if isinstance(declared, dict) else {}
        meta = result.get("_meta")
        server_info = meta.get(SERVER_INFO_KEY) if isinstance(meta, dict) else None
        answer: dict[str, Any] = {
            "protocolVersion": asked if asked in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE_VERSION,
            "capabilities": legacy_capabilities(self._upstream_capabilities),
            "serverInfo": server_info if isinstance(server_info, dict) else {"name": "upstream", "version": "0"},
        }
        if isinstance(result.get("instructions"), str):
            answer["instructions"] = result["instructions"]
        await self._listen_again()
        return {"jsonrpc": "2.0", "id": request_id, "result": answer}

    async def _forward(self, exchange: Exchange, message: Message) -> Message:
        """A request upstream with the envelope, its notifications relayed as they come; each
        `input_required` answer asks the client and retries on the same upstream channel (its
        `requestState` may be bound to that conversation)."""
        request_id, method = message["id"], message["method"]
        params = dict(jsonrpc.params_of(message))
        async with self._link.stateless() as channel:
            for number in range(MAX_INPUT_ROUNDS):
                upstream_id = request_id if number == 0 else f"{request_id}.r{number}"
                upstream_message, headers = self._enveloped(upstream_id, method, params)
                final = await self._relay(await channel.request(upstream_message, headers), exchange)
                result = final.get("result")
                if not (isinstance(result, dict) and result.get("resultType") == "input_required"):
                    return legacy_result(request_id, final)
                answered = await self._ask_client(exchange, result)
                if "error" in answered:
                    return {"jsonrpc": "2.0", "id": request_id, "error": answered["error"]}
                params = {key: value for key, value in params.items() if key not in ("inputResponses", "requestState")}
                params["inputResponses"] = answered["result"]
                if isinstance(result.get("requestState"), str):
                    params["requestState"] = result["requestState"]
        return jsonrpc.error_response(
            request_id,
            jsonrpc.INTERNAL_ERROR,
            f"the upstream asked for input more than {MAX_INPUT_ROUNDS} times in one {method}; the call was ended",
        )

    async def _relay(self, upstream: Exchange, exchange: Exchange) -> Message:
        """The upstream exchange's notifications to the client's, as they come; returns its response.
        A call that stops here (cancelled, the session closed) is cancelled upstream."""
        try:
            while (batch := await upstream.next_batch()) is not None:
                for message in batch:
                    if jsonrpc.is_final(message):
                        return message
                    await exchange.deliver(message)
        finally:
            if not upstream.finished:
                await upstream.cancel()
        return jsonrpc.error_response(upstream.request_id, jsonrpc.INTERNAL_ERROR, "upstream gave no response")

    async def _ask_client(self, exchange: Exchange, result: Mapping[str, Any]) -> Message:
        """The `inputRequests` as server-to-client requests on the call's stream; `{"result": responses}`
        keyed as asked once the client answered them all, or `{"error": …}`."""
        requests = result.get("inputRequests") or {}
        if not isinstance(requests, dict) or not all(
            isinstance(request, dict) and isinstance(request.get("method"), str) for request in requests.values()
        ):
            return {"error": {"code": jsonrpc.INTERNAL_ERROR, "message": "the upstream sent malformed inputRequests"}}
        loop = asyncio.get_running_loop()
        asked: dict[str, tuple[str, asyncio.Future[Message]]] = {}
        try:
            for key, request in requests.items():
                server_request_id = f"bridge-{secrets.token_hex(8)}"
                answer: asyncio.Future[Message] = loop.create_future()
                self._asked[server_request_id] = answer
                asked[key] = (server_request_id, answer)
                params = request.get("params")
                await exchange.deliver(
                    {
                        "jsonrpc": "2.0",
                        "id": server_request_id,
                        "method": request["method"],
                        "params": params if isinstance(params, dict) else {},
                    }
                )
            try:
                async with asyncio.timeout(self._input_timeout_s):
                    responses = {key: await answer for key, (_, answer) in asked.items()}
            except TimeoutError:
                methods = sorted({str(request["method"]) for request in requests.values()})
                return {
                    "error": {
                        "code": jsonrpc.INTERNAL_ERROR,
                        "message": (
                            f"Request timeout: the client did not answer {', '.join(methods)} within "
                            f"{self._input_timeout_s:g} s ([upstream.bridge] input_timeout_s); the call was ended"
                        ),
                        "data": {"reason": INPUT_TIMEOUT, "limit": self._input_timeout_s},
                    }
                }
        finally:
            for server_request_id, _ in asked.values():
                self._asked.pop(server_request_id, None)
        for response in responses.values():
            if "error" in response:
                return {"error": response["error"]}
        return {"result": {key: response.get("result") for key, response in responses.items()}}

    # -- list changes and resource updates --------------------------------------------------------

    async def _subscribe(self, message: Message) -> Message:
        uri = jsonrpc.params_of(message).get("uri")
        if not isinstance(uri, str):
            return jsonrpc.error_response(message["id"], jsonrpc.INVALID_PARAMS, "Invalid params: uri must be a string")
        if message["method"] == "resources/subscribe":
            self._subscribed.add(uri)
        else:
            self._subscribed.discard(uri)
        await self._listen_again()
        return {"jsonrpc": "2.0", "id": message["id"], "result": {}}

    def _listen_filter(self) -> dict[str, Any]:
        """What the session's `subscriptions/listen` asks for: the resources the client subscribed to,
        and the list changes the upstream declares, from an upstream where one listen sees them all (HTTP).
        A stdio upstream's pooled processes are servers of their own: a listen in one sees only its own
        list changes, and would hold that process for the session's life, so it is opened there only for
        resources the client subscribed to."""
        wanted: dict[str, Any] = {}
        if self._link.shared_stateless:
            for capability, key in LIST_CHANGES:
                declared = self._upstream_capabilities.get(capability)
                if isinstance(declared, dict) and declared.get("listChanged"):
                    wanted[key] = True
        if self._subscribed:
            wanted["resourceSubscriptions"] = sorted(self._subscribed)
        return wanted

    async def _listen_again(self) -> None:
        """(Re)open the session's `subscriptions/listen` with the current filter, and wait (bounded) for
        its acknowledgement, so that a change made after this returns reaches the client."""
        if self._listen is not None:
            self._listen.cancel()
            self._listen = None
        wanted = self._listen_filter()
        if not wanted or self._closed:
            return
        acknowledged = asyncio.Event()
        self._listen = self._spawn(self._listening(wanted, acknowledged))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._discover_timeout_s):
                await acknowledged.wait()

    async def _listening(self, wanted: dict[str, Any], acknowledged: asyncio.Event) -> None:
        message, headers = self._enveloped(
            f"listen-{secrets.token_hex(4)}", "subscriptions/listen", {"notifications": wanted}
        )
        try:
            async with self._link.stateless() as channel:
                upstream = await channel.request(message, headers)
                try:
                    while (batch := await upstream.next_batch()) is not None:
                        for note in batch:
                            if jsonrpc.is_final(note):
                                log.info(
                                    "the upstream ended a bridged session's subscriptions/listen: %s", note.get("error")
                                )
                                return
                            if note.get("method") == "notifications/subscriptions/acknowledged":
                                acknowledged.set()
                            elif "method" in note and self._unsolicited is not None:
                                await self._unsolicited(without_subscription_id(note), 0)
                finally:
                    if not upstream.finished:
                        await upstream.cancel()
        except Overloaded as error:
            log.warning("a bridged session opens no subscriptions/listen: %s", error.message)
        finally:
            acknowledged.set()  # whoever waits for it stops waiting
