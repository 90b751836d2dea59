"""Journaling for leaf toolsets pydantic-ai does not run as durable units (A-8, P-5, T-rules).

Function, dynamic and MCP toolsets are journaled by pydantic-ai's own durable wrappers. Any other
leaf (a custom `AbstractToolset`, an `ExternalToolset`) would silently run again on every retry,
and such toolsets are often the side-effecting ones, so `Durable` wraps them in this toolset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from .._active_run import active_run
from .._fingerprint import tool_call_digests
from .._usage import NestedUsage
from ._opt_out import toolset_opts_out
from ._payloads import load_outcome, outcome
from ._runner import replay_tool, run_live_call

__all__ = ('DurableLeafToolset',)


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
        replayable = not toolset_opts_out(self.wrapped)
        fingerprint, call = tool_call_digests(name, tool_args, ctx.tool_call_id)
        step = active.run.claim(self.step_name(name), 'tool', fingerprint, replayable=replayable, call=call)
        done = await replay_tool(step, load_outcome, active.ledger)
        if done is not None:
            return outcome(done.value)  # values are returned, control-flow signals raised (T-5), decoded once
        active.ledger.record_live_tool_call(step.position, call=call)
        call_ctx = dataclasses.replace(ctx)  # this call's own context, whose usage NestedUsage swaps
        nested = NestedUsage(call_ctx, active.spend)  # what a delegate agent run inside the tool spends (U2-4)
        try:
            return await run_live_call(
                step,
                lambda: self.wrapped.call_tool(name, tool_args, call_ctx, tool),
                tool_name=name,
                to_record=active.mask,
                spend=lambda payload: active.tool_spend(payload, nested),
            )
        finally:
            nested.restore()
