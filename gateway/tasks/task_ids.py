"""The ids of tasks an upstream hosts, as clients see them: `<channel tag>.<upstream id>`.

An upstream's task id is unique only within its conversation, so the gateway namespaces it with the
channel's tag on everything the upstream sends (`map_task_ids` with the tag added) and strips it from
the client's task requests (the same function, the other way). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.protocol.dialect import TASK_EVENT
from gateway.protocol.jsonrpc import Message
from gateway.protocol.names import RELATED_TASK_KEY
from gateway.tasks.pushes import ACKNOWLEDGED

STATUS_PUSHES = frozenset({"notifications/tasks/status", "notifications/tasks"})
NAMING_TASK = STATUS_PUSHES | {TASK_EVENT}
"""Notifications whose `params.taskId` names a task."""


def map_task_ids(message: Message, method: str | None, convert: Callable[[str], str]) -> Message:
    """`message` from the upstream with every task id it carries passed through `convert`: a status
    push's or task event's `taskId`, related-task `_meta`, a subscription acknowledgement's `taskIds`,
    and the ids in the answers to tools/call and tasks/* (an error's `data.taskId`, as in `events_gone`)."""
    params = message.get("params")
    if isinstance(params, dict):
        changed = _map_related(params, convert)
        if message.get("method") in NAMING_TASK and isinstance(params.get("taskId"), str):
            changed = {**(changed or params), "taskId": convert(params["taskId"])}
        filters = params.get("notifications")
        if (
            message.get("method") == ACKNOWLEDGED
            and isinstance(filters, dict)
            and isinstance(filters.get("taskIds"), list)
        ):
            ids = [convert(task_id) if isinstance(task_id, str) else task_id for task_id in filters["taskIds"]]
            changed = {**(changed or params), "notifications": {**filters, "taskIds": ids}}
        return message if changed is None else {**message, "params": changed}
    error = message.get("error")
    data = error.get("data") if isinstance(error, dict) else None
    if isinstance(data, dict) and isinstance(data.get("taskId"), str) and (method or "").startswith("tasks/"):
        assert isinstance(error, dict)
        return {**message, "error": {**error, "data": {**data, "taskId": convert(data["taskId"])}}}
    result = message.get("result")
    if not isinstance(result, dict):
        return message
    mapped = _map_related(result, convert) or result
    if (
        method == "tools/call"
        and isinstance(mapped.get("task"), dict)
        and isinstance(mapped["task"].get("taskId"), str)
    ):
        mapped = {**mapped, "task": {**mapped["task"], "taskId": convert(mapped["task"]["taskId"])}}
    elif (method == "tools/call" and mapped.get("resultType") == "task") or (
        method is not None and method.startswith("tasks/") and method != "tasks/list"
    ):
        if isinstance(mapped.get("taskId"), str):
            mapped = {**mapped, "taskId": convert(mapped["taskId"])}
    elif method == "tasks/list" and isinstance(mapped.get("tasks"), list):
        mapped = {
            **mapped,
            "tasks": [
                {**task, "taskId": convert(task["taskId"])}
                if isinstance(task, dict) and isinstance(task.get("taskId"), str)
                else task
                for task in mapped["tasks"]
            ],
        }
    return message if mapped is result else {**message, "result": mapped}


def _map_related(container: dict[str, Any], convert: Callable[[str], str]) -> dict[str, Any] | None:
    meta = container.get("_meta")
    related = meta.get(RELATED_TASK_KEY) if isinstance(meta, dict) else None
    if not isinstance(related, dict) or not isinstance(related.get("taskId"), str):
        return None
    assert isinstance(meta, dict)
    return {**container, "_meta": {**meta, RELATED_TASK_KEY: {**related, "taskId": convert(related["taskId"])}}}
