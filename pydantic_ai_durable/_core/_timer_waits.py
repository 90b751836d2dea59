"""Long waits that end an attempt: noted in the execution record so the attempt ends `waiting` (TM-4).

A run whose wait is longer than its capability allows a process to hold ends the attempt at that wait. The
attempt's copy of the record lists the wait under `TIMERS`, by run key, with its position and wake-up time,
and the attempt then ends `waiting`. Each attempt starts with none noted (it walks its runs again and notes
the waits it ends on), so a wait a later attempt slept through, or no longer reached, is not kept.
"""

from __future__ import annotations

import time
from typing import Any

from ..journals import TIMERS, timer_waits

__all__ = ('note_timer_wait', 'timer_ahead', 'waits_on_timer')


def note_timer_wait(record: dict[str, Any], run: str, wait: int, since: float, wake_at: float) -> None:
    """Note that run `run` ends this attempt at its wait at position `wait`, begun at `since`, until `wake_at`."""
    waits = timer_waits(record)
    waits[run] = {'wait': wait, 'since': since, 'wake_at': wake_at}
    record[TIMERS] = waits


def waits_on_timer(record: dict[str, Any]) -> bool:
    """Whether a run of the attempt ended at a long wait: the attempt then ends `waiting`."""
    return bool(timer_waits(record))


def timer_ahead(record: dict[str, Any], now: float | None = None) -> bool:
    """Whether a long wait the record lists has not reached its wake-up time: the sweep leaves it until then."""
    moment = time.time() if now is None else now
    return any(float(wait['wake_at']) > moment for wait in timer_waits(record).values())
