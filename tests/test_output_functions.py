"""Output functions are journaled steps (A-11): `ToolOutput(func)` and `TextOutput(func)` run once.

An output function often acts (files a report, sends the answer on); a retry that replays the run
must hand back its recorded result, typed as the function returns it, not call it again.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import Calls
from pydantic import BaseModel, model_validator
from pydantic_ai import Agent, ModelRetry, TextOutput, ToolOutput
from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import Durable, Journal, execution
from pydantic_ai_durable.testing import SideEffects, assert_replays, crash_everywhere

effects = SideEffects()


class Filed(BaseModel):
    ticket: int
    title: str


def file_report(title: str) -> Filed:
    """Files a report: a side effect that must not repeat."""
    effects.record('file_report')
    return Filed(ticket=7, title=title.upper())


def split_words(text: str) -> list[str]:
    effects.record('split_words')
    return text.split()


def tool_output_agent() -> Agent[None, Filed]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {'title': 'disk full'}, tool_call_id='o1')])

    return Agent(
        FunctionModel(model, model_name='reporter'),
        name='reporter',
        output_type=ToolOutput(file_report),
        capabilities=[Durable()],
    )


def text_output_agent() -> Agent[None, list[str]]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart('three little words')])

    return Agent(
        FunctionModel(model, model_name='splitter'),
        name='splitter',
        output_type=TextOutput(split_words),
        capabilities=[Durable()],
    )


async def filed() -> Filed:
    return (await tool_output_agent().run('file it')).output


async def split() -> list[str]:
    return (await text_output_agent().run('split it')).output


@pytest.mark.parametrize(('scenario', 'effect'), [(filed, 'file_report'), (split, 'split_words')], ids=['tool', 'text'])
async def test_a11_an_output_function_runs_once_and_its_typed_result_replays(
    journal: Journal, scenario: Any, effect: str
) -> None:
    report = await assert_replays(scenario, journal=journal)  # the replay calls no model, no tool, no output function
    assert report.second == report.first
    assert type(report.second) is type(report.first)  # a `Filed`, a `list`: not the JSON it was stored as
    assert any(step.name.endswith(f'output_function.call:{effect}') for step in report.steps)


async def test_a11_an_output_function_side_effect_happens_once_over_any_crash(journal: Journal) -> None:
    await crash_everywhere(filed, journal=journal, exactly_once=['file_report'], points=['before_body', 'after_record'])


async def test_a11_an_output_function_asking_for_a_retry_is_replayed_as_such(journal: Journal) -> None:
    calls = Calls()

    def strict(title: str) -> Filed:
        calls.hit('strict')
        if calls['strict'] == 1:
            raise ModelRetry('a title needs two words')
        return Filed(ticket=8, title=title)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        retried = any(isinstance(part, RetryPromptPart) for message in messages for part in message.parts)
        title = 'disk full' if retried else 'disk'
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {'title': title}, tool_call_id=title)])

    def agent() -> Agent[None, Filed]:
        return Agent(
            FunctionModel(model, model_name='strict'),
            name='strict',
            output_type=ToolOutput(strict),
            capabilities=[Durable()],
        )

    with pytest.raises(KeyError):
        async with execution('a11-retry', journal=journal):
            first = await agent().run('file it')
            raise KeyError('after the run')
    live = dict(calls.counts)
    assert live['strict'] == 2  # it asked for a retry once, then filed
    async with execution('a11-retry', journal=journal):
        second = await agent().run('file it')
    assert second.output == first.output
    assert calls.counts == live  # the retry it asked for and its result both replayed


validations: list[object] = []


class Ticket(BaseModel):
    """A return type that counts how often pydantic validates it (X-4)."""

    ticket: int

    @model_validator(mode='before')
    @classmethod
    def count(cls, data: Any) -> Any:
        validations.append(data)
        return data


async def test_x4_an_output_function_replay_validates_its_result_once(journal: Journal) -> None:
    """The X-1 check's validated result is the one handed back: one validation per replay, not two."""

    def open_ticket(title: str) -> Ticket:
        effects.record('open_ticket')
        return Ticket(ticket=len(title))

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {'title': 'disk'}, tool_call_id='o1')])

    def agent() -> Agent[None, Ticket]:
        return Agent(
            FunctionModel(model), name='ticketer', output_type=ToolOutput(open_ticket), capabilities=[Durable()]
        )

    async with execution('x4-output', journal=journal, cleanup='keep'):
        first = await agent().run('open it')
    validations.clear()
    async with execution('x4-output', journal=journal) as handle:
        second = await agent().run('open it')
    assert len(validations) == 1  # two before: the check, then the decode
    assert second.output == first.output == Ticket(ticket=4)
    assert handle.stats.replayed == {'model': 1, 'tool': 1}
