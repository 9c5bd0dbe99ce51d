"""The gateway's own CPU time per forwarded `tools/call`, read from /proc: a measure the load of a shared
machine barely moves (unlike wall-clock latency), for comparing two builds side by side.

Starts the example server over Streamable HTTP and a gateway in front of it, both from TREE (a checkout;
run it once per tree, alternating), warms up, then sends N sequential requests with a raw aiohttp
client in the given era and prints one JSON line: the gateway process's utime+stime per request and the
wall-clock time per request. `--method tools/call` forwards `echo` calls; `--method tasks/get` (2025-11-25
only) asks for one finished gateway-hosted task (an `echo` call made a task with `params.task`), which
the gateway answers itself from its task store.

    python bench/gateway_cpu.py [--tree DIR] [--calls 2000] [--era modern|legacy] [--method tools/call|tasks/get]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def session_headers(http: aiohttp.ClientSession, url: str, era: str) -> dict[str, str]:
    if era == "modern":
        return {**ACCEPT, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    async with http.post(url, json=init, headers=ACCEPT) as response:
        session = response.headers["Mcp-Session-Id"]
        await response.read()
    headers = {**ACCEPT, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    async with http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers) as r:
        await r.read()
    return headers


def echo_call(era: str, task: bool = False) -> Callable[[int], dict[str, Any]]:
    params: dict[str, Any] = {"name": "echo", "arguments": {"text": "hi"}}
    if era == "modern":
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    if task:
        params["task"] = {"ttl": 600_000}
    return lambda request_id: {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def task_get(task_id: str) -> Callable[[int], dict[str, Any]]:
    params = {"taskId": task_id}
    return lambda request_id: {"jsonrpc": "2.0", "id": request_id, "method": "tasks/get", "params": params}


async def finished_task(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> str:
    """A gateway-hosted task made from one `echo` call, once it has completed: its id."""
    async with http.post(url, json=echo_call("legacy", task=True)(-1), headers=headers) as response:
        task_id: str = (await response.json())["result"]["task"]["taskId"]
    for _ in range(100):
        async with http.post(url, json=task_get(task_id)(-2), headers=headers) as response:
            if (await response.json())["result"]["status"] == "completed":
                return task_id
        await asyncio.sleep(0.05)
    raise RuntimeError(f"task {task_id} did not complete")


async def drive(url: str, gateway_pid: int, calls: int, era: str, method: str) -> tuple[float, float]:
    """Warm up, then time `calls` requests: the gateway's CPU seconds and the wall seconds they took."""
    async with aiohttp.ClientSession() as http:
        body, expect = echo_call(era), '"hi"'

        async def call(request_id: int, headers: dict[str, str]) -> None:
            async with http.post(url, json=body(request_id), headers=headers) as response:
                text = await response.text()
                if expect not in text:
                    raise RuntimeError(text[:300])

        headers: dict[str, str] = {}
        for _ in range(100):  # until both processes answer
            try:
                headers = await session_headers(http, url, era)
                await call(0, headers)
                break
            except (aiohttp.ClientError, RuntimeError, KeyError):
                await asyncio.sleep(0.2)
        if method == "tasks/get":
            task_id = await finished_task(http, url, headers)
            body = task_get(task_id)
            expect = '"completed"'
        for request_id in range(1, 100):
            await call(request_id, headers)
        cpu_before, wall_before = cpu_seconds(gateway_pid), time.perf_counter()
        for request_id in range(calls):
            await call(1000 + request_id, headers)
        return cpu_seconds(gateway_pid) - cpu_before, time.perf_counter() - wall_before


def measure(tree: Path, calls: int, era: str, method: str) -> dict[str, Any]:
    upstream_port, gateway_port = free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    quiet: dict[str, Any] = {"cwd": tree, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    server = subprocess.Popen(
        [sys.executable, "examples/build_server.py", "--http", "--host", "127.0.0.1", "--port", str(upstream_port)],
        **quiet,
    )
    serve = ["serve", "--listen", f"127.0.0.1:{gateway_port}", "--upstream-url", upstream_url]
    gateway = subprocess.Popen([sys.executable, "-m", "gateway", *serve], **quiet)
    try:
        cpu_s, wall_s = asyncio.run(drive(f"http://127.0.0.1:{gateway_port}/mcp", gateway.pid, calls, era, method))
    finally:
        for process in (gateway, server):
            process.terminate()
        for process in (gateway, server):
            process.wait(10)
    return {
        "tree": str(tree),
        "era": era,
        "method": method,
        "calls": calls,
        "gateway_cpu_ms_per_call": round(cpu_s * 1000 / calls, 4),
        "wall_ms_per_call": round(wall_s * 1000 / calls, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    parser.add_argument("--method", choices=["tools/call", "tasks/get"], default="tools/call")
    args = parser.parse_args()
    if args.method == "tasks/get" and args.era != "legacy":
        parser.error("--method tasks/get needs --era legacy (a task made with params.task)")
    print(json.dumps(measure(args.tree.resolve(), args.calls, args.era, args.method)))


if __name__ == "__main__":
    main()
