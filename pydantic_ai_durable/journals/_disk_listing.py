"""A disk journal listed a page at a time, through two partial indexes over `cache.db`.

Listing every execution reads every head, record and entry of the journal; an operator's screen needs one
page of the most recently changed executions and how many there are in each state. Heads (`{eid}/h`) are
rewritten with every change of their execution, so the time SQLite stamps on a head's row orders
executions by their last change; a partial index covering the heads' rows (`journal_heads`) reads them in
that order, and another (`journal_leases`) finds the few lease rows without a scan. Both are derived data:
created on the first listing, kept by SQLite from then on, and a journal that cannot take them (read-only)
is still listed correctly, only slower. The statements are `_disk_format`'s (`ListingSql`); this
module runs them and judges what a live lease changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from . import _json
from ._common import check_page, described, execution_id, wanted_states
from ._disk_format import ENTRY_TOTALS, LISTING_INDEXES, ListingSql, NotJson, lease_digests
from ._disk_leases import held_alive
from ._protocol import EXECUTION_STATES, RECORDED_STATES, ExecutionInfo, ExecutionPage, ExecutionState
from ._sealing import Sealer

__all__ = ('Listing',)


def _bucket(status: object) -> str:
    """The state of an execution no live lease holds, from the status its record holds."""
    return str(status) if status in RECORDED_STATES else 'interrupted'


class Listing:
    """The pages of one opened journal cache (a `JournalCache`), its indexes made once."""

    def __init__(self, cache: Any, path: Path, sealer: Sealer) -> None:
        self.cache = cache
        self._path = path
        self._sealer = sealer
        self.safe = False
        """Set once a head was found that is not JSON: every statement then checks each value first."""
        self.indexed = all(cache.add_index(statement) for statement in LISTING_INDEXES)

    def page(
        self,
        *,
        state: ExecutionState | Collection[ExecutionState] | None,
        prefix: str,
        key: str | None,
        limit: int,
        offset: int,
    ) -> ExecutionPage:
        wanted = wanted_states(state)
        check_page(limit, offset)
        eid = execution_id(key) if key is not None else None
        try:
            prefix.encode('utf-8')  # SQLite takes no lone surrogate, and no head's JSON holds one
        except UnicodeEncodeError:
            return ExecutionPage([], dict.fromkeys(EXECUTION_STATES, 0))
        alive = [found for found in self.leased() if held_alive(self._path, self.cache, found)]
        counts: dict[ExecutionState, int] = dict.fromkeys(EXECUTION_STATES, 0)
        stored = self.counts(prefix, eid)
        for held in alive:  # a live lease makes it running, whatever its record says
            bucket = self.bucket(held, prefix) if eid in (None, held) else None
            if bucket is not None and stored.get(bucket, 0) > 0:
                stored[bucket] -= 1
                counts['running'] += 1
        for name in EXECUTION_STATES:
            counts[name] += stored.get(name, 0) if name != 'running' else 0
        infos = [
            self._info(found, text, found in alive)
            for found, text in self.rows(prefix, eid, wanted, alive, limit, offset)
        ]
        return ExecutionPage([info for info in infos if info is not None], counts)

    def _info(self, eid: str, text: Any, leased: bool) -> ExecutionInfo | None:
        head = _json.loads_dict(text)
        if head is None or not isinstance(head.get('key'), str) or not isinstance(head.get('runs'), dict):
            return None
        stored = self.cache.get(f'{eid}/x')
        steps, size = self.steps(eid)
        retain_until = head.get('retain_until')
        updated = head.get('updated')
        shown = described(self._sealer, head['key'], _json.loads_record(stored), leased=leased)
        return ExecutionInfo(
            key=head['key'],
            runs=sum(isinstance(run, dict) for run in head['runs'].values()),
            steps=steps,
            bytes=size + (len(stored) if isinstance(stored, str) else 0),
            state=shown.state,
            updated=float(updated) if isinstance(updated, (int, float)) else 0.0,
            metadata=shown.metadata,
            retain_until=float(retain_until) if isinstance(retain_until, (int, float)) else None,
            problem=shown.problem,
            pending=shown.pending,
            wakes_at=shown.wakes_at,
        )

    def leased(self) -> list[str]:
        """The digests of the executions with a lease row: live ones, and those a dead holder left."""
        rows = self.cache.rows(lease_digests(self.indexed))
        return [eid for (eid,) in rows if isinstance(eid, str)]

    def _query(
        self, prefix: str, eid: str | None, pick: Callable[[ListingSql], str], asked: tuple[Any, ...] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement of `ListingSql`; a head that is not JSON makes it, and every later one, check first."""
        if not self.safe:
            statements = ListingSql(prefix, eid, False)
            try:
                return self.cache.rows(pick(statements), (*statements.params, *asked))  # type: ignore[no-any-return]
            except NotJson:
                self.safe = True
        statements = ListingSql(prefix, eid, True)
        return self.cache.rows(pick(statements), (*statements.params, *asked))  # type: ignore[no-any-return]

    def counts(self, prefix: str, eid: str | None) -> dict[str, int]:
        """How many matching executions are in each state no lease changes (`RECORDED_STATES` and `interrupted`).

        One pass over the heads' index; the heads that do not carry the status (written before they did)
        take a second pass that reads their records.
        """
        counts: dict[str, int] = dict.fromkeys((*RECORDED_STATES, 'interrupted'), 0)
        missing = 0
        for status, count in self._query(prefix, eid, lambda sql: sql.by_head):
            if status is None:
                missing += int(count)
            else:
                counts[_bucket(status)] += int(count)
        if missing:
            for status, count in self._query(prefix, eid, lambda sql: sql.by_record):
                counts[_bucket(status)] += int(count)
        return counts

    def bucket(self, eid: str, prefix: str) -> str | None:
        """The state of one execution its lease aside, when it matches `prefix` (`None`: no head, or no match)."""
        rows = self._query(prefix, eid, lambda sql: sql.one)
        return _bucket(rows[0][0]) if rows else None

    def rows(
        self,
        prefix: str,
        eid: str | None,
        wanted: Collection[ExecutionState],
        alive: Collection[str],
        limit: int,
        offset: int,
    ) -> list[tuple[str, Any]]:
        """`(digest, head text)` of one page of the matching executions in `wanted`, the last changed first.

        `alive` are the digests of the executions a live lease holds: `running`, whatever their record says.
        """
        held = json.dumps(sorted(alive))
        statuses = json.dumps(sorted(state for state in wanted if state in RECORDED_STATES))
        recorded = json.dumps(RECORDED_STATES)
        asked = (held, 'running' in wanted, held, statuses, 'interrupted' in wanted, recorded, limit, offset)
        return [
            (found, text)
            for found, text in self._query(prefix, eid, lambda sql: sql.page, asked)
            if isinstance(found, str)
        ]

    def steps(self, eid: str) -> tuple[int, int]:
        """How many entries the execution holds, and their bytes: a range of the key index, not a scan."""
        rows = self.cache.rows(ENTRY_TOTALS, (f'{eid}/e/', f'{eid}/e0'))
        count, size = rows[0]
        return int(count), int(size)
