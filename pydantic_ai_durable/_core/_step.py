"""A step: the run's handle on one claimed position, and the hooks around a live step's body.

Above the journal core, one module holds a `Step` (the step pipeline, `_steps/_pipeline.py`): it replays
its payload, or runs its body under `executing()` and records what it returned. The step passes each of
those calls on to its run, which holds the state they change; `RunView` names what it asks, so this module
does not import the run. The test harness watches live steps through `STEP_OBSERVER` and stops one with
`SimulatedCrash`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..journals import Journal
from ._attempt_view import AttemptView, StoreHold
from ._records import Kind
from ._stats import Stats

__all__ = ('STEP_OBSERVER', 'RunView', 'SimulatedCrash', 'Step', 'StepPoint', 'current_step')

_EXECUTING: ContextVar[Step | None] = ContextVar('pydantic_ai_durable.executing', default=None)
"""The step whose live body runs in this task; a run started under it is nested (R-5)."""

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


class RunView(Protocol):
    """What a step asks of the run that handed it out, and what its holders read of that run; `Run` implements it."""

    attempt: AttemptView
    key: str
    journal: Journal
    state: StoreHold

    @property
    def stats(self) -> Stats: ...

    @property
    def writes(self) -> StepWrites: ...

    @property
    def next_position(self) -> int: ...

    def reject(self, step: Step, reason: str = ...) -> None: ...


class StepWrites(Protocol):
    """What a step asks the writing half of its run (`RunWriter` implements it)."""

    async def record(
        self,
        step: Step,
        payload: Any,
        *,
        to_record: Callable[[Any], Any] | None = None,
        spend: dict[str, Any] | None = None,
        sent: Any = None,
    ) -> bool: ...

    async def keep(self, step: Step) -> None: ...

    async def fence(self, step: Step, error: BaseException) -> None: ...

    def note_error(self, step: Step, error: BaseException, *, recorded: int | None = None) -> None: ...


@dataclass
class Step:
    """One claimed unit of a run: its position, identity and, when it replays, the recorded payload."""

    run: RunView
    position: int
    name: str
    kind: Kind
    fingerprint: str | None
    replayable: bool = True
    replayed: bool = False
    payload: Any = None
    redacted: bool = False
    """The entry at this position holds only a redacted copy of the result (secrets masked), so it runs live."""
    call: str | None = None
    """Digest of the tool call's name and arguments, without its call id: what argument matching compares."""
    origin: str | None = None
    """Identity of the side effect this step's result stands for: its own when live, the matched one's otherwise."""
    by_arguments: bool = False
    """It replays the recorded result of an earlier call with the same name and arguments."""
    rerun: bool = False
    """It ran in an earlier attempt but its result could not be journaled, and runs again on request."""
    started: float | None = None
    """When its live body started (epoch seconds), kept in its entry for the console's timeline."""

    @property
    def live_by_rule(self) -> str | None:
        """Why this step runs live by design rather than for want of a record, in words and the rule's id (H-7)."""
        if not self.replayable:
            return 'its tool opted out of replay, so it runs on every attempt (A-9)'
        if self.redacted:
            return 'its result held a registered secret, which is never replayed, so it runs on every attempt (K-8)'
        if self.rerun:
            return 'its result could not be journaled, and it ran again as asked by rerun_unjournalable=True (JF-5)'
        return None

    def executing(self) -> _Executing:
        """Mark this step's live body as running, so agent runs started inside it nest under it (R-4)."""
        return _Executing(self)

    async def start(self) -> None:
        """Call right before the live body: stops the attempt if it may no longer run steps."""
        await self.ensure_attempt()
        self.started = time.time()
        self.reached('before_body')

    async def ensure_attempt(self) -> None:
        """Stop here if the attempt lost its lease or its journal; a body must not run then."""
        await self.run.attempt.ensure(self.run.state)

    async def record(
        self,
        payload: Any,
        *,
        to_record: Callable[[Any], Any] | None = None,
        spend: dict[str, Any] | None = None,
        sent: Any = None,
    ) -> bool:
        """Save the live result; see `RunWriter.record`."""
        return await self.run.writes.record(self, payload, to_record=to_record, spend=spend, sent=sent)

    async def keep(self) -> None:
        """Write a step replayed by arguments at its own position; see `RunWriter.keep`."""
        await self.run.writes.keep(self)

    def reached(self, point: StepPoint) -> None:
        """Tell the observer (if any) that a live step reached one of its boundaries."""
        observer = STEP_OBSERVER.get()
        if observer is not None:
            observer(self, point)

    def failed(self, error: BaseException, *, recorded: int | None = None) -> None:
        """Note that the body raised, or that `error` is its recorded outcome; see `RunWriter.note_error`."""
        self.run.writes.note_error(self, error, recorded=recorded)

    def reject(self, reason: str = 'recorded result no longer loads') -> None:
        """Undo a replay whose payload no longer decodes, or no longer holds; see `Run.reject`."""
        self.run.reject(self, reason)


class _Executing:
    """The block of a step's live body; a class, not a generator, since every live step enters one."""

    __slots__ = ('_step', '_token')

    def __init__(self, step: Step) -> None:
        self._step = step

    def __enter__(self) -> None:
        self._token = _EXECUTING.set(self._step)

    def __exit__(self, *exc: object) -> None:
        _EXECUTING.reset(self._token)
