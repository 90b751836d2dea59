"""A disk journal's leases: who holds an execution, until when by this host's boot clock, under which epoch.

A lease is `{eid}/l`: holder, epoch, expiry on this host's boot clock (and the boot's id, so a lease from
before a reboot is expired), and a wall-clock expiry for messages and for systems without a boot
clock. Every acquisition takes the next value of one store-wide counter, so an epoch is never reused,
and every write checks its epoch in its own transaction. A live holder keeps its lock file locked;
a lock that can be taken proves the holder's process gone, in whatever pid namespace or container it
ran.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import LeaseLost
from .._runtime import boot_id, is_proper, local_clock, ours_and_ended, token_of
from . import _json
from ._process_lock import lock_file, lockable
from ._protocol import Lease

__all__ = ('Held', 'fence', 'forget_process', 'held_alive', 'next_epoch', 'proved_dead', 'read_lease', 'store_lease')

_EPOCH_KEY = 'epoch'
"""The store-wide fencing counter: every lease acquisition takes the next value, none is ever reused."""


@dataclass(frozen=True)
class Held:
    """A stored lease: expiry on this host's boot clock (wall clock where there is none), and its epoch."""

    holder: str
    epoch: int
    expires_at: float
    until: float | None
    boot: str | None

    def live(self, now: float, clock: float, boot: str | None) -> bool:
        if self.boot is not None and boot is not None and self.until is not None:
            return self.boot == boot and self.until > clock  # no wall-clock change moves it (B-11)
        return self.expires_at > now

    def lease(self) -> Lease:
        return Lease(self.holder, self.expires_at, self.epoch)


def read_lease(cache: Any, eid: str) -> Held | None:
    return parse_lease(cache.read_text(f'{eid}/l'))


def parse_lease(text: Any) -> Held | None:
    """A stored lease row, or `None` for none (or one of an unknown shape)."""
    stored = _json.loads_dict(text)
    if stored is None or not isinstance(stored.get('holder'), str):
        return None
    epoch, expires, until, boot = (stored.get(name) for name in ('epoch', 'expires_at', 'until', 'boot'))
    if not isinstance(expires, (int, float)):
        return None
    return Held(
        stored['holder'],
        epoch if type(epoch) is int else 0,  # stored before leases had epochs: no writer carries 0
        float(expires),
        float(until) if isinstance(until, (int, float)) else None,
        boot if isinstance(boot, str) else None,
    )


def store_lease(cache: Any, eid: str, holder: str, epoch: int, ttl: float) -> Lease:
    now = time.time()
    until = local_clock() + ttl
    stored = {'holder': holder, 'epoch': epoch, 'expires_at': now + ttl, 'until': until, 'boot': boot_id()}
    cache.set(f'{eid}/l', _json.dumps(stored))
    return Lease(holder, now + ttl, epoch)


def next_epoch(cache: Any) -> int:
    """Take the store's next fencing epoch; call inside the acquisition's transaction."""
    counter = _json.loads(cache.get(_EPOCH_KEY))
    epoch = (counter if type(counter) is int else 0) + 1
    cache.set(_EPOCH_KEY, _json.dumps(epoch))
    return epoch


def fence(cache: Any, key: str, eid: str, epoch: int) -> None:
    """Refuse a write unless `epoch` is the execution's current one; call inside the write's transaction (B-9)."""
    held = read_lease(cache, eid)
    if held is None or held.epoch != epoch:
        raise LeaseLost(key, holder=held.holder if held is not None else None)


def proved_dead(path: Path, holder: str) -> bool:
    """Whether `holder`'s process is gone: an ended attempt of ours, or a lock file nobody keeps locked (B-12)."""
    if ours_and_ended(holder):
        return True
    lock = lock_file(path, holder) if is_proper(holder) else None
    return lock is not None and lockable(lock)  # else alive, or nothing can be proved: wait for expiry


def held_alive(path: Path, cache: Any, eid: str) -> bool:
    """Whether a holder the engine would not take over holds the execution now."""
    return alive(path, read_lease(cache, eid))


def alive(path: Path, held: Held | None) -> bool:
    """Whether `held`, a lease read from the store, is one the engine would not take over now (FN-3)."""
    if held is None or not held.live(time.time(), local_clock(), boot_id()):
        return False
    return not proved_dead(path, held.holder)


def forget_process(path: Path, cache: Any, holder: str, *, besides: str) -> None:
    """Remove a dead process's lock file once no lease but `besides` names it; call inside a transaction.

    Every lease a dead process left behind must stay provably dead until it is taken over or deleted,
    so the file goes with the last of them, and no sooner.
    """
    token = token_of(holder)
    lock = lock_file(path, holder) if is_proper(holder) else None
    if token is None or lock is None or ours_and_ended(holder) or not lockable(lock):
        return
    if not cache.leases_naming(f':{token}:', besides=besides):
        with contextlib.suppress(OSError):
            os.unlink(lock)
