"""Which eras the upstream speaks (`gateway.upstream.bridge.eras`), learnt in process from scripted answers
to the gateway's own `server/discover` and `initialize`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping

import pytest

from gateway.protocol import jsonrpc
from gateway.protocol.era import Era
from gateway.protocol.jsonrpc import Message
from gateway.upstream.base import Exchange, UpstreamChannel
from gateway.upstream.bridge.eras import BOTH, EraLearner, UpstreamEras

Answer = Callable[[Exchange], None]


def result(exchange: Exchange) -> None:
    exchange.give_back([{"jsonrpc": "2.0", "id": exchange.request_id, "result": {}}])
    exchange.end()


def error(exchange: Exchange) -> None:
    exchange.give_back([jsonrpc.error_response(exchange.request_id, jsonrpc.METHOD_NOT_FOUND, "Method not found")])
    exchange.end()


def unreachable(exchange: Exchange) -> None:
    exchange.fail(jsonrpc.INTERNAL_ERROR, "upstream unreachable: connection refused")


class Scripted(UpstreamChannel):
    """Answers each method as scripted, and counts what it was asked."""

    def __init__(self, answers: dict[str, Answer]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def request(self, message: Message, headers: Mapping[str, str]) -> Exchange:
        self.asked.append(message["method"])
        exchange = Exchange(message["id"], message["method"])
        self.answers[message["method"]](exchange)
        return exchange

    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        raise AssertionError("the era probe sends no notification")

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        raise AssertionError("the era probe answers nothing")

    def set_unsolicited_handler(self, handler: object) -> None:
        pass

    async def close(self) -> None:
        pass


def learner(channel: Scripted, setting: str = "auto") -> EraLearner:
    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[UpstreamChannel]:
        yield channel

    return EraLearner(setting, opened, opened)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("discover", "initialize", "expected"),
    [
        (error, result, UpstreamEras(legacy=True, modern=False)),  # server-everything
        (result, error, UpstreamEras(legacy=False, modern=True)),  # a 2026-only server
        (result, result, BOTH),  # mcp-server-time
        (unreachable, result, UpstreamEras(legacy=True, modern=False)),  # a legacy HTTP server's plain 400
        (error, error, BOTH),  # answers neither: forwarded as it is
    ],
)
async def test_auto_learns_from_the_two_questions(discover: Answer, initialize: Answer, expected: UpstreamEras) -> None:
    channel = Scripted({"server/discover": discover, "initialize": initialize})
    eras = learner(channel)
    assert await eras.get(5) == expected
    assert await eras.get(5) == expected
    assert channel.asked == ["server/discover", "initialize"]  # asked once


async def test_an_upstream_that_cannot_be_asked_is_asked_again_and_forwarded_meanwhile() -> None:
    channel = Scripted({"server/discover": unreachable, "initialize": unreachable})
    eras = learner(channel)
    assert await eras.get(5) == BOTH
    assert eras.known is None
    channel.answers = {"server/discover": error, "initialize": result}
    assert await eras.get(5) == UpstreamEras(legacy=True, modern=False)
    assert channel.asked == ["server/discover", "initialize"] * 2


@pytest.mark.parametrize(("setting", "legacy", "modern"), [("legacy", True, False), ("modern", False, True)])
async def test_a_configured_era_asks_nothing(setting: str, legacy: bool, modern: bool) -> None:
    channel = Scripted({})
    eras = learner(channel, setting)
    learnt = await eras.get(5)
    assert (learnt.speaks(Era.LEGACY), learnt.speaks(Era.MODERN)) == (legacy, modern)
    assert learnt.label == setting
    assert channel.asked == []


def test_labels_and_descriptions_name_what_is_bridged() -> None:
    assert BOTH.label == "both" and "forwarded in its own era" in BOTH.describe()
    assert "2026-07-28 clients are bridged" in UpstreamEras(legacy=True, modern=False).describe()
    assert "2025-11-25 clients are bridged" in UpstreamEras(legacy=False, modern=True).describe()
