"""Files and directories of a journal, created with the journal's own permissions whatever the umask.

A journal holds prompts, model answers and tool results, so under the usual umask 022 it must not come
out world-readable. The mode is given as the files' mode (`0o600` by default); directories get the
same bits plus the search bit wherever the file mode grants read or write, so `0o660` means a group
share with `0o770` directories. Modes are applied when a path is created and never to one that
exists: a journal someone shared on purpose is not tightened behind their back. Files are removed
relative to directory descriptors, never through a symbolic link (`remove_inside`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import os.path as op
import secrets
import stat
from pathlib import Path

__all__ = (
    'CONFINABLE',
    'DEFAULT_MODE',
    'check_database_files',
    'check_mode',
    'create_database',
    'directory_mode',
    'looser_than',
    'make_directory',
    'make_file',
    'open_file',
    'remove_inside',
)

DEFAULT_MODE = 0o600
"""Files only their owner can read and write, in directories only the owner can enter (`0o700`)."""

_NOFOLLOW = getattr(os, 'O_NOFOLLOW', 0)
CONFINABLE = (
    {os.open, os.unlink, os.rmdir} <= os.supports_dir_fd and hasattr(os, 'O_DIRECTORY') and hasattr(os, 'O_NOFOLLOW')
)
"""Whether `remove_inside` can work here: relative to directory descriptors, never through a symbolic link."""


def check_mode(mode: object) -> int:
    """`mode` if it is a file mode a journal can work with; a `ValueError` or `TypeError` saying why not."""
    if type(mode) is not int:
        raise TypeError(f'DiskJournal mode must be an int such as 0o600 or 0o660, not {mode!r}.')
    if not 0 <= mode <= 0o777:
        raise ValueError(f'DiskJournal mode must be permission bits between 0o000 and 0o777, not {mode:#o}.')
    if mode & 0o600 != 0o600:
        raise ValueError(f'DiskJournal mode must let its owner read and write (0o600 at least), not {mode:#o}.')
    return mode


def directory_mode(file_mode: int) -> int:
    """The mode of a directory holding files of `file_mode`: read or write access implies search (x)."""
    bits = file_mode & 0o777
    for shift in (6, 3, 0):
        if bits >> shift & 0o6:
            bits |= 0o1 << shift
    return bits


def make_directory(path: Path, file_mode: int = DEFAULT_MODE) -> None:
    """Create `path` and any missing parent with `directory_mode(file_mode)` exactly; existing ones stay as they are.

    Each level is made by `mkdir` (the umask can only take bits away, so nothing is ever more open than
    asked, even for an instant) and then set to the exact mode, in case the umask took away some that
    were asked for.
    """
    wanted = directory_mode(file_mode)
    missing: list[Path] = []
    level = path
    while not level.is_dir():
        missing.append(level)
        if level.parent == level:
            break
        level = level.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, wanted)
        except FileExistsError:
            if directory.is_dir():
                continue  # another process made it first; its mode is its creator's choice
            raise
        os.chmod(directory, wanted)


def open_file(path: Path, file_mode: int = DEFAULT_MODE, flags: int = os.O_RDWR) -> int:
    """A file descriptor on the regular file `path`, created with exactly `file_mode` if it is missing.

    A symbolic link is refused (`OSError`) instead of followed, so nobody who can write the directory can
    point a journal file at another of the user's files. An existing file keeps its mode. Never for a
    database file: see `make_file`.
    """
    if os.path.islink(path):  # O_NOFOLLOW below closes the race; this check gives the clear message
        raise OSError(errno.ELOOP, 'a journal file must not be a symbolic link', str(path))
    base = flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC)
    try:
        return _create(path, file_mode, base)
    except FileExistsError:
        fd = os.open(path, base | _NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f'{str(path)!r} is not a regular file')
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_file(path: Path, file_mode: int = DEFAULT_MODE) -> bool:
    """Create the empty file `path` with exactly `file_mode`, and hold no descriptor of it once it has its name.

    For a database file: on POSIX, closing any descriptor of a file releases every fcntl lock the process
    holds on it, SQLite's included, and a connection of this process may open the file as soon as it has
    its name. So the file is made under a temporary name beside `path`, given its mode and closed, then
    linked to `path`; a link never replaces, so a file that is there already (another process made it
    meanwhile, or it is a link) is kept and `False` returned. On a file system without hard links the
    file is created in place with `O_EXCL`, so the descriptor closed is only ever of a file this call
    just made.
    """
    temporary = path.with_name(f'.{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp')
    os.close(_create(temporary, file_mode, os.O_RDONLY))
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    except OSError:  # no hard links on this file system (EPERM, ENOTSUP): create it in place
        try:
            os.close(_create(path, file_mode, os.O_RDONLY))
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return True


def _create(path: Path, file_mode: int, flags: int) -> int:
    """A descriptor of a new file at `path`, made with exactly `file_mode`; `FileExistsError` if anything is there."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, file_mode)
    try:  # the umask may have taken away bits that were asked for
        if hasattr(os, 'fchmod'):
            os.fchmod(fd, file_mode)
        else:  # pragma: no cover - Windows before Python 3.13
            os.chmod(path, file_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def looser_than(path: Path, file_mode: int) -> int | None:
    """The permission bits of `path` if they grant anyone more than `file_mode` does, else `None` (also if absent)."""
    try:
        bits = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    return bits if bits & ~file_mode & 0o777 else None


def remove_inside(root: str, first: str, second: str, name: str) -> None:
    """Remove `root/first/second/name` and then its two directories if emptied, never following a symbolic link."""
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


def create_database(database: Path, file_mode: int) -> None:
    """Make `cache.db` with the journal's mode if it is missing, and refuse journal files that are not files (J-9).

    No descriptor of `cache.db` is ever opened here, not even for a moment: on POSIX, closing any
    descriptor of a file releases every fcntl lock the process holds on it, SQLite's own included, so
    another `DiskJournal` of this process, or another thread's connection, would lose its locks and a
    process beside it could checkpoint and reset the write-ahead log under them ("database disk image
    is malformed"). A missing file is made under a temporary name and linked into place (`make_file`);
    an existing one is only looked at (`lstat`), never opened.
    """
    if not op.lexists(database):
        make_file(database, file_mode)
    check_database_files(database)


def check_database_files(database: Path) -> None:
    """Refuse a database that is a symbolic link or not a regular file, and `-wal` or `-shm` links.

    A link could point the journal at another of the user's files. SQLite opens these files by name, so
    a link put in place between this check and its open is caught by the same check after it; the
    directory itself is private or refused (B-16), so only its owner could race it.
    """
    found = os.lstat(database)
    if stat.S_ISLNK(found.st_mode):
        raise OSError(errno.ELOOP, 'a journal file must not be a symbolic link', str(database))
    if not stat.S_ISREG(found.st_mode):
        raise OSError(f'{str(database)!r} is not a regular file')
    for companion in ('-wal', '-shm'):
        if op.islink(f'{database}{companion}'):
            raise OSError(f'{str(database) + companion!r} is a symbolic link; a journal file must not be one')
