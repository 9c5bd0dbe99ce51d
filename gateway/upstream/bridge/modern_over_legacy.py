"""`ModernOverLegacy`: 2026-07-28 requests carried on pooled 2025-11-25 upstream sessions.

Each 2026 request gets a `BridgeChannel` (`channel(owner)`); its `request()` picks the session of the
request's principal and declared capabilities (`session_pool`), sends the request there without its
envelope and under a session-unique id (`translate`), and returns an `Exchange` that a pump fills from
the upstream's: notifications in order (progress under the client's token, logs only at or above the
request's `logLevel`), then the response as a 2026 result. `server/discover` is answered from the
session's `initialize` result, `subscriptions/listen` from its unsolicited list changes and resource
updates, and a method 2026-07-28 does not have gets -32601.

MRTR: a server-to-client request (elicitation, sampling, roots) on a `tools/call`, `prompts/get` or
`resources/read` ends the client's exchange with an `InputRequiredResult` whose `requestState` is
sealed (`request_state`): the upstream call is held, for at most `input_timeout_s` (then cancelled
upstream), until a retry carrying that state and `inputResponses` for every input request answers the
upstream's requests; the retry's exchange carries on with the held call's messages. The bridge owns the
pumps and the held calls (`close()` ends them); a dropped client cancels its call upstream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.buffers import BufferBudget
from gateway.config.upstream import BridgeConfig
from gateway.principal import caller_entries
from gateway.protocol import jsonrpc
from gateway.protocol.era import SUBSCRIPTION_ID_KEY
from gateway.protocol.jsonrpc import Message, ProtocolError, RequestId
from gateway.upstream.base import Exchange, UnsolicitedHandler, Upstream, UpstreamChannel
from gateway.upstream.bridge import translate
from gateway.upstream.bridge.request_state import RequestStateSealer
from gateway.upstream.bridge.session_pool import BridgeSession, SessionFailed, SessionPool

log = logging.getLogger("gateway.upstream.bridge")

UNKNOWN_STATE = "Invalid params: unknown requestState (call again without requestState and inputResponses)"
TIMED_OUT_STATE = (
    "Invalid params: the upstream call this requestState resumes was cancelled because no retry came within "
    "upstream.bridge.input_timeout_s; call again without requestState and inputResponses"
)
INPUT_TIMEOUT_REASON = "no answer to the input request within the gateway's upstream.bridge.input_timeout_s"
TIMED_OUT_REMEMBERED = 1024
"""Timed-out held calls remembered, so that their late retries are told so (older ones look unknown)."""
LISTEN_FILTERS = {
    "notifications/tools/list_changed": "toolsListChanged",
    "notifications/prompts/list_changed": "promptsListChanged",
    "notifications/resources/list_changed": "resourcesListChanged",
}


class BridgedCall:
    """One 2026 request on a session: the upstream exchange, the client's current exchange (a new one
    per MRTR round), and the input requests the held call waits on."""

    def __init__(
        self, session: BridgeSession, owner: str | None, message: Message, upstream: Exchange, upstream_id: str
    ) -> None:
        self.id = secrets.token_urlsafe(12)
        self.session = session
        self.owner = owner
        self.message = message
        self.method: str = message["method"]
        self.upstream = upstream
        self.upstream_id = upstream_id
        self.fresh = True
        """Nothing came back yet: a session found gone by this very request may be replaced for it."""
        self.takes_input = self.method in translate.MRTR_METHODS
        self.declared = translate.client_capabilities(message)
        self.client: Exchange | None = None
        self.progress_token: Any = None
        self.log_threshold: int | None = None
        self.pending: dict[str, RequestId] = {}
        """Input key -> the upstream's request id, while the call is held."""
        self.resumed = asyncio.Event()
        self.rounds = 0

    def serve(self, message: Message, client: Exchange) -> None:
        """The client exchange (first request or a retry) the call's messages now go to."""
        self.client = client
        self.progress_token = jsonrpc.meta_of(message).get("progressToken")
        self.log_threshold = translate.log_level(message)


class ModernOverLegacy:
    """The `ModernBridge` for an upstream that speaks only 2025-11-25 (see the module docstring)."""

    def __init__(self, link: Upstream, config: BridgeConfig, budget: BufferBudget, open_timeout_s: float) -> None:
        self._pool = SessionPool(link, config, open_timeout_s)
        self._budget = budget
        self._input_timeout_s = config.input_timeout_s
        self._sealer = RequestStateSealer()
        self._held: dict[str, BridgedCall] = {}
        self._timed_out: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def sessions(self) -> int:
        """Upstream sessions held now."""
        return len(self._pool)

    @contextlib.asynccontextmanager
    async def channel(self, owner: str | None) -> AsyncIterator[UpstreamChannel]:
        yield BridgeChannel(self, owner)

    def owns(self, channel: UpstreamChannel) -> bool:
        return isinstance(channel, BridgeChannel) and channel.bridge is self

    async def close(self) -> None:
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._pool.close()

    # -- one request -----------------------------------------------------------------------------

    async def request(self, owner: str | None, message: Message, headers: Mapping[str, str]) -> Exchange:
        method = message["method"]
        try:
            if "requestState" in jsonrpc.params_of(message):
                return await self._resume(owner, message)
            caller = caller_entries(headers)
            if method == "server/discover":
                return await self._discover(owner, message, caller)
            if method == "subscriptions/listen":
                return await self._listen(owner, message, caller)
            if method not in translate.FORWARDED_METHODS:
                raise ProtocolError(
                    jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method} does not exist in 2026-07-28"
                )
            return await self._start(owner, message, headers)
        except SessionFailed as failure:
            return self._failed(message, jsonrpc.INTERNAL_ERROR, str(failure))
        except ProtocolError as error:
            if error.http_status == 503:
                raise  # UpstreamBusy: the edge answers 503 with Retry-After
            return self._failed(message, error.code, error.message, error.data)

    def _failed(self, message: Message, code: int, text: str, data: object = None) -> Exchange:
        exchange = Exchange(message["id"], message["method"], self._budget)
        exchange.fail(code, text, data)
        return exchange

    async def _answered(self, message: Message, final: Message) -> Exchange:
        exchange = Exchange(message["id"], message["method"], self._budget)
        await exchange.deliver(final)
        return exchange

    async def _discover(self, owner: str | None, message: Message, caller: Mapping[str, str]) -> Exchange:
        session = await self._pool.acquire(owner, message, caller)
        self._pool.release(session)
        result = translate.discover_result(session.initialized)
        return await self._answered(message, jsonrpc_result(message["id"], result))

    async def _start(self, owner: str | None, message: Message, headers: Mapping[str, str]) -> Exchange:
        session = await self._pool.acquire(owner, message, caller_entries(headers))
        try:
            if message["method"] == "tools/call":
                await session.tool_schemas.check(functools.partial(self._pool.ask, session), message, headers)
            upstream_id = session.next_id()
            upstream = await session.channel.request(translate.legacy_request(message, upstream_id), session.headers)
        except BaseException:
            self._pool.release(session)
            raise
        call = BridgedCall(session, owner, message, upstream, upstream_id)
        session.calls[upstream_id] = call
        client = self._client_exchange(call, message)
        pump = asyncio.create_task(self._pump(call), name=f"bridge-{message['method']}")
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return client

    def _client_exchange(self, call: BridgedCall, message: Message) -> Exchange:
        client = Exchange(message["id"], message["method"], self._budget)
        call.serve(message, client)

        async def cancel(reason: str) -> None:
            if call.client is client and not call.pending:
                await call.upstream.cancel(reason)  # notifications/cancelled upstream

        client.on_cancel(cancel)
        return client

    # -- the pump: the upstream's messages to the client's exchange --------------------------------

    async def _pump(self, call: BridgedCall) -> None:
        try:
            await self._relay(call)
        except Exception:
            log.exception("bridged %s failed in the bridge", call.method)
            if call.client is not None:
                call.client.fail(jsonrpc.INTERNAL_ERROR, "the gateway's era bridge failed (its log has the cause)")
        finally:
            session = call.session
            session.calls.pop(call.upstream_id, None)
            self._held.pop(call.id, None)
            self._pool.release(session)
            if session.channel.lost:
                self._pool.drop(session, "the upstream ended its session")

    async def _relay(self, call: BridgedCall) -> None:
        while (batch := await call.upstream.next_batch()) is not None:
            if call.fresh and self._session_unknown(call, batch):
                # The upstream answered that it no longer knows the session (it never ran the
                # request): a new session takes the request, once.
                call.fresh = False
                if await self._reopen(call):
                    continue
            call.fresh = False
            requests: list[Message] = []
            for message in batch:
                client = call.client
                assert client is not None
                if jsonrpc.is_final(message):
                    await client.deliver(
                        translate.modern_final(message, client.request_id, call.method, call.session.server_info)
                    )
                    return
                if "id" in message and "method" in message:
                    if await self._takes_input(call, message):
                        requests.append(message)
                elif (notification := self._notification(call, message)) is not None:
                    await client.deliver(notification)
            if requests and not await self._hold(call, requests):
                return
        if call.client is not None:  # cancelled, or a link that ended without a response
            call.client.fail(jsonrpc.INTERNAL_ERROR, call.upstream.failure or "the upstream gave no response")

    @staticmethod
    def _session_unknown(call: BridgedCall, batch: list[Message]) -> bool:
        if call.session.channel.lost and call.upstream.failure is not None:
            return True  # the link saw the session end (HTTP 404)
        return len(batch) == 1 and translate.says_session_unknown(batch[0])

    async def _reopen(self, call: BridgedCall) -> bool:
        """Send `call` again on a new session of its key; False when none can be had now."""
        lost = call.session
        lost.calls.pop(call.upstream_id, None)
        self._pool.drop(lost, "the upstream ended its session")
        try:
            session = await self._pool.acquire(call.owner, call.message, caller_entries(lost.headers))
        except (SessionFailed, ProtocolError):
            return False
        upstream_id = session.next_id()
        try:
            upstream = await session.channel.request(
                translate.legacy_request(call.message, upstream_id), session.headers
            )
        except BaseException:
            self._pool.release(session)
            raise
        self._pool.release(lost)
        call.session, call.upstream, call.upstream_id = session, upstream, upstream_id
        session.calls[upstream_id] = call
        return True

    def _notification(self, call: BridgedCall, message: Message) -> Message | None:
        method = message.get("method")
        if method == "notifications/progress":
            if call.progress_token is None:
                return None
            params = {**jsonrpc.params_of(message), "progressToken": call.progress_token}
            return {**message, "params": params}
        if method == "notifications/message":
            return message if translate.wants_log(message, call.log_threshold) else None
        return None if method in translate.LEGACY_ONLY_NOTIFICATIONS else message

    async def _takes_input(self, call: BridgedCall, request: Message) -> bool:
        """Whether a server request becomes an MRTR input request; otherwise it is answered here."""
        method = request["method"]
        capability = translate.INPUT_CAPABILITY.get(method)
        if method == "ping":
            answer: Message = {"jsonrpc": "2.0", "id": request["id"], "result": {}}
        elif capability is not None and call.takes_input and isinstance(call.declared.get(capability), dict):
            return True
        else:
            text = f"Method not found: {method} cannot reach this 2026-07-28 client"
            answer = jsonrpc.error_response(request["id"], jsonrpc.METHOD_NOT_FOUND, text)
        await call.session.channel.respond(answer, call.session.headers)
        return False

    async def _hold(self, call: BridgedCall, requests: list[Message]) -> bool:
        """End the client's exchange with an InputRequiredResult and hold the call until its retry
        (True) or `input_timeout_s` (cancelled upstream: False)."""
        client = call.client
        assert client is not None
        inputs: dict[str, Any] = {}
        for request in requests:
            call.rounds += 1
            key = f"input-{call.rounds}"
            call.pending[key] = request["id"]
            inputs[key] = translate.input_request(request)
        expires_at = time.time() + 2 * self._input_timeout_s  # a late retry is told the call timed out
        state = self._sealer.seal(call.id, call.owner, expires_at)
        self._held[call.id] = call
        call.resumed.clear()
        await client.deliver(translate.input_required(client.request_id, inputs, state, call.session.server_info))
        try:
            async with asyncio.timeout(self._input_timeout_s):
                await call.resumed.wait()
        except TimeoutError:
            if self._held.pop(call.id, None) is None:  # a retry claimed it meanwhile
                await call.resumed.wait()
                return True
            self._timed_out[call.id] = None
            while len(self._timed_out) > TIMED_OUT_REMEMBERED:
                self._timed_out.popitem(last=False)
            call.client = None
            await call.upstream.cancel(INPUT_TIMEOUT_REASON)
            return False
        return True

    # -- MRTR retries ----------------------------------------------------------------------------

    async def _resume(self, owner: str | None, message: Message) -> Exchange:
        params = jsonrpc.params_of(message)
        sealed = self._sealer.open(params.get("requestState"), owner, time.time())
        call = self._held.get(sealed.call_id) if sealed is not None else None
        if call is None or call.method != message["method"]:
            if sealed is not None and sealed.call_id in self._timed_out:
                raise ProtocolError(jsonrpc.INVALID_PARAMS, TIMED_OUT_STATE, data={"reason": "input_timeout"})
            raise ProtocolError(jsonrpc.INVALID_PARAMS, UNKNOWN_STATE)
        responses = params.get("inputResponses")
        if responses is None:
            responses = {}
        if not isinstance(responses, dict):
            raise ProtocolError(
                jsonrpc.INVALID_PARAMS, "Invalid params: inputResponses must map input keys to response objects"
            )
        missing = sorted(key for key in call.pending if not isinstance(responses.get(key), dict))
        if missing:
            raise ProtocolError(
                jsonrpc.INVALID_PARAMS,
                f"Invalid params: inputResponses lacks a response object for {', '.join(missing)}",
                data={"missing": missing},
            )
        del self._held[call.id]  # claimed: the state is good once (the next round gets a new one)
        client = self._client_exchange(call, message)
        pending, call.pending = call.pending, {}
        session = call.session
        for key, upstream_request_id in pending.items():
            await session.channel.respond(
                translate.input_response(upstream_request_id, responses[key]), session.headers
            )
        call.resumed.set()
        return client

    # -- subscriptions/listen --------------------------------------------------------------------

    async def _listen(self, owner: str | None, message: Message, caller: Mapping[str, str]) -> Exchange:
        asked = jsonrpc.params_of(message).get("notifications")
        asked = asked if isinstance(asked, dict) else {}
        honoured: dict[str, Any] = {name: True for name in LISTEN_FILTERS.values() if asked.get(name) is True}
        uris = asked.get("resourceSubscriptions")
        uris = [uri for uri in uris if isinstance(uri, str)] if isinstance(uris, list) else []
        session = await self._pool.acquire(owner, message, caller)
        if not session.subscribes:
            uris = []  # not honoured: the upstream cannot subscribe
        if uris:
            honoured["resourceSubscriptions"] = uris
            for uri in uris:
                await self._pool.subscribe(session, uri)
        subscription_id = message["id"]
        exchange = Exchange(subscription_id, message["method"], self._budget)
        tag = {SUBSCRIPTION_ID_KEY: subscription_id}
        await exchange.deliver(
            {
                "jsonrpc": "2.0",
                "method": "notifications/subscriptions/acknowledged",
                "params": {"_meta": tag, "notifications": honoured},
            }
        )

        listener = _Listen(exchange, subscription_id, honoured, uris)
        session.listeners.add(listener)

        async def stop(_reason: str) -> None:
            session.listeners.discard(listener)
            self._pool.release(session)

        exchange.on_cancel(stop)
        return exchange


class _Listen:
    """One subscriptions/listen stream: what it honours, tagged with its subscription id."""

    def __init__(self, exchange: Exchange, subscription_id: RequestId, honoured: dict[str, Any], uris: list[str]):
        self._exchange = exchange
        self._tag = {SUBSCRIPTION_ID_KEY: subscription_id}
        self._honoured = honoured
        self._uris = uris

    async def deliver(self, notification: Message) -> None:
        method = notification.get("method")
        params = jsonrpc.params_of(notification)
        if LISTEN_FILTERS.get(str(method)) in self._honoured or (
            method == "notifications/resources/updated" and params.get("uri") in self._uris
        ):
            meta = {**jsonrpc.meta_of(notification), **self._tag}
            await self._exchange.deliver({**notification, "params": {**params, "_meta": meta}})

    async def end(self) -> None:
        final = jsonrpc_result(self._exchange.request_id, {"resultType": "complete", "_meta": self._tag})
        await self._exchange.deliver(final)


def jsonrpc_result(request_id: RequestId, result: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


class BridgeChannel(UpstreamChannel):
    """One 2026-07-28 request's channel on the bridge: its owner, and the bridge that carries it."""

    def __init__(self, bridge: ModernOverLegacy, owner: str | None) -> None:
        self.bridge = bridge
        self.owner = owner

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        return await self.bridge.request(self.owner, message, headers)

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        """2026-07-28 clients send no notifications (a dropped POST is the cancel)."""

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        """2026-07-28 clients answer input requests in the retried call (MRTR), never with responses."""

    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        """Unsolicited messages reach 2026 clients on subscriptions/listen streams only."""

    async def close(self) -> None:
        """The channel holds nothing: sessions are the pool's."""
