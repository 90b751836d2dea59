"""The duties pydantic-ai's durable base class takes on, inherited (A-12), and the units it cannot see (A-13).

Each test runs on every supported release and skips, saying why, where the installed pydantic-ai lacks the
feature it checks. Each counts what ran: model requests, tool bodies, calls of the base's hooks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, CancellationToken, FunctionToolset
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec import BaseDurabilityCapability
from pydantic_ai.exceptions import RunCancelled, UserError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from pydantic_ai_durable import Durable, DurableError, execution
from pydantic_ai_durable.journals import DiskJournal

HAS_SUBMIT_OUTPUT = hasattr(RunContext, 'submit_output')
SEES_RUN_INPUTS = hasattr(AbstractCapability, '_get_default_run_id_for_inputs')
SPEC_DECLARES_TOKENS = 'accepts_cancellation_token' in Durable.engine_spec.__dataclass_fields__


def _returns(messages: list[ModelMessage]) -> int:
    return sum(isinstance(part, ToolReturnPart) for message in messages for part in message.parts)


def _stepping_agent(journal: DiskJournal, calls: list[str], during: Any = None) -> Agent[None, str]:
    """Two tool calls, then 'done': positions 0 to 4."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = _returns(messages)
        calls.append(f'model {2 * done}')
        if done < 2:
            return ModelResponse(parts=[ToolCallPart('step', {'n': done + 1}, tool_call_id=f'c{done + 1}')])
        return ModelResponse(parts=[TextPart('done')])

    def step(n: int) -> str:
        calls.append(f'tool {2 * n - 1}')
        if during is not None:
            during(n)
        return f'r{n}'

    return Agent(
        FunctionModel(model),
        name='contract',
        toolsets=[FunctionToolset([step], id='steps')],
        capabilities=[Durable(journal=journal)],
    )


async def test_a12_every_agent_run_goes_through_the_base_classes_wrap_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duty a release adds to `BaseDurabilityCapability.wrap_run` reaches this package without a change here."""
    entered: list[bool] = []
    original = BaseDurabilityCapability.wrap_run

    async def counting(self: Any, ctx: Any, *, handler: Any) -> Any:
        entered.append(bool(self.in_durable_context))
        return await original(self, ctx, handler=handler)

    monkeypatch.setattr(BaseDurabilityCapability, 'wrap_run', counting)
    calls: list[str] = []
    agent = _stepping_agent(DiskJournal(tmp_path / 'j'), calls)
    async with execution('a12-base'):
        assert (await agent.run('go')).output == 'done'
    assert (await agent.run('go')).output == 'done'  # outside an execution too
    assert entered == [True, False]


@pytest.mark.skipif(not SPEC_DECLARES_TOKENS, reason='pydantic-ai 2.62 has no cancellation-token policy in its spec')
def test_a12_the_cancellation_token_policy_is_declared() -> None:
    assert Durable.engine_spec.accepts_cancellation_token is True  # type: ignore[attr-defined,unused-ignore]


def _cancelled_in_second_tool(journal: DiskJournal, calls: list[str]) -> tuple[Agent[None, str], CancellationToken]:
    """The stepping agent and a token its second tool fires, once, while it runs."""
    token = CancellationToken()

    def cancel_in_second_tool(n: int) -> None:
        if n == 2 and not token.cancelled:
            token.cancel()

    return _stepping_agent(journal, calls, during=cancel_in_second_tool), token


async def test_a12_a_cancelled_run_fails_its_attempt_and_a_plain_rerun_repeats_no_step_that_ended(
    tmp_path: Path,
) -> None:
    journal = DiskJournal(tmp_path / 'j')
    calls: list[str] = []
    agent, token = _cancelled_in_second_tool(journal, calls)
    with pytest.raises(RunCancelled):
        async with execution('a12-cancel', cleanup='keep'):
            await agent.run('go', cancellation_token=token)
    assert calls == ['model 0', 'tool 1', 'model 2', 'tool 3']
    [info] = await journal.list_executions()
    assert info.state == 'failed'  # the attempt ended with the run's RunCancelled, which its record keeps
    assert 'RunCancelled' in str(await journal.read_execution('a12-cancel'))

    calls.clear()
    async with execution('a12-cancel', cleanup='keep') as handle:
        assert (await agent.run('go')).output == 'done'
    assert calls == ['model 4']  # the tool that was running when the token fired had ended: it replays
    assert [step.outcome for step in handle.stats.steps] == ['replayed'] * 4 + ['live']


# -- the leaves this package journals itself are durable units to pydantic-ai ---------------------------

_ANY_ARGS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))


class Submitting(AbstractToolset[Any]):
    """A custom leaf toolset whose tool submits the run's output, as `ctx.submit_output` allows."""

    def __init__(self, bodies: list[str]) -> None:
        self.bodies = bodies

    @property
    def id(self) -> str | None:
        return 'submitting'

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        definition = ToolDefinition(name='finish', parameters_json_schema={'type': 'object'})
        return {'finish': ToolsetTool(toolset=self, tool_def=definition, max_retries=1, args_validator=_ANY_ARGS)}

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        self.bodies.append(name)
        output_tool = next(iter(ctx.output_tools))
        await ctx.submit_output(output_tool, {'response': 'submitted'})  # type: ignore[attr-defined,unused-ignore]
        return 'ok'


def _submitting_agent(journal: DiskJournal | None, bodies: list[str], requests: list[int]) -> Agent[None, Any]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append(len(messages))
        if _returns(messages) == 0:
            return ModelResponse(parts=[ToolCallPart('finish', {}, tool_call_id='f1')])
        return ModelResponse(parts=[TextPart('the model answered')])

    capabilities = [Durable(journal=journal)] if journal is not None else []
    return Agent(
        FunctionModel(model), name='submit', output_type=[str], toolsets=[Submitting(bodies)], capabilities=capabilities
    )


@pytest.mark.skipif(not HAS_SUBMIT_OUTPUT, reason='this pydantic-ai has no RunContext.submit_output (2.7x)')
async def test_a13_submit_output_from_a_journaled_leaf_tool_is_refused_as_in_any_durable_unit(tmp_path: Path) -> None:
    bodies: list[str] = []
    requests: list[int] = []
    plain = _submitting_agent(None, bodies, requests)
    assert (await plain.run('go')).output == 'submitted'  # without durability pydantic-ai accepts it

    bodies.clear()
    durable = _submitting_agent(DiskJournal(tmp_path / 'j'), bodies, requests)
    with pytest.raises(UserError, match='submit_output'):
        async with execution('a13'):
            await durable.run('go')
    assert bodies == ['finish']


# -- a run's identity is the same in every attempt of its execution ---------------------------------------


async def test_a14_run_id_and_conversation_id_are_the_same_in_every_attempt(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / 'j')
    seen: list[tuple[str, str | None]] = []
    fail = [True]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if _returns(messages) == 0:
            return ModelResponse(parts=[ToolCallPart('look', {}, tool_call_id='l1')])
        return ModelResponse(parts=[TextPart('done')])

    def look(ctx: RunContext[None]) -> str:
        seen.append((ctx.run_id, getattr(ctx, 'conversation_id', None)))
        if fail[0]:
            fail[0] = False
            raise RuntimeError('the process dies here')
        return 'seen'

    agent = Agent(
        FunctionModel(model),
        name='ids',
        toolsets=[FunctionToolset([look], id='look')],
        capabilities=[Durable(journal=journal)],
    )
    with pytest.raises(RuntimeError):
        async with execution('a14', cleanup='keep'):
            await agent.run('go')
    async with execution('a14', cleanup='keep'):
        first = await agent.run('go')
        second = await agent.run('again')
    assert len(seen) == 3 and seen[0] == seen[1]  # the same run id and conversation id in both attempts
    assert seen[2][0] != seen[0][0]  # another run of the same attempt
    assert first.run_id == seen[0][0]
    assert second.run_id == seen[2][0]
    inside = {run_id for run_id, _ in seen}
    outside = await agent.run('go')  # outside an execution: pydantic-ai's own fresh id
    assert outside.run_id not in inside


# -- continuing a cancelled run never records over it ---------------------------------------------------


async def test_a15_a_run_restarted_with_its_own_messages_is_refused_and_the_recorded_run_stays(
    tmp_path: Path,
) -> None:
    journal = DiskJournal(tmp_path / 'j')
    calls: list[str] = []
    agent, token = _cancelled_in_second_tool(journal, calls)
    with pytest.raises(RunCancelled) as cancelled:
        async with execution('a15', cleanup='keep'):
            await agent.run('go', cancellation_token=token)
    recorded = await journal.read_run('a15', '0')
    messages = cancelled.value.all_messages()

    calls.clear()
    # 2.62 asks for the run id without the inputs, and refuses the reused id itself, with its own message
    refusal = DurableError if SEES_RUN_INPUTS else UserError
    with pytest.raises(refusal, match=r'same execution|already appears'):
        async with execution('a15', cleanup='keep'):
            await agent.run(message_history=messages)
    assert calls == []
    assert await journal.read_run('a15', '0') == recorded  # nothing recorded over run 0

    async with execution('a15', cleanup='keep') as handle:  # the same code again: it continues
        assert (await agent.run('go')).output == 'done'
    assert calls == ['model 4']
    assert [step.outcome for step in handle.stats.steps] == ['replayed'] * 4 + ['live']


async def test_a15_continuing_a_cancelled_run_in_the_same_attempt_is_a_run_of_its_own(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / 'j')
    calls: list[str] = []
    agent, token = _cancelled_in_second_tool(journal, calls)
    async with execution('a15-same', cleanup='keep') as handle:
        try:
            await agent.run('go', cancellation_token=token)
        except RunCancelled as cancelled:
            result = await agent.run(message_history=cancelled.all_messages())
    assert result.output == 'done'
    assert sorted({step.run for step in handle.stats.steps}) == ['0', '1']


# -- A-12, after pydantic-ai's own cancellation tests: a token fired early, a task cancelled from outside ------


async def test_a12_a_token_cancelled_before_the_run_sends_nothing_and_records_nothing(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / 'j')
    calls: list[str] = []
    agent = _stepping_agent(journal, calls)
    token = CancellationToken()
    token.cancel()
    with pytest.raises(RunCancelled):
        async with execution('a12-early', cleanup='keep'):
            await agent.run('go', cancellation_token=token)
    assert calls == []
    async with execution('a12-early', cleanup='keep') as handle:
        assert (await agent.run('go')).output == 'done'
    assert calls == ['model 0', 'tool 1', 'model 2', 'tool 3', 'model 4']
    assert handle.stats.divergences == []


async def test_a12_a_task_cancelled_from_outside_during_a_request_resends_only_that_request(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / 'j')
    calls: list[str] = []
    in_flight = asyncio.Event()
    hang = [True]

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = _returns(messages)
        calls.append(f'model {2 * done}')
        if done == 1 and hang[0]:
            in_flight.set()
            await asyncio.Event().wait()  # the second request never answers in the first attempt
        if done < 2:
            return ModelResponse(parts=[ToolCallPart('step', {'n': done + 1}, tool_call_id=f'c{done + 1}')])
        return ModelResponse(parts=[TextPart('done')])

    def step(n: int) -> str:
        calls.append(f'tool {2 * n - 1}')
        return f'r{n}'

    agent = Agent(
        FunctionModel(model),
        name='outside',
        toolsets=[FunctionToolset([step], id='steps')],
        capabilities=[Durable(journal=journal)],
    )

    async def first_attempt() -> None:
        async with execution('a12-task', cleanup='keep'):
            await agent.run('go')

    task = asyncio.create_task(first_attempt())
    await in_flight.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == ['model 0', 'tool 1', 'model 2']

    calls.clear()
    hang[0] = False
    async with execution('a12-task', cleanup='keep') as handle:
        assert (await agent.run('go')).output == 'done'
    assert calls == ['model 2', 'tool 3', 'model 4']  # the request cut off is sent again, once; nothing else
    assert [step.outcome for step in handle.stats.steps[:2]] == ['replayed', 'replayed']
