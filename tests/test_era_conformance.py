"""The official conformance suite's 2026-07-28 requirements, through the gateway in front of a legacy-only
server, next to the same suite against that server speaking 2026-07-28 natively.

The server is the Python SDK's own conformance "everything" server (tests/servers/conformance_everything_server.py):
natively it passes the suite's 2026-07-28 requirements but for the tasks extension, which it does not
implement. With `--legacy-only` it refuses every request outside a 2025-11-25 session, as stateful
legacy servers do, so everything a 2026-07-28 client gets through the gateway is bridged (`[upstream]
era = "auto"` learns that the upstream speaks 2025-11-25 only).

Both runs are recorded per scenario (checks passed, checks not passed), printed side by side, and every
scenario whose result differs must be one `DIFFERENCES` explains: a new difference, or one that went
away, fails the test until it is understood and written down (docs/gateway.md, "Bridging the eras",
has the same table).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from tests.conftest import EXAMPLE_SERVER, ROOT, RunningGateway, serve_http, start_gateway, stop_process
from tests.test_official_suite import suite_command

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "conformance_everything_server.py")]
RUN_TIMEOUT_S = 240.0
"""Seconds one whole run of the requirement set may take (it takes a few seconds)."""

SCENARIO_LINE = re.compile(r"^[✓✗] (?P<scenario>\S+): (?P<passed>\d+) passed, (?P<failed>\d+) failed$", re.MULTILINE)

SELF_MADE_INPUT_REQUIRED = (
    "the fixture tool returns a 2026-07-28 InputRequiredResult itself; in a 2025-11-25 session the SDK refuses "
    "that result (-32603 'Handler returned an invalid result'), so no legacy server can run it. A legacy server "
    "asks for input with server-to-client requests, which the bridge turns into MRTR rounds "
    "(tests/test_bridge_modern_client.py: elicitation, sampling, roots)"
)

DIFFERENCES: dict[str, str] = {
    **{
        f"input-required-result-{name}": SELF_MADE_INPUT_REQUIRED
        for name in (
            "basic-elicitation",
            "basic-list-roots",
            "basic-sampling",
            "capability-check",
            "missing-input-response",
            "multi-round",
            "multiple-input-requests",
            "non-tool-request",
            "request-state",
            "result-type",
            "tampered-state",
        )
    },
    "server-stateless": (
        "2 checks fewer, none failed: the server's 2025-11-25 initialize declares tools and prompts "
        "listChanged: false (its 2026-07-28 discover declares true), the bridged discover says what the "
        "legacy server declared, and the suite skips its two list_changed-on-subscription checks"
    ),
    "tasks-capability-negotiation": (
        "better (4/5, natively 2/5): the gateway hosts tasks for the server, which has none of its own; "
        "the failing check wants a task from a plain tools/call that only declares the extension, and the "
        "gateway's default policy runs such a call synchronously"
    ),
    "tasks-dispatch-and-envelope": (
        "better (7/9, natively 6/9): tasks/get of an unknown task id gets -32602 from the gateway's hosted "
        "tasks; the two failing checks want tasks the server itself decides to create"
    ),
}
"""Scenario → why it scores differently through the gateway in front of the legacy-only server than
against the server natively."""

PATH_DIFFERENCES: dict[str, str] = {
    scenario: DIFFERENCES[scenario] for scenario in ("tasks-capability-negotiation", "tasks-dispatch-and-envelope")
}
"""Scenario → why it scores differently on the server's own path of a many-upstream gateway (which
forwards in the server's own era) than against the server: the gateway hosts its tasks."""


@dataclass(frozen=True, slots=True)
class Score:
    passed: int
    not_passed: int

    @property
    def checks(self) -> int:
        return self.passed + self.not_passed


async def run_requirements(url: str, out: Path, name: str) -> dict[str, Score]:
    """The suite's 2026-07-28 requirement set against `url` (its output in `out`, under `name`): each
    scenario's checks passed and not passed."""
    log = out / f"{name}.log"
    args = ["server", "--url", url, "--requirements", "2026-07-28", "--output-dir", str(out / name)]
    with log.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            *suite_command(),
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            cwd=out,
            start_new_session=True,
        )
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            await proc.wait()
    finally:
        await stop_process(proc)
    output = log.read_text(encoding="utf-8", errors="replace")
    # The summary has one line per scenario, also for one that ended before writing its checks.
    scores = {
        match["scenario"]: Score(int(match["passed"]), int(match["failed"])) for match in SCENARIO_LINE.finditer(output)
    }
    assert scores, f"the suite reported no scenario:\n{output}"
    return scores


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def native_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    log = tmp_path_factory.mktemp("native") / "server.log"
    async with serve_http(SERVER, log=log, port_option="--port") as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bridged(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningGateway]:
    log = tmp_path_factory.mktemp("legacy") / "server.log"
    async with (
        serve_http(SERVER, "--legacy-only", log=log, port_option="--port") as upstream_url,
        start_gateway(upstream_url=upstream_url) as gateway,
    ):
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def native(native_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Score]:
    """The requirement set against the server itself, run once for every comparison."""
    return await run_requirements(native_url, tmp_path_factory.mktemp("native-run"), "native")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def on_its_path(native_url: str) -> AsyncIterator[str]:
    """The server as one of two `[[upstreams]]`: its own endpoint, /servers/conformance/mcp."""
    config = (
        f'[[upstreams]]\nname = "conformance"\nurl = "{native_url}"\n\n'
        f'[[upstreams]]\nname = "build"\ncommand = {json.dumps(EXAMPLE_SERVER)}\n'
    )
    async with start_gateway(config_text=config) as gateway:
        yield f"{gateway.base}/servers/conformance/mcp"


def compare(native: dict[str, Score], through: dict[str, Score], label: str, explained: dict[str, str]) -> None:
    """Print both runs side by side; fail on a difference `explained` lacks, or an explanation of none."""
    assert set(native) == set(through), (sorted(native), sorted(through))
    table = [f"{'scenario':48} {'native':>9} {label:>9}"]
    for scenario in sorted(native):
        n, b = native[scenario], through[scenario]
        table.append(
            f"{scenario:48} {n.passed:>4}/{n.passed + n.not_passed:<4} {b.passed:>4}/{b.passed + b.not_passed:<4}"
        )
    totals = [sum(s.passed for s in scores.values()) for scores in (native, through)]
    checks = [sum(s.checks for s in scores.values()) for scores in (native, through)]
    table.append(f"{'total':48} {totals[0]:>4}/{checks[0]:<4} {totals[1]:>4}/{checks[1]:<4}")
    print("\n".join(table))  # the record: `pytest -s` shows it; docs/gateway.md has the explained rows
    differing = {scenario for scenario in native if native[scenario] != through[scenario]}
    unexplained = sorted(differing - set(explained))
    assert not unexplained, "scores differ without an explanation:\n" + "\n".join(table)
    explained_but_equal = sorted(set(explained) - differing)
    assert not explained_but_equal, f"explained differences that no longer exist: {explained_but_equal}"


async def test_the_2026_requirements_score_through_the_bridge_as_natively_but_for_the_explained(
    native: dict[str, Score], bridged: RunningGateway, tmp_path: Path
) -> None:
    compare(native, await run_requirements(bridged.url, tmp_path, "bridged"), "bridged", DIFFERENCES)


async def test_the_2026_requirements_score_on_an_upstreams_own_path_as_natively_but_for_hosted_tasks(
    native: dict[str, Score], on_its_path: str, tmp_path: Path
) -> None:
    """/servers/NAME/mcp forwards as the single endpoint does: the same scores as the server's own,
    but for the scenarios where the gateway hosts the tasks the server has none of."""
    compare(native, await run_requirements(on_its_path, tmp_path, "path"), "path", PATH_DIFFERENCES)
