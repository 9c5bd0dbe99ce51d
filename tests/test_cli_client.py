"""Acceptance: what the client commands show a person (issue 17, items 2 and 5).

`call` shows progress and log notifications on stderr (lines on a pipe, a bar on a terminal; `--quiet`
silences them), `call --task` keeps stdout to a task id (a call answered without a task exits 6 with
the answer on stderr), `tools` lists the tools with their task support, a URL whose path answers 404
suggests `…/mcp`, `tasks list` is a table (or "no tasks"), Ctrl-C on `tail` / `call --follow` prints the
command that resumes, and form elicitation is answered from `--answers` (or a prompt on a terminal) for
plain calls and for `input_required` tasks in both eras.

Every command runs as the real `mcp-task-gateway` console script (`cli` of test_cli_tasks.py) against
a real gateway in front of the example server; the pure parts (the progress display, the prompt's
parsing, the resume command, the suggested URL) are unit-tested on top.
"""

from __future__ import annotations

import asyncio
import io
import os
import pty
import select
import shlex
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest

from gateway.client.elicit import field_value
from gateway.client.progress import ProgressDisplay
from gateway.client.stream import suggest_endpoint
from gateway.client.tail import Printer, resume_command
from gateway.protocol.era import Era
from tests.conftest import EXAMPLE_SERVER, ROOT, RunningGateway, start_gateway
from tests.test_cli_tasks import CLI, cli, json_lines, one_line

# deploy asks at once (the SDK resolver style): with after_ms = 0 a 2026-07-28 call is a task before it
# asks, so its question is a task's input_required; everything else keeps the defaults.
CONFIG = """
[[tasks.tools]]
match = "deploy"
task_support = "optional"
modern = "after_ms"
after_ms = 0

[[tasks.tools]]
match = "*"
task_support = "optional"
"""
WAIT = 60.0
"""Seconds any one command may take."""


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway:
        yield gateway


# -- the pure parts -----------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_display_lines_bar_and_no_total() -> None:
    """Lines on a pipe, a bar redrawn in place on a terminal; progress without a total is a count."""
    piped = io.StringIO()
    display = ProgressDisplay(piped, "call")
    display.notification({"method": "notifications/progress", "params": {"progress": 1, "total": 4, "message": "a"}})
    display.notification({"method": "notifications/progress", "params": {"progress": 2}})
    display.notification({"method": "notifications/message", "params": {"level": "info", "data": "hello"}})
    assert piped.getvalue().splitlines() == ["call: progress 1/4  a", "call: progress 2", "call: log info    hello"]

    terminal = Terminal()
    display = ProgressDisplay(terminal, "call")
    display.notification({"method": "notifications/progress", "params": {"progress": 1, "total": 4, "message": "a"}})
    assert terminal.getvalue() == "\r\x1b[K[" + "#" * 6 + "-" * 18 + "] 1/4  a"
    display.notification({"method": "notifications/progress", "params": {"progress": 3, "message": "b"}})
    assert terminal.getvalue().endswith("\r\x1b[K3  b")
    display.notification({"method": "notifications/message", "params": {"level": "warning", "data": "w"}})
    assert terminal.getvalue().endswith("\r\x1b[Kcall: log warning w\n3  b")  # the log line, then the bar again
    display.clear()
    assert terminal.getvalue().endswith("\r\x1b[K")

    quiet = io.StringIO()
    display = ProgressDisplay(quiet, "call", quiet=True)
    display.notification({"method": "notifications/progress", "params": {"progress": 1, "total": 4}})
    display.notification({"method": "notifications/message", "params": {"level": "info", "data": "x"}})
    assert quiet.getvalue() == ""


def test_progress_display_skips_task_events_shown_live() -> None:
    """A 2026-07-28 call that became a task: its events repeat what came live, and are shown once."""
    err = io.StringIO()
    display = ProgressDisplay(err, "call")
    display.notification({"method": "notifications/progress", "params": {"progress": 1, "total": 2}})
    display.notification({"method": "notifications/message", "params": {"level": "info", "data": "one"}})
    prefix = "io.github.mcp-task-gateway."
    events = [
        ("progress", {"progress": 1, "total": 2}),
        ("log", {"level": "info", "data": "one"}),
        ("progress", {"progress": 2, "total": 2}),
        ("log", {"level": "info", "data": "two"}),
    ]
    for kind, payload in events:
        display.event({"seq": 0, "type": prefix + kind, "payload": payload})
    assert err.getvalue().splitlines() == [
        "call: progress 1/2",
        "call: log info    one",
        "call: progress 2/2",
        "call: log info    two",
    ]


def test_prompt_values_and_suggested_url_and_resume_command() -> None:
    assert field_value("y", {"type": "boolean"}) is True
    assert field_value("No", {"type": "boolean"}) is False
    assert field_value("3", {"type": "integer"}) == 3
    assert field_value("2.5", {"type": "number"}) == 2.5
    assert field_value("blue", {"type": "string", "enum": ["red", "blue"]}) == "blue"
    for text, spec, error in [("maybe", {"type": "boolean"}, "y or n"), ("x", {"type": "integer"}, "an integer"),
                              ("green", {"enum": ["red", "blue"]}, "one of red, blue")]:  # fmt: skip
        with pytest.raises(ValueError, match=error):
            field_value(text, spec)

    assert suggest_endpoint("http://h:1/") == "http://h:1/mcp"
    assert suggest_endpoint("http://h:1") == "http://h:1/mcp"
    assert suggest_endpoint("http://h:1/api?x=1") == "http://h:1/api/mcp"
    assert suggest_endpoint("http://h:1/mcp/") is None

    printer = Printer(io.StringIO(), io.StringIO(), json_lines=False, after=4)
    assert resume_command("http://h:1/mcp", printer, era=Era.LEGACY, json_lines=False, headers=[]) is None
    printer.task_id = "t1"
    assert (
        resume_command(
            "http://h:1/mcp", printer, era=Era.MODERN, json_lines=True, headers=["X-A: 1", "authorization: x"]
        )
        == "mcp-task-gateway tail http://h:1/mcp t1 --after 4 --era modern --json --header 'X-A: 1'"
    )
    printer.event({"seq": 5, "taskId": "t1", "type": "x", "payload": {}})
    assert resume_command("http://h:1/mcp", printer, era=Era.LEGACY, json_lines=False, headers=[]).endswith("--after 5")  # type: ignore[union-attr]


# -- the commands ----------------------------------------------------------------------------------


async def test_call_shows_progress_and_logs_on_stderr(gw: RunningGateway) -> None:
    """On a pipe, each progress and log notification is a line on stderr; stdout has only the result."""
    code, out, err = await cli("call", gw.url, "slow_build", "--args", '{"steps": 3, "delay": 0.05}', timeout=WAIT)
    assert (code, out) == (0, "built 3 steps\n"), err
    lines = err.splitlines()
    assert [line for line in lines if line.startswith("call: progress")] == [
        f"call: progress {i}/3  step {i}/3" for i in (1, 2, 3)
    ], err
    assert "call: log info    builder: build started: 3 steps" in lines
    assert [line for line in lines if "finished step" in line] == [
        f"call: log info    builder: finished step {i}" for i in (1, 2, 3)
    ]

    # 2026-07-28: logs are opt-in per request, and the CLI opts in.
    code, out, err = await cli(
        "call", gw.url, "slow_build", "--args", '{"steps": 2, "delay": 0.05}', "--era", "modern", timeout=WAIT
    )
    assert (code, out) == (0, "built 2 steps\n"), err
    assert "call: progress 2/2  step 2/2" in err.splitlines() and "builder: finished step 2" in err

    code, out, err = await cli(
        "call", gw.url, "slow_build", "--args", '{"steps": 3, "delay": 0.05}', "--quiet", timeout=WAIT
    )
    assert (code, out, err) == (0, "built 3 steps\n", "")


async def test_call_task_answered_without_a_task(gw: RunningGateway) -> None:
    """A 2026-07-28 call answered within after_ms: stdout stays empty, the answer goes to stderr, exit 6."""
    args = ("call", gw.url, "slow_build", "--args", '{"steps": 1, "delay": 0}', "--era", "modern")
    code, out, err = await cli(*args, "--task", "--quiet", timeout=WAIT)
    assert (code, out) == (6, ""), err
    assert err.splitlines() == [
        "call: the server answered at once, without creating a task; its answer:",
        "built 1 steps",
    ]
    code, out, err = await cli(*args, "--task", "--quiet", "--json", timeout=WAIT)
    assert (code, out) == (6, ""), err
    assert json_lines(err.splitlines()[-1])[0]["content"] == [{"type": "text", "text": "built 1 steps"}]
    # --follow prints the result as usual.
    code, out, err = await cli(*args, "--task", "--follow", timeout=WAIT)
    assert (code, out) == (0, "built 1 steps\n"), err
    assert "without creating a task" in err


async def test_tools(gw: RunningGateway) -> None:
    code, out, err = await cli("tools", gw.url, timeout=WAIT)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "TASKS", "DESCRIPTION"]
    by_name = {row.split()[0]: row.split(None, 2)[1:] for row in rows}
    assert by_name["slow_build"] == [
        "optional",
        "Run a build of `steps` steps, `delay` seconds each, reporting progress and logs per step.",
    ]
    assert {"echo", "deploy", "burst"} <= set(by_name)

    code, out, err = await cli("tools", gw.url, "--json", timeout=WAIT)
    assert code == 0, err
    tools = {tool["name"]: tool for tool in json_lines(out)}
    assert tools["slow_build"]["execution"]["taskSupport"] == "optional"
    assert "inputSchema" in tools["slow_build"]


async def test_a_path_that_answers_404_suggests_mcp(gw: RunningGateway) -> None:
    root = gw.url.removesuffix("mcp")
    for command in (["tools", root], ["call", root, "echo"], ["tasks", root, "list"], ["tail", root, "x"],
                    ["call", root, "echo", "--era", "modern"]):  # fmt: skip
        code, out, err = await cli(*command, timeout=WAIT)
        assert (code, out) == (2, ""), (command, err)
        line = one_line(err)
        assert f"HTTP 404 from {root}: no MCP endpoint at this path; did you mean {gw.url}?" in line, command
        assert "unreachable" not in line and "cannot reach" not in line


async def test_tasks_list_table(gw: RunningGateway) -> None:
    code, out, err = await cli("tasks", gw.url, "list", timeout=WAIT)
    assert (code, out) == (0, "no tasks\n"), err
    code, out, err = await cli("tasks", gw.url, "list", "--json", timeout=WAIT)
    assert (code, out) == (0, ""), err

    code, out, err = await cli("call", gw.url, "slow_build", "--args", '{"steps": 1, "delay": 0}', "--task")
    assert code == 0, err
    task_id = out.strip()
    code, out, err = await cli("tasks", gw.url, "result", task_id, timeout=WAIT)
    assert code == 0, err
    code, out, err = await cli("tasks", gw.url, "list", timeout=WAIT)
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["TASK", "ID", "TOOL", "STATUS", "CREATED"]
    assert row.split()[:3] == [task_id, "slow_build", "completed"]
    assert row.split()[3].startswith("20") and row.split()[3].endswith("Z")


async def read_line(stream: asyncio.StreamReader) -> str:
    line = await asyncio.wait_for(stream.readline(), WAIT)
    assert line, "the command ended early"
    return line.decode()


@pytest.mark.parametrize("command", ["tail", "call --follow"])
async def test_ctrl_c_prints_the_command_that_resumes(gw: RunningGateway, command: str) -> None:
    """SIGINT after a few events: exit 130, and stderr names the last seq and the `tail … --after N` that
    resumes; that command goes on from the next seq."""
    build = ["slow_build", "--args", '{"steps": 200, "delay": 0.05}']
    if command == "tail":
        code, out, err = await cli("call", gw.url, *build, "--task", timeout=WAIT)
        assert code == 0, err
        argv = ["tail", gw.url, out.strip(), "--json"]
    else:
        argv = ["call", gw.url, *build, "--follow", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        str(CLI), *argv,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        printed = [json_lines(await read_line(proc.stdout))[0] for _ in range(3)]
        proc.send_signal(signal.SIGINT)
        rest, err_bytes = await asyncio.wait_for(proc.communicate(), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    printed += json_lines(rest.decode())
    err = err_bytes.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    task_id, last = printed[0]["taskId"], printed[-1]["seq"]
    expected = f"mcp-task-gateway tail {gw.url} {task_id} --after {last} --json"
    assert f"interrupted after seq {last} of task {task_id}; resume with: {expected}" in err.splitlines()[-1]

    code, out, err = await cli(*shlex.split(expected)[1:], timeout=WAIT)
    assert code == 0, err
    resumed = json_lines(out)
    assert [event["seq"] for event in resumed] == list(range(last + 1, last + 1 + len(resumed)))
    assert resumed[-1]["payload"]["status"] == "completed"


async def test_answers_answer_deploy(gw: RunningGateway) -> None:
    """`--answers` answers deploy's confirmation: a plain call (2025-11-25: elicitation/create mid-call;
    2026-07-28: an InputRequiredResult the call is retried with) and a task in input_required (both eras)."""
    deploy = ["call", gw.url, "deploy", "--args", '{"environment": "staging", "delay": 0}']
    yes = ["--answers", '{"confirm": true, "note": "ok", "unasked": 1}']
    code, out, err = await cli(*deploy, *yes, timeout=WAIT)
    assert (code, out) == (0, "deployed to staging\n"), err
    assert """call: answered 'Deploy to staging?' with {"confirm":true,"note":"ok"}""" in err.splitlines()
    assert "call: log info    builder: deploying to staging (ok)" in err.splitlines()

    # Under after_ms = 0, a 2026-07-28 call is a task at once: its question is the task's input_required.
    code, out, err = await cli(*deploy, *yes, "--era", "modern", timeout=WAIT)
    assert (code, out) == (0, "deployed to staging\n"), err
    for era in ("legacy", "modern"):
        code, out, err = await cli(*deploy, *yes, "--era", era, "--follow", "--json", timeout=WAIT)
        assert code == 0, (era, err)
        *events, result = json_lines(out)
        assert result["content"] == [{"type": "text", "text": "deployed to staging"}]
        kinds = [event["type"].rsplit(".", 2)[-2:] for event in events]
        assert ["input", "requested"] in kinds and ["input", "answered"] in kinds, (era, kinds)
        answered = next(event for event in events if event["type"].endswith("input.answered"))
        assert answered["payload"]["action"] == "accept"

    # A task started with --task gets its question answered by `tasks result --answers`.
    code, out, err = await cli(*deploy, "--task", timeout=WAIT)
    assert code == 0, err
    code, out, err = await cli("tasks", gw.url, "result", out.strip(), *yes, timeout=WAIT)
    assert (code, out) == (0, "deployed to staging\n"), err

    # No terminal and no answer for a required field: answered cancel, and the tool says so.
    code, out, err = await cli(*deploy, "--answers", '{"note": "x"}', timeout=WAIT)
    assert (code, out) == (0, "deployment cancelled\n"), err
    assert "without a terminal (--answers lacks confirm): answered cancel" in err
    code, out, err = await cli(*deploy, "--answers", "[true]")
    assert (code, out) == (2, "") and "--answers must be a JSON object" in one_line(err)


def run_on_terminal(argv: list[str], replies: dict[bytes, bytes], until: bytes) -> str:
    """Run the CLI with stdin and stderr on a pseudo-terminal, typing `replies[prompt]` after each
    prompt seen; what the terminal showed once `until` appeared and the command ended."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [str(CLI), *argv], stdin=terminal, stdout=subprocess.PIPE, stderr=terminal, env=env, cwd=ROOT
    )
    os.close(terminal)
    shown = b""
    pending = dict(replies)
    try:
        while proc.poll() is None or select.select([controller], [], [], 0)[0]:
            ready, _, _ = select.select([controller], [], [], WAIT)
            assert ready, f"nothing on the terminal for {WAIT} s:\n{shown.decode(errors='replace')}"
            try:
                shown += os.read(controller, 4096)
            except OSError:  # the terminal closed with the command
                break
            for prompt in [prompt for prompt in pending if prompt in shown]:
                os.write(controller, pending.pop(prompt))
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        assert proc.wait(WAIT) == 0, shown.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    assert until.decode() in out, (out, shown)
    return shown.decode(errors="replace")


async def test_prompt_on_a_terminal(gw: RunningGateway) -> None:
    """On a terminal the CLI asks for each field (re-asking after an answer of the wrong type)."""
    argv = ["call", gw.url, "deploy", "--args", '{"environment": "dev", "delay": 0}']
    replies = {b"confirm (Deploy now?) [y/n]: ": b"maybe\n", b"answer y or n": b"y\n", b"optional]: ": b"typed\n"}
    shown = await asyncio.to_thread(run_on_terminal, argv, replies, b"deployed to dev")
    assert "Deploy to dev?" in shown and "builder: deploying to dev (typed)" in shown
    assert "[########################] 3/3  deploy step 3/3" in shown  # the progress bar
