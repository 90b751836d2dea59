"""An execution as one JSON document: what `export` writes and what `import` checks before it writes (XP-4).

The document holds what the journal stores (entries with their fingerprints, run records, the execution
record), never a lease or an epoch, so it can move between stores. A document is data from outside: it is
parsed with size and depth limits and every field is checked against the shapes the core writes, so a
hostile or damaged file is refused with one message naming what is wrong, before anything is written.
Read from text, its stored values stay text until each is checked or written (`_document`), so an import
holds the file and one value at a time.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

from .._errors import ExportInvalid
from ..journals import SEALED, Encryption, Journal, RunSnapshot, Sealer
from ._document import Duplicates, Span, check_tree, read_frame, step_name
from ._document import shown as _shown
from ._records import ENTRY_VERSION, IMPORTING, KINDS, unlinked

__all__ = (
    'EXPORT_FORMAT',
    'EXPORT_VERSION',
    'Limits',
    'Payloads',
    'RunCopy',
    'Snapshot',
    'check_key',
    'parse_document',
    'read_snapshot',
    'snapshot_document',
    'snapshot_from_document',
)

EXPORT_FORMAT = 'pydantic-ai-durable/execution'
EXPORT_VERSION = 1

Payloads = Literal['plaintext', 'ciphertext']

_RUN_NAME = re.compile(r'\d{1,9}(?:\.\d{1,9}\.\d{1,9}){0,16}')
_RECORD_NAME = re.compile(r'[a-z][a-z_]{0,31}')
_CONTROL = re.compile(r'[\x00-\x1f\x7f-\x9f]')
_KEY_LIMIT = 1024
_NAME_LIMIT = 1024
_POSITION_LIMIT = 10_000_000
_TOP_FIELDS = frozenset({'format', 'version', 'key', 'payloads', 'key_ids', 'exported', 'state', 'execution', 'runs'})
_RUN_FIELDS = frozenset({'run', 'entries', 'records'})
_ENTRY_FIELDS = frozenset({'position', 'entry'})
_STATES = ('running', 'interrupted', 'waiting', 'failed', 'finished')


@dataclass(frozen=True)
class Limits:
    """How much an imported document may hold: it comes from outside, so nothing in it is unbounded."""

    document_bytes: int = 256 * 1024 * 1024
    value_bytes: int = 32 * 1024 * 1024
    """One entry or record, as JSON text: a recorded step larger than this is refused, not written."""
    depth: int = 200
    runs: int = 10_000
    entries: int = 1_000_000


@dataclass
class RunCopy:
    """One run as it moves between stores: entries by position and run records by name.

    Read from a document's text, both are `Deferred`: each value is parsed, checked and opened when asked for.
    """

    name: str
    entries: Mapping[int, dict[str, Any]] = field(default_factory=dict)
    records: Mapping[str, dict[str, Any]] = field(default_factory=dict)


_K = TypeVar('_K')


class Deferred(Mapping[_K, dict[str, Any]]):
    """Stored values of a document, each loaded (parsed, checked, opened) when it is asked for, and not kept."""

    def __init__(self, raw: dict[_K, Any], load: Callable[[_K, Any], dict[str, Any]]) -> None:
        self._raw = raw
        self._load = load

    def __getitem__(self, key: _K) -> dict[str, Any]:
        return self._load(key, self._raw[key])

    def __iter__(self) -> Iterator[_K]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


@dataclass
class Snapshot:
    """One execution as the core stores it, without its lease: what export reads and import writes."""

    key: str
    record: dict[str, Any]
    runs: list[RunCopy]
    state: str
    payloads: Payloads = 'plaintext'


def check_key(key: object, what: str = 'key') -> str:
    """An execution key from outside: a non-empty string without control characters, of bounded length."""
    if not isinstance(key, str) or not key:
        raise ExportInvalid(f'the {what} must be a non-empty string, not {_shown(key)}')
    if len(key) > _KEY_LIMIT or _CONTROL.search(key):
        raise ExportInvalid(
            f'the {what} {_shown(key)} is longer than {_KEY_LIMIT} characters or holds control characters'
        )
    return key


# -- reading an execution ---------------------------------------------------------------------------


async def read_snapshot(journal: Journal, key: str) -> Snapshot | None:
    """Everything stored for `key`, as the journal hands it back (plain, or sealed when it has no keys)."""
    record = await journal.read_execution(key)
    if record is None:
        return None
    listed = record.get('runs')
    names = [run for run in listed if isinstance(run, str)] if isinstance(listed, list) else []
    runs: list[RunCopy] = []
    for name in names:
        stored: RunSnapshot = await journal.read_run(key, name)
        copy = RunCopy(name)
        copy.entries = {p: e for p, e in stored.entries.items() if isinstance(e, dict)}
        copy.records = {n: r for n, r in stored.records.items() if isinstance(r, dict)}
        runs.append(copy)
    info = next((item for item in await journal.list_executions() if item.key == key), None)
    state = info.state if info is not None else 'interrupted'
    sealed = any(SEALED in value for value in _values(record, runs))
    return Snapshot(key, record, runs, state, 'ciphertext' if sealed else 'plaintext')


def _values(record: dict[str, Any], runs: Iterable[RunCopy]) -> Iterable[dict[str, Any]]:
    yield record
    for run in runs:
        yield from run.entries.values()
        yield from run.records.values()


# -- snapshot -> document ----------------------------------------------------------------------------


def snapshot_document(snapshot: Snapshot, seal_with: Encryption | None = None) -> dict[str, Any]:
    """The export document of a snapshot; `seal_with` seals its plain values, bound to their places."""
    key, record, runs = snapshot.key, snapshot.record, snapshot.runs
    payloads = snapshot.payloads
    if seal_with is not None and payloads == 'plaintext':
        sealer = Sealer(seal_with)
        record, runs = _each_value(key, record, runs, sealer.execution, sealer.entry, sealer.record)
        payloads = 'ciphertext'
    key_ids = sorted({value[SEALED].get('k') for value in _values(record, runs) if isinstance(value.get(SEALED), dict)})
    return {
        'format': EXPORT_FORMAT,
        'version': EXPORT_VERSION,
        'key': key,
        'payloads': payloads,
        'key_ids': [k for k in key_ids if isinstance(k, str)],
        'exported': time.time(),
        'state': snapshot.state,
        'execution': record,
        'runs': [
            {
                'run': run.name,
                'entries': [{'position': p, 'entry': run.entries[p]} for p in sorted(run.entries)],
                'records': run.records,
            }
            for run in runs
        ],
    }


# -- document -> snapshot (checked) ------------------------------------------------------------------


def parse_document(text: str | bytes, limits: Limits) -> dict[str, Any]:
    """JSON text of an export, parsed within `limits`, its stored values left as text; else `ExportInvalid`."""
    if len(text) > limits.document_bytes:
        raise ExportInvalid(f'the file is {len(text)} bytes, more than the {limits.document_bytes} an import takes')
    try:
        if isinstance(text, bytes):
            text = text.decode(json.detect_encoding(text), 'surrogatepass')
        document = read_frame(text, limits.depth)
    except ExportInvalid:
        raise
    except RecursionError:
        raise ExportInvalid('the file nests deeper than JSON can be read') from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ExportInvalid(f'the file is not JSON text, or is cut short ({exc})') from None
    if not isinstance(document, dict):
        raise ExportInvalid(f'the file holds {type(document).__name__}, not an export (a JSON object)')
    return document


def snapshot_from_document(document: dict[str, Any], limits: Limits, open_with: Encryption | None = None) -> Snapshot:
    """Check every field of an export document and return what it holds, opened if it was sealed.

    Every value is checked here, before any write; a value read from text is not kept but loaded again when
    the import writes it (`Deferred`). A sealed document is opened with `open_with` at the places it was
    sealed for, so a value altered or moved inside the file fails here.
    """
    _exact(document, _TOP_FIELDS, 'the document')
    if document['format'] != EXPORT_FORMAT:
        raise ExportInvalid(f'"format" is {_shown(document["format"])}, not {EXPORT_FORMAT!r}: not an export')
    if document['version'] != EXPORT_VERSION:
        raise ExportInvalid(
            f'"version" is {_shown(document["version"])}; this release reads version {EXPORT_VERSION} only '
            '(export it again with this release)'
        )
    key = check_key(document['key'], '"key"')
    payloads = document['payloads']
    if payloads not in ('plaintext', 'ciphertext'):
        raise ExportInvalid(f'"payloads" is {_shown(payloads)}, not "plaintext" or "ciphertext"')
    if document['state'] not in _STATES:
        raise ExportInvalid(f'"state" is {_shown(document["state"])}, not one of {", ".join(_STATES)}')
    if not isinstance(document['key_ids'], list) or not all(isinstance(k, str) for k in document['key_ids']):
        raise ExportInvalid('"key_ids" must be a list of strings')
    exported = document['exported']
    if isinstance(exported, bool) or not isinstance(exported, (int, float)) or not math.isfinite(exported):
        raise ExportInvalid('"exported" must be a number (epoch seconds)')
    raw_runs = _runs(document['runs'], limits)
    sealed = payloads == 'ciphertext'
    if sealed and open_with is None:
        ids = ', '.join(document['key_ids']) or '?'
        raise ExportInvalid(
            f'the file holds ciphertext (key ids {ids}); importing it needs those keys: pass '
            'encryption=Encryption({...}) (or set $PYDANTIC_AI_DURABLE_KEYS for the CLI)'
        )
    load = _Loader(key, limits, Sealer(open_with) if sealed else None)
    record = load.execution(document['execution'])
    listed = record.get('runs')
    if not isinstance(listed, list) or sorted(map(str, listed)) != sorted(name for name, _, _ in raw_runs):
        raise ExportInvalid('"execution.runs" must list exactly the runs the document holds')
    runs = [
        RunCopy(
            name,
            Deferred(entries, partial(load.entry, name)),
            Deferred(records, partial(load.record, name)),
        )
        for name, entries, records in raw_runs
    ]
    for run in runs:  # the whole document is checked before anything is written; nothing loaded is kept
        _check_links(run.name, {position: run.entries[position].get('after') for position in run.entries})
        for name in run.records:
            run.records[name]
    load.checked = True  # loaded again to be written, the same text needs only parsing (and opening)
    return Snapshot(key, record, runs, document['state'], payloads)


class _Loader:
    """Loads one stored value of a document: parsed if it is text, checked, opened if the document is sealed."""

    def __init__(self, key: str, limits: Limits, sealer: Sealer | None) -> None:
        self.key = key
        self.limits = limits
        self.sealer = sealer
        self.checked = False
        """Set once every value passed its checks: loading one again parses (and opens) it only."""

    def _value(self, raw: object, where: str) -> dict[str, Any]:
        if not self.checked:
            return _value(raw, self.limits, where)
        value: dict[str, Any] = raw.parse(where)[0] if isinstance(raw, Span) else raw  # type: ignore[assignment]
        return value

    def execution(self, raw: object) -> dict[str, Any]:
        value = self._opened(
            self._value(raw, '"execution"'), '"execution"', lambda sealer, v: sealer.open_execution(self.key, v)
        )
        if value.get('v') != ENTRY_VERSION:
            raise ExportInvalid(f'"execution" is of format version {_shown(value.get("v"))}, not {ENTRY_VERSION}')
        if IMPORTING in value:
            raise ExportInvalid(f'"execution" holds "{IMPORTING}": it is what an import left when it was stopped')
        return value

    def entry(self, run: str, position: int, found: tuple[str, object]) -> dict[str, Any]:
        where, raw = found
        value = self._opened(
            self._value(raw, where), where, lambda sealer, v: sealer.open_entry(self.key, run, position, v)
        )
        if not self.checked:
            _check_entry(value, f'run {run}, step {position}')
        return value

    def record(self, run: str, name: str, found: tuple[str, object]) -> dict[str, Any]:
        where, raw = found
        return self._opened(
            self._value(raw, where), where, lambda sealer, v: sealer.open_record(self.key, run, name, v)
        )

    def _opened(
        self, value: dict[str, Any], where: str, open_it: Callable[[Sealer, dict[str, Any]], Any]
    ) -> dict[str, Any]:
        if self.sealer is None:
            if SEALED in value:
                raise ExportInvalid(f'{where}: "payloads" says plaintext, but the file holds sealed values')
            return value
        try:
            opened = open_it(self.sealer, value)
        except Exception as exc:  # JournalCorrupt, EncryptionMismatch: the file is not what was exported
            raise ExportInvalid(f'the file does not open with the keys given: {exc}') from None
        if not isinstance(opened, dict):
            raise ExportInvalid(f'{where}: the file does not open with the keys given')
        return opened


_Found = tuple[str, Any]
"""A stored value of a document as found (text or an object), with its place in the document for messages."""


def _runs(value: object, limits: Limits) -> list[tuple[str, dict[int, _Found], dict[str, _Found]]]:
    """The runs of a document, their values as found, every name and position checked."""
    if not isinstance(value, list):
        raise ExportInvalid('"runs" must be a list')
    if len(value) > limits.runs:
        raise ExportInvalid(f'the file holds {len(value)} runs, more than {limits.runs}')
    runs: list[tuple[str, dict[int, _Found], dict[str, _Found]]] = []
    seen: set[str] = set()
    total = 0
    for index, item in enumerate(value):
        where = f'"runs"[{index}]'
        if not isinstance(item, dict):
            raise ExportInvalid(f'{where} must be an object')
        _exact(item, _RUN_FIELDS, where)
        name = item['run']
        if not isinstance(name, str) or not _RUN_NAME.fullmatch(name):
            raise ExportInvalid(f'{where}: the run name {_shown(name)} is not one the journal writes (like 0 or 0.3.1)')
        if name in seen:
            raise ExportInvalid(f'{where}: run {name} appears twice')
        seen.add(name)
        entries = item['entries']
        if not isinstance(entries, list):
            raise ExportInvalid(f'{where}.entries must be a list')
        total += len(entries)
        if total > limits.entries:
            raise ExportInvalid(f'the file holds more than {limits.entries} entries')
        found: dict[int, _Found] = {}
        for slot, wrapped in enumerate(entries):
            at = f'{where}.entries[{slot}]'
            if not isinstance(wrapped, dict):
                raise ExportInvalid(f'{at} must be an object')
            _exact(wrapped, _ENTRY_FIELDS, at)
            position = wrapped['position']
            if type(position) is not int or not 0 <= position < _POSITION_LIMIT:
                raise ExportInvalid(f'{at}: the position {_shown(position)} is not a whole number from 0')
            if position in found:
                raise ExportInvalid(f'{at}: run {name} has two entries at position {position}')
            found[position] = (f'{at}.entry', wrapped['entry'])
        records = item['records']
        if not isinstance(records, dict):
            raise ExportInvalid(f'{where}.records must be an object')
        for record_name in records:
            if not _RECORD_NAME.fullmatch(record_name):
                raise ExportInvalid(
                    f'{where}.records: the record name {_shown(record_name)} is not one the journal writes'
                )
        runs.append((name, found, {n: (f'{where}.records{step_name(n)}', r) for n, r in records.items()}))
    return runs


def _check_links(run: str, afters: dict[int, object]) -> None:
    """Refuse a run with a position a later entry was written after, but missing: every attempt would refuse it.

    A run may skip a position (a step never recorded), but not one a later entry names as stored before it
    (EN-3): an import of such a file would store an execution that no attempt replays (`JournalCorrupt`).
    """
    missing = unlinked(afters)
    if missing:
        position, later = min(missing.items())
        raise ExportInvalid(
            f'run {run} has no entry at position {position}, though its entry at position {later} was recorded '
            'after it: an entry was taken out of the file, and an attempt would refuse what is left'
        )


def _value(value: object, limits: Limits, where: str) -> dict[str, Any]:
    """One stored value from the file (text still, or an object): an object of one meaning, size and depth bounded."""
    duplicates: Duplicates | None = None
    if isinstance(value, Span):
        _within(len(value), limits, where)  # as written in the file, measured before it is parsed
        value, duplicates = value.parse(where)
        text = True
    else:
        text = False
    if not isinstance(value, dict):
        raise ExportInvalid(f'{where} must be an object')
    check_tree(value, where, limits.depth, duplicates)
    if not text:
        _within(len(json.dumps(value, separators=(',', ':'), ensure_ascii=True)), limits, where)
    return value


def _within(size: int, limits: Limits, where: str) -> None:
    if size > limits.value_bytes:
        raise ExportInvalid(f'{where} is {size} bytes of JSON, more than the {limits.value_bytes} one value may take')


def _check_entry(entry: dict[str, Any], where: str) -> None:
    """An entry must be one the core reads, with a name a terminal or a path cannot be fooled by."""
    name = entry.get('name')
    if entry.get('v') != ENTRY_VERSION or entry.get('kind') not in KINDS or 'payload' not in entry:
        raise ExportInvalid(f'{where}: not an entry of format version {ENTRY_VERSION} (v, name, kind, payload)')
    if not isinstance(name, str) or not name or len(name) > _NAME_LIMIT or _CONTROL.search(name):
        raise ExportInvalid(f'{where}: the step name {_shown(name)} is empty, too long or holds control characters')
    if name.startswith(('/', '\\')) or any(part == '..' for part in re.split(r'[/\\]', name)):
        raise ExportInvalid(f'{where}: the step name {_shown(name)} holds path parts')
    fingerprint = entry.get('fingerprint')
    if fingerprint is not None and not (
        isinstance(fingerprint, str) and re.fullmatch(r'[0-9a-f]{16,128}', fingerprint)
    ):
        raise ExportInvalid(f'{where}: the fingerprint {_shown(fingerprint)} is not a hex digest')


def _each_value(
    key: str,
    record: dict[str, Any],
    runs: list[RunCopy],
    on_execution: Callable[[str, Any], Any],
    on_entry: Callable[[str, str, int, Any], Any],
    on_record: Callable[[str, str, str, Any], Any],
) -> tuple[Any, list[RunCopy]]:
    """Every value of a snapshot passed through the sealer's call for its kind, at its own place."""
    return on_execution(key, record), [
        RunCopy(
            run.name,
            {p: on_entry(key, run.name, p, e) for p, e in run.entries.items()},
            {n: on_record(key, run.name, n, r) for n, r in run.records.items()},
        )
        for run in runs
    ]


def _exact(value: dict[str, Any], fields: frozenset[str], where: str) -> None:
    missing = sorted(fields - value.keys())
    extra = sorted(set(value) - fields)
    if missing or extra:
        parts = ([f'missing {", ".join(missing)}'] if missing else []) + (
            [f'unknown {", ".join(_shown(x) for x in extra)}'] if extra else []
        )
        raise ExportInvalid(f'{where}: {"; ".join(parts)}')
