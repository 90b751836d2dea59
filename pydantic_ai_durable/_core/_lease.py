"""Leases: an attempt's hold on its execution, and the one renewer per journal that keeps them all.

An attempt may only run steps while it holds its execution. Each attempt has a
`LeaseKeeper`: it takes the lease, knows its fencing epoch and whether it still holds it. The renewing
is not the keeper's: a process holding a thousand executions in one journal renews them with one
`LeaseRenewer`, one statement per interval, on the package's background loop, which keeps
running when the user's loop is busy. Before each step's body the attempt asks `ensure()`: a clock read
while the lease is fresh, a renewal of its own when the renewer has fallen behind (a paused process).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading

from .._errors import DurableError, JournalUnavailable, LeaseLost
from .._runtime import background, local_clock
from ..journals import Journal, Lease, LeaseRenewal

__all__ = ('LeaseKeeper', 'LeaseRenewer', 'store_identity')

log = logging.getLogger('pydantic_ai_durable')

_RETRY_SHARE = 10
"""After a failed renewal, the next try comes after `ttl / _RETRY_SHARE`, until the lease would lapse."""


def store_identity(journal: Journal) -> object:
    """What makes two journal objects the same store (their `store_identity`), else the object itself.

    An attempt holds one lease per store, and a process has one renewer per store: two objects over
    one store must share them, or the second acquisition would take a new epoch and fence the first.
    """
    identity = getattr(journal, 'store_identity', None)
    return identity if identity is not None else ('object', id(journal))


class LeaseKeeper:
    """One attempt's hold on one execution in one journal: its fencing epoch and whether it still holds it."""

    def __init__(self, journal: Journal, key: str, holder: str, ttl: float) -> None:
        self.journal = journal
        self.key = key
        self.holder = holder
        self.ttl = ttl
        self.epoch = 0
        """The epoch every write of this attempt carries; 0 until the lease is taken."""
        self.lost: DurableError | None = None
        """Set once the attempt may not go on: `LeaseLost` (another holder, a deletion) or `JournalUnavailable`
        (renewals kept failing until the lease lapsed). Every later step stops with it."""
        self.due = 0.0
        """On `local_clock()`: when the renewer should renew this lease next."""
        self.retired = False
        """Set when the attempt stopped renewing: a renewal answer that arrives later means nothing."""
        self._valid_until = 0.0
        """On `local_clock()`: until when the lease surely holds (from before the last renewal was sent)."""
        self._renewer: LeaseRenewer | None = None

    # -- taking, keeping, giving back -----------------------------------------------------------

    async def acquire(self, *, force: bool = False) -> Lease:
        """Take the lease; the returned lease is someone else's when the execution is busy."""
        sent = local_clock()
        lease = await self.journal.acquire_lease(self.key, self.holder, self.ttl, force=force)
        if lease.holder != self.holder:
            return lease
        self.epoch = lease.epoch
        self._renewed(sent)
        self._renewer = LeaseRenewer.of(self.journal)
        self._renewer.add(self)
        return lease

    def renewal(self) -> LeaseRenewal:
        return LeaseRenewal(self.key, self.holder, self.epoch, self.ttl)

    def _renewed(self, sent: float) -> None:
        self._valid_until = sent + self.ttl
        self.due = sent + self.ttl / 3

    def answer(self, sent: float, lease: Lease | None) -> None:
        """Take the store's answer to a renewal sent at `sent`: still ours, or lost to someone."""
        if self.retired or self.lost is not None:
            return
        if lease is None or (lease.holder, lease.epoch) != (self.holder, self.epoch):
            self._lose(LeaseLost(self.key, holder=lease.holder if lease is not None else None))
        else:
            self._renewed(sent)

    def failed(self, error: BaseException) -> None:
        """A renewal could not reach the store: retry soon, and once the lease lapsed, say the store failed (CC-4)."""
        if self.retired or self.lost is not None:
            return
        now = local_clock()
        if now < self._valid_until:
            log.warning('Execution %r: renewing its lease failed (%s); retrying.', self.key, error)
            self.due = min(now + self.ttl / _RETRY_SHARE, self._valid_until)
            return
        self._lose(
            JournalUnavailable(
                f'Execution {self.key!r}: its lease could not be renewed before it expired, because the journal '
                f'{self.journal!r} is failing ({type(error).__name__}: {_one_line(error)}). This attempt stopped '
                'before its next step, so nothing ran unrecorded; retry the execution once the journal works '
                'again, and every recorded step replays.'
            )
        )

    def _lose(self, error: DurableError) -> None:
        if self.lost is None:
            self.lost = error
            log.warning('%s', error)

    def fenced(self, error: LeaseLost) -> None:
        """A write was refused for a stale epoch: the lease is lost, whatever the renewer believes."""
        self._lose(error)

    def check(self) -> None:
        """Raise when the attempt may not go on (`LeaseLost` or `JournalUnavailable`); never waits."""
        lost = self.lost
        if isinstance(lost, LeaseLost):
            raise LeaseLost(self.key, holder=lost.holder, reason=lost.reason)
        if lost is not None:
            raise JournalUnavailable(str(lost))

    async def ensure(self) -> None:
        """Make sure the lease still holds before a step's body starts (B-10).

        While the last renewal is recent this is one clock read. When the renewer has fallen behind
        (this process was paused or starved), the lease is renewed here first: the store, not this
        process's belief, decides whether the attempt may go on.
        """
        self.check()
        if local_clock() < self._valid_until - self.ttl / 3:
            return
        sent = local_clock()
        try:
            [lease] = await self.journal.renew_leases([self.renewal()])
        except Exception as exc:
            self.failed(exc)
        else:
            self.answer(sent, lease)
        self.check()

    async def stop(self) -> None:
        """Stop renewing, and wait for a renewal on its way: nothing renews this lease after it returns (CC-3)."""
        renewer, self._renewer = self._renewer, None
        self.retired = True
        if renewer is not None:
            await renewer.remove(self)

    async def release(self) -> None:
        """Stop renewing and give the lease back if still held; never raises."""
        await self.stop()
        if self.epoch and not isinstance(self.lost, LeaseLost):
            try:
                await self.journal.release_lease(self.key, self.holder, self.epoch)
            except Exception as exc:  # an ended attempt's lease is taken over at once anyway
                log.debug('releasing the lease of %r failed: %r', self.key, exc)


class LeaseRenewer:
    """Renews every lease this process holds in one journal, in one call per round, on the background loop.

    A round renews every lease that is due within half a renewal interval, so leases taken at different
    moments soon share rounds: a thousand executions cost one statement every few seconds, not a
    thousand threads and a thousand statements. It runs only while it has leases to keep.
    """

    _renewers: dict[object, LeaseRenewer] = {}  # noqa: RUF012 - the process-wide registry, by store
    _registry = threading.Lock()

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._guard = threading.Lock()
        self._keepers: set[LeaseKeeper] = set()
        self._task: concurrent.futures.Future[None] | None = None
        self._round: concurrent.futures.Future[None] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def of(cls, journal: Journal) -> LeaseRenewer:
        """The renewer of `journal`'s store in this process."""
        identity = store_identity(journal)
        with cls._registry:
            renewer = cls._renewers.get(identity)
            if renewer is None:
                renewer = cls._renewers[identity] = cls(journal)
            return renewer

    def add(self, keeper: LeaseKeeper) -> None:
        with self._guard:
            self._keepers.add(keeper)
            if self._task is None:
                self._loop = background.hold()
                self._task = asyncio.run_coroutine_threadsafe(self._renew_while_held(), self._loop)
                return
            loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.call_soon_threadsafe(wake.set)  # it may be due before the round the renewer sleeps towards

    async def remove(self, keeper: LeaseKeeper) -> None:
        with self._guard:
            self._keepers.discard(keeper)
            running_round = self._round
            stopping: concurrent.futures.Future[None] | None = None
            if not self._keepers and self._task is not None:
                stopping, self._task = self._task, None
        if running_round is not None:
            await asyncio.wrap_future(running_round)
        if stopping is not None:
            stopping.cancel()  # it sleeps: the round above was its last; its loop ends it if nobody else holds it
            background.release()
            with LeaseRenewer._registry, self._guard:
                if self._task is None and LeaseRenewer._renewers.get(store_identity(self.journal)) is self:
                    del LeaseRenewer._renewers[store_identity(self.journal)]

    async def _renew_while_held(self) -> None:
        self._wake = asyncio.Event()
        try:
            while True:
                self._wake.clear()
                due, wait = self._next_round()
                if not due:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait)
                    continue
                await self._renew(due)
        finally:
            detach = getattr(self.journal, 'detach', None)
            if detach is not None:  # the background thread's own handles (a disk journal's SQLite connection)
                await detach()

    def _next_round(self) -> tuple[list[LeaseKeeper], float]:
        with self._guard:
            now = local_clock()
            keepers = [keeper for keeper in self._keepers if keeper.lost is None]
            due = [keeper for keeper in keepers if keeper.due - keeper.ttl / 6 <= now]
            if due:
                self._round = concurrent.futures.Future()
                return due, 0.0
            return [], max(0.0, min((keeper.due for keeper in keepers), default=now + 60.0) - now)

    async def _renew(self, due: list[LeaseKeeper]) -> None:
        sent = local_clock()
        try:
            leases: list[Lease | None] = await self.journal.renew_leases([keeper.renewal() for keeper in due])
        except Exception as exc:
            for keeper in due:
                keeper.failed(exc)
        else:
            for keeper, lease in zip(due, leases, strict=True):
                keeper.answer(sent, lease)
        finally:
            with self._guard:
                finished, self._round = self._round, None
            if finished is not None:
                finished.set_result(None)


def _forget_in_child() -> None:
    """A forked child renews nothing of its parent's, and its own leases need a renewer of their own (CC-7).

    The parent's renewers live on the parent's background loop, whose thread the child does not have: a
    child that reused one would hold leases nobody renews.
    """
    LeaseRenewer._renewers = {}
    LeaseRenewer._registry = threading.Lock()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_in_child)


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = ' '.join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + '...'
