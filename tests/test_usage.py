"""Usage with replay (U-1..U-17 and U2-1..U2-3): replays cost nothing, live spend counts over all attempts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import Calls, Operator, responses, tool_returns, two_step_agent
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext
from pydantic_ai.usage import RequestUsage, RunUsage, UsageLimits

from pydantic_ai_durable import Durable, Journal, MemoryJournal, execution
from pydantic_ai_durable._core import SimulatedCrash
from pydantic_ai_durable.testing import crash_at


def tokens_model(calls: Calls, *, turns: int, crash_at_turn: int | None = None, name: str = 'tokens') -> FunctionModel:
    """`turns` tool-call turns, then a final answer; response n uses 100*(n+1) input and 10*(n+1) output tokens."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        turn = responses(messages)
        if turn == crash_at_turn:
            raise RuntimeError(f'crash in request {turn + 1}')
        usage = RequestUsage(input_tokens=100 * (turn + 1), output_tokens=10 * (turn + 1))
        if turn < turns:
            return ModelResponse(parts=[ToolCallPart('work', {'n': turn}, tool_call_id=f't{turn}')], usage=usage)
        return ModelResponse(parts=[TextPart(f'{len(tool_returns(messages))} done')], usage=usage)

    return FunctionModel(model, model_name=name)


def working_agent(journal: Journal, calls: Calls, model: FunctionModel) -> Agent[None, str]:
    def work(n: int) -> str:
        calls.hit('tool')
        return f'work {n}'

    return Agent(model, name='worker', toolsets=[FunctionToolset([work], id='w')], capabilities=[Durable(journal)])


async def test_u17_partially_replayed_attempt_counts_only_live_work(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError):
        async with execution('j70'):
            await working_agent(new_journal(), calls, tokens_model(calls, turns=1, crash_at_turn=1)).run('go')
    async with execution('j70') as handle:
        result = await working_agent(new_journal(), calls, tokens_model(calls, turns=1)).run('go')
    attempt = handle.usage.attempt
    assert (attempt.requests, attempt.tool_calls, attempt.input_tokens, attempt.output_tokens) == (1, 0, 200, 20)
    # U2-2: the run's usage is the live spend of both attempts (the crashed request counted when it was sent)
    assert (result.usage.requests, result.usage.tool_calls) == (3, 1)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (300, 30)
    assert handle.usage.total == result.usage


async def test_u17_fully_replayed_attempt_leaves_usage_unchanged(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(KeyError):
        async with execution('full'):
            first = await working_agent(new_journal(), calls, tokens_model(calls, turns=2)).run('go')
            raise KeyError('after the run')
    async with execution('full') as handle:
        second = await working_agent(new_journal(), calls, tokens_model(calls, turns=2)).run('go')
    assert second.usage == first.usage
    assert handle.usage.attempt == RunUsage()
    assert calls['model'] == 3


async def three_requests_then_crash(new_journal: Any, key: str, calls: Calls) -> None:
    with pytest.raises(RuntimeError):
        async with execution(key):
            await working_agent(new_journal(), calls, tokens_model(calls, turns=4, crash_at_turn=3)).run('go')


async def test_u2_usage_over_attempts_counts_every_live_request(new_journal: Any) -> None:
    calls = Calls()
    await three_requests_then_crash(new_journal, 'u2a', calls)  # 3 answered + 1 sent and crashed
    async with execution('u2a') as handle:
        result = await working_agent(new_journal(), calls, tokens_model(calls, turns=4)).run('go')
    assert handle.usage.attempt.requests == 2
    assert result.usage.requests == 6
    assert handle.usage.total.requests == 6


async def test_u2_request_limit_caps_the_total_over_attempts(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError):
        async with execution('u2b'):
            await working_agent(new_journal(), calls, tokens_model(calls, turns=4, crash_at_turn=2)).run('go')
    assert calls['model'] == 3  # 2 answered, the 3rd sent and crashed: 3 requests paid
    async with execution('u2b'):
        with pytest.raises(UsageLimitExceeded):
            await working_agent(new_journal(), calls, tokens_model(calls, turns=4)).run(
                'go', usage_limits=UsageLimits(request_limit=4)
            )
    assert calls['model'] == 4  # request 3 ran live (the 4th paid); request 4 was stopped before the model


CRASH_LOOP = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import UsageLimits
    from pydantic_ai_durable import DiskJournal, Durable, execution

    journal_dir, counter = Path(sys.argv[1]), Path(sys.argv[2])

    def model(messages, info):
        with counter.open('a') as f:
            f.write('call\\n')
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # inside the 2nd request, before its response is recorded
        if done < 2:
            return ModelResponse(parts=[ToolCallPart('work', {}, tool_call_id=f'w{done}')])
        return ModelResponse(parts=[TextPart('done')])

    def work() -> str:
        return 'ok'

    agent = Agent(FunctionModel(model, model_name='loop'), name='loop', toolsets=[FunctionToolset([work], id='w')],
                  capabilities=[Durable(DiskJournal(journal_dir))])
    with execution('crash-loop'):
        agent.run_sync('go', usage_limits=UsageLimits(request_limit=3))
    """
)


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
def test_u2_1_crash_loop_inside_a_model_request_still_reaches_request_limit(tmp_path: Path) -> None:
    script = tmp_path / 'loop.py'
    script.write_text(CRASH_LOOP)
    outcomes = []
    for _ in range(5):
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / 'journal'), str(tmp_path / 'calls')],
            capture_output=True,
            text=True,
            timeout=120,
        )
        outcomes.append('killed' if done.returncode == -signal.SIGKILL else done.stderr.strip().splitlines()[-1])
    assert (tmp_path / 'calls').read_text().count('call') == 3
    assert outcomes[:2] == ['killed', 'killed']
    assert all('UsageLimitExceeded' in outcome for outcome in outcomes[2:])


async def test_u7_u9_resume_at_the_limits_replays_when_everything_replays(new_journal: Any) -> None:
    calls = Calls()

    def agent() -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit('model')
            if responses(messages) == 0:
                return ModelResponse(parts=[ToolCallPart('work', {'n': n}, tool_call_id=f'p{n}') for n in range(3)])
            return ModelResponse(parts=[TextPart('all done')])

        return working_agent(new_journal(), calls, FunctionModel(model, model_name='batch'))

    limits = UsageLimits(request_limit=2, tool_calls_limit=3)
    with pytest.raises(KeyError):
        async with execution('j71'):
            first = await agent().run('go', usage_limits=limits)
            raise KeyError('after the run')
    assert (first.usage.requests, first.usage.tool_calls) == (2, 3)
    async with execution('j71'):
        second = await agent().run('go', usage_limits=limits)
    assert second.usage == first.usage
    assert (calls['model'], calls['tool']) == (2, 3)


@pytest.mark.parametrize(
    'limits',
    [
        UsageLimits(input_tokens_limit=500),
        UsageLimits(output_tokens_limit=50),
        UsageLimits(total_tokens_limit=600),
        UsageLimits(cost_limit=0.0015),
    ],
    ids=['input_tokens', 'output_tokens', 'total_tokens', 'cost'],
)
async def test_u7_u9_token_and_cost_limits_stop_a_free_replay_only_where_the_run_itself_stops(
    new_journal: Any, limits: UsageLimits
) -> None:
    """Responses of 110, 220 and 330 tokens: only the last one takes the run over each limit."""
    calls = Calls()

    def agent() -> Agent[None, str]:
        return working_agent(new_journal(), calls, tokens_model(calls, turns=2, name='gpt-4o'))

    with pytest.raises(UsageLimitExceeded) as uninterrupted:  # where the run itself stops: after its last response
        async with execution('uninterrupted'):
            await agent().run('go', usage_limits=limits)
    assert (calls['model'], calls['tool']) == (3, 2)

    with pytest.raises(SimulatedCrash), crash_at(position=4, point='after_record'):  # before pydantic-ai's check
        async with execution('limits'):
            await agent().run('go', usage_limits=limits)
    with pytest.raises(UsageLimitExceeded) as resumed:
        async with execution('limits') as handle:
            await agent().run('go', usage_limits=limits)
    assert [step.outcome for step in handle.stats.steps] == ['replayed'] * 5  # every step replayed, for free
    assert (calls['model'], calls['tool']) == (6, 4)
    assert str(resumed.value).split('(')[0] == str(uninterrupted.value).split('(')[0]


@pytest.mark.parametrize('limit', [3, 4])
async def test_u15_credited_tool_that_turns_live_is_rechecked(new_journal: Any, limit: int) -> None:
    calls = Calls()

    def agent() -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit('model')
            if responses(messages) == 0:
                return ModelResponse(parts=[ToolCallPart('work', {'n': n}, tool_call_id=f'p{n}') for n in range(3)])
            return ModelResponse(parts=[TextPart('all done')])

        return working_agent(new_journal(), calls, FunctionModel(model, model_name='batch'))

    with pytest.raises(KeyError):
        async with execution('j72', cleanup='keep'):
            await agent().run('go')
            raise KeyError('after the run')
    journal = new_journal()
    snapshot = await journal.read_run('j72', '0')
    tool_position = next(position for position, entry in snapshot.entries.items() if entry['kind'] == 'tool')
    stale = dict(snapshot.entries[tool_position], v=99)  # an entry of an unknown format reads as missing
    assert await Operator(journal).write_entry('j72', '0', tool_position, stale)
    async with execution('j72'):
        if limit == 3:
            with pytest.raises(UsageLimitExceeded):
                await agent().run('go', usage_limits=UsageLimits(tool_calls_limit=limit))
        else:
            result = await agent().run('go', usage_limits=UsageLimits(tool_calls_limit=limit))
            assert result.usage.tool_calls == 4
    assert calls['tool'] == (3 if limit == 3 else 4)


async def test_u13_credited_request_that_diverges_is_rechecked_before_the_model(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(KeyError):
        async with execution('j73'):
            await two_step_agent(new_journal(), calls, instructions='old').run('q')
            raise KeyError('after the run')
    assert calls['model'] == 2
    async with execution('j73'):
        with pytest.raises(UsageLimitExceeded):
            await two_step_agent(new_journal(), calls, instructions='new').run(
                'q', usage_limits=UsageLimits(request_limit=2)
            )
    assert calls['model'] == 2


async def test_u3_replayed_priced_response_costs_one_live_charge(new_journal: Any) -> None:
    calls = Calls()
    model = tokens_model(calls, turns=1, name='gpt-4o')
    with pytest.raises(KeyError):
        async with execution('j74'):
            first = await working_agent(new_journal(), calls, model).run('go')
            raise KeyError('after the run')
    assert isinstance(first.usage.cost, Decimal) and first.usage.cost > 0
    async with execution('j74') as handle:
        second = await working_agent(new_journal(), calls, tokens_model(calls, turns=1, name='gpt-4o')).run('go')
    assert second.usage.cost == first.usage.cost
    assert (second.usage.requests, second.usage.input_tokens) == (first.usage.requests, first.usage.input_tokens)
    assert handle.usage.attempt.cost in (None, 0)


async def test_x4_u3_a_response_is_priced_once_when_it_arrives_and_its_replay_not_again(
    new_journal: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live response is priced once, by the step, with the graph's own function; the graph then finds it
    priced. Its entry records the price, so the response pydantic-ai gets on a replay is priced already (X-4)."""
    import pydantic_ai._genai_prices as prices
    from genai_prices import calc_price

    calls, lookups = Calls(), Calls()

    def counted(*args: Any, **kwargs: Any) -> Any:
        lookups.hit('price')
        return calc_price(*args, **kwargs)

    monkeypatch.setattr(prices, 'calc_price', counted)
    async with execution('x4-priced', cleanup='keep'):
        first = await working_agent(new_journal(), calls, tokens_model(calls, turns=2, name='gpt-4o')).run('go')
    assert calls['model'] == 3
    assert lookups['price'] == 3  # one per live response; 6 when the step and the graph each priced it
    async with execution('x4-priced') as handle:
        second = await working_agent(new_journal(), calls, tokens_model(calls, turns=2, name='gpt-4o')).run('go')
    assert handle.stats.replayed['model'] == 3 and calls['model'] == 3
    assert lookups['price'] == 3  # the replayed responses carry their recorded price
    assert isinstance(first.usage.cost, Decimal) and second.usage.cost == first.usage.cost
    assert handle.usage.attempt.cost in (None, 0)


class Accrual(AbstractCapability[Any]):
    """Calls a durable operation after each model response; the operation spends usage of its own."""

    id = 'accrual'

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @durable_operation('accrue')
    async def accrue(self, ctx: RunContext[Any], label: str) -> str:
        self.calls.hit('accrue')
        ctx.usage.incr(RunUsage(requests=1, input_tokens=7))
        return f'accrued {label}'

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        await self.accrue(ctx, str(len(request_context.messages)))
        return response


async def test_u16_capability_operations_replay_without_counting_twice(new_journal: Any) -> None:
    calls = Calls()

    def agent(crash: bool) -> Agent[None, str]:
        return Agent(
            tokens_model(calls, turns=1, crash_at_turn=1 if crash else None),
            name='accruing',
            toolsets=[FunctionToolset([lambda: 'x'], id='t')],
            capabilities=[Accrual(calls), Durable(new_journal())],
        )

    agent_model = tokens_model(calls, turns=1)
    del agent_model
    with pytest.raises(RuntimeError):
        async with execution('g57'):
            await agent(True).run('go')
    assert calls['accrue'] == 1
    async with execution('g57') as handle:
        result = await agent(False).run('go')
    assert calls['accrue'] == 2  # one per completed request, none repeated
    assert handle.stats.replayed['other'] == 1
    live_only = handle.usage.attempt
    assert result.usage.requests == live_only.requests + 3  # attempt 1: 1 answered + 1 crashed + 1 accrue
    assert (result.usage.input_tokens - live_only.input_tokens) == 100 + 7


def _operation_payload(delta: RunUsage) -> dict[str, Any]:
    from pydantic_ai.durable_exec import JSON_CODEC

    return {'value': 1, 'usage_delta': JSON_CODEC.dump(RunUsage, delta)}


def test_u16_a_replayed_operation_hands_back_its_value_and_no_usage() -> None:
    from pydantic_ai_durable._usage._spend import operation_usage, without_operation_usage

    delta = RunUsage(requests=1, tool_calls=1, input_tokens=7, details={'x': 2}, cost=Decimal('0.01'))
    payload = _operation_payload(delta)
    replayed = without_operation_usage(payload)
    assert replayed == {'value': 1, 'usage_delta': {}}
    assert payload == _operation_payload(delta)  # the recorded payload itself is left alone
    assert operation_usage(payload) == delta
    assert operation_usage(replayed) == RunUsage()


@pytest.mark.parametrize(
    'payload', [None, 'x', {'value': 1}, {'usage_delta': None}, {'usage_delta': {'input_tokens': 'many'}}]
)
def test_u16_payloads_without_a_valid_delta_count_nothing(payload: object) -> None:
    from pydantic_ai_durable._usage._spend import operation_usage, without_operation_usage

    assert operation_usage(payload) is None
    if not (isinstance(payload, dict) and isinstance(payload.get('usage_delta'), dict)):
        assert without_operation_usage(payload) is payload


def test_u2_every_run_usage_field_is_persisted() -> None:
    from pydantic_ai_durable._usage._spend import _USAGE, dump_usage, load_usage

    usage = RunUsage(requests=1, tool_calls=2, details={'reasoning': 3}, cost=Decimal('0.5'), audio_seconds=1.5)
    for number, field in enumerate(dataclasses.fields(RunUsage), start=10):
        if field.type in (int, 'int'):
            setattr(usage, field.name, number)
    assert load_usage({'usage': _USAGE.dump_python(usage, mode='json')}) == usage
    snapshot = dump_usage(usage)
    assert json.loads(json.dumps(snapshot)) == snapshot  # plain JSON data
    assert load_usage({'usage': snapshot}) == usage
    assert load_usage({'usage': dump_usage(RunUsage())}) == RunUsage()


def test_u2_1_a_snapshot_leaves_out_the_counters_at_zero_and_reads_them_back() -> None:
    from pydantic_ai_durable._core import spend_cost
    from pydantic_ai_durable._usage._spend import dump_usage, load_usage

    usage = RunUsage(requests=2, input_tokens=1500, output_tokens=30, cost=Decimal('0.00465'))
    snapshot = dump_usage(usage)
    assert snapshot == {'requests': 2, 'input_tokens': 1500, 'output_tokens': 30, 'cost': '0.00465'}
    assert load_usage({'usage': snapshot}) == usage
    assert dump_usage(RunUsage()) == {} and load_usage({'usage': {}}) == RunUsage()
    assert spend_cost(snapshot) == 0.00465  # decimal text, read as the number it is
    assert spend_cost({'cost': 0.5}) == 0.5 and spend_cost({}) is None
    for unreadable in ('NaN', 'Infinity', 'a lot', True, [1]):
        assert spend_cost({'cost': unreadable}) is None, unreadable


def test_u2_usage_snapshot_of_an_unexpected_shape_uses_pydantics_dump() -> None:
    from pydantic_ai_durable._usage._spend import _USAGE, dump_usage

    usage = RunUsage(requests=1, details={'reasoning': 3})
    usage.details = {'reasoning': True}  # not the int counters the fast copy knows
    assert dump_usage(usage) == _USAGE.dump_python(usage, mode='json')


def test_asyncio_is_available() -> None:
    assert asyncio.get_event_loop_policy() is not None


def continuation_model(calls: Calls, *, same_id: bool) -> FunctionModel:
    """A response delivered in three segments: two suspended, then complete (Anthropic pause_turn, OpenAI
    background mode). With `same_id` every segment re-polls one provider response with cumulative usage."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        last = messages[-1]
        segment = 0
        if isinstance(last, ModelResponse) and last.state == 'suspended':
            segment = last.usage.input_tokens // 10 if same_id else int(str(last.provider_response_id)[1:])
        tokens = 10 * (segment + 1) if same_id else 10
        usage = RequestUsage(input_tokens=tokens, output_tokens=tokens // 10)
        response_id = 'r1' if same_id else f'r{segment + 1}'
        state: Any = 'complete' if segment == 2 else 'suspended'
        return ModelResponse(
            parts=[TextPart(f's{segment}')], usage=usage, provider_response_id=response_id, state=state
        )

    return FunctionModel(model, model_name='continuing')


@pytest.mark.parametrize('same_id', [False, True], ids=['distinct-ids', 're-polled-id'])
async def test_u5_u12_continuation_chains_count_once_and_replay_for_free(new_journal: Any, same_id: bool) -> None:
    calls = Calls()

    def agent() -> Agent[None, str]:
        return Agent(continuation_model(calls, same_id=same_id), name='chain', capabilities=[Durable(new_journal())])

    with pytest.raises(KeyError):
        async with execution('j75'):
            first = await agent().run('go')
            raise KeyError('after the run')
    assert first.usage.requests == 1
    assert first.usage.input_tokens == 30  # summed over distinct segments, the last snapshot of a re-poll
    async with execution('j75') as handle:
        second = await agent().run('go')
    assert calls['model'] == 3
    assert handle.stats.replayed == {'model': 3}
    assert second.usage == first.usage  # requests and tokens do not move on replay, nor in the persisted spend
    assert second.output == first.output


async def test_u2_live_response_usage_is_read_off_the_response_not_a_second_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic_ai.durable_exec import JSON_CODEC

    decoded: list[object] = []
    original = type(JSON_CODEC).load

    def counting(self: Any, tp: Any, payload: Any) -> Any:
        if tp is ModelResponse:
            decoded.append(payload)
        return original(self, tp, payload)

    monkeypatch.setattr(type(JSON_CODEC), 'load', counting)
    calls = Calls()
    async with execution('u2-live-usage', journal=MemoryJournal()) as handle:
        result = await two_step_agent(MemoryJournal(), calls).run('q')
    assert calls['model'] == 2
    assert len(decoded) == 2  # pydantic-ai's own decode of each payload, nothing more
    assert handle.usage.attempt.requests == result.usage.requests == 2
    assert handle.usage.attempt.input_tokens == result.usage.input_tokens > 0
