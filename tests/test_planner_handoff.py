"""In process, no socket: the planner's upstream facts (gathered before planning, then passed in as
data) and the call handoff (`gateway.tasks.handoff.TaskHandoff`, the `CallHandoff` the relay calls back
when a 2026-07-28 tools/call may become a task the gateway hosts).

The gateway is the playbook's (`tests.test_service_playbook.Gateway`: the real service, registry, log
and hosted runner over a scripted upstream).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from gateway.protocol.dialect import MODERN
from gateway.protocol.era import Era, primes_streams
from gateway.protocol.jsonrpc import Message
from gateway.tasks.handoff import TaskHandoff
from gateway.tasks.input import UpstreamCall
from gateway.tasks.plans import Forward, Reply, UpstreamFacts
from gateway.tasks.policy import UpstreamSupport
from gateway.tasks.registry import TaskLimitReached
from tests.test_per_tool_hosting import MarkingUpstream, gateway_lists
from tests.test_service_playbook import ECHO, SEP_1686, SEP_2663, TASKLESS, Gateway

# -- the facts, gathered before planning ---------------------------------------------------------------


def probes(gateway: Gateway) -> list[Message]:
    return [message for message in gateway.upstream.received if message["method"] == "server/discover"]


@pytest.mark.parametrize("kind", [TASKLESS, SEP_2663])
async def test_a_modern_calls_facts_come_from_the_upstreams_discover_asked_once(kind: str) -> None:
    gateway = Gateway(Era.MODERN, kind)
    call = gateway.call(gateway.message("tools/call", {"name": "echo", "arguments": {}}))
    facts = await gateway.service.upstream_facts(call)
    assert facts == UpstreamFacts(has_tasks=kind == SEP_2663)  # a SEP-2663 upstream's tools carry no mark
    await gateway.service.upstream_facts(call)
    assert len(probes(gateway)) == 1
    await gateway.stop()


@pytest.mark.parametrize("kind", [TASKLESS, SEP_1686])
async def test_a_legacy_sessions_facts_come_from_its_initialize_without_asking(kind: str) -> None:
    gateway = Gateway(Era.LEGACY, kind)
    call = gateway.call(gateway.message("tasks/list", {}))
    assert await gateway.service.upstream_facts(call) == UpstreamFacts(has_tasks=kind == SEP_1686)
    assert gateway.upstream.received == []
    await gateway.stop()


async def test_a_legacy_tools_mark_is_a_fact_asked_for_only_when_the_plan_depends_on_it() -> None:
    gateway = Gateway(Era.LEGACY, SEP_1686, upstream=MarkingUpstream(SEP_1686))
    plain = gateway.call(gateway.message("tools/call", {"name": "job", "arguments": {}}))
    assert (await gateway.service.upstream_facts(plain)).tool_support is UpstreamSupport.UNKNOWN
    assert gateway_lists(gateway) == []  # a plain call: the upstream answers it whoever hosts the tool's tasks
    as_task = gateway.call(gateway.message("tools/call", {"name": "job", "arguments": {}, "task": {}}))
    facts = await gateway.service.upstream_facts(as_task)
    assert facts == UpstreamFacts(has_tasks=True, tool_support=UpstreamSupport.FORBIDDEN)
    assert len(gateway_lists(gateway)) == 2  # both pages, once
    await gateway.service.upstream_facts(as_task)
    assert len(gateway_lists(gateway)) == 2
    await gateway.stop()


# -- the planner, with facts as data ------------------------------------------------------------------


async def test_the_planner_asks_the_upstream_nothing_and_follows_the_facts_it_is_given() -> None:
    gateway = Gateway(Era.MODERN, SEP_2663)
    message = gateway.message("tools/call", {"name": "job", "arguments": {}})
    hosted = await gateway.service.plan(gateway.call(message), UpstreamFacts(has_tasks=False))
    assert isinstance(hosted, Forward) and hosted.hooks.handoff is not None  # the gateway's task to make
    passed = await gateway.service.plan(gateway.call(message), UpstreamFacts(has_tasks=True))
    assert isinstance(passed, Forward) and passed.hooks.handoff is None and passed.message == message
    assert gateway.upstream.received == []  # no discover probe: the facts were given
    await gateway.stop()


async def test_a_legacy_tool_the_facts_say_the_upstream_forbids_is_hosted_without_a_tools_list() -> None:
    gateway = Gateway(Era.LEGACY, SEP_1686, upstream=MarkingUpstream(SEP_1686))
    message = gateway.message("tools/call", {"name": "job", "arguments": {}, "task": {"ttl": 60000}})
    facts = UpstreamFacts(has_tasks=True, tool_support=UpstreamSupport.FORBIDDEN)
    plan = await gateway.service.plan(gateway.call(message), facts)
    assert isinstance(plan, Reply) and "task" in plan.message["result"]
    assert gateway_lists(gateway) == []
    await gateway.stop()


# -- the handoff ----------------------------------------------------------------------------------------


def progress(token: str) -> Message:
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": 1}}


async def handoff_of(
    gateway: Gateway, wait_s: float, meta: dict[str, Any] | None = None
) -> tuple[TaskHandoff, Message]:
    """A handoff of a "job" call (`meta` added to its `_meta`), and the call as the upstream gets it."""
    message = gateway.message("tools/call", {"name": "job", "arguments": {}})
    message["params"]["_meta"].update(meta or {})
    call = gateway.call(message)
    upstream_message = gateway.hosted.upstream_call(message, call.dialect)
    return TaskHandoff(
        gateway.hosted, call, UpstreamCall(gateway.upstream, upstream_message, {}), wait_s
    ), upstream_message


@pytest.fixture
async def gateway() -> Any:
    gateway = Gateway(Era.MODERN, TASKLESS)
    yield gateway
    await gateway.stop()


async def test_the_client_sees_live_only_the_notifications_it_asked_for(gateway: Gateway) -> None:
    theirs, ours = progress("client"), progress("gateway-task-1")
    log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
    other = {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "u"}}
    asked, _ = await handoff_of(gateway, 60, meta={"progressToken": "client"})
    assert asked.observe([theirs, log, other]) == [theirs, other]
    unasked, _ = await handoff_of(gateway, 60)
    assert unasked.observe([ours, log, other]) == [other]
    assert math.isclose(asked.deadline, time.monotonic() + 60, abs_tol=5)


async def test_at_the_deadline_a_task_takes_the_call_over_with_what_was_observed(gateway: Gateway) -> None:
    handoff, sent = await handoff_of(gateway, 0)
    exchange = await gateway.upstream.request(sent, {})
    handoff.observe([progress(sent["params"]["_meta"]["progressToken"])])
    answer = await handoff.take_over(exchange)
    assert answer is not None and answer["result"]["resultType"] == "task"
    task = gateway.registry.find(answer["result"]["taskId"])
    assert task is not None and task.status == "working"
    events = await gateway.stores.log.read(task.id, -1, 10)
    assert any(b"progress" in event.body for event in events)  # the relayed progress is its first event
    await gateway.upstream.release()  # the call answers: the task that took it over completes
    async with asyncio.timeout(5):
        await task.done.wait()
    assert task.status == "completed"


async def test_without_room_for_a_task_the_call_carries_on_plain(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(owner: str) -> None:
        raise TaskLimitReached("full", total=True)

    monkeypatch.setattr(gateway.registry, "check_room", full)
    handoff, sent = await handoff_of(gateway, 0)
    exchange = await gateway.upstream.request(sent, {})
    assert await handoff.take_over(exchange) is None and handoff.deadline == math.inf
    assert not exchange.finished  # untouched: still the client's call, relayed on
    final = {"jsonrpc": "2.0", "id": sent["id"], "result": ECHO}
    assert await handoff.result_as_task(final) == final


async def test_an_answer_within_the_deadline_becomes_an_ended_task_unless_it_asks_for_input(gateway: Gateway) -> None:
    handoff, sent = await handoff_of(gateway, 60)
    request_id = sent["id"]
    asking: Message = {"jsonrpc": "2.0", "id": request_id, "result": {"resultType": "input_required"}}
    assert await handoff.result_as_task(asking) == asking
    created = await handoff.result_as_task({"jsonrpc": "2.0", "id": request_id, "result": ECHO})
    task = gateway.registry.find(created["result"]["taskId"])
    assert task is not None and task.status == "completed"
    assert created == {"jsonrpc": "2.0", "id": request_id, "result": {"resultType": "task", **MODERN.task(task)}}
    record = await gateway.hosted.reads.record(task.owner, task.id)
    assert record is not None and record.terminal


# -- the era rules the edge asks by name ------------------------------------------------------------------


def test_the_era_rules_the_edge_asks() -> None:
    assert Era.LEGACY.has_sessions and not Era.MODERN.has_sessions
    assert Era.MODERN.drop_cancels and not Era.LEGACY.drop_cancels
    assert primes_streams("2025-11-25") and not primes_streams("2025-06-18")
