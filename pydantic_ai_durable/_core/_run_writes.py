"""What a run writes: live steps' entries, replays kept by arguments, fences, run records, the failure meta.

`Run` reads what earlier attempts recorded and decides, claim by claim, what replays; this module holds
the other half, every write the run makes through its attempt's guard, with the state
only writing needs: how far the run recorded, what it saved, the errors its steps raised, and the unused
recorded results to copy into the `pool` record before the first write that could cover one.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from .._errors import JournalError, JournalUnavailable, ResultNotJournalable
from ._attempt_view import AttemptView, StoreHold
from ._fences import ErrorNotes, RunMeta, lifted_fence, next_meta
from ._records import ENTRY_VERSION, one_line
from ._step import Step

__all__ = ('RunWriter',)

log = logging.getLogger('pydantic_ai_durable')


class RunWriter:
    """The writes of one run inside an attempt, each fenced and retried by the attempt (W-, F-, JF-rules)."""

    def __init__(
        self,
        attempt: AttemptView,
        state: StoreHold,
        key: str,
        records: dict[str, Any],
        start: str | None,
        *,
        stored: Iterable[int] = (),
    ) -> None:
        self.attempt = attempt
        self.state = state
        self.journal = state.journal
        self.key = key
        self.records = records
        """The run's records as read at its start, updated by every record this run writes."""
        self.start = start
        self.unsaved_pool: list[dict[str, Any]] | None = None
        """Unused recorded results the `pool` record lacks, set when the run diverges."""
        self._tried_max = -1
        self._saved: set[int] = set()
        self._stored = sorted(stored)
        """Positions of the run known to be stored: read at its start, or acknowledged since."""
        self._errors = ErrorNotes()
        self._pool_lock: asyncio.Lock | None = None

    async def record(
        self,
        step: Step,
        payload: Any,
        *,
        to_record: Callable[[Any], Any] | None = None,
        spend: dict[str, Any] | None = None,
        sent: Any = None,
    ) -> bool:
        """Save a live step's payload (W-1..W-4) and return whether it was stored.

        A store that keeps failing stops the attempt with `JournalUnavailable`, and the step is
        reported as not recorded; a payload the journal cannot encode raises `JournalError` after leaving
        a fence.
        `spend` is a snapshot of the run's live spend (with an int `seq`) that rides along with the
        entry, so counting a step's usage costs no write of its own; so does `sent`, what the step was asked.
        """
        if not step.replayable:
            return False
        self._tried_max = max(self._tried_max, step.position)
        entry = self._entry(step)
        if spend is not None:
            entry['usage'] = spend
        if sent is not None:
            entry['sent'] = sent
        stats = self.attempt.stats
        try:
            recorded = to_record(payload) if to_record is not None else payload
            entry['payload'] = recorded
            if recorded is not payload:  # `to_record` hands back the very value when it changes nothing
                entry['redacted'] = True
        except Exception as exc:  # masking failed: the result cannot be journaled as it must be
            log.debug('preparing the record of step %d failed: %r', step.position, exc)
            saved = False
        else:
            try:
                # The unused recorded results are kept safe before this write can cover one of them.
                saved = await self._protect_pool() and await self._write_entry(step, entry)
            except JournalUnavailable:
                stats.not_recorded.append((step.kind, step.name))  # it ran; the attempt stops here
                raise
        if saved is False:
            error = ResultNotJournalable(
                f'The result of step {step.position} ({step.name}) cannot be journaled: the journal could not '
                'encode it as JSON text. Return JSON-compatible data instead.',
                step=step,
            )
            await self.fence(step, error)
            raise error
        self._saved.add(step.position)
        stats.recorded[step.kind] += 1
        log.debug('run %s: recorded step %d (%s)', self.key, step.position, step.name)
        return True

    def _entry(self, step: Step) -> dict[str, Any]:
        entry: dict[str, Any] = {
            'v': ENTRY_VERSION,
            'name': step.name,
            'kind': step.kind,
            'fingerprint': step.fingerprint,
            't': time.time(),  # when it was recorded, for inspection
            'a': self.attempt.number,  # the attempt that wrote it, and when its body started
        }
        if step.started is not None:
            entry['s'] = step.started
        if step.position == 0 and self.start is not None:
            entry['start'] = self.start
        below = bisect.bisect_left(self._stored, step.position)
        if below:
            entry['after'] = self._stored[below - 1]  # deleting that entry now shows
        if step.call is not None:
            entry['call'] = step.call  # what a later, diverged attempt matches a call by
            entry['origin'] = step.origin
        return entry

    async def _write_entry(self, step: Step, entry: dict[str, Any], what: str | None = None) -> bool:
        written = await self.attempt.store(
            self.state,
            what or f'step {step.position} ({step.name}) of run {self.key}',
            lambda epoch: self.journal.write_entry(self.attempt.key, self.key, step.position, entry, epoch=epoch),
        )
        at = bisect.bisect_left(self._stored, step.position)
        if written and (at == len(self._stored) or self._stored[at] != step.position):
            self._stored.insert(at, step.position)
        return written

    async def keep(self, step: Step) -> None:
        """Write a step replayed by arguments at its own position, with the recorded result.

        The next attempt of the same (changed) agent then replays it by position like any other step,
        and every step after it too, instead of diverging here again. The entry keeps the origin of the
        result it stands for, so that result still serves one call only. Counts as a replay, not a record.
        """
        entry = {**self._entry(step), 'payload': step.payload, 'matched': True}
        self._tried_max = max(self._tried_max, step.position)
        if await self._protect_pool() and await self._write_entry(step, entry):
            self._saved.add(step.position)

    async def fence(self, step: Step, error: BaseException) -> None:
        """Record that `step` ran but its result cannot be journaled, so a retry stops there.

        The side effect already happened; without this entry a retry would silently run it again.
        Never raises: the caller raises the error that explains what went wrong.
        """
        if not step.replayable:
            return
        entry = {**self._entry(step), 'payload': None, 'unjournalable': one_line(error, 300)}
        self._tried_max = max(self._tried_max, step.position)
        try:
            what = f'the fence of step {step.position} ({step.name})'
            if not await self._protect_pool() or not await self._write_entry(step, entry, what):
                raise JournalError('the journal refused it')
        except Exception as exc:
            log.warning(
                'Execution %r run %s: step %d (%s) ran but neither its result nor a fence could be recorded (%s); '
                'a retry runs it again.',
                self.attempt.key,
                self.key,
                step.position,
                step.name,
                exc,
            )

    async def _protect_pool(self) -> bool:
        """Before the first write that could overwrite a recorded result, keep the unused ones in the `pool` record.

        A diverged attempt writes its steps at positions where earlier results lie; without this copy, a
        crash after such a write would leave the next attempt without a result whose side effect happened.
        Written once per diverged attempt, and only when it holds results the record lacks.
        """
        if self.unsaved_pool is None:
            return True
        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        async with self._pool_lock:
            unsaved = self.unsaved_pool
            if unsaved is None:
                return True
            if not await self.write_record('pool', {'entries': unsaved}):
                return False  # the journal refused the copy: nothing is written over those results
            self.unsaved_pool = None
        return True

    async def write_record(self, name: str, value: dict[str, Any]) -> bool:
        """Store a run-level record (usage, meta); a store that keeps failing stops the attempt."""
        stored = {'v': ENTRY_VERSION, **value}
        saved = await self.attempt.store(
            self.state,
            f'the {name} record of run {self.key}',
            lambda epoch: self.journal.write_record(self.attempt.key, self.key, name, stored, epoch=epoch),
        )
        if saved:
            self.records[name] = stored
        return saved

    # -- failure ---------------------------------------------------------------------------------

    def note_error(self, step: Step, error: BaseException, *, recorded: int | None = None) -> None:
        """Remember that a step's body raised `error` while the run's next position was what it is now.

        An error recorded as the step's outcome (A-16) is noted at `recorded`, a position no later than the
        step's own: a run it fails must not replay it on the next attempt, but send the request again (F-2).
        """
        self._errors.note(error, step.run.next_position if recorded is None else recorded)

    async def lift_fence(self, meta: RunMeta, recorded: Iterable[int], next_position: int) -> RunMeta:
        """After the run succeeded, the fence at the first position still holding a failed attempt's entry (F-10)."""
        fence = lifted_fence(meta, recorded, self._saved)
        if fence == meta.diverge_from:
            return meta
        lifted = RunMeta(fence, max(meta.high_water, next_position), meta.model_at_fault and fence is not None)
        record = {'diverge_from': fence, 'high_water': lifted.high_water, 'model_at_fault': lifted.model_at_fault}
        await self.write_record('meta', record)  # a refused write leaves the fence where it was
        return lifted

    async def fail(
        self,
        error: BaseException,
        *,
        model_at_fault: bool,
        meta: RunMeta,
        diverged: bool,
        last_model: int | None,
        next_position: int,
    ) -> None:
        """Write the fence the next attempt must respect after this run failed (F-1..F-6)."""
        failed_at, raised_by_step = self._errors.failed_at(error, next_position)
        new_meta = next_meta(
            meta,
            failed_at=failed_at,
            raised_by_step=raised_by_step,
            model_at_fault=model_at_fault,
            diverged=diverged,
            tried_max=self._tried_max,
            last_model=last_model,
            saved=self._saved,
            next_position=next_position,
        )
        await self.write_record('meta', new_meta)  # a refused write is ignored
