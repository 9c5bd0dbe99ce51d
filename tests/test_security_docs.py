"""docs/security.md says what the code does: its token-carrying SDK client example runs as written
against the gateway in `api_key` mode (and a wrong key is refused), its authorization-server recipe
uses the settings the tests' real `oidc-provider` runs with, its `hide` default is the code's, and no
code fence swallows the text after it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path

from gateway.config import AuthRule
from tests.conftest import EXAMPLE_SERVER, ROOT, start_gateway
from tests.test_readme import runnable_examples

SECURITY = ROOT / "docs" / "security.md"
PROVIDER = ROOT / "tests" / "oidc" / "provider.mjs"
DOCS_ADDRESS = "http://127.0.0.1:8765/mcp"
KEY = "security-docs-key-0123456789"
EXAMPLE_TIMEOUT = 60


async def run_example(code: str, url: str, token: str, tmp_path: Path) -> tuple[int, str]:
    """The example as a script against `url` with MCP_GATEWAY_TOKEN=`token`: (exit status, its output)."""
    script = tmp_path / "client.py"
    script.write_text(code.replace(DOCS_ADDRESS, url), encoding="utf-8")
    env = {**os.environ, "MCP_GATEWAY_TOKEN": token}
    env.pop("PYTHONPATH", None)  # the example needs the SDK only, not this checkout
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(EXAMPLE_TIMEOUT):
            output, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, output.decode(errors="replace")


async def test_the_token_carrying_client_example_runs_and_a_wrong_key_is_refused(tmp_path: Path) -> None:
    (example,) = runnable_examples(SECURITY.read_text(encoding="utf-8"))
    assert DOCS_ADDRESS in example.code and "MCP_GATEWAY_TOKEN" in example.code
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    config = f'[auth]\nmode = "api_key"\n\n[[auth.api_keys]]\nname = "docs"\nsha256 = "{digest}"\n'
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config) as gw:
        code, output = await run_example(example.code, gw.url, KEY, tmp_path)
        assert code == 0, output
        assert "tools:" in output and "slow_build" in output, output
        assert "built 2 steps" in output, output
        code, output = await run_example(example.code, gw.url, "not-the-key", tmp_path)
        assert code != 0 and "Unauthorized: invalid token: unknown api key" in output, output


def test_the_authorization_server_recipe_uses_the_tests_provider_settings() -> None:
    docs, provider = SECURITY.read_text(encoding="utf-8"), PROVIDER.read_text(encoding="utf-8")
    for setting in (
        "clientCredentials",
        "resourceIndicators",
        "defaultResource",
        "useGrantedResource",
        "getResourceServerInfo",
        "audience: resource",
        "accessTokenFormat",
        'jwt: { sign: { alg: "RS256" } }',
    ):
        assert setting in docs and setting in provider, setting
    assert 'accessTokenFormat: "jwt"' in docs


def test_the_documented_hide_default_is_the_code_s() -> None:
    assert AuthRule.model_fields["hide"].default is True
    assert "**`hide` defaults to `true`**" in SECURITY.read_text(encoding="utf-8")
    example = (ROOT / "config" / "gateway.example.toml").read_text(encoding="utf-8")
    assert "# hide = true" in example and "Default true" in example


def test_no_text_follows_a_closing_fence() -> None:
    """A fence with text after it does not close: everything below becomes code (headings included)."""
    lines = SECURITY.read_text(encoding="utf-8").splitlines()
    inside = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            assert not inside or line == "```", f"docs/security.md:{number}: text after a closing fence"
            inside = not inside
    assert not inside, "docs/security.md ends inside a code block"
