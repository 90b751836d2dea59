"""An attempt: one activation of an execution key, over the journals its runs use.

It opens each journal once (reachability, lease, execution record), numbers the runs it starts, guards
every journal call its runs make (a failing store is retried for `write_timeout` seconds, then the attempt
stops), and at the end cleans up, records the outcome, releases its leases and logs what it
replayed and recorded. The replay decisions themselves are the runs' (`_run`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from secrets import token_hex
from typing import Any, Literal, TypeVar

from .._errors import ExecutionBusy, ExecutionWaiting, JournalError, JournalUnavailable, LeaseLost
from .._runtime import (
    DEADLINE,
    DEFAULT_RETENTION,
    Retention,
    end_holding,
    local_clock,
    new_holder,
    retention_seconds,
    start_holding,
)
from ..journals import TIMERS, Journal
from ._attempt_view import StoreHold
from ._cancel import carried_out, check_not_cancelled
from ._history import ended, started
from ._lease import LeaseKeeper, store_identity
from ._records import ENTRY_VERSION, check_not_importing, one_line, readable
from ._retention import FROM_JOURNAL, check_metadata, check_same_work
from ._run import DivergenceMode, Run, check_divergence_mode
from ._stats import Stats, log_summary
from ._step import SimulatedCrash, current_step
from ._waiting import pending_ids, still_waiting

__all__ = ('Attempt', 'CleanupMode')

log = logging.getLogger('pydantic_ai_durable')

_R = TypeVar('_R')

CleanupMode = Literal['keep', 'execution', 'run']
"""What the end of a successful attempt does: `keep` the finished execution until its retention ends (a retry
replays it), delete the whole `execution`, or delete each `run` as it succeeds."""

_AUTO_PRUNE = 8
"""How many expired executions the end of a successful attempt deletes at most."""
_RETRY_FIRST = 0.02
"""The first pause between tries of a failing journal call (seconds); it doubles after each try."""
_RETRY_MAX = 0.5
"""The longest pause between tries of a failing journal call (seconds)."""


def _journal_retention(journal: Journal) -> float | None:
    """The journal's own retention (`DiskJournal(retention=...)`), or seven days for a journal without one."""
    return retention_seconds(getattr(journal, 'retention', DEFAULT_RETENTION), f'{journal!r}.retention')


class Attempt:
    """One activation of an execution key: a fresh view over the shared journal (R-2).

    It numbers the runs it starts (R-3, R-4), holds each journal's lease and execution record, and at
    the end cleans up (C-rules) and logs the summary (S-2). Every journal call it makes for its runs
    goes through `store` / `load`, which retry a failing store for `write_timeout` seconds and then
    stop the attempt.
    """

    def __init__(
        self,
        key: str,
        *,
        journal: Journal | None,
        default_journal: Callable[[], Journal],
        cleanup: CleanupMode,
        lease_ttl: float,
        write_timeout: float | None = None,
        rerun_unjournalable: bool = False,
        retention: Retention = FROM_JOURNAL,
        metadata: dict[str, Any] | None = None,
        fixed_metadata: Collection[str] = (),
        on_divergence: DivergenceMode | None = None,
        serves: Callable[[Any], bool] = lambda payload: True,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f'An execution key must be a non-empty string, not {key!r}.')
        if cleanup == 'never':  # type: ignore[comparison-overlap]
            raise ValueError(
                "cleanup='never' is now cleanup='keep', the default: a finished execution is kept, and a retry "
                'replays it; pass retention=None to keep it until it is pruned by hand.'
            )
        if cleanup not in ('keep', 'execution', 'run'):
            raise ValueError(f"cleanup must be 'keep', 'execution' or 'run', not {cleanup!r}.")
        if not isinstance(lease_ttl, (int, float)) or not lease_ttl > 0:
            raise ValueError(f'lease_ttl must be a positive number of seconds, not {lease_ttl!r}.')
        if write_timeout is None:
            write_timeout = lease_ttl / 3
        if not isinstance(write_timeout, (int, float)) or not write_timeout >= 0:
            raise ValueError(f'write_timeout must be a number of seconds (0 or more), not {write_timeout!r}.')
        check_divergence_mode(on_divergence)
        self.key = key
        self.journal = journal
        self._default_journal = default_journal
        self.cleanup = cleanup
        self.lease_ttl = float(lease_ttl)
        self.write_timeout = float(write_timeout)
        self.rerun_unjournalable = rerun_unjournalable
        self.retention = FROM_JOURNAL if retention is FROM_JOURNAL else retention_seconds(retention)
        """Seconds a finished execution is kept (`None`: until pruned); unset: the journal's."""
        self.metadata = check_metadata(metadata)
        self.fixed_metadata = tuple(fixed_metadata)
        """Metadata fields every attempt must bring as the execution recorded them."""
        self.on_divergence: DivergenceMode | None = on_divergence
        """The execution's divergence policy; `None` leaves it to each capability, then `"run_live"`."""
        self.serves = serves
        """Whether a recorded tool payload is a result that may serve a later call by its arguments."""
        self.tag = token_hex(6)
        """Names the side effects this attempt's live tool steps perform: `{tag}.{position}`."""
        self.stats = Stats()
        self.number = 1
        self.holder = new_holder()
        self.broken: JournalUnavailable | None = None
        """Set once a journal write failed for good: no step of this attempt starts after it."""
        self._states: dict[object, StoreHold] = {}
        self._opening: dict[object, asyncio.Future[StoreHold]] = {}
        self._taking = 0
        """Openings between `start_holding` and their end: while any runs, the holder may come to hold a lease."""
        self._abandoned = False
        """Set when the entry failed: an opening that ends after it gives its lease back at once."""
        self._top_runs = 0
        self._nested: Counter[tuple[str, int]] = Counter()
        self.runs: list[Run] = []

    @property
    def waiting_on(self) -> tuple[str, ...]:
        """The ids of the calls this attempt's runs left undecided: once it ended, what its execution waits on."""
        return pending_ids(state.record for state in self._states.values())

    def journal_for(self, preferred: Journal | None) -> Journal:
        """The execution's journal, else the capability's, else the default disk journal (I-2, I-4)."""
        if self.journal is not None:
            return self.journal
        return preferred if preferred is not None else self._default_journal()

    # -- guarding every journal call ------------------------------------------------------------

    def check(self, state: StoreHold) -> None:
        """Raise when this attempt may no longer run steps: its lease is lost or its journal failed (B-10, JF-2)."""
        state.keeper.check()
        if self.broken is not None:
            raise JournalUnavailable(str(self.broken))

    async def ensure(self, state: StoreHold) -> None:
        """`check`, and make sure the lease still holds; called right before a step's body."""
        self.check(state)
        await state.keeper.ensure()

    async def _retrying(
        self, what: str, call: Callable[[], Awaitable[_R]], journal: Journal, *, patient: bool = True
    ) -> _R:
        """Call the journal, retrying a failing store with backoff for `write_timeout` seconds (or once)."""
        deadline = local_clock() + (self.write_timeout if patient else 0.0)
        delay = _RETRY_FIRST
        while True:
            token = DEADLINE.set(deadline)
            try:
                return await call()
            except JournalUnavailable as exc:  # the store fails for now: retried like any other failure
                failure: Exception = exc
            except (LeaseLost, JournalError):
                raise  # a refusal, or a value that does not open: retrying cannot help
            except Exception as exc:
                failure = exc
            finally:
                DEADLINE.reset(token)
            remaining = deadline - local_clock()
            if remaining <= 0:
                tried = f'and still failed after {self.write_timeout:g} s of retries ' if patient else ''
                raise JournalUnavailable(
                    f'Execution {self.key!r}: {what} failed in {journal!r} {tried}'
                    f'({type(failure).__name__}: {one_line(failure)}). '
                    'This attempt stopped before its next step, so nothing ran unrecorded; retry the '
                    'execution once the journal works again, and every recorded step replays.'
                ) from failure
            log.debug('journal call failed, retrying: %s: %r', what, failure)
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, _RETRY_MAX)

    async def store(
        self, state: StoreHold, what: str, write: Callable[[int], Awaitable[bool]], *, patient: bool = True
    ) -> bool:
        """Write with this attempt's lease epoch (B-9); a store that keeps failing stops the attempt (JF-2).

        Returns what the backend said (`False`: the value cannot be encoded).
        """
        self.check(state)
        try:
            return await self._retrying(
                f'writing {what}', lambda: write(state.keeper.epoch), state.journal, patient=patient
            )
        except LeaseLost as lost:
            state.keeper.fenced(lost)
            raise
        except JournalUnavailable as error:
            self.broken = error
            raise

    async def _finish_state(self, state: StoreHold, error: BaseException | None, *, patient: bool) -> None:
        journal = state.journal
        waiting = (error is None or isinstance(error, ExecutionWaiting)) and still_waiting(state.record)  # WT-1, EV-2
        if carried_out(state.record, error, waiting):  # TM-10: what it would wait on, it was cancelled in
            history = ended(state.record, self.number, 'cancelled', error)
            await self._write_record(state, status='failed', history=history, patient=patient)
        elif waiting:
            await self._write_record(
                state, status='waiting', history=ended(state.record, self.number, 'waiting'), patient=patient
            )
        elif error is None and (self.cleanup == 'execution' or (self.cleanup == 'run' and not state.runs)):

            async def delete(epoch: int) -> bool:
                await journal.delete_execution(self.key, epoch=epoch)
                return True

            await self.store(state, 'the cleanup of the execution', delete, patient=patient)  # C-2, or C-1
        elif error is None:  # FN-1: finished, and kept until its retention ends
            retention = self.retention if self.retention is not FROM_JOURNAL else _journal_retention(journal)
            history = ended(state.record, self.number, 'finished')
            await self._write_record(
                state, status='finished', finished=time.time(), retention=retention, history=history, patient=patient
            )
        else:
            history = ended(state.record, self.number, 'failed', error)
            await self._write_record(state, status='failed', history=history, patient=patient)

    # -- opening ---------------------------------------------------------------------------------

    async def open(self, journal: Journal) -> StoreHold:
        """Open `journal` for this attempt once: reachability, lease, execution record (B-5, B-7).

        Two journal objects over the same store (two `DiskJournal`s on one directory) share one state,
        so they share one lease and one execution record. Runs that start concurrently wait for one
        opening instead of each taking the lease.
        """
        identity = store_identity(journal)
        opening = self._opening.get(identity)
        if opening is None:
            opening = self._opening[identity] = asyncio.ensure_future(self._open(journal))
        try:
            return await asyncio.shield(opening)
        except BaseException:
            if opening.done():
                self._opening.pop(identity, None)  # a failed opening may be retried by a later run
            raise

    async def enter(self, journal: Journal) -> None:
        """Open the execution's own journal as the scope is entered; an entry that fails holds nothing."""
        try:
            await self.open(journal)
        except BaseException:
            await self.abandon()
            raise

    async def abandon(self) -> None:
        """Undo an entry that failed: give back every lease taken, so nothing renews it, and end the holder (B-18).

        An opening still on its way (the entry was cancelled while the lease was being taken) sees the attempt
        abandoned when it ends, and gives its lease back then.
        """
        self._abandoned = True
        states = list(self._states.values())
        self._states.clear()
        for state in states:
            await state.keeper.release()
        if not self._taking:
            end_holding(self.holder)

    async def _open(self, journal: Journal) -> StoreHold:
        try:
            await journal.open()
        except JournalUnavailable:
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The journal {journal!r} cannot be opened ({type(exc).__name__}: {exc}); no model was called.'
            ) from exc
        start_holding(self.holder)
        self._taking += 1
        try:
            state = await self._take(journal)
        finally:
            self._taking -= 1
            if not self._states and not self._taking:
                end_holding(self.holder)  # an attempt that holds no lease is no holder (JF-3)
        return state

    async def _take(self, journal: Journal) -> StoreHold:
        """Take the lease and mark the execution running; on any failure, give the lease back."""
        keeper = LeaseKeeper(journal, self.key, self.holder, self.lease_ttl)
        try:
            lease = await keeper.acquire()
        except JournalError:  # JournalUnavailable, or EncryptionMismatch: a sealed journal without keys
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The lease of execution {self.key!r} could not be taken in {journal!r} '
                f'({type(exc).__name__}: {exc}); no model was called.'
            ) from exc
        if lease.holder != self.holder:
            raise ExecutionBusy(self.key, holder=lease.holder, expires_at=lease.expires_at)
        state = StoreHold(journal, keeper)
        try:
            if self._abandoned:  # the entry gave up while the lease was being taken
                raise asyncio.CancelledError
            await self._start_record(state)
            if self._abandoned:
                raise asyncio.CancelledError
        except BaseException:
            await keeper.release()
            raise
        self._states[store_identity(journal)] = state
        return state

    async def _start_record(self, state: StoreHold) -> None:
        """Read the execution record (a wrong shape counts as empty, B-3) and mark this attempt running.

        A record that cannot be read is an error, never an empty execution: starting afresh
        would run every recorded step again.
        """
        journal = state.journal
        stored = await self._load(journal, 'the execution record', lambda: journal.read_execution(self.key))
        check_not_importing(self.key, stored)  # what a killed import left is no execution
        known = readable(stored, f'Execution {self.key!r}: its record') if stored is not None else None
        record: dict[str, Any] = known if known is not None else {}
        listed = record.get('runs')
        state.runs = [run for run in listed if isinstance(run, str)] if isinstance(listed, list) else []
        attempts = record.get('attempts')
        self.number = (attempts if type(attempts) is int else 0) + 1
        check_same_work(self.key, record.get('metadata'), self.metadata, self.fixed_metadata)  # before any write
        check_not_cancelled(self.key, record)  # TM-10
        for field in ('retention', 'finished', TIMERS):  # running again: out of retention's reach until it ends,
            record.pop(field, None)  # and waiting on no long wait until it ends at one itself (TM-4)
        if self.metadata is not None:
            record['metadata'] = self.metadata
        record['history'] = started(record, self.number, self.holder)
        state.record = {
            **record,
            'v': ENTRY_VERSION,
            'key': self.key,
            'runs': state.runs,
            'status': 'running',
            'attempts': self.number,
            'updated': time.time(),
        }
        try:
            written = await self.store(
                state,
                'the start of the execution',
                lambda epoch: journal.write_execution(self.key, state.record, epoch=epoch),
            )
        except JournalUnavailable as exc:
            self.broken = None  # nothing ran: a later entry into this execution may try again
            raise JournalUnavailable(f'{exc} No model was called.') from exc
        if not written:
            raise JournalUnavailable(
                f'The journal {journal!r} refused to record the start of execution {self.key!r}; '
                'check that it is writable and not full. No model was called.'
            )

    async def _load(self, journal: Journal, what: str, read: Callable[[], Awaitable[_R]]) -> _R:
        """Read from the journal, retrying a failing store; a read that keeps failing is `JournalUnavailable` (JF-1)."""
        try:
            return await self._retrying(f'reading {what}', read, journal)
        except JournalUnavailable as error:
            raise JournalUnavailable(
                f'{error} Nothing was run live: an unreadable journal is never taken for an empty one.'
            ) from error.__cause__

    # -- runs ------------------------------------------------------------------------------------

    def next_run_key(self, journal: Journal) -> str:
        parent = current_step()
        if (
            parent is not None
            and parent.run.attempt is self
            and store_identity(parent.run.journal) == store_identity(journal)
        ):
            slot = (parent.run.key, parent.position)
            self._nested[slot] += 1
            return f'{parent.run.key}.{parent.position}.{self._nested[slot]}'
        key = str(self._top_runs)
        self._top_runs += 1
        return key

    async def start_run(
        self, journal: Journal, *, start: str | None = None, on_divergence: DivergenceMode | None = None, key: str = ''
    ) -> Run:
        """Number a new run (synchronously, in start order) and read what earlier attempts recorded for it.

        `start` fingerprints what the run is started with; see `Run._started_alike`. `on_divergence` is
        the capability's policy; the execution's own, when set, wins (DV-3). `key`: numbered before (A-14).
        """
        run_key = key or self.next_run_key(journal)
        state = await self.open(journal)
        self.check(state)
        if run_key not in state.runs:  # a run is registered when it starts
            state.runs.append(run_key)
            await self._write_record(state)
        snapshot = await self._load(
            state.journal, f'the entries of run {run_key}', lambda: state.journal.read_run(self.key, run_key)
        )
        policy = self.on_divergence if self.on_divergence is not None else on_divergence
        run = Run(
            self, state, run_key, snapshot, start=start, on_divergence=policy if policy is not None else 'run_live'
        )
        self.runs.append(run)
        return run

    async def _write_record(self, state: StoreHold, *, patient: bool = True, **changes: Any) -> None:
        """Write the execution record with `changes`; `patient=False` tries a failing store once (the end of a
        broken attempt). `patient` is how to write, never a field of the record."""
        async with state.lock:
            state.record.update(changes, runs=list(state.runs), updated=time.time())
            record = dict(state.record)
            await self.store(
                state,
                'the execution record',
                lambda epoch: state.journal.write_execution(self.key, record, epoch=epoch),
                patient=patient,
            )

    async def cleanup_run(self, run: Run) -> None:
        """Delete one finished run's entries and forget its key (C-1); a failure is logged, never raised (C-5)."""
        state = run.state
        try:

            async def delete(epoch: int) -> bool:
                await run.journal.delete_run(self.key, run.key, epoch=epoch)
                return True

            await self.store(state, f'the cleanup of run {run.key}', delete)
            if run.key in state.runs:
                state.runs.remove(run.key)
                await self._write_record(state)
        except Exception as exc:  # LeaseLost included: the keeper knows, and the scope's exit reports it
            log.warning('Execution %r run %s: cleanup failed (%s).', self.key, run.key, exc)

    async def finish(self, error: BaseException | None) -> None:
        """End the attempt: clean up after success (C-2, C-3), record the status, release leases, summarise.

        Raises `LeaseLost` when the attempt otherwise succeeded but its execution was taken over before it
        could finish: its cleanup was refused, and the new holder's result is the execution's.
        """
        lost: LeaseLost | None = None
        was_broken, self.broken = self.broken is not None, None  # the end is tried once more, best effort
        for state in self._states.values():
            keeper = state.keeper
            await keeper.stop()  # no renewal lands once the end starts deleting or marking (CC-3)
            try:
                if not (isinstance(error, SimulatedCrash) or keeper.lost is not None):
                    await self._finish_state(state, error, patient=not was_broken)
            except LeaseLost as exc:
                lost = exc
            except Exception as exc:
                log.warning('Execution %r: cleanup failed (%s); its entries stay in the journal.', self.key, exc)
            if lost is None and isinstance(keeper.lost, LeaseLost):
                lost = keeper.lost  # a dead process writes nothing above; a stale attempt may not
            await keeper.release()
        end_holding(self.holder)
        if error is None:
            await self._prune_expired()
        log_summary(self.key, self.number, self.stats)
        if error is None and lost is not None:
            raise LeaseLost(self.key, holder=lost.holder, reason=lost.reason)

    async def _prune_expired(self) -> None:
        """Delete a few finished executions whose retention ended: a bounded, indexed cost per attempt (FN-2)."""
        for state in self._states.values():
            try:
                pruned = await state.journal.prune(limit=_AUTO_PRUNE)
            except Exception as exc:  # retention is housekeeping: the attempt itself succeeded
                log.debug('pruning expired executions of %r failed: %r', state.journal, exc)
                continue
            if pruned:
                log.info('Retention deleted %d finished executions of %r.', len(pruned), state.journal)
