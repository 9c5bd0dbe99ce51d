"""One client response in the making: a single JSON body if the answer is the first thing ready,
otherwise an SSE stream that is committed on the first write and written as things happen.

Given a legacy session's streams, an SSE response is resumable: it opens with a priming event and
every event carries an id and is kept for a GET with Last-Event-ID (`gateway.replay`). Once its
connection is abandoned, such a responder still records what it is given, for that resume.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping

from aiohttp import web

from gateway import telemetry
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc, sse
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
from gateway.replay import ReplayStream, SessionStreams

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
}


def json_response(message: object, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    # A message from the upstream that nothing rewrote goes out as the bytes it came as (`jsonrpc.encode`).
    return web.Response(body=jsonrpc.encode(message), status=status, content_type="application/json", headers=headers)


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
        streams: SessionStreams | None = None,
    ) -> None:
        self._request = request
        self._metrics = metrics
        self._headers = dict(headers or {})
        self._write_timeout_s = write_timeout_s
        self._streams = streams
        self.stream: web.StreamResponse | None = None
        self.replay: ReplayStream | None = None
        """The resumable stream this response is, once it is SSE (legacy sessions only)."""
        self._gone = False
        self._closed = False

    @property
    def streaming(self) -> bool:
        return self.stream is not None

    @property
    def resumable(self) -> bool:
        """An SSE response with event ids whose connection still serves it and that has not ended."""
        return self.stream is not None and self.replay is not None and not self.replay.ended and not self._gone

    def _replay(self, streams: SessionStreams) -> ReplayStream:
        if self.replay is None:
            self.replay = streams.open()
        return self.replay

    async def _commit(self) -> web.StreamResponse:
        if self.stream is None:
            stream = web.StreamResponse(status=200, headers={**SSE_HEADERS, **self._headers})
            await stream.prepare(self._request)
            self._metrics.open_streams.inc()
            self.stream = stream
        return self.stream

    async def write(self, data: bytes) -> None:
        """Write SSE bytes (committing to SSE first); SlowClient if the client stops reading. Nothing
        once the connection is abandoned."""
        if self._gone:
            return
        if self.stream is None and self._streams is not None:
            data = self._replay(self._streams).opening() + data
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

    def write_now(self, data: bytes) -> bool:
        """Write SSE bytes at once if the connection takes them without waiting: the response is
        committed and its buffer stays under the transport's high-water mark, so the write cannot block
        (nor meet the write timeout). False, with nothing written, otherwise: the caller writes with
        `write`, which waits, within the timeout. A shared tail writes a block to many streams this way,
        in one pass (`gateway.events.fanout`)."""
        if self._gone:
            return True
        stream, transport = self.stream, self._request.transport
        if stream is None or transport is None or transport.is_closing():
            return False
        if transport.get_write_buffer_size() + len(data) > transport.get_write_buffer_limits()[1]:
            return False
        # StreamResponse.write hands the bytes to the transport before anything it may await (a drain,
        # which waits only over the high-water mark, checked above): run it to its end or first wait.
        writing = stream.write(data)
        try:
            writing.send(None)
        except StopIteration:
            return True
        writing.close()
        return True

    async def send(self, messages: list[Message]) -> None:
        # One increment per method and batch: a counter's increment takes a lock, a burst has thousands.
        for method, count in collections.Counter(m["method"] for m in messages if "method" in m).items():
            self._metrics.count_forwarded(method, count)
        if self._streams is None:
            await self.write(b"".join(sse.encode_message(jsonrpc.encode(message)) for message in messages))
            return
        replay = self._replay(self._streams)
        await self.write(replay.record(messages))
        if not self._gone:
            replay.written(replay.last)

    async def keepalive(self) -> None:
        await self.write(sse.encode_comment("keepalive"))

    async def finish(self, final: Message, era: Era) -> web.StreamResponse:
        """End with the response: as JSON when nothing was streamed yet, else as the last SSE event."""
        telemetry.answered(final)
        if self.stream is None:
            return json_response(final, era.status_for_response(final), self._headers)
        await self.send([final])
        if self.replay is not None:
            self.replay.end()
        if not self._gone:
            await self.stream.write_eof()
            if self._streams is not None and self.replay is not None:
                self._streams.forget(self.replay)  # written in full: nothing is left to resume
        return self.stream

    def abandon(self) -> web.StreamResponse | None:
        """The client is gone or too slow: drop the connection; nothing more will be written.

        Aborted, not closed: a closing transport keeps its unsent bytes until the client reads them."""
        self._gone = True
        if self.stream is not None and self._request.transport is not None:
            self._request.transport.abort()
        return self.stream

    def close(self) -> None:
        """The handler is done with the response; a resumable stream left unfinished waits for a resume."""
        if self.stream is not None and not self._closed:
            self._metrics.open_streams.dec()
        self._closed = True
        if self._streams is not None and self.replay is not None:
            self._streams.detach(self.replay)
