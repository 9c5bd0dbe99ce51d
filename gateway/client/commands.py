"""`mcp-task-gateway call` and `mcp-task-gateway tasks`: a tool call or a task method from the shell.

`call URL TOOL` prints the tool's result; `--task` starts it as a task and prints the task id;
`--task --follow` prints its events like `tail` (same printer, same following), then its result.
`tasks URL list|get|result|cancel [TASK_ID]` is one task method. Each invocation is one client
session (legacy) or one envelope (modern): nothing is kept between commands but the task id.

Results and tasks go to stdout (readable text, or JSON with `--json`); notices and errors go to
stderr in one line each, never a traceback. Exit codes are `tail`'s (`tail.py`): for the commands
about an outcome (`call`, `call --task --follow`, `tasks result`) 0 completed, 1 failed (or a tool
result with isError), 3 cancelled, 4 events gone; for the others (`call --task`, `tasks list|get|cancel`)
0 when it was done. For all: 2 an error answer (unknown task, unknown tool, a 401 or 403 of a gateway
with `[auth]`...) or bad input, 5 the gateway is unreachable, 130 interrupted. `--header 'Name: value'`
(or `MCP_GATEWAY_TOKEN`, `headers.py`) goes with every request.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TextIO

import orjson

from gateway.client.headers import BadHeader, request_headers
from gateway.client.stream import EraName, GatewayClient, GatewayError, JsonRpcError
from gateway.client.tail import (
    EXIT_COMPLETED,
    EXIT_FAILED,
    Printer,
    UsageError,
    check_url,
    exit_code,
    failure,
    follow_task,
    run,
    usage_error,
)

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


class Output:
    """Where a command writes: results to `out` (text or JSON); events and one-line notices through
    `events`, the printer `tail` uses."""

    def __init__(self, prog: str, out: TextIO, err: TextIO, *, json_out: bool) -> None:
        self.out = out
        self.json = json_out
        self.events = Printer(out, err, json_lines=json_out, prog=prog)

    def say(self, text: str) -> None:
        self.events.notice(text)

    def line(self, value: object, text: str) -> None:
        """`value` as JSON with --json, else `text`."""
        self.out.write((orjson.dumps(value).decode() if self.json else text) + "\n")
        self.out.flush()

    def result(self, result: Mapping[str, Any]) -> int:
        """Print a tool's result; EXIT_FAILED when it reports an error (isError), else EXIT_COMPLETED."""
        self.line(dict(result), result_text(result))
        if result.get("isError"):
            self.say("the tool reported an error (isError)")
            return EXIT_FAILED
        return EXIT_COMPLETED


# -- call -----------------------------------------------------------------------------------------


async def call(
    url: str,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    task: bool = False,
    follow: bool = False,
    era: EraName = "legacy",
    json_out: bool = False,
    headers: Mapping[str, str] | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """`call`: see the module docstring. `follow` implies `task`."""
    output = Output("call", out, err, json_out=json_out)
    try:
        async with GatewayClient(url, era=era, headers=headers) as client:
            result = await client.call_tool(tool, arguments, task=task or follow)
            task_id = client.created_task(result)
            if task_id is None:
                if task or follow:
                    output.say("the server answered at once, without creating a task")
                return output.result(result)
            if not (task or follow):
                # A modern server may make any call a task: the caller asked for the result, so wait for it.
                return await show_outcome(client, task_id, output)
            if not follow:
                output.line(result, task_id)
                return EXIT_COMPLETED
            output.say(f"task {task_id} started; following its events")
            code = await follow_task(client, task_id, output.events)
            if code in (EXIT_COMPLETED, EXIT_FAILED):
                return await show_outcome(client, task_id, output)
            return code
    except GatewayError as exc:
        return failure(exc, output.say, f"tools/call {tool}")


async def show_outcome(client: GatewayClient, task_id: str, output: Output) -> int:
    """Print a task's result (waiting for it if need be); the exit code of how the task ended."""
    try:
        result = await client.task_result(task_id)
    except JsonRpcError as exc:
        # A failed or cancelled task has no result, only an error: its status says how it ended.
        status = str((await client.get_task(task_id))["result"].get("status"))
        if status not in ("failed", "cancelled"):
            raise
        output.say(f"task {task_id} {status}: {exc.message} (code {exc.code})")
        return exit_code(status)
    return output.result(result)


# -- tasks ----------------------------------------------------------------------------------------


async def tasks(
    url: str,
    action: TaskAction,
    task_id: str | None = None,
    *,
    era: EraName = "legacy",
    json_out: bool = False,
    headers: Mapping[str, str] | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """`tasks`: see the module docstring."""
    output = Output("tasks", out, err, json_out=json_out)
    subject = "tasks/list" if action == "list" else f"task {task_id}"
    try:
        async with GatewayClient(url, era=era, headers=headers) as client:
            if action == "list":
                for listed in await client.list_tasks():
                    output.line(listed, task_line(listed))
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


# -- entry points ---------------------------------------------------------------------------------


def main_call(
    url: str,
    tool: str,
    args_json: str | None,
    *,
    task: bool = False,
    follow: bool = False,
    era: EraName = "legacy",
    json_out: bool = False,
    headers: Sequence[str] = (),
) -> int:
    """Entry point of `mcp-task-gateway call`."""
    try:
        check_url(url)
        arguments = parse_arguments(args_json)
        sent = request_headers(headers)
    except (UsageError, BadHeader) as exc:
        return usage_error(exc, "call")
    return run(call(url, tool, arguments, task=task, follow=follow, era=era, json_out=json_out, headers=sent))


def main_tasks(
    url: str,
    action: TaskAction,
    task_id: str | None,
    *,
    era: EraName = "legacy",
    json_out: bool = False,
    headers: Sequence[str] = (),
) -> int:
    """Entry point of `mcp-task-gateway tasks`."""
    try:
        check_url(url)
        if action == "list" and task_id is not None:
            raise UsageError("list takes no TASK_ID")
        if action != "list" and not task_id:
            raise UsageError(f"{action} needs a TASK_ID: mcp-task-gateway tasks URL {action} TASK_ID")
        sent = request_headers(headers)
    except (UsageError, BadHeader) as exc:
        return usage_error(exc, "tasks")
    return run(tasks(url, action, task_id, era=era, json_out=json_out, headers=sent))
