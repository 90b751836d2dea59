"""Deciding deferred calls from anywhere: `resolve_calls`, `pending_calls` and the deadline pass.

A web handler or a script decides a call with the journal and the execution key alone: no agent, no history.
The decision is written into the execution record under a lease of the resolver's own, so it is fenced like
any write, and a resolver never writes while an attempt runs: it waits for the attempt to end (one that
starts while calls are pending ends waiting again at once), and a later attempt applies it. The checks and
the write happen under that lease, so two resolvers of one call are serialised: the first decision stands,
the same decision again is accepted, a different one is refused.

The resolver that decides the last pending call may send the execution on to a worker (`dispatch=True`)
through this process's dispatcher: the fleet core installs its `redispatch` when it is imported
(`set_dispatcher`), since the journal core knows no job queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .._errors import DispatchFailed, DurableError, EncryptionMismatch, ExecutionBusy, LeaseLost, ResolutionRefused
from .._runtime import beyond_calendar, end_holding, new_holder, start_holding, utc_moment, utc_text
from ..journals import (
    DEFERRED,
    SEALED,
    CallDecision,
    DeferredCall,
    ExecutionInfo,
    Journal,
    deferred_calls,
    deferred_slots,
    metadata_of,
    state_of,
)
from ._document import check_tree
from ._records import ENTRY_VERSION

__all__ = (
    'Dispatcher',
    'Resolution',
    'call_json',
    'check_open',
    'deadline_message',
    'deny_listed',
    'deny_overdue',
    'describe',
    'dispatcher_for',
    'pending_calls',
    'resolve_calls',
    'secret_digest',
    'set_dispatcher',
    'under_own_lease',
)

log = logging.getLogger('pydantic_ai_durable')

_T = TypeVar('_T')

_RESOLVE_TTL = 5.0
"""Seconds a resolver holds the execution: long enough to read and write one record, short if it dies."""
_POLL_FIRST = 0.05
_POLL_MAX = 0.5

_ALLOWED = {'approval': ('approved', 'denied'), 'external': ('result', 'denied'), 'event': ('result', 'denied')}
"""What each kind of call may be decided as: an outside result can be refused (the tool failed), not approved;
an external event gets its payload, or fails (EV-3)."""

Dispatcher = Callable[[Journal, str], Awaitable[None]]
"""How this process sends execution `key` of `journal` on to a worker: the fleet core's `redispatch`."""

_DISPATCHER: list[Dispatcher] = []


def set_dispatcher(dispatcher: Dispatcher | None) -> Dispatcher | None:
    """Make `dispatcher` what `resolve(..., dispatch=True)` sends a ready execution with; return the one before.

    `pydantic_ai_durable.fleet` sets its `redispatch` when it is imported, so an app whose tasks are durable
    tasks of Celery, Procrastinate or another adapter over the fleet core needs nothing more; `None` unsets it.
    """
    before = _DISPATCHER[0] if _DISPATCHER else None
    _DISPATCHER[:] = [] if dispatcher is None else [dispatcher]
    return before


@dataclass(frozen=True)
class Resolution:
    """What one call of `resolve` did, and what the execution still waits on.

    `completed` says this resolution decided the execution's last pending call: a dispatcher that starts the
    execution again acts on it, and only one resolver of an execution ever sees it for one wait.
    """

    key: str
    decided: tuple[str, ...]
    """The call ids this resolution decided."""
    unchanged: tuple[str, ...]
    """The call ids it named that were already decided the same way (accepted, nothing written for them)."""
    pending: tuple[str, ...]
    """The call ids the execution still waits on."""
    metadata: dict[str, Any] | None = None
    """The execution's metadata (`execution(key, metadata=...)`): what a worker needs to start it again."""
    dispatched: bool = False
    """Whether this resolution sent the execution on to a worker (`dispatch=True`, and `completed`)."""

    @property
    def ready(self) -> bool:
        """Whether nothing is pending any more: the next attempt of the execution goes on."""
        return not self.pending

    @property
    def completed(self) -> bool:
        """Whether this resolution decided the last pending call."""
        return self.ready and bool(self.decided)

    def as_json(self) -> dict[str, Any]:
        """What `approve --json` prints and the console's API answers."""
        return {
            'key': self.key,
            'decided': list(self.decided),
            'unchanged': list(self.unchanged),
            'pending': list(self.pending),
            'completed': self.completed,
            'dispatched': self.dispatched,
        }


async def pending_calls(journal: Journal, key: str, *, decided: bool = False) -> list[DeferredCall]:
    """The calls execution `key` waits on, oldest first; with `decided=True`, also those already decided.

    Read from the execution record alone, with no lease taken: a console or a web handler lists them as
    often as it likes. An unknown key has none.
    """
    record = await journal.read_execution(key)
    check_open(key, record)
    calls = deferred_calls(record)
    if decided:
        return calls
    if (record or {}).get('status') != 'waiting':
        return []
    return [call for call in calls if call.pending]


def check_open(key: str, record: dict[str, Any] | None) -> None:
    """Refuse a sealed record read without keys: what it holds can neither be read nor decided."""
    if isinstance(record, dict) and SEALED in record:
        raise EncryptionMismatch(
            f'Execution {key!r}: its record is encrypted and this journal was given no keys, so the calls it waits '
            'on cannot be read or decided. Pass encryption=Encryption({...}) to the journal (the CLI reads '
            '$PYDANTIC_AI_DURABLE_KEYS).',
            key=key,
            where='the execution record',
        )


async def resolve_calls(
    journal: Journal,
    key: str,
    decisions: Mapping[str, CallDecision],
    *,
    wait: float = 10.0,
    dispatch: bool = False,
    secret: str | None = None,
) -> Resolution:
    """Record `decisions` (by tool call id) for the calls execution `key` waits on, all of them or none (WT-2).

    Waits up to `wait` seconds for an attempt that holds the execution to end, then raises `ExecutionBusy`.
    Raises `ResolutionRefused` when the execution is not waiting, a call id is not one it waits on, a call is
    decided differently already, or a decision does not fit the call's kind. Nothing is written then.

    With `dispatch=True`, the resolution that decides the last pending call (`completed`) then sends the
    execution on to a worker through this process's dispatcher; a `DurableError` before anything is
    written when there is none. A send that fails raises `DispatchFailed` after the decisions are recorded:
    they stand, and the fleet's sweep sends the execution once its `resume_after` has passed.

    A wait on an external event is decided only with `secret`, the random part of the token it handed out
    (`resolve_event`), or by its deadline; `secret` decides nothing else (EV-3).
    """
    if not decisions:
        raise ValueError('resolve() needs at least one decision: approvals={call_id: ...} or results={call_id: ...}.')
    for call_id, decision in decisions.items():
        _check_json(key, call_id, decision)
    dispatcher = dispatcher_for(key) if dispatch else None
    resolution = await _resolve(journal, key, decisions, wait, secret)
    if dispatcher is None or not resolution.completed:
        return resolution
    try:
        await dispatcher(journal, key)
    except Exception as exc:
        raise DispatchFailed(key, f'{type(exc).__name__}: {exc}') from exc
    log.info('Execution %r: its last pending call was decided; it was sent on to a worker.', key)
    return replace(resolution, dispatched=True)


_NO_DEPTH_LIMIT = sys.maxsize
"""A decision's value is as deep as the app makes it; only what JSON cannot hold is refused here."""


def _check_json(key: str, call_id: str, decision: CallDecision) -> None:
    """Refuse a result or arguments holding NaN or an infinity, before anything is written (WT-2).

    JSON has no such numbers: stored, one is printed as `NaN` by `show --json` (no JSON reader takes it), written
    into an export no import takes, or turned into `null` by the reader on the way; so it is refused, saying where.
    """
    for what, value in (('result', decision.value), ('arguments', decision.override_args)):
        check_tree(
            value,
            f'the {what} of call {call_id!r}',
            _NO_DEPTH_LIMIT,
            error=lambda reason: ResolutionRefused(key, call_id, reason),
        )


def dispatcher_for(key: str) -> Dispatcher:
    """This process's dispatcher, for `dispatch=True`; a `DurableError` saying what to load when there is none."""
    if not _DISPATCHER:
        raise DurableError(
            f'Execution {key!r}: dispatch=True sends the execution on through the fleet of this process, and no '
            'fleet is loaded here. Import the module that defines its durable task (its Celery or Procrastinate '
            "app) first, or leave dispatch off: the workers' sweep sends it once resume_after has passed."
        )
    return _DISPATCHER[0]


async def _resolve(
    journal: Journal, key: str, decisions: Mapping[str, CallDecision], wait: float, secret: str | None
) -> Resolution:
    return await under_own_lease(journal, key, wait, lambda epoch: _decide(journal, key, decisions, epoch, secret))


async def under_own_lease(journal: Journal, key: str, wait: float, body: Callable[[int], Awaitable[_T]]) -> _T:
    """`body(epoch)` under a short lease of its own on execution `key`, taken within `wait` seconds.

    An attempt that holds the execution longer makes it raise `ExecutionBusy`: a write from outside an attempt
    (a decision, a cancellation) never lands beside the attempt's own.
    """
    holder = new_holder()
    start_holding(holder)
    try:
        deadline = time.monotonic() + max(0.0, wait)
        delay = _POLL_FIRST
        while True:
            lease = await journal.acquire_lease(key, holder, _RESOLVE_TTL)
            if lease.holder == holder:
                break
            if time.monotonic() >= deadline:
                raise ExecutionBusy(key, holder=lease.holder, expires_at=lease.expires_at)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, _POLL_MAX)
        try:
            return await body(lease.epoch)
        finally:
            await journal.release_lease(key, holder, lease.epoch)
    finally:
        end_holding(holder)


async def _decide(
    journal: Journal, key: str, decisions: Mapping[str, CallDecision], epoch: int, secret: str | None = None
) -> Resolution:
    record = await journal.read_execution(key)
    check_open(key, record)
    if not isinstance(record, dict) or record.get('v') != ENTRY_VERSION:
        raise ResolutionRefused(
            key, None, f'there is no execution {key!r} in {journal!r}' if record is None else 'its record is unreadable'
        )
    status = state_of(record, leased=False)
    if status != 'waiting':
        raise ResolutionRefused(key, None, _not_waiting(status))
    slots = deferred_slots(record)
    changes: dict[str, tuple[str, CallDecision]] = {}  # by slot: the call id and its decision
    unchanged: list[str] = []
    now = time.time()
    for call_id, decision in decisions.items():
        slot, call = _target(key, call_id, slots)
        _check_token(key, call_id, call, record[DEFERRED][slot], decision, secret)
        if decision.kind not in _ALLOWED[call.kind]:
            wanted = 'approve or deny it' if call.kind == 'approval' else 'give its result, or deny it'
            raise ResolutionRefused(
                key, call_id, f'call {call_id!r} ({call.tool_name}) waits for an {call.kind} decision: {wanted}'
            )
        if call.earlier is not None:
            raise ResolutionRefused(
                key,
                call_id,
                f'call {call_id!r} ({call.tool_name}) was decided, then deferred again for an {call.kind} decision, '
                'which pydantic-ai asks for only in a new run: answer it by running the agent with the message '
                'history and DeferredToolResults for it',
            )
        if call.answered_in is not None:
            raise ResolutionRefused(key, call_id, f'call {call_id!r} was answered by run {call.answered_in} already')
        if call.decision is not None:
            if call.decision.same_as(decision):
                unchanged.append(call.call_id)
                continue
            raise ResolutionRefused(key, call_id, f'call {call_id!r} was decided already: {describe(call.decision)}')
        if call.deadline is not None and decision.via != 'deadline' and max(now, decision.at) >= call.deadline:
            raise ResolutionRefused(
                key,
                call_id,
                f'call {call_id!r} ({call.tool_name}) passed its deadline at {utc_text(call.deadline)}: only its '
                'deadline decides it now, and the next deadline pass (deny_overdue, which the sweep runs) denies it',
            )
        changes[slot] = (call.call_id, decision)
    if changes:
        stored = dict(record[DEFERRED])
        for slot, (_, decision) in changes.items():
            stored[slot] = {**stored[slot], 'decision': decision.as_record()}
        written = {**record, DEFERRED: stored, 'updated': time.time()}
        try:
            ok = await journal.write_execution(key, written, epoch=epoch)
        except LeaseLost as lost:
            raise ExecutionBusy(key, holder=lost.holder or 'another attempt', expires_at=time.time()) from lost
        if not ok:
            raise ResolutionRefused(key, None, 'the decision cannot be stored as JSON')
        record = written
        for call_id, decision in changes.values():
            log.info('Execution %r: call %s was %s.', key, call_id, describe(decision))
    pending = tuple(call.call_id for call in deferred_calls(record) if call.pending)
    decided = tuple(call_id for call_id, _ in changes.values())
    return Resolution(key, decided, tuple(unchanged), pending, metadata_of(record))


def _check_token(
    key: str, given: str, call: DeferredCall, stored: dict[str, Any], decision: CallDecision, secret: str | None
) -> None:
    """A wait on an external event is resolved by its token only, and a token resolves nothing else (EV-3)."""
    if secret is None and (call.kind != 'event' or decision.via == 'deadline'):
        return
    if call.kind != 'event':
        raise ResolutionRefused(key, given, 'a resume token resolves only a wait on an external event')
    kept = stored.get('token')
    if secret is None:
        raise ResolutionRefused(
            key,
            given,
            f'{given!r} waits on an external event: resolve it with the token its ask was given '
            "(resolve_external_event, or the CLI's resolve-event)",
        )
    if not isinstance(kept, str) or not hmac.compare_digest(kept, secret_digest(secret)):
        raise ResolutionRefused(key, given, 'the token is not the one this wait handed out: nothing was resolved')


def secret_digest(secret: str) -> str:
    """What the record keeps of a resume token's secret (EV-3): enough to check a token, not to make one."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _target(key: str, given: str, slots: list[tuple[str, DeferredCall]]) -> tuple[str, DeferredCall]:
    """The call a decision given for `given` is for (WT-7): the one pending with that call id, else the one that
    `ref` names (`ID@RUN:WAIT`), else the latest with that id (decided: the same decision again is accepted)."""
    pending = [(slot, call) for slot, call in slots if call.call_id == given and call.pending]
    if len(pending) == 1:
        return pending[0]
    named = [(slot, call) for slot, call in slots if call.ref == given and call.wait is not None]
    if named:
        return named[0]
    if pending:
        refs = ', '.join(f'{call.ref} ({call.tool_name}, run {call.run})' for _, call in pending)
        raise ResolutionRefused(
            key, given, f'{len(pending)} calls it waits on share the id {given!r}: decide each by its ref, {refs}'
        )
    same = [(slot, call) for slot, call in slots if call.call_id == given]
    if same:
        return same[-1]
    waits = ', '.join(f'{call.call_id} ({call.tool_name})' for _, call in slots if call.pending) or 'nothing'
    raise ResolutionRefused(key, given, f'it has no deferred call {given!r}; it waits on {waits}')


def _not_waiting(status: str) -> str:
    if status == 'finished':
        return 'it is finished: nothing waits for a decision'
    if status == 'failed':
        return 'its last attempt failed; retry it, and resolve the calls it waits on once it ends waiting'
    return (
        f'it is {status}, not waiting: its last attempt stopped before it ended waiting; run it again (it replays '
        'up to the same wait without calling the model) and resolve its calls then'
    )


def describe(decision: CallDecision) -> str:
    """A decision in a sentence: `approved by alice at 2026-...`, for messages and the CLI."""
    what = {'approved': 'approved', 'denied': 'denied', 'result': 'completed with a result'}[decision.kind]
    if decision.via == 'deadline':
        what = 'denied by its deadline'
    moment = utc_moment(decision.at)
    when = moment.isoformat(timespec='seconds') if moment is not None else beyond_calendar(decision.at)
    return f'{what}{f" by {decision.by}" if decision.by else ""} at {when}'


def call_json(call: DeferredCall) -> dict[str, Any]:
    """A deferred call as JSON: one shape for `show --json`, `list --json` and the console's API."""
    decision = call.decision
    return {
        'call_id': call.call_id,
        'ref': call.ref,
        'wait': call.wait,
        'tool': call.tool_name,
        'kind': call.kind,
        'run': call.run,
        'arguments': call.arguments,
        'metadata': call.metadata,
        'tool_metadata': call.tool_metadata,
        'request': call.request,
        'since': utc_text(call.since),
        'deadline': utc_text(call.deadline),
        'pending': call.pending,
        'answered_in': call.answered_in,
        'decision': None
        if decision is None
        else {**decision.as_record(), 'at': utc_text(decision.at), 'at_epoch': decision.at},
    }


async def deny_overdue(journal: Journal, *, now: float | None = None) -> list[Resolution]:
    """Deny every pending call whose deadline passed, saying it timed out (WT-5); return what was resolved.

    Called by the sweep in every worker; an execution an attempt holds, or whose call was decided meanwhile,
    is left for the next pass. `now` (epoch seconds) is for tests that move the clock.
    """
    return await deny_listed(journal, await journal.list_executions(state='waiting'), now=now)


async def deny_listed(
    journal: Journal, listed: Iterable[ExecutionInfo], *, now: float | None = None
) -> list[Resolution]:
    """`deny_overdue` over executions already listed: the sweep lists once for its deadlines and its sends."""
    moment = time.time() if now is None else now
    resolved: list[Resolution] = []
    for info in listed:
        overdue = {
            call.ref: CallDecision(
                kind='denied',
                at=moment,
                via='deadline',
                message=deadline_message(call.deadline - call.since)
                if call.kind == 'event'
                else f'Nobody decided this call within {_span(call.deadline - call.since)}: '
                'it timed out and was denied.',
            )
            for call in info.pending
            if call.deadline is not None and call.deadline <= moment
        }
        if not overdue:
            continue
        try:
            resolved.append(await resolve_calls(journal, info.key, overdue, wait=0.0))
        except (ExecutionBusy, ResolutionRefused) as exc:
            log.info('Execution %r: its overdue calls were left for a later sweep (%s).', info.key, exc)
    return resolved


def deadline_message(seconds: float) -> str:
    """What a wait on an external event past its deadline raises in the run (EV-5), as pydantic-ai words it."""
    return f'No resolution arrived within {_span(seconds)}.'


def _span(seconds: float) -> str:
    for unit, size in (('day', 86400), ('hour', 3600), ('minute', 60)):
        if seconds >= size:
            count = seconds / size
            return f'{count:g} {unit}{"s" if count != 1 else ""}'
    return f'{seconds:g} seconds'
