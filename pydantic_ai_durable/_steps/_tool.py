"""A tool call as a step: fingerprinted by name and arguments, counted as pydantic-ai counts a call.

What a tool call does its own way in the pipeline: its fingerprint and its argument digest, its recorded
payload masked, the usage ledger cancelling what pydantic-ai counts for a replay and re-checking a
credited limit before a live call, and what a delegate agent run inside the body spends (U2-4).
`ToolStep` is what every step kept as a tool call shares (output functions too);
a leaf toolset's call, whose outcome the package encodes itself, is in `_leaf`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic_ai.tools import RunContext

from .._active_run import ActiveRun
from .._core import Kind, Step
from .._fingerprint import tool_call_digests
from .._usage import NestedUsage, is_successful_tool_payload
from ._pipeline import Body, StepKind

__all__ = ('RoutedToolCall', 'ToolCall', 'ToolStep')


@dataclass
class ToolStep(StepKind):
    """A step the journal keeps as a tool call: fingerprinted by name and arguments, its payload masked."""

    journal_kind: ClassVar[Kind] = 'tool'
    masked: ClassVar[bool] = True

    tool_name: str
    args: Any
    tool_call_id: str | None

    def fingerprint(self, active: ActiveRun) -> str | None:
        fingerprint, self.call = tool_call_digests(self.tool_name, self.args, self.tool_call_id)
        return fingerprint


@dataclass
class ToolCall(ToolStep):
    """One call of a tool that pydantic-ai counts in the run's usage; its subclasses say how the body runs."""

    ctx: RunContext[Any]
    """The call's own run context: its usage is what a delegate agent run inside the body adds to (U2-4)."""
    nested: NestedUsage | None = field(default=None, init=False)

    def replayed(self, active: ActiveRun, step: Step, value: object) -> object:
        if is_successful_tool_payload(step.payload):  # pydantic-ai counts it after the call returns
            active.ledger.record_tool_replay(step.position, call=step.call if step.by_arguments else None)
        return super().replayed(active, step, value)

    def going_live(self, active: ActiveRun, step: Step) -> None:
        active.ledger.record_live_tool_call(step.position, call=self.call)  # re-checks a credited limit
        self.nested = NestedUsage(self.ctx, active.spend)  # what a delegate agent run inside the tool spends (U2-4)

    def spent(self, active: ActiveRun, payload: object) -> dict[str, Any] | None:
        return active.tool_spend(payload, self.nested)

    def ended(self) -> None:
        if self.nested is not None:
            self.nested.restore()


@dataclass
class RoutedToolCall(ToolCall):
    """A call pydantic-ai routes as a durable operation (function, dynamic and MCP toolsets), with its body."""

    body: Body

    def live(self, active: ActiveRun) -> Awaitable[object]:
        return self.body()
