"""`[server] metrics_listen`: /metrics on a listen address of its own, with a real gateway process.

When set, /metrics is served only there (the main listener answers 404 for it, like any unknown path),
/healthz and /readyz stay on the main listener, the second listener closes with the gateway, and a
metrics address in use stops the start with one line. `serve` refuses a `--listen` equal to it (what
check-config refuses in the file is in test_config.py).
"""

from __future__ import annotations

import asyncio
import shlex
import socket
from pathlib import Path

import aiohttp
import pytest

from gateway.cli import main
from gateway.config import load_config
from tests.conftest import EXAMPLE_SERVER, GATEWAY_CMD, ROOT, free_port, start_gateway, stop_process

TEST_TIMEOUT = 60.0


def test_serve_refuses_a_listen_flag_equal_to_the_metrics_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    path = tmp_path / "g.toml"
    path.write_text(f"[server]\nmetrics_listen = '{listen}'\n")
    assert load_config(path).server.metrics_listen == listen
    args = ["serve", "--config", str(path), "--listen", listen, "--upstream-cmd", shlex.join(EXAMPLE_SERVER)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "command line: server: Value error, metrics_listen" in err, err


async def status_of(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url) as response:
        return response.status, await response.text()


@pytest.mark.asyncio(loop_scope="module")  # the module's `http` session
async def test_metrics_only_on_their_own_address_and_closed_with_the_gateway(http: aiohttp.ClientSession) -> None:
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    config = f'[server]\nmetrics_listen = "127.0.0.1:{metrics_port}"\n'
    async with asyncio.timeout(TEST_TIMEOUT):
        async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
            status, text = await status_of(http, metrics_url)
            assert status == 200 and "mcp_gateway_requests_total" in text, text
            assert (await status_of(http, f"{gw.base}/metrics"))[0] == 404
            assert (await status_of(http, f"{gw.base}/healthz"))[0] == 200
            assert (await status_of(http, f"{gw.base}/readyz"))[0] in (200, 503)  # 503 until the upstream is up
            for path in ("/healthz", "/readyz", "/mcp"):
                assert (await status_of(http, f"http://127.0.0.1:{metrics_port}{path}"))[0] == 404, path
        with pytest.raises(aiohttp.ClientConnectionError):
            await status_of(http, metrics_url)
    assert any("metrics listening" in line and metrics_url in line for line in gw.output), gw.output


async def test_a_metrics_address_in_use_stops_the_start_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        metrics_listen = f"127.0.0.1:{taken.getsockname()[1]}"
        config = tmp_path / "g.toml"
        config.write_text(f'[server]\nmetrics_listen = "{metrics_listen}"\n[store]\nkind = "memory"\n')
        proc = await asyncio.create_subprocess_exec(
            *GATEWAY_CMD, "serve", "--config", str(config), "--listen", f"127.0.0.1:{free_port()}",
            "--upstream-cmd", shlex.join(EXAMPLE_SERVER),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        try:
            async with asyncio.timeout(TEST_TIMEOUT):
                out, err = await proc.communicate()
        finally:
            await stop_process(proc)
    assert proc.returncode == 1 and out == b"", (out, err)
    last = err.decode().strip().splitlines()[-1]
    assert last.startswith("mcp-task-gateway: [Errno 98] cannot listen on " + metrics_listen), err
    assert last.endswith("([server] metrics_listen): Address already in use"), err
    assert "Traceback" not in err.decode(), err
