"""`[telemetry]`: where OpenTelemetry traces go (off when no endpoint is set), the service name, and the
share of new traces sampled. The standard `OTEL_*` environment variables fill what the file leaves at its
default (`effective`)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import Field

from gateway.config.section import Section

DEFAULT_SERVICE_NAME = "mcp-task-gateway"

TRACES_PATH = "/v1/traces"
"""Appended to `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL, as the OTLP spec says); never to the other two."""


class TelemetryConfig(Section):
    otlp_endpoint: str = ""
    """The OTLP/HTTP traces URL (e.g. `http://collector:4318/v1/traces`); empty: tracing off."""
    service_name: str = DEFAULT_SERVICE_NAME
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """The share of traces this gateway starts that are sampled; a caller's sampled flag decides for
    the traces it joins (parent-based)."""

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint)

    def effective(self, environ: Mapping[str, str] = os.environ) -> TelemetryConfig:
        """This section with the `OTEL_*` variables applied: a key the file sets (to other than its
        default) wins; a key at its default takes the variable's value. `OTEL_SDK_DISABLED=true` turns
        tracing off whatever else is set. A variable's bad value raises pydantic's ValidationError."""
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return self.model_copy(update={"otlp_endpoint": ""})
        defaults = TelemetryConfig()
        update: dict[str, object] = {}
        if self.otlp_endpoint == defaults.otlp_endpoint:
            if endpoint := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
                update["otlp_endpoint"] = endpoint
            elif base := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
                update["otlp_endpoint"] = base.rstrip("/") + TRACES_PATH
        if self.service_name == defaults.service_name and (name := environ.get("OTEL_SERVICE_NAME", "").strip()):
            update["service_name"] = name
        if self.sample_ratio == defaults.sample_ratio and (ratio := environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()):
            update["sample_ratio"] = ratio
        return TelemetryConfig.model_validate({**self.model_dump(), **update}) if update else self
