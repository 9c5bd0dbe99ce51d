"""Client connections before authentication, against the real gateway: half-sent request heads are
closed after `[server] header_timeout_s` while /healthz and calls go on; a trickling body gets 408;
a connection beyond `max_connections` gets 503 at once; the 400 for an oversized header quotes no
credential, in its body or in the log; the open-file limit is checked at start-up. The event loop's
accept errors are counted and logged at most once per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import resource
from collections.abc import Iterator

import aiohttp
import pytest

from gateway.edge.connections import ACCEPT_FAILED, AcceptErrors
from gateway.metrics import Metrics
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.wire import MODERN, Client

pytestmark = pytest.mark.asyncio(loop_scope="module")

FLOOD = 1000
HEAD = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def port_of(gw: RunningGateway) -> int:
    return int(gw.base.rsplit(":", 1)[1])


@contextlib.contextmanager
def file_limit_at_least(files: int) -> Iterator[None]:
    """Raise this process's open-file soft limit for the flood's sockets (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < files:
        if hard != resource.RLIM_INFINITY and hard < files:
            pytest.skip(f"the open-file hard limit {hard} is below {files}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def closed_by_peer(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """What the gateway sends before closing the connection (b"" for a close without an answer)."""
    return await asyncio.wait_for(reader.read(), timeout)


async def test_half_sent_heads_are_closed_after_the_header_timeout_while_health_and_calls_answer(
    http: aiohttp.ClientSession,
) -> None:
    config = "[server]\nheader_timeout_s = 5.0\n"
    with file_limit_at_least(4 * FLOOD):
        async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
            connections = []
            try:
                for _ in range(FLOOD):
                    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
                    writer.write(HEAD + b"Authorization: Bearer half-")  # never finished
                    connections.append((reader, writer))
                await asyncio.gather(*(writer.drain() for _, writer in connections))

                async with http.get(gw.base + "/healthz", timeout=aiohttp.ClientTimeout(total=30)) as health:
                    assert health.status == 200
                reply = await Client(http, gw.url, MODERN).request(
                    "tools/call", {"name": "echo", "arguments": {"text": "still here"}}
                )
                assert reply.status == 200 and not reply.final["result"].get("isError"), reply.messages
                # Answered while the half-sent heads were all still held open.
                assert not [reader for reader, _ in connections if reader.at_eof()]

                closed = await asyncio.gather(*(closed_by_peer(reader, 60) for reader, _ in connections))
                assert set(closed) == {b""}  # closed without an answer: nothing was read as a request
            finally:
                for _, writer in connections:
                    writer.close()
            async with http.get(gw.base + "/metrics") as response:
                assert "mcp_gateway_connections " in await response.text()


async def test_a_body_slower_than_the_minimum_rate_gets_408() -> None:
    config = "[server]\nheader_timeout_s = 1.0\nmin_body_rate_bytes_s = 100\n"
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
        try:
            writer.write(
                HEAD + b"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                b"MCP-Protocol-Version: 2026-07-28\r\nContent-Length: 100000\r\n\r\n" + b'{"jsonrpc":"2.0",'
            )
            answer = await closed_by_peer(reader, 30)  # the rest of the body never comes
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b'"code":-32600' in answer and b"min_body_rate_bytes_s" in answer, answer


async def test_a_connection_beyond_max_connections_gets_503_at_once() -> None:
    config = "[server]\nmax_connections = 3\nheader_timeout_s = 30.0\nretry_after_s = 7\n"
    async with (
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw,
        aiohttp.ClientSession() as http,
    ):
        held = [await asyncio.open_connection("127.0.0.1", port_of(gw)) for _ in range(3)]
        try:
            for _, writer in held:
                writer.write(HEAD)
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            refusal = await closed_by_peer(reader, 30)
            writer.close()
            assert refusal.startswith(b"HTTP/1.1 503 "), refusal
            assert b"Retry-After: 7\r\n" in refusal and b'"limit":"server.max_connections"' in refusal, refusal
        finally:
            for _, writer in held:
                writer.close()
        # The held connections gone, the gateway serves again; until it has seen them go, a poll is
        # refused like any connection beyond the limit, and counted (as 503, or as a connection closed
        # before the client read the answer).
        refused, unread = 1, 0
        for _ in range(100):
            try:
                async with http.get(gw.base + "/metrics") as response:
                    if response.status == 200:
                        text = await response.text()
                        break
                    assert response.status == 503, response.status
                    refused += 1
            except aiohttp.ClientError:
                unread += 1
            await asyncio.sleep(0.1)
        counted = re.search(r'mcp_gateway_rejected_total\{limit="server.max_connections"\} (\d+)\.0', text)
        assert counted is not None, text
        assert refused <= int(counted.group(1)) <= refused + unread, (counted.group(0), refused, unread)
        assert 'mcp_gateway_limit{limit="server.max_connections"} 3.0' in text


async def test_the_400_for_an_oversized_header_quotes_no_credential() -> None:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER) as gw:
        secret = b"SECRET-TOKEN-abcdef"
        answers = []
        for header in (b"Authorization: Bearer " + secret + b"A" * 9000, b"Authorization: Bearer " + secret + b"\x01"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            try:
                writer.write(HEAD + header + b"\r\n\r\n")
                answers.append(await closed_by_peer(reader, 30))
            finally:
                writer.close()
        async with aiohttp.ClientSession() as http, http.get(gw.base + "/metrics") as response:
            assert 'mcp_gateway_rejected_requests_total{reason="framing"} 2.0' in await response.text()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 400 ") or answer.startswith(b"HTTP/1.0 400 "), answer[:100]
        assert b"SECRET" not in answer and b"Bearer" not in answer, answer
    assert b"Got more than" in answers[0] and b"Invalid header value char" in answers[1], answers
    logged = gw.output_text()
    assert "malformed HTTP request" in logged and "SECRET" not in logged and "Bearer" not in logged, logged


async def test_the_file_limit_is_checked_at_start_up() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard open-file limit to exceed")
    config = f"[server]\nmax_connections = {hard + 1}\n"
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
        pass
    assert "cannot hold [server] max_connections" in gw.output_text(), gw.output_text()


async def test_accept_errors_are_counted_and_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    handler = AcceptErrors(metrics, 60.0)
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.WARNING):
        for _ in range(500):
            handler(loop, {"message": ACCEPT_FAILED, "exception": OSError(24, "Too many open files")})
        handler(loop, {"message": "something else", "exception": RuntimeError("passes on")})
    accepts = [record for record in caplog.records if record.name == "gateway.edge.connections"]
    assert len(accepts) == 1 and accepts[0].exc_info is None, accepts
    assert "Too many open files" in accepts[0].getMessage()
    assert metrics.registry.get_sample_value("mcp_gateway_accept_errors_total") == 500
    assert any("something else" in record.getMessage() for record in caplog.records)  # the default handler's
