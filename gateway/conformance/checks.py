"""The checks: the scenarios the kit plays against a target in one era, and the verdict of each check.

One era's run, in order: read the capabilities; start a task and stream it live to its end; stream it
again as a late joiner, with a progress token, after a cursor, after its last event; send malformed
and foreign requests; overrun retention where the target's advertised limits allow it; start a second
task to try a second concurrent stream and a stream cancellation; and, with a second credential set,
try another caller. A check is judged on every exchange that bears on it: the first violation fails
it, with that exchange as evidence; a check nothing could exercise is skipped with the reason. A stream
that does not end within the timeout after its task is terminal fails its ending check and stops the
era's run (`StreamHung`): every later stream would wait as long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from gateway.client.stream import GatewayError
from gateway.conformance.probe import Exchange, Probe, clip, unknown_task_id
from gateway.conformance.registry import Result, Status, checks_for
from gateway.protocol.dialect import dialect_of
from gateway.protocol.era import CLIENT_CAPABILITIES_KEY, PROTOCOL_VERSION_KEY, Era
from gateway.protocol.jsonrpc import EVENTS_GONE, HEADER_MISMATCH, INVALID_PARAMS, METHOD_NOT_FOUND
from gateway.protocol.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY as MISSING_CAPABILITY
from gateway.protocol.names import RELATED_TASK_KEY as RELATED_TASK

BAD_AFTER_TYPES: tuple[object, ...] = (1.5, "1", True, None)


@dataclass(frozen=True)
class Target:
    """What the kit is pointed at and how it may drive it."""

    url: str
    tool: str
    arguments: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)
    other_headers: Mapping[str, str] | None = None
    """A second credential set, for the authorization check; None skips it."""
    timeout: float = 15.0
    """Bound on each wait: one answer, one stream, a task reaching its end, a stream's end after that."""


class StreamHung(Exception):
    """A stream did not end within the timeout after its task was terminal: the era's run stops here."""


class Verdicts:
    """The checks of one era and their outcomes so far: a failure is final, a pass can still turn into one."""

    def __init__(self, era: Era) -> None:
        self.era = era
        self.blocked = ""
        """Why the run stopped early (the reason every undecided check is skipped with)."""
        self._results = {check.id: Result(check, era, "skip") for check in checks_for(era)}
        self._decided: set[str] = set()

    def judge(self, check_id: str, ok: bool, reason: str, *evidence: dict[str, Any], seen: str = "") -> None:
        """Record one observation: a failure with its `reason` and evidence, or a pass (with what was
        `seen`, if worth saying; the first pass's evidence is kept)."""
        result = self._results[check_id]
        if result.status == "fail":
            return
        if not ok:
            result.status, result.reason, result.evidence = "fail", reason, list(evidence)
        elif result.status != "pass":
            result.status, result.reason, result.evidence = "pass", seen, list(evidence)
        self._decided.add(check_id)

    def skip(self, check_id: str, reason: str, *evidence: dict[str, Any]) -> None:
        self._settle(check_id, "skip", reason, evidence)

    def info(self, check_id: str, reason: str, *evidence: dict[str, Any]) -> None:
        """Report what was seen for a check that cannot fail (a SHOULD the SEP gives no wire form)."""
        self._settle(check_id, "info", reason, evidence)

    def _settle(self, check_id: str, status: Status, reason: str, evidence: Sequence[dict[str, Any]]) -> None:
        if check_id not in self._decided:
            self._results[check_id] = Result(self._results[check_id].check, self.era, status, reason, list(evidence))
            self._decided.add(check_id)

    def block(self, reason: str, *evidence: dict[str, Any]) -> None:
        """Stop the run: `setup.run` fails with `reason`, and every check not yet decided is skipped with it."""
        self.blocked = self.blocked or reason
        self.judge("setup.run", False, self.blocked, *evidence)

    def stop(self, reason: str) -> None:
        """Stop the run for a fault a check has already failed on: every check not yet decided is skipped
        with `reason` (`setup.run` does not fail: the kit did its part)."""
        self.blocked = self.blocked or reason

    def results(self) -> list[Result]:
        self.judge("setup.run", True, "")
        for check_id, result in self._results.items():
            if check_id not in self._decided:
                result.reason = self.blocked or "not reached"
        return list(self._results.values())


def event_key(event: object) -> bytes:
    """What must be identical between two deliveries of one event: seq, type and payload."""
    if not isinstance(event, dict):
        return orjson.dumps(event, default=repr)
    return orjson.dumps(
        [event.get("seq"), event.get("type"), event.get("payload")], option=orjson.OPT_SORT_KEYS, default=repr
    )


def is_seq(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def type_is_prefixed(kind: str) -> bool:
    """A namespaced type: `vendor/name`, or at least two dotted labels before the name (reverse-DNS).
    `task.status` or `content.partial` look like the names SEP-2694 reserves for MCP."""
    if "/" in kind:
        return bool(kind.split("/", 1)[0]) and bool(kind.split("/", 1)[1])
    labels = kind.split(".")
    return len(labels) >= 3 and all(labels)


def not_a_task(created: Exchange) -> str:
    """Why a tools/call made no task, for the reason of `setup.run`."""
    error = created.error
    if error is not None:
        return f"was refused: {error.get('code')} {error.get('message')!r}"
    if created.problem:
        return f"got no answer: {created.problem}"
    return (
        "answered without a task: give --tool/--args for a tool that runs as a task long enough "
        "(a 2026-07-28 server may answer a short call directly)"
    )


def empty_result(result: dict[str, Any] | None, era: Era) -> bool:
    return result is not None and {k: v for k, v in result.items() if k != "_meta"} == dialect_of(era).empty_result


class Scenario:
    """One era's run against the target."""

    def __init__(self, probe: Probe, target: Target, verdicts: Verdicts) -> None:
        self.probe = probe
        self.target = target
        self.v = verdicts
        self.era = probe.era
        self.retention: dict[str, Any] = {}

    async def run(self) -> None:
        await self.capabilities()
        task_id, live = await self.live_task()
        if task_id is None or live is None:
            return
        late = await self.replays(task_id, live)
        await self.request_validation(task_id)
        await self.events_gone(task_id, live, late)
        await self.authorization(task_id)
        if self.era.has_envelope:
            await self.modern_envelope(task_id)
        await self.concurrent_and_cancel()

    # -- the capabilities --------------------------------------------------------------------------

    async def capabilities(self) -> None:
        capabilities, evidence = await self.probe.capabilities()
        tasks = dialect_of(self.era).declared_tasks({"capabilities": capabilities})
        where = f"{self.era.tasks_capability_path}.eventStreams"
        advertised = tasks.get("eventStreams") if tasks is not None else None
        if advertised is None:
            reason = f"{where} is not advertised (MAY)"
            self.v.skip("capability.event_streams", reason, evidence)
            self.v.info("capability.retention_fields", f"{reason}: no retention advertised", evidence)
            return
        self.v.judge("capability.event_streams", isinstance(advertised, dict), f"{where} must be an object", evidence)
        if isinstance(advertised, dict):
            self.retention = advertised
        # SEP-2694 asks receivers to document retention and names no field for it: whatever is (or is not)
        # advertised is reported, never judged. maxEventsPerTask, if given, only helps read the streams.
        shown = orjson.dumps(advertised, option=orjson.OPT_SORT_KEYS).decode()
        if len(shown) > 200:
            shown = shown[:200] + "…"
        self.v.info(
            "capability.retention_fields",
            f"advertised {where} = {shown}" if advertised else f"{where} advertises no retention",
            {"advertised": clip(advertised)},
        )

    # -- the main task: live, then replays ---------------------------------------------------------

    async def live_task(self) -> tuple[str | None, Exchange | None]:
        task_id, created = await self.probe.start_task(self.target.tool, self.target.arguments)
        if task_id is None:
            self.v.block(f"tools/call {self.target.tool!r} {not_a_task(created)}", created.evidence())
            return None, None
        live = await self.probe.stream(task_id)
        if live.error_code() == METHOD_NOT_FOUND:
            self.v.block("the target does not implement tasks/stream")
            self.v.judge("method.exists", False, "tasks/stream answered -32601", live.evidence())
            return None, None
        self.v.judge("method.exists", True, "", live.evidence())
        self.shape(live, task_id)
        seqs = live.seqs()
        if not seqs:
            self.v.judge(
                "seq.starts_at_zero",
                False,
                "the live stream delivered no event (the tool must emit some: see --tool/--args)",
                live.evidence(),
            )
        elif seqs[0] != 0 and self.may_have_dropped(seqs):
            self.v.skip(
                "seq.starts_at_zero",
                f"the live stream starts at seq {seqs[0]!r}, and the task has more events than the advertised "
                f"maxEventsPerTask ({self.retention.get('maxEventsPerTask')}): the first may have been dropped "
                f"before the stream opened",
                live.evidence(),
            )
        else:
            self.v.judge("seq.starts_at_zero", seqs[0] == 0, f"the first event has seq {seqs[0]!r}", live.evidence())
        self.ended(live)
        self.v.judge(
            "end.terminal_result",
            empty_result(live.result, self.era),
            f"the live stream must end with {orjson.dumps(dialect_of(self.era).empty_result).decode()}",
            live.evidence(),
        )
        status, _ = await self.probe.wait_terminal(task_id)
        if status not in ("completed", "failed", "cancelled"):
            self.v.block(f"the task did not end within {self.target.timeout:g} s (status {status!r})")
            return None, None
        return task_id, live

    async def stream(
        self,
        task_id: str,
        after: object = None,
        *,
        progress_token: str | None = None,
        ending: str = "end.terminal_result",
    ) -> Exchange:
        """`Probe.stream`, and `ended` on it (with `ending`, the check a stream that does not end fails)."""
        exchange = await self.probe.stream(task_id, after, progress_token=progress_token)
        self.ended(exchange, ending)
        return exchange

    def ended(self, exchange: Exchange, ending: str = "end.terminal_result") -> None:
        """A stream that did not end within the timeout after its task was terminal fails `ending` and
        stops the run (StreamHung)."""
        if not exchange.hung_after:
            return
        self.v.judge(ending, False, f"{exchange.problem} (a stream of an ended task must end)", exchange.evidence())
        raise StreamHung(f"not played: {exchange.problem} (see {ending}); every later stream would wait as long")

    def may_have_dropped(self, seqs: Sequence[object]) -> bool:
        """Whether retention may have dropped the first of a task's events whose last seq is in `seqs`:
        it had more than the advertised maxEventsPerTask."""
        limit = self.retention.get("maxEventsPerTask")
        last = max((seq for seq in seqs if is_seq(seq)), default=-1)
        return is_seq(limit) and last + 1 > limit

    def shape(self, exchange: Exchange, task_id: str, after: int | None = None) -> None:
        """The sequence and event-shape checks, on every event of one stream."""
        previous = after
        for event in exchange.events:
            evidence = exchange.evidence(f"offending event: {orjson.dumps(clip(event), default=repr).decode()}")
            if not isinstance(event, dict):
                self.v.judge("event.fields", False, "an event's params is not an object", evidence)
                continue
            seq, kind, payload = event.get("seq"), event.get("type"), event.get("payload")
            fields_ok = is_seq(seq) and event.get("taskId") == task_id and isinstance(kind, str) and "payload" in event
            self.v.judge(
                "event.fields", fields_ok, "an event lacks seq, taskId (of this task), type or payload", evidence
            )
            self.v.judge(
                "event.type_prefixed",
                isinstance(kind, str) and type_is_prefixed(kind),
                f"event type {kind!r} has no vendor prefix",
                evidence,
            )
            self.v.judge(
                "event.payload_object", isinstance(payload, dict), "an event's payload is not an object", evidence
            )
            meta = event.get("_meta")
            related = meta.get(RELATED_TASK) if isinstance(meta, dict) else None
            self.v.judge(
                "event.related_task_meta",
                isinstance(related, dict) and related.get("taskId") == event.get("taskId"),
                f"_meta[{RELATED_TASK!r}].taskId is missing or differs from params.taskId",
                evidence,
            )
            if not is_seq(seq):
                continue
            if previous is not None:
                self.v.judge("seq.ordered", seq > previous, f"seq {seq} came after seq {previous}", evidence)
                self.v.judge(
                    "seq.contiguous",
                    seq == previous + 1,
                    f"seq {seq} followed seq {previous} (expected {previous + 1})",
                    evidence,
                )
            previous = seq
        if exchange.events:
            self.v.judge("seq.ordered", True, "", exchange.evidence())
            self.v.judge("seq.contiguous", True, "", exchange.evidence())

    async def replays(self, task_id: str, live: Exchange) -> Exchange:
        """The ended task streamed again: from the start, with a progress token, after a cursor, after
        its last event. Returns the late joiner's stream."""
        late = await self.stream(task_id)
        self.shape(late, task_id)
        history = [e for e in live.events if isinstance(e, dict) and is_seq(e.get("seq"))]
        seqs = [e["seq"] for e in history]
        late_seqs = late.seqs()
        first = late_seqs[0] if late_seqs and is_seq(late_seqs[0]) else None
        expected = [event_key(e) for e in history if first is not None and e["seq"] >= first]
        same = first is not None and [event_key(e) for e in late.events] == expected
        same = same and (first == 0 or self.may_have_dropped(seqs))
        self.v.judge(
            "history.late_joiner",
            same and empty_result(late.result, self.era),
            f"a late stream must repeat the live history from the earliest retained event (live seqs "
            f"{seqs[:1]}…{seqs[-1:]}, {len(seqs)} events; late first seq {first!r}, {len(late_seqs)} events)",
            late.evidence(),
            live.evidence("the live stream"),
        )
        with_token = await self.stream(task_id, progress_token="conformance-progress")
        self.shape(with_token, task_id)
        self.v.judge(
            "progress.not_events",
            [event_key(e) for e in with_token.events] == [event_key(e) for e in late.events]
            and empty_result(with_token.result, self.era),
            "a stream with a progressToken must deliver the same events as one without",
            with_token.evidence(),
            late.evidence("the same stream without a progressToken"),
        )
        if not seqs:
            return late
        last = seqs[-1]
        earliest = first if first is not None else last + 1
        cursor = max(earliest, (earliest + last) // 2)
        if cursor >= last:
            self.v.skip("resume.after_cursor", f"fewer than two retained events (earliest {earliest}, last {last})")
        else:
            resumed = await self.stream(task_id, cursor)
            self.shape(resumed, task_id, cursor)
            wanted = [event_key(e) for e in history if e["seq"] > cursor]
            self.v.judge(
                "resume.after_cursor",
                [event_key(e) for e in resumed.events] == wanted and empty_result(resumed.result, self.era),
                f"after {cursor} must deliver exactly seqs {cursor + 1}…{last}, then the empty result",
                resumed.evidence(),
            )
        at_end = await self.stream(task_id, last, ending="end.terminal_immediate")
        self.v.judge(
            "end.terminal_immediate",
            not at_end.events and empty_result(at_end.result, self.era),
            f"after {last} (the last seq) on an ended task must be the empty result at once, with no event",
            at_end.evidence(),
        )
        return late

    # -- malformed and foreign requests -----------------------------------------------------------

    def refused(self, check_id: str, exchange: Exchange, what: str, *codes: int) -> None:
        self.v.judge(
            check_id,
            exchange.error_code() in codes and not exchange.events,
            f"{what} must get {' or '.join(map(str, codes))} and no event",
            exchange.evidence(),
        )

    async def request_validation(self, task_id: str) -> None:
        self.refused("request.after_range", await self.probe.stream(task_id, -1), "after: -1", INVALID_PARAMS)
        for value in BAD_AFTER_TYPES:
            params = {"taskId": task_id, "after": value}
            exchange = await self.probe.call(self.probe.message("tasks/stream", params))
            self.refused("request.after_type", exchange, f"after: {orjson.dumps(value).decode()}", INVALID_PARAMS)
        # 2026-07-28: without a taskId there is no Mcp-Name to send, which the header check may refuse first.
        missing = (INVALID_PARAMS, HEADER_MISMATCH) if self.era.has_envelope else (INVALID_PARAMS,)
        for malformed, codes in (({}, missing), ({"taskId": 42}, (INVALID_PARAMS,))):
            exchange = await self.probe.call(self.probe.message("tasks/stream", malformed))
            self.refused("request.task_id", exchange, f"params {orjson.dumps(malformed).decode()}", *codes)
        unknown = unknown_task_id()
        streamed = await self.probe.stream(unknown)
        got = await self.probe.request("tasks/get", {"taskId": unknown})
        self.v.judge(
            "request.unknown_task",
            streamed.error is not None and not streamed.events and streamed.error_code() == got.error_code(),
            "tasks/stream of an unknown task must be refused like its tasks/get (same code, no event)",
            streamed.evidence(),
            got.evidence(),
        )

    async def authorization(self, task_id: str) -> None:
        if self.target.other_headers is None:
            self.v.skip("auth.same_as_tasks_get", "no second credential set given (--other-header)")
            return
        other = Probe(self.target.url, self.era, self.target.other_headers, self.target.timeout)
        async with other:
            got = await other.request("tasks/get", {"taskId": task_id})
            streamed = await other.stream(task_id)
        get_allowed = got.result is not None
        stream_allowed = streamed.error is None and streamed.answer is not None
        self.v.judge(
            "auth.same_as_tasks_get",
            get_allowed == stream_allowed and (stream_allowed or not streamed.events),
            f"another caller's tasks/get was {'allowed' if get_allowed else 'refused'} but its tasks/stream "
            f"was {'allowed' if stream_allowed else 'refused'}"
            + ("" if stream_allowed or not streamed.events else " (and it received events)"),
            got.evidence("tasks/get with --other-header"),
            streamed.evidence("tasks/stream with --other-header"),
        )

    async def modern_envelope(self, task_id: str) -> None:
        no_extension: dict[str, Any] = {PROTOCOL_VERSION_KEY: self.era.value, CLIENT_CAPABILITIES_KEY: {}}
        exchange = await self.probe.call(
            self.probe.message("tasks/stream", {"taskId": task_id, "_meta": no_extension}, envelope=False)
        )
        self.refused("modern.extension_required", exchange, "an envelope without the extension", MISSING_CAPABILITY)
        exchange = await self.probe.call(self.probe.stream_message(task_id), {"Mcp-Name": "not-" + task_id})
        if exchange.result is not None:
            reason = (
                "the target does not read Mcp-Name on tasks/stream (it served the stream): allowed, since no rule "
                "gives tasks/stream a routing header"
            )
            self.v.skip("modern.name_header", reason, exchange.evidence())
        else:
            self.v.judge(
                "modern.name_header",
                exchange.http_status == 400 and exchange.error_code() == HEADER_MISMATCH and not exchange.events,
                "an Mcp-Name other than the taskId must get HTTP 400 and -32020",
                exchange.evidence(),
            )
        exchange = await self.probe.call(self.probe.message("tasks/stream", {"taskId": task_id}, envelope=False))
        self.v.judge(
            "modern.envelope_required",
            exchange.error is not None and not exchange.events,
            "a request without the _meta envelope must get an error and no event",
            exchange.evidence(),
        )

    # -- retention overrun ------------------------------------------------------------------------

    async def events_gone(self, task_id: str, live: Exchange, late: Exchange) -> None:
        ids = ("events_gone.not_silent", "events_gone.error_shape", "events_gone.earliest_seq")
        seqs = late.seqs()
        earliest = seqs[0] if seqs and is_seq(seqs[0]) else None
        if not is_seq(earliest) or earliest < 2:
            reason = (
                f"no event was dropped (a late stream starts at seq {earliest!r}; the tool emitted "
                f"{len(live.events)} events, advertised maxEventsPerTask {self.retention.get('maxEventsPerTask')!r}): "
                f"retention cannot be overrun in bounded time"
            )
            for check_id in (*ids, "events_gone.resume_from_earliest"):
                self.v.skip(check_id, reason, late.evidence())
            return
        gone = await self.stream(task_id, earliest - 2)
        error = gone.error or {}
        data = error.get("data")
        data = data if isinstance(data, dict) else {}
        self.v.judge(
            "events_gone.not_silent",
            gone.error is not None and not gone.events,
            f"after {earliest - 2}, when seq {earliest - 1} is gone, must be an error, not a stream",
            gone.evidence(),
        )
        message = error.get("message")
        self.v.judge(
            "events_gone.error_shape",
            error.get("code") == EVENTS_GONE
            and isinstance(message, str)
            and bool(message)
            and data.get("reason") == "events_gone"
            and data.get("taskId") == task_id,
            f"events_gone must be code {EVENTS_GONE}, a message, data.reason 'events_gone' and data.taskId",
            gone.evidence(),
        )
        reported = data.get("earliestSeq")
        self.v.judge(
            "events_gone.earliest_seq",
            reported == earliest and is_seq(reported),
            f"data.earliestSeq must be {earliest}, the first seq a stream without after delivers",
            gone.evidence(),
            late.evidence("a stream without after"),
        )
        start = reported if is_seq(reported) and reported >= 1 else earliest
        resumed = await self.stream(task_id, start - 1)
        self.shape(resumed, task_id, start - 1)
        wanted = [
            event_key(e) for e in live.events if isinstance(e, dict) and is_seq(e.get("seq")) and e["seq"] >= start
        ]
        self.v.judge(
            "events_gone.resume_from_earliest",
            [event_key(e) for e in resumed.events] == wanted and empty_result(resumed.result, self.era),
            f"after {start - 1} must deliver the retained events from {start} on, gap-free",
            resumed.evidence(),
        )

    # -- a second task: a second stream, then cancelling the stream ------------------------------

    async def concurrent_and_cancel(self) -> None:
        task_id, created = await self.probe.start_task(self.target.tool, self.target.arguments)
        if task_id is None:
            for check_id in ("stream.one_per_task", "cancel.task_survives"):
                self.v.skip(check_id, f"a second tools/call {not_a_task(created)}", created.evidence())
            return
        first = await self.probe.open(self.probe.stream_message(task_id))
        delivering = await first.read_until(lambda message: message.get("method") == "notifications/tasks/event")
        status, _ = await self.probe.task_status(task_id)
        if not delivering or status in ("completed", "failed", "cancelled"):
            first.close()
            reason = "the task ended (or its stream delivered nothing) before the kit could use it: give a longer task"
            for check_id in ("stream.one_per_task", "cancel.task_survives"):
                self.v.skip(check_id, reason, first.exchange.evidence())
            return
        await self.second_stream(task_id)
        await first.cancel()
        after_cancel, polled = await self.probe.task_status(task_id)
        final, ended = await self.probe.wait_terminal(task_id)
        self.v.judge(
            "cancel.task_survives",
            after_cancel != "cancelled" and final not in ("cancelled", None),
            f"after the stream was cancelled the task was {after_cancel!r}, then {final!r}",
            first.exchange.evidence("the cancelled stream"),
            polled.evidence("tasks/get right after the cancellation"),
            ended.evidence("tasks/get once the task ended"),
            seen=f"the task was {after_cancel!r} after the cancellation, then {final!r}",
        )

    async def second_stream(self, task_id: str) -> None:
        if not self.era.has_sessions:
            self.v.skip("stream.one_per_task", "2026-07-28 has no sessions: each POST is its own connection")
            return
        second = await self.probe.open(self.probe.stream_message(task_id))
        await second.read_until(lambda message: message.get("method") == "notifications/tasks/event")
        await second.cancel()
        self.v.judge(
            "stream.one_per_task",
            second.exchange.error_code() == INVALID_PARAMS and not second.exchange.events,
            "a second tasks/stream of the same task on the same session, while the first is active, must get -32602",
            second.exchange.evidence(),
        )


async def run_era(target: Target, era: Era) -> list[Result]:
    """Every check of `era` against `target`, bounded in time."""
    verdicts = Verdicts(era)
    try:
        # Each step is bounded by the target's timeout; this bounds the sum (a run takes a few dozen steps).
        async with (
            asyncio.timeout(target.timeout * 40),
            Probe(target.url, era, target.headers, target.timeout) as probe,
        ):
            await Scenario(probe, target, verdicts).run()
    except StreamHung as exc:
        verdicts.stop(str(exc))
    except TimeoutError:
        verdicts.block("the run did not finish in time")
    except (GatewayError, OSError) as exc:  # e.g. nothing answered the initialize
        verdicts.block(f"cannot talk to {target.url}: {exc}")
    except Exception as exc:  # a target answering nonsense must end in a report, not a traceback
        verdicts.block(f"the run stopped: {type(exc).__name__}: {exc}")
    return verdicts.results()
