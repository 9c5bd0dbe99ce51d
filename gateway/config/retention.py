"""`[retention]`: how many events, how much payload and how many result bytes are kept, and for how long."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.config.section import MiB, Section


class RetentionConfig(Section):
    max_events_per_task: int = Field(default=10_000, gt=0)
    max_event_age_s: float = Field(default=3600.0, gt=0)
    terminal_retention_s: float = Field(default=600.0, ge=0)
    max_payload_bytes: int = Field(default=65_536, gt=0)
    max_result_bytes: int = Field(default=4 * MiB, gt=0)
    """The largest task result (or error) a task record keeps, serialized; a larger one is replaced by
    an error that says so."""
    results_budget_bytes: int = Field(default=256 * MiB, gt=0)
    """The task results all task records keep together; the oldest are evicted to make room."""

    @model_validator(mode="after")
    def _result_fits_budget(self) -> RetentionConfig:
        if self.max_result_bytes > self.results_budget_bytes:
            raise ValueError("max_result_bytes must not exceed results_budget_bytes")
        return self
