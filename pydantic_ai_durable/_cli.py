"""`python -m pydantic_ai_durable`: list, show, delete and prune the executions of a journal (CLI-1, CLI-2).

When a retry costs money again, a user needs to see what the journal held and where replay stopped,
without writing code. The CLI only works on a journal that already exists: it never creates a
directory or a database schema, so a mistyped path is reported instead of silently becoming an empty
journal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import re
import sys
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import diskcache  # type: ignore[import-untyped]

from ._errors import JournalUnavailable
from ._journal._fences import RunMeta
from ._journal._records import latest_spend, parse_entry
from .journals import _json
from .journals._common import delete_under_lease, metadata_of, state_of
from .journals._dsn import mask_dsn, scrub
from .journals._protocol import EXECUTION_STATES, ExecutionInfo, ExecutionState, Journal, RunSnapshot
from .journals.disk import DiskJournal, default_directory

__all__ = ('EXIT_NOT_FOUND', 'EXIT_OK', 'EXIT_USAGE', 'main', 'parse_duration', 'run_order')

EXIT_OK = 0
EXIT_NOT_FOUND = 1
"""An unknown execution key, a missing journal, or a journal that cannot be opened or written."""
EXIT_USAGE = 2
"""What argparse uses for a bad command line; a bad `--older-than` or `--schema` is one too."""

_T = TypeVar('_T')

_PROG = 'pydantic-ai-durable'
_DSN_URL_PREFIXES = ('postgresql://', 'postgres://')
_DSN_KEYWORDS = re.compile(r'^\s*[A-Za-z_]+\s*=')
_KEY_WIDTH = 40
_NAME_WIDTH = 60
_FINGERPRINT_PREFIX = 12
_KIND_WIDTH = 20
_UNITS = {'s': 1, 'm': 60, 'h': 3600, 'd': 86400, 'w': 604800}
_DURATION = re.compile(r'(?:\d+(?:\.\d+)?[smhdw])+')
_DURATION_PART = re.compile(r'(\d+(?:\.\d+)?)([smhdw])')
_ESCAPES = {'\n': '\\n', '\r': '\\r', '\t': '\\t'}

_EPILOG = """\
journal:
  --journal takes a directory (a DiskJournal) or a PostgreSQL DSN: a URL starting with
  postgresql:// or postgres://, or a libpq "key=value ..." string. Without it, the default
  journal is used: $PYDANTIC_AI_DURABLE_DIR, else .durable in the working directory. Nothing is
  ever created: a directory or Postgres schema that does not hold a journal is reported.

exit codes:
  0  success
  1  not found: an unknown KEY, or no journal at the given place; also a journal that cannot be
     opened (unreadable, a file, a refused connection) and a refused delete (a running execution),
     each reported as one line on stderr
  2  usage error: a bad command line, e.g. an --older-than that is not a duration

Times in tables are local; --json gives UTC ISO-8601 strings and epoch seconds.
"""


class _Failure(Exception):
    """A reason to stop with a one-line message and an exit code, never a traceback (CLI-2)."""

    def __init__(self, message: str, code: int = EXIT_NOT_FOUND) -> None:
        super().__init__(message)
        self.code = code


# -- parsing ---------------------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `30s`, `15m`, `12h`, `7d`, `2w` or `1d12h`.

    A unit is required: a bare number would silently mean seconds to one reader and days to another,
    and a mistake here deletes executions.
    """
    cleaned = text.strip()
    if not _DURATION.fullmatch(cleaned):
        raise ValueError(
            f'invalid duration {text!r}: use numbers with a unit s, m, h, d or w (e.g. 30s, 15m, 12h, 7d, 2w, 1d12h)'
        )
    return sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(cleaned))


@dataclass(frozen=True)
class _Duration:
    """A parsed `--older-than`, keeping what the user typed for the messages."""

    seconds: float
    text: str


def _duration_argument(text: str) -> _Duration:
    try:
        return _Duration(parse_duration(text), text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_order(run: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key putting run keys in start order: `0` < `0.1.1` < `0.3.1` < `1` < `10` (R-3, R-4).

    Run keys are dotted integers; comparing them as strings would put `10` before `2` and a nested
    run after its successors. A part that is not an integer (never written by this package) sorts last.
    """
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in run.split('.'))


def _build_parser(prog: str) -> argparse.ArgumentParser:
    # The shared options are accepted before and after the command. The subparsers' copies default
    # to SUPPRESS so that a value given before the command is not overwritten by their default.
    def shared(parser: argparse.ArgumentParser, *, top: bool) -> None:
        parser.add_argument(
            '--journal',
            metavar='PATH|DSN',
            default=None if top else argparse.SUPPRESS,
            help='journal directory or PostgreSQL DSN (default: $PYDANTIC_AI_DURABLE_DIR, else .durable)',
        )
        parser.add_argument(
            '--schema',
            default=None if top else argparse.SUPPRESS,
            help='schema of a PostgreSQL journal (default: pydantic_ai_durable)',
        )
        parser.add_argument(
            '--json',
            action='store_true',
            default=False if top else argparse.SUPPRESS,
            help='print JSON for a program instead of a table',
        )

    parser = argparse.ArgumentParser(
        prog=prog,
        description='Inspect a pydantic-ai-durable journal: list, show, delete and prune executions.',
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shared(parser, top=True)
    commands = parser.add_subparsers(dest='command', metavar='COMMAND', required=True)
    sub: dict[str, argparse.ArgumentParser] = {}
    for name, help_text in (
        ('list', 'list the executions in the journal'),
        ('show', 'show the runs and steps recorded for one execution'),
        ('delete', 'delete everything recorded for one execution'),
        ('prune', 'delete finished executions whose retention ended, or any not updated for a while'),
    ):
        sub[name] = commands.add_parser(name, help=help_text, description=help_text.capitalize() + '.')
        shared(sub[name], top=False)
    sub['show'].add_argument('key', metavar='KEY', help='the execution key')
    sub['delete'].add_argument('key', metavar='KEY', help='the execution key')
    sub['delete'].add_argument(
        '--force', action='store_true', help='delete even while a live attempt holds the execution'
    )
    states = {
        'list': 'only executions in these states: running, interrupted, failed, finished',
        'prune': 'with --older-than: which states to delete (default finished; also interrupted, failed)',
    }
    for name, help_text in states.items():
        sub[name].add_argument('--state', metavar='STATE[,STATE]', type=_states_argument, default=None, help=help_text)
    sub['prune'].add_argument(
        '--older-than',
        metavar='DURATION',
        type=_duration_argument,
        default=None,
        help='age since the last write, e.g. 30s, 15m, 12h, 7d, 2w or 1d12h '
        '(without it: finished executions whose retention ended)',
    )
    return parser


def _states_argument(text: str) -> tuple[ExecutionState, ...]:
    names = [name.strip() for name in text.split(',') if name.strip()]
    unknown = [name for name in names if name not in EXECUTION_STATES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f'invalid state {", ".join(unknown) or repr(text)}: use {", ".join(EXECUTION_STATES)} (comma-separated)'
        )
    return tuple(name for name in EXECUTION_STATES if name in names)


# -- opening the journal ---------------------------------------------------------------------------


@dataclass
class _Target:
    """The journal to work on, and how to name it in messages (a DSN without its password)."""

    journal: Journal
    label: str
    dsn: str | None = None
    """The PostgreSQL DSN, whose password must be scrubbed from every error text shown."""

    def clean(self, text: str) -> str:
        return scrub(text, self.dsn) if self.dsn is not None else text


def _is_dsn(value: str) -> bool:
    if value.startswith(_DSN_URL_PREFIXES):
        return True
    return bool(_DSN_KEYWORDS.match(value)) and not os.path.lexists(value)


def _one_line(exc: BaseException) -> str:
    text = ' '.join(part.strip() for part in str(exc).splitlines() if part.strip())
    return f'{type(exc).__name__}: {text}' if text else type(exc).__name__


def _open_target(value: str | None, schema: str | None) -> _Target:
    if value is not None and _is_dsn(value):
        return _postgres_target(value, schema)
    if schema is not None:
        raise _Failure('--schema applies only to a PostgreSQL journal (a DSN in --journal)', EXIT_USAGE)
    path = Path(value) if value is not None else default_directory()
    label = repr(str(path))
    # Only the errors name the default, so a user who meant another journal learns how to choose it.
    where = label if value is not None else f'{label} (the default journal; set --journal or PYDANTIC_AI_DURABLE_DIR)'
    try:
        if not path.exists():
            raise _Failure(f'no journal at {where}: the directory does not exist')
        if not path.is_dir():
            raise _Failure(f'no journal at {where}: it is a file, not a journal directory')
        if not (path / diskcache.core.DBNAME).is_file():
            raise _Failure(f'no journal at {where}: the directory holds no {diskcache.core.DBNAME}')
    except OSError as exc:
        raise _Failure(f'cannot open the journal {where}: {_one_line(exc)}') from None
    return _Target(DiskJournal(path), label)


def _postgres_target(dsn: str, schema: str | None) -> _Target:
    try:
        from .journals.postgres import PostgresJournal

        journal = PostgresJournal(dsn) if schema is None else PostgresJournal(dsn, schema=schema)
    except ImportError as exc:
        raise _Failure(_one_line(exc)) from None
    except ValueError as exc:
        raise _Failure(str(exc), EXIT_USAGE) from None
    label = f'{mask_dsn(dsn)!r} (schema {journal.schema!r})'
    # PostgresJournal creates its schema on first use; looking first keeps a typo from creating one.
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        timeout = {} if 'connect_timeout' in conninfo_to_dict(dsn) else {'connect_timeout': '10'}
        quoted = '"' + journal.schema.replace('"', '""') + '"'
        with psycopg.connect(make_conninfo(dsn, **timeout), autocommit=True) as conn:
            row = conn.execute('SELECT to_regclass(%s) IS NOT NULL', (f'{quoted}.executions',)).fetchone()
    except Exception as exc:
        raise _Failure(f'cannot open the journal {label}: {scrub(_one_line(exc), dsn)}') from None
    if row is None or not row[0]:
        raise _Failure(f'no journal at {label}: the schema holds no journal tables')
    return _Target(journal, label, dsn)


def _run(target: _Target, action: Callable[[Journal], Awaitable[_T]]) -> _T:
    """Run one command's journal calls on a fresh event loop, and always close the journal."""

    async def go() -> _T:
        try:
            return await action(target.journal)
        finally:
            with contextlib.suppress(Exception):  # a failing close must not hide the answer or the error
                await target.journal.close()

    try:
        return asyncio.run(go())
    except _Failure:
        raise
    except JournalUnavailable as exc:
        raise _Failure(target.clean(' '.join(str(exc).split()))) from None
    except Exception as exc:
        raise _Failure(f'cannot read the journal {target.label}: {target.clean(_one_line(exc))}') from None


# -- reading an execution --------------------------------------------------------------------------


@dataclass
class _Found:
    """What is known about one execution: its record (runs, attempts), its state and its metadata."""

    key: str
    record: dict[str, Any] | None
    state: ExecutionState
    updated: float | None
    runs: list[tuple[str, RunSnapshot]]
    retain_until: float | None = None


async def _find(journal: Journal, key: str) -> _Found | None:
    """The execution `key`, or `None` when nothing is stored under it.

    The state comes from listing, not from the execution record: only the lease, judged as the engine
    judges a takeover, tells a live attempt from one that died (FN-3).
    """
    record = await journal.read_execution(key)
    info = next((item for item in await journal.list_executions() if item.key == key), None)
    if record is None and info is None:
        return None
    state = info.state if info is not None else state_of(record, leased=False)
    updated = _epoch(info.updated) if info is not None else _epoch((record or {}).get('updated'))
    listed = (record or {}).get('runs')
    names = sorted({run for run in listed if isinstance(run, str)} if isinstance(listed, list) else (), key=run_order)
    runs = [(run, await journal.read_run(key, run)) for run in names]
    return _Found(key, record, state, updated, runs, info.retain_until if info is not None else None)


def _not_found(key: str, target: _Target) -> _Failure:
    return _Failure(f'no execution {_quote(key)} in {target.label}')


# -- rendering -------------------------------------------------------------------------------------


def _escape(text: str) -> str:
    """`text` with every non-printable character escaped (`\\x1b`, `\\u202e`, `\\n`).

    Everything printed for a person comes from a journal someone else may have written: a raw ESC or
    BEL could retitle or clear the operator's terminal, a newline or a bidi override could forge lines.
    """
    out: list[str] = []
    for char in text:
        if char.isprintable():
            out.append(char)
        elif char in _ESCAPES:
            out.append(_ESCAPES[char])
        else:
            code = ord(char)
            out.append(f'\\x{code:02x}' if code < 0x100 else f'\\u{code:04x}' if code < 0x10000 else f'\\U{code:08x}')
    return ''.join(out)


def _width(text: str) -> int:
    """Terminal columns of printable text: wide East Asian characters take two, combining marks none."""
    return sum(
        0 if unicodedata.combining(char) else 2 if unicodedata.east_asian_width(char) in 'WF' else 1 for char in text
    )


def _cell(text: str, limit: int) -> str:
    """Escaped `text`, cut to `limit` columns with an ellipsis."""
    text = _escape(text)
    if _width(text) <= limit:
        return text
    kept: list[str] = []
    used = 0
    for char in text:
        width = _width(char)
        if used + width > limit - 1:
            break
        kept.append(char)
        used += width
    return ''.join(kept) + '…'


def _quote(key: str) -> str:
    return "'" + _cell(key, 80) + "'"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int], indent: str = '') -> list[str]:
    widths = [max([_width(header)] + [_width(row[i]) for row in rows]) for i, header in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            ' ' * (widths[i] - _width(cell)) + cell if i in right else cell + ' ' * (widths[i] - _width(cell))
            for i, cell in enumerate(cells)
        ]
        return (indent + '  '.join(padded)).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def _size(count: int) -> str:
    """Bytes for a person: `812 B`, `12.3 KB`, `4.0 MB` (powers of 1000, like the units say)."""
    if count < 1000:
        return f'{count} B'
    value = float(count)
    for unit in ('KB', 'MB', 'GB', 'TB'):
        value /= 1000
        if value < 999.95 or unit == 'TB':
            return f'{value:.1f} {unit}'
    raise AssertionError('unreachable')  # pragma: no cover


def _epoch(value: object) -> float | None:
    """A usable epoch time, or `None` for a missing or nonsensical one (old entries have none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 253402300800:
        return None
    return float(value)


def _local(epoch: float | None, *, millis: bool = False) -> str:
    if epoch is None:
        return '-'
    moment = datetime.datetime.fromtimestamp(epoch).astimezone()
    text = moment.strftime('%Y-%m-%d %H:%M:%S')
    return f'{text}.{moment.microsecond // 1000:03d}' if millis else text


def _utc(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    return moment.isoformat(timespec='milliseconds').replace('+00:00', 'Z')


def _print_lines(lines: Sequence[str]) -> None:
    """Print lines for a person; each is escaped once more, so no field can reach the terminal raw.

    Fields are escaped where they are rendered, so that tables line up; this is the guarantee that a
    field someone forgets to escape still cannot send a control sequence to the operator's terminal.
    """
    print('\n'.join(_escape(line) for line in lines))


def _print_json(value: object) -> None:
    # ASCII-only JSON parses the same whatever the terminal's encoding, lone surrogates in keys included.
    print(json.dumps(value, indent=2, ensure_ascii=True))


def _plural(count: int, word: str) -> str:
    return f'{count} {word}' if count == 1 else f'{count} {word}s'


# -- commands --------------------------------------------------------------------------------------


def _metadata_text(metadata: dict[str, Any] | None, limit: int = 40) -> str:
    return _cell(json.dumps(metadata, ensure_ascii=False, separators=(',', ':')), limit) if metadata else ''


def _info_json(info: ExecutionInfo) -> dict[str, Any]:
    return {
        'key': info.key,
        'state': info.state,
        'runs': info.runs,
        'steps': info.steps,
        'bytes': info.bytes,
        'updated': _utc(_epoch(info.updated)),
        'updated_epoch': _epoch(info.updated),
        'metadata': info.metadata,
        'retain_until': _utc(info.retain_until),
        'retain_until_epoch': info.retain_until,
    }


def _list(target: _Target, states: tuple[ExecutionState, ...] | None, as_json: bool) -> int:
    infos = _run(target, lambda journal: journal.list_executions(state=states))
    if as_json:
        _print_json([_info_json(info) for info in infos])
        return EXIT_OK
    if not infos:
        which = f' {"/".join(states)}' if states else ''
        _print_lines([f'no{which} executions in {target.label}'])
        return EXIT_OK
    rows = [
        [
            _cell(info.key, _KEY_WIDTH),
            _cell(info.state, _KIND_WIDTH),
            str(info.runs),
            str(info.steps),
            _size(info.bytes),
            _local(_epoch(info.updated)),
            _metadata_text(info.metadata),
        ]
        for info in infos
    ]
    headers = ['KEY', 'STATE', 'RUNS', 'STEPS', 'SIZE', 'LAST UPDATE', 'METADATA']
    _print_lines([line.rstrip() for line in _table(headers, rows, right={2, 3, 4})])
    return EXIT_OK


@dataclass
class _Step:
    position: int
    entry: Any

    @property
    def fields(self) -> dict[str, Any]:
        entry = self.entry if isinstance(self.entry, dict) else {}
        payload = _json.dumps(entry['payload']) if 'payload' in entry else None
        recorded = _epoch(entry.get('t'))
        fingerprint = entry.get('fingerprint')
        return {
            'position': self.position,
            'name': entry.get('name'),
            'kind': entry.get('kind'),
            'fingerprint': fingerprint,
            'payload_bytes': len(payload) if payload is not None else None,
            'recorded': _utc(recorded),
            'recorded_epoch': recorded,
            'v': entry.get('v'),
            'readable': parse_entry(self.entry) is not None,
        }


def _steps(snapshot: RunSnapshot) -> list[_Step]:
    return [_Step(position, snapshot.entries[position]) for position in sorted(snapshot.entries)]


def _spend_line(snapshot: RunSnapshot) -> str | None:
    spend = latest_spend([snapshot.records.get('usage'), *(_entry_usage(e) for e in snapshot.entries.values())])
    usage = spend.get('usage') if spend is not None else None
    if not isinstance(usage, dict):
        return None
    parts = [
        _plural(_count(usage.get('requests')), 'request'),
        _plural(_count(usage.get('tool_calls')), 'tool call'),
        f'{_count(usage.get("input_tokens"))} input / {_count(usage.get("output_tokens"))} output tokens',
    ]
    cost = usage.get('cost')
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        parts.append(f'cost {cost:g}')
    return 'live spend (all attempts): ' + ', '.join(parts)


def _count(value: object) -> int:
    """A counter from a stored usage snapshot; anything that is not a number (another version) counts as 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return int(value)


def _entry_usage(entry: Any) -> Any:
    return entry.get('usage') if isinstance(entry, dict) else None


def _meta_line(snapshot: RunSnapshot) -> str | None:
    if 'meta' not in snapshot.records:
        return None
    meta = RunMeta.parse(snapshot.records['meta'])
    fence = 'none' if meta.diverge_from is None else str(meta.diverge_from)
    line = f'meta: diverge_from={fence} high_water={meta.high_water} model_at_fault={str(meta.model_at_fault).lower()}'
    if meta.diverge_from is not None:
        line += f' (a retry replays positions below {meta.diverge_from} only)'
    return line


def _gap_row(start: int, end: int) -> list[str]:
    """A row for positions `start..end` that a run reached but nothing was recorded at (a retry runs them live)."""
    return [f'{start}-{end}' if end > start else str(start), '', '(nothing recorded)', '', '', '']


def _step_rows(snapshot: RunSnapshot) -> list[list[str]]:
    rows: list[list[str]] = []
    expected = 0
    for step in _steps(snapshot):
        if step.position > expected:
            rows.append(_gap_row(expected, step.position - 1))
        expected = step.position + 1
        fields = step.fields
        fingerprint = fields['fingerprint']
        name = fields['name'] if isinstance(fields['name'], str) else '?'
        rows.append(
            [
                str(step.position),
                _cell(fields['kind'], _KIND_WIDTH) if isinstance(fields['kind'], str) else '?',
                _cell(name if fields['readable'] else f'{name} (unreadable: runs live)', _NAME_WIDTH),
                _escape(fingerprint[:_FINGERPRINT_PREFIX]) if isinstance(fingerprint, str) else '-',
                _size(fields['payload_bytes']) if fields['payload_bytes'] is not None else '-',
                _local(fields['recorded_epoch'], millis=True),
            ]
        )
    high_water = RunMeta.parse(snapshot.records['meta']).high_water if 'meta' in snapshot.records else 0
    if high_water > expected:  # a failed attempt claimed positions it never recorded
        rows.append(_gap_row(expected, high_water - 1))
    return rows


def _show(target: _Target, key: str, as_json: bool) -> int:
    found = _run(target, lambda journal: _find(journal, key))
    if found is None:
        raise _not_found(key, target)
    record = found.record or {}
    attempts = record.get('attempts') if type(record.get('attempts')) is int else None
    updated = found.updated
    if as_json:
        _print_json(
            {
                'key': found.key,
                'state': found.state,
                'attempts': attempts,
                'metadata': metadata_of(record),
                'retain_until': _utc(found.retain_until),
                'retain_until_epoch': found.retain_until,
                'updated': _utc(updated),
                'updated_epoch': updated,
                'runs': [
                    {
                        'run': run,
                        'steps': [step.fields for step in _steps(snapshot)],
                        'records': snapshot.records,
                    }
                    for run, snapshot in found.runs
                ],
            }
        )
        return EXIT_OK
    steps = sum(len(snapshot.entries) for _, snapshot in found.runs)
    lines = [
        f'execution  {_cell(found.key, 100)}',
        f'state      {_escape(found.state)}' + (f', {_plural(attempts, "attempt")}' if attempts is not None else ''),
        f'updated    {_local(updated)}',
        f'recorded   {_plural(len(found.runs), "run")}, {_plural(steps, "step")}',
    ]
    if found.retain_until is not None:
        lines.append(f'retained   until {_local(found.retain_until)}, then deleted by retention')
    if metadata_of(record):
        lines.append(f'metadata   {_metadata_text(metadata_of(record), 100)}')
    if found.record is None:
        lines.append('           (no execution record: its runs cannot be listed)')
    for run, snapshot in found.runs:
        lines += ['', f'run {_cell(run, 100)}']
        rows = _step_rows(snapshot)
        if rows:
            headers = ['POS', 'KIND', 'NAME', 'FINGERPRINT', 'PAYLOAD', 'RECORDED']
            lines += _table(headers, rows, right={0, 4}, indent='  ')
        else:
            lines.append('  (no steps recorded)')
        for extra in (_meta_line(snapshot), _spend_line(snapshot)):
            if extra is not None:
                lines.append(f'  {extra}')
    _print_lines(lines)
    return EXIT_OK


def _delete(target: _Target, key: str, *, force: bool, as_json: bool) -> int:
    async def delete(journal: Journal) -> _Found | None:
        found = await _find(journal, key)
        if found is None:
            return None
        running = _Failure(
            f'execution {_quote(key)} is running: an attempt holds its lease and the journal cannot prove that '
            "attempt's process dead; stop it first, or pass --force to delete it anyway (that attempt then stops "
            'at its next step)'
        )
        if found.state == 'running' and not force:
            raise running
        await journal.open()  # a read-only or unreachable store says so here
        # The lease is taken first (a new epoch), so the attempt that held it can write nothing more (B-13).
        if await delete_under_lease(journal, key, force=force) is not None:
            raise running
        left = [bool((await journal.read_run(key, run)).entries) for run, _ in found.runs]
        if await journal.read_execution(key) is not None or any(left):
            raise _Failure(f'execution {_quote(key)} in {target.label} could not be deleted')
        return found

    found = _run(target, delete)
    if found is None:
        raise _not_found(key, target)
    steps = sum(len(snapshot.entries) for _, snapshot in found.runs)
    if as_json:
        _print_json({'deleted': found.key, 'state': found.state, 'runs': len(found.runs), 'steps': steps})
    else:
        _print_lines(
            [
                f'deleted execution {_quote(found.key)} ({_escape(found.state)}, '
                f'{_plural(len(found.runs), "run")}, {_plural(steps, "step")}) from {target.label}'
            ]
        )
    return EXIT_OK


def _prune(
    target: _Target, older_than: _Duration | None, states: tuple[ExecutionState, ...] | None, as_json: bool
) -> int:
    if older_than is None and states is not None:
        raise _Failure(
            '--state applies with --older-than; without it, prune deletes expired finished executions', EXIT_USAGE
        )
    chosen: tuple[ExecutionState, ...] = states or ('finished',)
    if 'running' in chosen:
        raise _Failure('prune never deletes running executions; delete one with `delete KEY --force`', EXIT_USAGE)

    async def prune(journal: Journal) -> tuple[list[str], list[ExecutionInfo]]:
        await journal.open()
        if older_than is None:
            pruned = await journal.prune()
        else:
            pruned = await journal.prune(older_than.seconds, states=chosen)
        return pruned, (await journal.list_executions() if not pruned else [])

    pruned, left = _run(target, prune)
    if as_json:
        _print_json(pruned)
    elif pruned:
        what = (
            f'not updated for {older_than.text} ({"/".join(chosen)})'
            if older_than is not None
            else 'finished, whose retention ended'
        )
        _print_lines([f'pruned {_plural(len(pruned), "execution")} {what}:', *(f'  {_cell(k, 100)}' for k in pruned)])
    else:
        _print_lines([f'nothing to prune in {target.label}: {_why_nothing(left, older_than, chosen)}'])
    return EXIT_OK


def _why_nothing(left: list[ExecutionInfo], older_than: _Duration | None, chosen: tuple[str, ...]) -> str:
    """The real reason a prune deleted nothing, from what the journal holds."""
    if not left:
        return 'it holds no executions'
    held = ', '.join(f'{count} {state}' for state, count in _count_states(left).items())
    if older_than is None:
        finished = [info for info in left if info.state == 'finished']
        kept = [info for info in finished if info.retain_until is None]
        waiting = [info.retain_until for info in finished if info.retain_until is not None]
        reasons = [f'it holds {held}']
        if waiting:
            reasons.append(f'the first retention ends {_local(min(waiting))}')
        if kept:
            reasons.append(f'{_plural(len(kept), "finished execution")} kept without retention')
        reasons.append('only finished executions whose retention ended are pruned (--older-than for others)')
        return '; '.join(reasons)
    matching = [info for info in left if info.state in chosen]
    if not matching:
        return f'it holds {held}, none {"/".join(chosen)} (--state chooses others)'
    return f'every {"/".join(chosen)} execution was updated within {older_than.text} ({held})'


def _count_states(infos: list[ExecutionInfo]) -> dict[str, int]:
    counts = {state: sum(info.state == state for info in infos) for state in EXECUTION_STATES}
    return {state: count for state, count in counts.items() if count}


# -- entry point -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run the CLI with `argv` (default: the process's arguments) and return the exit code (CLI-2)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, 'reconfigure', None)
        if reconfigure is not None:  # a key a terminal cannot show must not crash the listing
            reconfigure(errors='backslashreplace')
    parser = _build_parser(prog or _PROG)
    options = parser.parse_args(arguments)  # exits with EXIT_USAGE on a bad command line
    try:
        target = _open_target(options.journal, options.schema)
        if options.command == 'list':
            return _list(target, options.state, options.json)
        if options.command == 'show':
            return _show(target, options.key, options.json)
        if options.command == 'delete':
            return _delete(target, options.key, force=options.force, as_json=options.json)
        return _prune(target, options.older_than, options.state, options.json)
    except _Failure as failure:
        message = _escape(' '.join(str(failure).splitlines()))
        if failure.code == EXIT_USAGE:
            parser.error(message)
        print(f'{parser.prog}: {message}', file=sys.stderr)
        return failure.code
    except KeyboardInterrupt:
        print(f'{parser.prog}: interrupted', file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader is gone, so is the need to print
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
