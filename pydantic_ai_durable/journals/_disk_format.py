"""DiskJournal's storage: the one module that talks to diskcache and to SQLite.

The rest of the disk journal gets a `JournalCache` and calls only diskcache's documented API on it and the
statements defined here, each with the reason diskcache's API does not do its job; nothing else in the
package imports diskcache or `sqlite3` (tests/test_layout.py). It opens only on the diskcache releases it
was tested with (`check_diskcache`), since it relies on parts that are not diskcache's documented API.

SQLite's locks stay SQLite's (J-9): nothing opens, closes or locks `cache.db`, `-wal` or `-shm` outside
SQLite (`_files.create_database`), since closing any descriptor of a file drops every lock the process
holds on it; a forked child closes the connections it inherited before it opens its own.

Rows that reading can never turn into code: `cache.db` is a file anyone who can write the directory
can plant rows in, and diskcache's own `Disk` would unpickle them, follow their side files and apply their
settings. This format accepts exactly what the journal writes: `str` keys stored raw (any other reads as
`BAD_KEY`, never unpickled), JSON text kept inline in `MODE_RAW` (any other row reads as `BAD_VALUE`, a
value that does not decode), side files removed only when their name has diskcache's own shape and
they lie inside the directory, every setting pinned by the opener, and `trusted_schema=OFF` on every
connection so a planted trigger or view cannot call an SQL function with side effects.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import os.path as op
import re
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import diskcache  # type: ignore[import-untyped]

from .._errors import JournalError
from ._files import CONFINABLE, DEFAULT_MODE, check_database_files, create_database, make_directory, remove_inside

__all__ = (
    'BAD_KEY',
    'BAD_VALUE',
    'DATABASE',
    'ENTRY_TOTALS',
    'LISTING_INDEXES',
    'TESTED_DISKCACHE',
    'JournalCache',
    'JournalDisk',
    'ListingSql',
    'NotJson',
    'lease_digests',
)

log = logging.getLogger('pydantic_ai_durable')

TESTED_DISKCACHE = ('5.6.3', '5.7')
"""The diskcache releases the journal was tested with: from the first, up to the second not included.

pyproject.toml bounds the dependency to the same range; a release outside it may store rows, or call the
`Disk` hooks below, differently, so a journal refuses to open on it.
"""
DATABASE = 'cache.db'
"""The database in a journal directory (diskcache's `DBNAME`)."""
MODE_RAW = 1
"""diskcache's storage mode for a value kept in its column as it is: the only one the journal writes."""
_MODES = {2: 'binary data', 3: 'a text file', 4: 'a pickle'}
"""diskcache's other storage modes (`MODE_BINARY`, `MODE_TEXT`, `MODE_PICKLE`), which are never loaded."""
_core = diskcache.core
_MISSING = object()
# Looked up without failing, so that a diskcache whose parts differ still imports and a journal can say
# what is wrong when it opens (`check_diskcache`).
_UNKNOWN = getattr(_core, 'UNKNOWN', None)
_ENOVAL = getattr(_core, 'ENOVAL', None)
_METADATA: dict[str, Any] = getattr(_core, 'METADATA', {})
_CORE = {'DBNAME': DATABASE, 'MODE_RAW': MODE_RAW, 'MODE_BINARY': 2, 'MODE_TEXT': 3, 'MODE_PICKLE': 4}
"""What `diskcache.core` must hold: the file name and the storage modes the journal's rows are written in."""
_PARTS = {
    'core': ('UNKNOWN', 'ENOVAL', 'DEFAULT_SETTINGS', 'METADATA'),
    'Disk': ('put', 'get', 'store', 'fetch', 'filename', 'remove'),
    'Cache': ('_con', 'reset', 'transact', 'get', 'set', 'add', 'delete', 'iterkeys', 'close'),
}
"""The other parts of diskcache the journal uses or overrides; a hook renamed would be silently bypassed."""
_COLUMNS = frozenset(('key', 'raw', 'mode', 'filename', 'value', 'size', 'tag', 'access_count')) | {
    f'{moment}_time' for moment in ('store', 'expire', 'access')
}
"""The columns of diskcache's `Cache` table that the statements below read or write."""
_SIDE_FILE = re.compile(r'([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{28}\.val)')
"""The only side-file name diskcache generates (`Disk.filename`): two levels of hex directories."""


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r'\d+', text)[:3])


def check_diskcache(directory: str) -> None:
    """Refuse to open a journal on a diskcache other than the releases it was tested with (J-10).

    Runs before anything is created or opened, so a mismatch leaves the directory as it was.
    """
    version = str(getattr(diskcache, '__version__', 'of an unknown version'))
    low, high = TESTED_DISKCACHE
    problems = [] if _release(low) <= _release(version) < _release(high) else ['is outside that range']
    for name, expected in _CORE.items():
        found = getattr(_core, name, _MISSING)
        if found is _MISSING:
            problems.append(f'has no diskcache.core.{name}')
        elif found != expected:
            problems.append(f'has diskcache.core.{name} = {found!r}, not {expected!r}')
    for owner, names in _PARTS.items():
        holder = _core if owner == 'core' else getattr(diskcache, owner)
        problems += [f'has no diskcache.{owner}.{name}' for name in names if not hasattr(holder, name)]
    if problems:
        raise _incompatible(directory, version, problems)


def _incompatible(directory: str, version: str, problems: list[str]) -> JournalError:
    low, high = TESTED_DISKCACHE
    return JournalError(
        f"The journal {directory!r} was not opened: DiskJournal reads and writes diskcache's database with "
        f'statements of its own, so it runs only on the diskcache releases it was tested with ({low} up to '
        f'{high}, not included), and the installed diskcache {version} {"; ".join(problems)}. Install a tested '
        f'release (pip install "diskcache>={low},<{high}"). No entry was read or written. (J-10)'
    )


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
        self, value: Any, read: bool, key: Any = _UNKNOWN
    ) -> tuple[int, int, None, str]:
        if read or type(value) is not str:
            raise TypeError(f'DiskJournal stores JSON text only, not {type(value).__name__}.')
        return 0, MODE_RAW, None, value

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == MODE_RAW and filename is None and not read and type(value) is str:
            return value
        # The core reports the value that does not decode once; a second WARNING would be noise.
        if filename is not None:
            self._refuse(f'a value in a side file ({filename!r})', logging.DEBUG)
        elif mode != MODE_RAW:
            self._refuse(_MODES.get(mode, f'diskcache mode {mode!r}'), logging.DEBUG)
        else:
            self._refuse(f'a value of type {type(value).__name__}', logging.DEBUG)
        return BAD_VALUE

    def filename(self, key: Any = _UNKNOWN, value: Any = _UNKNOWN) -> tuple[str, str]:
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
        if match is None or not CONFINABLE:
            self._refuse(f'a side file ({file_path!r})')
            return
        first, second, name = match.groups()
        remove_inside(self._directory, first, second, name)


_DEFAULTS: dict[str, Any] = {
    **getattr(_core, 'DEFAULT_SETTINGS', {}),
    'eviction_policy': 'none',
    'cull_limit': 0,
    'disk_min_file_size': 2**40,
}
"""Every diskcache setting a journal runs with; the opener may choose others, the database never does."""


class JournalCache(diskcache.Cache):  # type: ignore[misc]
    """A diskcache over a journal directory that only its opener configures.

    diskcache applies every row of its `Settings` table, at open and for each new connection: a planted
    row could turn on `query_only`, turn off the rollback journal, evict every entry or set an attribute of
    the cache. Here every known setting takes the opener's value, unknown rows are ignored, and
    `durability="power"` keeps `synchronous=FULL` whoever rewrote the table. Opening checks diskcache first
    (`check_diskcache`), then makes the directory and `cache.db` with `file_mode` before SQLite opens
    anything, so no journal file is ever readable by others, even for an instant.
    """

    def __init__(
        self, directory: str, *, synchronous: int, file_mode: int = DEFAULT_MODE, timeout: float = 60, **settings: Any
    ) -> None:
        unknown = sorted(set(settings) - set(_DEFAULTS))
        if unknown:
            raise TypeError(f'not diskcache settings: {unknown}')
        check_diskcache(str(directory))
        self._pinned: dict[str, Any] = {**_DEFAULTS, **settings, 'sqlite_synchronous': synchronous}
        # diskcache expands `~` and `$VARS` in the directory; create exactly the one it will open.
        target = Path(op.expandvars(op.expanduser(str(directory))))
        make_directory(target, file_mode)
        database = target / DATABASE
        create_database(database, file_mode)
        super().__init__(directory, timeout=timeout, disk=JournalDisk, **self._pinned)  # pyright: ignore[reportArgumentType]
        try:
            self._check_opened(database)
        except BaseException:
            self.close()
            raise
        _OPEN.add(self)

    def _check_opened(self, database: Path) -> None:
        """What can only be checked on an open cache: diskcache's own parts, and files that are still ours."""
        missing = [name for name in ('_local', '_disk') if not hasattr(self, name)]
        if not missing and not hasattr(self._disk, '_directory'):
            missing.append('_disk._directory')
        problems = [f'has no diskcache.Cache.{name} once opened' for name in missing]
        if not missing:
            # Why raw (compatibility): diskcache has no call that describes its table.
            columns = {row[1] for row in self._con.execute('PRAGMA table_info(Cache)').fetchall()}
            problems += [f'stores no column {name!r} in its Cache table' for name in sorted(_COLUMNS - columns)]
        if problems:
            raise _incompatible(str(self.directory), str(getattr(diskcache, '__version__', '?')), problems)
        check_database_files(database)  # SQLite opened the file by name: it must still be the one checked before

    def reset(self, key: str, value: Any = _ENOVAL, update: bool = True) -> Any:
        if key in self._pinned:
            if value is _ENOVAL:  # asked to reload: the opener's value, not what the table holds now
                setattr(self, key, self._pinned[key])
                return self._pinned[key]
            return super().reset(key, self._pinned[key], update)
        if key in _METADATA:  # counters (count, size, hits, misses): harmless, read as diskcache does
            return super().reset(key, value, update)
        return None  # a Settings row this version does not know is never applied

    # Every SQL statement the journal runs itself is in this class, each with why diskcache's API is not used.
    # `read_text` and `put_text` (speed): they run on every step a journal records, and read and write the
    # very rows `get` and `set` would, in one statement each instead of diskcache's several with their
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
        """A savepoint in the open transaction; calling what it yields undoes what was written since."""
        # Why raw (atomicity): `transact` nests without savepoints, so one refused write of a shared commit
        # could only roll back the whole commit, the other executions' writes with it.
        execute = self._con.execute
        execute('SAVEPOINT journal_write')

        def rollback() -> None:
            execute('ROLLBACK TO journal_write')

        try:
            yield rollback
        finally:
            execute('RELEASE journal_write')

    def put_text(self, key: str, text: str) -> None:
        """What `set(key, text)` leaves (the row, and diskcache's counts by its triggers), in one upsert."""
        if type(text) is not str:
            raise TypeError(f'DiskJournal stores JSON text only, not {type(text).__name__}.')
        now = time.time()
        written = self._con.execute(
            'INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,'
            ' filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, 0, ?, NULL, ?) ON CONFLICT (key, raw) DO UPDATE SET'
            ' store_time = excluded.store_time, expire_time = NULL, access_time = excluded.access_time, tag = NULL,'
            ' access_count = 0, size = 0, mode = excluded.mode, value = excluded.value WHERE filename IS NULL',
            (key, now, now, MODE_RAW, text),
        ).rowcount
        if written != 1:
            self.set(key, text)  # a row with a side file, which `set` removes (confined, see `remove`)

    def keys_between(self, low: str, high: str, *, limit: int) -> list[str]:
        """Up to `limit` keys `low <= key < high`, in order, through the key index (no scan of the journal)."""
        # Why raw (speed): `iterkeys` walks every key from the first; this reads one range of the index.
        rows = self._con.execute(
            'SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1 ORDER BY key LIMIT ?', (low, high, limit)
        ).fetchall()
        return [key for (key,) in rows if isinstance(key, str)]

    def rows(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read-only statement of the listing (`ListingSql`), on the hardened connection."""
        try:
            return self._con.execute(statement, params).fetchall()
        except sqlite3.OperationalError as exc:
            if 'JSON' in str(exc):
                raise NotJson(str(exc)) from exc
            raise

    def add_index(self, statement: str) -> bool:
        """Run one `CREATE INDEX IF NOT EXISTS`; `False` when the database cannot take it (read-only, busy)."""
        try:
            self._con.execute(statement)
        except sqlite3.Error as exc:
            log.debug('creating an index of the journal failed: %r', exc)
            return False
        return True

    def entry_lengths(self) -> list[tuple[Any, int]]:
        """Every entry row's key and the length of its JSON text (0 for a row this format refuses)."""
        # Why raw (speed): a listing needs every execution's step counts (ten thousand waiting ones in
        # under a second); reading each position a head reserves would cost tens of reads per execution.
        return self._con.execute(
            "SELECT key, CASE WHEN mode = ? AND filename IS NULL AND typeof(value) = 'text' THEN length(value)"
            " ELSE 0 END FROM Cache WHERE key GLOB '*/e/*' AND raw = 1",
            (MODE_RAW,),
        ).fetchall()

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
        # Why raw (speed): through the API, every key and every lease would be read into Python to look.
        row = self._con.execute(
            "SELECT 1 FROM Cache WHERE key GLOB '*/l' AND key != ? AND raw = 1 AND instr(value, ?) > 0 LIMIT 1",
            (besides, fragment),
        ).fetchone()
        return row is not None

    @property
    def _con(self) -> sqlite3.Connection:
        con: sqlite3.Connection = super()._con
        if getattr(self._local, 'hardened', None) is not con:
            # Why raw (safety): diskcache has no setting for it, and a connection must not run without it.
            con.execute('PRAGMA trusted_schema = OFF')
            self._local.hardened = con
        return con


_OPEN: weakref.WeakSet[JournalCache] = weakref.WeakSet()
"""Every cache of this process, so that a forked child can close the connections it inherited."""


def _close_inherited() -> None:
    """In a forked child: close every connection inherited from the parent, before the child opens its own.

    SQLite keeps, per process, which locks its connections hold on each file. A child inherits that record
    but not the locks, so a connection it opens on the same file takes the locks for held and holds none:
    once the parent closed its own, another process could reset the write-ahead log under the child. The
    forking thread's connections are closed here; those of the parent's other threads are unreachable
    garbage in the child (their threads are gone), closed by collecting it. The parent's locks are the
    parent's and are not touched. diskcache closes the first kind too, but only once a cache is used again.
    """
    if not _OPEN:
        return
    for cache in list(_OPEN):
        with contextlib.suppress(Exception):
            cache.close()
    gc.collect()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_close_inherited)


# -- the listing's statements ----------------------------------------------------------------------------------
# Why raw (speed): a page among 100,000 executions is counted and sorted by SQLite through two partial indexes;
# through the API every head, record and lease would be read into Python. `_disk_listing` runs them.

LISTING_INDEXES = (
    "CREATE INDEX IF NOT EXISTS journal_heads ON Cache(store_time, key, value) WHERE key GLOB '*/h'",
    "CREATE INDEX IF NOT EXISTS journal_leases ON Cache(key) WHERE key GLOB '*/l'",
)
_EID = 'substr(h.key, 1, length(h.key) - 2)'
"""A head's or a lease's row key less its `/h` or `/l`: the execution's digest."""


class NotJson(Exception):
    """A listing statement met a head that is not JSON: run it again built with `safe=True`."""


def _field(name: str, table: str, safe: bool) -> str:
    """A field of a row's JSON value; `safe` also reads a value that is not JSON (as `NULL`, never an error)."""
    extract = f"json_extract({table}.value, '$.{name}')"
    return f'CASE WHEN json_valid({table}.value) THEN {extract} END' if safe else extract


class ListingSql:
    """The statements of one page, over the heads matching `prefix` (or the one digest `eid`).

    `safe` builds them to read a head that is not JSON as `NULL`; they are slower, so a listing uses them
    only once it met such a head (`NotJson`). `params` go before each statement's own parameters.
    """

    def __init__(self, prefix: str, eid: str | None, safe: bool) -> None:
        self.safe = safe
        where: str = "h.key GLOB '*/h'"
        params: tuple[Any, ...] = ()
        if eid is not None:
            where, params = f'{where} AND h.key = ?', (f'{eid}/h',)
        if prefix:
            where, params = f'{where} AND substr({_field("key", "h", safe)}, 1, ?) = ?', (*params, len(prefix), prefix)
        self.params = params
        record = f"(SELECT {_field('status', 'x', True)} FROM Cache AS x WHERE x.key = {_EID} || '/x')"
        self.status = f'coalesce({_field("status", "h", safe)}, {record})'
        """A head's status, or its record's for a head written before heads carried it."""
        self.by_head = f'SELECT {_field("status", "h", safe)}, count(*) FROM Cache AS h WHERE {where} GROUP BY 1'
        self.by_record = (
            f'SELECT {record}, count(*) FROM Cache AS h WHERE {where} AND {_field("status", "h", safe)} IS NULL '
            'GROUP BY 1'
        )
        self.one = f'SELECT {self.status} FROM Cache AS h WHERE {where}'
        # Parameters after `params`: held digests (JSON), whether running is wanted, held digests again, the
        # statuses wanted (JSON), whether interrupted is wanted, every status a record says alone (JSON),
        # limit, offset.
        self.page = (
            f'SELECT eid, value FROM (SELECT {_EID} AS eid, h.value AS value, h.store_time AS t, h.key AS k, '
            f'{self.status} AS st FROM Cache AS h WHERE {where}) '
            'WHERE ((eid IN (SELECT value FROM json_each(?)) AND ?) '
            'OR (eid NOT IN (SELECT value FROM json_each(?)) AND (st IN (SELECT value FROM json_each(?)) '
            'OR (? AND (st IS NULL OR st NOT IN (SELECT value FROM json_each(?))))))) '
            'ORDER BY t DESC, k DESC LIMIT ? OFFSET ?'
        )


def lease_digests(indexed: bool) -> str:
    """The digests of every execution with a lease row, through the leases' index when it exists."""
    return f"SELECT {_EID} FROM Cache AS h {'INDEXED BY journal_leases ' if indexed else ''}WHERE h.key GLOB '*/l'"


ENTRY_TOTALS = 'SELECT count(*), coalesce(sum(length(value)), 0) FROM Cache WHERE key >= ? AND key < ?'
"""How many entries one execution holds and their bytes, given its range of keys: the key index, not a scan."""
