"""Moving executions between journals: export, import, copy and fork.

A recorded run is the best debugging and evaluation data a team has; these calls carry one from the
production store to a laptop, or cut it at a step so the tail runs live again. They work on any journal
through the protocol, and keep encryption at rest: a sealed journal exports ciphertext unless plaintext
is asked for by someone who holds the keys.
"""

from __future__ import annotations

from typing import Any

from .._errors import EncryptionMismatch
from ..journals import Encryption, Journal
from ._export import Limits, Snapshot, parse_document, snapshot_document, snapshot_from_document
from ._import import ImportReport, fork_snapshot, read_stable_snapshot, write_snapshot
from ._records import check_not_importing

__all__ = ('copy_execution', 'export_execution', 'fork_execution', 'import_execution')


def _encryption(journal: Journal) -> Encryption | None:
    found = getattr(journal, 'encryption', None)
    return found if isinstance(found, Encryption) else None


async def _snapshot(journal: Journal, key: str) -> Snapshot:
    snapshot = await read_stable_snapshot(journal, key)
    if snapshot is None:
        raise LookupError(f'No execution {key!r} in {journal!r}.')
    check_not_importing(key, snapshot.record)  # a killed import's leftovers are not exported or forked
    return snapshot


async def export_execution(journal: Journal, key: str, *, plaintext: bool = False) -> dict[str, Any]:
    """Execution `key` as one JSON-ready document (XP-1): its record, runs, entries and run records.

    Leases and epochs stay behind. From a journal with encryption keys the payloads are sealed unless
    `plaintext` is set; a journal whose values come back sealed (the CLI without keys) exports them as
    stored. The document's `payloads` says which it holds.
    """
    snapshot = await _snapshot(journal, key)
    if snapshot.payloads == 'ciphertext' and plaintext:
        raise EncryptionMismatch(
            f'Execution {key!r} is encrypted and no keys were given: a plaintext export needs them '
            '(encryption= on the journal, or $PYDANTIC_AI_DURABLE_KEYS for the CLI).',
            key=key,
            where='the export',
        )
    return snapshot_document(snapshot, None if plaintext else _encryption(journal))


async def import_execution(
    journal: Journal,
    document: dict[str, Any] | str | bytes,
    *,
    key: str | None = None,
    force: bool = False,
    encryption: Encryption | None = None,
    limits: Limits | None = None,
) -> ImportReport:
    """Write an exported execution into `journal`, under `key` or its own key: all of it or nothing.

    The whole document is checked first (`ExportInvalid`); an existing execution is replaced only with
    `force`, a running one never (`ImportRefused`). A sealed document is opened with `encryption`, by
    default the journal's own keys, and written through the journal, which seals it anew if it has keys.
    Text is read one stored value at a time; an import killed part way leaves a record that every
    attempt refuses and the next import replaces.
    """
    limits = limits or Limits()
    parsed = parse_document(document, limits) if isinstance(document, (str, bytes)) else document
    snapshot = snapshot_from_document(parsed, limits, encryption or _encryption(journal))
    return await write_snapshot(journal, snapshot, key=key, force=force)


async def copy_execution(
    source: Journal, target: Journal, key: str, *, as_key: str | None = None, force: bool = False
) -> ImportReport:
    """Copy execution `key` from `source` to `target` (as `as_key`), checked as an import is."""
    document = await export_execution(source, key, plaintext=True)
    return await import_execution(target, document, key=as_key, force=force)


async def fork_execution(journal: Journal, key: str, new_key: str, *, at: int, run: str = '0') -> ImportReport:
    """Create `new_key` holding the steps of `key` before step `at` of run `run` (XP-3).

    Entering `execution(new_key)` then replays those steps and runs the rest live. `key` is only read, from
    a snapshot two reads agree on, so forking a running execution is safe.
    """
    snapshot = await _snapshot(journal, key)
    if snapshot.payloads == 'ciphertext':
        raise EncryptionMismatch(
            f'Execution {key!r} is encrypted and no keys were given: forking rebinds its values to the new key, '
            'which needs them (encryption= on the journal, or $PYDANTIC_AI_DURABLE_KEYS for the CLI).',
            key=key,
            where='the fork',
        )
    forked = fork_snapshot(snapshot, run=run, at=at)
    limits = Limits()
    checked = snapshot_from_document(snapshot_document(forked), limits)  # the same checks as any import
    return await write_snapshot(journal, checked, key=new_key)
