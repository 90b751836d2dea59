"""The timers an execution waits on, as its record lists them: one reader for listings, the core and the sweep.

A run whose wait between two polls is longer than `Durable(suspend_waits_over=...)` ends its attempt there,
and the execution waits, holding nothing, until the wait's wake-up time (TM-4). The attempt notes that wait
in its record under `TIMERS`, by run, with its position and wake-up time; listings show the earliest one
(`ExecutionInfo.wakes_at`) and the sweep sends the execution on once it has passed.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ('TIMERS', 'timer_waits', 'wakes_at')

TIMERS = 'timers'
"""The execution record's field that holds the long waits its runs ended on, by run key: `{"wait": position,
"wake_at": epoch seconds, "since": epoch seconds}`; part of the record format."""


def timer_waits(record: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The long waits noted in the record, by run key; an entry of the wrong shape is left out."""
    stored = (record or {}).get(TIMERS)
    if not isinstance(stored, dict):
        return {}
    return {
        run: wait
        for run, wait in stored.items()
        if isinstance(wait, dict)
        and _finite(wait.get('wake_at'))
        and type(wait.get('wait')) is int
        and isinstance(run, str)
    }


def wakes_at(record: dict[str, Any] | None) -> float | None:
    """For a waiting execution: the earliest wake-up time of the waits it ended on (`None`: it waits on no timer)."""
    if record is None or record.get('status') != 'waiting':
        return None
    times = [float(wait['wake_at']) for wait in timer_waits(record).values()]
    return min(times) if times else None


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
