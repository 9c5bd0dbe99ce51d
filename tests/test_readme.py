"""README.md's examples run as written.

The convention (also in README's Development section): a fenced block whose language is `python` or
`sh` (or `bash`, `shell`) and whose line before the opening fence is exactly `<!-- runnable -->` is
an example this test runs. Each runs on its own, from the repository root, with the venv's `bin` first
on PATH: a Python block as a script with the venv's python, a shell block as a `bash -e -o pipefail`
script. One gateway serves them all, started the way the README (`make run`) starts it:
`mcp-task-gateway serve --config config/gateway.example.toml --upstream-cmd "<venv>/bin/python
examples/build_server.py"` (the example config with the SQLite file in a temporary directory), on a
free port; the test rewrites the README's `127.0.0.1:8765` to it.
Each example must exit 0 and print no traceback. Long-running examples (`make run`, `docker run`,
`serve`) stay unmarked.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import READY_TIMEOUT, ROOT, free_port, http_status, stop_popen

README = ROOT / "README.md"
MARKER = "<!-- runnable -->"
README_ADDRESS = "127.0.0.1:8765"
LANGUAGES = {"python": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
BIN = Path(sys.executable).parent
"""The venv's bin (not resolved: the venv's python is a symlink to the base interpreter)."""
EXAMPLE_TIMEOUT = 120
TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class Example:
    line: int
    """1-based line of the opening fence in README.md."""
    language: str
    """"python" or "sh"."""
    code: str

    @property
    def name(self) -> str:
        return f"README.md:{self.line}-{self.language}"


def runnable_examples(text: str) -> list[Example]:
    """The marked blocks, in order. A marker not followed by a python or shell fence is an error."""
    lines = text.splitlines()
    examples: list[Example] = []
    for index, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = lines[index + 1] if index + 1 < len(lines) else ""
        match = re.fullmatch(r"```(\w+)\s*", fence)
        if match is None or match.group(1) not in LANGUAGES:
            raise ValueError(f"README.md:{index + 1}: {MARKER} must stand right before a ```python or ```sh fence")
        body: list[str] = []
        for end in range(index + 2, len(lines)):
            if lines[end].strip() == "```":
                break
            body.append(lines[end])
        else:
            raise ValueError(f"README.md:{index + 2}: the runnable block is never closed")
        examples.append(Example(index + 2, LANGUAGES[match.group(1)], "\n".join(body) + "\n"))
    return examples


EXAMPLES = runnable_examples(README.read_text(encoding="utf-8"))


def test_the_readme_marks_examples_of_each_kind() -> None:
    """The test below cannot pass by finding nothing: the quickstart's Python and the tour's shell."""
    languages = [example.language for example in EXAMPLES]
    assert languages.count("python") >= 2 and languages.count("sh") >= 3, EXAMPLES
    assert sum(README_ADDRESS in example.code for example in EXAMPLES) >= 5, "the examples talk to the gateway"
    tour = "\n".join(example.code for example in EXAMPLES)
    for command in ("call ", "--task", "--follow", "tail ", "tasks ", " result ", " list", " cancel "):
        assert command in tour, f"no runnable README example uses {command.strip()!r}"


@pytest.fixture(scope="module")
def gateway_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The gateway as README's quickstart runs it (the venv's console script), on a free port."""
    command = BIN / "mcp-task-gateway"
    if not command.exists():
        pytest.fail(f"{command} is missing: run the tests with `make test` (it installs the package into .venv)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("readme")
    log = workdir / "gateway.log"
    # The example config as it is but for the SQLite file: its own, not the data/gateway.db that a
    # `make run` in this checkout may hold.
    example = (ROOT / "config" / "gateway.example.toml").read_text(encoding="utf-8")
    config = workdir / "gateway.toml"
    config.write_text(
        example.replace('path = "data/gateway.db"', f'path = "{workdir / "gateway.db"}"'), encoding="utf-8"
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(command),
                "serve",
                "--config",
                str(config),
                "--upstream-cmd",
                f"{BIN / 'python'} examples/build_server.py",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while http_status(f"http://127.0.0.1:{port}/healthz") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the gateway did not become healthy:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)
        yield port
    finally:
        stop_popen(proc)


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.name for example in EXAMPLES])
def test_readme_example_runs(example: Example, gateway_port: int, tmp_path: Path) -> None:
    code = example.code.replace(README_ADDRESS, f"127.0.0.1:{gateway_port}")
    if example.language == "python":
        script = tmp_path / "example.py"
        command = [str(BIN / "python"), str(script)]
    else:
        script = tmp_path / "example.sh"
        command = ["bash", "-e", "-o", "pipefail", str(script)]
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's gateway, whichever checkout the venv was installed from
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=EXAMPLE_TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{example.name} did not finish in {EXAMPLE_TIMEOUT} s:\n{code}\n{exc.stdout}\n{exc.stderr}")
    output = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, f"{example.name} exited {done.returncode}:\n{code}\n{output}"
    assert TRACEBACK not in done.stdout + done.stderr, f"{example.name} printed a traceback:\n{code}\n{output}"


def test_the_quickstart_progress_callback_handles_progress_without_a_total(capsys: pytest.CaptureFixture[str]) -> None:
    """MCP progress may come without `total`: the Quickstart's callback prints it rather than failing
    (the example server always sends one, so the run above cannot show it)."""
    (example,) = [e for e in runnable_examples(README.read_text(encoding="utf-8")) if "def show_progress" in e.code]
    namespace: dict[str, Any] = {}
    exec(example.code.partition("\nasync def main")[0], namespace)  # the imports and the callback only
    asyncio.run(namespace["show_progress"](2, None, None))
    asyncio.run(namespace["show_progress"](2.5, 5, "step 2"))
    assert [line.rstrip() for line in capsys.readouterr().out.splitlines()] == ["2", "2.5/5 step 2"]
