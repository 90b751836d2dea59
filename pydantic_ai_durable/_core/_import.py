"""Writing an execution into a journal from a snapshot: import, copy and fork (XP-2, XP-3).

The target key is taken under a lease of its own first, so an import racing a live attempt is refused and
an attempt that starts meanwhile finds the key busy. What was under the key is deleted, the runs are
written, and the execution record goes last; a failure on the way deletes what was written, so the
target holds the whole execution or nothing.
"""

from __future__ import annotations

import contextlib
import copy as _copy
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from .._errors import ImportRefused, LeaseLost
from .._runtime import end_holding, new_holder, start_holding
from ..journals import Journal, Lease
from ._export import RunCopy, Snapshot, check_key, read_snapshot
from ._fences import RunMeta

__all__ = ('ImportReport', 'fork_snapshot', 'read_stable_snapshot', 'write_snapshot')

_IMPORT_TTL = 60.0
"""Seconds an import holds the target key; an importer that dies frees it then (on disk, at once)."""
_STABLE_TRIES = 20


@dataclass(frozen=True)
class ImportReport:
    """What an import, copy or fork wrote."""

    key: str
    runs: int
    steps: int
    replaced: bool
    """Whether an execution stored under `key` before was replaced (`force`)."""


async def write_snapshot(
    journal: Journal, snapshot: Snapshot, *, key: str | None = None, force: bool = False
) -> ImportReport:
    """Store `snapshot` under `key` (its own by default): all of it, or nothing (XP-2)."""
    target = check_key(key if key is not None else snapshot.key, 'target key')
    holder = new_holder()
    start_holding(holder)
    try:
        lease = await _take(journal, target, holder)
        try:
            existing = await journal.read_execution(target)
            if existing is not None and not force:
                raise ImportRefused(
                    f'An execution {target!r} already exists in {journal!r}; pass force=True (--force) to replace '
                    'it, or import it under another key (--as).',
                    key=target,
                )
            # Whatever is there (the execution replaced, or what a killed import left without a record) goes.
            await journal.delete_execution(target, epoch=lease.epoch)
            lease = await _take(journal, target, holder)
            try:
                steps = await _write(journal, target, snapshot, lease.epoch)
            except BaseException:
                with contextlib.suppress(Exception):  # the error that stopped the import is the one to see
                    await journal.delete_execution(target, epoch=lease.epoch)
                raise
        finally:
            await journal.release_lease(target, holder, lease.epoch)
    finally:
        end_holding(holder)
    return ImportReport(target, len(snapshot.runs), steps, existing is not None)


async def _take(journal: Journal, key: str, holder: str) -> Lease:
    lease = await journal.acquire_lease(key, holder, _IMPORT_TTL)
    if lease.holder != holder:
        raise ImportRefused(
            f'Execution {key!r} is running in {journal!r}: an attempt holds its lease. Nothing was written; '
            'import again once it has ended (a running execution is never replaced, even with force).',
            key=key,
        )
    return lease


async def _write(journal: Journal, key: str, snapshot: Snapshot, epoch: int) -> int:
    steps = 0
    for run in snapshot.runs:
        for position in sorted(run.entries):
            await _stored(journal.write_entry(key, run.name, position, run.entries[position], epoch=epoch), key)
            steps += 1
        for name, value in run.records.items():
            await _stored(journal.write_record(key, run.name, name, value, epoch=epoch), key)
    record = {**snapshot.record, 'key': key, 'runs': [run.name for run in snapshot.runs]}
    await _stored(journal.write_execution(key, record, epoch=epoch), key)
    return steps


async def _stored(write: Awaitable[bool], key: str) -> None:
    try:
        written = await write
    except LeaseLost:
        raise ImportRefused(
            f'Execution {key!r} was taken over while it was imported; nothing is left of it.', key=key
        ) from None
    if written is not True:
        raise ImportRefused(f'The journal refused a value of execution {key!r}; nothing is left of it.', key=key)


async def read_stable_snapshot(journal: Journal, key: str) -> Snapshot | None:
    """A snapshot that two reads in a row agree on, so a fork of a running execution is consistent (XP-3)."""
    previous = await read_snapshot(journal, key)
    for _ in range(_STABLE_TRIES):
        if previous is None:
            return None
        current = await read_snapshot(journal, key)
        if current is not None and _same(previous, current):
            return current
        previous = current
    raise ImportRefused(
        f'Execution {key!r} kept changing while it was read ({_STABLE_TRIES} reads); fork it once it has stopped.',
        key=key,
    )


def _same(a: Snapshot, b: Snapshot) -> bool:
    def runs(s: Snapshot) -> list[tuple[str, dict[int, dict[str, Any]], dict[str, dict[str, Any]]]]:
        return [(run.name, run.entries, run.records) for run in s.runs]

    record_a = {k: v for k, v in a.record.items() if k != 'updated'}
    record_b = {k: v for k, v in b.record.items() if k != 'updated'}
    return record_a == record_b and runs(a) == runs(b)


def fork_snapshot(snapshot: Snapshot, *, run: str, at: int) -> Snapshot:
    """The steps before `at` of top-level run `run`, with every run that started before it (XP-3).

    Runs nested in a step (code mode) come with that step. The cut run keeps a failure fence only where it
    lies before `at`; its usage comes from the snapshots its kept entries carry, and its argument pool,
    which holds results of steps after a divergence, is left behind.
    """
    names = [r.name for r in snapshot.runs]
    if run not in names or '.' in run:
        tops = ', '.join(n for n in names if '.' not in n) or 'none'
        raise ImportRefused(
            f'Execution {snapshot.key!r} has no top-level run {run!r} (its runs: {tops}).', key=snapshot.key
        )
    if at < 0:
        raise ImportRefused(f'A fork point is a step number from 0, not {at}.', key=snapshot.key)
    cut = int(run)
    kept: list[RunCopy] = []
    for copy in snapshot.runs:
        top, _, rest = copy.name.partition('.')
        if int(top) < cut:
            kept.append(copy)
        elif copy.name == run:
            kept.append(_cut_run(copy, at))
        elif int(top) == cut and int(rest.split('.')[0]) < at:
            kept.append(copy)  # a run nested in a kept step
    record = {
        key: value
        for key, value in _copy.deepcopy(snapshot.record).items()
        if key not in ('status', 'finished', 'retention', 'patient')
    }
    record['attempts'] = 0
    record['runs'] = [copy.name for copy in kept]
    record['forked_from'] = {'key': snapshot.key, 'run': run, 'at': at}
    return Snapshot(snapshot.key, record, kept, 'interrupted', snapshot.payloads)


def _cut_run(run: RunCopy, at: int) -> RunCopy:
    cut = RunCopy(run.name, {p: e for p, e in run.entries.items() if p < at})
    meta = run.records.get('meta')
    if meta is not None:
        parsed = RunMeta.parse(meta)
        fence = parsed.diverge_from is not None and parsed.diverge_from < at
        cut.records['meta'] = {
            **meta,
            'diverge_from': parsed.diverge_from if fence else None,
            'high_water': min(parsed.high_water, at),
            'model_at_fault': parsed.model_at_fault if fence else False,
        }
    return cut
