"""A page of the listing (B-17), on every backend: what `list_executions` says, a page at a time, last changed first."""

from __future__ import annotations

import asyncio
from pathlib import Path

import diskcache
import pytest
from helpers import Operator

from pydantic_ai_durable.journals import EXECUTION_STATES, DiskJournal, ExecutionPage, Journal
from pydantic_ai_durable.journals._common import execution_id

STATES = {
    'order-1': 'finished',
    'order-2': 'failed',
    'order-3': 'running',  # a record that says running, no lease: interrupted
    'order-4': 'finished',
    'refund-1': 'finished',
    'refund-2': 'failed',
    'refund-3': None,  # no record at all, only an entry: interrupted
    'refund-4': 'waiting',  # ended with tool calls that wait for a decision (WT-1)
}


async def _journal_of_every_state(store: Operator, journal: Journal) -> str:
    """The executions of `STATES`, written in that order, and one a live lease holds; returns the held key."""
    for key, status in STATES.items():
        if status is not None:
            await store.write_execution(key, {'v': 1, 'key': key, 'runs': ['0'], 'status': status})
        await store.write_entry(key, '0', 0, {'v': 1, 'name': 'm', 'kind': 'model', 'payload': {'n': key}})
        await asyncio.sleep(0.002)  # distinct update times, whatever the clock's resolution
    held = 'order-5'
    lease = await journal.acquire_lease(held, 'someone-else', 60)
    await journal.write_execution(held, {'v': 1, 'key': held, 'runs': [], 'status': 'failed'}, epoch=lease.epoch)
    return held


async def test_b17_a_page_counts_every_state_and_lists_the_last_changed_first(
    backend_store: Operator, backend_journal: Journal
) -> None:
    held = await _journal_of_every_state(backend_store, backend_journal)
    listed = await backend_journal.list_executions()
    page = await backend_journal.page_executions(limit=50)
    assert page.counts == {state: sum(info.state == state for info in listed) for state in EXECUTION_STATES}
    assert page.counts == {'running': 1, 'interrupted': 2, 'waiting': 1, 'failed': 2, 'finished': 3, 'corrupt': 0}
    assert [info.key for info in page.executions] == [held, *reversed(STATES)]
    by_key = {info.key: info for info in listed}
    for info in page.executions:  # the same facts as the whole listing, state, runs, steps and size included
        assert info == by_key[info.key]
    assert page.total() == 9 and page.total('failed') == 2 and page.total(['running', 'finished']) == 4


async def test_b17_a_page_filters_by_state_prefix_and_key_and_pages_by_offset(
    backend_store: Operator, backend_journal: Journal
) -> None:
    held = await _journal_of_every_state(backend_store, backend_journal)
    failed = await backend_journal.page_executions(state='failed')
    assert [info.key for info in failed.executions] == ['refund-2', 'order-2']
    running = await backend_journal.page_executions(state=['running', 'interrupted'])
    assert [info.key for info in running.executions] == [held, 'refund-3', 'order-3']
    refunds = await backend_journal.page_executions(prefix='refund-')
    assert refunds.counts == {'running': 0, 'interrupted': 1, 'waiting': 1, 'failed': 1, 'finished': 1, 'corrupt': 0}
    assert [info.key for info in refunds.executions] == ['refund-4', 'refund-3', 'refund-2', 'refund-1']
    waiting = await backend_journal.page_executions(state='waiting')
    assert [info.key for info in waiting.executions] == ['refund-4']
    one = await backend_journal.page_executions(key='order-1')
    assert [info.key for info in one.executions] == ['order-1'] and one.total() == 1
    alone = await backend_journal.page_executions(key=held)
    assert [info.state for info in alone.executions] == ['running'] and alone.counts['running'] == 1
    assert (await backend_journal.page_executions(key='order-')).total() == 0
    pages: list[ExecutionPage] = [await backend_journal.page_executions(limit=3, offset=at) for at in (0, 3, 6, 9)]
    seen = [info.key for page in pages for info in page.executions]
    assert seen == [held, *reversed(STATES)]  # every execution once, in order, over four pages


@pytest.mark.parametrize('limit, offset', [(0, 0), (1001, 0), (10, -1)])
async def test_b17_a_page_that_is_not_one_is_refused(backend_journal: Journal, limit: int, offset: int) -> None:
    with pytest.raises(ValueError, match=r'page|offset'):
        await backend_journal.page_executions(limit=limit, offset=offset)


async def test_b17_a_disk_head_that_is_not_json_leaves_the_page_correct(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / 'j')
    store = Operator(journal)
    for key in ('a-1', 'a-2'):
        await store.write_execution(key, {'v': 1, 'key': key, 'runs': [], 'status': 'finished'})
    with diskcache.Cache(str(tmp_path / 'j'), eviction_policy='none') as cache:
        cache.set(f'{execution_id("a-2")}/h', 'planted: not JSON')  # what no release writes
    page = await journal.page_executions(prefix='a-')
    assert [info.key for info in page.executions] == ['a-1']
    assert page.counts['finished'] == 1
    await journal.close()


async def test_b17_a_postgres_schema_of_version_3_gets_the_status_of_every_record_on_upgrade() -> None:
    import psycopg
    from pg import fresh_schema

    from pydantic_ai_durable.journals import PostgresJournal

    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema)
    store = Operator(journal)
    for key, status in (('a', 'finished'), ('b', 'failed'), ('c', 'running'), ('d', 'waiting')):
        await store.write_execution(key, {'v': 1, 'key': key, 'runs': [], 'status': status})
    await journal.close()
    with psycopg.connect(dsn, autocommit=True) as conn:  # as a release before the status column left it
        conn.execute(f'ALTER TABLE "{schema}".executions DROP COLUMN status')
        conn.execute(f'UPDATE "{schema}".schema_version SET version = 3')
    upgraded = PostgresJournal(dsn, schema=schema)
    page = await upgraded.page_executions(state='failed')
    assert [info.key for info in page.executions] == ['b']
    assert page.counts == {'running': 0, 'interrupted': 1, 'waiting': 1, 'failed': 1, 'finished': 1, 'corrupt': 0}
    await upgraded.close()
