"""An in-process stand-in for the upstream and its one conversation, for unit tests of the layers above
the links (no process, no socket). Subclasses say which requests it answers (`request`) and whether it
lends itself for 2026-07-28 requests (`stateless`); everything else the gateway must not ask of it."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager

from gateway.protocol.jsonrpc import Message
from gateway.upstream.base import UnsolicitedHandler, Upstream, UpstreamChannel


class OneConversation(UpstreamChannel, Upstream):
    async def notify(self, message: Message, headers: Mapping[str, str]) -> None:
        raise AssertionError(f"unexpected notification {message}")

    async def respond(self, message: Message, headers: Mapping[str, str]) -> None:
        raise AssertionError(f"unexpected response {message}")

    def set_unsolicited_handler(self, handler: UnsolicitedHandler | None) -> None:
        pass

    async def open_session(self) -> UpstreamChannel:
        return self

    def stateless(
        self, affinity: str | None = None, *, beside: bool = False, owner: str | None = None
    ) -> AbstractAsyncContextManager[UpstreamChannel]:
        raise AssertionError("unexpected stateless request")

    def probe_session(self) -> AbstractAsyncContextManager[UpstreamChannel]:
        raise AssertionError("unexpected readiness check")

    def pin(self, affinity: str, channel: UpstreamChannel) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass
