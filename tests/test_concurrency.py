"""Many executions at once on one journal object (CC-rules): nothing acknowledged is lost, nothing grows with N.

Every test counts (entries stored, side effects, threads, connections), never times, so it holds on
a loaded machine; how fast concurrent executions run is `benchmarks/concurrency.py`'s job.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pg import fresh_schema
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    ExecutionBusy,
    Journal,
    JournalUnavailable,
    LeaseLost,
    PostgresJournal,
    execution,
)
from pydantic_ai_durable._core import STEP_OBSERVER, SimulatedCrash, Step, StepPoint

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

STEPS = 3


async def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = sum(isinstance(part, ToolReturnPart) for message in messages for part in message.parts)
    if done < STEPS:
        return ModelResponse(parts=[ToolCallPart('work', {'n': done + 1}, tool_call_id=f'w{done + 1}')])
    return ModelResponse(parts=[TextPart('done')])


class Workload:
    """N executions of one agent on one journal object; each tool call is a counted side effect."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.effects: Counter[tuple[str, int]] = Counter()
        self.gate: Callable[[], Any] | None = None
        self.agent = Agent(
            FunctionModel(_model, model_name='many'),
            name='many',
            toolsets=[FunctionToolset([self.work], id='w')],
            capabilities=[Durable()],
        )

    async def work(self, n: int) -> str:
        key = _KEY.get()
        self.effects[(key, n)] += 1
        if self.gate is not None:
            await self.gate()
        else:
            await asyncio.sleep(0.005)
        return f'{key}-{n}'

    async def one(self, key: str, **options: Any) -> str:
        token = _KEY.set(key)
        try:
            async with execution(key, journal=self.journal, **options):
                result = await self.agent.run('go')
            return result.output
        finally:
            _KEY.reset(token)


from contextvars import ContextVar  # noqa: E402

_KEY: ContextVar[str] = ContextVar('key')


# -- CC-1: concurrent opens and writes on one journal object ---------------------------------------


async def test_cc1_fifty_concurrent_opens_on_one_journal_all_succeed(new_journal: Callable[[], Journal]) -> None:
    journal = new_journal()
    keys = [f'open-{n}' for n in range(50)]

    async def enter(key: str) -> int:
        async with execution(key, journal=journal, cleanup='keep') as handle:
            await asyncio.sleep(0.01)
            return handle.attempt

    assert await asyncio.gather(*(enter(key) for key in keys)) == [1] * 50


class _AcknowledgeOrCrash:
    """A step observer per execution: notes every acknowledged step, and crashes at one chosen boundary."""

    def __init__(self, acknowledged: set[tuple[str, str, int]], crash: tuple[int, StepPoint] | None) -> None:
        self.acknowledged = acknowledged
        self.crash = crash
        self.seen = 0

    def __call__(self, step: Step, point: StepPoint) -> None:
        if point == 'after_record':
            self.acknowledged.add((step.run.attempt.key, step.run.key, step.position))
        if point == 'before_body':
            self.seen += 1
        if self.crash is not None and self.seen == self.crash[0] and point == self.crash[1]:
            self.crash = None
            raise SimulatedCrash(f'crash {point} step {step.position}')


async def test_cc1_fifty_concurrent_executions_killed_at_random_lose_no_acknowledged_entry(
    new_journal: Callable[[], Journal],
) -> None:
    """Every entry a write acknowledged is in the store and replays; no acknowledged side effect repeats."""
    journal = new_journal()
    work = Workload(journal)
    chance = random.Random(23)
    acknowledged: set[tuple[str, str, int]] = set()
    crashed_after_body: Counter[str] = Counter()
    keys = [f'exec-{n}' for n in range(50)]

    async def attempt(key: str) -> str | None:
        crash: tuple[int, StepPoint] | None = None
        if chance.random() < 0.7:  # 7 live steps per execution: 4 model requests, 3 tool calls
            crash = (chance.randint(1, 7), chance.choice(['before_body', 'after_body', 'after_record']))
            if crash[1] == 'after_body':
                crashed_after_body[key] += 1
        token = STEP_OBSERVER.set(_AcknowledgeOrCrash(acknowledged, crash))
        try:
            return await work.one(key, cleanup='keep')
        except SimulatedCrash:
            return None
        finally:
            STEP_OBSERVER.reset(token)

    first = await asyncio.gather(*(attempt(key) for key in keys))
    assert any(output is None for output in first) and any(output == 'done' for output in first)

    reader = new_journal()
    stored: set[tuple[str, str, int]] = set()
    for key in keys:
        snapshot = await reader.read_run(key, '0')
        stored |= {(key, '0', position) for position in snapshot.entries}
    assert acknowledged - stored == set(), 'acknowledged entries are missing from the store'

    assert await asyncio.gather(*(work.one(key, cleanup='keep') for key in keys)) == ['done'] * 50
    for key in keys:
        for n in range(1, STEPS + 1):
            runs = work.effects[(key, n)]
            assert 1 <= runs <= 1 + crashed_after_body[key], (key, n, runs)


# -- CC-2: what a process holds does not grow with the number of executions ------------------------


def _package_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name.startswith('pydantic-ai-durable'))


async def _peak_while_all_inside(new_journal: Callable[[], Journal], n: int, sample: Callable[[], int]) -> int:
    """Run `n` executions until every one is inside its first tool call, and sample there."""
    work = Workload(new_journal())
    arrived = 0
    everyone = asyncio.Event()
    peak = 0

    async def gate() -> None:
        nonlocal arrived, peak
        arrived += 1
        if arrived == n:
            peak = sample()
            everyone.set()
        await everyone.wait()

    work.gate = gate
    outputs = await asyncio.gather(*(work.one(f'grow-{n}-{i}') for i in range(n)))
    assert outputs == ['done'] * n
    return peak


async def test_cc2_threads_do_not_grow_with_the_number_of_executions(new_journal: Callable[[], Journal]) -> None:
    ten = await _peak_while_all_inside(new_journal, 10, threading.active_count)
    hundred = await _peak_while_all_inside(new_journal, 100, threading.active_count)
    assert hundred <= ten, (ten, hundred)
    assert await _peak_while_all_inside(new_journal, 10, _package_threads) <= 1


def _connections(dsn: str, application: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            'SELECT count(*) FROM pg_stat_activity WHERE application_name = %s', (application,)
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_cc2_postgres_connections_do_not_grow_with_the_number_of_executions() -> None:
    dsn, schema = fresh_schema()
    application = f'cc2-{schema}'
    journals: list[PostgresJournal] = []

    def make() -> Journal:
        journals.append(PostgresJournal(f'{dsn} application_name={application}', schema=schema))
        return journals[-1]

    try:
        ten = await _peak_while_all_inside(make, 10, lambda: _connections(dsn, application))
        for journal in journals:
            await journal.close()
        hundred = await _peak_while_all_inside(make, 100, lambda: _connections(dsn, application))
    finally:
        for journal in journals:
            await journal.close()
    assert 1 <= ten <= 10 and 1 <= hundred <= 10, (ten, hundred)


def test_cc2_sync_executions_leave_no_connection_open() -> None:
    dsn, schema = fresh_schema()
    application = f'cc2s-{schema}'
    journal = PostgresJournal(f'{dsn} application_name={application}', schema=schema)
    agent = Workload(journal).agent
    for n in range(5):
        token = _KEY.set(f'sync-{n}')
        try:
            with execution(f'sync-{n}', journal=journal):
                assert agent.run_sync('go').output == 'done'
        finally:
            _KEY.reset(token)
    asyncio.run(journal.close())
    deadline = time.monotonic() + 5  # the server forgets a session a moment after it closed
    while _connections(dsn, application) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _connections(dsn, application) == 0


# -- CC-3: the end of a successful execution never loses its lease to its own cleanup -------------


def _slow_cleanup(journal: Journal) -> None:
    """Make the answer of the execution's deletion arrive 0.6 s late, as over a slow network."""
    real = journal.delete_execution

    async def delete_execution(key: str, *, epoch: int) -> None:
        await real(key, epoch=epoch)
        await asyncio.sleep(0.6)

    journal.delete_execution = delete_execution  # type: ignore[method-assign]


async def test_cc3_a_renewal_racing_the_end_of_a_successful_execution_never_raises(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    _slow_cleanup(journal)
    work = Workload(journal)
    for n in range(3):  # renewals every 0.3 s: one lands while the deletion's answer is on its way
        assert await work.one(f'race-{n}', cleanup='execution', lease_ttl=0.9) == 'done'


# -- CC-4: a holder is dead only when its lease expired or the store proves it ---------------------


async def test_cc4_postgres_holder_whose_session_ends_keeps_its_execution_until_its_lease_expires() -> None:
    import psycopg

    dsn, schema = fresh_schema()
    application = f'cc4-{schema}'
    first = PostgresJournal(f'{dsn} application_name={application}', schema=schema)
    second = PostgresJournal(dsn, schema=schema)
    work = Workload(first)
    inside = asyncio.Event()
    go_on = asyncio.Event()

    async def gate() -> None:
        inside.set()
        await go_on.wait()

    work.gate = gate
    running = asyncio.ensure_future(work.one('held', lease_ttl=3.0))
    try:
        await asyncio.wait_for(inside.wait(), 30)
        with psycopg.connect(dsn, autocommit=True) as conn:  # the server ends the holder's sessions
            conn.execute(
                'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s', (application,)
            )
        await asyncio.sleep(0.3)
        with pytest.raises(ExecutionBusy):
            async with execution('held', journal=second):
                pass
        go_on.set()
        assert await running == 'done'  # it reconnects and finishes: nobody took its execution
    finally:
        go_on.set()
        await asyncio.gather(running, return_exceptions=True)
        await first.close()
        await second.close()


# -- CC-5: a failing store says so, never that someone else holds the execution ----------------------


async def test_cc5_renewals_failing_with_the_store_raise_journal_unavailable_not_lease_lost(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / 'j')

    async def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, 'No space left on device')

    for name in ('renew_lease', 'renew_leases'):
        if hasattr(journal, name):
            setattr(journal, name, full)
    work = Workload(journal)

    async def slow() -> None:
        await asyncio.sleep(1.2)  # longer than the lease: every renewal meanwhile failed

    work.gate = slow
    with pytest.raises(JournalUnavailable, match='No space left on device') as raised:
        await work.one('full', lease_ttl=0.6)
    assert not isinstance(raised.value, LeaseLost)
    assert 'goes on with the execution' not in str(raised.value)


# -- CC-5: limits give one clear error each, or a wait, never noise ----------------------------------


async def test_cc5_a_pool_smaller_than_the_number_of_executions_makes_them_wait_not_fail() -> None:
    dsn, schema = fresh_schema()
    application = f'cc5-{schema}'
    journal = PostgresJournal(f'{dsn} application_name={application}', schema=schema, max_size=2)
    try:
        peak = await _peak_while_all_inside(lambda: journal, 30, lambda: _connections(dsn, application))
    finally:
        await journal.close()
    assert 1 <= peak <= 2


async def test_cc5_no_free_connection_in_time_names_the_bound_and_how_to_raise_it() -> None:
    import psycopg

    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema, max_size=1, pool_timeout=0.5)
    lease = await journal.acquire_lease('busy', 'tests', 60)
    blocker = await psycopg.AsyncConnection.connect(dsn)
    try:
        async with blocker.transaction():  # holds the execution's row: the journal's one connection waits on it
            await blocker.execute(f'SELECT 1 FROM "{schema}".executions WHERE key = %s FOR UPDATE', (b'busy',))
            waiting = asyncio.ensure_future(journal.write_execution('busy', {'v': 1}, epoch=lease.epoch))
            await asyncio.sleep(0.2)
            with pytest.raises(JournalUnavailable) as starved:
                await journal.read_execution('busy')
        assert await waiting is True
    finally:
        await blocker.close()
        await journal.close()
    message = str(starved.value)
    assert 'all 1 connections of its pool were busy' in message
    assert 'max_size=' in message and 'pool_timeout=' in message


CHILD_AT_THE_FD_LIMIT = """
import asyncio, json, resource, sys, tempfile
sys.path.insert(0, sys.argv[1])
from test_concurrency import Workload, _KEY
from pydantic_ai_durable import DiskJournal, JournalUnavailable

resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

async def main():
    root = tempfile.mkdtemp()
    work = Workload(DiskJournal(root + '/open'))
    outputs = await asyncio.gather(*(work.one(f'k{n}') for n in range(300)), return_exceptions=True)
    ok = sum(output == 'done' for output in outputs)
    hoard = []  # every descriptor the process may still open, taken
    try:
        while True:
            hoard.append(open('/dev/null'))
    except OSError:
        pass
    starved = Workload(DiskJournal(root + '/new'))
    refused = await asyncio.gather(*(starved.one(f'k{n}') for n in range(20)), return_exceptions=True)
    for file in hoard:
        file.close()
    print(json.dumps({
        'ok': ok,
        'refused': [type(error).__name__ for error in refused],
        'message': str(refused[0]),
    }))

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='RLIMIT_NOFILE and /dev/null')
def test_cc5_running_out_of_descriptors_is_one_clear_error_per_execution_and_nothing_on_stderr(
    tmp_path: Path,
) -> None:
    script = tmp_path / 'child.py'
    script.write_text(CHILD_AT_THE_FD_LIMIT)
    done = subprocess.run(
        [sys.executable, str(script), str(Path(__file__).parent)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result['ok'] == 300  # 300 executions at a limit of 128 descriptors: none needs one of its own
    assert result['refused'] == ['JournalUnavailable'] * 20
    assert 'Too many open files' in result['message']
    assert done.stderr == ''


async def test_cc1_a_pool_of_the_users_own_serves_the_journal_and_stays_open() -> None:
    from psycopg_pool import AsyncConnectionPool

    dsn, schema = fresh_schema()
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=3, open=False)
    await pool.open()  # without autocommit, as a user's pool often is: each statement still commits
    try:
        journal = PostgresJournal(pool=pool, schema=schema)
        work = Workload(journal)
        assert await asyncio.gather(*(work.one(f'own-{n}', cleanup='keep') for n in range(20))) == ['done'] * 20
        await journal.close()
        assert not pool.closed
        reader = PostgresJournal(dsn, schema=schema)  # what the user's pool wrote is committed
        try:
            assert len((await reader.read_run('own-7', '0')).entries) == 7
        finally:
            await reader.close()
    finally:
        await pool.close()


def test_cc1_postgres_journal_needs_a_dsn_or_a_pool() -> None:
    with pytest.raises(TypeError, match='either a dsn or an open pool'):
        PostgresJournal()
    with pytest.raises(ValueError, match='max_size'):
        PostgresJournal('dbname=x', max_size=0)
