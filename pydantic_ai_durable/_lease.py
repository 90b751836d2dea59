"""The lease keeper: takes an execution's lease for one attempt, renews it, and notices when it is lost.

An attempt may only run steps while it holds its execution (SPEC B-5, B-10). The keeper runs every
lease call on an event loop of its own, in a daemon thread, so a long model call never lets the
lease lapse and a network journal keeps one connection for the whole attempt. The attempt asks
`ensure()` before each step's body: a clock read while the lease is fresh, a renewal when it may
have lapsed (a paused process, a frozen VM), and `LeaseLost` once another attempt has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ._errors import LeaseLost
from .journals._holder import local_clock
from .journals._protocol import Journal, Lease

__all__ = ('LeaseKeeper',)

log = logging.getLogger('pydantic_ai_durable')

_T = TypeVar('_T')

_RETRY_SHARE = 10
"""After a failed renewal, the next try comes after `ttl / _RETRY_SHARE`, until the lease would lapse."""


class LeaseKeeper:
    """One attempt's hold on one execution in one journal: its fencing epoch and whether it still holds it."""

    def __init__(self, journal: Journal, key: str, holder: str, ttl: float) -> None:
        self.journal = journal
        self.key = key
        self.holder = holder
        self.ttl = ttl
        self.epoch = 0
        """The epoch every write of this attempt carries (B-9); 0 until the lease is taken."""
        self.lost: LeaseLost | None = None
        """Set once the lease is known lost; every later step stops with it (B-10)."""
        self._valid_until = 0.0
        """On `local_clock()`: until when the lease surely holds (from before the last renewal was sent)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._renewing: asyncio.Task[None] | None = None

    # -- the keeper's own event loop ------------------------------------------------------------

    def _start_thread(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=loop.run_forever, name=f'pydantic-ai-durable-lease {self.key[:40]}', daemon=True
            )
            self._thread.start()
        return self._loop

    async def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run `coro` on the keeper's loop and wait for it from whatever loop the caller runs."""
        loop = self._start_thread()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def _stop_thread(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()

    # -- taking, keeping, giving back -----------------------------------------------------------

    async def acquire(self, *, force: bool = False) -> Lease:
        """Take the lease; the returned lease is someone else's when the execution is busy."""
        sent = local_clock()
        try:
            lease = await self._call(self.journal.acquire_lease(self.key, self.holder, self.ttl, force=force))
        except BaseException:
            self._stop_thread()
            raise
        if lease.holder != self.holder:
            self._stop_thread()
            return lease
        self.epoch = lease.epoch
        self._valid_until = sent + self.ttl
        self._renewing = await self._call(self._start_renewing())
        return lease

    async def _start_renewing(self) -> asyncio.Task[None]:
        return asyncio.create_task(self._keep())

    async def _keep(self) -> None:
        """Renew every `ttl / 3`; after a failure, sooner, until the lease is renewed or known lost."""
        interval = self.ttl / 3
        wait = interval
        while self.lost is None:
            await asyncio.sleep(wait)
            wait = interval if await self._renew() else min(interval, self.ttl / _RETRY_SHARE)

    async def _renew(self) -> bool:
        """One renewal; `False` when the store could not be reached (the lease may still hold)."""
        sent = local_clock()
        try:
            lease = await self.journal.renew_lease(self.key, self.holder, self.epoch, self.ttl)
        except Exception as exc:
            if local_clock() >= self._valid_until:
                self._lose(
                    LeaseLost(self.key, holder=None, reason=f'it could not be renewed before it expired ({exc})')
                )
            else:
                log.warning('Execution %r: renewing its lease failed (%s); retrying.', self.key, exc)
            return False
        if lease is None or (lease.holder, lease.epoch) != (self.holder, self.epoch):
            self._lose(LeaseLost(self.key, holder=lease.holder if lease is not None else None))
            return True
        self._valid_until = sent + self.ttl
        return True

    def _lose(self, error: LeaseLost) -> None:
        if self.lost is None:
            self.lost = error
            log.warning('%s', error)

    def fenced(self, error: LeaseLost) -> None:
        """A write was refused for a stale epoch: the lease is lost, whatever the renewer believes."""
        self._lose(error)

    def check(self) -> None:
        """Raise `LeaseLost` when the lease is known lost; never waits."""
        if self.lost is not None:
            raise LeaseLost(self.key, holder=self.lost.holder, reason=self.lost.reason)

    async def ensure(self) -> None:
        """Make sure the lease still holds before a step's body starts (B-10).

        While the last renewal is recent this is one clock read. When the renewer has fallen behind
        (this process was paused or starved), the lease is renewed here first: the store, not this
        process's belief, decides whether the attempt may go on.
        """
        self.check()
        if local_clock() < self._valid_until - self.ttl / 3:
            return
        await self._call(self._renew())
        if local_clock() >= self._valid_until and self.lost is None:
            self._lose(LeaseLost(self.key, holder=None, reason='it could not be renewed before it expired'))
        self.check()

    async def release(self) -> None:
        """Stop renewing and give the lease back if still held; never raises."""
        renewing, self._renewing = self._renewing, None
        if self._loop is not None:
            with contextlib.suppress(Exception):
                await self._call(self._release(renewing))
        self._stop_thread()

    async def _release(self, renewing: asyncio.Task[None] | None) -> None:
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(BaseException):
                await renewing
        try:
            if self.epoch:
                await self.journal.release_lease(self.key, self.holder, self.epoch)
        finally:
            # The connection this thread's loop opened dies with the thread: close it now, not at some
            # later garbage collection (an optional method of a backend that keeps one per thread or loop).
            detach = getattr(self.journal, 'detach', None)
            if detach is not None:
                await detach()
