"""The journal a CLI command works on: found from `--journal`, opened without creating anything, always closed.

A mistyped path or DSN must be reported, never become an empty journal, so a directory must already hold
a journal database and a PostgreSQL schema its tables. Every failure a command meets becomes a
`Failure`: one line on stderr and an exit code, never a traceback, with a DSN's password scrubbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .._errors import JournalError
from ..journals import (
    DATABASE,
    KEYS_VARIABLE,
    DiskJournal,
    Encryption,
    Journal,
    default_directory,
    mask_dsn,
    reseal,
    scrub,
)

__all__ = ('EXIT_NOT_FOUND', 'EXIT_OK', 'EXIT_USAGE', 'Failure', 'Target', 'open_target', 'run_on')

EXIT_OK = 0
EXIT_NOT_FOUND = 1
"""An unknown execution key, a missing journal, or a journal that cannot be opened or written."""
EXIT_USAGE = 2
"""What argparse uses for a bad command line; a bad `--older-than` or `--schema` is one too."""

_T = TypeVar('_T')

_DSN_URL_PREFIXES = ('postgresql://', 'postgres://')
_DSN_KEYWORDS = re.compile(r'^\s*[A-Za-z_]+\s*=')


class Failure(Exception):
    """A reason to stop with a one-line message and an exit code, never a traceback."""

    def __init__(self, message: str, code: int = EXIT_NOT_FOUND) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Target:
    """The journal to work on, and how to name it in messages (a DSN without its password)."""

    journal: Journal
    label: str
    dsn: str | None = None
    """The PostgreSQL DSN, whose password must be scrubbed from every error text shown."""
    keys: Encryption | None = None
    """The keys of `$PYDANTIC_AI_DURABLE_KEYS`, if set: `import` decides itself what it seals with them."""
    exists: bool = True
    """False for the journal `import` is about to create: nothing is stored there, and nothing is opened early."""

    def clean(self, text: str) -> str:
        return scrub(text, self.dsn) if self.dsn is not None else text


def _is_dsn(value: str) -> bool:
    if value.startswith(_DSN_URL_PREFIXES):
        return True
    return bool(_DSN_KEYWORDS.match(value)) and not os.path.lexists(value)


def _one_line(exc: BaseException) -> str:
    text = ' '.join(part.strip() for part in str(exc).splitlines() if part.strip())
    return f'{type(exc).__name__}: {text}' if text else type(exc).__name__


def open_target(
    value: str | None, schema: str | None, *, rekeying: bool = False, decrypt: bool = False, creating: bool = False
) -> Target:
    """The journal `--journal` names, with the keys of `$PYDANTIC_AI_DURABLE_KEYS` if set (EN-5).

    Without keys, sealed values are shown as such; `rekey` needs them, and also reads plain values (with
    `decrypt` it writes them back plain). `creating` (for `import`, which writes an execution anyway) lets a
    journal that does not exist yet be made.
    """
    encryption = _keys(required=rekeying)
    target = _open(value, schema, creating=creating)
    if rekeying:
        reseal(target.journal, encryption, 'decrypt' if decrypt else 'migrate')
    else:
        reseal(target.journal, encryption, 'strict' if encryption is not None else 'show')
    target.keys = encryption
    return target


def _keys(*, required: bool) -> Encryption | None:
    if not os.environ.get(KEYS_VARIABLE, '').strip():
        if required:
            raise Failure(
                f'rekey needs the keys in ${KEYS_VARIABLE} ("id:base64key,id:base64key", the new current key '
                'first, then every key the journal may still be sealed with)',
                EXIT_USAGE,
            )
        return None
    try:
        return Encryption.from_env()
    except (ValueError, ImportError) as exc:
        raise Failure(str(exc), EXIT_USAGE) from None


def _open(value: str | None, schema: str | None, *, creating: bool) -> Target:
    if value is not None and _is_dsn(value):
        return _postgres_target(value, schema, creating=creating)
    if schema is not None:
        raise Failure('--schema applies only to a PostgreSQL journal (a DSN in --journal)', EXIT_USAGE)
    path = Path(value) if value is not None else default_directory()
    label = repr(str(path))
    # Only the errors name the default, so a user who meant another journal learns how to choose it.
    where = label if value is not None else f'{label} (the default journal; set --journal or PYDANTIC_AI_DURABLE_DIR)'
    try:
        if creating and not path.exists():
            return Target(DiskJournal(path), label, exists=False)
        if not path.exists():
            raise Failure(f'no journal at {where}: the directory does not exist')
        if not path.is_dir():
            raise Failure(f'no journal at {where}: it is a file, not a journal directory')
        if not (path / DATABASE).is_file():
            raise Failure(f'no journal at {where}: the directory holds no {DATABASE}')
    except OSError as exc:
        raise Failure(f'cannot open the journal {where}: {_one_line(exc)}') from None
    return Target(DiskJournal(path), label)


def _postgres_target(dsn: str, schema: str | None, *, creating: bool) -> Target:
    try:
        from ..journals import PostgresJournal

        journal = PostgresJournal(dsn) if schema is None else PostgresJournal(dsn, schema=schema)
    except ImportError as exc:
        raise Failure(_one_line(exc)) from None
    except ValueError as exc:
        raise Failure(str(exc), EXIT_USAGE) from None
    label = f'{mask_dsn(dsn)!r} (schema {journal.schema!r})'
    # PostgresJournal creates its schema on first use; looking first keeps a typo from creating one, and an
    # import from opening a journal it would refuse to write.
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        timeout = {} if 'connect_timeout' in conninfo_to_dict(dsn) else {'connect_timeout': '10'}
        quoted = '"' + journal.schema.replace('"', '""') + '"'
        with psycopg.connect(make_conninfo(dsn, **timeout), autocommit=True) as conn:
            row = conn.execute('SELECT to_regclass(%s) IS NOT NULL', (f'{quoted}.executions',)).fetchone()
    except Exception as exc:
        raise Failure(f'cannot open the journal {label}: {scrub(_one_line(exc), dsn)}') from None
    found = row is not None and bool(row[0])
    if not found and not creating:
        raise Failure(f'no journal at {label}: the schema holds no journal tables')
    return Target(journal, label, dsn, exists=found)


def run_on(target: Target, action: Callable[[Journal], Awaitable[_T]]) -> _T:
    """Run one command's journal calls on a fresh event loop, and always close the journal."""

    async def go() -> _T:
        try:
            return await action(target.journal)
        finally:
            with contextlib.suppress(Exception):  # a failing close must not hide the answer or the error
                await target.journal.close()

    try:
        return asyncio.run(go())
    except Failure:
        raise
    except JournalError as exc:
        raise Failure(target.clean(' '.join(str(exc).split()))) from None
    except Exception as exc:
        raise Failure(f'cannot read the journal {target.label}: {target.clean(_one_line(exc))}') from None
