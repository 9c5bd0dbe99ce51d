"""`[tasks]` and `[[tasks.tools]]`: which tools become tasks in each era, and the task limits and timings."""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import Field, model_validator

from gateway.config.section import Section

TaskSupport = Literal["forbidden", "optional", "required"]
ModernTasks = Literal["never", "always", "after_ms", "required"]

MODERN_FOR_TASK_SUPPORT: dict[str, tuple[ModernTasks, ...]] = {
    "forbidden": ("never",),
    "optional": ("after_ms", "always", "never"),
    "required": ("required",),
}
"""Which `modern` values agree with each `task_support`; the first is the one a policy without `modern` gets."""


class ToolTaskPolicy(Section):
    """How tools whose name matches `match` (a glob) become tasks, per era, and how long their calls may take.

    The two task keys describe one tool, so they must agree: a tool that is never a task, or must be one,
    is that in both eras. Either key left out follows the other (`required` implies `required`)."""

    match: str = "*"
    upstream: str | None = None
    """With `[[upstreams]]`: the policy applies only to this upstream's tools, on its own path and at
    `[server] path` (`match` behind its prefix there). None: every upstream's."""
    task_support: TaskSupport = "optional"
    modern: ModernTasks = "after_ms"
    after_ms: int = Field(default=1000, ge=0)
    input_window_ms: int = Field(default=500, ge=0)
    request_timeout_s: float | None = Field(default=None, ge=0)
    """The deadline of these tools' upstream calls, plain or as a task (0: none); None follows
    `[upstream] request_timeout_s`."""

    @model_validator(mode="before")
    @classmethod
    def _one_key_implies_the_other(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        support = data.get("task_support")
        if "modern" not in data and isinstance(support, str) and support in MODERN_FOR_TASK_SUPPORT:
            return {**data, "modern": MODERN_FOR_TASK_SUPPORT[support][0]}
        if "task_support" not in data and data.get("modern") == "required":
            return {**data, "task_support": "required"}
        return data

    @model_validator(mode="after")
    def _eras_agree(self) -> ToolTaskPolicy:
        allowed = MODERN_FOR_TASK_SUPPORT[self.task_support]
        if self.modern not in allowed:
            choices = " | ".join(repr(value) for value in allowed)
            raise ValueError(
                f"tool {self.match!r}: task_support = {self.task_support!r} (2025-11-25) and modern = "
                f"{self.modern!r} (2026-07-28) contradict each other; with this task_support, modern must be "
                f"{choices} (or left out)"
            )
        return self


UNMATCHED_TOOL = ToolTaskPolicy(task_support="forbidden")
"""The policy of a tool no `[[tasks.tools]]` entry matches."""


class TasksConfig(Section):
    tools: list[ToolTaskPolicy] = Field(default_factory=lambda: [ToolTaskPolicy()])
    default_ttl_ms: int = Field(default=3_600_000, gt=0)
    max_ttl_ms: int = Field(default=86_400_000, gt=0)
    poll_interval_ms: int = Field(default=1000, gt=0)
    max_tasks_per_owner: int = Field(default=1000, gt=0)
    max_tasks_total: int = Field(default=10_000, gt=0)
    page_size: int = Field(default=50, gt=0)
    max_streams_per_task: int = Field(default=1000, gt=0)
    max_streams_total: int = Field(default=1000, gt=0)
    stream_write_timeout_s: float = Field(default=30.0, gt=0)
    replay_batch: int = Field(default=256, gt=0)
    stream_flush_interval_ms: float = Field(default=20.0, ge=0)
    upstream_poll_min_ms: int = Field(default=250, gt=0)
    upstream_poll_max_ms: int = Field(default=30_000, gt=0)

    def policy_for(self, tool: object) -> ToolTaskPolicy:
        """The first `tools` entry whose `match` fits the tool's name; a tool none fits is never a task."""
        name = tool if isinstance(tool, str) else ""
        for policy in self.tools:
            if fnmatch.fnmatchcase(name, policy.match):
                return policy
        return UNMATCHED_TOOL

    @model_validator(mode="after")
    def _ttl_order(self) -> TasksConfig:
        if self.default_ttl_ms > self.max_ttl_ms:
            raise ValueError("default_ttl_ms must not exceed max_ttl_ms")
        if self.upstream_poll_min_ms > self.upstream_poll_max_ms:
            raise ValueError("upstream_poll_min_ms must not exceed upstream_poll_max_ms")
        return self
