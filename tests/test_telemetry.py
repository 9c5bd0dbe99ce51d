"""OpenTelemetry traces: spans of a call through the real gateway reach an OTLP/HTTP receiver (decoded with
opentelemetry-proto), join the caller's trace, and parent the `traceparent` a recording HTTP upstream
(the example server behind a recording proxy) receives; a task's span and its links arrive; log lines
carry the trace ids; with telemetry off no exporter thread runs. Plus the `[telemetry]` precedence over
the `OTEL_*` environment and the `_meta` propagation as pure logic."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shlex
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from bench.tasks_stream import HEADERS, call, open_session
from gateway import telemetry
from gateway.app import build_app
from gateway.config import Config, TelemetryConfig
from tests.conftest import EXAMPLE_SERVER, free_port, start_gateway
from tests.wire import MODERN
from tests.wire import Client as WireClient

EXPORT_WAIT_S = 15.0
EXPORTER_THREAD = "OtelBatchSpanRecordProcessor"
"""The name the SDK's BatchSpanProcessor gives its export thread."""


def attributes(span: Span) -> dict[str, object]:
    values: dict[str, object] = {}
    for attribute in span.attributes:
        value = attribute.value
        values[attribute.key] = getattr(value, value.WhichOneof("value"))
    return values


@dataclass
class Receiver:
    """An OTLP/HTTP traces endpoint: every span exported to it, decoded."""

    url: str = ""
    spans: list[Span] = field(default_factory=list)
    services: set[str] = field(default_factory=set)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            self.services.update(
                a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"
            )
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        self.arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def span(self, matches: Callable[[Span], bool]) -> Span:
        """The first exported span that `matches`, waiting for exports (bounded)."""
        async with asyncio.timeout(EXPORT_WAIT_S):
            while True:
                found = [span for span in self.spans if matches(span)]
                if found:
                    return found[0]
                self.arrived.clear()
                await self.arrived.wait()


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", receiver.handle)
    async with serve(app) as base:
        receiver.url = f"{base}/v1/traces"
        yield receiver


@dataclass
class Seen:
    """One request the recording proxy passed on: its method, and the trace context in its header and `_meta`."""

    method: str | None
    traceparent: str | None
    meta: dict[str, Any]


@contextlib.asynccontextmanager
async def recording_proxy(target: str) -> AsyncIterator[tuple[str, list[Seen]]]:
    """A pass-through HTTP proxy to the MCP server at `target` that records what each POST carried."""
    seen: list[Seen] = []
    async with aiohttp.ClientSession(auto_decompress=False) as client:

        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            if request.method == "POST":
                message = json.loads(body)
                params = message.get("params") if isinstance(message.get("params"), dict) else {}
                seen.append(Seen(message.get("method"), request.headers.get("traceparent"), params.get("_meta") or {}))
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            async with client.request(request.method, target, data=body or None, headers=headers) as upstream:
                passed = {
                    k: v
                    for k, v in upstream.headers.items()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")
                }
                response = web.StreamResponse(status=upstream.status, headers=passed)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response

        app = web.Application()
        app.router.add_route("*", "/mcp", forward)
        async with serve(app) as base:
            yield f"{base}/mcp", seen


def in_trace(trace_id: str, name: str, **wanted: object) -> Callable[[Span], bool]:
    """Matches the spans of trace `trace_id` named `name` with the `wanted` attributes."""
    return lambda span: (
        span.trace_id.hex() == trace_id and span.name == name and wanted.items() <= attributes(span).items()
    )


def caller_traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def telemetry_config(receiver: Receiver) -> str:
    return f'[telemetry]\notlp_endpoint = "{receiver.url}"\nservice_name = "gateway-under-test"\n'


@pytest.fixture
def fast_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans are exported within 50 ms of ending (the SDK's default is 5 s); no stray OTEL_* applies."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")


async def test_a_call_joins_the_callers_trace_and_parents_the_upstreams(
    example_http_url: str, fast_export: None
) -> None:
    traceparent, trace_id, caller_span = caller_traceparent()
    async with (
        otlp_receiver() as receiver,
        recording_proxy(example_http_url) as (upstream_url, seen),
        start_gateway(
            upstream_url=upstream_url, config_text=telemetry_config(receiver) + '[logging]\nlevel = "debug"\n'
        ) as gateway,
        aiohttp.ClientSession(headers=HEADERS) as http,
    ):
        headers = await open_session(http, gateway.url)
        answer = await call(http, gateway.url, {**headers, "traceparent": traceparent}, "tools/call", echo("hi"))
        assert answer["result"]["content"][0]["text"] == "hi"

        request = await receiver.span(in_trace(trace_id, "tools/call echo"))
        upstream = await receiver.span(in_trace(trace_id, telemetry.UPSTREAM_SPAN, **{telemetry.METHOD: "tools/call"}))
        relay = await receiver.span(in_trace(trace_id, telemetry.RELAY_SPAN))
        log_lines = [json.loads(line) for line in gateway.output if line.startswith("{")]

    assert request.parent_span_id.hex() == caller_span  # the gateway's root joined the caller's trace
    assert request.kind == Span.SPAN_KIND_SERVER
    assert attributes(request) | {telemetry.PRINCIPAL: "?"} == {
        telemetry.METHOD: "tools/call",
        telemetry.TOOL: "echo",
        telemetry.ERA: "2025-11-25",
        telemetry.PRINCIPAL: "?",
        telemetry.UPSTREAM: "default",
        telemetry.HTTP_STATUS: 200,
    }
    assert attributes(request)[telemetry.PRINCIPAL] == "anonymous"  # the owner, a keyed hash with auth on
    assert upstream.parent_span_id == request.span_id
    assert attributes(upstream)[telemetry.METHOD] == "tools/call"
    assert relay.parent_span_id == request.span_id
    assert receiver.services == {"gateway-under-test"}

    # The upstream got the gateway's upstream span as its parent, in the W3C header.
    (received,) = [entry for entry in seen if entry.method == "tools/call"]
    assert received.traceparent is not None
    _, received_trace, received_parent, _ = received.traceparent.split("-")
    assert (received_trace, received_parent) == (trace_id, upstream.span_id.hex())
    assert "traceparent" not in received.meta  # a 2025-11-25 request: the header only

    # Log lines under the request's span carry its ids; lines outside any span carry none.
    traced = [line for line in log_lines if line.get("trace_id") == trace_id]
    ours = {span.span_id.hex() for span in (request, upstream, relay)}
    assert traced and {line["span_id"] for line in traced} <= ours
    assert any("trace_id" not in line for line in log_lines)


async def test_a_modern_calls_meta_traceparent_is_joined_and_passed_to_stdio_in_meta(
    tmp_path: Path, fast_export: None
) -> None:
    """No header: the 2026-07-28 envelope's `_meta.traceparent` parents the request span, and the stdio
    upstream gets the gateway's span in `params._meta.traceparent` (MCP's key)."""
    traceparent, trace_id, caller_span = caller_traceparent()
    sent = tmp_path / "sent.jsonl"
    teed = ["sh", "-c", f"tee -a {shlex.quote(str(sent))} | exec {shlex.join(EXAMPLE_SERVER)}"]
    async with (
        otlp_receiver() as receiver,
        start_gateway(upstream_cmd=teed, config_text=telemetry_config(receiver)) as gateway,
        aiohttp.ClientSession() as http,
    ):
        client = WireClient(http, gateway.url, MODERN)
        result = await client.result("tools/call", {**echo("modern"), "_meta": {"traceparent": traceparent}})
        assert result["content"][0]["text"] == "modern"

        request = await receiver.span(in_trace(trace_id, "tools/call echo"))
        waited = await receiver.span(in_trace(trace_id, telemetry.STDIO_WAIT_SPAN))
        upstream = await receiver.span(in_trace(trace_id, telemetry.UPSTREAM_SPAN, **{telemetry.METHOD: "tools/call"}))

    assert request.parent_span_id.hex() == caller_span
    assert attributes(request)[telemetry.ERA] == MODERN
    assert waited.parent_span_id == request.span_id and upstream.parent_span_id == request.span_id
    (line,) = [json.loads(line) for line in sent.read_text().splitlines() if '"tools/call"' in line]
    _, received_trace, received_parent, _ = line["params"]["_meta"]["traceparent"].split("-")
    assert (received_trace, received_parent) == (trace_id, upstream.span_id.hex())


def echo(text: str) -> dict[str, Any]:
    return {"name": "echo", "arguments": {"text": text}}


async def test_a_tasks_span_arrives_linked_from_the_requests_that_touched_it(
    example_http_url: str, fast_export: None
) -> None:
    async with (
        otlp_receiver() as receiver,
        start_gateway(upstream_url=example_http_url, config_text=telemetry_config(receiver)) as gateway,
        aiohttp.ClientSession(headers=HEADERS) as http,
    ):
        headers = await open_session(http, gateway.url)
        arguments = {"steps": 1, "delay": 0.05}
        created = await call(http, gateway.url, headers, "tools/call", {**slow_build(arguments), "task": {}})
        task_id = created["result"]["task"]["taskId"]
        result = await call(http, gateway.url, headers, "tasks/result", {"taskId": task_id})
        assert "error" not in result
        await call(http, gateway.url, headers, "tasks/get", {"taskId": task_id})

        task = await receiver.span(lambda span: attributes(span).get(telemetry.TASK_ID) == task_id)
        linking = {
            name: await receiver.span(lambda span, name=name: span.name == name and bool(span.links))  # type: ignore[misc]
            for name in ("tools/call slow_build", "tasks/result", "tasks/get")
        }

    assert task.name == telemetry.TASK_SPAN
    statuses = [event.attributes[0].value.string_value for event in task.events if event.name == "task.status"]
    assert statuses[0] == "working" and statuses[-1] == "completed"
    assert attributes(task)["mcp_gateway.task.status"] == "completed"
    for name, span in linking.items():
        assert [(link.trace_id, link.span_id) for link in span.links] == [(task.trace_id, task.span_id)], name
    # The task's span is a child of the request that created it.
    assert task.parent_span_id == linking["tools/call slow_build"].span_id


def slow_build(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"name": "slow_build", "arguments": arguments}


def exporter_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("OtelBatch")]


async def test_with_telemetry_off_no_exporter_thread_runs(
    example_http_url: str, fast_export: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def threads_while_serving(config: Config) -> list[str]:
        async with serve(build_app(config)) as base, aiohttp.ClientSession(headers=HEADERS) as http:
            headers = await open_session(http, f"{base}/mcp")
            answer = await call(http, f"{base}/mcp", headers, "tools/call", echo("off"))
            assert answer["result"]["content"][0]["text"] == "off"
            return exporter_threads()

    upstream = {"url": example_http_url}
    assert exporter_threads() == []
    assert await threads_while_serving(Config.model_validate({"upstream": upstream, "store": {"kind": "memory"}})) == []
    assert not telemetry.active()
    # The same check sees the thread while tracing is on (here turned on by the environment alone) ...
    async with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
        on = Config.model_validate({"upstream": upstream, "store": {"kind": "memory"}})
        assert await threads_while_serving(on) == [EXPORTER_THREAD]
        await receiver.span(lambda span: span.name == "tools/call echo")  # flushed on the way out
    # ... and the thread is gone once the gateway stopped.
    assert exporter_threads() == [] and not telemetry.active()


def test_the_file_wins_over_the_environment_which_fills_the_defaults() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_SERVICE_NAME": "from-env",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    filled = TelemetryConfig().effective(environ)
    assert (filled.otlp_endpoint, filled.service_name, filled.sample_ratio) == (
        "http://collector:4318/v1/traces",
        "from-env",
        0.25,
    )
    given = TelemetryConfig(otlp_endpoint="http://file:4318/v1/traces", service_name="file", sample_ratio=0.5)
    assert given.effective(environ) == given
    traces_env = {**environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/t"}
    assert TelemetryConfig().effective(traces_env).otlp_endpoint == "http://traces:4318/t"  # used as is
    assert not given.effective({**environ, "OTEL_SDK_DISABLED": "true"}).enabled
    assert not TelemetryConfig().effective({}).enabled
    with pytest.raises(ValueError, match="sample_ratio"):
        TelemetryConfig().effective({"OTEL_TRACES_SAMPLER_ARG": "2"})


async def test_trace_context_goes_into_meta_for_stdio_and_the_modern_envelope_only() -> None:
    # Sampled out (ratio 0): nothing is exported, yet the context propagates (with the sampled flag clear).
    provider = telemetry.start_tracing(TelemetryConfig(otlp_endpoint="http://127.0.0.1:9/v1/traces", sample_ratio=0))
    try:
        legacy = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}
        modern_meta = {
            telemetry.ENVELOPE_VERSION_KEY: "2026-07-28",
            "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        }
        modern = {**legacy, "params": {"name": "echo", "_meta": modern_meta}}
        assert provider is not None
        assert telemetry.start_span("outside any trace") is None  # no current span: no orphan span either
        with provider.get_tracer("test").start_as_current_span("test") as span:
            context = span.get_span_context()
            assert not context.trace_flags.sampled
            ours = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
            assert telemetry.with_trace_meta(legacy, always=False) is legacy
            assert telemetry.with_trace_meta(legacy, always=True)["params"]["_meta"] == {"traceparent": ours}
            replaced = telemetry.with_trace_meta(modern, always=False)["params"]["_meta"]
            assert replaced == {telemetry.ENVELOPE_VERSION_KEY: "2026-07-28", "traceparent": ours}
    finally:
        await telemetry.stop_tracing(provider)
    assert telemetry.with_trace_meta(legacy, always=True) is legacy  # off: untouched
