"""Journaling for leaf toolsets pydantic-ai does not run as durable units (P-5, T-rules).

Function, dynamic and MCP toolsets are journaled by pydantic-ai's own durable wrappers. Any other
leaf (a custom `AbstractToolset`, an `ExternalToolset`) would silently run again on every retry,
and such toolsets are often the side-effecting ones, so `Durable` wraps them in this toolset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from .._active_run import ActiveRun, active_run
from .._core import Step
from ._opt_out import toolset_opts_out
from ._payloads import call_and_encode, load_outcome, outcome
from ._pipeline import run_step
from ._tool import ToolCall

__all__ = ('DurableLeafToolset', 'LeafCall')


@dataclass
class DurableLeafToolset(WrapperToolset[AgentDepsT]):
    """Records each call of the wrapped leaf as a tool step, and replays it on a later attempt.

    A toolset with a `replayable = False` attribute still takes a position but always runs live. `owner` is
    the capability whose active run the calls are journaled in, `agent_name` the name its steps carry.
    """

    owner: object = field(default=None, repr=False)
    agent_name: str = field(default='', repr=False)

    @property
    def id(self) -> str | None:
        return self.wrapped.id

    def visit_and_replace(
        self, visitor: Callable[[AbstractToolset[AgentDepsT]], AbstractToolset[AgentDepsT]]
    ) -> AbstractToolset[AgentDepsT]:
        return self  # visiting again on the next run must not wrap twice

    def step_name(self, tool_name: str) -> str:
        toolset = self.wrapped.id or type(self.wrapped).__name__
        return f'{self.agent_name}__leaf_toolset__{toolset}.call_tool:{tool_name}'

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[AgentDepsT], tool: ToolsetTool[AgentDepsT]
    ) -> Any:
        active = active_run(self.owner)
        if active is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        return await run_step(
            active,
            LeafCall(
                name=self.step_name(name),
                replayable=not toolset_opts_out(self.wrapped),
                decoder=load_outcome,  # values are returned, control-flow signals raised, decoded once
                hands_on=False,
                tool_name=name,
                args=tool_args,
                tool_call_id=ctx.tool_call_id,
                ctx=ctx,
                toolset=self.wrapped,
                tool=tool,
            ),
        )


@dataclass
class LeafCall(ToolCall):
    """A call of a leaf toolset's tool: counted as a tool call, its outcome encoded by the package."""

    toolset: AbstractToolset[Any]
    tool: ToolsetTool[Any]
    outcome: object = field(default=None, init=False)
    """The live outcome: the value returned, or the control-flow signal raised, to hand on once recorded."""

    def replayed(self, active: ActiveRun, step: Step, value: object) -> object:
        super().replayed(active, step, value)
        return outcome(value)

    def going_live(self, active: ActiveRun, step: Step) -> None:
        self.ctx = dataclasses.replace(self.ctx)  # this call's own context, whose usage NestedUsage swaps
        super().going_live(active, step)

    async def live(self, active: ActiveRun) -> object:
        self.outcome, payload = await call_and_encode(self._call, tool_name=self.tool_name)
        return payload

    def _call(self) -> Awaitable[Any]:
        return self.toolset.call_tool(self.tool_name, self.args, self.ctx, self.tool)

    def finished(self, active: ActiveRun, step: Step, payload: object) -> object:
        return outcome(self.outcome)
