"""2025-11-25 streams through the gateway resume with Last-Event-ID after a dropped connection.

Real parts: the example build server as the upstream (stdio, and Streamable HTTP without an event
store), the real gateway, the official SDK client (`mcp.Client`, legacy mode), and between client and
gateway a small TCP fault proxy (`FaultProxy`) that cuts a connection mid-stream: the client does not
close it, and the SDK client resumes on its own. Checked: every progress and log notification of a
cut `tools/call` arrives exactly once and in order, then the result; an unsolicited notification sent
while the GET stream's connection was away is replayed on its resume, once; a Last-Event-ID older
than the stream's buffer gets the documented 410 with JSON-RPC -32010 (`data.reason` "events_gone").
The pure core (`gateway.replay`) is unit-tested at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import mcp_types as types
import orjson
import pytest
from mcp.client.session import IncomingMessage

from gateway.buffers import BufferBudget
from gateway.config import ResumeConfig
from gateway.protocol import sse
from gateway.protocol.jsonrpc import ProtocolError
from gateway.replay import ReplayStream, SessionStreams, StreamGap
from tests.conftest import EXAMPLE_SERVER, RunningGateway, free_port, start_gateway
from tests.test_forwarding import Recorder, make_client
from tests.test_slow_reader import metric
from tests.wire import ACCEPT, LEGACY, wait_for_marker

TEST_TIMEOUT = 60.0
RETRY_MS = 200
CONFIG = f"[server.resume]\nretry_ms = {RETRY_MS}\n"


# --------------------------------------------------------------------------------------------------
# The fault proxy
# --------------------------------------------------------------------------------------------------


@dataclass
class Link:
    """One client connection through the proxy and its connection to the gateway."""

    client: asyncio.StreamWriter
    gateway: asyncio.StreamWriter
    requests: list[bytes] = field(default_factory=list)
    """The request line and headers of each request the client sent on it, in order."""
    cut: bool = False

    @property
    def serving_get(self) -> bool:
        return bool(self.requests) and self.requests[-1].startswith(b"GET ")

    def abort(self) -> None:
        """Cut both sides at once, as a network fault would: no FIN, no response end."""
        self.cut = True
        self.client.transport.abort()
        self.gateway.transport.abort()


class FaultProxy:
    """A loopback TCP proxy in front of the gateway that cuts connections on demand.

    `cut_before(pattern)`: the connection whose next gateway-to-client chunk contains `pattern` is cut
    before that chunk is passed on. `hold_gets`: while set, a request that starts with `GET ` waits in
    the proxy (the client is "away") until `release()`."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target_port = target_port
        self.links: list[Link] = []
        self._trigger: bytes | None = None
        self.hold_gets = False
        self._released = asyncio.Event()
        self.get_answered = asyncio.Event()
        """Set once a GET's response has begun to reach the client."""
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def cut_before(self, pattern: bytes) -> None:
        self._trigger = pattern

    def release(self) -> None:
        self.hold_gets = False
        self._released.set()

    def requests(self) -> list[bytes]:
        return [request for link in self.links for request in link.requests]

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for link in self.links:
            link.abort()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        gateway_reader, gateway_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        link = Link(client_writer, gateway_writer)
        self.links.append(link)
        for pump in (self._upward(link, client_reader), self._downward(link, gateway_reader)):
            task = asyncio.create_task(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _upward(self, link: Link, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                if chunk[:4] in (b"GET ", b"POST", b"DELE"):
                    link.requests.append(chunk.split(b"\r\n\r\n", 1)[0])
                    if chunk.startswith(b"GET ") and self.hold_gets:
                        await self._released.wait()
                link.gateway.write(chunk)
                await link.gateway.drain()

    async def _downward(self, link: Link, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                if self._trigger is not None and self._trigger in chunk:
                    self._trigger = None
                    link.abort()
                    return
                link.client.write(chunk)
                await link.client.drain()
                if link.serving_get:
                    self.get_answered.set()
        link.client.close()


@contextlib.asynccontextmanager
async def through_proxy(gateway: RunningGateway) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(int(gateway.base.rsplit(":", 1)[1])) as proxy:
        yield proxy


def resumed(proxy: FaultProxy) -> list[bytes]:
    """The requests that resumed a stream: GETs carrying Last-Event-ID."""
    return [r for r in proxy.requests() if r.startswith(b"GET ") and b"last-event-id:" in r.lower()]


# --------------------------------------------------------------------------------------------------
# A tools/call cut mid-stream
# --------------------------------------------------------------------------------------------------


@pytest.fixture(params=["stdio", "http"])
async def resumable_gateway(request: pytest.FixtureRequest) -> AsyncIterator[RunningGateway]:
    """The gateway (short `retry`) in front of the example server on stdio, or on HTTP without an
    event store of its own."""
    kind: str = request.param
    upstream: dict[str, Any] = (
        {"upstream_cmd": EXAMPLE_SERVER}
        if kind == "stdio"
        else {"upstream_url": request.getfixturevalue("example_http_url")}
    )
    async with start_gateway(**upstream, config_text=CONFIG) as gw:
        gw.upstream_kind = kind
        yield gw


async def test_a_tools_call_cut_mid_stream_is_resumed_by_the_sdk_client(resumable_gateway: RunningGateway) -> None:
    steps = 6
    rec = Recorder()
    with anyio.fail_after(TEST_TIMEOUT):
        async with (
            through_proxy(resumable_gateway) as proxy,
            make_client(proxy.url, "legacy", logging_callback=rec.on_log) as client,
        ):
            proxy.cut_before(f'"message":"step 3/{steps}"'.encode())
            result = await client.call_tool(
                "slow_build", {"steps": steps, "delay": 0.1}, progress_callback=rec.on_progress
            )
            rec.add("result", result.model_dump(mode="json"))
            assert sum(link.cut for link in proxy.links) == 1, "the proxy never cut the tools/call stream"
            assert len(resumed(proxy)) == 1, proxy.requests()

    assert [p["progress"] for p in rec.of("progress")] == list(range(1, steps + 1))
    assert [p["message"] for p in rec.of("progress")] == [f"step {i}/{steps}" for i in range(1, steps + 1)]
    logs = [f"build started: {steps} steps", *(f"finished step {i}" for i in range(1, steps + 1))]
    assert [entry["data"] for entry in rec.of("log")] == logs
    assert rec.events[-1] == ("result", rec.of("result")[0])
    assert rec.of("result")[0]["structured_content"] == {"result": f"built {steps} steps"}


# --------------------------------------------------------------------------------------------------
# The GET stream: an unsolicited notification sent while the client was away
# --------------------------------------------------------------------------------------------------


async def announce(client: Any) -> None:
    assert (await client.call_tool("announce", {})).structured_content == {"result": "announced"}


async def test_the_get_stream_replays_what_was_sent_while_the_client_was_away() -> None:
    changed: list[IncomingMessage] = []
    grew = anyio.Event()

    async def on_message(message: IncomingMessage) -> None:
        nonlocal grew
        if isinstance(message, types.ToolListChangedNotification):
            changed.append(message)
            grew.set()
            grew = anyio.Event()

    async def until_changed(count: int) -> None:
        while len(changed) < count:
            await grew.wait()

    # stdio: the upstream's notification and the tool's result share one pipe, in order, so the
    # notification has reached the gateway before the client sees the result.
    with anyio.fail_after(TEST_TIMEOUT):
        async with (
            start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway,
            through_proxy(gateway) as proxy,
            make_client(proxy.url, "legacy", message_handler=on_message) as client,
            aiohttp.ClientSession() as http,
        ):
            await proxy.get_answered.wait()  # the SDK opens its GET stream in the background
            await announce(client)
            await until_changed(1)  # the GET stream is live and the client has read an event of it
            proxy.hold_gets = True
            (get_link,) = [link for link in proxy.links if link.serving_get]
            get_link.abort()

            await announce(client)
            assert len(changed) == 1  # the client is away: its reconnecting GET waits in the proxy
            proxy.release()
            await until_changed(2)
            assert len(resumed(proxy)) == 1, proxy.requests()

            # Live again on the resumed stream; a duplicate of the replayed one would arrive before this.
            await announce(client)
            await until_changed(3)
            await client.call_tool("echo", {"text": "settle"})
            assert len(changed) == 3
            undelivered = (
                "mcp_gateway_notifications_undelivered_total"
                '{method="notifications/tools/list_changed",reason="no_get_stream"}'
            )
            assert await metric(http, gateway, undelivered) == 0


# --------------------------------------------------------------------------------------------------
# A Last-Event-ID older than the buffer
# --------------------------------------------------------------------------------------------------


async def initialize(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    """A raw 2025-11-25 session; returns the headers its later requests carry."""
    headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }
    async with http.post(url, json=hello, headers=headers) as response:
        assert response.status == 200, await response.text()
        headers |= {"Mcp-Session-Id": response.headers["Mcp-Session-Id"], "MCP-Protocol-Version": LEGACY}
    async with http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers):
        pass
    return headers


async def read_events(response: aiohttp.ClientResponse) -> list[sse.SseEvent]:
    parser = sse.SseParser()
    events: list[sse.SseEvent] = []
    async for chunk in response.content.iter_any():
        events += parser.feed(chunk)
    return events


async def test_a_last_event_id_older_than_the_buffer_gets_410(tmp_path: Path) -> None:
    steps = 20
    marker = tmp_path / "marker"
    config = f"[server.resume]\nbuffer_bytes = 1024\nretry_ms = {RETRY_MS}\n"
    async with (
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gateway,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TEST_TIMEOUT)) as http,
    ):
        headers = await initialize(http, gateway.url)
        get = {**headers, "Accept": "text/event-stream"}
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "slow_build",
                "arguments": {"steps": steps, "delay": 0.01, "marker": str(marker)},
                "_meta": {"progressToken": "p"},
            },
        }
        response = await http.post(gateway.url, json=call, headers=headers)
        try:
            assert response.headers["Content-Type"] == "text/event-stream"
            parser = sse.SseParser()
            while not (events := parser.feed(await response.content.readany())):
                pass
        finally:
            response.close()  # walk away after the priming event; the call runs on, unattended
        priming = events[0]
        assert priming.data == "" and priming.retry == RETRY_MS and priming.id is not None
        stream_key = priming.id.split("_")[0]
        await wait_for_marker(marker, ("finished",), TEST_TIMEOUT)
        last = 2 * steps + 2  # the first log, a progress and a log per step, the response

        async with http.get(gateway.url, headers={**get, "Last-Event-ID": priming.id}) as gone:
            body = await gone.json()
            assert gone.status == 410, body
        assert body["error"]["code"] == -32010 and body["id"] is None
        assert body["error"]["data"] == {"reason": "events_gone", "lastEventId": priming.id}
        assert "server.resume.buffer_bytes" in body["error"]["message"]

        # The newest events are kept: resuming after the last notification gets exactly the response.
        tail_id = f"{stream_key}_{last - 1}"
        async with http.get(gateway.url, headers={**get, "Last-Event-ID": tail_id}) as tail:
            assert tail.status == 200
            replayed = await read_events(tail)
        assert [(event.id, event.data == "") for event in replayed] == [
            (tail_id, True),
            (f"{stream_key}_{last}", False),
        ]
        assert orjson.loads(replayed[1].data)["result"]["structuredContent"] == {"result": f"built {steps} steps"}

        # Written to its end, the stream is forgotten; ids this gateway never sent are refused too, also
        # numbers longer than int() takes (they were a 500).
        for last_event_id, status, code in [
            (tail_id, 410, -32010),
            ("not-an-id", 400, -32600),
            ("7_x", 400, -32600),
            ("9" * 5000 + "_1", 400, -32600),
            (f"{stream_key}_{'9' * 5000}", 400, -32600),
        ]:
            async with http.get(gateway.url, headers={**get, "Last-Event-ID": last_event_id}) as refused:
                assert (refused.status, (await refused.json())["error"]["code"]) == (status, code), last_event_id
        assert await metric(http, gateway, 'mcp_gateway_rejected_requests_total{reason="events_gone"}') == 2


# --------------------------------------------------------------------------------------------------
# The pure core
# --------------------------------------------------------------------------------------------------


def message(n: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": n}}


def frame(stream: ReplayStream, n: int) -> bytes:
    return sse.encode_message(orjson.dumps(message(n)), stream.event_id(n))


async def test_events_get_ids_of_their_stream_and_replay_after_any_kept_one() -> None:
    budget = BufferBudget()
    streams = SessionStreams(ResumeConfig(retry_ms=300), budget)
    first, second = streams.open(), streams.open()
    assert first.opening() == b"id: 1_0\r\ndata: \r\nretry: 300\r\n\r\n"
    assert first.opening(7) == b"id: 1_7\r\ndata: \r\nretry: 300\r\n\r\n"  # a resume opens at its id
    streams.priming = False  # a client of 2025-06-18 or older: ids, but no priming event
    assert streams.open().opening() == b""
    assert first.record([message(1), message(2)]) == frame(first, 1) + frame(first, 2)
    assert second.record([message(1)]) == sse.encode_message(orjson.dumps(message(1)), "2_1")
    assert first.after(0) == (frame(first, 1) + frame(first, 2), 2)
    assert first.after(1) == (frame(first, 2), 2)
    assert first.after(2) == (b"", 2)
    assert budget.held == 3 * len(frame(first, 1))
    await streams.close()
    assert budget.held == 0


async def test_a_resume_beyond_the_buffer_is_refused_never_served_with_a_gap() -> None:
    budget = BufferBudget()
    size = len(frame(ReplayStream(1, ResumeConfig(), budget, priming=True), 1))
    streams = SessionStreams(ResumeConfig(buffer_bytes=2 * size), budget)
    stream = streams.open()
    stream.record([message(n) for n in range(1, 6)])
    assert stream.after(3) == (frame(stream, 4) + frame(stream, 5), 5)
    with pytest.raises(StreamGap):
        stream.after(2)
    assert budget.held == 2 * size
    streams.detach(stream)
    with pytest.raises(ProtocolError) as gone:
        streams.resume("1_2")
    assert (gone.value.http_status, gone.value.code, gone.value.data) == (
        410,
        -32010,
        {"reason": "events_gone", "lastEventId": "1_2"},
    )
    for beyond in ("1_6", "9" * 5000 + "_1", "1_" + "9" * 5000, "1_" + "9" * 19):
        with pytest.raises(ProtocolError) as ahead:
            streams.resume(beyond)
        assert (ahead.value.http_status, ahead.value.code) == (400, -32600), beyond
    assert streams.resume("1_3") == (stream, 3)
    with pytest.raises(ProtocolError) as served:
        streams.resume("1_3")
    assert served.value.http_status == 409
    await streams.close()


async def test_the_newest_event_stays_however_large_and_old_events_age_out(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = BufferBudget()
    tiny = ReplayStream(1, ResumeConfig(buffer_bytes=1), budget, priming=True)
    tiny.record([message(1), message(2)])
    assert tiny.after(1) == (frame(tiny, 2), 2)
    with pytest.raises(StreamGap):
        tiny.after(0)
    tiny.release()

    now = [1000.0]
    monkeypatch.setattr("gateway.replay.time.monotonic", lambda: now[0])
    stream = ReplayStream(1, ResumeConfig(max_age_s=10), budget, priming=True)
    stream.record([message(1), message(2)])
    now[0] += 5
    stream.record([message(3)])
    now[0] += 6  # events 1 and 2 are 11 s old, event 3 is 6 s old
    with pytest.raises(StreamGap):
        stream.after(0)
    assert stream.after(2) == (frame(stream, 3), 3)
    now[0] += 5
    assert stream.after(3) == (b"", 3)  # all aged out, but nothing after 3 is missing
    assert budget.held == 0


async def test_a_plain_get_replaces_a_get_stream_whose_connection_is_away() -> None:
    streams = SessionStreams(ResumeConfig(), BufferBudget())
    standalone = streams.open_standalone()
    assert standalone is not None and streams.open_standalone() is None  # served: 409
    standalone.record([message(1)])
    streams.detach(standalone)
    assert standalone.expiry is not None
    replacement = streams.open_standalone()
    assert replacement is not None and replacement is not standalone and streams.standalone is replacement
    with pytest.raises(ProtocolError) as gone:
        streams.resume(standalone.event_id(0))
    assert gone.value.http_status == 410
    await streams.close()
