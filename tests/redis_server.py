"""A `redis-server` of the tests' own, on a free loopback port: never the machine's shared Redis.

`RedisServer` starts one (persistence off unless asked for AOF, `maxmemory-policy noeviction`) and
stops it by pid. `shared_redis_url()` starts one for the whole session on first use, for the store
contract suites; every store built on it takes a fresh key prefix (`fresh_prefix()`), so no test or
Hypothesis example sees another's keys. `conftest.py` stops it at the end of the session.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.conftest import STOP_TIMEOUT, free_port

READY_TIMEOUT = 10.0


class RedisServer:
    """One `redis-server` process: started by `start`, stopped by pid by `stop` (SIGTERM, then SIGKILL)."""

    def __init__(
        self, directory: Path, *, aof: bool = False, port: int | None = None, policy: str = "noeviction"
    ) -> None:
        self.directory = directory
        self.aof = aof
        self.port = port or free_port()
        self.policy = policy
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else ["--appendonly", "no"]
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += [*persistence, "--dir", str(self.directory), "--maxmemory-policy", self.policy]
        log = open(self.directory / f"redis-{self.port}.log", "ab")  # noqa: SIM115 - the child holds it
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {self.log_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                self.stop()
                raise TimeoutError(f"redis-server did not answer on port {self.port}: {self.log_text()}")
            time.sleep(0.05)

    def gateway_config(self, prefix: str, lease_ttl_s: float) -> str:
        """The `[store]` section of a gateway (replica) on this server under `prefix`."""
        lines = ['kind = "redis"', f'url = "{self.url}"', f'key_prefix = "{prefix}"', f"lease_ttl_s = {lease_ttl_s}"]
        return "[store]\n" + "\n".join(lines) + "\n"

    def log_text(self) -> str:
        path = self.directory / f"redis-{self.port}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop the server by its pid (SIGTERM: AOF flushed; SIGKILL: as a crash)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, sig)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT)


_shared: RedisServer | None = None


def shared_redis_url() -> str:
    """The session's server for the contract suites, started on first use."""
    global _shared
    if _shared is None:
        server = RedisServer(Path(tempfile.mkdtemp(prefix="mtg-test-redis-")))
        server.start()
        _shared = server
    return _shared.url


def stop_shared_redis() -> None:
    global _shared
    if _shared is not None:
        _shared.stop()
        _shared = None


def fresh_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}:"
