"""Reloading the upstream list with several upstreams (`gateway.assembly.servers`).

End to end, one real gateway with two `[[upstreams]]` (the example server twice, stdio) and a metrics
listener: while a legacy session is open on the aggregate (its GET stream too) and one on upstream b's
path, the config file is replaced (c added, b removed, a's settings changed) and SIGHUP sent. c's path
serves and its tools join the aggregate, for the open session (which hears `tools/list_changed`) as for
a new one; b's path answers 404 to a new session and /readyz and the page's endpoints leave b out,
while the old b session's next request still works; once it ends, b stops. a keeps its old settings,
named as needing a restart.
In process: what a reload takes of the upstream list, and the keys it names.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from gateway.client import GatewayClient
from gateway.config import Config
from gateway.protocol.era import Era
from gateway.protocol.names import SESSION_HEADER
from gateway.reload import changed_keys, reloadable, restart_keys
from tests.conftest import EXAMPLE_SERVER, free_port, start_gateway
from tests.test_global_limits import eventually
from tests.test_many_upstreams import readyz, until_ready
from tests.test_reload import WAIT, config_path, lines_with, reloads, replace_config, sighup

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}


def upstreams_config(metrics_port: int, *entries: tuple[str, str]) -> str:
    """A config with `[[upstreams]]` (name, extra keys) each running the example server on stdio."""
    text = f'[server]\nmetrics_listen = "127.0.0.1:{metrics_port}"\n\n[logging]\nformat = "json"\n'
    for name, extra in entries:
        text += f'\n[[upstreams]]\nname = "{name}"\ncommand = {json.dumps(EXAMPLE_SERVER)}\n{extra}\n'
    return text


async def tool_names(client: GatewayClient) -> set[str]:
    return {tool["name"] for tool in await client.list_tools()}


async def new_session_status(http: aiohttp.ClientSession, url: str) -> int:
    """The HTTP status an `initialize` (a new legacy session) gets at `url`."""
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    async with http.post(url, json=INITIALIZE, headers=headers) as response:
        return response.status


async def read_until(response: aiohttp.ClientResponse, needle: str) -> None:
    """Read the SSE stream until a line contains `needle`."""
    async for line in response.content:
        if needle in line.decode():
            return
    raise AssertionError(f"the stream ended before {needle!r}")


async def test_a_reload_adds_and_removes_upstreams_while_their_sessions_go_on() -> None:
    metrics_port = free_port()
    metrics_base = f"http://127.0.0.1:{metrics_port}"
    async with (
        asyncio.timeout(90),
        start_gateway(config_text=upstreams_config(metrics_port, ("a", ""), ("b", ""))) as gw,
        aiohttp.ClientSession() as http,
    ):
        path = {name: f"{gw.base}/servers/{name}/mcp" for name in "abc"}
        await until_ready(gw, {"a", "b"})
        async with GatewayClient(gw.url) as aggregate, GatewayClient(path["b"]) as old_b:
            assert {"a__echo", "b__echo"} <= await tool_names(aggregate)
            assert "echo" in await tool_names(old_b)
            b_session = old_b.session_id
            assert b_session is not None and await new_session_status(http, path["c"]) == 404
            stream_headers = {
                SESSION_HEADER: str(aggregate.session_id),
                "Accept": "text/event-stream",
                "MCP-Protocol-Version": "2025-11-25",
            }
            async with http.get(gw.url, headers=stream_headers) as stream:
                assert stream.status == 200
                replace_config(
                    config_path(gw),
                    upstreams_config(metrics_port, ("a", "request_timeout_s = 100"), ("c", "")),
                )
                line = await sighup(gw, "config reloaded")
                assert "upstreams.a" in line and '"upstreams"' in line, line  # applied, but a's change waits
                # The open aggregate session hears its tools changed.
                await asyncio.wait_for(read_until(stream, "notifications/tools/list_changed"), WAIT)

            # c serves on its own path and in the aggregate, for the open session and a new one; b is gone.
            async with GatewayClient(path["c"]) as c:
                assert "echo" in await tool_names(c)
                assert (await c.call_tool("echo", {"text": "from c"}))["content"][0]["text"] == "from c"
            listed = await tool_names(aggregate)
            assert "c__echo" in listed and "a__echo" in listed and not any(n.startswith("b__") for n in listed)
            async with GatewayClient(gw.url, era=Era.MODERN) as fresh:
                assert "c__echo" in await tool_names(fresh) and "b__echo" not in await tool_names(fresh)
            result = await aggregate.call_tool("c__echo", {"text": "via the aggregate"})
            assert result["content"][0]["text"] == "via the aggregate"
            await until_ready(gw, {"c"})
            status, body = await readyz(gw)
            assert status == 200 and set(body["upstreams"]) == {"a", "c"}, body
            async with http.get(f"{gw.base}/ui/config.json") as response:
                page = {endpoint["path"] for endpoint in (await response.json())["endpoints"]}
            assert page == {"/mcp", "/servers/a/mcp", "/servers/c/mcp"}, page

            # b: a new session gets 404, the open one goes on until it ends.
            assert await new_session_status(http, path["b"]) == 404
            assert (await old_b.call_tool("echo", {"text": "still b"}))["content"][0]["text"] == "still b"
            assert old_b.session_id == b_session  # the same session, not a new one
            assert not lines_with(gw, "removed upstream drained")
            assert await reloads(metrics_base, "ok") == 1
        # The old b session ended (DELETE on leaving the block): b stops, its path is unknown.

        async def stopped() -> bool:
            return bool(lines_with(gw, "removed upstream drained and stopped"))

        await eventually(stopped, WAIT, "b stopped once its session ended")
        assert await new_session_status(http, path["b"]) == 404
        assert await new_session_status(http, f"{gw.base}/servers/never/mcp") == 404


# -- in process ------------------------------------------------------------------------------------


def several(*entries: dict[str, Any]) -> Config:
    return Config.model_validate({"upstreams": list(entries)})


def test_a_reload_takes_the_upstream_list_but_not_a_changed_entry() -> None:
    a, b, c = ({"name": name, "command": ["server", name]} for name in "abc")
    changed_a = {**a, "request_timeout_s": 5}
    old, new = several(a, b), several(c, changed_a)
    applied = reloadable(old, new)
    assert [upstream.name for upstream in applied.upstreams] == ["c", "a"]
    assert applied.upstreams[1] == old.upstreams[0] and applied.upstreams[0] == new.upstreams[0]
    assert changed_keys(old, applied) == ["upstreams"]
    assert restart_keys(applied, new) == ["upstreams.a"]
    assert restart_keys(reloadable(old, several(a, c)), several(a, c)) == []


def test_going_between_one_upstream_and_several_needs_a_restart() -> None:
    one = Config.model_validate({"upstream": {"command": ["server"]}})
    many = several({"name": "a", "command": ["server"]}, {"name": "b", "command": ["server"]})
    assert reloadable(one, many).upstreams == [] and "upstreams" in restart_keys(reloadable(one, many), many)
    assert reloadable(many, one).upstreams == many.upstreams
    assert "upstreams" in restart_keys(reloadable(many, one), one)
