"""Small pieces every backend shares: key hashing and the status of a listed execution."""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

from .._runtime import end_holding, new_holder, start_holding
from ._protocol import EXECUTION_STATES, ExecutionState, Journal, Lease

__all__ = ('delete_under_lease', 'execution_id', 'metadata_of', 'retention_of', 'state_of', 'wanted_states')

_DELETE_TTL = 60.0
"""Seconds a deletion holds its lease: long enough for any deletion, short if the deleting process dies."""


def execution_id(key: str) -> str:
    """A fixed-length identity for an execution key.

    Hashing the whole key means no separator inside a key can make two executions share storage
    (J-6, B-4): `etl`+`load_data` and `etl_load`+`data` are different strings, so different digests.
    """
    return hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()


def state_of(record: dict[str, Any] | None, *, leased: bool) -> ExecutionState:
    """Running while a live lease exists; otherwise what the last attempt said, `interrupted` if it said nothing.

    A waiting execution holds no lease, so it is never taken for an interrupted one (WT-1).

    `leased` must be judged as the engine judges a takeover (the store's clock, and a holder the store can
    prove dead is not a live one), so a killed holder shows as `interrupted` exactly when a retry would take
    it over (FN-3).
    """
    if leased:
        return 'running'
    status = (record or {}).get('status')
    if status == 'finished':
        return 'finished'
    if status == 'waiting':
        return 'waiting'
    return 'failed' if status == 'failed' else 'interrupted'


def metadata_of(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The metadata `execution(key, metadata=...)` stored in the record, if it is a JSON object."""
    metadata = (record or {}).get('metadata')
    return metadata if isinstance(metadata, dict) else None


def retention_of(record: dict[str, Any] | None) -> float | None:
    """For a finished execution's record: how many seconds retention keeps it (`None`: not retained)."""
    if record is None or record.get('status') != 'finished':
        return None
    retention = record.get('retention')
    if isinstance(retention, bool) or not isinstance(retention, (int, float)) or retention < 0:
        return None
    return float(retention)


def wanted_states(state: ExecutionState | Collection[ExecutionState] | None) -> frozenset[ExecutionState]:
    """The states a listing asks for, checked: one name, several, or `None` for all."""
    if state is None:
        return frozenset(EXECUTION_STATES)
    asked: list[object] = [state] if isinstance(state, str) else list(state)
    unknown = sorted(str(name) for name in asked if name not in EXECUTION_STATES)
    if unknown:
        raise ValueError(f'Unknown execution state {", ".join(unknown)}: use {", ".join(EXECUTION_STATES)}.')
    return frozenset(known for known in EXECUTION_STATES if known in asked)


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
