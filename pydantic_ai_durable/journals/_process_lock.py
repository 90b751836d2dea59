"""A disk journal's liveness files: one lock file per process, kept locked while the process holds a lease.

A lease on disk names its holder, `host:pid:token:serial` (see `_holder`). Whether that holder's process
still lives is proved through a file the process keeps locked with `flock`: the kernel drops the lock
when the process dies, whatever pid namespace or container it ran in. One file serves every
lease a process holds in one journal directory, so a process running a thousand executions keeps
one descriptor, not a thousand.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import threading
from pathlib import Path

from .._runtime import process_token, token_of
from ._files import make_directory, open_file

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock files, so a dead holder is waited for
    fcntl = None  # type: ignore[assignment]

__all__ = ('LOCKS', 'drop_lock', 'hold_lock', 'lock_file', 'lockable')

LOCKS = 'locks'
"""The subdirectory of a journal holding its processes' lock files."""

_guard = threading.Lock()
_held: dict[str, list[int]] = {}
"""Per journal directory (real path): `[descriptor of this process's locked file, live holders using it]`."""


def lock_file(directory: Path, holder: str) -> Path | None:
    """Where `holder`'s process keeps its lock file, or `None` for a holder of another format."""
    token = token_of(holder)
    if token is None:
        return None
    name = hashlib.sha256(token.encode('utf-8', 'surrogatepass')).hexdigest()[:32]
    return directory / LOCKS / f'{name}.lock'


def hold_lock(directory: Path, mode: int) -> None:
    """Count one more live holder of this process in `directory`, locking the process's file for the first."""
    if fcntl is None:
        return
    where = os.path.realpath(directory)
    with _guard:
        held = _held.get(where)
        if held is not None:
            held[1] += 1
            return
        path = lock_file(directory, f'-:0:{process_token()}:0')
        assert path is not None
        make_directory(path.parent, mode)
        _held[where] = [_locked_in_place(path, mode), 1]


def _locked_in_place(path: Path, mode: int) -> int:
    """Lock a new file under a name of its own, then rename it to `path`: the file at `path` is locked from
    the moment it is there. Created in place, it was there unlocked for an instant, and another process
    checking it then took this live process for dead and kept the lock while this one failed to take it."""
    assert fcntl is not None
    fresh = path.with_name(f'{path.name}.{os.getpid()}.{secrets.token_hex(4)}')
    fd = open_file(fresh, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(fresh, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(fresh)
        raise
    return fd


def drop_lock(directory: Path) -> None:
    """Count one live holder less; the last one removes the process's file, then unlocks it."""
    if fcntl is None:
        return
    where = os.path.realpath(directory)
    with _guard:
        held = _held.get(where)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _held[where]
        path = lock_file(directory, f'-:0:{process_token()}:0')
        if path is not None:
            with contextlib.suppress(OSError):  # removed before unlocking: nobody takes a live file for dead
                os.unlink(path)
        os.close(held[0])


def lockable(path: Path) -> bool:
    """Whether the lock file at `path` exists and nobody keeps it locked: its process is gone."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0))
    except OSError:
        return False  # no lock file (removed by hand, another release): nothing proved, in doubt wait
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False  # locked: the process lives
        raise
    finally:
        os.close(fd)
    return True


def _forget_in_child() -> None:
    """A forked child must not keep its parent's files locked: the parent's death would look like life."""
    global _guard
    for fd, _ in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    _guard = threading.Lock()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_in_child)
