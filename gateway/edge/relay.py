"""Relaying one upstream exchange to one client response, and what a dropped client means per era.

The relay writes each batch the moment it arrives. The plan's `RelayHooks` serve the other paths: a
`transform` of the final response (the gateway adds its capabilities to `server/discover` and
`tools/list`, and learns the tasks an upstream creates), `observed` (a list that collects what was
relayed before the response), the session that expects the client's answers to relayed server requests
(and where they go), and a `Handoff` that turns a call still running at a deadline into a
gateway-hosted task: the handoff answers the client and takes the exchange over.

A 2025-11-25 call whose resumable SSE response loses its connection is relayed on, unattended, into
its replay stream (the session owns that relay), so that a GET with Last-Event-ID can resume it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass

from aiohttp import web

from gateway.edge.responder import Responder, SlowClient
from gateway.metrics import Metrics
from gateway.pacing import WritePacer
from gateway.protocol import jsonrpc
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
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
    metrics, keepalive_s = settings.metrics, settings.keepalive_s
    transform, handoff, observed = hooks.transform, hooks.handoff, hooks.observed
    started = time.perf_counter()
    pacer = WritePacer(settings.flush_interval_s)
    unattended = False
    taken: list[Message] = []
    if observed is None and handoff is not None:
        observed = []  # what the handoff passes on to the task
    try:
        while True:
            wait = keepalive_s
            if handoff is not None:
                wait = min(wait, max(0.0, handoff.deadline - time.monotonic()))
            batch = await exchange.next_batch(wait)
            taken = batch or []  # out of the exchange and not yet recorded: an unattended relay gets it back
            if batch and not jsonrpc.is_final(batch[-1]) and (pause := pacer.pause()) > 0:
                # Mid-burst: let the burst accumulate and write it once, instead of one small write
                # (one syscall, one wake-up of the client) per notification.
                await asyncio.sleep(pause)
                batch.extend(exchange.more())
            if batch is None:  # every link ends an exchange with a response; this is a broken link
                final = jsonrpc.error_response(exchange.request_id, jsonrpc.INTERNAL_ERROR, "upstream gave no response")
                return await responder.finish(final, era)
            if batch and jsonrpc.is_final(batch[-1]):
                final = batch.pop()
                taken = [final]  # the batch is recorded before `_send` first waits
                if observed is not None:
                    observed.extend(batch)
                await _send(batch, responder, hooks)
                metrics.latency.labels(method=exchange.method).observe(time.perf_counter() - started)
                outcome = "error" if "error" in final else "ok"
                metrics.requests.labels(method=exchange.method, outcome=outcome).inc()
                answer = await transform(final) if transform else final
                taken = []
                return await responder.finish(answer, era)
            if batch:
                taken = []
                if observed is not None:
                    observed.extend(batch)
                await _send(batch, responder, hooks)
                pacer.wrote()
            elif handoff is not None and time.monotonic() >= handoff.deadline and not handoff.possible():
                handoff.deadline = math.inf  # no room for a task (a ceiling): the client gets the answer
            elif handoff is not None and time.monotonic() >= handoff.deadline:
                handoff.taken = True
                answer = await handoff.take_over(exchange, observed or [])
                metrics.requests.labels(method=exchange.method, outcome="task").inc()
                return await responder.finish(answer, era)
            elif wait >= keepalive_s:
                await responder.keepalive()
    except (asyncio.CancelledError, ConnectionResetError, SlowClient) as exc:
        # A forwarded stream the upstream must see end (cancel_when_gone) is not kept for a resume.
        resumable = responder.resumable and not hooks.cancel_when_gone
        if hooks.session is not None and resumable and (handoff is None or not handoff.taken):
            assert responder.replay is not None
            unattended = True
            exchange.give_back(taken)
            # On its own, without the handoff; what it observes goes on into the same list.
            go_on = relay(
                exchange,
                responder,
                era,
                dataclasses.replace(settings, flush_interval_s=0),
                dataclasses.replace(hooks, handoff=None, observed=observed),
            )
            hooks.session.streams.run_on(responder.replay, go_on)
        elif handoff is None or not handoff.taken:
            await _client_gone(exchange, era, metrics, hooks.cancel_when_gone)
        response = responder.abandon()
        if response is None or isinstance(exc, asyncio.CancelledError):
            raise
        return response
    finally:
        if not unattended and (handoff is None or not handoff.taken):
            exchange.detach()  # what it held no longer counts (a cut call's later messages are discarded)
        responder.close()


async def _send(batch: list[Message], responder: Responder, hooks: RelayHooks) -> None:
    if hooks.session is not None:
        for message in batch:
            hooks.session.note_outgoing(message, hooks.answer_route)
    if hooks.handoff is not None:
        batch = [message for message in batch if hooks.handoff.forward(message)]
    if batch:
        await responder.send(batch)


async def _client_gone(exchange: Exchange, era: Era, metrics: Metrics, cancel: bool) -> None:
    """Modern (or `cancel`): a dropped POST is the cancel. Legacy: the call runs on; its output is discarded."""
    if exchange.finished:
        return
    if era is Era.MODERN or cancel:  # a dropped 2026-07-28 POST is the cancel; a 2025-11-25 call outlives its stream
        metrics.requests.labels(method=exchange.method, outcome="cancelled").inc()
        await exchange.cancel()
    else:
        metrics.requests.labels(method=exchange.method, outcome="disconnected").inc()
        exchange.detach()
