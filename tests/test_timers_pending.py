"""Runs that end with a pending response (TM-7..TM-9): the execution waits on the provider, and the same code
checks the same request again, never submitting it twice.

The provider is `timer_batch.FileBatchModel`'s file; the agent has `PendingModelResponse` in its `output_type`,
so a run ends as soon as its request is left waiting on the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.output import PendingModelResponse
from timer_batch import ANSWER, BatchFile, FileBatchModel, Sleeps, counted_sleeps

from pydantic_ai_durable import (
    Durable,
    DurableError,
    ExecutionInfo,
    Journal,
    MemoryJournal,
    execution,
    sweep_interrupted,
)

PROMPT = 'summarise the report'


@pytest.fixture
def sleeps() -> Iterator[Sleeps]:
    with counted_sleeps() as counted:
        yield counted


def pending_agent(journal: Journal | None, batches: BatchFile) -> Agent[None, str | PendingModelResponse]:
    return Agent(
        FileBatchModel(batches, interval=30.0),
        name='batched',
        output_type=[str, PendingModelResponse],  # type: ignore[arg-type]
        capabilities=[Durable(journal)],
    )


async def state(journal: MemoryJournal) -> str:
    (info,) = await journal.list_executions()
    return info.state


async def attempt(agent: Agent[None, str | PendingModelResponse], journal: MemoryJournal) -> object:
    async with execution('report', journal=journal):
        result = await agent.run(PROMPT)
    return result.output


def counts(batches: BatchFile) -> tuple[int, int, int]:
    return batches.count('submitted'), batches.count('checks'), batches.count('cancels')


async def test_tm7_tm8_a_pending_run_waits_and_the_same_code_checks_the_same_request_until_it_goes_on(
    sleeps: Sleeps, tmp_path: Path, new_journal: Callable[[], Journal]
) -> None:
    batches = BatchFile(tmp_path / 'batches.json')
    agent = pending_agent(None, batches)  # each attempt opens the journal anew, as a new process would

    async def attempt() -> object:
        journal = new_journal()
        async with execution('report', journal=journal):
            result = await agent.run(PROMPT)
        return result.output

    async def state() -> str:
        (info,) = await new_journal().list_executions()
        return info.state

    first = await attempt()
    assert isinstance(first, PendingModelResponse)
    assert counts(batches) == (1, 0, 0)
    assert await state() == 'waiting'  # on the provider, not finished

    again = await attempt()  # still pending: checked once, not submitted again
    assert isinstance(again, PendingModelResponse)
    assert again.response.provider_response_id == 'batch-1'
    assert counts(batches) == (1, 1, 0)
    assert await state() == 'waiting'

    batches.set_all('ready')
    assert await attempt() == ANSWER
    assert counts(batches) == (1, 2, 0)
    assert await state() == 'finished'

    assert await attempt() == ANSWER  # the replay of the finished execution calls nothing
    assert counts(batches) == (1, 2, 0) and sleeps.seconds == []


async def test_tm9_continuing_a_pending_run_in_its_own_key_with_its_history_is_refused_and_overwrites_nothing(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = pending_agent(journal, batches)
    async with execution('report', journal=journal):
        pending = await agent.run(PROMPT)
    assert isinstance(pending.output, PendingModelResponse)

    batches.set_all('ready')
    with pytest.raises(DurableError, match='run the same code again'):
        async with execution('report', journal=journal):
            await agent.run(message_history=pending.all_messages(), run_id='continued')  # its own run id
    assert counts(batches) == (1, 0, 0)

    assert await attempt(agent, journal) == ANSWER  # the original call goes on: the same batch, checked once
    assert counts(batches) == (1, 1, 0)
    assert await state(journal) == 'finished'


async def test_tm7_the_sweep_sends_a_run_waiting_on_the_provider_on_once_per_idle(
    sleeps: Sleeps, tmp_path: Path, new_journal: Callable[[], Journal]
) -> None:
    idle = 0.3
    batches, journal = BatchFile(tmp_path / 'batches.json'), new_journal()
    agent = pending_agent(None, batches)
    sent: list[str] = []

    def dispatch(info: ExecutionInfo) -> None:
        sent.append(info.key)

    async def attempt() -> object:
        async with execution('report', journal=new_journal()):
            return (await agent.run(PROMPT)).output

    assert isinstance(await attempt(), PendingModelResponse)
    assert await sweep_interrupted(journal, dispatch, idle=idle) == []  # not idle yet
    await asyncio.sleep(idle)
    assert await sweep_interrupted(journal, dispatch, idle=idle) == ['report']
    assert await sweep_interrupted(new_journal(), dispatch, idle=idle) == []  # once per idle, whoever sweeps
    assert isinstance(await attempt(), PendingModelResponse)  # the attempt it was sent for: one check
    assert counts(batches) == (1, 1, 0)

    batches.set_all('ready')
    await asyncio.sleep(idle)
    assert await sweep_interrupted(journal, dispatch, idle=idle) == ['report']
    assert await attempt() == ANSWER
    await asyncio.sleep(idle)
    assert await sweep_interrupted(journal, dispatch, idle=idle) == []  # finished: nothing to send
    assert sent == ['report', 'report'] and counts(batches) == (1, 2, 0)


async def test_tm9_xp3_a_fork_before_the_pending_request_waits_on_no_job_until_its_own_run_submits_one(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    from pydantic_ai_durable import fork_execution

    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = pending_agent(journal, batches)
    assert isinstance(await attempt(agent, journal), PendingModelResponse)
    await fork_execution(journal, 'report', 'report-2', at=0)
    assert 'provider_waits' not in (await journal.read_execution('report-2') or {})  # the job is the source's
    async with execution('report-2', journal=journal):
        assert isinstance((await agent.run(PROMPT)).output, PendingModelResponse)
    assert counts(batches) == (2, 0, 0)  # the fork submitted its own request, and checked no one else's job
