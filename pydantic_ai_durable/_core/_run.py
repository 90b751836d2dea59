"""A run: positions and replay decisions, from one read of what earlier attempts recorded (R, P, M, D).

`Attempt.start_run` creates a run from one read of what earlier attempts recorded under its key; each
`claim` then decides synchronously from that snapshot whether the step at the next position replays
(parallel steps take positions in start order). The run sees its attempt through `AttemptView`,
hands out `Step`s, and leaves argument matching to `_pool`, the failure rules to `_fences`, and
every write (live steps, kept replays, fences, records, the failure meta) to its `RunWriter`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Literal

from .._errors import JournalCorrupt, ReplayDiverged
from ..journals import RunSnapshot
from ._attempt_view import AttemptView, StoreHold
from ._fences import RunMeta, honour_unjournalable
from ._pool import Pool, gather_pool, matchable
from ._records import Kind, latest_spend, missing_links, parse_entry, readable
from ._run_writes import RunWriter
from ._stats import Divergence, Stats, StepOutcome
from ._step import Step

__all__ = ('DIVERGENCE_MODES', 'DivergenceMode', 'Run', 'check_divergence_mode')

log = logging.getLogger('pydantic_ai_durable')

DivergenceMode = Literal['run_live', 'raise']
"""What a run does at its first mismatch: run live with argument-matched replay, or stop."""
DIVERGENCE_MODES: tuple[DivergenceMode, ...] = ('run_live', 'raise')


def _refuse_missing(execution: str, run: str, snapshot: RunSnapshot) -> None:
    """Stop before anything replays when a recorded step was deleted from under a later one (EN-3).

    A step deleted by hand or by damage would otherwise run again live, repeating its side effect.
    """
    missing = missing_links(snapshot.entries)
    if missing:
        position, later = min(missing.items())
        raise JournalCorrupt(
            f'Execution {execution!r}, run {run}: step {position} is missing from the journal, though step {later} '
            'was recorded after it was stored. An entry was deleted (by hand, or by damage to the store); the '
            'step is neither replayed nor run again. Restore the journal from a backup, or delete the execution '
            'to start it over.',
            key=execution,
            where=f'run {run}, step {position}',
        )


def check_divergence_mode(value: object) -> None:
    """Refuse an `on_divergence` that is neither `None`, `"run_live"` nor `"raise"`."""
    if value is not None and value not in DIVERGENCE_MODES:
        raise ValueError(f"on_divergence must be 'run_live' or 'raise', not {value!r}.")


class Run:
    """One agent run inside an attempt: what earlier attempts recorded for it, and what replays of it.

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
        _refuse_missing(attempt.key, key, snapshot)
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
        """Positions of every readable entry of the snapshot; claims pop `_entries`, this stays whole."""
        self._results = {position: entry for position, entry in self._entries.items() if matchable(entry)}
        """The recorded tool results argument matching may hand out: kept whole, not every entry, so a
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
        self._previous_replayed = self._started_alike()  # the start is the first verified step
        self.writes = RunWriter(attempt, state, key, self.records, start, stored=snapshot.entries)
        """Every write of this run: live steps, kept replays, fences, records (`_run_writes`)."""
        self._last_model_position: int | None = None
        self.on_divergence: DivergenceMode = on_divergence
        self.stopped: ReplayDiverged | None = None
        """Set when the run diverged under `on_divergence="raise"`: every later claim raises it again."""
        self._used: set[str] = set()
        """Origins of the recorded results this attempt replayed, by position or by arguments."""
        self._pool: Pool | None = None

    def __repr__(self) -> str:
        return f'Run({self.attempt.key!r}, {self.key!r}, next_position={self.next_position})'

    def _record(self, name: str) -> dict[str, Any] | None:
        """A run record the core can read; one of an unknown version or shape is ignored with a WARNING."""
        if name not in self.records:
            return None
        return readable(self.records[name], f'Execution {self.attempt.key!r} run {self.key}: its {name} record')

    @property
    def stats(self) -> Stats:
        return self.attempt.stats

    # -- claiming --------------------------------------------------------------------------------

    def claim(
        self,
        name: str,
        kind: Kind,
        fingerprint: str | None,
        *,
        replayable: bool = True,
        call: str | None = None,
        earlier: Callable[[], str | None] | None = None,
    ) -> Step:
        """Take the next position and decide whether it replays (M-1..M-7). Never awaits.

        `call` is a tool call's digest of name and arguments: after a divergence it lets the step replay
        a recorded result of the same call made at another position. Raises instead when the
        attempt may no longer run steps, when an earlier attempt left a fence for this call
        because its result could not be journaled, or when the run diverged under
        `on_divergence="raise"`. `earlier` gives the step's fingerprint under an earlier scheme, asked for
        only when the recorded fingerprint differs from `fingerprint` (FP-16).
        """
        self.attempt.check(self.state)
        if self.stopped is not None:
            raise self.stopped
        position = self.next_position
        self.next_position += 1
        if kind == 'model':
            self._last_model_position = position
        step = Step(self, position, name, kind, fingerprint, replayable, call=call)
        entry = self._match(step, earlier)
        if entry is None and call is not None and replayable and (self.diverged or position not in self._recorded):
            entry = self._match_arguments(step)  # after a divergence, or where nothing was recorded
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

    def recorded_next(self) -> str | None:
        """The name of the step an earlier attempt recorded at the next position, while the run has not diverged.

        Lets a kind of step this version added (a timer, TM-5) step aside where an older version recorded
        something else, instead of making the run diverge there.
        """
        if self.diverged:
            return None
        entry = self._entries.get(self.next_position)
        return None if entry is None else str(entry['name'])

    def _match(self, step: Step, earlier: Callable[[], str | None] | None = None) -> dict[str, Any] | None:
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
        recorded = entry.get('fingerprint')
        if recorded != step.fingerprint and (recorded is None or earlier is None or recorded != earlier()):
            self._diverge(step, 'request differs (prompt, model, settings, tools, arguments, history)')
            return None
        if step.fingerprint is None and not self._previous_replayed:
            return None  # unverifiable and not chained to a verified replay
        if 'unjournalable' in entry:
            self._honour_fence(step, entry)
            return None
        if entry.get('redacted') is True:
            step.redacted = True  # K-8: handing `***` back would feed it to the next live call
            return None
        return entry

    def _honour_fence(self, step: Step, entry: dict[str, Any]) -> None:
        """A step whose side effect ran but whose result could not be journaled: stop, or rerun on request."""
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

        A fence left by a failed attempt is no mismatch: the agent did not change, the retry re-runs
        what failed. From here on, tool calls may still replay by their arguments.
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
        """The recorded tool results this attempt has not used, see `gather_pool`.

        With `protect`, results not yet in the `pool` record are written there before this attempt writes
        over any position (`RunWriter._protect_pool`).
        """
        pool = gather_pool(self._record('pool'), self._results, self._entries.values(), self._used, self.attempt.serves)
        if protect and pool.unkept():
            self.writes.unsaved_pool = pool.saved
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
            self._honour_fence(step, entry)  # a fence found by arguments: raises, or runs the step once more on request
            return None
        step.by_arguments = True
        return entry

    def servable(self, calls: Iterable[str]) -> list[str]:
        """Those of these call digests a diverged run would replay by arguments now; none before it diverged."""
        return self._pool.servable(calls) if self._pool is not None and self.diverged else []

    def peek(self, position: int) -> dict[str, Any] | None:
        """The entry recorded at a later position, without claiming it; obeys the replay fences (S-3)."""
        if self.diverged:
            return None
        fence = self._meta.diverge_from
        if fence is not None and position >= fence:
            return None
        return self._entries.get(position)

    def reject(self, step: Step, reason: str = 'recorded result no longer loads') -> None:
        """Turn a replayed step live: its payload no longer loads or no longer holds; else no-op (X-3)."""
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

    def started_alike(self) -> bool:
        """Whether this run is started with the input the attempt that recorded its first step started it with."""
        return self._started_alike()

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

    # -- failure ---------------------------------------------------------------------------------

    async def succeeded(self) -> None:
        """The run ended without an exception: move its fence past what it recorded again, or lift it (F-10)."""
        if self._meta.diverge_from is not None:
            self._meta = await self.writes.lift_fence(self._meta, self._recorded, self.next_position)

    async def fail(self, error: BaseException, *, model_at_fault: bool) -> None:
        """Write the fence the next attempt must respect after this run failed."""
        await self.writes.fail(
            error,
            model_at_fault=model_at_fault,
            meta=self._meta,
            diverged=self.diverged,
            last_model=self._last_model_position,
            next_position=self.next_position,
        )
