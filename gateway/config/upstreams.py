"""Many upstreams in one config: the checks that span sections (names unique, one form of upstream, every
`upstream = "NAME"` naming one), and the config each endpoint's stack is built from (`route_config`).

The checks report the key they are about (`upstreams.2.name: …`) through `KeyProblems`, which
`describe_errors` spells out; they never look at anything beyond the config itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from gateway.config.auth import AuthRule
from gateway.config.events import CaptureRule
from gateway.config.tasks import ToolTaskPolicy
from gateway.config.upstream import DEFAULT_UPSTREAM, UPSTREAM_NAME, UpstreamConfig

if TYPE_CHECKING:
    from gateway.config.file import Config

SINGLE_UPSTREAM = UpstreamConfig()
"""`[upstream]` left out: what it must be when `[[upstreams]]` configures the upstreams."""

Scoped = TypeVar("Scoped", AuthRule, ToolTaskPolicy, CaptureRule)
"""An entry that `upstream = "NAME"` may scope to one upstream."""
Matching = TypeVar("Matching", AuthRule, ToolTaskPolicy)
"""A scoped entry whose `match` is a glob on tool names."""


class KeyProblems(ValueError):
    """Problems a validator found, each with the dotted key it is about (a validator on the whole config
    would otherwise report them at the top level, naming no key)."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{key}: {reason}" for key, reason in self.problems))


def require_entry_names(data: object) -> object:
    """The raw file's `[[upstreams]]` entries each name their upstream (the default name is the single
    `[upstream]`'s); checked before validation, which would give a nameless entry that default."""
    entries = data.get("upstreams") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return data
    nameless = [index for index, entry in enumerate(entries) if isinstance(entry, dict) and "name" not in entry]
    if nameless:
        reason = f"required in an [[upstreams]] entry (matching {UPSTREAM_NAME.pattern})"
        raise KeyProblems([(f"upstreams.{index}.name", reason) for index in nameless])
    return data


def upstream_problems(config: Config) -> list[tuple[str, str]]:
    """What is wrong with the config's upstreams and the references to them, each with its key."""
    if config.upstreams:
        problems = _single_form_left_out(config.upstream) + _entries_complete(config)
    elif config.upstream.name != DEFAULT_UPSTREAM:
        problems = [
            ("upstream.name", f"the single [upstream] is {DEFAULT_UPSTREAM!r}; name upstreams in [[upstreams]]")
        ]
    else:
        problems = []
    return problems + _unknown_references(config)


def _single_form_left_out(upstream: UpstreamConfig) -> list[tuple[str, str]]:
    # Its settings would silently apply to nothing: the entries carry their own.
    reason = "[upstream] and [[upstreams]] are two forms, not one: with [[upstreams]], set it in each entry"
    return [
        (f"upstream.{key}", reason)
        for key in UpstreamConfig.model_fields
        if getattr(upstream, key) != getattr(SINGLE_UPSTREAM, key)
    ]


def _entries_complete(config: Config) -> list[tuple[str, str]]:
    problems = []
    first_with: dict[str, int] = {}
    for index, upstream in enumerate(config.upstreams):
        if not (upstream.url or upstream.command):
            problems.append((f"upstreams.{index}", "set 'url' or 'command'"))
        if upstream.name in first_with:
            where = f"upstreams.{first_with[upstream.name]}"
            problems.append((f"upstreams.{index}.name", f"duplicate upstream name {upstream.name!r} ({where} has it)"))
        first_with.setdefault(upstream.name, index)
        if config.server.path == upstream_path(upstream.name):
            problems.append(("server.path", f"{config.server.path!r} is upstream {upstream.name!r}'s own endpoint"))
    return problems


def upstream_path(name: str) -> str:
    """The endpoint of one upstream of `[[upstreams]]`, served beside the aggregate at `[server] path`."""
    return f"/servers/{name}/mcp"


def _unknown_references(config: Config) -> list[tuple[str, str]]:
    names = list(dict.fromkeys(upstream.name for upstream in config.named_upstreams()))
    scoped: list[tuple[str, Sequence[AuthRule | ToolTaskPolicy | CaptureRule]]] = [
        ("auth.rules", config.auth.rules),
        ("tasks.tools", config.tasks.tools),
        ("rules", config.rules),
    ]
    return [
        (f"{key}.{index}.upstream", f"no upstream named {entry.upstream!r} (configured: {', '.join(names)})")
        for key, entries in scoped
        for index, entry in enumerate(entries)
        if entry.upstream is not None and entry.upstream not in names
    ]


def route_config(config: Config, name: str | None) -> Config:
    """The config of one endpoint: upstream `name`'s own, or (None) the aggregate's at `[server] path`.

    An upstream's: `upstream` is its `UpstreamConfig`; auth rules, task policies and capture rules are
    those for every upstream or scoped to it, in their order. The aggregate's: every upstream's auth rules
    and task policies, a scoped one's `match` behind the prefix its upstream's tools carry there; capture
    rules only those for every upstream (a scoped one applies on its upstream's path); `upstream` is the
    first upstream (the aggregate reads each upstream's settings from `named_upstreams()`). With the single
    `[upstream]` there is no aggregate: None is its one endpoint, `default`. `upstreams` stays whole."""
    if name is None and not config.aggregating:
        name = DEFAULT_UPSTREAM
    if name is None:
        separator = config.server.name_separator
        return config.model_copy(
            update={
                "upstream": config.upstreams[0],
                "auth": config.auth.model_copy(update={"rules": _prefixed(config.auth.rules, separator)}),
                "tasks": config.tasks.model_copy(update={"tools": _prefixed(config.tasks.tools, separator)}),
                "rules": [rule for rule in config.rules if rule.upstream is None],
            }
        )
    upstream = next((upstream for upstream in config.named_upstreams() if upstream.name == name), None)
    if upstream is None:
        raise KeyError(f"no upstream named {name!r}")
    return config.model_copy(
        update={
            "upstream": upstream,
            "auth": config.auth.model_copy(update={"rules": _scoped_to(config.auth.rules, name)}),
            "tasks": config.tasks.model_copy(update={"tools": _scoped_to(config.tasks.tools, name)}),
            "rules": _scoped_to(config.rules, name),
        }
    )


def _scoped_to(entries: list[Scoped], name: str) -> list[Scoped]:
    return [entry for entry in entries if entry.upstream in (None, name)]


def _prefixed(entries: list[Matching], separator: str) -> list[Matching]:
    # Names and separators hold no glob characters, so the prefix matches only that upstream's tools.
    return [
        entry
        if entry.upstream is None
        else entry.model_copy(update={"match": entry.upstream + separator + entry.match})
        for entry in entries
    ]
