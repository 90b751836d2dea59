"""Backend fixtures shared by the journal core and backend contract suites.

Every fixture here is prefixed `backend_` or `core_` so other test modules can add their own freely.
To run both suites against another backend, append one `BackendCase` factory to `BACKEND_FACTORIES`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache
import pytest
from helpers import Operator
from pg import fresh_schema, postgres_dsn  # noqa: F401
from pg import put_raw as pg_put_raw

from pydantic_ai_durable._core._lease import LeaseKeeper, LeaseRenewer
from pydantic_ai_durable.journals import DiskJournal, Journal, MemoryJournal, PostgresJournal
from pydantic_ai_durable.journals._common import execution_id


def _renewed_leases() -> set[LeaseKeeper]:
    """Every lease this process's renewers still keep renewing."""
    with LeaseRenewer._registry:
        renewers = list(LeaseRenewer._renewers.values())
    keepers: set[LeaseKeeper] = set()
    for renewer in renewers:
        with renewer._guard:
            keepers.update(keeper for keeper in renewer._keepers if keeper.lost is None)
    return keepers


@pytest.fixture(autouse=True)
def _no_lease_left_renewing() -> Iterator[None]:
    """A test ends every attempt it starts (CC-3): a lease left held is renewed for the rest of the session,
    against a journal the test closed and, at the end, a server already stopped."""
    before = _renewed_leases()
    yield
    left = _renewed_leases() - before
    if left:
        pytest.fail(
            f'the test left {len(left)} lease(s) renewing: '
            + ', '.join(sorted(f'{keeper.key!r} in {keeper.journal!r}' for keeper in left))
            + '; finish each attempt it starts (Attempt.finish, or leave its execution block).',
            pytrace=False,
        )


Where = tuple[Any, ...]
"""Where a raw value goes: `('entry', key, run, position)`, `('record', key, run, name)` or `('execution', key)`."""


@dataclass
class BackendCase:
    """One backend under test, with the few hooks the contract suite needs beyond the protocol."""

    name: str
    journal: Journal
    reopen: Callable[[], Journal]
    """A second journal object over the same storage (for memory: the same object)."""
    put_raw: Callable[[Where, object], None]
    """Replace the stored representation of an existing value with `raw` (bypasses the journal's encoder)."""
    shares_across_processes: bool


def _memory_case(tmp_path: Path) -> BackendCase:
    journal = MemoryJournal()

    def put_raw(where: Where, raw: object) -> None:
        stored = journal._executions[where[1]]
        if where[0] == 'entry':
            stored.runs[where[2]].entries[where[3]] = raw  # type: ignore[assignment]
        elif where[0] == 'record':
            stored.runs[where[2]].records[where[3]] = raw  # type: ignore[assignment]
        else:
            stored.record = raw  # type: ignore[assignment]

    return BackendCase('memory', journal, lambda: journal, put_raw, shares_across_processes=False)


def _disk_case(tmp_path: Path) -> BackendCase:
    path = tmp_path / 'j'

    def put_raw(where: Where, raw: object) -> None:
        eid = execution_id(where[1])
        if where[0] == 'entry':
            item = f'{eid}/e/{where[2]}/{where[3]}'
        elif where[0] == 'record':
            item = f'{eid}/m/{where[2]}/{where[3]}'
        else:
            item = f'{eid}/x'
        with diskcache.Cache(str(path), eviction_policy='none') as cache:
            cache.set(item, raw)

    return BackendCase('disk', DiskJournal(path), lambda: DiskJournal(path), put_raw, shares_across_processes=True)


def _postgres_case(tmp_path: Path) -> BackendCase:
    dsn, schema = fresh_schema()  # starts the session's server lazily; skips (fails when CI=true) without one
    return BackendCase(
        'postgres',
        PostgresJournal(dsn, schema=schema),
        lambda: PostgresJournal(dsn, schema=schema),
        lambda where, raw: pg_put_raw(dsn, schema, where, raw),
        shares_across_processes=True,
    )


BACKEND_FACTORIES: list[Callable[[Path], BackendCase]] = [_memory_case, _disk_case, _postgres_case]
"""Factories of the backends every contract and core test runs against."""


@pytest.fixture(params=BACKEND_FACTORIES, ids=lambda factory: factory.__name__.strip('_').removesuffix('_case'))
async def backend_case(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BackendCase]:
    case: BackendCase = request.param(tmp_path)
    await case.journal.open()
    opened: list[Journal] = [case.journal]
    reopen = case.reopen

    def tracked_reopen() -> Journal:
        journal = reopen()
        opened.append(journal)
        return journal

    case.reopen = tracked_reopen
    yield case
    for journal in opened:
        await journal.close()


@pytest.fixture
def backend_journal(backend_case: BackendCase) -> Journal:
    """An opened, empty journal of each backend."""
    return backend_case.journal


@pytest.fixture
def backend_store(backend_case: BackendCase) -> Operator:
    """The same journal written as an operator would: each write under a lease of its own (B-9)."""
    return Operator(backend_case.journal)


@pytest.fixture(params=['memory', 'disk', 'postgres'])
def new_journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Journal]]:
    """The journal of the next attempt: the same object (memory), or a new object on the same store,
    as a new process would open it (disk, postgres). Every object made is closed after the test."""
    made: list[Journal] = []

    def opened(journal: Journal) -> Journal:
        made.append(journal)
        return journal

    if request.param == 'memory':
        shared = MemoryJournal()
        yield lambda: shared
    elif request.param == 'postgres':
        dsn, schema = fresh_schema()
        yield lambda: opened(PostgresJournal(dsn, schema=schema))
    else:
        yield lambda: opened(DiskJournal(tmp_path / 'journal'))
    for journal in made:
        asyncio.run(journal.close())
