"""Which upstream owns a resource URI, learnt from the `resources/list` and `resources/templates/list`
pages the aggregate relays. The first configured upstream wins a URI (or template) two upstreams claim,
and the clash is logged once. A URI no list named is matched against the learnt templates (RFC 6570
level 1: each `{var}` one path segment). No I/O.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.upstream.aggregate.naming import Names, template_pattern

log = logging.getLogger("gateway.upstream.aggregate")


class ResourceOwners:
    def __init__(self, names: Names) -> None:
        self._rank = {name: index for index, name in enumerate(names.upstreams)}
        self._uris: dict[str, str] = {}
        self._templates: dict[str, tuple[str, re.Pattern[str]]] = {}
        self._clashes: set[str] = set()

    def learn(self, upstream: str, key: str, entries: Iterable[object]) -> None:
        """Entries of a `resources` (key `uri`) or `resourceTemplates` (key `uriTemplate`) page of `upstream`."""
        for entry in entries:
            value = entry.get(key) if isinstance(entry, Mapping) else None
            if isinstance(value, str):
                self._claim(upstream, value, template=key == "uriTemplate")

    def _claim(self, upstream: str, uri: str, *, template: bool) -> None:
        known = self._templates.get(uri, (None, None))[0] if template else self._uris.get(uri)
        if known is not None and known != upstream:
            if uri not in self._clashes:
                self._clashes.add(uri)
                winner = min(known, upstream, key=self._rank.__getitem__)
                log.warning(
                    "two upstreams list one resource; the first configured owns it",
                    extra={"uri": uri, "upstreams": [known, upstream], "owner": winner},
                )
            if self._rank[known] < self._rank[upstream]:
                return
        if template:
            self._templates[uri] = (upstream, template_pattern(uri))
        else:
            self._uris[uri] = upstream

    def owner(self, uri: str) -> str | None:
        """The upstream that listed `uri` (or a template matching it, or the template itself); None if none."""
        owner = self._uris.get(uri)
        if owner is not None:
            return owner
        exact = self._templates.get(uri)
        if exact is not None:
            return exact[0]
        matching = [name for name, pattern in self._templates.values() if pattern.fullmatch(uri)]
        return min(matching, key=self._rank.__getitem__) if matching else None


def entries_of(result: Mapping[str, Any], key: str) -> list[Any]:
    value = result.get(key)
    return value if isinstance(value, list) else []
