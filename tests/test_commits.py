"""Commits per step, counted where they happen: SQLite's own COMMITs and PostgreSQL's transaction ids (CS-1).

A journaled round trip (a model request that calls a tool, then the tool) costs three fenced commits: the
request counted before it is sent (U2-1), the response's entry with its tokens (UW-1), and the tool's
entry. A replayed round trip costs none. Each count is the difference between an agent of six round trips
and one of two, so the commits every execution pays once (lease, execution record, finish) cancel out; a
change that adds a commit back to the hot path fails here, on a loaded machine too, since nothing is timed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pg import fresh_schema
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import DiskJournal, Durable, PostgresJournal, execution
from pydantic_ai_durable.journals import Journal

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
    """(live, replayed) commits per round trip: the fewest over three tries, since stray writers only add."""
    live: list[int] = []
    replayed: list[int] = []
    await _commits_of(journal, 'first', 1, counter)  # the first execution of a journal writes what later ones find
    for attempt in range(3):
        short = await _commits_of(journal, f'short-{attempt}', 2, counter)
        long = await _commits_of(journal, f'long-{attempt}', 6, counter)
        assert (long[0] - short[0]) % 4 == 0, (short, long)
        live.append((long[0] - short[0]) // 4)
        replayed.append((long[1] - short[1]) // 4)
    return min(live), min(replayed)


async def test_cs_1_a_round_trip_commits_three_times_on_disk(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / 'journal')
    await journal.open()
    commits = 0

    def trace(statement: str) -> None:
        nonlocal commits
        commits += statement.strip().upper().startswith(('COMMIT', 'END'))

    connection: sqlite3.Connection = journal._cache._con  # pyright: ignore[reportPrivateUsage]
    connection.set_trace_callback(trace)

    async def counter() -> int:
        return commits

    try:
        live, replayed = await _per_round_trip(journal, counter)
    finally:
        connection.set_trace_callback(None)
        await journal.close()
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
