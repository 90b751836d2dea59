"""Usage of work nested inside a step (U2-4): a replayed or resumed parent counts what it really spent.

A tool that runs a delegate agent with `usage=ctx.usage`, or a capability `@durable_operation` that
does, adds the delegate's requests, tokens and cost to the parent's usage while its body runs. A
replay does not run the body, so that usage must come from the journal: after a replay, and after a
crash at any step, the parent's usage equals an uninterrupted run's.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.usage import RunUsage

from pydantic_ai_durable import Durable, Journal
from pydantic_ai_durable.testing import ScriptedModel, SideEffects, ToolCall, assert_replays, crash_everywhere

effects = SideEffects()


def delegate(durable: bool) -> Agent[None, str]:
    """A delegate agent: two requests of its own, 50 + 60 input tokens."""
    model = ScriptedModel([[ToolCall('note', {'text': 'x'}, id='d1')], 'delegated'])
    agent: Agent[None, str] = Agent(model, name='delegate', capabilities=[Durable()] if durable else [])

    @agent.tool_plain
    def note(text: str) -> str:
        effects.record('note')
        return f'noted {text}'

    return agent


class Research(AbstractCapability[Any]):
    """A capability whose durable operation runs the delegate agent after each model response."""

    id = 'research'

    def __init__(self, durable_delegate: bool) -> None:
        self.durable_delegate = durable_delegate

    @durable_operation('research')
    async def research(self, ctx: RunContext[Any], topic: str) -> str:
        result = await delegate(self.durable_delegate).run(topic, usage=ctx.usage)
        return result.output

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: Any
    ) -> Any:
        if ctx.usage.requests == 1:  # once, after the parent's first response
            await self.research(ctx, 'topic')
        return response


def parent(how: str, durable_delegate: bool) -> Agent[None, str]:
    model = ScriptedModel([[ToolCall('ask', {'question': 'why'}, id='p1')], 'done'])
    capabilities: list[Any] = [Durable()]
    if how == 'operation':
        capabilities.insert(0, Research(durable_delegate))
    agent: Agent[None, str] = Agent(
        model, name='parent', toolsets=[FunctionToolset([], id='none')], capabilities=capabilities
    )

    @agent.tool
    async def ask(ctx: RunContext[None], question: str) -> str:
        effects.record('ask')
        if how == 'tool':
            return (await delegate(durable_delegate).run(question, usage=ctx.usage)).output
        return 'asked'

    return agent


def usage_of(result: Any) -> RunUsage:
    usage = result.usage  # a `RunUsage`; older releases had a method, and calling 2.68's value is deprecated
    return usage if isinstance(usage, RunUsage) else usage()


async def tool_plain() -> Any:
    result = await parent('tool', durable_delegate=False).run('go')
    return (result.output, usage_of(result))


async def tool_durable() -> Any:
    result = await parent('tool', durable_delegate=True).run('go')
    return (result.output, usage_of(result))


async def operation_plain() -> Any:
    result = await parent('operation', durable_delegate=False).run('go')
    return (result.output, usage_of(result))


SCENARIOS = {'tool-delegate': tool_plain, 'tool-durable-delegate': tool_durable, 'operation-delegate': operation_plain}


@pytest.mark.parametrize('scenario', SCENARIOS.values(), ids=SCENARIOS.keys())
async def test_u2_4_a_replayed_parent_counts_the_usage_of_work_nested_in_its_steps(
    journal: Journal, scenario: Any
) -> None:
    uninterrupted = await scenario()  # outside an execution: what the run really spends
    _output, usage = uninterrupted
    assert usage.requests == 4  # the parent's two and the delegate's two
    report = await assert_replays(scenario, journal=journal)
    assert report.first == uninterrupted
    assert report.second == uninterrupted  # the replay counts the delegate's requests too


@pytest.mark.parametrize('scenario', SCENARIOS.values(), ids=SCENARIOS.keys())
async def test_u2_4_a_resumed_parent_counts_the_usage_of_nested_work_after_a_crash_at_any_step(
    journal: Journal, scenario: Any
) -> None:
    # After each record: nothing crashed mid-flight, so nothing was paid twice, and the output (with the
    # usage) must be the uninterrupted run's. (A crash inside a model request re-sends it: paid twice.)
    await crash_everywhere(scenario, journal=journal, points=['after_record'])
