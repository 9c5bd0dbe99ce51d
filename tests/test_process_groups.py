"""A stdio upstream's whole process group is stopped: at a session's end, when its process is parked,
and when the gateway shuts down.

The upstream is a shell wrapper, as `npx` or `uvx` is: it runs the example server as its child (not
`exec`), beside a grandchild that ignores SIGTERM and the session (it reads nothing and sleeps). Each
test finds the wrapper's process group from /proc (the wrapper's pid, which it writes to a file, is
the group's id) and checks that no process of it is alive after the stop; signalling the wrapper alone
left both the server and the sleeper running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway, stop_process
from tests.test_global_limits import eventually
from tests.wire import Client

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process groups from /proc")

WRAPPER = """#!/bin/sh
# Like npx: the server runs as this shell's child, beside a grandchild that ignores SIGTERM and the session.
(trap '' TERM; exec sleep 600) &
echo $$ > "$1"
shift
"$@"
"""

GRACE = "shutdown_timeout_s = 0.3"
"""[upstream.stdio]: the stop's waits are short, so the SIGKILL of the sleeper comes soon."""

TIMEOUT = 30.0

PARKED_ONCE = "mcp_gateway_sessions_parked_total 1.0"


def group_members(pgid: int) -> set[int]:
    """The live (not zombie) processes whose process group is `pgid`, read from /proc/PID/stat."""
    members = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        state, _ppid, pgrp = stat.rpartition(")")[2].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.add(int(entry.name))
    return members


@contextlib.asynccontextmanager
async def wrapped_gateway(tmp_path: Path, server_config: str = "") -> AsyncIterator[tuple[RunningGateway, Path]]:
    """The gateway in front of the example server through the wrapper; yields it and the pid file."""
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(WRAPPER, encoding="utf-8")
    pid_file = tmp_path / "wrapper.pid"
    config = f"[server]\n{server_config}\n[upstream.stdio]\n{GRACE}\nidle_processes = 0\n[store]\nkind = 'memory'\n"
    async with start_gateway(
        upstream_cmd=["sh", str(wrapper), str(pid_file), *EXAMPLE_SERVER], config_text=config
    ) as gw:
        yield gw, pid_file


async def open_session(gw: RunningGateway, http: aiohttp.ClientSession, pid_file: Path) -> tuple[Client, int]:
    """A legacy session (its own upstream process); the wrapper's process group once all three run."""
    client = Client(http, gw.url)
    await client.initialize()  # the server answered: the wrapper, the server and the sleeper are up
    pgid = int(pid_file.read_text())  # noqa: ASYNC240 - a few bytes the wrapper wrote before the server started
    assert len(group_members(pgid)) >= 3, f"expected the wrapper, the server and the sleeper in group {pgid}"
    return client, pgid


def kill_group(pgid: int) -> None:
    """The test's own clean-up, should the gateway have left the group behind."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def test_deleting_the_session_stops_the_whole_group(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http, wrapped_gateway(tmp_path) as (gw, pid_file):
        client, pgid = await open_session(gw, http, pid_file)
        try:
            async with asyncio.timeout(TIMEOUT):
                assert await client.delete() == 200
            # DELETE answers once the session's process is stopped.
            assert group_members(pgid) == set()
        finally:
            kill_group(pgid)


async def test_parking_the_session_stops_the_whole_group(tmp_path: Path) -> None:
    async with (
        aiohttp.ClientSession() as http,
        wrapped_gateway(tmp_path, "session_process_idle_s = 0.2") as (gw, pid_file),
    ):
        client, pgid = await open_session(gw, http, pid_file)
        groups = [pgid]
        try:
            # The counter moves once the parked process is stopped (SessionRegistry._park).
            async def parked() -> bool:
                return PARKED_ONCE in await (await http.get(f"{gw.base}/metrics")).text()

            await eventually(parked, TIMEOUT, "the idle session's process parked")
            assert group_members(pgid) == set()
            # The session lives on: its next request starts a group of its own again.
            assert "tools" in await client.result("tools/list")
            groups.append(int(pid_file.read_text()))
            assert groups[1] != pgid and len(group_members(groups[1])) >= 3
        finally:
            for group in groups:
                kill_group(group)


async def test_gateway_shutdown_stops_the_whole_group(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as http, wrapped_gateway(tmp_path) as (gw, pid_file):
        _, pgid = await open_session(gw, http, pid_file)
        try:
            gw.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(TIMEOUT):
                assert await gw.proc.wait() == 0
            assert group_members(pgid) == set()
        finally:
            kill_group(pgid)
            await stop_process(gw.proc)
