"""Cancelling an execution for good, together with the provider's job it waits on (TM-10).

Cancelling an attempt (its task, its `CancellationToken`) leaves the provider's job running for the next attempt
(TM-6): the execution goes on. `cancel_execution` ends the execution instead. Its record notes the cancellation
under `CANCEL`. What holds no job at the provider (a wait on decisions or on an external event, a failed
execution) ends at once, `failed`. What may hold one (a run that waits on the provider or at a long wait, an
interrupted attempt) needs one more attempt to cancel it, since only the app's model can: the record is marked
for it, reads `interrupted` so the sweep sends it on, and that attempt runs nothing live but the job's
cancellation, then ends `failed` with `ExecutionCancelled`. Every later entry is refused.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

from .._errors import DurableError, ExecutionBusy, ExecutionCancelled, LeaseLost
from ..journals import Journal, state_of
from ._provider_waits import waits_on_provider
from ._records import ENTRY_VERSION
from ._resolve import check_open, dispatcher_for, under_own_lease
from ._timer_waits import waits_on_timer

__all__ = ('CANCEL', 'cancel_execution', 'cancel_request', 'cancellation', 'carried_out', 'check_not_cancelled')

log = logging.getLogger('pydantic_ai_durable')

CANCEL = 'cancel'
"""The execution record's field of a cancellation: `{"reason": text, "at": epoch seconds, "done": epoch seconds or
null}`; `done` is set once nothing more of the execution runs. Part of the record format."""

Cancelled = Literal['cancelled', 'requested']


def cancellation(record: dict[str, Any] | None) -> tuple[str, float, float | None] | None:
    """The record's cancellation: its reason, when, and when it was carried out (`None`: not yet)."""
    stored = (record or {}).get(CANCEL)
    if not isinstance(stored, dict):
        return None
    reason, at, done = stored.get('reason'), stored.get('at'), stored.get('done')
    if not isinstance(at, (int, float)):
        return None
    return str(reason), float(at), float(done) if isinstance(done, (int, float)) else None


def cancel_request(record: dict[str, Any] | None) -> tuple[str, float] | None:
    """The reason and time of a cancellation the attempt reading `record` must carry out, if any."""
    cancel = cancellation(record)
    return (cancel[0], cancel[1]) if cancel is not None and cancel[2] is None else None


def check_not_cancelled(key: str, record: dict[str, Any] | None) -> None:
    """Refuse to enter an execution whose cancellation was carried out: nothing more of it runs."""
    cancel = cancellation(record)
    if cancel is not None and cancel[2] is not None:
        raise ExecutionCancelled(key, reason=cancel[0], at=cancel[1])


def carried_out(record: dict[str, Any], error: BaseException | None, waiting: bool) -> bool:
    """Whether the attempt ending with `error` carried the record's cancellation out; if so, noted in `record`.

    It did when its run stopped with `ExecutionCancelled`, and when it would end waiting anyway (on a decision,
    an event, the provider): the cancellation then ends what it waits on. Ended otherwise (finished, or failed
    before it got there), the cancellation is left for the next attempt, or dropped with a finished execution.
    """
    cancel = cancellation(record)
    if cancel is None or cancel[2] is not None:
        return False
    if isinstance(error, ExecutionCancelled) or waiting:
        record[CANCEL] = {'reason': cancel[0], 'at': cancel[1], 'done': time.time()}
        return True
    if error is None:
        record.pop(CANCEL, None)  # it finished: every step replayed, nothing was left to cancel
    return False


async def cancel_execution(
    journal: Journal, key: str, reason: str = 'cancelled', *, wait: float = 10.0, dispatch: bool = False
) -> Cancelled:
    """Cancel execution `key` for good: `"cancelled"` when it ended at once, `"requested"` when an attempt must.

    An execution that waits on decisions or on an external event, or that failed, holds no job at the provider
    and ends `failed` at once. One whose run waits on the provider's job or at a long wait, or whose attempt was
    interrupted, is marked for cancelling: the next attempt of the same code (the sweep sends it, or
    `dispatch=True` at once) cancels the job, runs nothing else live and ends `failed`. A finished execution is
    refused with a `DurableError`, as is an unknown one; one an attempt holds raises `ExecutionBusy` after
    `wait` seconds (cancel that attempt's task first: its job is kept for this). Cancelling again is accepted
    and changes nothing.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f'cancel_execution() needs a reason, a non-empty text, not {reason!r}.')
    dispatcher = dispatcher_for(key) if dispatch else None
    outcome = await under_own_lease(journal, key, wait, lambda epoch: _mark(journal, key, reason, epoch))
    if dispatcher is not None and outcome == 'requested':
        try:
            await dispatcher(journal, key)
        except Exception as exc:
            raise DurableError(
                f'Execution {key!r}: the cancellation is recorded, but sending it on to a worker failed '
                f"({type(exc).__name__}: {exc}). It stands: the workers' sweep sends it on, or run the same code again."
            ) from exc
    return outcome


async def _mark(journal: Journal, key: str, reason: str, epoch: int) -> Cancelled:
    record = await journal.read_execution(key)
    check_open(key, record)
    if not isinstance(record, dict) or record.get('v') != ENTRY_VERSION:
        found = 'does not exist' if record is None else 'has an unreadable record'
        raise DurableError(f'Execution {key!r} {found} in {journal!r}: there is nothing to cancel.')
    earlier = cancellation(record)
    if earlier is not None:
        return 'requested' if earlier[2] is None else 'cancelled'
    state = state_of(record, leased=False)
    if state == 'finished':
        raise DurableError(
            f'Execution {key!r} finished: there is nothing left to cancel. Delete it (pydantic-ai-durable delete) '
            'if its journal is no longer wanted.'
        )
    now = time.time()
    holds_job = state == 'interrupted' or waits_on_provider(record) or waits_on_timer(record)
    written: dict[str, Any] = {**record, CANCEL: {'reason': reason, 'at': now, 'done': None if holds_job else now}}
    written['updated'] = now
    # To be cancelled by an attempt, it reads `interrupted` (no lease, not ended), which the sweep sends on.
    written['status'] = 'running' if holds_job else 'failed'
    try:
        ok = await journal.write_execution(key, written, epoch=epoch)
    except LeaseLost as lost:
        raise ExecutionBusy(key, holder=lost.holder or 'another attempt', expires_at=now) from lost
    if not ok:
        raise DurableError(f'Execution {key!r}: the cancellation cannot be stored as JSON ({reason!r}).')
    log.info('Execution %r: cancelled (%s)%s.', key, reason, '; its next attempt cancels its job' if holds_job else '')
    return 'requested' if holds_job else 'cancelled'
