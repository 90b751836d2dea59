"""A run: positions, replay decisions and the writes of live steps (R, P, M, D, W).

`Attempt.start_run` creates a run from one read of what earlier attempts recorded under its key; each
`claim` then decides synchronously from that snapshot whether the step at the next position replays
(parallel steps take positions in start order, P-2), and only the writes of live steps are awaited. The
run sees its attempt through `AttemptView`, hands out `Step`s, and leaves argument matching (DV-2) to
`_pool` and the failure rules to `_fences`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

from .._errors import JournalError, JournalUnavailable, ReplayDiverged, ResultNotJournalable
from ..journals import RunSnapshot
from ._attempt_view import AttemptView, StoreHold
from ._fences import ErrorNotes, RunMeta, honour_unjournalable, next_meta
from ._pool import Pool, gather_pool, matchable
from ._records import ENTRY_VERSION, Kind, latest_spend, one_line, parse_entry, readable
from ._stats import Divergence, Stats, StepOutcome
from ._step import Step

__all__ = ('DIVERGENCE_MODES', 'DivergenceMode', 'Run', 'check_divergence_mode')

log = logging.getLogger('pydantic_ai_durable')

DivergenceMode = Literal['run_live', 'raise']
"""What a run does at its first mismatch: run live with argument-matched replay (DV-2), or stop (DV-3)."""
DIVERGENCE_MODES: tuple[DivergenceMode, ...] = ('run_live', 'raise')


def check_divergence_mode(value: object) -> None:
    """Refuse an `on_divergence` that is neither `None`, `"run_live"` nor `"raise"` (DV-3)."""
    if value is not None and value not in DIVERGENCE_MODES:
        raise ValueError(f"on_divergence must be 'run_live' or 'raise', not {value!r}.")


class Run:
    """One agent run inside an attempt: positions, replay decisions and failure bookkeeping.

    Created by `Attempt.start_run` from a snapshot of what earlier attempts recorded for the same run
    key. Claims are synchronous so parallel steps take positions in start order (P-2).
    """

    def __init__(
        self,
        attempt: AttemptView,
        state: StoreHold,
        key: str,
        snapshot: RunSnapshot,
        *,
        start: str | None = None,
        on_divergence: DivergenceMode = 'run_live',
    ) -> None:
        self.attempt = attempt
        self.state = state
        self.journal = state.journal
        self.key = key
        self.records: dict[str, Any] = snapshot.records
        self._entries: dict[int, dict[str, Any]] = {}
        unreadable: list[int] = []
        for position, value in snapshot.entries.items():
            entry = parse_entry(value)
            if entry is None:
                unreadable.append(position)
            else:
                self._entries[position] = entry
        if unreadable:
            log.warning(
                'Execution %r run %s: entries at positions %s were written in a format this version cannot '
                'read; those steps will run live.',
                attempt.key,
                key,
                sorted(unreadable),
            )
        self._recorded = frozenset(self._entries)
        """Positions of every readable entry of the snapshot; claims pop `_entries`, this stays whole (DV-2, DV-3)."""
        self._results = {position: entry for position, entry in self._entries.items() if matchable(entry)}
        """The recorded tool results argument matching may hand out (DV-2): kept whole, not every entry, so a
        replay holds only what it may still need once its claims popped `_entries` (PERF-3)."""
        self._meta = RunMeta.parse(self._record('meta'))
        self.spend_snapshot = latest_spend(
            [self._record('usage'), *(entry.get('usage') for entry in self._entries.values())]
        )
        """The newest spend snapshot any attempt wrote for this run, from its usage record or an entry (U2-1)."""
        self.next_position = 0
        self.diverged = False
        self.start = start
        """Fingerprint of what the run was started with (prompt, history); recorded with its first step."""
        self._previous_replayed = self._started_alike()  # M-5 (amended): the start is the first verified step
        self._tried_max = -1
        self._saved: set[int] = set()
        self._errors = ErrorNotes()
        self._last_model_position: int | None = None
        self.on_divergence: DivergenceMode = on_divergence
        self.stopped: ReplayDiverged | None = None
        """Set when the run diverged under `on_divergence="raise"`: every later claim raises it again (DV-3)."""
        self._used: set[str] = set()
        """Origins of the recorded results this attempt replayed, by position or by arguments (DV-2)."""
        self._pool: Pool | None = None
        self._unsaved_pool: list[dict[str, Any]] | None = None
        self._pool_lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f'Run({self.attempt.key!r}, {self.key!r}, next_position={self.next_position})'

    def _record(self, name: str) -> dict[str, Any] | None:
        """A run record the core can read; one of an unknown version or shape is ignored with a WARNING (B-3)."""
        if name not in self.records:
            return None
        return readable(self.records[name], f'Execution {self.attempt.key!r} run {self.key}: its {name} record')

    @property
    def stats(self) -> Stats:
        return self.attempt.stats

    # -- claiming --------------------------------------------------------------------------------

    def claim(
        self, name: str, kind: Kind, fingerprint: str | None, *, replayable: bool = True, call: str | None = None
    ) -> Step:
        """Take the next position and decide whether it replays (M-1..M-7, DV-2). Never awaits.

        `call` is a tool call's digest of name and arguments: after a divergence it lets the step replay
        a recorded result of the same call made at another position (DV-2). Raises instead when the
        attempt may no longer run steps (B-10, JF-2), when an earlier attempt left a fence for this call
        because its result could not be journaled (JF-5), or when the run diverged under
        `on_divergence="raise"` (DV-3).
        """
        self.attempt.check(self.state)
        if self.stopped is not None:
            raise self.stopped
        position = self.next_position
        self.next_position += 1
        if kind == 'model':
            self._last_model_position = position
        step = Step(self, position, name, kind, fingerprint, replayable, call=call)
        entry = self._match(step)
        if entry is None and call is not None and replayable and (self.diverged or position not in self._recorded):
            entry = self._match_arguments(step)  # DV-2: after a divergence, or where nothing was recorded (M-3)
        if entry is None:
            # M-6 (amended): a step that opted out, or whose record cannot stand in for its result, runs live
            # by design; it says nothing about the run, so the step after it is judged by what came before.
            self._previous_replayed = self._previous_replayed and (not replayable or step.redacted)
            self.stats.steps.append(StepOutcome(self.key, position, name, kind, 'live'))
            if call is not None:
                step.origin = f'{self.attempt.tag}.{position}'  # a new side effect, named once for every attempt
            return step
        self.stats.steps.append(StepOutcome(self.key, position, name, kind, 'replayed', step.by_arguments))
        step.replayed = True
        step.payload = entry['payload']
        self._previous_replayed = True
        self.stats.replayed[kind] += 1
        origin = entry.get('origin')
        if isinstance(origin, str):
            step.origin = origin
            self._used.add(origin)
        if step.by_arguments:
            self.stats.replayed_by_arguments[kind] += 1
            log.info(
                'Execution %r run %s: step %d (%s) replayed the result recorded for the same tool call and arguments.',
                self.attempt.key,
                self.key,
                position,
                name,
            )
        else:
            log.debug('run %s: replayed step %d (%s)', self.key, position, name)
        return step

    def _match(self, step: Step) -> dict[str, Any] | None:
        if not step.replayable or self.diverged:
            return None
        fence = self._meta.diverge_from
        if fence is not None and step.position >= fence:
            reason = (
                "model's answers from here failed the previous attempt"
                if self._meta.model_at_fault
                else 'previous attempt failed before this step'
            )
            self._diverge(step, reason, mismatch=False)  # F-7: a failure's fence, not a changed agent
            return None
        entry = self._entries.pop(step.position, None)
        if entry is None:
            return None  # M-3: never recorded says nothing about later steps
        if entry['name'] != step.name:
            self._diverge(step, f'previous attempt ran {entry["name"]} here')
            return None
        if entry.get('fingerprint') != step.fingerprint:
            self._diverge(step, 'request differs (prompt, model, settings, tools, arguments, history)')
            return None
        if step.fingerprint is None and not self._previous_replayed:
            return None  # M-5: unverifiable and not chained to a verified replay
        if 'unjournalable' in entry:
            self._honour_fence(step, entry)
            return None
        if entry.get('redacted') is True:
            step.redacted = True  # K-8: handing `***` back would feed it to the next live call
            return None
        return entry

    def _honour_fence(self, step: Step, entry: dict[str, Any]) -> None:
        """A step whose side effect ran but whose result could not be journaled: stop, or rerun on request (JF-5)."""
        honour_unjournalable(
            entry,
            rerun=self.attempt.rerun_unjournalable,
            execution=self.attempt.key,
            run=self.key,
            position=step.position,
            name=step.name,
        )
        step.rerun = True

    def _diverge(self, step: Step, reason: str, *, mismatch: bool = True) -> None:
        """Stop replaying by position (D-1); under `on_divergence="raise"` a mismatch stops the run instead (DV-3).

        A fence left by a failed attempt (F-7) is no mismatch: the agent did not change, the retry re-runs
        what failed. From here on, tool calls may still replay by their arguments (DV-2).
        """
        self.stats.divergences.append(Divergence(self.key, step.position, step.name, reason))
        if mismatch and self.on_divergence == 'raise':
            self.stopped = ReplayDiverged(
                self.attempt.key,
                run=self.key,
                position=step.position,
                name=step.name,
                reason=reason,
                recorded_after=sum(1 for position in self._recorded if position > step.position),
            )
            log.warning('%s', self.stopped)
            raise self.stopped
        self.diverged = True
        self._entries.clear()
        self._pool = self._gather_pool(protect=True)
        log.warning(
            'Execution %r run %s diverged at position %d (%s): %s. This step and every later step of the run run '
            'live, except tool calls whose name and arguments equal those of a recorded result not used yet, which '
            'get that result instead of running again.',
            self.attempt.key,
            self.key,
            step.position,
            step.name,
            reason,
        )

    def _gather_pool(self, *, protect: bool) -> Pool:
        """The recorded tool results this attempt has not used (DV-2), see `gather_pool`.

        With `protect`, results not yet in the `pool` record are written there before this attempt writes
        over any position (`_protect_pool`).
        """
        pool = gather_pool(self._record('pool'), self._results, self._entries.values(), self._used, self.attempt.serves)
        if protect and pool.unkept():
            self._unsaved_pool = pool.saved
        return pool

    def _match_arguments(self, step: Step) -> dict[str, Any] | None:
        """Hand a tool call the oldest unused result recorded for the same name and arguments (DV-2).

        Asked after a divergence, or when nothing was recorded at the step's position: an attempt that
        resumes a diverged one replays its path by position, and a call the crashed attempt had not reached
        yet may still have its result in the `pool` record.
        """
        assert step.call is not None
        if self._pool is None:
            self._pool = self._gather_pool(protect=False)  # a step nothing was recorded for, before any divergence
        entry = self._pool.take(step.name, step.call)
        if entry is None:
            return None
        self._used.add(entry['origin'])
        if 'unjournalable' in entry:
            self._honour_fence(step, entry)  # JF-5 by arguments: raises, or runs it once more on request
            return None
        step.by_arguments = True
        return entry

    def servable(self, calls: Iterable[str]) -> list[str]:
        """Those of these call digests a diverged run would replay by arguments now (U-19); none before it diverged."""
        return self._pool.servable(calls) if self._pool is not None and self.diverged else []

    async def _protect_pool(self) -> bool:
        """Before the first write that could overwrite a recorded result, keep the unused ones in the `pool` record.

        A diverged attempt writes its steps at positions where earlier results lie; without this copy, a
        crash after such a write would leave the next attempt without a result whose side effect happened
        (DV-2). Written once per diverged attempt, and only when it holds results the record lacks.
        """
        if self._unsaved_pool is None:
            return True
        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        async with self._pool_lock:
            unsaved = self._unsaved_pool
            if unsaved is None:
                return True
            if not await self.write_record('pool', {'entries': unsaved}):
                return False  # the journal refused the copy: nothing is written over those results
            self._unsaved_pool = None
        return True

    def peek(self, position: int) -> dict[str, Any] | None:
        """The entry recorded at a later position, without claiming it; obeys the replay fences (S-3)."""
        if self.diverged:
            return None
        fence = self._meta.diverge_from
        if fence is not None and position >= fence:
            return None
        return self._entries.get(position)

    def reject(self, step: Step, reason: str = 'recorded result no longer loads') -> None:
        """Turn a replayed step live: its payload no longer loads (X-2) or no longer holds (DV-1); else no-op (X-3)."""
        if not step.replayed:
            return
        step.replayed = False
        step.payload = None
        self.stats.replayed[step.kind] -= 1
        outcome = StepOutcome(self.key, step.position, step.name, step.kind, 'live')
        self.stats.steps = [
            outcome if (old.run, old.position) == (self.key, step.position) else old for old in self.stats.steps
        ]
        self._previous_replayed = False
        if step.call is not None:
            step.origin = f'{self.attempt.tag}.{step.position}'  # what it records now is a new side effect
        if step.by_arguments:  # the run diverged already; the matched result stays used, the call runs live
            step.by_arguments = False
            self.stats.replayed_by_arguments[step.kind] -= 1
            return
        self._diverge(step, reason)

    # -- recording -------------------------------------------------------------------------------

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

        A store that keeps failing stops the attempt with `JournalUnavailable` (JF-2), and the step is
        reported as not recorded; a payload the journal cannot encode raises `JournalError` after leaving
        a fence (JF-5).
        `spend` is a snapshot of the run's live spend (with an int `seq`) that rides along with the
        entry, so counting a step's usage costs no write of its own; so does `sent`, what the step was asked (XP-5).
        """
        if not step.replayable:
            return False
        self._tried_max = max(self._tried_max, step.position)
        entry = self._entry(step)
        if spend is not None:
            entry['usage'] = spend
        if sent is not None:
            entry['sent'] = sent
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
                # DV-2: the unused recorded results are kept safe before this write can cover one of them.
                saved = await self._protect_pool() and await self.attempt.store(
                    self.state,
                    f'step {step.position} ({step.name}) of run {self.key}',
                    lambda epoch: self.journal.write_entry(
                        self.attempt.key, self.key, step.position, entry, epoch=epoch
                    ),
                )
            except JournalUnavailable:
                self.stats.not_recorded.append((step.kind, step.name))  # it ran; the attempt stops here (JF-2)
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
        self.stats.recorded[step.kind] += 1
        log.debug('run %s: recorded step %d (%s)', self.key, step.position, step.name)
        return True

    def _entry(self, step: Step) -> dict[str, Any]:
        entry: dict[str, Any] = {
            'v': ENTRY_VERSION,
            'name': step.name,
            'kind': step.kind,
            'fingerprint': step.fingerprint,
            't': time.time(),  # when it was recorded, for inspection (CLI-1)
        }
        if step.position == 0 and self.start is not None:
            entry['start'] = self.start
        if step.call is not None:
            entry['call'] = step.call  # DV-2: what a later, diverged attempt matches a call by
            entry['origin'] = step.origin
        return entry

    async def keep(self, step: Step) -> None:
        """Write a step replayed by arguments at its own position, with the recorded result (DV-2).

        The next attempt of the same (changed) agent then replays it by position like any other step,
        and every step after it too, instead of diverging here again. The entry keeps the origin of the
        result it stands for, so that result still serves one call only. Counts as a replay, not a record.
        """
        entry = {**self._entry(step), 'payload': step.payload, 'matched': True}
        self._tried_max = max(self._tried_max, step.position)
        if not await self._protect_pool():
            return
        if await self.attempt.store(
            self.state,
            f'step {step.position} ({step.name}) of run {self.key}',
            lambda epoch: self.journal.write_entry(self.attempt.key, self.key, step.position, entry, epoch=epoch),
        ):
            self._saved.add(step.position)

    def _started_alike(self) -> bool:
        """Whether this run was started as the attempt that recorded its first step was (M-5).

        An unfingerprinted first step has nothing verified before it but the run's start: it may
        replay only when both attempts started the run with the same input. Without a start
        fingerprint (a caller that has none) the first claim counts as preceded by a replay.
        """
        if self.start is None:
            return True
        first = self._entries.get(0)
        return first is not None and first.get('start') == self.start

    async def fence(self, step: Step, error: BaseException) -> None:
        """Record that `step` ran but its result cannot be journaled, so a retry stops there (JF-5).

        The side effect already happened; without this entry a retry would silently run it again.
        Never raises: the caller raises the error that explains what went wrong.
        """
        if not step.replayable:
            return
        entry = {**self._entry(step), 'payload': None, 'unjournalable': one_line(error, 300)}
        self._tried_max = max(self._tried_max, step.position)
        try:
            if not await self._protect_pool() or not await self.attempt.store(
                self.state,
                f'the fence of step {step.position} ({step.name})',
                lambda epoch: self.journal.write_entry(self.attempt.key, self.key, step.position, entry, epoch=epoch),
            ):
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

    async def write_record(self, name: str, value: dict[str, Any]) -> bool:
        """Store a run-level record (usage, meta); a store that keeps failing stops the attempt (JF-2)."""
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

    def note_error(self, step: Step, error: BaseException) -> None:
        """Remember that a step's body raised `error` while `next_position` was what it is now (W-5)."""
        self._errors.note(error, self.next_position)

    async def fail(self, error: BaseException, *, model_at_fault: bool) -> None:
        """Write the fence the next attempt must respect after this run failed (F-1..F-6)."""
        failed_at, raised_by_step = self._errors.failed_at(error, self.next_position)
        meta = next_meta(
            self._meta,
            failed_at=failed_at,
            raised_by_step=raised_by_step,
            model_at_fault=model_at_fault,
            diverged=self.diverged,
            tried_max=self._tried_max,
            last_model=self._last_model_position,
            saved=self._saved,
            next_position=self.next_position,
        )
        await self.write_record('meta', meta)  # F-6: a refused write is ignored
