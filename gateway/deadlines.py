"""How long the upstream may take to answer each request the gateway sends it, from the configuration.

Every request gets `[upstream] request_timeout_s`; a `tools/call` gets its tool's `[[tasks.tools]]`
`request_timeout_s` instead when that entry sets one, whether the call is plain or runs as a gateway-
hosted task (0 on either: no deadline). Requests that by design wait on something other than the
upstream's work are bound otherwise: `initialize` by `[server] initialize_timeout_s` (where it is sent),
`subscriptions/listen` not at all (a stream its client ends by closing it), and `tasks/result` and
`tasks/stream` to an upstream that hosts tasks by `[tasks] max_ttl_ms` (they wait for the task, which
cannot outlive that).

Plain rules over the config and the message; the links arm the deadline (`Exchange`).
"""

from __future__ import annotations

import functools

from gateway.config import TasksConfig, UpstreamConfig
from gateway.metrics import Metrics
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.upstream.base import Deadline

UNBOUNDED_METHODS = frozenset({"initialize", "subscriptions/listen"})
"""Methods `request_timeout_s` does not apply to (see the module docstring)."""


class RequestDeadlines:
    """The `DeadlineRule` of a configured gateway: the deadline of each request sent upstream."""

    def __init__(self, upstream: UpstreamConfig, tasks: TasksConfig, metrics: Metrics | None = None) -> None:
        self._tasks = tasks
        self._on_expiry = None if metrics is None else functools.partial(metrics.count_timeout, upstream=upstream.name)
        self._default = self._deadline(upstream.request_timeout_s, "upstream.request_timeout_s")
        self._task_result = self._deadline(tasks.max_ttl_ms / 1000, "tasks.max_ttl_ms")

    def __call__(self, message: Message) -> Deadline | None:
        method = message.get("method")
        if method in UNBOUNDED_METHODS:
            return None
        if method in ("tasks/result", "tasks/stream"):
            return self._task_result
        if method == "tools/call":
            policy = self._tasks.policy_for(jsonrpc.params_of(message).get("name"))
            if policy.request_timeout_s is not None:
                key = f'request_timeout_s of the [[tasks.tools]] entry match = "{policy.match}"'
                return self._deadline(policy.request_timeout_s, key)
        return self._default

    def _deadline(self, seconds: float, key: str) -> Deadline | None:
        return Deadline(seconds, key, self._on_expiry) if seconds > 0 else None
