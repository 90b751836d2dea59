"""Small pieces every backend shares: key hashing, the status of a listed execution, and paging a listing."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

from .._errors import EncryptionMismatch, JournalCorrupt
from .._runtime import end_holding, new_holder, start_holding
from . import _json
from ._deferred import DeferredCall, pending_of
from ._protocol import EXECUTION_STATES, ExecutionInfo, ExecutionPage, ExecutionState, Journal, Lease
from ._sealing import Sealer
from ._timer_waits import wakes_at

__all__ = (
    'MAX_PAGE',
    'Listed',
    'check_page',
    'delete_under_lease',
    'described',
    'execution_id',
    'listed',
    'metadata_of',
    'page_of',
    'retention_of',
    'state_of',
    'wanted_states',
)

MAX_PAGE = 1000
"""The most executions one page holds: a screen shows far fewer, and a bigger page is a listing of everything."""

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

    A waiting execution holds no lease, so it is never taken for an interrupted one.

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


class Listed(NamedTuple):
    """One execution as a listing shows it, from its stored record."""

    state: ExecutionState
    metadata: dict[str, Any] | None
    problem: str | None
    """Why the record could not be read (`corrupt`, or sealed under keys not given), else `None`."""
    pending: tuple[DeferredCall, ...]
    """For a waiting execution, the calls it still waits on."""
    wakes_at: float | None = None
    """For a waiting execution, when the earliest timer it ended an attempt on is over (TM-4)."""


def listed(sealer: Sealer, key: str, text: object, *, leased: bool, wanted: frozenset[ExecutionState]) -> Listed | None:
    """One execution as a listing shows it (see `described`); `None` when its state is not wanted."""
    record = _json.loads_record(text)
    if state_of(record, leased=leased) not in wanted and 'corrupt' not in wanted:
        return None  # sealed metadata is opened only for what is listed: a fleet's sweep decrypts no finished ones
    found = described(sealer, key, record, leased=leased)
    return found if found.state in wanted else None


def described(sealer: Sealer, key: str, record: dict[str, Any] | None, *, leased: bool) -> Listed:
    """One execution's state, metadata, problem, pending calls and timer, from its stored record (`None`: none).

    It is `corrupt` exactly when an attempt would refuse it: its sealed part fails authentication, or, in a
    journal given keys, it does not decode; the reason goes with it, and the listing of every other
    execution goes on. Without keys a record that does not decode reads as absent, as an attempt reads
    it, and one the keys cannot open keeps its state; both say why in `problem`.
    """
    state = state_of(record, leased=leased)
    try:
        opened = sealer.open_execution(key, record)
    except JournalCorrupt as exc:
        return Listed('corrupt', None, ' '.join(str(exc).split()), ())
    except EncryptionMismatch as exc:
        return Listed(state, None, ' '.join(str(exc).split()), ())
    problem = None
    if _json.undecoded(record):
        problem = 'its execution record does not decode (it is not a JSON object); an attempt reads it as absent'
    return Listed(state, metadata_of(opened), problem, pending_of(opened), wakes_at(opened))


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


def check_page(limit: int, offset: int) -> None:
    """Refuse a page that is not one: `limit` from 1 to `MAX_PAGE`, `offset` from 0 (B-17)."""
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f'A page holds 1 to {MAX_PAGE} executions; limit={limit!r} is not one.')
    if type(offset) is not int or offset < 0:
        raise ValueError(f'offset counts the executions skipped (0 or more), not {offset!r}.')


def page_of(
    infos: Iterable[ExecutionInfo],
    *,
    state: ExecutionState | Collection[ExecutionState] | None,
    prefix: str,
    key: str | None,
    limit: int,
    offset: int,
) -> ExecutionPage:
    """A page cut from a whole listing, for a store small enough to list (memory)."""
    wanted = wanted_states(state)
    check_page(limit, offset)
    matching = [info for info in infos if (info.key == key if key is not None else info.key.startswith(prefix))]
    counts: dict[ExecutionState, int] = {
        name: sum(info.state == name for info in matching) for name in EXECUTION_STATES
    }
    chosen = sorted((info for info in matching if info.state in wanted), key=lambda info: (-info.updated, info.key))
    return ExecutionPage(chosen[offset : offset + limit], counts)


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
