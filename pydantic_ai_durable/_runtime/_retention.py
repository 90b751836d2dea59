"""How long a finished execution is kept, as a value every layer reads the same way (FN-1).

A finished execution stays in its journal so that a retry after any crash replays it instead of running
it again; retention then deletes it. Backends take a default period, `execution()` an override, and the
journal core decides which applies (`_core/_retention.py`); all of them parse it here.
"""

from __future__ import annotations

import datetime

__all__ = ('DEFAULT_RETENTION', 'Retention', 'retention_seconds')

Retention = float | datetime.timedelta | None
"""Seconds, a `timedelta`, or `None` for never."""

DEFAULT_RETENTION = 7 * 24 * 3600.0
"""Seven days: long enough for any job queue's retries, short enough that journals do not grow forever."""


def retention_seconds(value: object, what: str = 'retention') -> float | None:
    """`value` as seconds (`None`: never), or a `TypeError` / `ValueError` saying what is accepted."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f'{what} must be seconds, a datetime.timedelta, or None for never; not {value!r}.')
    if not value >= 0 or value != value or value == float('inf'):
        raise ValueError(f'{what} must be a finite number of seconds, 0 or more (None keeps forever); not {value!r}.')
    return float(value)
