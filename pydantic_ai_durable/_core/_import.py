"""Writing an execution into a journal from a snapshot: import, copy and fork.

The target key is taken under a lease of its own first, so an import racing a live attempt is refused and
an attempt that starts meanwhile finds the key busy; the lease is renewed as an attempt's is, however long
the import takes. What was under the key is deleted, then the execution record is written marked as an
import under way (`IMPORTING`), then the runs, and last the record without the mark, which publishes the
execution in one write. A failure on the way deletes what was written; a killed import leaves the mark,
which every attempt refuses (`JournalCorrupt`), so no attempt replays part of an import.
"""

from __future__ import annotations

import contextlib
import copy as _copy
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from .._errors import ImportRefused, LeaseLost
from .._runtime import end_holding, new_holder, start_holding
from ..journals import DEFERRED, TIMERS, Journal, decision_of
from ._cancel import CANCEL
from ._export import RunCopy, Snapshot, check_key, read_snapshot
from ._fences import RunMeta
from ._lease import LeaseKeeper
from ._provider_waits import PROVIDER_WAITS
from ._records import IMPORTING, is_importing

__all__ = ('ImportReport', 'fork_snapshot', 'read_stable_snapshot', 'write_snapshot')

_IMPORT_TTL = 60.0
"""Seconds an import's lease lasts unless renewed; it is renewed while the import runs, and an importer that
dies frees it then (on disk, at once)."""
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
    """Store `snapshot` under `key` (its own by default): all of it, or nothing an attempt replays (XP-2)."""
    target = check_key(key if key is not None else snapshot.key, 'target key')
    holder = new_holder()
    start_holding(holder)
    try:
        keeper = await _take(journal, target, holder)
        try:
            existing = await journal.read_execution(target)
            replaced = existing is not None and not is_importing(existing)
            if replaced and not force:
                raise ImportRefused(
                    f'An execution {target!r} already exists in {journal!r}; pass force=True (--force) to replace '
                    'it, or import it under another key (--as).',
                    key=target,
                )
            # Whatever is there (the execution replaced, or what a killed import left) goes, lease included.
            await keeper.stop()
            await journal.delete_execution(target, epoch=keeper.epoch)
            keeper = await _take(journal, target, holder)
            try:
                steps = await _write(journal, target, snapshot, keeper)
            except BaseException:
                await keeper.stop()
                if not isinstance(keeper.lost, LeaseLost):  # the lease's new holder decides; the mark stays
                    with contextlib.suppress(Exception):  # the error that stopped the import is the one to see
                        await journal.delete_execution(target, epoch=keeper.epoch)
                raise
        finally:
            await keeper.release()
    finally:
        end_holding(holder)
    return ImportReport(target, len(snapshot.runs), steps, replaced)


async def _take(journal: Journal, key: str, holder: str) -> LeaseKeeper:
    keeper = LeaseKeeper(journal, key, holder, _IMPORT_TTL)
    lease = await keeper.acquire()
    if lease.holder != holder:
        raise ImportRefused(
            f'Execution {key!r} is running in {journal!r}: an attempt holds its lease. Nothing was written; '
            'import again once it has ended (a running execution is never replaced, even with force).',
            key=key,
        )
    return keeper


async def _write(journal: Journal, key: str, snapshot: Snapshot, keeper: LeaseKeeper) -> int:
    record = {**snapshot.record, 'key': key, 'runs': [run.name for run in snapshot.runs]}
    marked = {field: value for field, value in record.items() if field not in ('retention', 'finished')}
    marked.update(status='failed', **{IMPORTING: {'at': time.time()}})
    await _stored(keeper, partial(journal.write_execution, key, marked))
    steps = 0
    for run in snapshot.runs:
        for position in sorted(run.entries):  # read from a file's text, each is parsed and opened here, one at a time
            await _stored(keeper, partial(journal.write_entry, key, run.name, position, run.entries[position]))
            steps += 1
        for name in run.records:
            await _stored(keeper, partial(journal.write_record, key, run.name, name, run.records[name]))
    await _stored(keeper, partial(journal.write_execution, key, record))  # published: the mark is gone
    return steps


async def _stored(keeper: LeaseKeeper, write: Callable[..., Awaitable[bool]]) -> None:
    """One write under the import's lease; stops first when the renewer found the lease lost or the journal failing."""
    key = keeper.key
    try:
        keeper.check()
        written = await write(epoch=keeper.epoch)
    except LeaseLost as lost:
        keeper.fenced(lost)
        raise ImportRefused(
            f'Execution {key!r} was taken over while it was imported; what the import wrote stays marked as an '
            'unfinished import, which no attempt replays. Import it again, or delete it.',
            key=key,
        ) from None
    if written is not True:
        raise ImportRefused(f'The journal refused a value of execution {key!r}; nothing is left of it.', key=key)


async def read_stable_snapshot(journal: Journal, key: str) -> Snapshot | None:
    """A snapshot that two reads in a row agree on, so a fork of a running execution is consistent."""
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
    def runs(s: Snapshot) -> list[tuple[str, Mapping[int, dict[str, Any]], Mapping[str, dict[str, Any]]]]:
        return [(run.name, run.entries, run.records) for run in s.runs]

    record_a = {k: v for k, v in a.record.items() if k != 'updated'}
    record_b = {k: v for k, v in b.record.items() if k != 'updated'}
    return record_a == record_b and runs(a) == runs(b)


def fork_snapshot(snapshot: Snapshot, *, run: str, at: int) -> Snapshot:
    """The steps before `at` of top-level run `run`, with every run that started before it.

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
        if key not in ('status', 'finished', 'retention', 'patient', CANCEL, TIMERS)  # new work: neither cancelled
    }
    record['attempts'] = 0
    record['runs'] = [copy.name for copy in kept]
    if DEFERRED in record:
        record[DEFERRED] = _waits_before(record[DEFERRED], cut, at)
        _refuse_unresolvable(snapshot.key, record[DEFERRED], at)
    waits = record.pop(PROVIDER_WAITS, None)  # the fork's own run checks on a job it reaches itself
    if isinstance(waits, dict) and (kept_waits := {r: w for r, w in waits.items() if r.isdigit() and int(r) < cut}):
        record[PROVIDER_WAITS] = kept_waits
    record['forked_from'] = {'key': snapshot.key, 'run': run, 'at': at}
    return Snapshot(snapshot.key, record, kept, 'interrupted', snapshot.payloads)


def _waits_before(calls: object, cut: int, at: int) -> dict[str, Any]:
    """The deferred calls, with their decisions, of the waits that lie before the fork point (WT-8).

    A wait of an earlier run is kept, and one of the cut run only if it lies before step `at`; any other, and
    one recorded before waits had positions, stays behind: the fork's own run asks for its own decision there,
    so one approval never pays twice.
    """
    if not isinstance(calls, dict):
        return {}
    kept: dict[str, Any] = {}
    for slot, item in calls.items():
        run = item.get('run') if isinstance(item, dict) else None
        wait = item.get('wait') if isinstance(item, dict) else None
        if not isinstance(run, str) or not run.isdigit():
            continue
        if int(run) < cut or (int(run) == cut and isinstance(wait, int) and wait < at):
            kept[slot] = item
    return kept


def _refuse_unresolvable(key: str, calls: dict[str, Any], at: int) -> None:
    """Refuse a fork that keeps a wait on an external event nobody resolved (EV-3).

    Its token names the execution forked, and its `ask` replays in the fork without asking again, so no token
    could ever resolve the fork's copy: the fork would wait for ever.
    """
    for item in calls.values():
        if isinstance(item, dict) and item.get('kind') == 'event' and decision_of(item.get('decision')) is None:
            raise ImportRefused(
                f'Execution {key!r} waits on the external event {item.get("id")!r} (run {item.get("run")}, step '
                f'{item.get("wait")}) before step {at}: its resume token names {key!r}, so nothing could resolve '
                "the fork's copy of the wait. Fork at or before that step (the fork's run asks again, with a token "
                'of its own), or resolve the wait first.',
                key=key,
            )


def _cut_run(run: RunCopy, at: int) -> RunCopy:
    records: dict[str, dict[str, Any]] = {}
    meta = run.records.get('meta')
    if meta is not None:
        parsed = RunMeta.parse(meta)
        fence = parsed.diverge_from is not None and parsed.diverge_from < at
        records['meta'] = {
            **meta,
            'diverge_from': parsed.diverge_from if fence else None,
            'high_water': min(parsed.high_water, at),
            'model_at_fault': parsed.model_at_fault if fence else False,
        }
    return RunCopy(run.name, {p: e for p, e in run.entries.items() if p < at}, records)
