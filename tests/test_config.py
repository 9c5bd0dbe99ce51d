"""Config loading and check-config: defaults, flag overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_no_file_gives_the_defaults() -> None:
    config = load_config(None)
    assert config.server.listen == "127.0.0.1:8765" and config.server.path == "/mcp"
    assert (config.store.kind, config.store.path) == ("sqlite", "data/gateway.db")  # durable by default


def test_the_example_file_is_valid_and_matches_the_defaults() -> None:
    # The example documents every key with its default value: the two must not drift apart.
    assert load_config(ROOT / "config" / "gateway.example.toml") == Config()


def test_command_may_be_a_string(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text("[upstream]\ncommand = \"python server.py --flag 'a b'\"\n")
    assert load_config(path).upstream.command == ["python", "server.py", "--flag", "a b"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[server]\nlisten = 'nope'\n", "server.listen"),
        ("[server]\nlistn = '127.0.0.1:1'\n", "server.listn: unknown key"),
        ("[upstream]\nurl = 'ftp://x'\n", "upstream.url"),
        ("[upstream]\nurl = 'http://x'\ncommand = 'y'\n", "either 'url' or 'command'"),
        ("[upstream.stdio]\nmax_processes = 0\n", "upstream.stdio.max_processes"),
        ("[[rules]]\nmethod = 'notifications/progress'\n", "rules.0: Value error, 'type' is required"),
        (
            "[[rules]]\nmethod = 'x'\ntype = 'a'\n[[rules]]\nmethod = 'y'\ndrop = true\ntype = 'b'\n",
            "rules.1: Value error, a rule with drop = true takes no 'type'",
        ),
        (
            "[[rules]]\nmethod = 'x'\ntype = 'bad type'\n",
            "rules.0: Value error, 'type' 'bad type' must be dot-separated labels without spaces",
        ),
        ("[events]\nprefix = 'nodots'\n", "events.prefix"),
        (
            "[[tasks.tools]]\nmatch = 'build'\ntask_support = 'required'\nmodern = 'always'\n",
            "tasks.tools.0: Value error, tool 'build': task_support = 'required'",
        ),
        (
            "[[tasks.tools]]\nmatch = 'deploy'\ntask_support = 'optional'\nmodern = 'required'\n",
            "contradict each other; with this task_support, modern must be 'after_ms'",
        ),
        ("[[tasks.tools]]\ntask_support = 'forbidden'\nmodern = 'after_ms'\n", "modern must be 'never'"),
        ("[[tasks.tools]]\nmodern = 'sometimes'\n", "tasks.tools.0.modern"),
        ("[store]\nkind = 'redis-ish'\n", "store.kind: Input should be 'memory', 'sqlite' or 'redis'"),
        ("[store]\nkind = 'sqlite'\nsynchronous = 'off'\n", "store.synchronous: Input should be 'normal' or 'full'"),
        ("[store]\nkind = 'sqlite'\npath = ''\n", "store.path: String should have at least 1 character"),
        ("[store]\nkind = 'memory'\nfile = 'x'\n", "store.file: unknown key"),
        ("[server]\nmetrics_listen = 'nope'\n", "server.metrics_listen: Value error, 'nope' is not HOST:PORT"),
        (
            "[server]\nlisten = '127.0.0.1:9464'\nmetrics_listen = '127.0.0.1:9464'\n",
            "server: Value error, metrics_listen '127.0.0.1:9464' must differ from listen '127.0.0.1:9464'",
        ),
        (
            "[store]\nkind = 'redis'\nlease_ttl_s = 0.1\n",
            "store.lease_ttl_s: Input should be greater than or equal to 0.5",
        ),
        ("[server\n", "not valid TOML"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("(", r"\(")):
        load_config(path)


@pytest.mark.parametrize(
    ("keys", "task_support", "modern"),
    [
        ("task_support = 'required'", "required", "required"),
        ("modern = 'required'", "required", "required"),
        ("task_support = 'forbidden'", "forbidden", "never"),
        ("task_support = 'optional'", "optional", "after_ms"),
        ("modern = 'always'", "optional", "always"),
    ],
)
def test_a_tool_policy_key_left_out_follows_the_other(
    tmp_path: Path, keys: str, task_support: str, modern: str
) -> None:
    path = tmp_path / "g.toml"
    path.write_text(f"[[tasks.tools]]\nmatch = 'build'\n{keys}\n")
    (policy,) = load_config(path).tasks.tools
    assert (policy.task_support, policy.modern) == (task_support, modern)


def test_check_config_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(ROOT / "config" / "gateway.example.toml")]) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[logging]\nlevel = 'loud'\n")
    assert main(["check-config", str(bad)]) == 2
    assert "logging.level" in capsys.readouterr().err


def test_serve_without_an_upstream_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--listen", "127.0.0.1:0"]) == 2
    assert "no upstream" in capsys.readouterr().err
