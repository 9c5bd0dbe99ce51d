"""Unit tests of the dialect table: every shape and name that differs between the two eras."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.protocol import jsonrpc
from gateway.protocol.dialect import (
    LEGACY,
    MODERN,
    TASKS_EXTENSION,
    dialect_of,
    missing_extension,
    unknown_task,
)
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, Era
from gateway.protocol.jsonrpc import Message, ProtocolError

ENVELOPE = {PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {"extensions": {TASKS_EXTENSION: {}}}}


@dataclass
class FakeTask:
    """The facts a view reads, as plain values."""

    id: str = "t1"
    status: str = "working"
    status_message: str | None = None
    created_at: str = "T0"
    last_updated_at: str = "T1"
    ttl_ms: int = 60_000
    poll_interval_ms: int = 500
    input_requests: dict[str, Any] = field(default_factory=dict)
    outcome: Message | None = None


BASE = {"taskId": "t1", "status": "working", "createdAt": "T0", "lastUpdatedAt": "T1"}


def test_dialect_of_each_era() -> None:
    assert dialect_of(Era.LEGACY) is LEGACY and LEGACY.era is Era.LEGACY
    assert dialect_of(Era.MODERN) is MODERN and MODERN.era is Era.MODERN


def test_names_per_era() -> None:
    assert (LEGACY.ttl_key, LEGACY.poll_key, LEGACY.outcome_method) == ("ttl", "pollInterval", "tasks/result")
    assert (MODERN.ttl_key, MODERN.poll_key, MODERN.outcome_method) == ("ttlMs", "pollIntervalMs", "tasks/get")
    assert LEGACY.task_requests == {"tasks/get", "tasks/result", "tasks/cancel"}
    assert MODERN.task_requests == {"tasks/get", "tasks/update", "tasks/cancel"}
    assert LEGACY.task_methods == {"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"}
    assert MODERN.task_methods == {"tasks/get", "tasks/update", "tasks/cancel"}
    assert LEGACY.upstream_call_meta == {} and MODERN.upstream_call_meta == {"io.modelcontextprotocol/logLevel": "info"}


def test_behaviour_flags_per_era() -> None:
    assert LEGACY.cancelled_has_outcome and not MODERN.cancelled_has_outcome
    assert LEGACY.ended_cancel_is_error and not MODERN.ended_cancel_is_error
    assert LEGACY.tool_error_fails_task and not MODERN.tool_error_fails_task


# -- task views ---------------------------------------------------------------------------------------


def test_task_object_per_era() -> None:
    task = FakeTask()
    assert LEGACY.task(task) == {**BASE, "ttl": 60_000, "pollInterval": 500}
    assert MODERN.task(task) == {**BASE, "ttlMs": 60_000, "pollIntervalMs": 500}
    task.status_message = "step 1"
    assert LEGACY.task(task)["statusMessage"] == "step 1" and MODERN.task(task)["statusMessage"] == "step 1"


def test_created_result_per_era() -> None:
    task = FakeTask()
    assert LEGACY.created_result(task) == {"task": {**BASE, "ttl": 60_000, "pollInterval": 500}}
    assert MODERN.created_result(task) == {"resultType": "task", **BASE, "ttlMs": 60_000, "pollIntervalMs": 500}


def test_legacy_tasks_get_is_the_task_without_input_or_outcome() -> None:
    waiting = FakeTask(status="input_required", input_requests={"q": {"method": "elicitation/create"}})
    assert LEGACY.get_result(waiting) == LEGACY.task(waiting)
    done = FakeTask(status="completed", outcome={"result": {"content": []}})
    assert LEGACY.get_result(done) == LEGACY.task(done)


def test_modern_tasks_get_is_the_detailed_task() -> None:
    asks = {"q": {"method": "elicitation/create"}}
    waiting = FakeTask(status="input_required", input_requests=asks)
    assert MODERN.get_result(waiting) == {"resultType": "complete", **MODERN.task(waiting), "inputRequests": asks}
    result = {"content": [{"type": "text", "text": "ok"}]}
    done = FakeTask(status="completed", outcome={"result": result})
    assert MODERN.get_result(done) == {"resultType": "complete", **MODERN.task(done), "result": result}
    error = {"code": -32603, "message": "boom"}
    failed = FakeTask(status="failed", outcome={"error": error})
    assert MODERN.detailed_task(failed) == {**MODERN.task(failed), "error": error}
    # A completed task whose result could not be kept shows the error that says why.
    unkept = FakeTask(status="completed", outcome={"error": error})
    assert MODERN.detailed_task(unkept) == {**MODERN.task(unkept), "error": error}
    cancelled = FakeTask(status="cancelled", outcome={"error": error})
    assert MODERN.detailed_task(cancelled) == MODERN.task(cancelled)
    assert MODERN.detailed_task(FakeTask(status="working", outcome={"result": result})) == MODERN.task(FakeTask())


def test_cancel_result_per_era() -> None:
    task = FakeTask(status="cancelled")
    assert LEGACY.cancel_result(task) == LEGACY.task(task)
    assert MODERN.cancel_result(task) == {"resultType": "complete"}


# -- parsing what the upstream answers ----------------------------------------------------------------


def test_created_task_parses_only_the_dialects_create_result() -> None:
    legacy_view = {**BASE, "ttl": 1000}
    assert LEGACY.created_task({"result": {"task": legacy_view}}) == legacy_view
    assert MODERN.created_task({"result": {"task": legacy_view}}) is None
    modern = {"resultType": "task", **BASE}
    assert MODERN.created_task({"result": modern}) == modern
    assert LEGACY.created_task({"result": modern}) is None
    assert MODERN.created_task({"result": {"resultType": "complete", "taskId": "x"}}) is None
    assert MODERN.created_task({"result": {"resultType": "task", "taskId": 7}}) is None
    assert LEGACY.created_task({"error": {"code": 1, "message": "no"}}) is None


def test_inlined_outcome() -> None:
    assert MODERN.inlined_outcome({"status": "completed", "result": {"a": 1}}) == {"result": {"a": 1}}
    assert MODERN.inlined_outcome({"status": "failed", "error": {"code": 1}}) == {"error": {"code": 1}}
    assert MODERN.inlined_outcome({"status": "completed"}) is None
    assert MODERN.inlined_outcome({"status": "cancelled", "result": {}}) is None
    assert LEGACY.inlined_outcome({"status": "completed", "result": {"a": 1}}) is None


def test_answered_outcome() -> None:
    assert LEGACY.answered_outcome({"id": 1, "result": {"a": 1}}) == {"result": {"a": 1}}
    assert LEGACY.answered_outcome({"id": 1, "error": {"code": 2}}) == {"error": {"code": 2}}
    view = {"status": "completed", "result": {"a": 1}}
    assert MODERN.answered_outcome({"id": 1, "result": view}) == {"result": {"a": 1}}
    assert MODERN.answered_outcome({"id": 1, "result": {"status": "completed"}}) is None
    assert MODERN.answered_outcome({"id": 1, "error": {"code": 2}}) is None


# -- requests -----------------------------------------------------------------------------------------


def _tool_call(params: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", **params}}


def test_may_create_task() -> None:
    assert LEGACY.may_create_task(_tool_call({"task": {"ttl": 1000}}))
    assert not LEGACY.may_create_task(_tool_call({"_meta": ENVELOPE}))
    assert MODERN.may_create_task(_tool_call({"_meta": ENVELOPE}))
    assert not MODERN.may_create_task(_tool_call({"task": {}, "_meta": {CLIENT_CAPABILITIES_KEY: {}}}))


def test_check_tasks_declared() -> None:
    undeclared = {"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": {"taskId": "t"}}
    LEGACY.check_tasks_declared(undeclared)
    MODERN.check_tasks_declared({**undeclared, "params": {"taskId": "t", "_meta": ENVELOPE}})
    with pytest.raises(ProtocolError) as refused:
        MODERN.check_tasks_declared(undeclared)
    assert refused.value.to_message() == missing_extension(4).to_message()


def test_modern_gateway_request_carries_the_envelope_and_its_headers() -> None:
    message, headers = MODERN.gateway_request("mcp-task-gateway-poll-1", "tasks/get", {"taskId": "u1"})
    assert message == {
        "jsonrpc": "2.0",
        "id": "mcp-task-gateway-poll-1",
        "method": "tasks/get",
        "params": {"taskId": "u1", "_meta": ENVELOPE},
    }
    assert headers == {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tasks/get", "Mcp-Name": "u1"}
    listen, listen_headers = MODERN.gateway_request(
        "mcp-task-gateway-listen-1", "subscriptions/listen", {"notifications": {"taskIds": ["u1"]}}
    )
    assert listen["params"] == {"notifications": {"taskIds": ["u1"]}, "_meta": ENVELOPE}
    assert listen_headers == {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "subscriptions/listen"}
    discover, discover_headers = MODERN.gateway_request("mcp-task-gateway-discover", "server/discover", {})
    assert discover == {
        "jsonrpc": "2.0",
        "id": "mcp-task-gateway-discover",
        "method": "server/discover",
        "params": {"_meta": ENVELOPE},
    }
    assert discover_headers == {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"}
    jsonrpc.classify(message)  # a well-formed request


def test_legacy_gateway_request_is_plain() -> None:
    message, headers = LEGACY.gateway_request("mcp-task-gateway-result-2", "tasks/result", {"taskId": "u1"})
    assert message == {
        "jsonrpc": "2.0",
        "id": "mcp-task-gateway-result-2",
        "method": "tasks/result",
        "params": {"taskId": "u1"},
    }
    assert headers == {}


# -- responses ----------------------------------------------------------------------------------------


def test_empty_result_and_stream_end() -> None:
    assert LEGACY.stream_end(9) == {"jsonrpc": "2.0", "id": 9, "result": {}}
    assert MODERN.stream_end(9) == {"jsonrpc": "2.0", "id": 9, "result": {"resultType": "complete"}}
    MODERN.stream_end(9)["result"]["extra"] = True  # each answer is its own dict: the table stays as it is
    assert MODERN.empty_result == {"resultType": "complete"}


STREAMS = {"maxEventsPerTask": 10}


def test_legacy_advertise_hosts_tasks_for_an_upstream_without() -> None:
    result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}
    advertised = LEGACY.advertise(result, STREAMS)
    hosted = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}, "eventStreams": STREAMS}
    assert advertised == {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}, "tasks": hosted}}
    assert result == {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}  # not edited in place
    assert LEGACY.advertise({}, None) == {
        "capabilities": {"tasks": {key: hosted[key] for key in hosted if key != "eventStreams"}}
    }


def test_legacy_advertise_keeps_the_upstreams_own_tasks() -> None:
    own = {"list": {}, "requests": {"tools": {"call": {}}}}
    advertised = LEGACY.advertise({"capabilities": {"tasks": own}}, STREAMS)
    assert advertised == {"capabilities": {"tasks": {**own, "eventStreams": STREAMS}}}
    assert LEGACY.advertise({"capabilities": {"tasks": {}}}, None) == {"capabilities": {"tasks": {}}}


def test_modern_advertise_declares_the_extension() -> None:
    result = {"capabilities": {"tools": {}, "extensions": {"x/y": {"a": 1}}}}
    assert MODERN.advertise(result, STREAMS) == {
        "capabilities": {"tools": {}, "extensions": {"x/y": {"a": 1}, TASKS_EXTENSION: {"eventStreams": STREAMS}}}
    }
    own = {"capabilities": {"extensions": {TASKS_EXTENSION: {"b": 2}}}}
    assert MODERN.advertise(own, None) == own
    assert MODERN.advertise({}, None) == {"capabilities": {"extensions": {TASKS_EXTENSION: {}}}}


def test_declared_tasks_and_event_streams_per_era() -> None:
    native = {"list": {}, "eventStreams": STREAMS}
    legacy = {"capabilities": {"tasks": native}}
    modern = {"capabilities": {"extensions": {TASKS_EXTENSION: native}}}
    assert LEGACY.declared_tasks(legacy) == native and LEGACY.declares_event_streams(legacy)
    assert MODERN.declared_tasks(modern) == native and MODERN.declares_event_streams(modern)
    assert MODERN.declared_tasks(legacy) is None and LEGACY.declared_tasks(modern) is None
    without = {"capabilities": {"tasks": {"list": {}}}}
    assert LEGACY.declared_tasks(without) == {"list": {}} and not LEGACY.declares_event_streams(without)
    assert LEGACY.declared_tasks({"capabilities": {"tasks": None}}) == {}  # declared, without settings
    assert not LEGACY.declares_event_streams({"capabilities": {"tasks": {"eventStreams": True}}})
    assert LEGACY.declared_tasks({}) is None and MODERN.declared_tasks({"capabilities": []}) is None


def test_advertise_keeps_a_native_upstreams_event_streams() -> None:
    """It serves those streams itself (the gateway forwards them): its retention is the one that holds."""
    own = {"list": {}, "eventStreams": {"maxEventsPerTask": 10}}
    assert LEGACY.advertise({"capabilities": {"tasks": own}}, STREAMS) == {"capabilities": {"tasks": own}}
    modern = {"capabilities": {"extensions": {TASKS_EXTENSION: own}}}
    assert MODERN.advertise(modern, STREAMS) == modern


def test_error_shapes() -> None:
    assert missing_extension(5, "tool 'x' runs only as a task; ").to_message() == {
        "jsonrpc": "2.0",
        "id": 5,
        "error": {
            "code": jsonrpc.MISSING_REQUIRED_CLIENT_CAPABILITY,
            "message": "Missing required client capability: tool 'x' runs only as a task; "
            f"declare the {TASKS_EXTENSION} extension in clientCapabilities",
            "data": {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
        },
    }
    assert unknown_task(6).to_message() == {
        "jsonrpc": "2.0",
        "id": 6,
        "error": {"code": jsonrpc.INVALID_PARAMS, "message": "Invalid params: no such task"},
    }
