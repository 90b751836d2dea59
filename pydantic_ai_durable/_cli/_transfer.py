"""The CLI's commands that move executions: `export`, `import`, `fork`, and `show --messages` (XP-1..XP-5).

They are thin over the journal core's calls of the same names: the checks, the lease and the all-or-nothing
write live there, so the command line and Python behave alike. An export file is written whole or not at
all (a temporary file renamed into place), and an import file is read with the same size limit it is
checked against.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from .._core import Limits, export_execution, fork_execution, import_execution, recorded_conversation
from .._errors import ExportInvalid, ImportRefused
from ._render import cell, plural, print_json, print_lines, quote
from ._target import EXIT_USAGE, Failure, Target, run_on

__all__ = ('export_command', 'fork_command', 'import_command', 'messages_command')


def export_command(target: Target, key: str, output: str | None, *, plaintext: bool, as_json: bool) -> int:
    document = run_on(target, _refusing(lambda journal: export_execution(journal, key, plaintext=plaintext)))
    text = json.dumps(document, ensure_ascii=True, separators=(',', ':'))
    if output is None or output == '-':
        sys.stdout.write(text + '\n')
        sys.stdout.flush()
        return 0
    _write_whole(Path(output), text)
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
                f'{plural(steps, "step")}, {document["payloads"]}) to {cell(output, 200)}'
            ]
        )
    return 0


def import_command(target: Target, source: str, *, as_key: str | None, force: bool, as_json: bool) -> int:
    limits = Limits()
    text = _read_limited(source, limits.document_bytes)
    report = run_on(
        target, _refusing(lambda journal: import_execution(journal, text, key=as_key, force=force, limits=limits))
    )
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


def _read_limited(source: str, limit: int) -> bytes:
    try:
        if source == '-':
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(source, 'rb') as handle:
                data = handle.read(limit + 1)
    except OSError as exc:
        raise Failure(f'cannot read {cell(source, 200)}: {exc.strerror or exc}') from None
    if len(data) > limit:
        raise Failure(
            f'Not imported: {cell(source, 200)} is larger than the {limit} bytes an import takes. Nothing was written.'
        )
    return data


def _write_whole(path: Path, text: str) -> None:
    """Write the export to a temporary file beside `path` and rename it: a killed export leaves no half file."""
    directory = path.parent if str(path.parent) else Path('.')
    try:
        handle, temporary = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=directory)
    except OSError as exc:
        raise Failure(f'cannot write {cell(str(path), 200)}: {exc.strerror or exc}', EXIT_USAGE) from None
    try:
        with os.fdopen(handle, 'w', encoding='ascii') as file:
            file.write(text + '\n')
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise Failure(f'cannot write {cell(str(path), 200)}: {exc.strerror or exc}') from None
        raise
