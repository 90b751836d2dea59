"""`PostgresJournal` against a real PostgreSQL server that the test session starts itself (B-1..B-8).

The backend contract (the same behaviours `test_backends.py` checks for memory and disk), plus what
only a network store has: schema creation and versioning, connections per event loop and thread,
reconnecting, a refused server, privileges, and atomic leases across connections.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from helpers import Operator, renew
from pg import drop_schema, fresh_schema, in_ci, postgres_dsn, put_raw  # noqa: F401  (postgres_dsn is a fixture)

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo
except ImportError:  # pragma: no cover - the postgres extra is part of the test extra
    if in_ci():
        raise
    pytest.skip("psycopg is not installed: pip install -e '.[postgres]'", allow_module_level=True)

from pydantic_ai_durable import JournalUnavailable, LeaseLost
from pydantic_ai_durable.journals import ExecutionInfo, Journal, RunSnapshot
from pydantic_ai_durable.journals._common import execution_id
from pydantic_ai_durable.journals.postgres import SCHEMA_VERSION, PostgresJournal

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

KEY = 'order-42'


def entry(payload: Any, name: str = 'agent__model.request', kind: str = 'model') -> dict[str, Any]:
    return {'v': 1, 'name': name, 'kind': kind, 'fingerprint': 'fp', 'payload': payload}


@dataclass
class Pg:
    dsn: str
    schema: str
    journal: PostgresJournal

    def reopen(self) -> PostgresJournal:
        return PostgresJournal(self.dsn, schema=self.schema)

    def put_raw(self, where: tuple[Any, ...], raw: str) -> None:
        put_raw(self.dsn, self.schema, where, raw)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(sql.SQL(query).format(s=sql.Identifier(self.schema)), params)
            return cursor.fetchall() if cursor.description else []


@pytest.fixture
async def pg(postgres_dsn: str) -> AsyncIterator[Pg]:  # noqa: F811
    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema)
    await journal.open()
    yield Pg(dsn, schema, journal)
    await journal.close()
    drop_schema(dsn, schema)


async def epoch_of(journal: PostgresJournal, key: str = KEY, holder: str = 'tests') -> int:
    """The epoch of a lease taken for the test's writes, which every write must carry (B-9)."""
    lease = await journal.acquire_lease(key, holder, 600)
    assert lease.holder == holder
    return lease.epoch


async def only_info(journal: Journal, key: str = KEY) -> ExecutionInfo:
    infos = [info for info in await journal.list_executions() if info.key == key]
    assert len(infos) == 1, infos
    return infos[0]


# -- B-1: the protocol, reads and writes ---------------------------------------------------------


async def test_perf3_read_run_and_writes_are_one_statement_each(pg: Pg, monkeypatch: pytest.MonkeyPatch) -> None:
    j = pg.journal
    e = await epoch_of(j)
    for position in range(50):
        await j.write_entry(KEY, '0', position, entry(position), epoch=e)
    await j.write_record(KEY, '0', 'meta', {'v': 1}, epoch=e)
    statements: list[str] = []
    real_execute = psycopg.AsyncConnection.execute

    async def counting_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(str(query))
        return await real_execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, 'execute', counting_execute)

    snapshot = await j.read_run(KEY, '0')
    assert len(snapshot.entries) == 50 and snapshot.records == {'meta': {'v': 1}}
    assert len(statements) == 1
    assert await j.write_entry(KEY, '0', 50, entry(50), epoch=e) is True  # the epoch check is in the statement
    assert await j.write_record(KEY, '0', 'usage', {'v': 1}, epoch=e) is True
    assert len(statements) == 3


# -- J-2: unstorable values ----------------------------------------------------------------------


async def test_j2_a_value_the_database_refuses_is_not_recorded(pg: Pg) -> None:
    j = pg.journal
    e = await epoch_of(j)
    assert await j.write_entry(KEY, 'run\x00with nul', 0, entry('x'), epoch=e) is False  # text cannot hold NUL
    assert await j.write_entry(KEY, '0', 2**63, entry('x'), epoch=e) is False  # out of bigint range
    assert await j.write_entry(KEY, '0', 0, entry('still works'), epoch=e) is True
    assert (await j.read_run(KEY, '0')).entries == {0: entry('still works')}


# -- J-3: garbage in the store reads as absent ---------------------------------------------------


async def test_j3_an_undecodable_key_is_left_out_of_the_listing(pg: Pg) -> None:
    await Operator(pg.journal).write_execution(KEY, {'v': 1})
    await Operator(pg.journal).write_execution('other', {'v': 1})
    pg.sql("UPDATE {s}.executions SET key = '\\xff'::bytea WHERE eid = %s", execution_id('other'))
    assert [info.key for info in await pg.journal.list_executions()] == [KEY]


# -- deleting ------------------------------------------------------------------------------------


async def test_jf2_writes_raise_when_the_server_is_gone_so_the_core_retries_them() -> None:
    journal = PostgresJournal(f'host=127.0.0.1 port={_closed_port()} user=x dbname=x connect_timeout=2')
    for write in (
        journal.delete_run(KEY, '0', epoch=1),
        journal.delete_execution(KEY, epoch=1),
        journal.write_entry(KEY, '0', 0, entry('x'), epoch=1),
        journal.write_record(KEY, '0', 'meta', {'v': 1}, epoch=1),
        journal.write_execution(KEY, {'v': 1}, epoch=1),
        journal.read_run(KEY, '0'),
    ):
        with pytest.raises(psycopg.OperationalError):  # never a silent False: nothing was stored
            await write
    await journal.release_lease(KEY, 'A', 1)  # giving back never raises
    with pytest.raises(JournalUnavailable):
        await journal.acquire_lease(KEY, 'A', 60)
    await journal.close()


# -- B-6: listing and retention ------------------------------------------------------------------


async def test_b5_a_lease_alone_is_not_an_execution(pg: Pg) -> None:
    j = pg.journal
    lease = await j.acquire_lease(KEY, 'A', 60)
    assert await j.list_executions() == []
    await j.release_lease(KEY, 'A', lease.epoch)
    assert await j.list_executions() == []
    assert await j.read_execution(KEY) is None
    assert pg.sql('SELECT count(*) FROM {s}.executions') == [(0,)]  # no row left behind


# -- B-5: leases ---------------------------------------------------------------------------------


async def test_b5_concurrent_acquires_over_separate_connections_have_one_winner(pg: Pg) -> None:
    journals = [pg.reopen() for _ in range(12)]
    try:
        for round_number in range(5):
            key = f'contended-{round_number}'
            results = await asyncio.gather(*(j.acquire_lease(key, f'w{i}', 60) for i, j in enumerate(journals)))
            winners = [i for i, held in enumerate(results) if held.holder == f'w{i}']
            assert len(winners) == 1, results
            assert {(held.holder, held.epoch) for held in results} == {(f'w{winners[0]}', results[winners[0]].epoch)}
    finally:
        for journal in journals:
            await journal.close()


# -- J-6 / B-4: key namespacing ------------------------------------------------------------------


async def test_b4_two_schemas_in_one_database_are_separate(pg: Pg) -> None:
    await Operator(pg.journal).write_entry(KEY, '0', 0, entry('first schema'))
    other_schema = f'{pg.schema}_b'
    other = PostgresJournal(pg.dsn, schema=other_schema)
    try:
        await other.open()
        assert await other.read_run(KEY, '0') == RunSnapshot()
        assert (await other.acquire_lease(KEY, 'B', 60)).holder == 'B'
        assert (await pg.journal.acquire_lease(KEY, 'A', 60)).holder == 'A'
    finally:
        await other.close()
        drop_schema(pg.dsn, other_schema)


# -- sharing: objects, processes, durability (B-2, B-8) ------------------------------------------


CHILD = """
import asyncio, json, os, signal, sys
from pydantic_ai_durable.journals.postgres import PostgresJournal

async def main():
    journal = PostgresJournal(sys.argv[1], schema=sys.argv[2])
    await journal.open()
    key = json.loads(sys.argv[3])
    snapshot = await journal.read_run(key, '0')
    lease = await journal.acquire_lease(key, 'child', 60)
    ok = await journal.write_entry(key, '0', 1, {'v': 1, 'name': 'child', 'kind': 'tool', 'fingerprint': None,
                                                 'payload': 'written by the child'}, epoch=int(sys.argv[4]))
    print(json.dumps({'entries': {str(k): v for k, v in snapshot.entries.items()}, 'records': snapshot.records,
                      'execution': await journal.read_execution(key),
                      'lease_holder': lease.holder, 'ok': ok}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # B-2: what returned True is already committed

asyncio.run(main())
"""


async def test_b2_b8_another_process_reads_and_its_acknowledged_write_survives_sigkill(pg: Pg) -> None:
    j = pg.journal
    key = 'proc/key:\u00e9\x00'
    e = await epoch_of(j, key, 'parent')
    await j.write_entry(key, '0', 0, entry({'rows': (1, 2)}), epoch=e)
    await j.write_record(key, '0', 'meta', {'v': 1, 'diverge_from': None}, epoch=e)
    await j.write_execution(key, {'v': 1, 'runs': ['0']}, epoch=e)

    child = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, '-c', CHILD, pg.dsn, pg.schema, json.dumps(key), str(e)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert child.returncode == -signal.SIGKILL, child.stderr
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert seen == {
        'entries': {'0': entry({'rows': [1, 2]})},
        'records': {'meta': {'v': 1, 'diverge_from': None}},
        'execution': {'v': 1, 'runs': ['0']},
        'lease_holder': 'parent',
        'ok': True,
    }
    assert (await j.read_run(key, '0')).entries[1]['payload'] == 'written by the child'


# -- B-7 / B-8: opening, schema, versions --------------------------------------------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return int(probe.getsockname()[1])


async def test_b7_refused_connection_is_unavailable_quickly() -> None:
    journal = PostgresJournal(f'host=127.0.0.1 port={_closed_port()} user=nobody password=hunter2 dbname=x')
    started = time.monotonic()
    with pytest.raises(JournalUnavailable) as caught:
        await journal.open()
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert '\n' not in message
    assert 'cannot be opened' in message and 'no model was called' in message
    assert 'hunter2' not in message and 'password=***' in message


@pytest.mark.parametrize(
    'dsn',
    ['this is not a dsn', 'postgresql://[bad', 'host=127.0.0.1 port=notaport'],
    ids=['words', 'bad_url', 'bad_port'],
)
async def test_b7_malformed_dsn_is_unavailable(dsn: str) -> None:
    journal = PostgresJournal(dsn)
    with pytest.raises(JournalUnavailable, match='cannot be opened'):
        await journal.open()
    assert 'PostgresJournal(' in repr(journal)


async def test_b7_unreachable_host_times_out_with_connect_timeout() -> None:
    # 192.0.2.0/24 is TEST-NET-1: never routed, so the connection hangs until the timeout.
    journal = PostgresJournal('host=192.0.2.1 port=5432 user=x dbname=x', connect_timeout=1)
    started = time.monotonic()
    with pytest.raises(JournalUnavailable):
        await journal.open()
    assert time.monotonic() - started < 5


async def test_b7_missing_database_is_unavailable(postgres_dsn: str) -> None:  # noqa: F811
    journal = PostgresJournal(make_conninfo(postgres_dsn, dbname=f'no_such_database_{uuid.uuid4().hex[:8]}'))
    with pytest.raises(JournalUnavailable, match='no_such_database'):
        await journal.open()


async def test_b7_calls_that_wait_together_on_a_failed_opening_each_get_the_journal_error(postgres_dsn: str) -> None:  # noqa: F811
    # Found behind PgBouncer (a database it does not serve): the first caller to see the opening fail forgot
    # it, and every other caller waiting on the same opening then failed on that, with an AttributeError.
    journal = PostgresJournal(make_conninfo(postgres_dsn, dbname=f'no_such_database_{uuid.uuid4().hex[:8]}'))
    outcomes = await asyncio.gather(*(journal.list_executions() for _ in range(5)), return_exceptions=True)
    assert [type(outcome) for outcome in outcomes] == [psycopg.OperationalError] * 5, outcomes
    assert all('no_such_database' in str(outcome) for outcome in outcomes)
    with pytest.raises(JournalUnavailable, match='no_such_database'):
        await journal.open()  # the failed opening is tried again, and fails again
    await journal.close()


async def test_b7_a_user_without_privileges_is_unavailable_but_may_use_an_existing_schema(pg: Pg) -> None:
    role = f'pad_limited_{uuid.uuid4().hex[:8]}'
    try:
        pg.sql(f'CREATE ROLE {role} LOGIN')
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip('the test server does not let this user create roles')
    try:
        limited_dsn = make_conninfo(pg.dsn, user=role)
        with pytest.raises(JournalUnavailable, match='cannot be opened'):
            await PostgresJournal(limited_dsn, schema=f'{pg.schema}_new').open()  # may not create a schema
        read_only = PostgresJournal(limited_dsn, schema=pg.schema)
        pg.sql(f'GRANT USAGE ON SCHEMA {{s}} TO {role}')
        pg.sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA {{s}} TO {role}')
        with pytest.raises(JournalUnavailable, match='permission denied'):
            await read_only.open()  # may read, not write: refused before any model call
        await read_only.close()
        pg.sql(f'GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {{s}} TO {role}')
        with pytest.raises(JournalUnavailable, match='lease_epochs'):
            await PostgresJournal(limited_dsn, schema=pg.schema).open()  # leases need the epoch sequence too
        pg.sql(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA {{s}} TO {role}')
        writer = PostgresJournal(limited_dsn, schema=pg.schema)
        await writer.open()
        assert await Operator(writer).write_entry(KEY, '0', 0, entry('by the limited user')) is True
        await writer.close()
        assert (await pg.journal.read_run(KEY, '0')).entries == {0: entry('by the limited user')}
    finally:
        pg.sql(f'DROP OWNED BY {role}')
        pg.sql(f'DROP ROLE {role}')


async def test_b8_a_newer_schema_version_is_refused(pg: Pg) -> None:
    await Operator(pg.journal).write_entry(KEY, '0', 0, entry('kept'))
    pg.sql('UPDATE {s}.schema_version SET version = %s', SCHEMA_VERSION + 1)
    newer = pg.reopen()
    with pytest.raises(JournalUnavailable, match=f'version {SCHEMA_VERSION + 1}, newer than'):
        await newer.open()
    with pytest.raises(JournalUnavailable, match='newer than'):
        await newer.write_entry(KEY, '0', 1, entry('refused'), epoch=1)
    assert pg.sql('SELECT count(*) FROM {s}.entries') == [(1,)]
    await newer.close()


async def test_b8_schema_is_created_once_when_many_open_at_once(postgres_dsn: str) -> None:  # noqa: F811
    dsn, schema = fresh_schema()
    journals = [PostgresJournal(dsn, schema=schema) for _ in range(10)]
    try:
        await asyncio.gather(*(journal.open() for journal in journals))
        e = await epoch_of(journals[0])
        results = await asyncio.gather(*(j.write_entry(KEY, '0', i, entry(i), epoch=e) for i, j in enumerate(journals)))
        assert all(results)
        assert len((await journals[0].read_run(KEY, '0')).entries) == 10
    finally:
        for journal in journals:
            await journal.close()
        drop_schema(dsn, schema)


def test_b8_schema_creation_is_safe_across_threads_and_loops(postgres_dsn: str) -> None:  # noqa: F811
    dsn, schema = fresh_schema()
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker(number: int) -> None:
        async def run() -> None:
            journal = PostgresJournal(dsn, schema=schema)
            barrier.wait()
            await journal.open()
            assert await Operator(journal).write_entry(f'k{number}', '0', 0, {'v': 1})
            await journal.close()

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(number,)) for number in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        journal = PostgresJournal(dsn, schema=schema)
        assert [info.runs for info in asyncio.run(journal.list_executions())] == [1, 1, 1, 1]
        asyncio.run(journal.close())
    finally:
        drop_schema(dsn, schema)


def test_b8_repr_hides_the_password() -> None:
    assert 's3cret' not in repr(PostgresJournal('postgresql://me:s3cret@db.example:5432/app'))
    assert repr(PostgresJournal('postgresql://me:s3cret@db.example/app')) == (
        "PostgresJournal('postgresql://me:***@db.example/app', schema='pydantic_ai_durable')"
    )
    assert 's3cret' not in repr(PostgresJournal('host=db user=me password=s3cret'))
    assert 's3cret' not in repr(PostgresJournal('postgresql://db/app?user=me&password=s3cret'))
    assert repr(PostgresJournal('host=db', schema='x')) == "PostgresJournal('host=db', schema='x')"


@pytest.mark.parametrize('schema', ['', 'x' * 64, 'a\x00b'])
def test_b8_bad_schema_name_is_refused(schema: str) -> None:
    with pytest.raises(ValueError, match='schema'):
        PostgresJournal('host=db', schema=schema)


async def test_b8_odd_schema_names_are_quoted(postgres_dsn: str) -> None:  # noqa: F811
    schema = f'Odd "name"; DROP TABLE x; {uuid.uuid4().hex[:6]}'
    journal = PostgresJournal(postgres_dsn, schema=schema)
    try:
        await journal.open()
        assert await Operator(journal).write_entry(KEY, '0', 0, entry('x')) is True
        assert (await journal.read_run(KEY, '0')).entries == {0: entry('x')}
    finally:
        await journal.close()
        drop_schema(postgres_dsn, schema)


def test_b8_missing_psycopg_says_what_to_install() -> None:
    code = (
        'import sys; sys.modules["psycopg"] = None\n'
        'from pydantic_ai_durable.journals.postgres import PostgresJournal\n'
        'try:\n    PostgresJournal("host=x")\n'
        'except ImportError as exc:\n    print(exc)\n'
    )
    child = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60, check=True)
    assert "the extra 'postgres' of pydantic-ai-durable-journal" in child.stdout
    assert "pip install 'psycopg[binary]>=3.2' 'psycopg-pool>=3.2'" in child.stdout


# -- connections: event loops, threads, breaks, cancellation -------------------------------------


def _backends(dsn: str, application_name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            'SELECT count(*) FROM pg_stat_activity WHERE application_name = %s', (application_name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_cc1_calls_from_several_event_loops_and_threads_share_one_pool(postgres_dsn: str) -> None:  # noqa: F811
    dsn, schema = fresh_schema()
    name = f'pad-loops-{uuid.uuid4().hex[:8]}'
    journal = PostgresJournal(make_conninfo(dsn, application_name=name), schema=schema, max_size=2)
    try:
        asyncio.run(journal.open())
        e = asyncio.run(journal.acquire_lease(KEY, 'A', 60)).epoch
        assert asyncio.run(journal.write_entry(KEY, '0', 0, entry('loop 2'), epoch=e)) is True
        assert asyncio.run(journal.write_entry(KEY, '0', 1, entry('loop 3'), epoch=e)) is True
        assert 1 <= _backends(dsn, name) <= 2  # the pool's, whatever loops called: none per loop

        async def main_loop() -> None:
            errors: list[BaseException] = []

            def renewer() -> None:  # another thread with loops of its own
                try:
                    for _ in range(5):
                        renewed = asyncio.run(renew(journal, KEY, 'A', e, 60))
                        assert renewed is not None and renewed.holder == 'A'
                except BaseException as exc:
                    errors.append(exc)

            thread = threading.Thread(target=renewer)
            thread.start()
            for position in range(2, 30):
                assert await journal.write_entry(KEY, '0', position, entry(position), epoch=e) is True
            await asyncio.to_thread(thread.join)
            assert errors == []
            assert len((await journal.read_run(KEY, '0')).entries) == 30

        asyncio.run(main_loop())
        assert asyncio.run(journal.read_execution(KEY)) is None
        assert 1 <= _backends(dsn, name) <= 2
        asyncio.run(journal.close())
        deadline = time.monotonic() + 5  # the server forgets a session a moment after it closed
        while _backends(dsn, name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _backends(dsn, name) == 0
    finally:
        asyncio.run(journal.close())
        drop_schema(dsn, schema)


async def test_cc6_concurrent_writes_share_commits(postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from pydantic_ai_durable.journals import _pg_connections

    dsn, schema = fresh_schema()
    name = f'pad-tasks-{uuid.uuid4().hex[:8]}'
    journal = PostgresJournal(make_conninfo(dsn, application_name=name), schema=schema)
    commits: list[int] = []
    real = _pg_connections._commit_together

    async def counting(conn: Any, batch: list[Any]) -> Any:
        commits.append(len(batch))
        return await real(conn, batch)

    monkeypatch.setattr(_pg_connections, '_commit_together', counting)
    try:
        e = await epoch_of(journal)
        results = await asyncio.gather(*(journal.write_entry(KEY, '0', p, entry(p), epoch=e) for p in range(40)))
        assert all(results)
        assert sum(commits) == 40 and len(commits) < 40, commits  # a commit holds whatever queued meanwhile
        assert len((await journal.read_run(KEY, '0')).entries) == 40
        stale = await asyncio.gather(
            journal.write_entry(KEY, '0', 40, entry('stale'), epoch=e - 1),
            journal.write_entry(KEY, '0', 41, entry('fresh'), epoch=e),
            return_exceptions=True,
        )
        assert isinstance(stale[0], LeaseLost) and stale[1] is True  # fenced one by one inside a shared commit
        refused = await asyncio.gather(
            journal.write_entry(KEY, '0', 2**63, entry('out of bigint range'), epoch=e),
            journal.write_entry(KEY, '0', 43, entry('fine'), epoch=e),
        )
        assert refused == [False, True]  # a value the database refuses fails only its own write (J-2)
        entries = (await journal.read_run(KEY, '0')).entries
        assert 40 not in entries and entries[43] == entry('fine')
    finally:
        await journal.close()
        drop_schema(dsn, schema)


async def test_b8_reconnects_after_the_server_drops_the_connection(pg: Pg) -> None:
    name = f'pad-drop-{uuid.uuid4().hex[:8]}'
    j = PostgresJournal(make_conninfo(pg.dsn, application_name=name), schema=pg.schema)
    kill = 'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s'
    try:
        e = await epoch_of(j)
        assert await j.write_entry(KEY, '0', 0, entry('before'), epoch=e) is True
        assert set(pg.sql(kill, name)) == {(True,)}

        assert await j.write_entry(KEY, '0', 1, entry('after'), epoch=e) is True

        assert set(pg.sql(kill, name)) == {(True,)}
        assert (await j.read_run(KEY, '0')).entries == {0: entry('before'), 1: entry('after')}
        assert set(pg.sql(kill, name)) == {(True,)}
        assert (await j.acquire_lease(KEY, 'tests', 60)).holder == 'tests'  # its own lease, after a reconnect
    finally:
        await j.close()


async def test_b8_a_cancelled_call_leaves_the_journal_usable(pg: Pg) -> None:
    j = pg.journal
    e = await epoch_of(j)
    await j.write_entry(KEY, '0', 0, entry('first'), epoch=e)
    blocker = await psycopg.AsyncConnection.connect(pg.dsn)
    try:
        # Hold the execution row's lock so the next write waits inside the database.
        await blocker.execute(
            sql.SQL('SELECT 1 FROM {}.executions WHERE eid = %s FOR UPDATE').format(sql.Identifier(pg.schema)),
            (execution_id(KEY),),
        )
        task = asyncio.create_task(j.write_entry(KEY, '0', 1, entry('cancelled'), epoch=e))
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await blocker.rollback()
    finally:
        await blocker.close()

    assert await asyncio.wait_for(j.write_entry(KEY, '0', 2, entry('after'), epoch=e), 10) is True
    entries = (await j.read_run(KEY, '0')).entries
    assert entries[0] == entry('first') and entries[2] == entry('after')
    assert entries.get(1) in (None, entry('cancelled'))


async def test_b8_close_then_use_again_reconnects(pg: Pg) -> None:
    await Operator(pg.journal).write_entry(KEY, '0', 0, entry('x'))
    await pg.journal.close()
    await pg.journal.close()
    assert (await pg.journal.read_run(KEY, '0')).entries == {0: entry('x')}


def test_pg_fixture_module_reports_how_to_enable() -> None:
    import pg as pg_module

    assert 'install the Debian package postgresql' in pg_module.HOW_TO_ENABLE
    assert pg_module.DSN_VARIABLE in pg_module.HOW_TO_ENABLE


async def test_fn2_the_retention_prune_reads_its_index_only_as_far_as_the_deadlines_that_passed(pg: Pg) -> None:
    operator = Operator(pg.journal)
    for n in range(300):
        await operator.write_execution(f'kept-{n}', {'v': 1, 'status': 'finished', 'retention': 86400.0})
    pg.sql('ANALYZE {s}.executions')
    statement = pg.journal._sql.prune_expired.replace('%(limit)s', '8')  # deletes nothing: nothing expired
    plan = '\n'.join(row[0] for row in pg.sql('EXPLAIN (ANALYZE, FORMAT TEXT) ' + statement))
    assert 'Index Cond' in plan and 'Rows Removed by Filter: 300' not in plan, plan
    assert await pg.journal.prune(limit=8) == []
