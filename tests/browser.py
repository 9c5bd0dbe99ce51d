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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, CDPSession, Page, ViewportSize, async_playwright

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

VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
"""The README screenshot's size."""


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


async def direct_events(client: GatewayClient, task_id: str) -> list[tuple[int, str]]:
    """(seq, type) of the task's retained events, read with tasks/stream (no `after`: from the earliest)."""
    async with asyncio.timeout(WAIT_MS / 1000):
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


WATCH_INTERACTIONS = """() => {
    // Each keydown and click answered: from the input's own time stamp (when the browser took it, so
    // time the main thread was busy counts) to just after the next frame is painted. Called again, it
    // starts the figures afresh (the listeners stay, once).
    window.__answers = [];
    window.__longTasks = [];
    if (window.__watching) return;
    window.__watching = true;
    const answered = event => {
        const input = event.timeStamp;
        requestAnimationFrame(() => {
            const channel = new MessageChannel();
            channel.port1.onmessage = () => window.__answers.push(performance.now() - input);
            channel.port2.postMessage(null);
        });
    };
    window.addEventListener('keydown', answered, true);
    window.addEventListener('click', answered, true);
    new PerformanceObserver(list => {
        for (const entry of list.getEntries()) window.__longTasks.push(entry.duration);
    }).observe({type: 'longtask'});
}"""
"""Time every interaction from now on (`window.__answers`, ms) and collect the main thread's long tasks."""

NEXT_FRAME = "() => new Promise(resolve => requestAnimationFrame(() => resolve(null)))"
"""Resolves at the page's next frame."""

NEWEST_SHOWN = """() => {
    const last = window.mcpTaskUi.lastSeq();
    return last !== null && document.querySelector(`#timeline .event[data-seq="${last}"]`) !== null
        && window.mcpTaskUi.state() !== 'loading';
}"""
"""The task's last event is on screen and nothing is loading."""

OLDEST_SHOWN = """() => document.querySelector('#timeline .event[data-seq="0"]') !== null
    && window.mcpTaskUi.state() !== 'loading'"""
"""The oldest event is on screen and nothing is loading."""


class Heap:
    """The page's JS heap in use (bytes), from the DevTools protocol's Performance domain, through one
    DevTools session for the whole measurement (so sampling adds little work to the page's thread)."""

    def __init__(self, session: CDPSession) -> None:
        self.session = session

    @classmethod
    async def of(cls, page: Page) -> Heap:
        session = await page.context.new_cdp_session(page)
        await session.send("Performance.enable")
        return cls(session)

    async def used(self, *, collect: bool = False) -> int:
        """Bytes in use now; after a full garbage collection with `collect` (what the page retains)."""
        if collect:
            await self.session.send("HeapProfiler.collectGarbage")
        metrics = await self.session.send("Performance.getMetrics")
        return int(next(metric["value"] for metric in metrics["metrics"] if metric["name"] == "JSHeapUsedSize"))


@dataclass
class ScrollFigures:
    """What scrolling a big task's view back to its first event took."""

    answers_ms: list[float] = field(default_factory=list)
    """Each interaction's answer (keys and clicks): from the input to just after the next frame."""
    heaps: list[int] = field(default_factory=list)
    """The JS heap in use (bytes), sampled at each step as it is (garbage included)."""
    retained: list[int] = field(default_factory=list)
    """The JS heap in use (bytes) after a full collection, at the start and at the end."""
    held: list[int] = field(default_factory=list)
    """Events the view held in memory, sampled at each step."""
    rendered: list[int] = field(default_factory=list)
    """`.event` elements in the timeline, sampled at each step."""
    long_tasks_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    """From the Home key to the oldest event on screen."""


async def scroll_to_oldest(page: Page) -> ScrollFigures:
    """On the open task view (loaded, its newest events on screen): open a payload, page up through the
    held events, press Home on the timeline to go to its first event, and press ArrowUp there (a probe
    of how soon the page answers, one a frame) until `.event[data-seq="0"]` is on screen and
    nothing loads (within WAIT_MS); then open the first event's payload. Every key and click is timed."""
    figures = ScrollFigures()
    await page.evaluate(WATCH_INTERACTIONS)
    heap = await Heap.of(page)
    figures.retained.append(await heap.used(collect=True))
    await sample(page, heap, figures)
    timeline = page.locator("#timeline")
    await timeline.locator(".event details.event-payload > summary").last.click()
    await timeline.focus()
    for _ in range(3):
        await page.keyboard.press("PageUp")
    await sample(page, heap, figures)
    started = time.perf_counter()
    await page.keyboard.press("Home")
    # Polled every 100 ms and sampled every 10th probe: the measuring itself takes the page's thread.
    oldest = asyncio.ensure_future(page.wait_for_function(OLDEST_SHOWN, polling=100, timeout=WAIT_MS))
    try:
        probes = 0
        while not oldest.done():  # bounded: the wait for the oldest row times out
            await page.keyboard.press("ArrowUp")
            # One probe a frame (a flood of keys would time its own queue, not the page).
            await page.evaluate(NEXT_FRAME)
            probes += 1
            if probes % 10 == 0:
                await sample(page, heap, figures)
        await oldest
    finally:
        oldest.cancel()
    figures.seconds = time.perf_counter() - started
    await timeline.locator('.event[data-seq="0"] details.event-payload > summary').click()
    await sample(page, heap, figures)
    figures.retained.append(await heap.used(collect=True))
    await heap.session.detach()
    figures.answers_ms = [float(ms) for ms in await page.evaluate("() => window.__answers")]
    figures.long_tasks_ms = [float(ms) for ms in await page.evaluate("() => window.__longTasks")]
    return figures


async def back_to_newest(page: Page) -> None:
    """Press End on the timeline and wait until the task's last event is on screen again (within WAIT_MS)."""
    await page.locator("#timeline").focus()
    await page.keyboard.press("End")
    await page.wait_for_function(NEWEST_SHOWN, polling=100, timeout=WAIT_MS)


async def sample(page: Page, heap: Heap, figures: ScrollFigures) -> None:
    """The view's heap, held events and rendered events now."""
    figures.heaps.append(await heap.used())
    figures.held.append(int(await page.evaluate("() => window.mcpTaskUi.heldCount()")))
    figures.rendered.append(await page.locator("#timeline .event").count())
