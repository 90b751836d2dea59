"""Code mode (pydantic-ai-harness `CodeMode`): each nested tool call is its own step (CM-1..CM-3)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import Calls, harness_mismatch, responses, tool_returns
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from pydantic_ai_durable import Durable, execution
from pydantic_ai_durable.testing import SimulatedCrash, crash_at

if (_mismatch := harness_mismatch()) is not None:
    pytest.skip(f'code mode not tested: {_mismatch}', allow_module_level=True)
code_mode = pytest.importorskip('pydantic_ai_harness.code_mode')


SNIPPETS = {
    'sum': 'a = await get_value(x=1)\nb = await get_value(x=2)\na + b',
    'first': 'a = await get_value(x=1)\na',
    'second': 'b = a + await get_value(x=2)\nb',
}


def code_agent(journal: Any, calls: Calls, snippets: list[str], *, code_mode_id: str | None) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        turn = responses(messages)
        if turn < len(snippets):
            code = SNIPPETS[snippets[turn]]
            return ModelResponse(parts=[ToolCallPart('run_code', {'code': code}, tool_call_id=f'rc{turn + 1}')])
        returns = tool_returns(messages)
        return ModelResponse(parts=[TextPart(f'result {returns[-1].content}')])

    def get_value(x: int) -> int:
        calls.hit(f'get_value {x}')
        return x * 10

    capability = code_mode.CodeMode(id=code_mode_id) if code_mode_id else code_mode.CodeMode()
    return Agent(
        FunctionModel(model, model_name='coder'),
        name='coder',
        toolsets=[FunctionToolset([get_value], id='tools')],
        capabilities=[capability, Durable(journal)],
    )


@pytest.mark.parametrize('code_mode_id', [None, 'cm'])
async def test_cm1_cm2_nested_calls_replay_and_the_next_request_replays(new_journal: Any, code_mode_id: Any) -> None:
    calls = Calls()
    with pytest.raises(SimulatedCrash):
        async with execution('cm-a'):
            with crash_at(kind='tool', nth=1, point='after_record'):
                await code_agent(new_journal(), calls, ['sum'], code_mode_id=code_mode_id).run('add')
    assert (calls['model'], calls['get_value 1'], calls['get_value 2']) == (1, 1, 0)
    async with execution('cm-a') as handle:
        result = await code_agent(new_journal(), calls, ['sum'], code_mode_id=code_mode_id).run('add')
    assert (calls['model'], calls['get_value 1'], calls['get_value 2']) == (2, 1, 1)
    assert '30' in result.output
    names = [(o.outcome, o.name.rsplit('.', 1)[-1]) for o in handle.stats.steps]
    assert names == [
        ('replayed', 'request'),
        ('replayed', 'call_tool:get_value'),
        ('live', 'call_tool:get_value'),
        ('live', 'request'),
    ]


@pytest.mark.parametrize('code_mode_id', [None, 'cm'])
async def test_cm2_crash_after_the_final_request_replays_everything(new_journal: Any, code_mode_id: Any) -> None:
    calls = Calls()
    with pytest.raises(SimulatedCrash):
        async with execution('cm-b'):
            with crash_at(kind='model', nth=2, point='after_record'):
                await code_agent(new_journal(), calls, ['sum'], code_mode_id=code_mode_id).run('add')
    before = dict(calls.counts)
    async with execution('cm-b') as handle:
        result = await code_agent(new_journal(), calls, ['sum'], code_mode_id=code_mode_id).run('add')
    assert calls.counts == before  # no model and no tool called again
    assert '30' in result.output
    assert sum(handle.stats.recorded.values()) == 0


async def test_cm1_repl_state_survives_a_crash_between_two_run_code_calls(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(SimulatedCrash):
        async with execution('cm-d'):
            with crash_at(kind='tool', nth=2, point='before_body'):
                await code_agent(new_journal(), calls, ['first', 'second'], code_mode_id='cm').run('go')
    async with execution('cm-d') as handle:
        result = await code_agent(new_journal(), calls, ['first', 'second'], code_mode_id='cm').run('go')
    assert result.output == 'result 30'
    assert (calls['get_value 1'], calls['get_value 2']) == (1, 1)
    assert handle.stats.replayed == {'model': 2, 'tool': 1}


async def test_cm3_nested_calls_that_replay_pass_the_tool_calls_limit(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(KeyError):
        async with execution('cm-limit'):
            first = await code_agent(new_journal(), calls, ['sum'], code_mode_id='cm').run('add')
            raise KeyError('after the run')
    limit = UsageLimits(tool_calls_limit=first.usage.tool_calls)
    async with execution('cm-limit'):
        second = await code_agent(new_journal(), calls, ['sum'], code_mode_id='cm').run('add', usage_limits=limit)
    assert second.output == first.output
    assert second.usage == first.usage
    assert calls['model'] == 2


def secret_agent(journal: Any, calls: Calls, registry: Any) -> Agent[None, str]:
    """A snippet reads a password with one tool and hands it to another: `connect` must get the real one."""
    code = 'password = await read_password()\nawait connect(password=password)'

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        if responses(messages) == 0:
            return ModelResponse(parts=[ToolCallPart('run_code', {'code': code}, tool_call_id='rc1')])
        return ModelResponse(parts=[TextPart(f'result {tool_returns(messages)[-1].content}')])

    def read_password() -> str:
        calls.hit('read_password')
        return 'hunter2-secret'

    def connect(password: str) -> str:
        calls.hit(f'connect {password}')
        return 'connected' if password == 'hunter2-secret' else 'refused'

    return Agent(
        FunctionModel(model, model_name='coder'),
        name='coder',
        toolsets=[FunctionToolset([read_password, connect], id='tools')],
        capabilities=[code_mode.CodeMode(id='cm'), Durable(journal, secrets=registry)],
    )


async def test_k7_a_masked_result_is_never_replayed_into_a_live_call(new_journal: Any) -> None:
    from pydantic_ai_durable import SecretRegistry

    registry = SecretRegistry()
    registry.register('hunter2-secret')
    calls = Calls()
    with pytest.raises(SimulatedCrash):
        async with execution('cm-secret'):
            with crash_at(kind='tool', nth=1, point='after_record'):  # read_password recorded, connect not yet
                await secret_agent(new_journal(), calls, registry).run('connect')
    snapshot = await new_journal().read_run('cm-secret', '0')
    assert 'hunter2-secret' not in str(snapshot.entries)  # the journal never holds it
    async with execution('cm-secret'):
        result = await secret_agent(new_journal(), calls, registry).run('connect')
    assert calls['connect ***'] == 0  # the live call got the real password
    assert calls['connect hunter2-secret'] == 1
    assert 'connected' in result.output
