"""Rewriting what a journal stores under its current key (EN-2): rotation, encrypting a plain journal, decrypting.

Each execution is rewritten under a lease of its own, so a running one is left alone (its holder keeps
it) and every write is fenced like an attempt's. Entries and run records go first and the execution
record last; a rewrite killed halfway leaves each value sealed under either key, both readable while
the old key stays listed, and running it again finishes the job. An execution with a value that does not
open (damaged, altered, or sealed under a key not given) is skipped and reported, and the rewrite goes on
with the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .._errors import JournalError, JournalUnavailable, LeaseLost
from .._runtime import end_holding, new_holder, start_holding
from ..journals import Journal, clear_marker, plain_values_opened

__all__ = ('RekeyReport', 'rekey')

_REKEY_TTL = 10.0
"""Seconds the rewrite holds one execution; one that dies frees it then (on disk, at once). A rewrite that
outlasts it goes on fenced: an attempt that takes the execution over makes its next write fail, never mix."""


@dataclass
class RekeyReport:
    rewritten: list[str] = field(default_factory=list)
    """Executions whose every value is now sealed under the current key (plain, with `decrypt`)."""
    busy: list[str] = field(default_factory=list)
    """Executions an attempt held: left as they were, for a later run of `rekey`."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Executions left as they were because a value of theirs does not open, each with the reason."""
    values: int = 0
    """Values written: entries, run records and execution records."""
    sealed_plain: int = 0
    """Executions that held plain values and are now sealed: the store may keep the old text until it
    reclaims the space (PostgreSQL's old row versions, SQLite's free pages)."""
    marker_cleared: bool = False
    """With `decrypt`: every value is plain now, and the journal no longer refuses journals without keys."""


async def rekey(
    journal: Journal, progress: Callable[[str, int], None] | None = None, *, decrypt: bool = False
) -> RekeyReport:
    """Rewrite every execution the journal holds through its own write path, so that it is sealed anew.

    `decrypt` (a journal given its keys in `decrypt` mode) writes every value back in plain text instead,
    and once all of them are, clears the journal's marker of encryption.
    """
    report = RekeyReport()
    for info in await journal.list_executions():
        if info.state == 'corrupt' or info.problem is not None:
            report.skipped[info.key] = info.problem or 'its execution record does not open'
            continue
        holder = new_holder()
        start_holding(holder)
        try:
            lease = await journal.acquire_lease(info.key, holder, _REKEY_TTL)
            if lease.holder != holder:
                report.busy.append(info.key)
                continue
            plain_before = plain_values_opened(journal)
            try:
                written = await _rewrite(journal, info.key, lease.epoch)
            except LeaseLost:
                report.busy.append(info.key)  # an attempt took it over meanwhile: it is that attempt's now
                continue
            except JournalUnavailable:
                raise  # the journal fails: every execution would, so rekey stops here
            except JournalError as exc:  # a value that does not open: this execution only, the others go on
                report.skipped[info.key] = ' '.join(str(exc).split())
                continue
            finally:
                await journal.release_lease(info.key, holder, lease.epoch)
        finally:
            end_holding(holder)
        report.rewritten.append(info.key)
        report.values += written
        if plain_values_opened(journal) > plain_before:
            report.sealed_plain += 1
        if progress is not None:
            progress(info.key, written)
    if decrypt and not report.busy and not report.skipped:
        await clear_marker(journal)
        report.marker_cleared = True
    return report


async def _rewrite(journal: Journal, key: str, epoch: int) -> int:
    record = await journal.read_execution(key)
    listed = record.get('runs') if isinstance(record, dict) else None
    names = [run for run in listed if isinstance(run, str)] if isinstance(listed, list) else []
    snapshots = [(run, await journal.read_run(key, run)) for run in names]  # all opened before the first write
    written = 0
    for run, snapshot in snapshots:
        for position, entry in sorted(snapshot.entries.items()):
            if isinstance(entry, dict) and await journal.write_entry(key, run, position, entry, epoch=epoch):
                written += 1
        for name, value in snapshot.records.items():
            if isinstance(value, dict) and await journal.write_record(key, run, name, value, epoch=epoch):
                written += 1
    if isinstance(record, dict) and await journal.write_execution(key, record, epoch=epoch):
        written += 1
    return written
