"""`mcp-task-gateway demo`: tasks/stream (SEP-2694) end to end, in one command, in well under a minute.

It starts the example build server (`examples/build_server.py`, a plain MCP server without Tasks)
behind a gateway on a free loopback port with a small retention (200 events per task), the gateway a
process of its own started the way a user starts one (`python -m gateway serve --config ...`), then
drives it with `GatewayClient`: start a task, stream it, drop the connection, resume with `after`, let
a late joiner replay the history, let `follow` ride out cut connections, provoke `events_gone` and
recover from `earliestSeq - 1`, and check `tasks/result`. Each step prints a short
narration and ends as a PASS/FAIL line; the exit code is 0 only if every step passed.

This module only drives the gateway through its public surface: its command line, its config file
and HTTP. It imports nothing of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gateway.client.stream import EventsGone, GatewayClient
from gateway.client.tail import Timeline

RETAINED = 200
"""Events the demo gateway keeps per task: small, so a burst of 1000 outruns it."""
BUILD_STEPS, BUILD_DELAY = 12, 0.25
DROP_AFTER = 5
"""Client A cuts its first stream after this seq."""
BURST = 1000
DEADLINE_S = 50.0
STARTUP_S = 30.0
"""How long the gateway process may take to listen."""
PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""Where the `gateway` package this demo belongs to sits (the checkout, or site-packages)."""
LISTENING = "mcp-task-gateway listening on "
"""What `serve` prints on stdout once it listens, followed by its URL."""


def find_example_server() -> Path | None:
    """`examples/build_server.py` in the current directory or next to the installed package."""
    for root in (Path.cwd(), PROJECT_ROOT):
        candidate = root / "examples" / "build_server.py"
        if candidate.is_file():
            return candidate
    return None


class StepFailed(Exception):
    pass


def check(condition: bool, why: str) -> None:
    if not condition:
        raise StepFailed(why)


def seq_run(events: list[dict[str, Any]]) -> str:
    if not events:
        return "no events"
    return f"seq {events[0]['seq']}..{events[-1]['seq']} ({len(events)} events)"


def gap_free(events: list[dict[str, Any]], first: int) -> bool:
    return [event["seq"] for event in events] == list(range(first, first + len(events)))


class FlakyLink:
    """A TCP relay in front of the gateway whose connections can be cut at will, like a failing network."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._pipes: set[asyncio.Task[None]] = set()
        self.cuts = 0

    async def start(self) -> int:
        """Listen on a free loopback port; returns it."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            far_reader, far_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, far_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))
        finally:
            self._pairs.discard(pair)
            writer.transport.abort()
            far_writer.transport.abort()

    def cut(self) -> int:
        """Reset every relayed connection now (both sides see a connection reset); returns how many."""
        pairs = list(self._pairs)
        for near, far in pairs:
            near.transport.abort()
            far.transport.abort()
        self.cuts += 1
        return len(pairs)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self.cut()
            await self._server.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


@dataclass
class Outcome:
    name: str
    passed: bool
    detail: str


@dataclass
class Demo:
    url: str
    out: TextIO
    color: bool
    a: GatewayClient
    """Client A: starts the tasks, streams, drops, resumes."""
    b: GatewayClient
    """Client B: the late joiner, in a session of its own."""
    c: GatewayClient
    """Client C: follows a task through the flaky relay."""
    link: FlakyLink
    results: list[Outcome] = field(default_factory=list)
    build_task: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    first_part: list[dict[str, Any]] = field(default_factory=list)
    burst_task: str | None = None
    earliest: int | None = None

    # -- narration --------------------------------------------------------------------------------

    def say(self, text: str = "", indent: int = 3) -> None:
        self.out.write((" " * indent + text if text else "") + "\n")
        self.out.flush()

    def heading(self, number: int, title: str) -> None:
        self.say()
        self.say(self._style("1", f"{number}. {title}"), indent=0)

    def _style(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def record(self, name: str, passed: bool, detail: str) -> None:
        self.results.append(Outcome(name, passed, detail))
        mark = self._style("1;32", "PASS") if passed else self._style("1;31", "FAIL")
        self.say(f"{mark}  {detail}")

    async def step(self, number: int, name: str, title: str, body: Callable[[], Awaitable[str]]) -> None:
        self.heading(number, title)
        try:
            detail = await body()
        except StepFailed as exc:
            self.record(name, False, str(exc))
        except Exception as exc:
            self.record(name, False, f"{type(exc).__name__}: {exc}")
        else:
            self.record(name, True, detail)

    def needs_build_task(self) -> str:
        if self.build_task is None:
            raise StepFailed("skipped: no task was started in step 1")
        return self.build_task

    async def run(self) -> None:
        await self.step(1, "start a task", "Start a task", self.start_task)
        await self.step(2, "stream, then drop", "Stream it, then drop the connection", self.stream_then_drop)
        if self.first_part:
            await self.resume_and_late_join()
        else:
            self.record("resume with after", False, "skipped: step 2 received nothing")
            self.record("late joiner", False, "skipped: step 2 received nothing")
        await self.step(5, "follow across drops", "follow() rides out dropped connections", self.follow_flaky)
        await self.step(6, "events_gone", "Retention overtakes a slow client: events_gone", self.events_gone)
        await self.step(7, "resume from earliestSeq - 1", "Resume from earliestSeq - 1", self.resume_from_earliest)
        await self.step(8, "tasks/result", "tasks/result agrees with the stream", self.check_result)

    # -- the steps --------------------------------------------------------------------------------

    async def start_task(self) -> str:
        self.say(f"client A: tools/call slow_build(steps={BUILD_STEPS}, delay={BUILD_DELAY}) with params.task")
        self.say("the example server has no Tasks: the gateway hosts the task and records its notifications")
        task_id = await self.a.start_task("slow_build", {"steps": BUILD_STEPS, "delay": BUILD_DELAY}, ttl_ms=600_000)
        check(task_id is not None, "tools/call did not return a task")
        assert task_id is not None
        self.build_task = task_id
        status = (await self.a.get_task(task_id))["result"].get("status")
        return f"task {task_id} created; tasks/get says {status!r}"

    async def stream_then_drop(self) -> str:
        task_id = self.needs_build_task()
        self.say("client A: tasks/stream {taskId} (no `after`: from the earliest retained event)")
        timeline = Timeline(color=self.color)
        stream = self.a.stream(task_id)
        async for event in stream:
            self.first_part.append(event)
            self.say("  " + timeline.line(event, time.time()))
            if event["seq"] >= DROP_AFTER:
                stream.abort()
                break
        await stream.aclose(cancel=False)
        check(bool(self.first_part), "the stream delivered no events")
        check(gap_free(self.first_part, 0), f"not a gap-free run from seq 0: {seq_run(self.first_part)}")
        self.say(f"client A cuts the connection after seq {self.first_part[-1]['seq']} (no cancel: a network failure)")
        return f"received {seq_run(self.first_part)} in order, then the connection dropped"

    async def resume_and_late_join(self) -> None:
        """Steps 3 and 4 run together: A resumes with `after` while B joins the running task late."""
        task_id = self.needs_build_task()
        last = self.first_part[-1]["seq"]
        self.history = list(self.first_part)
        late: list[dict[str, Any]] = []
        joined_while: list[str] = []
        reconnects: list[str] = []

        def on_reconnect(attempt: int, after: int | None, why: BaseException) -> None:
            reconnects.append(str(why))

        async def resume() -> int | None:
            return await self.a.follow(task_id, last, on_event=self.history.append, on_reconnect=on_reconnect)

        async def late_joiner() -> None:
            await asyncio.sleep(0.3)
            joined_while.append(str((await self.b.get_task(task_id))["result"].get("status")))
            async for event in self.b.stream(task_id):
                late.append(event)

        self.say(f"client A: tasks/stream {{taskId, after: {last}}} (its last fully processed seq), via follow()")
        self.say("client B (its own session) joins 0.3 s later, while the task runs, with no `after`")
        resumed, joined = await asyncio.gather(resume(), late_joiner(), return_exceptions=True)

        self.heading(3, "Resume with `after`")
        if isinstance(resumed, BaseException):
            self.record("resume with after", False, f"{type(resumed).__name__}: {resumed}")
        else:
            rest = self.history[len(self.first_part) :]
            problems = []
            if not gap_free(self.history, 0):
                problems.append(f"the assembled history is not gap-free from 0: {seq_run(self.history)}")
            if not rest or rest[0]["seq"] != last + 1:
                problems.append(f"the resumed stream did not start at seq {last + 1}")
            if not self.history[-1]["type"].endswith(".task.terminal"):
                problems.append(f"the last event is {self.history[-1]['type']}, not task.terminal")
            if reconnects:
                self.say(f"(follow reconnected {len(reconnects)}x, first because: {reconnects[0]})")
            self.say(f"received {seq_run(rest)} after the resume; the stream then ended with the empty result")
            detail = f"assembled {seq_run(self.history)}: gap-free, no duplicates, ends with task.terminal"
            self.record("resume with after", not problems, "; ".join(problems) or detail)

        self.heading(4, "A late joiner receives the retained history")
        if isinstance(joined, BaseException):
            self.record("late joiner", False, f"{type(joined).__name__}: {joined}")
            return
        when = joined_while[0] if joined_while else "?"
        self.say(f"client B joined while the task was {when!r} and received {seq_run(late)}: replay, then live")
        if late != self.history:
            detail = f"differs from client A's history: B {seq_run(late)}, A {seq_run(self.history)}"
        elif when != "working":
            detail = f"identical history, but the task was already {when!r} when B joined (not a late join)"
        else:
            detail = f"identical to client A's assembled history ({len(late)} events: seq, type and payload)"
        self.record("late joiner", late == self.history and when == "working", detail)

    async def follow_flaky(self) -> str:
        self.say("task 3 runs; client C follows it through a relay that resets its connections twice")
        task_id = await self.a.start_task("slow_build", {"steps": 10, "delay": 0.2})
        check(task_id is not None, "tools/call did not return a task")
        assert task_id is not None
        seen: list[dict[str, Any]] = []
        reconnects = 0

        def on_event(event: dict[str, Any]) -> None:
            seen.append(event)
            if event["seq"] in (4, 11):
                cut = self.link.cut()
                self.say(f"relay: reset {cut} connection(s) after client C processed seq {event['seq']}")

        def on_reconnect(attempt: int, after: int | None, why: BaseException) -> None:
            nonlocal reconnects
            reconnects += 1
            self.say(f"follow: {why}; reconnecting with after={after}")

        last = await self.c.follow(task_id, on_event=on_event, on_reconnect=on_reconnect, backoff=0.1)
        reference = [event async for event in self.a.stream(task_id)]
        check(self.link.cuts >= 2, f"the relay cut connections {self.link.cuts} times, expected 2")
        check(reconnects >= 2, f"follow reconnected {reconnects} times, expected at least 2")
        check(gap_free(seen, 0), f"follow's events are not gap-free: {seq_run(seen)}")
        check(seen == reference, f"follow saw {seq_run(seen)}, a direct stream {seq_run(reference)}")
        self.say(f"follow() returned {last}, the last processed seq; a direct stream gives the same {len(seen)} events")
        return f"{reconnects} reconnects, {seq_run(seen)}: each event once, in order, none missing"

    async def events_gone(self) -> str:
        self.say(f"task 2: burst(n={BURST}) sends {BURST} progress notifications at once; the gateway keeps {RETAINED}")
        task_id = await self.a.start_task("burst", {"n": BURST})
        check(task_id is not None, "tools/call did not return a task")
        assert task_id is not None
        self.burst_task = task_id
        result = await self.a.task_result(task_id)
        self.say(f"tasks/result: {result.get('content', [{}])[0].get('text')!r}")
        self.say("a client that last processed seq 0 comes back: tasks/stream {taskId, after: 0}")
        try:
            async for event in self.a.stream(task_id, after=0):
                raise StepFailed(f"expected events_gone, got event seq {event['seq']}")
        except EventsGone as exc:
            check(exc.earliest_seq is not None and exc.earliest_seq > 1, f"odd earliestSeq {exc.earliest_seq}")
            self.earliest = exc.earliest_seq
            return f"error {exc.code}, data.reason 'events_gone', earliestSeq {exc.earliest_seq}: the gap is reported"
        raise StepFailed("the stream ended normally; expected events_gone")

    async def resume_from_earliest(self) -> str:
        earliest = self.earliest
        if earliest is None or self.burst_task is None:
            raise StepFailed("skipped: step 6 did not report earliestSeq")
        after = earliest - 1
        self.say(f"the client accepts the gap and resumes: tasks/stream {{taskId, after: {after}}}")
        events: list[dict[str, Any]] = []
        last = await self.a.follow(self.burst_task, after, on_event=events.append)
        check(gap_free(events, earliest), f"not gap-free from seq {earliest}: {seq_run(events)}")
        check(len(events) == RETAINED, f"expected the {RETAINED} retained events, got {len(events)}")
        check(events[-1]["type"].endswith(".task.terminal"), "the last event is not task.terminal")
        return f"received {seq_run(events)}, gap-free through task.terminal (last seq {last})"

    async def check_result(self) -> str:
        task_id = self.needs_build_task()
        result = await self.a.task_result(task_id)
        text = next((block.get("text") for block in result.get("content", []) if block.get("type") == "text"), None)
        status = (await self.a.get_task(task_id))["result"].get("status")
        terminal = self.history[-1]["payload"] if self.history else {}
        self.say(
            f"tasks/result: {text!r}; tasks/get: {status!r}; the stream's task.terminal: {terminal.get('status')!r}"
        )
        check(text == f"built {BUILD_STEPS} steps", f"unexpected result {result!r}")
        check(status == "completed", f"tasks/get says {status!r}")
        check(terminal.get("status") == "completed", "the stream's terminal event disagrees")
        return "the result, the task's status and the stream's terminal event agree"

    def report(self, elapsed: float) -> bool:
        self.say()
        self.say(f"Results ({elapsed:.1f} s)", indent=0)
        for outcome in self.results:
            self.say(f"{'PASS' if outcome.passed else 'FAIL'}  {outcome.name}", indent=2)
        failed = [outcome for outcome in self.results if not outcome.passed]
        total = len(self.results)
        self.say(f"all {total} steps passed" if not failed else f"{len(failed)} of {total} steps failed", indent=0)
        return bool(self.results) and not failed


class GatewayNotStarted(Exception):
    """The gateway process exited, or did not listen in time."""


def config_text(upstream_cmd: list[str], store_path: Path) -> str:
    """The demo gateway's config file: a free loopback port, a small retention, SQLite in `store_path`."""
    return "\n".join(
        [
            "[server]",
            'listen = "127.0.0.1:0"',
            "[upstream]",
            f"command = {json.dumps(upstream_cmd)}",
            "[upstream.stdio]",
            "idle_processes = 0",
            "[retention]",
            f"max_events_per_task = {RETAINED}",
            "[store]",
            'kind = "sqlite"',
            f"path = {json.dumps(str(store_path))}",
            "[logging]",
            'level = "warning"',
            "",
        ]
    )


@contextlib.asynccontextmanager
async def gateway_process(config_path: Path) -> AsyncIterator[str]:
    """`python -m gateway serve --config config_path` as a child process, as a user would start it;
    yields its URL once it listens and stops it on exit (SIGTERM, which it takes as a shutdown). Its
    log (warnings) goes to this process's stderr."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(path for path in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if path)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config_path),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        yield await _listening_url(process)
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def _listening_url(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    try:
        async with asyncio.timeout(STARTUP_S):
            while line := (await process.stdout.readline()).decode(errors="replace"):
                if line.startswith(LISTENING):
                    return line[len(LISTENING) :].strip()
            code = await process.wait()
    except TimeoutError:
        raise GatewayNotStarted(f"the gateway did not listen within {STARTUP_S:.0f} s") from None
    raise GatewayNotStarted(f"the gateway exited (code {code}) before it listened; its log is above")


async def run_demo(upstream_cmd: list[str], *, keep: bool = False, out: TextIO = sys.stdout) -> int:
    """Run the demo against a gateway process it starts; 0 if every step passed, else 1."""
    # The default store (SQLite) in a directory of its own: a demo leaves nothing behind, and runs
    # beside a gateway that holds data/gateway.db.
    with tempfile.TemporaryDirectory(prefix="mcp-task-gateway-demo-") as data:
        config_path = Path(data) / "gateway.toml"
        config_path.write_text(config_text(upstream_cmd, Path(data) / "gateway.db"), encoding="utf-8")
        out.write("mcp-task-gateway demo: resumable task event streams (SEP-2694), end to end\n")
        out.write(f"   upstream: {shlex.join(upstream_cmd)} (stdio; an MCP server without Tasks)\n")
        out.flush()
        try:
            async with gateway_process(config_path) as url:
                where = f"a process of its own; retention {RETAINED} events per task; SQLite store in {data}"
                out.write(f"   gateway:  {url} ({where})\n")
                return await drive(url, keep=keep, out=out)
        except GatewayNotStarted as exc:
            print(f"mcp-task-gateway demo: {exc}", file=sys.stderr)
            return 1


async def drive(url: str, *, keep: bool, out: TextIO) -> int:
    """The demo's steps against the gateway at `url`, and its report; 0 if every step passed, else 1."""
    started = time.monotonic()
    host, _, port = url.split("//", 1)[1].split("/", 1)[0].rpartition(":")
    link = FlakyLink(host, int(port))
    try:
        link_url = f"http://127.0.0.1:{await link.start()}/mcp"
        out.write("   opening clients A, B and C (each legacy session gets an upstream process of its own)\n")
        out.flush()
        a, b, c = GatewayClient(url), GatewayClient(url), GatewayClient(link_url)
        demo = Demo(url, out, out.isatty(), a, b, c, link)
        try:
            async with asyncio.timeout(DEADLINE_S), contextlib.AsyncExitStack() as stack:
                for client in (a, b, c):
                    stack.push_async_callback(client.close)
                await asyncio.gather(a.connect(), b.connect(), c.connect())
                await demo.run()
        except TimeoutError:
            demo.record("deadline", False, f"the demo did not finish within {DEADLINE_S:.0f} s")
        except Exception as exc:  # a client could not even connect
            demo.record("connect", False, f"{type(exc).__name__}: {exc}")
        passed = demo.report(time.monotonic() - started)
        if keep:
            await _keep_running(demo)
        return 0 if passed else 1
    finally:
        await link.close()


async def _keep_running(demo: Demo) -> None:
    demo.say()
    demo.say(f"The gateway keeps running at {demo.url} (Ctrl-C to stop). Try:", indent=0)
    if demo.build_task is not None:
        demo.say(f"mcp-task-gateway tail {demo.url} {demo.build_task}")
        demo.say(f"mcp-task-gateway tail --json --after {DROP_AFTER} {demo.url} {demo.build_task}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(*, keep: bool = False, upstream_cmd: str | None = None) -> int:
    """Entry point of `mcp-task-gateway demo`."""
    if upstream_cmd:
        command = shlex.split(upstream_cmd)
    else:
        example = find_example_server()
        if example is None:
            print(
                "mcp-task-gateway demo: examples/build_server.py not found in the current directory or next to the "
                "package; run from the repository or pass --upstream-cmd",
                file=sys.stderr,
            )
            return 2
        command = [sys.executable, str(example)]
    try:
        return asyncio.run(run_demo(command, keep=keep))
    except KeyboardInterrupt:
        return 130
