"""The interface every upstream link implements, and the Exchange that carries one request's messages.

An `UpstreamChannel` is one upstream conversation (a stdio process, or an HTTP upstream session).
`request()` returns an `Exchange`: every message the upstream routes to that request (notifications,
server-to-client requests) in arrival order, ending with exactly one response. Upstream failures never
raise out of a channel; they end the exchange with a JSON-RPC error response instead.

Backpressure is end to end and bounded in bytes as well as messages (see `gateway.buffers`):
`Exchange.deliver` waits while the exchange holds its budget's `stream_bytes` (queued, or handed to a
consumer that has not come back for more, i.e. is still writing them) or `stream_messages` queued, so
a burst is never dropped and never buffered without bound. A consumer that goes away calls
`detach()`, after which messages are discarded (and counted) so the link never stalls on it.

An exchange given a `Deadline` that passes before its response ends with a timeout error and is
cancelled upstream (the link decides how), whether or not anyone still consumes it: an upstream that
never answers holds no client, channel or process beyond the deadline.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode

from gateway import telemetry
from gateway.buffers import BufferBudget
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, Overloaded, RequestId
from gateway.upstream.capabilities import Capabilities, Discovery

UnsolicitedHandler = Callable[[Message, int], Awaitable[None]]
"""Gets a message not tied to a request and its size on the wire in bytes."""
CancelHook = Callable[[str], Awaitable[None]]
"""Cancels one request upstream, giving the reason (a stdio or legacy upstream sees it in
`notifications/cancelled`)."""
Tap = Callable[["UpstreamChannel", str | None, Message], Awaitable[Message]]
"""Sees every message a channel hands to the gateway, in arrival order and before anyone consumes it
(even when the request's client is gone), with the method of the request it answers (None for
unsolicited messages); returns the message as the gateway's clients must see it."""
LossListener = Callable[[str], Awaitable[None]]
"""Told (with the cause) when the upstream conversation behind a channel ended on the upstream's side."""
FailureListener = Callable[[str], None]
"""Told (with the cause) when real traffic found the upstream unusable: a stdio command that cannot start
or whose process exits, an HTTP upstream that does not answer. Must not block (readiness re-checks)."""

CLIENT_CANCEL_REASON = "cancelled by the client"
TIMEOUT_CANCEL_REASON = "request timed out at the gateway"
REQUEST_TIMEOUT = "request_timeout"
"""`data.reason` of the error a request gets when its deadline passes."""


class UpstreamBusy(Overloaded):
    """No upstream process could be had within the limit; the edge answers 503 with Retry-After."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """How long the upstream may take to answer one request, and the config key that set it."""

    seconds: float
    key: str
    on_expiry: Callable[[str], None] | None = None
    """Told the method of each request whose deadline passed (metrics)."""

    def error(self, method: str) -> tuple[str, dict[str, object]]:
        """The message and `data` of the JSON-RPC error the request ends with."""
        text = (
            f"Request timeout: the upstream did not answer {method} within {self.seconds:g} s ({self.key}); "
            "the request was cancelled upstream"
        )
        return text, {"reason": REQUEST_TIMEOUT, "limit": self.seconds, "key": self.key}


DeadlineRule = Callable[[Message], Deadline | None]
"""The deadline a request gets as it is sent upstream (None: none)."""


class Exchange:
    """The messages routed to one request in flight upstream, ending with its response."""

    def __init__(
        self,
        request_id: RequestId,
        method: str,
        budget: BufferBudget | None = None,
        channel: UpstreamChannel | None = None,
        deadline: Deadline | None = None,
    ) -> None:
        self.request_id = request_id
        self.method = method
        self._channel = channel
        self._budget = budget or BufferBudget()
        self._items: deque[Message] = deque()
        self._queued_bytes = 0
        self._handed_bytes = 0
        """Bytes of the batch (or batches, with `more`) the consumer took last and is still writing."""
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._finished = False
        self._detached = False
        self._cancel_hook: CancelHook | None = None
        self._deadline = deadline
        self._timer: asyncio.TimerHandle | None = None
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_later(deadline.seconds, self._expire)
        self._expiry: asyncio.Task[None] | None = None
        """The upstream cancel of an expired exchange; held here so it runs to its end (it is short:
        one write, bounded by the link)."""
        self.failure: str | None = None
        """Why the link ended this exchange itself (`fail`), as the client was told; None when the response
        came from upstream."""
        self.failure_detail: str | None = None
        """`failure` with what the upstream itself said (its last stderr line, its HTTP error body), for
        the log and /readyz; never the gateway's configuration (command line, URL, addresses)."""
        self.span: Span | None = None
        """The exchange's span while tracing is on (the link starts it); ended as the exchange settles."""

    @property
    def finished(self) -> bool:
        """True once the response has been delivered (or the exchange was failed)."""
        return self._finished

    def on_cancel(self, hook: CancelHook) -> None:
        """Set by the link: how to cancel this request upstream (era and transport specific)."""
        self._cancel_hook = hook

    def _full(self, size: int) -> bool:
        if len(self._items) >= self._budget.stream_messages:
            return True
        held = self._queued_bytes + self._handed_bytes
        # A message larger than the whole bound still passes, alone: nothing else is held then.
        return held > 0 and held + size > self._budget.stream_bytes

    async def deliver(self, message: Message, size: int = 0) -> None:
        """Called by the link for each message routed here, in arrival order, with its size on the wire."""
        if self._finished:
            return
        if self._channel is not None and self._channel.tap is not None:
            message = await self._channel.tap(self._channel, self.method, message)
        while not self._detached and self._full(size):
            self._writable.clear()
            await self._writable.wait()
        if self._finished:  # failed (or expired) while this message waited for room
            return
        if jsonrpc.is_final(message):
            if self.span is not None and isinstance(error := message.get("error"), dict):
                telemetry.error_code(self.span, error)
            self._settle()
        if self._detached:
            self._budget.dropped(1)
            return
        self._items.append(message)
        self._queued_bytes += size
        self._budget.held += size
        self._readable.set()

    def fail(self, code: int, text: str, data: object = None, *, detail: str | None = None) -> None:
        """End the exchange with a JSON-RPC error now, after what is already queued. Never blocks.

        `text` is what the client sees: no addresses, paths or stack traces. `detail` is the upstream's
        own account, kept for the log and /readyz (see `failure_detail`)."""
        if self._finished:
            return
        if self.span is not None:
            self.span.set_status(Status(StatusCode.ERROR, text))
        self._settle()
        self.failure = text
        self.failure_detail = f"{text}: {detail}" if detail else text
        if not self._detached:
            self._items.append(jsonrpc.error_response(self.request_id, code, text, data))
            self._readable.set()

    def end(self) -> None:
        """Finish without a response (for streams that have none): the consumer sees the end."""
        self._settle()
        self._readable.set()

    def detach(self) -> None:
        """The consumer is gone: discard what is queued and whatever still arrives."""
        if not self._detached:
            self._budget.dropped(len(self._items))
        self._detached = True
        self._items.clear()
        self._budget.held -= self._queued_bytes + self._handed_bytes
        self._queued_bytes = self._handed_bytes = 0
        self._writable.set()
        self._readable.set()

    async def cancel(self, reason: str = CLIENT_CANCEL_REASON) -> None:
        """Cancel the request upstream (the link decides how) and stop delivery."""
        hook, self._cancel_hook = self._cancel_hook, None
        self.detach()
        finished = self._finished
        self._settle()
        if hook is not None and not finished:
            await hook(reason)

    def _settle(self) -> None:
        """The exchange is over: no more messages, and its deadline no longer matters."""
        self._finished = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.span is not None:
            self.span.end()
            self.span = None

    def _expire(self) -> None:
        """The deadline passed without a response: cancel upstream, and end with the timeout error."""
        self._timer = None
        deadline = self._deadline
        if self._finished or deadline is None:
            return
        hook, self._cancel_hook = self._cancel_hook, None
        if hook is not None:
            # Started before the error wakes the consumer, so the link has forgotten the request (and
            # marked its conversation as having abandoned one) before the consumer can release it.
            self._expiry = asyncio.ensure_future(hook(TIMEOUT_CANCEL_REASON))
        text, data = deadline.error(self.method)
        self.fail(jsonrpc.INTERNAL_ERROR, text, data)
        if deadline.on_expiry is not None:
            deadline.on_expiry(self.method)

    def _hand_out(self) -> list[Message]:
        batch = list(self._items)
        self._items.clear()
        self._handed_bytes += self._queued_bytes
        self._queued_bytes = 0
        self._writable.set()
        return batch

    async def next_batch(self, wait_s: float | None = None) -> list[Message] | None:
        """Everything available now, waiting up to `wait_s` for something: [] on timeout, None when over.

        Calling it again says the previous batch is written: its bytes stop counting against the bound."""
        if self._handed_bytes:
            self._budget.held -= self._handed_bytes
            self._handed_bytes = 0
            self._writable.set()
        if self._detached:
            return None
        if not self._items:
            if self._finished:
                return None
            self._readable.clear()
            try:
                await asyncio.wait_for(self._readable.wait(), wait_s)
            except TimeoutError:
                return []
            if not self._items:
                return None if self._finished or self._detached else []
        return self._hand_out()

    def give_back(self, messages: list[Message]) -> None:
        """Put messages a consumer took but did not use back in front, in order, for the next consumer
        (a relay that goes on without its client); they no longer count against the bound."""
        if messages:
            self._items.extendleft(reversed(messages))
            self._readable.set()

    def more(self) -> list[Message]:
        """What arrived since the last batch, to be written with it: it counts until the next `next_batch`."""
        return self._hand_out()

    async def collect(self) -> list[Message]:
        """Every message until the response (inclusive)."""
        messages: list[Message] = []
        while (batch := await self.next_batch()) is not None:
            messages.extend(batch)
        return messages


class UpstreamChannel(ABC):
    """One upstream conversation. Headers are the client's forwardable MCP headers (HTTP links use them)."""

    lost = False
    """The upstream ended this conversation (an HTTP upstream answered 404 for its session): the client
    session built on it must end too, so the client initializes again."""
    tap: Tap | None = None
    """Set by the gateway on channels whose upstream hosts tasks (see `Tap`); links apply it to every
    exchange message (through `Exchange`) and every unsolicited message (`tapped`)."""

    @functools.cached_property
    def tag(self) -> str:
        """A short random name for this conversation, unique in the gateway (namespaces upstream ids)."""
        return secrets.token_hex(4)

    @property
    def rejoin_handle(self) -> str | None:
        """What names this conversation to the upstream beyond this process (an HTTP upstream's
        `Mcp-Session-Id`), for a restarted gateway to `Upstream.rejoin` it; None where the
        conversation ends with the process (a stdio child)."""
        return None

    @functools.cached_property
    def _loss_listeners(self) -> list[LossListener]:
        return []

    def on_loss(self, listener: LossListener) -> None:
        """Call `listener` each time the upstream side of this conversation ends (a process exits, an
        HTTP session is gone); the channel itself may live on (a respawned process)."""
        self._loss_listeners.append(listener)

    async def report_loss(self, cause: str) -> None:
        for listener in list(self._loss_listeners):
            await listener(cause)

    async def tapped(self, method: str | None, message: Message) -> Message:
        return message if self.tap is None else await self.tap(self, method, message)

    @abstractmethod
    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        """Send a request upstream. Failures arrive as a JSON-RPC error on the exchange, never as exceptions."""

    @abstractmethod
    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        """Forward a client notification (`notifications/cancelled` ids are translated by the link)."""

    @abstractmethod
    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        """Forward the client's response to a server-to-client request."""

    @abstractmethod
    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        """Where messages not tied to a request go (list_changed, unattributed server requests)."""

    @abstractmethod
    async def close(self) -> None:
        """End the conversation: in-flight exchanges fail, the upstream session or process ends."""

    def leave_open(self) -> None:
        """At a graceful stop, with tasks still running in this conversation: `close` ends it here only,
        and leaves the upstream's side (an HTTP session) to whoever takes the tasks over."""
        return None  # a stdio process ends with the gateway whatever is asked: nothing to leave

    async def park(self) -> bool:
        """Give back what an idle conversation holds (a stdio process) until its next request, which
        re-establishes it by replaying the handshake; the upstream loses its in-memory state of the
        conversation. False when there is nothing to give back, or a request is in flight."""
        return False

    async def resume(self) -> None:
        """Take back what `park` gave back, before a request; raises `Overloaded` when it cannot."""
        return None


class Upstream(ABC):
    """The upstream server: hands out channels per client session (legacy) or per request (modern)."""

    shared_stateless = False
    """Whether `stateless()` channels carry many requests at once, so a long one (a subscription)
    holds nothing else up. A leased stdio process does not."""

    outlives_gateway = False
    """Whether the upstream's 2026-07-28 tasks outlive this gateway process (a server of its own, not
    a child process of the gateway): a restarted gateway can watch them again on `stateless()`."""

    @functools.cached_property
    def _failure_listeners(self) -> list[FailureListener]:
        return []

    def on_failure(self, listener: FailureListener) -> None:
        """Call `listener` each time real traffic finds the upstream unusable (see `FailureListener`)."""
        self._failure_listeners.append(listener)

    def report_failure(self, cause: str) -> None:
        for listener in self._failure_listeners:
            listener(cause)

    @functools.cached_property
    def _discovery(self) -> Discovery:
        return Discovery(self.stateless)

    async def capabilities(self, timeout_s: float) -> Capabilities:
        """What the upstream declares in 2026-07-28 (`server/discover`): asked once, within `timeout_s`,
        however many requests need it at once, then cached (see `gateway.upstream.capabilities`)."""
        return await self._discovery.get(timeout_s)

    def learn_capabilities(self, discover_result: dict[str, Any]) -> None:
        """The upstream answered a client's `server/discover`: what it declares now."""
        self._discovery.learn(discover_result)

    @abstractmethod
    async def open_session(self) -> UpstreamChannel:
        """A channel dedicated to one legacy (handshake-era) client session."""

    def rejoin(self, handle: str, protocol_version: str) -> UpstreamChannel | None:
        """A channel on the legacy conversation a previous gateway process held (its `rejoin_handle`),
        to watch the tasks it holds; None where it cannot exist any more. Closing it ends it upstream."""
        return None

    @abstractmethod
    def stateless(
        self, affinity: str | None = None, *, beside: bool = False, owner: str | None = None
    ) -> AbstractAsyncContextManager[UpstreamChannel]:
        """A channel for one modern (2026-07-28) request, held for that request's lifetime.

        `affinity` is a multi-round-trip request's echoed `requestState`, or a task's id: the request
        must reach the conversation that issued it (see `pin`). `beside`: the request (a forwarded
        tasks/stream) may share that conversation with the request holding it, rather than wait its turn.
        `owner`: the principal the request is for (an era bridge keeps upstream sessions per principal)."""

    @abstractmethod
    def pin(self, affinity: str, channel: UpstreamChannel) -> None:
        """Remember that `channel` issued `affinity` (a `requestState`), for `stateless(affinity)`."""

    @abstractmethod
    def probe_session(self) -> AbstractAsyncContextManager[UpstreamChannel]:
        """A fresh handshake-era conversation for the readiness probe, ended on exit. It counts against
        no session limit and is logged at debug level only: a failing upstream is probed again and again."""

    @abstractmethod
    async def start(self) -> None:
        """Prepare (open HTTP client sessions, warm processes). An upstream that cannot start is no
        error here: requests fail with the cause, and readiness reports it."""

    @abstractmethod
    async def close(self) -> None:
        """Stop every process and connection the upstream owns."""
