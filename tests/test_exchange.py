"""Unit tests of Exchange: order, batching, backpressure in messages and bytes, detach, failure after queued
messages, deadlines, and the gateway-wide buffer budget."""

from __future__ import annotations

import asyncio

import pytest

from gateway.buffers import BUDGET_KEY, BufferBudget
from gateway.edge.endpoint import error_response
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Overloaded
from gateway.upstream.base import (
    CLIENT_CANCEL_REASON,
    REQUEST_TIMEOUT,
    TIMEOUT_CANCEL_REASON,
    Deadline,
    Exchange,
)


def note(i: int) -> jsonrpc.Message:
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": i}}


RESPONSE = {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_messages_arrive_in_order_and_end_with_the_response() -> None:
    exchange = Exchange(1, "tools/call")
    for i in range(5):
        await exchange.deliver(note(i))
    await exchange.deliver(RESPONSE)
    await exchange.deliver(note(99))  # after the response: ignored
    assert await exchange.collect() == [*(note(i) for i in range(5)), RESPONSE]
    assert await exchange.next_batch() is None


async def test_a_lagging_consumer_blocks_the_producer_instead_of_dropping() -> None:
    exchange = Exchange(1, "tools/call", BufferBudget(stream_messages=3))

    async def produce() -> None:
        for i in range(10):
            await exchange.deliver(note(i))
        await exchange.deliver(RESPONSE)

    producer = asyncio.create_task(produce())
    await asyncio.sleep(0.01)
    assert not producer.done()  # stuck at capacity
    first = await exchange.next_batch()
    assert first == [note(0), note(1), note(2)]
    rest = await exchange.collect()
    await producer
    assert [*first, *rest] == [*(note(i) for i in range(10)), RESPONSE]


async def test_next_batch_times_out_with_an_empty_batch() -> None:
    exchange = Exchange(1, "tools/call")
    assert await exchange.next_batch(0.01) == []


async def test_fail_comes_after_what_is_queued_and_never_blocks() -> None:
    exchange = Exchange(1, "tools/call", BufferBudget(stream_messages=1))
    await exchange.deliver(note(0))
    exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream process exited")
    messages = await exchange.collect()
    assert messages[0] == note(0)
    assert messages[1]["error"]["code"] == jsonrpc.INTERNAL_ERROR and messages[1]["id"] == 1
    assert exchange.finished


async def test_detach_unblocks_the_producer_and_discards() -> None:
    exchange = Exchange(1, "tools/call", BufferBudget(stream_messages=1))
    await exchange.deliver(note(0))
    producer = asyncio.create_task(exchange.deliver(note(1)))
    await asyncio.sleep(0.01)
    exchange.detach()
    await asyncio.wait_for(producer, 1)
    await exchange.deliver(RESPONSE)
    assert exchange.finished


async def test_cancel_runs_the_link_hook_once() -> None:
    calls: list[str] = []

    async def hook(reason: str) -> None:
        calls.append(reason)

    exchange = Exchange(1, "tools/call")
    exchange.on_cancel(hook)
    await exchange.cancel()
    await exchange.cancel()
    assert calls == [CLIENT_CANCEL_REASON] and exchange.finished


async def test_cancel_after_the_response_does_not_call_the_hook() -> None:
    calls: list[str] = []

    async def hook(reason: str) -> None:
        calls.append(reason)

    exchange = Exchange(1, "tools/call")
    exchange.on_cancel(hook)
    await exchange.deliver(RESPONSE)
    await exchange.cancel()
    assert calls == []


class Recorder:
    """A link's cancel hook and a deadline's expiry listener that remember their calls."""

    def __init__(self) -> None:
        self.cancels: list[str] = []
        self.cancelled = asyncio.Event()
        self.expired: list[str] = []
        self.expiry = asyncio.Event()

    async def hook(self, reason: str) -> None:
        self.cancels.append(reason)
        self.cancelled.set()

    def on_expiry(self, method: str) -> None:
        self.expired.append(method)
        self.expiry.set()

    def deadline(self, seconds: float = 0.01) -> Deadline:
        return Deadline(seconds, "upstream.request_timeout_s", self.on_expiry)


async def test_a_deadline_without_a_response_ends_with_the_timeout_error_and_cancels_upstream() -> None:
    recorder = Recorder()
    exchange = Exchange(7, "tools/call", deadline=recorder.deadline())
    exchange.on_cancel(recorder.hook)
    await exchange.deliver(note(0))
    async with asyncio.timeout(5):
        messages = await exchange.collect()
        await recorder.cancelled.wait()  # the upstream cancel runs beside the error
    assert messages[0] == note(0)
    error = messages[-1]["error"]
    assert messages[-1]["id"] == 7 and error["code"] == jsonrpc.INTERNAL_ERROR, messages
    assert "tools/call within 0.01 s (upstream.request_timeout_s)" in error["message"], error
    assert error["data"] == {"reason": REQUEST_TIMEOUT, "limit": 0.01, "key": "upstream.request_timeout_s"}
    assert recorder.cancels == [TIMEOUT_CANCEL_REASON] and recorder.expired == ["tools/call"]


async def test_a_detached_exchange_is_still_cancelled_upstream_at_its_deadline() -> None:
    """A legacy client that went away leaves the request running; its deadline still ends it upstream."""
    recorder = Recorder()
    exchange = Exchange(7, "tools/call", deadline=recorder.deadline())
    exchange.on_cancel(recorder.hook)
    exchange.detach()
    async with asyncio.timeout(5):
        await recorder.cancelled.wait()
    assert exchange.finished and recorder.cancels == [TIMEOUT_CANCEL_REASON]


async def test_an_answered_exchange_never_expires() -> None:
    recorder = Recorder()
    exchange = Exchange(1, "tools/call", deadline=recorder.deadline(0.02))
    exchange.on_cancel(recorder.hook)
    await exchange.deliver(RESPONSE)
    await asyncio.sleep(0.05)
    assert await exchange.collect() == [RESPONSE]
    assert recorder.cancels == [] and recorder.expired == []


async def test_a_message_waiting_for_room_is_not_delivered_after_the_timeout_error() -> None:
    recorder = Recorder()
    exchange = Exchange(1, "tools/call", BufferBudget(stream_messages=1), deadline=recorder.deadline())
    await exchange.deliver(note(0))
    producer = asyncio.create_task(exchange.deliver(note(1)))  # blocked: the consumer is one behind
    async with asyncio.timeout(5):
        await recorder.expiry.wait()
        messages = await exchange.collect()
        await producer
    assert messages[0] == note(0) and messages[-1]["error"]["data"]["reason"] == REQUEST_TIMEOUT, messages
    assert len(messages) == 2, messages
    assert await exchange.next_batch(0) is None  # nothing after the error


async def stuck(delivery: asyncio.Task[None]) -> bool:
    """Whether a delivery is (still) waiting for room."""
    await asyncio.sleep(0.01)
    return not delivery.done()


async def test_bytes_bound_the_exchange_until_the_consumer_comes_back_for_more() -> None:
    budget = BufferBudget(stream_bytes=1000)
    exchange = Exchange(1, "tools/call", budget)
    await exchange.deliver(note(0), 600)
    third = asyncio.create_task(exchange.deliver(note(1), 600))
    assert await stuck(third) and budget.held == 600
    assert await exchange.next_batch() == [note(0)]
    # Handed out but not yet written (the consumer has not come back): still held.
    assert await stuck(third) and budget.held == 600
    assert await exchange.next_batch() == [note(1)]  # coming back released the first batch
    await third
    assert budget.held == 600
    await exchange.deliver(RESPONSE, 10)
    assert await exchange.collect() == [RESPONSE]
    assert budget.held == 0


async def test_a_message_larger_than_the_bound_passes_alone() -> None:
    budget = BufferBudget(stream_bytes=100)
    exchange = Exchange(1, "tools/call", budget)
    await exchange.deliver(note(0), 5000)
    second = asyncio.create_task(exchange.deliver(note(1), 1))
    assert await stuck(second)
    assert await exchange.next_batch() == [note(0)]
    assert await exchange.next_batch(0) == []  # releases the large one: room again
    await second
    assert await exchange.next_batch() == [note(1)]


async def test_more_adds_to_the_batch_and_keeps_it_held() -> None:
    budget = BufferBudget(stream_bytes=1000)
    exchange = Exchange(1, "tools/call", budget)
    await exchange.deliver(note(0), 400)
    batch = await exchange.next_batch()
    await exchange.deliver(note(1), 400)
    batch = [*(batch or []), *exchange.more()]
    assert batch == [note(0), note(1)] and budget.held == 800
    blocked = asyncio.create_task(exchange.deliver(note(2), 400))
    assert await stuck(blocked)
    exchange.detach()
    await blocked


async def test_detach_releases_the_bytes_and_counts_what_it_drops() -> None:
    metrics = Metrics()
    budget = BufferBudget(stream_bytes=1000, metrics=metrics)
    exchange = Exchange(1, "tools/call", budget)
    await exchange.deliver(note(0), 300)
    await exchange.deliver(note(1), 300)
    exchange.detach()
    await exchange.deliver(note(2), 300)
    await exchange.deliver(RESPONSE, 10)
    assert budget.held == 0
    assert metrics.registry.get_sample_value("mcp_gateway_messages_dropped_total") == 4
    assert metrics.registry.get_sample_value("mcp_gateway_buffered_bytes") == 0


async def test_the_budget_refuses_new_work_with_503_until_buffers_drain() -> None:
    metrics = Metrics()
    budget = BufferBudget(stream_bytes=1000, budget_bytes=500, metrics=metrics)
    exchange = Exchange(1, "tools/call", budget)
    budget.admit(7)
    await exchange.deliver(note(0), 600)
    with pytest.raises(Overloaded) as refused:
        budget.admit(7)
    error = refused.value
    assert (error.http_status, error.code, error.request_id, error.limit) == (503, -32603, 7, BUDGET_KEY)
    assert error.data == {"reason": "overloaded", "limit": "server.buffered_bytes_budget"}
    assert "(server.buffered_bytes_budget)" in error.message
    # Rendered like every ceiling: 503 with the configured Retry-After ([server] retry_after_s).
    response = error_response(error, retry_after_s=5)
    assert (response.status, response.headers["Retry-After"]) == (503, "5")
    await exchange.deliver(RESPONSE, 10)
    await exchange.collect()
    budget.admit(8)
