"""Waiting on several asyncio events at once, bounded in time."""

from __future__ import annotations

import asyncio


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
