"""`[server]`: the client-facing listener, its HTTP limits and timeouts, TLS, the legacy resume buffer
(`[server.resume]`), and how the aggregate of many upstreams names their tools and reports readiness."""

from __future__ import annotations

import string
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.config.listen import parse_listen
from gateway.config.section import MiB, Section
from gateway.config.upstream import UPSTREAM_NAME_CHARS

TOOL_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
"""The characters a tool name may hold (SEP-986): a separator must keep prefixed names valid."""


class ResumeConfig(Section):
    """How long and how much of each 2025-11-25 SSE stream is kept for a GET with Last-Event-ID."""

    buffer_bytes: int = Field(default=1 * MiB, gt=0)
    """Bytes of events one stream keeps; the oldest go first (the newest stays, however large)."""
    max_age_s: float = Field(default=60.0, gt=0)
    """Events older than this are dropped, and a stream no connection serves is forgotten after it."""
    retry_ms: int = Field(default=1000, ge=0)
    """The `retry` field of priming events: how long a client waits before it resumes."""


class ServerConfig(Section):
    listen: str = "127.0.0.1:8765"
    path: str = "/mcp"
    allowed_hosts: list[str] = Field(default_factory=lambda: ["127.0.0.1:*", "localhost:*", "[::1]:*"])
    allowed_origins: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    )
    max_body_bytes: int = Field(default=4 * MiB, gt=0)
    # Capped well below the ~250 levels at which orjson cannot serialize a message and SDK servers drop it.
    max_json_depth: int = Field(default=64, ge=8, le=128)
    keepalive_s: float = Field(default=15.0, gt=0)
    max_sessions: int = Field(default=1000, gt=0)
    session_idle_timeout_s: float = Field(default=1800.0, gt=0)
    session_handshake_timeout_s: float = Field(default=30.0, gt=0)
    """A session that made no request after initialize is closed this soon (it holds a stdio process)."""
    session_process_idle_s: float = Field(default=0.0, ge=0)
    """An idle session's stdio process is stopped after this long (replayed handshake on its next
    request); 0: never, the process lives as long as the session."""
    retry_after_s: int = Field(default=5, gt=0)
    """`Retry-After` of every 503 sent because a ceiling or `buffered_bytes_budget` is reached."""
    exchange_capacity: int = Field(default=1024, gt=0)
    stream_buffer_bytes: int = Field(default=4 * MiB, gt=0)
    buffered_bytes_budget: int = Field(default=1024 * MiB, gt=0)
    write_timeout_s: float = Field(default=30.0, gt=0)
    initialize_timeout_s: float = Field(default=30.0, gt=0)
    flush_interval_ms: float = Field(default=2.0, ge=0)
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection must send a whole request head (request line and headers) within this long of
    opening, or of its previous response; else it is closed (before any authentication)."""
    min_body_rate_bytes_s: int = Field(default=1024, gt=0)
    """A request body must arrive at this average rate or faster, after a grace of `header_timeout_s`;
    a slower one gets 408 and its connection is closed."""
    max_connections: int = Field(default=4096, gt=0)
    """Client connections held at once; a connection beyond it gets 503 and is closed at once."""
    resume: ResumeConfig = Field(default_factory=ResumeConfig)
    tls_cert: str = ""
    """A PEM certificate (chain): the gateway serves HTTPS itself when set (with `tls_key`)."""
    tls_key: str = ""
    """The PEM private key of `tls_cert`."""
    metrics_listen: str = ""
    """HOST:PORT of a listener of its own serving only /metrics (plain HTTP; the main listener then
    answers 404 for it); empty: /metrics is served on `listen`."""
    ready_when: Literal["any", "all"] = "any"
    """With `[[upstreams]]`: /readyz answers 200 while any upstream is usable, or only while all are."""
    name_separator: str = "__"
    """With `[[upstreams]]`: what joins an upstream's name and a tool's (or prompt's) name at `path`."""
    drain_timeout_s: float = Field(default=25.0, ge=0)
    """After SIGTERM, how long the requests in flight may take to end before the gateway stops them and
    hands its tasks over (`gateway.drain`); below Kubernetes' default 30 s grace period."""

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("set both tls_cert and tls_key, or neither")
        return self

    @model_validator(mode="after")
    def _metrics_apart(self) -> ServerConfig:
        if not self.metrics_listen:
            return self
        host, port = parse_listen(self.metrics_listen)
        if port != 0 and (host, port) == parse_listen(self.listen):  # port 0: any free port, never the same
            raise ValueError(f"metrics_listen {self.metrics_listen!r} must differ from listen {self.listen!r}")
        return self

    @field_validator("listen")
    @classmethod
    def _listen_has_port(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen_empty_or_has_port(cls, value: str) -> str:
        if value:
            parse_listen(value)
        return value

    @field_validator("name_separator")
    @classmethod
    def _separator_splits_names(cls, value: str) -> str:
        if not 1 <= len(value) <= 8 or not set(value) <= TOOL_NAME_CHARS:
            raise ValueError(f"{value!r} must be 1 to 8 of the characters a tool name may hold: A-Z a-z 0-9 _ . -")
        # A character no upstream name holds marks where the name ends; without one, upstream `a-b` with
        # tool `c` and upstream `a` with tool `b-c` are both `a-b-c` (with separator "-").
        if set(value) <= UPSTREAM_NAME_CHARS:
            raise ValueError(
                f"{value!r} holds only characters an upstream name may hold (a-z 0-9 -), so two upstreams' "
                "prefixed names could collide: include one of A-Z _ ."
            )
        return value

    @field_validator("path")
    @classmethod
    def _path_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value
