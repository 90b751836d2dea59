"""Crash injection: stop an attempt at a chosen step boundary, as a dying process would (H-3)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .._core import STEP_OBSERVER, Kind, SimulatedCrash, Step, StepPoint

__all__ = ('CrashPlan', 'SimulatedCrash', 'crash_at')


@dataclass
class CrashPlan:
    """Which live step to crash and where; `fired` says whether it happened."""

    position: int | None = None
    kind: Kind | None = None
    name: str | None = None
    run: str | None = None
    point: StepPoint = 'after_record'
    nth: int = 1
    kill: bool = False
    fired: bool = False
    _seen: int = 0

    def matches(self, step: Step) -> bool:
        return (
            (self.position is None or step.position == self.position)
            and (self.kind is None or step.kind == self.kind)
            and (self.name is None or self.name in step.name)
            and (self.run is None or step.run.key == self.run)
        )

    def __call__(self, step: Step, point: StepPoint) -> None:
        if self.fired or point != self.point or not self.matches(step):
            return
        self._seen += 1
        if self._seen < self.nth:
            return
        self.fired = True
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedCrash(f'simulated crash {point} step {step.position} ({step.name}) of run {step.run.key}')


@contextmanager
def crash_at(
    *,
    position: int | None = None,
    kind: Kind | None = None,
    name: str | None = None,
    run: str | None = None,
    point: StepPoint = 'after_record',
    nth: int = 1,
    kill: bool = False,
) -> Iterator[CrashPlan]:
    """Crash the `nth` live step matching the filters at `point`; `kill=True` sends the process SIGKILL.

    The crash is a `SimulatedCrash` (a `BaseException` pydantic-ai does not catch), treated by the
    journal like a process death: nothing about the failure is recorded.
    """
    plan = CrashPlan(position=position, kind=kind, name=name, run=run, point=point, nth=nth, kill=kill)
    token = STEP_OBSERVER.set(plan)
    try:
        yield plan
    finally:
        STEP_OBSERVER.reset(token)
