"""Acceptance: the task commands of the CLI (`call`, `tasks`, `tail`, `--version`) drive whole stories.

Every command runs as the real `mcp-task-gateway` console script of the venv, a subprocess of its own,
so each is a new client session: nothing carries over between commands but the task id. The gateway
is the real one, in front of the example server (which has no Tasks: the gateway hosts them) with a
retention of 200 events per task, and in front of `@modelcontextprotocol/server-everything` on stdio
(it has Tasks of its own: pass-through), whose `simulate-research-query` runs four 1 s stages.

Exit codes are the documented ones: 0 completed (or done), 1 failed, 2 unknown task / error / bad
input, 3 cancelled, 4 events gone, 5 unreachable. No command may print a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway import __version__
from gateway.client import GatewayClient, recorded_at
from gateway.client.headers import TOKEN_ENV, BadHeader, request_headers
from gateway.client.tail import Timeline
from tests.conftest import EXAMPLE_SERVER, ROOT, RunningGateway, free_port, start_gateway
from tests.test_upstream_with_tasks import node_command

CLI = Path(sys.executable).parent / "mcp-task-gateway"
RETAINED = 200
CONFIG = f"[retention]\nmax_events_per_task = {RETAINED}\n"
RECORDED_AT = "io.github.mcp-task-gateway/recordedAt"
TERMINAL_SUFFIX = ".task.terminal"


async def cli(*args: str, timeout: float = 60, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """`mcp-task-gateway ARGS...` to completion, with `env` added to the environment: (exit code,
    stdout, stderr); never a traceback."""
    if not CLI.exists():
        pytest.fail(f"{CLI} is missing: run the tests with `make test` (it installs the console script)")
    # PYTHONPATH: this checkout's gateway, whichever checkout the venv's editable install points at.
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = await asyncio.create_subprocess_exec(
        str(CLI), *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        pytest.fail(f"`mcp-task-gateway {' '.join(args)}` did not finish in {timeout} s:\n{out.decode()}{err.decode()}")
    assert proc.returncode is not None
    text_out, text_err = out.decode(), err.decode()
    assert "Traceback" not in text_out + text_err, f"`{' '.join(args)}` printed a traceback:\n{text_out}{text_err}"
    return proc.returncode, text_out, text_err


def one_line(err: str) -> str:
    """The single line a failing command wrote to stderr."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    return lines[0]


async def until_status(url: str, task_id: str, status: str) -> None:
    """Until the task's event stream shows it entering `status` (one it stays in until the test moves it on)."""
    async with asyncio.timeout(60), GatewayClient(url) as client, client.stream(task_id) as events:
        async for event in events:
            if event["type"].endswith(".task.status") and event["payload"]["status"] == status:
                return
    pytest.fail(f"task {task_id} ended without entering {status}")


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def local_clock(stamp: str) -> str:
    """How the timeline shows a recordedAt: local time, HH:MM:SS.mmm."""
    return datetime.fromisoformat(stamp).astimezone().strftime("%H:%M:%S.%f")[:-3]


def test_timeline_shows_recorded_at_else_the_arrival_marked() -> None:
    """An event's time is its recordedAt; without one (another server), or with one that does not
    parse, the time it arrived, marked `~`."""
    timeline = Timeline(color=False)
    event = {"seq": 3, "taskId": "t", "type": "io.github.mcp-task-gateway.progress", "payload": {"progress": 1}}
    stamp = "2026-12-01T09:43:00.372Z"
    recorded = {**event, "_meta": {RECORDED_AT: stamp}}
    arrived = 1_700_000_000.25
    assert recorded_at(recorded) == datetime(2026, 12, 1, 9, 43, 0, 372000, tzinfo=UTC)
    assert timeline.line(recorded, arrived).split()[:3] == ["3", local_clock(stamp), "progress"]
    arrival = "~" + datetime.fromtimestamp(arrived).strftime("%H:%M:%S.%f")[:-3]
    for other in ({}, {"_meta": {}}, {"_meta": {RECORDED_AT: "yesterday"}}, {"_meta": {RECORDED_AT: 5}}):
        assert recorded_at({**event, **other}) is None
        assert timeline.line({**event, **other}, arrived).split()[1] == arrival


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway:
        yield gateway


# -- the example server: tasks hosted by the gateway --------------------------------------------------


def test_headers_from_the_command_line_and_the_environment() -> None:
    token = {TOKEN_ENV: " t0k "}
    assert request_headers(["X-Trace: 1", "X-Trace:2"], {}) == {"X-Trace": "2"}  # a later value wins
    assert request_headers(["X-Trace: 1"], token) == {"X-Trace": "1", "Authorization": "Bearer t0k"}
    assert request_headers(["authorization: Basic x"], token) == {"authorization": "Basic x"}  # explicit wins
    assert request_headers([], {TOKEN_ENV: " "}) == {}
    with pytest.raises(BadHeader, match="--header 'Bearer x': expected 'Name: value'"):
        request_headers(["Bearer x"], token)
    with pytest.raises(BadHeader, match="expected 'Name: value'"):
        request_headers([": x"], {})


async def test_version() -> None:
    code, out, _ = await cli("--version")
    assert (code, out.strip()) == (0, f"mcp-task-gateway {__version__}")


async def test_call_task_follow_result_list(gw: RunningGateway) -> None:
    url = gw.url
    # A plain call prints the tool's result.
    code, out, err = await cli("call", url, "echo", "--args", '{"text": "hello"}')
    assert (code, out) == (0, "hello\n"), err

    # call --task prints the task id and nothing else.
    code, out, err = await cli("call", url, "slow_build", "--args", '{"steps": 4, "delay": 0.1}', "--task")
    assert code == 0, err
    task_id = out.strip()
    assert task_id and out == task_id + "\n"

    # tail follows it to its end; --json has each event's params, recordedAt in _meta.
    code, out, err = await cli("tail", url, task_id, "--json")
    assert code == 0, err
    events = json_lines(out)
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert events[-1]["type"].endswith(TERMINAL_SUFFIX) and events[-1]["payload"]["status"] == "completed"
    stamps = [event["_meta"][RECORDED_AT] for event in events]
    assert all(stamp.endswith("Z") and len(stamp) == len("2026-12-01T09:43:00.123Z") for stamp in stamps), stamps
    assert stamps == sorted(stamps), "recordedAt never decreases within a task"
    assert f"task {task_id} completed" in err

    # The timeline shows the recorded time (a replay now: arrival times would all be the same).
    code, out, err = await cli("tail", url, task_id)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == len(events)
    for line, event in zip(lines, events, strict=True):
        seq, shown, kind = line.split()[:3]
        assert int(seq) == event["seq"]
        assert shown == local_clock(event["_meta"][RECORDED_AT]), (line, event)
        assert event["type"].endswith("." + kind)

    # tasks result / get / list, each from a session of its own.
    code, out, err = await cli("tasks", url, "result", task_id)
    assert (code, out) == (0, "built 4 steps\n"), err
    code, out, err = await cli("tasks", url, "result", task_id, "--json")
    assert code == 0, err
    assert json.loads(out)["content"] == [{"type": "text", "text": "built 4 steps"}]
    code, out, err = await cli("tasks", url, "get", task_id, "--json")
    assert code == 0, err
    assert json.loads(out)["taskId"] == task_id and json.loads(out)["status"] == "completed"
    code, out, err = await cli("tasks", url, "list")
    assert code == 0, err
    assert any(line.split()[:3] == [task_id, "slow_build", "completed"] for line in out.splitlines()), out
    code, out, err = await cli("tasks", url, "list", "--json")
    assert code == 0, err
    assert task_id in [task["taskId"] for task in json_lines(out)]

    # call --task --follow: the events, then the result; in JSON, the result is the last line.
    code, out, err = await cli("call", url, "slow_build", "--args", '{"steps": 3, "delay": 0.1}', "--task", "--follow")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1] == "built 3 steps"
    assert lines[-2].split()[2] == "task.terminal" and "completed" in lines[-2]
    assert "started; following its events" in err and "completed" in err
    code, out, err = await cli("call", url, "slow_build", "--args", '{"steps": 2, "delay": 0.1}', "--follow", "--json")
    assert code == 0, err
    *followed, result = json_lines(out)
    assert [event["seq"] for event in followed] == list(range(len(followed)))
    assert all(RECORDED_AT in event["_meta"] for event in followed)
    assert result["content"] == [{"type": "text", "text": "built 2 steps"}]


async def test_cancel_and_failure_exit_codes(gw: RunningGateway) -> None:
    url = gw.url
    # Far longer than the test: the task is still running when the cancel comes, however slow the machine.
    code, out, err = await cli("call", url, "slow_build", "--args", '{"steps": 100000, "delay": 0.1}', "--task")
    assert code == 0, err
    long = out.strip()
    code, out, err = await cli("tasks", url, "cancel", long)
    assert code == 0, err
    assert out.split()[:2] == [long, "cancelled"], out
    code, out, err = await cli("tasks", url, "result", long)
    assert (code, out) == (3, ""), err
    assert "cancelled" in one_line(err)
    code, out, err = await cli("tail", url, long, "--json")
    assert code == 3, err
    assert json_lines(out)[-1]["payload"]["status"] == "cancelled"
    code, _, err = await cli("tasks", url, "cancel", long)
    assert code == 2 and "already cancelled" in one_line(err)

    # A tool that fails: 1 from `tasks result` and from `call --follow`, with its error text printed.
    code, out, err = await cli("call", url, "slow_build", "--args", '{"steps": "many"}', "--task")
    assert code == 0, err
    code, out, err = await cli("tasks", url, "result", out.strip())
    assert code == 1, err
    assert "valid integer" in out
    code, out, err = await cli("call", url, "slow_build", "--args", '{"steps": "many"}', "--follow")
    assert code == 1, err
    assert "valid integer" in out and "failed" in err
    code, out, err = await cli("call", url, "slow_build", "--args", '{"steps": "many"}')
    assert code == 1 and "valid integer" in out, err


async def test_unknown_task_events_gone_and_unreachable(gw: RunningGateway) -> None:
    url = gw.url
    for command in (["tasks", url, "get", "no-such-task"], ["tasks", url, "result", "no-such-task"],
                    ["tasks", url, "cancel", "no-such-task"], ["tail", url, "no-such-task"]):  # fmt: skip
        code, out, err = await cli(*command)
        assert (code, out) == (2, ""), (command, err)
        assert "no such task" in one_line(err), command

    # Retention (200 events) overtook the cursor: events gone.
    code, out, err = await cli("call", url, "burst", "--args", '{"n": 1000}', "--task")
    assert code == 0, err
    burst = out.strip()
    code, out, err = await cli("tasks", url, "result", burst)
    assert (code, out) == (0, "sent 1000\n"), err
    code, out, err = await cli("tail", url, burst, "--after", "0")
    assert (code, out) == (4, ""), err
    assert "events_gone" in err

    nobody = f"http://127.0.0.1:{free_port()}/mcp"
    for command in (["tasks", nobody, "list"], ["call", nobody, "echo"], ["tail", nobody, "x"]):
        code, out, err = await cli(*command)
        assert (code, out) == (5, ""), (command, err)
        assert "cannot reach" in one_line(err)


async def test_bad_input_is_one_line_and_exit_2(gw: RunningGateway) -> None:
    url = gw.url
    cases = {
        ("call", url, "echo", "--args", "{bad"): "--args is not valid JSON",
        ("call", url, "echo", "--args", "[1, 2]"): "--args must be a JSON object",
        ("tasks", url, "get"): "get needs a TASK_ID",
        ("tasks", url, "result"): "result needs a TASK_ID",
        ("tasks", url, "list", "extra"): "list takes no TASK_ID",
        ("tasks", "127.0.0.1:8765", "list"): "is not an http(s) URL",
    }
    for command, message in cases.items():
        code, out, err = await cli(*command)
        assert (code, out) == (2, ""), (command, err)
        assert message in one_line(err), (command, err)


async def test_modern_era(gw: RunningGateway) -> None:
    url = gw.url
    code, out, err = await cli("call", url, "slow_build", "--args", '{"steps": 6, "delay": 0.3}', "--era", "modern")
    assert (code, out) == (0, "built 6 steps\n"), err
    code, out, err = await cli(
        "call", url, "slow_build", "--args", '{"steps": 6, "delay": 0.3}', "--era", "modern", "--follow"
    )
    assert code == 0, err
    assert out.splitlines()[-1] == "built 6 steps"
    task_id = err.split("task ", 1)[1].split()[0]
    code, out, err = await cli("tasks", url, "get", task_id, "--era", "modern", "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "completed"
    code, out, err = await cli("tasks", url, "result", task_id, "--era", "modern")
    assert (code, out) == (0, "built 6 steps\n"), err
    code, out, err = await cli("tasks", url, "list", "--era", "modern")
    assert (code, out) == (2, "") and "tasks/list" in one_line(err)


# -- server-everything: the upstream's own tasks, passed through ------------------------------------------

RESEARCH = "simulate-research-query"


@pytest.fixture
async def everything() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=[*node_command(), "stdio"]) as gateway:
        yield gateway


async def test_passthrough_story(everything: RunningGateway) -> None:
    """Start, follow, list, fetch the result; each command a new session after the creating one ended."""
    url = everything.url
    code, out, err = await cli("call", url, RESEARCH, "--args", '{"topic": "tides"}', "--task")
    assert code == 0, err
    task_id = out.strip()
    assert task_id and out == task_id + "\n"

    code, out, err = await cli("tail", url, task_id)
    assert code == 0, err
    assert out.splitlines()[-1].split()[2:4] == ["task.terminal", "completed"], out
    assert "Generating report..." in out

    # tasks/list answers from the gateway's records (docs/tasks-stream.md §9): the caller's tasks from
    # every session, though on stdio each session has an upstream process of its own.
    code, out, err = await cli("tasks", url, "list", "--json")
    assert code == 0, err
    assert [task["taskId"] for task in json_lines(out)] == [task_id], out

    code, out, err = await cli("tasks", url, "result", task_id)
    assert code == 0, err
    assert out.startswith("# Research Report: tides\n"), out


async def test_passthrough_cancel(everything: RunningGateway) -> None:
    url = everything.url
    # An ambiguous query stops at its third stage to ask the client (input_required) and waits there for
    # an answer nobody gives: the cancel finds it running, however slow the machine.
    arguments = '{"topic": "cancel me", "ambiguous": true}'
    code, out, err = await cli("call", url, RESEARCH, "--args", arguments, "--task")
    assert code == 0, err
    task_id = out.strip()
    await until_status(url, task_id, "input_required")
    code, out, err = await cli("tasks", url, "cancel", task_id)
    assert code == 0, err
    assert out.split()[:2] == [task_id, "cancelled"], out
    code, out, err = await cli("tasks", url, "result", task_id)
    assert (code, out) == (3, ""), err
    code, out, err = await cli("tail", url, task_id, "--json")
    assert code == 3, err
    assert json_lines(out)[-1]["payload"]["status"] == "cancelled"
    code, out, err = await cli("tasks", url, "get", "no-such-task")
    assert (code, out) == (2, ""), err


async def test_passthrough_call_follow(everything: RunningGateway) -> None:
    """One session from start to result: not affected by sessions ending."""
    code, out, err = await cli("call", everything.url, RESEARCH, "--args", '{"topic": "reefs"}', "--follow")
    assert code == 0, err
    assert "# Research Report: reefs" in out
    assert "task.terminal" in out and "completed" in err
