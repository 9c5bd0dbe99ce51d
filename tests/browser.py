"""What the browser tests of the /ui page share: Debian's chromium driven by Playwright, and data to show.

* ``launch_chromium()``: the system browser (``/usr/bin/chromium``, installed by ``make chromium``) through
  Playwright for Python, never a downloaded one;
* ``UiHook``: the page's read-only test hook, ``window.mcpTaskUi`` (UI_CONTRACT: events, lastSeq, state);
* ``fill_finished_task()``: a finished task with many events written into a SQLite store file in process,
  through the gateway's own registry, for a gateway then started on that file (100,000 events through an
  upstream take over 20 s; written here, about 2 s);
* ``direct_events()``: a task's retained events read with tasks/stream by a client of the test's own, to
  hold the page's timeline against;
* ``scroll_to_oldest()``: a big task's view scrolled to its top until its oldest event shows, each
  interaction timed in the page and the JS heap sampled (the test asserts bounds on them,
  bench/ui_timeline.py reports them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright

from gateway.assembly.stores import build_stores
from gateway.client import GatewayClient
from gateway.config import Config
from gateway.events.capture import Capture
from gateway.metrics import Metrics
from gateway.principal import ANONYMOUS
from gateway.protocol.era import Era
from gateway.tasks.lifecycle import Event
from gateway.tasks.records import TaskStatus
from gateway.tasks.registry import TaskRegistry

CHROMIUM = Path("/usr/bin/chromium")
"""Debian's `chromium` package (`make chromium` installs it; Playwright downloads nothing)."""

WAIT_MS = 20_000
"""Milliseconds any single page step may take (a bounded Playwright wait; generous for a loaded machine)."""

VIEWPORT = {"width": 1280, "height": 800}


@contextlib.asynccontextmanager
async def launch_chromium() -> AsyncIterator[Browser]:
    """The system chromium, headless, until the block exits. `--no-sandbox`: the tests may run as root
    (CI containers), where chromium's sandbox refuses to start."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make chromium` (Debian's chromium package)", pytrace=False)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


class UiHook:
    """The page's test hook, `window.mcpTaskUi` (read only): what the open task view holds."""

    def __init__(self, page: Page) -> None:
        self.page = page

    async def events(self) -> list[tuple[int, str]]:
        """(seq, type) of every event the view holds, in its order."""
        held = await self.page.evaluate("() => window.mcpTaskUi.events().map(e => [e.seq, e.type])")
        return [(int(seq), str(kind)) for seq, kind in held]

    async def last_seq(self) -> int | None:
        value = await self.page.evaluate("() => window.mcpTaskUi.lastSeq()")
        return None if value is None else int(value)

    async def state(self) -> str:
        return str(await self.page.evaluate("() => window.mcpTaskUi.state()"))

    async def wait_for(self, expression: str, timeout_ms: float = WAIT_MS) -> None:
        """Until the JS `expression` (over `ui`, the hook) is true, bounded."""
        await self.page.wait_for_function(
            f"() => {{ const ui = window.mcpTaskUi; return !!ui && ({expression}); }}", timeout=timeout_ms
        )

    async def wait_for_state(self, state: str, timeout_ms: float = WAIT_MS) -> None:
        await self.wait_for(f"ui.state() === {state!r}", timeout_ms)


async def direct_events(url: str, task_id: str, headers: Mapping[str, str] | None = None) -> list[tuple[int, str]]:
    """(seq, type) of the task's retained events, read with tasks/stream (no `after`: from the earliest)."""
    async with GatewayClient(url, headers=headers) as client, asyncio.timeout(WAIT_MS / 1000):
        return [(int(event["seq"]), str(event["type"])) async for event in client.stream(task_id)]


async def fill_finished_task(path: Path, progress_events: int, *, owner: str = ANONYMOUS) -> str:
    """A completed `burst` task of `owner` in the SQLite store file `path`: its `task.created`, then
    `progress_events` progress events, then its status change and end, written through the gateway's
    registry exactly as a hosted task records them; returns its id. Start a gateway on `path` with
    `[retention] max_events_per_task` above the count to keep them all."""
    config = Config.model_validate(
        {
            "store": {"kind": "sqlite", "path": str(path)},
            "retention": {"max_events_per_task": progress_events + 16},
        }
    )
    stores = build_stores(config)
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    registry = TaskRegistry(config.tasks, config.retention, stores.tasks, stores.log, capture, Metrics())
    try:
        task = await registry.create(owner, "burst", None, dialect=Era.LEGACY.value, arguments={"n": progress_events})
        batch = 10_000
        for start in range(1, progress_events + 1, batch):
            events = []
            for i in range(start, min(start + batch, progress_events + 1)):
                notification = progress_notification(i, progress_events)
                event = registry.capture_from(task, notification)
                assert event is not None, notification
                events.append(event)
            await registry.record(task, *events)
        text = f"sent {progress_events}"
        outcome: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {"content": [{"type": "text", "text": text}], "structuredContent": {"result": text}},
        }
        await registry.feed(task, Event.OUTCOME_ARRIVED, TaskStatus.COMPLETED, None, outcome=outcome)
        return task.id
    finally:
        await stores.close()


def progress_notification(progress: int, total: int) -> dict[str, Any]:
    """A `notifications/progress` as the example server's `burst` sends it (with a message, as most tools do)."""
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": 1, "progress": progress, "total": total, "message": f"item {progress}/{total}"},
    }


SCROLL_TO_TOP = """async () => {
    const timeline = document.getElementById('timeline');
    const started = performance.now();
    timeline.scrollTop = 0;
    // The scroll is handled in the next frame; the frame after it shows what the handler did.
    await new Promise(resolve => requestAnimationFrame(() => requestAnimationFrame(resolve)));
    return performance.now() - started;
}"""
"""One interaction: the timeline scrolled to its top; milliseconds until the frame answering it."""

TOGGLE_PAYLOAD = """async () => {
    const summary = document.querySelector('#timeline .event details.event-payload > summary');
    const started = performance.now();
    summary.click();
    await new Promise(resolve => requestAnimationFrame(() => requestAnimationFrame(resolve)));
    return performance.now() - started;
}"""
"""One interaction: an event's JSON payload opened (or closed); milliseconds until the frame answering it."""

WATCH_LONG_TASKS = """() => {
    window.__longTasks = [];
    new PerformanceObserver(list => {
        for (const entry of list.getEntries()) window.__longTasks.push(entry.duration);
    }).observe({type: 'longtask'});
}"""
"""Collect the main thread's long tasks (over 50 ms) from now on, in `window.__longTasks`."""

OLDER_LOADED = """first => document.querySelector('#timeline .event[data-seq="0"]') !== null
    || (window.mcpTaskUi.events()[0]?.seq ?? first) < first"""
"""Older events arrived (the first held seq went down), or the oldest is on screen."""


async def heap_used(page: Page) -> int:
    """The page's JS heap in use (bytes), from the DevTools protocol's Performance domain."""
    session = await page.context.new_cdp_session(page)
    try:
        await session.send("Performance.enable")
        metrics = await session.send("Performance.getMetrics")
    finally:
        await session.detach()
    return int(next(metric["value"] for metric in metrics["metrics"] if metric["name"] == "JSHeapUsedSize"))


@dataclass
class ScrollFigures:
    """What scrolling a big task's view back to its first event took."""

    loads: int = 0
    """Scrolls to the top that loaded older events."""
    answers_ms: list[float] = field(default_factory=list)
    """Each interaction's answer: from the input to the frame after the one that handled it."""
    heaps: list[int] = field(default_factory=list)
    """The JS heap in use (bytes) at the start and after each load."""
    held: list[int] = field(default_factory=list)
    """Events the view held in memory after each load."""
    rendered: list[int] = field(default_factory=list)
    """`.event` elements in the timeline after each load."""
    long_tasks_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    """From the first scroll to the oldest event on screen."""


async def scroll_to_oldest(page: Page, max_loads: int) -> ScrollFigures:
    """Scroll the open task view's timeline to its top until `.event[data-seq="0"]` is on screen (at most
    `max_loads` loads), opening a payload before and after; the view must have ended loading."""
    figures = ScrollFigures()
    await page.evaluate(WATCH_LONG_TASKS)
    await sample(page, figures)
    figures.answers_ms.append(await page.evaluate(TOGGLE_PAYLOAD))
    oldest = page.locator('#timeline .event[data-seq="0"]')
    started = time.perf_counter()
    while not await oldest.count():
        if figures.loads >= max_loads:
            raise AssertionError(f"still no seq 0 after {figures.loads} loads of older events")
        first = await page.evaluate("() => window.mcpTaskUi.events()[0]?.seq ?? null")
        figures.answers_ms.append(await page.evaluate(SCROLL_TO_TOP))
        await page.wait_for_function(OLDER_LOADED, arg=first, timeout=WAIT_MS)
        figures.loads += 1
        await sample(page, figures)
    figures.seconds = time.perf_counter() - started
    figures.answers_ms.append(await page.evaluate(TOGGLE_PAYLOAD))
    figures.long_tasks_ms = [float(ms) for ms in await page.evaluate("() => window.__longTasks")]
    return figures


async def sample(page: Page, figures: ScrollFigures) -> None:
    """The view's heap, held events and rendered events now."""
    figures.heaps.append(await heap_used(page))
    figures.held.append(int(await page.evaluate("() => window.mcpTaskUi.heldCount()")))
    figures.rendered.append(await page.locator("#timeline .event").count())
