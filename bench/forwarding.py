"""Forwarding overhead of the gateway: added latency and burst throughput, gateway vs direct, side by side.

One run starts the example server over Streamable HTTP with a gateway in front of it, and a second
gateway in front of the example server over stdio. It then measures, with the same client for both
sides of each comparison:

* the median and p99 of N sequential ``echo`` tool calls (after warm-up), and
* ``burst(n)``: progress notifications delivered and seconds to the result,

for direct HTTP, gateway→HTTP upstream, direct stdio and gateway→stdio, in legacy (2025-11-25) and
2026-07-28 mode. Two clients are used: the SDK's ``mcp.Client`` (``cache=None``), and a raw client
(aiohttp for HTTP, newline-delimited JSON over pipes for stdio) whose own overhead is small, so the
gateway's share is visible. Prints markdown tables; ``--json`` also writes the numbers to a file.

    python bench/forwarding.py [--calls 500] [--burst 5000] [--json out.json]

``--burst-rounds R`` measures only the burst, raw client, HTTP upstream, both eras: direct, this tree's
gateway and (with ``--base-tree DIR``) another checkout's gateway in front of the same upstream, in turn,
R rounds; it prints each round and the median rate ratio (gateway / direct of the same round).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.tasks_stream import cpu_seconds  # noqa: E402

SERVER = ROOT / "examples" / "build_server.py"
LEGACY_VERSION = "2025-11-25"
MODERN_VERSION = "2026-07-28"
ACCEPT = "application/json, text/event-stream"
STARTUP_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 120.0

Mode = Literal["legacy", "2026-07-28"]
MODES: tuple[Mode, ...] = ("legacy", "2026-07-28")
Json = dict[str, Any]
NotificationHook = Callable[[Json], None]


# --------------------------------------------------------------------------------------------- results


@dataclass
class Latency:
    calls: int
    median_ms: float
    p99_ms: float
    errors: int = 0

    @classmethod
    def of(cls, samples_s: list[float], errors: int) -> Latency:
        ordered = sorted(samples_s)
        if not ordered:
            return cls(calls=0, median_ms=math.nan, p99_ms=math.nan, errors=errors)
        rank = max(0, math.ceil(0.99 * len(ordered)) - 1)  # nearest-rank percentile
        return cls(
            calls=len(ordered),
            median_ms=statistics.median(ordered) * 1000,
            p99_ms=ordered[rank] * 1000,
            errors=errors,
        )


@dataclass
class Burst:
    requested: int
    delivered: int
    seconds: float
    error: str | None = None

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else math.nan


@dataclass
class Measurement:
    client: str  # "sdk" or "raw"
    mode: Mode
    upstream: str  # "http" or "stdio"
    path: str  # "direct" or "gateway"
    latency: Latency | None = None
    burst: Burst | None = None
    error: str | None = None


@dataclass
class Report:
    machine: dict[str, str]
    calls: int
    burst_n: int
    measurements: list[Measurement] = field(default_factory=list)


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count() or "?"),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


# ------------------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def spawn(name: str, argv: list[str], logdir: Path, cwd: Path = ROOT) -> Proc:
    """`argv` run in `cwd` (for `python -m gateway`, the checkout whose code runs)."""
    log = logdir / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return Proc(name, popen, log)


def stop(proc: Proc) -> None:
    if proc.popen.poll() is None:
        proc.popen.terminate()
        try:
            proc.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(timeout=5)


async def wait_until_ready(proc: Proc, port: int, health_path: str | None) -> None:
    """Wait for the port to accept connections (and, for a gateway, `/healthz` to answer 200)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.output()}")
            try:
                if health_path is None:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    await writer.wait_closed()
                    return
                async with http.get(f"http://127.0.0.1:{port}{health_path}") as resp:
                    if resp.status == 200:
                        return
            except (OSError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready on port {port} after {STARTUP_TIMEOUT_S:.0f}s:\n{proc.output()}")


@dataclass
class Targets:
    """Where each path is reachable: URLs for HTTP, the argv of the stdio server."""

    direct_http: str
    gateway_http: str
    gateway_stdio: str
    stdio_argv: list[str]


@contextlib.asynccontextmanager
async def running_targets(logdir: Path) -> AsyncIterator[Targets]:
    # Two gateways at once, measuring forwarding: the memory store (the default SQLite file is one per
    # process, and its writes are not what this measures).
    memory_store = logdir / "gateway.toml"
    memory_store.write_text('[store]\nkind = "memory"\n')
    python = sys.executable
    stdio_argv = [python, str(SERVER)]
    upstream_port, gw_http_port, gw_stdio_port = free_port(), free_port(), free_port()
    direct_http = f"http://127.0.0.1:{upstream_port}/mcp"
    procs: list[Proc] = []
    try:
        upstream = spawn(
            "upstream-http",
            [python, str(SERVER), "--http", "--host", "127.0.0.1", "--port", str(upstream_port)],
            logdir,
        )
        procs.append(upstream)
        await wait_until_ready(upstream, upstream_port, None)
        gw_http = spawn(
            "gateway-http",
            [
                *(python, "-m", "gateway", "serve", "--config", str(memory_store)),
                *("--listen", f"127.0.0.1:{gw_http_port}", "--upstream-url", direct_http),
            ],
            logdir,
        )
        procs.append(gw_http)
        gw_stdio = spawn(
            "gateway-stdio",
            [
                python,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(memory_store),
                "--listen",
                f"127.0.0.1:{gw_stdio_port}",
                "--upstream-cmd",
                shlex.join(stdio_argv),
            ],
            logdir,
        )
        procs.append(gw_stdio)
        await wait_until_ready(gw_http, gw_http_port, "/healthz")
        await wait_until_ready(gw_stdio, gw_stdio_port, "/healthz")
        yield Targets(
            direct_http=direct_http,
            gateway_http=f"http://127.0.0.1:{gw_http_port}/mcp",
            gateway_stdio=f"http://127.0.0.1:{gw_stdio_port}/mcp",
            stdio_argv=stdio_argv,
        )
    finally:
        for proc in reversed(procs):
            stop(proc)


# ----------------------------------------------------------------------------------------- raw clients


class RawError(Exception):
    """A JSON-RPC error or an unexpected answer seen by a raw client."""


class RawClient:
    """Just enough MCP to call a tool: one request at a time, notifications counted by the caller."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self._next_id = 0

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def params(self, params: Json) -> Json:
        if self.mode == "legacy":
            return params
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": "bench-raw", "version": "0.1.0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        return {**params, "_meta": {**params.get("_meta", {}), **meta}}

    async def request(self, method: str, params: Json, on_notification: NotificationHook | None = None) -> Json:
        raise NotImplementedError

    async def notify(self, method: str, params: Json | None = None) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> RawClient:
        if self.mode == "legacy":
            await self.request(
                "initialize",
                {
                    "protocolVersion": LEGACY_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "bench-raw", "version": "0.1.0"},
                },
            )
            await self.notify("notifications/initialized")
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def call_tool(self, name: str, arguments: Json, on_notification: NotificationHook | None = None) -> Json:
        params: Json = {"name": name, "arguments": arguments}
        if on_notification is not None:
            params["_meta"] = {"progressToken": f"bench-{self._next_id + 1}"}
        return await self.request("tools/call", self.params(params), on_notification)


def _final(message: Json, request_id: int) -> Json | None:
    """The result if `message` answers `request_id`; raises on its error; None if it is something else."""
    if message.get("id") != request_id or "method" in message:
        return None
    if "error" in message:
        raise RawError(f"JSON-RPC error: {message['error']}")
    result = message.get("result")
    if not isinstance(result, dict):
        raise RawError(f"malformed response: {message}")
    return result


class RawHttpClient(RawClient):
    """Streamable HTTP with aiohttp: legacy keeps an Mcp-Session-Id, 2026 sends the per-request headers."""

    def __init__(self, url: str, mode: Mode) -> None:
        super().__init__(mode)
        self.url = url
        self._http: aiohttp.ClientSession | None = None
        self._session_id: str | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, "use `async with`"
        return self._http

    def _headers(self, method: str, params: Json) -> dict[str, str]:
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if self.mode == "legacy":
            if self._session_id is not None:
                headers["Mcp-Session-Id"] = self._session_id
                headers["MCP-Protocol-Version"] = LEGACY_VERSION
        else:
            headers["MCP-Protocol-Version"] = MODERN_VERSION
            headers["Mcp-Method"] = method
            if method == "tools/call":
                headers["Mcp-Name"] = str(params["name"])
        return headers

    async def __aenter__(self) -> RawClient:
        connector = aiohttp.TCPConnector(limit=4)
        self._http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S))
        return await super().__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            if self._session_id is not None:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with self._http.delete(self.url, headers=self._headers("", {})):
                        pass
            await self._http.close()
            self._http = None

    async def notify(self, method: str, params: Json | None = None) -> None:
        body: Json = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            body["params"] = params
        async with self.http.post(self.url, data=json.dumps(body), headers=self._headers(method, params or {})) as r:
            if r.status != 202:
                raise RawError(f"{method}: HTTP {r.status} {await r.text()}")

    async def request(self, method: str, params: Json, on_notification: NotificationHook | None = None) -> Json:
        request_id = self.new_id()
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        async with self.http.post(self.url, data=json.dumps(body), headers=self._headers(method, params)) as resp:
            if method == "initialize":
                self._session_id = resp.headers.get("Mcp-Session-Id")
            content_type = resp.headers.get("Content-Type", "")
            if content_type.startswith("application/json"):
                message = json.loads(await resp.read())
                result = _final(message, request_id)
                if result is None:
                    raise RawError(f"{method}: HTTP {resp.status}, unexpected body {message}")
                return result
            if not content_type.startswith("text/event-stream"):
                raise RawError(f"{method}: HTTP {resp.status} {content_type!r}: {await resp.text()}")
            data: list[bytes] = []
            async for raw_line in resp.content:
                line = raw_line.rstrip(b"\r\n")
                if line.startswith(b"data:"):
                    data.append(line[5:].lstrip(b" "))
                elif not line and data:  # end of one SSE event
                    payload = b"\n".join(data)
                    data = []
                    if not payload:
                        continue  # a priming event
                    message = json.loads(payload)
                    result = _final(message, request_id)
                    if result is not None:
                        return result
                    if on_notification is not None and "method" in message:
                        on_notification(message)
            raise RawError(f"{method}: the SSE stream ended without a response")


class RawStdioClient(RawClient):
    """Newline-delimited JSON-RPC over the pipes of a server subprocess."""

    def __init__(self, argv: list[str], mode: Mode) -> None:
        super().__init__(mode)
        self.argv = argv
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def proc(self) -> asyncio.subprocess.Process:
        assert self._proc is not None, "use `async with`"
        return self._proc

    async def __aenter__(self) -> RawClient:
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=64 * 1024 * 1024,
        )
        return await super().__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 3)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def _send(self, message: Json) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps(message).encode() + b"\n")
        await stdin.drain()

    async def notify(self, method: str, params: Json | None = None) -> None:
        body: Json = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            body["params"] = params
        await self._send(body)

    async def request(self, method: str, params: Json, on_notification: NotificationHook | None = None) -> Json:
        request_id = self.new_id()
        await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        stdout = self.proc.stdout
        assert stdout is not None
        while True:
            line = await stdout.readline()
            if not line:
                raise RawError(f"{method}: the server closed stdout")
            message = json.loads(line)
            result = _final(message, request_id)
            if result is not None:
                return result
            if on_notification is not None and "method" in message:
                on_notification(message)


# ------------------------------------------------------------------------------------------- the loops


CallFn = Callable[[], Awaitable[object]]


async def latency_loop(call: CallFn, calls: int, warmup: int) -> Latency:
    for _ in range(warmup):
        await call()
    samples: list[float] = []
    errors = 0
    for _ in range(calls):
        start = time.perf_counter()
        try:
            await call()
        except Exception:
            errors += 1
            continue
        samples.append(time.perf_counter() - start)
    return Latency.of(samples, errors)


async def measure_sdk(target: str | StdioServerParameters, mode: Mode, calls: int, burst_n: int) -> Measurement:
    m = Measurement(client="sdk", mode=mode, upstream="", path="")
    async with Client(target, mode=mode, cache=None, read_timeout_seconds=CALL_TIMEOUT_S) as client:

        async def echo() -> None:
            result = await client.call_tool("echo", {"text": "ping"})
            if result.is_error:
                raise RawError(f"echo failed: {result}")

        m.latency = await latency_loop(echo, calls, warmup=max(20, calls // 10))
        delivered = 0

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            nonlocal delivered
            delivered += 1

        start = time.perf_counter()
        error: str | None = None
        try:
            result = await client.call_tool("burst", {"n": burst_n}, progress_callback=on_progress)
            if result.is_error:
                error = "tool error"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        m.burst = Burst(requested=burst_n, delivered=delivered, seconds=time.perf_counter() - start, error=error)
    return m


async def measure_raw(client: RawClient, mode: Mode, calls: int, burst_n: int) -> Measurement:
    m = Measurement(client="raw", mode=mode, upstream="", path="")
    async with client:

        async def echo() -> None:
            await client.call_tool("echo", {"text": "ping"})

        m.latency = await latency_loop(echo, calls, warmup=max(20, calls // 10))
        m.burst = await timed_burst(client, burst_n)
    return m


async def timed_burst(client: RawClient, burst_n: int) -> Burst:
    """`burst(burst_n)` on an open raw client: progress notifications delivered, seconds to the result."""
    delivered = 0

    def on_notification(message: Json) -> None:
        nonlocal delivered
        if message.get("method") == "notifications/progress":
            delivered += 1

    start = time.perf_counter()
    error: str | None = None
    try:
        await client.call_tool("burst", {"n": burst_n}, on_notification)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Burst(requested=burst_n, delivered=delivered, seconds=time.perf_counter() - start, error=error)


async def run(calls: int, burst_n: int, logdir: Path, progress: Callable[[str], None]) -> Report:
    report = Report(machine=machine_info(), calls=calls, burst_n=burst_n)
    async with running_targets(logdir) as t:
        stdio_params = StdioServerParameters(command=t.stdio_argv[0], args=t.stdio_argv[1:], cwd=str(ROOT))
        for mode in MODES:
            # Direct and gateway back to back for each pair, so drift on the machine hits both alike.
            sdk_targets: list[tuple[str, str, str | StdioServerParameters]] = [
                ("http", "direct", t.direct_http),
                ("http", "gateway", t.gateway_http),
                ("stdio", "direct", stdio_params),
                ("stdio", "gateway", t.gateway_stdio),
            ]
            for upstream, path, sdk_target in sdk_targets:
                progress(f"sdk {mode} {path} {upstream}")
                m = await _guarded(measure_sdk(sdk_target, mode, calls, burst_n), "sdk", mode)
                m.upstream, m.path = upstream, path
                report.measurements.append(m)
            raw_targets: list[tuple[str, str, RawClient]] = [
                ("http", "direct", RawHttpClient(t.direct_http, mode)),
                ("http", "gateway", RawHttpClient(t.gateway_http, mode)),
                ("stdio", "direct", RawStdioClient(t.stdio_argv, mode)),
                ("stdio", "gateway", RawHttpClient(t.gateway_stdio, mode)),
            ]
            for upstream, path, raw_client in raw_targets:
                progress(f"raw {mode} {path} {upstream}")
                m = await _guarded(measure_raw(raw_client, mode, calls, burst_n), "raw", mode)
                m.upstream, m.path = upstream, path
                report.measurements.append(m)
    return report


async def burst_rounds(
    burst_n: int, rounds: int, base_tree: Path | None, logdir: Path, progress: Callable[[str], None]
) -> list[Json]:
    """`--burst-rounds`: one row per burst (round, mode, path, delivered, seconds, rate)."""
    config = logdir / "gateway.toml"
    config.write_text('[store]\nkind = "memory"\n')
    python = sys.executable
    upstream_port = free_port()
    urls = {"direct": f"http://127.0.0.1:{upstream_port}/mcp"}
    pids: dict[str, int] = {}
    trees = {"gateway": ROOT, **({"base": base_tree} if base_tree is not None else {})}
    procs: list[Proc] = []
    try:
        argv = [python, str(SERVER), "--http", "--host", "127.0.0.1", "--port", str(upstream_port)]
        procs.append(spawn("upstream-http", argv, logdir))
        await wait_until_ready(procs[-1], upstream_port, None)
        for name, tree in trees.items():
            port = free_port()
            serve = [
                "serve",
                "--config",
                str(config),
                "--listen",
                f"127.0.0.1:{port}",
                "--upstream-url",
                urls["direct"],
            ]
            procs.append(spawn(f"gateway-{name}", [python, "-m", "gateway", *serve], logdir, cwd=tree))
            await wait_until_ready(procs[-1], port, "/healthz")
            urls[name] = f"http://127.0.0.1:{port}/mcp"
            pids[name] = procs[-1].popen.pid
        rows: list[Json] = []
        for round_ in range(1, rounds + 1):
            for mode in MODES:
                for path, url in urls.items():
                    progress(f"round {round_} {mode} {path}")
                    async with RawHttpClient(url, mode) as client:
                        await client.call_tool("echo", {"text": "ping"})
                        pid = pids.get(path)
                        cpu_before = cpu_seconds(pid) if pid else 0.0
                        burst = await timed_burst(client, burst_n)
                        cpu_s = cpu_seconds(pid) - cpu_before if pid else math.nan
                    row = {"round": round_, "mode": mode, "path": path, **asdict(burst), "rate": burst.rate}
                    row["gateway_cpu_us_per_notification"] = cpu_s * 1e6 / max(burst.delivered, 1)
                    rows.append(row)
        return rows
    finally:
        for proc in reversed(procs):
            stop(proc)


def render_rounds(rows: list[Json]) -> str:
    paths = list(dict.fromkeys(row["path"] for row in rows))
    lines = [
        "| mode | round | "
        + " | ".join(f"{path} /s (delivered)" for path in paths)
        + " | "
        + " | ".join(f"{path}/direct" for path in paths[1:])
        + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in paths) + " | " + " | ".join("---:" for _ in paths[1:]) + " |",
    ]
    for mode in MODES:
        ratios: dict[str, list[float]] = {path: [] for path in paths[1:]}
        for round_ in sorted({row["round"] for row in rows}):
            cell = {row["path"]: row for row in rows if row["mode"] == mode and row["round"] == round_}
            direct = cell["direct"]["rate"]
            for path in paths[1:]:
                ratios[path].append(cell[path]["rate"] / direct)
            rates = " | ".join(f"{cell[p]['rate']:.0f} ({cell[p]['delivered']})" for p in paths)
            lines.append(
                f"| {mode} | {round_} | {rates} | " + " | ".join(f"{r[-1]:.2f}" for r in ratios.values()) + " |"
            )
        medians = " | ".join(f"**{statistics.median(r):.2f}**" for r in ratios.values())
        lines.append(f"| {mode} | median | " + " | ".join("" for _ in paths) + f" | {medians} |")
    lines += ["", "Gateway CPU (utime + stime from /proc) per delivered notification, µs, median over rounds:", ""]
    for mode in MODES:
        for path in paths[1:]:
            cpu = [r["gateway_cpu_us_per_notification"] for r in rows if r["mode"] == mode and r["path"] == path]
            lines.append(f"- {mode} {path}: **{statistics.median(cpu):.1f}** ({' / '.join(f'{c:.1f}' for c in cpu)})")
    return "\n".join(lines)


async def _guarded(work: Awaitable[Measurement], client: str, mode: Mode) -> Measurement:
    """A failing path is reported in the table instead of aborting the whole run."""
    try:
        return await asyncio.wait_for(work, timeout=600)
    except Exception as exc:
        return Measurement(client=client, mode=mode, upstream="", path="", error=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------- output


def _ms(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.2f}"


def _signed(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:+.2f}"


def _find(report: Report, client: str, mode: Mode, upstream: str, path: str) -> Measurement | None:
    for m in report.measurements:
        if (m.client, m.mode, m.upstream, m.path) == (client, mode, upstream, path):
            return m
    return None


def _pairs(report: Report) -> Iterator[tuple[str, Mode, str, Measurement | None, Measurement | None]]:
    for client in ("sdk", "raw"):
        for mode in MODES:
            for upstream in ("http", "stdio"):
                yield (
                    client,
                    mode,
                    upstream,
                    _find(report, client, mode, upstream, "direct"),
                    _find(report, client, mode, upstream, "gateway"),
                )


def render(report: Report) -> str:
    mi = report.machine
    out = [
        "# Gateway forwarding benchmark",
        "",
        f"Machine: {mi['nproc']} CPUs, {mi['cpu']}; Python {mi['python']}; {mi['platform']}; {mi['date']}.",
        "Client, gateway and upstream share these CPUs, so differences under about 1 ms are noise.",
        "Upstream `stdio` rows compare a client on the server's pipes with a client on the gateway's HTTP",
        "endpoint, so their added latency includes the client's own HTTP hop; `http` rows compare like with like.",
        "`sdk` is `mcp.Client(cache=None)`; `raw` is a minimal aiohttp (HTTP) or pipe (stdio) client.",
        "",
        f"## Latency: {report.calls} sequential `echo` calls (after warm-up), ms",
        "",
        "| client | mode | upstream | direct median | direct p99 | gateway median | gateway p99 "
        "| added median | added p99 | errors (d/g) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for client, mode, upstream, direct, gateway in _pairs(report):
        dl = direct.latency if direct else None
        gl = gateway.latency if gateway else None
        added_median = gl.median_ms - dl.median_ms if dl and gl else None
        added_p99 = gl.p99_ms - dl.p99_ms if dl and gl else None
        out.append(
            f"| {client} | {mode} | {upstream} "
            f"| {_ms(dl.median_ms if dl else None)} | {_ms(dl.p99_ms if dl else None)} "
            f"| {_ms(gl.median_ms if gl else None)} | {_ms(gl.p99_ms if gl else None)} "
            f"| {_signed(added_median)} | {_signed(added_p99)} "
            f"| {dl.errors if dl else '—'}/{gl.errors if gl else '—'} |"
        )
    out += [
        "",
        f"## Burst: `burst({report.burst_n})` progress notifications, delivered by the time the result arrived",
        "",
        "| client | mode | upstream | direct delivered | direct s | direct /s | gateway delivered | gateway s "
        "| gateway /s | throughput ratio (g/d) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for client, mode, upstream, direct, gateway in _pairs(report):
        db = direct.burst if direct else None
        gb = gateway.burst if gateway else None
        ratio = gb.rate / db.rate if db and gb and db.rate > 0 else None
        out.append(
            f"| {client} | {mode} | {upstream} "
            f"| {f'{db.delivered}/{db.requested}' if db else '—'} | {_ms(db.seconds if db else None)} "
            f"| {f'{db.rate:.0f}' if db else '—'} "
            f"| {f'{gb.delivered}/{gb.requested}' if gb else '—'} | {_ms(gb.seconds if gb else None)} "
            f"| {f'{gb.rate:.0f}' if gb else '—'} | {f'{ratio:.2f}' if ratio is not None else '—'} |"
        )
    problems = [
        f"- {m.client} {m.mode} {m.path} {m.upstream or '?'}: {m.error or (m.burst.error if m.burst else '')}"
        for m in report.measurements
        if m.error or (m.burst and m.burst.error)
    ]
    if problems:
        out += ["", "## Errors", "", *problems]
    return "\n".join(out)


def to_json(report: Report) -> Json:
    data = asdict(report)
    for m, raw in zip(report.measurements, data["measurements"], strict=True):
        if m.burst is not None:
            raw["burst"]["rate_per_s"] = m.burst.rate
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="timed echo calls per path (default 500)")
    parser.add_argument("--burst", type=int, default=5000, help="progress notifications per burst (default 5000)")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--burst-rounds", type=int, default=0, help="only the HTTP burst, this many rounds")
    parser.add_argument("--base-tree", type=Path, default=None, help="with --burst-rounds: a checkout to compare")
    args = parser.parse_args(argv)

    def progress(text: str) -> None:
        if not args.quiet:
            print(f"… {text}", file=sys.stderr, flush=True)

    if args.burst_rounds:
        with tempfile.TemporaryDirectory(prefix="bench-forwarding-") as tmp:
            base = args.base_tree.resolve() if args.base_tree is not None else None
            rows = asyncio.run(burst_rounds(args.burst, args.burst_rounds, base, Path(tmp), progress))
        print(render_rounds(rows))
        if args.json is not None:
            args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        return 1 if any(row["error"] or row["delivered"] != row["requested"] for row in rows) else 0

    with tempfile.TemporaryDirectory(prefix="bench-forwarding-") as tmp:
        report = asyncio.run(run(args.calls, args.burst, Path(tmp), progress))
    print(render(report))
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(report), indent=2) + "\n", encoding="utf-8")
    return 1 if any(m.error for m in report.measurements) else 0


if __name__ == "__main__":
    sys.exit(main())
