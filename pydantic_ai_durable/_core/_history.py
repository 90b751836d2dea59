"""An execution's attempts as its record lists them: who ran each and when, and how it ended.

The record keeps the last few attempts so the console can show an execution's attempts and place its steps
on each attempt's own time axis; nothing replays from it, so a record without it (written before it was
kept) only shows less.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ('ended', 'started')

KEPT = 20
"""How many attempts the record keeps: the last ones, enough to read a flapping execution."""


def _listed(record: dict[str, Any]) -> list[dict[str, Any]]:
    history = record.get('history')
    return [dict(item) for item in history if isinstance(item, dict)] if isinstance(history, list) else []


def started(record: dict[str, Any], number: int, holder: str) -> list[dict[str, Any]]:
    """The record's history with attempt `number`, run by `holder`, started now."""
    return [*_listed(record), {'n': number, 'holder': holder, 'started': time.time()}][-KEPT:]


def ended(record: dict[str, Any], number: int, outcome: str, error: BaseException | None = None) -> list[Any]:
    """The record's history with attempt `number` ended now: how (`outcome`), and the type of the error."""
    history = _listed(record)
    if history and history[-1].get('n') == number:
        history[-1].update(ended=time.time(), outcome=outcome)
        if error is not None:
            history[-1]['error'] = type(error).__name__
    return history
