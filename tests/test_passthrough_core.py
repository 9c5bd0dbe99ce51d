"""The pure part of pass-through tasks: where task ids sit in upstream messages, and which answers
create a task. (The flows themselves run against real upstreams in test_upstream_with_tasks.py and
test_upstream_modern_tasks.py.)"""

from __future__ import annotations

from typing import Any

from gateway.protocol.dialect import LEGACY, MODERN
from gateway.tasks.task_ids import map_task_ids

RELATED = "io.modelcontextprotocol/related-task"


def to_client(upstream_id: str) -> str:
    return f"t1.{upstream_id}"


def response(result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "result": result}


def test_legacy_create_task_result_is_mapped_and_recognised() -> None:
    task = {"taskId": "u1", "status": "working", "ttl": 1000, "createdAt": "a", "lastUpdatedAt": "a"}
    mapped = map_task_ids(response({"task": task}), "tools/call", to_client)
    assert mapped["result"]["task"] == {**task, "taskId": "t1.u1"}
    assert LEGACY.created_task(mapped) == {**task, "taskId": "t1.u1"}
    assert MODERN.created_task(mapped) is None


def test_modern_create_task_result_is_flat_and_needs_result_type() -> None:
    flat = {"resultType": "task", "taskId": "u2", "status": "working"}
    mapped = map_task_ids(response(flat), "tools/call", to_client)
    assert mapped["result"]["taskId"] == "t1.u2"
    assert MODERN.created_task(mapped) == mapped["result"]
    # A plain tool result that happens to carry a taskId field is neither mapped nor a task.
    plain = response({"resultType": "complete", "taskId": "u2", "content": []})
    assert map_task_ids(plain, "tools/call", to_client) is plain
    assert MODERN.created_task(plain) is None


def test_task_method_answers_are_mapped() -> None:
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        mapped = map_task_ids(response({"taskId": "u3", "status": "working"}), method, to_client)
        assert mapped["result"]["taskId"] == "t1.u3", method
    listed = map_task_ids(response({"tasks": [{"taskId": "a"}, {"taskId": "b"}, "junk"]}), "tasks/list", to_client)
    assert listed["result"]["tasks"] == [{"taskId": "t1.a"}, {"taskId": "t1.b"}, "junk"]


def test_related_task_meta_is_mapped_wherever_it_is() -> None:
    result = map_task_ids(
        response({"content": [], "_meta": {RELATED: {"taskId": "u4"}, "other": 1}}), "tasks/result", to_client
    )
    assert result["result"]["_meta"] == {RELATED: {"taskId": "t1.u4"}, "other": 1}
    request = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "elicitation/create",
        "params": {"_meta": {RELATED: {"taskId": "u4"}}},
    }
    assert map_task_ids(request, None, to_client)["params"]["_meta"][RELATED] == {"taskId": "t1.u4"}


def test_status_pushes_are_mapped_in_both_dialects() -> None:
    for method in ("notifications/tasks/status", "notifications/tasks"):
        push = {"jsonrpc": "2.0", "method": method, "params": {"taskId": "u5", "status": "completed"}}
        assert map_task_ids(push, None, to_client)["params"] == {"taskId": "t1.u5", "status": "completed"}


def test_a_native_upstreams_task_events_and_events_gone_are_mapped() -> None:
    event = {
        "jsonrpc": "2.0",
        "method": "notifications/tasks/event",
        "params": {
            "seq": 3,
            "taskId": "u6",
            "type": "com.example.x",
            "payload": {},
            "_meta": {RELATED: {"taskId": "u6"}},
        },
    }
    mapped = map_task_ids(event, None, to_client)["params"]
    assert (mapped["taskId"], mapped["_meta"][RELATED], mapped["seq"]) == ("t1.u6", {"taskId": "t1.u6"}, 3)
    data = {"reason": "events_gone", "taskId": "u6", "earliestSeq": 5}
    gone = {"jsonrpc": "2.0", "id": 4, "error": {"code": -32010, "message": "gone", "data": data}}
    assert map_task_ids(gone, "tasks/stream", to_client)["error"]["data"] == {**data, "taskId": "t1.u6"}
    assert map_task_ids(gone, "tools/call", to_client) is gone  # only answers about a task name one
    ended = response({})
    assert map_task_ids(ended, "tasks/stream", to_client) is ended


def test_messages_without_task_ids_pass_untouched() -> None:
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 2}}
    other = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"taskId": "not-a-push"}}
    tools = response({"tools": []})
    assert map_task_ids(progress, None, to_client) is progress
    assert map_task_ids(other, None, to_client) is other
    assert map_task_ids(tools, "tools/list", to_client) is tools
    error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "no such task"}}
    assert map_task_ids(error, "tasks/get", to_client) is error


def test_a_subscription_acknowledgement_names_tasks_in_client_ids() -> None:
    ack = {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": {"taskIds": ["u6", "u7"], "toolsListChanged": True}, "_meta": {"x": 1}},
    }
    mapped = map_task_ids(ack, None, to_client)
    assert mapped["params"] == {
        "notifications": {"taskIds": ["t1.u6", "t1.u7"], "toolsListChanged": True},
        "_meta": {"x": 1},
    }
