"""Lease holders: who an attempt is, and when a store may call a holder dead (B-5).

A holder is `host:pid:process-token:serial`. The process token is random per process (a forked child
gets a new one), so an attempt of this process is recognised by the token, never by a pid that
another pid namespace or a reboot can reuse. Whether a holder in another process is alive is
for each store to prove through the store itself (a lock the holder keeps, its database session);
whatever cannot be proved dead is waited for until its lease expires.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
import socket
import threading
import time

__all__ = (
    'boot_id',
    'end_holding',
    'is_proper',
    'is_this_process',
    'local_clock',
    'new_holder',
    'ours_and_ended',
    'process_token',
    'start_holding',
    'token_of',
)

_state = threading.Lock()
_live: set[str] = set()
_serial = itertools.count(1)
_token = secrets.token_hex(6)


def _new_process() -> None:
    """In a forked child: a process token of its own, and none of the parent's attempts."""
    global _token, _state
    _token = secrets.token_hex(6)
    _state = threading.Lock()
    _live.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_new_process)


def new_holder() -> str:
    """A holder name no other attempt, in this process or any other, has or will have."""
    return f'{socket.gethostname()}:{os.getpid()}:{_token}:{next(_serial)}'


def process_token() -> str:
    """This process's random token, the third part of every holder name it makes."""
    return _token


def token_of(holder: str) -> str | None:
    """The process token inside `holder`, or `None` for a name of another format (an older release)."""
    parts = holder.rsplit(':', 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[3].isdigit():
        return None  # another format (an older release): nothing can be proved about it
    return parts[2]


def is_this_process(holder: str) -> bool:
    return token_of(holder) == _token


def start_holding(holder: str) -> None:
    """Mark `holder` as an attempt of this process that is running (before its lease is taken)."""
    with _state:
        _live.add(holder)


def end_holding(holder: str) -> None:
    """Mark `holder` as ended: a lease it left behind (a release that failed) may be taken at once."""
    with _state:
        _live.discard(holder)


def ours_and_ended(holder: str) -> bool:
    """Whether `holder` is an attempt of this very process that has ended (JF-3)."""
    with _state:
        return is_this_process(holder) and holder not in _live


def is_proper(holder: str) -> bool:
    """Whether `holder` has this release's format, so a store's liveness proof applies to it."""
    return token_of(holder) is not None


_BOOTTIME = getattr(time, 'CLOCK_BOOTTIME', None)


def local_clock() -> float:
    """Seconds on a clock no wall-clock change moves, and that also runs while the machine sleeps.

    `CLOCK_BOOTTIME` on Linux; elsewhere the monotonic clock (which may stop during a suspend, so
    an attempt could then believe its lease lasts longer than it does; the store's fence still
    refuses its writes).
    """
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


@functools.cache
def boot_id() -> str | None:
    """An id of the running kernel's boot (Linux), or `None` where there is none to read."""
    try:
        with open('/proc/sys/kernel/random/boot_id', encoding='ascii') as file:
            return file.read().strip() or None
    except OSError:
        return None
