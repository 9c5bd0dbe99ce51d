"""`[logging]`: level, format, and how often refused requests are logged."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config.section import Section


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "human"] = "auto"
    rejected_log_interval_s: float = Field(default=60.0, ge=0)
