"""The Makefile: `make run` stops with make, `make conformance` runs beside it, and `.venv` is made again
for another interpreter.

Stopping make stops the gateway (and the gateway its upstreams).

GNU make passes a SIGTERM on to its children and waits on SIGINT for the children to stop (a terminal's
Ctrl-C signals the whole foreground process group). The recipe `exec`s the gateway, so the gateway is
make's child itself; without `exec` the child is a shell, which dies of the SIGTERM and leaves the
gateway running. Each case starts `make run` in a process group of its own, waits for /healthz,
signals make the way a user would, and checks that every process make had started is gone.

`PYTHON` is set to the running venv's python so the Makefile keeps this .venv (it would make it again
for another interpreter); the first run installs the runtime stamp, so the wait for the gateway is long.

The interpreter check runs when make reads the Makefile; it is tested with `make -n` (which reports
but deletes nothing) on a copy of the Makefile beside stand-in interpreters that print an identity.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, http_status
from tests.test_upstream_crash import descendants, kill_all

BIN = Path(sys.executable).parent
START_TIMEOUT = 240.0
"""Seconds for make to install the runtime stamp (first run only) and the gateway to become healthy."""
STOP_TIMEOUT = 15.0


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@dataclass
class MakeRun:
    """`make run` started by `make_run`: the make process, its log, and the processes it had started once
    the gateway was healthy."""

    make: subprocess.Popen[bytes]
    port: int
    log: Path
    started: set[int]

    def healthz(self) -> int | None:
        """The status of the gateway's /healthz, or None when nothing answers."""
        return http_status(f"http://127.0.0.1:{self.port}/healthz")


@contextlib.contextmanager
def make_run(tmp_path: Path, env: dict[str, str]) -> Iterator[MakeRun]:
    """`make run` on a free port, in a process group of its own, once its gateway answers /healthz; at
    the end every process it started is killed (a test that stops it itself finds nothing left)."""
    port = free_port()
    log = tmp_path / "make-run.log"
    with log.open("wb") as out:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"ARGS=--listen 127.0.0.1:{port}", f"PYTHON={BIN / 'python'}"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    run = MakeRun(make, port, log, set())
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while http_status(f"http://127.0.0.1:{port}/healthz") != 200:
            assert make.poll() is None, f"make run exited with {make.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no healthy gateway on port {port}:\n{log.read_text()}"
            time.sleep(0.2)
        run.started = descendants(make.pid)
        assert run.started, "make has no child processes"
        yield run
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(make.pid, signal.SIGKILL)
        kill_all(run.started)
        with contextlib.suppress(subprocess.TimeoutExpired):
            make.wait(timeout=5)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to see make's descendants")
@pytest.mark.parametrize("stop", ["sigterm-to-make", "ctrl-c"])
def test_stopping_make_run_stops_the_gateway(stop: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH")}
    with make_run(tmp_path, env) as run:
        assert "recreating" not in run.log.read_text(), "the Makefile must keep the running venv"
        if stop == "sigterm-to-make":
            os.kill(run.make.pid, signal.SIGTERM)  # make's pid only, as `kill PID` does
        else:
            os.killpg(run.make.pid, signal.SIGINT)  # what Ctrl-C does: the foreground process group
        run.make.wait(timeout=STOP_TIMEOUT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while left := {pid for pid in run.started if running(pid)}:
            assert time.monotonic() < deadline, (
                f"still running {STOP_TIMEOUT} s after make stopped: {sorted(left)}\n{run.log.read_text()}"
            )
            time.sleep(0.1)
        assert run.healthz() != 200


CONFORMANCE_TIMEOUT = 150.0
"""Seconds `make conformance` may take (its kit bounds every wait by 30 s; a run takes about 30 s)."""


@pytest.mark.timeout(START_TIMEOUT + CONFORMANCE_TIMEOUT + 2 * STOP_TIMEOUT)
def test_make_conformance_runs_beside_make_run_in_the_same_checkout(tmp_path: Path) -> None:
    """The README's tour: `make run` holds data/gateway.db, and `make conformance` (what CI runs) passes
    beside it with a data folder of its own, while the first gateway goes on serving."""
    # PYTHONPATH stays: both gateways then run this checkout's code, as pytest imports it.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MCP_GATEWAY_DATA_DIR")}
    with make_run(tmp_path, env) as run:
        assert f'"store":"sqlite {ROOT / "data" / "gateway.db"}"' in run.log.read_text(), run.log.read_text()
        done = subprocess.run(
            ["make", "--no-print-directory", "conformance", f"PYTHON={BIN / 'python'}"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CONFORMANCE_TIMEOUT,
        )  # fmt: skip
        gateway_log = ROOT / "reports" / "conformance-gateway.log"
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{gateway_log.read_text(errors='replace')}"
        assert " 0 failed" in done.stdout, done.stdout
        assert run.healthz() == 200, run.log.read_text()
        assert run.make.poll() is None, run.log.read_text()


# -- which interpreter made .venv ------------------------------------------------------------------------


def stand_in(path: Path, identity: str) -> Path:
    """An executable that prints `identity` ("<version> <base prefix> <3.11+?>") whatever it is asked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{identity}'\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def dry_run(workdir: Path, python: Path, goal: str = "test") -> subprocess.CompletedProcess[str]:
    """`make -n GOAL PYTHON=python` with a copy of the Makefile (and an empty pyproject.toml) in workdir."""
    (workdir / "Makefile").write_text((ROOT / "Makefile").read_text(encoding="utf-8"), encoding="utf-8")
    (workdir / "pyproject.toml").touch()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "-n", "--no-print-directory", goal, f"PYTHON={python}"],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("venv_identity", "message"),
    [
        ("3.11.7 /opt/python3.11 True", None),
        ("3.9.18 /opt/python3.9 False", ".venv runs Python 3.9.18, older than 3.11; recreating it with"),
        ("3.12.1 /opt/python3.12 True", ".venv runs Python 3.12.1 from /opt/python3.12, not "),
        (None, ".venv/bin/python does not start; recreating .venv with"),
    ],
    ids=["same", "older", "another", "broken"],
)
def test_a_venv_of_another_interpreter_is_made_again(
    tmp_path: Path, venv_identity: str | None, message: str | None
) -> None:
    python = stand_in(tmp_path / "python3.11", "3.11.7 /opt/python3.11 True")
    if venv_identity is None:
        (tmp_path / ".venv" / "bin").mkdir(parents=True)  # a venv whose python is gone
    else:
        stand_in(tmp_path / ".venv" / "bin" / "python", venv_identity)
    done = dry_run(tmp_path, python)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if "recreating" in line]
    if message is None:
        assert said == [], done.stdout
    else:
        assert len(said) == 1 and said[0].startswith("make: ") and message in said[0], done.stdout
        assert str(python) in said[0]


def test_python_older_than_3_11_is_refused(tmp_path: Path) -> None:
    done = dry_run(tmp_path, stand_in(tmp_path / "python3.9", "3.9.18 /opt/python3.9 False"))
    assert done.returncode != 0
    assert "is Python 3.9.18; the gateway needs 3.11+" in done.stderr, done.stderr


def test_run_installs_the_runtime_only_and_test_the_extras(tmp_path: Path) -> None:
    python = stand_in(tmp_path / "python3.11", "3.11.7 /opt/python3.11 True")
    stand_in(tmp_path / ".venv" / "bin" / "python", "3.11.7 /opt/python3.11 True")
    planned = {goal: dry_run(tmp_path, python, goal) for goal in ("run", "test", "lint")}
    assert all(done.returncode == 0 for done in planned.values()), {g: d.stderr for g, d in planned.items()}
    run = planned["run"].stdout
    assert "pip install --quiet -e .\n" in run and "[test]" not in run, run
    assert "exec .venv/bin/mcp-task-gateway serve" in run, run
    for goal in ("test", "lint"):
        assert "pip install --quiet -e '.[test]'" in planned[goal].stdout, planned[goal].stdout


# -- the test lanes --------------------------------------------------------------------------------------


def test_make_test_fast_runs_the_in_process_lane_prints_its_duration_and_keeps_the_exit_status(tmp_path: Path) -> None:
    python = stand_in(tmp_path / "python3.11", "3.11.7 /opt/python3.11 True")
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    # The venv's python: the Makefile's identity check, pip (a no-op), and a pytest run that fails with 3.
    venv_python.write_text(
        '#!/bin/sh\ncase "$*" in *pytest*) echo "ran: $*"; exit 3;; esac\necho \'3.11.7 /opt/python3.11 True\'\n',
        encoding="utf-8",
    )
    venv_python.chmod(0o755)
    dry_run(tmp_path, python, "test-fast")  # writes the Makefile into tmp_path
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "test-fast", f"PYTHON={python}", "ARGS=-k 'a, b'"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    lines = done.stdout.splitlines()
    assert "ran: -m pytest -q --in-process -n 2 -k a, b" in lines, done.stdout
    assert lines[-1].startswith("make test-fast: ") and lines[-1].endswith(" s"), done.stdout
    planned = dry_run(tmp_path, python, "test").stdout
    # The whole suite, on two workers a module each, timed:
    assert "-m pytest -q -n 2 --dist loadfile \n" in planned and 'echo "make test: ' in planned, planned


def test_the_in_process_lane_skips_a_test_when_it_starts_a_process(tmp_path: Path) -> None:
    (tmp_path / "test_lane.py").write_text(
        "import asyncio\nimport subprocess\n\n\n"
        "def test_in_process():\n    pass\n\n\n"
        "def test_popen():\n    subprocess.run(['true'])\n\n\n"
        "def test_asyncio_subprocess():\n    asyncio.run(asyncio.create_subprocess_exec('true'))\n",
        encoding="utf-8",
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-rs"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fast = subprocess.run([*command, "--in-process", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert fast.returncode == 0 and "1 passed, 2 skipped" in fast.stdout, fast.stdout + fast.stderr
    assert "SKIPPED [2]" in fast.stdout and "starts a process" in fast.stdout, fast.stdout
    full = subprocess.run([*command, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert full.returncode == 0 and "3 passed" in full.stdout, full.stdout + full.stderr
