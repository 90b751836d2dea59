"""Small pieces every backend shares: key hashing and the status of a listed execution."""

from __future__ import annotations

import hashlib
from typing import Any

from ._holder import end_holding, new_holder, start_holding
from ._protocol import ExecutionStatus, Journal, Lease

__all__ = ('delete_under_lease', 'execution_id', 'status_of')

_DELETE_TTL = 60.0
"""Seconds a deletion holds its lease: long enough for any deletion, short if the deleting process dies."""


def execution_id(key: str) -> str:
    """A fixed-length identity for an execution key.

    Hashing the whole key means no separator inside a key can make two executions share storage
    (J-6, B-4): `etl`+`load_data` and `etl_load`+`data` are different strings, so different digests.
    """
    return hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()


def status_of(record: dict[str, Any] | None, *, leased: bool) -> ExecutionStatus:
    """Running while a live lease exists; otherwise what the last attempt said, `failed` if it died silently."""
    if leased:
        return 'running'
    status = (record or {}).get('status')
    return 'finished' if status == 'finished' else 'failed'


async def delete_under_lease(journal: Journal, key: str, *, force: bool) -> Lease | None:
    """Delete an execution after taking its lease, so a stale holder's next write is refused (B-13).

    Returns `None` once deleted, or the live lease of another holder when that one is not given up
    (`force` takes even a live lease: its holder stops at its next step).
    """
    holder = new_holder()
    start_holding(holder)
    try:
        lease = await journal.acquire_lease(key, holder, _DELETE_TTL, force=force)
        if lease.holder != holder:
            return lease
        try:
            await journal.delete_execution(key, epoch=lease.epoch)
        finally:
            await journal.release_lease(key, holder, lease.epoch)  # gone with the execution, unless it failed
        return None
    finally:
        end_holding(holder)
