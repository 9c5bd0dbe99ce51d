"""Reloading the config file while the gateway serves (SIGHUP, `POST /admin/reload`): which keys a
reload applies, reading the file again, refusing a bad one, and the one log line and the metric each
reload leaves.

A reload applies the `RELOADABLE` keys of the new file and keeps every other key as it was: those name
things built once at start (listeners, the store, the single upstream, TLS, ...), and their changes are
named in the log line as needing a restart. With several upstreams before and after, the upstream list
is applied too (`served_upstreams`): upstreams are added and removed, but an entry whose settings
changed keeps its old ones until a restart. What a new key means for the requests already under way is each
part's own (`gateway.assembly.reload` applies them): they finish with what they started with.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gateway.config import Config, ConfigError, ConfigUnreadable, UpstreamConfig, parse_config, read_config_bytes
from gateway.metrics import Metrics

log = logging.getLogger("gateway")

RELOADABLE: tuple[str, ...] = (
    "auth.api_keys",
    "auth.jwt",
    "auth.introspection",
    "auth.token_cache_s",
    "auth.rules",
    "auth.limits",
    "rules",
    "tasks.tools",
    "retention",
)
"""The keys a reload applies (each a top-level key or a key of a top-level section, with all it holds);
every other change needs a restart."""

DIGEST_CHARS = 12
"""How much of the file's SHA-256 /readyz and the log lines show: enough to tell two files apart."""

Result = Literal["ok", "invalid", "failed"]


def digest(data: bytes) -> str:
    """The short SHA-256 of the config file's bytes."""
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    config: Config
    digest: str | None
    """The short SHA-256 of the file it was read from (None: no file, the defaults)."""


def served_upstreams(current: Config, new: Config) -> list[UpstreamConfig]:
    """The `[[upstreams]]` a reload serves: with several upstreams before and after, `new`'s (in its
    order), but an entry of a name served now keeps its current settings (a restart applies theirs);
    else the current ones (going from one upstream to several, or back, needs a restart)."""
    if not (current.aggregating and new.aggregating):
        return current.upstreams
    served = {upstream.name: upstream for upstream in current.upstreams}
    return [served.get(upstream.name, upstream) for upstream in new.upstreams]


def reloadable(current: Config, new: Config) -> Config:
    """`current` with the `RELOADABLE` keys of `new` and its `served_upstreams`: what a reload applies."""
    updates: dict[str, dict[str, Any]] = {}
    for key in RELOADABLE:
        section, _, name = key.rpartition(".")
        updates.setdefault(section, {})[name] = getattr(getattr(new, section) if section else new, name)
    top = updates.pop("", {})
    for section, fields in updates.items():
        top[section] = getattr(current, section).model_copy(update=fields)
    return current.model_copy(update={**top, "upstreams": served_upstreams(current, new)})


def changed_keys(old: Config, new: Config) -> list[str]:
    """The dotted keys whose values differ, down to the tables (a list, `[[...]]`, is one key)."""
    return _differences(old.model_dump(), new.model_dump(), "")


def restart_keys(applied: Config, new: Config) -> list[str]:
    """The keys of `new` that `applied` keeps the old values of: `changed_keys`, each upstream entry
    kept as it was named (`upstreams.NAME`) where the upstream list itself was applied."""
    keys = changed_keys(applied, new)
    if "upstreams" not in keys or not (applied.aggregating and new.aggregating):
        return keys
    kept = [
        f"upstreams.{upstream.name}"
        for upstream, wanted in zip(applied.upstreams, new.upstreams, strict=True)
        if upstream != wanted
    ]
    return [key for key in keys if key != "upstreams"] + kept


def _differences(old: object, new: object, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(dict.fromkeys([*old, *new]))
        return [key for name in keys for key in _differences(old.get(name), new.get(name), f"{prefix}{name}.")]
    return [prefix.rstrip(".")] if old != new else []


class ConfigReloader:
    """The config file the gateway was started with, read again on request and applied.

    `finish` turns the file's config into the one served (the command line's flags applied over it, as
    at start). The app `attach`es what applies a config and counts reloads once it is built; a
    reload asked for before then, or while one runs, waits for it (reloads run one at a time)."""

    def __init__(self, path: str | Path | None, finish: Callable[[Config], Config] = lambda config: config) -> None:
        self._path = path
        self._finish = finish
        self._lock = asyncio.Lock()
        self._apply: Callable[[Config], Awaitable[None]] | None = None
        self._metrics: Metrics | None = None
        self._pending: set[asyncio.Task[Result]] = set()
        self.current = self.load()

    def load(self) -> LoadedConfig:
        """The file read and validated now; ConfigError (ConfigUnreadable) naming the key or the reason."""
        if self._path is None:
            return LoadedConfig(self._finish(Config()), None)
        data = read_config_bytes(self._path)
        return LoadedConfig(self._finish(parse_config(data, self._path)), digest(data))

    def attach(self, apply: Callable[[Config], Awaitable[None]], metrics: Metrics) -> None:
        """Reloads from now on apply the config with `apply` (all or nothing: it raises having changed
        nothing) and are counted in `metrics`."""
        self._apply = apply
        self._metrics = metrics

    def reload_soon(self) -> None:
        """Reload in the background (the SIGHUP handler: a signal handler must not wait)."""
        task = asyncio.ensure_future(self.reload())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def reload(self) -> Result:
        """Read the file again and apply its reloadable keys; the old config stays unless `ok`."""
        async with self._lock:
            result = await self._reload()
        if self._metrics is not None:
            self._metrics.config_reloads.labels(result=result).inc()
        return result

    async def _reload(self) -> Result:
        if self._apply is None:
            log.warning("config reload ignored: the gateway is not serving yet")
            return "failed"
        try:
            loaded = self.load()
        except ConfigUnreadable as exc:
            log.error("config reload failed, the old config stays: %s", exc)
            return "failed"
        except ConfigError as exc:
            log.error("config reload refused, the old config stays: %s", exc)
            return "invalid"
        old = self.current.config
        applied = reloadable(old, loaded.config)
        try:
            await self._apply(applied)
        except Exception as exc:  # a part could not be built from it (a bad key set): nothing changed
            log.exception("config reload failed, the old config stays: %s", exc)
            return "failed"
        self.current = LoadedConfig(applied, loaded.digest)
        changed = changed_keys(old, applied)
        needs_restart = restart_keys(applied, loaded.config)
        extra = {"config": loaded.digest, "changed": changed, "needs_restart": needs_restart}
        if needs_restart:
            log.warning(
                "config reloaded; these keys need a restart and keep their old values: %s",
                ", ".join(needs_restart),
                extra=extra,
            )
        else:
            log.info("config reloaded", extra=extra)
        return "ok"
