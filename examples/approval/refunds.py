"""The agent of the approval example, and its durable task: a refund, and every refund needs a person's approval.

A function model stands in for the LLM, so the example runs offline: it asks for the refund the prompt
names, then answers with what the refund tool returned (or that it was denied). The refund appends a
line to `effects.txt` in `APPROVAL_DATA`, the side effect that must happen once; the model notes when it
starts its answer and takes a second to give it (a slow LLM), the moment the example's test kills the
worker in. The web app and the worker both import this module: it defines the task, so both know it.
"""

from __future__ import annotations

import asyncio
import os

from jobs import app
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import Durable

THREE_DAYS = 3 * 24 * 3600


def note(line: str) -> None:
    data = os.environ.get('APPROVAL_DATA', 'approval-data')
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, 'effects.txt'), 'a') as file:
        file.write(line + '\n')


def prompt_for(order: str, amount: int) -> str:
    return f'Refund {amount} EUR for order {order}.'


async def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt = str(next(part.content for part in messages[0].parts if isinstance(part, UserPromptPart)))
    words = prompt.split()
    amount, order = int(words[1]), words[-1].rstrip('.')
    returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart('refund', {'order': order, 'amount': amount})])
    note(f'answering {order}')
    await asyncio.sleep(1.0)  # a slow model: the example's test kills the worker here
    return ModelResponse(parts=[TextPart(f'{order}: {returned[-1].content}')])


agent: Agent[None, str | DeferredToolRequests] = Agent(
    FunctionModel(_model, model_name='scripted'),
    name='refunds',
    output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
    # A refund nobody decided within three days is denied by the sweep the worker runs.
    capabilities=[Durable(wait_timeout=THREE_DAYS)],
)


@agent.tool_plain(requires_approval=True)
def refund(order: str, amount: int) -> str:
    """Pay the customer back: the side effect a person must approve."""
    note(f'refunded {order}')
    return f'refunded {amount} EUR'


TASK = 'refund'
"""The durable task's name: the execution of order `A-1` is `refund:A-1`."""


@app.task(TASK, resume_after=1.0)
async def refund_order(order: str, amount: int) -> str | DeferredToolRequests:
    """The task a worker runs: the same code the first time, after a worker died, and once decided."""
    return (await agent.run(prompt_for(order, amount))).output
