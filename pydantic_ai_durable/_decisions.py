"""`resolve()`: decide the calls an execution waits on, in pydantic-ai's own terms, from anywhere.

A web handler or a script has the journal and the execution key, nothing else: no agent, no message
history. It passes the decisions as pydantic-ai's `DeferredToolResults` would hold them (`True`, `False`,
`ToolApproved`, `ToolDenied`, an outside result, or the `AskUserResponse` a person gave); this module turns
them into the plain records the journal core writes (`_core/_resolve.py`), so the core stays free of
pydantic-ai and the CLI decides calls the same way without importing it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import ToolApproved, ToolDenied

from ._core import Resolution, pending_calls, resolve_calls, resolve_event
from .journals import CallDecision, DeferredCall, Journal

if TYPE_CHECKING:
    from pydantic_ai_harness.ask_user import AskUserRequest

__all__ = ('ask_user_request', 'fail_external_event', 'resolve', 'resolve_external_event')

_ANY: TypeAdapter[Any] = TypeAdapter(Any)


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
    asked_users: list[str] = []
    for call_id, value in (results or {}).items():
        if call_id in decisions:
            raise ValueError(f'Call {call_id!r} is given both an approval and a result; give it one decision.')
        if _is_ask_user_response(value):
            asked_users.append(call_id)
            continue
        decisions[call_id] = _result(call_id, value, now, by)
    if asked_users:
        calls: dict[str, DeferredCall] = {}
        for call in await pending_calls(journal, key, decided=True):  # oldest first: a pending call wins (WT-7)
            for name in (call.call_id, call.ref):
                if call.pending or name not in calls or not calls[name].pending:
                    calls[name] = call
        for call_id in asked_users:
            decisions[call_id] = _answer(key, calls.get(call_id), call_id, (results or {})[call_id], now, by)
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


def _is_ask_user_response(value: object) -> bool:
    try:
        from pydantic_ai_harness.ask_user import AskUserResponse
    except ImportError:
        return False
    return isinstance(value, AskUserResponse)


def _answer(
    key: str, call: DeferredCall | None, call_id: str, response: Any, now: float, by: str | None
) -> CallDecision:
    """A person's `AskUserResponse`, checked against the question it answers and rendered as the tool's result."""
    from pydantic_ai_harness.ask_user import ask_user_result

    if call is None:
        raise ValueError(f'Execution {key!r} has no deferred call {call_id!r} for this answer.')
    request = ask_user_request(call)
    return CallDecision('result', now, by, value=_ANY.dump_python(ask_user_result(request, response), mode='json'))


def ask_user_request(call: DeferredCall) -> AskUserRequest:
    """The validated `AskUserRequest` behind a waiting `ask_user_question` call: the questions to put to the person.

    Raises `ValueError` for a call of another tool.
    """
    from pydantic_ai_harness.ask_user import AskUserRequest

    if call.request is None:
        raise ValueError(f'Call {call.call_id!r} ({call.tool_name}) is not a question of AskUser.')
    return TypeAdapter(AskUserRequest).validate_python(call.request)


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
