"""A plain MCP server (official ``mcp`` SDK, ``MCPServer``, no Tasks of its own) with the tools the official
conformance suite's ``tasks-*`` scenarios call, so that the gateway hosts every task the suite asks for.

Usage::

    python tests/servers/tasks_suite_server.py

stdio only. The tools (names and arguments as the suite's scenarios call them; which of them become
tasks is the gateway's ``[[tasks.tools]]`` policy, see tests/test_official_suite.py):

* ``greet(name)``: ``Hello, {name}!`` at once;
* ``slow_compute(seconds, label="")``: sleeps ``seconds``, then ``computed {label} in {seconds}s``;
* ``failing_job()``: after 1 s, a tool execution error (``isError: true``);
* ``protocol_error_job()``: fails at once with JSON-RPC error -32603 (a protocol-level error, not a tool
  error), the fast failure a gateway must still turn into a ``failed`` task under ``always``;
* ``confirm_delete(filename)``: asks ``Delete {filename}?`` (a form with ``confirm``) through an SDK
  resolver, so at 2026-07-28 its first round is an ``InputRequiredResult``; then ``deleted {filename}`` or
  ``kept {filename}``;
* ``multi_input()``: two independent resolvers, so two ``elicitation/create`` requests in one
  ``InputRequiredResult``; then both names;
* ``test_tool_with_task()``: asks for ``name`` (the user's name), then ``Hello, {name}!``.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import anyio
from mcp.server.mcpserver import Elicit, MCPServer, Resolve
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

mcp = MCPServer("tasks-suite-server", version="0.1.0", log_level="WARNING")


class Confirmation(BaseModel):
    """The form `confirm_delete` elicits."""

    confirm: bool = Field(description="Go ahead?")


class Name(BaseModel):
    """The form `multi_input` and `test_tool_with_task` elicit."""

    name: str = Field(description="A name")


@mcp.tool()
async def greet(name: str) -> str:
    """Greet `name`."""
    return f"Hello, {name}!"


@mcp.tool()
async def slow_compute(seconds: float, label: str = "") -> str:
    """Compute for `seconds` seconds."""
    await anyio.sleep(seconds)
    return f"computed {label} in {seconds}s"


@mcp.tool()
async def failing_job() -> str:
    """Run for a second, then fail as a tool (isError)."""
    await anyio.sleep(1.0)
    raise ValueError("failing_job always fails")


@mcp.tool()
async def protocol_error_job() -> str:
    """Fail at once with a JSON-RPC error (-32603), not a tool error."""
    raise MCPError(code=-32603, message="protocol_error_job: internal error")


async def ask_delete(filename: str) -> Elicit[Confirmation]:
    return Elicit(f"Delete {filename}?", Confirmation)


@mcp.tool()
async def confirm_delete(filename: str, answer: Annotated[Confirmation, Resolve(ask_delete)]) -> str:
    """Delete `filename` once the user confirms."""
    return f"deleted {filename}" if answer.confirm else f"kept {filename}"


async def ask_first() -> Elicit[Name]:
    return Elicit("First name?", Name)


async def ask_second() -> Elicit[Name]:
    return Elicit("Second name?", Name)


@mcp.tool()
async def multi_input(first: Annotated[Name, Resolve(ask_first)], second: Annotated[Name, Resolve(ask_second)]) -> str:
    """Ask two questions at once, then report both answers."""
    return f"got {first.name} and {second.name}"


async def ask_user_name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


@mcp.tool()
async def test_tool_with_task(user_name: Annotated[Name, Resolve(ask_user_name)]) -> str:
    """Ask for the user's name, then greet them."""
    return f"Hello, {user_name.name}!"


def main() -> None:
    print(f"tasks_suite_server ready on stdio (pid {os.getpid()})", file=sys.stderr, flush=True)
    mcp.run("stdio")


if __name__ == "__main__":
    main()
