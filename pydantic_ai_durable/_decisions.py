"""`resolve()`: decide the calls an execution waits on, in pydantic-ai's own terms, from anywhere.

A web handler or a script has the journal and the execution key, nothing else: no agent, no message
history. It passes the decisions as pydantic-ai's `DeferredToolResults` would hold them (`True`, `False`,
`ToolApproved`, `ToolDenied`, an outside result, or the `AskUserResponse` a person gave); this module turns
them into the plain records the journal core writes (`_core/_resolve.py`), so the core stays free of
pydantic-ai and the CLI decides calls the same way without importing it. An answer to an `AskUser` question
is checked in `_answers`, which the CLI and the console call too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, TypeAdapter
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import ToolApproved, ToolDenied

from ._answers import answered, ask_user_request, is_ask_user_response
from ._core import Resolution, resolve_calls, resolve_event
from .journals import CallDecision, Journal

__all__ = ('ask_user_request', 'fail_external_event', 'resolve', 'resolve_external_event')

_ANY: TypeAdapter[Any] = TypeAdapter(Any, config=ConfigDict(ser_json_inf_nan='constants'))
"""Values as JSON data, but NaN and infinities kept as they are (pydantic writes `null` for them by default), so
the journal core refuses them, saying where, instead of recording a `null` nobody gave (WT-2)."""


async def resolve(
    journal: Journal,
    key: str,
    *,
    approvals: Mapping[str, bool | ToolApproved | ToolDenied] | None = None,
    results: Mapping[str, Any] | None = None,
    by: str | None = None,
    wait: float = 10.0,
    dispatch: bool = False,
) -> Resolution:
    """Decide calls execution `key` waits on, by tool call id; the next attempt goes on with them.

    `approvals` answers calls that need approval: `True` or `ToolApproved(override_args=...)` lets the tool run
    (once, in the next attempt), `False` or `ToolDenied(message)` tells the model it was denied. `results`
    answers calls whose result comes from outside: the value is the tool's return (JSON data, or a pydantic
    model or dataclass, stored as JSON), `ToolFailed(message)` refuses it, and for a question of
    pydantic-ai-harness's `AskUser` the person's `AskUserResponse` (checked against the question) or
    `ask_user_result(request, response)`. `by` names who decided, for the audit trail. A call id names the call
    pending under it; where two pending calls share an id, name each by its `DeferredCall.ref` (WT-7).

    All decisions are recorded at once, fenced under the execution's lease, or none is. Deciding a call the
    same way again is accepted; a call past its deadline (WT-9), and anything else that cannot be recorded,
    raises `ResolutionRefused`, and `ExecutionBusy` when an attempt still holds the execution after `wait`
    seconds. The returned `Resolution`
    says what is still pending, and `completed` when this call decided the last one.

    `dispatch=True` then sends the execution on to a worker, from the delivery its metadata recorded, through
    the fleet of this process that registered its task (import the module that defines the durable task
    first); it sends nothing while calls are still pending. The decisions are recorded before the
    send: should the send fail, `DispatchFailed` says so, the decisions stand, and the workers' sweep sends
    the execution once its `resume_after` has passed.
    """
    now = time.time()
    decisions: dict[str, CallDecision] = {}
    for call_id, approval in (approvals or {}).items():
        decisions[call_id] = _approval(call_id, approval, now, by)
    for call_id, value in (results or {}).items():
        if call_id in decisions:
            raise ValueError(f'Call {call_id!r} is given both an approval and a result; give it one decision.')
        if is_ask_user_response(value):  # kept as it is: only a question of AskUser takes it (`answered`)
            decisions[call_id] = CallDecision('result', now, by, value=value)
            continue
        decisions[call_id] = _result(call_id, value, now, by)
    decisions = await answered(journal, key, decisions)
    return await resolve_calls(journal, key, decisions, wait=wait, dispatch=dispatch)


def _approval(call_id: str, approval: object, now: float, by: str | None) -> CallDecision:
    if approval is True:
        return CallDecision('approved', now, by)
    if approval is False:
        return CallDecision('denied', now, by, message=ToolDenied().message)
    if isinstance(approval, ToolApproved):
        override = _ANY.dump_python(approval.override_args, mode='json') if approval.override_args is not None else None
        return CallDecision('approved', now, by, override_args=override)
    if isinstance(approval, ToolDenied):
        return CallDecision('denied', now, by, message=approval.message)
    raise TypeError(
        f'The approval of call {call_id!r} must be True, False, ToolApproved(...) or ToolDenied(...), '
        f'not {type(approval).__name__}.'
    )


def _result(call_id: str, value: object, now: float, by: str | None) -> CallDecision:
    if isinstance(value, ToolFailed):
        return CallDecision('denied', now, by, message=value.message)
    try:
        stored = _ANY.dump_python(value, mode='json')
    except Exception as exc:
        raise TypeError(
            f'The result of call {call_id!r} must be JSON data, a pydantic model or a dataclass, to be recorded: '
            f'{type(value).__name__} is not ({exc}).'
        ) from None
    return CallDecision('result', now, by, value=stored)


async def resolve_external_event(
    journal: Journal, token: str, payload: object, *, by: str | None = None, wait: float = 10.0, dispatch: bool = False
) -> Resolution:
    """End a wait on an external event of a durable run with `payload`: its next attempt goes on with it (EV-3).

    `token` is the resume token the wait's `ask` was given (the handler of `HandleDeferredToolCalls`, the `ask` of
    `wait_for_external_event`); it names the execution and the wait, and only the token that wait handed out
    resolves it. `payload` is stored as JSON (for `HandleDeferredToolCalls`, `DeferredToolResults` or its JSON
    form). The first resolution wins: the same payload again is accepted, another one, a wait that already
    ended, one past its deadline (EV-5) and a token not handed out are refused with `ResolutionRefused`, and
    nothing is written. `by`, `wait` and `dispatch` are `resolve`'s.
    """
    try:
        stored = _ANY.dump_python(payload, mode='json')
    except Exception as exc:
        raise TypeError(f'The payload must be JSON data, a pydantic model or a dataclass: {exc}') from None
    decision = CallDecision('result', time.time(), by, value=stored)
    return await resolve_event(journal, token, decision, wait=wait, dispatch=dispatch)


async def fail_external_event(
    journal: Journal, token: str, reason: str, *, by: str | None = None, wait: float = 10.0, dispatch: bool = False
) -> Resolution:
    """End a wait on an external event without a payload: in its next attempt the wait raises `ExternalEventError`
    with `reason`, so `HandleDeferredToolCalls` denies the calls it waited on, saying why (EV-4).

    Refused, and resolved, as `resolve_external_event` is.
    """
    decision = CallDecision('denied', time.time(), by, message=reason)
    return await resolve_event(journal, token, decision, wait=wait, dispatch=dispatch)
