"""Shared commits on disk: the fenced writes one event loop queues in a turn go into one SQLite transaction (CC-9).

A SQLite commit costs more than the two or three statements of a journal write, and a process running a
thousand executions wrote a thousand commits per step, one after another. Here a write waits until the
loop runs its ready callbacks; every write queued by then is committed together, each inside a savepoint of
its own, so a write refused on its own (a lost lease, a moved directory) is rolled back alone and the others
are stored. A write is acknowledged only once the commit that holds it returned, and a write whose caller
was cancelled while it waited is not made. A journal object that holds one lease or none has no other
execution to share a commit with, so it writes at once.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ('SharedCommits',)


@dataclass
class _Write:
    operation: Callable[[], bool]
    done: asyncio.Future[bool] = field(repr=False)


@dataclass
class SharedCommits:
    """The writes each event loop has queued for the next shared commit, and the committer that takes them."""

    cache: Callable[[], Any]
    """The journal's cache, checked as for any write (raises when the directory is gone or moved)."""
    _holders: int = 0
    """Leases the journal object acquired and has not released: with one or none, a write has no one to wait for."""

    _queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Write]] = field(
        default_factory=weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Write]]
    )

    def lease_taken(self) -> None:
        """The journal object granted a lease to a holder of this process."""
        self._holders += 1

    def lease_released(self) -> None:
        """The journal object released a lease it had granted."""
        self._holders = max(0, self._holders - 1)

    async def write(self, operation: Callable[[], bool]) -> bool:
        """Run `operation` (a write that opens its own transaction) in the next shared commit of this loop."""
        if self._holders <= 1:
            return operation()  # a lone execution commits at once, without waiting a loop turn
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = []
            loop.call_soon(self._commit, loop)
        write = _Write(operation, loop.create_future())
        queue.append(write)
        return await write.done

    def _commit(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = [write for write in self._queues.pop(loop, ()) if not write.done.done()]
        if len(batch) <= 1:
            for write in batch:
                _alone(write)
            return
        try:
            cache = self.cache()
            with cache.transact():  # the writes' own `transact()` nest in it; each gets a savepoint
                outcomes = [_saved(cache, write.operation) for write in batch]
        except Exception:
            for write in batch:  # the shared transaction itself failed: each write on its own, with its own error
                _alone(write)
            return
        except BaseException as exc:
            for write in batch:
                if not write.done.done():
                    write.done.set_exception(exc)
            raise
        for write, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                write.done.set_result(value)
            else:
                write.done.set_exception(value)


def _saved(cache: Any, operation: Callable[[], bool]) -> tuple[bool, Any]:
    """Run one write under a savepoint: its changes stay if it returned, and are rolled back if it raised."""
    with cache.savepoint() as rollback:
        try:
            return True, operation()
        except Exception as exc:
            rollback()
            return False, exc


def _alone(write: _Write) -> None:
    try:
        value = write.operation()
    except BaseException as exc:
        write.done.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
    else:
        write.done.set_result(value)
