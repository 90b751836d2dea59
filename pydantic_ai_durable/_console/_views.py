"""What the console shows of an execution, read from the journal: its attempts, runs and steps, and their timeline.

Everything here is plain data built from what the journal holds, through the protocol and the core's readers
of stored shapes (the same ones `show` uses), so the pages and the JSON API say the same thing and neither
invents a fact the journal does not hold. A step's start, the attempt that ran it and the attempts that
replayed it come from its entry (`s`, `a`) and the execution record's `history`; a journal written by an
older release lacks them, and the console then says less rather than guess.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .._core import RunMeta, call_json, parse_entry, run_order, spend_cost
from .._runtime import utc_text
from ..journals import (
    SEALED,
    DeferredCall,
    ExecutionInfo,
    ExecutionState,
    Journal,
    RunSnapshot,
    deferred_calls,
    dumps,
    metadata_of,
)

__all__ = ('AttemptRow', 'ExecutionView', 'RunRow', 'StepRow', 'info_json', 'read_execution', 'utc')

_COUNTERS = ('input_tokens', 'output_tokens', 'requests', 'tool_calls')


def utc(moment: float | None) -> str | None:
    """An epoch time as ISO-8601 UTC with milliseconds (epoch seconds beyond the calendar), or `None`."""
    return utc_text(moment)


def _time(value: object) -> float | None:
    """A usable epoch time from a stored value, or `None` (old entries have none; a planted one may be anything)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 253402300800:
        return None
    return float(value)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return float(value)


def info_json(info: ExecutionInfo) -> dict[str, Any]:
    """One listed execution as the JSON API gives it (the fields of `list --json`)."""
    return {
        'key': info.key,
        'state': info.state,
        'runs': info.runs,
        'steps': info.steps,
        'bytes': info.bytes,
        'updated': utc(_time(info.updated)),
        'updated_epoch': _time(info.updated),
        'metadata': info.metadata,
        'retain_until': utc(info.retain_until),
        'wakes_at': utc(info.wakes_at),
        'wakes_at_epoch': info.wakes_at,
    }


@dataclass
class StepRow:
    """One recorded step, as the timeline and the steps table show it."""

    run: str
    position: int
    kind: str
    name: str
    fingerprint: str | None
    recorded: float | None
    started: float | None
    attempt: int | None
    """The attempt that ran it live and recorded it, when the entry says."""
    replayed_in: list[int]
    """The later attempts that replayed it, as far as the journal tells (they ran live past it, or finished)."""
    readable: bool
    sealed: bool
    payload_bytes: int | None
    matched: bool
    """Replayed by its arguments and written at its own position."""
    unjournalable: str | None
    """Why its result could not be kept: a fence a retry stops at."""
    redacted: bool
    fenced: bool
    """At or past the run's fence (`diverge_from`): a retry runs it live (F-rules)."""
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None

    @property
    def duration(self) -> float | None:
        if self.started is None or self.recorded is None:
            return None
        return max(0.0, self.recorded - self.started)


@dataclass
class RunRow:
    """One run of the execution: its steps, the positions it reached without a record, and its fence."""

    key: str
    steps: list[StepRow]
    gaps: list[tuple[int, int]]
    diverge_from: int | None
    high_water: int
    model_at_fault: bool
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost: float | None = None


@dataclass
class AttemptRow:
    """One attempt from the execution record's history: who ran it, when, how it ended, what it did."""

    number: int
    holder: str
    started: float | None
    ended: float | None
    outcome: str
    error: str | None
    live: int = 0
    replayed: int = 0
    bars: list[dict[str, Any]] = field(default_factory=list)
    """The attempt's live steps on its own time axis: `x` and `width` in percent, for the timeline (UI-2)."""


@dataclass
class ExecutionView:
    """Everything the execution page shows."""

    key: str
    state: ExecutionState
    attempts: int | None
    updated: float | None
    metadata: dict[str, Any] | None
    sealed_metadata: bool
    retain_until: float | None
    history: list[AttemptRow]
    runs: list[RunRow]
    steps_bytes: int = 0
    calls: list[DeferredCall] = field(default_factory=list)
    """Every tool call its runs deferred: those it waits on, and the decided ones with their audit trail."""

    def as_json(self) -> dict[str, Any]:
        found = asdict(self)
        found['calls'] = [call_json(call) for call in self.calls]
        found['updated'] = utc(self.updated)
        found['retain_until'] = utc(self.retain_until)
        for attempt in found['history']:
            attempt['started'], attempt['ended'] = utc(attempt['started']), utc(attempt['ended'])
            del attempt['bars']
        for run in found['runs']:
            for step in run['steps']:
                step['recorded'], step['started'] = utc(step['recorded']), utc(step['started'])
        return found


def _holder(value: object) -> str:
    """Who ran an attempt, as `host:pid`: the process token and serial of a holder name are its own business."""
    if not isinstance(value, str):
        return '?'
    parts = value.split(':')
    return ':'.join(parts[:2]) if len(parts) >= 4 else value


def _history(record: dict[str, Any], state: ExecutionState) -> list[AttemptRow]:
    listed = record.get('history')
    rows: list[AttemptRow] = []
    for item in listed if isinstance(listed, list) else []:
        if not isinstance(item, dict) or type(item.get('n')) is not int:
            continue
        outcome = item.get('outcome')
        error = item.get('error')
        rows.append(
            AttemptRow(
                number=item['n'],
                holder=_holder(item.get('holder')),
                started=_time(item.get('started')),
                ended=_time(item.get('ended')),
                outcome=outcome if isinstance(outcome, str) else 'interrupted',
                error=error if isinstance(error, str) else None,
            )
        )
    if rows and rows[-1].ended is None and state == 'running':
        rows[-1].outcome = 'running'
    return rows


def _step(run: str, position: int, entry: Any, meta: RunMeta) -> StepRow:
    value = entry if isinstance(entry, dict) else {}
    payload = dumps(value['payload']) if 'payload' in value else None
    fingerprint = value.get('fingerprint')
    attempt = value.get('a')
    unjournalable = value.get('unjournalable')
    return StepRow(
        run=run,
        position=position,
        kind=value['kind'] if isinstance(value.get('kind'), str) else '?',
        name=value['name'] if isinstance(value.get('name'), str) else '?',
        fingerprint=fingerprint[:12] if isinstance(fingerprint, str) else None,
        recorded=_time(value.get('t')),
        started=_time(value.get('s')),
        attempt=attempt if type(attempt) is int else None,
        replayed_in=[],
        readable=parse_entry(entry) is not None,
        sealed=isinstance(value.get(SEALED), dict),
        payload_bytes=len(payload) if payload is not None else None,
        matched=value.get('matched') is True,
        unjournalable=unjournalable if isinstance(unjournalable, str) else None,
        redacted=value.get('redacted') is True,
        fenced=meta.diverge_from is not None and position >= meta.diverge_from,
    )


def _spend(entry: Any) -> dict[str, float] | None:
    """The run's live spend that rode along with an entry: cumulative counters, and the cost when priced."""
    usage = entry.get('usage') if isinstance(entry, dict) else None
    counters = usage.get('usage') if isinstance(usage, dict) else None
    if not isinstance(counters, dict):
        return None
    found = {name: _number(counters.get(name)) for name in _COUNTERS}
    cost = spend_cost(counters)
    if cost is not None:
        found['cost'] = cost
    return found


def _run(run: str, snapshot: RunSnapshot) -> RunRow:
    meta = RunMeta.parse(snapshot.records.get('meta') if isinstance(snapshot.records.get('meta'), dict) else None)
    steps: list[StepRow] = []
    gaps: list[tuple[int, int]] = []
    expected = 0
    last: dict[str, float] | None = None
    for position in sorted(snapshot.entries):
        if position > expected:
            gaps.append((expected, position - 1))
        expected = position + 1
        entry = snapshot.entries[position]
        step = _step(run, position, entry, meta)
        spent = _spend(entry)
        if spent is not None:  # a step's tokens: what the run's spend grew by since the previous snapshot
            before = last or {}
            step.tokens_in = int(max(0.0, spent['input_tokens'] - before.get('input_tokens', 0.0)))
            step.tokens_out = int(max(0.0, spent['output_tokens'] - before.get('output_tokens', 0.0)))
            if 'cost' in spent:
                step.cost = max(0.0, spent['cost'] - before.get('cost', 0.0))
            last = spent
        steps.append(step)
    if meta.high_water > expected:
        gaps.append((expected, meta.high_water - 1))
    row = RunRow(run, steps, gaps, meta.diverge_from, meta.high_water, meta.model_at_fault)
    if last is not None:
        row.tokens_in, row.tokens_out, row.cost = (
            int(last['input_tokens']),
            int(last['output_tokens']),
            last.get('cost'),
        )
    return row


def _replays(runs: list[RunRow], history: list[AttemptRow]) -> None:
    """Which later attempts replayed each step: those that ran live past it in its run, or finished."""
    finished = {attempt.number for attempt in history if attempt.outcome == 'finished'}
    for run in runs:
        furthest: dict[int, int] = {}
        for step in run.steps:
            if step.attempt is not None:
                furthest[step.attempt] = max(furthest.get(step.attempt, -1), step.position)
        for step in run.steps:
            if step.attempt is None:
                continue
            step.replayed_in = sorted(
                number
                for number in {*furthest, *finished}
                if number > step.attempt and (number in finished or furthest.get(number, -1) > step.position)
            )


def _bars(history: list[AttemptRow], runs: list[RunRow], now: float) -> None:
    """Place each attempt's live steps on that attempt's own time axis (attempts may be days apart)."""
    steps = [step for run in runs for step in run.steps]
    for attempt in history:
        mine = [step for step in steps if step.attempt == attempt.number and step.recorded is not None]
        attempt.live = len(mine)
        attempt.replayed = sum(attempt.number in step.replayed_in for step in steps)
        times = [t for step in mine for t in (step.started, step.recorded) if t is not None]
        start = min([t for t in (attempt.started, *times) if t is not None], default=None)
        end = max([t for t in (attempt.ended, *times) if t is not None], default=None)
        if attempt.outcome == 'running':
            end = max(end or now, now)
        if start is None or end is None:
            continue
        span = max(end - start, 1e-3)
        for step in mine:
            assert step.recorded is not None
            begin = step.started if step.started is not None else step.recorded
            x = 100.0 * (begin - start) / span
            attempt.bars.append(
                {
                    'run': step.run,
                    'position': step.position,
                    'kind': step.kind,
                    'name': step.name,
                    'x': round(min(max(x, 0.0), 99.5), 3),
                    'width': round(max(100.0 * (step.recorded - begin) / span, 0.4), 3),
                    'duration': step.duration,
                    'fenced': step.unjournalable is not None,
                }
            )


async def read_execution(journal: Journal, key: str, now: float) -> ExecutionView | None:
    """The execution `key` as the console shows it, or `None` when the journal holds nothing under it."""
    page = await journal.page_executions(key=key, limit=1)
    record = await journal.read_execution(key)
    info = page.executions[0] if page.executions else None
    if info is None and record is None:
        return None
    record = record if isinstance(record, dict) else {}
    state: ExecutionState = info.state if info is not None else 'interrupted'
    listed = record.get('runs')
    names = sorted({run for run in listed if isinstance(run, str)} if isinstance(listed, list) else (), key=run_order)
    runs = [_run(run, await journal.read_run(key, run)) for run in names]
    history = _history(record, state)
    _replays(runs, history)
    _bars(history, runs, now)
    attempts = record.get('attempts')
    return ExecutionView(
        key=key,
        state=state,
        attempts=attempts if type(attempts) is int else None,
        updated=_time(info.updated) if info is not None else _time(record.get('updated')),
        metadata=metadata_of(record),
        sealed_metadata=isinstance(record.get(SEALED), dict),
        retain_until=info.retain_until if info is not None else None,
        history=history,
        runs=runs,
        steps_bytes=info.bytes if info is not None else 0,
        calls=deferred_calls(record),
    )
