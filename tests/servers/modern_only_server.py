"""A real MCP server (official ``mcp`` SDK, ``MCPServer``) that speaks 2026-07-28 only, as an upstream for the
gateway's era-bridge tests: 2025-11-25 clients reach it only through the gateway's bridge.

Usage::

    python tests/servers/modern_only_server.py [--http PORT]

stdio without ``--http``; otherwise Streamable HTTP on ``http://127.0.0.1:PORT/mcp``.

It refuses the handshake era: ``initialize`` gets -32022 (UnsupportedProtocolVersion, ``data.supported`` =
``["2026-07-28"]``), and any other request on a handshake-era conversation (no 2026-07-28 ``_meta`` envelope)
gets the same error. A ``ServerMiddleware`` (``refuse_handshake``) does it, ahead of the SDK's own handlers.

Tools:

* ``echo(text)``: returns the text;
* ``count(n=3, delay=0)``: ``n`` progress notifications (``progress`` 1..n, ``total`` n, message ``step i``),
  each after ``delay`` s, and an ``info`` log ``counting to n`` first, then ``counted to n``;
* ``wait(seconds=30, marker="")``: sleeps, then ``waited``; appends ``started``, then ``finished`` or ``cancelled``
  (one flushed line each) to the file ``marker``, so a test sees a cancel reach the server;
* ``ask(question="Your name?", sample=true)``: the 2026 way of asking mid-call (MRTR): the first round returns
  an ``InputRequiredResult`` with an ``elicitation/create`` form under ``name`` (and, if ``sample``, a
  ``sampling/createMessage`` under ``summary``) and a ``requestState``; the retry carrying ``inputResponses``
  (and the echoed state) answers ``Hello, <name>! <sampled text>`` (``No name (<action>)`` when the form was
  not accepted);
* ``add_tool(name)``: registers a tool ``name`` (it echoes) and publishes ``tools`` list-changed, which goes out
  as ``notifications/tools/list_changed`` on every ``subscriptions/listen`` that asked for it (the SDK's
  ``ListenHandler``);
* ``touch(uri)``: publishes an update of ``uri``: ``notifications/resources/updated`` on every listen whose
  ``resourceSubscriptions`` name it.

Resource ``memo://greeting`` (text ``hello from modern-only``); prompt ``greet(name)`` (one user message
``Say hello to <name>.``). ``server/discover`` declares tools/prompts/resources with ``listChanged``.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import UNSUPPORTED_PROTOCOL_VERSION, InputRequiredResult
from pydantic import BaseModel

MODERN = "2026-07-28"

# Logs still exist on the 2026-07-28 wire (a request opts in with `_meta` logLevel); the SDK only warns.
warnings.filterwarnings("ignore", message="The logging capability is deprecated")


async def refuse_handshake(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """What a 2026-only server answers to the handshake era: -32022 naming the versions it speaks."""
    if ctx.method == "initialize" or ctx.protocol_version != MODERN:
        raise MCPError(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"Unsupported protocol version: this server speaks {MODERN} only (no initialize handshake)",
            {"supported": [MODERN], "requested": (ctx.params or {}).get("protocolVersion")},
        )
    return await call_next(ctx)


def mark(path: str, line: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def plain(answer: Any) -> dict[str, Any]:
    """An input response as JSON (the SDK hands the tool its parsed model)."""
    return answer.model_dump(by_alias=True, exclude_none=True) if isinstance(answer, BaseModel) else dict(answer)


def build_server() -> MCPServer[None]:
    server: MCPServer[None] = MCPServer("modern-only-server", version="0.1.0", log_level="WARNING")
    server.middleware.append(refuse_handshake)

    async def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    async def count(ctx: Context, n: int = 3, delay: float = 0.0) -> str:
        """Send n progress notifications (and an info log first), then answer."""
        await ctx.request_context.session.send_log_message(
            "info", f"counting to {n}", related_request_id=ctx.request_id
        )
        for i in range(1, n + 1):
            if delay:
                await anyio.sleep(delay)
            await ctx.report_progress(i, n, f"step {i}")
        return f"counted to {n}"

    async def wait(seconds: float = 30.0, marker: str = "") -> str:
        """Sleep for `seconds`, then answer; appends `started`, then `finished` or `cancelled`, to `marker`."""
        mark(marker, "started")
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            mark(marker, "cancelled")
            raise
        mark(marker, "finished")
        return "waited"

    async def ask(ctx: Context, question: str = "Your name?", sample: bool = True) -> str | InputRequiredResult:
        """Ask for a name (elicitation) and, if `sample`, a summary (sampling) the 2026 way, then greet."""
        answers = ctx.input_responses
        if not answers:
            schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
            sampling = {
                "messages": [{"role": "user", "content": {"type": "text", "text": "Summarize"}}],
                "maxTokens": 20,
            }
            form = {"mode": "form", "message": question, "requestedSchema": schema}
            requests: dict[str, Any] = {"name": {"method": "elicitation/create", "params": form}}
            if sample:
                requests["summary"] = {"method": "sampling/createMessage", "params": sampling}
            return InputRequiredResult.model_validate({"inputRequests": requests, "requestState": "asked-once"})
        if ctx.request_state != "asked-once":
            raise MCPError(-32602, f"unexpected requestState {ctx.request_state!r}")
        form = plain(answers["name"])
        if form.get("action") != "accept":
            return f"No name ({form.get('action')})"
        greeting = f"Hello, {form.get('content', {}).get('name')}!"
        if "summary" in answers:
            greeting += f" {plain(answers['summary']).get('content', {}).get('text')}"
        return greeting

    async def add_tool(ctx: Context, name: str) -> str:
        """Register a tool `name` (it echoes) and tell subscriptions/listen streams the list changed."""

        async def added(text: str) -> str:
            return text

        server.add_tool(added, name=name, description=f"added at run time as {name}", structured_output=False)
        await ctx.notify_tools_changed()
        return f"added {name}"

    async def touch(ctx: Context, uri: str) -> str:
        """Tell subscriptions/listen streams subscribed to `uri` that it changed."""
        await ctx.notify_resource_updated(uri)
        return f"touched {uri}"

    for fn in (echo, count, wait, ask, add_tool, touch):
        server.add_tool(fn, structured_output=False)

    @server.resource("memo://greeting", mime_type="text/plain")
    def greeting() -> str:
        """A fixed greeting."""
        return "hello from modern-only"

    @server.prompt()
    def greet(name: str) -> str:
        """Ask the model to greet `name`."""
        return f"Say hello to {name}."

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP on 127.0.0.1:PORT/mcp")
    args = parser.parse_args()
    server = build_server()
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
