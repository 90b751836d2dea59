"""The calls an execution waits on, as its record lists them: one reader for listings, the core and the CLI.

A run that ends with tool calls waiting for a person's approval or for an outside result leaves them in its
execution record, under `DEFERRED`, with the decision each gets once it is resolved. Everything that shows
or decides them (the backends' listings, `resolve`, the capability that applies the decisions, the CLI)
reads that field through `deferred_calls` here, so none of them reads the record's shape its own way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

__all__ = (
    'DEFERRED',
    'CallDecision',
    'CallKind',
    'DeferredCall',
    'decision_of',
    'deferred_calls',
    'deferred_slots',
    'pending_of',
    'wait_ref',
)

DEFERRED = 'deferred'
"""The execution record's field that holds the calls its runs deferred (sealed under encryption).

Format note (WT-7): each call is stored under a slot name with its call id (`id`), its run (`run`) and the
position of the wait in that run (`wait`); the slot is named by the call id alone unless another wait took
that name first (a reused id), then `ID@RUN:WAIT`. Releases before WT-7 stored the call under its id with
neither `id` nor `wait`: such a slot is read as that call id, and is taken by the first wait of its run that
asks the same tool with the same arguments."""


def wait_ref(name: str, run: str, wait: int) -> str:
    """A wait named so that no other wait of the execution shares the name: `NAME@RUN:WAIT` (WT-7).

    `NAME` is a call id, the name of a wait on an external event, or `durable_sleep` for a long wait (TM-4).
    """
    return f'{name}@{run}:{wait}'


CallKind = Literal['approval', 'external', 'event']
DecisionKind = Literal['approved', 'denied', 'result']
DecisionSource = Literal['resolve', 'deadline']


@dataclass(frozen=True)
class CallDecision:
    """How a deferred call was decided, by whom and when: the audit trail `show` prints."""

    kind: DecisionKind
    """`approved` (the tool runs), `denied` (the model is told `message`), or `result` (`value` is its return)."""
    at: float
    """Epoch seconds when the decision was recorded."""
    by: str | None = None
    """Who decided, as the resolver named itself (`resolve(..., by=...)`, the CLI's `--by`), or `None`."""
    via: DecisionSource = 'resolve'
    """`resolve` (a person or a program), or `deadline` (still pending past its deadline)."""
    message: str | None = None
    """For a denial: what the model is told."""
    override_args: dict[str, Any] | None = None
    """For an approval: the arguments the tool runs with instead of the model's, if any."""
    value: Any = None
    """For an outside result: the tool's return value (JSON)."""

    def as_record(self) -> dict[str, Any]:
        """The decision as the execution record stores it."""
        stored: dict[str, Any] = {'kind': self.kind, 'at': self.at, 'by': self.by, 'via': self.via}
        if self.kind == 'denied':
            stored['message'] = self.message
        elif self.kind == 'approved' and self.override_args is not None:
            stored['override_args'] = self.override_args
        elif self.kind == 'result':
            stored['value'] = self.value
        return stored

    def same_as(self, other: CallDecision) -> bool:
        """Whether `other` decides the same way (who and when aside): a repeated resolution is accepted."""
        return (self.kind, self.message, self.override_args, self.value) == (
            other.kind,
            other.message,
            other.override_args,
            other.value,
        )


@dataclass(frozen=True)
class DeferredCall:
    """One tool call a run of the execution deferred: what it asks, since when, and its decision once made."""

    call_id: str
    tool_name: str
    kind: CallKind
    """`approval`: the tool runs once a person approves it; `external`: its result comes from outside; `event`: a
    wait on an external event (EV-1), named `tool_name`, resolved by its resume token only."""
    arguments: Any
    """The arguments the model gave, with registered secrets masked (K-rules)."""
    run: str
    """The run that deferred it."""
    since: float
    """Epoch seconds when the run ended waiting on it."""
    deadline: float | None = None
    """Epoch seconds after which the sweep denies it; `None`: it waits for ever."""
    metadata: dict[str, Any] | None = None
    """The metadata the deferral carried (`ApprovalRequired(metadata=...)`, `CallDeferred(metadata=...)`)."""
    tool_metadata: dict[str, Any] | None = None
    """The tool's own metadata, as its definition declares it."""
    request: dict[str, Any] | None = None
    """What the call asks, validated, when a known capability deferred it (an `AskUserRequest` as JSON)."""
    decision: CallDecision | None = None
    answered_in: str | None = None
    """A later run of the execution that gave this call its result without a recorded decision (the app's own way)."""
    earlier: CallDecision | None = None
    """The decision the call got before it deferred again for another kind of decision (an approved tool that
    then waits for an outside result). pydantic-ai asks for the second decision only in a new run, so such a
    call is answered by the app's own run with `DeferredToolResults`, not by `resolve`."""
    wait: int | None = None
    """The position in its run where the run waited on it (WT-7); `None` for a call recorded before that was kept."""

    @property
    def ref(self) -> str:
        """The call named so that no other wait of the execution shares the name: `ID@RUN:WAIT` (WT-7).

        `resolve` takes it where the call id alone is ambiguous: two calls pending with one id, in two runs.
        """
        return self.call_id if self.wait is None else wait_ref(self.call_id, self.run, self.wait)

    @property
    def pending(self) -> bool:
        """Whether it still waits: undecided, and no later run answered it."""
        return self.decision is None and self.answered_in is None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _object(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def decision_of(value: object) -> CallDecision | None:
    """A decision as the record stores it, or `None` for none (or one of an unknown shape)."""
    if not isinstance(value, dict) or value.get('kind') not in ('approved', 'denied', 'result'):
        return None
    at = _number(value.get('at'))
    by = value.get('by')
    message = value.get('message')
    return CallDecision(
        kind=value['kind'],
        at=at if at is not None else 0.0,
        by=by if isinstance(by, str) else None,
        via='deadline' if value.get('via') == 'deadline' else 'resolve',
        message=message if isinstance(message, str) else None,
        override_args=_object(value.get('override_args')),
        value=value.get('value'),
    )


def deferred_calls(record: dict[str, Any] | None, *, pending_only: bool = False) -> list[DeferredCall]:
    """Every call the record lists as deferred, decided or not, oldest first; a malformed one is skipped.

    `pending_only` skips the decided and answered ones before reading them (a listing reads thousands).
    """
    return [call for _, call in deferred_slots(record, pending_only=pending_only)]


def deferred_slots(record: dict[str, Any] | None, *, pending_only: bool = False) -> list[tuple[str, DeferredCall]]:
    """`deferred_calls`, each with the name of the slot the record keeps it in: what a decision is written to."""
    stored = (record or {}).get(DEFERRED)
    if not isinstance(stored, dict):
        return []
    calls: list[tuple[str, DeferredCall]] = []
    for slot, item in stored.items():
        if not isinstance(item, dict) or item.get('kind') not in ('approval', 'external', 'event'):
            continue
        again = item.get('again') if item.get('again') in ('approval', 'external') else None
        if pending_only and ((item.get('decision') is not None and again is None) or item.get('answered') is not None):
            continue
        tool, run, since = item.get('tool'), item.get('run'), _number(item.get('since'))
        if not isinstance(tool, str) or not isinstance(run, str) or since is None:
            continue
        answered = item.get('answered')
        decision = decision_of(item.get('decision'))
        call_id, wait = item.get('id'), item.get('wait')
        calls.append(
            (
                slot,
                DeferredCall(
                    call_id=call_id if isinstance(call_id, str) else slot,
                    tool_name=tool,
                    kind=again or item['kind'],
                    arguments=item.get('args'),
                    run=run,
                    since=_number(item.get('again_since')) or since if again else since,
                    deadline=None if again else _number(item.get('deadline')),
                    metadata=_object(item.get('metadata')),
                    tool_metadata=_object(item.get('tool_metadata')),
                    request=_object(item.get('request')),
                    decision=None if again else decision,
                    answered_in=answered if isinstance(answered, str) else None,
                    earlier=decision if again else None,
                    wait=wait if isinstance(wait, int) and not isinstance(wait, bool) else None,
                ),
            )
        )
    if len(calls) > 1:
        calls.sort(key=lambda slot: (slot[1].since, slot[1].call_id))
    return calls


def pending_of(record: dict[str, Any] | None) -> tuple[DeferredCall, ...]:
    """The calls a waiting execution still waits on: listed with it (`ExecutionInfo.pending`)."""
    if record is None or record.get('status') != 'waiting':
        return ()
    return tuple(deferred_calls(record, pending_only=True))
