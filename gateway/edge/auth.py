"""Who is calling: the edge turns a request's credentials into a `Principal`, once, applies the
per-tool `[[auth.rules]]` to it, and answers the refusals (401, 403) with their `WWW-Authenticate`
challenges where re-authorizing can help.

A principal is a keyed hash (HMAC-SHA256 under `[auth] principal_key_env`) of who the caller is (an api
key's name, or a token's `principal_claims`) plus the scopes it holds and the claims the rules have
conditions on (from the token, or the api key's `claims`; nothing more of the token). Only the hash
travels below the edge, as the `owner` of the `TaskCall`: tasks and sessions are bound to it.
Credentials are read from `Authorization: Bearer` only; a token in the query string is refused. The
RFC 9728 protected-resource metadata document is served from here too. Token validation for
mode = "oauth" lives in `gateway.edge.tokens`; the per-tool rates in `gateway.edge.limits`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from aiohttp import web

from gateway.config import AuthConfig, AuthRule, ClaimValue, ConfigError
from gateway.edge.responder import json_response
from gateway.principal import ANONYMOUS_PRINCIPAL
from gateway.principal import Principal as Principal  # the edge makes it; re-exported for its callers
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, ProtocolError

METADATA_PATH = "/.well-known/oauth-protected-resource"
QUERY_TOKEN_NAMES = frozenset({"access_token", "token", "api_key", "apikey", "key"})
"""Query parameters that carry a credential: refused, since URLs end up in logs and Referer headers."""
TOKEN_SYNTAX = re.compile(r"[\x21-\x7e]+")
"""A credential is visible ASCII (RFC 6750's b64token is a subset): anything else is refused unread."""
UNQUOTABLE = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")
"""What RFC 6750 forbids in an `error_description` (controls, `"`, `\\`, non-ASCII): replaced."""
MAX_DESCRIPTION_CHARS = 200


class ValidatedToken(NamedTuple):
    """What an accepted oauth access token says of its caller."""

    identity: str
    """Who the caller is, before hashing (its `principal_claims` joined)."""
    scopes: frozenset[str]
    claims: Mapping[str, Any]
    """The token's claims that `[[auth.rules]]` have conditions on."""


TokenValidator = Callable[[str], Awaitable[ValidatedToken]]
"""Validates an oauth access token; raises `InvalidToken` with the reason."""


class InvalidToken(Exception):
    """A presented token that cannot be accepted; the message says why (it goes to the client)."""


class AuthRefused(ProtocolError):
    """A refusal: 401 (no or bad credentials), 403 (a scope is missing, or a claim condition fails) or
    400 (a credential in the query string). `data.reason` is the metric label. `challenge` is the
    `WWW-Authenticate` header; None for a failed claim condition, which no re-authorization can fix."""

    def __init__(self, status: int, reason: str, message: str, challenge: str | None) -> None:
        super().__init__(jsonrpc.INVALID_REQUEST, message, http_status=status, data={"reason": reason})
        self.challenge = challenge


def _quoted(params: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f'{name}="{value}"' for name, value in params)


def quotable(text: str) -> str:
    """`text` made safe for a quoted challenge parameter: no CR/LF (aiohttp would refuse to send the
    header, dropping the connection), quotes or other characters RFC 6750 forbids there; bounded."""
    return UNQUOTABLE.sub("?", text[:MAX_DESCRIPTION_CHARS])


def unmet_claims(rule: AuthRule, claims: Mapping[str, Any]) -> list[str]:
    """The claims of `rule` whose condition the caller's `claims` fail. A condition holds when the claim
    equals the value or, when the claim is a list, contains it; of the same JSON type (the string "1"
    is not the number 1, nor `true` the number 1). A missing claim fails."""
    return [name for name, wanted in rule.claims.items() if not _holds(claims.get(name), wanted)]


def _holds(claim: object, wanted: ClaimValue) -> bool:
    if type(claim) is type(wanted):
        return claim == wanted
    if isinstance(claim, list):
        for value in claim:
            if type(value) is type(wanted) and value == wanted:
                return True
    return False


def presented_token(headers: Mapping[str, str]) -> str:
    """The credential in `Authorization: Bearer` ("" when there is none)."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class EdgeAuth:
    """The configured `[auth]` mode: authenticates requests and applies the per-tool rules."""

    def __init__(self, config: AuthConfig, server_url: str, validate_token: TokenValidator | None = None) -> None:
        """`server_url` is the MCP endpoint's URL as `[server] listen` names it: the resource when
        `[auth] resource` is empty (never the Host a request names, which any client can set)."""
        self.config = config
        self._mcp_path = urlsplit(server_url).path
        self.resource = config.resource or server_url
        """The canonical URL of the protected resource."""
        self._validate_token = validate_token
        if config.mode == "oauth" and validate_token is None:
            raise ValueError('mode = "oauth" needs a token validator')
        self.use_key(self._hash_key(config.principal_key_env) if config.mode != "none" else b"")

    @staticmethod
    def _hash_key(env_name: str) -> bytes:
        if not env_name:
            return secrets.token_bytes(32)
        value = os.environ.get(env_name)
        if not value:
            raise ConfigError(f"auth.principal_key_env: the environment variable {env_name} is not set or empty")
        return value.encode()

    @property
    def keeps_key_in_store(self) -> bool:
        """Whether the principals' key is the store's (no `principal_key_env`): a durable or shared store
        must hash a caller the same after a restart and on every replica, or its tasks are lost to it."""
        return self.enabled and not self.config.principal_key_env

    def use_key(self, key: bytes) -> None:
        """Hash principals under `key` from now on (before serving: the store's key, read at start)."""
        self._key = key
        self._api_keys = [
            (api_key.sha256, self.principal(f"api_key:{api_key.name}", api_key.scopes, api_key.claims))
            for api_key in self.config.api_keys
        ]

    @property
    def key(self) -> bytes:
        """The principals' hash key (a reload's new `EdgeAuth` keeps it: callers must hash the same)."""
        return self._key

    @property
    def enabled(self) -> bool:
        return self.config.mode != "none"

    def principal(self, identity: str, scopes: Iterable[str], claims: Mapping[str, Any]) -> Principal:
        digest = hmac.new(self._key, identity.encode(), hashlib.sha256).hexdigest()
        return Principal(f"p_{digest[:32]}", frozenset(scopes), claims)

    # -- authenticating a request ----------------------------------------------------------------

    async def authenticate(self, request: web.Request) -> Principal:
        """The caller's principal, or AuthRefused (401, or 400 for a credential in the query string)."""
        if not self.enabled:
            return ANONYMOUS_PRINCIPAL
        if QUERY_TOKEN_NAMES.intersection(name.lower() for name in request.query):
            raise AuthRefused(
                400,
                "invalid_request",
                "Bad Request: credentials are accepted only in the Authorization header, never in the URL",
                self.challenge(error="invalid_request"),
            )
        token = presented_token(request.headers)
        if not token:
            raise AuthRefused(
                401,
                "unauthorized",
                "Unauthorized: send Authorization: Bearer <token>",
                self.challenge(),
            )
        try:
            if not TOKEN_SYNTAX.fullmatch(token):
                raise InvalidToken("malformed (a token is visible ASCII characters only)")
            return await self._principal_for(token)
        except InvalidToken as exc:
            raise AuthRefused(
                401,
                "invalid_token",
                f"Unauthorized: invalid token: {exc}",
                self.challenge(error="invalid_token", description=str(exc)),
            ) from None

    async def _principal_for(self, token: str) -> Principal:
        if self.config.mode == "api_key":
            digest = hashlib.sha256(token.encode()).hexdigest()
            found = None
            for expected, principal in self._api_keys:  # every key compared, so timing names none
                if hmac.compare_digest(digest, expected):
                    found = principal
            if found is None:
                raise InvalidToken("unknown api key")
            return found
        assert self._validate_token is not None
        validated = await self._validate_token(token)
        return self.principal(validated.identity, validated.scopes, validated.claims)

    # -- per-tool rules --------------------------------------------------------------------------

    @staticmethod
    def permits(rule: AuthRule, principal: Principal) -> bool:
        """Whether the caller meets the rule: every scope, every claim condition."""
        return principal.scopes.issuperset(rule.scopes) and not unmet_claims(rule, principal.claims)

    def check_call(self, principal: Principal, message: Message, rules: AuthConfig | None = None) -> AuthRule | None:
        """The rule of a `tools/call` (plain or creating a task), for its per-tool rate limit; None when
        no rule applies. A caller the rule refuses gets 403: for a failed claim condition without a
        step-up challenge (more scopes cannot fix who the caller is), checked first for that reason;
        for missing scopes `insufficient_scope` naming every scope the tool needs. `rules`: the endpoint's
        own (`Config.for_route`), else `[auth]`'s."""
        if not self.enabled or message.get("method") != "tools/call":
            return None
        tool = jsonrpc.params_of(message).get("name")
        rule = (rules or self.config).rule_for(tool)
        if rule is None or self.permits(rule, principal):
            return rule
        if unmet := unmet_claims(rule, principal.claims):
            error = AuthRefused(
                403,
                "claim_mismatch",
                f"Forbidden: the tool {tool} is not available to this caller: it does not meet the rule's "
                f"conditions on the claims {', '.join(unmet)}",
                None,
            )
        else:
            needed = " ".join(rule.scopes)
            error = AuthRefused(
                403,
                "insufficient_scope",
                f"Forbidden: the tool {tool} needs the scopes {needed}",
                self.challenge(error="insufficient_scope", scope=needed),
            )
        error.request_id = message["id"]
        raise error

    def visible_tools(self, principal: Principal, result: Message, rules: AuthConfig | None = None) -> Message:
        """A tools/list result without the tools hidden from this caller (`hide` rules it fails)."""
        rules = rules or self.config
        tools = result.get("tools")
        if not self.enabled or not isinstance(tools, list):
            return result
        kept = [
            tool
            for tool in tools
            if not (
                isinstance(tool, dict)
                and (rule := rules.rule_for(tool.get("name"))) is not None
                and rule.hide
                and not self.permits(rule, principal)
            )
        ]
        return {**result, "tools": kept}

    # -- challenges and the protected-resource metadata ------------------------------------------

    def metadata_url(self) -> str:
        parts = urlsplit(self.resource)
        return f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{parts.path.rstrip('/')}"

    @property
    def metadata_paths(self) -> list[str]:
        """Where the metadata is served: under the MCP path (and the resource's path, behind a proxy
        that changes it), then at the root, as clients look for it in that order."""
        resource_path = urlsplit(self.config.resource).path.rstrip("/")
        paths = [METADATA_PATH + self._mcp_path, METADATA_PATH + resource_path, METADATA_PATH]
        return list(dict.fromkeys(paths))

    def challenge(self, *, error: str | None = None, description: str | None = None, scope: str = "") -> str:
        params = [("resource_metadata", self.metadata_url())]
        scope = scope or " ".join(self.config.scopes_supported)
        if scope:
            params.append(("scope", scope))
        if error is not None:
            params.append(("error", error))
        if description is not None:
            params.append(("error_description", quotable(description)))
        return "Bearer " + _quoted(params)

    async def metadata(self, _: web.Request) -> web.Response:
        """RFC 9728 Protected Resource Metadata; `authorization_servers` exactly as configured."""
        body = {
            "resource": self.resource,
            "authorization_servers": self.config.authorization_servers,
            "scopes_supported": self.config.scopes_supported,
            "bearer_methods_supported": ["header"],
        }
        return json_response(body, 200)
