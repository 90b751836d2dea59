"""A disk journal's layout: the keys of an execution, and its head, the index of which keys exist.

Every key starts with the execution's digest, so no two executions share one: `{eid}/h` the head,
`{eid}/l` the lease, `{eid}/x` the execution record, `{eid}/e/{run}/{position}` entries and
`{eid}/m/{run}/{name}` run records; `retain/<deadline>/<eid>` rows index finished executions by the end
of their retention. The head holds the original key, the last update and, per run, how far its
positions may reach (`top`, reserved ahead in blocks, so a step's write is one `set`, not a
read-modify-write of the head) and its records' names. `Heads` reads heads, rebuilds one that no longer
reads, and remembers what each run's head covers, so that writes below it leave the head alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import _json

__all__ = (
    'EXPIRY',
    'RESERVE',
    'Heads',
    'delete_run_items',
    'entry_key',
    'entry_sizes',
    'expired',
    'expiry_key',
    'record_key',
)

log = logging.getLogger('pydantic_ai_durable')

_HEAD_VERSION = 1
RESERVE = 64
"""Positions a head reserves past the last one written: one head update per 64 steps of a run."""
EXPIRY = 'retain/'
"""Prefix of the retention index: `retain/<deadline in ms, 15 digits>/<eid>`, so keys sort by deadline."""
_BATCH = 1000
"""Rows of the retention index read at a time."""


def entry_key(eid: str, run: str, position: int) -> str:
    return f'{eid}/e/{run}/{position}'


def record_key(eid: str, run: str, name: str) -> str:
    return f'{eid}/m/{run}/{name}'


def expiry_key(deadline: float, eid: str) -> str:
    return f'{EXPIRY}{max(0, round(deadline * 1000)):015d}/{eid}'


def expired(cache: Any, limit: int | None) -> Iterator[str]:
    """The executions whose retention ended, earliest first, read from the index in batches as far as needed (FN-2)."""
    size = min(limit or _BATCH, _BATCH)
    low, high = EXPIRY, expiry_key(time.time(), '')
    while True:
        batch = cache.keys_between(low, high, limit=size)
        yield from (item.rsplit('/', 1)[-1] for item in batch)
        if len(batch) < size:
            return
        low = batch[-1] + '\0'  # the next key after the last one read; those pruned meanwhile are gone anyway


class Heads:
    """The heads of one disk journal's executions, and what this journal object knows of them."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self.tops: dict[tuple[str, str], int] = {}
        """Per (execution, run): positions below this are covered by the stored head, as of the run's start."""
        self.names: dict[tuple[str, str], set[str]] = {}
        """Per (execution, run): record names the stored head lists."""
        self.stamped: dict[str, float] = {}
        """Per execution: when this object last wrote the head's `updated`."""

    def read(self, cache: Any, eid: str) -> dict[str, Any]:
        """The execution's head; one that no longer reads is rebuilt from the keys it should list."""
        stored = cache.get(f'{eid}/h')
        head = _json.loads_dict(stored)
        if head is not None and head.get('v') == _HEAD_VERSION and isinstance(head.get('runs'), dict):
            return head
        if stored is None:
            return {'v': _HEAD_VERSION, 'runs': {}}
        return self._rebuild(cache, eid)

    def _rebuild(self, cache: Any, eid: str) -> dict[str, Any]:
        runs: dict[str, dict[str, Any]] = {}
        for item in list(cache.iterkeys()):
            if not (isinstance(item, str) and item.startswith(f'{eid}/')):
                continue
            parts = item.split('/')
            if len(parts) == 4 and parts[1] == 'e' and parts[3].isdigit():
                state = runs.setdefault(parts[2], {'top': 0, 'records': []})
                state['top'] = max(state['top'], int(parts[3]) + 1 + RESERVE)
            elif len(parts) == 4 and parts[1] == 'm':
                runs.setdefault(parts[2], {'top': 0, 'records': []})['records'].append(parts[3])
        log.warning(
            'The journal %r: the index of an execution was written in a format this version cannot read; '
            'it was rebuilt from the %d runs found.',
            str(self._path),
            len(runs),
        )
        head: dict[str, Any] = {'v': _HEAD_VERSION, 'runs': runs, 'updated': time.time()}
        record = _json.loads_dict(cache.get(f'{eid}/x'))
        if record is not None and isinstance(record.get('key'), str):
            head['key'] = record['key']
        return head

    def remember(self, eid: str, run: str, state: dict[str, Any]) -> None:
        top = state.get('top', 0)
        self.tops[(eid, run)] = top if isinstance(top, int) else 0
        self.names[(eid, run)] = {name for name in state.get('records', []) if isinstance(name, str)}

    def forget(self, eid: str) -> None:
        for known in (self.tops, self.names):
            for slot in [slot for slot in known if slot[0] == eid]:
                del known[slot]

    @staticmethod
    def unindex(cache: Any, head: dict[str, Any]) -> None:
        """Drop the execution's retention index row, if it has one; call inside a transaction."""
        head.pop('retain_until', None)
        expiry = head.pop('expiry', None)
        if isinstance(expiry, str) and expiry.startswith(EXPIRY):
            cache.delete(expiry)

    @staticmethod
    def every(cache: Any) -> dict[str, dict[str, Any]]:
        """The head of every execution in the journal, by execution digest."""
        heads: dict[str, dict[str, Any]] = {}
        cache.report_foreign_keys()
        for eid, text in cache.execution_rows('h').items():  # one scan, not a read per execution
            head = _json.loads_dict(text)
            if head is not None and isinstance(head.get('key'), str):
                heads[eid] = head
        return heads


def delete_run_items(cache: Any, eid: str, run: str, state: dict[str, Any]) -> None:
    """Delete a run's entries and records, as its head state lists them; call inside a transaction."""
    top = state.get('top', 0)
    limit = top if isinstance(top, int) else 0
    for position in range(limit):
        cache.delete(entry_key(eid, run, position))
    # Then on while entries exist: one the head lost track of (a head rewritten after it became
    # unreadable) must not outlive its run (C-1).
    position = limit
    while cache.delete(entry_key(eid, run, position)):
        position += 1
    for name in state.get('records', []):
        if isinstance(name, str):
            cache.delete(record_key(eid, run, name))


def entry_sizes(cache: Any) -> dict[tuple[str, str], tuple[int, int]]:
    """How many entries, and how many bytes of JSON text, each `(execution digest, run)` holds: one scan."""
    sizes: dict[tuple[str, str], tuple[int, int]] = {}
    for key, size in cache.entry_lengths():
        parts = key.split('/') if isinstance(key, str) else []
        if len(parts) != 4 or parts[1] != 'e':
            continue
        place = (parts[0], parts[2])
        count, total = sizes.get(place, (0, 0))
        sizes[place] = (count + 1, total + int(size or 0))
    return sizes
