"""The `mcp-task-gateway` command: serve, check-config, call, tasks, tools, tail, conformance and demo.

Thin: it parses the command line and hands over; the client commands live in `gateway.client`
(`tail.py`, `commands.py`), the conformance kit in `gateway.conformance`, the server in `gateway.app`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeAlias

from pydantic import ValidationError

from gateway import __version__
from gateway.config import Config, ConfigError, describe_errors, load_config, parse_listen
from gateway.events.log import StoreUnavailable

EXIT_CODES = (
    "Exit codes: 0 completed (call --task, tasks list|get|cancel, tools: done), 1 failed (or the tool's result "
    "has isError), 2 unknown task, another error answer (401/403 too, a path that answers 404) or bad input, "
    "3 cancelled, 4 events no longer retained (events_gone), 5 gateway unreachable, 6 call --task answered "
    "without a task (the answer is on stderr), 130 interrupted (Ctrl-C; tail and --follow print the command "
    "that resumes)."
)
log = logging.getLogger("gateway")

URL_HELP = "the gateway's MCP endpoint, e.g. http://127.0.0.1:8765/mcp"
HEADER_HELP = (
    "a header for every request, e.g. 'Authorization: Bearer TOKEN' for a gateway with [auth] (repeat; "
    "without an Authorization header, $MCP_GATEWAY_TOKEN is sent as one)"
)
DATA_DIR_ENV = "MCP_GATEWAY_DATA_DIR"
"""The environment variable naming the data folder, when `serve --data-dir` does not."""
ERA_HELP = "protocol era: legacy (2025-11-25, the default) or modern (2026-07-28)"
ANSWERS_HELP = (
    "answers to the server's form questions (elicitation), a JSON object of field values, e.g. "
    "'{\"confirm\": true}'; without it, a terminal prompts for them"
)


Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""Where each subcommand adds its parser (`_parser`)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-task-gateway", description=__doc__.split("\n")[0], epilog="call, tasks and tail: " + EXIT_CODES
    )
    parser.add_argument("--version", action="version", version=f"mcp-task-gateway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_arguments, _ in SUBCOMMANDS.values():
        add_arguments(commands)
    return parser


def _add_serve(commands: Subcommands) -> None:
    serve = commands.add_parser("serve", help="run the gateway in front of one MCP server, or several")
    serve.add_argument("--config", metavar="PATH", help="TOML config file (see config/gateway.example.toml)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8765)")
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help='with [auth] mode = "none", listen beyond loopback anyway (anyone who reaches it can call)',
    )
    serve.add_argument(
        "--data-dir",
        metavar="DIR",
        help=f"the folder of the SQLite store's file (default: ${DATA_DIR_ENV}, else the folder of [store] path, "
        "data/); a second gateway in the same checkout needs one of its own",
    )
    upstream = serve.add_mutually_exclusive_group()
    upstream.add_argument(
        "--upstream-url", metavar="URL", help="Streamable HTTP upstream, e.g. http://127.0.0.1:9000/mcp"
    )
    upstream.add_argument("--upstream-cmd", metavar="'CMD ARGS...'", type=_command, help="stdio upstream command line")
    upstream.add_argument(
        "--upstream",
        metavar="NAME=CMD_OR_URL",
        action="append",
        type=_named_upstream,
        help="one of several named upstreams (repeat; replaces the file's [[upstreams]]): an http(s):// URL or "
        "a command line, each served on /servers/NAME/mcp and together on the MCP path, e.g. "
        "--upstream 'build=python build_server.py' --upstream search=http://127.0.0.1:9000/mcp",
    )


def _add_check_config(commands: Subcommands) -> None:
    check = commands.add_parser(
        "check-config",
        help="validate a config file and exit",
        description="Validate a config file: exit 0 if usable, 2 with one line saying what is wrong.",
    )
    check.add_argument("path")
    check.add_argument(
        "--connect",
        action="store_true",
        help="also open the configured store (creating a SQLite file); exit 1 if its server is down",
    )


def _add_call(commands: Subcommands) -> None:
    call = commands.add_parser(
        "call",
        help="call a tool: print its result, or start it as a task (--task) and follow it (--follow)",
        description="Call a tool and print its result, showing its progress and log messages on stderr "
        "meanwhile. With --task, start it as a task and print the task id, and nothing else on stdout "
        "(fetch the result later with `tasks URL result TASK_ID`); with --task --follow, print the task's events "
        "as they arrive, like tail, then its result. " + EXIT_CODES,
    )
    call.add_argument("url", metavar="URL", help=URL_HELP)
    call.add_argument("tool", metavar="TOOL", help="the tool's name")
    call.add_argument("--args", metavar="JSON", dest="args_json", help="the arguments, a JSON object (default {})")
    call.add_argument("--task", action="store_true", help="start the call as a task; print its id")
    call.add_argument("--follow", action="store_true", help="with --task (implied): print its events, then its result")
    call.add_argument("--era", choices=["legacy", "modern"], default="legacy", help=ERA_HELP)
    call.add_argument("--json", action="store_true", help="print JSON: the result (one object per line; events too)")
    call.add_argument("--answers", metavar="JSON", dest="answers_json", help=ANSWERS_HELP)
    call.add_argument("--quiet", action="store_true", help="do not show progress and log messages on stderr")
    call.add_argument("--header", metavar="'K: V'", action="append", default=[], help=HEADER_HELP)


def _add_tasks(commands: Subcommands) -> None:
    tasks = commands.add_parser(
        "tasks",
        help="list the tasks, or get, fetch the result of, or cancel one",
        description="One task method: list (tasks/list, legacy era only), get (tasks/get), result (wait for the "
        "task to end and print its result) or cancel (tasks/cancel, then the task as it is now). " + EXIT_CODES,
    )
    tasks.add_argument("url", metavar="URL", help=URL_HELP)
    tasks.add_argument("action", choices=["list", "get", "result", "cancel"])
    tasks.add_argument("task_id", metavar="TASK_ID", nargs="?", help="the task (get, result, cancel)")
    tasks.add_argument("--era", choices=["legacy", "modern"], default="legacy", help=ERA_HELP)
    tasks.add_argument("--json", action="store_true", help="print JSON: the task, the result, or one task per line")
    tasks.add_argument("--answers", metavar="JSON", dest="answers_json", help="result: " + ANSWERS_HELP)
    tasks.add_argument("--header", metavar="'K: V'", action="append", default=[], help=HEADER_HELP)


def _add_tools(commands: Subcommands) -> None:
    tools = commands.add_parser(
        "tools",
        help="list the tools: name, task support, description",
        description="List the server's tools (tools/list): name, effective task support (the tool's "
        "execution.taskSupport: forbidden, optional or required) and the first line of the description. " + EXIT_CODES,
    )
    tools.add_argument("url", metavar="URL", help=URL_HELP)
    tools.add_argument("--era", choices=["legacy", "modern"], default="legacy", help=ERA_HELP)
    tools.add_argument("--json", action="store_true", help="print each tool as listed, one JSON object per line")
    tools.add_argument("--header", metavar="'K: V'", action="append", default=[], help=HEADER_HELP)


def _add_tail(commands: Subcommands) -> None:
    tail = commands.add_parser(
        "tail",
        help="print a task's events as they arrive (tasks/stream), then exit with its outcome",
        description="Follow a task's event stream, reconnecting and resuming on its own. Each line shows the "
        "time the gateway recorded the event (local time); a time marked ~ is when it arrived here, for a "
        "server that records none. " + EXIT_CODES,
    )
    tail.add_argument("url", metavar="URL", help=URL_HELP)
    tail.add_argument("task_id", metavar="TASK_ID")
    tail.add_argument(
        "--after", metavar="N", type=_seq, help="start after event seq N (default: the earliest retained)"
    )
    tail.add_argument("--json", action="store_true", help="one JSON object per event (the event's params) per line")
    tail.add_argument("--era", choices=["legacy", "modern"], default="legacy", help=ERA_HELP)
    tail.add_argument("--header", metavar="'K: V'", action="append", default=[], help=HEADER_HELP)


def _add_conformance(commands: Subcommands) -> None:
    kit = commands.add_parser(
        "conformance",
        help="check any Streamable HTTP MCP server or gateway against SEP-2694 (tasks/stream), rule by rule",
        description="A black-box SEP-2694 conformance check: starts a task with TOOL, streams it in every way "
        "the SEP defines, and reports each MUST and SHOULD as passed, failed (with the request and answer) or "
        "skipped (with the reason). Exit 0 only when nothing failed. See docs/conformance.md.",
    )
    kit.add_argument("url", metavar="URL", help="the server's MCP endpoint, e.g. http://127.0.0.1:8765/mcp")
    kit.add_argument("--era", choices=["legacy", "modern", "both"], default="both", help="protocol era(s) to check")
    kit.add_argument(
        "--tool", help="a tool that runs as a task and emits events (default slow_build of examples/build_server.py)"
    )
    kit.add_argument(
        "--args", metavar="JSON", dest="args_json", help='its arguments (default {"steps": 6, "delay": 0.25})'
    )
    kit.add_argument("--header", metavar="'K: V'", action="append", default=[], help=HEADER_HELP)
    kit.add_argument(
        "--other-header",
        metavar="'K: V'",
        action="append",
        help="a header of a second caller, for the authorization check (repeat; without it that check is skipped)",
    )
    kit.add_argument(
        "--timeout",
        metavar="S",
        type=float,
        default=15.0,
        help="bound on each wait, and on a stream's end after its task is terminal (default 15)",
    )
    kit.add_argument("--json", metavar="FILE", dest="json_path", help="write the results as JSON")
    kit.add_argument("--junit", metavar="FILE", dest="junit_path", help="write the results as JUnit XML")


def _add_demo(commands: Subcommands) -> None:
    demo = commands.add_parser(
        "demo", help="run the example server behind a gateway process and show tasks/stream end to end"
    )
    demo.add_argument("--keep", action="store_true", help="keep the gateway running afterwards (until Ctrl-C)")
    demo.add_argument(
        "--upstream-cmd", metavar="'CMD ARGS...'", help="the stdio upstream (default: examples/build_server.py)"
    )


def _seq(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a non-negative integer")
    return int(value)


def _command(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as exc:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None


def _named_upstream(value: str) -> dict[str, object]:
    """`NAME=CMD_OR_URL` as an `[[upstreams]]` entry; the name is checked with the rest of the config."""
    name, equals, target = value.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=CMD_OR_URL")
    if target.startswith(("http://", "https://")):
        return {"name": name, "url": target}
    return {"name": name, "command": _command(target)}


def _apply_flags(config: Config, args: argparse.Namespace) -> Config:
    """Flags override the file; re-validate so a bad flag is reported like a bad key."""
    data = in_data_dir(config, args.data_dir).model_dump()
    if args.listen:
        data["server"]["listen"] = args.listen
    if args.allow_unauthenticated:
        data["auth"]["allow_unauthenticated"] = True
    # Upstream flags replace the file's upstreams, whichever form the file uses.
    if args.upstream_url:
        data["upstreams"] = []
        data["upstream"].update(url=args.upstream_url, command=None)
    if args.upstream_cmd:
        data["upstreams"] = []
        data["upstream"].update(command=args.upstream_cmd, url=None)
    if args.upstream:
        data["upstreams"] = args.upstream
        data["upstream"].update(url=None, command=None)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"command line: {describe_errors(exc)}") from None


def in_data_dir(config: Config, flag: str | None = None) -> Config:
    """The SQLite store's file moved into the data folder: `--data-dir`, else $MCP_GATEWAY_DATA_DIR, else
    where `[store] path` puts it (default data/). Its file name stays `[store] path`'s (gateway.db)."""
    folder = flag or os.environ.get(DATA_DIR_ENV)
    if not folder:
        return config
    path = str(Path(folder) / Path(config.store.path).name)
    return config.model_copy(update={"store": config.store.model_copy(update={"path": path})})


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def _check_exposure(config: Config) -> None:
    """Refuse to serve everyone as one anonymous principal beyond loopback, unless told to."""
    host, _ = parse_listen(config.server.listen)
    if config.auth.mode != "none" or _is_loopback(host):
        return
    if not config.auth.allow_unauthenticated:
        raise ConfigError(
            f"refusing to listen on {config.server.listen} without authentication: set [auth] mode "
            '"api_key" or "oauth", or pass --allow-unauthenticated (allow_unauthenticated = true)'
        )
    log.warning(
        'listening on %s with [auth] mode = "none": anyone who can reach it can call every tool and read every task',
        config.server.listen,
    )


def _check_store(path: str, config: Config) -> int:
    """`check-config --connect`: open the store and reach its server (0: usable, its warnings printed;
    1: its server cannot be reached). A store that cannot be used at all raises StoreUnavailable (2)."""
    from gateway.app import build_stores

    async def check() -> list[str]:
        stores = build_stores(config)
        try:
            return await stores.check() if stores.check is not None else []
        finally:
            await stores.close()

    try:
        warnings = asyncio.run(check())
    except OSError as exc:  # its server cannot be reached (the Redis store's StoreUnreachable)
        print(f"mcp-task-gateway: {path}: store {config.store.kind!r} not reachable: {exc}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"mcp-task-gateway: warning: {warning}", file=sys.stderr)
    print(f"{path}: ok (store {config.store.kind!r} opened and reachable)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gateway.app import ListenError, serve
    from gateway.drain import sigterm_handler
    from gateway.logs import setup_logging
    from gateway.reload import ConfigReloader

    reloader = ConfigReloader(args.config, lambda config: _apply_flags(config, args))
    config = reloader.current.config
    if not (config.upstream.url or config.upstream.command or config.upstreams):
        raise ConfigError(
            "no upstream: set upstream.url or upstream.command, or [[upstreams]] entries, or pass "
            "--upstream-url/--upstream-cmd or --upstream NAME=CMD_OR_URL"
        )
    setup_logging(config.logging.level, config.logging.format)
    _check_exposure(config)

    listening = asyncio.Event()

    def announce(url: str) -> None:
        listening.set()
        print(f"mcp-task-gateway listening on {url}", flush=True)

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        # SIGINT (Ctrl-C) stops at once; SIGTERM drains first, and a second SIGTERM stops at once.
        drain_requested = asyncio.Event()
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        loop.add_signal_handler(signal.SIGTERM, sigterm_handler(drain_requested, task, listening))
        loop.add_signal_handler(signal.SIGHUP, reloader.reload_soon)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(config, announce, reloader, drain_requested)

    try:
        asyncio.run(run())
    except ListenError as exc:
        print(f"mcp-task-gateway: {exc}", file=sys.stderr)
        return 2
    return 0


def _run_check_config(args: argparse.Namespace) -> int:
    config = in_data_dir(load_config(args.path))
    if args.connect:
        return _check_store(args.path, config)
    print(f"{args.path}: ok")
    return 0


def _run_tail(args: argparse.Namespace) -> int:
    from gateway.client import tail

    return tail.main(args.url, args.task_id, after=args.after, json_lines=args.json, era=args.era, headers=args.header)


def _run_call(args: argparse.Namespace) -> int:
    from gateway.client import commands

    return commands.main_call(
        args.url,
        args.tool,
        args.args_json,
        task=args.task,
        follow=args.follow,
        era=args.era,
        json_out=args.json,
        headers=args.header,
        quiet=args.quiet,
        answers_json=args.answers_json,
    )


def _run_tasks(args: argparse.Namespace) -> int:
    from gateway.client import commands

    return commands.main_tasks(
        args.url,
        args.action,
        args.task_id,
        era=args.era,
        json_out=args.json,
        headers=args.header,
        answers_json=args.answers_json,
    )


def _run_tools(args: argparse.Namespace) -> int:
    from gateway.client import commands

    return commands.main_tools(args.url, era=args.era, json_out=args.json, headers=args.header)


def _run_conformance(args: argparse.Namespace) -> int:
    from gateway.conformance import command

    return command.main(
        args.url,
        era=args.era,
        tool=args.tool,
        args_json=args.args_json,
        headers=args.header,
        other_headers=args.other_header,
        timeout=args.timeout,
        json_path=args.json_path,
        junit_path=args.junit_path,
    )


def _run_demo(args: argparse.Namespace) -> int:
    from gateway.client import demo

    return demo.main(keep=args.keep, upstream_cmd=args.upstream_cmd)


SUBCOMMANDS: dict[str, tuple[Callable[[Subcommands], None], Callable[[argparse.Namespace], int]]] = {
    "serve": (_add_serve, _serve),
    "check-config": (_add_check_config, _run_check_config),
    "call": (_add_call, _run_call),
    "tasks": (_add_tasks, _run_tasks),
    "tools": (_add_tools, _run_tools),
    "tail": (_add_tail, _run_tail),
    "conformance": (_add_conformance, _run_conformance),
    "demo": (_add_demo, _run_demo),
}
"""Each subcommand, in the order `--help` lists them: how its arguments are parsed, and what runs it.
The client commands import their modules only when run, so `tail` and `call` start light."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _, run = SUBCOMMANDS[args.command]
    try:
        return run(args)
    except (ConfigError, StoreUnavailable) as exc:
        print(f"mcp-task-gateway: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mcp-task-gateway: {exc}", file=sys.stderr)
        return 1
