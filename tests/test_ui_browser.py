"""The /ui page in a real browser: Debian's chromium through Playwright, against real gateways.

Issue 22's acceptance, each test asserting what it names (the DOM ids and the test hook
`window.mcpTaskUi` are UI_CONTRACT's):

* a live hosted task of the example server is listed within 1 s and its timeline holds every event, in
  order, with no gap or duplicate: exactly what tasks/stream read directly returns;
* a reload mid-task resumes after the last seq held ("resumed after N") and ends with the same timeline;
* an input_required task is answered from the page's form (the task completes with that answer), and a
  task cancelled from the page ends cancelled;
* with two API keys each key sees only its own tasks, and the other's task link shows "no such task"
  exactly as an unknown id does; the key travels only in the Authorization header, kept in sessionStorage;
* a finished task of 100,000 events: scrolling to the top reaches its oldest event, every interaction
  answers within INTERACTION_MS (measured in the page: from the input to the next frame painted; the best
  of up to PASSES walks, as the machine is shared) and the
  JS heap stays under HEAP_BOUND_BYTES;
* with small retention the page shows events_gone with the earliest retained seq and loads from there;
* the README's screenshot (docs/ui-timeline.png) is written by a test.

One browser serves the module; each test has a context (cookies, sessionStorage) of its own. Two
gateways: one on a SQLite file holding the 100,000-event task (auth off, on loopback), one with two API
keys and small retention. Every wait is bounded and waits on the page or the gateway, never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import struct
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, ConsoleMessage, Page, Request

from gateway.client import GatewayClient
from tests.browser import (
    VIEWPORT,
    WAIT_MS,
    ScrollFigures,
    UiHook,
    back_to_newest,
    direct_events,
    fill_finished_task,
    launch_chromium,
    scroll_to_oldest,
)
from tests.conftest import EXAMPLE_SERVER, IN_PROCESS_OPTION, ROOT, RunningGateway, start_gateway
from tests.test_auth_api_key import KEY_A, KEY_B, TWO_KEYS, bearer

pytestmark = pytest.mark.asyncio(loop_scope="module")

BIG_TASK_EVENTS = 100_000
"""Progress events of the big task (with its task.created, task.status and task.terminal: 100,003)."""
INTERACTION_MS = 100.0
PASSES = 3
"""Every interaction must answer (its next frame painted) within this, measured in the page."""
HEAP_BOUND_BYTES = 64 * 1024 * 1024
"""The documented bound on the JS heap the page retains (used size after a full garbage collection) with a
task of 100,000 events (README); the peak with garbage not yet collected is reported beside it."""
MAX_RENDERED_EVENTS = 500
"""The timeline renders only what is on screen (plus a margin): far fewer rows than a window holds."""
MAX_HELD_EVENTS = 5_000
"""UI_CONTRACT: the view holds at most this many events in memory."""
SMALL_RETENTION = 8
"""[retention] max_events_per_task of the events_gone gateway."""
SCREENSHOT = ROOT / "docs" / "ui-timeline.png"
ELICITATION = {"elicitation": {"form": {}}}
TOKEN_KEY = "mcpTaskGatewayToken"


# -- browser and gateways -------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with launch_chromium() as launched:
        yield launched


class PageProblems:
    """What a page must never do: throw uncaught, or be refused by its own Content-Security-Policy
    (an inline script or style would be)."""

    def __init__(self, page: Page) -> None:
        self.found: list[str] = []
        page.on("pageerror", lambda error: self.found.append(f"uncaught: {error}"))
        page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and "Content Security Policy" in message.text:
            self.found.append(f"CSP: {message.text}")


@pytest_asyncio.fixture(loop_scope="module")
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    """A fresh context (its own sessionStorage) at the README screenshot's size."""
    fresh = await browser.new_context(viewport=VIEWPORT)
    fresh.set_default_timeout(WAIT_MS)
    try:
        yield fresh
    finally:
        await fresh.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(context: BrowserContext) -> AsyncIterator[Page]:
    opened = await context.new_page()
    problems = PageProblems(opened)
    opened.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))  # a confirm() before cancelling
    yield opened
    assert not problems.found, problems.found


@dataclass(frozen=True)
class Gateways:
    gw: RunningGateway
    """Auth off, on loopback, in front of the example server, on the store file holding the big task."""
    big_task: str
    """The finished task of BIG_TASK_EVENTS progress events (owner: anonymous)."""
    keys: RunningGateway
    """[auth] mode = "api_key" with principals a (KEY_A) and b (KEY_B), and retention of SMALL_RETENTION
    events per task: a longer task's early events are dropped while it runs."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateways(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateways]:
    """Both gateways, started at once (a start mostly waits on processes: the gateway, its upstream)."""
    if request.config.getoption(
        IN_PROCESS_OPTION
    ):  # here: a skip raised in the task group below reaches pytest wrapped in a group
        pytest.skip("starts gateways and a browser: `make test` runs it, `make test-fast` does not")
    path = tmp_path_factory.mktemp("ui-store") / "gateway.db"
    big_config = f'[store]\npath = "{path}"\n\n[retention]\nmax_events_per_task = {2 * BIG_TASK_EVENTS}\n'
    keys_config = f"{TWO_KEYS}\n[retention]\nmax_events_per_task = {SMALL_RETENTION}\n"
    async with contextlib.AsyncExitStack() as stack:

        async def on_big_task() -> tuple[RunningGateway, str]:
            task_id = await fill_finished_task(path, BIG_TASK_EVENTS)
            return await stack.enter_async_context(
                start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=big_config)
            ), task_id

        async with asyncio.TaskGroup() as starting:
            big = starting.create_task(on_big_task())
            keys = starting.create_task(
                stack.enter_async_context(start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=keys_config))
            )
        yield Gateways(*big.result(), keys.result())


@pytest.fixture(scope="module")
def gw(gateways: Gateways) -> RunningGateway:
    return gateways.gw


@pytest.fixture(scope="module")
def big_task(gateways: Gateways) -> str:
    return gateways.big_task


@pytest.fixture(scope="module")
def gw_keys(gateways: Gateways) -> RunningGateway:
    return gateways.keys


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(gw: RunningGateway) -> AsyncIterator[GatewayClient]:
    """The test's own 2025-11-25 session on `gw` (each session costs an upstream process: one for the
    module). It declares form elicitation but opens no GET stream, so a task's question waits for the
    page's tasks/result."""
    async with GatewayClient(gw.url, capabilities=ELICITATION) as session:
        yield session


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keyed(gw_keys: RunningGateway) -> AsyncIterator[dict[str, GatewayClient]]:
    """A session of the test's own on `gw_keys` for each key."""
    async with (
        GatewayClient(gw_keys.url, headers=bearer(KEY_A)) as a,
        GatewayClient(gw_keys.url, headers=bearer(KEY_B)) as b,
    ):
        yield {KEY_A: a, KEY_B: b}


def view_url(gateway: RunningGateway, task_id: str) -> str:
    """The task view's shareable link."""
    return f"{gateway.base}/ui#/task/{task_id}"


async def open_view(page: Page, gateway: RunningGateway, task_id: str) -> UiHook:
    await page.goto(view_url(gateway, task_id))
    await page.locator(f'section#task-view[data-task-id="{task_id}"]').wait_for()
    return UiHook(page)


async def sign_in(page: Page, gateway: RunningGateway, key: str) -> None:
    """Open the list and give the page's prompt `key`."""
    await page.goto(f"{gateway.base}/ui")
    await page.locator("form#auth-form").wait_for()
    await page.locator("#auth-token").fill(key)
    await page.locator("#auth-submit").click()
    await page.locator("form#auth-form").wait_for(state="hidden")


def kind(event_type: str) -> str:
    """An event type without the gateway's vendor prefix (`io.github.mcp-task-gateway.progress` -> progress)."""
    return event_type.removeprefix("io.github.mcp-task-gateway.")


# -- a live task ----------------------------------------------------------------------------------


async def test_a_live_task_is_listed_within_a_second_and_its_timeline_is_the_stream(
    gw: RunningGateway, client: GatewayClient, big_task: str, page: Page
) -> None:
    await page.goto(f"{gw.base}/ui")
    # The list is live once it shows the task already there (its first tasks/list opens a session,
    # which costs the gateway an upstream process): from then on a new task must show within 1 s.
    await page.locator(f'#task-list tbody tr[data-task-id="{big_task}"]').wait_for()
    assert await page.locator("form#auth-form").is_hidden(), "auth is off on loopback: no prompt"
    task_id = await client.start_task("slow_build", {"steps": 10, "delay": 0.3})
    assert task_id is not None
    row = page.locator(f'#task-list tbody tr[data-task-id="{task_id}"]')
    await row.wait_for(timeout=1000)  # the list shows a new task within 1 s
    assert "slow_build" in await row.locator("td.tool").inner_text()

    await row.locator(f'td.task-id a[href="#/task/{task_id}"]').click()
    ui = UiHook(page)
    await page.locator(f'section#task-view[data-task-id="{task_id}"]').wait_for()
    # Live: the page holds a progress event while the gateway still says the task works.
    await ui.wait_for("ui.events().some(e => e.type.endsWith('.progress'))")
    assert (await client.get_task(task_id))["result"]["status"] == "working"
    await ui.wait_for_state("ended")

    held = await ui.events()
    direct = await direct_events(client, task_id)
    assert held == direct, f"page {held}\ndirect {direct}"
    assert [seq for seq, _ in held] == list(range(len(held))), "a gap or a duplicate"
    assert "completed" in await page.locator("#task-status").inner_text()
    assert "built 10 steps" in await page.locator("#task-outcome").inner_text()
    await page.locator(f'#timeline .event[data-seq="{held[-1][0]}"]').wait_for()

    # Back on the list, the row shows the task's end (the list updates itself), and the filter by status.
    await page.goto(f"{gw.base}/ui#/")
    row = page.locator(f'#task-list tr[data-task-id="{task_id}"]')
    await page.locator(f'#task-list tr[data-task-id="{task_id}"][data-status="completed"]').wait_for()
    await page.locator("select#status-filter").select_option("working")
    await row.wait_for(state="hidden")
    await page.locator("select#status-filter").select_option("completed")
    await row.wait_for()


async def test_a_reload_resumes_after_the_last_seq_held(gw: RunningGateway, client: GatewayClient, page: Page) -> None:
    # slow_build: task.created (0), "build started" (1), then per step a progress and a log, DELAY apart:
    # the page is reloaded just after an event, so the seq it holds then is the one it persisted.
    task_id = await client.start_task("slow_build", {"steps": 5, "delay": 0.8})
    assert task_id is not None
    ui = await open_view(page, gw, task_id)
    await ui.wait_for("ui.lastSeq() !== null && ui.lastSeq() >= 3")
    held_at_reload = await ui.last_seq()
    await page.reload()
    notice = page.locator("#stream-notice")
    await page.wait_for_function(
        "() => /resumed after [0-9,]+/.test(document.getElementById('stream-notice')?.textContent ?? '')"
    )
    resumed = re.search(r"resumed after ([0-9,]+)", await notice.inner_text())
    assert resumed is not None
    assert int(resumed.group(1).replace(",", "")) == held_at_reload
    await ui.wait_for_state("ended")
    assert (await client.get_task(task_id))["result"]["status"] == "completed"

    held = await ui.events()
    assert held == await direct_events(client, task_id), held


# -- input and cancel -----------------------------------------------------------------------------


async def test_an_input_required_task_is_answered_from_the_form(
    gw: RunningGateway, client: GatewayClient, page: Page
) -> None:
    # The creating client opens no GET stream: the question waits for the page's tasks/result.
    task_id = await client.start_task("deploy", {"environment": "ui-staging", "delay": 0.05})
    assert task_id is not None
    ui = await open_view(page, gw, task_id)
    form = page.locator("form#input-form")
    await form.wait_for(state="visible")
    assert "input_required" in await page.locator("#task-status").inner_text()
    confirm = form.locator('input[name="confirm"]')
    note = form.locator('[name="note"]')
    assert await confirm.get_attribute("type") == "checkbox"  # a boolean property
    for control in (confirm, note):
        assert await control.evaluate("el => el.labels.length > 0 || !!el.getAttribute('aria-label')")
    await confirm.check()
    await note.fill("from the page")
    await page.locator("#input-submit").click()
    await ui.wait_for_state("ended")
    assert await form.is_hidden()
    outcome = await client.task_result(task_id)

    assert outcome["content"][0]["text"] == "deployed to ui-staging", outcome
    assert "deployed to ui-staging" in await page.locator("#task-outcome").inner_text()
    async with asyncio.timeout(WAIT_MS / 1000):
        events = [event async for event in client.stream(task_id)]
    answered = [event["payload"] for event in events if kind(event["type"]) == "input.answered"]
    assert [payload["action"] for payload in answered] == ["accept"], answered
    assert b"deploying to ui-staging (from the page)" in orjson.dumps(events), "the note did not reach the tool"


async def test_a_task_cancelled_from_the_page_ends_cancelled(
    gw: RunningGateway, client: GatewayClient, page: Page
) -> None:
    task_id = await client.start_task("slow_build", {"steps": 100, "delay": 0.1})
    assert task_id is not None
    ui = await open_view(page, gw, task_id)
    cancel = page.locator("button#cancel-task")
    await ui.wait_for("ui.lastSeq() !== null && ui.lastSeq() >= 2")
    assert await cancel.is_enabled()
    await cancel.click()
    await page.wait_for_function(
        "() => (document.getElementById('task-status')?.textContent ?? '').includes('cancelled')"
    )
    await ui.wait_for_state("ended")
    assert (await client.get_task(task_id))["result"]["status"] == "cancelled"
    assert await cancel.is_disabled()


# -- principals -----------------------------------------------------------------------------------


async def test_each_key_sees_only_its_own_tasks_and_a_foreign_link_is_no_such_task(
    gw_keys: RunningGateway, keyed: dict[str, GatewayClient], browser: Browser
) -> None:
    tasks: dict[str, str] = {}
    for key, client in keyed.items():
        task_id = await client.start_task("slow_build", {"steps": 1, "delay": 0})
        assert task_id is not None
        tasks[key] = task_id

    for own, other in ((KEY_A, KEY_B), (KEY_B, KEY_A)):
        context = await browser.new_context(viewport=VIEWPORT)
        try:
            page = await context.new_page()
            problems = PageProblems(page)
            await sign_in(page, gw_keys, own)
            await page.locator(f'#task-list tr[data-task-id="{tasks[own]}"]').wait_for()
            listed = await page.locator("#task-list tbody tr[data-task-id]").evaluate_all(
                "rows => rows.map(row => row.dataset.taskId)"
            )
            assert tasks[other] not in listed, listed

            foreign = await not_found_view(page, gw_keys, tasks[other])
            unknown = await not_found_view(page, gw_keys, uuid.uuid4().hex)
            assert foreign == unknown, "another principal's task must look exactly like an unknown one"
            assert not problems.found, problems.found
        finally:
            await context.close()


async def not_found_view(page: Page, gateway: RunningGateway, task_id: str) -> str:
    """The task view's text for a task the page may not see (the id replaced, to compare two views)."""
    await page.goto(view_url(gateway, task_id))
    view = page.locator(f'section#task-view[data-task-id="{task_id}"]')
    await view.wait_for()
    not_found = page.locator("#not-found")
    await not_found.wait_for(state="visible")
    assert "no such task" in await not_found.inner_text()
    return (await view.inner_text()).replace(task_id, "<id>")


async def test_the_key_goes_only_in_the_authorization_header_and_stays_in_session_storage(
    gw_keys: RunningGateway, keyed: dict[str, GatewayClient], page: Page
) -> None:
    requests: list[Request] = []
    page.on("request", lambda request: requests.append(request))
    task_id = await keyed[KEY_A].start_task("slow_build", {"steps": 1, "delay": 0})
    assert task_id is not None
    await keyed[KEY_A].task_result(task_id)
    await sign_in(page, gw_keys, KEY_A)
    await page.locator(f'#task-list tr[data-task-id="{task_id}"]').wait_for()
    ui = await open_view(page, gw_keys, task_id)
    await ui.wait_for_state("ended")

    assert await page.evaluate(f"() => sessionStorage.getItem({TOKEN_KEY!r})") == KEY_A
    assert KEY_A not in await page.evaluate("() => JSON.stringify(localStorage) + document.cookie")
    assert KEY_A not in page.url
    assert all(KEY_A not in request.url for request in requests), [request.url for request in requests]
    mcp_posts = [request for request in requests if request.method == "POST" and request.url.endswith("/mcp")]
    assert mcp_posts, [request.url for request in requests]
    for request in mcp_posts:
        assert (await request.all_headers()).get("authorization") == f"Bearer {KEY_A}", request.url


# -- a big task -----------------------------------------------------------------------------------


async def test_a_big_task_scrolls_to_its_oldest_event_responsively_in_bounded_memory(
    gw: RunningGateway, big_task: str, page: Page
) -> None:
    ui = await open_view(page, gw, big_task)
    await ui.wait_for_state("ended", timeout_ms=60_000)
    await page.locator("#timeline .event").first.wait_for()
    # The machine is shared (the suite's other worker, its processes): another process can hold the CPU
    # from the browser for longer than INTERACTION_MS. So the walk is made up to PASSES times, back from
    # the newest event each time, and the best pass must answer every interaction in time: a page that
    # does too much work per interaction fails every pass. Memory and rendering bounds hold in every pass.
    passes: list[ScrollFigures] = []
    for _ in range(PASSES):
        if passes:
            await back_to_newest(page)
        passes.append(await scroll_to_oldest(page))
        if max(passes[-1].answers_ms) <= INTERACTION_MS:
            break
    reports = [describe(figures) for figures in passes]
    print(f"\nbig task ({BIG_TASK_EVENTS:,} events): " + " | ".join(reports))
    for figures, report in zip(passes, reports, strict=True):
        assert max(figures.held) <= MAX_HELD_EVENTS, f"the view held {max(figures.held)} events"
        assert max(figures.rendered) <= MAX_RENDERED_EVENTS, "the timeline renders more than is on screen"
        assert max(figures.retained) < HEAP_BOUND_BYTES, report
    assert min(max(figures.answers_ms) for figures in passes) <= INTERACTION_MS, reports


def describe(figures: ScrollFigures) -> str:
    answers = figures.answers_ms
    slowest = [round(ms) for ms in sorted(answers)[-5:]]
    return (
        f"{len(answers)} interactions, seq 0 on screen {figures.seconds:.1f} s after Home; answers ms: median "
        f"{statistics.median(answers):.1f}, slowest {slowest}; heap MiB: max {max(figures.heaps) / 2**20:.1f}, "
        f"retained {[round(b / 2**20, 1) for b in figures.retained]}; long tasks ms: {sorted(figures.long_tasks_ms)}"
    )


# -- events_gone ----------------------------------------------------------------------------------


async def test_events_gone_shows_the_earliest_retained_seq_and_loads_from_it(
    gw_keys: RunningGateway, keyed: dict[str, GatewayClient], page: Page
) -> None:
    client = keyed[KEY_A]
    await sign_in(page, gw_keys, KEY_A)
    task_id = await client.start_task("slow_build", {"steps": 12, "delay": 0.15})
    assert task_id is not None
    ui = await open_view(page, gw_keys, task_id)
    await ui.wait_for("ui.lastSeq() !== null && ui.lastSeq() >= 2")
    # The page goes away (its tab keeps its sessionStorage) while retention drops what it has not seen.
    await page.goto("about:blank")
    await client.task_result(task_id)
    direct = await direct_events(client, task_id)
    earliest = direct[0][0]
    assert len(direct) == SMALL_RETENTION and earliest > 3, direct

    await page.goto(view_url(gw_keys, task_id))
    gone = page.locator("#events-gone")
    await gone.wait_for(state="visible")
    assert re.search(rf"\b{earliest:,}\b", await gone.inner_text()), await gone.inner_text()
    await page.locator("button#load-from-earliest").click()
    await ui.wait_for(f"ui.events().length > 0 && ui.events()[0].seq === {earliest}")
    await ui.wait_for_state("ended")
    assert await ui.events() == direct


# -- the README's screenshot ----------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_the_readme_screenshot_is_a_finished_timeline(
    gw: RunningGateway, client: GatewayClient, page: Page
) -> None:
    task_id = await client.start_task("run_tests", {"suite": "integration", "count": 6, "delay": 0.05})
    assert task_id is not None
    result: dict[str, Any] = await client.task_result(task_id)
    ui = await open_view(page, gw, task_id)
    await ui.wait_for_state("ended")
    await page.locator("#task-outcome").wait_for(state="visible")
    assert result["content"][0]["text"] in await page.locator("#task-outcome").inner_text()
    shot = await page.screenshot()
    assert png_size(shot) == (VIEWPORT["width"], VIEWPORT["height"])
    await asyncio.to_thread(SCREENSHOT.write_bytes, shot)
