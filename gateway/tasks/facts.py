"""What the upstream declares that a call's plan depends on, gathered before the call is planned, so
that the planner (`TaskService.plan`) does no I/O to learn it and can be driven with facts as data.

The facts (`plans.UpstreamFacts`): whether the upstream has Tasks in the call's era and serves
`tasks/stream` itself (a legacy session's from its `initialize`, `Session.upstream_capabilities`; a
2026-07-28 call's from the upstream's cached `server/discover`, asked once), and, for a tools/call whose
plan depends on it, what a 2025-11-25 upstream with Tasks says of the tool's tasks (its tools/list marks,
kept per session and asked for when a tool was not listed yet: `gateway.tasks.tool_marks`).
"""

from __future__ import annotations

import weakref

from gateway.config import TasksConfig
from gateway.protocol import jsonrpc
from gateway.sessions import Session
from gateway.tasks.plans import TaskCall, UpstreamFacts
from gateway.tasks.policy import UpstreamSupport, policy_support
from gateway.tasks.tool_marks import ASK_TIMEOUT_S, ToolMarks
from gateway.upstream.base import Upstream


class FactGatherer:
    """Gathers the `UpstreamFacts` of each call, and keeps each legacy session's tool marks."""

    def __init__(self, upstream: Upstream, tasks: TasksConfig, probe_timeout_s: float) -> None:
        self._upstream = upstream
        self.tasks = tasks
        """The task policies calls are judged by (replaced on a config reload)."""
        self._probe_timeout_s = probe_timeout_s
        self._tool_marks: weakref.WeakKeyDictionary[Session, ToolMarks] = weakref.WeakKeyDictionary()
        """Per legacy session whose upstream has Tasks: what its tools/list says of each tool's tasks."""

    def marks(self, session: Session) -> ToolMarks:
        """The tool marks of `session`'s upstream, as learned so far (also from its forwarded tools/list)."""
        return self._tool_marks.setdefault(session, ToolMarks())

    async def gather(self, call: TaskCall) -> UpstreamFacts:
        """The facts `call`'s plan depends on; may ask the upstream (its discover, its tools/list)."""
        if call.session is not None:
            declared = call.session.upstream_capabilities
        else:
            declared = await self._upstream.capabilities(self._probe_timeout_s)
        support = await self._tool_support(call) if declared.tasks else UpstreamSupport.UNKNOWN
        return UpstreamFacts(declared.tasks, declared.event_streams, support)

    async def _tool_support(self, call: TaskCall) -> UpstreamSupport:
        """What the upstream says of the tasks of the tool a tools/call names, where the plan depends on
        it. A 2026-07-28 upstream decides per call (its tools carry no mark); a 2025-11-25 one marks each
        tool in its tools/list, asked for when the tool was not listed yet."""
        name = jsonrpc.params_of(call.message).get("name")
        session = call.session
        if call.method != "tools/call" or session is None or not isinstance(name, str):
            return UpstreamSupport.UNKNOWN
        may_be_task = call.dialect.may_create_task(call.message)
        if not (may_be_task or policy_support(self.tasks.policy_for(name), call.era) == "required"):
            # A plain call of a tool the gateway would not require as a task: the upstream answers it
            # whoever would host the tool's tasks.
            return UpstreamSupport.UNKNOWN
        marks = self.marks(session)
        if marks.of(name) is None:
            await marks.ask(session.channel, call.headers, ASK_TIMEOUT_S)
        return marks.of(name) or UpstreamSupport.UNKNOWN
