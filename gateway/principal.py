"""Who is calling, as every layer below the edge may know it: the `Principal` the edge makes of a
request's credentials (`gateway.edge.auth`), and `ANONYMOUS`, the owner of every call when auth is off.

Plain values only: the tasks, the sessions and the stores see the principal's `owner` (a keyed hash),
never a credential; this module imports nothing of the gateway so that any layer can name them.

With several upstreams, each one's own endpoint (`/servers/NAME/mcp`) binds tasks and sessions to the
caller *on that route* (`on_route`): an owner with the route's name appended. A task made there is
unknown on any other endpoint, as another caller's is, and a task's route says which upstream's
watcher takes it over after a restart (`route_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

ANONYMOUS = "anonymous"
"""The owner of every call when auth is off (`[auth] mode = "none"`): every task and session carries an
owner, so auth only fills it in."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, as the layers below the edge may know it."""

    owner: str
    """The keyed hash tasks and sessions are bound to (`anonymous` in mode = "none")."""
    scopes: frozenset[str]
    claims: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The caller's claims that `[[auth.rules]]` have conditions on (only those)."""


ANONYMOUS_PRINCIPAL = Principal(ANONYMOUS, frozenset())


ROUTE_MARK = "@"
"""Joins an owner and a route; no owner contains it (a keyed hash, or `anonymous`), no route name either."""


def on_route(principal: Principal, route: str | None) -> Principal:
    """The principal as the endpoint of `route` binds tasks and sessions to it (None: the gateway's
    main endpoint, whose owners are the plain principal's)."""
    return principal if route is None else replace(principal, owner=f"{principal.owner}{ROUTE_MARK}{route}")


def route_of(owner: str) -> str | None:
    """The route an owner was bound on (`on_route`); None for the main endpoint."""
    _, mark, route = owner.rpartition(ROUTE_MARK)
    return route if mark else None


CALLER_TOKEN = "gateway-caller-token"
CALLER_OWNER = "gateway-caller-owner"
"""The entries of a call's upstream headers that carry its caller to an upstream exchanging the caller's
token for its own (`[upstream.auth] mode = "token_exchange"`). Only the edge sets them (a client's
headers are forwarded by an allowlist that has neither), only the HTTP link reads them, and it never
sends them on; they live in memory with the call, never in a store."""


@dataclass(frozen=True, slots=True)
class Caller:
    """A validated caller as an upstream credential exchange needs it: its owner and raw access token."""

    owner: str
    token: str


def with_caller(headers: Mapping[str, str], principal: Principal, token: str) -> dict[str, str]:
    """`headers` carrying the caller (`CALLER_TOKEN`, `CALLER_OWNER`)."""
    return {**headers, CALLER_TOKEN: token, CALLER_OWNER: principal.owner}


def caller_entries(headers: Mapping[str, str]) -> dict[str, str]:
    """Only the caller a call's headers carry (none, or both entries): for requests a bridge makes anew."""
    return {name: value for name, value in headers.items() if name in (CALLER_TOKEN, CALLER_OWNER)}


def caller_of(headers: Mapping[str, str]) -> Caller | None:
    """The caller a call's headers carry, if any."""
    token, owner = headers.get(CALLER_TOKEN), headers.get(CALLER_OWNER)
    return Caller(owner, token) if token and owner else None
