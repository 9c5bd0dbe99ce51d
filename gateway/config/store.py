"""`[store]`: where task records and event logs live (memory, SQLite or Redis) and how store outages are held."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from gateway.config.section import Section


class StoreConfig(Section):
    kind: Literal["memory", "sqlite", "redis"] = "sqlite"
    """Where task records and event logs live. "sqlite" (default): one SQLite file on this host
    (`path`), kept across restarts; "memory": in this process, lost on restart (tests, throw-away
    runs); "redis": in a Redis server (Streams) that several replicas share."""
    path: str = Field(default="data/gateway.db", min_length=1)
    """The SQLite file (kind "sqlite"), relative to the working directory; its directory is created
    on first start."""
    synchronous: Literal["normal", "full"] = "normal"
    """SQLite's `synchronous` (kind "sqlite"): "normal" survives a crash of the process, "full" also
    a power loss (every commit waits for the disk)."""
    url: str = "redis://127.0.0.1:6379/0"
    """kind = "redis": the server (`redis://` or `rediss://`, with user, password and database)."""
    key_prefix: str = Field(default="mcp-task-gateway:", min_length=1)
    """kind = "redis": every key starts with it, so gateways with different prefixes share one server."""
    lease_ttl_s: float = Field(default=15.0, ge=0.5, le=3600.0)
    """kind = "redis": how long a replica's lease of a task it runs lasts without renewal (renewed every
    third of it). A replica that finds a lease expired takes the task over: the owner's death costs its
    tasks up to this long (plus a third, the scan period) before they are failed or watched again."""

    outage_buffer_bytes: int = Field(default=1_048_576, ge=1024)
    """While the store cannot take writes (its server down, its disk full), the events and status changes
    of running tasks are held in memory and retried with backoff, at most this many bytes of them
    together. A task whose write would exceed it, or whose writes are held longer than `outage_hold_s`,
    is failed (`data.reason` "store_unavailable"), written as soon as the store takes writes again."""
    outage_hold_s: float = Field(default=30.0, gt=0, le=3600.0)
    """How long a running task's writes may be held during a store outage before the task is failed."""
    timeout_s: float = Field(default=5.0, gt=0, le=300.0)
    """kind = "redis": how long one command may take before the store counts as unavailable (a paused or
    partitioned server); requests that need the store then get 503."""

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    @field_validator("key_prefix")
    @classmethod
    def _no_hash_tag(cls, value: str) -> str:
        # A brace would change the {t:<id>} hash tag that keeps a task's keys in one cluster slot.
        if "{" in value or "}" in value:
            raise ValueError("must not contain '{' or '}'")
        return value
