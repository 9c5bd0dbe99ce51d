"""Attributing a JSON-RPC message too long to read whole: its top-level id, from a bounded head and tail.

A stdio upstream's line over `line_limit_bytes` is skipped without being held; only its first
`HEAD_BYTES` and last `TAIL_BYTES` are kept. When they show a response (a top-level `result` or `error`
member and no `method`) and its integer id, the request it answers can be failed alone. Servers put the id
first (`{"jsonrpc":"2.0","id":1,"result":…}`, the Python SDK) or last (`{"result":…,"jsonrpc":"2.0","id":1}`,
the TypeScript SDK), so the head is read member by member at the top level, and the tail is searched only
for a closing `"id":N}`, which in a valid JSON object can only be its last top-level member.

Plain functions over bytes; no I/O.
"""

from __future__ import annotations

import re

import orjson

HEAD_BYTES = 4096
"""How much of an over-long line is kept to look for its top-level members (far below the smallest limit)."""
TAIL_BYTES = 256
"""How much of its end is kept to look for an id that comes last."""

_WHITESPACE = re.compile(rb"[ \t\r\n]*")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_SCALAR = re.compile(rb"[^,}\]\s]+")
_NESTING = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')
_LAST_ID = re.compile(rb'[{,][ \t\r\n]*"id"[ \t\r\n]*:[ \t\r\n]*([0-9]+)[ \t\r\n]*}[ \t\r\n]*$')


def response_id(head: bytes, tail: bytes) -> int | None:
    """The integer id of the response a line begins with `head` and ends with `tail`; None when the line
    is not a response (a notification or a server request) or its id is in neither part."""
    members = top_level_members(head)
    if "method" in members or not ("result" in members or "error" in members):
        return None
    if "id" in members:
        raw = members["id"]
        return int(raw) if raw is not None and raw.isdigit() else None
    match = _LAST_ID.search(tail)
    return int(match.group(1)) if match else None


def top_level_members(head: bytes) -> dict[str, bytes | None]:
    """The members of the JSON object `head` begins with, in order, as far as `head` reaches: each key
    with its raw value when that is a complete scalar (a number, true, false, null), else None (a string,
    an object, an array, or a value `head` cuts off)."""
    members: dict[str, bytes | None] = {}
    pos = _skip_whitespace(head, 0)
    if head[pos : pos + 1] != b"{":
        return members
    pos += 1
    while True:
        key = _STRING.match(head, _skip_whitespace(head, pos))
        if key is None:
            return members
        pos = _skip_whitespace(head, key.end())
        if head[pos : pos + 1] != b":":
            return members
        name = orjson.loads(key.group())
        members[name] = None
        start = _skip_whitespace(head, pos + 1)
        end = _value_end(head, start)
        if end is None:
            return members
        if head[start : start + 1] not in (b'"', b"{", b"["):
            members[name] = head[start:end]
        pos = _skip_whitespace(head, end)
        if head[pos : pos + 1] != b",":
            return members
        pos += 1


def _skip_whitespace(data: bytes, pos: int) -> int:
    match = _WHITESPACE.match(data, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _value_end(data: bytes, start: int) -> int | None:
    """Where the JSON value at `start` ends, or None when `data` ends first."""
    first = data[start : start + 1]
    if first == b'"':
        string = _STRING.match(data, start)
        return string.end() if string else None
    if first in (b"{", b"["):
        depth = 0
        for token in _NESTING.finditer(data, start):
            text = token.group()
            if text in (b"{", b"["):
                depth += 1
            elif text in (b"}", b"]"):
                depth -= 1
                if depth == 0:
                    return token.end()
        return None
    scalar = _SCALAR.match(data, start)
    # A scalar that runs to the end of `data` may be cut short (`12` of `123`).
    return scalar.end() if scalar and scalar.end() < len(data) else None
