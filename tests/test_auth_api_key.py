"""`[auth] mode = "api_key"` end to end: the real gateway in front of the example server.

Two principals, A and B (each an api key), against one gateway: the 401/400 shapes and the
protected-resource metadata, the open health endpoints, the official SDK client sending its key in
both eras, per-tool scopes (hidden from tools/list, 403 on call), and the matrix: every task method of
B on A's task answers byte for byte like one on a random id, in both eras, for hosted tasks and for
pass-through tasks (server-everything, 2025-11-25; the native example server, both eras); A's
tasks/list shows the task (from every session of A) and B's does not, not even under another id; and
A's session id is 404 for B. The client's key never reaches the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.conftest import EXAMPLE_SERVER, RunningGateway, serve_http, start_gateway
from tests.test_cli_tasks import cli, one_line
from tests.test_http_upstream import scripted
from tests.test_native_stream_server import NATIVE
from tests.test_upstream_with_tasks import TOOL as EVERYTHING_TOOL
from tests.test_upstream_with_tasks import node_command
from tests.wire import LEGACY, MODERN
from tests.wire import Client as WireClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY_A = "key-a-0123456789"
KEY_B = "key-b-0123456789"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


TWO_KEYS = f"""
[auth]
mode = "api_key"

[[auth.api_keys]]
name = "a"
sha256 = "{digest(KEY_A)}"

[[auth.api_keys]]
name = "b"
sha256 = "{digest(KEY_B)}"
"""
"""Principals a and b, no scopes: what tests about who owns what need."""


CONFIG = f"""
[auth]
mode = "api_key"
scopes_supported = ["deploy"]

[[auth.api_keys]]
name = "a"
sha256 = "{digest(KEY_A)}"
scopes = ["deploy"]

[[auth.api_keys]]
name = "b"
sha256 = "{digest(KEY_B)}"

[[auth.rules]]
match = "deploy"
scopes = ["deploy"]
hide = true

[[tasks.tools]]
match = "*"
task_support = "optional"
modern = "after_ms"
after_ms = 300
"""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw() -> AsyncIterator[RunningGateway]:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=CONFIG) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http_a() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers=bearer(KEY_A), timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http_b() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers=bearer(KEY_B), timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def metadata_url(gw: RunningGateway) -> str:
    return f"{gw.base}/.well-known/oauth-protected-resource/mcp"


# -- who is calling -------------------------------------------------------------------------------


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_no_key_gets_401_with_the_challenge_and_a_wrong_key_invalid_token(
    gw: RunningGateway, http: aiohttp.ClientSession, era: str
) -> None:
    client = WireClient(http, gw.url, era)
    bare = await client.request("tools/list")
    assert bare.status == 401, bare.messages
    assert bare.headers["WWW-Authenticate"] == f'Bearer resource_metadata="{metadata_url(gw)}", scope="deploy"'
    assert bare.final["error"]["data"] == {"reason": "unauthorized"}

    wrong = await client.request("tools/list", headers=bearer("not-a-key"))
    assert wrong.status == 401, wrong.messages
    challenge = wrong.headers["WWW-Authenticate"]
    assert challenge.startswith(f'Bearer resource_metadata="{metadata_url(gw)}", scope="deploy", error="invalid_token"')
    other_scheme = await client.request("tools/list", headers={"Authorization": f"Basic {KEY_A}"})
    assert other_scheme.status == 401 and "error=" not in other_scheme.headers["WWW-Authenticate"]


async def test_a_key_in_the_query_string_is_refused_even_with_a_good_header(
    gw: RunningGateway, http_a: aiohttp.ClientSession
) -> None:
    client = WireClient(http_a, f"{gw.url}?access_token={KEY_A}", MODERN)
    reply = await client.request("tools/list")
    assert reply.status == 400, reply.messages
    assert 'error="invalid_request"' in reply.headers["WWW-Authenticate"]
    assert "never in the URL" in reply.final["error"]["message"]


async def test_legacy_get_stream_and_delete_need_the_key_too(gw: RunningGateway, http_a: aiohttp.ClientSession) -> None:
    client = WireClient(http_a, gw.url)
    await client.initialize()
    headers = {"Mcp-Session-Id": str(client.session_id), "Accept": "text/event-stream"}
    async with aiohttp.ClientSession() as anonymous:
        async with anonymous.get(gw.url, headers=headers) as response:
            assert response.status == 401
        async with anonymous.delete(gw.url, headers=headers) as response:
            assert response.status == 401
    assert await client.delete() == 200


async def test_metadata_at_both_well_known_paths_and_health_stays_open(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    expected = {
        "resource": gw.url,
        "authorization_servers": [],
        "scopes_supported": ["deploy"],
        "bearer_methods_supported": ["header"],
    }
    for url in (metadata_url(gw), f"{gw.base}/.well-known/oauth-protected-resource"):
        async with http.get(url) as response:
            assert response.status == 200, url
            assert await response.json() == expected
    for path in ("/healthz", "/readyz", "/metrics"):
        async with http.get(gw.base + path) as response:
            assert response.status in (200, 503), path  # /readyz: 503 until the upstream is usable
            assert "WWW-Authenticate" not in response.headers


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_sdk_client_with_its_key_streams_a_call(gw: RunningGateway, mode: str) -> None:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with asyncio.timeout(60):
        transport = streamable_http_client(gw.url, http_client=create_mcp_http_client(headers=bearer(KEY_B)))
        async with Client(transport, mode=mode, cache=None, read_timeout_seconds=30) as client:
            result = await client.call_tool("slow_build", {"steps": 3, "delay": 0.01}, progress_callback=on_progress)
            assert not result.is_error, result
            assert len(seen) == 3, seen
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert "slow_build" in names and "deploy" not in names, names


# -- per-tool scopes ------------------------------------------------------------------------------


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_a_tool_needing_a_scope_is_hidden_and_its_call_is_403(
    gw: RunningGateway, http_a: aiohttp.ClientSession, http_b: aiohttp.ClientSession, era: str
) -> None:
    a, b = WireClient(http_a, gw.url, era), WireClient(http_b, gw.url, era)
    if era == LEGACY:
        await a.initialize()
        await b.initialize()
    assert "deploy" in {tool["name"] for tool in (await a.result("tools/list"))["tools"]}
    assert "deploy" not in {tool["name"] for tool in (await b.result("tools/list"))["tools"]}
    refused = await b.request("tools/call", {"name": "deploy", "arguments": {"environment": "prod"}}, request_id=9)
    assert refused.status == 403, refused.messages
    assert refused.headers["WWW-Authenticate"] == (
        f'Bearer resource_metadata="{metadata_url(gw)}", scope="deploy", error="insufficient_scope"'
    )
    assert refused.final["id"] == 9 and refused.final["error"]["data"] == {"reason": "insufficient_scope"}
    async with http_b.get(f"{gw.base}/metrics") as response:
        assert 'mcp_gateway_rejected_requests_total{reason="insufficient_scope"}' in await response.text()


# -- the matrix: A's tasks and sessions are not B's -----------------------------------------------

TASK_METHODS = ("tasks/get", "tasks/result", "tasks/cancel", "tasks/update", "tasks/list", "tasks/stream")
"""Every task method of both eras, asked in both: one that does not exist in an era must not tell a
foreign id from a random one either."""


def params_for(method: str, task_id: str) -> dict[str, Any]:
    if method == "tasks/list":
        return {}
    if method == "tasks/update":
        return {"taskId": task_id, "inputResponses": {}}
    return {"taskId": task_id}


async def answer(client: WireClient, method: str, task_id: str) -> tuple[int, bytes]:
    """The status and every message of the answer, the task id written as a placeholder."""
    reply = await client.request(method, params_for(method, task_id), request_id=41)
    return reply.status, orjson.dumps(reply.messages).replace(task_id.encode(), b"<task>")


async def start_long_task(client: WireClient, tool: str = "slow_build") -> str:
    arguments = {"steps": 40, "delay": 0.5} if tool == "slow_build" else {"topic": "auth"}
    if client.era == LEGACY:
        result = await client.result("tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": 60000}})
        task_id: str = result["task"]["taskId"]
        return task_id
    result = await client.result("tools/call", {"name": tool, "arguments": arguments})
    assert result["resultType"] == "task", result
    task_id = result["taskId"]
    return task_id


async def listed(client: WireClient) -> list[str]:
    """Every task id of the caller's tasks/list, page after page."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        page = await client.result("tasks/list", {"cursor": cursor} if cursor is not None else {})
        ids += [task["taskId"] for task in page["tasks"]]
        if "nextCursor" not in page:
            return ids
        cursor = page["nextCursor"]


async def assert_only_a_sees_it(
    gw: RunningGateway, http_a: aiohttp.ClientSession, http_b: aiohttp.ClientSession, era: str, tool: str
) -> None:
    """A starts a task of `tool`; every task method of B on it answers like one on a random id; A still
    sees it (in its tasks/list too, in 2025-11-25) and controls it; A's session is 404 for B."""
    a, b = WireClient(http_a, gw.url, era), WireClient(http_b, gw.url, era)
    if era == LEGACY:
        await a.initialize()
        await b.initialize()
    task_id = await start_long_task(a, tool)
    for method in TASK_METHODS:
        foreign = await answer(b, method, task_id)
        unknown = await answer(b, method, str(uuid.uuid4()))
        assert foreign == unknown, (method, foreign, unknown)
        if method != "tasks/list" or era == MODERN:
            assert foreign[1].count(b'"error"') == 1, (method, foreign)
    # B's cancel changed nothing: A still sees and controls its task.
    assert (await a.result("tasks/get", {"taskId": task_id}))["status"] == "working"
    if era == LEGACY:
        # Not under another name either: a pass-through id is `<conversation tag>.<upstream id>`, and
        # the upstream's own list would show the task to B under B's conversation tag.
        upstream_id = task_id.rsplit(".", 1)[-1]
        assert not [other for other in await listed(b) if upstream_id in other]
        assert task_id in await listed(a)
        # Another session of A lists it too (the list comes from the gateway's records, not from the
        # session's upstream conversation).
        other_session = WireClient(http_a, gw.url, era)
        await other_session.initialize()
        assert task_id in await listed(other_session)
        # A's session id with B's key: 404, as for an unknown session.
        stolen = await a.via(http_b).request("tools/list")
        assert stolen.status == 404, stolen.messages
        assert (await a.result("tools/list"))["tools"]
    await a.result("tasks/cancel", {"taskId": task_id})
    assert (await a.result("tasks/get", {"taskId": task_id}))["status"] == "cancelled"


# -- the matrix, run on hosted tasks and on pass-through ones the upstream hosts ------------------
#
# The example server (no Tasks: the gateway hosts them), server-everything (2025-11-25 Tasks, on stdio:
# a process per legacy session) and the native example server on Streamable HTTP (both eras' Tasks in
# one process, every task of the gateway's one upstream credential in one list). The list pages hold
# one task, so A's list is read through its cursors.

MATRIX_CONFIG = "[tasks]\npage_size = 1\n" + CONFIG


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def matrix_gw(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningGateway]:
    """The gateway in front of `request.param`: "example", "everything" or "native" (see above)."""
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "example":
            gateway = start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=MATRIX_CONFIG)
        elif request.param == "everything":
            gateway = start_gateway(upstream_cmd=node_command(), config_text=MATRIX_CONFIG)
        else:
            log = tmp_path_factory.mktemp("native") / "upstream.log"
            url = await stack.enter_async_context(serve_http(NATIVE, log=log, port_option="--port"))
            gateway = start_gateway(upstream_url=url, config_text=MATRIX_CONFIG)
        yield await stack.enter_async_context(gateway)


@pytest.mark.parametrize(
    ("matrix_gw", "tool", "era"),
    [
        ("example", "slow_build", LEGACY),  # hosted by the gateway
        ("example", "slow_build", MODERN),
        ("everything", EVERYTHING_TOOL, LEGACY),  # pass-through
        ("native", "slow_build", LEGACY),
        ("native", "slow_build", MODERN),
    ],
    indirect=["matrix_gw"],
)
async def test_b_cannot_tell_a_task_of_a_from_a_random_id(
    matrix_gw: RunningGateway, http_a: aiohttp.ClientSession, http_b: aiohttp.ClientSession, tool: str, era: str
) -> None:
    async with asyncio.timeout(90):
        await assert_only_a_sees_it(matrix_gw, http_a, http_b, era, tool)


# -- the CLI with a key: --header, or MCP_GATEWAY_TOKEN ----------------------------------------------

NO_TOKEN = {"MCP_GATEWAY_TOKEN": ""}
"""Whatever the environment running the tests holds: no token from it."""


async def test_the_cli_sends_its_key_with_header_or_from_the_environment(gw: RunningGateway) -> None:
    header = ["--header", f"Authorization: Bearer {KEY_A}"]
    async with asyncio.timeout(90):
        code, out, err = await cli("call", gw.url, "echo", "--args", '{"text": "hi"}', *header, env=NO_TOKEN)
        assert (code, out) == (0, "hi\n"), err
        code, out, err = await cli(
            "call", gw.url, "slow_build", "--args", '{"steps": 2, "delay": 0.01}', "--task", *header, env=NO_TOKEN
        )
        assert code == 0, err
        task_id = out.strip()
        code, out, err = await cli("tail", gw.url, task_id, "--json", *header, env=NO_TOKEN)
        assert code == 0, err
        # The environment's token: the same caller, so its task is listed; an explicit header wins over it.
        code, out, err = await cli("tasks", gw.url, "list", env={"MCP_GATEWAY_TOKEN": KEY_A})
        assert code == 0 and task_id in out, err
        code, out, err = await cli(
            "tasks", gw.url, "get", task_id, "--era", "modern", "--header", f"Authorization: Bearer {KEY_B}",
            env={"MCP_GATEWAY_TOKEN": KEY_A},
        )  # fmt: skip
        assert code == 2 and "no such task" in err, err


@pytest.mark.parametrize(
    "command",
    [
        ("call", "echo", "--args", '{"text": "hi"}'),
        ("call", "echo", "--args", '{"text": "hi"}', "--era", "modern"),
        ("tasks", "list"),
        ("tail", "0123456789abcdef0123456789abcdef"),
    ],
)
async def test_the_cli_without_a_key_exits_2_saying_how_to_send_one(
    gw: RunningGateway, command: tuple[str, ...]
) -> None:
    name, *rest = command
    async with asyncio.timeout(60):
        code, out, err = await cli(name, gw.url, *rest, env=NO_TOKEN)
    assert (code, out) == (2, ""), err
    line = one_line(err)
    assert line.startswith(f"{name}: ") and "HTTP 401: Unauthorized" in line, line
    assert line.endswith("pass --header 'Authorization: Bearer TOKEN' or set MCP_GATEWAY_TOKEN"), line


async def test_a_cli_header_without_a_colon_is_bad_input(gw: RunningGateway) -> None:
    code, out, err = await cli("tasks", gw.url, "list", "--header", f"Bearer {KEY_A}", env=NO_TOKEN)
    assert (code, out) == (2, "") and "expected 'Name: value'" in one_line(err), err


# -- the upstream never sees a client's key -------------------------------------------------------


async def test_the_client_key_never_reaches_the_upstream(http_a: aiohttp.ClientSession) -> None:
    seen: list[dict[str, str]] = []

    async def upstream(request: web.Request) -> web.StreamResponse:
        seen.append({name.lower(): value for name, value in request.headers.items()})
        body = await request.json()
        if "id" not in body:
            return web.Response(status=202)
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {"content": [], "tools": []}})

    async with (
        asyncio.timeout(60),
        scripted(upstream) as url,
        start_gateway(upstream_url=url, config_text=CONFIG) as gw,
    ):
        for era in (MODERN, LEGACY):
            client = WireClient(http_a, gw.url, era)
            if era == LEGACY:
                await client.initialize()
            assert (await client.request("tools/call", {"name": "echo", "arguments": {"text": "x"}})).status == 200
    assert seen
    for headers in seen:
        assert "authorization" not in headers, headers
        assert not any(KEY_A in value for value in headers.values()), headers


async def test_the_conformance_kit_with_two_keys_passes_the_authorization_check() -> None:
    from gateway.conformance.registry import ERAS
    from tests.test_conformance import assert_conforms, outcomes, run_kit

    keys = CONFIG.split("[[auth.rules]]")[0]  # both keys, none of the rules or task policies
    limits = "\n[auth.limits]\nrequests_per_s = 10000.0\nburst = 10000\n"
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=keys + limits) as gw:
        code, report, text = await run_kit(
            gw.url,
            "--era",
            "both",
            "--header",
            f"Authorization: Bearer {KEY_A}",
            "--other-header",
            f"Authorization: Bearer {KEY_B}",
        )
    assert_conforms(code, report, text, ERAS)
    assert {(era.label, "auth.same_as_tasks_get") for era in ERAS} <= outcomes(report, "pass"), text
