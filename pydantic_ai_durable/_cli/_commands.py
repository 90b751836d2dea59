"""The CLI's commands: `list`, `show`, `delete`, `prune` and `rekey`.

Each reads what the journal holds through the journal protocol and the core's own readers of stored
shapes, so `show` calls unreadable exactly what a retry would ignore (and sealed what it cannot judge
without keys), and states come from listing (the lease, judged as a takeover is), never from a record
alone. `delete` takes the lease first, so the attempt that held it can write nothing more; `prune`
never deletes a running execution.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .._core import RekeyReport, RunMeta, call_json, latest_spend, missing_links, parse_entry, rekey, spend_cost
from ..journals import (
    EXECUTION_STATES,
    KEYS_VARIABLE,
    SEALED,
    DiskJournal,
    ExecutionInfo,
    ExecutionState,
    Journal,
    PostgresJournal,
    RunSnapshot,
    deferred_calls,
    delete_under_lease,
    dumps,
    metadata_of,
    state_of,
)
from ._parsing import Duration, run_order
from ._render import cell, epoch, escape, local, plural, print_json, print_lines, quote, size, table, utc
from ._target import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, Failure, Target, run_on
from ._waiting import calls_lines, sealed_note, state_text, waits_json, waits_lines

__all__ = ('delete_command', 'list_command', 'prune_command', 'rekey_command', 'show_command')

_KEY_WIDTH = 40
_NAME_WIDTH = 60
_FINGERPRINT_PREFIX = 12
_KIND_WIDTH = 20


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
    judges a takeover, tells a live attempt from one that died.
    """
    record = await journal.read_execution(key)
    info = next((item for item in await journal.list_executions() if item.key == key), None)
    if record is None and info is None:
        return None
    state = info.state if info is not None else state_of(record, leased=False)
    updated = epoch(info.updated) if info is not None else epoch((record or {}).get('updated'))
    listed = (record or {}).get('runs')
    names = sorted({run for run in listed if isinstance(run, str)} if isinstance(listed, list) else (), key=run_order)
    runs = [(run, await journal.read_run(key, run)) for run in names]
    return _Found(key, record, state, updated, runs, info.retain_until if info is not None else None)


def _not_found(key: str, target: Target) -> Failure:
    return Failure(f'no execution {quote(key)} in {target.label}')


def _metadata_text(metadata: dict[str, Any] | None, limit: int = 40) -> str:
    return cell(json.dumps(metadata, ensure_ascii=False, separators=(',', ':')), limit) if metadata else ''


def _info_json(info: ExecutionInfo) -> dict[str, Any]:
    return {
        'key': info.key,
        'state': info.state,
        'runs': info.runs,
        'steps': info.steps,
        'bytes': info.bytes,
        'updated': utc(epoch(info.updated)),
        'updated_epoch': epoch(info.updated),
        'metadata': info.metadata,
        'retain_until': utc(info.retain_until),
        'retain_until_epoch': info.retain_until,
        'problem': info.problem,
        'pending': [call_json(call) for call in info.pending],
        'wakes_at': utc(info.wakes_at),
        'wakes_at_epoch': info.wakes_at,
    }


def list_command(target: Target, states: tuple[ExecutionState, ...] | None, as_json: bool) -> int:
    infos = run_on(target, lambda journal: journal.list_executions(state=states))
    if as_json:
        print_json([_info_json(info) for info in infos])
        return EXIT_OK
    if not infos:
        which = f' {"/".join(states)}' if states else ''
        print_lines([f'no{which} executions in {target.label}'])
        return EXIT_OK
    rows = [
        [
            cell(info.key, _KEY_WIDTH),
            cell(state_text(info), _KIND_WIDTH),
            str(info.runs),
            str(info.steps),
            size(info.bytes),
            local(epoch(info.updated)),
            _metadata_text(info.metadata),
        ]
        for info in infos
    ]
    headers = ['KEY', 'STATE', 'RUNS', 'STEPS', 'SIZE', 'LAST UPDATE', 'METADATA']
    lines = [line.rstrip() for line in table(headers, rows, right={2, 3, 4})]
    problems = [info for info in infos if info.problem is not None]
    if problems:  # what is wrong with each execution that could not be read, below the others
        lines += ['', 'could not be read:']
        lines += [f'  {cell(info.key, _KEY_WIDTH)}: {cell(info.problem or "", 400)}' for info in problems]
    print_lines(lines)
    return EXIT_OK


@dataclass
class _Step:
    position: int
    entry: Any

    @property
    def fields(self) -> dict[str, Any]:
        entry = self.entry if isinstance(self.entry, dict) else {}
        payload = dumps(entry['payload']) if 'payload' in entry else None
        key_id = _sealed_with(entry)
        recorded = epoch(entry.get('t'))
        fingerprint = entry.get('fingerprint')
        return {
            'position': self.position,
            'name': entry.get('name'),
            'kind': entry.get('kind'),
            'fingerprint': fingerprint,
            'payload_bytes': len(payload) if payload is not None else None,
            'sealed': key_id,
            'recorded': utc(recorded),
            'recorded_epoch': recorded,
            'v': entry.get('v'),
            # A sealed step is judged by whoever holds the keys; without them it is neither
            'readable': None if key_id is not None else parse_entry(self.entry) is not None,
        }


def _steps(snapshot: RunSnapshot) -> list[_Step]:
    return [_Step(position, snapshot.entries[position]) for position in sorted(snapshot.entries)]


def _sealed_with(value: Any) -> str | None:
    """The key id a value read without keys is sealed with (`?` when it names none), or `None` for a plain one."""
    sealed = value.get(SEALED) if isinstance(value, dict) else None
    if not isinstance(sealed, dict):
        return None
    return sealed.get('k') if isinstance(sealed.get('k'), str) else '?'


def _sealed_line(what: str, value: Any) -> str | None:
    """A run record read without keys says it is sealed, as a step's payload does, instead of being misread (EN-5)."""
    key_id = _sealed_with(value)
    return None if key_id is None else f'{what}: sealed (key id {cell(key_id, 20)})'


def _spend_line(snapshot: RunSnapshot) -> str | None:
    sealed = _sealed_line('live spend (all attempts)', snapshot.records.get('usage'))
    if sealed is not None:
        return sealed
    spend = latest_spend([snapshot.records.get('usage'), *(_entry_usage(e) for e in snapshot.entries.values())])
    usage = spend.get('usage') if spend is not None else None
    if not isinstance(usage, dict):
        return None
    parts = [
        plural(_count(usage.get('requests')), 'request'),
        plural(_count(usage.get('tool_calls')), 'tool call'),
        f'{_count(usage.get("input_tokens"))} input / {_count(usage.get("output_tokens"))} output tokens',
    ]
    cost = spend_cost(usage)
    if cost is not None:
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
    sealed = _sealed_line('meta', snapshot.records['meta'])
    if sealed is not None:
        return sealed
    meta = RunMeta.parse(snapshot.records['meta'])
    fence = 'none' if meta.diverge_from is None else str(meta.diverge_from)
    line = f'meta: diverge_from={fence} high_water={meta.high_water} model_at_fault={str(meta.model_at_fault).lower()}'
    if meta.diverge_from is not None:
        line += f' (a retry replays positions below {meta.diverge_from} only)'
    return line


def _gap_rows(start: int, end: int, missing: dict[int, int]) -> list[list[str]]:
    """Rows for positions `start..end` that hold nothing: never recorded (a retry runs them live), or deleted."""
    rows: list[list[str]] = []
    for position in sorted(p for p in missing if start <= p <= end):
        if position > start:
            rows += _gap_rows(start, position - 1, {})
        rows.append([str(position), '', f'(missing: step {missing[position]} was recorded after it)', '', '', ''])
        start = position + 1
    if start <= end:
        rows.append([f'{start}-{end}' if end > start else str(start), '', '(nothing recorded)', '', '', ''])
    return rows


def _step_rows(snapshot: RunSnapshot) -> list[list[str]]:
    rows: list[list[str]] = []
    missing = missing_links(snapshot.entries)  # a retry stops there with JournalCorrupt
    expected = 0
    for step in _steps(snapshot):
        if step.position > expected:
            rows += _gap_rows(expected, step.position - 1, missing)
        expected = step.position + 1
        fields = step.fields
        fingerprint = fields['fingerprint']
        name = fields['name'] if isinstance(fields['name'], str) else '?'
        rows.append(
            [
                str(step.position),
                cell(fields['kind'], _KIND_WIDTH) if isinstance(fields['kind'], str) else '?',
                cell(name if fields['readable'] is not False else f'{name} (unreadable: runs live)', _NAME_WIDTH),
                escape(fingerprint[:_FINGERPRINT_PREFIX])
                if isinstance(fingerprint, str)
                else ('sealed' if fields['sealed'] is not None else '-'),
                _payload_cell(fields),
                local(fields['recorded_epoch'], millis=True),
            ]
        )
    high_water = RunMeta.parse(snapshot.records['meta']).high_water if 'meta' in snapshot.records else 0
    if high_water > expected:  # a failed attempt claimed positions it never recorded
        rows += _gap_rows(expected, high_water - 1, missing)
    return rows


def _payload_cell(fields: dict[str, Any]) -> str:
    if fields['payload_bytes'] is not None:
        return size(fields['payload_bytes'])
    return f'sealed (key id {cell(str(fields["sealed"]), 20)})' if fields['sealed'] is not None else '-'


def show_command(target: Target, key: str, as_json: bool) -> int:
    found = run_on(target, lambda journal: _find(journal, key))
    if found is None:
        raise _not_found(key, target)
    record = found.record or {}
    attempts = record.get('attempts') if type(record.get('attempts')) is int else None
    updated = found.updated
    if as_json:
        print_json(
            {
                'key': found.key,
                'state': found.state,
                'attempts': attempts,
                'metadata': metadata_of(record),
                'retain_until': utc(found.retain_until),
                'retain_until_epoch': found.retain_until,
                'updated': utc(updated),
                'updated_epoch': updated,
                'calls': [call_json(call) for call in deferred_calls(record)],
                **waits_json(record),
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
        f'execution  {cell(found.key, 100)}',
        f'state      {escape(found.state)}' + (f', {plural(attempts, "attempt")}' if attempts is not None else ''),
        f'updated    {local(updated)}',
        f'recorded   {plural(len(found.runs), "run")}, {plural(steps, "step")}',
    ]
    if found.retain_until is not None:
        lines.append(f'retained   until {local(found.retain_until)}, then deleted by retention')
    if metadata_of(record):
        lines.append(f'metadata   {_metadata_text(metadata_of(record), 100)}')
    elif isinstance(record.get(SEALED), dict):
        lines.append(f'metadata   sealed (set ${KEYS_VARIABLE} to read it and the payloads)')
    lines += sealed_note(found.record)
    if found.record is None:
        lines.append('           (no execution record: its runs cannot be listed)')
    lines += [*waits_lines(found.record), *calls_lines(found.record)]
    for run, snapshot in found.runs:
        lines += ['', f'run {cell(run, 100)}']
        rows = _step_rows(snapshot)
        if rows:
            headers = ['POS', 'KIND', 'NAME', 'FINGERPRINT', 'PAYLOAD', 'RECORDED']
            lines += table(headers, rows, right={0, 4}, indent='  ')
        else:
            lines.append('  (no steps recorded)')
        for extra in (_meta_line(snapshot), _spend_line(snapshot)):
            if extra is not None:
                lines.append(f'  {extra}')
    print_lines(lines)
    return EXIT_OK


def delete_command(target: Target, key: str, *, force: bool, as_json: bool) -> int:
    async def delete(journal: Journal) -> _Found | None:
        found = await _find(journal, key)
        if found is None:
            return None
        running = Failure(
            f'execution {quote(key)} is running: an attempt holds its lease and the journal cannot prove that '
            "attempt's process dead; stop it first, or pass --force to delete it anyway (that attempt then stops "
            'at its next step)'
        )
        if found.state == 'running' and not force:
            raise running
        await journal.open()  # a read-only or unreachable store says so here
        # The lease is taken first (a new epoch), so the attempt that held it can write nothing more.
        if await delete_under_lease(journal, key, force=force) is not None:
            raise running
        left = [bool((await journal.read_run(key, run)).entries) for run, _ in found.runs]
        if await journal.read_execution(key) is not None or any(left):
            raise Failure(f'execution {quote(key)} in {target.label} could not be deleted')
        return found

    found = run_on(target, delete)
    if found is None:
        raise _not_found(key, target)
    steps = sum(len(snapshot.entries) for _, snapshot in found.runs)
    if as_json:
        print_json({'deleted': found.key, 'state': found.state, 'runs': len(found.runs), 'steps': steps})
    else:
        print_lines(
            [
                f'deleted execution {quote(found.key)} ({escape(found.state)}, '
                f'{plural(len(found.runs), "run")}, {plural(steps, "step")}) from {target.label}'
            ]
        )
    return EXIT_OK


def prune_command(
    target: Target, older_than: Duration | None, states: tuple[ExecutionState, ...] | None, as_json: bool
) -> int:
    if older_than is None and states is not None:
        raise Failure(
            '--state applies with --older-than; without it, prune deletes expired finished executions', EXIT_USAGE
        )
    chosen: tuple[ExecutionState, ...] = states or ('finished',)
    if 'running' in chosen:
        raise Failure('prune never deletes running executions; delete one with `delete KEY --force`', EXIT_USAGE)

    async def prune(journal: Journal) -> tuple[list[str], list[ExecutionInfo]]:
        await journal.open()
        if older_than is None:
            pruned = await journal.prune()
        else:
            pruned = await journal.prune(older_than.seconds, states=chosen)
        return pruned, (await journal.list_executions() if not pruned else [])

    pruned, left = run_on(target, prune)
    if as_json:
        print_json(pruned)
    elif pruned:
        what = (
            f'not updated for {older_than.text} ({"/".join(chosen)})'
            if older_than is not None
            else 'finished, whose retention ended'
        )
        print_lines([f'pruned {plural(len(pruned), "execution")} {what}:', *(f'  {cell(k, 100)}' for k in pruned)])
    else:
        print_lines([f'nothing to prune in {target.label}: {_why_nothing(left, older_than, chosen)}'])
    return EXIT_OK


def _why_nothing(left: list[ExecutionInfo], older_than: Duration | None, chosen: tuple[str, ...]) -> str:
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
            reasons.append(f'the first retention ends {local(min(waiting))}')
        if kept:
            reasons.append(f'{plural(len(kept), "finished execution")} kept without retention')
        reasons.append('only finished executions whose retention ended are pruned (--older-than for others)')
        return '; '.join(reasons)
    matching = [info for info in left if info.state in chosen]
    if not matching:
        return f'it holds {held}, none {"/".join(chosen)} (--state chooses others)'
    return f'every {"/".join(chosen)} execution was updated within {older_than.text} ({held})'


def _count_states(infos: list[ExecutionInfo]) -> dict[str, int]:
    counts = {state: sum(info.state == state for info in infos) for state in EXECUTION_STATES}
    return {state: count for state, count in counts.items() if count}


def rekey_command(target: Target, as_json: bool, *, decrypt: bool = False) -> int:
    """Rewrite every execution no attempt holds under the current key, or in plain text with `decrypt`.

    Exit 1 if any was held by an attempt or could not be read: every other one is rewritten all the same.
    """

    def progress(key: str, values: int) -> None:
        if not as_json:
            print_lines([f'rekeyed {cell(key, 100)} ({plural(values, "value")})'])

    report = run_on(target, lambda journal: rekey(journal, progress, decrypt=decrypt))
    reclaim = _reclaim(target.journal) if report.sealed_plain else None
    if as_json:
        print_json(
            {
                'rewritten': report.rewritten,
                'busy': report.busy,
                'skipped': report.skipped,
                'values': report.values,
                'sealed_plain': report.sealed_plain,
                'reclaim': reclaim,
                'marker_cleared': report.marker_cleared,
            }
        )
    else:
        print_lines(_rekey_lines(report, decrypt, reclaim))
    return EXIT_OK if not report.busy and not report.skipped else EXIT_NOT_FOUND


def _rekey_lines(report: RekeyReport, decrypt: bool, reclaim: str | None) -> list[str]:
    done = f'{plural(len(report.rewritten), "execution")} ({plural(report.values, "value")})'
    lines = [f'{done} ' + ('stored in plain text' if decrypt else 'rewritten under the current key')]
    if report.busy:
        lines.append(
            f'{plural(len(report.busy), "execution")} left as they were, held by a running attempt: '
            + ', '.join(cell(key, 60) for key in report.busy)
            + '; run rekey again once they end, and keep the old key listed until then'
        )
    if report.skipped:  # named, each with its reason; every other execution was rewritten
        skipped = plural(len(report.skipped), 'execution')
        lines.append(f'{skipped} skipped, left as they were because they could not be read:')
        lines += [f'  {cell(key, 60)}: {cell(reason, 400)}' for key, reason in report.skipped.items()]
    if report.marker_cleared:
        lines.append(
            "the journal's marker of encryption is cleared: a journal without keys may record here again; "
            'give a worker keys, and it marks the journal again'
        )
    elif decrypt:
        lines.append("the journal's marker of encryption stays until every execution is stored in plain text")
    if reclaim is not None:
        lines.append(
            f'{plural(report.sealed_plain, "execution")} held plain text, now sealed; its old copies stay in the '
            'store until the space is reclaimed:'
        )
        lines.append(f'  {reclaim}')
    return lines


def _reclaim(journal: Journal) -> str | None:
    """The command that removes the old plain copies of values `rekey` sealed, for this kind of store."""
    if isinstance(journal, PostgresJournal):  # old row versions stay in the table files until PostgreSQL reclaims them
        schema = '"' + journal.schema.replace('"', '""') + '"'
        return f'VACUUM FULL {schema}.entries, {schema}.run_records, {schema}.executions;'
    if isinstance(journal, DiskJournal):  # freed pages of SQLite keep their bytes until they are reused
        return f"with every process of the journal stopped: sqlite3 {journal.path / 'cache.db'} 'VACUUM'"
    return None
