"""A disk journal listed a page at a time (B-17): two partial indexes over `cache.db` and the statements reading them.

Listing every execution reads every head, record and entry of the journal; an operator's screen needs one
page of the most recently changed executions and how many there are in each state. Heads (`{eid}/h`) are
rewritten with every change of their execution, so the time SQLite stamps on a head's row orders
executions by their last change; a partial index covering the heads' rows (`journal_heads`) reads them in
that order, and another (`journal_leases`) finds the few lease rows without a scan. Both are derived data:
created on the first listing, kept by SQLite from then on, and a journal that cannot take them (read-only)
is still listed correctly, only slower. Every SQL statement of the listing is in this module.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from . import _json
from ._common import check_page, execution_id, metadata_of, state_of, wanted_states
from ._disk_leases import held_alive
from ._protocol import EXECUTION_STATES, ExecutionInfo, ExecutionPage, ExecutionState
from ._sealing import Sealer

__all__ = ('Listing',)

_INDEXES = (
    "CREATE INDEX IF NOT EXISTS journal_heads ON Cache(store_time, key, value) WHERE key GLOB '*/h'",
    "CREATE INDEX IF NOT EXISTS journal_leases ON Cache(key) WHERE key GLOB '*/l'",
)
_EID = 'substr(h.key, 1, length(h.key) - 2)'
"""A head's or a lease's row key less its `/h` or `/l`: the execution's digest."""
_STATUS = (
    "coalesce(CASE WHEN json_valid(h.value) THEN json_extract(h.value, '$.status') END, "
    f"(SELECT CASE WHEN json_valid(x.value) THEN json_extract(x.value, '$.status') END FROM Cache AS x "
    f"WHERE x.key = {_EID} || '/x'))"
)
"""The status the execution record holds, copied into the head; a head written before the copy reads the record."""
_BUCKET = f"CASE {_STATUS} WHEN 'finished' THEN 'finished' WHEN 'failed' THEN 'failed' ELSE 'interrupted' END"
"""The state an execution no live lease holds (FN-3)."""
_KEY = "CASE WHEN json_valid(h.value) THEN json_extract(h.value, '$.key') END"


class Listing:
    """The pages of one opened journal cache (a `JournalCache`), its indexes made once."""

    def __init__(self, cache: Any, path: Path, sealer: Sealer) -> None:
        self.cache = cache
        self._path = path
        self._sealer = sealer
        self.indexed = all(cache.add_index(statement) for statement in _INDEXES)

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
        for held in alive:  # a live lease makes it running, whatever its record says (FN-3)
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
        record = _json.loads_dict(stored)
        steps, size = self.steps(eid)
        retain_until = head.get('retain_until')
        updated = head.get('updated')
        return ExecutionInfo(
            key=head['key'],
            runs=sum(isinstance(run, dict) for run in head['runs'].values()),
            steps=steps,
            bytes=size + (len(stored) if isinstance(stored, str) else 0),
            state=state_of(record, leased=leased),
            updated=float(updated) if isinstance(updated, (int, float)) else 0.0,
            metadata=metadata_of(self._sealer.open_execution(head['key'], record)),
            retain_until=float(retain_until) if isinstance(retain_until, (int, float)) else None,
        )

    def leased(self) -> list[str]:
        """The digests of the executions with a lease row: live ones, and those a dead holder left."""
        hint = 'INDEXED BY journal_leases ' if self.indexed else ''
        rows = self.cache.rows(f"SELECT {_EID} FROM Cache AS h {hint}WHERE h.key GLOB '*/l'")
        return [eid for (eid,) in rows if isinstance(eid, str)]

    def _matching(self, prefix: str, eid: str | None) -> tuple[str, tuple[Any, ...]]:
        params: tuple[Any, ...]
        where, params = "h.key GLOB '*/h'", ()
        if eid is not None:
            where, params = f'{where} AND h.key = ?', (f'{eid}/h',)
        if prefix:
            where, params = f'{where} AND substr({_KEY}, 1, ?) = ?', (*params, len(prefix), prefix)
        return where, params

    def counts(self, prefix: str, eid: str | None) -> dict[str, int]:
        """How many matching executions are in each state no lease changes (`finished`, `failed`, `interrupted`)."""
        where, params = self._matching(prefix, eid)
        rows = self.cache.rows(f'SELECT {_BUCKET}, count(*) FROM Cache AS h WHERE {where} GROUP BY 1', params)
        return {str(bucket): int(count) for bucket, count in rows}

    def bucket(self, eid: str, prefix: str) -> str | None:
        """The state of one execution its lease aside, when it matches `prefix` (`None`: no head, or no match)."""
        where, params = self._matching(prefix, eid)
        rows = self.cache.rows(f'SELECT {_BUCKET} FROM Cache AS h WHERE {where}', params)
        return str(rows[0][0]) if rows else None

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
        where, params = self._matching(prefix, eid)
        running = 'running' in wanted
        others = json.dumps(sorted(state for state in wanted if state != 'running'))
        held = json.dumps(sorted(alive))
        state = (
            f'(({_EID} IN (SELECT value FROM json_each(?)) AND ?) '
            f'OR ({_EID} NOT IN (SELECT value FROM json_each(?)) AND {_BUCKET} IN (SELECT value FROM json_each(?))))'
        )
        order = 'ORDER BY h.store_time DESC, h.key DESC LIMIT ? OFFSET ?'
        rows = self.cache.rows(
            f'SELECT {_EID}, h.value FROM Cache AS h WHERE {where} AND {state} {order}',
            (*params, held, running, held, others, limit, offset),
        )
        return [(eid, text) for eid, text in rows if isinstance(eid, str)]

    def steps(self, eid: str) -> tuple[int, int]:
        """How many entries the execution holds, and their bytes: a range of the key index, not a scan."""
        rows = self.cache.rows(
            'SELECT count(*), coalesce(sum(length(value)), 0) FROM Cache WHERE key >= ? AND key < ?',
            (f'{eid}/e/', f'{eid}/e0'),
        )
        count, size = rows[0]
        return int(count), int(size)
