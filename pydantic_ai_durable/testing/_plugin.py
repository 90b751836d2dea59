"""pytest plugin (entry point `pytest11`): the `journal` fixture, over every journal backend available.

pytest loads this module in every session of anyone who installed the package, so it imports
nothing heavy at load time and cannot fail: backends are imported when a test asks for `journal`.
The fixture is synchronous, so it works with pytest-asyncio in strict and auto mode alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..journals import Journal

__all__ = ('PG_DSN_ENV', 'journal')

PG_DSN_ENV = 'PYDANTIC_AI_DURABLE_PG_DSN'
"""Set it to a Postgres DSN to also run every `journal` test on `PostgresJournal`."""

_POSTGRES_MODULE = 'pydantic_ai_durable.journals.postgres'


def _postgres_class() -> tuple[Any, str]:
    """`PostgresJournal` when a DSN is configured and it imports, else `None` and the reason."""
    if not os.environ.get(PG_DSN_ENV):
        return None, f'{PG_DSN_ENV} is not set'
    try:
        import importlib

        return importlib.import_module(_POSTGRES_MODULE).PostgresJournal, ''
    except Exception as exc:  # a missing driver or backend leaves Postgres out; it never breaks a session
        return None, f'{_POSTGRES_MODULE}.PostgresJournal cannot be imported ({type(exc).__name__}: {exc})'


def _backends() -> list[str]:
    try:
        return ['memory', 'disk'] + (['postgres'] if _postgres_class()[0] is not None else [])
    except Exception:
        return ['memory', 'disk']


def _close(journal: Journal) -> None:
    """Close a journal from synchronous teardown, also when this thread already runs an event loop."""

    def close() -> None:
        with contextlib.suppress(Exception):  # a failed close must not turn a passing test into an error
            asyncio.run(journal.close())

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        close()
        return
    thread = threading.Thread(target=close)
    thread.start()
    thread.join()


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say whether the Postgres backend takes part, only to those who configured it."""
    if not os.environ.get(PG_DSN_ENV):
        return None
    cls, reason = _postgres_class()
    if cls is not None:
        return f'pydantic-ai-durable: journal fixture backends: {", ".join(_backends())}'
    return f'pydantic-ai-durable: journal fixture leaves Postgres out: {reason}'


@pytest.fixture(params=_backends())
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Journal]:
    """An empty journal of each available backend: memory, disk (in `tmp_path`), and Postgres when configured.

    Pass it to `execution(key, journal=journal)`, `Durable(journal=journal)`, `assert_replays` or
    `crash_everywhere`. Postgres takes part when `PYDANTIC_AI_DURABLE_PG_DSN` is set and
    `PostgresJournal` imports; each test gets a schema of its own, dropped afterwards.
    """
    backend: str = request.param
    journal: Journal
    if backend == 'memory':
        from ..journals import MemoryJournal

        journal = MemoryJournal()
    elif backend == 'disk':
        from ..journals import DiskJournal

        journal = DiskJournal(tmp_path / 'journal')
    else:
        cls, reason = _postgres_class()
        if cls is None:
            pytest.skip(reason)
        schema = f'pad_test_{uuid.uuid4().hex[:16]}'
        journal = cls(os.environ[PG_DSN_ENV], schema=schema)
        yield journal
        _close(journal)
        _drop_schema(os.environ[PG_DSN_ENV], schema)
        return
    yield journal
    _close(journal)


def _drop_schema(dsn: str, schema: str) -> None:
    """Drop a test's own schema, so a shared server does not collect one per test run; best effort."""
    with contextlib.suppress(Exception):
        import psycopg
        from psycopg import sql

        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL('DROP SCHEMA IF EXISTS {} CASCADE').format(sql.Identifier(schema)))
