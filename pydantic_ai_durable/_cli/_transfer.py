"""The CLI's commands that move executions: `export`, `import`, `fork`, and `show --messages`.

They are thin over the journal core's calls of the same names: the checks, the lease and the all-or-nothing
write live there, so the command line and Python behave alike. What the CLI adds is the files (`_files`)
and, for `import`, how the keys of `$PYDANTIC_AI_DURABLE_KEYS` are used: a journal object in Python is
built with its own keys, while the CLI must learn from the journal whether it stores sealed values.
"""

from __future__ import annotations

import json
from typing import Any

from .._core import (
    ImportReport,
    Limits,
    export_execution,
    fork_execution,
    parse_document,
    recorded_conversation,
    snapshot_from_document,
    write_snapshot,
)
from .._errors import EncryptionMismatch, ExportInvalid, ImportRefused, JournalCorrupt
from ..journals import KEYS_VARIABLE, SEALED, Journal, reseal
from ._files import read_document, write_export
from ._render import cell, plural, print_json, print_lines, quote
from ._target import Failure, Target, run_on

__all__ = ('export_command', 'fork_command', 'import_command', 'messages_command')


def export_command(target: Target, key: str, output: str | None, *, plaintext: bool, as_json: bool) -> int:
    document = run_on(target, _refusing(lambda journal: export_execution(journal, key, plaintext=plaintext)))
    text = json.dumps(document, ensure_ascii=True, separators=(',', ':'))
    if not write_export(output or '-', text):
        return 0  # standard output, a pipe or a terminal: the document is all that is written there
    steps = sum(len(run['entries']) for run in document['runs'])
    if as_json:
        print_json(
            {
                'exported': key,
                'file': output,
                'payloads': document['payloads'],
                'runs': len(document['runs']),
                'steps': steps,
            }
        )
    else:
        print_lines(
            [
                f'exported {quote(key)} ({document["state"]}, {plural(len(document["runs"]), "run")}, '
                f'{plural(steps, "step")}, {document["payloads"]}) to {cell(output or "-", 200)}'
            ]
        )
    return 0


def import_command(target: Target, source: str, *, as_key: str | None, force: bool, as_json: bool) -> int:
    limits = Limits()
    keys = target.keys
    try:
        document = parse_document(read_document(source, limits.document_bytes), limits)  # its values stay text
        file_ids = _file_key_ids(document)
        # The whole file is checked (and opened) before the journal is touched; without its keys, the refusal
        # below names them together with the journal's.
        opens = set(file_ids) <= set(keys.key_ids if keys is not None else ())
        snapshot = snapshot_from_document(document, limits, keys) if opens else None
    except ExportInvalid as exc:
        raise Failure(' '.join(str(exc).split())) from None

    async def action(journal: Journal) -> ImportReport:
        await _store_as_the_journal_does(journal, target, file_ids)
        assert snapshot is not None  # a file that does not open was refused above
        return await write_snapshot(journal, snapshot, key=as_key, force=force)

    report = run_on(target, _refusing(action))
    if as_json:
        print_json({'imported': report.key, 'runs': report.runs, 'steps': report.steps, 'replaced': report.replaced})
    else:
        replaced = ', replacing the execution stored under it' if report.replaced else ''
        print_lines(
            [
                f'imported {quote(report.key)} ({plural(report.runs, "run")}, {plural(report.steps, "step")}) '
                f'into {target.label}{replaced}'
            ]
        )
    return 0


def _file_key_ids(document: dict[str, Any]) -> list[str]:
    """The key ids a sealed document says it needs (checked against its values when it is opened)."""
    ids = document.get('key_ids')
    if document.get('payloads') != 'ciphertext' or not isinstance(ids, list):
        return []
    return sorted({key_id for key_id in ids if isinstance(key_id, str)})


async def _store_as_the_journal_does(journal: Journal, target: Target, file_ids: list[str]) -> None:
    """Set the journal up to store imported values as it stores its own.

    A journal holding sealed executions gets them sealed under the current key given, once the keys are
    shown to open it; a plain one gets them in plain text (a sealed file was opened with the keys); an empty
    journal seals when keys are given, as an app given keys would. Without the keys either side needs, the
    import is refused with one message naming them all, before anything is written.
    """
    keys = target.keys
    journal_ids, plain, sample = await _stored_sealing(journal) if target.exists else ([], False, None)
    given = set(keys.key_ids) if keys is not None else set()
    if (journal_ids and keys is None) or not set(file_ids) <= given:
        parts = (
            [
                f'{target.label} is encrypted (key ids {", ".join(journal_ids)}), and imported values are stored as '
                'it stores its own'
            ]
            if journal_ids
            else []
        )
        if file_ids:
            parts.append(f'the file is encrypted (key ids {", ".join(file_ids)})')
        wanted = ', '.join(sorted({*journal_ids, *file_ids}))
        raise Failure(
            f'Not imported: {"; ".join(parts)}. Set ${KEYS_VARIABLE} to the keys with ids {wanted} '
            '("id:base64key,...", the journal\'s current key first). Nothing was written.'
        )
    if sample is not None:
        reseal(journal, keys, 'strict')
        try:
            await journal.read_execution(sample)
        except (EncryptionMismatch, JournalCorrupt):
            raise Failure(
                f'Not imported: the keys in ${KEYS_VARIABLE} do not open the executions of {target.label} (sealed with '
                f'key ids {", ".join(journal_ids)}); give its keys, the current one first. Nothing was written.'
            ) from None
    reseal(journal, keys if journal_ids or not plain else None, 'strict')


async def _stored_sealing(journal: Journal) -> tuple[list[str], bool, str | None]:
    """The key ids the journal's executions are sealed with, whether any is plain, and one sealed execution's key.

    Every execution record written with keys is sealed (its metadata, even when empty), so the records tell.
    """
    reseal(journal, None, 'show')  # values come back as stored
    ids: set[str] = set()
    plain = False
    sample: str | None = None
    for info in await journal.list_executions():
        record = await journal.read_execution(info.key)
        sealed = record.get(SEALED) if isinstance(record, dict) else None
        if isinstance(sealed, dict) and isinstance(sealed.get('k'), str):
            ids.add(sealed['k'])
            sample = sample or info.key
        elif record is not None:
            plain = True
    return sorted(ids), plain, sample


def fork_command(target: Target, key: str, new_key: str, at: tuple[str, int], *, as_json: bool) -> int:
    run, step = at
    report = run_on(target, _refusing(lambda journal: fork_execution(journal, key, new_key, at=step, run=run)))
    if as_json:
        print_json(
            {'forked': key, 'into': report.key, 'run': run, 'at': step, 'runs': report.runs, 'steps': report.steps}
        )
    else:
        print_lines(
            [
                f'forked {quote(key)} into {quote(report.key)}: {plural(report.steps, "step")} before step {step} of '
                f'run {run} replay, the rest runs live'
            ]
        )
    return 0


def messages_command(target: Target, key: str, run: str, until: int | None) -> int:
    """The run's conversation as pydantic-ai's JSON messages (`ModelMessagesTypeAdapter` reads it back)."""
    messages = run_on(target, _refusing(lambda journal: recorded_conversation(journal, key, run=run, until=until)))
    print_json(messages)
    return 0


def _refusing(action: Any) -> Any:
    """The action, with the refusals a user can act on turned into one-line failures."""

    async def run(journal: Any) -> Any:
        try:
            return await action(journal)
        except (ExportInvalid, ImportRefused, LookupError, ValueError) as exc:
            raise Failure(' '.join(str(exc).strip('\'"').split())) from None

    return run
