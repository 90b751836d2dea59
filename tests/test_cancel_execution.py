"""Cancelling an execution for good (TM-10): the provider's job it waits on is cancelled once, and nothing more runs.

Cancelling an attempt keeps the job for the next one (TM-6, `test_timers_cancel.py`); `cancel_execution` ends the
execution itself. The provider is `timer_batch.FileBatchModel`'s file, so submissions, checks and cancellations
are counted across attempts and processes.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from journal_cli import cli
from pydantic_ai import Agent
from pydantic_ai.output import PendingModelResponse
from pydantic_ai.tools import DeferredToolRequests
from timer_batch import BatchFile, FileBatchModel, Sleeps, batch_agent, counted_sleeps, run_child

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    DurableError,
    ExecutionBusy,
    ExecutionCancelled,
    ExecutionWaiting,
    MemoryJournal,
    ResolutionRefused,
    cancel_execution,
    execution,
    fork_execution,
    resolve,
    set_dispatcher,
    sweep_interrupted,
)

HERE = Path(__file__).parent
PROMPT = 'summarise the report'


@pytest.fixture
def sleeps() -> Iterator[Sleeps]:
    with counted_sleeps() as counted:
        yield counted


def counts(batches: BatchFile) -> tuple[int, int, int]:
    return batches.count('submitted'), batches.count('checks'), batches.count('cancels')


async def states(journal: MemoryJournal | DiskJournal) -> dict[str, str]:
    return {info.key: info.state for info in await journal.list_executions()}


async def test_tm10_an_execution_at_a_long_wait_is_cancelled_by_its_next_attempt_with_its_job(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=3600.0, suspend_waits_over=60)
    with pytest.raises(ExecutionWaiting):
        async with execution('report', journal=journal):
            await agent.run(PROMPT)
    assert counts(batches) == (1, 0, 0)  # TM-4 kept the job

    assert await cancel_execution(journal, 'report', 'the report is no longer needed') == 'requested'
    assert await states(journal) == {'report': 'interrupted'}  # it needs an attempt: the sweep sends it
    await asyncio.sleep(0.01)  # the sweep's `idle` since the cancellation's write
    assert await sweep_interrupted(journal, lambda info: None, idle=0.005) == ['report']

    with pytest.raises(ExecutionCancelled, match='the report is no longer needed') as raised:
        async with execution('report', journal=journal):
            await agent.run(PROMPT)
    assert raised.value.reason == 'the report is no longer needed'
    assert counts(batches) == (1, 0, 1)  # the job was cancelled once, never checked, never sent again
    assert await states(journal) == {'report': 'failed'}
    assert sleeps.seconds == []

    with pytest.raises(ExecutionCancelled):  # nothing more of it runs
        async with execution('report', journal=journal):
            await agent.run(PROMPT)
    assert counts(batches) == (1, 0, 1)
    assert await cancel_execution(journal, 'report', 'again') == 'cancelled'  # accepted, changes nothing
    assert await sweep_interrupted(journal, lambda info: None, idle=0.001) == []


async def test_tm10_a_run_waiting_on_a_pending_response_is_cancelled_instead_of_checked(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent: Agent[None, str | PendingModelResponse] = Agent(
        FileBatchModel(batches, interval=30.0),
        name='batched',
        output_type=[str, PendingModelResponse],  # type: ignore[arg-type]
        capabilities=[Durable(journal)],
    )
    async with execution('report', journal=journal):
        assert isinstance((await agent.run(PROMPT)).output, PendingModelResponse)
    assert await states(journal) == {'report': 'waiting'}
    assert await cancel_execution(journal, 'report', 'stop') == 'requested'
    with pytest.raises(ExecutionCancelled):
        async with execution('report', journal=journal):
            await agent.run(PROMPT)
    assert counts(batches) == (1, 0, 1)
    assert await states(journal) == {'report': 'failed'}


async def test_tm10_an_execution_waiting_on_a_decision_holds_no_job_and_is_cancelled_at_once() -> None:
    journal = MemoryJournal()
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        'test', name='approver', output_type=[str, DeferredToolRequests], capabilities=[Durable(journal)]
    )
    ran: list[str] = []

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        ran.append('refund')
        return 'refunded'

    async with execution('order-1', journal=journal):
        assert isinstance((await agent.run('refund it')).output, DeferredToolRequests)
    assert await cancel_execution(journal, 'order-1', 'customer withdrew') == 'cancelled'
    assert await states(journal) == {'order-1': 'failed'}
    (call,) = (await journal.read_execution('order-1') or {})['deferred'].values()
    with pytest.raises(ResolutionRefused):  # nothing waits any more
        await resolve(journal, 'order-1', approvals={call['id']: True})
    with pytest.raises(ExecutionCancelled, match='customer withdrew'):
        async with execution('order-1', journal=journal):
            await agent.run('refund it')
    assert ran == []

    await fork_execution(journal, 'order-1', 'order-1-again', at=1)  # new work: the fork is not cancelled
    async with execution('order-1-again', journal=journal):
        assert isinstance((await agent.run('refund it')).output, DeferredToolRequests)
    assert (await states(journal))['order-1-again'] == 'waiting'


async def test_tm10_what_cannot_be_cancelled_is_refused_saying_why(sleeps: Sleeps, tmp_path: Path) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=1.0, ready_after=1)
    async with execution('done', journal=journal):
        await agent.run(PROMPT)
    with pytest.raises(DurableError, match='finished: there is nothing left to cancel'):
        await cancel_execution(journal, 'done', 'too late')
    with pytest.raises(DurableError, match='does not exist'):
        await cancel_execution(journal, 'nobody', 'why')
    with pytest.raises(ValueError, match='needs a reason'):
        await cancel_execution(journal, 'done', '  ')
    before = set_dispatcher(None)  # a process that loaded no fleet
    try:
        with pytest.raises(DurableError, match='no fleet is loaded'):
            await cancel_execution(journal, 'done', 'send it', dispatch=True)
    finally:
        set_dispatcher(before)

    async with execution('busy', journal=journal):  # an attempt holds it: cancel that attempt's task first
        with pytest.raises(ExecutionBusy):
            await cancel_execution(journal, 'busy', 'now', wait=0.05)
    assert await states(journal) == {'done': 'finished', 'busy': 'finished'}


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
async def test_tm10_an_attempt_killed_inside_a_wait_is_cancelled_by_the_next_process(tmp_path: Path) -> None:
    batches = BatchFile(tmp_path / 'batches.json')
    killed = run_child(tmp_path, later=0, kill_at=2)  # SIGKILLed inside its second wait on the batch
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    assert counts(batches) == (1, 1, 0)

    journal = DiskJournal(tmp_path / 'journal')
    try:
        assert await states(journal) == {'batch-1': 'interrupted'}
        assert await cancel_execution(journal, 'batch-1', 'operator stop') == 'requested'
    finally:
        await journal.close()
    cancelling = run_child(tmp_path, later=30)
    assert cancelling.returncode == 1 and 'ExecutionCancelled' in cancelling.stderr, cancelling.stderr[-3000:]
    assert counts(batches) == (1, 1, 1)
    again = run_child(tmp_path, later=60)
    assert again.returncode == 1 and 'ExecutionCancelled' in again.stderr
    assert counts(batches) == (1, 1, 1)


async def test_tm10_the_cli_cancels_an_execution_and_refuses_what_it_cannot_in_one_line(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), DiskJournal(tmp_path / 'journal')
    agent = batch_agent(journal, batches, interval=3600.0, suspend_waits_over=60)
    try:
        with pytest.raises(ExecutionWaiting):
            async with execution('report', journal=journal):
                await agent.run(PROMPT)
    finally:
        await journal.close()
    waiting = cli(tmp_path / 'journal', 'list')  # TM-4: a long wait is listed as such
    assert 'waiting (timer)' in waiting.stdout, waiting.stdout
    shown = cli(tmp_path / 'journal', 'show', 'report')
    assert 'wakes ' in shown.stdout and '(durable_sleep@0:1): a long wait ended its attempt there' in shown.stdout
    (before,) = json.loads(cli(tmp_path / 'journal', 'list', '--json').stdout)
    assert before['wakes_at_epoch'] > 0 and before['wakes_at'].endswith('Z')
    marked = cli(tmp_path / 'journal', 'cancel', 'report', '--reason', 'budget cut', '--json')
    assert marked.returncode == 0, marked.stderr
    assert json.loads(marked.stdout) == {'key': 'report', 'outcome': 'requested'}
    shown = cli(tmp_path / 'journal', 'show', 'report')
    assert 'cancelled' in shown.stdout and "budget cut; its next attempt cancels the provider's job" in shown.stdout
    as_json = json.loads(cli(tmp_path / 'journal', 'show', 'report', '--json').stdout)
    assert as_json['cancel']['reason'] == 'budget cut' and as_json['cancel']['done'] is None
    assert list(as_json['wakes_at']) == ['0'] and as_json['provider_jobs'] == []
    listed = cli(tmp_path / 'journal', 'list', '--json')
    assert [(info['key'], info['state'], info['wakes_at_epoch']) for info in json.loads(listed.stdout)] == [
        ('report', 'interrupted', None)
    ]
    unknown = cli(tmp_path / 'journal', 'cancel', 'nobody', '--reason', 'x')
    assert unknown.returncode == 1 and unknown.stderr.count('\n') == 1 and 'does not exist' in unknown.stderr
    missing = cli(tmp_path / 'journal', 'cancel', 'report')
    assert missing.returncode == 2 and '--reason' in missing.stderr


async def test_tm10_dispatch_sends_a_marked_execution_on_and_a_failed_send_leaves_the_mark_standing(
    sleeps: Sleeps, tmp_path: Path
) -> None:
    batches, journal = BatchFile(tmp_path / 'batches.json'), MemoryJournal()
    agent = batch_agent(journal, batches, interval=3600.0, suspend_waits_over=60)
    for key in ('sent', 'lost'):
        with pytest.raises(ExecutionWaiting):
            async with execution(key, journal=journal):
                await agent.run(PROMPT)
    sent: list[str] = []

    async def send(journal: object, key: str) -> None:
        if key == 'lost':
            raise ConnectionError('broker down')
        sent.append(key)

    before = set_dispatcher(send)
    try:
        assert await cancel_execution(journal, 'sent', 'stop', dispatch=True) == 'requested'
        with pytest.raises(DurableError, match=r'the cancellation is recorded, but sending it on.*broker down'):
            await cancel_execution(journal, 'lost', 'stop', dispatch=True)
    finally:
        set_dispatcher(before)
    assert sent == ['sent']
    assert await states(journal) == {'sent': 'interrupted', 'lost': 'interrupted'}  # both marked: the sweep sends
