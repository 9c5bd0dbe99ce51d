"""The lifecycle table driven through the registry, in process, by a hypothesis state machine: any events
in any order, for hosted and pass-through tasks on the in-memory stores, and the invariants every task
keeps whatever happens to it. Also: the drivers keep no status or phase flags of their own."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from gateway.config import Config
from gateway.events.capture import Capture
from gateway.events.log import MemoryEventLog
from gateway.metrics import Metrics
from gateway.stores.memory import MemoryTaskStore
from gateway.tasks.lifecycle import Event, Kind, LifecycleError, Phase, step
from gateway.tasks.records import TaskStatus, UpstreamTaskRef
from gateway.tasks.registry import Task, TaskRegistry, outcome_cap

DIALECT = "2025-11-25"
EPILOGUE = "result.evicted"


def registry() -> TaskRegistry:
    """Small outcome caps, so that kept results are evicted and evictions are logged after the end."""
    retention = {"max_result_bytes": 400, "results_budget_bytes": 1000}
    config = Config.model_validate({"retention": retention})
    capture = Capture(config.rules, config.events.prefix, config.retention.max_payload_bytes)
    store = MemoryTaskStore(outcome_cap(config.retention))
    return TaskRegistry(config.tasks, config.retention, store, MemoryEventLog(100_000), capture, Metrics())


class TaskLives(RuleBasedStateMachine):
    tasks = Bundle("tasks")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.registry = registry()
        self.ended: dict[str, TaskStatus] = {}
        """Task id -> the terminal status its record first showed."""

    def run(self, work: Any) -> Any:
        return self.loop.run_until_complete(work)

    def teardown(self) -> None:
        self.run(self.registry.stop())
        self.loop.close()

    @rule(target=tasks, kind=st.sampled_from(Kind))
    def create(self, kind: Kind) -> Task:
        upstream = None if kind is Kind.HOSTED else UpstreamTaskRef(f"u{len(self.ended)}", "tag")
        return self.run(self.registry.create("alice", "build", None, dialect=DIALECT, upstream=upstream))

    @rule(
        task=tasks,
        # A store fault comes from the held writes when the store is down (tests/test_task_faults.py);
        # the memory store never is.
        event=st.sampled_from([event for event in Event if event not in (Event.CREATED, Event.STORE_FAULT)]),
        told=st.none() | st.sampled_from(TaskStatus),
        size=st.integers(0, 600),
    )
    def feed(self, task: Task, event: Event, told: TaskStatus | None, size: int) -> None:
        phase = task.phase
        try:
            expected = step(phase, event, task.kind, told)
        except LifecycleError:
            expected = None
        outcome = {"result": {"content": [{"type": "text", "text": "x" * size}]}}
        transition = self.run(self.registry.feed(task, event, told, "why", outcome=outcome))
        if expected is None or not expected.changes:
            assert transition is None and task.phase is phase  # refused or ignored: nothing changed
        else:
            assert transition == expected and task.phase is expected.phase

    @invariant()
    def every_task_keeps_the_invariants(self) -> None:
        for task in list(self.registry._tasks.values()):
            self.run(self.check(task))

    async def check(self, task: Task) -> None:
        record = await self.registry.store.find(task.id)
        assert record is not None and record.status is task.status  # the store's status is the one seen here
        if task.phase.status is not None:
            assert record.status is task.phase.status
        if record.terminal:  # one terminal status, ever
            assert self.ended.setdefault(task.id, record.status) is record.status
        else:
            assert task.id not in self.ended
        stored = await self.registry.log.read(task.id, -1, 100_000)
        assert [event.seq for event in stored] == list(range(len(stored)))  # gap-free
        assert record.next_seq == len(stored)
        kinds = [orjson.loads(b"{" + event.body + b"}")["type"].rsplit(".", 2)[-2:] for event in stored]
        names = [".".join(kind) for kind in kinds]
        assert names[0] == "task.created"
        lived = [name for name in names if name != EPILOGUE]
        if record.terminal:
            assert lived[-2:] == ["task.status", "task.terminal"] and lived.count("task.terminal") == 1
            assert set(names[names.index("task.terminal") + 1 :]) <= {EPILOGUE}  # nothing after the end but evictions
        else:
            assert "task.terminal" not in names and EPILOGUE not in names


async def test_a_refused_event_is_logged_counted_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    tasks = registry()
    refusals = tasks._metrics.lifecycle_refusals.labels(event=Event.UPSTREAM_ENDED.value)
    task = await tasks.create("alice", "build", None, dialect=DIALECT)
    before = task.record
    # A pass-through event for a hosted task: a driver's mistake.
    assert await tasks.feed(task, Event.UPSTREAM_ENDED, TaskStatus.COMPLETED, outcome={"result": {}}) is None
    assert "lifecycle: event refused" in caplog.text
    assert refusals._value.get() == 1
    assert task.record is before and task.phase is Phase.WORKING and not task.done.is_set()
    stored = await tasks.store.find(task.id)
    assert stored is not None and stored.status is TaskStatus.WORKING
    assert len(await tasks.log.read(task.id, -1, 10)) == 1  # task.created only
    await tasks.stop()


TestTaskLives = TaskLives.TestCase
TestTaskLives.settings = settings(
    max_examples=30, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


DRIVERS = ("registry.py", "hosted.py", "passthrough.py", "watch.py", "watcher.py", "input.py")


def attributes(tree: ast.Module) -> list[tuple[str, str, str]]:
    """(class, attribute, annotation or assigned value) of each class: dataclass fields and other
    annotated class attributes, `__slots__`, and what `__init__` assigns to `self`."""
    found: list[tuple[str, str, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                found.append((node.name, item.target.id, ast.unparse(item.annotation)))
            elif isinstance(item, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in item.targets):
                found += [(node.name, str(ast.literal_eval(slot)), "slot") for slot in getattr(item.value, "elts", [])]
            elif isinstance(item, ast.FunctionDef) and item.name == "__init__":
                for statement in ast.walk(item):
                    for target, value in _self_assignments(statement):
                        found.append((node.name, target, value))
    return found


def _self_assignments(statement: ast.AST) -> list[tuple[str, str]]:
    if isinstance(statement, ast.AnnAssign):
        pairs = [(statement.target, ast.unparse(statement.annotation))]
    elif isinstance(statement, ast.Assign):
        pairs = [(target, ast.unparse(statement.value)) for target in statement.targets]
    else:
        return []
    return [
        (target.attr, value)
        for target, value in pairs
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    ]


def test_the_drivers_keep_no_status_or_phase_flags() -> None:
    """A task's phase is the lifecycle's (`Task.phase`); a boolean beside it is a second, hidden state."""
    root = Path(__file__).parent.parent
    flags = []
    for path in DRIVERS:
        for owner, name, kind in attributes(ast.parse((root / "gateway" / "tasks" / path).read_text())):
            if kind.replace(" ", "") in ("bool", "bool|None", "True", "False") or kind.startswith("bool"):
                flags.append(f"{path}: {owner}.{name} ({kind})")
    assert flags == []


def test_the_flag_check_sees_fields_slots_and_init_assignments() -> None:
    tree = ast.parse(
        "class A:\n    ending: bool = False\n    __slots__ = ('told',)\n"
        "    def __init__(self) -> None:\n        self.listening = False\n        self.seen: bool = True\n"
    )
    assert attributes(tree) == [
        ("A", "ending", "bool"),
        ("A", "told", "slot"),
        ("A", "listening", "False"),
        ("A", "seen", "bool"),
    ]
