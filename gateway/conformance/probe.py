"""`Probe`: the kit's side of the wire in one era, and `Exchange`, one request with everything it got
back (HTTP status, the notifications before the answer, the answer), kept as evidence.

The session, the 2026-07-28 envelope and the routing headers come from the project's SEP-2694 client
(`GatewayClient`); the kit posts the exact message it wants (malformed ones included) and reads every
message of the answer itself, so it sees codes and notifications the client would hide. Every read is
bounded by the probe's timeout; a timeout or a dropped connection is recorded as the exchange's
`problem`, never raised. A `tasks/stream` is also watched with `tasks/get`: once its task is terminal,
the stream has one more timeout to end, and one that does not is recorded as `hung_after`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from gateway.client.stream import TERMINAL_STATUSES, GatewayClient, GatewayError, Message, answers
from gateway.protocol.dialect import TASK_EVENT
from gateway.protocol.era import Era

EVIDENCE_EVENTS = 12
"""How many events an evidence entry lists (seq and type); the count is always given."""
EVIDENCE_CHARS = 1500
"""Longer JSON values in evidence are cut to this many characters."""
STATUS_POLL_S = 0.2
"""How often the kit asks tasks/get whether a task is terminal (while waiting for it, or for its stream)."""


def clip(value: Any) -> Any:
    """`value` for evidence: as it is when its JSON is short, else its JSON cut short."""
    text = orjson.dumps(value, default=repr).decode()
    return value if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + "…"


@dataclass
class Exchange:
    """One request and what came back for it."""

    request: Message
    headers: dict[str, str] = field(default_factory=dict)
    """Headers the kit set over the era's own (empty when none)."""
    http_status: int | None = None
    messages: list[Message] = field(default_factory=list)
    """Everything the server sent on this response before the answer (notifications, requests)."""
    answer: Message | None = None
    problem: str = ""
    """Why there is no answer: a timeout, a dropped connection (empty when there is one)."""
    hung_after: str = ""
    """For a stream that did not end within the timeout after its task was terminal: that terminal status."""

    @property
    def events(self) -> list[Any]:
        """The params of every `notifications/tasks/event`, in arrival order (as sent, even malformed)."""
        return [m.get("params") for m in self.messages if m.get("method") == TASK_EVENT]

    @property
    def error(self) -> dict[str, Any] | None:
        error = self.answer.get("error") if self.answer else None
        return error if isinstance(error, dict) else None

    @property
    def result(self) -> dict[str, Any] | None:
        result = self.answer.get("result") if self.answer else None
        return result if isinstance(result, dict) else None

    def error_code(self) -> object:
        return self.error.get("code") if self.error else None

    def seqs(self) -> list[object]:
        return [e.get("seq") if isinstance(e, dict) else None for e in self.events]

    def evidence(self, note: str = "") -> dict[str, Any]:
        """The request, and the relevant part of what came back: status, events (seq and type), answer."""
        entry: dict[str, Any] = {"request": clip(self.request)}
        if self.headers:
            entry["headers"] = self.headers
        entry["http_status"] = self.http_status
        events = self.events
        if events:
            entry["events"] = {
                "count": len(events),
                "first": [
                    {"seq": e.get("seq"), "type": e.get("type")} if isinstance(e, dict) else clip(e)
                    for e in events[:EVIDENCE_EVENTS]
                ],
            }
        others = [m.get("method") for m in self.messages if m.get("method") != TASK_EVENT]
        if others:
            entry["other_messages"] = others[:EVIDENCE_EVENTS]
        if self.answer is not None:
            entry["answer"] = clip({k: v for k, v in self.answer.items() if k in ("result", "error")})
        if self.problem:
            entry["problem"] = self.problem
        if note:
            entry["note"] = note
        return entry


class Call:
    """A request whose answer is read step by step: `read_until` a condition, `finish`, or `cancel`."""

    def __init__(self, probe: Probe, exchange: Exchange) -> None:
        self.probe = probe
        self.exchange = exchange
        self._response: aiohttp.ClientResponse | None = None
        self._messages: AsyncIterator[Message] | None = None

    @property
    def done(self) -> bool:
        return self.exchange.answer is not None or bool(self.exchange.problem)

    async def start(self) -> None:
        try:
            async with asyncio.timeout(self.probe.timeout):
                self._response = await self.probe.client.post(self.exchange.request, headers=self.exchange.headers)
        except (GatewayError, TimeoutError) as exc:
            self.exchange.problem = f"no answer: {exc or type(exc).__name__}"
            return
        self.exchange.http_status = self._response.status
        self._messages = self.probe.client.messages(self._response).__aiter__()

    async def read_until(self, stop: Callable[[Message], bool], *, task_id: str | None = None) -> bool:
        """Read messages until one satisfies `stop` (True), or the answer, the end or the timeout (False).
        With `task_id` (a stream of that task), the timeout starts again when the task is seen terminal."""
        if self._messages is None or self.done:
            return False
        request_id = self.exchange.request.get("id")
        terminal: list[object] = []
        try:
            async with asyncio.timeout(self.probe.timeout) as bound:
                watcher = None if task_id is None else asyncio.create_task(self.probe.watch(task_id, bound, terminal))
                try:
                    async for message in self._messages:
                        if answers(message, request_id):
                            self.exchange.answer = message
                            break
                        self.exchange.messages.append(message)
                        if "method" in message and "id" in message:
                            await self.probe.decline(message)
                        if stop(message):
                            return True
                    else:
                        self.exchange.problem = "the response ended without an answer"
                finally:
                    if watcher is not None:
                        watcher.cancel()
                        await asyncio.gather(watcher, return_exceptions=True)
        except TimeoutError:
            self.exchange.problem = f"no answer within {self.probe.timeout:g} s"
            if terminal:
                self.exchange.hung_after = str(terminal[0])
                self.exchange.problem = (
                    f"the stream did not end within {self.probe.timeout:g} s after the task was {terminal[0]}"
                )
        except GatewayError as exc:
            self.exchange.problem = str(exc)
        self.close()
        return False

    async def finish(self) -> Exchange:
        await self.read_until(lambda message: False)
        return self.exchange

    async def cancel(self) -> None:
        """Cancel the request the era's way: 2025-11-25 `notifications/cancelled`, then the connection is
        closed; 2026-07-28 closing the response is the cancellation."""
        if self.probe.era.has_sessions and not self.done:
            params = {"requestId": self.exchange.request.get("id"), "reason": "conformance kit: stream cancelled"}
            with contextlib.suppress(GatewayError, TimeoutError):
                async with asyncio.timeout(self.probe.timeout):
                    await self.probe.client.notify("notifications/cancelled", params)
        self.close()

    def close(self) -> None:
        if self._response is not None:
            self._response.close()
            self._response = None


class Probe:
    """The kit's connection to the target in one era (a legacy session, or modern per-request envelopes)."""

    def __init__(self, url: str, era: Era, headers: Mapping[str, str], timeout: float) -> None:
        self.era = era
        self.timeout = timeout
        # Every read is bounded by the kit's own deadline, which a terminal status restarts (Call.read_until):
        # the socket's idle bound only backs it up, so it must not fire first.
        self.client = GatewayClient(url, era=era, headers=headers, idle_timeout=3 * timeout, connect_timeout=timeout)

    async def __aenter__(self) -> Probe:
        async with asyncio.timeout(self.timeout):
            await self.client.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.client.__aexit__(exc_type, exc, tb)

    def message(self, method: str, params: Mapping[str, Any], *, envelope: bool = True) -> Message:
        """A request; with `envelope`, the era's `_meta` envelope is added (modern) to `params`."""
        body = self.client.envelope(params) if envelope else dict(params)
        return {"jsonrpc": "2.0", "id": self.client.next_id(), "method": method, "params": body}

    async def open(self, message: Message, headers: Mapping[str, str] | None = None) -> Call:
        call = Call(self, Exchange(message, dict(headers or {})))
        await call.start()
        return call

    async def call(self, message: Message, headers: Mapping[str, str] | None = None) -> Exchange:
        return await (await self.open(message, headers)).finish()

    async def request(self, method: str, params: Mapping[str, Any]) -> Exchange:
        return await self.call(self.message(method, params))

    def stream_message(self, task_id: str, after: object = None, *, progress_token: str | None = None) -> Message:
        params: dict[str, Any] = {"taskId": task_id}
        if after is not None:
            params["after"] = after
        if progress_token is not None:
            params["_meta"] = {"progressToken": progress_token}
        return self.message("tasks/stream", params)

    async def stream(self, task_id: str, after: object = None, *, progress_token: str | None = None) -> Exchange:
        """A whole `tasks/stream`: every event, then its answer (or the problem). It has the timeout to
        end, and once its task is terminal, the timeout again from then (`Exchange.hung_after` if not)."""
        call = await self.open(self.stream_message(task_id, after, progress_token=progress_token))
        await call.read_until(lambda message: False, task_id=task_id)
        return call.exchange

    async def watch(self, task_id: str, bound: asyncio.Timeout, terminal: list[object]) -> None:
        """Poll tasks/get until `task_id` is terminal, then give `bound` the timeout from now and put the
        status in `terminal`. Stops quietly when tasks/get is refused (another caller, an unknown task)."""
        while True:
            status, exchange = await self.task_status(task_id)
            if status in TERMINAL_STATUSES:
                terminal.append(status)
                bound.reschedule(asyncio.get_running_loop().time() + self.timeout)
                return
            if exchange.result is None:
                return
            await asyncio.sleep(STATUS_POLL_S)

    async def decline(self, request: Message) -> None:
        """A server request on a response (sampling, elicitation): the kit offers none, so it says so."""
        if not self.era.has_sessions:
            return
        answer = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "not offered"}}
        with contextlib.suppress(GatewayError, TimeoutError):
            async with asyncio.timeout(self.timeout):
                (await self.client.post(answer)).close()

    async def capabilities(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The server's capabilities and the evidence of where they came from (initialize or discover)."""
        if self.era.has_sessions:  # the session's initialize said it
            result = self.client.initialize_result or {}
            evidence: dict[str, Any] = {"request": "initialize (2025-11-25)", "answer": clip(result)}
        else:
            exchange = await self.request("server/discover", {})
            result = exchange.result or {}
            evidence = exchange.evidence()
        capabilities = result.get("capabilities")
        return (capabilities if isinstance(capabilities, dict) else {}), evidence

    async def start_task(self, tool: str, arguments: Mapping[str, Any]) -> tuple[str | None, Exchange]:
        """Call `tool` as a task; its taskId (None when the server answered without a task) and the exchange."""
        params: dict[str, Any] = {"name": tool, "arguments": dict(arguments)}
        if self.era.client_asks_for_task:
            params["task"] = {}
        exchange = await self.request("tools/call", params)
        result = exchange.result
        return (self.client.created_task(result) if result is not None else None), exchange

    async def task_status(self, task_id: str) -> tuple[object, Exchange]:
        exchange = await self.request("tasks/get", {"taskId": task_id})
        return (exchange.result or {}).get("status"), exchange

    async def wait_terminal(self, task_id: str) -> tuple[object, Exchange]:
        """Poll tasks/get until the task is terminal or the timeout passes; the last status seen."""
        deadline = asyncio.get_running_loop().time() + self.timeout
        while True:
            status, exchange = await self.task_status(task_id)
            if status in TERMINAL_STATUSES or exchange.error or asyncio.get_running_loop().time() >= deadline:
                return status, exchange
            await asyncio.sleep(STATUS_POLL_S)


def unknown_task_id() -> str:
    """A task id no server has made."""
    return "conformance-unknown-" + uuid.uuid4().hex
