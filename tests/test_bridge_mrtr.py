"""MRTR through the modern bridge, raw: the held upstream call, its sealed `requestState`, bad input.

The real gateway (API keys for two principals) in front of server-everything on stdio (its stdin teed
to a file: the test sees what reached the upstream). `trigger-elicitation-request` asks the client
mid-call; a 2026-07-28 client gets an `InputRequiredResult`. Checked: a requestState that is unknown,
tampered with or another principal's gets one and the same -32602 (HTTP 400), and leaves the held call
alone for its owner; `inputResponses` missing a key names it; a used state is unknown; a retry after
`input_timeout_s` is told the call timed out (and the upstream got `notifications/cancelled`); methods
2026-07-28 lacks get -32601 (404); and a gateway-hosted task whose tool asks for input goes
`input_required` and resumes with `tasks/update` (`always` with no input window: the call is a task
before the tool asks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.conftest import RunningGateway, start_gateway
from tests.test_auth_api_key import KEY_A, KEY_B, TWO_KEYS
from tests.test_bridge_modern_client import teed_command, until_sent
from tests.wire import MODERN, Client, envelope

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 30.0
ELICIT = "trigger-elicitation-request"
SAMPLE = "trigger-sampling-request"
CONFIG = f"""{TWO_KEYS}
[[tasks.tools]]
match = "{SAMPLE}"
modern = "always"
input_window_ms = 0

[[tasks.tools]]
match = "*"
modern = "never"
"""
ANSWER = {"action": "accept", "content": {"name": "Ada"}}


class Gateways:
    def __init__(self, keyed: RunningGateway, hasty: RunningGateway, hasty_log: Path) -> None:
        self.keyed = keyed
        self.hasty = hasty
        self.hasty_log = hasty_log


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateways(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateways]:
    tmp = tmp_path_factory.mktemp("bridge-mrtr")
    log, hasty_log = tmp / "keyed.jsonl", tmp / "hasty.jsonl"
    hasty_config = "[upstream.bridge]\ninput_timeout_s = 0.5\n"
    async with (
        start_gateway(upstream_cmd=teed_command(log), config_text=CONFIG) as keyed,
        start_gateway(upstream_cmd=teed_command(hasty_log), config_text=hasty_config) as hasty,
    ):
        yield Gateways(keyed, hasty, hasty_log)


def meta(*, sampling: bool = False) -> dict[str, Any]:
    """The envelope of a client that declares form elicitation (or sampling) and the tasks extension."""
    declared = envelope(tasks=True)
    capabilities = declared["io.modelcontextprotocol/clientCapabilities"]
    asked = {"sampling": {}} if sampling else {"elicitation": {"form": {}}}
    declared["io.modelcontextprotocol/clientCapabilities"] = {**capabilities, **asked}
    return declared


async def call(
    http: aiohttp.ClientSession, url: str, key: str | None, method: str, params: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    client = Client(http, url, MODERN)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with asyncio.timeout(WAIT):
        reply = await client.request(method, params, headers=headers)
    return reply.status, reply.final


async def ask(http: aiohttp.ClientSession, url: str, key: str | None) -> dict[str, Any]:
    """The first round of trigger-elicitation-request: its InputRequiredResult."""
    status, final = await call(http, url, key, "tools/call", {"name": ELICIT, "arguments": {}, "_meta": meta()})
    assert status == 200 and final["result"]["resultType"] == "input_required", (status, final)
    result: dict[str, Any] = final["result"]
    ((_, request),) = result["inputRequests"].items()
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "form", result
    return result


async def retry(
    http: aiohttp.ClientSession, url: str, key: str | None, state: Any, responses: Any
) -> tuple[int, dict[str, Any]]:
    params = {"name": ELICIT, "arguments": {}, "_meta": meta(), "requestState": state, "inputResponses": responses}
    return await call(http, url, key, "tools/call", params)


def answers(asked: dict[str, Any]) -> dict[str, Any]:
    return {key: ANSWER for key in asked["inputRequests"]}


def completed_text(status: int, final: dict[str, Any]) -> str:
    assert status == 200 and final["result"]["resultType"] == "complete", (status, final)
    return "\n".join(block["text"] for block in final["result"]["content"])


def invalid_params(status: int, final: dict[str, Any]) -> dict[str, Any]:
    assert status == 400 and final["error"]["code"] == -32602, (status, final)
    error: dict[str, Any] = final["error"]
    return error


async def test_unknown_tampered_and_foreign_states_look_alike_and_spare_the_held_call(
    gateways: Gateways, http: aiohttp.ClientSession
) -> None:
    url = gateways.keyed.url
    asked = await ask(http, url, KEY_A)
    state: str = asked["requestState"]
    flipped = state[:-2] + ("A" if state[-2] != "A" else "B") + state[-1]
    errors = [
        invalid_params(*await retry(http, url, KEY_A, "no-such-state", answers(asked))),
        invalid_params(*await retry(http, url, KEY_A, flipped, answers(asked))),
        invalid_params(*await retry(http, url, KEY_B, state, answers(asked))),  # another principal's
        invalid_params(*await retry(http, url, KEY_A, {"not": "a string"}, answers(asked))),
    ]
    assert all(error == errors[0] for error in errors), errors
    assert "unknown requestState" in errors[0]["message"], errors[0]
    assert "127.0.0.1" not in str(errors) and "node" not in str(errors)

    assert "Name: Ada" in completed_text(*await retry(http, url, KEY_A, state, answers(asked)))
    used = invalid_params(*await retry(http, url, KEY_A, state, answers(asked)))  # a state is good once
    assert used == errors[0], used


async def test_missing_input_responses_are_named(gateways: Gateways, http: aiohttp.ClientSession) -> None:
    url = gateways.keyed.url
    asked = await ask(http, url, KEY_A)
    ((key, _),) = asked["inputRequests"].items()
    missing = invalid_params(*await retry(http, url, KEY_A, asked["requestState"], {}))
    assert key in missing["message"] and missing["data"]["missing"] == [key], missing
    wrong = invalid_params(*await retry(http, url, KEY_A, asked["requestState"], {key: "yes"}))
    assert key in wrong["message"], wrong
    not_a_map = invalid_params(*await retry(http, url, KEY_A, asked["requestState"], ["yes"]))
    assert "inputResponses must map" in not_a_map["message"], not_a_map
    assert "Name: Ada" in completed_text(*await retry(http, url, KEY_A, asked["requestState"], answers(asked)))


async def test_a_retry_after_the_input_timeout_is_told_so(gateways: Gateways, http: aiohttp.ClientSession) -> None:
    url = gateways.hasty.url
    asked = await ask(http, url, None)
    sent = await until_sent(gateways.hasty_log, lambda m: m.get("method") == "notifications/cancelled")
    call_ids = [m["id"] for m in sent if m.get("method") == "tools/call" and m["params"]["name"] == ELICIT]
    assert any(m["params"]["requestId"] in call_ids for m in sent if m.get("method") == "notifications/cancelled")
    error = invalid_params(*await retry(http, url, None, asked["requestState"], answers(asked)))
    assert "input_timeout_s" in error["message"] and error["data"]["reason"] == "input_timeout", error


@pytest.mark.parametrize("method", ["logging/setLevel", "resources/subscribe", "ping"])
async def test_a_method_2026_does_not_have_is_not_found(
    gateways: Gateways, http: aiohttp.ClientSession, method: str
) -> None:
    status, final = await call(http, gateways.keyed.url, KEY_A, method, {"level": "info", "uri": "demo://x"})
    assert status == 404 and final["error"]["code"] == -32601, (status, final)
    assert method in final["error"]["message"], final


async def test_a_hosted_task_asking_for_input_resumes_with_tasks_update(
    gateways: Gateways, http: aiohttp.ClientSession
) -> None:
    url = gateways.keyed.url
    params = {"name": SAMPLE, "arguments": {"prompt": "tides"}, "_meta": meta(sampling=True)}
    status, final = await call(http, url, KEY_A, "tools/call", params)
    assert status == 200 and final["result"]["resultType"] == "task", final
    task_id = final["result"]["taskId"]

    task = await task_until(http, url, task_id, ("input_required",))
    ((key, request),) = task["inputRequests"].items()
    assert request["method"] == "sampling/createMessage", task
    sampled = {"role": "assistant", "content": {"type": "text", "text": "moon pull"}, "model": "test"}
    update = {"taskId": task_id, "inputResponses": {key: sampled}}
    status, final = await call(http, url, KEY_A, "tasks/update", update)
    assert status == 200 and "result" in final, final

    task = await task_until(http, url, task_id, ("completed", "failed", "cancelled"))
    assert task["status"] == "completed", task
    assert "moon pull" in task["result"]["content"][0]["text"], task


async def task_until(http: aiohttp.ClientSession, url: str, task_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
    """tasks/get until the task's status is one of `statuses` (polling is how 2026 clients follow a task)."""
    deadline = time.monotonic() + WAIT
    while True:
        status, final = await call(http, url, KEY_A, "tasks/get", {"taskId": task_id, "_meta": meta(sampling=True)})
        assert status == 200, final
        task: dict[str, Any] = final["result"]
        if task["status"] in statuses:
            return task
        assert time.monotonic() < deadline, task
        await asyncio.sleep(0.1)
