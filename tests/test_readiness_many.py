"""Readiness of several named upstreams: `ReadinessSet` (any/all, the /readyz body naming each),
`Readiness.on_change` (told when one goes down and when it comes back), the `upstream` label and log
field, and `unavailable_error` (names the upstream and why, never its command line).

Real stdio upstreams: the example server, a command that exits at once, and a script that exits unless
a flag file exists and otherwise execs the example server; an HTTP upstream at a port nothing listens
on. Every wait is on an event, bounded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.config import HttpUpstreamConfig, ReadinessConfig, StdioConfig
from gateway.metrics import Metrics
from gateway.readiness import (
    UPSTREAM_UNAVAILABLE,
    Readiness,
    ReadinessSet,
    UpstreamState,
    unavailable_error,
)
from gateway.upstream.http import HttpUpstream
from gateway.upstream.stdio import StdioUpstream
from tests.conftest import EXAMPLE_SERVER, free_port

WAIT_S = 30.0
"""Bound of every wait below (a check starts one process)."""

EXITS = [sys.executable, "-c", "raise SystemExit(1)"]
FAST = ReadinessConfig(retry_initial_s=0.1, retry_max_s=0.3, recheck_interval_s=0.2)
"""Quick re-checks: a usable upstream is checked again every few tenths of a second."""

FLAGGED = """\
import os, sys
if not os.path.exists({flag!r}):
    print("flagged.py: no flag file", file=sys.stderr)
    sys.exit(1)
os.execv({python!r}, {server!r})
"""
"""An upstream command that runs the example server only while its flag file exists."""

Change = tuple[str, UpstreamState]


@asynccontextmanager
async def readiness_of(commands: dict[str, list[str]], metrics: Metrics) -> AsyncIterator[list[Readiness]]:
    """The readiness of one stdio upstream per named command (not started); stopped and closed on exit."""
    links = {name: StdioUpstream(command, StdioConfig(), metrics, name=name) for name, command in commands.items()}
    readinesses = [Readiness(link, f"command {name}", FAST, 10.0, metrics, name=name) for name, link in links.items()]
    try:
        yield readinesses
    finally:
        await asyncio.gather(*(readiness.stop() for readiness in readinesses))
        await asyncio.gather(*(link.close() for link in links.values()))


def recorder() -> tuple[asyncio.Queue[Change], Callable[[str, UpstreamState], None]]:
    changes: asyncio.Queue[Change] = asyncio.Queue()
    return changes, lambda name, state: changes.put_nowait((name, state))


async def next_change(changes: asyncio.Queue[Change]) -> Change:
    async with asyncio.timeout(WAIT_S):
        return await changes.get()


async def first_states(changes: asyncio.Queue[Change], count: int) -> dict[str, UpstreamState]:
    """The first change of each of `count` upstreams (out of "starting")."""
    seen: dict[str, UpstreamState] = {}
    while len(seen) < count:
        name, state = await next_change(changes)
        assert name not in seen, (name, state, seen)
        seen[name] = state
    return seen


async def test_any_or_all_upstreams_ready_and_the_body_names_each() -> None:
    metrics = Metrics()
    async with readiness_of({"build": EXAMPLE_SERVER, "broken": EXITS}, metrics) as readinesses:
        readiness = ReadinessSet(readinesses, "any")
        every = ReadinessSet(readinesses, "all")
        assert not readiness.ready and readiness.body()["status"] == "unready"  # both still starting
        assert readiness.state_of("build").status == "starting"
        changes, listener = recorder()
        readiness.on_change(listener)
        readiness.start()
        states = await first_states(changes, 2)

        assert states["build"].ready and states["broken"].status == "unready", states
        assert readiness.ready
        assert readiness.state_of("broken") == states["broken"]
        body = readiness.body()
        assert body["status"] == "ready" and body["ready_when"] == "any", body
        assert body["upstreams"].keys() == {"build", "broken"}, body
        assert body["upstreams"]["build"] == states["build"].body(), body
        assert body["upstreams"]["broken"]["status"] == "unready", body
        assert "exited (code 1)" in body["upstreams"]["broken"]["reason"], body
        assert "SystemExit" not in json.dumps(body) and sys.executable not in json.dumps(body), body

        assert not every.ready and every.body()["status"] == "unready"
        assert every.body()["ready_when"] == "all"

        error = unavailable_error("broken", readiness.state_of("broken"))
        assert error.http_status == 503, error
        assert error.data == {"reason": UPSTREAM_UNAVAILABLE, "upstream": "broken"}, error.data
        assert "upstream 'broken' is not usable" in error.message and "exited (code 1)" in error.message, error
        assert "/readyz" in error.message and "SystemExit" not in error.message, error.message

        ready = metrics.registry.get_sample_value
        assert ready("mcp_gateway_upstream_ready", {"upstream": "build"}) == 1
        assert ready("mcp_gateway_upstream_ready", {"upstream": "broken"}) == 0
        assert ready("mcp_gateway_upstream_checks_total", {"outcome": "unusable", "upstream": "broken"}) >= 1


async def test_on_change_tells_when_an_upstream_goes_down_and_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    flag = tmp_path / "flag"
    flag.touch()
    script = tmp_path / "flagged.py"
    script.write_text(FLAGGED.format(flag=str(flag), python=sys.executable, server=EXAMPLE_SERVER))
    commands = {"build": EXAMPLE_SERVER, "flaky": [sys.executable, str(script)]}
    caplog.set_level(logging.INFO, logger="gateway.readiness")
    async with readiness_of(commands, Metrics()) as readinesses:
        readiness = ReadinessSet(readinesses, "all")
        changes, listener = recorder()

        def broken_listener(name: str, state: UpstreamState) -> None:
            raise RuntimeError("a listener's bug")

        readiness.on_change(broken_listener)  # must not keep the next listener from hearing
        readiness.on_change(listener)
        readiness.start()
        states = await first_states(changes, 2)
        assert states["build"].ready and states["flaky"].ready, states
        assert readiness.ready

        flag.unlink()
        name, down = await next_change(changes)
        assert name == "flaky" and down.status == "unready", (name, down)
        assert "flagged.py: no flag file" in (down.reason or ""), down  # the upstream's words: log and /readyz
        assert down.client_reason is not None and "flag" not in down.client_reason, down  # not for clients
        assert not readiness.ready and readiness.state_of("build").ready
        assert "flag" not in unavailable_error(name, down).message

        flag.touch()
        name, back = await next_change(changes)
        assert name == "flaky" and back.ready and back.reason is None, (name, back)
        assert readiness.ready
        assert changes.empty(), changes  # one change each way, not one per check

    by_flaky = [record for record in caplog.records if getattr(record, "upstream", None) == "flaky"]
    messages = [record.getMessage() for record in by_flaky]
    assert any("flaky ready" in message for message in messages), messages
    assert any("flaky not usable any more" in message for message in messages), messages
    assert any("flaky usable again" in message for message in messages), messages
    assert any(record.getMessage() == "a readiness listener failed" for record in by_flaky), messages


async def test_a_set_needs_upstreams_with_distinct_names() -> None:
    with pytest.raises(ValueError, match="distinct names"):
        ReadinessSet([], "any")
    async with readiness_of({"build": EXAMPLE_SERVER}, Metrics()) as (first,):
        twin = Readiness(StdioUpstream(EXITS, StdioConfig(), Metrics()), "twin", FAST, 10.0, Metrics(), name="build")
        with pytest.raises(ValueError, match="distinct names"):
            ReadinessSet([first, twin], "any")


def test_an_upstream_not_yet_checked_is_unavailable_for_that_reason() -> None:
    state = UpstreamState("starting", "internal detail", 0.0, client_reason="the first check has not finished")
    error = unavailable_error("search", state)
    assert "upstream 'search' is not usable (the first check has not finished)" in error.message, error.message
    assert "internal detail" not in error.message


async def test_a_stdio_link_labels_its_metrics_and_log_lines_with_its_name(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.upstream.stdio")
    metrics = Metrics()
    link = StdioUpstream(EXAMPLE_SERVER, StdioConfig(idle_processes=1), metrics, name="build")
    processes = {"upstream": "build"}
    assert metrics.registry.get_sample_value("mcp_gateway_upstream_processes", processes) == 0
    assert metrics.registry.get_sample_value("mcp_gateway_upstream_restarts_total", processes) == 0
    try:
        async with asyncio.timeout(WAIT_S):
            await link.start()  # one warm idle process
        assert metrics.registry.get_sample_value("mcp_gateway_upstream_processes", processes) == 1
    finally:
        await link.close()
    assert metrics.registry.get_sample_value("mcp_gateway_upstream_processes", processes) == 0
    started = [record for record in caplog.records if record.getMessage() == "upstream process started"]
    assert [getattr(record, "upstream", None) for record in started] == ["build"], started


async def test_an_unreachable_http_upstream_is_unready_by_name_without_its_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.upstream.http")
    port = free_port()
    metrics = Metrics()
    link = HttpUpstream(f"http://127.0.0.1:{port}/mcp", HttpUpstreamConfig(), metrics, name="search")
    await link.start()
    readiness = Readiness(link, f"http://127.0.0.1:{port}/mcp", FAST, 10.0, metrics, name="search")
    changes, listener = recorder()
    readiness.on_change(listener)
    readiness.start()
    try:
        name, state = await next_change(changes)
    finally:
        await readiness.stop()
        await link.close()
    assert name == "search" and state.status == "unready" and "unreachable" in (state.reason or ""), state
    error = unavailable_error(name, state)
    assert "upstream 'search' is not usable" in error.message and str(port) not in error.message, error.message
    assert str(port) not in str(state.body()), state.body()
    unreachable = [record for record in caplog.records if "unreachable" in record.getMessage()]
    assert unreachable and {getattr(record, "upstream", None) for record in unreachable} == {"search"}, unreachable
