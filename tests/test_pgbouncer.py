"""`PostgresJournal` behind PgBouncer in transaction-pooling mode (CC-8).

PgBouncer hands each transaction to whichever server session is free, so nothing may rely on session state:
a statement prepared on one session is missing, or means another statement, on the next. The tests start a
real PgBouncer (Debian package `pgbouncer`) in front of the session's throwaway server, and count what was
stored against what was acknowledged.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from pg import fresh_schema, pgbouncer_dsn
from psycopg import sql
from test_concurrency import STEPS, Workload

from pydantic_ai_durable import PostgresJournal
from pydantic_ai_durable.journals._common import execution_id

pytestmark = pytest.mark.fleet


class _Acknowledged(PostgresJournal):
    """A PostgresJournal that notes every entry a write acknowledged, with the JSON value it was given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acknowledged: dict[tuple[str, str, int], dict[str, Any]] = {}

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        stored = await super().write_entry(key, run, position, entry, epoch=epoch)
        if stored:
            self.acknowledged[(key, run, position)] = entry
        return stored


def _stored_entries(dsn: str, schema: str) -> dict[tuple[str, str, int], str]:
    """Every entry as the server holds it, read straight from the server (not through the pooler)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL('SELECT eid, run, position, value FROM {}.entries WHERE position IS NOT NULL').format(
                sql.Identifier(schema)
            )
        ).fetchall()
    return {(eid, run, int(position)): value for eid, run, position, value in rows}


async def _all(work: Workload, keys: list[str]) -> list[str | BaseException]:
    return await asyncio.gather(*(work.one(key) for key in keys), return_exceptions=True)


async def test_cc8_two_hundred_executions_through_pgbouncer_succeed_replay_and_store_what_was_acknowledged() -> None:
    direct, schema = fresh_schema()
    journal = _Acknowledged(pgbouncer_dsn(), schema=schema)
    work = Workload(journal)
    keys = [f'bounced-{n}' for n in range(200)]
    try:
        first = await _all(work, keys)
        failures = Counter(type(result).__name__ for result in first if isinstance(result, BaseException))
        assert not failures, f'through PgBouncer: {dict(failures)}'
        assert set(work.effects.values()) == {1} and len(work.effects) == 200 * STEPS

        again = await _all(work, keys)  # every execution is finished: each replays, nothing runs again
        assert again == first
        assert set(work.effects.values()) == {1}
    finally:
        await journal.close()

    stored = _stored_entries(direct, schema)
    from pydantic_ai_durable.journals import _json

    assert len(journal.acknowledged) == 200 * (2 * STEPS + 1)
    for (key, run, position), entry in journal.acknowledged.items():
        assert stored[(execution_id(key), run, position)] == _json.dumps(entry), (key, run, position)


async def test_cc8_a_pool_of_the_users_own_behind_pgbouncer_works_too() -> None:
    """A pool built with psycopg's defaults (statements prepared after five runs) behind PgBouncer."""
    from psycopg_pool import AsyncConnectionPool

    _, schema = fresh_schema()
    pool = AsyncConnectionPool(pgbouncer_dsn(), kwargs={'autocommit': True}, max_size=4, open=False)
    await pool.open()
    journal = PostgresJournal(pool=pool, schema=schema)
    work = Workload(journal)
    try:
        results = await _all(work, [f'own-pool-{n}' for n in range(50)])
        assert [result for result in results if isinstance(result, BaseException)] == []
        async with pool.connection() as conn:
            assert conn.prepare_threshold == 5  # the journal turned it off only while it used the connection
    finally:
        await journal.close()
        await pool.close()


async def test_cc8_a_data_error_that_is_not_the_values_fault_is_raised_for_the_core_to_retry() -> None:
    """22P02 (invalid input syntax) cannot come from a value this journal sends: it is a fault, never `False`."""
    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema)
    try:
        await journal.open()
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            await journal._fenced('k', "SELECT 'not a number'::smallint", {})
        # What the database cannot hold is refused without a round trip: the same value fails every time (J-2).
        assert await journal._fenced('k', 'SELECT 1', {'run': 'nul\x00'}) is False
        assert await journal._fenced('k', 'SELECT 1', {'name': 'lone \ud800'}) is False
    finally:
        await journal.close()


async def test_cc8_a_lone_surrogate_in_a_run_key_is_refused_as_a_value_and_fences_nothing_else() -> None:
    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema)
    try:
        await journal.open()
        lease = await journal.acquire_lease('k', 'host:1:abcd:1', 30.0)
        assert await journal.write_entry('k', 'run \ud800', 0, {'v': 1}, epoch=lease.epoch) is False
        assert await journal.write_entry('k', 'run', 0, {'v': 1}, epoch=lease.epoch) is True
    finally:
        await journal.close()


def test_cc8_the_journal_leaves_no_prepared_statement_on_a_server_session() -> None:
    """Straight to the server too: nothing the journal runs is prepared, so no pooler can mix them up."""
    dsn, schema = fresh_schema()

    async def many_writes() -> None:
        journal = PostgresJournal(dsn, schema=schema, max_size=1)
        work = Workload(journal)
        try:
            await _all(work, [f'prepared-{uuid.uuid4().hex[:6]}-{n}' for n in range(10)])
            prepared = await journal._connections.run(_prepared_statements)
        finally:
            await journal.close()
        assert prepared == 0

    asyncio.run(many_writes())


async def _prepared_statements(conn: Any) -> int:
    row = await (await conn.execute('SELECT count(*) FROM pg_prepared_statements')).fetchone()
    return int(row[0])
