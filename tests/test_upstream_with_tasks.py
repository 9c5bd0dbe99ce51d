"""The gateway in front of an upstream that already implements 2025-11-25 Tasks: it forwards them
and records each task's timeline, served by tasks/stream.

The upstream is the real `@modelcontextprotocol/server-everything` (version pinned in the Makefile,
installed by `make node_modules`), on stdio and on Streamable HTTP. Its `simulate-research-query` tool
is `execution.taskSupport: "required"` and runs four 1 s stages (see docs/notes/server-everything-wire.md).

Each behaviour is checked through the gateway and against a direct run of the same calls (raw pipes for
stdio, raw aiohttp for HTTP), compared after `normalized()`: it replaces task ids (`taskId`, also inside
`_meta["io.modelcontextprotocol/related-task"]`) and the `createdAt` / `lastUpdatedAt` timestamps with
placeholders, and nothing else. The gateway may add `eventStreams` inside `capabilities.tasks`.
Each task's tasks/stream is read by a client of its own after the task ended, so it is the retained
timeline a late client gets; its status events are the distinct status pushes the upstream sent.

Node and the package are not optional: without them every test fails with a message saying how to
install them (CI runs `make test`, which installs the package).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.client import GatewayClient
from gateway.client.tail import main as tail_main
from gateway.config import EventsConfig
from gateway.protocol.dialect import TASK_TOOL_KEY, TASK_UPSTREAM_KEY
from gateway.protocol.era import Era
from tests.conftest import (
    EXAMPLE_SERVER,
    READY_TIMEOUT,
    ROOT,
    STOP_TIMEOUT,
    free_port,
    start_gateway,
    stop_process,
    wait_for_port,
)
from tests.test_upstream_crash import descendants, kill_all
from tests.wire import LEGACY, Client, Message

PACKAGE = "@modelcontextprotocol/server-everything"
PACKAGE_DIR = ROOT / "node_modules" / "@modelcontextprotocol" / "server-everything"
ENTRY = PACKAGE_DIR / "dist" / "index.js"
TOOL = "simulate-research-query"
TASK_PARAMS = {"ttl": 60000}
CALL_TIMEOUT = 15.0
"""Seconds any single request may take (tasks/result waits out the tool's ~4 s of stages)."""

CLIENT_CAPABILITIES: dict[str, Any] = {"elicitation": {}}
"""Declared by every session here (direct and through the gateway): the tool only asks when it is."""

Call = Callable[[str, dict[str, Any] | None], Awaitable[Message]]
"""Send one request, return its JSON-RPC response (the final message)."""


def pinned_version() -> str:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^SERVER_EVERYTHING\s*:=\s*{re.escape(PACKAGE)}@(\S+)\s*$", text, re.MULTILINE)
    assert match, f"the Makefile pins no {PACKAGE} version (SERVER_EVERYTHING := {PACKAGE}@X)"
    return match.group(1)


def node_command() -> list[str]:
    """`node` and the package entry point, or fail the test saying how to get them."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"node is not on PATH: install Node.js 20+ and npm, then `make node_modules` ({PACKAGE})")
    wanted = pinned_version()
    manifest = PACKAGE_DIR / "package.json"
    if not manifest.is_file():
        pytest.fail(f"{PACKAGE}@{wanted} is not installed in {ROOT / 'node_modules'}: run `make node_modules`")
    installed = json.loads(manifest.read_text(encoding="utf-8")).get("version")
    if installed != wanted:
        pytest.fail(
            f"{PACKAGE} {installed} is installed but the Makefile pins {wanted}: "
            f"rm -rf node_modules && make node_modules"
        )
    return [node, str(ENTRY)]


_PLACEHOLDERS = {"taskId": "<taskId>", "createdAt": "<createdAt>", "lastUpdatedAt": "<lastUpdatedAt>"}


def normalized(value: Any) -> Any:
    """`value` with task ids and the two task timestamps replaced by placeholders (nothing else)."""
    if isinstance(value, dict):
        return {k: _PLACEHOLDERS[k] if k in _PLACEHOLDERS else normalized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


def body(message: Message) -> Any:
    """A response without its envelope: the result, or the error."""
    assert "result" in message or "error" in message, message
    return normalized(message.get("result", message.get("error")))


# -- the two ways to talk to the server directly --------------------------------------------------


class StdioDirect:
    """server-everything on raw stdio pipes: newline-delimited JSON-RPC, one request at a time."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.notifications: list[Message] = []
        self._next = 0

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Message:
        self._next += 1
        message: Message = {"jsonrpc": "2.0", "id": self._next, "method": method}
        if params is not None:
            message["params"] = params
        await self._write(message)
        async with asyncio.timeout(CALL_TIMEOUT):
            while True:
                line = await self.proc.stdout.readline()  # type: ignore[union-attr]
                assert line, f"server-everything closed stdout (exit {self.proc.returncode}) during {method}"
                received: Message = json.loads(line)
                if "method" not in received and received.get("id") == self._next:
                    return received
                assert "id" not in received, f"unexpected server request {received}"
                self.notifications.append(received)

    async def notify(self, method: str) -> None:
        await self._write({"jsonrpc": "2.0", "method": method})

    async def _write(self, message: Message) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()


@contextlib.asynccontextmanager
async def stdio_direct(tmp: Path) -> AsyncIterator[tuple[StdioDirect, Message]]:
    """An initialized direct stdio session; stderr goes to a file so no pipe can fill."""
    with (tmp / "direct-stdio.log").open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *node_command(),
            "stdio",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            limit=1 << 22,
        )
    try:
        direct = StdioDirect(proc)
        init = await direct.call("initialize", initialize_params())
        assert "result" in init, init
        await direct.notify("notifications/initialized")
        yield direct, init
    finally:
        await stop_process(proc)


@contextlib.asynccontextmanager
async def http_direct(http: aiohttp.ClientSession, url: str) -> AsyncIterator[tuple[Call, Message]]:
    """An initialized direct Streamable HTTP session (raw aiohttp via tests.wire.Client)."""
    client = Client(http, url, LEGACY)
    init = await asyncio.wait_for(client.initialize(CLIENT_CAPABILITIES), CALL_TIMEOUT)
    try:
        yield client_call(client), init
    finally:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await asyncio.wait_for(client.delete(), STOP_TIMEOUT)


def client_call(client: Client) -> Call:
    async def call(method: str, params: dict[str, Any] | None = None) -> Message:
        reply = await asyncio.wait_for(client.request(method, params), CALL_TIMEOUT)
        assert reply.status == 200, (method, reply.status, reply.messages)
        return reply.final

    return call


def initialize_params() -> dict[str, Any]:
    return {
        "protocolVersion": LEGACY,
        "capabilities": CLIENT_CAPABILITIES,
        "clientInfo": {"name": "wire", "version": "0"},
    }


@contextlib.asynccontextmanager
async def http_upstream(tmp: Path, port: int | None = None) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """server-everything in Streamable HTTP mode (`streamableHttp`, port from $PORT) on `port` (default:
    a free one): its URL and its process, stopped when the block exits."""
    port = port or free_port()
    with (tmp / "upstream-http.log").open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *node_command(),
            "streamableHttp",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PORT": str(port)},
            start_new_session=True,
        )
    try:
        await wait_for_port("127.0.0.1", port, READY_TIMEOUT)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        await stop_process(proc)


# -- one fixture: a gateway session and a direct session to the same kind of upstream -------------


class Pair:
    """One initialized session through the gateway and one straight to an upstream of the same kind."""

    def __init__(
        self,
        kind: str,
        url: str,
        base: str,
        client: Client,
        gateway_init: Message,
        direct: Call,
        direct_init: Message,
        direct_pushes: list[Message] | None,
    ) -> None:
        self.kind = kind
        self.url = url
        self.base = base
        """The gateway's own address (/metrics)."""
        self.client = client
        self.gateway = client_call(client)
        self.gateway_init = gateway_init
        self.direct = direct
        self.direct_init = direct_init
        self.direct_pushes = direct_pushes
        """What the direct stdio session received besides responses (None over HTTP)."""


def beside_the_build_server(command: list[str]) -> str:
    """A config with server-everything (`command`) as one of two `[[upstreams]]`, served on its own at
    /servers/everything/mcp: the per-path endpoint must be as faithful as the single one."""
    return (
        f'[[upstreams]]\nname = "everything"\ncommand = {json.dumps(command)}\n\n'
        f'[[upstreams]]\nname = "build"\ncommand = {json.dumps(EXAMPLE_SERVER)}\n'
    )


@pytest.fixture(params=["stdio", "http", "servers-path"])
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pair]:
    kind: str = request.param
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)))
        if kind in ("stdio", "servers-path"):
            if kind == "stdio":
                gw = await stack.enter_async_context(start_gateway(upstream_cmd=[*node_command(), "stdio"]))
            else:
                config = beside_the_build_server([*node_command(), "stdio"])
                gw = await stack.enter_async_context(start_gateway(config_text=config))
                gw.url = f"{gw.base}/servers/everything/mcp"
            stdio, direct_init = await stack.enter_async_context(stdio_direct(tmp_path))
            direct, pushes = stdio.call, stdio.notifications
        else:
            url, _ = await stack.enter_async_context(http_upstream(tmp_path))
            gw = await stack.enter_async_context(start_gateway(upstream_url=url))
            direct, direct_init = await stack.enter_async_context(http_direct(http, url))
            pushes = None
        client = Client(http, gw.url, LEGACY)
        init = await asyncio.wait_for(client.initialize(CLIENT_CAPABILITIES), CALL_TIMEOUT)
        yield Pair(kind, gw.url, gw.base, client, init, direct, direct_init, pushes)
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await asyncio.wait_for(client.delete(), STOP_TIMEOUT)


async def research_tool(call: Call) -> dict[str, Any]:
    """The tool's tools/list entry. The server registers it once `notifications/initialized` is handled,
    which a forwarded notification does not wait for, so tools/list is retried for up to 5 s."""
    deadline = time.monotonic() + 5.0
    while True:
        final = await call("tools/list", None)
        tools: dict[str, dict[str, Any]] = {tool["name"]: tool for tool in final["result"]["tools"]}
        if TOOL in tools or time.monotonic() >= deadline:
            assert TOOL in tools, sorted(tools)
            return tools[TOOL]
        await asyncio.sleep(0.1)


async def start_research(call: Call, topic: str, *, ambiguous: bool = False) -> Message:
    await research_tool(call)
    arguments = {"topic": topic, "ambiguous": True} if ambiguous else {"topic": topic}
    return await call("tools/call", {"name": TOOL, "arguments": arguments, "task": TASK_PARAMS})


async def timeline(url: str, task_id: str) -> list[dict[str, Any]]:
    """The task's whole retained log, read by a new client (tasks/stream from the start to its end)."""
    async with GatewayClient(url, era=Era.LEGACY) as client:
        async with asyncio.timeout(CALL_TIMEOUT):
            return [event async for event in client.stream(task_id)]


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """Event types without the vendor prefix (`task.status`, `input.requested`, ...)."""
    return [event["type"].removeprefix(EventsConfig().prefix + ".") for event in events]


def statuses(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """(status, statusMessage) of each task.status event."""
    return [
        (event["payload"]["status"], event["payload"].get("statusMessage"))
        for event in events
        if event["type"].endswith(".task.status")
    ]


def distinct_pushes(pushes: list[Message], task_id: str) -> list[tuple[str, str | None]]:
    """The task's status pushes as (status, statusMessage), each repeat of the one before dropped."""
    changes: list[tuple[str, str | None]] = []
    for push in pushes:
        params = push.get("params", {})
        if push.get("method") == "notifications/tasks/status" and params.get("taskId") == task_id:
            change = (params["status"], params.get("statusMessage"))
            if not changes or changes[-1] != change:
                changes.append(change)
    return changes


RESEARCH_STAGES = [
    ("working", "Gathering sources..."),
    ("working", "Analyzing content..."),
    ("working", "Synthesizing findings..."),
    ("working", "Generating report..."),
]


def check_log_shape(events: list[dict[str, Any]], terminal: str) -> None:
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert kinds(events)[0] == "task.created" and kinds(events)[-1] == "task.terminal", kinds(events)
    assert events[-1]["payload"]["status"] == terminal


# -- tests --------------------------------------------------------------------------------------


async def test_initialize_and_tools_list_keep_upstream_tasks(pair: Pair) -> None:
    upstream = pair.direct_init["result"]
    via_gateway = pair.gateway_init["result"]
    assert upstream["capabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    tasks = dict(via_gateway["capabilities"]["tasks"])
    tasks.pop("eventStreams", None)  # the one thing the gateway may add
    assert tasks == upstream["capabilities"]["tasks"]
    assert {**via_gateway, "capabilities": {}} == {**upstream, "capabilities": {}}
    assert {k: v for k, v in via_gateway["capabilities"].items() if k != "tasks"} == {
        k: v for k, v in upstream["capabilities"].items() if k != "tasks"
    }

    # tools/list (same session): simulate-research-query's execution.taskSupport as the upstream sent it.
    upstream, via_gateway = await asyncio.gather(research_tool(pair.direct), research_tool(pair.gateway))
    assert upstream["execution"] == {"taskSupport": "required"}
    assert via_gateway == upstream
    assert "ambiguous" in via_gateway["inputSchema"]["properties"]


async def test_task_augmented_call_completes_like_direct(pair: Pair) -> None:
    async def run(call: Call) -> dict[str, Any]:
        created = await start_research(call, "tides")
        task_id = created["result"]["task"]["taskId"]
        running = await call("tasks/get", {"taskId": task_id})
        result = await call("tasks/result", {"taskId": task_id})
        done = await call("tasks/get", {"taskId": task_id})
        listed = await call("tasks/list", None)
        return {
            "task_id": task_id,
            "created": created,
            "running": running,
            "result": result,
            "done": done,
            "listed": listed,
        }

    direct, gw = await asyncio.gather(run(pair.direct), run(pair.gateway))

    created = gw["created"]["result"]["task"]
    assert created["status"] == "working" and created["pollInterval"] == 1000, created
    assert isinstance(created["taskId"], str) and created["taskId"]
    assert body(gw["created"]) == body(direct["created"])

    running = gw["running"]["result"]
    assert running["taskId"] == gw["task_id"] and running["status"] == "working", running
    # Mid-run, only the shape is stable: statusMessage moves with the tool's 1 s stages.
    assert set(running) == set(direct["running"]["result"])

    final = gw["result"]["result"]
    assert final["content"][0]["type"] == "text" and "# Research Report: tides" in final["content"][0]["text"]
    assert final["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == gw["task_id"]
    assert body(gw["result"]) == body(direct["result"])

    assert gw["done"]["result"]["status"] == "completed"
    assert body(gw["done"]) == body(direct["done"])
    assert [t["taskId"] for t in gw["listed"]["result"]["tasks"]] == [gw["task_id"]]
    # The list comes from the gateway's records (never the upstream's, which shows every caller of the
    # gateway's upstream credential), and they hold what the upstream showed, but its `_meta`; each task's
    # `_meta` names its tool instead, and with several upstreams the upstream that runs it.
    listed = body(gw["listed"])
    meta = {TASK_TOOL_KEY: TOOL} | ({TASK_UPSTREAM_KEY: "everything"} if pair.kind == "servers-path" else {})
    assert [task.pop("_meta") for task in listed["tasks"]] == [meta]
    assert listed == {key: value for key, value in body(direct["listed"]).items() if key != "_meta"}

    # The timeline: every status change the upstream pushed, in order, then the terminal event.
    events = await timeline(pair.url, gw["task_id"])
    check_log_shape(events, "completed")
    assert statuses(events) == [*RESEARCH_STAGES, ("completed", "Generating report...")]
    if pair.direct_pushes is not None:
        assert statuses(events) == distinct_pushes(pair.direct_pushes, direct["task_id"])


async def test_tasks_cancel_stops_it_midway(pair: Pair) -> None:
    async def run(call: Call) -> dict[str, Any]:
        created = await start_research(call, "cancel me")
        task_id = created["result"]["task"]["taskId"]
        await asyncio.sleep(1.2)  # into the second of four 1 s stages
        cancelled = await call("tasks/cancel", {"taskId": task_id})
        await asyncio.sleep(3.0)  # past where the tool would have completed
        after = await call("tasks/get", {"taskId": task_id})
        result = await call("tasks/result", {"taskId": task_id})
        return {"task_id": task_id, "cancelled": cancelled, "after": after, "result": result}

    direct, gw = await asyncio.gather(run(pair.direct), run(pair.gateway))

    cancelled = gw["cancelled"]["result"]
    assert cancelled["taskId"] == gw["task_id"] and cancelled["status"] == "cancelled", cancelled
    assert body(gw["cancelled"]) == body(direct["cancelled"])
    assert gw["after"]["result"]["status"] == "cancelled"
    assert body(gw["after"]) == body(direct["after"])
    # The tool stored no result: the server answers tasks/result with an error, the same through the gateway.
    assert gw["result"]["error"]["code"] == direct["result"]["error"]["code"] == -32603
    # Free text is the upstream's own: it names the upstream's id, not the namespaced one clients see.
    upstream_id = gw["task_id"].split(".", 1)[1]
    assert body(gw["result"]) == {**body(direct["result"]), "message": f"Task {upstream_id} has no result stored"}
    assert direct["result"]["error"]["message"] == f"Task {direct['task_id']} has no result stored"

    # The upstream pushes nothing for a cancel: the cancelled status comes from the tasks/cancel answer.
    events = await timeline(pair.url, gw["task_id"])
    check_log_shape(events, "cancelled")
    observed = statuses(events)
    assert observed[:2] == RESEARCH_STAGES[:2] and observed[-1] == ("cancelled", "Client cancelled task execution.")
    assert len(observed) == 3, observed


async def test_ambiguous_query_elicits_through_the_gateway(pair: Pair) -> None:
    """`ambiguous: true`: the task goes input_required; tasks/result carries the server's
    elicitation/create; the answer POSTed to the gateway reaches the upstream and the task completes."""
    created = await start_research(pair.gateway, "python", ambiguous=True)
    task_id = created["result"]["task"]["taskId"]
    deadline = time.monotonic() + 6.0  # the tool asks at its third 1 s stage
    while (status := (await pair.gateway("tasks/get", {"taskId": task_id}))["result"]["status"]) == "working":
        assert time.monotonic() < deadline, "the task never left working"
        await asyncio.sleep(0.2)
    assert status == "input_required"

    reply = await pair.client.open("tasks/result", {"taskId": task_id})
    try:
        async with asyncio.timeout(CALL_TIMEOUT):
            elicitation = await reply.next()
            assert elicitation is not None and elicitation.get("method") == "elicitation/create", reply.messages
            params = elicitation["params"]
            assert params["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
            choices = params["requestedSchema"]["properties"]["interpretation"]["oneOf"]
            assert {"const": "snake", "title": "Python snake species"} in choices
            answer = {"jsonrpc": "2.0", "id": elicitation["id"], "result": {"action": "accept", "content": {}}}
            answer["result"]["content"] = {"interpretation": "snake"}
            sent = await pair.client.send(answer)
            await sent.response.read()
            sent.close()
            assert sent.status == 202
            await reply.rest()
    finally:
        reply.close()
    final = reply.final["result"]
    assert final["content"][0]["text"].startswith("# Research Report: python (snake)\n"), final
    assert (await pair.gateway("tasks/get", {"taskId": task_id}))["result"]["status"] == "completed"

    events = await timeline(pair.url, task_id)
    check_log_shape(events, "completed")
    order = kinds(events)
    asked, answered = order.index("input.requested"), order.index("input.answered")
    waiting = statuses(events).index(("input_required", events_status_message(events, "input_required")))
    assert statuses(events)[waiting - 1][0] == "working" and waiting >= 2
    assert asked < answered
    assert events[asked]["payload"]["method"] == "elicitation/create"
    assert events[asked]["payload"]["fields"] == ["interpretation"]
    assert events[answered]["payload"] == {
        "method": "elicitation/create",
        "requestId": elicitation["id"],
        "action": "accept",
        "fields": ["interpretation"],
    }
    assert statuses(events)[waiting + 1] == ("working", 'Continuing with interpretation: "snake"...')
    assert statuses(events)[-1][0] == "completed"


async def test_another_session_of_the_caller_answers_the_elicitation(pair: Pair) -> None:
    """The task lives on session A's upstream conversation; session B reads its tasks/result, gets the
    elicitation and answers it on B: the answer goes back to A's conversation and the task completes."""
    created = await start_research(pair.gateway, "python", ambiguous=True)
    task_id = created["result"]["task"]["taskId"]
    other = Client(pair.client.http, pair.url, LEGACY)
    await asyncio.wait_for(other.initialize(CLIENT_CAPABILITIES), CALL_TIMEOUT)
    reply = await other.open("tasks/result", {"taskId": task_id})
    try:
        async with asyncio.timeout(CALL_TIMEOUT):
            elicitation = await reply.next()
            assert elicitation is not None and elicitation.get("method") == "elicitation/create", reply.messages
            assert elicitation["params"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
            answer = {"jsonrpc": "2.0", "id": elicitation["id"], "result": {"action": "accept", "content": {}}}
            answer["result"]["content"] = {"interpretation": "comedy"}
            sent = await other.send(answer)
            await sent.response.read()
            sent.close()
            assert sent.status == 202
            await reply.rest()
    finally:
        reply.close()
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await asyncio.wait_for(other.delete(), STOP_TIMEOUT)
    assert reply.final["result"]["content"][0]["text"].startswith("# Research Report: python (comedy)\n")
    events = await timeline(pair.url, task_id)
    check_log_shape(events, "completed")
    assert kinds(events).count("input.answered") == 1


def events_status_message(events: list[dict[str, Any]], status: str) -> str | None:
    """The statusMessage of the first task.status event with `status`."""
    return next(change[1] for change in statuses(events) if change[0] == status)


async def test_the_timeline_is_complete_after_the_creating_session_is_gone(pair: Pair) -> None:
    """The client deletes its session right after starting the task: the gateway keeps the upstream
    conversation (and its listener) until the task ends, so the log still gets every status."""
    task_id = (await start_research(pair.gateway, "orphans"))["result"]["task"]["taskId"]
    assert await pair.client.delete() == 200
    events = await timeline(pair.url, task_id)  # a new client; the stream ends with the task
    check_log_shape(events, "completed")
    assert statuses(events) == [*RESEARCH_STAGES, ("completed", "Generating report...")]


async def watched_tasks(http: aiohttp.ClientSession, base: str) -> float:
    """The gateway's `mcp_gateway_upstream_tasks` gauge: pass-through tasks whose watcher still holds
    their upstream conversation open."""
    async with http.get(base + "/metrics") as response:
        text = await response.text()
    match = re.search(r"^mcp_gateway_upstream_tasks (\S+)$", text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


async def test_a_later_session_gets_the_outcome_after_the_creating_conversation_is_gone(pair: Pair) -> None:
    """The creating session is deleted mid-task, and its upstream conversation closes when the task ends:
    a new session of the same caller still gets tasks/get (completed) and tasks/result (both as a
    direct run's) and the whole stream, all from the task's record; `tail` exits 0. A 2026-07-28
    client of the same caller gets the same stream and result."""

    async def direct_run() -> tuple[Message, Message]:
        task_id = (await start_research(pair.direct, "outlived"))["result"]["task"]["taskId"]
        result = await pair.direct("tasks/result", {"taskId": task_id})
        return result, await pair.direct("tasks/get", {"taskId": task_id})

    direct = asyncio.create_task(direct_run())
    task_id = (await start_research(pair.gateway, "outlived"))["result"]["task"]["taskId"]
    assert await pair.client.delete() == 200
    events = await timeline(pair.url, task_id)  # a new session; the stream ends with the task
    async with asyncio.timeout(CALL_TIMEOUT):
        while True:  # the task's watcher ended: its conversation is closed (the channel refuses requests)
            if await watched_tasks(pair.client.http, pair.base) == 0:
                break
            await asyncio.sleep(0.05)
    direct_result, direct_done = await direct

    later = Client(pair.client.http, pair.url, LEGACY)
    await asyncio.wait_for(later.initialize(CLIENT_CAPABILITIES), CALL_TIMEOUT)
    try:
        call = client_call(later)
        done = await call("tasks/get", {"taskId": task_id})
        assert done["result"]["taskId"] == task_id and done["result"]["status"] == "completed", done
        assert body(done) == body(direct_done)
        result = await call("tasks/result", {"taskId": task_id})
        assert "# Research Report: outlived" in result["result"]["content"][0]["text"], result
        assert result["result"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
        assert body(result) == body(direct_result)
    finally:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await asyncio.wait_for(later.delete(), STOP_TIMEOUT)

    check_log_shape(events, "completed")
    assert statuses(events) == [*RESEARCH_STAGES, ("completed", "Generating report...")]
    text = result["result"]["content"][0]["text"]
    assert events[-1]["payload"]["content"] == [{"type": "text", "bytes": len(text)}]
    assert await timeline(pair.url, task_id) == events  # from another session again: the same whole log
    assert await asyncio.to_thread(tail_main, pair.url, task_id) == 0  # what `mcp-task-gateway tail` runs

    # A task belongs to its caller, not to an era: a 2026-07-28 client gets the same log and outcome.
    async with GatewayClient(pair.url, era=Era.MODERN) as modern, asyncio.timeout(CALL_TIMEOUT):
        assert [event async for event in modern.stream(task_id)] == events
        assert normalized(await modern.task_result(task_id)) == normalized(result["result"])
    assert await asyncio.to_thread(tail_main, pair.url, task_id, era="modern") == 0


async def followed_through(url: str, task_id: str, kill: Callable[[], None]) -> list[dict[str, Any]]:
    """Follow the task's tasks/stream from the start, `kill` the upstream 1.3 s in (its second stage),
    and return what the stream delivered before it ended (with the empty result: it raises otherwise)."""
    async with GatewayClient(url, era=Era.LEGACY) as watcher:
        live: list[dict[str, Any]] = []

        async def follow() -> None:
            async for event in watcher.stream(task_id):
                live.append(event)

        following = asyncio.create_task(follow())
        await asyncio.sleep(1.3)
        kill()
        async with asyncio.timeout(CALL_TIMEOUT):
            await following
    return live


async def test_upstream_killed_mid_task_fails_it(tmp_path: Path) -> None:
    """The stdio upstream dies while its task runs: the task's log ends with a terminal `failed` naming
    the cause, an open tasks/stream ends with the empty result, and the gateway keeps serving."""
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)))
        gw = await stack.enter_async_context(start_gateway(upstream_cmd=[*node_command(), "stdio"]))
        client = Client(http, gw.url, LEGACY)
        await asyncio.wait_for(client.initialize(CLIENT_CAPABILITIES), CALL_TIMEOUT)
        call = client_call(client)
        created = await start_research(call, "doomed")
        task_id = created["result"]["task"]["taskId"]

        live = await followed_through(gw.url, task_id, lambda: kill_all(descendants(gw.proc.pid)))
        check_log_shape(live, "failed")
        failed = [event for event in live if event["type"].endswith(".task.status")][-1]["payload"]
        assert failed["status"] == "failed" and "upstream process exited" in failed["statusMessage"], failed
        assert live[-1]["payload"]["error"]["message"] == failed["statusMessage"]
        assert await timeline(gw.url, task_id) == live
        # The gateway is up and the session goes on with a respawned upstream.
        assert gw.proc.returncode is None
        assert "tools" in (await call("tools/list", None))["result"]
        # The respawned process never had the task: the gateway's record of how it ended answers.
        view = (await call("tasks/get", {"taskId": task_id}))["result"]
        assert view["taskId"] == task_id and view["status"] == "failed"
        assert view["statusMessage"] == failed["statusMessage"]
        outcome = await call("tasks/result", {"taskId": task_id})
        assert outcome["error"]["code"] == -32603 and outcome["error"]["message"] == failed["statusMessage"]


async def test_http_upstream_killed_mid_task_fails_it(tmp_path: Path) -> None:
    """The HTTP upstream dies while its task runs: pushes stop, the gateway's polls fail, and after
    three in a row the task ends `failed`, naming why; streams end, the gateway stays up."""
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)))
        url, upstream = await stack.enter_async_context(http_upstream(tmp_path))
        gw = await stack.enter_async_context(start_gateway(upstream_url=url))
        client = Client(http, gw.url, LEGACY)
        await asyncio.wait_for(client.initialize(CLIENT_CAPABILITIES), CALL_TIMEOUT)
        task_id = (await start_research(client_call(client), "doomed"))["result"]["task"]["taskId"]

        live = await followed_through(gw.url, task_id, upstream.kill)
        check_log_shape(live, "failed")
        failed = statuses(live)[-1]
        assert failed[0] == "failed" and failed[1] is not None, failed
        assert failed[1].startswith("tasks/get failed 3 times in a row: upstream unreachable"), failed
        assert gw.proc.returncode is None
        async with http.get(f"{gw.base}/healthz") as health:
            assert health.status == 200
