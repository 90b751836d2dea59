"""What a delivery whose execution ends waiting returns: a small JSON object, not pydantic-ai's requests (WT-4).

A run that ends waiting for a person or an outside result returns pydantic-ai's `DeferredToolRequests`,
which a queue's JSON serializer refuses (Celery's result backend fails the task on it). The execution keeps
everything the calls need, so the delivery only reports that it waits, and on what: it ends like any task
that returned, its worker slot is free, and the queue never retries it for that.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ('Waiting',)


class Waiting(dict[str, Any]):
    """`{"state": "waiting", "key": KEY, "pending": [CALL_ID, ...]}`: a delivery's execution ended waiting.

    A `dict`, so every serializer that takes JSON takes it (and hands it on as a plain dict); in the worker's
    process it is told from a task's own dict by its type.
    """

    def __init__(self, key: str, pending: Iterable[str]) -> None:
        super().__init__(state='waiting', key=key, pending=list(pending))

    @property
    def key(self) -> str:
        """The execution key: what `resolve`, `pending_calls` and the CLI take."""
        return str(self['key'])

    @property
    def pending(self) -> list[str]:
        """The tool call ids the execution waited on when the delivery ended."""
        return list(self['pending'])
