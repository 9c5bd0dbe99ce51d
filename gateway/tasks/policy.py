"""What a tools/call means under its tool's task policy, in each era: a plain call, a call that becomes a
gateway-hosted task (and when), or an error. Every era rule of hosted task creation lives here; plain
functions over the policy and the request, no I/O.

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

from dataclasses import dataclass

from gateway.config import ToolTaskPolicy
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


def plan_tool_call(policy: ToolTaskPolicy, message: Message, era: Era) -> Hosting | None:
    """How `message` (a tools/call) may become a hosted task; None: forward it as a plain call.
    Raises ProtocolError when the call breaks the tool's policy."""
    # Who decides differs: the 2025-11-25 client asks for a task, the 2026-07-28 gateway decides.
    if era is Era.LEGACY:
        return _plan_legacy(policy, message)
    return _plan_modern(policy, message)


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
