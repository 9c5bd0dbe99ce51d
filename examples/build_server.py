"""A realistic "legacy" MCP server (no Tasks) for trying and testing the gateway: a build/test runner.

It is written with the official ``mcp`` SDK (``MCPServer``) and knows nothing about the gateway.
Its tools stream progress and log notifications, call back into the client (sampling, elicitation),
announce list changes, and expose a prompt, resources and completions, so every forwarding path has
something real to carry.

Run it on stdio (the default) or as a Streamable HTTP server at ``/mcp`` with the SDK defaults
(SSE responses, sessions)::

    python examples/build_server.py
    python examples/build_server.py --http --host 127.0.0.1 --port 8765

``slow_build(marker=PATH)`` appends ``started``, ``step i`` and ``finished`` or ``cancelled`` to PATH,
one flushed line each, so tests can observe from outside whether the tool ran on or was stopped.
Nothing but JSON-RPC is ever written to stdout in stdio mode; diagnostics go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, Elicit, ElicitationResult, MCPServer, Resolve, UserMessage
from mcp.server.mcpserver.prompts.base import Message
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import (
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    TextContent,
)
from pydantic import BaseModel, Field

SERVER_NAME = "build-server"
SERVER_VERSION = "0.1.0"
LOGGER = "builder"

LANGUAGES = ("python", "go", "rust", "typescript", "javascript", "java", "c", "cpp")
BUILD_IDS = ("1001", "1002", "1003", "1010", "1011", "2001")

BuildContext = Context[Any, Any]

# Logging and sampling are deprecated at 2026-07-28 but are exactly what a legacy server uses;
# keep the warning per call site out of stderr (which the gateway relays into its own log).
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

mcp = MCPServer(
    SERVER_NAME,
    version=SERVER_VERSION,
    instructions="A build and test runner. Long tools stream progress and logs.",
    log_level="WARNING",
)


def _mark(path: str, line: str) -> None:
    """Append one flushed line to the marker file (blocking, but tiny; kept out of async bodies)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()


class Answer(BaseModel):
    """The form `ask_user` elicits from the client."""

    answer: str = Field(description="Your answer")


@mcp.tool()
async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@mcp.tool()
async def slow_build(ctx: BuildContext, steps: int = 3, delay: float = 0.2, marker: str = "") -> str:
    """Run a build of `steps` steps, `delay` seconds each, reporting progress and logs per step."""
    if marker:
        _mark(marker, "started")
    try:
        await ctx.info(f"build started: {steps} steps", logger_name=LOGGER)
        for i in range(1, steps + 1):
            await anyio.sleep(delay)
            await ctx.report_progress(i, steps, f"step {i}/{steps}")
            await ctx.info(f"finished step {i}", logger_name=LOGGER)
            if marker:
                _mark(marker, f"step {i}")
    except anyio.get_cancelled_exc_class():
        if marker:
            _mark(marker, "cancelled")
        raise
    if marker:
        _mark(marker, "finished")
    return f"built {steps} steps"


@mcp.tool()
async def run_tests(ctx: BuildContext, suite: str = "unit", count: int = 5, delay: float = 0.1) -> str:
    """Run `count` tests of `suite`; every third test fails (deterministically) with a warning log."""
    await ctx.info(f"running {count} {suite} tests", logger_name=LOGGER)
    failed: list[str] = []
    for i in range(1, count + 1):
        await anyio.sleep(delay)
        name = f"{suite}::test_{i:03d}"
        if i % 3 == 0:
            failed.append(name)
            await ctx.warning(f"FAILED {name}: expected 200, got 500", logger_name=LOGGER)
        else:
            await ctx.info(f"passed {name}", logger_name=LOGGER)
        await ctx.report_progress(i, count, f"test {i}/{count}")
    passed = count - len(failed)
    summary = f"{suite}: {passed} passed, {len(failed)} failed"
    if failed:
        summary += " (" + ", ".join(failed) + ")"
    return summary


@mcp.tool()
async def burst(ctx: BuildContext, n: int) -> str:
    """Send `n` progress notifications back to back, without sleeping."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n)
    return f"sent {n}"


@mcp.tool()
async def ticker(ctx: BuildContext, rate: float = 10.0, seconds: float = 5.0) -> str:
    """Emit progress at `rate` per second for `seconds`, each stamped with its send time (`t=<unix>`)."""
    total = max(1, int(rate * seconds))
    started = time.monotonic()
    for i in range(1, total + 1):
        # Sleep to the schedule rather than a fixed delay, so the rate holds under load.
        await anyio.sleep(max(0.0, started + i / rate - time.monotonic()))
        await ctx.report_progress(i, total, f"t={time.time():.6f}")
    return f"ticked {total} times"


@mcp.tool()
async def announce(ctx: BuildContext) -> str:
    """Announce that the tool list changed (legacy: notifications/tools/list_changed; 2026: the listen bus)."""
    # `ctx.notify_tools_changed()` only publishes to 2026 `subscriptions/listen` streams; a
    # 2025-11-25 client hears of the change through the session's unsolicited notification,
    # which rides the standalone channel (the GET stream on Streamable HTTP).
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()
    return "announced"


@mcp.tool()
async def ask_user(ctx: BuildContext, question: str) -> str:
    """Ask the user a question through elicitation and report the answer."""
    result = await ctx.elicit(question, Answer)
    if result.action == "accept":
        return f"user said: {result.data.answer}"
    return f"user {result.action}"


class Confirm(BaseModel):
    """The form `deploy` elicits before it deploys."""

    confirm: bool = Field(description="Deploy now?")
    note: str = Field(default="", description="A note for the deploy log")


async def ask_confirmation(environment: str, preflight: float) -> Elicit[Confirm]:
    """`deploy`'s resolver: after `preflight` seconds of checks, ask the user to confirm (a mid-call
    `elicitation/create` up to 2025-11-25; at 2026-07-28 an `InputRequiredResult`, answered by
    retrying the call with `inputResponses`, which runs the resolver again)."""
    await anyio.sleep(preflight)
    return Elicit(f"Deploy to {environment}?", Confirm)


@mcp.tool()
async def deploy(
    ctx: BuildContext,
    environment: str,
    confirm: Annotated[ElicitationResult[Confirm], Resolve(ask_confirmation)],
    steps: int = 3,
    delay: float = 0.1,
    preflight: float = 0.0,
) -> str:
    """Deploy to `environment` once the user confirms: `steps` steps of `delay` seconds, with progress.
    `preflight` seconds of checks come before the question."""
    if confirm.action != "accept" or not confirm.data.confirm:
        return "deployment cancelled"
    note = f" ({confirm.data.note})" if confirm.data.note else ""
    await ctx.info(f"deploying to {environment}{note}", logger_name=LOGGER)
    for i in range(1, steps + 1):
        await anyio.sleep(delay)
        await ctx.report_progress(i, steps, f"deploy step {i}/{steps}")
    return f"deployed to {environment}"


@mcp.tool()
async def summarize(ctx: BuildContext, text: str) -> str:
    """Summarize `text` by asking the client's model (sampling)."""
    result = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize: {text}"))],
        max_tokens=200,
        system_prompt="You summarize build logs in one sentence.",
        related_request_id=ctx.request_id,
    )
    content = result.content
    if isinstance(content, TextContent):
        return str(content.text)
    return str(content)


@mcp.tool()
async def whoami() -> int:
    """Return this server process's PID."""
    return os.getpid()


@mcp.prompt()
def review_code(code: str, language: str = "python") -> list[Message]:
    """Ask for a review of a piece of code."""
    return [UserMessage(f"Please review this {language} code for bugs and style:\n\n```{language}\n{code}\n```")]


@mcp.resource("build://logs/latest", name="latest-build-log", mime_type="text/plain")
def latest_log() -> str:
    """The log of the most recent build."""
    return _log_text(BUILD_IDS[-1])


@mcp.resource("build://logs/{build_id}", name="build-log", mime_type="text/plain")
def build_log(build_id: str) -> str:
    """The log of one build."""
    return _log_text(build_id)


def _log_text(build_id: str) -> str:
    return f"build {build_id}\nstep 1 ok\nstep 2 ok\nstep 3 ok\nresult: success\n"


async def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion | None:
    """Complete the `language` argument of `review_code` and the `build_id` of the log template."""
    if argument.name == "language":
        options: tuple[str, ...] = LANGUAGES
    elif argument.name == "build_id":
        options = BUILD_IDS
    else:
        return None
    values = [v for v in options if v.startswith(argument.value)]
    return Completion(values=values, total=len(values), has_more=False)


# `MCPServer.completion` is unannotated in the SDK, so mypy --strict sees an untyped call.
mcp.completion()(complete)  # type: ignore[no-untyped-call]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--http", action="store_true", help="serve Streamable HTTP at /mcp instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    transport: Literal["stdio", "http"] = "http" if args.http else "stdio"
    where = f"http://{args.host}:{args.port}/mcp" if transport == "http" else "stdio"
    print(f"build_server ready on {where} (pid {os.getpid()})", file=sys.stderr, flush=True)
    if transport == "http":
        mcp.run("streamable-http", host=args.host, port=args.port)
    else:
        mcp.run("stdio")


if __name__ == "__main__":
    main()
