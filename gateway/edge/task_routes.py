"""The HTTP side of the task plans that hold a response open: a tasks/stream cursor, and a legacy
tasks/result that waits for its task.

The task service decides what each of them means (`gateway.tasks.plans`); these functions only write:
SSE frames as the plan produces them, keep-alives while it waits, its final message, and what a client
that goes away (or stops reading) means for the response.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.edge.responder import Responder, SlowClient
from gateway.protocol import sse
from gateway.protocol.era import Era
from gateway.tasks.plans import AwaitResult, StreamEvents


async def await_result(plan: AwaitResult, responder: Responder, era: Era, keepalive_s: float) -> web.StreamResponse:
    """Keep the response alive until the task's answer, carrying its requests to the client meanwhile."""
    try:
        while True:
            requests, final = await plan.next(keepalive_s)
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
        final = await plan.run(responder.write, responder.send)
        return await responder.finish(final, plan.era)
    except (asyncio.CancelledError, ConnectionResetError, SlowClient):
        # The stream's client is gone (or too slow): delivery stops, the task carries on.
        response = responder.abandon()
        if response is None:
            raise
        return response
    finally:
        responder.close()
