"""One client response in the making: a single JSON body if the answer is the first thing ready,
otherwise an SSE stream that is committed on the first write and written as things happen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import orjson
from aiohttp import web

from gateway import sse
from gateway.metrics import Metrics
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
}


def json_response(message: object, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(message), status=status, content_type="application/json", headers=headers)


class SlowClient(Exception):
    """A write did not complete within the write timeout: the client is not reading."""


class Responder:
    def __init__(
        self,
        request: web.Request,
        metrics: Metrics,
        *,
        headers: Mapping[str, str] | None = None,
        write_timeout_s: float | None = None,
    ) -> None:
        self._request = request
        self._metrics = metrics
        self._headers = dict(headers or {})
        self._write_timeout_s = write_timeout_s
        self.stream: web.StreamResponse | None = None

    @property
    def streaming(self) -> bool:
        return self.stream is not None

    async def _commit(self) -> web.StreamResponse:
        if self.stream is None:
            stream = web.StreamResponse(status=200, headers={**SSE_HEADERS, **self._headers})
            await stream.prepare(self._request)
            self._metrics.open_streams.inc()
            self.stream = stream
        return self.stream

    async def write(self, data: bytes) -> None:
        """Write SSE bytes (committing to SSE first); SlowClient if the client stops reading."""
        stream = await self._commit()
        if self._write_timeout_s is None:
            await stream.write(data)
            return
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await stream.write(data)
        except TimeoutError:
            self._metrics.slow_clients.inc()
            raise SlowClient from None

    async def send(self, messages: list[Message]) -> None:
        for message in messages:
            if "method" in message:
                self._metrics.count_forwarded(message["method"])
        await self.write(b"".join(sse.encode_message(orjson.dumps(message)) for message in messages))

    async def keepalive(self) -> None:
        await self.write(sse.encode_comment("keepalive"))

    async def finish(self, final: Message, era: Era) -> web.StreamResponse:
        """End with the response: as JSON when nothing was streamed yet, else as the last SSE event."""
        if self.stream is None:
            return json_response(final, era.status_for_response(final), self._headers)
        await self.send([final])
        await self.stream.write_eof()
        return self.stream

    def abandon(self) -> web.StreamResponse | None:
        """The client is gone or too slow: drop the connection; nothing more will be written.

        Aborted, not closed: a closing transport keeps its unsent bytes until the client reads them."""
        if self.stream is not None and self._request.transport is not None:
            self._request.transport.abort()
        return self.stream

    def close(self) -> None:
        if self.stream is not None:
            self._metrics.open_streams.dec()
