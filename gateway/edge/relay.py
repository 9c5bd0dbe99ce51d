"""Relaying one upstream exchange to one client response, and what a dropped client means per era.

The relay writes each batch the moment it arrives. Optional hooks serve the other paths: a
`transform` of the final response (the gateway adds its capabilities to `server/discover` and
`tools/list`, and learns the tasks an upstream creates), `observed` (a list that collects what was
relayed before the response), and a `Handoff` that turns a call still running at a deadline into a
gateway-hosted task: the handoff answers the client and takes the exchange over.

A 2025-11-25 call whose resumable SSE response loses its connection is relayed on, unattended, into
its replay stream (the session owns that relay), so that a GET with Last-Event-ID can resume it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from gateway.edge.responder import Responder, SlowClient
from gateway.metrics import Metrics
from gateway.pacing import WritePacer
from gateway.protocol import jsonrpc
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
from gateway.sessions import ResponseRoute, Session
from gateway.upstream.base import Exchange

Transform = Callable[[Message], Awaitable[Message]]


@dataclass
class Handoff:
    """Turn the call into a task if it is still running at `deadline` (time.monotonic())."""

    deadline: float
    take_over: Callable[[list[Message]], Awaitable[Message]]
    """Gets the notifications seen so far; creates the task, takes the exchange, returns the answer."""
    forward: Callable[[Message], bool] = field(default=lambda message: True)
    """Which notifications the client asked for and may see live before the handoff."""
    possible: Callable[[], bool] = field(default=lambda: True)
    """Whether a task can be made at the deadline; if not, the call carries on as a plain call."""
    taken: bool = False


async def relay(
    exchange: Exchange,
    responder: Responder,
    era: Era,
    metrics: Metrics,
    keepalive_s: float,
    *,
    session: Session | None = None,
    transform: Transform | None = None,
    handoff: Handoff | None = None,
    observed: list[Message] | None = None,
    answer_route: ResponseRoute | None = None,
    flush_interval_s: float,
) -> web.StreamResponse:
    """Relay `exchange` to `responder`. `answer_route` takes the client's answers to the server
    requests relayed here, instead of the session's own upstream channel."""
    started = time.perf_counter()
    pacer = WritePacer(flush_interval_s)
    unattended = False
    if observed is None and handoff is not None:
        observed = []  # what the handoff passes on to the task
    try:
        while True:
            wait = keepalive_s
            if handoff is not None:
                wait = min(wait, max(0.0, handoff.deadline - time.monotonic()))
            batch = await exchange.next_batch(wait)
            if batch and not jsonrpc.is_final(batch[-1]) and (pause := pacer.pause()) > 0:
                # Mid-burst: let the burst accumulate and write it once, instead of one small write
                # (one syscall, one wake-up of the client) per notification.
                await asyncio.sleep(pause)
                batch.extend(exchange.more())
            if batch is None:  # every link ends an exchange with a response; this is a broken link
                final = jsonrpc.error_response(exchange.request_id, jsonrpc.INTERNAL_ERROR, "upstream gave no response")
                return await responder.finish(final, era)
            if batch and observed is not None:
                observed.extend(message for message in batch if not jsonrpc.is_final(message))
            if batch and jsonrpc.is_final(batch[-1]):
                final = batch.pop()
                await _send(batch, responder, session, handoff, answer_route)
                metrics.latency.labels(method=exchange.method).observe(time.perf_counter() - started)
                outcome = "error" if "error" in final else "ok"
                metrics.requests.labels(method=exchange.method, outcome=outcome).inc()
                return await responder.finish(await transform(final) if transform else final, era)
            if batch:
                await _send(batch, responder, session, handoff, answer_route)
                pacer.wrote()
            elif handoff is not None and time.monotonic() >= handoff.deadline and not handoff.possible():
                handoff.deadline = math.inf  # no room for a task (a ceiling): the client gets the answer
            elif handoff is not None and time.monotonic() >= handoff.deadline:
                handoff.taken = True
                answer = await handoff.take_over(observed or [])
                metrics.requests.labels(method=exchange.method, outcome="task").inc()
                return await responder.finish(answer, era)
            elif wait >= keepalive_s:
                await responder.keepalive()
    except (asyncio.CancelledError, ConnectionResetError, SlowClient) as exc:
        if session is not None and responder.resumable and (handoff is None or not handoff.taken):
            assert responder.replay is not None
            unattended = True
            go_on = relay(
                exchange,
                responder,
                era,
                metrics,
                keepalive_s,
                session=session,
                transform=transform,
                observed=observed,
                answer_route=answer_route,
                flush_interval_s=0,
            )
            session.streams.run_on(responder.replay, go_on)
        elif handoff is None or not handoff.taken:
            await _client_gone(exchange, era, metrics)
        response = responder.abandon()
        if response is None or isinstance(exc, asyncio.CancelledError):
            raise
        return response
    finally:
        if not unattended and (handoff is None or not handoff.taken):
            exchange.detach()  # what it held no longer counts (a cut call's later messages are discarded)
        responder.close()


async def _send(
    batch: list[Message],
    responder: Responder,
    session: Session | None,
    handoff: Handoff | None,
    answer_route: ResponseRoute | None,
) -> None:
    if session is not None:
        for message in batch:
            session.note_outgoing(message)
            if answer_route is not None and "method" in message and "id" in message:
                session.response_routes[message["id"]] = answer_route
    if handoff is not None:
        batch = [message for message in batch if handoff.forward(message)]
    if batch:
        await responder.send(batch)


async def _client_gone(exchange: Exchange, era: Era, metrics: Metrics) -> None:
    """Modern: a dropped POST is the cancel. Legacy: the call runs on; its output is discarded."""
    if exchange.finished:
        return
    if era is Era.MODERN:
        metrics.requests.labels(method=exchange.method, outcome="cancelled").inc()
        await exchange.cancel()
    else:
        metrics.requests.labels(method=exchange.method, outcome="disconnected").inc()
        exchange.detach()
