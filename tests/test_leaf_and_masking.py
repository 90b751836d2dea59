"""Leaf toolsets pydantic-ai does not journal (A-8, T-rules), per-tool opt-out (A-9) and secret masking (K)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Calls, Operator, Warehouse, responses, tool_returns
from pydantic import TypeAdapter
from pydantic_ai import Agent, FunctionToolset, ModelRetry, Tool
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, UserError
from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturn
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, RunContext
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset

from pydantic_ai_durable import DiskJournal, Durable, JournalError, SecretRegistry, execution
from pydantic_ai_durable.journals import Journal

_ARGS = TypeAdapter(dict[str, Any]).validator


def leaf_agent(
    journal: Journal,
    calls: Calls,
    tool: Callable[..., Any],
    *,
    crash_final: bool,
    replayable: bool = True,
    **kwargs: Any,
) -> Agent[None, Any]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        if responses(messages) == 0:
            return ModelResponse(parts=[ToolCallPart('lookup', {'item': 'nope'}, tool_call_id='l1')])
        if crash_final:
            raise RuntimeError('final request crashed')
        retries = [p.content for m in messages for p in m.parts if isinstance(p, RetryPromptPart)]
        returns = [p.content for p in tool_returns(messages)]
        return ModelResponse(parts=[TextPart(json.dumps({'retries': retries, 'returns': returns}, default=str))])

    def counted(**args: Any) -> Any:
        calls.hit('tool')
        return tool(**args)

    return Agent(
        FunctionModel(model, model_name='leafy'),
        name='leafy',
        toolsets=[Warehouse({'lookup': counted}, replayable=replayable)],
        capabilities=[Durable(journal)],
        **kwargs,
    )


async def crash_then_resume(new_journal: Any, key: str, calls: Calls, tool: Callable[..., Any], **kwargs: Any) -> Any:
    with pytest.raises(RuntimeError, match='final request crashed'):
        async with execution(key):
            await leaf_agent(new_journal(), calls, tool, crash_final=True, **kwargs).run('find it')
    async with execution(key, cleanup='keep') as handle:  # kept, so tests can read what was recorded
        result = await leaf_agent(new_journal(), calls, tool, crash_final=False, **kwargs).run('find it')
    return result, handle


async def test_a8_leaf_toolset_results_replay(new_journal: Any) -> None:
    calls = Calls()
    result, handle = await crash_then_resume(new_journal, 'a8-leaf', calls, lambda item: {'item': item, 'stock': 3})
    assert json.loads(result.output)['returns'] == [{'item': 'nope', 'stock': 3}]
    assert (calls['tool'], calls['model']) == (1, 3)
    assert handle.stats.replayed == {'model': 1, 'tool': 1}
    assert any(o.name == 'leafy__leaf_toolset__warehouse.call_tool:lookup' for o in handle.stats.steps)


async def test_t2_t5_model_retry_is_replayed_with_the_same_text(new_journal: Any) -> None:
    calls = Calls()

    def fails(item: str) -> str:
        raise ModelRetry(f'no column {item}')

    result, _ = await crash_then_resume(new_journal, 'g52', calls, fails)
    assert calls['tool'] == 1
    assert json.loads(result.output)['returns'] == ['no column nope']  # a retry comes back as a retried return


@pytest.mark.parametrize(
    ('signal', 'kind'),
    [
        (ApprovalRequired(metadata={'reason': 'big order'}), 'approval_required'),
        (CallDeferred(metadata={'queue': 'slow'}), 'call_deferred'),
    ],
)
async def test_t2_deferral_signals_are_recorded_and_raised_again(new_journal: Any, signal: Any, kind: str) -> None:
    calls = Calls()

    def defer(item: str) -> str:
        raise signal

    outputs = []
    for attempt in range(2):
        with pytest.raises(KeyError):
            async with execution('g53'):
                agent = leaf_agent(
                    new_journal(), calls, defer, crash_final=False, output_type=[str, DeferredToolRequests]
                )
                outputs.append((await agent.run('find it')).output)
                raise KeyError(f'attempt {attempt} fails after the run')
    assert calls['tool'] == 1
    assert isinstance(outputs[0], DeferredToolRequests)
    assert outputs[1] == outputs[0]
    entries = (await new_journal().read_run('g53', '0')).entries
    assert [e['payload']['kind'] for e in entries.values() if e['kind'] == 'tool'] == [kind]
    assert [e['payload'].get('metadata') for e in entries.values() if e['kind'] == 'tool'] == [signal.metadata]


async def test_t2_tool_failed_is_recorded_and_raised_again(new_journal: Any) -> None:
    from pydantic_ai.exceptions import ToolFailed

    calls = Calls()

    def broke(item: str) -> str:
        raise ToolFailed('broke')

    result, _ = await crash_then_resume(new_journal, 'g53-failed', calls, broke)
    assert calls['tool'] == 1
    assert 'broke' in result.output
    entries = (await new_journal().read_run('g53-failed', '0')).entries
    assert [e['payload'] for e in entries.values() if e['kind'] == 'tool'] == [
        {'kind': 'tool_failed', 'message': 'broke'}
    ]


async def test_t3_other_exceptions_are_not_recorded(new_journal: Any) -> None:
    calls = Calls()
    broken = True

    def flaky(item: str) -> str:
        if broken:
            raise ValueError('backend down')
        return 'fine'

    with pytest.raises(ValueError, match='backend down'):
        async with execution('g54'):
            await leaf_agent(new_journal(), calls, flaky, crash_final=False).run('find it')
    entries = (await new_journal().read_run('g54', '0')).entries
    assert [e['kind'] for e in entries.values()] == ['model']
    broken = False
    async with execution('g54') as handle:
        await leaf_agent(new_journal(), calls, flaky, crash_final=False).run('find it')
    assert calls['tool'] == 2
    assert handle.stats.replayed == {'model': 1}


async def test_t1_tool_return_objects_replay_equal(new_journal: Any) -> None:
    calls = Calls()
    value = ToolReturn(return_value={'stock': 3}, content='three in stock', metadata={'source': 'db'})
    result, _ = await crash_then_resume(new_journal, 'g55', calls, lambda item: value)
    assert calls['tool'] == 1
    entries = (await new_journal().read_run('g55', '0')).entries
    tool_payloads = [e['payload'] for e in entries.values() if e['kind'] == 'tool']
    assert list(tool_payloads[0]) == ['kind', 'tool_return'] or set(tool_payloads[0]) == {'kind', 'tool_return'}
    replayed = TypeAdapter(ToolReturn).validate_python(tool_payloads[0]['tool_return'])
    assert replayed == value
    assert json.loads(result.output)['returns'] == [{'stock': 3}]


async def test_a9_non_replayable_leaf_runs_live_and_keeps_its_position(new_journal: Any) -> None:
    calls = Calls()
    _, handle = await crash_then_resume(new_journal, 'g56', calls, lambda item: 'remote', replayable=False)
    assert (calls['tool'], calls['model']) == (2, 3)
    assert handle.stats.replayed == {'model': 1}
    assert [o.position for o in handle.stats.steps] == [0, 1, 2]


async def test_t4_leaf_result_that_is_not_json_fails_with_journal_error(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(JournalError, match='not JSON-serializable') as raised:
        async with execution('g51-leaf'):
            await leaf_agent(new_journal(), calls, lambda item: object(), crash_final=False).run('find it')
    assert 'lookup' in str(raised.value)


async def test_t6_unknown_leaf_payload_kind_runs_live(new_journal: Any) -> None:
    calls = Calls()
    with pytest.raises(KeyError):
        async with execution('d37'):
            await leaf_agent(new_journal(), calls, lambda item: 'v1', crash_final=False).run('find it')
            raise KeyError('after the run')
    journal = new_journal()
    snapshot = await journal.read_run('d37', '0')
    for position, entry in snapshot.entries.items():
        if entry['kind'] == 'tool':
            entry['payload'] = {'kind': 'renamed_in_a_later_version'}
            assert await Operator(journal).write_entry('d37', '0', position, entry)
    async with execution('d37'):
        result = await leaf_agent(new_journal(), calls, lambda item: 'v2', crash_final=False).run('find it')
    assert json.loads(result.output)['returns'] == ['v2']
    assert calls['tool'] == 2


# -- masking -----------------------------------------------------------------------------------------------


async def all_entries(journal: Journal, key: str) -> list[dict[str, Any]]:
    return list((await journal.read_run(key, '0')).entries.values())


async def test_k7_k8_secrets_never_reach_the_journal_their_tools_rerun_and_the_model_steps_replay(
    new_journal: Any,
) -> None:
    secret = f'S-{uuid.uuid4().hex}'
    secrets = SecretRegistry()
    secrets.register(secret)
    calls = Calls()

    def agent(crash_final: bool) -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit('model')
            if responses(messages) == 0:
                return ModelResponse(parts=[ToolCallPart('login', {'user': 'ann'}, tool_call_id='li')])
            if responses(messages) == 1:
                return ModelResponse(parts=[ToolCallPart('whoami', {}, tool_call_id='wi')])
            if crash_final:
                raise RuntimeError('final request crashed')
            return ModelResponse(parts=[TextPart('logged in')])

        def login(user: str) -> str:
            calls.hit('login')
            return f'password={secret}'

        def whoami() -> dict[str, Any]:
            return {'user': 'ann', 'token': [secret, {'nested': f'x{secret}y'}]}

        return Agent(
            FunctionModel(model, model_name='masked'),
            name='masked',
            toolsets=[FunctionToolset([login, whoami], id='auth')],
            capabilities=[Durable(new_journal(), secrets=secrets)],
        )

    with pytest.raises(RuntimeError):
        async with execution('h58'):
            await agent(True).run('log in')
    entries = await all_entries(new_journal(), 'h58')
    assert secret not in json.dumps(entries)
    tool_payloads = [e['payload'] for e in entries if e['kind'] == 'tool']
    assert tool_payloads[0]['result'] == 'password=***'
    assert tool_payloads[1]['result'] == {'user': 'ann', 'token': ['***', {'nested': 'x***y'}]}
    async with execution('h58') as handle:
        assert (await agent(False).run('log in')).output == 'logged in'
    assert handle.stats.replayed == {'model': 2}  # the masked history still matches
    # K-8: the journal holds only `***` of their results, which must never reach a live call: they run again
    assert calls['login'] == 2
    assert [o.name.rsplit(':', 1)[-1] for o in handle.stats.steps if o.outcome == 'live'][:2] == ['login', 'whoami']


async def test_k7_secret_in_tool_results_args_and_model_text_never_in_what_tools_returned(new_journal: Any) -> None:
    from pydantic_ai_durable import register_secret

    secret = f'G-{uuid.uuid4().hex}'
    register_secret(secret)
    calls = Calls()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if responses(messages) == 0:
            return ModelResponse(
                parts=[TextPart(f'using {secret}'), ToolCallPart('echo', {'value': secret}, tool_call_id='e')]
            )
        return ModelResponse(parts=[TextPart(f'done with {secret}')])

    def echo(value: str) -> list[str]:
        calls.hit('echo')
        return [value, value.encode().hex(), f'again {value}']

    journal = new_journal()
    agent = Agent(
        FunctionModel(model, model_name='grep'),
        name='grep',
        toolsets=[FunctionToolset([echo], id='e')],
        capabilities=[Durable(journal)],
    )
    async with execution('grep', cleanup='keep'):
        await agent.run('go')
    entries = await all_entries(journal, 'grep')
    tool_text = json.dumps([e for e in entries if e['kind'] == 'tool'])
    assert secret not in tool_text and '***' in tool_text
    if isinstance(journal, DiskJournal):
        raw = b''.join(p.read_bytes() for p in Path(journal.path).iterdir() if p.is_file())
        assert f'again {secret}'.encode() not in raw  # only in what the tool returned, so never stored
        assert b'again ***' in raw


async def test_p5_a_leaf_without_an_id_is_journaled_under_its_class_name(new_journal: Any) -> None:
    calls = Calls()

    def lookup(item: str) -> str:
        calls.hit('tool')
        return f'{item}: 3'

    def build() -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit('model')
            if responses(messages) == 0:
                return ModelResponse(parts=[ToolCallPart('lookup', {'item': 'a'}, tool_call_id='l1')])
            return ModelResponse(parts=[TextPart(str(tool_returns(messages)[-1].content))])

        return Agent(
            FunctionModel(model),
            name='unnamed',
            toolsets=[Warehouse({'lookup': lookup}, id=None)],  # type: ignore[arg-type]
            capabilities=[Durable(new_journal())],
        )

    for _attempt in range(2):
        async with execution('p5-no-id', cleanup='keep') as handle:
            assert (await build().run('go')).output == 'a: 3'
    assert (calls['model'], calls['tool']) == (2, 1)
    assert handle.stats.replayed == {'model': 2, 'tool': 1}
    assert [o.name for o in handle.stats.steps if o.kind == 'tool'] == [
        'unnamed__leaf_toolset__Warehouse.call_tool:lookup'
    ]


# -- toolsets added at run time (A-10) ----------------------------------------------------------------


def runtime_model(tool: str) -> FunctionModel:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if responses(messages) == 0:
            return ModelResponse(parts=[ToolCallPart(tool, {'item': 'a'}, tool_call_id='r1')])
        return ModelResponse(parts=[TextPart('done')])

    return FunctionModel(model)


@pytest.mark.parametrize('how', ['run', 'override', 'dynamic', 'decorator'])
async def test_a10_executing_toolsets_added_at_run_time_are_refused_inside_an_execution(
    new_journal: Any, how: str
) -> None:
    calls = Calls()

    def lookup(item: str) -> str:
        calls.hit('tool')
        return f'{item}: 3'

    agent = Agent(runtime_model('lookup'), name='runtime', capabilities=[Durable(new_journal())])
    extra = FunctionToolset([lookup], id='extra')
    if how == 'decorator':  # registered after the agent was built

        @agent.toolset(id='registered')
        def registered(ctx: RunContext[None]) -> FunctionToolset[None]:
            return extra

    async def run() -> Any:
        if how == 'run':
            return await agent.run('go', toolsets=[extra])
        if how == 'override':
            with agent.override(toolsets=[extra]):
                return await agent.run('go')
        if how == 'dynamic':
            return await agent.run('go', toolsets=[DynamicToolset(lambda ctx: extra, id='later')])
        return await agent.run('go')

    assert (await run()).output == 'done'  # outside an execution the capability is inert (R-1)
    with pytest.raises(UserError, match='cannot be added at runtime') as refused:
        async with execution('a10-refused'):
            await run()
    assert 'Pass them to the agent constructor' in str(refused.value)
    assert calls['tool'] == 1  # only the run outside the execution called it


async def test_a10_a_custom_leaf_added_at_run_time_is_journaled(new_journal: Any) -> None:
    calls = Calls()

    def lookup(item: str) -> str:
        calls.hit('tool')
        return f'{item}: 3'

    agent = Agent(runtime_model('lookup'), name='runtime', capabilities=[Durable(new_journal())])
    with pytest.raises(KeyError):
        async with execution('a10-leaf'):
            await agent.run('go', toolsets=[Warehouse({'lookup': lookup}, id='extra')])
            raise KeyError('after the run')
    async with execution('a10-leaf') as handle:
        await agent.run('go', toolsets=[Warehouse({'lookup': lookup}, id='extra')])
    assert calls['tool'] == 1  # replayed, never run twice
    outcomes = [(o.kind, o.outcome) for o in handle.stats.steps]
    assert outcomes == [('model', 'replayed'), ('tool', 'replayed'), ('model', 'replayed')]


# -- opting out (A-9, M-6) -----------------------------------------------------------------------------


class LiveToolset(FunctionToolset[Any]):
    """A function toolset whose tools act on a system the journal cannot observe."""

    replayable = False


def opt_out_agent(journal: Journal, calls: Calls, kind: str, *, crash_final: bool) -> Agent[None, str]:
    """Calls `save` and `ping` (opted out, as `kind` says) in one batch; a dynamic toolset lists before each request.

    The listing after the batch is an unfingerprinted step claimed right after the opted-out call (M-5).
    """

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        if responses(messages) == 0:
            return ModelResponse(
                parts=[ToolCallPart('save', {}, tool_call_id='s'), ToolCallPart('ping', {}, tool_call_id='p')]
            )
        if crash_final:
            raise RuntimeError('final request crashed')
        return ModelResponse(parts=[TextPart('done')])

    def ping() -> str:
        calls.hit('ping')
        return 'pong'

    def save() -> str:
        calls.hit('save')
        return 'saved'

    def listing(ctx: RunContext[None]) -> FunctionToolset[None]:
        calls.hit('listing')  # a dynamic toolset's discovery: an unfingerprinted step (M-5)
        return FunctionToolset([save], id='saving')

    if kind == 'metadata':
        pinging: AbstractToolset[Any] = FunctionToolset(
            [Tool(ping, metadata={'durable': {'replayable': False}})], id='p'
        )
    elif kind == 'function-subclass':
        pinging = LiveToolset([ping], id='p')
    elif kind == 'function-attribute':
        pinging = FunctionToolset([ping], id='p')
        pinging.replayable = False  # type: ignore[attr-defined]
    elif kind == 'dynamic':
        pinging = DynamicToolset(lambda ctx: FunctionToolset([ping], id='inner'), id='p')
        pinging.replayable = False  # type: ignore[attr-defined]
    else:
        pinging = Warehouse({'ping': ping}, id='p', replayable=False)
    return Agent(
        FunctionModel(model, model_name='optout'),
        name='optout',
        toolsets=[pinging, DynamicToolset(listing, id='listing')],
        capabilities=[Durable(journal)],
    )


@pytest.mark.parametrize('kind', ['metadata', 'function-subclass', 'function-attribute', 'dynamic', 'leaf'])
async def test_a9_m6_an_opted_out_tool_runs_live_and_every_step_after_it_still_replays(
    new_journal: Any, kind: str
) -> None:
    calls = Calls()
    with pytest.raises(RuntimeError):
        async with execution('a9-kinds'):
            await opt_out_agent(new_journal(), calls, kind, crash_final=True).run('go')
    first = dict(calls.counts)
    async with execution('a9-kinds') as handle:
        await opt_out_agent(new_journal(), calls, kind, crash_final=False).run('go')
    assert calls['ping'] == 2 * first['ping'] == 2  # opted out: live on every attempt
    assert calls['save'] == first['save'] == 1  # its sibling replayed
    # The listing right after it replayed too (M-6): listed again only to check it is unchanged (DV-1).
    assert handle.stats.divergences == [] and handle.stats.replayed['other'] >= 1
    live = [(o.kind, o.name.rsplit('.', 1)[-1]) for o in handle.stats.steps if o.outcome == 'live']
    assert live == [('tool', 'call_tool:ping'), ('model', 'request')]  # the final request crashed before


async def test_x4_a_leaf_tool_return_replay_is_validated_once(
    new_journal: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recorded `ToolReturn` is validated by the X-1 check, and that object is what the replay returns."""
    import pydantic_ai_durable._steps._payloads as payloads

    validations: list[object] = []
    adapter = payloads._TOOL_RETURN_ADAPTER  # pyright: ignore[reportPrivateUsage]

    class Counting:
        def validate_python(self, data: object) -> Any:
            validations.append(data)
            return adapter.validate_python(data)

    calls = Calls()
    value = ToolReturn(return_value={'stock': 3}, content='three in stock')
    with pytest.raises(RuntimeError, match='final request crashed'):
        async with execution('x4-leaf'):
            await leaf_agent(new_journal(), calls, lambda item: value, crash_final=True).run('find it')
    monkeypatch.setattr(payloads, '_TOOL_RETURN_ADAPTER', Counting())
    async with execution('x4-leaf') as handle:
        result = await leaf_agent(new_journal(), calls, lambda item: value, crash_final=False).run('find it')
    assert json.loads(result.output)['returns'] == [{'stock': 3}]
    assert handle.stats.replayed == {'model': 1, 'tool': 1}
    assert calls['tool'] == 1
    assert len(validations) == 1  # two before: the check, then the decode
