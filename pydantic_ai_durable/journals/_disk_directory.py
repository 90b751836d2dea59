"""A disk journal's directory: opened only while it is the journal's, written only while it is the one opened.

A directory every user may write would let anyone plant entries a retry replays as recorded answers.
A database found empty, replaced or truncated beside the journal's id file means the recorded
steps are gone, and opening it as an empty journal would run them all again. A directory moved or
replaced while an attempt runs must not receive its writes. `DiskJournal` opens its cache through
`open_cache`, then checks the directory with `check_directory` and remembers its `place_of`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import uuid
from pathlib import Path
from typing import Any, Literal

from .._errors import JournalUnavailable
from . import _json
from ._disk_format import DATABASE, JournalCache
from ._files import looser_than, open_file

__all__ = ('Durability', 'check_directory', 'open_cache', 'place_of', 'safe_place')

log = logging.getLogger('pydantic_ai_durable')

Durability = Literal['process', 'power']

_INLINE = 2**40
"""Keep every value inside SQLite: diskcache writes large values to side files it never fsyncs."""

_SYNCHRONOUS: dict[Durability, int] = {'process': 1, 'power': 2}
"""SQLite `synchronous` per durability: NORMAL (a commit survives a process kill), FULL (also power loss)."""

_IDENTITY_KEY = 'journal'
"""The journal's id inside its database; the same id is kept in `_MARKER` beside it."""
_MARKER = 'journal-id'
_WARNED_GROUP_WRITABLE: set[str] = set()
"""Journal directories whose group write permission was reported, once per process."""


class _Cache(JournalCache):
    """The journal's diskcache: settings pinned, JSON text rows only, files made private (see `_disk_format`)."""


def open_cache(path: Path, durability: Durability, mode: int) -> Any:
    """The journal's cache in `path`, once the database there is proven to be this journal's or a new one."""
    _refuse_truncated_database(path)
    cache = _Cache(
        str(path),
        synchronous=_SYNCHRONOUS[durability],
        file_mode=mode,
        eviction_policy='none',
        cull_limit=0,  # nothing expires or is evicted, so skip diskcache's expiry query on every write
        disk_min_file_size=_INLINE,
        timeout=60,
    )
    try:
        _check_identity(path, mode, cache)
    except BaseException:
        cache.close()
        raise
    _warn_if_shared(path / DATABASE, mode)
    return cache


def check_directory(path: Path, mode: int, durability: Durability) -> None:
    """After opening: refuse a directory anyone may write, and make its entries durable for `"power"`."""
    _check_directory_mode(path, mode)
    if durability == 'power':  # the database file's name, and the directory's own
        _sync_directory(path)
        _sync_directory(path.absolute().parent)


def place_of(path: Path) -> tuple[int, int]:
    """The directory's device and inode: what tells it from another directory later put at its path."""
    found = os.stat(path)
    return found.st_dev, found.st_ino


def safe_place(path: Path) -> tuple[int, int] | None:
    try:
        return place_of(path)
    except OSError:
        return None


def _sync_directory(path: Path) -> None:
    """Flush a directory's entries, so a file or directory just created in it survives power loss."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not a directory we can open (e.g. on Windows): nothing more we can do
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_directory_mode(path: Path, mode: int) -> None:
    """Refuse a directory every user may write; say once when its group may write it unasked (B-16)."""
    try:
        bits = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    if bits & 0o002:
        raise JournalUnavailable(
            f'The journal directory {str(path)!r} can be written by every user (mode {bits:#o}): anyone '
            'could plant entries there that a retry would replay as recorded model answers and tool results. '
            f'Run `chmod o-w {str(path)!r}`; to share a journal, give a group access (mode 2770) and pass '
            'DiskJournal(mode=0o660). No model was called.'
        )
    where = os.path.realpath(path)
    if bits & 0o020 and not mode & 0o020 and where not in _WARNED_GROUP_WRITABLE:
        _WARNED_GROUP_WRITABLE.add(where)
        log.warning(
            'The journal directory %r can be written by its group (mode %#o) while the journal keeps its files '
            'private (mode %#o): members of the group could plant entries that replay. If it is shared on '
            'purpose, pass DiskJournal(mode=0o660); otherwise run `chmod g-w %s`.',
            str(path),
            bits,
            mode,
            str(path),
        )


def _lost_store(path: Path, what: str) -> JournalUnavailable:
    return JournalUnavailable(
        f'The journal {str(path)!r}: {what}. Opening it as an empty journal would run every recorded '
        'step again, so it is refused: restore the directory from a backup, or move it aside to start a new '
        'journal there.'
    )


def _refuse_truncated_database(path: Path) -> None:
    """A zero-length database where a journal was is a lost one: SQLite would start an empty one over it.

    Without the id file beside it, an empty database is a creation that was interrupted (the file is
    made with its mode first, then initialised), so it is simply created.
    """
    database = path / DATABASE
    with contextlib.suppress(OSError):
        if database.is_file() and database.stat().st_size == 0 and (path / _MARKER).exists():
            raise _lost_store(path, f'its database {str(database)!r} is empty (zero bytes; truncated?)')


def _check_identity(path: Path, mode: int, cache: Any) -> None:
    """Tell a new journal from one whose database was lost or replaced (JF-4).

    A random id is stored both inside the database and in a file beside it: a fresh database next
    to an existing id file, or one holding another journal's id, means the entries are gone.
    """
    marker = path / _MARKER
    try:
        recorded: str | None = marker.read_text(encoding='ascii').strip()
    except FileNotFoundError:
        recorded = None
    except OSError as exc:
        raise JournalUnavailable(f'The journal {str(path)!r} cannot be read ({exc}).') from exc
    stored = _json.loads(cache.get(_IDENTITY_KEY))
    if recorded is not None and stored != recorded:
        if stored is None:
            raise _lost_store(path, 'its database holds nothing of the journal that was here (created anew?)')
        raise _lost_store(path, "its database is another journal's (copied over it?)")
    if stored is None:
        if recorded is None and next(iter(_value_files(path)), None) is not None:
            raise _lost_store(path, 'its database is empty but the directory still holds value files')
        cache.add(_IDENTITY_KEY, _json.dumps(uuid.uuid4().hex))  # add: a concurrent creator's id wins
        stored = _json.loads(cache.get(_IDENTITY_KEY))
    if recorded is None and isinstance(stored, str):
        temporary = marker.with_name(f'{_MARKER}.{os.getpid()}.tmp')
        with contextlib.suppress(OSError):  # a directory we may not write is refused by the probe
            fd = open_file(temporary, mode, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, (stored + '\n').encode('ascii'))
            finally:
                os.close(fd)
            os.replace(temporary, marker)


def _value_files(path: Path) -> Any:
    """Files diskcache would have written values to (`ab/cd/<name>.val`), if any are left."""
    return path.glob('[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]/*.val')


def _warn_if_shared(database: Path, file_mode: int) -> None:
    """One WARNING when the database grants others more than the journal's mode (made before files were private)."""
    loose = [(path, bits) for path in _database_files(database) if (bits := looser_than(path, file_mode)) is not None]
    if not loose:
        return
    shown = ', '.join(f'{path.name} ({bits:#o})' for path, bits in loose)
    log.warning(
        'The journal %r: %s can be read or written by other users, more than the journal mode %s allows; '
        'they keep recorded prompts, model answers and tool results. If it is not shared on purpose, run '
        "`chmod %o %s` (journals made before pydantic-ai-durable created its files private got the umask's "
        'mode); if it is, pass DiskJournal(mode=...) to match.',
        str(database.parent),
        shown,
        f'{file_mode:#o}',
        file_mode,
        ' '.join(str(path) for path, _ in loose),
    )


def _database_files(database: Path) -> list[Path]:
    return [database, database.with_name(database.name + '-wal'), database.with_name(database.name + '-shm')]
