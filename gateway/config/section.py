"""What every config section shares: unknown keys refused, values frozen once read."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MiB = 1024 * 1024


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
