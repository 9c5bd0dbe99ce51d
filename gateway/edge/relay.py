"""Relaying one upstream exchange to one client response, and what a dropped client means per era.

The relay writes each batch the moment it arrives. The plan's `RelayHooks` serve the other paths: a
`transform` of the final response (the gateway adds its capabilities to `server/discover` and
`tools/list`, and learns the tasks an upstream creates), `observed` (a list that collects what was
relayed before the response), the session that expects the client's answers to relayed server requests
(and where they go), and a `CallHandoff` that turns a call still running at a deadline into a
gateway-hosted task: the handoff answers the client and takes the exchange over.

A 2025-11-25 call whose resumable SSE response loses its connection is relayed on, unattended, into
its replay stream (the session owns that relay), so that a GET with Last-Event-ID can resume it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

from aiohttp import web

from gateway import telemetry
from gateway.edge.responder import Responder, SlowClient
from gateway.metrics import Metrics
from gateway.pacing import WritePacer
from gateway.protocol import jsonrpc
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
from gateway.sessions import Session
from gateway.tasks.plans import RelayHooks
from gateway.upstream.base import Exchange

NO_HOOKS = RelayHooks()


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """How every relay paces itself, from the server config."""

    metrics: Metrics
    keepalive_s: float
    flush_interval_s: float


async def relay(
    exchange: Exchange, responder: Responder, era: Era, settings: RelaySettings, hooks: RelayHooks = NO_HOOKS
) -> web.StreamResponse:
    """Relay `exchange` to `responder`, with what `hooks` add."""
    relaying = _Relay(exchange, responder, era, settings, hooks)
    try:
        with telemetry.span(telemetry.RELAY_SPAN, **{telemetry.METHOD: exchange.method}):
            return await relaying.run()
    except (asyncio.CancelledError, ConnectionResetError, SlowClient) as exc:
        await relaying.client_gone()
        response = responder.abandon()
        if response is None or isinstance(exc, asyncio.CancelledError):
            raise
        return response
    finally:
        if not relaying.handed_on:
            exchange.detach()  # what it held no longer counts (a cut call's later messages are discarded)
        responder.close()


class _Relay:
    """One exchange on its way to one response: what was taken out of the exchange and not yet written,
    and whether the exchange was handed on (to a task, or to a relay that goes on unattended)."""

    def __init__(
        self, exchange: Exchange, responder: Responder, era: Era, settings: RelaySettings, hooks: RelayHooks
    ) -> None:
        self._exchange = exchange
        self._responder = responder
        self._era = era
        self._settings = settings
        self._hooks = hooks
        self._started = time.perf_counter()
        self._pacer = WritePacer(settings.flush_interval_s)
        self._taken: list[Message] = []
        """Out of the exchange and not yet written: a relay that goes on unattended gets it back."""
        self.handed_on = False

    async def run(self) -> web.StreamResponse:
        """Relay each batch as it comes, until the final message (or the handoff's deadline)."""
        keepalive_s = self._settings.keepalive_s
        while True:
            wait = self._wait_s()
            batch = await self._next_batch(wait)
            if batch is None:  # every link ends an exchange with a response; this is a broken link
                final = jsonrpc.error_response(
                    self._exchange.request_id, jsonrpc.INTERNAL_ERROR, "upstream gave no response"
                )
                return await self._responder.finish(final, self._era)
            if batch and jsonrpc.is_final(batch[-1]):
                return await self._answer(batch)
            if batch:
                self._taken = []
                await self._send(batch)
                self._pacer.wrote()
            elif self._handoff_due():
                answer = await self._hand_off()
                if answer is not None:
                    return await self._responder.finish(answer, self._era)
            elif wait >= keepalive_s:
                await self._responder.keepalive()

    def _wait_s(self) -> float:
        handoff = self._hooks.handoff
        if handoff is None:
            return self._settings.keepalive_s
        return min(self._settings.keepalive_s, max(0.0, handoff.deadline - time.monotonic()))

    async def _next_batch(self, wait_s: float) -> list[Message] | None:
        batch = await self._exchange.next_batch(wait_s)
        self._taken = batch or []
        if batch and not jsonrpc.is_final(batch[-1]) and (pause := self._pacer.pause()) > 0:
            # Mid-burst: let the burst accumulate and write it once, instead of one small write
            # (one syscall, one wake-up of the client) per notification.
            await asyncio.sleep(pause)
            batch.extend(self._exchange.more())
        return batch

    async def _answer(self, batch: list[Message]) -> web.StreamResponse:
        """The batch that ends with the final message: relay the rest, then the (transformed) answer."""
        exchange, metrics, transform = self._exchange, self._settings.metrics, self._hooks.transform
        final = batch.pop()
        self._taken = [final]  # the batch is recorded before `_send` first waits
        await self._send(batch)
        metrics.latency.labels(method=exchange.method).observe(time.perf_counter() - self._started)
        outcome = "error" if "error" in final else "ok"
        metrics.requests.labels(method=exchange.method, outcome=outcome).inc()
        answer = await transform(final) if transform else final
        self._taken = []
        return await self._responder.finish(answer, self._era)

    async def _send(self, batch: list[Message]) -> None:
        hooks = self._hooks
        if hooks.observed is not None:
            hooks.observed.extend(batch)
        if hooks.session is not None:
            for message in batch:
                hooks.session.note_outgoing(message, hooks.answer_route)
        if hooks.handoff is not None:
            batch = hooks.handoff.observe(batch)
        if batch:
            await self._responder.send(batch)

    def _handoff_due(self) -> bool:
        handoff = self._hooks.handoff
        return handoff is not None and time.monotonic() >= handoff.deadline

    async def _hand_off(self) -> Message | None:
        """The call is still running at the deadline: a task takes the exchange over (the client's
        answer), or, with no room for one, the call carries on (None)."""
        assert self._hooks.handoff is not None
        self.handed_on = True  # from here the exchange is the task's, even if the client leaves meanwhile
        answer = await self._hooks.handoff.take_over(self._exchange)
        if answer is None:
            self.handed_on = False
            return None
        self._settings.metrics.requests.labels(method=self._exchange.method, outcome="task").inc()
        return answer

    async def client_gone(self) -> None:
        """The client went away (or stopped reading): a resumable legacy response goes on unattended
        into its replay stream; otherwise what its era says of a dropped request."""
        if self.handed_on:
            return
        hooks = self._hooks
        # A forwarded stream the upstream must see end (cancel_when_gone) is not kept for a resume.
        if hooks.session is not None and self._responder.resumable and not hooks.cancel_when_gone:
            self._go_on_unattended(hooks.session)
        else:
            await _client_gone(self._exchange, self._era, self._settings.metrics, hooks.cancel_when_gone)

    def _go_on_unattended(self, session: Session) -> None:
        """Relay the rest into the response's replay stream (the session runs it), for a GET with
        Last-Event-ID to resume; without the handoff, observing into the same list."""
        replay = self._responder.replay
        assert replay is not None
        self.handed_on = True
        self._exchange.give_back(self._taken)
        settings = dataclasses.replace(self._settings, flush_interval_s=0)
        go_on = relay(
            self._exchange, self._responder, self._era, settings, dataclasses.replace(self._hooks, handoff=None)
        )
        session.streams.run_on(replay, go_on)


async def _client_gone(exchange: Exchange, era: Era, metrics: Metrics, cancel: bool) -> None:
    """Modern (or `cancel`): a dropped POST is the cancel. Legacy: the call runs on; its output is discarded."""
    if exchange.finished:
        return
    if era.drop_cancels or cancel:  # era branch: a dropped 2026-07-28 POST is the cancel; a 2025-11-25 call runs on
        metrics.requests.labels(method=exchange.method, outcome="cancelled").inc()
        await exchange.cancel()
    else:
        metrics.requests.labels(method=exchange.method, outcome="disconnected").inc()
        exchange.detach()
