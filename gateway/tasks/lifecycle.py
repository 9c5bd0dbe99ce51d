"""A task's life as one table: phase x event -> new phase + the commands that carry the change out.

In the style of h11's `_state.py`: the decisions are data, the drivers (the registry for records and
logs, `hosted` and `passthrough` for the upstream side) feed events in and carry the commands out. A
gateway-hosted task and a pass-through one (the upstream hosts it) share the table; where they differ
a rule names the kinds it holds for. The eras do not differ here: what they do differ in (whether a
cancelled task has an outcome to fetch, whether `isError` fails a task) decides which event a driver
feeds, and is the dialect's (`gateway.protocol.dialect`). Anything the table does not allow raises
`LifecycleError`: the registry logs it (a warning, `lifecycle: event refused`), and the task's
record stays as it was.

Pure: no I/O, no asyncio, nothing from the edge, the upstreams, the stores or the event log.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.tasks.records import TaskStatus

__all__ = [
    "Command",
    "Event",
    "Kind",
    "LifecycleError",
    "Phase",
    "Transition",
    "mermaid",
    "phase_of",
    "rules",
    "step",
]


class Phase(enum.StrEnum):
    """Where a task stands in this process. The SEP's five statuses, and the few phases in between
    that only the gateway sees (its record still shows the status before them)."""

    NEW = "new"
    """Not created yet: the record and its log are being written (`task.created` comes next)."""
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    END_TOLD = "end_told"
    """Pass-through: a forwarded `tasks/result` was answered, so the task ended upstream; how, a poll
    sent at once learns. (2025-11-25: answers about the task wait for that end to be in the record.)"""
    FETCHING_OUTCOME = "fetching_outcome"
    """Pass-through: the upstream said the task ended but its view left the outcome out; the watcher
    fetches it, and the record turns terminal with the outcome in it (the end told is kept meanwhile)."""
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def status(self) -> TaskStatus | None:
        """The record's status in this phase; None in an in-between phase (the record keeps its own)."""
        return None if self in (Phase.NEW, Phase.END_TOLD, Phase.FETCHING_OUTCOME) else TaskStatus(self.value)


TERMINAL = (Phase.COMPLETED, Phase.FAILED, Phase.CANCELLED)


def phase_of(status: TaskStatus) -> Phase:
    """The phase of a task known only from its record (one adopted from a previous process)."""
    return Phase(status.value)


class Kind(enum.StrEnum):
    """Who runs the task: the column of the table where hosted and pass-through tasks differ."""

    HOSTED = "hosted"
    """The gateway runs the upstream call in the background (the upstream has no tasks)."""
    PASSTHROUGH = "passthrough"
    """The upstream hosts the task; the gateway watches it (pushes, polls) into the record and log."""


class Event(enum.StrEnum):
    """What can happen to a task. Events marked "told" carry a status (`step`'s `told`)."""

    CREATED = "created"
    """The record is made (hosted: a task-augmented call; pass-through: the handoff, a forwarded call
    whose answer created a task upstream)."""
    INPUT_REQUESTED = "input_requested"
    """Hosted: the upstream call asks the client (a server-to-client request, or an MRTR round)."""
    INPUT_ANSWERED = "input_answered"
    """Hosted: every open question has its answer; the call goes on."""
    OUTCOME_ARRIVED = "outcome_arrived"
    """Hosted, told completed or failed: the upstream call's result or error (a passed deadline is an
    error too: `request_timeout`)."""
    UPSTREAM_STATUS = "upstream_status"
    """Pass-through, told working or input_required: a status the upstream pushed or a poll got."""
    UPSTREAM_ENDED = "upstream_ended"
    """Pass-through, told a terminal status: the upstream's view of the end, outcome in hand."""
    UPSTREAM_ENDED_UNFETCHED = "upstream_ended_unfetched"
    """Pass-through, told a terminal status: the upstream says the task ended, its outcome is to fetch."""
    OUTCOME_FETCHED = "outcome_fetched"
    """Pass-through, told the end the upstream told: the fetch returned (an outcome, or why there is
    none: no answer in time, or the upstream lost the task meanwhile)."""
    RESULT_ANSWERED = "result_answered"
    """Pass-through: a forwarded `tasks/result` was answered (the task ended upstream)."""
    UPSTREAM_LOST = "upstream_lost"
    """Pass-through: the upstream lost the task (conversation gone, polls failing, id unknown): it fails.
    (Lost while its outcome is fetched, the fetch ends without one: `OUTCOME_FETCHED`.)"""
    CANCEL_REQUESTED = "cancel_requested"
    """Hosted: the client (here, or through another replica's lease) cancels the task."""
    OWNER_LOST = "owner_lost"
    """Told failed, or cancelled when a client had asked: the process or replica that ran the task is
    gone and the task cannot be resumed here."""
    RUNNER_LOST = "runner_lost"
    """Hosted: two orphan checks in a row found no live runner for the task in this process."""
    STORE_FAULT = "store_fault"
    """The task store could not take the task's writes in time (`store_unavailable`)."""
    RESULT_EVICTED = "result_evicted"
    """An ended task's kept result gave way to newer ones (`results_budget_bytes`)."""


class Command(enum.StrEnum):
    """What a transition asks the drivers to do, in this order."""

    APPEND_EVENT = "append_event"
    """The event's own log entry (`task.created`, `task.owner_lost`, `result.evicted`)."""
    APPEND_STATUS = "append_status"
    """`task.status` in the log, before the record shows the status."""
    APPEND_TERMINAL = "append_terminal"
    """`task.terminal` in the same log call, sealing the log."""
    WRITE_RECORD = "write_record"
    """The record in the store: created, or its status by compare-and-set."""
    KEEP_OUTCOME = "keep_outcome"
    """The outcome kept beside the record, within the size caps and the results budget."""
    REPLACE_OUTCOME = "replace_outcome"
    """The kept outcome becomes the error saying it was evicted."""
    WAKE_WAITERS = "wake_waiters"
    """The task's waiters learn it ended; its pending input is settled; its log's deletion is due."""
    FETCH_OUTCOME = "fetch_outcome"
    """Wake the watcher to fetch the ended task's outcome from the upstream."""
    POLL_UPSTREAM = "poll_upstream"
    """Wake the watcher to poll the upstream at once."""
    CANCEL_UPSTREAM = "cancel_upstream"
    """Stop what runs the task here (the upstream call, or the MRTR wait), once."""


class LifecycleError(Exception):
    """An event the table does not allow in the task's phase (a driver's mistake): logged by the
    registry as a warning; the task's record is left as it was."""


TOLD = "told"
"""A rule's target when the new phase is the status the event tells."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One allowed (phase, event): the new phase (or `TOLD`), the commands, and the kinds it holds for."""

    target: Phase | str
    commands: tuple[Command, ...] = ()
    kinds: frozenset[Kind] = frozenset(Kind)


@dataclass(frozen=True, slots=True)
class Transition:
    """What `step` decided: the new phase and the commands to carry out (none: nothing changes)."""

    phase: Phase
    commands: tuple[Command, ...]

    @property
    def changes(self) -> bool:
        return bool(self.commands)


HOSTED = frozenset({Kind.HOSTED})
PASSTHROUGH = frozenset({Kind.PASSTHROUGH})

STATUS = (Command.APPEND_STATUS, Command.WRITE_RECORD)
END = (Command.APPEND_STATUS, Command.APPEND_TERMINAL, Command.WRITE_RECORD, Command.KEEP_OUTCOME, Command.WAKE_WAITERS)
"""A terminal status: events and seal, the record, the outcome, then everyone waiting hears of it."""

TELLS: dict[Event, frozenset[TaskStatus]] = {
    Event.OUTCOME_ARRIVED: frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED}),
    Event.UPSTREAM_STATUS: frozenset({TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED}),
    Event.UPSTREAM_ENDED: frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    Event.UPSTREAM_ENDED_UNFETCHED: frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    Event.OUTCOME_FETCHED: frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    Event.OWNER_LOST: frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED}),
}
"""The statuses an event may tell."""

LATE = tuple(event for event in Event if event not in (Event.CREATED, Event.RESULT_EVICTED))
"""Events that may still arrive after the end (a push crossing the final answer, a cancel racing the
result): ignored, since a terminal status never changes."""

_RUNNING: dict[Event, Rule] = {
    Event.INPUT_ANSWERED: Rule(Phase.WORKING, STATUS, HOSTED),
    Event.OUTCOME_ARRIVED: Rule(TOLD, END, HOSTED),
    Event.UPSTREAM_STATUS: Rule(TOLD, STATUS, PASSTHROUGH),
    Event.UPSTREAM_ENDED: Rule(TOLD, END, PASSTHROUGH),
    Event.UPSTREAM_ENDED_UNFETCHED: Rule(Phase.FETCHING_OUTCOME, (Command.FETCH_OUTCOME,), PASSTHROUGH),
    Event.RESULT_ANSWERED: Rule(Phase.END_TOLD, (Command.POLL_UPSTREAM,), PASSTHROUGH),
    Event.UPSTREAM_LOST: Rule(Phase.FAILED, END, PASSTHROUGH),
    Event.CANCEL_REQUESTED: Rule(Phase.CANCELLED, (*END, Command.CANCEL_UPSTREAM), HOSTED),
    Event.OWNER_LOST: Rule(TOLD, (Command.APPEND_EVENT, *END)),
    Event.RUNNER_LOST: Rule(Phase.FAILED, END, HOSTED),
    Event.STORE_FAULT: Rule(Phase.FAILED, (*END, Command.CANCEL_UPSTREAM)),
}
"""What happens to a task that runs, whether working or waiting for input."""


def _table() -> dict[tuple[Phase, Event], Rule]:
    table: dict[tuple[Phase, Event], Rule] = {
        (Phase.NEW, Event.CREATED): Rule(Phase.WORKING, (Command.WRITE_RECORD, Command.APPEND_EVENT))
    }
    for phase in (Phase.WORKING, Phase.INPUT_REQUIRED):
        for event, rule in _RUNNING.items():
            table[phase, event] = rule
    # Another question while one is open changes nothing; an answer while none is open neither.
    table[Phase.WORKING, Event.INPUT_REQUESTED] = Rule(Phase.INPUT_REQUIRED, STATUS, HOSTED)
    table[Phase.INPUT_REQUIRED, Event.INPUT_REQUESTED] = Rule(Phase.INPUT_REQUIRED, (), HOSTED)
    table[Phase.WORKING, Event.INPUT_ANSWERED] = Rule(Phase.WORKING, (), HOSTED)
    end_told = {
        Event.UPSTREAM_STATUS: Rule(Phase.END_TOLD, STATUS, PASSTHROUGH),  # the record follows; the end is due
        Event.RESULT_ANSWERED: Rule(Phase.END_TOLD, (Command.POLL_UPSTREAM,), PASSTHROUGH),
    }
    for event in (Event.UPSTREAM_ENDED, Event.UPSTREAM_ENDED_UNFETCHED, Event.UPSTREAM_LOST, Event.STORE_FAULT):
        end_told[event] = _RUNNING[event]
    for event, rule in end_told.items():
        table[Phase.END_TOLD, event] = Rule(rule.target, rule.commands, PASSTHROUGH)
    # While the outcome is fetched, later views change nothing: the end told is what the record gets.
    for event in (Event.UPSTREAM_STATUS, Event.UPSTREAM_ENDED, Event.UPSTREAM_ENDED_UNFETCHED, Event.RESULT_ANSWERED):
        table[Phase.FETCHING_OUTCOME, event] = Rule(Phase.FETCHING_OUTCOME, (), PASSTHROUGH)
    table[Phase.FETCHING_OUTCOME, Event.OUTCOME_FETCHED] = Rule(TOLD, END, PASSTHROUGH)
    table[Phase.FETCHING_OUTCOME, Event.STORE_FAULT] = _RUNNING[Event.STORE_FAULT]
    for phase in TERMINAL:
        for event in LATE:
            table[phase, event] = Rule(phase)
        table[phase, Event.RESULT_EVICTED] = Rule(phase, (Command.APPEND_EVENT, Command.REPLACE_OUTCOME))
        # An end decided here whose writes the store never took: the store will show it failed, so
        # this process does too (the one change of a terminal phase).
        table[phase, Event.STORE_FAULT] = _RUNNING[Event.STORE_FAULT]
    return table


TABLE = _table()


def rules() -> Iterator[tuple[Phase, Event, Rule]]:
    """Every allowed (phase, event) and its rule, in table order."""
    for (phase, event), rule in TABLE.items():
        yield phase, event, rule


def step(phase: Phase, event: Event, kind: Kind, told: TaskStatus | None = None) -> Transition:
    """The transition `event` makes from `phase` for a task of `kind` (`told`: the status an event
    that tells one carries); `LifecycleError` when the table does not allow it."""
    rule = TABLE.get((phase, event))
    if rule is None or kind not in rule.kinds:
        raise LifecycleError(f"{event} is not allowed for a {kind} task in phase {phase}")
    if phase.terminal and rule.target == phase and event is not Event.STORE_FAULT:
        return Transition(phase, rule.commands)  # late, or an eviction: whatever it tells, the end stays
    tells = TELLS.get(event, frozenset())
    if (told is not None and told not in tells) or (rule.target == TOLD and told is None):
        raise LifecycleError(f"{event} in phase {phase} must tell one of {sorted(tells)}, not {told}")
    if rule.target == TOLD:
        assert told is not None
        return Transition(phase_of(told), rule.commands)
    return Transition(Phase(rule.target), rule.commands)


def mermaid() -> str:
    """The table as a Mermaid `stateDiagram-v2`: each change of phase once, labelled with its events
    (and who they hold for where not every task); self-loops and ignored late events left out."""
    edges: dict[tuple[str, str], list[str]] = {}
    for phase, event, rule in rules():
        targets = [phase_of(status) for status in sorted(TELLS[event])] if rule.target == TOLD else [Phase(rule.target)]
        for target in targets:
            if target == phase:
                continue
            label = event.value
            if rule.kinds != frozenset(Kind):
                label += f" ({', '.join(sorted(kind.value for kind in rule.kinds))})"
            source = "[*]" if phase is Phase.NEW else phase.value
            edges.setdefault((source, target.value), [])
            if label not in edges[source, target.value]:
                edges[source, target.value].append(label)
    lines = ["stateDiagram-v2"]
    lines.extend(f"    {start} --> {end}: {'<br/>'.join(labels)}" for (start, end), labels in edges.items())
    lines.extend(f"    {ended.value} --> [*]" for ended in TERMINAL)
    return "\n".join(lines) + "\n"
