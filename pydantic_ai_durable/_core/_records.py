"""The journal's stored shapes: entries, run records and execution records, and their format version (B-3).

Everything the core writes carries `ENTRY_VERSION`; what it reads back is checked here first, so a value of
another version or shape is ignored (its step runs live) instead of being replayed as something it is
not. The CLI shows a journal through the same readers, so it calls unreadable what a retry would ignore.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from .._errors import JournalCorrupt

__all__ = (
    'ENTRY_VERSION',
    'IMPORTING',
    'KINDS',
    'MODEL_ERROR',
    'Kind',
    'check_not_importing',
    'is_importing',
    'latest_spend',
    'missing_links',
    'one_line',
    'parse_entry',
    'readable',
    'run_order',
    'spend_cost',
    'unlinked',
)

log = logging.getLogger('pydantic_ai_durable')

Kind = Literal['model', 'tool', 'other']
KINDS: tuple[Kind, ...] = ('model', 'tool', 'other')

ENTRY_VERSION = 1
"""Format version written into every entry, run record and execution record."""

MODEL_ERROR = 'model_error'
"""The key of a model step's payload that records the error its request failed with (A-16); no response has it."""

IMPORTING = 'importing'
"""The execution record's field an import writes first and drops in its last write: `{"at": epoch seconds}`.

While the record holds it, what is stored under the key is an import under way, or what one left when it was
killed: never an execution an attempt may replay.
"""


def is_importing(record: object) -> bool:
    """Whether an execution record is an import's mark: an import under way, or what a killed one left."""
    return isinstance(record, dict) and IMPORTING in record


def check_not_importing(key: str, record: object) -> None:
    """Refuse an execution whose record is an import's mark: what is stored is not an execution.

    An import that is still running holds the lease, so whoever reads the mark without it reads what a killed
    import left: part of the runs. Replaying it would run the rest live as if it were a real execution.
    """
    if not is_importing(record):
        return
    raise JournalCorrupt(
        f'Execution {key!r} holds what an import left when it was stopped part way: it is not an execution, and '
        'nothing of it is replayed or run. Import the file again (what was left is replaced), or delete it '
        '(pydantic-ai-durable delete KEY).',
        key=key,
        where='the import',
    )


def parse_entry(value: Any) -> dict[str, Any] | None:
    """An entry as the core reads it, or `None` when its version or shape is unknown."""
    if not isinstance(value, dict) or value.get('v') != ENTRY_VERSION:
        return None
    if not isinstance(value.get('name'), str) or value.get('kind') not in KINDS or 'payload' not in value:
        return None
    fingerprint = value.get('fingerprint')
    if fingerprint is not None and not isinstance(fingerprint, str):
        return None
    return value


def missing_links(entries: Mapping[int, Any]) -> dict[int, int]:
    """Positions a later entry was written after and that are no longer stored: each, with that entry's.

    Every entry names in `after` the highest position of its run that was stored when it was written. A run
    may leave a position empty (a step not recorded, or still running when its process died), but a position
    a later entry was written after was stored, so its absence means an entry was deleted.
    """
    afters = {}
    for position, value in entries.items():
        entry = parse_entry(value)
        afters[position] = entry.get('after') if entry is not None else None
    return unlinked(afters)


def unlinked(afters: Mapping[int, object]) -> dict[int, int]:
    """`missing_links` over each stored position's `after` alone: what an import checks as it reads entries."""
    missing: dict[int, int] = {}
    for position, after in afters.items():
        if type(after) is int and 0 <= after < position and after not in afters:
            missing[after] = min(position, missing.get(after, position))
    return missing


def readable(value: Any, what: str) -> dict[str, Any] | None:
    """`value` if it is a record of this format version, else `None` after one WARNING naming `what`."""
    if isinstance(value, dict) and value.get('v') == ENTRY_VERSION:
        return value
    log.warning('%s was written in a format this version cannot read; it is ignored.', what)
    return None


def latest_spend(candidates: Iterable[Any]) -> dict[str, Any] | None:
    """The spend snapshot with the highest `seq`: snapshots only grow, so that is the newest.

    A snapshot is `{"seq": int, "usage": {...}}`; one of another shape is ignored with a WARNING.
    """
    best: dict[str, Any] | None = None
    for candidate in candidates:
        if candidate is None:
            continue
        if not (
            isinstance(candidate, dict)
            and type(candidate.get('seq')) is int
            and isinstance(candidate.get('usage'), dict)
        ):
            log.warning('A usage snapshot in the journal has an unknown shape; it is ignored.')
            continue
        if best is None or candidate['seq'] > best['seq']:
            best = candidate
    return best


def spend_cost(usage: Mapping[str, Any]) -> float | None:
    """The cost a spend snapshot's usage holds, or `None` when the run was not priced.

    The snapshot keeps a cost as decimal text (a float would round it), and an older one may hold a
    number; whoever shows the spend reads it here, so a priced run never shows as unpriced.
    """
    value = usage.get('cost')
    if isinstance(value, str):
        try:
            value = float(Decimal(value))
        except (InvalidOperation, ValueError):
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def one_line(error: BaseException, limit: int = 400) -> str:
    """An error's text on one line, cut to `limit` characters: for a fence's record and for messages."""
    text = ' '.join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + '...'


def run_order(run: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key putting run keys in start order: `0` < `0.1.1` < `0.3.1` < `1` < `10` (R-3, R-4).

    Run keys are dotted integers; comparing them as strings would put `10` before `2` and a nested
    run after its successors. A part that is not an integer (never written by this package) sorts last.
    """
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in run.split('.'))
