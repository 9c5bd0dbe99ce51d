"""Start-up: the one line that says what the gateway serves, where its data lives (`serve --data-dir`,
$MCP_GATEWAY_DATA_DIR), a listen port in use (one line, exit 2, nothing started), and "did you mean"
for a mistyped config key."""

from __future__ import annotations

import asyncio
import shlex
import socket
from pathlib import Path

import orjson
import pytest

from gateway.cli import main
from gateway.stores.sqlite import SqliteDatabase, StoreUnavailable
from tests.conftest import EXAMPLE_SERVER, GATEWAY_CMD, ROOT, RunningGateway, start_gateway, stop_process

TIMEOUT = 30.0
API_KEY_SHA256 = "0" * 64


def started_line(gw: RunningGateway) -> dict[str, object]:
    """The JSON log line the gateway writes once it listens."""
    lines = [orjson.loads(line) for line in gw.output if line.startswith("{") and '"gateway listening"' in line]
    assert len(lines) == 1, gw.output_text()
    line: dict[str, object] = lines[0]
    return line


async def test_the_start_up_line_names_address_auth_store_and_upstream(tmp_path: Path) -> None:
    store = tmp_path / "tasks.db"
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=f'[store]\npath = "{store}"\n') as gw:
        line = started_line(gw)
    assert line["url"] == gw.url and line["auth"] == "none"
    assert line["store"] == f"sqlite {store}"
    assert line["upstream"] == f"command `{shlex.join(EXAMPLE_SERVER)}`"


async def test_the_start_up_line_names_another_auth_mode_and_store() -> None:
    config = f"[auth]\nmode = 'api_key'\n[[auth.api_keys]]\nname = 'a'\nsha256 = '{API_KEY_SHA256}'\n"
    config += "[store]\nkind = 'memory'\n"
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
        line = started_line(gw)
    assert (line["auth"], line["store"]) == ("api_key", "memory (lost when the gateway stops)")


@pytest.mark.parametrize("given", ["flag", "env", "both"])
async def test_the_data_folder_holds_the_store(given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--data-dir, else $MCP_GATEWAY_DATA_DIR, moves the store out of the folder `[store] path` names
    (start_gateway's config sets one in its own temporary folder)."""
    by_flag, by_env = tmp_path / "flag", tmp_path / "env"
    if given in ("env", "both"):
        monkeypatch.setenv("MCP_GATEWAY_DATA_DIR", str(by_env))
    extra = ["--data-dir", str(by_flag)] if given in ("flag", "both") else []
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, extra_args=extra) as gw:
        line = started_line(gw)
    chosen = by_env if given == "env" else by_flag
    assert line["store"] == f"sqlite {chosen / 'gateway.db'}"
    assert (chosen / "gateway.db").is_file()
    assert given != "both" or not by_env.exists()


def test_check_config_connect_opens_the_store_in_the_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_GATEWAY_DATA_DIR", str(tmp_path / "data"))
    config = tmp_path / "g.toml"
    config.write_text('[store]\npath = "elsewhere/gateway.db"\n', encoding="utf-8")
    assert main(["check-config", str(config), "--connect"]) == 0
    assert (tmp_path / "data" / "gateway.db").is_file()


async def test_the_store_in_use_error_names_the_fix(tmp_path: Path) -> None:
    first = SqliteDatabase(tmp_path / "gateway.db").acquire()
    try:
        with pytest.raises(StoreUnavailable) as refused:
            SqliteDatabase(tmp_path / "gateway.db")
    finally:
        await first.release()
    message = str(refused.value)
    assert "in use by another gateway process: stop that gateway" in message
    assert all(fix in message for fix in ("--data-dir", "MCP_GATEWAY_DATA_DIR", "[store] path")), message


async def test_a_port_in_use_is_one_line_and_exit_2_before_anything_starts(tmp_path: Path) -> None:
    marker = tmp_path / "upstream-started"
    upstream = f"sh -c 'touch {shlex.quote(str(marker))}; exec {shlex.join(EXAMPLE_SERVER)}'"
    data = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        proc = await asyncio.create_subprocess_exec(
            *GATEWAY_CMD, "serve", "--listen", listen, "--data-dir", str(data), "--upstream-cmd", upstream,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        try:
            async with asyncio.timeout(TIMEOUT):
                out, err = await proc.communicate()
        finally:
            await stop_process(proc)
    assert proc.returncode == 2 and out == b"", (out, err)
    assert err.decode().splitlines() == [
        f"mcp-task-gateway: cannot listen on {listen}: Address already in use "
        "(another gateway? stop it, or pass --listen HOST:PORT)"
    ]
    assert not marker.exists(), "the upstream was started"
    assert not data.exists(), "the store was opened"


@pytest.mark.parametrize("command", [["check-config"], ["serve", "--config"]])
def test_an_unknown_key_gets_the_closest_known_one(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "g.toml"
    config.write_text(
        '[server]\nlissten = "127.0.0.1:1"\n[[tasks.tools]]\nmach = "*"\n[stor]\nkind = "memory"\n'
        "[upstream.stdio]\nzzz = 1\n",
        encoding="utf-8",
    )
    assert main([*command, str(config)]) == 2
    err = capsys.readouterr().err
    assert "server.lissten: unknown key (did you mean `listen`?)" in err, err
    assert "tasks.tools.0.mach: unknown key (did you mean `match`?)" in err, err
    assert "stor: unknown key (did you mean `store`?)" in err, err
    assert "upstream.stdio.zzz: unknown key;" in err or err.rstrip().endswith("upstream.stdio.zzz: unknown key"), err
