"""What gateway-hosted tasks answer besides a task's view: how an upstream call's outcome ends the
task, the outcome as `tasks/result` gives it, and the errors of creating, cancelling and reaching a
task. Plain messages, no I/O."""

from __future__ import annotations

from typing import Any

from gateway.protocol import jsonrpc
from gateway.protocol.dialect import Dialect, TaskDetails
from gateway.protocol.jsonrpc import Message, Overloaded, ProtocolError, RequestId
from gateway.protocol.names import RELATED_TASK_KEY
from gateway.tasks.records import TaskRecord, TaskStatus
from gateway.tasks.registry import TaskLimitReached


def outcome_status(outcome: Message, dialect: Dialect) -> tuple[TaskStatus, str | None]:
    """How a hosted task ends with its upstream call's `outcome`, and the status message saying why:
    `failed` for an error, and for a tool result with `isError` where the dialect says so."""
    error = outcome.get("error")
    result = outcome.get("result")
    if isinstance(error, dict):
        return TaskStatus.FAILED, str(error.get("message", "error"))
    if dialect.tool_error_fails_task and isinstance(result, dict) and result.get("isError"):
        return TaskStatus.FAILED, "the tool reported an error (isError)"
    return TaskStatus.COMPLETED, None


def task_limit_error(exc: TaskLimitReached, request_id: RequestId) -> ProtocolError:
    """The gateway-wide ceiling is an overload (503, Retry-After); the per-caller one stays a plain error."""
    if exc.total:
        remedy = "retry later: tasks leave the count when their ttl runs out; ask for a shorter ttl"
        return Overloaded("tasks.max_tasks_total", str(exc), remedy, request_id=request_id)
    return ProtocolError(jsonrpc.INTERNAL_ERROR, f"Too many tasks: {exc}", request_id=request_id)


def result_message(request_id: RequestId, result: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def already_ended(record: TaskRecord, request_id: RequestId) -> ProtocolError:
    return ProtocolError(
        jsonrpc.INVALID_PARAMS,
        f"Invalid params: task is already {record.status.value} and cannot be cancelled",
        request_id=request_id,
    )


def task_elsewhere(record: TaskRecord, request_id: RequestId) -> ProtocolError:
    """-32603 for a cancel or an input answer of a running task no process here runs, on a store without
    owner leases (memory, SQLite: only one process uses it, and that one takes over every unfinished task
    before it serves, so this is only seen if that went wrong). On shared stores (Redis) the request is
    recorded for the replica that runs the task instead (`LeaseStore`)."""
    return ProtocolError(
        jsonrpc.INTERNAL_ERROR,
        "Internal error: the task is running in another gateway process; this request must reach that process",
        data={"reason": "task_elsewhere", "taskId": record.id},
        request_id=request_id,
    )


def related_outcome(task: TaskDetails, request_id: RequestId) -> Message:
    """What tasks/result returns: exactly the upstream's result or error, tagged with related-task."""
    related = {RELATED_TASK_KEY: {"taskId": task.id}}
    outcome = task.outcome
    if outcome is not None and isinstance(outcome.get("result"), dict):
        result = outcome["result"]
        return result_message(request_id, {**result, "_meta": {**(result.get("_meta") or {}), **related}})
    if outcome is not None and isinstance(outcome.get("error"), dict):
        return {"jsonrpc": "2.0", "id": request_id, "error": outcome["error"]}
    error = jsonrpc.error_response(request_id, jsonrpc.REQUEST_CANCELLED, f"Task {task.status}")
    error["error"]["data"] = {"_meta": related}
    return error
