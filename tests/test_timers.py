"""Durable timers (TM-1..TM-5): the waits between polls of a batch are journaled wake-up times.

The batch is a provider's double kept in a file (`timer_batch.FileBatchModel`), so submissions and checks are
counted across processes; sleeps are counted (and wait no wall time) with a clock that moves on by what was slept.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.durable_exec import BaseDurabilityCapability
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.usage import RequestUsage
from timer_batch import ANSWER, BatchFile, FileBatchModel, Sleeps, batch_agent, counted_sleeps, run_child, slept

from pydantic_ai_durable import Durable, MemoryJournal, execution

HERE = Path(__file__).parent


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sleeps]:
    with counted_sleeps(monkeypatch) as counted:
        yield counted


async def test_tm1_tm3_a_replayed_wait_does_not_sleep_and_a_finished_replay_calls_nothing(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=30.0, ready_after=3)
    async with execution('report', journal=journal) as handle:
        result = await agent.run('summarise the report')
    assert result.output == ANSWER
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 3, [30.0, 30.0, 30.0])
    assert [step.name for step in handle.stats.steps].count('durable_sleep') == 3

    sleeps.seconds.clear()
    async with execution('report', journal=journal) as handle:
        again = await agent.run('summarise the report')
    assert again.output == ANSWER
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 3, [])
    assert {step.outcome for step in handle.stats.steps} == {'replayed'}


async def test_tm2_a_recovered_wait_sleeps_only_for_what_is_left(
    sleeps: Sleeps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=30.0)

    class Crash(BaseException):
        pass

    def crash_in_third_wait(seconds: float) -> None:
        if len(sleeps.seconds) == 3:
            sleeps.seconds[-1], sleeps.elapsed = 10.0, 70.0  # ten seconds of the wait passed, then the process died
            raise Crash

    sleeps.on_sleep = crash_in_third_wait
    with pytest.raises(Crash):
        async with execution('report', journal=journal):
            await agent.run('summarise the report')
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 2, [30.0, 30.0, 10.0])

    batches.set_all('ready')  # ready all along
    sleeps.on_sleep = None
    sleeps.seconds.clear()
    async with execution('report', journal=journal) as handle:
        result = await agent.run('summarise the report')
    assert result.output == ANSWER
    assert sleeps.seconds == [20.0]  # the rest of the third wait, and nothing for the two it replayed
    assert (batches.count('submitted'), batches.count('checks')) == (1, 3)
    assert [step.outcome for step in handle.stats.steps].count('live') == 1  # the check


class Untimed(Durable[None]):
    """`Durable` as it was before timers: the agent graph's sleep left plain (the journals it wrote have no timers)."""

    async def _timed(self, handler: Any) -> Any:
        return await handler()

    if hasattr(BaseDurabilityCapability, 'durable_sleep'):  # 2.78: the base routes only an overridden one
        durable_sleep = BaseDurabilityCapability.durable_sleep  # type: ignore[attr-defined]


async def test_tm5_a_run_journaled_without_timers_replays_as_recorded(sleeps: Sleeps, tmp_path: Path) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    old = Agent(FileBatchModel(batches, interval=30.0, ready_after=3), name='batched', capabilities=[Untimed(journal)])
    async with execution('report', journal=journal) as handle:
        assert (await old.run('summarise the report')).output == ANSWER
    assert 'durable_sleep' not in [step.name for step in handle.stats.steps]

    sleeps.seconds.clear()
    new = batch_agent(journal, batches, interval=30.0, ready_after=3)
    async with execution('report', journal=journal) as handle:
        assert (await new.run('summarise the report')).output == ANSWER
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 3, [])
    assert {step.outcome for step in handle.stats.steps} == {'replayed'} and not handle.stats.divergences


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
def test_tm2_tm3_sigkill_inside_a_wait_then_recovery_checks_at_once_and_the_replay_sleeps_nothing(
    tmp_path: Path,
) -> None:
    batches = BatchFile(tmp_path / 'batches.json')
    killed = run_child(tmp_path, later=0, kill_at=4)  # killed as its fourth 60 s wait begins
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    first = slept(tmp_path)
    assert len(first) == 4 and all(59.0 < seconds <= 60.0 for seconds in first), first  # the wall clock moves on
    assert (batches.count('submitted'), batches.count('checks')) == (1, 3)

    batches.set_all('ready')  # the batch was ready all along
    recovered = run_child(tmp_path, later=180 + 45)  # 45 s after the crash, which came three waits in
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert recovered.stdout.strip() == ANSWER
    (left,) = slept(tmp_path)  # only the rest of the interrupted wait; none for the three it replayed
    assert 0 < left <= 15.0
    assert (batches.count('submitted'), batches.count('checks')) == (1, 4)

    replay = run_child(tmp_path, later=3600)  # the finished execution, an hour later
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert replay.stdout.strip() == ANSWER
    assert slept(tmp_path) == []
    assert (batches.count('submitted'), batches.count('checks'), batches.count('cancels')) == (1, 4, 0)


class TwoSegments(FileBatchModel):
    """A generation the provider pauses once: 'The answer ' (suspended, its own id), then 'is 42.' after a delay."""

    async def request(self, messages: list[Any], model_settings: Any, model_request_parameters: Any) -> ModelResponse:
        data = self.batches.read()
        data['submitted' if not isinstance(messages[-1], ModelResponse) else 'checks'] += 1
        self.batches.write(data)
        if isinstance(messages[-1], ModelResponse):
            return ModelResponse(
                parts=[TextPart('is 42.')],
                usage=RequestUsage(input_tokens=3, output_tokens=4),
                provider_response_id='s2',
            )
        return ModelResponse(
            parts=[TextPart('The answer ')],
            usage=RequestUsage(input_tokens=5, output_tokens=2),
            provider_response_id='s1',
            state='suspended',
        )

    def continuation_delay(self, response: ModelResponse) -> float | None:
        return 0.2


async def test_tm1_tm3_a_paused_generation_waits_on_a_timer_and_counts_as_one_request(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    """pydantic-ai's Temporal suite checks that the delay before continuing a paused segment is a durable timer,
    each segment its own unit, and the chain one request; here the same, then the replay: nothing runs again."""
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = Agent(TwoSegments(batches), name='paused', capabilities=[Durable(journal)])
    async with execution('paused', journal=journal) as handle:
        result = await agent.run('go')
    assert result.output == 'The answer is 42.'
    assert [step.kind for step in handle.stats.steps] == ['model', 'other', 'model']
    assert [step.name for step in handle.stats.steps][1] == 'durable_sleep'
    assert (result.usage.requests, result.usage.input_tokens, result.usage.output_tokens) == (1, 8, 6)
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 1, [pytest.approx(0.2)])

    sleeps.seconds.clear()
    async with execution('paused', journal=journal) as handle:
        again = await agent.run('go')
    assert again.output == 'The answer is 42.'
    assert (again.usage.requests, again.usage.input_tokens, again.usage.output_tokens) == (1, 8, 6)
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 1, [])
    assert {step.outcome for step in handle.stats.steps} == {'replayed'}


async def test_tm1_a_wait_inside_a_tool_is_a_plain_sleep_of_the_tool(sleeps: Sleeps, tmp_path: Path) -> None:
    """A nested run in a tool inherits the graph's sleep: its wait is part of the tool's step, not a timer."""
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    inner = Agent(TwoSegments(batches), name='inner')

    async def ask_inner() -> str:
        return (await inner.run('go')).output

    def outer_model(messages: list[Any], info: Any) -> ModelResponse:
        if any(isinstance(part, ToolReturnPart) for message in messages for part in message.parts):
            return ModelResponse(parts=[TextPart('done')])
        return ModelResponse(parts=[ToolCallPart('ask_inner', {}, tool_call_id='c1')])

    outer = Agent(
        FunctionModel(outer_model, model_name='outer'),
        name='outer',
        toolsets=[FunctionToolset([ask_inner], id='inner_tools')],
        capabilities=[Durable(journal)],
    )
    async with execution('nested', journal=journal) as handle:
        assert (await outer.run('go')).output == 'done'
    assert 'durable_sleep' not in [step.name for step in handle.stats.steps]
    assert sleeps.seconds == [pytest.approx(0.2)]
    sleeps.seconds.clear()
    async with execution('nested', journal=journal):
        assert (await outer.run('go')).output == 'done'
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 1, [])
