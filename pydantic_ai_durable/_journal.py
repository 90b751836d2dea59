"""The framework-neutral journal: attempts, runs, steps, matching, divergence and failure fences.

It knows positions, names, kinds, fingerprints and JSON payloads, and nothing of pydantic-ai, so
every replay rule of docs/rules.md (R, P, M, D, W, F, X, C and S) lives here once and is tested without an agent.
A run reads its recorded entries in one backend call when it starts; claims then decide
synchronously from that snapshot (P-2), and only writes are awaited.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from secrets import token_hex
from typing import Any, Literal, TypeVar

from ._errors import ExecutionBusy, JournalError, JournalUnavailable, LeaseLost, ReplayDiverged, ResultNotJournalable
from ._lease import LeaseKeeper, store_identity
from .journals._holder import end_holding, local_clock, new_holder, start_holding
from .journals._protocol import DEADLINE, Journal, RunSnapshot
from .journals._retention import DEFAULT_RETENTION, FROM_JOURNAL, Retention, check_metadata, retention_seconds

_R = TypeVar('_R')

__all__ = (
    'ENTRY_VERSION',
    'STEP_OBSERVER',
    'Attempt',
    'CleanupMode',
    'Divergence',
    'DivergenceMode',
    'Kind',
    'Run',
    'SimulatedCrash',
    'Stats',
    'Step',
    'StepOutcome',
    'StepPoint',
    'current_step',
)

log = logging.getLogger('pydantic_ai_durable')

Kind = Literal['model', 'tool', 'other']
KINDS: tuple[Kind, ...] = ('model', 'tool', 'other')
CleanupMode = Literal['keep', 'execution', 'run']
"""What the end of a successful attempt does: `keep` the finished execution until its retention ends (a retry
replays it), delete the whole `execution`, or delete each `run` as it succeeds."""

_AUTO_PRUNE = 8
"""How many expired executions the end of a successful attempt deletes at most (FN-2)."""

DivergenceMode = Literal['run_live', 'raise']
"""What a run does at its first mismatch: run live with argument-matched replay (DV-2), or stop (DV-3)."""
DIVERGENCE_MODES: tuple[DivergenceMode, ...] = ('run_live', 'raise')

ENTRY_VERSION = 1
"""Format version written into every entry, run record and execution record (B-3)."""

_EXECUTING: ContextVar[Step | None] = ContextVar('pydantic_ai_durable.executing', default=None)
"""The step whose live body runs in this task; a run started under it is nested (R-4, R-5)."""

StepPoint = Literal['before_body', 'after_body', 'after_record']
"""The boundaries of a live step where the test harness can crash it (H-3)."""

STEP_OBSERVER: ContextVar[Callable[[Step, StepPoint], None] | None] = ContextVar(
    'pydantic_ai_durable.step_observer', default=None
)
"""Called at each boundary of a live step; `pydantic_ai_durable.testing` uses it to inject crashes."""


class SimulatedCrash(BaseException):
    """The test harness's stand-in for a process death at a step boundary.

    A `BaseException`, so pydantic-ai does not turn it into a retry; the journal treats it like a
    SIGKILL: the run's failure is not recorded and the execution is not cleaned up.
    """


def current_step() -> Step | None:
    """The step whose live body is running in the current task, if any."""
    return _EXECUTING.get()


@dataclass(frozen=True)
class StepOutcome:
    """How one step of this attempt went: `replayed` from the journal, or run `live`.

    `by_arguments` marks a replay after a divergence: the step got the recorded result of an earlier call
    with the same tool name and arguments instead of running again (DV-2).
    """

    run: str
    position: int
    name: str
    kind: Kind
    outcome: Literal['replayed', 'live']
    by_arguments: bool = False


@dataclass(frozen=True)
class Divergence:
    """Where a run stopped replaying, and why (D-3)."""

    run: str
    position: int
    name: str
    reason: str


def _steps(count: int) -> str:
    return 'step' if count == 1 else 'steps'


@dataclass
class Stats:
    """What an attempt replayed and recorded, per kind (S-1), and step by step."""

    replayed: Counter[str] = field(default_factory=Counter)
    replayed_by_arguments: Counter[str] = field(default_factory=Counter)
    """The part of `replayed` served by tool name and arguments after a divergence (DV-2)."""
    recorded: Counter[str] = field(default_factory=Counter)
    not_recorded: list[tuple[str, str]] = field(default_factory=list)
    steps: list[StepOutcome] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    def summary(self) -> str:
        """The INFO line of S-2."""

        def counts(counter: Counter[str]) -> str:
            return ', '.join(f'{counter[kind]} {kind}' for kind in KINDS)

        matched = ', '.join(
            f'{count} {kind} step{"s by their" if count > 1 else " by its"} arguments after a divergence'
            for kind, count in self.replayed_by_arguments.items()
            if count
        )
        replayed, recorded = sum(self.replayed.values()), sum(self.recorded.values())
        return (
            f'replayed {replayed} {_steps(replayed)} ({counts(self.replayed)}{f"; {matched}" if matched else ""}), '
            f'recorded {recorded} new {_steps(recorded)} ({counts(self.recorded)})'
        )


@dataclass
class Step:
    """One claimed unit of a run: its position, identity and, when it replays, the recorded payload."""

    run: Run
    position: int
    name: str
    kind: Kind
    fingerprint: str | None
    replayable: bool = True
    replayed: bool = False
    payload: Any = None
    redacted: bool = False
    """The entry at this position holds only a redacted copy of the result (secrets masked), so it runs live (K-8)."""
    call: str | None = None
    """Digest of the tool call's name and arguments, without its call id: what argument matching compares (DV-2)."""
    origin: str | None = None
    """Identity of the side effect this step's result stands for: its own when live, the matched one's otherwise."""
    by_arguments: bool = False
    """It replays the recorded result of an earlier call with the same name and arguments (DV-2)."""
    rerun: bool = False
    """It ran in an earlier attempt but its result could not be journaled, and runs again on request (JF-5)."""

    @property
    def live_by_rule(self) -> str | None:
        """Why this step runs live by design rather than for want of a record, as a rule id and reason (H-7)."""
        if not self.replayable:
            return 'A-9: opted out of replay'
        if self.redacted:
            return 'K-8: its recorded result held a registered secret'
        if self.rerun:
            return 'JF-5: its result could not be journaled; rerun on request (rerun_unjournalable=True)'
        return None

    @contextmanager
    def executing(self) -> Iterator[None]:
        """Mark this step's live body as running, so agent runs started inside it nest under it (R-4)."""
        token = _EXECUTING.set(self)
        try:
            yield
        finally:
            _EXECUTING.reset(token)

    async def start(self) -> None:
        """Call right before the live body: stops the attempt if it may no longer run steps (B-10, JF-2)."""
        await self.run.attempt.ensure(self.run.state)
        self.reached('before_body')

    async def record(
        self, payload: Any, *, to_record: Callable[[Any], Any] | None = None, spend: dict[str, Any] | None = None
    ) -> bool:
        """Save the live result; see `Run.record`."""
        return await self.run.record(self, payload, to_record=to_record, spend=spend)

    async def keep(self) -> None:
        """Write a step replayed by arguments at its own position; see `Run.keep`."""
        await self.run.keep(self)

    def reached(self, point: StepPoint) -> None:
        """Tell the observer (if any) that a live step reached one of its boundaries."""
        observer = STEP_OBSERVER.get()
        if observer is not None:
            observer(self, point)

    def failed(self, error: BaseException) -> None:
        """Note that the body raised; see `Run.note_error`."""
        self.run.note_error(self, error)

    def reject(self, reason: str = 'recorded result no longer loads') -> None:
        """Undo a replay whose payload no longer decodes, or no longer holds (DV-1); see `Run.reject`."""
        self.run.reject(self, reason)


def _parse_entry(value: Any) -> dict[str, Any] | None:
    """An entry as the core reads it, or `None` when its version or shape is unknown (B-3)."""
    if not isinstance(value, dict) or value.get('v') != ENTRY_VERSION:
        return None
    if not isinstance(value.get('name'), str) or value.get('kind') not in KINDS or 'payload' not in value:
        return None
    fingerprint = value.get('fingerprint')
    if fingerprint is not None and not isinstance(fingerprint, str):
        return None
    return value


def _readable(value: Any, what: str) -> dict[str, Any] | None:
    """`value` if it is a record of this format version, else `None` after one WARNING naming `what` (B-3)."""
    if isinstance(value, dict) and value.get('v') == ENTRY_VERSION:
        return value
    log.warning('%s was written in a format this version cannot read; it is ignored.', what)
    return None


def _latest_spend(candidates: Iterable[Any]) -> dict[str, Any] | None:
    """The spend snapshot with the highest `seq`: snapshots only grow, so that is the newest.

    A snapshot is `{"seq": int, "usage": {...}}`; one of another shape is ignored with a WARNING (B-3).
    """
    best: dict[str, Any] | None = None
    for candidate in candidates:
        if candidate is None:
            continue
        if not (
            isinstance(candidate, dict)
            and type(candidate.get('seq')) is int
            and isinstance(candidate.get('usage'), dict)
        ):
            log.warning('A usage snapshot in the journal has an unknown shape; it is ignored.')
            continue
        if best is None or candidate['seq'] > best['seq']:
            best = candidate
    return best


@dataclass
class _Meta:
    """The run's failure record (F-rules), read once when the run starts."""

    diverge_from: int | None = None
    high_water: int = 0
    model_at_fault: bool = False

    @classmethod
    def parse(cls, value: dict[str, Any] | None) -> _Meta:
        if value is None:
            return cls()
        diverge_from = value.get('diverge_from')
        high_water = value.get('high_water')
        return cls(
            diverge_from=diverge_from if type(diverge_from) is int else None,
            high_water=high_water if type(high_water) is int else 0,
            model_at_fault=value.get('model_at_fault') is True,
        )


@dataclass
class _Pool:
    """The recorded tool results a diverged run may still hand out by tool name and arguments (DV-2).

    Each result stands for one side effect (its `origin`) and serves at most one call, earliest recorded
    first. `saved` lists them with their positions, as the run record `pool` keeps them safe from the
    diverged attempt's own writes.
    """

    by_call: dict[tuple[str, str], deque[dict[str, Any]]] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    saved: list[dict[str, Any]] = field(default_factory=list)

    def add(self, position: int, entry: dict[str, Any]) -> None:
        self.by_call.setdefault((entry['name'], entry['call']), deque()).append(entry)
        self.calls[entry['call']] += 1
        self.saved.append({**entry, 'position': position})

    def take(self, name: str, call: str) -> dict[str, Any] | None:
        waiting = self.by_call.get((name, call))
        if not waiting:
            return None
        self.calls[call] -= 1
        return waiting.popleft()

    def servable(self, calls: Iterable[str]) -> list[str]:
        """Those of `calls` the pool could serve, each result counted once: for crediting usage ahead (U-19)."""
        left = Counter(self.calls)
        served: list[str] = []
        for call in calls:
            if left[call] > 0:
                left[call] -= 1
                served.append(call)
        return served


class Run:
    """One agent run inside an attempt: positions, replay decisions and failure bookkeeping.

    Created by `Attempt.start_run` from a snapshot of what earlier attempts recorded for the same run
    key. Claims are synchronous so parallel steps take positions in start order (P-2).
    """

    def __init__(
        self,
        attempt: Attempt,
        state: _JournalState,
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
            entry = _parse_entry(value)
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
        self._recorded = dict(self._entries)
        """Every readable entry of the snapshot; claims pop `_entries`, this stays whole for DV-2 and DV-3."""
        self._meta = _Meta.parse(self._record('meta'))
        self.spend_snapshot = _latest_spend(
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
        self._error_notes: dict[int, tuple[BaseException, int]] = {}
        self._last_model_position: int | None = None
        self.on_divergence: DivergenceMode = on_divergence
        self.stopped: ReplayDiverged | None = None
        """Set when the run diverged under `on_divergence="raise"`: every later claim raises it again (DV-3)."""
        self._used: set[str] = set()
        """Origins of the recorded results this attempt replayed, by position or by arguments (DV-2)."""
        self._pool: _Pool | None = None
        self._unsaved_pool: list[dict[str, Any]] | None = None
        self._pool_lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f'Run({self.attempt.key!r}, {self.key!r}, next_position={self.next_position})'

    def _record(self, name: str) -> dict[str, Any] | None:
        """A run record the core can read; one of an unknown version or shape is ignored with a WARNING (B-3)."""
        if name not in self.records:
            return None
        return _readable(self.records[name], f'Execution {self.attempt.key!r} run {self.key}: its {name} record')

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
        if self.attempt.rerun_unjournalable:
            step.rerun = True
            log.warning(
                'Execution %r run %s: step %d (%s) ran in an earlier attempt but its result could not be journaled; '
                'it runs again because rerun_unjournalable=True.',
                self.attempt.key,
                self.key,
                step.position,
                step.name,
            )
            return
        raise JournalError(
            f'Step {step.position} ({step.name}) of execution {self.attempt.key!r} ran in an earlier attempt, but its '
            f'result could not be journaled ({entry["unjournalable"]}), so running it again would repeat its side '
            'effect. Make it return JSON-compatible data, then either resume with '
            f'execution({self.attempt.key!r}, rerun_unjournalable=True) to run it once more, or delete the '
            'execution to start over.'
        )

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
        self._pool = self._build_pool(protect=True)
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

    def _build_pool(self, *, protect: bool) -> _Pool:
        """The recorded tool results this attempt has not used, from the entries and the run record `pool` (DV-2).

        A result serves later calls only when it stands for a completed call: not one whose record holds
        only masked secrets (K-8), and not a payload the adapter does not count as a result (a recorded
        retry or failure would lead down the old error path). A fence (JF-5) is kept: a call that matches it
        stops, as at its position. A result still waiting at a position this run may replay (it has not
        diverged) is left to that position. With `protect`, results not yet in the `pool` record are written
        there before this attempt writes over any position (`_protect_pool`).
        """
        candidates: list[tuple[int, dict[str, Any]]] = []
        stored = self._record('pool')
        items = stored.get('entries') if stored is not None else None
        for item in items if isinstance(items, list) else ():
            entry = _parse_entry(item)
            if entry is not None and type(entry.get('position')) is int:
                candidates.append((entry['position'], entry))
        kept = {entry.get('origin') for _, entry in candidates}
        candidates += self._recorded.items()
        candidates.sort(key=lambda candidate: candidate[0])
        pool = _Pool()
        seen = self._used | {entry.get('origin') for entry in self._entries.values()}
        for position, entry in candidates:
            origin = entry.get('origin')
            if (
                entry['kind'] != 'tool'
                or not isinstance(origin, str)
                or not isinstance(entry.get('call'), str)
                or origin in seen
                or not self._serves(entry)
            ):
                continue
            seen.add(origin)
            pool.add(position, {key: value for key, value in entry.items() if key != 'position'})
        if protect and any(item['origin'] not in kept for item in pool.saved):
            self._unsaved_pool = pool.saved
        return pool

    def _serves(self, entry: dict[str, Any]) -> bool:
        if 'unjournalable' in entry:
            return True
        return entry.get('redacted') is not True and self.attempt.serves(entry['payload'])

    def _match_arguments(self, step: Step) -> dict[str, Any] | None:
        """Hand a tool call the oldest unused result recorded for the same name and arguments (DV-2).

        Asked after a divergence, or when nothing was recorded at the step's position: an attempt that
        resumes a diverged one replays its path by position, and a call the crashed attempt had not reached
        yet may still have its result in the `pool` record.
        """
        assert step.call is not None
        if self._pool is None:
            self._pool = self._build_pool(protect=False)  # a step nothing was recorded for, before any divergence
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
    ) -> bool:
        """Save a live step's payload (W-1..W-4) and return whether it was stored.

        A store that keeps failing stops the attempt with `JournalUnavailable` (JF-2), and the step is
        reported as not recorded; a payload the journal cannot encode raises `JournalError` after leaving
        a fence (JF-5).
        `spend` is a snapshot of the run's live spend (with an int `seq`) that rides along with the
        entry, so counting a step's usage costs no write of its own.
        """
        if not step.replayable:
            return False
        self._tried_max = max(self._tried_max, step.position)
        entry = self._entry(step)
        if spend is not None:
            entry['usage'] = spend
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
        entry = {**self._entry(step), 'payload': None, 'unjournalable': _one_line(error, 300)}
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
        noted = self._error_notes.get(id(error))
        if noted is None or noted[1] > self.next_position:
            self._error_notes[id(error)] = (error, self.next_position)

    def _failed_at(self, error: BaseException) -> tuple[int, bool]:
        """F-2: the next position at failure, lowered to where a step raised this error or its cause."""
        failed_at = self.next_position
        raised_by_step = False
        seen: set[int] = set()
        current: BaseException | None = error
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            noted = self._error_notes.get(id(current))
            if noted is not None and noted[0] is current:
                failed_at = min(failed_at, noted[1])
                raised_by_step = True
            current = current.__cause__ or current.__context__
        return failed_at, raised_by_step

    async def fail(self, error: BaseException, *, model_at_fault: bool) -> None:
        """Write the fence the next attempt must respect after this run failed (F-1..F-6)."""
        previous = self._meta
        failed_at, raised_by_step = self._failed_at(error)
        candidate: int | None
        if self.diverged or self._tried_max >= failed_at:
            candidate, flag = failed_at, False  # F-3
        else:
            candidate, flag = previous.diverge_from, previous.model_at_fault
        last_model = self._last_model_position
        if (  # F-4
            model_at_fault
            and not raised_by_step
            and last_model is not None
            and (candidate is None or last_model <= candidate)
        ):
            candidate, flag = last_model, True
        fence = previous.diverge_from
        if fence is not None and fence not in self._saved and (candidate is None or fence < candidate):  # F-5
            candidate, flag = fence, previous.model_at_fault
        meta = {
            'diverge_from': candidate,
            'high_water': max(previous.high_water, self.next_position),
            'model_at_fault': flag,
        }
        await self.write_record('meta', meta)  # F-6: a refused write is ignored


def check_divergence_mode(value: object) -> None:
    """Refuse an `on_divergence` that is neither `None`, `"run_live"` nor `"raise"` (DV-3)."""
    if value is not None and value not in DIVERGENCE_MODES:
        raise ValueError(f"on_divergence must be 'run_live' or 'raise', not {value!r}.")


def _one_line(error: BaseException, limit: int = 400) -> str:
    text = ' '.join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + '...'


_RETRY_FIRST = 0.02
_RETRY_MAX = 0.5
"""Backoff between tries of a failing journal call: from 20 ms, doubling, at most half a second."""


def _journal_retention(journal: Journal) -> float | None:
    """The journal's own retention (`DiskJournal(retention=...)`), or seven days for a journal without one."""
    return retention_seconds(getattr(journal, 'retention', DEFAULT_RETENTION), f'{journal!r}.retention')


@dataclass
class _JournalState:
    """What an attempt holds on one journal: the lease, and the execution record it maintains."""

    journal: Journal
    keeper: LeaseKeeper
    record: dict[str, Any] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Attempt:
    """One activation of an execution key: a fresh view over the shared journal (R-2).

    It numbers the runs it starts (R-3, R-4), holds each journal's lease and execution record, and at
    the end cleans up (C-rules) and logs the summary (S-2). Every journal call it makes for its runs
    goes through `store` / `load`, which retry a failing store for `write_timeout` seconds and then
    stop the attempt (JF-1, JF-2).
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
        """Seconds a finished execution is kept (`None`: until pruned); unset: the journal's (FN-1)."""
        self.metadata = check_metadata(metadata)
        self.on_divergence: DivergenceMode | None = on_divergence
        """The execution's divergence policy; `None` leaves it to each capability, then `"run_live"` (DV-3)."""
        self.serves = serves
        """Whether a recorded tool payload is a result that may serve a later call by its arguments (DV-2)."""
        self.tag = token_hex(6)
        """Names the side effects this attempt's live tool steps perform: `{tag}.{position}` (DV-2)."""
        self.stats = Stats()
        self.number = 1
        self.holder = new_holder()
        self.broken: JournalUnavailable | None = None
        """Set once a journal write failed for good: no step of this attempt starts after it (JF-2)."""
        self._states: dict[object, _JournalState] = {}
        self._opening: dict[object, asyncio.Future[_JournalState]] = {}
        self._top_runs = 0
        self._nested: Counter[tuple[str, int]] = Counter()
        self.runs: list[Run] = []
        self.handle: Any = None
        """The public `Execution` handle; typed loosely so this module stays framework-neutral."""

    def journal_for(self, preferred: Journal | None) -> Journal:
        """The execution's journal, else the capability's, else the default disk journal (I-2, I-4)."""
        if self.journal is not None:
            return self.journal
        return preferred if preferred is not None else self._default_journal()

    # -- guarding every journal call ------------------------------------------------------------

    def check(self, state: _JournalState) -> None:
        """Raise when this attempt may no longer run steps: its lease is lost or its journal failed (B-10, JF-2)."""
        state.keeper.check()
        if self.broken is not None:
            raise JournalUnavailable(str(self.broken))

    async def ensure(self, state: _JournalState) -> None:
        """`check`, and make sure the lease still holds; called right before a step's body (B-10)."""
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
            except (LeaseLost, JournalError):
                raise
            except Exception as exc:
                remaining = deadline - local_clock()
                if remaining <= 0:
                    tried = f'and still failed after {self.write_timeout:g} s of retries ' if patient else ''
                    raise JournalUnavailable(
                        f'Execution {self.key!r}: {what} failed in {journal!r} {tried}'
                        f'({type(exc).__name__}: {_one_line(exc)}). '
                        'This attempt stopped before its next step, so nothing ran unrecorded; retry the '
                        'execution once the journal works again, and every recorded step replays.'
                    ) from exc
                log.debug('journal call failed, retrying: %s: %r', what, exc)
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, _RETRY_MAX)
            finally:
                DEADLINE.reset(token)

    async def store(
        self, state: _JournalState, what: str, write: Callable[[int], Awaitable[bool]], *, patient: bool = True
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

    async def _finish_state(self, state: _JournalState, error: BaseException | None, *, patient: bool) -> None:
        journal = state.journal
        if error is None and (self.cleanup == 'execution' or (self.cleanup == 'run' and not state.runs)):

            async def delete(epoch: int) -> bool:
                await journal.delete_execution(self.key, epoch=epoch)
                return True

            await self.store(state, 'the cleanup of the execution', delete, patient=patient)  # C-2, or C-1
        elif error is None:  # FN-1: finished, and kept until its retention ends
            retention = self.retention if self.retention is not FROM_JOURNAL else _journal_retention(journal)
            await self._write_record(
                state, status='finished', finished=time.time(), retention=retention, patient=patient
            )
        else:
            await self._write_record(state, status='failed', patient=patient)

    # -- opening ---------------------------------------------------------------------------------

    async def open(self, journal: Journal) -> _JournalState:
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

    async def _open(self, journal: Journal) -> _JournalState:
        try:
            await journal.open()
        except JournalUnavailable:
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The journal {journal!r} cannot be opened ({type(exc).__name__}: {exc}); no model was called.'
            ) from exc
        start_holding(self.holder)
        keeper = LeaseKeeper(journal, self.key, self.holder, self.lease_ttl)
        try:
            lease = await keeper.acquire()
        except JournalUnavailable:
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The lease of execution {self.key!r} could not be taken in {journal!r} '
                f'({type(exc).__name__}: {exc}); no model was called.'
            ) from exc
        if lease.holder != self.holder:
            raise ExecutionBusy(self.key, holder=lease.holder, expires_at=lease.expires_at)
        state = _JournalState(journal, keeper)
        try:
            await self._start_record(state)
        except BaseException:
            await keeper.release()
            raise
        self._states[store_identity(journal)] = state
        return state

    async def _start_record(self, state: _JournalState) -> None:
        """Read the execution record (a wrong shape counts as empty, B-3) and mark this attempt running.

        A record that cannot be read is an error, never an empty execution (JF-1): starting afresh
        would run every recorded step again.
        """
        journal = state.journal
        stored = await self._load(journal, 'the execution record', lambda: journal.read_execution(self.key))
        readable = _readable(stored, f'Execution {self.key!r}: its record') if stored is not None else None
        record: dict[str, Any] = readable if readable is not None else {}
        listed = record.get('runs')
        state.runs = [run for run in listed if isinstance(run, str)] if isinstance(listed, list) else []
        attempts = record.get('attempts')
        self.number = (attempts if type(attempts) is int else 0) + 1
        record.pop('retention', None)  # running again: out of retention's reach until it ends (FN-2)
        record.pop('finished', None)
        if self.metadata is not None:
            record['metadata'] = self.metadata
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

    def _next_run_key(self, journal: Journal) -> str:
        parent = _EXECUTING.get()
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
        self, journal: Journal, *, start: str | None = None, on_divergence: DivergenceMode | None = None
    ) -> Run:
        """Number a new run (synchronously, in start order) and read what earlier attempts recorded for it.

        `start` fingerprints what the run is started with; see `Run._started_alike`. `on_divergence` is
        the capability's policy; the execution's own, when set, wins (DV-3).
        """
        run_key = self._next_run_key(journal)
        state = await self.open(journal)
        self.check(state)
        if run_key not in state.runs:
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

    async def _write_record(self, state: _JournalState, **changes: Any) -> None:
        async with state.lock:
            state.record.update(changes, runs=list(state.runs), updated=time.time())
            record = dict(state.record)
            await self.store(
                state,
                'the execution record',
                lambda epoch: state.journal.write_execution(self.key, record, epoch=epoch),
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
                lost = keeper.lost  # a dead process writes nothing above; a stale attempt may not (B-9)
            await keeper.release()
        end_holding(self.holder)
        if error is None:
            await self._prune_expired()
        self._log_summary()
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

    def _log_summary(self) -> None:
        stats = self.stats
        log.info('Execution %r attempt %d: %s.', self.key, self.number, stats.summary())
        tools = [name for kind, name in stats.not_recorded if kind == 'tool']
        if tools:
            names = ', '.join(f'{name} (x{count})' if count > 1 else name for name, count in Counter(tools).items())
            log.warning('Execution %r: tool steps not recorded, a retry runs them again: %s.', self.key, names)
        models = sum(1 for kind, _ in stats.not_recorded if kind == 'model')
        if models:
            log.warning(
                'Execution %r: %d model %s not recorded; a retry re-runs %s and every step after the first.',
                self.key,
                models,
                'step was' if models == 1 else 'steps were',
                'it' if models == 1 else 'them',
            )
