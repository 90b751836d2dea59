"""The stores a test can scan byte by byte: memory, disk and PostgreSQL journals, and their raw contents.

A test that says nothing of a secret reached the store, or that a refused import left the store as it
was, reads what the store really holds: the disk journal's files, every row of its PostgreSQL schema, the
memory journal's stored texts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pg import fresh_schema

from pydantic_ai_durable import DiskJournal, Encryption, MemoryJournal, PostgresJournal
from pydantic_ai_durable.journals import Journal, reseal


@dataclass
class Store:
    """One backend: journals over the same store with given keys, and its raw bytes."""

    name: str
    make: Callable[[Encryption | None], Journal]
    raw: Callable[[], bytes]
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

    return Store('memory', make, raw)


def disk_store(tmp_path: Path) -> Store:
    path = tmp_path / 'journal'

    def raw() -> bytes:
        return b''.join(file.read_bytes() for file in sorted(path.rglob('*')) if file.is_file())

    return Store('disk', lambda encryption: DiskJournal(path, encryption=encryption), raw, cli=['--journal', str(path)])


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

    return Store(
        'postgres',
        lambda encryption: PostgresJournal(dsn, schema=schema, encryption=encryption),
        raw,
        cli=['--journal', dsn, '--schema', schema],
    )
