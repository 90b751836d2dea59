"""How long the caller of a journal call keeps retrying it: a deadline carried in a context variable (JF-2).

The attempt sets it around each journal call it retries; a backend that may wait inside a call (for a
pooled connection) reads it. It is not a parameter because it crosses the `Journal` protocol, a public
interface other backends implement, and only a backend that waits has any use for it.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ('DEADLINE',)

DEADLINE: ContextVar[float | None] = ContextVar('pydantic_ai_durable.deadline', default=None)
"""When the caller stops retrying the journal call it makes, on `local_clock()`, or `None`.

A backend that may wait inside a call waits no longer than this, so a journal that cannot be reached
stops an attempt after `write_timeout`, as a failing write does.
"""
