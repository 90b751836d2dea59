"""Durable timers: the agent graph's waits between polls of a background response or a batch, as steps (TM-1..TM-5).

A wait is a step at the run's position whose recorded result is its wake-up time, written before the wait
begins. A replayed wait sleeps only until that time, which for every poll an earlier attempt finished has
passed already, so a recovered run goes straight to its first live check; the wait a crash interrupted
sleeps only for what is left of it. The clock is the wall clock (`time.time`), so the wake-up time means the
same to every process that continues the execution.

A wait longer than `Durable(suspend_waits_over=...)` ends the attempt once its wake-up time is recorded: the
execution waits until then holding nothing, and the attempt that goes on sleeps only what is left (TM-4). A
cancelled attempt (its task cancelled, or its run's `CancellationToken` fired) is noted on the run when the
cancellation reaches a wait or a poll; in both cases pydantic-ai's cancellation of the job it was waiting on
does not reach the provider, and the next attempt continues the same job (TM-6).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from .._active_run import ActiveRun
from .._core import note_timer_wait
from .._errors import ExecutionWaiting
from ..journals import wait_ref
from ._pipeline import StepKind, run_step

__all__ = ('TIMER_STEP', 'Timer', 'durable_wait', 'noting_cancellation')

TIMER_STEP = 'durable_sleep'
"""The name every timer step is journaled under (P-3); part of the journal format."""

clock: Callable[[], float] = time.time
"""The wall clock wake-up times are read against (seconds since the epoch); tests replace it."""


@dataclass
class Timer(StepKind):
    """A wait of `seconds`: live, it records the wake-up time and nothing else; replayed, it hands that time back."""

    seconds: float = 0.0

    def live(self, active: ActiveRun) -> Any:
        return self._wake_up()

    async def _wake_up(self) -> object:
        seconds = max(self.seconds, 0.0)
        return {'wake_at': clock() + seconds, 'seconds': seconds}


def _wake_at(payload: object) -> float | None:
    if isinstance(payload, dict):
        wake_at = payload.get('wake_at')
        if isinstance(wake_at, (int, float)):
            return float(wake_at)
    return None


async def durable_wait(active: ActiveRun, seconds: float) -> None:
    """Wait `seconds` as a step of `active`'s run: only until the recorded wake-up time when the step replays (TM-1).

    A wait the recording attempt finished has passed its wake-up time and is not waited again (A-17, TM-3); the
    wait a crash cut short sleeps what is left of it (TM-2), through the app's sleep if it installed one. Where an
    earlier version of the package recorded another step at this position (it journaled no
    timers), the wait steps aside and does not sleep: the step it precedes replays as recorded (TM-5).
    """
    active.refuse_if_cancelling()  # TM-10: pydantic-ai then cancels the job it waited on
    recorded = active.run.recorded_next()
    if recorded is not None and recorded != TIMER_STEP:
        return
    async with noting_cancellation(active):
        payload = await run_step(active, Timer(TIMER_STEP, True, None, False, seconds))
        streak, position = active.failed_streak, active.run.next_position - 1
        if streak is not None and streak[1] == position - 1:
            active.failed_streak = (streak[0], position)  # a retry's backoff keeps its failures in a row (F-2)
        wake_at = _wake_at(payload)
        left = max(seconds, 0.0) if wake_at is None else wake_at - clock()
        if left > 0:
            _end_attempt_if_long(active, position, payload, wake_at, left)
            await (active.outer_sleep or anyio.sleep)(left)


def _end_attempt_if_long(active: ActiveRun, wait: int, payload: object, wake_at: float | None, left: float) -> None:
    """End the attempt here, its execution `waiting` until the wake-up time, if `left` is more than it may hold (TM-4).

    Only the run the app started ends its attempt: a nested run's wait is its caller's step, which has no
    position to come back to. The provider's job is kept for the attempt that goes on (`keeps_job`).
    """
    limit, run = active.suspend_waits_over, active.run
    if limit is None or left <= limit or wake_at is None or not active.top_level:
        return
    seconds = payload.get('seconds') if isinstance(payload, dict) else None
    since = wake_at - seconds if isinstance(seconds, (int, float)) else wake_at - left
    note_timer_wait(run.state.record, run.key, wait, since, wake_at)
    active.keeps_job = True
    ref = wait_ref(TIMER_STEP, run.key, wait)
    raise ExecutionWaiting(run.attempt.key, name=TIMER_STEP, wait=ref, deadline=None, wakes_at=wake_at)


@asynccontextmanager
async def noting_cancellation(active: ActiveRun) -> AsyncIterator[None]:
    """Note on `active` that the attempt was cancelled, when its cancellation ends this block (TM-6).

    A `CancellationToken` cancels the run's task too, so both arrive here as the event loop's cancellation.
    """
    try:
        yield
    except (asyncio.CancelledError, anyio.get_cancelled_exc_class()):
        active.keeps_job = True
        raise
