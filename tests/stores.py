"""The stores a test can scan byte by byte: memory, disk and PostgreSQL journals, and their raw contents.

A test that says nothing of a secret reached the store, or that a refused import left the store as it
was, reads what the store really holds: the disk journal's files, every row of its PostgreSQL schema, the
memory journal's stored texts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pg import fresh_schema
from pg import put_raw as pg_put_raw

from pydantic_ai_durable import DiskJournal, Encryption, MemoryJournal, PostgresJournal
from pydantic_ai_durable.journals import Journal, reseal
from pydantic_ai_durable.journals._common import execution_id

Where = tuple[Any, ...]
"""A stored value: `('entry', key, run, position)`, `('record', key, run, name)` or `('execution', key)`."""


@dataclass
class Store:
    """One backend: journals over the same store with given keys, its raw bytes, and an attacker's pen."""

    name: str
    make: Callable[[Encryption | None], Journal]
    raw: Callable[[], bytes]
    put_raw: Callable[[Where, str], None]
    """Replace the stored text of an existing value, as someone with write access to the store would."""
    delete_raw: Callable[[Where], None]
    """Delete one stored entry, as someone with write access to the store would."""
    cli: list[str] | None = None
    """The CLI's options that name this store, for a store other processes can open."""


def memory_store(tmp_path: Path) -> Store:
    holder: list[MemoryJournal] = []

    def make(encryption: Encryption | None) -> Journal:
        if not holder:
            holder.append(MemoryJournal(encryption=encryption))
        else:
            reseal(holder[0], encryption, 'strict')  # one store per object: the same texts under other keys
        return holder[0]

    def raw() -> bytes:
        texts: list[str] = []
        for stored in holder[0]._executions.values():
            texts.append(stored.record or '')
            for run in stored.runs.values():
                texts += [*run.entries.values(), *run.records.values()]
        return '\n'.join(texts).encode()

    def put_raw(where: Where, text: str) -> None:
        stored = holder[0]._executions[where[1]]
        if where[0] == 'entry':
            stored.runs[where[2]].entries[where[3]] = text
        elif where[0] == 'record':
            stored.runs[where[2]].records[where[3]] = text
        else:
            stored.record = text

    def delete_raw(where: Where) -> None:
        del holder[0]._executions[where[1]].runs[where[2]].entries[where[3]]

    return Store('memory', make, raw, put_raw=put_raw, delete_raw=delete_raw)


def disk_store(tmp_path: Path) -> Store:
    path = tmp_path / 'journal'

    def raw() -> bytes:
        return b''.join(file.read_bytes() for file in sorted(path.rglob('*')) if file.is_file())

    def item(where: Where) -> str:
        eid = execution_id(where[1])
        if where[0] == 'entry':
            return f'{eid}/e/{where[2]}/{where[3]}'
        return f'{eid}/m/{where[2]}/{where[3]}' if where[0] == 'record' else f'{eid}/x'

    def put_raw(where: Where, text: str) -> None:
        cache = DiskJournal(path)._open_cache()
        try:
            assert cache.get(item(where)) is not None, f'nothing stored at {where!r}'
            cache.set(item(where), text)
        finally:
            cache.close()

    def delete_raw(where: Where) -> None:
        cache = DiskJournal(path)._open_cache()
        try:
            assert cache.delete(item(where)), f'nothing stored at {where!r}'
        finally:
            cache.close()

    return Store(
        'disk',
        lambda encryption: DiskJournal(path, encryption=encryption),
        raw,
        cli=['--journal', str(path)],
        put_raw=put_raw,
        delete_raw=delete_raw,
    )


def postgres_store(tmp_path: Path) -> Store:
    dsn, schema = fresh_schema()

    def raw() -> bytes:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    'SELECT table_name FROM information_schema.tables WHERE table_schema = %s', (schema,)
                ).fetchall()
            ]
            rows = [
                str(row[0])
                for table in tables
                for row in conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t').fetchall()
            ]
        return '\n'.join(rows).encode()

    def delete_raw(where: Where) -> None:
        import psycopg
        from psycopg import sql

        query = sql.SQL('DELETE FROM {}.entries WHERE eid = %s AND run = %s AND position = %s')
        with psycopg.connect(dsn, autocommit=True) as conn:
            deleted = conn.execute(
                query.format(sql.Identifier(schema)), (execution_id(where[1]), where[2], where[3])
            ).rowcount
        assert deleted == 1, f'nothing stored at {where!r}'

    return Store(
        'postgres',
        lambda encryption: PostgresJournal(dsn, schema=schema, encryption=encryption),
        raw,
        cli=['--journal', dsn, '--schema', schema],
        put_raw=lambda where, text: pg_put_raw(dsn, schema, where, text),
        delete_raw=delete_raw,
    )
