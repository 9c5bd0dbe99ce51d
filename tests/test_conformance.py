"""The SEP-2694 conformance kit (`mcp-task-gateway conformance`): it passes, with no failure, against
the gateway in front of the example server (both eras, hosted tasks; and with a retention small enough
that its events_gone checks run), in front of server-everything (pass-through, 2025-11-25), and against
the native reference server directly (both eras, two callers, retention it can overrun); each broken
variant of the native server fails on the check named for it, which the correct server passes with the
same options. Its pure parts (check registry, reports, the generated docs) are checked on their own.

`run_kit(url, *options)` runs the real command against any URL and returns its exit status, JSON
report and table: a new target is one more call of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from gateway.conformance import command, docs
from gateway.conformance.checks import Verdicts, type_is_prefixed
from gateway.conformance.registry import BY_ID, CHECKS, ERAS, SECTIONS, Result, checks_for
from gateway.conformance.report import as_json, junit, summary, table
from gateway.protocol.era import Era
from tests.conftest import EXAMPLE_SERVER, ROOT, free_port, serve_http, start_gateway
from tests.test_native_stream_server import BROKEN, DEFECTS, NATIVE
from tests.test_upstream_with_tasks import node_command

VARIANT_CHECKS = {
    "first_seq_1": "seq.starts_at_zero",
    "skipped_seq": "seq.contiguous",
    "duplicates_after_resume": "resume.after_cursor",
    "events_gone_wrong_code": "events_gone.error_shape",
    "events_gone_no_earliest": "events_gone.earliest_seq",
    "events_gone_silent_skip": "events_gone.not_silent",
    "no_terminal_result": "end.terminal_result",
    "stream_never_ends": "end.terminal_result",
    "cancel_cancels_task": "cancel.task_survives",
    "unprefixed_types": "event.type_prefixed",
    "payload_not_object": "event.payload_object",
    "concurrent_streams_allowed": "stream.one_per_task",
    "foreign_caller_allowed": "auth.same_as_tasks_get",
}
"""Each broken native server (tests/servers/broken_native_server.py) and the check it must fail (issue 13):
these ids must exist, unchanged."""

OVERRUN_RETENTION = ("--max-events-per-task", "10")
"""Native server options the kit can overrun, so its events_gone checks run: `slow_build` with the kit's
default arguments emits 15 events. Seq 0 is kept until the tool's 11th event, 1.25 s in, so a stream
opened late on a busy machine still starts at 0 (else seq.starts_at_zero would be skipped)."""

TWO_CALLERS = ("--header", "Authorization: Bearer alice", "--other-header", "Authorization: Bearer bob")
"""Two principals of the native server, so auth.same_as_tasks_get runs."""

VARIANT_KIT_OPTIONS = ("--era", "legacy", "--timeout", "3", "--args", '{"steps": 6, "delay": 0.15}', *TWO_CALLERS)
"""How the kit is run against a broken variant (and the correct server it is compared with), kept short:
2025-11-25 shows every defect; `slow_build` still emits 15 events, in 0.9 s; a 3 s bound on each wait
keeps the streams that never end (no_terminal_result, stream_never_ends) short and is still three times
the task."""

KIT_TIMEOUT = 150.0
"""Seconds one run of the kit may take (a run is a few seconds per era; each of its waits is bounded)."""
HUNG_KIT_TIMEOUT = 90.0
"""Seconds a run with the default --timeout may take against a target whose streams never end (the
kit stops an era at the first such stream: about 2 x (the task + 15 s) in all)."""


async def run_kit(url: str, *options: str, bound: float = KIT_TIMEOUT) -> tuple[int, dict[str, Any], str]:
    """`mcp-task-gateway conformance URL *options` as a subprocess, which must end within `bound` seconds:
    (exit status, JSON report, table)."""
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        report = Path(tmp) / "report.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "conformance", url, "--json", str(report), *options,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        try:
            async with asyncio.timeout(bound):
                output, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        text = output.decode(errors="replace")
        assert report.is_file(), f"the kit wrote no JSON report:\n{text}"
        return proc.returncode or 0, json.loads(report.read_text(encoding="utf-8")), text


def outcomes(report: dict[str, Any], status: str) -> set[tuple[str, str]]:
    """(era, check id) of every result with `status`."""
    return {(r["era"], r["id"]) for r in report["results"] if r["status"] == status}


def assert_conforms(code: int, report: dict[str, Any], table_text: str, eras: tuple[Era, ...]) -> None:
    assert outcomes(report, "fail") == set(), table_text
    assert code == 0, table_text
    expected = {(era.label, check.id) for era in eras for check in checks_for(era)}
    assert {(r["era"], r["id"]) for r in report["results"]} == expected
    assert summary_line(report) in table_text


def summary_line(report: dict[str, Any]) -> str:
    tally = report["summary"]
    return f"{tally['passed']} passed, {tally['failed']} failed, {tally['skipped']} skipped, {tally['info']} info"


# -- against real targets -------------------------------------------------------------------------


async def test_gateway_in_front_of_the_example_server_conforms_in_both_eras() -> None:
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER) as gw:
        code, report, text = await run_kit(gw.url, "--era", "both")
    assert_conforms(code, report, text, ERAS)
    passed = outcomes(report, "pass")
    for era in ERAS:
        ran = {
            "setup.run",
            "seq.starts_at_zero",
            "seq.contiguous",
            "resume.after_cursor",
            "history.late_joiner",
            "end.terminal_result",
            "end.terminal_immediate",
            "cancel.task_survives",
            "event.type_prefixed",
            "event.payload_object",
            "progress.not_events",
            "request.after_type",
        }
        assert {(era.label, check_id) for check_id in ran} <= passed, text
    assert ("legacy", "stream.one_per_task") in passed
    assert ("modern", "modern.name_header") in passed
    # The default retention (10,000 events per task) cannot be overrun by a 16-event task.
    skipped = {r["id"]: r["reason"] for r in report["results"] if r["status"] == "skip"}
    assert "retention cannot be overrun" in skipped["events_gone.not_silent"]
    assert "--other-header" in skipped["auth.same_as_tasks_get"]


async def test_events_gone_checks_run_and_pass_when_retention_is_small() -> None:
    config = "[retention]\nmax_events_per_task = 5\n"
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
        code, report, text = await run_kit(gw.url, "--era", "both")
    assert_conforms(code, report, text, ERAS)
    gone = {check.id for check in CHECKS if check.section == "events_gone"}
    assert {(era.label, check_id) for era in ERAS for check_id in gone} <= outcomes(report, "pass"), text


async def test_gateway_passing_through_server_everything_conforms() -> None:
    async with start_gateway(upstream_cmd=node_command()) as gw:
        code, report, text = await run_kit(
            gw.url, "--era", "legacy", "--tool", "simulate-research-query", "--args", '{"topic": "python"}'
        )
    assert_conforms(code, report, text, (Era.LEGACY,))
    assert {("legacy", "history.late_joiner"), ("legacy", "cancel.task_survives")} <= outcomes(report, "pass")


@contextlib.asynccontextmanager
async def native_server(tmp_path: Path, *options: str, variant: str | None = None) -> AsyncIterator[str]:
    """The native reference server (or its broken `variant`) on a free port; its URL."""
    command = NATIVE if variant is None else [*BROKEN, "--variant", variant]
    log = tmp_path / f"{variant or 'native'}.log"
    async with serve_http(command, *options, log=log, port_option="--port") as url:
        yield url


async def test_the_native_reference_server_conforms_in_both_eras(tmp_path: Path) -> None:
    async with native_server(tmp_path, *OVERRUN_RETENTION) as url:
        code, report, text = await run_kit(url, "--era", "both", *TWO_CALLERS)
    assert_conforms(code, report, text, ERAS)
    skipped = {(r["era"], r["id"]): r["reason"] for r in report["results"] if r["status"] == "skip"}
    # Everything else ran and passed: events_gone (retention overrun) and authorization (two callers) included.
    assert set(skipped) == {("modern", "stream.one_per_task"), ("modern", "modern.name_header")}, text
    assert "does not read Mcp-Name on tasks/stream" in skipped["modern", "modern.name_header"]


async def test_a_server_advertising_no_retention_fields_conforms_and_its_retention_is_reported(
    tmp_path: Path,
) -> None:
    """SEP-2694 names no retention field: `eventStreams: {}` is reported (info), never failed."""
    async with native_server(tmp_path, "--no-retention-fields") as url:
        code, report, text = await run_kit(url, "--era", "both")
    assert_conforms(code, report, text, ERAS)
    retention = {r["era"]: r for r in report["results"] if r["id"] == "capability.retention_fields"}
    assert {era: r["status"] for era, r in retention.items()} == {"legacy": "info", "modern": "info"}, text
    assert "advertises no retention" in retention["legacy"]["reason"]
    assert retention["legacy"]["evidence"] == [{"advertised": {}}]
    assert ("legacy", "capability.event_streams") in outcomes(report, "pass")


async def test_advertised_retention_is_reported_with_its_values(tmp_path: Path) -> None:
    async with native_server(tmp_path, *OVERRUN_RETENTION) as url:
        code, report, text = await run_kit(url, "--era", "legacy")
    assert code == 0, text
    (retention,) = [r for r in report["results"] if r["id"] == "capability.retention_fields"]
    assert retention["status"] == "info" and '"maxEventsPerTask":10' in retention["reason"], text
    assert "info  capability.retention_fields" in text


@pytest.mark.parametrize("variant", ["stream_never_ends", "no_terminal_result"])
async def test_a_stream_that_never_ends_fails_both_eras_within_the_default_timeout(
    tmp_path: Path, variant: str
) -> None:
    """No terminal event and no end (stream_never_ends), or every event and then no answer
    (no_terminal_result): with the default --timeout the whole run ends (bounded by HUNG_KIT_TIMEOUT),
    failing end.terminal_result in each era with the reason, the rest of the era skipped with it."""
    async with native_server(tmp_path, variant=variant) as url:
        code, report, text = await run_kit(url, "--era", "both", bound=HUNG_KIT_TIMEOUT)
    assert code == 1, text
    assert outcomes(report, "fail") == {("legacy", "end.terminal_result"), ("modern", "end.terminal_result")}, text
    for result in report["results"]:
        if result["id"] == "end.terminal_result":
            assert "did not end within 15 s after the task was completed" in result["reason"], text
    skipped = [r for r in report["results"] if r["status"] == "skip"]
    assert {r["id"] for r in skipped} >= {"history.late_joiner", "resume.after_cursor", "cancel.task_survives"}
    assert all("not played" in r["reason"] for r in skipped if r["id"] == "history.late_joiner"), text
    assert "Traceback" not in text


NATIVE_UPSTREAM_ARGS = ("--args", '{"steps": 12, "delay": 0.25}')
"""The kit's tool through the gateway in front of the native server: the default's first steps (so seq 0
is still retained when the live stream opens, see OVERRUN_RETENTION), then more, so the task outlives
the kit's second-task checks on a loaded machine (3 s, 27 events)."""


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_gateway_in_front_of_the_native_server_conforms_in_both_eras(tmp_path: Path, transport: str) -> None:
    """The upstream serves tasks/stream itself: the gateway forwards it (tests/test_native_upstream.py)."""
    async with contextlib.AsyncExitStack() as stack:
        if transport == "stdio":
            gateway = start_gateway(upstream_cmd=[*NATIVE, "--stdio", *OVERRUN_RETENTION])
        else:
            url = await stack.enter_async_context(native_server(tmp_path, *OVERRUN_RETENTION))
            gateway = start_gateway(upstream_url=url)
        gw = await stack.enter_async_context(gateway)
        code, report, text = await run_kit(gw.url, "--era", "both", *NATIVE_UPSTREAM_ARGS)
    assert_conforms(code, report, text, ERAS)
    skipped = {(r["era"], r["id"]) for r in report["results"] if r["status"] == "skip"}
    # The upstream's retention is advertised and overrun, so events_gone runs; the gateway checks Mcp-Name.
    # Only what no gateway run can show is skipped: a second caller, and sessions in 2026-07-28.
    expected = {("legacy", "auth.same_as_tasks_get"), ("modern", "auth.same_as_tasks_get")}
    assert skipped == expected | {("modern", "stream.one_per_task")}, text


async def correct_report(
    reports: dict[tuple[str, ...], dict[str, Any]], tmp_path: Path, server_options: tuple[str, ...]
) -> dict[str, Any]:
    """The kit's report (VARIANT_KIT_OPTIONS) on the correct native server with `server_options`,
    run once per option set and kept in `reports`."""
    if server_options not in reports:
        async with native_server(tmp_path, *server_options) as url:
            code, reports[server_options], text = await run_kit(url, *VARIANT_KIT_OPTIONS)
        assert code == 0, text
    return reports[server_options]


@pytest.fixture(scope="module")
def correct_reports() -> dict[tuple[str, ...], dict[str, Any]]:
    """The correct server's reports by server options, shared by the variant tests (see correct_report)."""
    return {}


def test_every_broken_variant_is_named_for_a_check() -> None:
    assert sorted(VARIANT_CHECKS) == sorted(DEFECTS)


@pytest.mark.parametrize(("variant", "check_id"), sorted(VARIANT_CHECKS.items()))
async def test_each_broken_native_variant_fails_on_its_check(
    tmp_path: Path, correct_reports: dict[tuple[str, ...], dict[str, Any]], variant: str, check_id: str
) -> None:
    server_options = OVERRUN_RETENTION if check_id.startswith("events_gone.") else ()
    async with native_server(tmp_path, *server_options, variant=variant) as url:
        code, report, text = await run_kit(url, *VARIANT_KIT_OPTIONS)
    assert code == 1, text
    assert ("legacy", check_id) in outcomes(report, "fail"), text
    correct = await correct_report(correct_reports, tmp_path, server_options)
    assert ("legacy", check_id) in outcomes(correct, "pass")


async def test_a_target_that_does_not_answer_fails_the_run() -> None:
    code, report, text = await run_kit(f"http://127.0.0.1:{free_port()}/mcp", "--era", "legacy", "--timeout", "5")
    assert code == 1, text
    assert outcomes(report, "fail") == {("legacy", "setup.run")}
    reason = next(r["reason"] for r in report["results"] if r["id"] == "setup.run")
    assert "cannot talk to" in reason
    assert "Traceback" not in text


def test_bad_options_are_refused_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main("http://127.0.0.1:1/mcp", args_json="[1]") == 2
    assert "--args must be a JSON object" in capsys.readouterr().err
    assert command.main("http://127.0.0.1:1/mcp", headers=["no colon"]) == 2
    assert "--header 'no colon': expected 'Name: value'" in capsys.readouterr().err


# -- the pure parts -------------------------------------------------------------------------------


def test_check_ids_are_unique_and_include_the_fixed_ones() -> None:
    ids = [check.id for check in CHECKS]
    assert len(ids) == len(set(ids))
    assert set(VARIANT_CHECKS.values()) <= set(ids)
    for check in CHECKS:
        assert check.section in SECTIONS, check.id
        assert check.sentence and check.method, check.id
        assert check.eras and set(check.eras) <= set(ERAS), check.id


def test_vendor_prefixed_types() -> None:
    for kind in ("com.example.review.comment", "io.github.mcp-task-gateway.task.created", "acme/progress"):
        assert type_is_prefixed(kind), kind
    for kind in ("content.partial", "task.status", "progress", "a..b", "/x", "acme/", ""):
        assert not type_is_prefixed(kind), kind


def test_a_failure_is_final_and_a_blocked_run_fails_setup() -> None:
    verdicts = Verdicts(Era.LEGACY)
    verdicts.judge("seq.contiguous", True, "gap")
    verdicts.judge("seq.contiguous", False, "seq 3 followed seq 1", {"request": "r"})
    verdicts.judge("seq.contiguous", True, "gap")
    verdicts.skip("seq.contiguous", "not applicable")
    verdicts.block("the task did not end")
    results = {r.check.id: r for r in verdicts.results()}
    assert (results["seq.contiguous"].status, results["seq.contiguous"].reason) == ("fail", "seq 3 followed seq 1")
    assert results["seq.contiguous"].evidence == [{"request": "r"}]
    assert (results["setup.run"].status, results["setup.run"].reason) == ("fail", "the task did not end")
    assert (results["seq.ordered"].status, results["seq.ordered"].reason) == ("skip", "the task did not end")


def sample_results() -> list[Result]:
    return [
        Result(BY_ID["seq.starts_at_zero"], Era.LEGACY, "pass"),
        Result(BY_ID["seq.contiguous"], Era.LEGACY, "fail", "seq 2 followed seq 0", [{"request": {"id": 3}}]),
        Result(BY_ID["auth.same_as_tasks_get"], Era.MODERN, "skip", "no second credential set"),
        Result(BY_ID["capability.retention_fields"], Era.MODERN, "info", "advertised {}"),
    ]


def test_table_groups_by_era_and_section_and_ends_with_the_summary() -> None:
    text = table(sample_results())
    lines = text.splitlines()
    assert lines[0] == "2025-11-25 (legacy)"
    assert lines[1] == "  sequence"
    assert lines[2].split() == ["PASS", "seq.starts_at_zero"]
    assert lines[3].split()[:2] == ["FAIL", "seq.contiguous"] and lines[3].endswith("seq 2 followed seq 0")
    assert json.loads(lines[4]) == {"request": {"id": 3}}
    assert "2026-07-28 (modern)" in lines and "  authorization" in lines
    assert lines[-1] == "1 passed, 1 failed, 1 skipped, 1 info" == summary(sample_results())
    assert lines[-3].split()[:2] == ["info", "capability.retention_fields"]
    assert lines[-3].endswith("advertised {}")


def test_junit_has_one_testcase_per_check_with_failure_and_skipped() -> None:
    root = ElementTree.fromstring(junit("http://x/mcp", sample_results()))
    suites = root.findall("testsuite")
    assert [(s.get("name"), s.get("tests"), s.get("failures"), s.get("skipped")) for s in suites] == [
        ("sep-2694 2025-11-25", "2", "1", "0"),
        ("sep-2694 2026-07-28", "2", "0", "1"),
    ]
    cases = {case.get("name"): case for case in root.iter("testcase")}
    assert cases["seq.starts_at_zero"].find("failure") is None and cases["seq.starts_at_zero"].find("skipped") is None
    failure = cases["seq.contiguous"].find("failure")
    assert failure is not None and failure.get("message") == "seq 2 followed seq 0"
    assert json.loads(failure.text or "") == [{"request": {"id": 3}}]
    assert cases["seq.contiguous"].get("classname") == "conformance.legacy.sequence"
    skipped = cases["auth.same_as_tasks_get"].find("skipped")
    assert skipped is not None and skipped.get("message") == "no second credential set"
    info = cases["capability.retention_fields"]
    assert info.find("failure") is None and info.find("skipped") is None
    assert (info.findtext("system-out") or "").endswith("info: advertised {}")


def test_json_report() -> None:
    report = as_json("http://x/mcp", sample_results())
    assert report["summary"] == {"passed": 1, "failed": 1, "skipped": 1, "info": 1}
    first = report["results"][1]
    assert first["id"] == "seq.contiguous" and first["status"] == "fail" and first["level"] == "MUST"
    assert first["sentence"] == BY_ID["seq.contiguous"].sentence
    assert first["evidence"] == [{"request": {"id": 3}}]
    json.dumps(report)  # serialisable as it is


def test_docs_check_list_is_the_generated_one() -> None:
    committed = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    assert docs.with_check_list(committed) == committed, (
        "docs/conformance.md is out of date: run `python -m gateway.conformance.docs --write docs/conformance.md`"
    )
    for check in CHECKS:
        assert f"| `{check.id}` |" in committed
