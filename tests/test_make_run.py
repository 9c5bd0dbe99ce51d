"""`make run`: stopping make stops the gateway (and the gateway its upstreams).

GNU make passes a SIGTERM on to its children and waits on SIGINT for the children to stop (a terminal's
Ctrl-C signals the whole foreground process group). The recipe `exec`s the gateway, so the gateway is
make's child itself; without `exec` the child is a shell, which dies of the SIGTERM and leaves the
gateway running. Each case starts `make run` in a process group of its own, waits for /healthz,
signals make the way a user would, and checks that every process make had started is gone.

`PYTHON` is set to the running venv's python so the Makefile keeps this .venv (it would make it again
for another interpreter); the first run installs the runtime stamp, so the wait for the gateway is long.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from tests.test_upstream_crash import descendants, kill_all

BIN = Path(sys.executable).parent
START_TIMEOUT = 240.0
"""Seconds for make to install the runtime stamp (first run only) and the gateway to become healthy."""
STOP_TIMEOUT = 15.0


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to see make's descendants")
@pytest.mark.parametrize("stop", ["sigterm-to-make", "ctrl-c"])
def test_stopping_make_run_stops_the_gateway(stop: str, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH")}
    log = tmp_path / "make-run.log"
    with log.open("wb") as out:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"ARGS=--listen 127.0.0.1:{port}", f"PYTHON={BIN / 'python'}"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    started: set[int] = set()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(port):
            assert make.poll() is None, f"make run exited with {make.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no healthy gateway on port {port}:\n{log.read_text()}"
            time.sleep(0.2)
        started = descendants(make.pid)
        assert started, "make has no child processes"
        assert "recreating" not in log.read_text(), "the Makefile must keep the running venv"

        if stop == "sigterm-to-make":
            os.kill(make.pid, signal.SIGTERM)  # make's pid only, as `kill PID` does
        else:
            os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C does: the foreground process group
        make.wait(timeout=STOP_TIMEOUT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while left := {pid for pid in started if running(pid)}:
            assert time.monotonic() < deadline, (
                f"still running {STOP_TIMEOUT} s after make stopped: {sorted(left)}\n{log.read_text()}"
            )
            time.sleep(0.1)
        assert not healthy(port)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(make.pid, signal.SIGKILL)
        kill_all(started)
        with contextlib.suppress(subprocess.TimeoutExpired):
            make.wait(timeout=5)
