"""The package's exceptions.

Every message says what happened and what the user can do about it; the classes exist so callers
can tell a journal problem (retrying will not help) from an ordinary failure of their agent.
"""

from __future__ import annotations

__all__ = ('DurableError', 'ExecutionBusy', 'JournalError', 'JournalUnavailable')


class DurableError(Exception):
    """Base class of every error raised by `pydantic_ai_durable`."""


class JournalError(DurableError):
    """A value cannot be journaled or replayed.

    The same value fails the same way on every attempt, so this error is not retryable: fix the
    tool (return JSON-compatible data) instead of retrying the execution.
    """


class JournalUnavailable(DurableError):
    """The journal backend cannot be opened or written.

    Raised when an execution starts, before any model is called, so no money is spent on an
    attempt whose steps could not be recorded.
    """


class ExecutionBusy(DurableError):
    """Another live attempt holds the execution's lease.

    Two attempts on one execution would interleave positions and replay each other's answers, so
    the second one is refused before any step runs.
    """

    def __init__(self, key: str, *, holder: str, expires_at: float) -> None:
        import datetime

        self.key = key
        self.holder = holder
        self.expires_at = expires_at
        when = datetime.datetime.fromtimestamp(expires_at, tz=datetime.timezone.utc).isoformat(timespec='seconds')
        super().__init__(
            f'Execution {key!r} is held by another live attempt ({holder}) until {when}. '
            'Wait for it to finish, or stop it; a holder that died is taken over automatically.'
        )
