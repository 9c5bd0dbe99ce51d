"""`mcp-task-gateway call`, `tasks` and `tools`: a tool call, a task method or the tool list from the shell.

`call URL TOOL` prints the tool's result, showing its progress and log notifications on stderr
meanwhile (`progress.py`; `--quiet` silences them); `--task` starts it as a task and prints the task
id, and nothing else: a server that answers at once, without a task, gets its answer printed on stderr
and exit 6; `--task --follow` prints its events like `tail` (same printer, same following), then its
result. The server's questions (form elicitation; 2026-07-28 input rounds, tasks in `input_required`)
are answered from `--answers` or a prompt on a terminal (`elicit.py`). `tasks URL list|get|result|cancel
[TASK_ID]` is one task method; `tools URL` lists the tools with their task support. Each invocation is
one client session (legacy) or one envelope (modern): nothing is kept between commands but the task id.

Results and tasks go to stdout (readable text, or JSON with `--json`); notices and errors go to
stderr in one line each, never a traceback. Exit codes are `tail`'s (`tail.py`): for the commands
about an outcome (`call`, `call --task --follow`, `tasks result`) 0 completed, 1 failed (or a tool
result with isError), 3 cancelled, 4 events gone; for the others (`call --task`, `tasks list|get|cancel`,
`tools`) 0 when it was done, and 6 for a `call --task` answered without a task. For all: 2 an error
answer (unknown task, unknown tool, a 401 or 403 of a gateway with `[auth]`, a path that answers 404...)
or bad input, 5 the gateway is unreachable, 130 interrupted. `--header 'Name: value'` (or
`MCP_GATEWAY_TOKEN`, `headers.py`) goes with every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Literal, TextIO

import orjson

from gateway.client.elicit import CAPABILITIES, Answerer, parse_answers
from gateway.client.headers import BadHeader, request_headers
from gateway.client.progress import ProgressDisplay
from gateway.client.stream import GatewayClient, GatewayError, JsonRpcError
from gateway.client.tail import (
    DEFAULT_ERA,
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_NO_TASK,
    Printer,
    UsageError,
    check_url,
    exit_code,
    failure,
    follow_task,
    interrupted_notice,
    parse_era,
    run,
    usage_error,
)
from gateway.protocol.dialect import TASK_TOOL_KEY, dialect_of
from gateway.protocol.era import Era

TaskAction = Literal["list", "get", "result", "cancel"]


# -- input ----------------------------------------------------------------------------------------


def parse_arguments(text: str | None) -> dict[str, Any]:
    """`--args`: a JSON object (absent: no arguments)."""
    if text is None:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"--args is not valid JSON ({exc}): {text}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--args must be a JSON object such as '{{\"steps\": 5}}', not {text}")
    return value


# -- output ---------------------------------------------------------------------------------------


def result_text(result: Mapping[str, Any]) -> str:
    """A CallToolResult as a person reads it: text blocks as they are, other blocks in brackets."""
    lines: list[str] = []
    content = result.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            lines.append(str(block.get("text", "")))
        elif kind in ("image", "audio"):
            size = len(str(block.get("data", ""))) * 3 // 4
            lines.append(f"[{kind} {block.get('mimeType', '?')}, {size} bytes]")
        elif kind == "resource_link":
            lines.append(f"[resource link {block.get('uri')}]")
        elif kind == "resource" and isinstance(block.get("resource"), dict):
            resource = block["resource"]
            text = resource.get("text")
            lines.append(f"[resource {resource.get('uri')}]" + (f"\n{text}" if isinstance(text, str) else ""))
        else:
            lines.append(orjson.dumps(block).decode())
    if not lines:
        structured = result.get("structuredContent")
        lines.append(orjson.dumps(structured if structured is not None else dict(result)).decode())
    return "\n".join(lines)


def task_line(task: Mapping[str, Any]) -> str:
    """`TASK_ID  STATUS  CREATED  [message]`: one task per line."""
    parts = [str(task.get("taskId")), f"{task.get('status')!s:<14}", str(task.get("createdAt", "-"))]
    message = task.get("statusMessage")
    if message:
        parts.append(str(message))
    return "  ".join(parts)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, the header first; the last column is not padded."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    return ["  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
            for row in [header, *rows]]  # fmt: skip


def task_row(task: Mapping[str, Any]) -> list[str]:
    """A `tasks list` row: id, tool (the gateway's `_meta`, else -), status, created."""
    meta = task.get("_meta")
    tool = meta.get(TASK_TOOL_KEY) if isinstance(meta, dict) else None
    return [str(task.get("taskId")), str(tool or "-"), str(task.get("status")), str(task.get("createdAt", "-"))]


def task_support(tool: Mapping[str, Any], era: Era) -> str:
    """A tool's effective task support: its `execution.taskSupport`; when absent, the era's default
    (2025-11-25 `forbidden`), or `-` where the server decides per call (2026-07-28)."""
    execution = tool.get("execution")
    support = execution.get("taskSupport") if isinstance(execution, dict) else None
    if isinstance(support, str):
        return support
    return era.default_task_support or "-"


def first_line(text: object, width: int = 100) -> str:
    line = str(text or "").strip().split("\n", 1)[0]
    return line if len(line) <= width else line[: width - 1] + "…"


class Output:
    """Where a command writes: results to `out` (text or JSON); events and one-line notices through
    `events`, the printer `tail` uses."""

    def __init__(self, prog: str, out: TextIO, err: TextIO, *, json_out: bool, printer: Printer | None = None) -> None:
        self.out = out
        self.err = err
        self.json = json_out
        self.events = printer or Printer(out, err, json_lines=json_out, prog=prog)

    def say(self, text: str) -> None:
        self.events.notice(text)

    def line(self, value: object, text: str, *, to: TextIO | None = None) -> None:
        """`value` as JSON with --json, else `text`; to stdout unless told `to`."""
        stream = to or self.out
        stream.write((orjson.dumps(value).decode() if self.json else text) + "\n")
        stream.flush()

    def result(self, result: Mapping[str, Any]) -> int:
        """Print a tool's result; EXIT_FAILED when it reports an error (isError), else EXIT_COMPLETED."""
        self.line(dict(result), result_text(result))
        if result.get("isError"):
            self.say("the tool reported an error (isError)")
            return EXIT_FAILED
        return EXIT_COMPLETED


# -- call -----------------------------------------------------------------------------------------


def answerer(output: Output, display: ProgressDisplay, answers: Mapping[str, Any] | None, stdin: TextIO) -> Answerer:
    """The answers to the server's questions: `answers`, then a prompt when stdin and stderr are a terminal."""
    interactive = stdin.isatty() and output.err.isatty()
    return Answerer(
        answers, interactive=interactive, stdin=stdin, err=output.err, say=output.say, before_prompt=display.clear
    )


async def call(
    url: str,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    task: bool = False,
    follow: bool = False,
    era: Era = DEFAULT_ERA,
    json_out: bool = False,
    headers: Mapping[str, str] | None = None,
    quiet: bool = False,
    answers: Mapping[str, Any] | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    stdin: TextIO = sys.stdin,
    printer: Printer | None = None,
) -> int:
    """`call`: see the module docstring. `follow` implies `task`."""
    output = Output("call", out, err, json_out=json_out, printer=printer)
    display = ProgressDisplay(err, "call", quiet=quiet)
    on_input = answerer(output, display, answers, stdin)
    meta = call_meta(tool, era, asks_for_task=task or follow)
    try:
        async with GatewayClient(url, era=era, headers=headers, capabilities=CAPABILITIES, on_input=on_input) as client:
            result = await client.call_tool(
                tool, arguments, task=task or follow, meta=meta, on_message=display.notification
            )
            display.clear()
            return await show_call(client, result, output, display, task=task, follow=follow)
    except GatewayError as exc:
        display.clear()
        return failure(exc, output.say, f"tools/call {tool}")
    except asyncio.CancelledError:
        display.clear()  # Ctrl-C: the notice goes on a line of its own
        raise


def call_meta(tool: str, era: Era, *, asks_for_task: bool) -> dict[str, Any]:
    """The call's `_meta`: what asks for progress and log notifications on its own response. A call
    that asks for a task (2025-11-25) is answered at once: its task's events say it all. Logs are
    asked for the way the era wants (2026-07-28: opt-in per request, like the gateway's own calls)."""
    meta: dict[str, Any] = {}
    if not (asks_for_task and era.client_asks_for_task):
        meta["progressToken"] = f"mcp-task-gateway-call-{tool}"
    meta.update(dialect_of(era).upstream_call_meta)
    return meta


async def show_call(
    client: GatewayClient, result: dict[str, Any], output: Output, display: ProgressDisplay, *, task: bool, follow: bool
) -> int:
    """What `call` prints of a tools/call's `result`: the tool's result, the task id it created, or that
    task's events and then its outcome; the exit code."""
    task_id = client.created_task(result)
    if task_id is None:
        if follow:
            output.say("the server answered at once, without creating a task")
        elif task:
            # stdout carries only a task id: `TASK=$(… --task)` must not capture a result.
            output.say("the server answered at once, without creating a task; its answer:")
            output.line(dict(result), result_text(result), to=output.err)
            return EXIT_NO_TASK
        return output.result(result)
    if not (task or follow):
        # A modern server may make any call a task: the caller asked for the result, so wait for
        # it, showing the task's progress and logs as the call's.
        return await show_outcome(client, task_id, output, display=display)
    if not follow:
        output.line(result, task_id)
        return EXIT_COMPLETED
    output.say(f"task {task_id} started; following its events")
    # Waiting for the result meanwhile is what gets the task's questions answered.
    outcome = asyncio.create_task(client.task_result(task_id))
    try:
        code = await follow_task(client, task_id, output.events)
        if code in (EXIT_COMPLETED, EXIT_FAILED):
            return await show_outcome(client, task_id, output, outcome=outcome)
        return code
    finally:
        await _stop(outcome)


async def _stop(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, GatewayError):
        await task


async def show_outcome(
    client: GatewayClient,
    task_id: str,
    output: Output,
    *,
    outcome: Awaitable[dict[str, Any]] | None = None,
    display: ProgressDisplay | None = None,
) -> int:
    """Print a task's result (waiting for it if need be, or for `outcome`); the exit code of how the
    task ended. `display` shows the task's progress and logs meanwhile."""
    watcher = None
    if display is not None:
        watcher = asyncio.create_task(client.follow(task_id, on_event=display.event))
    try:
        result = await (outcome if outcome is not None else client.task_result(task_id))
    except JsonRpcError as exc:
        # A failed or cancelled task has no result, only an error: its status says how it ended.
        status = str((await client.get_task(task_id))["result"].get("status"))
        if status not in ("failed", "cancelled"):
            raise
        output.say(f"task {task_id} {status}: {exc.message} (code {exc.code})")
        return exit_code(status)
    finally:
        if watcher is not None:
            await _stop(watcher)
        if display is not None:
            display.clear()
    return output.result(result)


# -- tasks ----------------------------------------------------------------------------------------


async def tasks(
    url: str,
    action: TaskAction,
    task_id: str | None = None,
    *,
    era: Era = DEFAULT_ERA,
    json_out: bool = False,
    headers: Mapping[str, str] | None = None,
    answers: Mapping[str, Any] | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    stdin: TextIO = sys.stdin,
) -> int:
    """`tasks`: see the module docstring."""
    output = Output("tasks", out, err, json_out=json_out)
    subject = "tasks/list" if action == "list" else f"task {task_id}"
    on_input = answerer(output, ProgressDisplay(err, "tasks", quiet=True), answers, stdin)
    try:
        async with GatewayClient(url, era=era, headers=headers, capabilities=CAPABILITIES, on_input=on_input) as client:
            if action == "list":
                listed = await client.list_tasks()
                if json_out:
                    for each in listed:
                        output.line(each, "")
                else:
                    lines = table(["TASK ID", "TOOL", "STATUS", "CREATED"], [task_row(each) for each in listed])
                    output.out.write("\n".join(lines if listed else ["no tasks"]) + "\n")
                return EXIT_COMPLETED
            assert task_id is not None
            if action == "result":
                return await show_outcome(client, task_id, output)
            answer = await (client.cancel_task(task_id) if action == "cancel" else client.get_task(task_id))
            view = answer["result"]
            if "status" not in view:  # a 2026-07-28 tasks/cancel answers without the task
                view = (await client.get_task(task_id))["result"]
            output.line(view, task_line(view))
            return EXIT_COMPLETED
    except GatewayError as exc:
        return failure(exc, output.say, subject)


# -- tools ----------------------------------------------------------------------------------------


async def tools(
    url: str,
    *,
    era: Era = DEFAULT_ERA,
    json_out: bool = False,
    headers: Mapping[str, str] | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """`tools`: a table of name, task support and description (`--json`: each tool as listed, one a line)."""
    output = Output("tools", out, err, json_out=json_out)
    try:
        async with GatewayClient(url, era=era, headers=headers) as client:
            listed = await client.list_tools()
    except GatewayError as exc:
        return failure(exc, output.say, "tools/list")
    if json_out:
        for tool in listed:
            output.line(tool, "")
        return EXIT_COMPLETED
    rows = [[str(tool.get("name")), task_support(tool, era), first_line(tool.get("description"))] for tool in listed]
    lines = table(["NAME", "TASKS", "DESCRIPTION"], rows) if rows else ["no tools"]
    out.write("\n".join(lines) + "\n")
    out.flush()
    return EXIT_COMPLETED


# -- entry points ---------------------------------------------------------------------------------


def main_call(
    url: str,
    tool: str,
    args_json: str | None,
    *,
    task: bool = False,
    follow: bool = False,
    era: str = DEFAULT_ERA.label,
    json_out: bool = False,
    headers: Sequence[str] = (),
    quiet: bool = False,
    answers_json: str | None = None,
) -> int:
    """Entry point of `mcp-task-gateway call`; `era` is the `--era` the user typed."""
    try:
        check_url(url)
        chosen = parse_era(era)
        arguments = parse_arguments(args_json)
        answers = parse_answers(answers_json)
        sent = request_headers(headers)
    except (UsageError, BadHeader) as exc:
        return usage_error(exc, "call")
    printer = Printer(sys.stdout, sys.stderr, json_lines=json_out, prog="call")
    command = call(
        url, tool, arguments, task=task, follow=follow, era=chosen, json_out=json_out, headers=sent, quiet=quiet,
        answers=answers, printer=printer,
    )  # fmt: skip
    return run(
        command,
        interrupted_notice(url, printer, era=chosen, json_lines=json_out, headers=headers),
    )


def main_tasks(
    url: str,
    action: TaskAction,
    task_id: str | None,
    *,
    era: str = DEFAULT_ERA.label,
    json_out: bool = False,
    headers: Sequence[str] = (),
    answers_json: str | None = None,
) -> int:
    """Entry point of `mcp-task-gateway tasks`; `era` is the `--era` the user typed."""
    try:
        check_url(url)
        chosen = parse_era(era)
        if action == "list" and task_id is not None:
            raise UsageError("list takes no TASK_ID")
        if action != "list" and not task_id:
            raise UsageError(f"{action} needs a TASK_ID: mcp-task-gateway tasks URL {action} TASK_ID")
        answers = parse_answers(answers_json)
        sent = request_headers(headers)
    except (UsageError, BadHeader) as exc:
        return usage_error(exc, "tasks")
    return run(tasks(url, action, task_id, era=chosen, json_out=json_out, headers=sent, answers=answers))


def main_tools(url: str, *, era: str = DEFAULT_ERA.label, json_out: bool = False, headers: Sequence[str] = ()) -> int:
    """Entry point of `mcp-task-gateway tools`; `era` is the `--era` the user typed."""
    try:
        check_url(url)
        chosen = parse_era(era)
        sent = request_headers(headers)
    except (UsageError, BadHeader) as exc:
        return usage_error(exc, "tools")
    return run(tools(url, era=chosen, json_out=json_out, headers=sent))
