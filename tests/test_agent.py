"""End-to-end replay with real pydantic-ai agents, on every backend: crash and resume, failure fences,
unloadable payloads and cleanup."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from helpers import Calls, Operator, Warehouse, responses, tool_returns, two_step_agent
from pydantic_ai import Agent, FunctionToolset, ModelRetry
from pydantic_ai.exceptions import UnexpectedModelBehavior, UserError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    Journal,
    JournalError,
    JournalUnavailable,
    MemoryJournal,
    execution,
)
from pydantic_ai_durable.journals._json import dumps
from pydantic_ai_durable.testing import ScriptedModel, ToolCall


async def stored_executions(journal: Journal) -> list[str]:
    return [info.key for info in await journal.list_executions()]


# -- A. crash and resume -----------------------------------------------------------------------------


def five_turn_agent(journal: Journal, calls: Calls, *, broken: bool) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        turn = responses(messages)
        if turn < 5:
            return ModelResponse(parts=[ToolCallPart('step', {'n': turn + 1}, tool_call_id=f'c{turn + 1}')])
        return ModelResponse(parts=[TextPart(','.join(str(part.content) for part in tool_returns(messages)))])

    def step(n: int) -> str:
        calls.hit('tool')
        if broken and n == 3:
            raise RuntimeError('tool 3 is broken')
        return f'done {n}'

    return Agent(
        FunctionModel(model, model_name='five'),
        name='five',
        toolsets=[FunctionToolset([step], id='steps')],
        capabilities=[Durable(journal=journal)],
    )


async def test_resume_replays_completed_steps_and_runs_the_rest_live(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError, match='tool 3 is broken'):
        async with execution('a1'):
            await five_turn_agent(new_journal(), calls, broken=True).run('go')
    assert (calls['model'], calls['tool']) == (3, 3)
    async with execution('a1') as handle:
        result = await five_turn_agent(new_journal(), calls, broken=False).run('go')
    assert result.output == 'done 1,done 2,done 3,done 4,done 5'
    assert (calls['model'], calls['tool']) == (6, 6)
    assert dict(handle.stats.replayed) == {'model': 3, 'tool': 2}
    assert dict(handle.stats.recorded) == {'model': 3, 'tool': 3}


async def test_final_request_crash_replays_first_request(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError, match='model crashed'):
        async with execution('a2'):
            await two_step_agent(new_journal(), calls, fail_final=True).run('how many?')
    async with execution('a2'):
        result = await two_step_agent(new_journal(), calls).run('how many?')
    assert result.output == 'answer: 3 rows'
    assert (calls['model'], calls['tool']) == (3, 1)


async def test_failure_after_the_run_replays_every_step(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(KeyError):
        async with execution('a3'):
            first = await two_step_agent(new_journal(), calls).run('how many?')
            raise KeyError('post-processing failed')
    async with execution('a3') as handle:
        second = await two_step_agent(new_journal(), calls).run('how many?')
    assert (calls['model'], calls['tool']) == (2, 1)
    assert second.output == first.output
    assert second.usage == first.usage
    assert dict(handle.stats.replayed) == {'model': 2, 'tool': 1}


async def test_changed_instructions_diverge_at_the_first_model_step(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError):
        async with execution('a5'):
            await two_step_agent(new_journal(), calls, fail_final=True, instructions='Be brief.').run('q')
    async with execution('a5') as handle:
        await two_step_agent(new_journal(), calls, instructions='Be thorough.').run('q')
    assert (calls['model'], calls['tool']) == (4, 1)  # the model was asked again; its equal query replayed (DV-2)
    assert dict(handle.stats.replayed) == dict(handle.stats.replayed_by_arguments) == {'tool': 1}
    [divergence] = handle.stats.divergences
    assert (divergence.run, divergence.position, divergence.name) == ('0', 0, 'two_step__model.request')
    assert divergence.reason.startswith('request differs')


@pytest.mark.parametrize('change', ['function', 'settings'])
async def test_fp2_changed_model_identity_or_model_settings_diverge(new_journal: Any, change: str) -> None:
    calls = Calls()

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        return ModelResponse(parts=[TextPart('ok')])

    def other(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        return ModelResponse(parts=[TextPart('ok')])

    def agent(model: FunctionModel) -> Agent[None, str]:
        return Agent(model, name='a6', capabilities=[Durable(journal=new_journal())])

    with pytest.raises(KeyError):
        async with execution('a6'):
            await agent(FunctionModel(answer, settings={'temperature': 0.1})).run('q')
            raise KeyError('later failure')
    changed = (
        FunctionModel(other, settings={'temperature': 0.1})
        if change == 'function'
        else FunctionModel(answer, settings={'temperature': 0.9})
    )
    async with execution('a6') as handle:
        await agent(changed).run('q')
    assert calls['model'] == 2
    assert handle.stats.replayed['model'] == 0


async def test_fp4_transport_only_settings_do_not_diverge(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError):
        async with execution('a7'):
            await two_step_agent(new_journal(), calls, fail_final=True, model_settings={'timeout': 10}).run('q')
    settings: Any = {'timeout': 99.0, 'anthropic_cache_messages': True}
    async with execution('a7') as handle:
        await two_step_agent(new_journal(), calls, model_settings=settings).run('q')
    assert handle.stats.replayed['model'] == 1
    assert calls['tool'] == 1


def charging_agent(journal: Journal, calls: Calls, *, delays: bool, crash_final: bool) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        if responses(messages) == 0:
            return ModelResponse(parts=[ToolCallPart('charge', {'n': n}, tool_call_id=f'ch{n}') for n in (1, 2, 3)])
        if crash_final:
            raise RuntimeError('final request crashed')
        return ModelResponse(parts=[TextPart(','.join(str(part.content) for part in tool_returns(messages)))])

    async def charge(n: int) -> str:
        calls.hit(f'charge {n}')
        if delays:
            await asyncio.sleep(0.03 * (4 - n))
        return f'charged {n}'

    return Agent(
        FunctionModel(model, model_name='charging'),
        name='charging',
        toolsets=[FunctionToolset([charge], id='payments')],
        capabilities=[Durable(journal=journal)],
    )


async def test_p2_parallel_calls_claim_positions_in_start_order(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError):
        async with execution('a8'):
            await charging_agent(new_journal(), calls, delays=True, crash_final=True).run('pay')
    async with execution('a8') as handle:
        result = await charging_agent(new_journal(), calls, delays=False, crash_final=False).run('pay')
    assert result.output == 'charged 1,charged 2,charged 3'
    assert [calls[f'charge {n}'] for n in (1, 2, 3)] == [1, 1, 1]
    assert handle.stats.replayed['tool'] == 3


async def test_f2_parallel_siblings_of_a_failed_call_stay_replayable(new_journal: Any) -> None:
    calls = Calls()

    def agent(fail_first: bool) -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit('model')
            if responses(messages) == 0:
                return ModelResponse(parts=[ToolCallPart('work', {'n': n}, tool_call_id=f'w{n}') for n in (1, 2, 3)])
            return ModelResponse(parts=[TextPart('done')])

        async def work(n: int) -> str:
            calls.hit(f'work {n}')
            if n == 1:
                await asyncio.sleep(0.05)
                if fail_first:
                    raise RuntimeError('call 1 failed')
            return f'ok {n}'

        return Agent(
            FunctionModel(model, model_name='par'),
            name='par',
            toolsets=[FunctionToolset([work], id='w')],
            capabilities=[Durable(journal=new_journal())],
        )

    with pytest.raises(RuntimeError, match='call 1 failed'):
        async with execution('a9'):
            await agent(True).run('go')
    journal = new_journal()
    snapshot = await journal.read_run('a9', '0')
    assert snapshot.records['meta']['diverge_from'] is None
    async with execution('a9') as handle:
        await agent(False).run('go')
    assert [calls[f'work {n}'] for n in (1, 2, 3)] == [2, 1, 1]
    assert handle.stats.replayed['tool'] == 2


@pytest.mark.parametrize('cleanup', ['execution', 'run'])
async def test_c3_cleanup_mode_decides_what_a_retry_replays(new_journal: Any, cleanup: Any) -> None:
    calls_a, calls_b = Calls(), Calls()
    with pytest.raises(RuntimeError):
        async with execution('a10', cleanup=cleanup):
            await two_step_agent(new_journal(), calls_a).run('a')
            await two_step_agent(new_journal(), calls_b, fail_final=True).run('b')
    async with execution('a10', cleanup=cleanup):
        await two_step_agent(new_journal(), calls_a).run('a')
        await two_step_agent(new_journal(), calls_b).run('b')
    assert calls_a['tool'] == (1 if cleanup == 'execution' else 2)
    assert calls_b['tool'] == 1
    assert await stored_executions(new_journal()) == []


def nested_agents(journal: Journal, calls: Calls, *, second_fails: bool) -> Agent[None, str]:
    def sub_agent(label: str, fail: bool) -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit(f'{label} model')
            if responses(messages) == 0:
                return ModelResponse(parts=[ToolCallPart('lookup', {}, tool_call_id=f'{label}-l')])
            if fail:
                raise RuntimeError(f'{label} sub-agent failed')
            return ModelResponse(parts=[TextPart(f'{label} result')])

        def lookup() -> str:
            calls.hit(f'{label} lookup')
            return 'found'

        return Agent(
            FunctionModel(model, model_name=label),
            name=f'sub_{label}',
            toolsets=[FunctionToolset([lookup], id=f'{label}_tools')],
            capabilities=[Durable(journal=journal)],
        )

    async def first() -> str:
        return (await sub_agent('first', False).run('x')).output

    async def second() -> str:
        return (await sub_agent('second', second_fails).run('y')).output

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('outer model')
        turn = responses(messages)
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart('first', {}, tool_call_id='o1')])
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart('second', {}, tool_call_id='o2')])
        return ModelResponse(parts=[TextPart(' + '.join(str(p.content) for p in tool_returns(messages)))])

    return Agent(
        FunctionModel(model, model_name='outer'),
        name='outer',
        toolsets=[FunctionToolset([first, second], id='subs')],
        capabilities=[Durable(journal=journal)],
    )


async def test_r4_nested_runs_are_numbered_under_their_parent_step(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError, match='second sub-agent failed'):
        async with execution('a11') as first_attempt:
            await nested_agents(new_journal(), calls, second_fails=True).run('go')
    assert {outcome.run for outcome in first_attempt.stats.steps} == {'0', '0.1.1', '0.3.1'}
    async with execution('a11') as handle:
        result = await nested_agents(new_journal(), calls, second_fails=False).run('go')
    assert result.output == 'first result + second result'
    assert calls['first lookup'] == 1 and calls['second lookup'] == 1
    assert calls['first model'] == 2  # its parent step replayed, so the first sub-agent never started again
    runs = {outcome.run for outcome in handle.stats.steps}
    assert runs == {'0', '0.3.1'}
    assert [info.state for info in await new_journal().list_executions()] == ['finished']


async def test_r1_inert_outside_an_execution(new_journal: Any) -> None:
    calls = Calls()
    journal = new_journal()
    result = await two_step_agent(journal, calls).run('q')
    assert result.output == 'answer: 3 rows'
    assert await stored_executions(journal) == []


async def test_r2_second_attempt_in_one_process_gets_a_fresh_view(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(KeyError):
        async with execution('a13', cleanup='keep') as one:
            await two_step_agent(new_journal(), calls).run('q')
            raise KeyError('x')
    async with execution('a13') as two:
        await two_step_agent(new_journal(), calls).run('q')
    assert dict(one.stats.recorded) == {'model': 2, 'tool': 1}
    assert dict(two.stats.recorded) == {}
    assert [o.position for o in two.stats.steps] == [0, 1, 2]
    assert two.attempt == 2


async def test_i5_stream_replays_with_the_same_output(new_journal: Any) -> None:
    calls = Calls()

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        calls.hit('stream')
        for chunk in ('hello ', 'world'):
            yield chunk

    def agent() -> Agent[None, str]:
        return Agent(FunctionModel(stream_function=stream), name='streamer', capabilities=[Durable(new_journal())])

    outputs = []
    for attempt in range(2):
        try:
            async with execution('a14'):
                async with agent().run_stream('hi') as result:
                    outputs.append(await result.get_output())
                if attempt == 0:
                    raise KeyError('fail after the run')
        except KeyError:
            pass
    assert outputs == ['hello world', 'hello world']
    assert calls['stream'] == 1


def test_i5_run_sync_inside_a_sync_execution(tmp_path: Path) -> None:
    calls = Calls()
    for attempt in range(2):
        try:
            with execution('sync', journal=DiskJournal(tmp_path / 'j')):
                assert two_step_agent(None, calls).run_sync('q').output == 'answer: 3 rows'
                if attempt == 0:
                    raise KeyError('fail after the run')
        except KeyError:
            pass
    assert (calls['model'], calls['tool']) == (2, 1)


# -- C. failure bookkeeping with real agents ---------------------------------------------------------


def validated_agent(journal: Journal, calls: Calls, *, valid: bool) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        if responses(messages) == 0:
            return ModelResponse(parts=[ToolCallPart('query', {}, tool_call_id='v1')])
        return ModelResponse(parts=[TextPart('good' if valid else 'bad')])

    def query() -> str:
        calls.hit('tool')
        return 'rows'

    agent = Agent(
        FunctionModel(model, model_name='validated'),
        name='validated',
        toolsets=[FunctionToolset([query], id='q')],
        capabilities=[Durable(journal=journal)],
        retries={'output': 1},
    )

    @agent.output_validator
    def check(output: str) -> str:
        if output != 'good':
            raise ModelRetry('say good')
        return output

    return agent


async def test_f4_model_at_fault_re_asks_only_the_last_request(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(UnexpectedModelBehavior):
        async with execution('c30'):
            await validated_agent(new_journal(), calls, valid=False).run('q')
    meta = (await new_journal().read_run('c30', '0')).records['meta']
    assert (meta['diverge_from'], meta['model_at_fault']) == (3, True)
    async with execution('c30') as handle:
        result = await validated_agent(new_journal(), calls, valid=True).run('q')
    assert result.output == 'good'
    assert calls['model'] == 4
    assert calls['tool'] == 1
    assert handle.stats.replayed['model'] == 2


async def test_f10_a_finished_execution_replays_past_the_fence_of_the_failed_attempt(new_journal: Any) -> None:
    """The attempt after the failure re-asked the model from the fence and finished: from then on, all replays."""
    calls = Calls()
    with pytest.raises(UnexpectedModelBehavior):
        async with execution('c33'):
            await validated_agent(new_journal(), calls, valid=False).run('q')
    async with execution('c33'):
        assert (await validated_agent(new_journal(), calls, valid=True).run('q')).output == 'good'
    assert calls['model'] == 4
    meta = (await new_journal().read_run('c33', '0')).records['meta']
    assert meta['diverge_from'] is None and meta['model_at_fault'] is False
    for _ in range(2):
        async with execution('c33') as handle:
            assert (await validated_agent(new_journal(), calls, valid=True).run('q')).output == 'good'
        assert calls['model'] == 4 and calls['tool'] == 1  # no live request, no live tool call
        assert handle.stats.replayed == {'model': 3, 'tool': 1}  # the bad answer the output check retried, too


async def test_f4_exhausted_tool_retries_fence_at_the_last_model_step(new_journal: Any) -> None:
    calls = Calls()

    def agent(fixed: bool) -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit('model')
            if responses(messages) < 2:
                return ModelResponse(parts=[ToolCallPart('fragile', {}, tool_call_id=f'f{responses(messages)}')])
            return ModelResponse(parts=[TextPart('done')])

        def fragile() -> str:
            calls.hit('tool')
            if not fixed:
                raise ModelRetry('try again')
            return 'fine'

        return Agent(
            FunctionModel(model, model_name='retrying'),
            name='retrying',
            toolsets=[FunctionToolset([fragile], id='f', max_retries=1)],
            capabilities=[Durable(journal=new_journal())],
        )

    with pytest.raises(UnexpectedModelBehavior):
        async with execution('c31'):
            await agent(False).run('q')
    meta = (await new_journal().read_run('c31', '0')).records['meta']
    assert meta['model_at_fault'] is True and meta['diverge_from'] == 2
    async with execution('c31') as handle:
        await agent(True).run('q')
    assert handle.stats.replayed == {'model': 1, 'tool': 1}


async def test_f4_model_error_raised_inside_a_step_fences_at_that_step(new_journal: Any) -> None:
    calls = Calls()

    def agent(broken: bool) -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit('model')
            if responses(messages) == 0:
                return ModelResponse(parts=[ToolCallPart('query', {}, tool_call_id='u1')])
            if broken:
                raise UnexpectedModelBehavior('garbage from the provider')
            return ModelResponse(parts=[TextPart('fine')])

        def query() -> str:
            calls.hit('tool')
            return 'rows'

        return Agent(
            FunctionModel(model, model_name='um'),
            name='um',
            toolsets=[FunctionToolset([query], id='q')],
            capabilities=[Durable(journal=new_journal())],
        )

    with pytest.raises(UnexpectedModelBehavior):
        async with execution('c32'):
            await agent(True).run('q')
    meta = (await new_journal().read_run('c32', '0')).records['meta']
    assert meta['model_at_fault'] is False
    async with execution('c32') as handle:
        await agent(False).run('q')
    assert handle.stats.replayed == {'model': 1, 'tool': 1}


# -- D. unloadable payloads ---------------------------------------------------------------------------


async def corrupt(journal: Journal, key: str, kind: str) -> None:
    snapshot = await journal.read_run(key, '0')
    for position, entry in snapshot.entries.items():
        if entry['kind'] == kind:
            entry['payload'] = 'written by another version'
            assert await Operator(journal).write_entry(key, '0', position, entry)


async def finished_then_failed(new_journal: Any, key: str, calls: Calls) -> None:
    with pytest.raises(KeyError):
        async with execution(key):
            await two_step_agent(new_journal(), calls).run('q')
            raise KeyError('after the run')


async def test_x1_unloadable_model_payloads_run_live(new_journal: Any) -> None:
    calls = Calls()
    await finished_then_failed(new_journal, 'd35', calls)
    await corrupt(new_journal(), 'd35', 'model')
    async with execution('d35') as handle:
        result = await two_step_agent(new_journal(), calls).run('q')
    assert result.output == 'answer: 3 rows'
    assert (calls['model'], calls['tool']) == (4, 1)  # the recorded query, asked again, replays by arguments (DV-2)
    assert handle.stats.replayed['model'] == 0


async def test_x2_unloadable_tool_payload_diverges_from_there(new_journal: Any) -> None:
    calls = Calls()
    await finished_then_failed(new_journal, 'd36', calls)
    await corrupt(new_journal(), 'd36', 'tool')
    async with execution('d36'):
        await two_step_agent(new_journal(), calls).run('q')
    assert (calls['model'], calls['tool']) == (3, 2)


async def test_x4_a_replay_decodes_each_recorded_payload_once(
    new_journal: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value the X-1 check decoded is the one pydantic-ai gets: each payload is loaded once, not twice."""
    from pydantic_ai.durable_exec import JSON_CODEC as json_codec
    from pydantic_ai.durable_exec import CallToolResult

    import pydantic_ai_durable._steps._codec as codec

    loads: list[str] = []

    class Counting:
        def dump(self, tp: Any, value: Any) -> Any:
            return json_codec.dump(tp, value)

        def load(self, tp: Any, payload: Any) -> Any:
            loads.append('tool' if tp is CallToolResult else getattr(tp, '__name__', str(tp)))
            return json_codec.load(tp, payload)

    calls = Calls()
    async with execution('x4', cleanup='keep'):
        first = await five_turn_agent(new_journal(), calls, broken=False).run('go')
    monkeypatch.setattr(codec, 'JSON_CODEC', Counting())
    async with execution('x4') as handle:
        again = await five_turn_agent(new_journal(), calls, broken=False).run('go')
    assert again.output == first.output == 'done 1,done 2,done 3,done 4,done 5'
    assert (calls['model'], calls['tool']) == (6, 5)  # nothing ran again
    assert handle.stats.replayed == {'model': 6, 'tool': 5}
    assert sorted(loads) == ['ModelResponse'] * 6 + ['tool'] * 5  # twice as many before X-4


# -- E. cleanup --------------------------------------------------------------------------------------


async def test_cleaned_up_key_runs_live_again(new_journal: Any) -> None:
    calls = Calls()
    for _ in range(2):
        async with execution('e44', cleanup='execution'):  # the key is reused for new work on purpose
            await two_step_agent(new_journal(), calls).run('q')
    assert (calls['model'], calls['tool']) == (4, 2)
    assert await stored_executions(new_journal()) == []


# -- F / G. storage refusals and payload errors -------------------------------------------------------


class FailingJournal(MemoryJournal):
    """Fails to store the entries of chosen tools, as a full or failing store would."""

    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        if self.fail in entry['name']:
            raise OSError(28, 'No space left on device')
        return await super().write_entry(key, run, position, entry, epoch=epoch)


async def test_s2_summary_lists_steps_that_ran_but_were_not_recorded(caplog: pytest.LogCaptureFixture) -> None:
    calls = Calls()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        if responses(messages) == 0:
            return ModelResponse(parts=[ToolCallPart('send_email', {'to': t}, tool_call_id=t) for t in ('a', 'b')])
        return ModelResponse(parts=[TextPart('sent')])

    both_sending = asyncio.Event()

    async def send_email(to: str) -> str:  # both run before either is recorded, as a parallel batch can
        if calls.hit('send_email') == 2:
            both_sending.set()
        await both_sending.wait()
        return f'sent to {to}'

    journal = FailingJournal('send_email')
    agent = Agent(
        FunctionModel(model, model_name='mailer'),
        name='mailer',
        toolsets=[FunctionToolset([send_email], id='mail')],
        capabilities=[Durable(journal)],
    )
    caplog.set_level(logging.INFO, logger='pydantic_ai_durable')
    with pytest.raises(JournalUnavailable, match='No space left on device'):
        async with execution('f50', cleanup='keep', write_timeout=0) as handle:
            await agent.run('mail')
    assert calls['send_email'] == 2 and calls['model'] == 1  # the attempt stopped before the next request (JF-2)
    assert handle.stats.recorded == {'model': 1}
    assert handle.stats.not_recorded == [('tool', 'mailer__function_toolset__mail.call_tool:send_email')] * 2
    messages = [record.getMessage() for record in caplog.records]
    assert any('send_email (x2)' in message for message in messages)
    assert any('recorded 1 new step (1 model, 0 tool, 0 other)' in message for message in messages)


@pytest.mark.parametrize('tool_kind', ['function', 'leaf'])
async def test_t4_jf5_unjournalable_tool_result_leaves_a_fence_a_retry_stops_at(
    new_journal: Any, tool_kind: str
) -> None:
    calls = Calls()
    fixed = False

    def opaque() -> object:
        calls.hit('opaque')
        return {'fixed': True} if fixed else object()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        if responses(messages) == 0:
            return ModelResponse(parts=[ToolCallPart('opaque', {}, tool_call_id='o')])
        return ModelResponse(parts=[TextPart('done')])

    def build() -> Agent[None, str]:
        toolset: Any = FunctionToolset([opaque], id='o') if tool_kind == 'function' else Warehouse({'opaque': opaque})
        return Agent(
            FunctionModel(model, model_name='opaque'),
            name='opaque',
            toolsets=[toolset],
            capabilities=[Durable(new_journal())],
        )

    with pytest.raises(JournalError, match='not JSON-serializable') as raised:
        async with execution('g51'):
            await build().run('q')
    assert 'opaque' in str(raised.value) and 'object' in str(raised.value)  # names the tool and the type
    entries = (await new_journal().read_run('g51', '0')).entries
    assert [entry['kind'] for entry in entries.values()] == ['model', 'tool']
    assert entries[1]['payload'] is None and 'not JSON-serializable' in entries[1]['unjournalable']

    for _ in range(2):  # every retry stops at the fence: the side effect ran once, it never silently repeats
        with pytest.raises(JournalError, match='rerun_unjournalable=True') as stopped:
            async with execution('g51'):
                await build().run('q')
        assert 'ran in an earlier attempt' in str(stopped.value)
    assert calls['opaque'] == 1

    fixed = True  # the user fixed the tool and decided to run it once more
    async with execution('g51', rerun_unjournalable=True) as handle:
        result = await build().run('q')
    assert result.output == 'done'
    assert calls['opaque'] == 2
    assert handle.stats.replayed['model'] == 1


# -- bad input -------------------------------------------------------------------------------------------


def test_bad_input_journal_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match='MemoryJournal'):
        Durable(journal='.durable')  # type: ignore[arg-type]


def test_bad_input_agent_without_a_name() -> None:
    from pydantic_ai.exceptions import UserError

    with pytest.raises(UserError, match='name'):
        Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart('x')])), capabilities=[Durable(MemoryJournal())])


async def test_bad_input_journal_path_that_is_a_file(tmp_path: Path) -> None:
    from pydantic_ai_durable import JournalUnavailable

    path = tmp_path / 'file'
    path.write_text('not a directory')
    calls = Calls()
    with pytest.raises(JournalUnavailable, match='is a file'):
        async with execution('bad', journal=DiskJournal(path)):
            await two_step_agent(None, calls).run('q')
    with pytest.raises(JournalUnavailable, match='is a file'):
        async with execution('bad'):
            await two_step_agent(DiskJournal(path), calls).run('q')
    assert calls['model'] == 0


def test_bad_input_empty_execution_key() -> None:
    with pytest.raises(ValueError, match='non-empty'):
        execution('')


def test_j5_memory_store_is_json(tmp_path: Path) -> None:
    assert dumps({'a': (1, 2)}) == '{"a":[1,2]}'


async def test_i5_iter_and_event_stream_handler_runs_replay(new_journal: Any) -> None:
    calls = Calls()
    events: list[str] = []

    async def handler(ctx: Any, stream: Any) -> None:
        async for event in stream:
            events.append(type(event).__name__)

    model = ScriptedModel([[ToolCall('query', {'sql': 'select 3'}, id='q1')], 'answer: 3 rows'])
    outputs = []
    for attempt in range(2):
        with pytest.raises(KeyError):
            async with execution('i5-iter'):
                agent = two_step_agent(new_journal(), calls)
                async with agent.iter('q') as run:
                    async for _ in run:
                        pass
                assert run.result is not None
                outputs.append(run.result.output)
                streamed = await scripted_agent(new_journal(), calls, model).run('q', event_stream_handler=handler)
                outputs.append(streamed.output)
                raise KeyError(f'attempt {attempt} fails after the runs')
    assert outputs == ['answer: 3 rows'] * 4
    assert (calls['model'], calls['tool'], model.calls) == (2, 2, 2)  # each run live once, then replayed
    assert 'FunctionToolResultEvent' in events


def scripted_agent(journal: Journal, calls: Calls, model: ScriptedModel) -> Agent[None, str]:
    def query(sql: str) -> str:
        calls.hit('tool')
        return '3 rows'

    return Agent(model, name='scripted', toolsets=[FunctionToolset([query], id='db')], capabilities=[Durable(journal)])


async def test_model_operations_are_bound_once_per_model_not_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_ai.durable_exec import CallableOperationBackend, ModelRequestId

    bindings: list[str | None] = []
    original = CallableOperationBackend.bind

    def counting(self: Any, operation: Any) -> Any:
        if isinstance(operation.operation_id, ModelRequestId):
            bindings.append(operation.operation_id.model_name)
        return original(self, operation)

    monkeypatch.setattr(CallableOperationBackend, 'bind', counting)
    calls, journal = Calls(), MemoryJournal()
    agent = five_turn_agent(journal, calls, broken=False)
    durable = next(cap for cap in agent.root_capability.capabilities if isinstance(cap, Durable))
    async with execution('bound-once', cleanup='keep'):
        first = await agent.run('go')
    async with execution('bound-once') as handle:  # replays through the same bound operations
        second = await agent.run('go')
    assert first.output == second.output == 'done 1,done 2,done 3,done 4,done 5'
    assert calls['model'] == 6 and handle.stats.replayed['model'] == 6
    assert bindings == ['five', 'five']  # the request and the streamed request, each bound once
    backend = durable.get_durable_operation_backend()
    assert durable.get_durable_operation_backend() is backend
    durable.name = 'renamed'  # the names an operation is journaled under changed: a new backend
    assert durable.get_durable_operation_backend() is not backend


async def test_one_durable_instance_in_two_agents_journals_each_agent_under_its_own_name() -> None:
    journal, durable = MemoryJournal(), Durable(MemoryJournal())
    calls = {'alpha': Calls(), 'beta': Calls()}

    def build(name: str) -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls[name].hit('model')
            if responses(messages) == 0:
                return ModelResponse(parts=[ToolCallPart('step', {'n': 1}, tool_call_id='c1')])
            return ModelResponse(parts=[TextPart(f'{name} done')])

        def step(n: int) -> str:
            calls[name].hit('tool')
            return f'{name} {n}'

        return Agent(
            FunctionModel(model), name=name, toolsets=[FunctionToolset([step], id='steps')], capabilities=[durable]
        )

    alpha, beta = build('alpha'), build('beta')
    for attempt in range(2):
        async with execution('shared-capability', journal=journal, cleanup='keep') as handle:
            assert (await alpha.run('go')).output == 'alpha done'
            assert (await beta.run('go')).output == 'beta done'
        if attempt:
            assert handle.stats.replayed['model'] == 4 and handle.stats.replayed['tool'] == 2
    assert {name: (c['model'], c['tool']) for name, c in calls.items()} == {'alpha': (2, 1), 'beta': (2, 1)}


# -- M-5: an unverifiable first request --------------------------------------------------------------


async def test_m5_an_unverifiable_first_request_replays_only_for_the_same_prompt(
    new_journal: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls = Calls()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        prompt = next(part.content for part in messages[0].parts if isinstance(part, UserPromptPart))
        return ModelResponse(parts=[TextPart(f'answer to {prompt}')])

    def agent() -> Agent[None, str]:
        return Agent(
            FunctionModel(model, model_name='echo'),
            name='echo',
            model_settings={'extra_body': {'handle': object()}},  # cannot be fingerprinted: every request is None
            capabilities=[Durable(new_journal())],
        )

    with pytest.raises(KeyError):
        async with execution('m5-prompt'):
            assert (await agent().run('prompt A')).output == 'answer to prompt A'
            raise KeyError('after the run')
    async with execution('m5-prompt'):
        assert (await agent().run('prompt B')).output == 'answer to prompt B'  # never A's answer
    assert calls['model'] == 2
    with pytest.raises(KeyError):
        async with execution('m5-same'):
            await agent().run('prompt A')
            raise KeyError('after the run')
    async with execution('m5-same') as handle:
        assert (await agent().run('prompt A')).output == 'answer to prompt A'
    assert handle.stats.replayed['model'] == 1  # started alike: the unverifiable request still replays


async def test_a1_pydantic_ai_messages_name_the_execution_in_good_english() -> None:
    from pydantic_ai.models.test import TestModel

    agent = Agent(TestModel(), name='words', capabilities=[Durable()])
    with pytest.raises(UserError) as refused:
        async with execution('words', journal=MemoryJournal()):
            await agent.run('go', model=TestModel(custom_output_text='another instance'))
    message = str(refused.value)
    assert 'inside a journaled execution' in message, message
    assert 'a execution' not in message
