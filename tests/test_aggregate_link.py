"""The aggregate link over real upstream subprocesses: the example build server, the 2025-11-25 tasks
test server and mcp-server-time, each a `StdioUpstream`, together one `AggregateUpstream`.

Driven the way the gateway's layers above drive a link: a legacy session through `open_session()`
(initialize, notifications/initialized, requests, the unsolicited handler), 2026-07-28 requests
through `stateless()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.config import HttpUpstreamConfig, StdioConfig
from gateway.metrics import Metrics
from gateway.protocol.dialect import MODERN
from gateway.protocol.era import SERVER_INFO_KEY, TASKS_EXTENSION
from gateway.protocol.jsonrpc import Message
from gateway.tasks.task_ids import map_task_ids
from gateway.upstream.aggregate.link import AggregateUpstream
from gateway.upstream.base import Exchange, Upstream, UpstreamChannel
from gateway.upstream.http import HttpUpstream
from gateway.upstream.stdio import StdioUpstream

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
BUILD = [PYTHON, str(ROOT / "examples" / "build_server.py")]
TASKS = [PYTHON, str(ROOT / "tests" / "servers" / "legacy_tasks_server.py")]
MODERN_TASKS = [PYTHON, str(ROOT / "tests" / "servers" / "modern_tasks_server.py")]
MODERN_CLIENT = {"elicitation": {"form": {}}, "extensions": {TASKS_EXTENSION: {}}}
TIME = [PYTHON, "-m", "mcp_server_time", "--local-timezone", "UTC"]
WAIT_S = 20.0
CLIENT_INIT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"elicitation": {}},
    "clientInfo": {"name": "aggregate-test", "version": "1"},
}

try:
    import mcp_server_time  # noqa: F401

    HAVE_TIME = True
except ImportError:  # pragma: no cover - the venv has it; the time server is then left out
    HAVE_TIME = False


@contextlib.asynccontextmanager
async def _aggregate(idle_processes: int, *, modern_tasks: bool = False) -> AsyncIterator[AggregateUpstream]:
    """The aggregate over the three servers (and the 2026-07-28 tasks server). Legacy sessions need no
    idle pool; 2026-07-28 requests keep one process per upstream (with none, each is stopped in the
    background after its request)."""
    config = StdioConfig(idle_processes=idle_processes)
    upstreams = {"build": StdioUpstream(BUILD, config, Metrics()), "tasks": StdioUpstream(TASKS, config, Metrics())}
    if HAVE_TIME:
        upstreams["time"] = StdioUpstream(TIME, config, Metrics())
    if modern_tasks:
        upstreams["mtasks"] = StdioUpstream(MODERN_TASKS, config, Metrics())
    await asyncio.gather(*(upstream.start() for upstream in upstreams.values()))
    link = AggregateUpstream(upstreams, "__", timeout_s=WAIT_S)
    await link.start()
    try:
        yield link
    finally:
        await link.close()
        # A stdio process whose request was cancelled is stopped in the background, and the link's
        # close() cancels that stop, leaving the process's transport to be collected after the loop
        # closed: wait for those stops first.
        background = [task for upstream in upstreams.values() for task in upstream._background]
        if background:
            await asyncio.wait(background, timeout=WAIT_S)
        await asyncio.gather(*(upstream.close() for upstream in upstreams.values()))


@pytest.fixture
async def aggregate() -> AsyncIterator[AggregateUpstream]:
    async with _aggregate(idle_processes=0) as link:
        yield link


class Client:
    """A legacy session on the aggregate, as the gateway's session layer holds it."""

    def __init__(self, channel: UpstreamChannel) -> None:
        self.channel = channel
        self.unsolicited: asyncio.Queue[Message] = asyncio.Queue()
        channel.set_unsolicited_handler(self._unsolicited)
        self._ids = iter(range(1, 10_000))

    async def _unsolicited(self, message: Message, size: int) -> None:
        await self.unsolicited.put(message)

    def message(self, method: str, params: Mapping[str, Any] | None = None) -> Message:
        return {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": dict(params or {})}

    async def send(self, method: str, params: Mapping[str, Any] | None = None) -> Exchange:
        return await self.channel.request(self.message(method, params), {})

    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> list[Message]:
        exchange = await self.send(method, params)
        async with asyncio.timeout(WAIT_S):
            return await exchange.collect()

    async def result(self, method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        final = (await self.call(method, params))[-1]
        assert "result" in final, final
        return final["result"]  # type: ignore[no-any-return]

    async def error(self, method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        final = (await self.call(method, params))[-1]
        assert "error" in final, final
        return final["error"]  # type: ignore[no-any-return]

    async def initialize(self) -> dict[str, Any]:
        result = await self.result("initialize", CLIENT_INIT)
        await self.channel.notify({"jsonrpc": "2.0", "method": "notifications/initialized"}, {})
        return result


@pytest.fixture
async def client(aggregate: AggregateUpstream) -> AsyncIterator[Client]:
    channel = await aggregate.open_session()
    try:
        yield Client(channel)
    finally:
        await channel.close()


async def _all_tools(client: Client) -> tuple[list[str], int]:
    names: list[str] = []
    pages = 0
    params: dict[str, Any] = {}
    while True:
        result = await client.result("tools/list", params)
        pages += 1
        names += [tool["name"] for tool in result["tools"]]
        if "nextCursor" not in result:
            return names, pages
        params = {"cursor": result["nextCursor"]}


async def test_initialize_merges_every_upstreams_answer(aggregate: AggregateUpstream, client: Client) -> None:
    result = await client.initialize()
    assert result["protocolVersion"] == "2025-11-25"
    assert result["serverInfo"]["name"] == "mcp-task-gateway"
    capabilities = result["capabilities"]
    assert "tools" in capabilities and "prompts" in capabilities  # the build server's
    assert "list" in capabilities["tasks"]  # the tasks server's
    assert "completions" in capabilities and "resources" in capabilities
    assert result["instructions"].startswith("## build\n\nA build and test runner.")
    assert (await client.result("ping")) == {}
    assert sorted(client.channel.upstream_sessions) == sorted(aggregate.upstreams)  # type: ignore[attr-defined]


async def test_a_later_session_opens_an_upstream_session_only_when_it_uses_that_upstream(
    aggregate: AggregateUpstream, client: Client
) -> None:
    first = await client.initialize()
    later = Client(await aggregate.open_session())
    try:
        assert await later.initialize() == first  # what the first session learnt, without asking again
        assert later.channel.upstream_sessions == []  # type: ignore[attr-defined]
        echoed = await later.result("tools/call", {"name": "tasks__echo", "arguments": {"text": "lazy"}})
        assert "lazy" in echoed["content"][0]["text"]
        assert later.channel.upstream_sessions == ["tasks"]  # type: ignore[attr-defined]
        # Idle, it gives its upstream process back, and takes one again (the handshake replayed) to go on.
        assert await later.channel.park()
        await later.channel.resume()
        echoed = await later.result("tools/call", {"name": "tasks__echo", "arguments": {"text": "resumed"}})
        assert "resumed" in echoed["content"][0]["text"]
    finally:
        await later.channel.close()


async def test_tools_list_is_every_upstreams_list_prefixed_in_one_page(client: Client) -> None:
    await client.initialize()
    names, pages = await _all_tools(client)
    assert pages == 1  # each upstream's first page is its whole list: asked at once, one page
    assert {"build__echo", "build__run_tests", "tasks__slow_job", "tasks__echo"} <= set(names)
    if HAVE_TIME:
        assert "time__get_current_time" in names
    assert [name.split("__", 1)[0] for name in names] == sorted(
        (name.split("__", 1)[0] for name in names), key=["build", "tasks", "time"].index
    )  # in configured order


async def test_a_forged_cursor_is_invalid_params(client: Client) -> None:
    await client.initialize()
    error = await client.error("tools/list", {"cursor": "garbage!"})
    assert error["code"] == -32602
    assert error["message"].startswith("Invalid params: the cursor is not one this server gave out")


async def test_a_tool_call_is_routed_with_its_progress_in_the_exchange(client: Client) -> None:
    await client.initialize()
    params = {"name": "build__run_tests", "arguments": {"count": 3, "delay": 0.01}, "_meta": {"progressToken": "p1"}}
    messages = await client.call("tools/call", params)
    progress = [m for m in messages if m.get("method") == "notifications/progress"]
    assert [m["params"]["progress"] for m in progress] == [1, 2, 3]
    assert all(m["params"]["progressToken"] == "p1" for m in progress)
    assert any(m.get("method") == "notifications/message" for m in messages)
    final = messages[-1]
    assert final["id"] == 2 and "unit: 2 passed, 1 failed" in final["result"]["content"][0]["text"]
    echoed = await client.result("tools/call", {"name": "tasks__echo", "arguments": {"text": "hi"}})
    assert "hi" in echoed["content"][0]["text"]


async def test_an_unknown_prefix_is_invalid_params_naming_the_tool(client: Client) -> None:
    await client.initialize()
    error = await client.error("tools/call", {"name": "nope__echo", "arguments": {}})
    assert error == {"code": -32602, "message": "Invalid params: unknown tool 'nope__echo'"}
    error = await client.error("prompts/get", {"name": "review_code"})
    assert error["code"] == -32602 and "unknown prompt 'review_code'" in error["message"]


async def test_resources_are_read_from_the_upstream_that_listed_them(client: Client) -> None:
    await client.initialize()
    # Before any list: the first upstream that can read it answers.
    read = await client.result("resources/read", {"uri": "build://logs/1002"})
    assert "1002" in read["contents"][0]["text"]
    listed = await client.result("resources/list")
    assert "build://logs/latest" in [resource["uri"] for resource in listed["resources"]]
    read = await client.result("resources/read", {"uri": "build://logs/latest"})
    assert read["contents"][0]["uri"] == "build://logs/latest"
    templates = await client.result("resources/templates/list")
    assert "build://logs/{build_id}" in [t["uriTemplate"] for t in templates["resourceTemplates"]]
    read = await client.result("resources/read", {"uri": "build://logs/1001"})
    assert "1001" in read["contents"][0]["text"]
    error = await client.error("resources/read", {"uri": "nowhere://x"})
    assert error["code"] in (-32002, -32602)


async def test_prompts_and_completions_route_by_the_prefixed_prompt(
    aggregate: AggregateUpstream, client: Client
) -> None:
    await client.initialize()
    prompts = await client.result("prompts/list")
    assert "build__review_code" in [prompt["name"] for prompt in prompts["prompts"]]
    assert "nextCursor" not in prompts  # an upstream without prompts (mcp-server-time) adds none
    prompt = await client.result("prompts/get", {"name": "build__review_code", "arguments": {"code": "x = 1"}})
    assert "x = 1" in str(prompt["messages"])
    completion = await client.result(
        "completion/complete",
        {"ref": {"type": "ref/prompt", "name": "build__review_code"}, "argument": {"name": "language", "value": "py"}},
    )
    assert "python" in completion["completion"]["values"]
    assert await client.result("logging/setLevel", {"level": "debug"}) == {}


async def test_a_server_request_is_relayed_and_its_answer_reaches_the_upstream(client: Client) -> None:
    await client.initialize()
    exchange = await client.send("tools/call", {"name": "build__ask_user", "arguments": {"question": "Name?"}})
    async with asyncio.timeout(WAIT_S):
        batch = await exchange.next_batch()
        while batch is not None and not any(m.get("method") == "elicitation/create" for m in batch):
            batch = await exchange.next_batch()
    assert batch is not None
    (elicit,) = [m for m in batch if m.get("method") == "elicitation/create"]
    assert str(elicit["id"]).startswith("build__")
    answer = {"jsonrpc": "2.0", "id": elicit["id"], "result": {"action": "accept", "content": {"answer": "Ada"}}}
    await client.channel.respond(answer, {})
    async with asyncio.timeout(WAIT_S):
        final = (await exchange.collect())[-1]
    assert "user said: Ada" in final["result"]["content"][0]["text"]


async def test_an_unusable_upstream_leaves_the_lists_and_its_calls_name_it(
    aggregate: AggregateUpstream, client: Client
) -> None:
    capabilities = (await client.initialize())["capabilities"]
    await client.result("resources/list")
    down: set[str] = set()
    aggregate.usable = lambda name: name not in down
    down.add("build")
    await aggregate.upstream_changed("build")
    # tools/list_changed always; the others where the merged capabilities say those lists change.
    expected = {"notifications/tools/list_changed"} | {
        f"notifications/{key}/list_changed" for key in ("prompts", "resources") if capabilities[key].get("listChanged")
    }
    notes = [await asyncio.wait_for(client.unsolicited.get(), WAIT_S) for _ in expected]
    assert {note["method"] for note in notes} == expected
    assert client.unsolicited.empty()
    names, _ = await _all_tools(client)
    assert names and not any(name.startswith("build__") for name in names)
    error = await client.error("tools/call", {"name": "build__echo", "arguments": {"text": "x"}})
    assert error == {"code": -32602, "message": "Invalid params: upstream 'build' is unavailable"}
    assert "build://logs/latest" not in str(await client.result("resources/list"))
    error = await client.error("resources/read", {"uri": "build://logs/latest"})  # its owner was learnt before
    assert error == {"code": -32602, "message": "Invalid params: upstream 'build' is unavailable"}
    down.clear()
    await aggregate.upstream_changed("build")
    assert (await asyncio.wait_for(client.unsolicited.get(), WAIT_S))["method"] == "notifications/tools/list_changed"
    names, _ = await _all_tools(client)
    assert "build__echo" in names


async def test_a_task_created_upstream_gets_a_prefixed_id_that_routes_back(client: Client) -> None:
    await client.initialize()
    tapped: list[tuple[str | None, Message]] = []

    async def tap(channel: UpstreamChannel, method: str | None, message: Message) -> Message:
        assert channel is client.channel
        tapped.append((method, message))
        return message

    client.channel.tap = tap
    params = {"name": "tasks__slow_job", "arguments": {"steps": 2, "delay": 0.05}, "task": {"ttl": 60000}}
    created = await client.result("tools/call", params)
    task_id = created["task"]["taskId"]
    assert task_id.startswith("tasks__")
    assert tapped[-1][1]["result"]["task"]["taskId"] == task_id  # the tap sees the aggregate's id
    got = await client.result("tasks/get", {"taskId": task_id})
    assert got["taskId"] == task_id and got["status"] in ("working", "completed")
    outcome = await client.result("tasks/result", {"taskId": task_id})
    assert "done after 2 steps" in str(outcome)
    error = await client.error("tasks/get", {"taskId": "nobody__1"})
    assert error["code"] == -32602


async def test_modern_requests_route_through_the_upstreams_stateless_channels() -> None:
    async with _aggregate(idle_processes=1, modern_tasks=True) as aggregate:
        await _modern_requests(aggregate)


async def _per_path_tap(channel: UpstreamChannel, method: str | None, message: Message) -> Message:
    """What the task service of the upstream's own endpoint sets on the channels it uses."""
    return map_task_ids(message, method, lambda task_id: f"{channel.tag}.{task_id}")


async def _modern_requests(aggregate: AggregateUpstream) -> None:
    async def ask(method: str, params: dict[str, Any], affinity: str | None = None) -> list[Message]:
        message, headers = MODERN.gateway_request(f"m-{method}", method, params, MODERN_CLIENT)
        async with aggregate.stateless(affinity) as channel:
            exchange = await channel.request(message, headers)
            async with asyncio.timeout(WAIT_S):
                return await exchange.collect()

    discovered = (await ask("server/discover", {}))[-1]["result"]
    assert discovered["supportedVersions"] == ["2026-07-28"]
    assert discovered["capabilities"]["tools"]["listChanged"] is True  # the build server's, at 2026-07-28
    params = {"name": "build__run_tests", "arguments": {"count": 2, "delay": 0.01}, "_meta": {"progressToken": 7}}
    messages = await ask("tools/call", params)
    assert [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"] == [1, 2]
    assert "unit: 2 passed" in messages[-1]["result"]["content"][0]["text"]
    assert messages[-1]["result"]["_meta"][SERVER_INFO_KEY]["name"] == "mcp-task-gateway"
    listed = (await ask("tools/list", {}))[-1]["result"]
    assert "build__echo" in [tool["name"] for tool in listed["tools"]]
    # A multi-round-trip call: its requestState is the build server's, prefixed, and its retry
    # (entered with that state as the affinity, as the gateway does) reaches the build server again.
    deploy = {"name": "build__deploy", "arguments": {"environment": "staging", "steps": 1, "delay": 0}}
    asked_final = (await ask("tools/call", deploy))[-1]
    assert "result" in asked_final, asked_final
    asked = asked_final["result"]
    assert asked["resultType"] == "input_required" and asked["requestState"].startswith("build__")
    answers = {key: {"action": "accept", "content": {"confirm": True}} for key in asked["inputRequests"]}
    retry = {**deploy, "requestState": asked["requestState"], "inputResponses": answers}
    done = (await ask("tools/call", retry, asked["requestState"]))[-1]["result"]
    assert done["content"][0]["text"] == "deployed to staging"
    # A task the 2026-07-28 tasks server creates: its id prefixed, pinned as the gateway pins it
    # (its own id for the task, `tag.upstream-id`), and its tasks/get routed back with the prefix stripped.
    # The upstream's own endpoint shares its pooled channel, and its task service taps it (naming tasks
    # `<channel tag>.<id>` for its own clients): the aggregate's ids must not carry that name.
    async with aggregate.upstreams["mtasks"].stateless() as shared:
        shared.tap = _per_path_tap
    message, headers = MODERN.gateway_request("m-create", "tools/call", {"name": "mtasks__slow_job", "arguments": {}})
    async with aggregate.stateless() as channel:
        created = (await (await channel.request(message, headers)).collect())[-1]["result"]
        assert created["resultType"] == "task" and created["taskId"].startswith("mtasks__"), created
        assert "." not in created["taskId"] and shared.tap is _per_path_tap  # the same pooled channel
        gateway_task_id = f"{channel.tag}.{created['taskId']}"
        aggregate.pin(gateway_task_id, channel)
    for _ in range(100):
        got = (await ask("tasks/get", {"taskId": created["taskId"]}, gateway_task_id))[-1]
        assert got["result"]["taskId"] == created["taskId"], got
        if got["result"]["status"] == "completed":
            break
        await asyncio.sleep(0.1)
    assert got["result"]["status"] == "completed"
    # A listen: one per upstream, one acknowledgement (the union), the task's pushes prefixed, and the
    # aggregate's own list_changed when an upstream comes or goes.
    slow = {"name": "mtasks__slow_job", "arguments": {"steps": 4, "delay": 0.3}}
    message, headers = MODERN.gateway_request("m-slow", "tools/call", slow, MODERN_CLIENT)
    async with aggregate.stateless() as channel:
        task_id = (await (await channel.request(message, headers)).collect())[-1]["result"]["taskId"]
        aggregate.pin(f"{channel.tag}.{task_id}", channel)
    filters = {"toolsListChanged": True, "taskIds": [task_id]}
    message, headers = MODERN.gateway_request(
        "m-listen", "subscriptions/listen", {"notifications": filters}, MODERN_CLIENT
    )
    async with aggregate.stateless(f"{aggregate.modern_tag}.{task_id}") as channel:
        stream = await channel.request(message, headers)
        seen: list[Message] = []

        async def until(found: Callable[[Message], bool]) -> Message:
            async with asyncio.timeout(WAIT_S):
                while True:
                    for message in seen:
                        if found(message):
                            return message
                    batch = await stream.next_batch()
                    assert batch is not None, seen
                    seen.extend(batch)

        ack = await until(lambda m: m.get("method") == "notifications/subscriptions/acknowledged")
        assert ack["params"]["notifications"] == {"toolsListChanged": True, "taskIds": [task_id]}
        assert seen[0] is ack  # the first message of the stream, and the only acknowledgement
        pushed = await until(lambda m: m.get("method") == "notifications/tasks")
        assert pushed["params"]["taskId"] == task_id
        await aggregate.upstream_changed("build")
        changed = await until(lambda m: m.get("method") == "notifications/tools/list_changed")
        assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "m-listen"
        assert [m.get("method") for m in seen].count("notifications/subscriptions/acknowledged") == 1
        await stream.cancel()
    await aggregate.upstream_changed("build")  # a listen whose client has gone hears nothing more
    assert await stream.next_batch() is None


SILENT = [PYTHON, "-c", "import sys\nfor line in sys.stdin:\n    pass\n"]
"""An upstream that reads everything and never answers: a hung server."""


async def test_a_hanging_upstream_is_left_out_and_slows_no_call_routed_elsewhere() -> None:
    upstreams = {
        "hung": StdioUpstream(SILENT, StdioConfig(idle_processes=0, acquire_timeout_s=0.5), Metrics()),
        "build": StdioUpstream(BUILD, StdioConfig(idle_processes=0), Metrics()),
    }
    aggregate = AggregateUpstream(upstreams, "__", timeout_s=10.0)  # long enough for a cold build server
    client = Client(await aggregate.open_session())
    try:
        result = await client.initialize()  # within timeout_s: the hung upstream is left out
        assert result["instructions"].startswith("## build") and "## hung" not in result["instructions"]
        hung_call = await client.send("tools/call", {"name": "hung__anything", "arguments": {}})
        echoed = await client.result("tools/call", {"name": "build__echo", "arguments": {"text": "still here"}})
        assert "still here" in echoed["content"][0]["text"]
        assert not hung_call.finished  # the build call was answered while the hung one still waits
        async with asyncio.timeout(WAIT_S):
            final = (await hung_call.collect())[-1]
        assert final["error"]["message"] == "upstream 'hung' did not answer initialize"
    finally:
        await client.channel.close()
        await aggregate.close()
        await asyncio.gather(*(upstream.close() for upstream in upstreams.values()))


async def test_an_http_upstream_beside_a_stdio_one(example_http_url: str) -> None:
    """The example server over Streamable HTTP: its calls routed in both eras, and a list change it
    announces on its session's GET stream reaching the aggregate session's client."""
    upstreams: dict[str, Upstream] = {
        "web": HttpUpstream(example_http_url, HttpUpstreamConfig(), Metrics()),
        "tasks": StdioUpstream(TASKS, StdioConfig(idle_processes=0), Metrics()),
    }
    await asyncio.gather(*(upstream.start() for upstream in upstreams.values()))
    aggregate = AggregateUpstream(upstreams, "__", timeout_s=WAIT_S)
    client = Client(await aggregate.open_session())
    try:
        await client.initialize()
        params = {"name": "web__run_tests", "arguments": {"count": 2, "delay": 0.01}, "_meta": {"progressToken": "w"}}
        messages = await client.call("tools/call", params)
        assert [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"] == [1, 2]
        # The GET stream opens after notifications/initialized; an announcement before it is lost.
        heard = None
        for _ in range(20):
            await client.result("tools/call", {"name": "web__announce", "arguments": {}})
            with contextlib.suppress(TimeoutError):
                heard = await asyncio.wait_for(client.unsolicited.get(), 0.5)
                break
        assert heard is not None and heard["method"] == "notifications/tools/list_changed"
        message, headers = MODERN.gateway_request("m", "tools/call", {"name": "web__echo", "arguments": {"text": "w"}})
        async with aggregate.stateless() as channel:
            async with asyncio.timeout(WAIT_S):
                final = (await (await channel.request(message, headers)).collect())[-1]
        assert final["result"]["content"][0]["text"] == "w"
    finally:
        await client.channel.close()
        await aggregate.close()
        await asyncio.gather(*(upstream.close() for upstream in upstreams.values()))
