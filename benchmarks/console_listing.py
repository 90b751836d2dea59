"""A page of the console's listing in a journal of 100,000 executions, on disk and on PostgreSQL (B-17, UI-1).

The console's executions page asks `page_executions` for fifty executions, the last changed first, with the
count of each state; the target is under 200 ms for the first page and for a filtered one. This script fills
a journal with `--n` executions (70% finished, 20% failed, 10% interrupted, and a few running under live
leases of this process), in bulk in the store's own format (a real attempt per execution would take an
hour), checks the counts against what it wrote, then times each kind of page (median of `--rounds`) and,
for comparison, one whole `list_executions`.

    python benchmarks/console_listing.py                 # 100,000 executions, disk and PostgreSQL
    python benchmarks/console_listing.py --n 1000 --no-postgres
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic_ai_durable import DiskJournal, Journal, PostgresJournal
from pydantic_ai_durable._runtime import new_holder, start_holding
from pydantic_ai_durable.journals import EXECUTION_STATES
from pydantic_ai_durable.journals._common import execution_id
from pydantic_ai_durable.journals._disk_heads import RESERVE, entry_key

HERE = Path(__file__).resolve().parent
QUEUES = ('order', 'refund', 'invoice')
RUNNING = 5
TARGET_MS = 200.0


def status_of(index: int) -> str:
    """70% finished, 20% failed, 10% whose record still says running (interrupted: no lease)."""
    return 'finished' if index % 10 < 7 else 'failed' if index % 10 < 9 else 'running'


def key_of(index: int) -> str:
    return f'{QUEUES[index % 3]}-{index}'


def _entry(index: int, position: int, now: float) -> str:
    payload = {'parts': [{'part_kind': 'text', 'content': f'answer {index} ' * 20}]}
    entry = {'v': 1, 'name': 'agent__model.request', 'kind': 'model', 'fingerprint': 'f' * 64, 't': now}
    return json.dumps({**entry, 'a': 1, 'payload': payload}, separators=(',', ':'))


def fill_disk(journal: DiskJournal, n: int) -> None:
    """Heads, records and two entries per execution, as `DiskJournal` writes them, in one transaction."""
    cache = journal._open_cache()
    now = time.time() - n
    with cache.transact():
        for index in range(n):
            key, eid, status = key_of(index), execution_id(key_of(index)), status_of(index)
            updated = now + index
            head = {'v': 1, 'runs': {'0': {'top': RESERVE + 2, 'records': []}}, 'key': key, 'updated': updated}
            record = {'v': 1, 'key': key, 'runs': ['0'], 'status': status, 'attempts': 1, 'updated': updated}
            cache.put_text(f'{eid}/h', json.dumps({**head, 'status': status}, separators=(',', ':')))
            cache.put_text(f'{eid}/x', json.dumps(record, separators=(',', ':')))
            for position in range(2):
                cache.put_text(entry_key(eid, '0', position), _entry(index, position, updated))


async def fill_postgres(journal: PostgresJournal, n: int) -> None:
    """The same executions in the tables of `PostgresJournal`, one statement each, as its writes store them."""
    await journal.open()
    s = f'"{journal.schema}"'
    now = time.time() - n
    record = (
        "json_build_object('v', 1, 'key', k, 'runs', json_build_array('0'), 'status', st, 'attempts', 1, "
        "'updated', u)::text"
    )
    statements = [
        f"""INSERT INTO {s}.executions (eid, key, record, updated, status)
            SELECT encode(sha256(convert_to(k, 'UTF8')), 'hex'), convert_to(k, 'UTF8'), {record}, u, st FROM (
              SELECT (ARRAY['order', 'refund', 'invoice'])[i % 3 + 1] || '-' || i AS k, {now} + i AS u,
                     CASE WHEN i % 10 < 7 THEN 'finished' WHEN i % 10 < 9 THEN 'failed' ELSE 'running' END AS st
              FROM generate_series(0, {n - 1}) AS i) AS made""",
        f"""INSERT INTO {s}.entries (eid, run, position, value)
            SELECT x.eid, '0', p, %(entry)s FROM {s}.executions AS x, generate_series(0, 1) AS p""",
    ]
    async with await _connect(journal) as conn:
        for statement in statements:
            await conn.execute(statement, {'entry': _entry(0, 0, now)} if '%(entry)s' in statement else None)


async def _connect(journal: PostgresJournal) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(journal.dsn, autocommit=True)


async def hold_running(journal: Journal) -> None:
    """A few executions under live leases of this process: running, whatever their record says."""
    holder = new_holder()
    start_holding(holder)
    for index in range(RUNNING):
        lease = await journal.acquire_lease(key_of(index), holder, 3600)
        assert lease.holder == holder


async def timed(call: Callable[[], Awaitable[Any]], rounds: int) -> tuple[float, Any]:
    times: list[float] = []
    found: Any = None
    for _ in range(rounds):
        started = time.perf_counter()
        found = await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), found


async def measure(name: str, journal: Journal, n: int, rounds: int, whole: bool) -> None:
    recorded = {'running': 'interrupted', 'failed': 'failed', 'finished': 'finished'}
    expected = dict.fromkeys(EXECUTION_STATES, 0) | {'running': RUNNING}
    for index in range(RUNNING, n):  # the first RUNNING are held by live leases
        expected[recorded[status_of(index)]] += 1
    started = time.perf_counter()
    first = await journal.page_executions(limit=50)
    print(f'  first call (creates the indexes when missing)          {(time.perf_counter() - started) * 1000:9.1f} ms')
    assert first.counts == expected, f'{first.counts} != {expected}'
    assert [info.key for info in first.executions][:1] == [key_of(n - 1)], 'not the last changed first'
    cases: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ('first page (50 of every state)', lambda: journal.page_executions(limit=50)),
        ('state=failed, first page', lambda: journal.page_executions(state='failed', limit=50)),
        ('prefix refund-, first page', lambda: journal.page_executions(prefix='refund-', limit=50)),
        ('prefix refund-99, state=failed', lambda: journal.page_executions(prefix='refund-99', state='failed')),
        (
            'state=interrupted, page 100 (offset 4,950)',
            lambda: journal.page_executions(state='interrupted', offset=4950),
        ),
        ('one key (the execution page)', lambda: journal.page_executions(key=key_of(n // 2))),
    ]
    for label, call in cases:
        median, page = await timed(call, rounds)
        verdict = 'meets' if median < TARGET_MS else 'MISSES'
        print(f'  {label:<54} {median:9.1f} ms  ({len(page.executions)} rows; {verdict} < {TARGET_MS:.0f} ms)')
    if whole:
        median, infos = await timed(journal.list_executions, 1)
        print(f'  {"for comparison: list_executions (everything, once)":<54} {median:9.1f} ms  ({len(infos)} rows)')


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--n', type=int, default=100_000)
    parser.add_argument('--rounds', type=int, default=21)
    parser.add_argument('--no-postgres', action='store_true')
    parser.add_argument('--no-whole', action='store_true', help='skip timing one whole list_executions')
    args = parser.parse_args()
    print(f'a page of the listing among {args.n:,} executions (median of {args.rounds}):')
    with tempfile.TemporaryDirectory() as scratch:
        disk = DiskJournal(Path(scratch) / 'journal')
        started = time.perf_counter()
        fill_disk(disk, args.n)
        await hold_running(disk)
        print(f'DiskJournal (filled in {time.perf_counter() - started:.1f} s):')
        await measure('disk', disk, args.n, args.rounds, not args.no_whole)
        await disk.close()
    if args.no_postgres:
        return
    sys.path.insert(0, str(HERE.parent / 'tests'))
    import pg

    binaries = pg._find_binaries()
    if binaries is None:
        print('PostgreSQL: not run (no initdb / pg_ctl on this machine)')
        return
    server = pg._Server(binaries)
    dsn = server.start()
    try:
        journal = PostgresJournal(dsn, schema='bench_console')
        started = time.perf_counter()
        await fill_postgres(journal, args.n)
        await hold_running(journal)
        async with await _connect(journal) as conn:
            await conn.execute('VACUUM ANALYZE "bench_console".executions')
        print(f'PostgresJournal (filled in {time.perf_counter() - started:.1f} s):')
        await measure('postgres', journal, args.n, args.rounds, not args.no_whole)
        await journal.close()
    finally:
        server.stop()


if __name__ == '__main__':
    asyncio.run(main())
