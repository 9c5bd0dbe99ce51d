"""How the aggregate names what its upstreams own, and merges what they declare. Pure; no I/O.

Tool names, prompt names and upstream task ids (and `requestState`s) are prefixed with the upstream's
name and a separator (`build__echo`), so a request routes by its name alone: statelessly, the same on
every replica and after a restart. A list cursor names each upstream whose list goes on and that
upstream's own cursor, as base64url of compact JSON; a cursor the aggregate did not make (or one naming
an upstream it does not have) is refused with `CursorError`. Capabilities are merged as a union, and
instructions concatenated under a heading per upstream.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""What MCP allows as a tool name (SEP-986): a prefixed name outside it is left out of the list."""


class CursorError(ValueError):
    """A list cursor the aggregate did not make, or one naming an upstream it does not have."""


class Names:
    """The upstreams' names (in configured order) and the separator that joins them to what they own."""

    def __init__(self, upstream_names: Sequence[str], separator: str) -> None:
        if not separator:
            raise ValueError("the separator must not be empty")
        self.upstreams: tuple[str, ...] = tuple(upstream_names)
        self.separator = separator
        # Longest first: with names `a` and `a-b` and separator `-`, `a-b-x` is `a-b`'s.
        self._by_length = sorted(self.upstreams, key=len, reverse=True)

    def prefixed(self, upstream: str, name: str) -> str:
        """`name` (a tool, a prompt, a task id, a requestState) of `upstream` as the aggregate shows it."""
        return f"{upstream}{self.separator}{name}"

    def split(self, prefixed: str) -> tuple[str, str] | None:
        """The upstream owning `prefixed` and its own name for it; None for a name no upstream owns."""
        for upstream in self._by_length:
            head = f"{upstream}{self.separator}"
            if prefixed.startswith(head) and len(prefixed) > len(head):
                return upstream, prefixed[len(head) :]
        return None

    def owner(self, prefixed: str) -> str | None:
        """The upstream owning `prefixed`; None for a name no upstream owns."""
        owned = self.split(prefixed)
        return owned[0] if owned is not None else None

    def valid_tool_name(self, prefixed: str) -> bool:
        return TOOL_NAME.fullmatch(prefixed) is not None

    def encode_cursor(self, pending: Sequence[tuple[str, str]]) -> str:
        """The aggregate's cursor: each upstream whose list goes on, with its own cursor, in order."""
        raw = orjson.dumps({"p": [list(pair) for pair in pending]})
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    def decode_cursor(self, cursor: str) -> list[tuple[str, str]]:
        """The upstreams and their cursors that `cursor` (made by `encode_cursor`) names; CursorError else."""
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            value = orjson.loads(raw)
        except (binascii.Error, ValueError):
            raise CursorError("the cursor is not one this server gave out") from None
        pending = value.get("p") if isinstance(value, dict) and set(value) == {"p"} else None
        if not isinstance(pending, list) or not pending:
            raise CursorError("the cursor is not one this server gave out")
        pairs: list[tuple[str, str]] = []
        for pair in pending:
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(part, str) for part in pair)):
                raise CursorError("the cursor is not one this server gave out")
            if pair[0] not in self.upstreams:
                raise CursorError(f"the cursor names an unknown upstream {pair[0]!r}")
            pairs.append((pair[0], pair[1]))
        return pairs


def merge_capabilities(declared: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The union of the upstreams' capabilities: nested objects merged key by key, a flag true when
    any upstream's is; for any other value the first upstream's stands."""
    merged: dict[str, Any] = {}
    for capabilities in declared:
        merged = _union(merged, capabilities)
    return merged


def _union(into: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(into)
    for key, value in other.items():
        mine = result.get(key)
        if key not in result:
            result[key] = value
        elif isinstance(mine, Mapping) and isinstance(value, Mapping):
            result[key] = _union(mine, value)
        elif isinstance(mine, bool) and isinstance(value, bool):
            result[key] = mine or value
    return result


def merge_instructions(instructions: Sequence[tuple[str, object]]) -> str | None:
    """Each upstream's instructions (upstream, text) under a `## NAME` heading; None when none has any."""
    sections = [f"## {upstream}\n\n{text}" for upstream, text in instructions if isinstance(text, str) and text]
    return "\n\n".join(sections) if sections else None


def template_pattern(template: str) -> re.Pattern[str]:
    """A URI template's RFC 6570 level-1 match: each `{var}` stands for one path segment's worth."""
    parts = re.split(r"\{[^{}]*\}", template)
    return re.compile("[^/]+".join(re.escape(part) for part in parts))
