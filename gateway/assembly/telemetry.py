"""Builds tracing: `[telemetry]` with the `OTEL_*` environment applied, the tracer started with the app
and flushed and stopped after everything else has stopped (`gateway.telemetry`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web
from pydantic import ValidationError

from gateway import telemetry
from gateway.config import Config, TelemetryConfig, describe_errors

log = logging.getLogger("gateway")


def build_telemetry(app: web.Application, config: Config) -> None:
    """Tracing for the app's life, when `[telemetry]` or the environment names an OTLP endpoint."""

    async def tracing(_: web.Application) -> AsyncIterator[None]:
        settings = effective(config.telemetry)
        provider = telemetry.start_tracing(settings)
        if provider is not None:
            log.info("tracing on", extra={"service": settings.service_name, "sample_ratio": settings.sample_ratio})
        yield
        await telemetry.stop_tracing(provider)

    app.cleanup_ctx.append(tracing)


def effective(config: TelemetryConfig) -> TelemetryConfig:
    """`config` with the `OTEL_*` variables applied; a variable with a bad value is ignored with a warning
    (as the OpenTelemetry SDK does), the file's section kept."""
    try:
        return config.effective()
    except ValidationError as error:
        log.warning("OTEL_* environment ignored", extra={"error": describe_errors(error)})
        return config
