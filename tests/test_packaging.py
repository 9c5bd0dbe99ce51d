"""Packaging: a clean, non-editable `pip install .` works, and the Dockerfile's CMD serves with it.

The install goes into a fresh venv (no editable install, no repo on sys.path), so these tests catch a
missing dependency, entry point or package-data file that the development venv would hide. The
Docker image itself is not built (no daemon in CI); instead the build context is replicated (the tree
minus `.dockerignore`), installed from, and the Dockerfile's CMD and HEALTHCHECK are parsed and run
against the installed package with that copy as the working directory, the way the image's WORKDIR is.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port, http_status, stop_popen

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
EXAMPLE_CONFIG = ROOT / "config" / "gateway.example.toml"
INSTALL_TIMEOUT_S = 240
# Never copied, .dockerignore or not: environments, VCS data and build leftovers.
SOURCE_IGNORE = (
    ".git",
    ".venv",
    "venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "node_modules",
)
SERVE_TIMEOUT_S = 30


@dataclass
class Venv:
    root: Path
    context: Path
    """The replicated Docker build context the package was installed from (the image's WORKDIR)."""

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def env(self) -> dict[str, str]:
        """The environment of a shell with this venv activated, and nothing from the repo on sys.path."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        env["PYTHONUNBUFFERED"] = "1"
        return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv with `pip install <repo root>` (a regular, non-editable install) of a copy of the tree."""
    base = tmp_path_factory.mktemp("pkg")
    # pip builds in the source tree (build/, *.egg-info); build from a copy so the checkout stays untouched
    # and stale build/lib files from earlier builds can't leak into the wheel. The copy is what `docker
    # build` would send, so a .dockerignore that drops something the install needs fails here too.
    source = base / "context"
    copy_build_context(ROOT, source)
    venv = Venv(base / "venv", source)
    # The test runner's own pip installs into the new venv (`pip --python`), which saves seeding the venv
    # with pip (ensurepip: 5-15 s); without a pip here, fall back to the venv's own.
    outer_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, timeout=60)
    if outer_pip.returncode == 0:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv.root)], check=True, timeout=120)
        pip = [sys.executable, "-m", "pip", "--python", str(venv.bin / "python")]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv.root)], check=True, timeout=120)
        pip = [str(venv.bin / "python"), "-m", "pip"]
    done = subprocess.run(
        [*pip, "install", "--quiet", "--no-compile", str(source)],
        env=venv.env(),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    return venv


# --------------------------------------------------------------------------------------- build context


def dockerignore_patterns(root: Path) -> list[str]:
    path = root / ".dockerignore"
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax (Go filepath.Match plus `**`) as a regex over a relative '/' path."""
    out, i = "", 0
    pattern = pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(rel: str, patterns: list[str]) -> bool:
    """Whether `rel` is left out of the context; later patterns win, `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        if _pattern_regex(pattern[1:] if negate else pattern).fullmatch(rel):
            ignored = not negate
    return ignored


def copy_build_context(root: Path, dest: Path) -> None:
    patterns = dockerignore_patterns(root)
    always = shutil.ignore_patterns(*SOURCE_IGNORE)

    def ignore(directory: str, names: list[str]) -> set[str]:
        rel_dir = Path(directory).relative_to(root).as_posix()
        skipped = set(always(directory, names))
        for name in names:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if dockerignored(rel, patterns):
                skipped.add(name)
        return skipped

    shutil.copytree(root, dest, ignore=ignore)


def test_dockerignore_keeps_what_the_image_needs() -> None:
    patterns = dockerignore_patterns(ROOT)
    for needed in ("pyproject.toml", "README.md", "gateway/__init__.py", "examples/build_server.py"):
        assert not dockerignored(needed, patterns), f".dockerignore drops {needed}"
    unwanted = (".git", ".venv", "gateway/__pycache__", "data", "node_modules", "tests/oidc/node_modules")
    for path in unwanted:
        assert dockerignored(path, patterns), f".dockerignore lets {path} into the image"


# ------------------------------------------------------------------------------------------ Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and `\\` continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            instructions.append((keyword.upper(), args.strip()))
    return instructions


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not exec form: {args}"
    return value


def last(instructions: list[tuple[str, str]], keyword: str) -> str:
    found = [args for kw, args in instructions if kw == keyword]
    assert found, f"the Dockerfile has no {keyword}"
    return found[-1]


def with_listen(cmd: list[str], listen: str) -> list[str]:
    """`cmd` with the value of `--listen` (or `--listen=...`) replaced."""
    out = list(cmd)
    for i, arg in enumerate(out):
        if arg == "--listen":
            out[i + 1] = listen
            return out
        if arg.startswith("--listen="):
            out[i] = f"--listen={listen}"
            return out
    raise AssertionError(f"the CMD has no --listen: {cmd}")


def listen_port(cmd: list[str]) -> int:
    for i, arg in enumerate(cmd):
        value = cmd[i + 1] if arg == "--listen" else arg.partition("=")[2] if arg.startswith("--listen=") else None
        if value is not None:
            return int(value.rpartition(":")[2])
    raise AssertionError(f"the CMD has no --listen: {cmd}")


@pytest.fixture(scope="module")
def docker() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))


def test_dockerfile_shape(docker: list[tuple[str, str]]) -> None:
    """Non-root, the exposed port is the one the CMD listens on, and the health check probes /readyz there."""
    base = last(docker, "FROM")
    assert re.match(r"python:3\.11[.\w-]*slim", base), base
    assert "pip install --no-cache-dir --no-deps ." in last(docker, "RUN")
    user = last(docker, "USER")
    assert user.split(":")[0] not in ("root", "0"), user
    cmd = exec_form(last(docker, "CMD"))
    assert cmd[:2] == ["mcp-task-gateway", "serve"], cmd
    port = listen_port(cmd)
    assert str(port) in last(docker, "EXPOSE").split()
    health = last(docker, "HEALTHCHECK")
    assert f":{port}/readyz" in health, health
    assert "curl" not in health and "wget" not in health, "slim images have neither curl nor wget"


def source_copy(docker: list[tuple[str, str]]) -> int:
    """The index of the instruction that copies the whole build context."""
    copies = [i for i, (kw, args) in enumerate(docker) if kw == "COPY" and args.split()[0] == "."]
    assert len(copies) == 1, f"expected one `COPY . …`: {docker}"
    return copies[0]


def test_dependencies_are_installed_in_a_layer_before_the_source(docker: list[tuple[str, str]], tmp_path: Path) -> None:
    """Only pyproject.toml is copied before the dependency install, which comes before `COPY . /app`; the
    install's command, run here on the real pyproject.toml, lists exactly the project's dependencies."""
    before = docker[: source_copy(docker)]
    copied = [args.split()[:-1] for kw, args in before if kw == "COPY"]
    assert copied == [["pyproject.toml"]], copied
    (install,) = [args for kw, args in before if kw == "RUN" and "requirements.txt" in args]
    assert "pip install --no-cache-dir -r /tmp/requirements.txt" in install
    words = shlex.split(install)
    script = words[words.index("-c") + 1]
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    listed = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True
    )
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    assert listed.stdout.split() == dependencies


def test_the_image_can_run_npm_and_pypi_stdio_upstreams(docker: list[tuple[str, str]]) -> None:
    """node, npm/npx (Debian's nodejs and npm) and uv/uvx (from PyPI) are installed, and nothing is
    downloaded outside a package manager; uvx uses the image's Python."""
    runs = " ".join(args for kw, args in docker if kw == "RUN")
    apt = re.search(r"apt-get install -y --no-install-recommends ([^&]+)", runs)
    assert apt is not None and {"nodejs", "npm"} <= set(apt.group(1).split()), runs
    assert re.search(r"pip install --no-cache-dir \"uv>=[\d.]+\"", runs), runs
    assert "curl" not in runs and "wget" not in runs and "http" not in runs, runs
    env = " ".join(args for kw, args in docker if kw == "ENV")
    assert "UV_PYTHON_DOWNLOADS=never" in env


def test_docs_note_host_gateway_on_linux() -> None:
    flag = "--add-host=host.docker.internal:host-gateway"
    assert flag in (ROOT / "README.md").read_text(encoding="utf-8")
    assert flag in DOCKERFILE.read_text(encoding="utf-8")


@pytest.fixture
def served(installed: Venv, docker: list[tuple[str, str]], tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The Dockerfile's CMD, on a free loopback port, run from the replicated build context (the WORKDIR)."""
    workdir = installed.context
    port = free_port()
    cmd = with_listen(exec_form(last(docker, "CMD")), f"127.0.0.1:{port}")
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=workdir, env=installed.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield port, log
    finally:
        stop_popen(proc)
        tail = log.read_text(encoding="utf-8", errors="replace")
        assert "Traceback" not in tail, tail


def test_docker_cmd_becomes_ready_from_clean_install(
    served: tuple[int, Path], installed: Venv, docker: list[tuple[str, str]]
) -> None:
    port, log = served
    url = f"http://127.0.0.1:{port}/readyz"
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    status = None
    while time.monotonic() < deadline:
        status = http_status(url)
        if status == 200:
            break
        time.sleep(0.2)
    output = log.read_text(encoding="utf-8", errors="replace")
    assert status == 200, f"/readyz gave {status} after {SERVE_TIMEOUT_S}s; output:\n{output}"
    assert f"http://127.0.0.1:{port}/mcp" in output, output

    # The image's HEALTHCHECK command, pointed at this port, passes against the running gateway.
    health = last(docker, "HEALTHCHECK")
    check_args = health.partition("CMD")[2].strip()
    check = [arg.replace(":8765/", f":{port}/") for arg in exec_form(check_args)]
    done = subprocess.run(check, env=installed.env(), capture_output=True, text=True, timeout=15)
    assert done.returncode == 0, f"HEALTHCHECK failed: {done.stdout}{done.stderr}"
    # Against /readyz's 503 (here: a path that answers 404 on the same server) it fails in one line.
    unready = [arg.replace("/readyz", "/no-such-path") for arg in check]
    done = subprocess.run(unready, env=installed.env(), capture_output=True, text=True, timeout=15)
    assert done.returncode == 1, f"HEALTHCHECK passed against a 404: {done.stdout}{done.stderr}"
    assert done.stderr.startswith("not ready: HTTP Error 404") and "Traceback" not in done.stderr, done.stderr


# -------------------------------------------------------------------------------------------- check-config


def test_check_config_accepts_the_example(installed: Venv) -> None:
    done = subprocess.run(
        [str(installed.bin / "mcp-task-gateway"), "check-config", str(EXAMPLE_CONFIG)],
        cwd=ROOT,
        env=installed.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[server]\nlisten = "127.0.0.1:8765"\nmax_bodybytes = 10\n', "max_bodybytes"),
        ('[server]\nlisten = "127.0.0.1:8765"\n\n[upstreams]\nurl = "http://127.0.0.1:1/mcp"\n', "upstreams"),
    ],
    ids=["misspelt-key", "unknown-section"],
)
def test_check_config_rejects_an_unknown_key(installed: Venv, tmp_path: Path, toml: str, key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml, encoding="utf-8")
    done = subprocess.run(
        [str(installed.bin / "mcp-task-gateway"), "check-config", str(path)],
        cwd=tmp_path,
        env=installed.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, f"accepted a config with unknown key {key!r}:\n{done.stdout}\n{done.stderr}"
    assert key in done.stdout + done.stderr, f"the error does not name {key!r}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stdout + done.stderr


def test_the_ui_pages_files_are_installed(installed: Venv) -> None:
    """The /ui page's static files are package data: a regular install serves the same files as the tree."""
    done = subprocess.run(
        [str(installed.bin / "python"), "-c", "import gateway.ui as ui; print(sorted(ui.static_files()))"],
        cwd=installed.root,  # not the repo root: the installed package, never the tree's
        env=installed.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    shipped = sorted(path.name for path in (ROOT / "gateway" / "ui" / "static").iterdir())
    assert done.stdout.strip() == str(shipped), (done.stdout, shipped)
