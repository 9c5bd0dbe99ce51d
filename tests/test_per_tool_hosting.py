"""Per-tool hosting: a tool the upstream will not run as a task gets the gateway's tasks, where the
gateway's `[[tasks.tools]]` policy allows them; a tool the upstream runs as a task stays pass-through.

The decision is one pure function (`gateway.tasks.policy.who_hosts`), checked here over every pairing
of what the upstream says of a tool and the gateway's policy, in both eras. Then the task service in
process, over the scripted SEP-1686 upstream of the playbook (with a tools/list), and at last the real
`@modelcontextprotocol/server-everything` (its own 2025-11-25 Tasks; `trigger-long-running-operation` is
`taskSupport: "forbidden"` there) behind the real gateway, driven by the `mcp-task-gateway` CLI, the
official `mcp` SDK client and raw 2026-07-28 requests, on stdio and (2025-11-25) Streamable HTTP.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.config import ToolTaskPolicy
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message, ProtocolError
from gateway.tasks.plans import Forward, Reply
from gateway.tasks.policy import (
    AT_ONCE,
    Host,
    ToolHosting,
    UpstreamSupport,
    listed_support,
    plan_tool_call,
    policy_support,
    who_hosts,
    with_task_support,
)
from gateway.tasks.tool_marks import LIST_ID_PREFIX
from tests.conftest import RunningGateway, start_gateway
from tests.test_cli_tasks import cli, json_lines
from tests.test_service_playbook import ECHO, HOSTED_ID, SEP_1686, Gateway, ScriptedUpstream
from tests.test_upstream_with_tasks import http_upstream, node_command
from tests.wire import MODERN
from tests.wire import Client as WireClient

# -- the decision, pure ------------------------------------------------------------------------------

FORBIDDEN = ToolTaskPolicy(task_support="forbidden")
OPTIONAL = ToolTaskPolicy(task_support="optional")  # modern = "after_ms"
OPTIONAL_NEVER_MODERN = ToolTaskPolicy(task_support="optional", modern="never")
ALWAYS = ToolTaskPolicy(task_support="optional", modern="always")
REQUIRED = ToolTaskPolicy(task_support="required")

WONT = (UpstreamSupport.NONE, UpstreamSupport.FORBIDDEN)
"""What an upstream says of a tool it will not run as a task: it has no Tasks, or marks the tool so."""
RUNS = (UpstreamSupport.OPTIONAL, UpstreamSupport.REQUIRED, UpstreamSupport.UNKNOWN)
"""What leaves the tool with the upstream: it runs it as a task, or decides itself (SEP-2663, unlisted)."""


@pytest.mark.parametrize("upstream", list(UpstreamSupport))
@pytest.mark.parametrize("era", list(Era))
def test_who_hosts_every_pairing(upstream: UpstreamSupport, era: Era) -> None:
    """upstream support x gateway policy -> who hosts, and what tools/list shows (None: the upstream's entry)."""
    expected: dict[tuple[ToolTaskPolicy, Era], ToolHosting]
    if upstream in RUNS:
        passthrough = ToolHosting(Host.UPSTREAM, None)
        expected = {(policy, era): passthrough for policy in (FORBIDDEN, OPTIONAL, OPTIONAL_NEVER_MODERN, REQUIRED)}
    else:
        expected = {
            (FORBIDDEN, era): ToolHosting(Host.NOBODY, "forbidden"),
            (OPTIONAL, era): ToolHosting(Host.GATEWAY, "optional"),
            (ALWAYS, era): ToolHosting(Host.GATEWAY, "optional"),
            (REQUIRED, era): ToolHosting(Host.GATEWAY, "required"),
            # The two keys may differ for one tool: a task for 2025-11-25 clients, never for 2026-07-28 ones.
            (OPTIONAL_NEVER_MODERN, era): ToolHosting(Host.GATEWAY, "optional")
            if era is Era.LEGACY
            else ToolHosting(Host.NOBODY, "forbidden"),
        }
    for (policy, _), hosting in expected.items():
        assert who_hosts(upstream, policy, era) == hosting, (upstream, policy, era)


def test_the_policy_support_of_each_era() -> None:
    assert [policy_support(p, Era.LEGACY) for p in (FORBIDDEN, OPTIONAL, OPTIONAL_NEVER_MODERN, REQUIRED)] == [
        "forbidden",
        "optional",
        "optional",
        "required",
    ]
    assert [policy_support(p, Era.MODERN) for p in (FORBIDDEN, OPTIONAL, ALWAYS, OPTIONAL_NEVER_MODERN, REQUIRED)] == [
        "forbidden",
        "optional",
        "optional",
        "forbidden",
        "required",
    ]


def legacy_task_call(tool: str, *, task: bool = True) -> Message:
    params: dict[str, Any] = {"name": tool, "arguments": {}}
    if task:
        params["task"] = {"ttl": 1000}
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}


def outcome(upstream: UpstreamSupport, policy: ToolTaskPolicy, message: Message) -> str:
    """What becomes of a 2025-11-25 tools/call: hosted (a task the gateway runs), plain (the gateway
    forwards it as it is), pass-through (the upstream's to answer), or refused (its JSON-RPC code)."""
    hosting = who_hosts(upstream, policy, Era.LEGACY)
    if hosting.host is Host.UPSTREAM:
        return "pass-through"
    try:
        planned = plan_tool_call(policy, message, Era.LEGACY)
    except ProtocolError as refused:
        return f"refused {refused.code}"
    assert planned in (None, AT_ONCE)
    return "plain" if planned is None else "hosted"


def test_a_legacy_task_call_is_hosted_passed_through_or_refused() -> None:
    as_task, plain = legacy_task_call("t"), legacy_task_call("t", task=False)
    for upstream in WONT:
        assert outcome(upstream, OPTIONAL, as_task) == "hosted"
        assert outcome(upstream, REQUIRED, as_task) == "hosted"
        assert outcome(upstream, FORBIDDEN, as_task) == "refused -32601"
        assert outcome(upstream, OPTIONAL, plain) == outcome(upstream, FORBIDDEN, plain) == "plain"
        assert outcome(upstream, REQUIRED, plain) == "refused -32601"
    for upstream in RUNS:
        for policy in (FORBIDDEN, OPTIONAL, REQUIRED):
            assert outcome(upstream, policy, as_task) == outcome(upstream, policy, plain) == "pass-through"


def test_what_a_tools_list_entry_says() -> None:
    assert listed_support({"name": "a"}) is UpstreamSupport.FORBIDDEN  # unmarked: SEP-1686's default
    assert listed_support({"name": "a", "execution": {}}) is UpstreamSupport.FORBIDDEN
    assert listed_support({"name": "a", "execution": {"taskSupport": "forbidden"}}) is UpstreamSupport.FORBIDDEN
    assert listed_support({"name": "a", "execution": {"taskSupport": "optional"}}) is UpstreamSupport.OPTIONAL
    assert listed_support({"name": "a", "execution": {"taskSupport": "required"}}) is UpstreamSupport.REQUIRED
    assert listed_support({"name": "a", "execution": "odd"}) is UpstreamSupport.FORBIDDEN


def test_tools_list_shows_the_effective_support_and_keeps_the_rest() -> None:
    result = {
        "tools": [
            {"name": "mine", "execution": {"taskSupport": "forbidden", "other": 1}, "description": "d"},
            {"name": "theirs", "execution": {"taskSupport": "required"}},
            "not a tool",
        ],
        "nextCursor": "c",
    }

    def hosting_of(tool: dict[str, Any]) -> ToolHosting:
        return who_hosts(listed_support(tool), OPTIONAL, Era.LEGACY)

    assert with_task_support(result, hosting_of) == {
        "tools": [
            {"name": "mine", "execution": {"taskSupport": "optional", "other": 1}, "description": "d"},
            {"name": "theirs", "execution": {"taskSupport": "required"}},
            "not a tool",
        ],
        "nextCursor": "c",
    }
    assert with_task_support({"tools": "odd"}, hosting_of) == {"tools": "odd"}


# -- the task service in process: a SEP-1686 upstream that marks its tools --------------------------

MARKS = {"job": "forbidden", "research": "required"}
"""The scripted upstream's tools/list marks ("echo" is unmarked)."""


class MarkingUpstream(ScriptedUpstream):
    """The playbook's SEP-1686 upstream, with a tools/list (two pages) that marks each tool."""

    def _answer(self, message: Message) -> dict[str, Any] | None:
        if message["method"] != "tools/list":
            return super()._answer(message)
        cursor = message.get("params", {}).get("cursor")
        names = ["echo", "job"] if cursor is None else ["research"]
        tools = [
            {"name": name, **({"execution": {"taskSupport": MARKS[name]}} if name in MARKS else {})} for name in names
        ]
        return {"result": {"tools": tools, **({"nextCursor": "page2"} if cursor is None else {})}}


@pytest.fixture
async def marking() -> AsyncIterator[Gateway]:
    gateway = Gateway(Era.LEGACY, SEP_1686, upstream=MarkingUpstream(SEP_1686))
    assert gateway.session is not None and gateway.session.upstream_capabilities.tasks
    yield gateway
    await gateway.stop()


def gateway_lists(gateway: Gateway) -> list[Message]:
    return [message for message in gateway.upstream.received if str(message["id"]).startswith(LIST_ID_PREFIX)]


async def test_a_tool_the_upstream_forbids_becomes_a_gateway_task(marking: Gateway) -> None:
    message = marking.message("tools/call", {"name": "job", "arguments": {}, "task": {"ttl": 60000}})
    call, plan = await marking.plan(message)
    # The gateway asked for the upstream's whole list (both pages) to learn the tool's mark.
    assert [m["params"].get("cursor") for m in gateway_lists(marking)] == [None, "page2"]
    assert isinstance(plan, Reply) and call.resources_kept
    task = marking.registry.find(plan.message["result"]["task"]["taskId"])
    assert task is not None and HOSTED_ID.match(task.id) and task.record.upstream is None
    # The upstream got a plain call (no task request), with the gateway's progress token.
    (forwarded,) = [m for m in marking.upstream.forwarded() if m["method"] == "tools/call"]
    assert "task" not in forwarded["params"] and forwarded["params"]["_meta"]["progressToken"]

    # Requests naming it are the gateway's although the upstream has Tasks; a second call asks no list.
    get = marking.message("tasks/get", {"taskId": task.id})
    _, plan = await marking.plan(get)
    assert isinstance(plan, Reply) and plan.message["result"]["taskId"] == task.id
    await marking.end_task(task)
    _, plan = await marking.plan(marking.message("tasks/result", {"taskId": task.id}))
    assert isinstance(plan, Reply) and plan.message["result"]["content"] == ECHO["content"]
    _, plan = await marking.plan(marking.message("tools/call", {"name": "job", "arguments": {}, "task": {}}))
    assert isinstance(plan, Reply) and len(gateway_lists(marking)) == 2


async def test_a_tool_the_upstream_runs_as_a_task_stays_pass_through(marking: Gateway) -> None:
    message = marking.message("tools/call", {"name": "research", "arguments": {}, "task": {"ttl": 60000}})
    _, plan = await marking.plan(message)
    assert isinstance(plan, Forward) and plan.message == message
    final = await marking.forward(plan)
    assert final["result"]["task"]["taskId"] == f"{marking.upstream.tag}.u1"


async def test_an_unlisted_tool_is_left_to_the_upstream_and_a_plain_call_asks_nothing(marking: Gateway) -> None:
    _, plan = await marking.plan(marking.message("tools/call", {"name": "echo", "arguments": {}}))
    assert isinstance(plan, Forward) and gateway_lists(marking) == []  # a plain call: no list needed
    message = marking.message("tools/call", {"name": "elsewhere", "arguments": {}, "task": {}})
    _, plan = await marking.plan(message)
    assert isinstance(plan, Forward) and plan.message == message
    assert len(gateway_lists(marking)) == 2  # asked, not found: the upstream's to answer


async def test_a_forwarded_tools_list_shows_the_effective_support_and_teaches_the_marks(marking: Gateway) -> None:
    message = marking.message("tools/list", {})
    _, plan = await marking.plan(message)
    final = await marking.forward(plan)
    support = {tool["name"]: tool.get("execution", {}).get("taskSupport") for tool in final["result"]["tools"]}
    assert support == {"echo": "optional", "job": "optional"}  # the playbook's policy: optional for all
    _, plan = await marking.plan(marking.message("tools/call", {"name": "job", "arguments": {}, "task": {}}))
    assert isinstance(plan, Reply) and gateway_lists(marking) == []  # learned from the forwarded list


# -- the real server-everything behind the real gateway ------------------------------------------------

LONG = "trigger-long-running-operation"
RESEARCH = "simulate-research-query"
STEPS = 4
CONFIG = """
[[tasks.tools]]
match = "echo"
task_support = "forbidden"

[[tasks.tools]]
match = "*"
task_support = "optional"
modern = "after_ms"
after_ms = 500
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def everything() -> AsyncIterator[RunningGateway]:
    """One gateway for the module's server-everything tests: each CLI command is a session of its own."""
    async with start_gateway(upstream_cmd=[*node_command(), "stdio"], config_text=CONFIG) as gateway:
        yield gateway


async def runs_as_a_gateway_task(url: str, era: str) -> None:
    """`call trigger-long-running-operation --task --follow` in `era`: a gateway-hosted task whose log
    holds the tool's progress, one event per step, then its completion."""
    args = json.dumps({"duration": 2, "steps": STEPS})
    code, out, err = await cli("call", url, LONG, "--args", args, "--task", "--follow", "--era", era)
    assert code == 0, err
    assert out.splitlines()[-1] == f"Long running operation completed. Duration: 2 seconds, Steps: {STEPS}.", out
    started = re.search(r"task (\S+) started", err)
    assert started is not None, err
    task_id = started.group(1)
    assert re.fullmatch(r"[0-9a-f]{32}", task_id), task_id  # a gateway-hosted id (a pass-through one has a dot)

    code, out, err = await cli("tail", url, task_id, "--json", "--era", era)
    assert code == 0, err
    events = json_lines(out)
    kinds = [event["type"].rsplit(".", 2)[-2:] for event in events]
    created = events[0]["payload"]
    assert kinds[0] == ["task", "created"] and created["tool"] == LONG and "hostedBy" not in created, events[0]
    progress = [event["payload"] for event in events if event["type"].endswith(".progress")]
    assert [(p["progress"], p["total"]) for p in progress] == [(step, STEPS) for step in range(1, STEPS + 1)]
    assert kinds[-1] == ["task", "terminal"] and events[-1]["payload"]["status"] == "completed", events[-1]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_forbidden_tool_runs_as_a_gateway_task_with_its_progress(everything: RunningGateway, era: str) -> None:
    await runs_as_a_gateway_task(everything.url, era)


@pytest.mark.asyncio(loop_scope="module")
async def test_over_http_too(tmp_path: Path) -> None:
    """server-everything on Streamable HTTP: the gateway's own tools/list goes on the client's upstream
    session. (2025-11-25 only: this server answers no request without its initialize handshake.)"""
    async with http_upstream(tmp_path) as (url, _), start_gateway(upstream_url=url, config_text=CONFIG) as gateway:
        await runs_as_a_gateway_task(gateway.url, "legacy")


@pytest.mark.asyncio(loop_scope="module")
async def test_the_upstreams_own_task_tool_stays_pass_through(everything: RunningGateway) -> None:
    code, out, err = await cli("call", everything.url, RESEARCH, "--args", '{"topic": "kelp"}', "--task")
    assert code == 0, err
    assert re.fullmatch(r"[0-9a-f]{8}\.\S+", out.strip()), out  # `<channel tag>.<upstream id>`


@pytest.mark.asyncio(loop_scope="module")
async def test_a_tool_nobody_hosts_is_refused_as_a_task(everything: RunningGateway) -> None:
    code, out, err = await cli("call", everything.url, "echo", "--args", '{"message": "hi"}', "--task")
    assert (code, out) == (2, ""), err
    assert "-32601" in err and "must not be called as a task" in err, err


@pytest.mark.asyncio(loop_scope="module")
async def test_the_sdk_client_lists_the_effective_task_support(everything: RunningGateway) -> None:
    async with asyncio.timeout(60), Client(streamable_http_client(everything.url), mode="legacy", cache=None) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    support = {name: tool.execution.task_support if tool.execution else None for name, tool in tools.items()}
    assert support[LONG] == "optional", support  # the upstream says forbidden: the gateway hosts it
    assert support["echo"] == "forbidden", support  # the gateway's policy forbids it too
    # simulate-research-query (the upstream's own task tool, registered a moment after initialize) keeps
    # the upstream's entry: test_upstream_with_tasks.test_initialize_and_tools_list_keep_upstream_tasks.


@pytest.mark.asyncio(loop_scope="module")
async def test_a_modern_tools_list_shows_the_effective_task_support(
    everything: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(60):
        result = await WireClient(http, everything.url, MODERN).result("tools/list")
    support = {tool["name"]: tool.get("execution", {}).get("taskSupport") for tool in result["tools"]}
    assert support[LONG] == "optional" and support["echo"] == "forbidden", support
