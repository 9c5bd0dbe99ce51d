"""The /ui page as the gateway serves it (`gateway.assembly.ui`): its files with their types and the
Content-Security-Policy that forbids anything but the page's own files, `/ui/config.json` for one and for
several upstreams, no credentials needed for any of it, 404 with `[ui] enabled = false`, and tasks/list
through the aggregate naming each task's upstream (the page's upstream column). Real gateways on loopback;
the browser tests of the page itself are tests/test_ui_browser.py."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import make_mocked_request

from gateway import __version__
from gateway.app import build_app
from gateway.client import GatewayClient
from gateway.config import Config
from gateway.protocol.dialect import TASK_TOOL_KEY, TASK_UPSTREAM_KEY
from gateway.ui import CONTENT_TYPES, STATIC
from tests.conftest import EXAMPLE_SERVER, RunningGateway, start_gateway
from tests.test_auth_api_key import KEY_A, TWO_KEYS, bearer

ASYNC = pytest.mark.asyncio(loop_scope="module")

WAIT = 30.0
CSP = "default-src 'self'"
UPSTREAMS = f"""
[[upstreams]]
name = "build"
command = {json.dumps(EXAMPLE_SERVER)}

[[tasks.tools]]
upstream = "build"
match = "slow_build"
task_support = "optional"
"""
"""`[[upstreams]]` (here one, to start one process per session: the page's view is the same with more):
the aggregate at `/mcp` beside `/servers/build/mcp`."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keyed() -> AsyncIterator[RunningGateway]:
    """One upstream, `[auth] mode = "api_key"`: the page's files must not need the key."""
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=TWO_KEYS) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as session:
        yield session


def page_files() -> list[str]:
    """index.html and every file it loads, following the ES modules' imports from app.js."""
    index = (STATIC / "index.html").read_text(encoding="utf-8")
    files = ["index.html", *re.findall(r'(?:src|href)="/ui/([\w.-]+)"', index)]
    for name in files:
        if name.endswith(".js"):
            imported = re.findall(r'from "\./([\w.-]+)"', (STATIC / name).read_text(encoding="utf-8"))
            files += [each for each in imported if each not in files]
    return files


def test_the_page_loads_only_its_own_files_and_nothing_inline() -> None:
    index = (STATIC / "index.html").read_text(encoding="utf-8")
    assert {"app.js", "app.css", "wire.js", "timeline.js"} <= set(page_files())
    assert not re.search(r"<script(?![^>]*\bsrc=)", index), "an inline script (the CSP would refuse it)"
    assert not re.search(r"<style|\sstyle=|\son[a-z]+=", index), "inline style or event handler attributes"
    everything = "".join(path.read_text(encoding="utf-8") for path in STATIC.iterdir())
    assert not re.search(r"https?://(?!127\.0\.0\.1|localhost)", everything.replace("http://www.w3.org/2000/svg", ""))
    assert not re.search(r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML", everything), "markup parsed from data"


@ASYNC
async def test_every_file_is_served_with_its_type_the_csp_and_nosniff_without_credentials(
    keyed: RunningGateway, http: aiohttp.ClientSession
) -> None:
    for name in page_files():
        path = "/ui" if name == "index.html" else f"/ui/{name}"
        async with http.get(keyed.base + path) as response:
            body = await response.read()
            assert response.status == 200, (path, response.status)
            assert response.content_type == CONTENT_TYPES["." + name.rsplit(".", 1)[1]], path
            assert response.headers["Content-Security-Policy"] == CSP, path
            assert response.headers["X-Content-Type-Options"] == "nosniff", path
            assert body == (STATIC / name).read_bytes(), path
            etag = response.headers["ETag"]
        # A reload revalidates: the same file answers 304 with no body.
        async with http.get(keyed.base + path, headers={"If-None-Match": etag}) as again:
            assert again.status == 304, path
            assert await again.read() == b""


@ASYNC
async def test_unknown_files_are_404_and_the_trailing_slash_redirects(
    keyed: RunningGateway, http: aiohttp.ClientSession
) -> None:
    for path in ("/ui/nope.js", "/ui/..%2Fapp.py", "/ui/__init__.py", "/ui/static/app.js"):
        async with http.get(keyed.base + path) as response:
            assert response.status == 404, path
    async with http.get(keyed.base + "/ui/", allow_redirects=False) as response:
        assert response.status == 308 and response.headers["Location"] == "/ui"


@ASYNC
async def test_config_json_of_one_upstream_names_its_endpoint_and_the_auth_mode(
    keyed: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(keyed.base + "/ui/config.json") as response:
        assert response.status == 200
        assert response.headers["Content-Security-Policy"] == CSP
        assert response.headers["Cache-Control"] == "no-store"
        body = await response.json()
    assert body == {
        "endpoint": "/mcp",
        "endpoints": [{"name": "default", "path": "/mcp"}],
        "auth": "api_key",
        "version": __version__,
    }
    # The page's files are open; the endpoint it talks to is not.
    async with http.post(keyed.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}) as refused:
        assert refused.status == 401


@ASYNC
async def test_one_upstreams_tasks_list_has_no_upstream_key(keyed: RunningGateway) -> None:
    async with asyncio.timeout(WAIT), GatewayClient(keyed.url, headers=bearer(KEY_A)) as client:
        task_id = await client.start_task("slow_build", {"steps": 1, "delay": 0})
        listed = {task["taskId"]: task for task in await client.list_tasks()}
    assert listed[task_id]["_meta"] == {TASK_TOOL_KEY: "slow_build"}


@ASYNC
async def test_with_upstreams_config_json_lists_each_path_and_the_aggregates_tasks_name_their_upstream(
    http: aiohttp.ClientSession,
) -> None:
    async with start_gateway(config_text=UPSTREAMS) as gateway:
        async with http.get(gateway.base + "/ui/config.json") as response:
            body = await response.json()
        assert body["endpoint"] == "/mcp" and body["auth"] == "none"
        assert body["endpoints"] == [
            {"name": "all upstreams", "path": "/mcp"},
            {"name": "build", "path": "/servers/build/mcp"},
        ]
        async with asyncio.timeout(WAIT), GatewayClient(gateway.url) as client:
            task_id = await client.start_task("build__slow_build", {"steps": 1, "delay": 0})
            listed = {task["taskId"]: task for task in await client.list_tasks()}
    assert listed[task_id]["_meta"] == {TASK_TOOL_KEY: "build__slow_build", TASK_UPSTREAM_KEY: "build"}


@ASYNC
@pytest.mark.parametrize("enabled", [True, False])
async def test_disabled_the_page_is_404_and_the_endpoint_stays(enabled: bool, tmp_path: Path) -> None:
    """The app's own routing (in process, never started: nothing is spawned) for what /ui asks."""
    config = Config.model_validate(
        {"ui": {"enabled": enabled}, "upstream": {"command": EXAMPLE_SERVER}, "store": {"path": str(tmp_path / "g.db")}}
    )
    app = build_app(config)
    for path in ("/ui", "/ui/app.js", "/ui/config.json", "/mcp", "/healthz"):
        match = await app.router.resolve(make_mocked_request("GET", path, app=app))
        found = match.http_exception is None
        assert found == (enabled or not path.startswith("/ui")), (path, match.http_exception)
        if not found:
            assert match.http_exception.status == 404, path


def test_an_endpoint_path_under_ui_is_refused_while_the_page_is_on() -> None:
    with pytest.raises(ValueError, match=r"server\.path: '/ui/mcp' is where \[ui\] serves its page"):
        Config.model_validate({"server": {"path": "/ui/mcp"}})
    assert Config.model_validate({"server": {"path": "/ui"}, "ui": {"enabled": False}}).server.path == "/ui"
    assert Config.model_validate({"server": {"path": "/uix"}}).server.path == "/uix"
