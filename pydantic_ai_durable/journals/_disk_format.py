"""DiskJournal's storage format: rows of JSON text that reading can never turn into code (J-8).

diskcache's own `Disk` unpickles every row whose `mode` column says pickle and every key whose `raw`
flag is off, reads and deletes whatever side file a row's `filename` names, and `Cache` applies whatever
its `Settings` table holds (SQLite pragmas, eviction, even attributes of the cache object). `cache.db`
is a file, so anyone who can write the journal directory can plant any of that. This format accepts
exactly what the journal writes and treats everything else as data that does not decode:

- Keys are `str`, stored as they are (`raw = 1`). Any other key reads as `BAD_KEY`, which no listing
  of the backend takes for one of its keys; it is never unpickled.
- Values are JSON text kept inline as SQLite TEXT in diskcache's `MODE_RAW`. `_json.dumps` writes
  ASCII only, so the column holds exactly the JSON bytes; storing Python `bytes` instead would only
  turn the column into a BLOB and make every journal written so far unreadable, since 0.1.0 wrote this
  very representation through diskcache's default `Disk`. A row in any other mode, with a side file or
  of another SQLite type reads as `BAD_VALUE`, which every decoder of the backend takes for a value
  that does not decode: a miss the core reports once (B-3), never loaded. Keys and side files the
  core never sees are reported here instead, once per kind, since this package never writes them.
- A side file is deleted only when its name has diskcache's own shape and it is reached inside the
  directory without following a symbolic link; its emptied subdirectories go with it, nothing above.
- Every setting is pinned by whoever opens the journal, `Settings` rows this version does not know
  are ignored, and every connection runs with `trusted_schema=OFF`, so a planted trigger or view
  cannot call an SQL function that has side effects.
"""

from __future__ import annotations

import contextlib
import logging
import os
import os.path as op
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import diskcache  # type: ignore[import-untyped]

from ._files import DEFAULT_MODE, looser_than, make_directory, open_file

__all__ = ('BAD_KEY', 'BAD_VALUE', 'JournalCache', 'JournalDisk')

log = logging.getLogger('pydantic_ai_durable')

_core = diskcache.core
MODE_RAW: int = _core.MODE_RAW
_MODES = {_core.MODE_BINARY: 'binary data', _core.MODE_TEXT: 'a text file', _core.MODE_PICKLE: 'a pickle'}
_SIDE_FILE = re.compile(r'([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{28}\.val)')
"""The only side-file name diskcache generates (`Disk.filename`): two levels of hex directories."""
_CONFINABLE = (
    {os.open, os.unlink, os.rmdir} <= os.supports_dir_fd and hasattr(os, 'O_DIRECTORY') and hasattr(os, 'O_NOFOLLOW')
)
"""Whether side files can be removed relative to directory descriptors, never through a symbolic link."""


class _Bad:
    """What a refused row reads as: neither text nor bytes, so no decoder of the backend accepts it."""

    __slots__ = ('_what',)

    def __init__(self, what: str) -> None:
        self._what = what

    def __repr__(self) -> str:
        return f'<{self._what} refused by the journal format>'


BAD_KEY = _Bad('key')
BAD_VALUE = _Bad('value')


class JournalDisk(diskcache.Disk):  # type: ignore[misc]
    """The `Disk` of a journal: `str` keys, JSON text values inside the database, nothing else."""

    def __init__(self, directory: str, **ignored: Any) -> None:
        # `disk_*` rows of the Settings table arrive here as keywords; none of them means anything to
        # this format, and a planted one must not be able to break opening.
        super().__init__(directory)
        self._reported: set[str] = set()

    def _refuse(self, what: str, level: int = logging.WARNING) -> None:
        """Say once per kind why a row was refused: at `level`, DEBUG where the core reports the miss itself."""
        kind = what.split(' (', 1)[0]
        if kind in self._reported:
            return
        self._reported.add(kind)
        log.log(
            level,
            'The journal %r holds a row stored as %s. This version keeps every key and value as plain JSON '
            'text inside cache.db and never loads anything else (a pickle could run code), so the row is '
            'ignored. pydantic-ai-durable never writes such a row: check who else can write to this '
            'directory. Further rows of this kind are not reported.',
            self._directory,
            what,
        )

    # diskcache has no type hints; pyright infers its methods' return types from their bodies.
    def put(self, key: Any) -> tuple[str, bool]:  # pyright: ignore[reportIncompatibleMethodOverride]
        if type(key) is not str:
            raise TypeError(f'DiskJournal keys are str, not {type(key).__name__}.')
        return key, True

    def get(self, key: Any, raw: bool) -> Any:
        if raw and type(key) is str:
            return key
        self._refuse('a pickled key' if not raw else f'a key of type {type(key).__name__}')
        return BAD_KEY

    def store(  # pyright: ignore[reportIncompatibleMethodOverride]
        self, value: Any, read: bool, key: Any = _core.UNKNOWN
    ) -> tuple[int, int, None, str]:
        if read or type(value) is not str:
            raise TypeError(f'DiskJournal stores JSON text only, not {type(value).__name__}.')
        return 0, MODE_RAW, None, value

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == MODE_RAW and filename is None and not read and type(value) is str:
            return value
        # The core reports the value that does not decode once (B-3); a second WARNING would be noise.
        if filename is not None:
            self._refuse(f'a value in a side file ({filename!r})', logging.DEBUG)
        elif mode != MODE_RAW:
            self._refuse(_MODES.get(mode, f'diskcache mode {mode!r}'), logging.DEBUG)
        else:
            self._refuse(f'a value of type {type(value).__name__}', logging.DEBUG)
        return BAD_VALUE

    def filename(self, key: Any = _core.UNKNOWN, value: Any = _core.UNKNOWN) -> tuple[str, str]:
        raise TypeError('DiskJournal keeps every value inside its database; it never writes a side file.')

    def remove(self, file_path: Any) -> None:
        """Delete the side file of a row that was replaced or deleted, if it is one diskcache could have made.

        A row names its file; a planted row could name `/home/user/.ssh/id_rsa`, `../x` or `cache.db`
        itself. Only a name of diskcache's own shape is removed, relative to directory descriptors opened
        without following links, and only its own two subdirectories are removed when emptied.
        """
        if file_path is None:
            return
        match = _SIDE_FILE.fullmatch(file_path) if isinstance(file_path, str) else None
        if match is None or not _CONFINABLE:
            self._refuse(f'a side file ({file_path!r})')
            return
        first, second, name = match.groups()
        _remove_inside(self._directory, first, second, name)


def _remove_inside(root: str, first: str, second: str, name: str) -> None:
    search = os.O_RDONLY | os.O_DIRECTORY
    opened: list[int] = []
    try:
        top = os.open(root, search)
        opened.append(top)
        outer = os.open(first, search | os.O_NOFOLLOW, dir_fd=top)
        opened.append(outer)
        inner = os.open(second, search | os.O_NOFOLLOW, dir_fd=outer)
        opened.append(inner)
    except OSError:  # missing, or a symbolic link where a directory should be: nothing of ours to remove
        for fd in reversed(opened):
            os.close(fd)
        return
    try:
        # Suppressed like diskcache does: two openers may remove the same file at the same time.
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=inner)  # a link is removed itself, never what it points to
        with contextlib.suppress(OSError):
            os.rmdir(second, dir_fd=outer)
        with contextlib.suppress(OSError):
            os.rmdir(first, dir_fd=top)
    finally:
        for fd in reversed(opened):
            os.close(fd)


_DEFAULTS: dict[str, Any] = {
    **_core.DEFAULT_SETTINGS,
    'eviction_policy': 'none',
    'cull_limit': 0,
    'disk_min_file_size': 2**40,
}
"""Every diskcache setting a journal runs with; the opener may choose others, the database never does."""


class JournalCache(diskcache.Cache):  # type: ignore[misc]
    """A diskcache over a journal directory that only its opener configures.

    diskcache applies every row of its `Settings` table: at open, and again for each new SQLite
    connection (one per thread and per process). A planted row could turn on `query_only` (nothing is
    recorded any more), turn off the rollback journal, evict every entry, or set an attribute of the
    cache object such as its directory. Here every known setting takes the opener's value whatever
    the table says, unknown rows are ignored, and `durability="power"` keeps `synchronous=FULL` even
    after another opener of the directory (the CLI, an older release) rewrote the table.

    The directory, its missing parents and `cache.db` are created with `file_mode` (see `_files`)
    before SQLite opens anything, so the database and the `-wal` and `-shm` files SQLite gives the same
    mode are never readable by others, even for an instant.
    """

    def __init__(
        self, directory: str, *, synchronous: int, file_mode: int = DEFAULT_MODE, timeout: float = 60, **settings: Any
    ) -> None:
        unknown = sorted(set(settings) - set(_DEFAULTS))
        if unknown:
            raise TypeError(f'not diskcache settings: {unknown}')
        self._pinned: dict[str, Any] = {**_DEFAULTS, **settings, 'sqlite_synchronous': synchronous}
        # diskcache expands `~` and `$VARS` in the directory; create exactly the one it will open.
        target = Path(op.expandvars(op.expanduser(str(directory))))
        make_directory(target, file_mode)
        database = target / _core.DBNAME
        for companion in ('-wal', '-shm'):
            if op.islink(f'{database}{companion}'):
                raise OSError(f'{str(database) + companion!r} is a symbolic link; a journal file must not be one')
        os.close(open_file(database, file_mode, os.O_RDONLY))
        super().__init__(directory, timeout=timeout, disk=JournalDisk, **self._pinned)  # pyright: ignore[reportArgumentType]
        _warn_if_shared(database, file_mode)

    def reset(self, key: str, value: Any = _core.ENOVAL, update: bool = True) -> Any:
        if key in self._pinned:
            if value is _core.ENOVAL:  # asked to reload: the opener's value, not what the table holds now
                setattr(self, key, self._pinned[key])
                return self._pinned[key]
            return super().reset(key, self._pinned[key], update)
        if key in _core.METADATA:  # counters (count, size, hits, misses): harmless, read as diskcache does
            return super().reset(key, value, update)
        return None  # a Settings row this version does not know is never applied

    # The two calls below run on every step a journal records. They read and write the very rows
    # `get` and `set` would, as one indexed statement each instead of diskcache's several with their
    # bookkeeping, which made up most of a fenced write's cost; anything unusual takes `set`'s path.

    def read_text(self, key: str) -> Any:
        """What `get(key)` returns (the row's JSON text, `BAD_VALUE` or `None`), in one SELECT."""
        row = self._con.execute(
            'SELECT mode, filename, value FROM Cache'
            ' WHERE key = ? AND raw = 1 AND (expire_time IS NULL OR expire_time > ?)',
            (key, time.time()),
        ).fetchone()
        if row is None:
            return None
        mode, filename, value = row
        if mode == MODE_RAW and filename is None and type(value) is str:
            return value
        return self._disk.fetch(mode, filename, value, False)  # refused, and reported, as `get` does

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[Callable[[], None]]:
        """A savepoint in the open transaction; calling what it yields undoes what was written since (CC-9)."""
        execute = self._con.execute
        execute('SAVEPOINT journal_write')

        def rollback() -> None:
            execute('ROLLBACK TO journal_write')

        try:
            yield rollback
        finally:
            execute('RELEASE journal_write')

    def put_text(self, key: str, text: str) -> None:
        """What `set(key, text)` does, in one UPDATE when the row exists and has no side file to remove."""
        if type(text) is not str:
            raise TypeError(f'DiskJournal stores JSON text only, not {type(text).__name__}.')
        now = time.time()
        updated = self._con.execute(
            'UPDATE Cache SET store_time = ?, expire_time = NULL, access_time = ?, access_count = 0, tag = NULL,'
            ' size = 0, mode = ?, value = ? WHERE key = ? AND raw = 1 AND filename IS NULL',
            (now, now, MODE_RAW, text, key),
        ).rowcount
        if updated != 1:
            self.set(key, text)  # a new row, or one whose side file `set` removes (confined, see `remove`)

    def keys_between(self, low: str, high: str, *, limit: int) -> list[str]:
        """Up to `limit` keys `low <= key < high`, in order, through the key index (no scan of the journal)."""
        rows = self._con.execute(
            'SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1 ORDER BY key LIMIT ?', (low, high, limit)
        ).fetchall()
        return [key for (key,) in rows if isinstance(key, str)]

    def rows(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read-only statement (the listing's, `_disk_listing`), on the hardened connection."""
        return self._con.execute(statement, params).fetchall()

    def add_index(self, statement: str) -> bool:
        """Run one `CREATE INDEX IF NOT EXISTS`; `False` when the database cannot take it (read-only, busy)."""
        try:
            self._con.execute(statement)
        except sqlite3.Error as exc:
            log.debug('creating an index of the journal failed: %r', exc)
            return False
        return True

    def entry_sizes(self) -> dict[tuple[str, str], tuple[int, int]]:
        """How many entries, and how many bytes of JSON text, each `(execution digest, run)` holds: one scan.

        A listing needs the counts of every execution (WT-1: ten thousand waiting ones list in under a
        second); reading each position a head reserves would cost tens of reads per execution.
        """
        rows = self._con.execute(
            "SELECT key, CASE WHEN mode = ? AND filename IS NULL AND typeof(value) = 'text' THEN length(value)"
            " ELSE 0 END FROM Cache WHERE key GLOB '*/e/*' AND raw = 1",
            (MODE_RAW,),
        ).fetchall()
        sizes: dict[tuple[str, str], tuple[int, int]] = {}
        for key, size in rows:
            parts = key.split('/') if isinstance(key, str) else []
            if len(parts) != 4 or parts[1] != 'e':
                continue
            place = (parts[0], parts[2])
            count, total = sizes.get(place, (0, 0))
            sizes[place] = (count + 1, total + int(size or 0))
        return sizes

    def execution_rows(self, suffix: str) -> dict[str, Any]:
        """Every execution's row `<eid>/<suffix>` (head `h`, record `x`, lease `l`) by digest, in one scan."""
        rows = self._con.execute(
            'SELECT key, mode, filename, value FROM Cache WHERE key GLOB ? AND raw = 1', (f'*/{suffix}',)
        ).fetchall()
        found: dict[str, Any] = {}
        for key, mode, filename, value in rows:
            if not isinstance(key, str) or key.count('/') != 1:
                continue
            ok = mode == MODE_RAW and filename is None and type(value) is str
            found[key.split('/', 1)[0]] = value if ok else self._disk.fetch(mode, filename, value, False)
        return found

    def report_foreign_keys(self) -> None:
        """Report (once per kind) a row whose key this format never writes: listing used to meet it key by key."""
        row = self._con.execute("SELECT key, raw FROM Cache WHERE raw != 1 OR typeof(key) != 'text' LIMIT 1").fetchone()
        if row is not None:
            self._disk.get(row[0], bool(row[1]))  # refuses it, never loads it (a pickled key is not unpickled)

    def leases_naming(self, fragment: str, *, besides: str) -> bool:
        """Whether a lease row (`<eid>/l`) other than `besides` holds `fragment`, a holder's process token."""
        row = self._con.execute(
            "SELECT 1 FROM Cache WHERE key GLOB '*/l' AND key != ? AND raw = 1 AND instr(value, ?) > 0 LIMIT 1",
            (besides, fragment),
        ).fetchone()
        return row is not None

    @property
    def _con(self) -> sqlite3.Connection:
        con: sqlite3.Connection = super()._con
        if getattr(self._local, 'hardened', None) is not con:
            con.execute('PRAGMA trusted_schema = OFF')
            self._local.hardened = con
        return con


def _warn_if_shared(database: Path, file_mode: int) -> None:
    """One WARNING when the database grants others more than the journal's mode (e.g. a 0.1.0 journal)."""
    loose = [(path, bits) for path in _database_files(database) if (bits := looser_than(path, file_mode)) is not None]
    if not loose:
        return
    shown = ', '.join(f'{path.name} ({bits:#o})' for path, bits in loose)
    log.warning(
        'The journal %r: %s can be read or written by other users, more than the journal mode %s allows; '
        'they keep recorded prompts, model answers and tool results. If it is not shared on purpose, run '
        '`chmod %o %s` (files created by pydantic-ai-durable-journal 0.1.0 got the umask default); if it is, pass '
        'DiskJournal(mode=...) to match.',
        str(database.parent),
        shown,
        f'{file_mode:#o}',
        file_mode,
        ' '.join(str(path) for path, _ in loose),
    )


def _database_files(database: Path) -> list[Path]:
    return [database, database.with_name(database.name + '-wal'), database.with_name(database.name + '-shm')]
