"""The agent both fleet examples run: charge a card, then ship the order, each a side effect.

A function model stands in for the LLM, so the examples run offline. Each side effect appends a line to
the file `ORDERS_EFFECTS` names, so a demo can count them: `charging X` when a payment call starts,
`charged X` when it ends, `shipped X`.
"""

from __future__ import annotations

import asyncio
import os

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import Durable


def _effect(line: str) -> None:
    with open(os.environ.get('ORDERS_EFFECTS', 'effects.txt'), 'a') as file:
        file.write(line + '\n')


async def charge_card(order: str, amount: int) -> str:
    _effect(f'charging {order}')
    await asyncio.sleep(1.0)  # a slow payment provider: the demos kill workers in here
    _effect(f'charged {order}')
    return f'charged {amount} EUR for {order}'


async def ship_order(order: str) -> str:
    _effect(f'shipped {order}')
    return f'{order} shipped'


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Charge the order named in the prompt, then ship it, then answer."""
    prompt = next(part.content for part in messages[0].parts if isinstance(part, UserPromptPart))
    order = str(prompt).removeprefix('Process ')
    turn = sum(isinstance(message, ModelResponse) for message in messages)
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart('charge_card', {'order': order, 'amount': 30})])
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart('ship_order', {'order': order})])
    return ModelResponse(parts=[TextPart('Charged and shipped.')])


agent = Agent(
    FunctionModel(_model, model_name='scripted'),
    name='orders',
    instructions='Charge the order, then ship it.',
    toolsets=[FunctionToolset([charge_card, ship_order], id='shop')],
    capabilities=[Durable()],  # the journal comes from the task's execution
)


async def process(order: str) -> str:
    result = await agent.run(f'Process {order}')
    return f'{order}: {result.output}'
