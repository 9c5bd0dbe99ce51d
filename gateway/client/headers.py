"""Request headers from the command line: `--header 'Name: value'` (repeatable) on the client commands
and the conformance kit, and the `MCP_GATEWAY_TOKEN` fallback for a gateway with `[auth]`.

`MCP_GATEWAY_TOKEN=T` sends `Authorization: Bearer T` unless an `Authorization` header is given
explicitly; it keeps the credential out of the shell history and the process list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

TOKEN_ENV = "MCP_GATEWAY_TOKEN"
AUTH_HINT = f"pass --header 'Authorization: Bearer TOKEN' or set {TOKEN_ENV}"
"""What to do about a 401, said after the gateway's own message."""


class BadHeader(ValueError):
    """A `--header` value that is not `Name: value`; the message says which."""


def parse_headers(values: Sequence[str], option: str = "--header") -> dict[str, str]:
    """`Name: value` strings as a header dict (a later name wins)."""
    headers: dict[str, str] = {}
    for value in values:
        name, colon, content = value.partition(":")
        if not colon or not name.strip():
            raise BadHeader(f"{option} {value!r}: expected 'Name: value', e.g. 'Authorization: Bearer TOKEN'")
        headers[name.strip()] = content.strip()
    return headers


def request_headers(values: Sequence[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The headers of every request: `--header` values, plus the token of `MCP_GATEWAY_TOKEN` as
    `Authorization: Bearer` when none of them is an Authorization header."""
    headers = parse_headers(values)
    token = environ.get(TOKEN_ENV, "").strip()
    if token and not any(name.lower() == "authorization" for name in headers):
        headers["Authorization"] = f"Bearer {token}"
    return headers
