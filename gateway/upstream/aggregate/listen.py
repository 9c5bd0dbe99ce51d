"""A 2026-07-28 `subscriptions/listen` on the aggregate: one listen per usable upstream, one stream.

Each upstream is asked for what the client's filter asks of it: the list flags as they are, the task
ids it owns (unprefixed) and the resource URIs it owns (or all of them while no list named an owner).
The client's stream opens with one acknowledgement, the union of the upstreams' (each within the
aggregate's timeout; one that does not acknowledge is left out), then carries every upstream's
notifications as they come (rewritten by the channel), and ends when the last upstream's listen ends.
Pure helpers; the channel does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.protocol import jsonrpc
from gateway.protocol.era import SUBSCRIPTION_ID_KEY
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.pushes import ACKNOWLEDGED
from gateway.upstream.aggregate.naming import Names

LIST_FILTERS = {
    "toolsListChanged": "notifications/tools/list_changed",
    "promptsListChanged": "notifications/prompts/list_changed",
    "resourcesListChanged": "notifications/resources/list_changed",
}


def filters_of(message: Message) -> dict[str, Any]:
    filters = jsonrpc.params_of(message).get("notifications")
    return filters if isinstance(filters, dict) else {}


def upstream_filters(
    filters: Mapping[str, Any], upstream: str, names: Names, owner: Callable[[str], str | None]
) -> dict[str, Any]:
    """What of the client's filter `upstream` is asked for: its own task ids and resources."""
    mine = dict(filters)
    task_ids = filters.get("taskIds")
    if isinstance(task_ids, list):
        owned = [names.split(task_id) if isinstance(task_id, str) else None for task_id in task_ids]
        mine["taskIds"] = [split[1] for split in owned if split is not None and split[0] == upstream]
    uris = filters.get("resourceSubscriptions")
    if isinstance(uris, list):
        mine["resourceSubscriptions"] = [uri for uri in uris if isinstance(uri, str) and owner(uri) in (None, upstream)]
    return mine


def acknowledgement(listen_id: RequestId, acknowledged: list[Mapping[str, Any]]) -> Message:
    """The client's one acknowledgement: the union of the upstreams' (task ids already prefixed)."""
    merged: dict[str, Any] = {}
    for filters in acknowledged:
        for key, value in filters.items():
            if isinstance(value, list):
                known = merged.setdefault(key, [])
                known.extend(item for item in value if item not in known)
            elif isinstance(value, bool):
                merged[key] = merged.get(key, False) or value
            else:
                merged.setdefault(key, value)
    params = {"_meta": {SUBSCRIPTION_ID_KEY: listen_id}, "notifications": merged}
    return {"jsonrpc": "2.0", "method": ACKNOWLEDGED, "params": params}


def acknowledged_filters(message: Message) -> dict[str, Any] | None:
    """The filter an upstream's acknowledgement names; None when `message` is not one."""
    if message.get("method") != ACKNOWLEDGED:
        return None
    return filters_of(message)


def list_changed(listen_id: RequestId, method: str) -> Message:
    """A list_changed the aggregate itself sends on a listen stream (an upstream came or went)."""
    return {"jsonrpc": "2.0", "method": method, "params": {"_meta": {SUBSCRIPTION_ID_KEY: listen_id}}}


def ended(listen_id: RequestId) -> Message:
    """The graceful end of a listen, once every upstream's has ended."""
    result = {"resultType": "complete", "_meta": {SUBSCRIPTION_ID_KEY: listen_id}}
    return {"jsonrpc": "2.0", "id": listen_id, "result": result}
