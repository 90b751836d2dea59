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

from ..journals import DEFERRED, CallDecision, CallKind, decision_of, deferred_calls

__all__ = ('Deferral', 'decisions_for', 'note_answered', 'note_deferred', 'pending_ids', 'still_waiting')

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


def note_deferred(record: dict[str, Any], run: str, deferrals: Sequence[Deferral]) -> None:
    """Note the calls run `run` ended waiting on; a call noted before (a replay of the same wait) keeps its state.

    A call id the record already holds for another call (another run, tool or arguments) is replaced, with a
    WARNING: a decision must never reach a call it was not made for. A decided call that waits again for another
    kind of decision (an approved tool that then defers its result) keeps its decision, applied on every
    replay, and is marked `again`: pydantic-ai asks for that second decision only in a new run, never in the
    step that applied the first, so the execution waits for an app that passes `DeferredToolResults` itself,
    with a WARNING, instead of finishing.
    """
    calls = _calls(record)
    now = time.time()
    for deferral in deferrals:
        known = calls.get(deferral.call_id)
        same = isinstance(known, dict) and (known.get('run'), known.get('tool'), known.get('digest')) == (
            run,
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
                'Execution record: tool call id %r was deferred before for another call; the earlier one is forgotten.',
                deferral.call_id,
            )
        calls[deferral.call_id] = {
            'run': run,
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


def note_answered(record: dict[str, Any], run: str, call_ids: Iterable[str]) -> None:
    """Note that run `run` gave these calls their results without a recorded decision (the app's own way)."""
    calls = record.get(DEFERRED)
    if not isinstance(calls, dict):
        return
    for call_id in call_ids:
        known = calls.get(call_id)
        if (
            isinstance(known, dict)
            and known.get('answered') is None
            and (known.get('decision') is None or known.get('again') is not None)
        ):
            known['answered'] = run


def decisions_for(
    record: dict[str, Any], run: str, asked: Sequence[tuple[str, str, str, CallKind]]
) -> dict[str, CallDecision]:
    """The recorded decisions for the calls `(call id, tool name, digest, kind)` a run is now waiting on.

    All or nothing: unless every one of them was noted by this run, for this tool, these arguments and this kind
    of decision, and is decided, the answer is empty and the run ends waiting again without running anything.
    """
    calls = record.get(DEFERRED)
    found: dict[str, CallDecision] = {}
    for call_id, tool_name, digest, kind in asked:
        stored = calls.get(call_id) if isinstance(calls, dict) else None
        if not isinstance(stored, dict):
            return {}
        if (stored.get('run'), stored.get('tool'), stored.get('digest'), stored.get('kind')) != (
            run,
            tool_name,
            digest,
            kind,
        ):
            return {}
        decision = decision_of(stored.get('decision'))
        if decision is None:
            return {}
        found[call_id] = decision
    return found


def still_waiting(record: dict[str, Any]) -> bool:
    """Whether a call noted in the record is still undecided and unanswered: the attempt then ends `waiting`."""
    return any(call.pending for call in deferred_calls(record))


def pending_ids(records: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The ids of the calls still undecided in `records`: what an attempt that ended leaves its execution waiting on."""
    return tuple(call.call_id for record in records for call in deferred_calls(record, pending_only=True))
