"""The config file as a whole: the top-level `Config` of every section (and of every upstream), reading
and validating a TOML file, and the one-line error that names the bad key (with the closest known key
for a typo)."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, model_validator

from gateway.config.auth import AuthConfig
from gateway.config.events import CaptureRule, EventsConfig, default_rules
from gateway.config.logging import LoggingConfig
from gateway.config.retention import RetentionConfig
from gateway.config.section import Section
from gateway.config.server import ServerConfig
from gateway.config.store import StoreConfig
from gateway.config.tasks import TasksConfig
from gateway.config.telemetry import TelemetryConfig
from gateway.config.ui import UiConfig, ui_problems
from gateway.config.upstream import UpstreamConfig
from gateway.config.upstreams import KeyProblems, require_entry_names, route_config, upstream_problems


class Config(Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    """`[[upstreams]]`: several named upstreams, each on `/servers/NAME/mcp` and together at `[server]
    path`; empty: the single `[upstream]`."""
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    rules: list[CaptureRule] = Field(default_factory=default_rules)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    ui: UiConfig = Field(default_factory=UiConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @model_validator(mode="before")
    @classmethod
    def _entries_named(cls, data: object) -> object:
        return require_entry_names(data)

    @model_validator(mode="after")
    def _upstreams_consistent(self) -> Config:
        problems = upstream_problems(self) + ui_problems(self)
        if problems:
            raise KeyProblems(problems)
        return self

    @model_validator(mode="after")
    def _callers_have_tokens(self) -> Config:
        exchanging = [upstream.name for upstream in self.named_upstreams() if upstream.auth.mode == "token_exchange"]
        if exchanging and self.auth.mode != "oauth":
            raise ValueError(
                f'upstream {exchanging[0]!r}: auth.mode = "token_exchange" needs [auth] mode = "oauth" '
                "(the caller's validated access token is what is exchanged)"
            )
        return self

    @property
    def exchanges_caller_tokens(self) -> bool:
        """Some upstream acts for the caller (`token_exchange`): the edge hands the caller down with each call."""
        return any(upstream.auth.mode == "token_exchange" for upstream in self.named_upstreams())

    def named_upstreams(self) -> list[UpstreamConfig]:
        """Every upstream, in the file's order: the `[[upstreams]]` entries, or the single `[upstream]`
        (named `default`)."""
        return list(self.upstreams) if self.upstreams else [self.upstream]

    @property
    def aggregating(self) -> bool:
        """`[[upstreams]]` is given: each upstream is served on its own path and all together at `[server]
        path`, their tools and prompts prefixed with their names."""
        return bool(self.upstreams)

    def for_route(self, name: str | None) -> Config:
        """The config the stack of one endpoint is built from: upstream `name`'s, or (None) the one at
        `[server] path` (see `route_config`). KeyError for a name no upstream has."""
        return route_config(self, name)


class ConfigError(Exception):
    """A config file that cannot be used; the message names the key and the reason."""


class ConfigUnreadable(ConfigError):
    """The config file cannot be read at all (missing, not permitted)."""


def load_config(path: str | Path | None) -> Config:
    """Read and validate a TOML config file; None gives the defaults."""
    if path is None:
        return Config()
    return parse_config(read_config_bytes(path), path)


def read_config_bytes(path: str | Path) -> bytes:
    """The config file's bytes; ConfigUnreadable saying why not."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ConfigUnreadable(f"{path}: cannot read: {exc.strerror}") from None


def parse_config(data: bytes, path: str | Path) -> Config:
    """Validate the bytes of the config file at `path` (named in the error)."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {describe_errors(exc)}") from None


def describe_errors(exc: ValidationError) -> str:
    parts: list[str] = []
    for error in exc.errors():
        problem = error.get("ctx", {}).get("error")
        if isinstance(problem, KeyProblems):  # a check across sections: it names its keys itself
            parts.extend(f"{key}: {reason}" for key, reason in problem.problems)
            continue
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        reason = unknown_key(error["loc"]) if error["type"] == "extra_forbidden" else error["msg"]
        parts.append(f"{key}: {reason}")
    return "; ".join(parts)


def unknown_key(loc: tuple[int | str, ...]) -> str:
    """The reason for an unknown key: with the closest key of its section when one is close (a typo)."""
    section: type[BaseModel] | None = Config
    for part in loc[:-1]:  # down the sections the key sits in; a list's index stays in the same model
        if section is None or isinstance(part, int):
            continue
        field = section.model_fields.get(part)
        section = _model_in(field.annotation) if field is not None else None
    if section is None:
        return "unknown key"
    close = difflib.get_close_matches(str(loc[-1]), list(section.model_fields), n=1)
    return f"unknown key (did you mean `{close[0]}`?)" if close else "unknown key"


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The section model a field holds: itself, or the item of a list of them (None for plain values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        return _model_in(item)
    return None
