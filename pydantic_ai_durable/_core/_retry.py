"""When a job queue should run again a task whose execution raised: one answer for every engine (FL-2).

A fleet's task meets three errors that are not the task's fault: the execution is held by another live
attempt (`ExecutionBusy`), another attempt took it over (`LeaseLost`), or the journal failed
(`JournalUnavailable`). Each has one right delay, and every integration (and every queue a user glues by
hand) asks `retry_delay` for it instead of deciding again.
"""

from __future__ import annotations

import random
import time

from .._errors import ExecutionBusy, JournalUnavailable, LeaseLost

__all__ = ('retry_delay',)

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
"""Seconds before a task whose journal failed runs again: from one, doubling per attempt, at most a minute."""


def retry_delay(error: BaseException, *, attempt: int = 0, lease_ttl: float = 30.0) -> float | None:
    """Seconds after which a job queue should run again a task that raised `error`, or `None` if it must not.

    `ExecutionBusy`: when the holder's lease would end (at least one second, at most `lease_ttl`), so a
    holder that died is taken over and a live one has finished or renewed. `LeaseLost` to another holder:
    `lease_ttl`, by which time that holder has usually finished and the task replays its output; lost to a
    deletion, never. `JournalUnavailable`: backoff from one second, doubling with `attempt` (the queue's
    retry count), at most a minute. Any other error is the task's own: `None`. A little jitter keeps
    tasks that failed together from coming back together.
    """
    if isinstance(error, ExecutionBusy):
        wait = min(max(error.expires_at - time.time(), 1.0), lease_ttl)
        return wait + random.uniform(0.0, 0.5)
    if isinstance(error, LeaseLost):
        return None if error.holder is None else lease_ttl + random.uniform(0.0, 0.5)
    if isinstance(error, JournalUnavailable):
        return min(BACKOFF_FIRST * 2.0 ** min(max(attempt, 0), 10), BACKOFF_MAX) * random.uniform(0.8, 1.2)
    return None
