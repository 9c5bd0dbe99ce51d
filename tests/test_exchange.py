"""Unit tests of Exchange: order, batching, backpressure, detach, failure after queued messages."""

from __future__ import annotations

import asyncio

from gateway.protocol import jsonrpc
from gateway.upstream.base import Exchange


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
    exchange = Exchange(1, "tools/call", capacity=3)

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
    exchange = Exchange(1, "tools/call", capacity=1)
    await exchange.deliver(note(0))
    exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream process exited")
    messages = await exchange.collect()
    assert messages[0] == note(0)
    assert messages[1]["error"]["code"] == jsonrpc.INTERNAL_ERROR and messages[1]["id"] == 1
    assert exchange.finished


async def test_detach_unblocks_the_producer_and_discards() -> None:
    exchange = Exchange(1, "tools/call", capacity=1)
    await exchange.deliver(note(0))
    producer = asyncio.create_task(exchange.deliver(note(1)))
    await asyncio.sleep(0.01)
    exchange.detach()
    await asyncio.wait_for(producer, 1)
    await exchange.deliver(RESPONSE)
    assert exchange.finished


async def test_cancel_runs_the_link_hook_once() -> None:
    calls: list[str] = []

    async def hook() -> None:
        calls.append("cancelled")

    exchange = Exchange(1, "tools/call")
    exchange.on_cancel(hook)
    await exchange.cancel()
    await exchange.cancel()
    assert calls == ["cancelled"] and exchange.finished


async def test_cancel_after_the_response_does_not_call_the_hook() -> None:
    calls: list[str] = []

    async def hook() -> None:
        calls.append("cancelled")

    exchange = Exchange(1, "tools/call")
    exchange.on_cancel(hook)
    await exchange.deliver(RESPONSE)
    await exchange.cancel()
    assert calls == []
