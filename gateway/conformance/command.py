"""`mcp-task-gateway conformance URL`: parse the kit's options, run the eras, print the table, write
the JUnit and JSON reports; exit 0 only when no check failed (2 for bad options)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.client.commands import parse_arguments
from gateway.client.headers import BadHeader, parse_headers, request_headers
from gateway.client.tail import UsageError, parse_era
from gateway.conformance.checks import Target, run_era
from gateway.conformance.registry import ERAS, Result
from gateway.conformance.report import as_json, counts, junit, table
from gateway.protocol.era import Era

DEFAULT_TOOL = "slow_build"
DEFAULT_ARGUMENTS: dict[str, Any] = {"steps": 6, "delay": 0.25}
"""For examples/build_server.py: 1.5 s of work, 15 events; long enough that a 2026-07-28 gateway with
its default 1 s `after_ms` makes it a task."""


async def run(target: Target, eras: Sequence[Era]) -> list[Result]:
    """Every check of every era in `eras` against `target`, era after era."""
    results: list[Result] = []
    for era in eras:
        results += await run_era(target, era)
    return results


def eras_named(text: str) -> tuple[Era, ...]:
    """`--era`: `both`, or one era (`legacy`, `modern`), parsed once at the command's edge."""
    return ERAS if text == "both" else (parse_era(text),)


def main(
    url: str,
    *,
    era: str = "both",
    tool: str | None = None,
    args_json: str | None = None,
    headers: Sequence[str] = (),
    other_headers: Sequence[str] | None = None,
    timeout: float = 15.0,
    json_path: str | None = None,
    junit_path: str | None = None,
) -> int:
    try:
        eras = eras_named(era)
        target = Target(
            url=url,
            tool=tool or DEFAULT_TOOL,
            arguments=dict(DEFAULT_ARGUMENTS) if tool is None and args_json is None else parse_arguments(args_json),
            headers=request_headers(headers),
            other_headers=None if other_headers is None else parse_headers(other_headers, "--other-header"),
            timeout=timeout,
        )
    except (UsageError, BadHeader) as exc:
        print(f"mcp-task-gateway conformance: {exc}", file=sys.stderr)
        return 2
    print(f"SEP-2694 conformance of {url} (tool {target.tool!r})", flush=True)
    results = asyncio.run(run(target, eras))
    print(table(results))
    if json_path:
        Path(json_path).write_text(json.dumps(as_json(url, results), indent=1, ensure_ascii=False) + "\n")
    if junit_path:
        Path(junit_path).write_text(junit(url, results), encoding="utf-8")
    return 1 if counts(results)["fail"] else 0
