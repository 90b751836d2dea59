"""The recovery sweep: hand interrupted executions back to a job queue, each once per interruption (FL-3).

A job queue brings back a killed worker's task only when its broker notices (a Redis visibility timeout,
a stalled-job check), which can take an hour. The sweep bounds that: an execution left `interrupted` for
`idle` seconds is claimed under its own lease, marked as dispatched for the attempt that was interrupted,
released, and only then given to `dispatch`, which enqueues it again from its metadata. The claim and
the mark make concurrent sweeps (one per worker) dispatch each execution once; a dispatch that is lost
after the mark is retried once `idle` has passed again. The claim lasts no longer than the sweep's own
period, so a sweeping process that dies holding it delays that execution by one period at most.

An execution that waits and whose every call is decided is ready to go on: `resolve(..., dispatch=True)`
sends it at once, and the sweep sends it the same way as an interrupted one, once `idle` has passed since
the decision, so a resolver that died before its send leaves nothing stuck. One that still waits
on a call is never sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._errors import LeaseLost
from .._runtime import end_holding, new_holder, start_holding
from ..journals import ExecutionInfo, Journal, deferred_calls
from ._provider_waits import waits_on_provider
from ._records import ENTRY_VERSION
from ._resolve import deny_listed
from ._timer_waits import timer_ahead, waits_on_timer

__all__ = ('DISPATCHED', 'sweep_interrupted')

log = logging.getLogger('pydantic_ai_durable')

DISPATCHED = 'dispatched'
"""The execution record's field a sweep writes: `{"attempt": n, "at": epoch seconds}`."""

_CLAIM_MAX = 30.0
"""The most seconds a claim lasts by default, whatever `idle` is."""


async def sweep_interrupted(
    journal: Journal,
    dispatch: Callable[[ExecutionInfo], Awaitable[None] | None],
    *,
    idle: float = 30.0,
    select: Callable[[ExecutionInfo], bool] | None = None,
    limit: int | None = None,
    claim_ttl: float | None = None,
) -> list[str]:
    """Dispatch again every execution interrupted for `idle` seconds that `select` accepts; return their keys.

    An execution is dispatched when no attempt wrote to it for `idle` seconds and no sweep dispatched it in
    the last `idle` seconds (or since, an attempt started). So is a waiting execution whose every call is
    decided, `idle` seconds after the last decision (at once when this sweep's deadlines decided it), and
    never one that still waits on a call; one whose run waits on the provider's job alone, once per
    `idle`, so that its next attempt checks the job (TM-7); and one that ended an attempt at a long wait, once
    the wait's wake-up time has passed (TM-4). `dispatch` gets the execution as
    `list_executions` shows it (its key and `metadata`) and must enqueue a task that enters
    `execution(key)` again; a dispatch that raises is logged and retried by a later sweep
    once `idle` has passed. An execution that a live attempt holds, that ended meanwhile, or that another
    sweep dispatched within `idle` seconds is left alone, so sweeps may run in every worker at once.
    `claim_ttl` is how long the sweep's claim on one execution lasts if this process dies while it marks
    it (default: a third of `idle`, at most 30 s); give the period at which you sweep, or less (FL-8).
    """
    if not isinstance(idle, (int, float)) or isinstance(idle, bool) or not idle > 0:
        raise ValueError(
            f'idle must be a positive number of seconds, not {idle!r}: it is also how long a dispatch keeps '
            'other sweeps from dispatching the same execution again.'
        )
    if claim_ttl is None:
        claim_ttl = min(idle / 3, _CLAIM_MAX)
    if not isinstance(claim_ttl, (int, float)) or isinstance(claim_ttl, bool) or not claim_ttl > 0:
        raise ValueError(f'claim_ttl must be a positive number of seconds, not {claim_ttl!r}.')
    listed = await journal.list_executions(state=('interrupted', 'waiting'))
    # Calls pending past their deadline are denied, whatever else the sweep does; an execution whose last
    # call that decided is ready now, as after a resolve that sends it.
    waiting = [info for info in listed if info.state == 'waiting']
    decided = {resolution.key for resolution in await deny_listed(journal, waiting) if resolution.completed}
    now = time.time()
    candidates = [
        info
        for info in listed
        if (info.state == 'interrupted' and now - info.updated >= idle)
        or (info.key in decided or (_ready(info) and _idle_over(info, now, idle)))
    ]
    if select is not None:
        candidates = [info for info in candidates if select(info)]
    dispatched: list[str] = []
    for info in candidates:
        if limit is not None and len(dispatched) >= limit:
            break
        if not await _claim(journal, info.key, idle, float(claim_ttl)):
            continue
        try:
            pending = dispatch(info)
            if pending is not None:
                await pending
        except Exception as exc:
            log.warning(
                'Execution %r: dispatching it again failed (%s: %s); a later sweep retries in %g s.',
                info.key,
                type(exc).__name__,
                exc,
                idle,
            )
            continue
        if info.state == 'waiting':
            log.info('Execution %r: every call it waited on is decided; it was dispatched to go on.', info.key)
        else:
            log.info('Execution %r was interrupted; it was dispatched again.', info.key)
        dispatched.append(info.key)
    return dispatched


def _ready(info: ExecutionInfo) -> bool:
    """A waiting execution whose calls are all decided, read from a record this process can read (WT-4)."""
    return info.state == 'waiting' and not info.pending and info.problem is None


def _idle_over(info: ExecutionInfo, now: float, idle: float) -> bool:
    """Whether a ready execution is due: `idle` after its last write, or, waiting on a timer, once it is over (TM-4)."""
    return now - info.updated >= idle if info.wakes_at is None else info.wakes_at <= now


async def _claim(journal: Journal, key: str, idle: float, ttl: float) -> bool:
    """Mark `key` dispatched for its interrupted attempt, under a lease of the sweep's own; `False`: leave it."""
    holder = new_holder()
    start_holding(holder)
    try:
        lease = await journal.acquire_lease(key, holder, ttl)
        if lease.holder != holder:
            return False  # an attempt runs it (or another sweep claims it) right now
        try:
            record = await journal.read_execution(key)
            if record is None or not _due(record, idle):
                return False
            attempts = record.get('attempts')
            marked = {**record, DISPATCHED: {'attempt': attempts, 'at': time.time()}}
            return await journal.write_execution(key, marked, epoch=lease.epoch)
        except LeaseLost:
            return False
        finally:
            await journal.release_lease(key, holder, lease.epoch)
    finally:
        end_holding(holder)


def _due(record: dict[str, Any] | None, idle: float) -> bool:
    """Whether the record is of an attempt that never ended, or that ended waiting on calls now all decided or on
    the provider alone, and no sweep dispatched it within `idle` seconds."""
    if not isinstance(record, dict) or record.get('v') != ENTRY_VERSION:
        return False  # deleted, or of a format this release does not write
    status = record.get('status')
    calls = deferred_calls(record) if status == 'waiting' else []
    decided = not any(call.pending for call in calls)
    # TM-7: a run waiting on the provider is sent on to check its job, once per `idle`; TM-4: a long wait, once over
    waits = status == 'waiting' and (waits_on_provider(record) or waits_on_timer(record))
    ready = decided and (bool(calls) or waits) and not timer_ahead(record)
    if status != 'running' and not ready:
        return False  # finished or failed meanwhile, or still waiting on a call
    mark = record.get(DISPATCHED)
    if not isinstance(mark, dict) or mark.get('attempt') != record.get('attempts'):
        return True  # never dispatched, or dispatched for an earlier attempt, which has since run
    at = mark.get('at')
    return not isinstance(at, (int, float)) or time.time() - at >= idle
