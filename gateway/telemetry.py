"""OpenTelemetry traces: the tracer (on while `[telemetry]` names an OTLP endpoint), the spans the gateway
makes, W3C trace context in and out, and the trace ids on log lines.

Off (the default), no tracer provider and no export thread exist, and every helper here returns at its
first check of `_tracer`: the request path pays one attribute read per helper.

On, each client request gets a server span (`RequestTrace`, opened by the edge middleware), parented by
the caller's `traceparent` header or, failing that, its `params._meta.traceparent` (MCP's convention,
SEP-414). Code on the way adds children with `span` and annotates the request span with `annotate`. A
task's span runs from its creation to its terminal status, with an event per status change; request spans
that touch a task link to it (kept in memory by task id: a task started on another replica is not
linked). Outgoing, the current span goes to HTTP upstreams as `traceparent`/`tracestate` headers and, in
`params._meta` under the same keys, to stdio upstreams and in 2026-07-28 envelopes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.config import TelemetryConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("gateway.telemetry")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
"""The W3C header names, and MCP's `_meta` keys for the same values (SEP-414: `traceparent`,
`tracestate`, `baggage` in `params._meta`)."""

ENVELOPE_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
"""Present in `_meta` on every 2026-07-28 request: the envelope that carries trace context in `_meta`."""

MAX_TASK_SPANS = 10_000
"""Task span contexts kept for links, oldest forgotten first: a bound on memory, not on tasks."""

# Attribute names: OpenTelemetry's MCP and RPC conventions where they have one, the gateway's own otherwise.
METHOD = "mcp.method.name"
TOOL = "gen_ai.tool.name"
ERA = "mcp.protocol.version"
PRINCIPAL = "mcp_gateway.principal_hash"
UPSTREAM = "mcp_gateway.upstream"
HTTP_STATUS = "http.response.status_code"
ERROR_CODE = "rpc.jsonrpc.error_code"
TASK_ID = "mcp_gateway.task.id"

# Span names, besides the request's (`METHOD [TOOL]`, or `HTTP-METHOD PATH` before the message is read).
UPSTREAM_SPAN = "mcp_gateway.upstream"
"""The exchange with the upstream: from sending the request to its final message."""
STDIO_WAIT_SPAN = "mcp_gateway.stdio.wait"
"""Waiting for a stdio process of the pool (a free slot, or the process holding the conversation)."""
RELAY_SPAN = "mcp_gateway.relay"
"""The answer on its way to the client, from the upstream's first message (or the wait for it) to the
response's end: longer than the upstream span by what writing to the client took."""
TASK_SPAN = "mcp_gateway.task"

_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: trace.Tracer | None = None
"""Set while tracing is on (`start_tracing`); None is the one flag every helper checks."""
_current: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("request_trace", default=None)
_tasks: OrderedDict[str, Span] = OrderedDict()
"""The span of each task this process started (by task id), live until its terminal status, then kept
(ended) for the links of the requests that read it later."""


def active() -> bool:
    return _tracer is not None


def start_tracing(config: TelemetryConfig) -> TracerProvider | None:
    """The tracer provider `config` asks for, exporting in the background over OTLP/HTTP; None when off."""
    global _tracer
    if not config.enabled:
        return None
    # Imported only when on: the exporter pulls in requests and protobuf (half a second at start).
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: config.service_name}),
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint)))
    _tracer = provider.get_tracer("mcp-task-gateway")
    return provider


async def stop_tracing(provider: TracerProvider | None) -> None:
    """Export what is pending and stop the export thread (task spans still open end unexported). In a
    thread: with the collector down, the export takes up to the exporter's timeout (10 s by default,
    `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`), and the event loop must not stall meanwhile."""
    global _tracer
    if provider is None:
        return
    _tracer = None
    _tasks.clear()
    await asyncio.to_thread(provider.shutdown)  # flushes the batch processor before its thread ends


# -- request spans ---------------------------------------------------------------------------------


class RequestTrace:
    """The span of one client request. Opened when its parent is known: the `traceparent` header, else
    (`join`) the message's `_meta.traceparent` once the body is read; a request refused before that gets
    its span at the end. Starts at the request's arrival either way."""

    def __init__(self, tracer: trace.Tracer, name: str, headers: Mapping[str, str]) -> None:
        self._tracer = tracer
        self._name = name
        self._parent = _PROPAGATOR.extract(headers) if TRACEPARENT in headers else None
        self._started = time.time_ns()
        self._context_token: object = None
        self._current_token: contextvars.Token[RequestTrace | None] | None = None
        self._task: asyncio.Task[Any] | None = None
        self.span: Span | None = None

    def __enter__(self) -> RequestTrace:
        self._current_token = _current.set(self)
        self._task = asyncio.current_task()
        return self

    def open(self, meta: object = None) -> Span:
        if self.span is None:
            parent = self._parent
            if parent is None and isinstance(meta, dict) and isinstance(meta.get(TRACEPARENT), str):
                parent = _PROPAGATOR.extract(meta)
            self.span = self._tracer.start_span(
                self._name, context=parent, kind=SpanKind.SERVER, start_time=self._started
            )
            if asyncio.current_task() is self._task:  # current in the handler's context, not in a task it started
                self._context_token = otel_context.attach(trace.set_span_in_context(self.span, parent))
        return self.span

    def respond(self, status: int) -> None:
        span = self.open()
        span.set_attribute(HTTP_STATUS, status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        span = self.open()
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()
        if self._context_token is not None:
            otel_context.detach(self._context_token)  # type: ignore[arg-type]
        if self._current_token is not None:
            _current.reset(self._current_token)


class _Untraced:
    """`request_span` while tracing is off, and the context of a request that gets no span."""

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def respond(self, status: int) -> None:
        return None


UNTRACED = _Untraced()


def request_span(method: str, path: str, headers: Mapping[str, str]) -> RequestTrace | _Untraced:
    """The span of one HTTP request (`with`; `respond` records its status)."""
    if _tracer is None:
        return UNTRACED
    return RequestTrace(_tracer, f"{method} {path}", headers)


def join(message: Mapping[str, Any], **attributes: str | None) -> None:
    """The request's message is read: open its span (under `_meta.traceparent` when no header gave a
    parent), name it after the MCP method (and tool), and set `attributes` (None ones left out) and a
    link to the task it names."""
    if _tracer is None or (request := _current.get()) is None:
        return
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    span = request.open(params.get("_meta"))
    found = {key: value for key, value in attributes.items() if value is not None}
    method = message.get("method")
    if isinstance(method, str):
        tool = params.get("name") if method == "tools/call" else None
        span.update_name(f"{method} {tool}" if isinstance(tool, str) else method)
        found[METHOD] = method
        if isinstance(tool, str):
            found[TOOL] = tool
    span.set_attributes(found)  # at once: each call takes the span's lock
    if isinstance(task_id := params.get("taskId"), str):
        link_task(task_id)


def annotate(key: str, value: str | int) -> None:
    """Set an attribute of the current request's span (nothing once it ended, or while tracing is off)."""
    if _tracer is None or (request := _current.get()) is None:
        return
    span = request.open()
    if span.is_recording():
        span.set_attribute(key, value)


def answered(message: Mapping[str, Any]) -> None:
    """The request's final JSON-RPC message: its error code goes on the request span."""
    if _tracer is None:
        return
    error = message.get("error")
    if isinstance(error, dict) and isinstance(code := error.get("code"), int):
        annotate(ERROR_CODE, code)


def error_code(span: Span, error: Mapping[str, Any]) -> None:
    """A JSON-RPC error's code on `span` (a code that is not an integer, as a string)."""
    code = error.get("code")
    span.set_attribute(ERROR_CODE, code if isinstance(code, int) else str(code))


@contextlib.contextmanager
def _child(name: str, attributes: Mapping[str, str | int]) -> Iterator[Span]:
    assert _tracer is not None
    with _tracer.start_as_current_span(name, attributes=attributes) as span:
        yield span


def _in_trace() -> bool:
    """A span is current: work done outside any request or task (readiness probes, the gateway's own
    polls, start-up) makes no spans, which would each be a trace of its own."""
    return trace.get_current_span().get_span_context().is_valid


def span(name: str, **attributes: str | int) -> contextlib.AbstractContextManager[Span | None]:
    """A child of the current span for a `with` block; a no-op while tracing is off or outside a trace."""
    if _tracer is None or not _in_trace():
        return contextlib.nullcontext()
    return _child(name, attributes)


def start_span(name: str, **attributes: str | int) -> Span | None:
    """A child of the current span that outlives the block that starts it (the caller ends it); None
    while tracing is off or outside a trace."""
    if _tracer is None or not _in_trace():
        return None
    return _tracer.start_span(name, attributes=attributes, kind=SpanKind.CLIENT)


@contextlib.contextmanager
def current(span: Span | None) -> Iterator[None]:
    """`span` is the current span within the block (tasks created there inherit it)."""
    if span is None:
        yield
        return
    with trace.use_span(span, end_on_exit=False):
        yield


# -- propagation -------------------------------------------------------------------------------------


def inject_headers(headers: MutableMapping[str, str]) -> None:
    """`traceparent`/`tracestate` of the current span, for an HTTP upstream."""
    if _tracer is not None:
        _PROPAGATOR.inject(headers)


def with_trace_meta(message: dict[str, Any], *, always: bool) -> dict[str, Any]:
    """`message` with the current span's trace context in `params._meta` (replacing the caller's: the
    gateway's span is now the parent); `always` False: only in a 2026-07-28 envelope. Unchanged off."""
    if _tracer is None:
        return message
    params = message.get("params")
    if not isinstance(params, dict):
        return message
    meta = params.get("_meta")
    meta = meta if isinstance(meta, dict) else {}
    if not always and ENVELOPE_VERSION_KEY not in meta:
        return message
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    if not carrier:
        return message
    meta = {key: value for key, value in meta.items() if key not in (TRACEPARENT, TRACESTATE)} | carrier
    return {**message, "params": {**params, "_meta": meta}}


# -- task spans ---------------------------------------------------------------------------------------


def task_started(task_id: str, tool: str, status: str) -> None:
    """A task was created in this process: its span starts (under the current request) and the request links to it."""
    if _tracer is None:
        return
    task_span = _tracer.start_span(TASK_SPAN, attributes={TASK_ID: task_id, TOOL: tool})
    task_span.add_event("task.status", {"status": status})
    _tasks[task_id] = task_span
    while len(_tasks) > MAX_TASK_SPANS:
        _tasks.popitem(last=False)[1].end()
    link_task(task_id)


def task_status(task_id: str, status: str, *, terminal: bool) -> None:
    """A status change of a task this process started: an event on its span, which a terminal one ends."""
    if _tracer is None or (task_span := _tasks.get(task_id)) is None or not task_span.is_recording():
        return
    task_span.add_event("task.status", {"status": status})
    if terminal:
        task_span.set_attribute("mcp_gateway.task.status", status)
        if status == "failed":
            task_span.set_status(Status(StatusCode.ERROR))
        task_span.end()


def link_task(task_id: str) -> None:
    """Link the current request's span to the task's (a task this process knows)."""
    if _tracer is None or (request := _current.get()) is None or (task_span := _tasks.get(task_id)) is None:
        return
    context: SpanContext = task_span.get_span_context()
    span = request.open()
    if span.is_recording():
        span.add_link(context, {TASK_ID: task_id})


# -- logs ---------------------------------------------------------------------------------------------


class TraceIds(logging.Filter):
    """Adds `trace_id` and `span_id` (hex) to each log record made while a span is current."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _tracer is None:
            return True
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True
