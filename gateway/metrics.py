"""Prometheus metrics of one gateway instance, on its own registry (so tests can run several gateways).

Every metric is one row of `METRICS` (attribute, kind, exported name, help, labels, buckets); `Metrics`
builds them all on its registry and carries each as the attribute its row names, typed by the class
annotations below. A new metric is a row and an annotation. A metric about one upstream (its processes,
readiness, deadlines, stdio lines) carries an `upstream` label: the upstream's configured name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_UPSTREAM = "default"
"""The `upstream` label of the one upstream a single `[upstream]` (or --upstream-cmd/--upstream-url) configures."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: the `Metrics` attribute that carries it, its kind, and what the exposition shows."""

    attribute: str
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.kind is Histogram:
            buckets = self.buckets or Histogram.DEFAULT_BUCKETS
            return Histogram(self.name, self.help, self.labels, buckets=buckets, registry=registry)
        return self.kind(self.name, self.help, self.labels, registry=registry)


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "requests",
        Counter,
        "mcp_gateway_requests",
        "Client JSON-RPC requests by method and outcome (ok, error, cancelled, disconnected, rejected)",
        ("method", "outcome"),
    ),
    MetricSpec(
        "rejected_requests",
        Counter,
        "mcp_gateway_rejected_requests",
        "HTTP requests the gateway refused, by reason: framing (malformed HTTP, refused by the HTTP parser), "
        "host, origin, content_type, accept, body_too_large, parse_error, invalid_request (including too "
        "deep), invalid_params, header_mismatch, unsupported_version, not_found, http_method, conflict, "
        "body_timeout (a body slower than min_body_rate_bytes_s), unavailable, upstream_timeout, unknown_task"
        " (a task id that is unknown or another caller's); with [auth]: unauthorized, invalid_token, "
        "invalid_request (a credential in the URL), insufficient_scope, claim_mismatch, rate_limited, "
        "tool_rate_limited, lookup_budget, max_streams",
        ("reason",),
    ),
    MetricSpec(
        "connections",
        Gauge,
        "mcp_gateway_connections",
        "Client connections held (against [server] max_connections)",
    ),
    MetricSpec(
        "accept_errors",
        Counter,
        "mcp_gateway_accept_errors",
        "Client connections the gateway could not accept (out of file descriptors or memory)",
    ),
    MetricSpec(
        "notifications_forwarded",
        Counter,
        "mcp_gateway_notifications_forwarded",
        "Upstream notifications delivered to clients, by method",
        ("method",),
    ),
    MetricSpec(
        "notifications_undelivered",
        Counter,
        "mcp_gateway_notifications_undelivered",
        "Upstream messages tied to no request that no client was listening for, by method and reason: "
        "no_get_stream (a legacy session without its GET stream open), session_closed (the session has "
        "ended), no_session (an upstream conversation no client session owns). Not a loss of task events: "
        "those are recorded in the task's event log before delivery is tried.",
        ("method", "reason"),
    ),
    MetricSpec(
        "upstream_restarts",
        Counter,
        "mcp_gateway_upstream_restarts",
        "Upstream stdio processes that exited unexpectedly, by upstream",
        ("upstream",),
    ),
    MetricSpec(
        "upstream_processes",
        Gauge,
        "mcp_gateway_upstream_processes",
        "Running upstream stdio processes, by upstream",
        ("upstream",),
    ),
    MetricSpec(
        "upstream_ready",
        Gauge,
        "mcp_gateway_upstream_ready",
        "1 while the upstream is usable (its readiness check passes), else 0, by upstream",
        ("upstream",),
    ),
    MetricSpec(
        "upstream_checks",
        Counter,
        "mcp_gateway_upstream_checks",
        "Readiness checks of an upstream (a fresh conversation's initialize), by outcome (usable, unusable) "
        "and upstream",
        ("outcome", "upstream"),
    ),
    MetricSpec(
        "upstream_task_polls",
        Counter,
        "mcp_gateway_upstream_task_polls",
        "tasks/get requests the gateway sent on its own to observe tasks the upstream hosts",
    ),
    MetricSpec(
        "upstream_tasks",
        Gauge,
        "mcp_gateway_upstream_tasks",
        "Tasks the upstream hosts that the gateway is watching (not yet terminal)",
    ),
    MetricSpec(
        "kept_result_bytes",
        Gauge,
        "mcp_gateway_kept_result_bytes",
        "Bytes of task results (or errors) the task records keep, at most [retention] results_budget_bytes",
    ),
    MetricSpec(
        "results_dropped",
        Counter,
        "mcp_gateway_results_dropped",
        "Task results the gateway did not keep, by reason: result_too_large (over max_result_bytes), "
        "result_evicted (the oldest, evicted to keep newer ones within results_budget_bytes)",
        ("reason",),
    ),
    MetricSpec(
        "store_outages",
        Counter,
        "mcp_gateway_store_outages",
        "Times the store stopped taking writes (an unreachable server, a full disk, an I/O error); the writes"
        " of running tasks are held meanwhile",
    ),
    MetricSpec(
        "held_write_bytes",
        Gauge,
        "mcp_gateway_held_write_bytes",
        "Bytes of task writes held while the store cannot take them, at most [store] outage_buffer_bytes",
    ),
    MetricSpec(
        "tasks_failed",
        Counter,
        "mcp_gateway_tasks_failed_by_gateway",
        "Tasks the gateway itself failed, by reason: store_unavailable (their writes could not be held until "
        "the store came back), runner_lost (no live runner), owner_lost (taken over)",
        ("reason",),
    ),
    MetricSpec(
        "lifecycle_refusals",
        Counter,
        "mcp_gateway_lifecycle_refusals",
        "Events the task lifecycle table refused in a task's phase (a driver's mistake: the record is left as "
        "it was), by event",
        ("event",),
    ),
    MetricSpec(
        "store_resets",
        Counter,
        "mcp_gateway_store_resets",
        "Times the store's data set was found replaced (a Redis restarted empty, flushed, or failed over to "
        "an empty replica): the open streams of its tasks ended with store_reset",
    ),
    MetricSpec(
        "config_reloads",
        Counter,
        "mcp_gateway_config_reloads",
        "Config reloads (SIGHUP, POST /admin/reload) by result: ok (applied), invalid (the new file refused, "
        "the old config kept), failed (the file unreadable or not applied, the old config kept)",
        ("result",),
    ),
    MetricSpec(
        "request_timeouts",
        Counter,
        "mcp_gateway_request_timeouts",
        "Requests sent upstream that got no response within their deadline (request_timeout_s), by method; "
        "each was answered with an error and cancelled upstream; by method and upstream",
        ("method", "upstream"),
    ),
    MetricSpec(
        "upstream_oversized_lines",
        Counter,
        "mcp_gateway_upstream_oversized_lines",
        "Lines from a stdio upstream longer than line_limit_bytes, skipped unread, by outcome: request_failed"
        " (a response whose request got an error instead), dropped (nothing to attribute it to: a "
        "notification, a server request, or a response whose id was not found); by outcome and upstream",
        ("outcome", "upstream"),
    ),
    MetricSpec("open_streams", Gauge, "mcp_gateway_open_streams", "Open client SSE streams"),
    MetricSpec(
        "buffered_bytes",
        Gauge,
        "mcp_gateway_buffered_bytes",
        "Bytes of upstream messages queued for clients, being written to them or kept for a resume, in every stream",
    ),
    MetricSpec(
        "messages_dropped",
        Counter,
        "mcp_gateway_messages_dropped",
        "Upstream messages discarded, unwritten, because the client of their request or GET stream went away "
        "or was cut (legacy calls run on without their client; counted once no longer kept for a resume)",
    ),
    MetricSpec(
        "slow_clients",
        Counter,
        "mcp_gateway_slow_clients",
        "Client responses cut because one write did not complete within the write timeout",
    ),
    MetricSpec("sessions", Gauge, "mcp_gateway_sessions", "Open legacy client sessions"),
    MetricSpec(
        "sessions_expired",
        Counter,
        "mcp_gateway_sessions_expired",
        "Legacy sessions the gateway closed on its own, by reason: handshake (no request after initialize "
        "within session_handshake_timeout_s), idle (session_idle_timeout_s)",
        ("reason",),
    ),
    MetricSpec(
        "sessions_parked",
        Counter,
        "mcp_gateway_sessions_parked",
        "Times an idle legacy session gave its stdio process back (session_process_idle_s); its next request "
        "starts a process and replays the handshake",
    ),
    MetricSpec("tasks", Gauge, "mcp_gateway_tasks", "Tasks the gateway holds (terminal ones until they expire)"),
    MetricSpec("task_streams", Gauge, "mcp_gateway_task_streams", "Open tasks/stream requests"),
    MetricSpec(
        "rejected",
        Counter,
        "mcp_gateway_rejected",
        "Requests refused with 503 + Retry-After because a ceiling (or the buffered-bytes budget) was "
        "reached, by its config key",
        ("limit",),
    ),
    MetricSpec(
        "limits",
        Gauge,
        "mcp_gateway_limit",
        "Configured ceilings, by config key: compare with the gauges of current use",
        ("limit",),
    ),
    MetricSpec(
        "latency",
        Histogram,
        "mcp_gateway_request_seconds",
        "Time from receiving a client request to sending its response, by method",
        ("method",),
        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    ),
)
"""Every metric, in exposition order."""


class Metrics:
    requests: Counter
    rejected_requests: Counter
    connections: Gauge
    accept_errors: Counter
    notifications_forwarded: Counter
    notifications_undelivered: Counter
    upstream_restarts: Counter
    upstream_processes: Gauge
    upstream_ready: Gauge
    upstream_checks: Counter
    upstream_task_polls: Counter
    upstream_tasks: Gauge
    kept_result_bytes: Gauge
    results_dropped: Counter
    store_outages: Counter
    held_write_bytes: Gauge
    tasks_failed: Counter
    lifecycle_refusals: Counter
    store_resets: Counter
    config_reloads: Counter
    request_timeouts: Counter
    upstream_oversized_lines: Counter
    open_streams: Gauge
    buffered_bytes: Gauge
    messages_dropped: Counter
    slow_clients: Counter
    sessions: Gauge
    sessions_expired: Counter
    sessions_parked: Counter
    tasks: Gauge
    task_streams: Gauge
    rejected: Counter
    limits: Gauge
    latency: Histogram

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for spec in METRICS:
            setattr(self, spec.attribute, spec.build(self.registry))
        self._forwarded_children: dict[str, Any] = {}

    def count_forwarded(self, method: str, count: int = 1) -> None:
        """Count forwarded notifications of one method; label children are cached (this runs per batch)."""
        child = self._forwarded_children.get(method)
        if child is None:
            child = self._forwarded_children[method] = self.notifications_forwarded.labels(method=method)
        child.inc(count)

    def count_timeout(self, method: str, upstream: str = DEFAULT_UPSTREAM) -> None:
        self.request_timeouts.labels(method=method, upstream=upstream).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
