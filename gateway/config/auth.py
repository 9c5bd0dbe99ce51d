"""`[auth]`: how clients authenticate (api keys, OAuth JWT or introspection), the per-tool rules and the
per-principal limits."""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.config.section import Section

AuthMode = Literal["none", "api_key", "oauth"]


class JwtConfig(Section):
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


class IntrospectionConfig(Section):
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


class ApiKey(Section):
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


class AuthRule(Section):
    """Per-tool policy: the first rule whose `match` (a glob) fits the tool's name applies."""

    match: str = Field(min_length=1)
    upstream: str | None = None
    """With `[[upstreams]]`: the rule applies only to this upstream's tools, on its own path (`match` as
    the upstream names the tool) and at `[server] path` (`match` behind its prefix). None: every path."""
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


class AuthLimits(Section):
    """Per-principal limits, enforced with mode = "api_key" or "oauth" (`gateway.edge.limits`)."""

    requests_per_s: float = Field(default=50.0, gt=0)
    burst: int = Field(default=100, gt=0)
    failed_lookups_per_min: int = Field(default=60, gt=0)
    max_streams: int = Field(default=100, gt=0)
    max_sessions: int = Field(default=8, gt=0)
    """Legacy sessions open at once (each holds an upstream process on stdio): a quarter of the default
    `[upstream.stdio] max_processes`, so one caller cannot take the pool."""


class AuthConfig(Section):
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
