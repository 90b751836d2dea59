"""Waits on external events in a durable run: pydantic-ai's `ExternalEventWaiter`, journaled (EV-1..EV-6).

pydantic-ai 2.68 added `wait_for_external_event`: a run hands a resume token to an `ask` function, which answers
in place or hands the token on, and the run waits until the token is resolved (`HandleDeferredToolCalls` with a
handler that takes a token is built on it). A durable engine supplies the wait. Here `ask` runs once, as a
journaled step whose payload is its answer and the digest of the token's secret, so a replay never asks again
and gets the same answer; a token handed on ends the run with `ExecutionWaiting` and leaves the wait in the
execution record, which the attempt then writes `waiting`, holding nothing. The token's resolution is recorded
there (`_core/_events.py`), and the next attempt replays up to the wait and goes on with it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .._active_run import ActiveRun
from .._compat import EXTERNAL_EVENTS
from .._core import EventWait, event_slot, make_token, new_secret, note_event, secret_digest, settle_overdue
from .._errors import DurableError, ExecutionWaiting
from ..journals import wait_ref
from ._pipeline import StepKind, run_step

__all__ = ('DurableEventWaiter', 'waits_on_events')

Ask = Callable[[str], Awaitable[Any]]

log = logging.getLogger('pydantic_ai_durable')


@dataclass
class _AskStep(StepKind):
    """The step that calls `ask` with a fresh token: recorded once, replayed at its position ever after (EV-1)."""

    ask: Ask = field(kw_only=True)
    key: str = field(kw_only=True)
    wait_name: str = field(kw_only=True)
    timeout: float | None = field(kw_only=True)
    position: int = field(default=-1, init=False)

    def fingerprint(self, active: ActiveRun) -> str | None:
        self.position = active.run.next_position  # the claim takes it next, with no await between
        return 'event:' + hashlib.sha256(self.wait_name.encode()).hexdigest()

    def decode(self, payload: object) -> object:
        if not (isinstance(payload, dict) and isinstance(payload.get('token'), str) and 'answer' in payload):
            raise ValueError('not the record of an ask')
        return payload

    async def live(self, active: ActiveRun) -> object:
        secret = new_secret()
        ref = wait_ref(self.wait_name, active.run.key, self.position)
        since = time.time()
        answer = await self.ask(make_token(self.key, ref, secret))
        deadline = since + self.timeout if self.timeout is not None else None
        return {'answer': answer, 'token': secret_digest(secret), 'since': since, 'deadline': deadline}


@dataclass
class DurableEventWaiter:
    """Waits on external events for one run of a `Durable` agent; installed by `Durable.wrap_run` (EV-1).

    Registered as a virtual subclass of pydantic-ai's `ExternalEventWaiter` where the release has one.
    """

    active: ActiveRun
    default_timeout: float | None
    """`Durable(wait_timeout=...)`: the deadline of a wait given no `timeout`, as of a deferred call (WT-5)."""

    async def wait(self, name: str, *, ask: Ask, timeout: timedelta | None) -> Any:
        """Ask once, journaled; return its answer, else the recorded resolution, else end the run waiting."""
        active = self.active
        key = active.run.attempt.key
        if not active.top_level:
            raise DurableError(
                f'Execution {key!r} run {active.run.key}: a run started inside a tool cannot wait on an external '
                'event, since only the run the app started can leave its execution waiting. Wait in that run '
                '(a HandleDeferredToolCalls of its agent), or end the inner run with DeferredToolRequests.'
            )
        seconds = timeout.total_seconds() if timeout is not None else self.default_timeout
        step = _AskStep(f'external_event:{name}', True, None, False, ask=ask, key=key, wait_name=name, timeout=seconds)
        recorded = await run_step(active, step)
        assert isinstance(recorded, dict)
        if recorded.get('answer') is not None:
            return recorded['answer']  # answered in place: every replay gets this answer (EV-1)
        ref = wait_ref(name, active.run.key, step.position)
        record = active.run.state.record
        slot = event_slot(record, ref)
        if slot is not None and slot.get('token') != recorded['token']:
            # An ask that ran anew (the run diverged before it) handed out another token: the resolution of
            # the earlier one is not for it (EV-3), so the wait starts over, as a new deferral replaces one.
            log.warning('Execution %r: the wait %s asked again; its earlier resolution is not for it.', key, ref)
            slot = None
        if slot is None:  # first time here, or an attempt killed before it wrote the record: as the step says
            since, deadline = recorded.get('since'), recorded.get('deadline')
            wait = EventWait(
                name,
                active.run.key,
                step.position,
                str(recorded['token']),
                float(since) if isinstance(since, (int, float)) else time.time(),
                float(deadline) if isinstance(deadline, (int, float)) else None,
            )
            slot = note_event(record, wait)
        decision = settle_overdue(slot)
        if decision is None:
            active.refuse_if_cancelling()  # TM-10: a cancelled execution waits on nothing
            deadline = slot.get('deadline')
            raise ExecutionWaiting(
                key, name=name, wait=ref, deadline=deadline if isinstance(deadline, (int, float)) else None
            )
        if decision.kind == 'result':
            return decision.value
        raise EXTERNAL_EVENTS.ExternalEventError(decision.message or 'The wait was failed.')


if EXTERNAL_EVENTS is not None:
    EXTERNAL_EVENTS.ExternalEventWaiter.register(DurableEventWaiter)


@contextmanager
def waits_on_events(active: ActiveRun, default_timeout: float | None) -> Iterator[None]:
    """Install a `DurableEventWaiter` for the run inside, on the releases that wait on external events (EV-1)."""
    if EXTERNAL_EVENTS is None:
        yield
        return
    with EXTERNAL_EVENTS.external_event_scope(DurableEventWaiter(active, default_timeout)):
        yield
