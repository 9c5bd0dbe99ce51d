"""The gateway's configuration: pydantic models for the TOML file. Defaults live here.

Every key is documented with a comment in `config/gateway.example.toml`. Unknown keys are refused so a
typo never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import fnmatch
import shlex
import tomllib
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MiB = 1024 * 1024


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResumeConfig(_Section):
    """How long and how much of each 2025-11-25 SSE stream is kept for a GET with Last-Event-ID."""

    buffer_bytes: int = Field(default=1 * MiB, gt=0)
    """Bytes of events one stream keeps; the oldest go first (the newest stays, however large)."""
    max_age_s: float = Field(default=60.0, gt=0)
    """Events older than this are dropped, and a stream no connection serves is forgotten after it."""
    retry_ms: int = Field(default=1000, ge=0)
    """The `retry` field of priming events: how long a client waits before it resumes."""


class ServerConfig(_Section):
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

    @field_validator("path")
    @classmethod
    def _path_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class StdioConfig(_Section):
    max_processes: int = Field(default=32, gt=0)
    idle_processes: int = Field(default=2, ge=0)
    acquire_timeout_s: float = Field(default=10.0, gt=0)
    line_limit_bytes: int = Field(default=64 * MiB, ge=64 * 1024)
    shutdown_timeout_s: float = Field(default=2.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class HttpUpstreamConfig(_Section):
    headers: dict[str, str] = Field(default_factory=dict)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_reconnects: int = Field(default=2, ge=0)
    max_connections: int = Field(default=100, gt=0)


class ReadinessConfig(_Section):
    """How the upstream's usability (/readyz) is checked: backoff while unusable, re-checks while usable."""

    retry_initial_s: float = Field(default=0.5, gt=0)
    retry_max_s: float = Field(default=30.0, gt=0)
    recheck_interval_s: float = Field(default=30.0, ge=0)

    @model_validator(mode="after")
    def _retry_order(self) -> ReadinessConfig:
        if self.retry_initial_s > self.retry_max_s:
            raise ValueError("retry_initial_s must not exceed retry_max_s")
        return self


class UpstreamAuthConfig(_Section):
    """The gateway's own credential towards an HTTP upstream (never a client's)."""

    mode: Literal["none", "client_credentials"] = "none"
    token_url: str = ""
    """The authorization server's token endpoint."""
    client_id: str = ""
    client_secret_env: str = ""
    """The name of the environment variable holding the client secret."""
    scope: str = ""
    resource: str = ""
    """The RFC 8707 resource the token is asked for; empty: the upstream's URL."""

    @model_validator(mode="after")
    def _complete(self) -> UpstreamAuthConfig:
        if self.mode == "client_credentials" and not (self.token_url and self.client_id and self.client_secret_env):
            raise ValueError('mode = "client_credentials" needs token_url, client_id and client_secret_env')
        return self


class UpstreamConfig(_Section):
    url: str | None = None
    command: list[str] | None = None
    request_timeout_s: float = Field(default=300.0, ge=0)
    """How long the upstream may take to answer a forwarded request before the gateway answers it with
    an error and cancels it upstream (0: no deadline). A `[[tasks.tools]]` entry may override it."""
    stdio: StdioConfig = Field(default_factory=StdioConfig)
    http: HttpUpstreamConfig = Field(default_factory=HttpUpstreamConfig)
    readiness: ReadinessConfig = Field(default_factory=ReadinessConfig)
    auth: UpstreamAuthConfig = Field(default_factory=UpstreamAuthConfig)

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: object) -> object:
        return shlex.split(value) if isinstance(value, str) else value

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
        return self


class EventsConfig(_Section):
    enabled: bool = True
    prefix: str = "io.github.mcp-task-gateway"

    @field_validator("prefix")
    @classmethod
    def _vendor_prefix(cls, value: str) -> str:
        # SEP-2694 reserves unprefixed event types for MCP itself: insist on a dotted namespace.
        labels = value.split(".")
        if len(labels) < 2 or not all(labels) or not all(label.replace("-", "").isalnum() for label in labels):
            raise ValueError("must be a vendor namespace of dot-separated labels, e.g. 'com.example.gateway'")
        return value


class RetentionConfig(_Section):
    max_events_per_task: int = Field(default=10_000, gt=0)
    max_event_age_s: float = Field(default=3600.0, gt=0)
    terminal_retention_s: float = Field(default=600.0, ge=0)
    max_payload_bytes: int = Field(default=65_536, gt=0)
    max_result_bytes: int = Field(default=4 * MiB, gt=0)
    """The largest task result (or error) a task record keeps, serialized; a larger one is replaced by
    an error that says so."""
    results_budget_bytes: int = Field(default=256 * MiB, gt=0)
    """The task results all task records keep together; the oldest are evicted to make room."""

    @model_validator(mode="after")
    def _result_fits_budget(self) -> RetentionConfig:
        if self.max_result_bytes > self.results_budget_bytes:
            raise ValueError("max_result_bytes must not exceed results_budget_bytes")
        return self


class StoreConfig(_Section):
    kind: Literal["memory", "sqlite", "redis"] = "sqlite"
    """Where task records and event logs live. "sqlite" (default): one SQLite file on this host
    (`path`), kept across restarts; "memory": in this process, lost on restart (tests, throw-away
    runs); "redis": in a Redis server (Streams) that several replicas share."""
    path: str = Field(default="data/gateway.db", min_length=1)
    """The SQLite file (kind "sqlite"), relative to the working directory; its directory is created
    on first start."""
    synchronous: Literal["normal", "full"] = "normal"
    """SQLite's `synchronous` (kind "sqlite"): "normal" survives a crash of the process, "full" also
    a power loss (every commit waits for the disk)."""
    url: str = "redis://127.0.0.1:6379/0"
    """kind = "redis": the server (`redis://` or `rediss://`, with user, password and database)."""
    key_prefix: str = Field(default="mcp-task-gateway:", min_length=1)
    """kind = "redis": every key starts with it, so gateways with different prefixes share one server."""
    lease_ttl_s: float = Field(default=15.0, ge=0.5, le=3600.0)
    """kind = "redis": how long a replica's lease of a task it runs lasts without renewal (renewed every
    third of it). A replica that finds a lease expired takes the task over: the owner's death costs its
    tasks up to this long (plus a third, the scan period) before they are failed or watched again."""

    outage_buffer_bytes: int = Field(default=1_048_576, ge=1024)
    """While the store cannot take writes (its server down, its disk full), the events and status changes
    of running tasks are held in memory and retried with backoff, at most this many bytes of them
    together. A task whose write would exceed it, or whose writes are held longer than `outage_hold_s`,
    is failed (`data.reason` "store_unavailable"), written as soon as the store takes writes again."""
    outage_hold_s: float = Field(default=30.0, gt=0, le=3600.0)
    """How long a running task's writes may be held during a store outage before the task is failed."""
    timeout_s: float = Field(default=5.0, gt=0, le=300.0)
    """kind = "redis": how long one command may take before the store counts as unavailable (a paused or
    partitioned server); requests that need the store then get 503."""

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    @field_validator("key_prefix")
    @classmethod
    def _no_hash_tag(cls, value: str) -> str:
        # A brace would change the {t:<id>} hash tag that keeps a task's keys in one cluster slot.
        if "{" in value or "}" in value:
            raise ValueError("must not contain '{' or '}'")
        return value


class CaptureRule(_Section):
    """Turns a matching upstream notification into a task event (or drops it)."""

    method: str
    match: dict[str, str | int | float | bool] = Field(default_factory=dict)
    type: str | None = None
    fields: list[str] | None = None
    payload: Literal["params", "message"] = "params"
    drop: bool = False

    @model_validator(mode="after")
    def _type_unless_drop(self) -> CaptureRule:
        if self.drop and (self.type or self.fields):
            raise ValueError("a rule with drop = true takes no 'type' or 'fields'")
        if not self.drop and not self.type:
            raise ValueError("'type' is required (the event type, appended to [events] prefix)")
        if self.type is not None and (not all(self.type.split(".")) or " " in self.type):
            raise ValueError(f"'type' {self.type!r} must be dot-separated labels without spaces")
        return self


def default_rules() -> list[CaptureRule]:
    return [
        CaptureRule(method="notifications/progress", type="progress", fields=["progress", "total", "message"]),
        CaptureRule(method="notifications/message", type="log"),
        CaptureRule(method="notifications/tasks/partial", type="partial"),
        CaptureRule(method="notifications/tools/partial_result", type="partial_result"),
        CaptureRule(method="notifications/tasks/status", type="upstream.status"),
        CaptureRule(method="*", type="notification", payload="message"),
    ]


TaskSupport = Literal["forbidden", "optional", "required"]
ModernTasks = Literal["never", "always", "after_ms", "required"]

MODERN_FOR_TASK_SUPPORT: dict[str, tuple[ModernTasks, ...]] = {
    "forbidden": ("never",),
    "optional": ("after_ms", "always", "never"),
    "required": ("required",),
}
"""Which `modern` values agree with each `task_support`; the first is the one a policy without `modern` gets."""


class ToolTaskPolicy(_Section):
    """How tools whose name matches `match` (a glob) become tasks, per era, and how long their calls may take.

    The two task keys describe one tool, so they must agree: a tool that is never a task, or must be one,
    is that in both eras. Either key left out follows the other (`required` implies `required`)."""

    match: str = "*"
    task_support: TaskSupport = "optional"
    modern: ModernTasks = "after_ms"
    after_ms: int = Field(default=1000, ge=0)
    input_window_ms: int = Field(default=500, ge=0)
    request_timeout_s: float | None = Field(default=None, ge=0)
    """The deadline of these tools' upstream calls, plain or as a task (0: none); None follows
    `[upstream] request_timeout_s`."""

    @model_validator(mode="before")
    @classmethod
    def _one_key_implies_the_other(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        support = data.get("task_support")
        if "modern" not in data and isinstance(support, str) and support in MODERN_FOR_TASK_SUPPORT:
            return {**data, "modern": MODERN_FOR_TASK_SUPPORT[support][0]}
        if "task_support" not in data and data.get("modern") == "required":
            return {**data, "task_support": "required"}
        return data

    @model_validator(mode="after")
    def _eras_agree(self) -> ToolTaskPolicy:
        allowed = MODERN_FOR_TASK_SUPPORT[self.task_support]
        if self.modern not in allowed:
            choices = " | ".join(repr(value) for value in allowed)
            raise ValueError(
                f"tool {self.match!r}: task_support = {self.task_support!r} (2025-11-25) and modern = "
                f"{self.modern!r} (2026-07-28) contradict each other; with this task_support, modern must be "
                f"{choices} (or left out)"
            )
        return self


UNMATCHED_TOOL = ToolTaskPolicy(task_support="forbidden")
"""The policy of a tool no `[[tasks.tools]]` entry matches."""


class TasksConfig(_Section):
    tools: list[ToolTaskPolicy] = Field(default_factory=lambda: [ToolTaskPolicy()])
    default_ttl_ms: int = Field(default=3_600_000, gt=0)
    max_ttl_ms: int = Field(default=86_400_000, gt=0)
    poll_interval_ms: int = Field(default=1000, gt=0)
    max_tasks_per_owner: int = Field(default=1000, gt=0)
    max_tasks_total: int = Field(default=10_000, gt=0)
    page_size: int = Field(default=50, gt=0)
    max_streams_per_task: int = Field(default=1000, gt=0)
    max_streams_total: int = Field(default=1000, gt=0)
    stream_write_timeout_s: float = Field(default=30.0, gt=0)
    replay_batch: int = Field(default=256, gt=0)
    stream_flush_interval_ms: float = Field(default=20.0, ge=0)
    upstream_poll_min_ms: int = Field(default=250, gt=0)
    upstream_poll_max_ms: int = Field(default=30_000, gt=0)

    def policy_for(self, tool: object) -> ToolTaskPolicy:
        """The first `tools` entry whose `match` fits the tool's name; a tool none fits is never a task."""
        name = tool if isinstance(tool, str) else ""
        for policy in self.tools:
            if fnmatch.fnmatchcase(name, policy.match):
                return policy
        return UNMATCHED_TOOL

    @model_validator(mode="after")
    def _ttl_order(self) -> TasksConfig:
        if self.default_ttl_ms > self.max_ttl_ms:
            raise ValueError("default_ttl_ms must not exceed max_ttl_ms")
        if self.upstream_poll_min_ms > self.upstream_poll_max_ms:
            raise ValueError("upstream_poll_min_ms must not exceed upstream_poll_max_ms")
        return self


AuthMode = Literal["none", "api_key", "oauth"]


class JwtConfig(_Section):
    """mode = "oauth" with JWT access tokens, validated locally against the issuer's keys."""

    issuer: str = ""
    """The `iss` every token must carry (exactly)."""
    jwks_uri: str = ""
    """The issuer's key set; empty: discovered from `<issuer>/.well-known/oauth-authorization-server`
    (then `openid-configuration`)."""
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"], min_length=1)
    """The signature algorithms accepted; `none` and HMAC ones are refused here (the keys are public)."""
    audiences: list[str] = Field(default_factory=list)
    """Audiences accepted besides `[auth] resource`."""
    leeway_s: float = Field(default=30.0, ge=0)
    """Clock skew tolerated on `exp` and `nbf`."""
    jwks_cache_s: float = Field(default=3600.0, gt=0)
    """How long a fetched key set is used before it is fetched again (the last good one serves on)."""
    unknown_kid_refresh_min_s: float = Field(default=60.0, ge=0)
    """A token with a `kid` the key set lacks refetches it at most this often."""
    jwks_timeout_s: float = Field(default=2.0, gt=0)
    """The longest a fetch of the key set may take (a token waiting on it waits no longer)."""

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, value: list[str]) -> list[str]:
        allowed = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
        refused = [name for name in value if name not in allowed]
        if refused:
            raise ValueError(f"{refused} not allowed; use asymmetric algorithms from {sorted(allowed)}")
        return value


class IntrospectionConfig(_Section):
    """mode = "oauth" with opaque tokens checked by RFC 7662 introspection (used when `endpoint` is set)."""

    endpoint: str = ""
    client_id: str = ""
    client_secret_env: str = ""
    """The name of the environment variable that holds the client secret (never the secret itself)."""


ClaimValue = str | bool | int
"""What a claim condition of `[[auth.rules]]` compares with: a string, a boolean or an integer."""


def check_claims(claims: object, *, lists: bool) -> object:
    """One clear error for a claims table whose values are not ClaimValues (or, with `lists`, lists of them)."""
    if not isinstance(claims, dict):
        return claims
    for name, value in claims.items():
        values = value if lists and isinstance(value, list) else [value]
        if not name or not all(isinstance(item, str | bool | int) for item in values):
            kinds = "a string, boolean or integer" + (", or a list of them" if lists else "")
            raise ValueError(f"claim {name!r}: needs a name and {kinds}, not {value!r}")
    return claims


class ApiKey(_Section):
    """One key of mode = "api_key": its name (the principal) and the sha256 of the key, never the key."""

    name: str = Field(min_length=1)
    sha256: str
    scopes: list[str] = Field(default_factory=list)
    claims: dict[str, ClaimValue | list[ClaimValue]] = Field(default_factory=dict)
    """The claims the key's caller carries for `[[auth.rules]]` claim conditions, as a token would."""

    @field_validator("claims", mode="before")
    @classmethod
    def _claim_values(cls, value: object) -> object:
        return check_claims(value, lists=True)

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        digest = value.lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError("must be the 64 hex digits of the key's sha256 (sha256sum of the key)")
        return digest


class AuthRule(_Section):
    """Per-tool policy: the first rule whose `match` (a glob) fits the tool's name applies."""

    match: str = Field(min_length=1)
    scopes: list[str] = Field(default_factory=list)
    """Every scope the caller needs to call the tool (or create a task with it)."""
    claims: dict[str, ClaimValue] = Field(default_factory=dict)
    """Claim conditions, every one of which must hold: the caller's claim equals the value or, when
    the claim is a list, contains it (of the same JSON type: "1" is not 1)."""
    hide: bool = True
    """Hide the tool from tools/list when the caller lacks the scopes or fails a claim condition. On by
    default: a caller is shown only what it may call. False suits a scope obtained by step-up (a client
    steps up only on a tool it has seen and called)."""
    requests_per_s: float | None = Field(default=None, gt=0)
    """With `burst`: each principal's calls of each tool the rule matches, a token bucket of its own
    (besides `[auth.limits]`)."""
    burst: int | None = Field(default=None, gt=0)

    @field_validator("claims", mode="before")
    @classmethod
    def _claim_values(cls, value: object) -> object:
        # One value per condition: a list here would raise "any of them, or all?"; write two rules.
        return check_claims(value, lists=False)

    @model_validator(mode="after")
    def _rate_and_burst(self) -> AuthRule:
        if (self.requests_per_s is None) != (self.burst is None):
            raise ValueError(f"rule {self.match!r}: set both requests_per_s and burst, or neither")
        return self


class AuthLimits(_Section):
    """Per-principal limits, enforced with mode = "api_key" or "oauth" (`gateway.edge.limits`)."""

    requests_per_s: float = Field(default=50.0, gt=0)
    burst: int = Field(default=100, gt=0)
    failed_lookups_per_min: int = Field(default=60, gt=0)
    max_streams: int = Field(default=100, gt=0)
    max_sessions: int = Field(default=8, gt=0)
    """Legacy sessions open at once (each holds an upstream process on stdio): a quarter of the default
    `[upstream.stdio] max_processes`, so one caller cannot take the pool."""


class AuthConfig(_Section):
    mode: AuthMode = "none"
    resource: str = ""
    """The gateway's canonical URL (required for oauth): the audience tokens must carry, and the
    `resource` of the protected-resource metadata."""
    authorization_servers: list[str] = Field(default_factory=list)
    """Advertised in the protected-resource metadata byte-for-byte (a trailing `/` matters to clients)."""
    scopes_supported: list[str] = Field(default_factory=list)
    allow_unauthenticated: bool = False
    """Needed to listen beyond loopback with mode = "none"."""
    principal_claims: list[str] = Field(default_factory=lambda: ["iss", "sub"], min_length=1)
    """The token claims that together name the principal (mode = "oauth")."""
    principal_key_env: str = ""
    """The environment variable holding the key of the principals' keyed hash; empty: a random key kept in
    the store (drawn once: the same after a restart and on every replica), per process on the memory store."""
    token_cache_s: float = Field(default=300.0, ge=0)
    """A validated token is trusted again without checking for min(its exp, this long)."""
    jwt: JwtConfig = Field(default_factory=JwtConfig)
    introspection: IntrospectionConfig = Field(default_factory=IntrospectionConfig)
    api_keys: list[ApiKey] = Field(default_factory=list)
    rules: list[AuthRule] = Field(default_factory=list)
    limits: AuthLimits = Field(default_factory=AuthLimits)

    @model_validator(mode="after")
    def _mode_complete(self) -> AuthConfig:
        if self.mode == "api_key":
            if not self.api_keys:
                raise ValueError('mode = "api_key" needs at least one [[auth.api_keys]] entry')
            names = [key.name for key in self.api_keys]
            if len(set(names)) != len(names):
                raise ValueError("[[auth.api_keys]] names must be unique (each names a principal)")
        if self.mode == "oauth":
            if not self.resource.startswith(("http://", "https://")):
                raise ValueError('mode = "oauth" needs resource = the gateway\'s canonical http(s) URL')
            if not self.authorization_servers:
                raise ValueError('mode = "oauth" needs at least one authorization_servers entry')
            if not (self.jwt.issuer or self.introspection.endpoint):
                raise ValueError('mode = "oauth" needs [auth.jwt] issuer or [auth.introspection] endpoint')
        return self

    def rule_for(self, tool: object) -> AuthRule | None:
        """The first rule whose `match` fits the tool's name; None: the tool is open to every caller."""
        name = tool if isinstance(tool, str) else ""
        return next((rule for rule in self.rules if fnmatch.fnmatchcase(name, rule.match)), None)

    @property
    def rule_claims(self) -> frozenset[str]:
        """The claims some rule has a condition on: all a principal needs to carry of its token."""
        return frozenset(name for rule in self.rules for name in rule.claims)


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "human"] = "auto"
    rejected_log_interval_s: float = Field(default=60.0, ge=0)


class Config(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    rules: list[CaptureRule] = Field(default_factory=default_rules)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)


class ConfigError(Exception):
    """A config file that cannot be used; the message names the key and the reason."""


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def url_host(host: str) -> str:
    """`host` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def load_config(path: str | Path | None) -> Config:
    """Read and validate a TOML config file; None gives the defaults."""
    if path is None:
        return Config()
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {describe_errors(exc)}") from None


def describe_errors(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
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
