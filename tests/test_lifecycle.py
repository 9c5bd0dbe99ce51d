"""Playbook of the task lifecycle table (`gateway.tasks.lifecycle`): every phase x event, for hosted and
pass-through tasks, against the expectations written out below; what each era feeds it where the eras
differ; and the table as `docs/architecture.md` draws it. In process, no I/O."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from gateway.protocol.dialect import LEGACY, MODERN, Dialect
from gateway.tasks.answers import outcome_status
from gateway.tasks.lifecycle import (
    TERMINAL,
    Command,
    Event,
    Kind,
    LifecycleError,
    Phase,
    mermaid,
    step,
)
from gateway.tasks.passthrough import status_event
from gateway.tasks.records import TaskStatus

ENDS = "completed,failed,cancelled"

# phase             event                      kinds   target            statuses it may tell
EXPECTED = f"""
new                 created                    both    working           -
working             input_requested            hosted  input_required    -
working             input_answered             hosted  working           -
working             outcome_arrived            hosted  told              completed,failed
working             upstream_status            pass    told              working,input_required
working             upstream_ended             pass    told              {ENDS}
working             upstream_ended_unfetched   pass    fetching_outcome  {ENDS}
working             result_answered            pass    end_told          -
working             upstream_lost              pass    failed            -
working             cancel_requested           hosted  cancelled         -
working             owner_lost                 both    told              failed,cancelled
working             runner_lost                hosted  failed            -
working             store_fault                both    failed            -
input_required      input_requested            hosted  input_required    -
input_required      input_answered             hosted  working           -
input_required      outcome_arrived            hosted  told              completed,failed
input_required      upstream_status            pass    told              working,input_required
input_required      upstream_ended             pass    told              {ENDS}
input_required      upstream_ended_unfetched   pass    fetching_outcome  {ENDS}
input_required      result_answered            pass    end_told          -
input_required      upstream_lost              pass    failed            -
input_required      cancel_requested           hosted  cancelled         -
input_required      owner_lost                 both    told              failed,cancelled
input_required      runner_lost                hosted  failed            -
input_required      store_fault                both    failed            -
end_told            upstream_status            pass    end_told          working,input_required
end_told            result_answered            pass    end_told          -
end_told            upstream_ended             pass    told              {ENDS}
end_told            upstream_ended_unfetched   pass    fetching_outcome  {ENDS}
end_told            upstream_lost              pass    failed            -
end_told            store_fault                pass    failed            -
fetching_outcome    upstream_status            pass    fetching_outcome  working,input_required
fetching_outcome    upstream_ended             pass    fetching_outcome  {ENDS}
fetching_outcome    upstream_ended_unfetched   pass    fetching_outcome  {ENDS}
fetching_outcome    result_answered            pass    fetching_outcome  -
fetching_outcome    outcome_fetched            pass    told              {ENDS}
fetching_outcome    store_fault                both    failed            -
"""
"""Every allowed (phase, event) of a task that has not ended. Any other is refused, except on an ended
task: there every event but `created` is allowed and changes nothing (a late push, a cancel racing
the result), an eviction replaces the kept outcome, and a store fault fails it (the store never took
the end decided here)."""

STATUS_WRITE = (Command.APPEND_STATUS, Command.WRITE_RECORD)
END = (Command.APPEND_STATUS, Command.APPEND_TERMINAL, Command.WRITE_RECORD, Command.KEEP_OUTCOME, Command.WAKE_WAITERS)
KINDS = {"both": set(Kind), "hosted": {Kind.HOSTED}, "pass": {Kind.PASSTHROUGH}}


def expected() -> dict[tuple[Phase, Event], tuple[set[Kind], str, set[TaskStatus | None]]]:
    table = {}
    for line in EXPECTED.strip().splitlines():
        phase, event, kinds, target, tells = line.split()
        statuses = {None} if tells == "-" else {TaskStatus(status) for status in tells.split(",")}
        if target != "told" and tells != "-":
            statuses.add(None)  # the status is told for the record; the phase does not follow it
        table[Phase(phase), Event(event)] = (KINDS[kinds], target, statuses)
    return table


CASES = list(itertools.product(Phase, Event, Kind, [None, *TaskStatus]))


@pytest.mark.parametrize("phase", list(Phase))
def test_every_phase_and_event_is_allowed_or_refused_as_written(phase: Phase) -> None:
    table = expected()
    for event, kind, told in itertools.product(Event, Kind, [None, *TaskStatus]):
        case = f"{phase} + {event} ({kind}, told {told})"
        if phase.terminal:
            if event is Event.CREATED or (event is Event.STORE_FAULT and told is not None):
                with pytest.raises(LifecycleError):
                    step(phase, event, kind, told)
                continue
            transition = step(phase, event, kind, told)
            if event is Event.STORE_FAULT:
                assert transition.phase is Phase.FAILED and Command.WRITE_RECORD in transition.commands, case
            elif event is Event.RESULT_EVICTED:
                assert transition.phase is phase and Command.REPLACE_OUTCOME in transition.commands, case
            else:
                assert transition.phase is phase and not transition.commands, case
            continue
        kinds, target, statuses = table.get((phase, event), (set(), "", set()))
        if kind not in kinds or told not in statuses:
            with pytest.raises(LifecycleError):
                step(phase, event, kind, told)
            continue
        transition = step(phase, event, kind, told)
        wanted = Phase(told.value) if target == "told" and told is not None else Phase(target)
        assert transition.phase is wanted, case


def test_a_status_change_logs_before_it_writes_and_an_end_seals_keeps_and_wakes() -> None:
    for (phase, event), (kinds, _target, statuses) in expected().items():
        for kind, told in itertools.product(kinds, statuses):
            transition = step(phase, event, kind, told)
            commands = [command for command in transition.commands if command in END]
            if transition.phase.terminal:
                assert commands == list(END), (phase, event)  # in this order: events, record, outcome, waiters
            elif Command.WRITE_RECORD in transition.commands and phase is not Phase.NEW:
                assert transition.commands == STATUS_WRITE, (phase, event)
            elif transition.phase is phase:
                assert transition.commands in ((), (Command.POLL_UPSTREAM,)), (phase, event)  # nothing changes


def test_the_watcher_is_woken_to_fetch_an_outcome_and_to_poll_after_a_forwarded_result() -> None:
    fetch = step(Phase.WORKING, Event.UPSTREAM_ENDED_UNFETCHED, Kind.PASSTHROUGH, TaskStatus.COMPLETED)
    assert fetch.commands == (Command.FETCH_OUTCOME,)  # the record stays working until the outcome is in
    poll = step(Phase.INPUT_REQUIRED, Event.RESULT_ANSWERED, Kind.PASSTHROUGH)
    assert poll.commands == (Command.POLL_UPSTREAM,)


def test_a_cancel_stops_the_upstream_call_and_an_owner_lost_records_why_first() -> None:
    cancel = step(Phase.WORKING, Event.CANCEL_REQUESTED, Kind.HOSTED)
    assert cancel.commands == (*END, Command.CANCEL_UPSTREAM)
    lost = step(Phase.INPUT_REQUIRED, Event.OWNER_LOST, Kind.PASSTHROUGH, TaskStatus.CANCELLED)
    assert lost.phase is Phase.CANCELLED and lost.commands == (Command.APPEND_EVENT, *END)


def test_no_ended_phase_leaves_the_ends() -> None:
    for phase, event, kind, told in CASES:
        if phase.terminal and event is not Event.CREATED and (told is None or event is not Event.STORE_FAULT):
            assert step(phase, event, kind, told).phase in TERMINAL


@pytest.mark.parametrize("dialect", [LEGACY, MODERN], ids=["legacy", "modern"])
def test_where_the_eras_differ_they_feed_different_events_to_one_table(dialect: Dialect) -> None:
    legacy = dialect is LEGACY
    # A hosted task: a tool result with isError fails it in 2025-11-25 only.
    tool_error = {"result": {"content": [], "isError": True}}
    assert outcome_status(tool_error, dialect)[0] is (TaskStatus.FAILED if legacy else TaskStatus.COMPLETED)
    assert outcome_status({"error": {"code": -32603, "message": "m"}}, dialect) == (TaskStatus.FAILED, "m")
    # A pass-through task: a cancelled one has an outcome to fetch in 2025-11-25 only.
    cancelled = status_event(TaskStatus.CANCELLED, None, dialect)
    assert cancelled is (Event.UPSTREAM_ENDED_UNFETCHED if legacy else Event.UPSTREAM_ENDED)
    assert status_event(TaskStatus.COMPLETED, None, dialect) is Event.UPSTREAM_ENDED_UNFETCHED
    assert status_event(TaskStatus.FAILED, {"error": {}}, dialect) is Event.UPSTREAM_ENDED
    assert status_event(TaskStatus.INPUT_REQUIRED, None, dialect) is Event.UPSTREAM_STATUS
    for phase in (Phase.WORKING, Phase.INPUT_REQUIRED, Phase.END_TOLD):
        ended = step(phase, cancelled, Kind.PASSTHROUGH, TaskStatus.CANCELLED)
        assert ended.phase is (Phase.FETCHING_OUTCOME if legacy else Phase.CANCELLED)


DIAGRAM = re.compile(
    r"<!-- lifecycle diagram: begin.*?-->\n```mermaid\n(.*?)```\n<!-- lifecycle diagram: end -->", re.S
)


def test_the_architecture_doc_draws_the_table_as_it_is() -> None:
    """Regenerate with `python -c "from gateway.tasks.lifecycle import mermaid; print(mermaid())"`."""
    doc = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    match = DIAGRAM.search(doc)
    assert match is not None, "docs/architecture.md lost its lifecycle diagram markers"
    assert match.group(1) == mermaid()
