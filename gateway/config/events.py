"""`[events]` and `[[rules]]`: whether task events are recorded, their type prefix, and the capture rules
that turn upstream notifications into them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.config.section import Section


class EventsConfig(Section):
    enabled: bool = True
    prefix: str = "io.github.mcp-task-gateway"

    @field_validator("prefix")
    @classmethod
    def _vendor_prefix(cls, value: str) -> str:
        # SEP-2694 reserves unprefixed event types for MCP itself: insist on a dotted namespace.
        labels = value.split(".")
        if len(labels) < 2 or not all(labels) or not all(label.replace("-", "").isalnum() for label in labels):
            raise ValueError("must be a vendor namespace of dot-separated labels, e.g. 'com.example.gateway'")
        return value


class CaptureRule(Section):
    """Turns a matching upstream notification into a task event (or drops it)."""

    method: str
    match: dict[str, str | int | float | bool] = Field(default_factory=dict)
    type: str | None = None
    fields: list[str] | None = None
    payload: Literal["params", "message"] = "params"
    drop: bool = False
    upstream: str | None = None
    """With `[[upstreams]]`: the rule applies only to this upstream's notifications, and only on its own
    path (`/servers/NAME/mcp`); the aggregate at `[server] path` applies the rules without `upstream`."""

    @model_validator(mode="after")
    def _type_unless_drop(self) -> CaptureRule:
        if self.drop and (self.type or self.fields):
            raise ValueError("a rule with drop = true takes no 'type' or 'fields'")
        if not self.drop and not self.type:
            raise ValueError("'type' is required (the event type, appended to [events] prefix)")
        if self.type is not None and (not all(self.type.split(".")) or " " in self.type):
            raise ValueError(f"'type' {self.type!r} must be dot-separated labels without spaces")
        return self


def default_rules() -> list[CaptureRule]:
    return [
        CaptureRule(method="notifications/progress", type="progress", fields=["progress", "total", "message"]),
        CaptureRule(method="notifications/message", type="log"),
        CaptureRule(method="notifications/tasks/partial", type="partial"),
        CaptureRule(method="notifications/tools/partial_result", type="partial_result"),
        CaptureRule(method="notifications/tasks/status", type="upstream.status"),
        CaptureRule(method="*", type="notification", payload="message"),
    ]
