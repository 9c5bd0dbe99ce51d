"""The modern bridge checks a bridged `tools/call`'s `Mcp-Param-*` headers as a 2026-07-28 server must
(SEP-2243), against the schemas its legacy session lists: in process, with a scripted session."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, ProtocolError
from gateway.upstream.bridge.param_headers import ToolSchemas

SCHEMA = {
    "type": "object",
    "properties": {"region": {"type": "string", "x-mcp-header": "Region"}, "size": {"type": "integer"}},
}


class Session:
    """Answers tools/list in two pages (the annotated tool on the second), and counts the pages asked."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    async def ask(self, method: str, params: dict[str, Any]) -> Message:
        assert method == "tools/list"
        self.asked.append(params)
        if "cursor" not in params:
            return {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "plain"}], "nextCursor": "2"}}
        return {"jsonrpc": "2.0", "id": 2, "result": {"tools": [{"name": "regional", "inputSchema": SCHEMA}]}}


def call(name: str, **arguments: Any) -> Message:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


async def test_matching_headers_pass_and_the_list_is_asked_once() -> None:
    session, schemas = Session(), ToolSchemas()
    await schemas.check(session.ask, call("regional", region="eu"), {"Mcp-Param-Region": "eu"})
    await schemas.check(session.ask, call("regional", region="Hello"), {"mcp-param-region": "=?base64?SGVsbG8=?="})
    await schemas.check(session.ask, call("plain", region="eu"), {})
    await schemas.check(session.ask, call("unknown"), {"Mcp-Param-Region": "eu"})  # the upstream says unknown
    assert session.asked == [{}, {"cursor": "2"}]


@pytest.mark.parametrize(
    ("arguments", "headers", "says"),
    [
        ({"region": "eu"}, {}, "missing"),
        ({"region": "eu"}, {"Mcp-Param-Region": "us"}, "does not match"),
        ({}, {"Mcp-Param-Region": "eu"}, "argument is absent"),
        ({"region": "Hello"}, {"Mcp-Param-Region": "=?base64?SGVs!!!bG8=?="}, "malformed base64"),
    ],
)
async def test_a_disagreeing_header_gets_header_mismatch(
    arguments: dict[str, Any], headers: dict[str, str], says: str
) -> None:
    with pytest.raises(ProtocolError) as refused:
        await ToolSchemas().check(Session().ask, call("regional", **arguments), headers)
    assert (refused.value.code, refused.value.http_status) == (jsonrpc.HEADER_MISMATCH, 400)
    assert says in refused.value.message and "Mcp-Param-Region" in refused.value.message


async def test_a_changed_list_is_asked_again() -> None:
    session, schemas = Session(), ToolSchemas()
    await schemas.check(session.ask, call("regional", region="eu"), {"Mcp-Param-Region": "eu"})
    schemas.forget()
    await schemas.check(session.ask, call("regional", region="eu"), {"Mcp-Param-Region": "eu"})
    assert len(session.asked) == 4
