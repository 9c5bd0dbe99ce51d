"""What a tools/call means under its tool's task policy, in each era: who hosts the tool's tasks (the
gateway, the upstream, or nobody), and for the gateway a plain call, a call that becomes a task it hosts
(and when), or an error. Every era rule of hosted task creation lives here; plain functions over the
policy, what the upstream says of the tool, and the request; no I/O.

Who hosts (`who_hosts`), per tool: an upstream without Tasks, or one whose tools/list marks the tool
`forbidden` (or leaves it unmarked: SEP-1686's default), gets the gateway's tasks where the tool's
`[[tasks.tools]]` policy allows them; a tool the upstream itself runs as a task (`optional`, `required`)
stays with the upstream (pass-through), and so does one the gateway cannot judge (a SEP-2663 upstream
decides per call; a tool its tools/list does not show). `tools/list` shows the result as each tool's
`execution.taskSupport`, in both eras.

2025-11-25 (SEP-1686): the client asks with `params.task`, and `task_support` says whether it may
(`forbidden`) or must (`required`); a wrong call gets `-32601`.

2026-07-28 (SEP-2663): the gateway decides, and only for a client that declares the tasks extension; a
`required` tool refuses any other client with `-32021`. MRTR input the upstream asks for before a task
exists reaches the client as it is (an `InputRequiredResult`), and the task is made on the final round:
`after_ms` relays any answer that comes within `after_ms` and makes a task of a call that runs longer;
`always` and `required` make every answer a task (a result `completed`, a JSON-RPC error `failed` with the
error inlined), but wait `input_window_ms` for a first call (one without `inputResponses` or
`requestState`) to ask for input first, while a retried call is a task at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.config import TaskSupport, ToolTaskPolicy
from gateway.protocol import jsonrpc
from gateway.protocol.dialect import declares_tasks_extension, missing_extension
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message, ProtocolError

RETRY_PARAMS = ("inputResponses", "requestState")
"""A tools/call carrying either is the retry of an MRTR round (SEP-2322)."""


@dataclass(frozen=True, slots=True)
class Hosting:
    """A tools/call the gateway may turn into a task it hosts."""

    wait_s: float
    """How long the upstream's answer may take and still reach the client as it is; then the call
    becomes a task (0: a task at once)."""
    result_is_task: bool
    """Whether an answer that comes within `wait_s` becomes a task as well (one already ended: a result
    `completed`, a JSON-RPC error `failed`), unless it asks for input (an `InputRequiredResult`)."""


AT_ONCE = Hosting(0.0, result_is_task=True)


class UpstreamSupport(StrEnum):
    """What the upstream says of one tool's tasks, in the client's era."""

    NONE = "none"
    """The upstream has no Tasks at all (no tasks capability; no tasks extension)."""
    FORBIDDEN = "forbidden"
    """Its tools/list marks the tool `forbidden`, or leaves it unmarked (SEP-1686's default)."""
    OPTIONAL = "optional"
    REQUIRED = "required"
    UNKNOWN = "unknown"
    """It has Tasks, and the gateway cannot tell for this tool: a SEP-2663 upstream decides per call,
    and a SEP-1686 tool its tools/list does not show (or a list it would not give) is left to it."""


class Host(StrEnum):
    """Who runs a tool's tasks."""

    GATEWAY = "gateway"
    UPSTREAM = "upstream"
    """Pass-through: the upstream's own tasks, forwarded and recorded."""
    NOBODY = "nobody"
    """Never a task: a 2025-11-25 call asking for one is refused (-32601); a 2026-07-28 call stays plain."""


@dataclass(frozen=True, slots=True)
class ToolHosting:
    """Who hosts a tool's tasks, and what tools/list shows of it."""

    host: Host
    task_support: TaskSupport | None
    """The effective `execution.taskSupport`; None: the upstream's entry is shown as it is (it hosts)."""


def policy_support(policy: ToolTaskPolicy, era: Era) -> TaskSupport:
    """The task support the gateway's policy gives a tool in `era`: `task_support` for 2025-11-25; for
    2026-07-28 what `modern` does (never: forbidden, required: required, after_ms / always: optional)."""
    return _ERA_RULES[era].support(policy)


def _modern_support(policy: ToolTaskPolicy) -> TaskSupport:
    if policy.modern == "never":
        return "forbidden"
    return "required" if policy.modern == "required" else "optional"


def who_hosts(upstream: UpstreamSupport, policy: ToolTaskPolicy, era: Era) -> ToolHosting:
    """Who hosts the tasks of a tool the upstream says `upstream` of, under the gateway's `policy`."""
    if upstream in (UpstreamSupport.OPTIONAL, UpstreamSupport.REQUIRED, UpstreamSupport.UNKNOWN):
        return ToolHosting(Host.UPSTREAM, None)
    support = policy_support(policy, era)
    return ToolHosting(Host.NOBODY if support == "forbidden" else Host.GATEWAY, support)


def listed_support(tool: Mapping[str, Any]) -> UpstreamSupport:
    """What a SEP-1686 upstream's tools/list entry says of the tool's tasks (unmarked: forbidden)."""
    execution = tool.get("execution")
    marked = execution.get("taskSupport") if isinstance(execution, dict) else None
    if marked == "optional":
        return UpstreamSupport.OPTIONAL
    if marked == "required":
        return UpstreamSupport.REQUIRED
    return UpstreamSupport.FORBIDDEN


def with_task_support(result: dict[str, Any], hosting_of: Callable[[Mapping[str, Any]], ToolHosting]) -> dict[str, Any]:
    """A tools/list result with each tool's effective `execution.taskSupport` (`hosting_of` an entry);
    a tool the upstream hosts keeps its entry as it is."""
    tools = result.get("tools")
    if not isinstance(tools, list):
        return result
    shown = []
    for tool in tools:
        if isinstance(tool, dict) and (support := hosting_of(tool).task_support) is not None:
            execution = tool.get("execution")
            tool = {**tool, "execution": {**(execution if isinstance(execution, dict) else {}), "taskSupport": support}}
        shown.append(tool)
    return {**result, "tools": shown}


def plan_tool_call(policy: ToolTaskPolicy, message: Message, era: Era) -> Hosting | None:
    """How `message` (a tools/call) may become a hosted task; None: forward it as a plain call.
    Raises ProtocolError when the call breaks the tool's policy."""
    return _ERA_RULES[era].plan(policy, message)


def _plan_legacy(policy: ToolTaskPolicy, message: Message) -> Hosting | None:
    params = jsonrpc.params_of(message)
    wants_task = "task" in params
    if (wants_task and policy.task_support == "forbidden") or (not wants_task and policy.task_support == "required"):
        need = "must not" if wants_task else "must"
        raise ProtocolError(
            jsonrpc.METHOD_NOT_FOUND,
            f"Method not found: tool {params.get('name')!r} {need} be called as a task (execution.taskSupport)",
            http_status=200,
            request_id=message["id"],
        )
    return AT_ONCE if wants_task else None


def _plan_modern(policy: ToolTaskPolicy, message: Message) -> Hosting | None:
    if not declares_tasks_extension(message):
        if policy.modern == "required":
            tool = jsonrpc.params_of(message).get("name")
            raise missing_extension(message["id"], f"tool {tool!r} runs only as a task; ")
        return None
    if policy.modern == "never":
        return None
    if policy.modern == "after_ms":
        return Hosting(policy.after_ms / 1000, result_is_task=False)
    params = jsonrpc.params_of(message)
    if any(key in params for key in RETRY_PARAMS):
        return AT_ONCE
    return Hosting(policy.input_window_ms / 1000, result_is_task=True)


@dataclass(frozen=True, slots=True)
class _EraRules:
    """Who decides that a tools/call is a task differs by era: the 2025-11-25 client asks for one
    (`task_support` says whether it may or must), the 2026-07-28 gateway decides (`modern`)."""

    support: Callable[[ToolTaskPolicy], TaskSupport]
    plan: Callable[[ToolTaskPolicy, Message], Hosting | None]


_ERA_RULES = {
    Era.LEGACY: _EraRules(lambda policy: policy.task_support, _plan_legacy),
    Era.MODERN: _EraRules(_modern_support, _plan_modern),
}
