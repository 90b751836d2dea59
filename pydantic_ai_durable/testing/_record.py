"""What one attempt did, as a list of events: live step boundaries, crashes, side effects, warnings.

The harness judges an attempt from these events rather than from the journal, because a process
killed with SIGKILL cannot report anything afterwards: its child process appends each event to a file
the moment it happens, and the in-process harness appends the same events to a list.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .._core import STEP_OBSERVER, SimulatedCrash, Step, StepPoint, current_step
from .._execution import execution
from ..journals import Journal
from ._crash import CrashPlan

__all__ = ('AttemptRecord', 'LiveStep', 'Recorder', 'SideEffects', 'StepRef', 'run_recorded')

Event = dict[str, Any]
StepKey = tuple[str, int]

_RECORDER: ContextVar[Recorder | None] = ContextVar('pydantic_ai_durable.testing.recorder', default=None)


class SideEffects:
    """Counts named side effects, such as a card charged or an email sent, that your tools perform.

    The journal only sees whether a step's body ran; a counter you call where the effect really
    happens (after an idempotency check, say) is what proves "exactly once". Inside `crash_everywhere`
    and `assert_replays` every call is also attributed to the attempt and the step that made it.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def record(self, name: str) -> None:
        """Count one occurrence of the side effect `name`."""
        self.counts[name] += 1
        recorder = _RECORDER.get()
        if recorder is not None:
            recorder.effect(name)

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def __repr__(self) -> str:
        return f'SideEffects({dict(self.counts)!r})'


@dataclass(frozen=True)
class StepRef:
    """A step as a person finds it in the journal: its run, position, name and kind."""

    run: str
    position: int
    name: str
    kind: str

    @property
    def key(self) -> StepKey:
        return (self.run, self.position)

    def __str__(self) -> str:
        run = '' if self.run == '0' else f' of run {self.run}'
        return f'step {self.position}{run} ({self.kind} {self.name})'


class _WarningCapture(logging.Handler):
    """Forwards WARNING records of the package's logger: they say why a resumed step ran live."""

    def __init__(self, emit: Callable[[Event], None]) -> None:
        super().__init__(logging.WARNING)
        self._emit = emit

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._emit({'t': 'warning', 'message': record.getMessage()})
        except Exception:  # a broken sink must not break the agent under test
            self.handleError(record)


class Recorder:
    """The step observer of one attempt: emits an event at each live step boundary, then crashes if planned.

    `plan` is the crash to inject; the event for the boundary where it fires is a `crash` event written
    before the crash, so it survives a SIGKILL.
    """

    def __init__(self, emit: Callable[[Event], None], plan: CrashPlan | None = None) -> None:
        self.emit = emit
        self.plan = plan

    def __call__(self, step: Step, point: StepPoint) -> None:
        plan = self.plan
        fires = plan is not None and not plan.fired and point == plan.point and plan.matches(step)
        self.emit(
            {
                't': 'crash' if fires else 'step',
                'run': step.run.key,
                'position': step.position,
                'name': step.name,
                'kind': step.kind,
                'point': point,
                'replayable': step.replayable,
                'rule': step.live_by_rule,
            }
        )
        if plan is not None:
            plan(step, point)

    def effect(self, name: str) -> None:
        step = current_step()
        where = None if step is None else [step.run.key, step.position]
        self.emit({'t': 'effect', 'name': name, 'step': where})

    @contextmanager
    def active(self) -> Iterator[None]:
        """Observe steps, side effects and the package's warnings while the attempt runs."""
        logger = logging.getLogger('pydantic_ai_durable')
        handler = _WarningCapture(self.emit)
        level = logger.level
        if logger.getEffectiveLevel() > logging.WARNING:
            logger.setLevel(logging.WARNING)
        logger.addHandler(handler)
        observer_token = STEP_OBSERVER.set(self)
        recorder_token = _RECORDER.set(self)
        try:
            yield
        finally:
            _RECORDER.reset(recorder_token)
            STEP_OBSERVER.reset(observer_token)
            logger.removeHandler(handler)
            logger.setLevel(level)


@dataclass
class LiveStep:
    """One step that ran live in an attempt, and how far it got."""

    ref: StepRef
    replayable: bool = True
    rule: str | None = None
    """The rule by which it runs live on every attempt (opted out, secret-masked result, ...), if any."""
    started: bool = False
    """Its body started (the crash, if any, was not at `before_body`)."""
    recorded: bool = False
    """It reached `after_record`: a later attempt replays it."""

    @property
    def in_flight(self) -> bool:
        """Started and never recorded: a retry runs it again, which a crash may legitimately cause."""
        return self.started and not self.recorded


@dataclass
class AttemptRecord:
    """What one attempt did, parsed from its events, with how it ended."""

    steps: dict[StepKey, LiveStep] = field(default_factory=dict)
    crash: tuple[StepRef, StepPoint] | None = None
    effects: list[tuple[str, StepKey | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    completed: bool = False
    """The scenario returned."""
    crashed: bool = False
    """The attempt ended with the injected crash (a `SimulatedCrash`, or the process was killed)."""
    error: str | None = None
    """Any other way it ended: an exception, an exit status, a timeout."""
    output: Any = None
    result: Any = None
    """The scenario's return value (in-process only)."""
    exception: BaseException | None = None
    """The exception the attempt ended with (in-process only)."""
    replayed: int = 0
    log: str = ''
    """What a child process printed (SIGKILL variant only)."""

    @classmethod
    def parse(cls, events: Iterable[Event]) -> AttemptRecord:
        attempt = cls()
        for event in events:
            kind = event.get('t')
            if kind in ('step', 'crash'):
                ref = StepRef(str(event['run']), int(event['position']), str(event['name']), str(event['kind']))
                step = attempt.steps.setdefault(ref.key, LiveStep(ref, replayable=bool(event['replayable'])))
                rule = event.get('rule')
                step.rule = step.rule or (str(rule) if rule else None)
                point: StepPoint = event['point']
                if point == 'before_body':
                    step.started = kind == 'step'
                elif point == 'after_record':
                    step.recorded = True
                if kind == 'crash':
                    attempt.crash = (ref, point)
            elif kind == 'effect':
                where = event.get('step')
                attempt.effects.append((str(event['name']), (str(where[0]), int(where[1])) if where else None))
            elif kind == 'warning':
                attempt.warnings.append(str(event['message']))
            elif kind == 'result':
                attempt.completed = True
                attempt.output = event.get('output')
                attempt.replayed = int(event.get('replayed', 0))
            elif kind == 'error':
                attempt.error = str(event['error'])
            elif kind == 'crashed':
                attempt.crashed = True
        return attempt

    def effect_counts(self) -> Counter[str]:
        return Counter(name for name, _ in self.effects)

    def by_rule(self) -> tuple[tuple[StepRef, str], ...]:
        """The steps that ran live by a rule of the journal, with that rule."""
        return tuple((step.ref, step.rule) for step in self.steps.values() if step.rule is not None)


def contains_crash(error: BaseException) -> bool:
    """Whether `error` is the injected crash, possibly wrapped in an exception group by a task group."""
    if isinstance(error, SimulatedCrash):
        return True
    inner = getattr(error, 'exceptions', None)
    return isinstance(inner, tuple) and any(isinstance(e, BaseException) and contains_crash(e) for e in inner)


def describe_error(error: BaseException) -> str:
    return f'{type(error).__name__}: {error}'


async def run_recorded(
    scenario: Callable[[], Awaitable[Any]],
    *,
    journal: Journal,
    key: str,
    recorder: Recorder,
    encode: Callable[[Any], Any] = lambda value: value,
) -> tuple[Any, BaseException | None]:
    """Run one attempt of `scenario` under `execution(key)`, observed by `recorder`.

    The attempt's end is an event too (`result`, `crashed` or `error`), so a parent process reads the
    same story from a child's event file as the in-process harness reads from its list.
    """
    with recorder.active():
        try:
            async with execution(key, journal=journal, cleanup='keep') as handle:
                result = await scenario()
        except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
            raise
        except BaseException as error:
            if contains_crash(error):
                recorder.emit({'t': 'crashed'})
            else:
                recorder.emit({'t': 'error', 'error': describe_error(error)})
            return None, error
        output = getattr(result, 'output', result)
        recorder.emit({'t': 'result', 'output': encode(output), 'replayed': sum(handle.stats.replayed.values())})
    return result, None
