"""The /ui task timeline with a big task (issue 22): interaction latency and JS heap in a real browser.

A finished task of `--events` progress events is written into a SQLite store file in process (as
tests/test_ui_browser.py does), the real gateway is started on that file, and Debian's chromium
(Playwright, the system browser) opens the task's view `--runs` times, each in a fresh context: once
the view has loaded, it opens a payload, pages up, presses Home on the timeline (the jump to the first
event, whose rows are then read with tasks/stream) and probes with ArrowUp until seq 0 is on screen.
Every key and click is timed in the page from its input time stamp to just after the next paint.

    python bench/ui_timeline.py [--events 100000] [--runs 3]

Prints one markdown table: per run the interactions' median, p90 and max answer (ms), the seconds from
Home to seq 0 on screen, the JS heap in use at its peak (garbage included) and after a full collection,
the most events held and rendered, and the longest main-thread task. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser import (  # noqa: E402
    VIEWPORT,
    UiHook,
    fill_finished_task,
    launch_chromium,
    scroll_to_oldest,
)
from tests.conftest import EXAMPLE_SERVER, start_gateway  # noqa: E402

MIB = 1024 * 1024


async def main(events: int, runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        path = Path(tmp) / "gateway.db"
        filled = time.perf_counter()
        task_id = await fill_finished_task(path, events)
        filled = time.perf_counter() - filled
        config = f'[store]\npath = "{path}"\n\n[retention]\nmax_events_per_task = {2 * events}\n'
        rows = []
        async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw, launch_chromium() as browser:
            for run in range(1, runs + 1):
                context = await browser.new_context(viewport=VIEWPORT)
                try:
                    page = await context.new_page()
                    opened = time.perf_counter()
                    await page.goto(f"{gw.base}/ui#/task/{task_id}")
                    await UiHook(page).wait_for_state("ended", timeout_ms=120_000)
                    await page.locator("#timeline .event").first.wait_for()
                    loaded = time.perf_counter() - opened
                    figures = await scroll_to_oldest(page)
                finally:
                    await context.close()
                answers = sorted(figures.answers_ms)
                rows.append(
                    (
                        run,
                        len(answers),
                        statistics.median(answers),
                        answers[int(0.9 * (len(answers) - 1))],
                        answers[-1],
                        loaded,
                        figures.seconds,
                        max(figures.heaps) / MIB,
                        max(figures.retained) / MIB,
                        max(figures.held),
                        max(figures.rendered),
                        max(figures.long_tasks_ms, default=0.0),
                    )
                )
    total = events + 3
    print(f"\n## The /ui timeline with a {total:,}-event task ({runs} runs; log written in {filled:.1f} s)\n")
    print(
        "| run | interactions | answer median ms | p90 ms | max ms | view loaded s | Home to seq 0 s "
        "| heap peak MiB | heap retained MiB | most held | most rendered | longest task ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            "| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:,} | {} | {:.0f} |".format(
                *row
            )
        )
    medians = [statistics.median(row[i] for row in rows) for i in (2, 4, 7, 8)]
    print(
        f"\nmedian of the runs: answer median {medians[0]:.1f} ms, answer max {medians[1]:.1f} ms "
        f"(target every one <= 100 ms), heap peak {medians[2]:.1f} MiB, retained {medians[3]:.1f} MiB "
        "(bound 64 MiB)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.events, arguments.runs))
