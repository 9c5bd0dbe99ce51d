"""The official MCP conformance suite's ten `tasks-*` scenarios (SEP-2663) against gateway-hosted tasks.

The suite is npm `@modelcontextprotocol/conformance`, pinned with the Node 22 it needs in
tests/official_suite/package-lock.json (`make node_modules` installs both there). Its server scenarios
connect to a URL as a 2026-07-28 client and call fixture tools by name; here the URL is the gateway, in
front of tests/servers/tasks_suite_server.py, a plain SDK server with those tools and no Tasks of its own,
so every task the suite sees is one the gateway hosts. The `[[tasks.tools]]` policy below gives each
fixture the task support the scenarios describe:

* `greet` is sync-only (`forbidden`);
* `failing_job` and `test_tool_with_task` are `required` (a client without the extension gets -32021;
  `test_tool_with_task`'s first MRTR round reaches the client before a task exists);
* `confirm_delete` and `multi_input` are tasks at once (`always`, `input_window_ms = 0`): the suite
  expects their input requests on the task (`input_required`, answered with `tasks/update`);
* everything else is `always`; `protocol_error_job` fails with a JSON-RPC error at once, well within its
  window, and must still become a `failed` task with the error inlined (tasks-lifecycle).

Each scenario writes its verdicts to `checks.json`; a scenario passes when the suite exits 0 and every
check it reports is a SUCCESS (a skip or a warning is not). tasks-status-notifications reports one
check in this version of the suite, its own SKIPPED (it is not yet rewritten for `subscriptions/listen`):
that exact skip is asserted, so a suite that starts checking there fails this test until it is looked at.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.conftest import ROOT, RunningGateway, start_gateway, stop_process

pytestmark = pytest.mark.asyncio(loop_scope="module")

SUITE_VERSION = "0.2.0-alpha.12"
SUITE_DIR = ROOT / "tests" / "official_suite"
PACKAGE_DIR = SUITE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance"
NODE = SUITE_DIR / "node_modules" / ".bin" / "node"
"""Node 22 from the npm package `node` (the suite uses Node 22 APIs such as `fs.globSync`)."""

SCENARIOS = (
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
)
SKIPPED_BY_THE_SUITE = "tasks-status-notifications"
"""The scenario this suite version reports as one SKIPPED check of its own, whatever the server does."""

SCENARIO_TIMEOUT_MS = 60_000
"""The suite's own per-scenario timeout."""
RUN_TIMEOUT_S = 90.0
"""Seconds one scenario's process may take, start-up included, before it is killed and the test fails."""

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "tasks_suite_server.py")]

CONFIG = """
[[tasks.tools]]
match = "greet"
task_support = "forbidden"

[[tasks.tools]]
match = "failing_job"
modern = "required"

[[tasks.tools]]
match = "test_tool_with_task"
modern = "required"
input_window_ms = 10000

[[tasks.tools]]
match = "protocol_error_job"
modern = "always"
input_window_ms = 10000

[[tasks.tools]]
match = "confirm_delete"
modern = "always"
input_window_ms = 0

[[tasks.tools]]
match = "multi_input"
modern = "always"
input_window_ms = 0

[[tasks.tools]]
match = "*"
modern = "always"
"""


def suite_command() -> list[str]:
    """Node 22 and the suite's entry point, or fail the test saying how to get them."""
    manifest = PACKAGE_DIR / "package.json"
    if not NODE.exists() or not manifest.exists():
        pytest.fail(f"the official conformance suite is not installed in {SUITE_DIR}: run `make node_modules`")
    installed = json.loads(manifest.read_text(encoding="utf-8"))["version"]
    if installed != SUITE_VERSION:
        pytest.fail(f"{SUITE_DIR} has conformance {installed}, not {SUITE_VERSION}: run `make node_modules`")
    return [str(NODE), str(PACKAGE_DIR / "dist" / "index.js")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=SERVER, config_text=CONFIG) as running:
        yield running


async def run_scenario(url: str, scenario: str, out: Path) -> tuple[int, str, list[dict[str, Any]]]:
    """Run one server scenario against `url`: the exit code, its output, and the checks it wrote."""
    log = out / "suite.log"
    args = ["server", "--url", url, "--scenario", scenario, "--output-dir", str(out / "results")]
    with log.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            *suite_command(),
            *args,
            "--timeout",
            str(SCENARIO_TIMEOUT_MS),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            cwd=out,
            start_new_session=True,
        )
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            code = await proc.wait()
    finally:
        await stop_process(proc)
    output = log.read_text(encoding="utf-8", errors="replace")
    written = sorted((out / "results").glob(f"server-{scenario}-*/checks.json"))
    assert len(written) == 1, f"{scenario}: expected one checks.json, found {written}\n{output}"
    checks: list[dict[str, Any]] = json.loads(written[0].read_text(encoding="utf-8"))
    return code, output, checks


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_scenario_passes(gateway: RunningGateway, scenario: str, tmp_path: Path) -> None:
    code, output, checks = await run_scenario(gateway.url, scenario, tmp_path)
    verdicts = {check["id"]: check["status"] for check in checks}
    assert code == 0, f"{scenario}: the suite exited {code}\n{output}"
    if scenario == SKIPPED_BY_THE_SUITE:
        assert verdicts == {scenario: "SKIPPED"}, f"{scenario}: the suite now checks something: {checks}"
        return
    not_passed = [check for check in checks if check["status"] != "SUCCESS"]
    assert checks and not not_passed, f"{scenario}: {json.dumps(not_passed, indent=1)}\n{output}"
    if scenario == "tasks-lifecycle":
        # The fast protocol error under `always` (protocol_error_job) was judged, and passed.
        assert verdicts["sep-2663-tasks-get-status-failed"] == "SUCCESS", checks
