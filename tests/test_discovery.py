"""Tool discovery replays only while the toolset still lists what it listed when recorded (DV-1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import DynamicToolset

from pydantic_ai_durable import Durable, Journal, execution


class Catalog:
    """A tool server whose tool list an operator changes between two attempts."""

    def __init__(self) -> None:
        self.version = 1
        self.listings = 0

    def toolset(self, ctx: RunContext[Any]) -> FunctionToolset[Any]:
        self.listings += 1

        def lookup_v1(sku: str) -> str:
            return f'{sku}: 3 in stock'

        def lookup_v2(sku: str, warehouse: str = 'main') -> str:
            return f'{sku}: 3 in stock at {warehouse}'

        return FunctionToolset([lookup_v1 if self.version == 1 else lookup_v2])


def _agent(journal: Journal, catalog: Catalog, seen: list[list[str]], *, crash: bool) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(sorted(tool.name for tool in info.function_tools))
        answered = sum(isinstance(message, ModelResponse) for message in messages)
        if answered == 0:
            return ModelResponse(parts=[ToolCallPart(seen[-1][0], {'sku': 'A1'}, tool_call_id='c1')])
        if crash:
            raise RuntimeError('the process died here')
        return ModelResponse(parts=[TextPart('done')])

    return Agent(
        FunctionModel(model, model_name='catalog-model'),
        name='shop',
        toolsets=[DynamicToolset(catalog.toolset, id='catalog')],
        capabilities=[Durable(journal)],
    )


async def test_dv_1_a_changed_tool_list_is_a_divergence_and_live_steps_see_the_new_tools(
    new_journal: Callable[[], Journal],
) -> None:
    catalog = Catalog()
    first: list[list[str]] = []
    with pytest.raises(RuntimeError, match='died'):
        async with execution('order-dv1', journal=new_journal()):
            await _agent(new_journal(), catalog, first, crash=True).run('stock of A1?')
    assert first == [['lookup_v1'], ['lookup_v1']]

    catalog.version = 2  # the server was redeployed before the resume
    second: list[list[str]] = []
    async with execution('order-dv1', journal=new_journal()) as handle:
        result = await _agent(new_journal(), catalog, second, crash=False).run('stock of A1?')
    assert result.output == 'done'
    assert second and all(tools == ['lookup_v2'] for tools in second), second
    [divergence] = handle.stats.divergences
    assert divergence.position == 0
    assert 'catalog' in divergence.name
    assert 'tools' in divergence.reason


async def test_dv_1_an_unchanged_tool_list_still_replays(new_journal: Callable[[], Journal]) -> None:
    catalog = Catalog()
    with pytest.raises(RuntimeError, match='died'):
        async with execution('order-dv1b', journal=new_journal()):
            await _agent(new_journal(), catalog, [], crash=True).run('stock of A1?')
    listed = catalog.listings
    second: list[list[str]] = []
    async with execution('order-dv1b', journal=new_journal()) as handle:
        await _agent(new_journal(), catalog, second, crash=False).run('stock of A1?')
    assert handle.stats.divergences == []
    assert handle.stats.replayed['model'] == 1 and handle.stats.replayed['tool'] == 1
    assert handle.stats.replayed['other'] == 2  # both listings replay, each checked by listing again
    assert catalog.listings == listed + 2  # each replayed listing was checked against a fresh one
    assert second == [['lookup_v1']]
