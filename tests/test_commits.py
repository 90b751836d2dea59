"""Commits per step, counted where they happen: SQLite's own COMMITs and PostgreSQL's transaction ids (CS-1).

A journaled round trip (a model request that calls a tool, then the tool) costs three fenced commits: the
request counted before it is sent (U2-1), the response's entry with its tokens (UW-1), and the tool's
entry. A replayed round trip costs none. Each count is the difference between an agent of six round trips
and one of two, so the commits every execution pays once (lease, execution record, finish) cancel out; a
change that adds a commit back to the hot path fails here, on a loaded machine too, since nothing is timed.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pg import fresh_schema
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import DiskJournal, Durable, LeaseLost, PostgresJournal, execution
from pydantic_ai_durable.journals import Journal

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

ROUND_TRIP_COMMITS = 3
"""The request's count, the response's entry with its tokens, the tool's entry."""


def _agent(journal: Journal, round_trips: int, calls: list[int]) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(message, ModelResponse) for message in messages)
        if turn < round_trips:
            return ModelResponse(parts=[ToolCallPart('step', {'n': turn}, tool_call_id=f'c{turn}')])
        return ModelResponse(parts=[TextPart('done')])

    agent = Agent(FunctionModel(model, model_name='counted'), name='counted', capabilities=[Durable(journal=journal)])

    @agent.tool_plain
    def step(n: int) -> int:
        calls.append(n)
        return n * 2

    return agent


async def _commits_of(
    journal: Journal, key: str, round_trips: int, counter: Callable[[], Awaitable[int]]
) -> tuple[int, int]:
    """Commits of a first (live) and a second (replayed) execution of `key` with `round_trips` round trips."""
    counts: list[int] = []
    calls: list[int] = []
    for _ in range(2):
        before = await counter()
        async with execution(key, journal=journal):
            result = await _agent(journal, round_trips, calls).run('go')
        counts.append(await counter() - before)
        assert result.output == 'done'
    assert calls == list(range(round_trips))  # the second execution replayed every tool call
    return counts[0], counts[1]


async def _per_round_trip(journal: Journal, counter: Callable[[], Awaitable[int]]) -> tuple[int, int]:
    """(live, replayed) commits per round trip, from the fewest each execution took over three tries.

    Another writer (a lease renewal, a test before this one winding down) can only add to a count, so the
    minimum of each execution's count over the tries is its own, and only then are they subtracted: a
    stray commit in a short execution would otherwise shrink the difference.
    """
    await _commits_of(journal, 'first', 1, counter)  # the first execution of a journal writes what later ones find
    tries = [
        (
            await _commits_of(journal, f'short-{attempt}', 2, counter),
            await _commits_of(journal, f'long-{attempt}', 6, counter),
        )
        for attempt in range(3)
    ]
    short = [min(short[phase] for short, _ in tries) for phase in (0, 1)]
    long = [min(long[phase] for _, long in tries) for phase in (0, 1)]
    assert all((long[phase] - short[phase]) % 4 == 0 for phase in (0, 1)), tries
    return (long[0] - short[0]) // 4, (long[1] - short[1]) // 4


@pytest.fixture
async def disk_journal(tmp_path: Path) -> AsyncIterator[DiskJournal]:
    """An opened `DiskJournal` in a fresh directory, closed after the test."""
    journal = DiskJournal(tmp_path / 'journal')
    await journal.open()
    try:
        yield journal
    finally:
        await journal.close()


def _count_commits(journal: DiskJournal) -> list[int]:
    """A one-item list counting the COMMITs of the journal's connection from now on."""
    commits = [0]

    def trace(statement: str) -> None:
        commits[0] += statement.strip().upper().startswith(('COMMIT', 'END'))

    connection: sqlite3.Connection = journal._cache._con  # pyright: ignore[reportPrivateUsage]
    connection.set_trace_callback(trace)
    return commits


async def test_cs_1_a_round_trip_commits_three_times_on_disk(disk_journal: DiskJournal) -> None:
    commits = _count_commits(disk_journal)

    async def counter() -> int:
        return commits[0]

    live, replayed = await _per_round_trip(disk_journal, counter)
    assert live == ROUND_TRIP_COMMITS
    assert replayed == 0


async def test_cs_1_a_round_trip_commits_three_times_on_postgres() -> None:
    import psycopg

    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema)
    probe = await psycopg.AsyncConnection.connect(dsn, autocommit=True)

    async def counter() -> int:
        # The next transaction id to be given out: only a transaction that writes takes one.
        cursor = await probe.execute('SELECT pg_snapshot_xmax(pg_current_snapshot())::text')
        row: Any = await cursor.fetchone()
        return int(row[0])

    try:
        live, replayed = await _per_round_trip(journal, counter)
    finally:
        await probe.close()
        await journal.close()
    assert live == ROUND_TRIP_COMMITS
    assert replayed == 0


# -- CC-9: the writes of many executions of one process share commits on disk -------------------------------------


async def test_cc_9_concurrent_executions_share_commits_on_disk(disk_journal: DiskJournal) -> None:
    """Twenty executions in one process, gathered: their step writes take far fewer commits than they hold."""
    journal = disk_journal
    commits = _count_commits(journal)
    calls: list[int] = []

    async def one(index: int, round_trips: int) -> str:
        async with execution(f'many-{round_trips}-{index}', journal=journal):
            return (await _agent(journal, round_trips, calls).run('go')).output

    counted: list[int] = []
    for round_trips in (2, 6):
        before = commits[0]
        outputs = await asyncio.gather(*(one(index, round_trips) for index in range(20)))
        counted.append(commits[0] - before)
        assert outputs == ['done'] * 20
    assert len(calls) == 20 * 8  # every tool ran once per round trip
    per_round_trip = (counted[1] - counted[0]) / (20 * 4)
    assert per_round_trip <= ROUND_TRIP_COMMITS / 2, counted  # alone, each pays three (CS-1)


async def test_cc_9_a_refused_write_fails_alone_and_the_others_in_its_commit_are_stored(
    disk_journal: DiskJournal,
) -> None:
    journal = disk_journal
    leases = {key: await journal.acquire_lease(key, f'holder-{key}', 60) for key in ('a', 'b', 'c')}
    await journal.acquire_lease('b', 'intruder', 60, force=True)  # b's writer no longer holds it
    commits = _count_commits(journal)
    outcomes = await asyncio.gather(
        *(journal.write_entry(key, '0', 0, {'n': key}, epoch=leases[key].epoch) for key in ('a', 'b', 'c')),
        return_exceptions=True,
    )
    assert commits[0] == 1  # one shared transaction
    assert outcomes[0] is True and outcomes[2] is True
    assert isinstance(outcomes[1], LeaseLost)
    for key in ('a', 'c'):
        assert (await journal.read_run(key, '0')).entries == {0: {'n': key}}
    assert (await journal.read_run('b', '0')).entries == {}


async def test_cc_9_a_lone_execution_writes_at_once(disk_journal: DiskJournal) -> None:
    """With one lease held, a write commits before its caller's coroutine first yields: nothing to share with."""
    journal = disk_journal
    lease = await journal.acquire_lease('k', 'holder', 60)
    write = journal.write_entry('k', '0', 0, {'n': 0}, epoch=lease.epoch)
    with pytest.raises(StopIteration) as done:
        write.send(None)  # runs to its end without suspending
    assert done.value.value is True


async def test_cc_9_a_write_whose_caller_was_cancelled_while_it_waited_is_not_made(disk_journal: DiskJournal) -> None:
    journal = disk_journal
    lease = await journal.acquire_lease('k', 'holder', 60)
    await journal.acquire_lease('other', 'holder', 60)  # a second execution: writes wait to share a commit
    kept = asyncio.ensure_future(journal.write_entry('k', '0', 0, {'n': 0}, epoch=lease.epoch))
    dropped = asyncio.ensure_future(journal.write_entry('k', '0', 1, {'n': 1}, epoch=lease.epoch))
    await asyncio.sleep(0)  # both queued, not yet committed
    dropped.cancel()
    assert await kept is True
    with pytest.raises(asyncio.CancelledError):
        await dropped
    assert (await journal.read_run('k', '0')).entries == {0: {'n': 0}}


async def test_cc_9_when_the_shared_transaction_fails_each_write_is_made_on_its_own(
    disk_journal: DiskJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = disk_journal
    shared = journal._commits  # pyright: ignore[reportPrivateUsage]
    opened = shared.cache
    failures = [OSError('the shared transaction could not begin')]

    def cache_failing_once() -> Any:
        if failures:
            raise failures.pop()
        return opened()

    monkeypatch.setattr(shared, 'cache', cache_failing_once)
    leases = {key: await journal.acquire_lease(key, f'holder-{key}', 60) for key in ('a', 'b')}
    outcomes = await asyncio.gather(
        *(journal.write_entry(key, '0', 0, {'n': key}, epoch=leases[key].epoch) for key in ('a', 'b'))
    )
    assert outcomes == [True, True]
    assert not failures  # the shared attempt was made, and failed
    for key in ('a', 'b'):
        assert (await journal.read_run(key, '0')).entries == {0: {'n': key}}
