"""Who is calling, as every layer below the edge may know it: the `Principal` the edge makes of a
request's credentials (`gateway.edge.auth`), and `ANONYMOUS`, the owner of every call when auth is off.

Plain values only: the tasks, the sessions and the stores see the principal's `owner` (a keyed hash),
never a credential; this module imports nothing of the gateway so that any layer can name them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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
