"""What a queue does with a delivery whose execution met a journal error: run it again, and when (FL-2).

Three errors are not the task's fault: the execution is held by another live attempt (`ExecutionBusy`),
another attempt took it over (`LeaseLost`), or the journal failed (`JournalUnavailable`). `retry_after`
turns each into one `Retry` with its delay (`retry_delay`), and every adapter hands that to its queue's
own retry; any other error is the task's own, and `None` says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .. import ExecutionBusy, LeaseLost, retry_delay

__all__ = ('Retry', 'retry_after')

log = logging.getLogger('pydantic_ai_durable')


@dataclass(frozen=True)
class Retry:
    """Run the delivery again after `delay` seconds, because of `error`."""

    delay: float
    error: BaseException

    @property
    def busy(self) -> bool:
        """Another live attempt holds the execution: the error is no failure of the task, only a wait."""
        return isinstance(self.error, ExecutionBusy)

    @property
    def taken_over(self) -> bool:
        """Another delivery of the same id took the execution over, and reports its outcome."""
        return isinstance(self.error, LeaseLost) and self.error.holder is not None

    def log(self, key: str) -> None:
        """Say in the log why and when the task runs again."""
        holder = getattr(self.error, 'holder', None)
        why = f'{type(self.error).__name__} ({holder})' if holder else type(self.error).__name__
        log.info('Execution %r: %s; its task runs again in %.1f s.', key, why, self.delay)


def retry_after(error: BaseException, *, attempt: int, lease_ttl: float) -> Retry | None:
    """The retry a delivery that raised `error` gets (`attempt`: the queue's retry count), or `None`: a failure."""
    delay = retry_delay(error, attempt=attempt, lease_ttl=lease_ttl)
    return None if delay is None else Retry(delay, error)
