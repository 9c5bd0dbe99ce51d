"""Shared test harness: real processes on real sockets.

What it provides (other test modules import these names; keep them stable):

* ``free_port()``, ``wait_for_port()`` and ``EXAMPLE_SERVER`` (the command line of ``examples/build_server.py``);
* ``example_http_url``: the example server on Streamable HTTP, one per test module;
* ``start_gateway()``: the real gateway (``python -m gateway serve``) as a subprocess, yielding a
  ``RunningGateway`` once it has printed its ready line;
* ``gateway_stdio`` / ``gateway_http`` / ``gateway`` (parametrized over both upstream transports).

Every process started here is stopped here (SIGTERM, then SIGKILL), and every wait has a timeout.
Process output goes to a file or is drained continuously, so no pipe can fill and stall a child.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

ROOT = Path(__file__).resolve().parent.parent

EXAMPLE_SERVER: list[str] = [sys.executable, str(ROOT / "examples" / "build_server.py")]
"""Command line of the example upstream on stdio (add ``--http --host H --port N`` for HTTP)."""

GATEWAY_CMD: list[str] = [sys.executable, "-m", "gateway"]
"""How the gateway is launched; ``start_gateway`` appends ``serve --listen ...``."""

READY_TIMEOUT = 20.0
"""Seconds a gateway or example server may take to become ready."""

STOP_TIMEOUT = 5.0
"""Seconds between SIGTERM and SIGKILL."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_status(url: str) -> int | None:
    """The HTTP status a GET of `url` gets (blocking, 2 s), or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


async def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Wait until something accepts TCP connections on host:port; raise TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
        except (TimeoutError, OSError):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing accepted connections on {host}:{port} within {timeout} s") from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # the ready line must not sit in a block buffer
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def stop_popen(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, wait, SIGKILL the process group (the child was started in its own session)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything the child left behind in its group


def _wait_for_port_sync(proc: subprocess.Popen[bytes], host: str, port: int, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"example server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"example server did not listen on {host}:{port} within {timeout} s:\n"
                    f"{log.read_text(errors='replace')}"
                ) from None
            time.sleep(0.05)


@pytest.fixture(scope="module")
def example_http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example server on Streamable HTTP (SDK defaults), shared by one test module."""
    port = free_port()
    log = tmp_path_factory.mktemp("example-http") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*EXAMPLE_SERVER, "--http", "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_child_env(),
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        _wait_for_port_sync(proc, "127.0.0.1", port, READY_TIMEOUT, log)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_popen(proc)


@dataclass
class RunningGateway:
    """A gateway subprocess that has printed its ready line."""

    url: str
    """The client URL, ``http://127.0.0.1:PORT/mcp``."""
    base: str
    """``http://127.0.0.1:PORT`` (for ``/healthz``, ``/metrics``, ...)."""
    proc: asyncio.subprocess.Process
    output: list[str] = field(default_factory=list)
    """Captured stdout+stderr lines so far (still growing while the gateway runs)."""
    upstream_kind: str = ""
    """``"stdio"`` or ``"http"`` when the gateway came from a fixture; ``""`` otherwise."""
    upstream_cmd: list[str] | None = None
    """The stdio upstream's command line, if any (to build the matching direct connection)."""
    upstream_url: str | None = None
    """The HTTP upstream's URL, if any."""

    def output_text(self) -> str:
        return "\n".join(self.output)

    def rss_bytes(self) -> int:
        """The gateway process's resident memory now (VmRSS from /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for pid {self.proc.pid}")


async def _drain(
    stream: asyncio.StreamReader, sink: list[str], ready: asyncio.Event | None = None, needle: str = ""
) -> None:
    """Collect lines until EOF; set `ready` (if given) at the first line containing `needle`."""
    while True:
        try:
            raw = await stream.readline()
        except ValueError:  # a line beyond the reader's limit: take what is buffered and go on
            raw = await stream.read(1 << 16)
        if not raw:
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        sink.append(line)
        if ready is not None and not ready.is_set() and needle in line:
            ready.set()


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT; then whatever is left in its process group."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.wait_for(proc.wait(), timeout=STOP_TIMEOUT)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stray children (a gateway's upstreams) in its group


@contextlib.asynccontextmanager
async def listening_process(argv: Callable[[int], list[str]], log: Path) -> AsyncIterator[int]:
    """The process `argv(port)` for a free loopback port, its output in `log`, until the block exits;
    yields the port once the process listens on it."""
    port = free_port()
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv(port), stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, cwd=ROOT, start_new_session=True
        )
    try:
        await wait_for_port("127.0.0.1", port, READY_TIMEOUT)
        yield port
    finally:
        await stop_process(proc)


@contextlib.asynccontextmanager
async def serve_http(command: list[str], *args: str, log: Path, port_option: str = "--http") -> AsyncIterator[str]:
    """A test MCP server, `command --http PORT *args`, on a free loopback port until the block exits;
    yields its URL (`/mcp`). Its output goes to `log`. `port_option` is the option that takes the port
    (`--port` for examples/native_stream_server.py)."""
    async with listening_process(lambda port: [*command, port_option, str(port), *args], log) as port:
        yield f"http://127.0.0.1:{port}/mcp"


@contextlib.asynccontextmanager
async def start_gateway(
    *,
    upstream_cmd: list[str] | None = None,
    upstream_url: str | None = None,
    config_text: str | None = None,
    extra_args: list[str] = [],  # noqa: B006 - never mutated; the documented signature
    port: int | None = None,
    host: str = "127.0.0.1",
    scheme: str = "http",
) -> AsyncIterator[RunningGateway]:
    """Run ``python -m gateway serve --listen HOST:PORT`` (default: a free loopback port) until the block
    exits; `scheme` is the one it announces (``https`` with ``[server] tls_cert``). The upstream is
    `upstream_cmd` or `upstream_url`, or those `config_text` names (`[[upstreams]]`)."""
    if upstream_cmd is not None and upstream_url is not None:
        raise ValueError("give at most one of upstream_cmd and upstream_url")
    port = port or free_port()
    base = f"{scheme}://{host}:{port}"
    url = f"{base}/mcp"
    with tempfile.TemporaryDirectory(prefix="gateway-test-") as tmp:
        args = [*GATEWAY_CMD, "serve", "--listen", f"{host}:{port}"]
        if upstream_cmd is not None:
            args += ["--upstream-cmd", shlex.join(upstream_cmd)]
        elif upstream_url is not None:
            args += ["--upstream-url", upstream_url]
        # Each gateway gets a store of its own (the default kind, SQLite, in its temporary directory)
        # unless the test configures one: the default path is shared by everything run from ROOT.
        if config_text is None or "[store]" not in config_text:
            config_text = f'{config_text or ""}\n[store]\npath = "{Path(tmp) / "gateway.db"}"\n'
        config_path = Path(tmp) / "gateway.toml"
        config_path.write_text(config_text, encoding="utf-8")
        args += ["--config", str(config_path)]
        args += list(extra_args)

        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_child_env(),
            cwd=ROOT,
            start_new_session=True,
            limit=1 << 20,
        )
        gw = RunningGateway(url=url, base=base, proc=proc, upstream_cmd=upstream_cmd, upstream_url=upstream_url)
        ready = asyncio.Event()
        assert proc.stdout is not None and proc.stderr is not None
        # Only stdout carries the ready line (stderr may mention the URL earlier, e.g. in a log line
        # written before the socket is bound); both are drained into `output` for the gateway's lifetime.
        drains = [
            asyncio.create_task(_drain(proc.stdout, gw.output, ready, url)),
            asyncio.create_task(_drain(proc.stderr, gw.output)),
        ]
        waiters = [asyncio.create_task(ready.wait()), asyncio.create_task(proc.wait())]
        try:
            await asyncio.wait(waiters, timeout=READY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if not ready.is_set():
                if proc.returncode is not None:
                    why = f"exited with {proc.returncode} before it was ready"
                else:
                    why = f"printed no ready line with {url} on stdout within {READY_TIMEOUT} s"
                await asyncio.sleep(0.2)  # let the last lines arrive
                pytest.fail(f"gateway {why} (cmd: {shlex.join(args)}):\n{gw.output_text()}", pytrace=False)
            yield gw
        finally:
            try:
                await stop_process(proc)
            finally:
                for drain in drains:
                    try:
                        await asyncio.wait_for(drain, timeout=STOP_TIMEOUT)
                    except (TimeoutError, asyncio.CancelledError):
                        drain.cancel()


@pytest.fixture
async def gateway_stdio() -> AsyncIterator[RunningGateway]:
    """The gateway in front of the example server on stdio (the gateway spawns it)."""
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER) as gw:
        gw.upstream_kind = "stdio"
        yield gw


@pytest.fixture
async def gateway_http(example_http_url: str) -> AsyncIterator[RunningGateway]:
    """The gateway in front of the example server on Streamable HTTP."""
    async with start_gateway(upstream_url=example_http_url) as gw:
        gw.upstream_kind = "http"
        yield gw


@pytest.fixture(params=["stdio", "http"])
async def gateway(request: pytest.FixtureRequest) -> AsyncIterator[RunningGateway]:
    """The gateway in front of the example server, once per upstream transport (``gateway.upstream_kind``)."""
    kind: str = request.param
    if kind == "stdio":
        async with start_gateway(upstream_cmd=EXAMPLE_SERVER) as gw:
            gw.upstream_kind = kind
            yield gw
    else:
        url: str = request.getfixturevalue("example_http_url")
        async with start_gateway(upstream_url=url) as gw:
            gw.upstream_kind = kind
            yield gw


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the output of every fixture-provided gateway to a failed test's report."""
    report: pytest.TestReport = yield
    if report.when == "call" and report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, RunningGateway):
                report.sections.append((f"gateway output ({name}, {value.url})", value.output_text() or "(none)"))
    return report


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One aiohttp session for a test module's raw-protocol requests."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield session


# ------------------------------------------------------------------------------------------ SQLite store files

_sqlite_directories: list[Path] = []


@pytest.fixture
def sqlite_directory(tmp_path: Path) -> Iterator[Path]:
    """The test's tmp_path, where ``fresh_sqlite_file()`` makes files while the test runs (store factories
    in the contract suites are plain functions, called many times per test by the state machines)."""
    _sqlite_directories.append(tmp_path)
    yield tmp_path
    _sqlite_directories.remove(tmp_path)


def fresh_sqlite_file() -> Path:
    """A path for a new SQLite store file under the running test's ``sqlite_directory``."""
    return Path(tempfile.mkdtemp(dir=_sqlite_directories[-1])) / "gateway.db"


# ------------------------------------------------------------------------------------------ the fast lane

IN_PROCESS_OPTION = "--in-process"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        IN_PROCESS_OPTION,
        action="store_true",
        help="the fast lane (make test-fast): a test is skipped the moment it starts a process (a gateway, a "
        "server, redis-server, the CLI); what runs is every test that needs none",
    )


def _refuse_processes(*args: object, **kwargs: object) -> None:
    pytest.skip("starts a process: `make test` runs it, `make test-fast` does not")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """With --in-process, every way a test starts a process (subprocess.Popen, and asyncio's subprocesses,
    which are Popen underneath) skips the test instead, when it tries: the fast lane sorts itself, so no
    list or marker can fall behind the tests. Only around each test (its fixtures' set-up and tear-down
    included): pytest and pytest-xdist start processes of their own. `Popen.__init__` closes the pipes it
    made and re-raises."""
    if not item.config.getoption(IN_PROCESS_OPTION):
        return (yield)
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = _refuse_processes  # type: ignore[attr-defined]
    try:
        return (yield)
    finally:
        subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the session's own redis-server, if a store test started one (tests/redis_server.py)."""
    from tests.redis_server import stop_shared_redis

    stop_shared_redis()
