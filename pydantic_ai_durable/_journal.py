"""The framework-neutral journal: attempts, runs, steps, matching, divergence and failure fences.

It knows positions, names, kinds, fingerprints and JSON payloads, and nothing of pydantic-ai, so
every replay rule of SPEC Part II sections 2-10 lives here once and is tested without an agent.
A run reads its recorded entries in one backend call when it starts; claims then decide
synchronously from that snapshot (P-2), and only writes are awaited.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

from ._errors import ExecutionBusy, JournalUnavailable
from .journals._protocol import Journal, Lease, RunSnapshot

__all__ = (
    'ENTRY_VERSION',
    'STEP_OBSERVER',
    'Attempt',
    'CleanupMode',
    'Divergence',
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
CleanupMode = Literal['execution', 'run', 'never']

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
    """How one step of this attempt went: `replayed` from the journal, or run `live`."""

    run: str
    position: int
    name: str
    kind: Kind
    outcome: Literal['replayed', 'live']


@dataclass(frozen=True)
class Divergence:
    """Where a run stopped replaying, and why (D-3)."""

    run: str
    position: int
    name: str
    reason: str


@dataclass
class Stats:
    """What an attempt replayed and recorded, per kind (S-1), and step by step."""

    replayed: Counter[str] = field(default_factory=Counter)
    recorded: Counter[str] = field(default_factory=Counter)
    not_recorded: list[tuple[str, str]] = field(default_factory=list)
    steps: list[StepOutcome] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    def summary(self) -> str:
        """The INFO line of S-2."""

        def counts(counter: Counter[str]) -> str:
            return ', '.join(f'{counter[kind]} {kind}' for kind in KINDS)

        return (
            f'replayed {sum(self.replayed.values())} steps ({counts(self.replayed)}), '
            f'recorded {sum(self.recorded.values())} new steps ({counts(self.recorded)})'
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

    @contextmanager
    def executing(self) -> Iterator[None]:
        """Mark this step's live body as running, so agent runs started inside it nest under it (R-4)."""
        token = _EXECUTING.set(self)
        try:
            yield
        finally:
            _EXECUTING.reset(token)

    async def record(
        self, payload: Any, *, to_record: Callable[[Any], Any] | None = None, spend: dict[str, Any] | None = None
    ) -> bool:
        """Save the live result; see `Run.record`."""
        return await self.run.record(self, payload, to_record=to_record, spend=spend)

    def reached(self, point: StepPoint) -> None:
        """Tell the observer (if any) that a live step reached one of its boundaries."""
        observer = STEP_OBSERVER.get()
        if observer is not None:
            observer(self, point)

    def failed(self, error: BaseException) -> None:
        """Note that the body raised; see `Run.note_error`."""
        self.run.note_error(self, error)

    def reject(self) -> None:
        """Undo a replay whose payload no longer decodes; see `Run.reject`."""
        self.run.reject(self)


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


class Run:
    """One agent run inside an attempt: positions, replay decisions and failure bookkeeping.

    Created by `Attempt.start_run` from a snapshot of what earlier attempts recorded for the same run
    key. Claims are synchronous so parallel steps take positions in start order (P-2).
    """

    def __init__(self, attempt: Attempt, journal: Journal, key: str, snapshot: RunSnapshot) -> None:
        self.attempt = attempt
        self.journal = journal
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
        self._meta = _Meta.parse(self._record('meta'))
        self.spend_snapshot = _latest_spend(
            [self._record('usage'), *(entry.get('usage') for entry in self._entries.values())]
        )
        """The newest spend snapshot any attempt wrote for this run, from its usage record or an entry (U2-1)."""
        self.next_position = 0
        self.diverged = False
        self._previous_replayed = True  # M-5: the first claim counts as preceded by a replay
        self._tried_max = -1
        self._saved: set[int] = set()
        self._error_notes: dict[int, tuple[BaseException, int]] = {}
        self._last_model_position: int | None = None

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

    def claim(self, name: str, kind: Kind, fingerprint: str | None, *, replayable: bool = True) -> Step:
        """Take the next position and decide whether it replays (M-1..M-7). Never awaits."""
        position = self.next_position
        self.next_position += 1
        if kind == 'model':
            self._last_model_position = position
        step = Step(self, position, name, kind, fingerprint, replayable)
        entry = self._match(step)
        if entry is None:
            self._previous_replayed = False
            self.stats.steps.append(StepOutcome(self.key, position, name, kind, 'live'))
            return step
        self.stats.steps.append(StepOutcome(self.key, position, name, kind, 'replayed'))
        step.replayed = True
        step.payload = entry['payload']
        self._previous_replayed = True
        self.stats.replayed[kind] += 1
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
            self._diverge(step, reason)
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
        return entry

    def _diverge(self, step: Step, reason: str) -> None:
        self.diverged = True
        self._entries.clear()
        self.stats.divergences.append(Divergence(self.key, step.position, step.name, reason))
        log.warning(
            'Execution %r run %s diverged at position %d (%s): %s. This step and every later step of the run run live.',
            self.attempt.key,
            self.key,
            step.position,
            step.name,
            reason,
        )

    def peek(self, position: int) -> dict[str, Any] | None:
        """The entry recorded at a later position, without claiming it; obeys the replay fences (S-3)."""
        if self.diverged:
            return None
        fence = self._meta.diverge_from
        if fence is not None and position >= fence:
            return None
        return self._entries.get(position)

    def reject(self, step: Step) -> None:
        """Turn a replayed step live because its payload no longer decodes (X-2); no-op otherwise (X-3)."""
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
        self._diverge(step, 'recorded result no longer loads')

    # -- recording -------------------------------------------------------------------------------

    async def record(
        self,
        step: Step,
        payload: Any,
        *,
        to_record: Callable[[Any], Any] | None = None,
        spend: dict[str, Any] | None = None,
    ) -> bool:
        """Save a live step's payload (W-1..W-4); `False`, never an exception, when it was not stored.

        `spend` is a snapshot of the run's live spend (with an int `seq`) that rides along with the
        entry, so counting a step's usage costs no write of its own.
        """
        if not step.replayable:
            return False
        self._tried_max = max(self._tried_max, step.position)
        entry = {
            'v': ENTRY_VERSION,
            'name': step.name,
            'kind': step.kind,
            'fingerprint': step.fingerprint,
            't': time.time(),  # when it was recorded, for inspection (CLI-1)
        }
        if spend is not None:
            entry['usage'] = spend
        try:
            entry['payload'] = to_record(payload) if to_record is not None else payload
            saved = await self.journal.write_entry(self.attempt.key, self.key, step.position, entry)
        except Exception as exc:  # a journal failure must never fail a step that already succeeded
            log.debug('journal write raised %r', exc)
            saved = False
        if saved:
            self._saved.add(step.position)
            self.stats.recorded[step.kind] += 1
            log.debug('run %s: recorded step %d (%s)', self.key, step.position, step.name)
        else:
            self.stats.not_recorded.append((step.kind, step.name))
            log.warning(
                'Execution %r run %s: step %d (%s) could not be recorded; a retry will run it again.',
                self.attempt.key,
                self.key,
                step.position,
                step.name,
            )
        return saved

    async def write_record(self, name: str, value: dict[str, Any]) -> bool:
        """Store a run-level record (usage, meta); failures are logged, never raised."""
        try:
            saved = await self.journal.write_record(self.attempt.key, self.key, name, {'v': ENTRY_VERSION, **value})
        except Exception:
            saved = False
        if saved:
            self.records[name] = {'v': ENTRY_VERSION, **value}
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


def _store_identity(journal: Journal) -> object:
    """What makes two journal objects the same store: a directory's resolved path, else the object."""
    path = getattr(journal, 'path', None)
    if isinstance(path, os.PathLike):
        return ('path', os.path.realpath(path))
    return ('object', id(journal))


async def _quietly(operation: Awaitable[object]) -> None:
    """Await a best-effort clean-up step; its failure must not hide the error being handled."""
    try:
        await operation
    except Exception as exc:
        log.debug('best-effort journal operation failed: %r', exc)


def _holder() -> str:
    return f'{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}'


def _holder_is_dead(holder: str) -> bool:
    """Whether a lease holder is a process on this host that no longer exists."""
    host, _, rest = holder.partition(':')
    pid_text = rest.partition(':')[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass
class _JournalState:
    """What an attempt holds on one journal: the lease, and the execution record it maintains."""

    journal: Journal
    record: dict[str, Any]
    runs: list[str]
    renewer: _LeaseRenewer | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _LeaseRenewer:
    """Renews a lease from a daemon thread, so a long model call never lets it lapse (B-5)."""

    def __init__(self, journal: Journal, key: str, holder: str, ttl: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(journal, key, holder, ttl), name='pydantic-ai-durable-lease', daemon=True
        )
        self._thread.start()

    def _loop(self, journal: Journal, key: str, holder: str, ttl: float) -> None:
        while not self._stop.wait(ttl / 3):
            try:
                if not asyncio.run(journal.renew_lease(key, holder, ttl)):
                    log.warning('Execution %r: its lease was lost; another attempt may have taken over.', key)
                    return
            except Exception as exc:
                log.warning('Execution %r: renewing its lease failed (%s).', key, exc)

    def stop(self) -> None:
        self._stop.set()


class Attempt:
    """One activation of an execution key: a fresh view over the shared journal (R-2).

    It numbers the runs it starts (R-3, R-4), holds each journal's lease and execution record, and at
    the end cleans up (C-rules) and logs the summary (S-2).
    """

    def __init__(
        self,
        key: str,
        *,
        journal: Journal | None,
        default_journal: Callable[[], Journal],
        cleanup: CleanupMode,
        lease_ttl: float,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f'An execution key must be a non-empty string, not {key!r}.')
        if cleanup not in ('execution', 'run', 'never'):
            raise ValueError(f"cleanup must be 'execution', 'run' or 'never', not {cleanup!r}.")
        if lease_ttl <= 0:
            raise ValueError(f'lease_ttl must be a positive number of seconds, not {lease_ttl!r}.')
        self.key = key
        self.journal = journal
        self._default_journal = default_journal
        self.cleanup = cleanup
        self.lease_ttl = lease_ttl
        self.stats = Stats()
        self.number = 1
        self.holder = _holder()
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

    async def open(self, journal: Journal) -> _JournalState:
        """Open `journal` for this attempt once: reachability, lease, execution record (B-5, B-7).

        Two journal objects over the same store (two `DiskJournal`s on one directory) share one state,
        so they share one lease and one execution record. Runs that start concurrently wait for one
        opening instead of each taking the lease.
        """
        identity = _store_identity(journal)
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
        try:
            await self._take_lease(journal)
        except (ExecutionBusy, JournalUnavailable):
            raise
        except Exception as exc:
            raise JournalUnavailable(
                f'The lease of execution {self.key!r} could not be taken in {journal!r} '
                f'({type(exc).__name__}: {exc}); no model was called.'
            ) from exc
        try:
            state = await self._start_record(journal)
        except BaseException:
            await _quietly(journal.release_lease(self.key, self.holder))
            raise
        state.renewer = _LeaseRenewer(journal, self.key, self.holder, self.lease_ttl)
        self._states[_store_identity(journal)] = state
        return state

    async def _start_record(self, journal: Journal) -> _JournalState:
        """Read the execution record (a wrong shape counts as empty, B-3) and mark this attempt running."""
        try:
            stored = await journal.read_execution(self.key)
        except Exception:
            stored = None
        readable = _readable(stored, f'Execution {self.key!r}: its record') if stored is not None else None
        record: dict[str, Any] = readable if readable is not None else {}
        listed = record.get('runs')
        runs = [run for run in listed if isinstance(run, str)] if isinstance(listed, list) else []
        attempts = record.get('attempts')
        self.number = (attempts if type(attempts) is int else 0) + 1
        new_record = {
            **record,
            'v': ENTRY_VERSION,
            'key': self.key,
            'runs': runs,
            'status': 'running',
            'attempts': self.number,
            'updated': time.time(),
        }
        try:
            written = await journal.write_execution(self.key, new_record)
        except Exception as exc:
            raise JournalUnavailable(
                f'The journal {journal!r} failed to record the start of execution {self.key!r} '
                f'({type(exc).__name__}: {exc}); no model was called.'
            ) from exc
        if not written:
            raise JournalUnavailable(
                f'The journal {journal!r} refused to record the start of execution {self.key!r}; '
                'check that it is writable and not full. No model was called.'
            )
        return _JournalState(journal, new_record, runs)

    async def _take_lease(self, journal: Journal) -> None:
        held: Lease | None = await journal.acquire_lease(self.key, self.holder, self.lease_ttl)
        if held is not None and _holder_is_dead(held.holder):
            held = await journal.acquire_lease(self.key, self.holder, self.lease_ttl, take_over=held.holder)
        if held is not None:
            raise ExecutionBusy(self.key, holder=held.holder, expires_at=held.expires_at)

    def _next_run_key(self, journal: Journal) -> str:
        parent = _EXECUTING.get()
        if (
            parent is not None
            and parent.run.attempt is self
            and _store_identity(parent.run.journal) == _store_identity(journal)
        ):
            slot = (parent.run.key, parent.position)
            self._nested[slot] += 1
            return f'{parent.run.key}.{parent.position}.{self._nested[slot]}'
        key = str(self._top_runs)
        self._top_runs += 1
        return key

    async def start_run(self, journal: Journal) -> Run:
        """Number a new run (synchronously, in start order) and read what earlier attempts recorded for it."""
        run_key = self._next_run_key(journal)
        state = await self.open(journal)
        journal = state.journal
        if run_key not in state.runs:
            state.runs.append(run_key)
            await self._write_record(state)
        try:
            snapshot = await journal.read_run(self.key, run_key)
        except Exception as exc:
            log.warning(
                'Execution %r run %s: its entries could not be read (%s); it runs live.', self.key, run_key, exc
            )
            snapshot = RunSnapshot()
        run = Run(self, journal, run_key, snapshot)
        self.runs.append(run)
        return run

    async def _write_record(self, state: _JournalState, **changes: Any) -> None:
        async with state.lock:
            state.record.update(changes, runs=list(state.runs), updated=time.time())
            try:
                await state.journal.write_execution(self.key, state.record)
            except Exception as exc:
                log.warning('Execution %r: its record could not be written (%s).', self.key, exc)

    async def cleanup_run(self, run: Run) -> None:
        """Delete one finished run's entries and forget its key (C-1), never raising (C-5)."""
        state = self._states.get(_store_identity(run.journal))
        try:
            await run.journal.delete_run(self.key, run.key)
        except Exception as exc:
            log.warning('Execution %r run %s: cleanup failed (%s).', self.key, run.key, exc)
        if state is not None and run.key in state.runs:
            state.runs.remove(run.key)
            await self._write_record(state)

    async def finish(self, error: BaseException | None) -> None:
        """End the attempt: clean up after success (C-2, C-3), record the status, release leases, summarise."""
        for state in self._states.values():
            if state.renewer is not None:
                state.renewer.stop()
            journal = state.journal
            if isinstance(error, SimulatedCrash):  # a dead process writes nothing; only the lease goes
                await journal.release_lease(self.key, self.holder)
                continue
            try:
                if error is None and (self.cleanup == 'execution' or (self.cleanup == 'run' and not state.runs)):
                    await journal.delete_execution(self.key)  # C-2, or C-1's empty runs list
                else:
                    await self._write_record(state, status='failed' if error is not None else 'finished')
            except Exception as exc:
                log.warning('Execution %r: cleanup failed (%s); its entries stay in the journal.', self.key, exc)
            try:
                await journal.release_lease(self.key, self.holder)
            except Exception as exc:
                log.warning('Execution %r: releasing its lease failed (%s).', self.key, exc)
        self._log_summary()

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
                'Execution %r: %d model steps were not recorded; a retry re-runs them and every step after the first.',
                self.key,
                models,
            )
