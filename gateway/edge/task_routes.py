"""The HTTP side of the task plans that hold a response open: a tasks/stream cursor, and a legacy
tasks/result that waits for its task.

The task service decides what each of them means (`gateway.tasks.plans`); these functions only write:
SSE frames from the log's cursor (`gateway.events.stream.run_stream`), keep-alives while a plan waits,
its final message, and what a client that goes away (or stops reading) means for the response.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.edge.responder import Responder, SlowClient
from gateway.events.stream import run_stream
from gateway.protocol import jsonrpc, sse
from gateway.protocol.dialect import dialect_of
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
from gateway.tasks.plans import AwaitResult, StreamEvents
from gateway.waiting import either, wait_any

RECORDED_END_WAIT_S = 5.0
"""How long a stream's final message waits for its task's record to show the end its log told."""


async def await_result(plan: AwaitResult, responder: Responder, era: Era, keepalive_s: float) -> web.StreamResponse:
    """Keep the response alive until the task's answer, carrying its requests to the client meanwhile."""
    try:
        while True:
            requests, final = await plan.wait.next(keepalive_s)
            if final is not None:
                return await responder.finish(final, era)
            await (responder.send(requests) if requests else responder.keepalive())
    except (asyncio.CancelledError, ConnectionResetError):
        stream = responder.abandon()
        if stream is None:
            raise
        return stream
    finally:
        responder.close()


async def stream_events(plan: StreamEvents, responder: Responder) -> web.StreamResponse:
    """The task's events as SSE, then the stream's final message."""
    try:
        await responder.write(sse.encode_comment("stream"))
        final = await _deliver(plan, responder)
        return await responder.finish(final, plan.era)
    except (asyncio.CancelledError, ConnectionResetError, SlowClient):
        # The stream's client is gone (or too slow): delivery stops, the task carries on.
        response = responder.abandon()
        if response is None:
            raise
        return response
    finally:
        responder.close()


async def _deliver(plan: StreamEvents, responder: Responder) -> Message:
    """Write the events (SSE) and, for a request with a progress token, progress notifications; the
    stream's final message."""
    request_id = plan.request["id"]
    token = jsonrpc.meta_of(plan.request).get("progressToken")

    async def progress(delivered: int) -> None:
        # Progress on the stream request's own token: request-local UX, never a task event (no seq).
        note = {"progressToken": token, "progress": delivered, "message": f"{delivered} events delivered"}
        await responder.send([{"jsonrpc": "2.0", "method": "notifications/progress", "params": note}])

    # A drain ends the stream as its task's end would: after the last complete event, with the empty result.
    with either(plan.stop, plan.draining) as ending:
        outcome = await run_stream(
            plan.log,
            plan.task_id,
            plan.first_seq,
            responder.write,
            stop=ending,
            keepalive_s=plan.keepalive_s,
            batch=plan.replay_batch,
            on_batch=progress if token is not None else None,
            flush_interval_s=plan.flush_interval_s,
            write_now=responder.write_now,
        )
        if outcome is None and plan.recorded_end is not None:
            # The log's last event is written before the record turns terminal (the registry's order): the
            # final message waits for the record, bounded, as the store may hold that write in an outage.
            await wait_any((plan.recorded_end, ending), RECORDED_END_WAIT_S)
    if plan.stop.is_set():
        return jsonrpc.error_response(request_id, jsonrpc.REQUEST_CANCELLED, "Request cancelled")
    if outcome is not None:
        outcome.request_id = request_id
        return outcome.to_message()
    return dialect_of(plan.era).stream_end(request_id)
