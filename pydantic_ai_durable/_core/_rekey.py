"""Rewriting what a journal stores under its current key (EN-2): rotation, and encrypting a plain journal.

Each execution is rewritten under a lease of its own, so a running one is left alone (its holder keeps
it) and every write is fenced like an attempt's. Entries and run records go first and the execution
record last; a rewrite killed halfway leaves each value sealed under either key, both readable while
the old key stays listed, and running it again finishes the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .._errors import LeaseLost
from .._runtime import end_holding, new_holder, start_holding
from ..journals import Journal

__all__ = ('RekeyReport', 'rekey')

_REKEY_TTL = 10.0
"""Seconds the rewrite holds one execution; one that dies frees it then (on disk, at once). A rewrite that
outlasts it goes on fenced: an attempt that takes the execution over makes its next write fail, never mix."""


@dataclass
class RekeyReport:
    rewritten: list[str] = field(default_factory=list)
    """Executions whose every value is now sealed under the current key."""
    busy: list[str] = field(default_factory=list)
    """Executions an attempt held: left as they were, for a later run of `rekey`."""
    values: int = 0
    """Values written: entries, run records and execution records."""


async def rekey(journal: Journal, progress: Callable[[str, int], None] | None = None) -> RekeyReport:
    """Rewrite every execution the journal holds through its own write path, so that it is sealed anew."""
    report = RekeyReport()
    for info in await journal.list_executions():
        holder = new_holder()
        start_holding(holder)
        try:
            lease = await journal.acquire_lease(info.key, holder, _REKEY_TTL)
            if lease.holder != holder:
                report.busy.append(info.key)
                continue
            try:
                written = await _rewrite(journal, info.key, lease.epoch)
            except LeaseLost:
                report.busy.append(info.key)  # an attempt took it over meanwhile: it is that attempt's now
                continue
            finally:
                await journal.release_lease(info.key, holder, lease.epoch)
        finally:
            end_holding(holder)
        report.rewritten.append(info.key)
        report.values += written
        if progress is not None:
            progress(info.key, written)
    return report


async def _rewrite(journal: Journal, key: str, epoch: int) -> int:
    record = await journal.read_execution(key)
    runs = record.get('runs') if isinstance(record, dict) else None
    written = 0
    for run in runs if isinstance(runs, list) else []:
        if not isinstance(run, str):
            continue
        snapshot = await journal.read_run(key, run)
        for position, entry in sorted(snapshot.entries.items()):
            if isinstance(entry, dict) and await journal.write_entry(key, run, position, entry, epoch=epoch):
                written += 1
        for name, value in snapshot.records.items():
            if isinstance(value, dict) and await journal.write_record(key, run, name, value, epoch=epoch):
                written += 1
    if isinstance(record, dict) and await journal.write_execution(key, record, epoch=epoch):
        written += 1
    return written
