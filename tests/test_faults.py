"""Journal faults never silently break the exactly-once promise (JF-1..JF-6).

Real faults: a PostgreSQL server crashed with `pg_ctl stop -m immediate` and started again, a table
locked past `statement_timeout`, a database file with corrupted pages, truncated to zero bytes or
created anew over an existing journal, results too deep to encode. Each test checks the error the
user sees, that no acknowledged step runs twice, and that a retry once the fault is cleared replays
every recorded step. (A file system filling up mid-run is in `test_reliability.py`.)
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import Warehouse, tool_returns
from pg import crashable_server, fresh_schema
from psycopg import sql
from psycopg.conninfo import make_conninfo
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    Execution,
    JournalError,
    JournalUnavailable,
    MemoryJournal,
    PostgresJournal,
    execution,
)

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

STEPS = 5
EXPECTED = ' '.join(f'result-{n}' for n in range(1, STEPS + 1))


class Tools:
    """Counts each tool call by its number; `during` runs inside a chosen call (the fault goes there)."""

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()
        self.during: dict[int, Callable[[], None]] = {}

    def agent(self, *, payload: int = 0) -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            returns = tool_returns(messages)
            if len(returns) < STEPS:
                n = len(returns) + 1
                return ModelResponse(parts=[ToolCallPart('step', {'n': n}, tool_call_id=f'call-{n}')])
            return ModelResponse(parts=[TextPart(' '.join(str(part.content).split('|')[0] for part in returns))])

        def step(n: int) -> str:
            self.calls[n] += 1
            fault = self.during.pop(n, None)
            if fault is not None:
                fault()
            return f'result-{n}' + ('|' + 'x' * payload if payload else '')

        return Agent(
            FunctionModel(model, model_name='faults'),
            name='faults',
            toolsets=[FunctionToolset([step], id='steps')],
            capabilities=[Durable()],
        )


def replayed(handle: Execution) -> int:
    return sum(1 for step in handle.stats.steps if step.outcome == 'replayed')


async def assert_resumes(journal: Any, tools: Tools, key: str, *, recorded: int) -> None:
    """A retry once the fault is cleared: every recorded step replays, the output is the uninterrupted one.

    `recorded` steps (positions 0 to recorded - 1) were acknowledged: none of their tools may run again.
    """
    before = Counter(tools.calls)
    async with execution(key, journal=journal, cleanup='keep') as handle:
        result = await tools.agent().run('go')
    assert result.output == EXPECTED
    assert replayed(handle) == recorded
    acknowledged = [n for n in range(1, STEPS + 1) if 2 * n - 1 < recorded]
    assert [tools.calls[n] for n in acknowledged] == [before[n] for n in acknowledged]


def crash() -> None:
    raise RuntimeError('the attempt crashed in step 5')


# -- JF-2: a PostgreSQL server that crashes mid-run ------------------------------------------------


@pytest.fixture
def crashable() -> Iterator[Any]:
    with crashable_server() as server:
        yield server


def crash_for(server: Any, seconds: float) -> Callable[[], None]:
    """Crash the server now and start it again `seconds` later (in the background)."""

    def fault() -> None:
        server.crash()
        restart = threading.Timer(seconds, server.resume)
        restart.daemon = True
        restart.start()

    return fault


async def test_jf2_postgres_restarted_mid_run_retries_writes_and_records_every_step(crashable: Any) -> None:
    journal = PostgresJournal(crashable.dsn, schema='faults')
    tools = Tools()
    tools.during[3] = crash_for(crashable, 2.0)  # inside step 5 (tool 3): down for 2 s
    async with execution('restart', journal=journal, cleanup='keep', lease_ttl=30) as handle:  # retries for 10 s
        result = await tools.agent().run('go')
    assert result.output == EXPECTED
    assert handle.stats.not_recorded == []
    assert sum(handle.stats.recorded.values()) == 2 * STEPS + 1  # nothing lost to the outage
    await assert_resumes(journal, tools, 'restart', recorded=2 * STEPS + 1)
    assert set(tools.calls.values()) == {1}  # every tool ran exactly once over both attempts
    await journal.close()


async def test_jf2_postgres_down_longer_than_the_retries_stops_the_attempt_before_the_next_step(
    crashable: Any,
) -> None:
    journal = PostgresJournal(crashable.dsn, schema='faults')
    tools = Tools()
    tools.during[3] = crash_for(crashable, 3.0)
    with pytest.raises(JournalUnavailable) as stopped:
        async with execution('outage', journal=journal, cleanup='keep', write_timeout=0.5):
            await tools.agent().run('go')
    assert 'step 5' in str(stopped.value) and 'nothing ran unrecorded' in str(stopped.value)
    assert dict(tools.calls) == {1: 1, 2: 1, 3: 1}  # no side effect after the unrecorded step
    deadline = time.monotonic() + 30
    while not crashable.started:  # the fault is cleared once the server is back
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    await assert_resumes(journal, tools, 'outage', recorded=5)  # positions 0-4 were acknowledged
    await journal.close()


# -- JF-1: a read that fails is an error, never an empty journal -----------------------------------


async def test_jf1_postgres_entries_locked_past_statement_timeout_stop_before_any_step() -> None:
    dsn, schema = fresh_schema()
    journal = PostgresJournal(make_conninfo(dsn, options='-c statement_timeout=300'), schema=schema)
    tools = Tools()
    tools.during[3] = crash
    with pytest.raises(RuntimeError):
        async with execution('locked', journal=journal, cleanup='keep'):
            await tools.agent().run('go')
    recorded = dict(tools.calls)

    with psycopg.connect(dsn) as blocker:  # holds the lock until the block ends
        blocker.execute(sql.SQL('LOCK TABLE {}.entries IN ACCESS EXCLUSIVE MODE').format(sql.Identifier(schema)))
        with pytest.raises(JournalUnavailable) as unavailable:
            async with execution('locked', journal=journal, cleanup='keep', write_timeout=0.5):
                await tools.agent().run('go')
        blocker.rollback()
    assert 'statement timeout' in str(unavailable.value) or 'canceling statement' in str(unavailable.value)
    assert 'never taken for an empty one' in str(unavailable.value)
    assert dict(tools.calls) == recorded  # not one recorded side effect ran again
    await assert_resumes(journal, tools, 'locked', recorded=5)
    await journal.close()


async def record_then_break(path: Path, tools: Tools, key: str, *, payload: int = 0) -> Path:
    """Record a run that crashed in step 5 (positions 0-4 acknowledged), close it, and keep a copy of the files."""
    tools.during[3] = crash
    journal = DiskJournal(path)
    with pytest.raises(RuntimeError):
        async with execution(key, journal=journal, cleanup='keep'):
            await tools.agent(payload=payload).run('go')
    await journal.close()  # the last connection checkpoints the WAL into cache.db
    backup = path.with_name('backup')
    shutil.copytree(path, backup)
    return backup


def restore(path: Path, backup: Path) -> None:
    shutil.rmtree(path)
    shutil.copytree(backup, path)


async def test_jf1_disk_corrupted_pages_stop_before_any_step(tmp_path: Path) -> None:
    path = tmp_path / 'journal'
    tools = Tools()
    backup = await record_then_break(path, tools, 'corrupt', payload=20_000)  # results span overflow pages
    database = path / 'cache.db'
    data = bytearray(database.read_bytes())
    page = 4096
    for start in range(len(data) - 6 * page, len(data), page):  # the last pages: the latest results
        data[start : start + page] = b'\xa5' * page
    database.write_bytes(bytes(data))
    calls = dict(tools.calls)

    with pytest.raises(JournalUnavailable) as unavailable:
        async with execution('corrupt', journal=DiskJournal(path), cleanup='keep', write_timeout=0.2):
            await tools.agent().run('go')
    # SQLite names the damage by where it lands: the b-tree (malformed), the header, or a value's text
    assert any(sign in str(unavailable.value) for sign in ('malformed', 'not a database', 'Could not decode')), str(
        unavailable.value
    )
    assert dict(tools.calls) == calls

    restore(path, backup)
    await assert_resumes(DiskJournal(path), tools, 'corrupt', recorded=5)


# -- JF-4: a store that lost its data is noticed ---------------------------------------------------


@pytest.mark.parametrize('loss', ['truncated', 'created-anew', 'another-journal'])
async def test_jf4_a_disk_journal_whose_database_was_lost_is_refused(tmp_path: Path, loss: str) -> None:
    path = tmp_path / 'journal'
    tools = Tools()
    backup = await record_then_break(path, tools, 'lost')
    for name in ('cache.db', 'cache.db-wal', 'cache.db-shm'):
        (path / name).unlink(missing_ok=True)
    if loss == 'truncated':
        (path / 'cache.db').write_bytes(b'')  # a bad restore
    elif loss == 'another-journal':
        other = tmp_path / 'other'
        await DiskJournal(other).open()
        await DiskJournal(other).close()
        shutil.copy(other / 'cache.db', path / 'cache.db')
    calls = dict(tools.calls)

    with pytest.raises(JournalUnavailable) as unavailable:
        async with execution('lost', journal=DiskJournal(path)):
            await tools.agent().run('go')
    assert str(path) in str(unavailable.value)
    assert 'restore' in str(unavailable.value)
    assert dict(tools.calls) == calls  # nothing ran again over an empty journal

    restore(path, backup)
    await assert_resumes(DiskJournal(path), tools, 'lost', recorded=5)


async def test_jf4_an_empty_database_beside_leftover_value_files_is_refused(tmp_path: Path) -> None:
    path = tmp_path / 'journal'
    (path / 'ab' / 'cd').mkdir(parents=True)
    (path / 'ab' / 'cd' / '0123456789abcdef0123456789ab.val').write_bytes(b'a value diskcache wrote')
    with pytest.raises(JournalUnavailable, match='value files'):
        await DiskJournal(path).open()


async def test_jf4_an_interrupted_creation_is_a_new_journal(tmp_path: Path) -> None:
    path = tmp_path / 'journal'
    path.mkdir()
    (path / 'cache.db').write_bytes(b'')  # created, never initialised, no journal id beside it
    tools = Tools()
    async with execution('fresh', journal=DiskJournal(path)):
        assert (await tools.agent().run('go')).output == EXPECTED


# -- JF-6: results nested too deeply say so ----------------------------------------------------------


@pytest.mark.parametrize('toolset_kind', ['function', 'leaf'])
async def test_jf6_a_result_nested_too_deeply_says_so(toolset_kind: str) -> None:
    def deep() -> Any:
        value: list[Any] = []
        for _ in range(300):
            value = [value]
        return value

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not tool_returns(messages):
            return ModelResponse(parts=[ToolCallPart('deep', {}, tool_call_id='d')])
        return ModelResponse(parts=[TextPart('never')])

    toolset: Any = FunctionToolset([deep], id='deep') if toolset_kind == 'function' else Warehouse({'deep': deep})
    agent = Agent(FunctionModel(model, model_name='deep'), name='deep', toolsets=[toolset], capabilities=[Durable()])
    with pytest.raises(JournalError) as raised:
        async with execution('deep', journal=MemoryJournal()):
            await agent.run('go')
    message = str(raised.value)
    assert 'nested more than 254 levels deep' in message and 'deep' in message
    assert 'Circular reference' not in message


def test_jf6_the_shape_of_the_value_decides_between_too_deep_and_circular() -> None:
    from pydantic_ai_durable._steps._payloads import why_not_journalable

    deep: list[Any] = []
    for _ in range(300):
        deep = [deep]
    circular: dict[str, Any] = {'a': [1]}
    circular['a'].append(circular)
    misleading = ValueError('Circular reference detected (id repeated)')  # what pydantic says of both
    assert 'nested more than 254 levels deep' in why_not_journalable(misleading, deep)
    assert 'contains itself' in why_not_journalable(misleading, circular)
    assert 'nested more than' in why_not_journalable(ValueError('Maximum serialization depth exceeded'))
