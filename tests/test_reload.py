"""Reloading the config file (`gateway.reload`, `gateway.assembly.reload`).

End to end, one real gateway (api keys, the example server on stdio, a metrics listener): while a
legacy session and the `tasks/stream` of a running hosted task are open, the config file is replaced
(a key added, one removed, a rule tightened, a capture rule changed) and SIGHUP sent. The stream goes
on to the task's end and the session's next request works; the new key works, the removed one gets
401, the tightened rule refuses the tool, and the next task's events carry the new capture type. A
file with an unknown key is refused with one line naming it and the old config kept; `POST
/admin/reload` works on the metrics listener only (here applying a new retention); /readyz shows the
file's hash; the metric counts. In oauth mode a reload moves JWT validation to another key set. In
process: which keys a reload takes, the keys it names, and the reloader's results.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.client import GatewayClient
from gateway.client.stream import JsonRpcError
from gateway.config import Config, EventsConfig
from gateway.metrics import Metrics
from gateway.protocol.era import Era
from gateway.reload import ConfigReloader, changed_keys, digest, reloadable
from tests.conftest import EXAMPLE_SERVER, RunningGateway, free_port, start_gateway
from tests.test_auth_api_key import KEY_A, KEY_B, bearer
from tests.test_auth_api_key import digest as key_digest
from tests.test_auth_jwt import ISSUER, RESOURCE, claims, jwks_server, rsa_key
from tests.test_global_limits import eventually

WAIT = 30.0
KEY_C = "key-c-0123456789"
PREFIX = EventsConfig().prefix


def keys(*named: tuple[str, str, list[str]]) -> str:
    return "".join(
        f'\n[[auth.api_keys]]\nname = "{name}"\nsha256 = "{key_digest(key)}"\nscopes = {scopes!r}\n'
        for name, key, scopes in named
    ).replace("'", '"')


def config_text(
    metrics_port: int, *, api_keys: str, extra: str = "", progress_type: str = "progress", tasks_for: str = "*"
) -> str:
    return f"""
[server]
metrics_listen = "127.0.0.1:{metrics_port}"
{extra}

[auth]
mode = "api_key"
{api_keys}

[[tasks.tools]]
match = "{tasks_for}"
task_support = "optional"

[[rules]]
method = "notifications/progress"
type = "{progress_type}"
fields = ["progress", "total", "message"]

[[rules]]
method = "*"
type = "notification"
payload = "message"

[logging]
format = "json"
"""


BEFORE_KEYS = keys(("a", KEY_A, []), ("b", KEY_B, []))
AFTER_KEYS = keys(("a", KEY_A, []), ("c", KEY_C, ["admin"]))
TIGHTER_RULE = '\n[[auth.rules]]\nmatch = "echo"\nscopes = ["admin"]\n'


def config_path(gw: RunningGateway) -> Path:
    """The config file `start_gateway` wrote, as the gateway's command line names it."""
    argv = Path(f"/proc/{gw.proc.pid}/cmdline").read_bytes().split(b"\0")
    return Path(argv[argv.index(b"--config") + 1].decode())


def replace_config(path: Path, text: str) -> bytes:
    """Replace the file at once (a new file renamed over it), keeping the store `start_gateway` chose;
    returns the new file's bytes."""
    store = path.read_text(encoding="utf-8").partition("[store]")[2]
    data = f"{text}\n[store]{store}".encode()
    staged = path.with_suffix(".new")
    staged.write_bytes(data)
    os.replace(staged, path)
    return data


def lines_with(gw: RunningGateway, needle: str) -> list[str]:
    return [line for line in gw.output if needle in line]


async def sighup(gw: RunningGateway, needle: str) -> str:
    """Send SIGHUP and return the reload's log line (the first new one containing `needle`)."""
    seen = len(lines_with(gw, "config reload"))

    async def logged() -> bool:
        return len(lines_with(gw, "config reload")) > seen

    gw.proc.send_signal(signal.SIGHUP)
    await eventually(logged, WAIT, "the reload's log line")
    line = lines_with(gw, "config reload")[seen]
    assert needle in line, line
    return line


async def status_of(gw: RunningGateway, key: str, tool: str = "whoami") -> int:
    """The HTTP status a 2026-07-28 tools/call of `tool` with `key` gets (200: it ran)."""
    async with GatewayClient(gw.url, era=Era.MODERN, headers=bearer(key)) as client:
        try:
            await client.call_tool(tool, {"text": "hi"} if tool == "echo" else {})
        except JsonRpcError as exc:
            assert exc.http_status is not None, exc
            return exc.http_status
        return 200


async def reloads(metrics_base: str, result: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{metrics_base}/metrics") as response:
        text = await response.text()
    sample = f'mcp_gateway_config_reloads_total{{result="{result}"}} '
    return next((float(line[len(sample) :]) for line in text.splitlines() if line.startswith(sample)), 0.0)


async def readyz_config(gw: RunningGateway) -> object:
    async with aiohttp.ClientSession() as http, http.get(f"{gw.base}/readyz") as response:
        body: dict[str, Any] = await response.json()
    return body.get("config")


def short_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


async def test_a_reload_applies_keys_rules_and_capture_while_a_stream_and_a_session_go_on() -> None:
    metrics_port = free_port()
    metrics_base = f"http://127.0.0.1:{metrics_port}"
    first = config_text(metrics_port, api_keys=BEFORE_KEYS)
    async with (
        asyncio.timeout(120),
        start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=first) as gw,
        GatewayClient(gw.url, headers=bearer(KEY_A)) as session,
        GatewayClient(gw.url, headers=bearer(KEY_A)) as streamer,
    ):
        path = config_path(gw)
        assert await readyz_config(gw) == short_sha256(path.read_bytes())
        assert await status_of(gw, KEY_B) == 200 and await status_of(gw, KEY_A, "echo") == 200
        assert await status_of(gw, KEY_C) == 401
        assert await session.start_task("whoami") is not None
        assert {tool["name"] for tool in await session.list_tools()} >= {"echo", "slow_build"}

        # A hosted task, its stream open and delivering, when the config changes under it.
        task_id = await streamer.start_task("slow_build", {"steps": 30, "delay": 0.1})
        assert task_id is not None
        events: list[dict[str, Any]] = []
        reloaded_at: int | None = None
        async with streamer.stream(task_id) as stream:
            async for event in stream:
                events.append(event)
                if reloaded_at is None and event["type"] == f"{PREFIX}.progress":
                    data = replace_config(
                        path,
                        config_text(metrics_port, api_keys=AFTER_KEYS, extra="", progress_type="step") + TIGHTER_RULE,
                    )
                    line = await sighup(gw, "config reloaded")
                    assert "auth.api_keys" in line and "auth.rules" in line and '"rules"' in line, line
                    reloaded_at = len(events)
        assert reloaded_at is not None, events
        # The stream went on across the reload to the task's end, every event once and in order.
        assert [event["seq"] for event in events] == list(range(events[0]["seq"], events[0]["seq"] + len(events)))
        assert events[-1]["type"] == f"{PREFIX}.task.terminal", events[-1]
        assert len(events) > reloaded_at + 1, "no event reached the stream after the reload"
        assert (await streamer.get_task(task_id))["result"]["status"] == "completed"

        # The session opened before the reload goes on; the keys and the rule are the new ones.
        assert {tool["name"] for tool in await session.list_tools()} >= {"slow_build"}
        assert await status_of(gw, KEY_C) == 200
        assert await status_of(gw, KEY_B) == 401
        assert await status_of(gw, KEY_A, "echo") == 403
        assert await status_of(gw, KEY_C, "echo") == 200
        assert await readyz_config(gw) == short_sha256(data)

        # The next task's progress is captured under the new type.
        next_id = await session.start_task("slow_build", {"steps": 2, "delay": 0.05})
        assert next_id is not None
        async with session.stream(next_id) as stream:
            types = [event["type"].removeprefix(PREFIX + ".") async for event in stream]
        assert types.count("step") == 2 and "progress" not in types, types
        assert await reloads(metrics_base, "ok") == 1

        # An unknown key: refused with one line naming it; the old config stays.
        refused = replace_config(path, config_text(metrics_port, api_keys=BEFORE_KEYS, extra="max_sesions = 5"))
        line = await sighup(gw, "config reload refused")
        assert "server.max_sesions" in line and "max_sessions" in line, line
        assert len(lines_with(gw, "max_sesions")) == 1, lines_with(gw, "max_sesions")
        assert await status_of(gw, KEY_C) == 200 and await status_of(gw, KEY_B) == 401
        assert await status_of(gw, KEY_A, "echo") == 403
        assert await readyz_config(gw) == short_sha256(data) != short_sha256(refused)
        assert await reloads(metrics_base, "invalid") == 1

        # POST /admin/reload: on the metrics listener, and nowhere on the main one. A key that needs a
        # restart is named and keeps its value; the rest applies.
        third = replace_config(
            path,
            config_text(metrics_port, api_keys=BEFORE_KEYS, extra="max_sessions = 5", tasks_for="slow_build")
            + "\n[retention]\nmax_events_per_task = 4\n",
        )
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{gw.base}/admin/reload", headers=bearer(KEY_A)) as response:
                assert response.status == 404, await response.text()
            assert await reloads(metrics_base, "ok") == 1
            async with http.post(f"{metrics_base}/admin/reload") as response:
                assert response.status == 200
                assert await response.json() == {"result": "ok", "config": short_sha256(third)}
        restart = lines_with(gw, "need a restart")
        assert len(restart) == 1 and "server.max_sessions" in restart[0], restart
        assert await status_of(gw, KEY_B) == 200 and await status_of(gw, KEY_C) == 401
        assert await status_of(gw, KEY_A, "echo") == 200  # the rule is gone again
        assert await readyz_config(gw) == short_sha256(third)
        # The new task policies: whoami is no task any more (a task-augmented call of it is refused).
        with pytest.raises(JsonRpcError) as refused_task:
            await session.start_task("whoami")
        assert refused_task.value.code == -32601, refused_task.value
        assert await reloads(metrics_base, "ok") == 2
        # The new retention: an ended task's log keeps its last 4 events (of 8).
        trimmed = await session.start_task("slow_build", {"steps": 2, "delay": 0.05})
        assert trimmed is not None
        await session.request("tasks/result", {"taskId": trimmed})
        async with session.stream(trimmed) as stream:
            kept = [(event["seq"], event["type"].removeprefix(PREFIX + ".")) async for event in stream]
        assert kept == [(4, "progress"), (5, "notification"), (6, "task.status"), (7, "task.terminal")], kept


OAUTH = """
[auth]
mode = "oauth"
resource = "{resource}"
authorization_servers = ["{issuer}"]

[auth.jwt]
issuer = "{issuer}"
jwks_uri = "{jwks}"
"""


async def test_a_reload_moves_jwt_validation_to_a_new_key_set() -> None:
    old_key, new_key = rsa_key("old"), rsa_key("new")
    async with (
        asyncio.timeout(60),
        jwks_server([old_key]) as old_jwks,
        jwks_server([new_key]) as new_jwks,
        start_gateway(
            upstream_cmd=EXAMPLE_SERVER,
            config_text=OAUTH.format(resource=RESOURCE, issuer=ISSUER, jwks=old_jwks.url),
        ) as gw,
    ):
        old_token, new_token = old_key.sign(claims()), new_key.sign(claims())
        assert await status_of(gw, old_token) == 200 and await status_of(gw, new_token) == 401
        replace_config(config_path(gw), OAUTH.format(resource=RESOURCE, issuer=ISSUER, jwks=new_jwks.url))
        line = await sighup(gw, "config reloaded")
        assert "auth.jwt.jwks_uri" in line, line
        assert await status_of(gw, new_token) == 200 and new_jwks.fetches >= 1
        # A token validated before is trusted no longer: the new validator starts with an empty cache.
        assert await status_of(gw, old_token) == 401


# -- in process ------------------------------------------------------------------------------------


def test_a_reload_takes_only_the_reloadable_keys_and_names_the_rest() -> None:
    old = Config.model_validate({"auth": {"mode": "api_key", "api_keys": [{"name": "a", "sha256": "0" * 64}]}})
    new = Config.model_validate(
        {
            "server": {"listen": "127.0.0.1:9999", "max_sessions": 5},
            "auth": {
                "mode": "api_key",
                "api_keys": [{"name": "b", "sha256": "1" * 64}],
                "rules": [{"match": "echo", "scopes": ["admin"]}],
                "limits": {"max_streams": 3},
            },
            "rules": [{"method": "*", "type": "other"}],
            "tasks": {"tools": [{"match": "build_*", "task_support": "optional"}], "max_tasks_total": 7},
            "retention": {"max_events_per_task": 9},
        }
    )
    applied = reloadable(old, new)
    assert applied.auth.api_keys == new.auth.api_keys and applied.auth.rules == new.auth.rules
    assert applied.auth.limits.max_streams == 3 and applied.rules == new.rules
    assert applied.tasks.tools == new.tasks.tools and applied.retention == new.retention
    assert applied.server == old.server and applied.tasks.max_tasks_total == old.tasks.max_tasks_total
    reloaded = {"tasks.tools", "rules", "auth.api_keys", "auth.rules", "auth.limits.max_streams"}
    reloaded.add("retention.max_events_per_task")
    assert set(changed_keys(old, applied)) == reloaded
    assert set(changed_keys(applied, new)) == {"server.listen", "server.max_sessions", "tasks.max_tasks_total"}
    assert changed_keys(new, new) == []


async def test_the_reloader_keeps_the_old_config_unless_the_new_one_applies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_bytes(b'[[rules]]\nmethod = "*"\ntype = "first"\n')
    reloader = ConfigReloader(path)
    first = reloader.current
    assert first.digest == digest(path.read_bytes()) and first.config.rules[0].type == "first"
    applied: list[Config] = []
    failing = False

    async def apply(config: Config) -> None:
        if failing:
            raise RuntimeError("cannot build it")
        applied.append(config)

    metrics = Metrics()
    assert await reloader.reload() == "failed"  # nothing attached yet: not serving
    reloader.attach(apply, metrics)

    path.write_bytes(b'[[rules]]\nmethod = "*"\ntypo = "second"\n')
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="gateway"):
        assert await reloader.reload() == "invalid"
    assert len(caplog.records) == 1 and "rules.0.typo" in caplog.records[0].getMessage(), caplog.records
    path.write_bytes(b"not toml [")
    assert await reloader.reload() == "invalid"
    path.unlink()
    assert await reloader.reload() == "failed"
    path.write_bytes(b'[[rules]]\nmethod = "*"\ntype = "second"\n')
    failing = True
    assert await reloader.reload() == "failed"
    assert reloader.current is first and applied == []

    failing = False
    assert await reloader.reload() == "ok"
    assert [config.rules[0].type for config in applied] == ["second"]
    assert reloader.current.config is applied[0] and reloader.current.digest == digest(path.read_bytes())
    counts = {
        result: metrics.config_reloads.labels(result=result)._value.get() for result in ("ok", "invalid", "failed")
    }
    assert counts == {"ok": 1, "invalid": 2, "failed": 2}
