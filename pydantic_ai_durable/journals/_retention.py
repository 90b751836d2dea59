"""How long a finished execution is kept, and the small JSON object an execution may carry (FN-1, FN-4).

A finished execution stays in its journal so that a retry after any crash replays it instead of running
it again; retention then deletes it. The period is the execution's (`execution(retention=...)`), else
its journal's (`DiskJournal(retention=...)` and the others), else seven days; `None` keeps it until it
is pruned by hand.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

__all__ = ('DEFAULT_RETENTION', 'FROM_JOURNAL', 'METADATA_LIMIT', 'Retention', 'check_metadata', 'retention_seconds')


class _FromJournal:
    """The default of `execution(retention=...)`: the retention of the execution's journal."""

    def __repr__(self) -> str:
        return "the journal's"


FROM_JOURNAL: Any = _FromJournal()

Retention = float | datetime.timedelta | None
"""Seconds, a `timedelta`, or `None` for never."""

DEFAULT_RETENTION = 7 * 24 * 3600.0
"""Seven days: long enough for any job queue's retries, short enough that journals do not grow forever."""

METADATA_LIMIT = 16 * 1024
"""The most bytes of JSON an execution's metadata may take: it is read with every listing."""


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


def check_metadata(metadata: object) -> dict[str, Any] | None:
    """A JSON copy of `metadata`, checked before anything runs: a JSON object of at most `METADATA_LIMIT` bytes."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(isinstance(key, str) for key in metadata):
        raise TypeError(
            f'execution(metadata=...) must be a dict with str keys (a JSON object), not {type(metadata).__name__}.'
        )
    try:
        text = json.dumps(metadata, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f'execution(metadata=...) must hold only JSON data (str, int, float, bool, None, lists and dicts): {exc}. '
            'Nothing ran.'
        ) from None
    if len(text.encode('utf-8')) > METADATA_LIMIT:
        raise ValueError(
            f'execution(metadata=...) takes {len(text.encode("utf-8"))} bytes as JSON, more than {METADATA_LIMIT}: '
            'keep what a worker needs to restart the execution (ids, not documents). Nothing ran.'
        )
    copy: dict[str, Any] = json.loads(text)
    return copy
