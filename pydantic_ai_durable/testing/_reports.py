"""What the harness reports: the replay check's findings, and each crash case of `crash_everywhere`.

A user reads these when a check fails and asserts on them when it passes, so each field says what it
holds in the user's terms: steps by run, position and name, crash points by where in the step they hit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from .._core import StepPoint
from ._record import StepRef

__all__ = ('POINTS', 'CrashCase', 'CrashReport', 'ReplayReport')

POINTS: tuple[StepPoint, ...] = get_args(StepPoint)

_POINT_TEXT: dict[str, str] = {
    'before_body': 'before its body ran',
    'after_body': 'after its body ran, before its result was recorded',
    'after_record': 'after its result was recorded',
}


@dataclass(frozen=True)
class ReplayReport:
    """What `assert_replays` saw: both runs' results and the steps the replay took from the journal."""

    first: Any
    """The live run's result."""
    second: Any
    """The replay's result."""
    steps: tuple[StepRef, ...]
    """The steps the live run recorded (model requests, tool calls, other operations), in order."""
    by_rule: tuple[tuple[StepRef, str], ...] = ()
    """Steps of the replay that ran live by a rule of the journal, with the rule (opted out, secret-masked, ...)."""


@dataclass(frozen=True)
class CrashCase:
    """One crash point: the step, where it crashed, and what went wrong after the resume (if anything)."""

    step: StepRef
    point: StepPoint
    problems: tuple[str, ...] = ()
    explanation: tuple[str, ...] = ()
    """Why steps ran live again on resume: the journal's warnings, by step."""
    hints: tuple[str, ...] = ()
    """What usually causes such a divergence, and how to fix it."""
    by_rule: tuple[tuple[StepRef, str], ...] = ()
    """Steps of the resume that ran live by a rule of the journal, with the rule; not counted as repeats."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        return f'crash {_POINT_TEXT[self.point]} of {self.step}'


@dataclass(frozen=True)
class CrashReport:
    """What `crash_everywhere` checked: the uninterrupted output, the steps, and every crash case."""

    output: Any
    steps: tuple[StepRef, ...]
    cases: tuple[CrashCase, ...]
    seconds: float
    killed: bool
    """Whether each attempt ran in a child process killed with SIGKILL."""

    @property
    def failures(self) -> tuple[CrashCase, ...]:
        return tuple(case for case in self.cases if not case.ok)
