"""The `[auth]` section: what check-config refuses, and the refusal to serve everyone beyond loopback."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import ConfigError, load_config
from tests.conftest import EXAMPLE_SERVER, free_port, start_gateway

KEY_DIGEST = hashlib.sha256(b"secret-a").hexdigest()
EXCHANGE = (
    "[upstream.auth]\nmode = 'token_exchange'\ntoken_url = 'http://as/token'\n"
    "client_id = 'gw'\nclient_secret_env = 'S'\n"
)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[auth]\nmode = 'basic'\n", "auth.mode: Input should be 'none', 'api_key' or 'oauth'"),
        ("[auth]\nmode = 'api_key'\n", 'auth: Value error, mode = "api_key" needs at least one [[auth.api_keys]]'),
        (
            f"[auth]\nmode = 'api_key'\n[[auth.api_keys]]\nname = 'a'\nsha256 = '{KEY_DIGEST}'\n"
            f"[[auth.api_keys]]\nname = 'a'\nsha256 = '{KEY_DIGEST}'\n",
            "names must be unique",
        ),
        ("[[auth.api_keys]]\nname = 'a'\nsha256 = 'secret'\n", "auth.api_keys.0.sha256: Value error, must be the 64"),
        ("[auth]\nmode = 'oauth'\n", "needs resource = the gateway's canonical http(s) URL"),
        ("[auth]\nmode = 'oauth'\nresource = 'http://gw/mcp'\n", "needs at least one authorization_servers"),
        (
            "[auth]\nmode = 'oauth'\nresource = 'http://gw/mcp'\nauthorization_servers = ['http://as']\n",
            "needs [auth.jwt] issuer or [auth.introspection] endpoint",
        ),
        ("[auth.jwt]\nalgorithms = ['HS256']\n", "auth.jwt.algorithms: Value error, ['HS256'] not allowed"),
        ("[auth.jwt]\nalgorithms = ['none']\n", "auth.jwt.algorithms: Value error, ['none'] not allowed"),
        ("[[auth.rules]]\nscopes = ['x']\n", "auth.rules.0.match: Field required"),
        (
            "[[auth.rules]]\nmatch = 'deploy'\nrequests_per_s = 1.0\n",
            "auth.rules.0: Value error, rule 'deploy': set both requests_per_s and burst, or neither",
        ),
        ("[[auth.rules]]\nmatch = 'x'\nburst = 0\nrequests_per_s = 1.0\n", "auth.rules.0.burst: Input should be"),
        (
            "[[auth.rules]]\nmatch = 'x'\nclaims = { groups = ['a', 'b'] }\n",
            "auth.rules.0.claims: Value error, claim 'groups': needs a name and a string, boolean or integer, not",
        ),
        ("[[auth.rules]]\nmatch = 'x'\nclaims = { '' = 'a' }\n", "claim '': needs a name"),
        (
            f"[[auth.api_keys]]\nname = 'a'\nsha256 = '{KEY_DIGEST}'\nclaims = {{ level = 1.5 }}\n",
            "auth.api_keys.0.claims: Value error, claim 'level': needs a name and a string, boolean or integer, "
            "or a list of them, not 1.5",
        ),
        ("[auth.limits]\nburst = 0\n", "auth.limits.burst: Input should be greater than 0"),
        ("[auth]\ntoken = 'x'\n", "auth.token: unknown key"),
        (
            "[upstream.auth]\nmode = 'client_credentials'\ntoken_url = 'http://as/token'\n",
            'upstream.auth: Value error, mode = "client_credentials" needs token_url, client_id and client_secret_env',
        ),
        (
            "[upstream.auth]\nmode = 'token_exchange'\n",
            'upstream.auth: Value error, mode = "token_exchange" needs token_url, client_id and client_secret_env',
        ),
        (
            f"[upstream]\ncommand = 'server'\n{EXCHANGE}",
            'upstream: Value error, auth.mode = "token_exchange" needs an HTTP upstream (url); a stdio one gets no',
        ),
        (
            f"[upstream]\nurl = 'http://up/mcp'\n{EXCHANGE}",
            'upstream \'default\': auth.mode = "token_exchange" needs [auth] mode = "oauth"',
        ),
    ],
)
def test_bad_auth_sections_name_the_key(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert named in str(caught.value)
    assert main(["check-config", str(path)]) == 2


def test_a_complete_api_key_section_is_usable(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(
        f"[auth]\nmode = 'api_key'\n[[auth.api_keys]]\nname = 'ci'\nsha256 = '{KEY_DIGEST.upper()}'\n"
        "scopes = ['deploy']\n[[auth.rules]]\nmatch = 'deploy*'\nscopes = ['deploy']\n"
    )
    auth = load_config(path).auth
    assert auth.api_keys[0].sha256 == KEY_DIGEST  # compared as lower-case hex
    rule = auth.rule_for("deploy_prod")
    assert rule is not None and rule.scopes == ["deploy"] and rule.hide
    assert auth.rule_for("build") is None


def test_mode_none_refuses_a_non_loopback_listen_address_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    listen = f"0.0.0.0:{free_port()}"
    assert main(["serve", "--listen", listen, "--upstream-cmd", shlex.join(EXAMPLE_SERVER)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"refusing to listen on {listen} without authentication" in err
    assert "--allow-unauthenticated" in err


async def test_allow_unauthenticated_starts_and_warns() -> None:
    extra = ["--allow-unauthenticated"]
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, host="0.0.0.0", extra_args=extra) as gw:
        assert gw.proc.returncode is None
    # Read once the gateway stopped: both of its output pipes are drained to their end by then.
    warnings = [line for line in gw.output if "anyone who can reach it can call every tool" in line]
    assert len(warnings) == 1 and "warning" in warnings[0], gw.output
