"""The agent the waiting tests run (WT): a refund needs a person's approval, a carrier's answer comes from outside.

In-process tests and killed child processes build it alike. Every model request and every tool's side
effect appends a line to a log file, so a test counts what really ran across processes. `kill` names the
points where the process SIGKILLs itself: `refund` inside the approved tool before its side effect,
`model-2` in the model request after the decisions (the approved tool's step is recorded by then).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.exceptions import CallDeferred
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import Durable, Journal, execution

PROMPT = 'refund order 7'
KEY = 'order-7'
HOSTILE_PARCEL = '</pre><script>window.__pwned=6</script><b id="injected">p-1</b>'

CALLS = {
    'one': [ToolCallPart('lookup', {'order': 7}, tool_call_id='c1'), ToolCallPart('refund', {'amount': 5}, 'c2')],
    'three': [
        ToolCallPart('refund', {'amount': 5}, tool_call_id='c2'),
        ToolCallPart('refund', {'amount': 900}, tool_call_id='c3'),
        ToolCallPart('carrier', {'parcel': 'p-1'}, tool_call_id='c4'),
    ],
    'hostile': [  # the console's tests: a parcel name made of markup, in the arguments and the deferral's metadata
        ToolCallPart('refund', {'amount': 5}, tool_call_id='c2'),
        ToolCallPart('refund', {'amount': 900}, tool_call_id='c3'),
        ToolCallPart('carrier', {'parcel': HOSTILE_PARCEL}, tool_call_id='c4'),
    ],
}
"""What the model asks for in its first response, per scenario."""

QUESTIONS = {
    'questions': [
        {
            'header': 'Seat',
            'question': 'Which seat do you want?',
            'options': [{'label': 'Window'}, {'label': 'Aisle', 'description': 'easier to leave'}],
        },
        {
            'header': 'Meals',
            'question': 'Which meals?',
            'options': [{'label': 'Breakfast'}, {'label': 'Dinner'}, {'label': 'None'}],
            'multi_select': True,
        },
    ]
}
"""What the agent of pydantic-ai-harness's `AskUser` asks a person (WT-6)."""


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def note(log: Path, line: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + '\n').encode())
    finally:
        os.close(fd)


def summary(messages: list[ModelMessage]) -> str:
    """The final answer: every tool result the model was sent, by call id."""
    returns = sorted(
        (part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)),
        key=lambda part: part.tool_call_id,
    )
    return ' | '.join(f'{part.tool_call_id} {part.tool_name}: {part.content}' for part in returns)


def build(
    journal: Journal | None,
    log: Path,
    *,
    scenario: str = 'one',
    durable: bool = True,
    kill: frozenset[str] = frozenset(),
    refund_timeout: object = None,
    carrier_timeout: object = None,
    **durable_options: Any,
) -> Agent[None, str | DeferredToolRequests]:
    """The agent; `durable=False` builds the same agent without `Durable`, for pydantic-ai's own two runs.

    `refund_timeout` goes into the refund tool's metadata, `carrier_timeout` into the carrier's deferral
    metadata, each as `wait_timeout` (WT-5).
    """
    turns = {'count': 0}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turns['count'] += 1
        note(log, 'model')
        returned = [p.tool_name for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if 'model-2' in kill and set(returned) - {'lookup'}:
            os.kill(os.getpid(), signal.SIGKILL)
        if not returned:
            return ModelResponse(parts=list(CALLS[scenario]))
        return ModelResponse(parts=[TextPart(summary(messages))])

    capabilities = [Durable(journal, **durable_options)] if durable else []
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model, model_name='waiting'),
        name='refunds',
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        capabilities=capabilities,
    )

    @agent.tool_plain
    def lookup(order: int) -> str:
        note(log, f'lookup {order}')
        return f'order {order}: paid 5'

    refund_metadata: dict[str, Any] = {'team': 'billing'}
    if refund_timeout is not None:
        refund_metadata['wait_timeout'] = refund_timeout
    deferral: dict[str, Any] = {'queue': 'carriers'}
    if carrier_timeout is not None:
        deferral['wait_timeout'] = carrier_timeout

    @agent.tool_plain(requires_approval=True, metadata=refund_metadata)
    def refund(amount: int) -> str:
        if 'refund' in kill:
            os.kill(os.getpid(), signal.SIGKILL)
        note(log, f'refund {amount}')
        return f'refunded {amount}'

    @agent.tool_plain
    def carrier(parcel: str) -> str:
        raise CallDeferred(metadata={**deferral, 'parcel': parcel})

    return agent


async def attempt(journal: Journal, log: Path, scenario: str = 'one', **options: Any) -> Any:
    """One attempt of the app's code, the same every time (no history kept, no results passed): its output."""
    agent = build(journal, log, scenario=scenario, **options)
    async with execution(KEY, journal=journal):
        result = await agent.run(PROMPT)
    return result.output


async def plain_two_runs(
    log: Path, scenario: str, results: DeferredToolResults
) -> tuple[str | DeferredToolRequests, list[str]]:
    """pydantic-ai's own way, without durability: run 1 ends deferred, run 2 gets the history and the results."""
    agent = build(None, log, scenario=scenario, durable=False)
    first = await agent.run(PROMPT)
    assert isinstance(first.output, DeferredToolRequests)
    second = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
    return second.output, lines(log)


def asking_agent(journal: Journal | None, log: Path) -> Agent[None, str | DeferredToolRequests]:
    """An agent whose model asks a person `QUESTIONS` through pydantic-ai-harness's `AskUser(answerer=None)`."""
    from pydantic_ai_harness import AskUser

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        note(log, 'model')
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[ToolCallPart('ask_user_question', QUESTIONS, tool_call_id='q1')])
        return ModelResponse(parts=[TextPart(summary(messages))])

    capabilities: list[Any] = [AskUser(answerer=None)]
    if journal is not None:
        capabilities.append(Durable(journal))
    return Agent(
        FunctionModel(model, model_name='asking'),
        name='trips',
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        capabilities=capabilities,
    )
