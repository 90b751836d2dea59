"""Long waits that end the attempt (TM-4): the execution waits until the wake-up time, holding nothing.

The batch is the provider's double kept in a file (`timer_batch.FileBatchModel`); sleeps wait no wall time and are
counted, and the timer's clock is set by each test, so "an hour later" is a number, not a wait.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from timer_batch import ANSWER, BatchFile, Sleeps, batch_agent, counted_sleeps, run_child, slept

from pydantic_ai_durable import DiskJournal, Durable, ExecutionWaiting, MemoryJournal, execution, sweep_interrupted
from pydantic_ai_durable._steps import _timer

HERE = Path(__file__).parent
HOUR = 3600.0
LOCAL = 'http://127.0.0.1:8765'


class Clock:
    """The timer's wall clock, moved by hand; sleeps add what they slept."""

    def __init__(self, sleeps: Sleeps, start: float) -> None:
        self.sleeps, self.start = sleeps, start

    def __call__(self) -> float:
        return self.start + self.sleeps.elapsed

    def move(self, seconds: float) -> None:
        self.start += seconds


@pytest.fixture
def sleeps() -> Iterator[Sleeps]:
    with counted_sleeps() as counted:  # the timer's clock is the `clock` fixture's
        yield counted


@pytest.fixture
def clock(sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock(sleeps, 1_000_000.0)
    monkeypatch.setattr(_timer, 'clock', moved)
    return moved


async def test_tm4_a_wait_longer_than_the_setting_ends_the_attempt_waiting_until_its_wake_up_time(
    sleeps: Sleeps, clock: Clock, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), DiskJournal(tmp_path / 'journal')
    agent = batch_agent(journal, batches, interval=HOUR, suspend_waits_over=600)
    with pytest.raises(ExecutionWaiting, match='waits until') as raised:
        async with execution('report', journal=journal) as handle:
            await agent.run('summarise the report')
    assert raised.value.wakes_at == clock() + HOUR and raised.value.name == 'durable_sleep'
    assert raised.value.wait == 'durable_sleep@0:1'  # the wait after the submission, at position 1 of run 0
    assert handle.waiting_on == ('durable_sleep',)
    # nothing held: no sleep, no lease (a lease would list it `running`), the provider's job left running
    assert sleeps.seconds == []
    (info,) = await journal.list_executions()
    assert (info.state, info.wakes_at, info.pending) == ('waiting', clock() + HOUR, ())
    assert (batches.count('submitted'), batches.count('checks'), batches.count('cancels')) == (1, 0, 0)

    batches.set_all('ready')
    clock.move(HOUR / 2)  # half-way: a rerun ends at the same wait again, checking nothing
    with pytest.raises(ExecutionWaiting) as again:
        async with execution('report', journal=journal):
            await agent.run('summarise the report')
    assert again.value.wakes_at == raised.value.wakes_at
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 0, [])

    clock.move(HOUR)  # past the wake-up time: the next attempt checks at once and finishes
    async with execution('report', journal=journal) as handle:
        result = await agent.run('summarise the report')
    assert result.output == ANSWER and handle.waiting_on == ()
    assert (batches.count('submitted'), batches.count('checks'), batches.count('cancels'), sleeps.seconds) == (
        1,
        1,
        0,
        [],
    )
    (info,) = await journal.list_executions()
    assert (info.state, info.wakes_at) == ('finished', None)

    async with execution('report', journal=journal) as handle:  # the replay of the finished execution
        assert (await agent.run('summarise the report')).output == ANSWER
    assert {step.outcome for step in handle.stats.steps} == {'replayed'}
    assert (batches.count('submitted'), batches.count('checks'), sleeps.seconds) == (1, 1, [])
    await journal.close()


async def test_tm4_what_is_left_within_the_setting_is_slept_in_the_process(
    sleeps: Sleeps, clock: Clock, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=HOUR, suspend_waits_over=600)
    with pytest.raises(ExecutionWaiting):
        async with execution('report', journal=journal):
            await agent.run('summarise the report')
    batches.set_all('ready')
    clock.move(HOUR - 300)  # five minutes left: the attempt holds them
    async with execution('report', journal=journal):
        assert (await agent.run('summarise the report')).output == ANSWER
    assert sleeps.seconds == [300.0]
    assert (batches.count('submitted'), batches.count('checks')) == (1, 1)
    (info,) = await journal.list_executions()
    assert (info.state, info.wakes_at) == ('finished', None)


async def test_tm4_without_the_setting_every_wait_holds_the_process(
    sleeps: Sleeps, clock: Clock, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=HOUR, ready_after=1)
    async with execution('report', journal=journal):
        assert (await agent.run('summarise the report')).output == ANSWER
    assert sleeps.seconds == [HOUR]


@pytest.mark.parametrize('value', [0, -5, float('inf'), float('nan'), True, '60', 1e12])
def test_tm4_a_setting_that_is_no_length_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r'suspend_waits_over=\.\.\.\) must be|suspend_waits_over=\.\.\.\) is'):
        Durable(MemoryJournal(), suspend_waits_over=value)  # type: ignore[arg-type]


async def test_tm4_the_sweep_sends_the_execution_on_only_once_its_wait_is_over(
    sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=HOUR, suspend_waits_over=600)
    started = {'at': time.time()}
    monkeypatch.setattr(_timer, 'clock', lambda: started['at'])  # the timer's clock stands still at the start
    for key in ('early', 'late'):
        if key == 'late':
            started['at'] -= 2 * HOUR  # recorded as if two hours ago: its wait ended an hour ago
        with pytest.raises(ExecutionWaiting):
            async with execution(key, journal=journal):
                await agent.run('summarise the report')
    sent: list[str] = []
    assert await sweep_interrupted(journal, lambda info: sent.append(info.key), idle=0.001) == ['late']
    assert sent == ['late']
    # once dispatched, the same attempt is not sent again within `idle`; the early one still waits
    assert await sweep_interrupted(journal, lambda info: sent.append(info.key), idle=HOUR) == []
    states = {info.key: (info.state, info.wakes_at is not None) for info in await journal.list_executions()}
    assert states == {'early': ('waiting', True), 'late': ('waiting', True)}


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
def test_tm4_tm2_across_processes_a_long_wait_ends_the_attempt_and_a_sigkill_inside_the_rest_loses_nothing(
    tmp_path: Path,
) -> None:
    batches = BatchFile(tmp_path / 'batches.json')
    # a 60 s wait, more than the 40 s a process may hold: the attempt ends
    first = run_child(tmp_path, later=0, suspend_over=40)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.startswith('waiting until ')
    assert (slept(tmp_path), batches.count('submitted'), batches.count('checks')) == ([], 1, 0)

    batches.set_all('ready')
    # 30 s later: it holds the rest, and is killed inside it
    killed = run_child(tmp_path, later=30, kill_at=1, suspend_over=40)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    (rest,) = slept(tmp_path)
    assert 25.0 < rest <= 30.0
    assert (batches.count('submitted'), batches.count('checks')) == (1, 0)

    recovered = run_child(tmp_path, later=120, suspend_over=40)
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert recovered.stdout.strip() == ANSWER
    assert (slept(tmp_path), batches.count('submitted'), batches.count('checks')) == ([], 1, 1)

    replay = run_child(tmp_path, later=HOUR, suspend_over=40)
    assert replay.stdout.strip() == ANSWER, replay.stderr[-3000:]
    assert (slept(tmp_path), batches.count('submitted'), batches.count('checks'), batches.count('cancels')) == (
        [],
        1,
        1,
        0,
    )


@pytest.mark.once
async def test_tm4_tm7_the_console_says_what_a_waiting_execution_waits_on_never_that_its_calls_are_decided(
    sleeps: Sleeps, clock: Clock, tmp_path: Path
) -> None:
    import asyncio

    from pydantic_ai import Agent
    from pydantic_ai.output import PendingModelResponse
    from starlette.testclient import TestClient
    from timer_batch import FileBatchModel

    from pydantic_ai_durable._console import ConsoleSettings, build_app

    batches, journal = BatchFile(tmp_path / 'batches.json'), DiskJournal(tmp_path / 'journal')
    with pytest.raises(ExecutionWaiting):
        async with execution('timer', journal=journal):
            await batch_agent(journal, batches, interval=HOUR, suspend_waits_over=600).run('summarise the report')
    pending: Agent[None, str | PendingModelResponse] = Agent(
        FileBatchModel(batches, interval=30.0),
        name='pending',
        output_type=[str, PendingModelResponse],  # type: ignore[arg-type]
        capabilities=[Durable(journal)],
    )
    async with execution('provider', journal=journal):
        await pending.run('summarise the report')
    await journal.close()

    def read() -> tuple[str, dict[str, object]]:
        with TestClient(build_app(DiskJournal(tmp_path / 'journal'), ConsoleSettings()), base_url=LOCAL) as client:
            return client.get('/waiting').text, client.get('/api/waiting').json()

    page, listed = await asyncio.to_thread(read)
    shown = subprocess.run(
        [sys.executable, '-m', 'pydantic_ai_durable', '--journal', str(tmp_path / 'journal'), 'show', 'provider'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "provider   waits on the provider's job batch-2" in shown.stdout, shown.stdout
    assert 'Every call it waited on is decided' not in page
    assert 'It waits until' in page and "waits on the provider's job <code>batch-2</code>" in page, page
    rows = {row['key']: row for row in listed['executions']}  # type: ignore[attr-defined]
    assert rows['timer']['wakes_at_epoch'] == clock() + HOUR and rows['timer']['provider_jobs'] == []
    assert rows['provider']['wakes_at_epoch'] is None and rows['provider']['provider_jobs'] == ['batch-2']
