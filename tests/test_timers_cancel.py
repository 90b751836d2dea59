"""A cancelled attempt leaves the provider's job running for the next attempt (TM-6).

The batch is `timer_batch.FileBatchModel`'s file: a cancellation that reached the provider marks it `canceled`,
and every later check of it fails as a provider's does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from timer_batch import ANSWER, BatchFile, FileBatchModel, Sleeps, batch_agent, counted_sleeps

from pydantic_ai_durable import MemoryJournal, execution

try:
    from pydantic_ai import CancellationToken
except ImportError:  # pragma: no cover - 2.62 has no tokens
    CancellationToken = None  # type: ignore[assignment,misc]


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sleeps]:
    with counted_sleeps(monkeypatch) as counted:
        yield counted


async def _cancelled_in_second_wait(sleeps: Sleeps, tmp_path: Path, how: str) -> tuple[BatchFile, MemoryJournal]:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=30.0)
    token = CancellationToken() if how == 'token' else None
    task: asyncio.Task[object] | None = None

    def cancel_in_second_wait(seconds: float) -> None:
        if len(sleeps.seconds) == 2:
            sleeps.real = True  # this wait waits, so the cancellation reaches the run inside it
            if token is not None:
                token.cancel()
            else:
                assert task is not None
                task.cancel()

    async def attempt() -> object:
        async with execution('report', journal=journal):
            if token is not None:
                return await agent.run('summarise the report', cancellation_token=token)  # type: ignore[call-arg]
            return await agent.run('summarise the report')

    sleeps.on_sleep = cancel_in_second_wait
    task = asyncio.ensure_future(attempt())
    with pytest.raises(BaseException) as raised:
        await task
    assert isinstance(raised.value, asyncio.CancelledError) or type(raised.value).__name__ == 'RunCancelled'
    sleeps.on_sleep, sleeps.real = None, False
    assert len(sleeps.seconds) == 2
    return batches, journal


async def _next_attempt_continues_the_same_batch(batches: BatchFile, journal: MemoryJournal) -> None:
    assert (batches.count('cancels'), batches.status('batch-1')) == (0, 'pending')  # left for the next attempt
    batches.set_all('ready')
    agent = batch_agent(journal, batches, interval=30.0)
    async with execution('report', journal=journal):
        result = await agent.run('summarise the report')
    assert result.output == ANSWER
    assert (batches.count('submitted'), batches.count('checks'), batches.count('cancels')) == (1, 2, 0)


async def test_tm6_a_task_cancelled_in_a_batch_wait_leaves_the_batch_for_the_next_attempt(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = await _cancelled_in_second_wait(sleeps, tmp_path, 'task')
    await _next_attempt_continues_the_same_batch(batches, journal)


@pytest.mark.skipif(CancellationToken is None, reason='pydantic-ai 2.62 has no CancellationToken')
async def test_tm6_a_token_cancelled_in_a_batch_wait_leaves_the_batch_for_the_next_attempt(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = await _cancelled_in_second_wait(sleeps, tmp_path, 'token')
    await _next_attempt_continues_the_same_batch(batches, journal)


async def test_tm6_an_attempt_cancelled_during_a_check_leaves_the_batch_for_the_next_attempt(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=30.0)
    model = agent.model
    assert isinstance(model, FileBatchModel)
    model.held = asyncio.Event()

    async def attempt() -> object:
        async with execution('report', journal=journal):
            return await agent.run('summarise the report')

    task = asyncio.ensure_future(attempt())
    await model.held.wait()  # the first check is in flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (batches.count('cancels'), batches.status('batch-1')) == (0, 'pending')
    batches.set_all('ready')
    again = batch_agent(journal, batches, interval=30.0)
    async with execution('report', journal=journal):
        assert (await again.run('summarise the report')).output == ANSWER
    assert (batches.count('submitted'), batches.count('checks'), batches.count('cancels')) == (1, 1, 0)
