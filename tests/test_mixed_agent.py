"""One agent that uses every kind of step at once, crashed at every step boundary (M-5, U-16, U2-1).

Function, dynamic and MCP-like (a custom leaf) toolsets run in one parallel batch, an
`event_stream_handler` sees every tool event, and a capability's `@durable_operation` reports usage
of its own after each model response. Scenarios like this come from other durable-execution test
suites; each kind of step alone passes its own tests, the mix is what found the bugs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.messages import AgentStreamEvent, FunctionToolCallEvent, FunctionToolResultEvent, ModelResponse
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RunUsage

from pydantic_ai_durable import Durable, Journal, execution
from pydantic_ai_durable.testing import ScriptedModel, SideEffects, ToolCall, assert_replays, crash_everywhere

effects = SideEffects()

_ARGS = TypeAdapter(dict[str, Any]).validator

ACCRUED = 'accrued_units'
"""The usage detail only the capability operation reports, so the test can tell its usage apart."""


class Catalog(AbstractToolset[Any]):
    """An MCP-like leaf toolset: lists its tools and calls them itself, so only `Durable` journals it."""

    @property
    def id(self) -> str | None:
        return 'catalog'

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tool_def = ToolDefinition(name='find_item', parameters_json_schema={'type': 'object'})
        return {'find_item': ToolsetTool(toolset=self, tool_def=tool_def, max_retries=1, args_validator=_ARGS)}

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        effects.record('find_item')
        return f'item {tool_args["sku"]} in stock'


class Accounting(AbstractCapability[Any]):
    """Books every model response through a durable operation that spends usage of its own."""

    id = 'accounting'

    @durable_operation('book')
    async def book(self, ctx: RunContext[Any], messages: int) -> str:
        effects.record('book')
        ctx.usage.incr(RunUsage(input_tokens=5, details={ACCRUED: 1}))
        return f'booked after {messages} messages'

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        await self.book(ctx, len(request_context.messages))
        return response


async def on_events(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    async for event in events:
        if isinstance(event, (FunctionToolCallEvent, FunctionToolResultEvent)):
            effects.record('event')


def price(sku: str) -> str:
    effects.record('price')
    return f'{sku}: 12 EUR'


async def reserve(sku: str) -> str:
    await asyncio.sleep(0.02)  # the slowest call of its batch: the others' results reach the handler first
    effects.record('reserve')
    return f'{sku} reserved'


def shop_agent() -> Agent[None, str]:
    model = ScriptedModel(
        [
            [
                ToolCall('price', {'sku': 'a1'}, id='c1'),
                ToolCall('find_item', {'sku': 'a1'}, id='c2'),
                ToolCall('reserve', {'sku': 'a1'}, id='c3'),
            ],
            [ToolCall('reserve', {'sku': 'b2'}, id='c4')],
            'a1 and b2 reserved',
        ]
    )
    return Agent(
        model,
        name='shop',
        toolsets=[
            FunctionToolset([price], id='prices'),
            DynamicToolset(lambda ctx: FunctionToolset([reserve]), id='stock'),
            Catalog(),
        ],
        capabilities=[Accounting(), Durable(event_stream_handler=on_events)],
    )


async def shop() -> AgentRunResult[str]:
    return await shop_agent().run('reserve a1 and b2')


async def shop_with_usage() -> tuple[str, dict[str, Any]]:
    """The output together with the usage the run reports: a replay must leave it unchanged."""
    result = await shop_agent().run('reserve a1 and b2')
    usage = result.usage
    return result.output, {
        ACCRUED: usage.details.get(ACCRUED),
        'input_tokens': usage.input_tokens,
        'output_tokens': usage.output_tokens,
        'tool_calls': usage.tool_calls,
    }


async def test_m5_mixed_agent_replays_in_full(journal: Journal) -> None:
    await assert_replays(shop, journal=journal)


async def test_m5_mixed_agent_resumes_from_a_crash_at_any_step(journal: Journal) -> None:
    report = await crash_everywhere(shop, journal=journal)
    names = {step.name for step in report.steps}
    assert 'shop__event_stream_handler' in names
    assert 'shop__dynamic_toolset__stock.call_tool:reserve' in names
    assert 'shop__capability__accounting.book' in names


async def shop_with_operation_usage() -> tuple[str, dict[str, Any]]:
    """The output with the usage a crash must leave unchanged: a crash inside a model request counts the
    request (U2-1), and one inside its encoding loses the tokens (UW-1), so neither is compared here."""
    output, usage = await shop_with_usage()
    return output, {ACCRUED: usage[ACCRUED], 'tool_calls': usage['tool_calls']}


async def test_u16_operation_usage_counts_once_per_live_run_over_crashes(journal: Journal) -> None:
    report = await crash_everywhere(shop_with_operation_usage, journal=journal)
    _output, usage = report.output
    assert usage[ACCRUED] == 3  # one booking per model response


async def test_u16_replayed_operation_adds_no_usage(journal: Journal) -> None:
    async with execution('u16-replay', journal=journal, cleanup='keep') as live:
        first = await shop_with_usage()
    async with execution('u16-replay', journal=journal) as replay:
        second = await shop_with_usage()
    assert second == first
    assert live.usage.attempt.details[ACCRUED] == 3  # the live attempt's own spend includes the operations'
    assert replay.stats.recorded == {}
    assert replay.usage.attempt.details.get(ACCRUED) is None
    assert replay.usage.total.details[ACCRUED] == 3
