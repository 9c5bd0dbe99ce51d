"""`[upstream]` and each `[[upstreams]]` entry: one MCP server behind the gateway, its name, over stdio
(`[upstream.stdio]`) or HTTP (`[upstream.http]`, `[upstream.auth]`), and how its readiness is checked
(`[upstream.readiness]`). Which upstreams a file configures, and their cross-checks, are `upstreams.py`'s."""

from __future__ import annotations

import re
import shlex
import string
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.config.section import MiB, Section

UPSTREAM_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
"""An upstream's name: it goes into paths (`/servers/NAME/mcp`), metric labels and prefixed tool names."""
UPSTREAM_NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "-")
DEFAULT_UPSTREAM = "default"
"""The name of the single `[upstream]`."""


class StdioConfig(Section):
    max_processes: int = Field(default=32, gt=0)
    idle_processes: int = Field(default=2, ge=0)
    acquire_timeout_s: float = Field(default=10.0, gt=0)
    line_limit_bytes: int = Field(default=64 * MiB, ge=64 * 1024)
    shutdown_timeout_s: float = Field(default=2.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class HttpUpstreamConfig(Section):
    headers: dict[str, str] = Field(default_factory=dict)
    headers_env: dict[str, str] = Field(default_factory=dict)
    """Header name -> the environment variable holding its value (a static credential kept out of the
    file, e.g. `Authorization = "BUILD_TOKEN"` with `BUILD_TOKEN="Bearer ..."`), read at start."""
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_reconnects: int = Field(default=2, ge=0)
    max_connections: int = Field(default=100, gt=0)


class ReadinessConfig(Section):
    """How the upstream's usability (/readyz) is checked: backoff while unusable, re-checks while usable."""

    retry_initial_s: float = Field(default=0.5, gt=0)
    retry_max_s: float = Field(default=30.0, gt=0)
    recheck_interval_s: float = Field(default=30.0, ge=0)

    @model_validator(mode="after")
    def _retry_order(self) -> ReadinessConfig:
        if self.retry_initial_s > self.retry_max_s:
            raise ValueError("retry_initial_s must not exceed retry_max_s")
        return self


ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
"""RFC 8693's token type of an OAuth access token: what a caller presents, and what is asked for by default."""


class UpstreamAuthConfig(Section):
    """The credential an HTTP upstream gets: the gateway's own, or one acting for the caller (never the
    caller's own token)."""

    mode: Literal["none", "client_credentials", "token_exchange"] = "none"
    token_url: str = ""
    """The authorization server's token endpoint."""
    client_id: str = ""
    client_secret_env: str = ""
    """The name of the environment variable holding the client secret."""
    scope: str = ""
    resource: str = ""
    """The RFC 8707 resource the token is asked for; empty: the upstream's URL."""
    audience: str = ""
    """token_exchange: the RFC 8693 `audience` asked for as well (empty: none; `resource` names the upstream)."""
    requested_token_type: str = ACCESS_TOKEN_TYPE
    """token_exchange: the RFC 8693 `requested_token_type`."""
    no_caller: Literal["client_credentials", "none"] = "client_credentials"
    """token_exchange: what a call with no caller (the gateway's own: readiness checks, list refreshes,
    task polls after a restart) sends: the gateway's own client-credentials token, or no Authorization."""
    exchanged_tokens: int = Field(default=10_000, gt=0)
    """token_exchange: exchanged tokens cached at once (one per caller); the least recently used goes."""

    @model_validator(mode="after")
    def _complete(self) -> UpstreamAuthConfig:
        if self.mode != "none" and not (self.token_url and self.client_id and self.client_secret_env):
            raise ValueError(f'mode = "{self.mode}" needs token_url, client_id and client_secret_env')
        return self


class BridgeConfig(Section):
    """How the gateway carries a client of one era to an upstream that speaks only the other."""

    max_sessions: int = Field(default=64, gt=0)
    """Upstream legacy sessions held for 2026-07-28 clients at once (one per principal and declared
    client capabilities); the least recently used idle one is closed to make room."""
    session_idle_s: float = Field(default=300.0, gt=0)
    """A bridged upstream session that carried no request for this long is closed."""
    input_timeout_s: float = Field(default=300.0, gt=0)
    """How long an upstream call waits, held, for the client's MRTR retry with `inputResponses`; past
    it the call is cancelled upstream and its `requestState` expires."""


class UpstreamConfig(Section):
    name: str = DEFAULT_UPSTREAM
    """Required in an `[[upstreams]]` entry; the single `[upstream]` is always `default`."""
    url: str | None = None
    command: list[str] | None = None
    era: Literal["auto", "legacy", "modern"] = "auto"
    """The protocol era the upstream speaks. auto: learnt (`server/discover`, then `initialize`);
    legacy: 2025-11-25 only, so 2026-07-28 clients are bridged; modern: 2026-07-28 only, so 2025-11-25
    clients are bridged."""
    request_timeout_s: float = Field(default=300.0, ge=0)
    """How long the upstream may take to answer a forwarded request before the gateway answers it with
    an error and cancels it upstream (0: no deadline). A `[[tasks.tools]]` entry may override it."""
    stdio: StdioConfig = Field(default_factory=StdioConfig)
    http: HttpUpstreamConfig = Field(default_factory=HttpUpstreamConfig)
    readiness: ReadinessConfig = Field(default_factory=ReadinessConfig)
    auth: UpstreamAuthConfig = Field(default_factory=UpstreamAuthConfig)
    bridge: BridgeConfig = Field(default_factory=BridgeConfig)

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: object) -> object:
        return shlex.split(value) if isinstance(value, str) else value

    @field_validator("name")
    @classmethod
    def _name_pattern(cls, value: str) -> str:
        if not UPSTREAM_NAME.match(value):
            raise ValueError(
                f"{value!r} is not an upstream name: it must match {UPSTREAM_NAME.pattern} (lowercase letters, "
                "digits and '-', at most 32, not starting with '-')"
            )
        return value

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> UpstreamConfig:
        if self.url and self.command:
            raise ValueError("set either 'url' or 'command', not both")
        if self.command is not None and not self.command:
            raise ValueError("'command' must not be empty")
        if self.command and self.auth.mode == "token_exchange":
            raise ValueError('auth.mode = "token_exchange" needs an HTTP upstream (url); a stdio one gets no token')
        return self
