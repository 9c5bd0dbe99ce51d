"""Many upstreams in the config: `[[upstreams]]`, names, `upstream =` scoping, the per-route configs
(`for_route`), the name separator, `serve --upstream` and check-config's errors that name the key."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gateway.assembly.upstream import with_env_headers
from gateway.cli import _apply_flags, _parser, main
from gateway.config import AuthRule, Config, ConfigError, HttpUpstreamConfig, load_config

ROOT = Path(__file__).resolve().parent.parent

THREE = """
[[upstreams]]
name = "build"
command = "python build_server.py --fast"
request_timeout_s = 900.0
[upstreams.stdio]
max_processes = 4

[[upstreams]]
name = "everything"
url = "http://127.0.0.1:3001/mcp"
era = "modern"

[[upstreams]]
name = "time"
command = ["uvx", "mcp-server-time"]
"""

SCOPED = (
    THREE
    + """
[[auth.rules]]
match = "deploy*"
upstream = "build"
scopes = ["deploy"]
requests_per_s = 1.0
burst = 2

[[auth.rules]]
match = "everything__*"
scopes = ["all"]

[[auth.rules]]
match = "get_*"
upstream = "time"

[[tasks.tools]]
match = "slow_*"
upstream = "build"
task_support = "required"

[[tasks.tools]]
match = "*"

[[rules]]
method = "notifications/message"
upstream = "time"
drop = true

[[rules]]
method = "*"
type = "notification"
payload = "message"
"""
)


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "g.toml"
    path.write_text(text)
    return load_config(path)


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    return str(caught.value)


def test_upstreams_load_in_order_with_their_own_settings(tmp_path: Path) -> None:
    config = load(tmp_path, THREE)
    assert config.aggregating
    build, everything, time = config.named_upstreams()
    assert [build.name, everything.name, time.name] == ["build", "everything", "time"]
    assert build.command == ["python", "build_server.py", "--fast"] and build.request_timeout_s == 900.0
    assert build.stdio.max_processes == 4 and everything.stdio.max_processes == 32
    assert everything.url == "http://127.0.0.1:3001/mcp" and everything.era == "modern"
    assert time.command == ["uvx", "mcp-server-time"]


def test_the_single_upstream_is_named_default(tmp_path: Path) -> None:
    config = load(tmp_path, "[upstream]\nurl = 'http://127.0.0.1:9/mcp'\n")
    assert not config.aggregating and config.upstreams == []
    (only,) = config.named_upstreams()
    assert only is config.upstream and only.name == "default" and only.url == "http://127.0.0.1:9/mcp"
    assert Config().named_upstreams() == [Config().upstream]


def test_the_commented_example_of_the_example_file_is_valid() -> None:
    text = (ROOT / "config" / "gateway.example.toml").read_text()
    block = re.search(r"^# \[\[upstreams\]\]\n(?:#.*\n)+", text, re.MULTILINE)
    assert block is not None
    uncommented = re.sub(r"^# ?", "", block.group(0), flags=re.MULTILINE)
    config = Config.model_validate(tomllib.loads(text + uncommented))
    assert [upstream.name for upstream in config.named_upstreams()] == ["build", "everything", "time"]


@pytest.mark.parametrize("name", ["build", "a", "0", "mcp-server-time", "a" * 32, "9-x"])
def test_good_names(tmp_path: Path, name: str) -> None:
    assert load(tmp_path, f"[[upstreams]]\nname = '{name}'\ncommand = 'x'\n").upstreams[0].name == name


@pytest.mark.parametrize("name", ["", "Build", "-x", "a_b", "a.b", "a b", "é", "a" * 33, "default/x"])
def test_bad_names_are_refused_with_the_pattern(tmp_path: Path, name: str) -> None:
    message = refused(tmp_path, f"[[upstreams]]\nname = '{name}'\ncommand = 'x'\n")
    assert message.startswith(f"{tmp_path / 'g.toml'}: upstreams.0.name: ")
    assert "^[a-z0-9][a-z0-9-]{0,31}$" in message


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            THREE + "[[upstreams]]\nname = 'build'\nurl = 'http://h/mcp'\n",
            "upstreams.3.name: duplicate upstream name 'build' (upstreams.0 has it)",
        ),
        ("[[upstreams]]\ncommand = 'x'\n", "upstreams.0.name: required in an [[upstreams]] entry"),
        ("[[upstreams]]\nname = 'a'\n", "upstreams.0: set 'url' or 'command'"),
        ("[[upstreams]]\nname = 'a'\nurl = 'http://h'\ncommand = 'x'\n", "either 'url' or 'command'"),
        ("[upstream]\ncommand = 'x'\n" + THREE, "upstream.command: [upstream] and [[upstreams]] are two forms"),
        ("[upstream]\nurl = 'http://h'\n" + THREE, "upstream.url: [upstream] and [[upstreams]] are two forms"),
        ("[upstream.stdio]\nmax_processes = 2\n" + THREE, "upstream.stdio: [upstream] and [[upstreams]]"),
        ("[upstream]\nname = 'x'\ncommand = 'y'\n", "upstream.name: the single [upstream] is 'default'"),
        (
            "[[upstreams]]\nname = 'a'\ncommand = 'x'\nnme = 'b'\n",
            "upstreams.0.nme: unknown key (did you mean `name`?)",
        ),
        (
            "[[upstreams]]\nname = 'a'\ncommand = 'x'\n[upstreams.stdio]\nmax_processes = 0\n",
            "upstreams.0.stdio.max_processes",
        ),
        ("[server]\npath = '/servers/time/mcp'\n" + THREE, "server.path: '/servers/time/mcp' is upstream 'time'"),
        ("[server]\nready_when = 'most'\n", "server.ready_when: Input should be 'any' or 'all'"),
    ],
)
def test_bad_upstreams_name_the_key(tmp_path: Path, text: str, named: str) -> None:
    assert named in refused(tmp_path, text)


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("auth.rules.1.upstream", "[[auth.rules]]\nmatch = 'a'\n[[auth.rules]]\nmatch = 'b'\nupstream = 'x'\n"),
        ("tasks.tools.0.upstream", "[[tasks.tools]]\nupstream = 'x'\n"),
        ("rules.0.upstream", "[[rules]]\nmethod = '*'\ntype = 'n'\nupstream = 'x'\n"),
    ],
)
def test_an_unknown_upstream_reference_is_refused(tmp_path: Path, key: str, text: str) -> None:
    assert f"{key}: no upstream named 'x' (configured: build, everything, time)" in refused(tmp_path, THREE + text)
    assert f"{key}: no upstream named 'x' (configured: default)" in refused(tmp_path, text)


def test_every_problem_across_sections_is_reported_at_once(tmp_path: Path) -> None:
    text = "[[upstreams]]\nname = 'a'\ncommand = 'x'\n[[upstreams]]\nname = 'a'\n[[tasks.tools]]\nupstream = 'b'\n"
    message = refused(tmp_path, text)
    assert message.endswith(
        "upstreams.1: set 'url' or 'command'; upstreams.1.name: duplicate upstream name 'a' (upstreams.0 has it); "
        "tasks.tools.0.upstream: no upstream named 'b' (configured: a)"
    )


def test_the_single_upstream_may_be_referred_to_as_default(tmp_path: Path) -> None:
    config = load(tmp_path, "[upstream]\ncommand = 'x'\n[[auth.rules]]\nmatch = 'a'\nupstream = 'default'\n")
    assert config.for_route("default").auth.rules == config.auth.rules


@pytest.mark.parametrize("separator", ["__", "_", ".", "X", "-_-", "a.b", "__x__", "a-b-c-d_"])
def test_separators_that_keep_names_apart(tmp_path: Path, separator: str) -> None:
    assert load(tmp_path, f"[server]\nname_separator = '{separator}'\n").server.name_separator == separator


@pytest.mark.parametrize(
    ("separator", "reason"),
    [
        ("-", "holds only characters an upstream name may hold (a-z 0-9 -), so two upstreams' prefixed names"),
        ("x", "could collide"),
        ("--", "could collide"),
        ("", "must be 1 to 8"),
        ("_________", "must be 1 to 8"),
        ("/", "must be 1 to 8 of the characters a tool name may hold"),
        (":", "A-Z a-z 0-9 _ . -"),
        ("* ", "must be 1 to 8"),
    ],
)
def test_separators_that_could_collide_or_break_tool_names_are_refused(
    tmp_path: Path, separator: str, reason: str
) -> None:
    message = refused(tmp_path, f"[server]\nname_separator = '{separator}'\n")
    assert "server.name_separator: " in message and reason in message


def test_an_upstreams_route_keeps_its_own_and_the_common_entries(tmp_path: Path) -> None:
    config = load(tmp_path, SCOPED)
    build = config.for_route("build")
    assert build.upstream is config.upstreams[0]
    assert [(rule.match, rule.upstream) for rule in build.auth.rules] == [("deploy*", "build"), ("everything__*", None)]
    assert [(tool.match, tool.upstream) for tool in build.tasks.tools] == [("slow_*", "build"), ("*", None)]
    assert [rule.method for rule in build.rules] == ["*"]
    time = config.for_route("time")
    assert time.upstream.command == ["uvx", "mcp-server-time"]
    assert [rule.match for rule in time.auth.rules] == ["everything__*", "get_*"]
    assert [tool.match for tool in time.tasks.tools] == ["*"]
    assert [(rule.method, rule.drop) for rule in time.rules] == [("notifications/message", True), ("*", False)]
    # What no route changes: the other sections, and the list of every upstream.
    assert time.server == config.server and time.store == config.store and time.upstreams == config.upstreams
    assert time.auth.mode == config.auth.mode and time.tasks.max_tasks_total == config.tasks.max_tasks_total


def test_the_aggregates_route_prefixes_the_scoped_matches(tmp_path: Path) -> None:
    config = load(tmp_path, SCOPED)
    aggregate = config.for_route(None)
    assert aggregate.upstream is config.upstreams[0]
    assert [rule.match for rule in aggregate.auth.rules] == ["build__deploy*", "everything__*", "time__get_*"]
    assert aggregate.auth.rules[0].requests_per_s == 1.0 and aggregate.auth.rules[0].scopes == ["deploy"]
    assert [tool.match for tool in aggregate.tasks.tools] == ["build__slow_*", "*"]
    assert [rule.method for rule in aggregate.rules] == ["*"]  # scoped capture rules: their own path only
    # A prefixed match finds only its upstream's tools.
    assert aggregate.auth.rule_for("build__deploy_prod") is aggregate.auth.rules[0]
    assert aggregate.auth.rule_for("time__deploy_prod") is None
    assert aggregate.tasks.policy_for("build__slow_build").task_support == "required"
    assert aggregate.tasks.policy_for("everything__slow_build").task_support == "optional"
    assert config.auth.rules[0].match == "deploy*"  # the file's config is left as it was


def test_the_aggregate_uses_the_configured_separator(tmp_path: Path) -> None:
    config = load(tmp_path, "[server]\nname_separator = '.'\n" + SCOPED)
    assert [rule.match for rule in config.for_route(None).auth.rules] == [
        "build.deploy*",
        "everything__*",
        "time.get_*",
    ]


def test_the_single_upstreams_route_is_its_one_endpoint(tmp_path: Path) -> None:
    config = load(tmp_path, "[upstream]\ncommand = 'x'\n[[auth.rules]]\nmatch = 'a*'\nupstream = 'default'\n")
    for route in (config.for_route(None), config.for_route("default")):
        assert route.upstream == config.upstream and [rule.match for rule in route.auth.rules] == ["a*"]


def test_an_unknown_route_is_a_key_error(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="no upstream named 'nope'"):
        load(tmp_path, THREE).for_route("nope")


def test_an_aggregate_rule_never_matches_a_name_that_only_starts_like_it() -> None:
    # "build" rules prefixed "build__" must not reach upstream "build-2"'s tools: names hold no "_".
    rule = AuthRule(match="*", upstream="build")
    config = Config.model_validate(
        {
            "upstreams": [{"name": "build", "command": "x"}, {"name": "build-2", "command": "y"}],
            "auth": {"rules": [rule.model_dump()]},
        }
    )
    aggregate = config.for_route(None).auth
    assert aggregate.rule_for("build__x") is not None and aggregate.rule_for("build-2__x") is None


def serve_config(*argv: str) -> Config:
    args = _parser().parse_args(["serve", *argv])
    return _apply_flags(load_config(args.config), args)


def test_serve_upstream_flags_become_named_upstreams() -> None:
    config = serve_config(
        "--upstream", "build=python build_server.py --name 'a b'", "--upstream", "search=https://s.example/mcp"
    )
    assert config.aggregating
    build, search = config.named_upstreams()
    assert (build.name, build.command, build.url) == ("build", ["python", "build_server.py", "--name", "a b"], None)
    assert (search.name, search.url, search.command) == ("search", "https://s.example/mcp", None)


def test_serve_upstream_flags_replace_the_files_upstreams(tmp_path: Path) -> None:
    many = tmp_path / "many.toml"
    many.write_text(THREE)
    assert [u.name for u in serve_config("--config", str(many), "--upstream", "a=x").named_upstreams()] == ["a"]
    single = serve_config("--config", str(many), "--upstream-cmd", "python s.py")
    assert not single.aggregating and single.upstream.command == ["python", "s.py"]
    one = tmp_path / "one.toml"
    one.write_text("[upstream]\nurl = 'http://h/mcp'\n")
    config = serve_config("--config", str(one), "--upstream", "a=x", "--upstream", "b=y")
    assert config.upstream.url is None and [u.command for u in config.upstreams] == [["x"], ["y"]]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--upstream", "Build=x"], "command line: upstreams.0.name: Value error, 'Build' is not an upstream name"),
        (["--upstream", "a=x", "--upstream", "a=y"], "command line: upstreams.1.name: duplicate upstream name 'a'"),
        (["--upstream", "a="], "command line: upstreams.0: Value error, 'command' must not be empty"),
    ],
)
def test_bad_serve_upstream_flags_are_one_line(argv: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--listen", "127.0.0.1:0", *argv]) == 2
    err = capsys.readouterr().err
    assert error in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--upstream", "build"], "argument --upstream: 'build' is not NAME=CMD_OR_URL"),
        (["--upstream", "a=x", "--upstream-url", "http://h"], "argument --upstream-url: not allowed with argument"),
        (["--upstream-cmd", "x", "--upstream", "a=y"], "argument --upstream: not allowed with argument --upstream-cmd"),
        (["--upstream", "a=python 'x"], 'argument --upstream: "python \'x": No closing quotation'),
    ],
)
def test_malformed_serve_upstream_flags_are_usage_errors(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", *argv])
    assert exited.value.code == 2 and error in capsys.readouterr().err


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    """`python -m gateway check-config PATH`, to its end."""
    command = [sys.executable, "-m", "gateway", "check-config", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_check_config_names_the_key_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        THREE
        + "[[upstreams]]\nname = 'time'\ncommand = 'x'\n[[upstreams]]\nname = 'Bad'\ncommand = 'x'\n"
        + "[server]\nname_separator = '-'\n"
    )
    run = check_config(bad)
    assert run.returncode == 2 and run.stdout == ""
    assert "server.name_separator: Value error, '-' holds only characters an upstream name may hold" in run.stderr
    assert "upstreams.4.name: Value error, 'Bad' is not an upstream name" in run.stderr
    # Field errors come first; fixed, the checks across sections report the duplicate and the reference.
    bad.write_text(
        THREE + "[[upstreams]]\nname = 'time'\ncommand = 'x'\n[[auth.rules]]\nmatch = 'a'\nupstream = 'tim'\n"
    )
    run = check_config(bad)
    assert run.returncode == 2
    assert run.stderr.strip() == (
        f"mcp-task-gateway: {bad}: upstreams.3.name: duplicate upstream name 'time' (upstreams.2 has it); "
        "auth.rules.0.upstream: no upstream named 'tim' (configured: build, everything, time)"
    )


def test_check_config_accepts_many_upstreams(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text(SCOPED)
    assert main(["check-config", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: ok\n"


def test_a_static_header_from_an_environment_variable_is_read_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    http = HttpUpstreamConfig(headers={"X-Team": "tools"}, headers_env={"Authorization": "BUILD_TOKEN"})
    monkeypatch.setenv("BUILD_TOKEN", "Bearer s3cret")
    assert with_env_headers(http, "upstreams.build.http").headers == {
        "X-Team": "tools",
        "Authorization": "Bearer s3cret",
    }
    monkeypatch.delenv("BUILD_TOKEN")
    with pytest.raises(ConfigError, match=r"upstreams\.build\.http\.headers_env\.Authorization: .*BUILD_TOKEN"):
        with_env_headers(http, "upstreams.build.http")
    assert with_env_headers(HttpUpstreamConfig(), "upstream.http") == HttpUpstreamConfig()
