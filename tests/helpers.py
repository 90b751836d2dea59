"""Shared building blocks for the end-to-end tests: counting models and tools, journals per backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from pydantic_ai_durable import Durable, Journal


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]


def responses(messages: list[ModelMessage]) -> int:
    return sum(isinstance(message, ModelResponse) for message in messages)


@dataclass
class Calls:
    """Counts calls by name; the counters are what a replay must not increase."""

    counts: dict[str, int] = field(default_factory=dict)

    def hit(self, name: str) -> int:
        self.counts[name] = self.counts.get(name, 0) + 1
        return self.counts[name]

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)


def two_step_model(calls: Calls, *, fail_final: bool = False, usages: tuple[RequestUsage, ...] = ()) -> FunctionModel:
    """Asks for `query` once, then answers with what it returned (SCENARIOS' two-step agent)."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        turn = responses(messages)
        usage = usages[turn] if turn < len(usages) else None
        if turn == 0:
            response = ModelResponse(parts=[ToolCallPart('query', {'sql': 'select 3'}, tool_call_id='q1')])
        else:
            if fail_final:
                raise RuntimeError('model crashed')
            response = ModelResponse(parts=[TextPart(f'answer: {tool_returns(messages)[-1].content}')])
        if usage is not None:
            response.usage = usage
        return response

    return FunctionModel(model, model_name='two-step')


def two_step_agent(
    journal: Journal | None, calls: Calls, *, fail_final: bool = False, **agent_kwargs: Any
) -> Agent[None, str]:
    def query(sql: str) -> str:
        calls.hit('tool')
        return '3 rows'

    return Agent(
        two_step_model(calls, fail_final=fail_final),
        name='two_step',
        toolsets=[FunctionToolset([query], id='db')],
        capabilities=[Durable(journal=journal)],
        **agent_kwargs,
    )


JournalFactory = Callable[[], Journal]
