"""Following a 2026-07-28 upstream's task pushes: one `subscriptions/listen` asking for `taskIds`.

SEP-2663 pushes `notifications/tasks` only on a listen stream that named the task. For each shared
upstream channel (Streamable HTTP, where a long request holds nothing else up) the gateway keeps one
listen open for every task it watches there, reopened (debounced) when tasks are added; the new one
replaces the old once acknowledged. The pushes themselves are recorded by the channel tap like any
other upstream message; this module only keeps the subscription and says which tasks it covers. An
upstream whose acknowledgement leaves `taskIds` out does not push tasks: its tasks stay on polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable

from gateway.protocol import jsonrpc
from gateway.protocol.dialect import MODERN
from gateway.upstream.base import Exchange, UpstreamChannel

log = logging.getLogger("gateway.tasks.pushes")

ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
DEBOUNCE_S = 0.05
"""Tasks added within this long share one resubscription."""
ACK_TIMEOUT_S = 10.0
RETRY_S = 1.0
"""Pause before reopening a listen the upstream ended."""
_listen_ids = itertools.count(1)

Covered = Callable[[set[str], bool], None]
"""Told which tasks (client ids) the open subscription covers, and whether that set is new (so each
newly covered task is polled once: changes before the subscription were not pushed)."""


class TaskPushes:
    """The listen for one shared upstream channel; `watch`/`unwatch` tasks by (client id, upstream id)."""

    def __init__(self, channel: UpstreamChannel, covered: Covered) -> None:
        self._channel = channel
        self._covered = covered
        self._wanted: dict[str, str] = {}
        """client id -> upstream id."""
        self._changed = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self.supported = True
        """False once the upstream acknowledged a listen without taskIds: it does not push tasks."""

    def watch(self, client_id: str, upstream_id: str) -> None:
        if not self.supported:
            return
        self._wanted[client_id] = upstream_id
        self._changed.set()
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name=f"task-pushes-{self._channel.tag}")

    def unwatch(self, client_id: str) -> None:
        # A finished task stays in the open subscription until the next resubscription (harmless);
        # the last one closes it.
        self._wanted.pop(client_id, None)
        if not self._wanted:
            self._changed.set()

    async def _run(self) -> None:
        current: Exchange | None = None
        try:
            while self.supported:
                if current is None or self._changed.is_set():
                    await asyncio.sleep(DEBOUNCE_S)
                    self._changed.clear()
                    replacement = await self._subscribe(dict(self._wanted)) if self._wanted else None
                    if current is not None:
                        await current.cancel()
                    current = replacement
                if current is None:
                    self._covered(set(), False)
                    if not self.supported:
                        return
                    await self._changed.wait()
                    continue
                # The tap records each push as it is delivered; here the stream is only drained.
                if await current.next_batch(DEBOUNCE_S * 4) is None:
                    log.info("the upstream ended the task subscription; reopening", extra={"tag": self._channel.tag})
                    current = None
                    self._covered(set(), False)
                    await asyncio.sleep(RETRY_S)
        finally:
            if current is not None:
                await current.cancel()

    async def _subscribe(self, wanted: dict[str, str]) -> Exchange | None:
        """A new listen for `wanted`, once the upstream acknowledged it; None if it will not push tasks."""
        request, headers = MODERN.gateway_request(
            f"mcp-task-gateway-listen-{next(_listen_ids)}",
            "subscriptions/listen",
            {"notifications": {"taskIds": sorted(wanted.values())}},
        )
        exchange = await self._channel.request(request, headers)
        acknowledged: list[object] | None = None
        refused = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ACK_TIMEOUT_S):
                while acknowledged is None and not refused and (batch := await exchange.next_batch()) is not None:
                    for message in batch:
                        refused = refused or jsonrpc.is_final(message)
                        if message.get("method") == ACKNOWLEDGED:
                            filters = jsonrpc.params_of(message).get("notifications")
                            ids = filters.get("taskIds") if isinstance(filters, dict) else None
                            acknowledged = ids if isinstance(ids, list) else []
        if not acknowledged:
            await exchange.cancel()
            # An error instead of an acknowledgement, or one without taskIds: no task pushes here.
            if refused or acknowledged is not None:
                self.supported = False
                log.info("the upstream does not push task status; polling", extra={"tag": self._channel.tag})
            return None
        # The tap shows the acknowledgement in client ids.
        self._covered({client_id for client_id in wanted if client_id in acknowledged}, True)
        return exchange

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
