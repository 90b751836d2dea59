"""What an attempt keeps of the calls its runs deferred: noted at a run's end, decided by `resolve` (WT-1, WT-3).

A run that ends with tool calls waiting for a decision leaves them in the attempt's copy of the execution
record (`StoreHold.record`, field `DEFERRED`); the attempt then ends `waiting` instead of `finished` and
writes them with its status. A later attempt reads the decisions `resolve` recorded there and hands them to
the run at the same point of its replay, so a call is only ever decided by the record. Nothing here writes
to a journal: the attempt writes the record, `_resolve` the decisions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..journals import DEFERRED, CallDecision, CallKind, decision_of, deferred_calls, timer_waits, wait_ref
from ._provider_waits import waits_on_provider
from ._timer_waits import waits_on_timer

__all__ = (
    'Deferral',
    'decided_at',
    'decisions_for',
    'note_answered',
    'note_deferred',
    'pending_ids',
    'still_waiting',
)

log = logging.getLogger('pydantic_ai_durable')


@dataclass(frozen=True)
class Deferral:
    """One call a run ends waiting on, as the capability describes it to the core (JSON values only)."""

    call_id: str
    tool_name: str
    kind: CallKind
    arguments: Any
    digest: str
    """Digest of the tool name and arguments: a decision applies only to the call it was made for."""
    wait: int
    """The position in the run where it waits: with the run, what a decision belongs to, whatever the id (WT-7)."""
    metadata: dict[str, Any] | None = None
    tool_metadata: dict[str, Any] | None = None
    request: dict[str, Any] | None = None
    timeout: float | None = None
    """Seconds the call may wait before the sweep denies it; `None`: for ever."""


def _calls(record: dict[str, Any]) -> dict[str, Any]:
    stored = record.get(DEFERRED)
    if not isinstance(stored, dict):
        stored = record[DEFERRED] = {}
    return stored


def _slot(calls: dict[str, Any], call_id: str, run: str, wait: int, tool: str, digest: str) -> str | None:
    """The slot of the call `call_id` run `run` waits on at position `wait` (WT-7), or `None` if none is noted.

    A slot recorded before waits had positions (keyed by the call id, no `wait`) is taken by the first wait of
    its run that asks the same tool with the same arguments, and stamped with it, so later waits that reuse the
    id never reach its decision.
    """
    for slot, item in calls.items():
        if (
            isinstance(item, dict)
            and item.get('kind') != 'event'  # a wait on an external event is no tool call (EV-1)
            and (item.get('id', slot), item.get('run'), item.get('wait')) == (call_id, run, wait)
        ):
            return slot
    legacy = calls.get(call_id)
    if (
        isinstance(legacy, dict)
        and 'wait' not in legacy
        and (legacy.get('run'), legacy.get('tool'), legacy.get('digest')) == (run, tool, digest)
    ):
        legacy['id'], legacy['wait'] = call_id, wait
        return call_id
    return None


def _free_slot(calls: dict[str, Any], call_id: str, run: str, wait: int) -> str:
    """A slot name for a new wait: the call id, unless an earlier wait holds it (a reused id)."""
    if call_id not in calls:
        return call_id
    name = wait_ref(call_id, run, wait)
    count = 1
    while name in calls:
        count += 1
        name = f'{call_id}@{run}:{wait}#{count}'
    return name


def note_deferred(record: dict[str, Any], run: str, deferrals: Sequence[Deferral]) -> None:
    """Note the calls run `run` ended waiting on; a call noted before (a replay of the same wait) keeps its state.

    A call is its run and the position of its wait there with its id (WT-7): a later wait that reuses the id is
    another call, with a slot of its own, and the earlier call keeps its decision. A different call noted at the
    same wait (the run went another way after a divergence) is replaced, with a WARNING: a decision must never
    reach a call it was not made for. A decided call that waits again for another kind of decision (an approved
    tool that then defers its result) keeps its decision, applied on every replay, and is marked `again`:
    pydantic-ai asks for that second decision only in a new run, never in the step that applied the first, so
    the execution waits for an app that passes `DeferredToolResults` itself, with a WARNING, instead of finishing.
    """
    calls = _calls(record)
    now = time.time()
    for deferral in deferrals:
        slot = _slot(calls, deferral.call_id, run, deferral.wait, deferral.tool_name, deferral.digest)
        known = calls.get(slot) if slot is not None else None
        same = isinstance(known, dict) and (known.get('tool'), known.get('digest')) == (
            deferral.tool_name,
            deferral.digest,
        )
        if same and isinstance(known, dict):
            if known.get('kind') == deferral.kind or known.get('again') == deferral.kind:
                continue
            if known.get('decision') is not None:
                known['again'], known['again_since'] = deferral.kind, now
                log.warning(
                    'Execution record: tool call %r (%s) was decided, then deferred again for an %s decision, which '
                    'pydantic-ai asks for only in a new run. The execution waits: answer the call by running the '
                    'agent with the message history and DeferredToolResults for it.',
                    deferral.call_id,
                    deferral.tool_name,
                    deferral.kind,
                )
                continue
        if known is not None:
            log.warning(
                'Execution record: run %s waited at step %d on another call %r before; the earlier one is forgotten.',
                run,
                deferral.wait,
                deferral.call_id,
            )
        calls[slot if slot is not None else _free_slot(calls, deferral.call_id, run, deferral.wait)] = {
            'id': deferral.call_id,
            'run': run,
            'wait': deferral.wait,
            'tool': deferral.tool_name,
            'kind': deferral.kind,
            'args': deferral.arguments,
            'digest': deferral.digest,
            'metadata': deferral.metadata,
            'tool_metadata': deferral.tool_metadata,
            'request': deferral.request,
            'since': now,
            'deadline': now + deferral.timeout if deferral.timeout is not None else None,
        }


def note_answered(record: dict[str, Any], run: str, answered: Iterable[tuple[str, str, str]]) -> None:
    """Note that run `run` gave these calls `(call id, tool name, digest)` their results without a recorded
    decision (the app's own way): only a call an earlier run waits on is answered so, never one of this run,
    whose results come from its decisions, nor another call that reused the id (WT-7)."""
    calls = record.get(DEFERRED)
    if not isinstance(calls, dict):
        return
    given = set(answered)
    for slot, known in calls.items():
        if (
            isinstance(known, dict)
            and known.get('kind') != 'event'
            and known.get('run') != run
            and (known.get('id', slot), known.get('tool'), known.get('digest')) in given
            and known.get('answered') is None
            and (known.get('decision') is None or known.get('again') is not None)
        ):
            known['answered'] = run


def decisions_for(
    record: dict[str, Any], run: str, wait: int, asked: Sequence[tuple[str, str, str, CallKind]]
) -> dict[str, CallDecision]:
    """The recorded decisions for the calls `(call id, tool name, digest, kind)` run `run` waits on at `wait`.

    All or nothing: unless every one of them was noted at this wait of this run (WT-7), for this tool, these
    arguments and this kind of decision, and is decided, the answer is empty and the run ends waiting again
    without running anything.
    """
    calls = record.get(DEFERRED)
    if not isinstance(calls, dict):
        return {}
    found: dict[str, CallDecision] = {}
    for call_id, tool_name, digest, kind in asked:
        slot = _slot(calls, call_id, run, wait, tool_name, digest)
        stored = calls.get(slot) if slot is not None else None
        if not isinstance(stored, dict):
            return {}
        if (stored.get('tool'), stored.get('digest'), stored.get('kind')) != (tool_name, digest, kind):
            return {}
        decision = decision_of(stored.get('decision'))
        if decision is None:
            return {}
        found[call_id] = decision
    return found


def decided_at(record: dict[str, Any], run: str, waits: Iterable[tuple[str, int]]) -> set[str]:
    """Which of the calls `(call id, wait)` of run `run` are decided and wait on nothing more (WT-10).

    An attempt that starts while some calls of a wait are pending replays to that wait and ends there again;
    its `DeferredToolRequests` lists only what still waits, so an app that shows it asks nobody twice.
    """
    calls = record.get(DEFERRED)
    if not isinstance(calls, dict):
        return set()
    decided: set[str] = set()
    for call_id, wait in waits:
        for slot, item in calls.items():
            if (
                isinstance(item, dict)
                and item.get('kind') != 'event'
                and (item.get('id', slot), item.get('run'), item.get('wait')) == (call_id, run, wait)
                and item.get('decision') is not None
                and item.get('again') is None
            ):
                decided.add(call_id)
    return decided


def still_waiting(record: dict[str, Any]) -> bool:
    """Whether a call noted in the record is still undecided and unanswered, a run waits on the provider (TM-7)
    or a run ended the attempt at a long wait (TM-4): the attempt then ends `waiting`."""
    return any(call.pending for call in deferred_calls(record)) or waits_on_provider(record) or waits_on_timer(record)


def pending_ids(records: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The ids of the calls still undecided in `records`, and `durable_sleep` for each long wait a run ended on
    (TM-4): what an attempt that ended leaves its execution waiting on."""
    return tuple(
        name
        for record in records
        for name in (
            *(call.call_id for call in deferred_calls(record, pending_only=True)),
            *('durable_sleep' for _ in timer_waits(record)),
        )
    )
