"""The shape rules of docs/architecture.md that a reviewer would otherwise check by eye: no function in
`gateway/` over 60 lines (but the listed table-like ones); `build_app` and its builders at most 50; at
most 8 era branches outside `gateway/protocol/`, each with a comment saying why (a branch asks which era
it is; asking one of the era's named rules defined in `gateway/protocol/` does not); a `Session`'s
fields written only by `gateway/sessions.py`. Plain AST walks over the source; no gateway code runs."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parent.parent / "gateway"

MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS: dict[str, str] = {}
"""`module:function` → why it may be longer (a generated or table-like body)."""

MAX_BUILDER_LINES = 50
"""`build_app` and every per-feature builder of `gateway/assembly/`."""

MAX_ERA_BRANCHES = 8
ERA_VERSIONS = {"2025-11-25", "2026-07-28"}


@functools.cache
def modules() -> list[tuple[str, ast.Module, list[str]]]:
    """Every module of the gateway: its path from the repository root, its tree, its lines."""
    parsed = []
    for path in sorted(GATEWAY.rglob("*.py")):
        source = path.read_text()
        parsed.append((path.relative_to(GATEWAY.parent).as_posix(), ast.parse(source), source.splitlines()))
    return parsed


def test_no_function_is_over_60_lines() -> None:
    long = []
    for name, tree, _ in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                key = f"{name}:{node.name}"
                if size > MAX_FUNCTION_LINES and key not in LONG_FUNCTIONS:
                    long.append(f"{key} ({size} lines)")
    assert not long, f"split these functions (at most {MAX_FUNCTION_LINES} lines): {long}"


MAX_MODULE_LINES = {"gateway/tasks/hosted.py": 350, "gateway/tasks/passthrough.py": 400}
"""The two task drivers stay small: their decisions are the lifecycle table's."""


@pytest.mark.parametrize("module", sorted(MAX_MODULE_LINES))
def test_the_task_drivers_stay_small(module: str) -> None:
    lines = next(lines for name, _, lines in modules() if name == module)
    assert len(lines) <= MAX_MODULE_LINES[module], f"{module} has {len(lines)} lines"


def test_the_composition_root_is_small_builders() -> None:
    builders = {}
    for name, tree, _ in modules():
        if name.startswith("gateway/assembly/") or name == "gateway/app.py":
            for node in tree.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("build"):
                    builders[f"{name}:{node.name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
    assert "gateway/app.py:build_app" in builders and len(builders) >= 8
    long = {key: size for key, size in builders.items() if size > MAX_BUILDER_LINES}
    assert not long, f"builders over {MAX_BUILDER_LINES} lines: {long}"


def _names_one_era(node: ast.expr) -> bool:
    """One era by name: an `Era` member, a dialect constant (`LEGACY`, `MODERN`) or a version string."""
    if isinstance(node, ast.Name):
        return node.id in {"LEGACY", "MODERN"}
    if isinstance(node, ast.Attribute):
        return node.attr in {"LEGACY", "MODERN"}
    return isinstance(node, ast.Constant) and node.value in ERA_VERSIONS


def _tests_which_era(test: ast.expr) -> bool:
    """Whether a condition asks which era it is (`era is Era.MODERN`, `version == "2025-11-25"`). Asking
    one of the era's named rules (`era.has_sessions`, `dialect.tasks_in_session`) is not: that rule is
    defined in `gateway/protocol/`, where the eras' differences live; nor is grouping or selecting by an
    era held in a variable (`check.eras`, `result.era == era`)."""
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and any(_names_one_era(side) for side in (node.left, *node.comparators)):
            return True
    return False


def era_branches(tree: ast.Module) -> Iterator[int]:
    """The line of every condition that compares eras: an if, a conditional expression, a loop or
    comprehension condition, a match subject."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.IfExp | ast.While):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = list(node.ifs)
        elif isinstance(node, ast.Match):
            tests = [node.subject]
        else:
            continue
        yield from (test.lineno for test in tests if _tests_which_era(test))


def test_era_branches_outside_protocol_are_few_and_explained() -> None:
    branches, unexplained = [], []
    for name, tree, lines in modules():
        if name.startswith("gateway/protocol/"):
            continue
        for line in era_branches(tree):
            branches.append(f"{name}:{line}")
            here, above = lines[line - 1], lines[line - 2].strip() if line > 1 else ""
            if "#" not in here and not above.startswith("#"):
                unexplained.append(f"{name}:{line}")
    assert len(branches) <= MAX_ERA_BRANCHES, f"{len(branches)} era branches outside protocol/: {branches}"
    assert not unexplained, f"say why these branch on the era (a comment on or above the line): {unexplained}"


def _session_fields() -> set[str]:
    tree = ast.parse((GATEWAY / "sessions.py").read_text())
    session = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    fields = set()
    for node in ast.walk(session):
        for target in node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                fields.add(target.attr)
    return fields


def _is_a_session(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "session" or name.endswith("_session")


MUTATORS = {"append", "add", "pop", "discard", "clear", "update", "setdefault", "remove", "extend"}


@pytest.mark.parametrize("field", sorted(_session_fields()))
def test_only_sessions_py_writes_a_sessions_field(field: str) -> None:
    writes = []
    for name, tree, _ in modules():
        if name == "gateway/sessions.py":
            continue
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                targets = [node.func.value]
            for target in targets:
                if isinstance(target, ast.Subscript):
                    target = target.value
                if isinstance(target, ast.Attribute) and target.attr == field and _is_a_session(target.value):
                    writes.append(f"{name}:{node.lineno}")
    assert not writes, f"Session.{field} is written outside gateway/sessions.py (use a Session method): {writes}"
