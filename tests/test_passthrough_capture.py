"""Unit tests of pass-through capture: the channel tap (`Passthrough.observe`) fed by hand, with a real
registry and event log. No upstream runs: the channel below only answers the gateway's own
`tasks/result` for an ended task, and polls are set far beyond the test's life. The flows against real
upstreams are in test_upstream_with_tasks.py, test_upstream_modern_tasks.py and
test_passthrough_outcome.py."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from gateway.config import Config
from gateway.events.capture import Capture
from gateway.events.log import MemoryEventLog
from gateway.metrics import Metrics
from gateway.protocol.dialect import LEGACY
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
from gateway.stores.memory import MemoryTaskStore
from gateway.tasks import watcher as watcher_module
from gateway.tasks.passthrough import Passthrough
from gateway.tasks.registry import Task, TaskRegistry, outcome_cap
from gateway.upstream.base import Exchange
from tests.fake_upstream import OneConversation

RELATED = "io.modelcontextprotocol/related-task"
PREFIX = Config().events.prefix + "."


class Unreachable(OneConversation):
    """Stands for the upstream and its one conversation. The only request it takes is the gateway's
    own `tasks/result` for a task in `results` (upstream id -> the answer's `result` or `error`),
    answered through the tap like a real link; a task missing there never gets an answer."""

    def __init__(self) -> None:
        self.results: dict[str, Message] = {}

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        assert message["method"] == "tasks/result", f"unexpected upstream request {message}"
        exchange = Exchange(message["id"], message["method"], channel=self)
        answer = self.results.get(message["params"]["taskId"])
        if answer is not None:
            await exchange.deliver({"jsonrpc": "2.0", "id": message["id"], **answer})
        return exchange


class ThreadedStore(MemoryTaskStore):
    """Yields to the loop on each status write, as the SQLite store does while its thread writes."""

    async def update_status(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0)
        return await super().update_status(*args, **kwargs)


@pytest.fixture
async def setup() -> tuple[Passthrough, Unreachable]:
    config = Config.model_validate({"tasks": {"upstream_poll_min_ms": 3_600_000, "upstream_poll_max_ms": 3_600_000}})
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    store = ThreadedStore(outcome_cap(config.retention))
    registry = TaskRegistry(config.tasks, config.retention, store, MemoryEventLog(1000), capture, Metrics())
    channel = Unreachable()
    passthrough = Passthrough(registry, channel, config.tasks, Metrics())
    channel.tap = passthrough.observe  # as the endpoint sets it on a conversation whose upstream has tasks
    return passthrough, channel


def legacy_task(
    task_id: str, status: str = "working", message: str | None = None, updated: str = "T1"
) -> dict[str, Any]:
    task: dict[str, Any] = {"taskId": task_id, "status": status, "createdAt": "T0", "lastUpdatedAt": updated}
    task |= {"ttl": 60000, "pollInterval": 1000}
    return task | ({"statusMessage": message} if message is not None else {})


def push(view: dict[str, Any], method: str = "notifications/tasks/status") -> Message:
    return {"jsonrpc": "2.0", "method": method, "params": view}


async def adopt_legacy(passthrough: Passthrough, channel: Unreachable, upstream_id: str, **meta: Any) -> Task:
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "job", "task": {}, "_meta": meta}}
    created = {"jsonrpc": "2.0", "id": 1, "result": {"task": legacy_task(upstream_id, message="started")}}
    final = await passthrough.observe(channel, "tools/call", created)
    task = await passthrough.adopt("alice", channel, Era.LEGACY, request, final, [], {})
    assert task is not None
    return task


async def events(passthrough: Passthrough, task: Task) -> list[tuple[str, dict[str, Any]]]:
    stored = await passthrough.registry.log.read(task.id, -1, 1000)
    decoded = [orjson.loads(b"{" + event.body + b"}") for event in stored]
    return [(event["type"].removeprefix(PREFIX), event["payload"]) for event in decoded]


async def test_a_push_before_the_create_result_is_recorded_once_learned(setup: tuple[Passthrough, Unreachable]) -> None:
    passthrough, channel = setup
    early = await passthrough.observe(channel, None, push(legacy_task("u1", message="queued", updated="T0")))
    assert early["params"]["taskId"] == f"{channel.tag}.u1"  # the client sees the namespaced id at once
    task = await adopt_legacy(passthrough, channel, "u1")
    assert task.id == f"{channel.tag}.u1" and task.owner == "alice"
    recorded = await events(passthrough, task)
    assert [kind for kind, _ in recorded] == ["task.created", "task.status", "task.status"]
    assert [payload.get("statusMessage") for _, payload in recorded[1:]] == ["queued", "started"]


async def test_task_created_audits_the_creator_and_the_arguments_digest(
    setup: tuple[Passthrough, Unreachable],
) -> None:
    passthrough, channel = setup
    arguments = {"target": "prod", "dry_run": False}
    params = {"name": "job", "arguments": arguments, "task": {}}
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    created = {"jsonrpc": "2.0", "id": 1, "result": {"task": legacy_task("u9")}}
    final = await passthrough.observe(channel, "tools/call", created)
    task = await passthrough.adopt("alice", channel, Era.LEGACY, request, final, [], {})
    assert task is not None
    kind, payload = (await events(passthrough, task))[0]
    digest = hashlib.sha256(b'{"dry_run":false,"target":"prod"}').hexdigest()[:32]
    assert kind == "task.created" and payload["hostedBy"] == "upstream", payload
    assert (payload["principal"], payload["tool"], payload["argumentsSha256"]) == ("alice", "job", digest)


async def test_status_changes_are_recorded_once_and_stale_views_never(setup: tuple[Passthrough, Unreachable]) -> None:
    passthrough, channel = setup
    channel.results["u2"] = {"result": {"content": []}}
    task = await adopt_legacy(passthrough, channel, "u2")
    for view in (
        legacy_task("u2", message="started", updated="T1"),  # the same as the create result: nothing new
        legacy_task("u2", message="step 1", updated="T2"),
        legacy_task("u2", message="step 1", updated="T2"),  # repeated push
        legacy_task("u2", message="started", updated="T1"),  # a poll answer older than what was seen
        legacy_task("u2", "completed", "step 1", updated="T3"),
        legacy_task("u2", "failed", "too late", updated="T4"),  # terminal states never change
    ):
        await passthrough.observe(channel, None, push(view))
    async with asyncio.timeout(5):
        await task.done.wait()  # the watcher fetched the result: the record is terminal with it
    recorded = await events(passthrough, task)
    assert [(kind, payload.get("status"), payload.get("statusMessage")) for kind, payload in recorded] == [
        ("task.created", "working", None),
        ("task.status", "working", "started"),
        ("task.status", "working", "step 1"),
        ("task.status", "completed", "step 1"),
        ("task.terminal", "completed", None),
    ]
    await passthrough.stop()


async def test_the_same_view_arriving_at_once_on_two_paths_is_recorded_once(
    setup: tuple[Passthrough, Unreachable],
) -> None:
    """A push and the answer to a forwarded `tasks/get` carry the same new view while the first is still
    being written: one status event, not two (CI once saw a stage recorded twice)."""
    passthrough, channel = setup
    task = await adopt_legacy(passthrough, channel, "u3")
    view = legacy_task("u3", message="step 1", updated="T2")
    answer = {"jsonrpc": "2.0", "id": 7, "result": view}
    await asyncio.gather(
        passthrough.observe(channel, None, push(view)),
        passthrough.observe(channel, "tasks/get", answer),
        passthrough.observe(channel, None, push(view)),
    )
    recorded = await events(passthrough, task)
    assert [(kind, payload.get("statusMessage")) for kind, payload in recorded] == [
        ("task.created", None),
        ("task.status", "started"),
        ("task.status", "step 1"),
    ]
    await passthrough.stop()


async def test_an_ended_legacy_task_turns_terminal_with_the_upstream_result_in_its_record(
    setup: tuple[Passthrough, Unreachable],
) -> None:
    passthrough, channel = setup
    result = {"content": [{"type": "text", "text": "done"}], "_meta": {RELATED: {"taskId": "u6"}}}
    channel.results["u6"] = {"result": result}
    task = await adopt_legacy(passthrough, channel, "u6")
    assert task.created_at == "T0"  # the upstream's times, not the gateway's
    await passthrough.observe(channel, None, push(legacy_task("u6", "completed", "done", updated="T9")))
    async with asyncio.timeout(5):
        await task.done.wait()
    # Exactly the upstream's answer to tasks/result, in the client's task id.
    assert task.outcome == {"result": {**result, "_meta": {RELATED: {"taskId": task.id}}}}
    assert LEGACY.task(task) == {**legacy_task(task.id, "completed", "done", updated="T9"), "ttl": 60000}
    kind, terminal = (await events(passthrough, task))[-1]
    assert (kind, terminal) == (
        "task.terminal",
        {"status": "completed", "isError": False, "content": [{"type": "text", "bytes": 4}]},
    )

    # An upstream error (a cancelled task's "no result stored") is kept as it is, too.
    channel.results["u7"] = {"error": {"code": -32603, "message": "Task u7 has no result stored"}}
    cancelled = await adopt_legacy(passthrough, channel, "u7")
    await passthrough.observe(
        channel, "tasks/cancel", {"jsonrpc": "2.0", "id": 5, "result": legacy_task("u7", "cancelled")}
    )
    async with asyncio.timeout(5):
        await cancelled.done.wait()
    assert cancelled.outcome == {"error": {"code": -32603, "message": "Task u7 has no result stored"}}
    await passthrough.stop()


async def test_a_result_the_upstream_does_not_give_in_time_is_recorded_as_unavailable(
    setup: tuple[Passthrough, Unreachable], monkeypatch: pytest.MonkeyPatch
) -> None:
    passthrough, channel = setup
    monkeypatch.setattr(watcher_module, "ASK_TIMEOUT_S", 0.2)
    task = await adopt_legacy(passthrough, channel, "u8")  # no answer scripted: tasks/result never answers
    await passthrough.observe(channel, None, push(legacy_task("u8", "completed", updated="T2")))
    async with asyncio.timeout(5):
        await task.done.wait()
    assert task.status.value == "completed"
    assert task.outcome == {
        "error": {
            "code": -32603,
            "message": "the task's result is unavailable: the upstream did not answer tasks/result within 0.2 s",
            "data": {"reason": "result_unavailable"},
        }
    }
    await passthrough.stop()


async def test_progress_for_the_creating_token_and_related_messages_are_captured(
    setup: tuple[Passthrough, Unreachable],
) -> None:
    passthrough, channel = setup
    task = await adopt_legacy(passthrough, channel, "u3", progressToken="p-1")
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "p-1", "progress": 2}}
    stranger = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "p-2", "progress": 9}}
    log = {
        "method": "notifications/message",
        "params": {"level": "info", "data": "hi", "_meta": {RELATED: {"taskId": "u3"}}},
    }
    asked = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "elicitation/create",
        "params": {"message": "Which?", "_meta": {RELATED: {"taskId": "u3"}}},
    }
    await passthrough.observe(channel, None, progress)
    await passthrough.observe(channel, None, stranger)
    relayed_log = await passthrough.observe(channel, None, log)
    relayed_ask = await passthrough.observe(channel, "tasks/result", asked)
    assert relayed_log["params"]["_meta"][RELATED] == relayed_ask["params"]["_meta"][RELATED] == {"taskId": task.id}
    await passthrough.answered(channel, {"jsonrpc": "2.0", "id": 0, "result": {"action": "decline"}})
    await passthrough.answered(channel, {"jsonrpc": "2.0", "id": 0, "result": {"action": "decline"}})  # once only
    recorded = await events(passthrough, task)
    assert [kind for kind, _ in recorded[2:]] == ["progress", "log", "input.requested", "input.answered"]
    assert recorded[2][1] == {"progress": 2}
    assert recorded[4][1] == {"method": "elicitation/create", "requestId": 0, "mode": "form", "message": "Which?"}
    assert recorded[5][1] == {"method": "elicitation/create", "requestId": 0, "action": "decline"}


async def test_modern_input_requests_are_recorded_once_per_key(setup: tuple[Passthrough, Unreachable]) -> None:
    passthrough, channel = setup
    created = {
        "resultType": "task",
        "taskId": "m1",
        "status": "working",
        "createdAt": "T0",
        "lastUpdatedAt": "T0",
        "ttlMs": 1000,
    }
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ask"}}
    final = await passthrough.observe(channel, "tools/call", {"jsonrpc": "2.0", "id": 1, "result": created})
    task = await passthrough.adopt("alice", channel, Era.MODERN, request, final, [], {})
    assert task is not None
    ask = {"method": "elicitation/create", "params": {"message": "Name?"}}
    waiting = created | {"status": "input_required", "lastUpdatedAt": "T1", "inputRequests": {"name": ask}}
    more = waiting | {"lastUpdatedAt": "T2", "inputRequests": {"name": ask, "age": ask}}
    for view in (waiting, waiting, more):
        await passthrough.observe(
            channel, "tasks/get", {"jsonrpc": "2.0", "id": 2, "result": {"resultType": "complete", **view}}
        )
    recorded = await events(passthrough, task)
    assert [(kind, payload.get("key")) for kind, payload in recorded] == [
        ("task.created", None),  # the create result said `working` without a message: nothing more
        ("task.status", None),
        ("input.requested", "name"),
        ("input.requested", "age"),
    ]
    assert recorded[1][1] == {"status": "input_required"}


async def test_losing_the_conversation_fails_its_tasks_naming_the_cause(setup: tuple[Passthrough, Unreachable]) -> None:
    passthrough, channel = setup
    task = await adopt_legacy(passthrough, channel, "u4")
    await channel.report_loss("the upstream process exited (code -9)")
    assert task.terminal
    kind, terminal = (await events(passthrough, task))[-1]
    assert kind == "task.terminal"
    assert terminal == {
        "status": "failed",
        "error": {"code": -32603, "message": "the upstream process exited (code -9)"},
    }
    await passthrough.stop()


async def test_unknown_and_foreign_ids_are_refused(setup: tuple[Passthrough, Unreachable]) -> None:
    passthrough, channel = setup
    task = await adopt_legacy(passthrough, channel, "u5")
    message = {"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": task.id}}
    routed, rewritten, headers = passthrough.route("alice", message, {"Mcp-Name": task.id, "Mcp-Method": "tasks/get"})
    assert routed is task and rewritten["params"]["taskId"] == "u5"
    assert headers == {"Mcp-Name": "u5", "Mcp-Method": "tasks/get"}
    for owner, task_id in (("bob", task.id), ("alice", "u5"), ("alice", f"{channel.tag}.other")):
        with pytest.raises(Exception, match="no such task") as raised:
            passthrough.route(owner, {**message, "params": {"taskId": task_id}}, {})
        assert getattr(raised.value, "code", None) == -32602
