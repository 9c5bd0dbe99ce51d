"""Waiting on several asyncio events at once, bounded in time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


async def wait_any(events: tuple[asyncio.Event, ...], timeout: float | None = None) -> bool:
    """Wait until one of `events` is set (True) or `timeout` seconds pass (False)."""
    if any(event.is_set() for event in events):
        return True
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return bool(done)


@contextlib.contextmanager
def either(*events: asyncio.Event | None) -> Iterator[asyncio.Event]:
    """An event set as soon as one of `events` (None: none) is set, while the block runs."""
    joined = asyncio.Event()
    waiters: list[asyncio.Future[bool]] = [asyncio.ensure_future(event.wait()) for event in events if event is not None]

    def one_set(waiter: asyncio.Future[bool]) -> None:
        if not waiter.cancelled():
            joined.set()

    for waiter in waiters:
        waiter.add_done_callback(one_set)
    try:
        yield joined
    finally:
        for waiter in waiters:
            waiter.cancel()
