"""A PostgreSQL journal listed: whole (`listing`), or a page at a time through indexes.

The statements are `_pg_sql`'s (`page_counts`, `page_rows`, `page_sizes`); this module runs them and turns
their rows into an `ExecutionPage`. The state of an execution is judged as `list_executions` judges it: a
live lease by the server's clock makes it running unless it is an ended attempt of this process, and
otherwise the status its record holds, kept in a column of its own since schema version 4. A schema
upgraded from an older version gets that column filled from the records once (`fill_status`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, LiteralString

from .._runtime import ours_and_ended
from . import _json
from ._common import check_page, described, execution_id, listed, wanted_states
from ._pg_sql import Sql
from ._pg_values import key_bytes, key_text
from ._protocol import EXECUTION_STATES, RECORDED_STATES, ExecutionInfo, ExecutionPage, ExecutionState
from ._sealing import Sealer

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ('fill_status', 'read_page', 'status_of')


def status_of(record: dict[str, Any] | None) -> str | None:
    """The status a record holds, as the `status` column keeps it."""
    status = (record or {}).get('status')
    return status if isinstance(status, str) else None


async def fill_status(conn: AsyncConnection[Any], sql: Sql) -> None:
    """Copy each record's status into its column: once, when a schema of an older version is upgraded."""
    rows = await (await conn.execute(sql.unset_status)).fetchall()
    found = [(eid, status_of(_json.loads_dict(text))) for eid, text in rows]
    if found:
        params = {'eids': [eid for eid, _ in found], 'statuses': [status for _, status in found]}
        await conn.execute(sql.set_status, params)


def _after(prefix: bytes) -> bytes | None:
    """The first byte string after every one that starts with `prefix` (`None`: there is none)."""
    trimmed = prefix.rstrip(b'\xff')
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else None


async def read_page(
    conn: AsyncConnection[Any],
    sql: Sql,
    sealer: Sealer,
    *,
    state: ExecutionState | Collection[ExecutionState] | None,
    prefix: str,
    key: str | None,
    limit: int,
    offset: int,
) -> ExecutionPage:
    wanted = wanted_states(state)
    check_page(limit, offset)
    low = key_bytes(prefix)
    params: dict[str, Any] = {
        'eid': execution_id(key) if key is not None else None,
        'low': low,
        'high': _after(low),
        'recorded': list(RECORDED_STATES),
    }
    counts: dict[ExecutionState, int] = dict.fromkeys(EXECUTION_STATES, 0)
    for bucket, holder, count in await (await conn.execute(sql.page_counts, params)).fetchall():
        running = holder is not None and not ours_and_ended(holder)
        found: ExecutionState = 'running' if running else bucket if bucket in counts else 'interrupted'
        counts[found] += int(count)
    params.update(
        running='running' in wanted,
        statuses=[name for name in wanted if name in RECORDED_STATES],
        interrupted='interrupted' in wanted,
        limit=limit,
        offset=offset,
    )
    rows = await (await conn.execute(sql.page_rows, params)).fetchall()
    sizes: dict[str, list[int]] = {}
    eids = [row[0] for row in rows]
    if eids:
        for eid, _, steps, size in await (await conn.execute(sql.page_sizes, {'eids': eids})).fetchall():
            runs_steps_bytes = sizes.setdefault(eid, [0, 0, 0])
            runs_steps_bytes[0] += 1
            runs_steps_bytes[1] += int(steps)
            runs_steps_bytes[2] += int(size or 0)
    infos: list[ExecutionInfo] = []
    for eid, raw_key, text, leased, holder, retain_until, updated in rows:
        name = key_text(raw_key)
        if name is None:
            continue
        leased_alive = bool(leased) and not ours_and_ended(holder or '')
        shown = described(sealer, name, _json.loads_record(text), leased=leased_alive)
        runs, steps, size = sizes.get(eid, [0, 0, 0])
        infos.append(
            ExecutionInfo(
                key=name,
                runs=runs,
                steps=steps,
                bytes=size + (len(text) if isinstance(text, str) else 0),
                state=shown.state,
                updated=float(updated) if updated is not None else 0.0,
                metadata=shown.metadata,
                retain_until=float(retain_until) if retain_until is not None else None,
                problem=shown.problem,
                pending=shown.pending,
                wakes_at=shown.wakes_at,
            )
        )
    return ExecutionPage(infos, counts)


async def fetch_all(conn: AsyncConnection[Any], statement: LiteralString) -> list[tuple[Any, ...]]:
    """Every row `statement` selects (the whole listing reads all executions in one statement)."""
    return await (await conn.execute(statement)).fetchall()


def listing(rows: list[tuple[Any, ...]], sealer: Sealer, wanted: frozenset[ExecutionState]) -> list[ExecutionInfo]:
    """`list_executions` from the rows of `Sql.list`, by key; a record that does not open is `corrupt`."""
    infos: list[ExecutionInfo] = []
    for raw_key, text, leased, holder, retain_until, updated, runs, steps, size in rows:
        key = key_text(raw_key)
        live = bool(leased) and not ours_and_ended(holder or '')
        shown = listed(sealer, key, text, leased=live, wanted=wanted) if key is not None else None
        if key is None or shown is None:
            continue
        infos.append(
            ExecutionInfo(
                key=key,
                runs=int(runs),
                steps=int(steps),
                bytes=int(size),
                state=shown.state,
                updated=float(updated) if updated is not None else 0.0,
                metadata=shown.metadata,
                retain_until=float(retain_until) if retain_until is not None else None,
                problem=shown.problem,
                pending=shown.pending,
                wakes_at=shown.wakes_at,
            )
        )
    return sorted(infos, key=lambda info: info.key)
