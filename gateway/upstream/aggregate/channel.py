"""One conversation with the aggregate: routes each request to the upstream that owns what it names.

`AggregateChannel` answers what the aggregate is itself (`initialize`, `server/discover`, `ping`,
`logging/setLevel`, list pages across upstreams) and relays the rest to one upstream's channel:
its name unprefixed going down, every message of its exchange rewritten coming up (task ids and
requestStates prefixed, server-to-client request ids made unique on this conversation, list entries
prefixed, cursors re-encoded). Each relayed request gets an `Exchange` of its own at once; the work
(opening a child conversation, which may hang) runs in a task it owns, so one hanging upstream never
holds up a request routed to another.

Taps: the aggregate never sets an upstream channel's `tap` (a stateless channel is shared with the
upstream's own endpoint, whose task service taps it). It rewrites as it relays, into exchanges of its
own channel, so the tap the gateway sets on the aggregate channel sees the messages as the client will.

How a conversation gets an upstream's channel is its era's: `session.SessionChannel` (a 2025-11-25
client session) and `request.RequestChannel` (one 2026-07-28 request).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache

import gateway
from gateway.protocol import jsonrpc
from gateway.protocol.envelope import NAME_PARAM
from gateway.protocol.era import SERVER_INFO_KEY
from gateway.protocol.jsonrpc import Message, ProtocolError, RequestId
from gateway.tasks.task_ids import map_task_ids
from gateway.upstream.aggregate import listen
from gateway.upstream.aggregate.naming import CursorError, Names, merge_capabilities, merge_instructions
from gateway.upstream.aggregate.resources import entries_of
from gateway.upstream.base import CLIENT_CANCEL_REASON, Exchange, UnsolicitedHandler, UpstreamChannel

if TYPE_CHECKING:
    from gateway.upstream.aggregate.link import AggregateUpstream

log = logging.getLogger("gateway.upstream.aggregate")

SERVER_INFO = {"name": "mcp-task-gateway", "version": gateway.__version__}
OWN_ID_PREFIX = "mcp-task-gateway-aggregate-"
"""Ids of the requests the aggregate sends its upstreams itself (handshakes, fan-outs)."""
RESOURCE_NOT_FOUND = -32002
SERVER_REQUESTS_KEPT = 1024
"""Server-to-client requests a conversation remembers for the client's answer (the oldest unanswered
one is forgotten past this: its late answer is dropped)."""

LIST_KEYS = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}
LIST_CHANGED = {
    "tools": "notifications/tools/list_changed",
    "prompts": "notifications/prompts/list_changed",
    "resources": "notifications/resources/list_changed",
}
_TASK_REQUESTS = frozenset({"tasks/get", "tasks/result", "tasks/cancel", "tasks/update", "tasks/stream"})
_BY_URI = frozenset({"resources/read", "resources/subscribe", "resources/unsubscribe"})


def invalid_params(text: str) -> ProtocolError:
    return ProtocolError(jsonrpc.INVALID_PARAMS, f"Invalid params: {text}")


def unavailable(upstream: str) -> ProtocolError:
    return invalid_params(f"upstream {upstream!r} is unavailable")


class _Relay:
    """One relayed request: the exchange its caller reads, and the upstreams' once it is sent."""

    __slots__ = ("children", "out", "task", "upstream")

    def __init__(self, out: Exchange) -> None:
        self.out = out
        self.upstream: str | None = None
        """The one upstream a routed request went to."""
        self.children: list[Exchange] = []
        self.task: asyncio.Task[None] | None = None

    async def cancel(self, reason: str) -> None:
        if not self.children and self.task is not None:
            self.task.cancel()
        for child in self.children:
            await child.cancel(reason)


class AggregateChannel(UpstreamChannel):
    """What both eras' aggregate conversations share (see the module docstring)."""

    def __init__(self, link: AggregateUpstream) -> None:
        self._link = link
        self._handler: UnsolicitedHandler | None = None
        self._server_requests: LRUCache[str, tuple[str, RequestId]] | None = None
        """The aggregate's id of each server-to-client request relayed -> (upstream, the upstream's id);
        made on the first one (most 2026-07-28 requests relay none)."""
        self._relays: dict[RequestId, _Relay] = {}
        """Requests in flight by the caller's id (a notifications/cancelled names one)."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._own_ids = itertools.count(1)
        self.routed: tuple[str, UpstreamChannel] | None = None
        """The upstream (and its channel) the last relayed request went to: `pin` forwards there."""

    @property
    def _names(self) -> Names:
        """The aggregate's names now (a config reload may add or remove upstreams)."""
        return self._link.names

    # -- what an era's conversation provides ------------------------------------------------------

    @abstractmethod
    async def _open_child(self, upstream: str, headers: Mapping[str, str]) -> UpstreamChannel:
        """`upstream`'s channel for this conversation, ready for the client's requests."""

    @abstractmethod
    def _opened(self) -> dict[str, UpstreamChannel]:
        """The upstreams' channels this conversation has opened, by upstream."""

    async def _child(self, upstream: str, headers: Mapping[str, str]) -> UpstreamChannel:
        """`upstream`'s channel in this conversation, opened on first use (once, however many ask)."""
        opened = self._opened()
        channel = opened.get(upstream)
        if channel is None:
            async with self._locks.setdefault(upstream, asyncio.Lock()):
                channel = opened.get(upstream)
                if channel is None:
                    channel = await self._open_child(upstream, headers)
                    opened[upstream] = channel
        self.routed = (upstream, channel)
        return channel

    def _own_id(self, what: str) -> str:
        return f"{OWN_ID_PREFIX}{what}-{next(self._own_ids)}"

    # -- requests ---------------------------------------------------------------------------------

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        method = message["method"]
        out = Exchange(message["id"], method, self._link.budget, self)
        relay = _Relay(out)
        out.on_cancel(relay.cancel)
        self._relays[message["id"]] = relay
        relay.task = asyncio.create_task(self._serve(relay, message, headers), name=f"aggregate-{method}")
        self._link.own(relay.task)
        return out

    async def _serve(self, relay: _Relay, message: Message, headers: Mapping[str, str]) -> None:
        out = relay.out
        try:
            await self._route(relay, message, headers)
        except ProtocolError as error:
            out.fail(error.code, error.message, error.data)
        except asyncio.CancelledError:
            out.fail(jsonrpc.REQUEST_CANCELLED, "Request cancelled")
        except Exception:
            log.exception("the aggregate failed to relay %s", message["method"])
            out.fail(jsonrpc.INTERNAL_ERROR, "aggregate link error (the gateway's log has the cause)")
        finally:
            if self._relays.get(message["id"]) is relay:
                del self._relays[message["id"]]

    async def _route(self, relay: _Relay, message: Message, headers: Mapping[str, str]) -> None:
        method = message["method"]
        params = jsonrpc.params_of(message)
        if method in LIST_KEYS:
            await self._list(relay, message, headers)
        elif method in ("tools/call", "prompts/get"):
            kind = "tool" if method == "tools/call" else "prompt"
            upstream, name = self._owner_of_name(params.get("name"), kind)
            await self._relay(relay, upstream, {**message, "params": {**params, "name": name}}, headers)
        elif method in _TASK_REQUESTS:
            task_id = params.get("taskId")
            owned = self._names.split(task_id) if isinstance(task_id, str) else None
            if owned is None:
                raise invalid_params(f"unknown task {task_id!r}")
            await self._relay(relay, owned[0], message, headers)
        elif method in _BY_URI:
            await self._by_uri(relay, message, headers)
        elif method == "completion/complete":
            await self._complete(relay, message, headers)
        elif method == "subscriptions/listen":
            await self._listen(relay, message, headers)
        elif method == "initialize":
            await relay.out.deliver(await self._initialize(message, headers))
        elif method == "server/discover":
            await relay.out.deliver(await self._discover(message, headers))
        elif method == "ping":
            await relay.out.deliver(result_of(message, {}))
        elif method == "logging/setLevel":
            await self._set_level(message, headers)
            await relay.out.deliver(result_of(message, {}))
        else:
            raise ProtocolError(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method}")

    def _owner_of_name(self, prefixed: object, kind: str) -> tuple[str, str]:
        owned = self._names.split(prefixed) if isinstance(prefixed, str) else None
        if owned is None:
            raise invalid_params(f"unknown {kind} {prefixed!r}")
        if not self._link.usable(owned[0]):
            raise unavailable(owned[0])
        return owned

    async def _relay(
        self,
        relay: _Relay,
        upstream: str,
        message: Message,
        headers: Mapping[str, str],
        rewrite: Callable[[Message], Message] | None = None,
    ) -> None:
        """Send `message` to `upstream` and deliver its exchange, rewritten, to the caller's."""
        child = await self._child(upstream, headers)
        down = self._down(upstream, message)
        exchange = await child.request(down, headers_for(down, headers))
        relay.upstream, relay.children = upstream, [exchange]
        await self._pump(upstream, child, exchange, relay.out, rewrite)

    async def _pump(
        self,
        upstream: str,
        child: UpstreamChannel,
        exchange: Exchange,
        out: Exchange,
        rewrite: Callable[[Message], Message] | None,
    ) -> None:
        method = exchange.method
        while (batch := await exchange.next_batch()) is not None:
            for message in batch:
                size = len(message.raw) if type(message) is jsonrpc.Received and message.raw else 0
                message = self._up(upstream, method, message, child)
                if jsonrpc.is_final(message):
                    if rewrite is not None:
                        message = rewrite(message)
                    out.failure, out.failure_detail = exchange.failure, exchange.failure_detail
                await out.deliver(message, size)
        if not out.finished:
            out.end()

    async def _ask(self, upstream: str, method: str, message: Message, headers: Mapping[str, str]) -> Message:
        """The final answer of `upstream` to a request the aggregate makes itself, within timeout_s;
        ProtocolError when it cannot be had."""
        try:
            async with asyncio.timeout(self._link.timeout_s):
                child = await self._child(upstream, headers)
                down = self._down(upstream, {**message, "id": self._own_id(method.replace("/", "-"))})
                exchange = await child.request(down, headers_for(down, headers))
                try:
                    messages = await exchange.collect()
                except asyncio.CancelledError:
                    await exchange.cancel()
                    raise
        except TimeoutError:
            raise ProtocolError(jsonrpc.INTERNAL_ERROR, f"upstream {upstream!r} did not answer {method}") from None
        return self._up(upstream, method, messages[-1], child) if messages else _error(message, "no answer")

    async def _fan_out(
        self, method: str, message: Message, headers: Mapping[str, str], upstreams: list[str]
    ) -> dict[str, dict[str, Any]]:
        """The results of `upstreams` (concurrently, each within timeout_s); those that fail are left out."""

        async def one(upstream: str) -> dict[str, Any] | None:
            try:
                final = await self._ask(upstream, method, message, headers)
            except ProtocolError as error:
                log.info("upstream %s left out of %s: %s", upstream, method, error.message)
                return None
            result = final.get("result")
            return result if isinstance(result, dict) else None

        results = await asyncio.gather(*(one(upstream) for upstream in upstreams))
        return {upstream: result for upstream, result in zip(upstreams, results, strict=True) if result is not None}

    # -- what the aggregate answers itself --------------------------------------------------------

    async def _initialize(self, message: Message, headers: Mapping[str, str]) -> Message:
        raise ProtocolError(jsonrpc.METHOD_NOT_FOUND, "Method not found: initialize")

    async def _discover(self, message: Message, headers: Mapping[str, str]) -> Message:
        results = await self._fan_out("server/discover", message, headers, self._link.usable_upstreams())
        versions: list[str] | None = None
        for result in results.values():
            supported = result.get("supportedVersions")
            if isinstance(supported, list):
                versions = [v for v in (supported if versions is None else versions) if v in supported]
        merged: dict[str, Any] = {
            "resultType": "complete",
            "supportedVersions": versions or [],
            "capabilities": self._merged_capabilities(results),
        }
        instructions = merge_instructions([(name, result.get("instructions")) for name, result in results.items()])
        if instructions is not None:
            merged["instructions"] = instructions
        ttls = [result["ttlMs"] for result in results.values() if isinstance(result.get("ttlMs"), int)]
        if ttls:
            merged["ttlMs"] = min(ttls)
            merged["cacheScope"] = "private"
        merged["_meta"] = {SERVER_INFO_KEY: SERVER_INFO}
        return result_of(message, merged)

    def _merged_capabilities(self, results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        declared = [result.get("capabilities") for result in results.values()]
        return merge_capabilities([capabilities for capabilities in declared if isinstance(capabilities, dict)])

    async def _set_level(self, message: Message, headers: Mapping[str, str]) -> None:
        """Only where the level means something: the upstream sessions of a 2025-11-25 client."""

    # -- lists across upstreams -------------------------------------------------------------------

    async def _list(self, relay: _Relay, message: Message, headers: Mapping[str, str]) -> None:
        """One page of every upstream whose list goes on, asked at once (each within timeout_s) and
        merged in configured order: the first page lists every usable upstream's first page, so a list
        that fits each upstream's first page takes one request, whatever the number of upstreams."""
        method = message["method"]
        params = jsonrpc.params_of(message)
        cursor = params.get("cursor")
        pending: dict[str, str | None]
        if isinstance(cursor, str):
            try:
                pending = dict(self._names.decode_cursor(cursor))
            except CursorError as error:
                raise invalid_params(str(error)) from None
        else:
            pending = dict.fromkeys(self._names.upstreams)
        asked = [upstream for upstream in pending if self._link.usable(upstream)]
        plain = {key: value for key, value in params.items() if key != "cursor"}

        async def one(upstream: str) -> Message | None:
            down = {**message, "params": plain if pending[upstream] is None else {**plain, "cursor": pending[upstream]}}
            try:
                return await self._ask(upstream, method, down, headers)
            except ProtocolError as error:
                log.info("upstream %s left out of %s: %s", upstream, method, error.message)
                return None

        key = LIST_KEYS[method]
        entries: list[Any] = []
        going_on: list[tuple[str, str]] = []
        results: list[dict[str, Any]] = []
        for upstream, final in zip(asked, await asyncio.gather(*(one(upstream) for upstream in asked)), strict=True):
            result = final.get("result") if final is not None else None
            if not isinstance(result, dict):  # failed, or has no such list (-32601): nothing of it here
                continue
            results.append(result)
            entries += self._entries(upstream, key, result)
            upstream_next = result.get("nextCursor")
            if isinstance(upstream_next, str) and upstream_next:
                going_on.append((upstream, upstream_next))
        page: dict[str, Any] = {**list_fields(results, key), key: entries}
        if going_on:
            page["nextCursor"] = self._names.encode_cursor(going_on)
        await relay.out.deliver(result_of(message, page))

    def _entries(self, upstream: str, key: str, result: dict[str, Any]) -> list[Any]:
        """One upstream's page entries as the aggregate lists them: names prefixed, owners learnt."""
        entries = entries_of(result, key)
        if key in ("tools", "prompts"):
            return self._prefixed(upstream, key, entries)
        self._link.resources.learn(upstream, "uri" if key == "resources" else "uriTemplate", entries)
        return entries

    def _prefixed(self, upstream: str, key: str, entries: list[Any]) -> list[Any]:
        listed = []
        for entry in entries:
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str):
                continue
            prefixed = self._names.prefixed(upstream, name)
            if key == "tools" and not self._names.valid_tool_name(prefixed):
                self._link.warn_once(upstream, name)
                continue
            listed.append({**entry, "name": prefixed})
        return listed

    # -- resources and completions ----------------------------------------------------------------

    async def _by_uri(self, relay: _Relay, message: Message, headers: Mapping[str, str]) -> None:
        uri = jsonrpc.params_of(message).get("uri")
        owner = self._link.resources.owner(uri) if isinstance(uri, str) else None
        if owner is not None:
            if not self._link.usable(owner):
                raise unavailable(owner)
            await self._relay(relay, owner, message, headers)
            return
        if message["method"] != "resources/read":
            raise ProtocolError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}", data={"uri": uri})
        # A URI no list named (a template's, not learnt yet): the first upstream that can read it.
        answer = _error(message, f"Resource not found: {uri}", RESOURCE_NOT_FOUND)
        for upstream in self._link.usable_upstreams():
            try:
                answer = await self._ask(upstream, "resources/read", message, headers)
            except ProtocolError:
                continue
            if "result" in answer:
                break
        await relay.out.deliver({**answer, "id": message["id"]})

    async def _complete(self, relay: _Relay, message: Message, headers: Mapping[str, str]) -> None:
        params = jsonrpc.params_of(message)
        ref = params.get("ref")
        kind = ref.get("type") if isinstance(ref, dict) else None
        if isinstance(ref, dict) and kind == "ref/prompt":
            upstream, name = self._owner_of_name(ref.get("name"), "prompt")
            down = {**message, "params": {**params, "ref": {**ref, "name": name}}}
            await self._relay(relay, upstream, down, headers)
            return
        uri = ref.get("uri") if isinstance(ref, dict) and kind == "ref/resource" else None
        owner = self._link.resources.owner(uri) if isinstance(uri, str) else None
        if owner is None:
            raise invalid_params("params.ref names no prompt or resource of any upstream")
        if not self._link.usable(owner):
            raise unavailable(owner)
        await self._relay(relay, owner, message, headers)

    # -- subscriptions/listen (2026-07-28) ------------------------------------------------------------

    async def _listen(self, relay: _Relay, message: Message, headers: Mapping[str, str]) -> None:
        """One listen per usable upstream, merged (see `listen`)."""
        filters = listen.filters_of(message)
        params = jsonrpc.params_of(message)
        out = relay.out
        refusals: list[Message] = []

        async def open_one(upstream: str) -> tuple[str, UpstreamChannel, Exchange, dict[str, Any]] | None:
            mine = listen.upstream_filters(filters, upstream, self._names, self._link.resources.owner)
            down = {**message, "params": {**params, "notifications": mine}}
            exchange: Exchange | None = None
            try:
                async with asyncio.timeout(self._link.timeout_s):
                    channel = await self._child(upstream, headers)
                    exchange = await channel.request(down, headers_for(down, headers))
                    relay.children.append(exchange)
                    while (batch := await exchange.next_batch()) is not None:
                        for index, received in enumerate(batch):
                            upward = self._up(upstream, message["method"], received, channel)
                            acknowledged = listen.acknowledged_filters(upward)
                            if acknowledged is not None:
                                exchange.give_back(batch[index + 1 :])
                                return upstream, channel, exchange, acknowledged
                            if jsonrpc.is_final(upward):
                                refusals.append(upward)
                                return None
            except (TimeoutError, ProtocolError) as error:
                log.info("upstream %s left out of a listen: %s", upstream, error)
                if exchange is not None:
                    await exchange.cancel()
            return None

        opened = [one for one in await asyncio.gather(*map(open_one, self._link.usable_upstreams())) if one]
        if not opened and refusals:
            await out.deliver({**refusals[0], "id": message["id"]})
            return
        await out.deliver(listen.acknowledgement(message["id"], [acknowledged for *_, acknowledged in opened]))
        self._link.listens[out] = (message["id"], filters)
        try:
            await asyncio.gather(*(self._pump_listen(*one[:3], out) for one in opened))
        finally:
            self._link.listens.pop(out, None)
        if not out.finished:
            await out.deliver(listen.ended(message["id"]))

    async def _pump_listen(self, upstream: str, child: UpstreamChannel, exchange: Exchange, out: Exchange) -> None:
        """One upstream's listen notifications into the client's stream, until that listen ends."""
        while (batch := await exchange.next_batch()) is not None:
            for message in batch:
                if jsonrpc.is_final(message):
                    return
                await out.deliver(self._up(upstream, "subscriptions/listen", message, child))

    # -- rewriting ----------------------------------------------------------------------------------

    def _down(self, upstream: str, message: Message) -> Message:
        """A client's message as `upstream` must get it: its own task id and requestState."""
        params = message.get("params")
        if not isinstance(params, dict):
            return message
        changed: dict[str, Any] | None = None
        for key in ("taskId", "requestState"):
            value = params.get(key)
            owned = self._names.split(value) if isinstance(value, str) else None
            if owned is not None and owned[0] == upstream:
                changed = {**(changed or params), key: owned[1]}
        filters = params.get("notifications")
        if isinstance(filters, dict) and isinstance(filters.get("taskIds"), list):
            ids = [self._unprefixed(upstream, task_id) for task_id in filters["taskIds"]]
            changed = {**(changed or params), "notifications": {**filters, "taskIds": ids}}
        return message if changed is None else {**message, "params": changed}

    def _task_namer(self, upstream: str, beneath: UpstreamChannel | None) -> Callable[[str], str]:
        """How `upstream`'s task ids read in the aggregate. A stateless channel is shared with the
        upstream's own endpoint (`/servers/NAME/mcp`), whose task service may have set its tap there:
        that tap has already named the task `<its tag>.<id>`, which is undone first."""
        if beneath is None or beneath.tap is None:
            return functools.partial(self._names.prefixed, upstream)
        tagged = f"{beneath.tag}."

        def name(task_id: str) -> str:
            return self._names.prefixed(upstream, task_id.removeprefix(tagged))

        return name

    def _unprefixed(self, upstream: str, value: object) -> object:
        owned = self._names.split(value) if isinstance(value, str) else None
        return owned[1] if owned is not None and owned[0] == upstream else value

    def _up(
        self, upstream: str, method: str | None, message: Message, beneath: UpstreamChannel | None = None
    ) -> Message:
        """A message of `upstream` (arriving on its channel `beneath`) as the aggregate's: task ids and
        requestStates prefixed, a server-to-client request's id made unique here (`respond` maps it
        back), the server a 2026-07-28 result names the aggregate."""
        message = map_task_ids(message, method, self._task_namer(upstream, beneath))
        kind = message.get("method")
        if kind is not None:
            if "id" in message:
                own = self._names.prefixed(upstream, str(message["id"]))
                if self._server_requests is None:
                    self._server_requests = LRUCache(SERVER_REQUESTS_KEPT)
                self._server_requests[own] = (upstream, message["id"])
                return {**message, "id": own}
            if kind == "notifications/cancelled":
                params = jsonrpc.params_of(message)
                own = self._names.prefixed(upstream, str(params.get("requestId")))
                if self._server_requests is not None and own in self._server_requests:
                    return {**message, "params": {**params, "requestId": own}}
            return message
        result = message.get("result")
        if not isinstance(result, dict):
            return message
        rewritten = result
        if isinstance(result.get("requestState"), str):
            rewritten = {**result, "requestState": self._names.prefixed(upstream, result["requestState"])}
        meta = result.get("_meta")
        if isinstance(meta, dict) and SERVER_INFO_KEY in meta:  # 2026-07-28: every result names its server
            rewritten = {**rewritten, "_meta": {**meta, SERVER_INFO_KEY: SERVER_INFO}}
        return message if rewritten is result else {**message, "result": rewritten}

    # -- the rest of a channel ----------------------------------------------------------------------

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        if message.get("method") == "notifications/cancelled":
            relay = self._relays.get(jsonrpc.params_of(message).get("requestId"))  # type: ignore[arg-type]
            if relay is None:
                return
            if not relay.children or relay.upstream is None:
                await relay.cancel(CLIENT_CANCEL_REASON)
                return
            await self._opened()[relay.upstream].notify(message, headers)
            return
        for channel in list(self._opened().values()):
            await channel.notify(message, headers)

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        requests = self._server_requests
        routed = requests.pop(message.get("id"), None) if requests is not None else None  # type: ignore[arg-type]
        channel = self._opened().get(routed[0]) if routed is not None else None
        if routed is None or channel is None:
            log.info("dropping a response to no server request the aggregate relayed: %r", message.get("id"))
            return
        await channel.respond({**message, "id": routed[1]}, headers)

    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        self._handler = handler

    async def _cancel_relays(self) -> None:
        """The conversation ends: what is still relayed is cancelled upstream, and waited for (briefly:
        a cancelled upstream exchange ends at once)."""
        # A relay whose answer is delivered is only finishing its bookkeeping: it is not waited for.
        relays = [relay for relay in self._relays.values() if not relay.out.finished]
        for relay in relays:
            await relay.out.cancel()
            await relay.cancel(CLIENT_CANCEL_REASON)
        tasks = [relay.task for relay in relays if relay.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self._link.timeout_s)


def result_of(message: Message, result: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def _error(message: Message, text: str, code: int = jsonrpc.INTERNAL_ERROR) -> Message:
    return jsonrpc.error_response(message["id"], code, text)


def headers_for(message: Message, headers: Mapping[str, str]) -> Mapping[str, str]:
    """The client's headers with `Mcp-Name` naming what the upstream's message names (2026-07-28)."""
    name = jsonrpc.params_of(message).get(NAME_PARAM.get(message["method"], ""))
    if not isinstance(name, str) or not any(key.lower() == "mcp-name" for key in headers):
        return headers
    return {key: name if key.lower() == "mcp-name" else value for key, value in headers.items()}


def list_fields(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """What a merged page says besides its entries and cursor: the first page's fields (2026-07-28's
    `resultType`), its cache hints the strictest of all (the shortest `ttlMs`, `private` if any is)."""
    fields = {name: value for name, value in (results[0] if results else {}).items() if name not in (key, "nextCursor")}
    fields.pop("_meta", None)
    ttls = [result["ttlMs"] for result in results if isinstance(result.get("ttlMs"), int)]
    if ttls:
        fields["ttlMs"] = min(ttls)
    if any(result.get("cacheScope") == "private" for result in results):
        fields["cacheScope"] = "private"
    return fields
