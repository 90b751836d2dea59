"""The recorded form of a tool call made through a toolset pydantic-ai does not journal itself.

Custom `AbstractToolset`s and `ExternalToolset`s have no wire format of their own, so their outcomes
are stored as small JSON dicts tagged with a `kind`. Control-flow exceptions are outcomes the model
reacts to, so they are stored as values and raised again on replay; any other exception is a crash
and is never stored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.messages import ToolReturn
from pydantic_core import PydanticSerializationError

from .._core import current_step
from .._errors import JournalError, ResultNotJournalable

__all__ = (
    'CONTROL_FLOW_EXCEPTIONS',
    'call_and_encode',
    'decode_payload',
    'encode_exception',
    'encode_result',
    'is_replayable_payload',
    'load_outcome',
    'outcome',
    'why_not_journalable',
)

CONTROL_FLOW_EXCEPTIONS: tuple[type[Exception], ...] = (ModelRetry, ToolFailed, ApprovalRequired, CallDeferred)
"""Exceptions a tool raises to steer the agent; they are recorded as outcomes rather than failures."""

_ANY_ADAPTER: TypeAdapter[Any] = TypeAdapter(Any)
_TOOL_RETURN_ADAPTER: TypeAdapter[ToolReturn[Any]] = TypeAdapter(ToolReturn)
_ENCODE_ERRORS = (PydanticSerializationError, TypeError, ValueError)
_MESSAGE_KINDS = frozenset({'model_retry', 'tool_failed'})


async def call_and_encode(
    call: Callable[[], Awaitable[object]], *, tool_name: str
) -> tuple[object, dict[str, Any] | None]:
    """Run a tool and return its live outcome together with the payload to record.

    The outcome is the tool's return value, or the control-flow exception it raised, which the caller
    must raise again once the payload is recorded (check `isinstance(outcome, CONTROL_FLOW_EXCEPTIONS)`
    or the payload's `kind`). Any other exception propagates untouched, so nothing is recorded and the
    call runs again on the next attempt (T-3).
    """
    try:
        value = await call()
    except CONTROL_FLOW_EXCEPTIONS as exc:
        return exc, encode_exception(exc, tool_name=tool_name)
    return value, encode_result(value, tool_name=tool_name)


def encode_result(value: object, *, tool_name: str) -> dict[str, Any]:
    """Encode a tool's return value as a `tool_return` payload of plain JSON data (T-1, T-4).

    Encoding happens before recording so that a value the journal cannot hold fails the step at once
    with a clear, non-retryable error instead of breaking a later replay.
    """
    if isinstance(value, ToolReturn):
        return {'kind': 'tool_return', 'tool_return': _to_json_data(value, tool_name=tool_name, what='returned')}
    return {'kind': 'tool_return', 'result': _to_json_data(value, tool_name=tool_name, what='returned')}


def encode_exception(exc: BaseException, *, tool_name: str | None = None) -> dict[str, Any] | None:
    """Encode a control-flow exception as a payload, or return None for any other exception (T-2, T-3).

    Retry and failure messages are kept as text; approval and deferral metadata is encoded like a
    result, so it must be JSON-compatible too. `tool_name` only improves the error message.
    """
    if isinstance(exc, ModelRetry):
        return {'kind': 'model_retry', 'message': _message_of(exc)}
    if isinstance(exc, ToolFailed):
        return {'kind': 'tool_failed', 'message': _message_of(exc)}
    if isinstance(exc, ApprovalRequired):
        kind = 'approval_required'
    elif isinstance(exc, CallDeferred):
        kind = 'call_deferred'
    else:
        return None
    metadata = _to_json_data(exc.metadata, tool_name=tool_name, what=f'raised {type(exc).__name__} with metadata')
    return {'kind': kind, 'metadata': metadata}


def is_replayable_payload(payload: object) -> bool:
    """Tell whether `load_outcome` can reproduce the outcome stored in `payload` (T-6).

    A payload written by another version of this package is then run live again instead of failing the
    execution for good on every attempt.
    """
    try:
        load_outcome(payload)
    except ValueError:
        return False
    return True


def load_outcome(payload: object) -> object:
    """The recorded outcome: the value returned, or the control-flow exception raised, as an object (T-5).

    Raises `ValueError` for a payload it cannot reproduce, which `replay` takes as "run it live". The
    exception is returned rather than raised so a replay's check and its result are one decoding: the
    executor raises it once the ledger has recorded the replay.
    """
    if not isinstance(payload, dict):
        raise ValueError(f'a tool payload of type {type(payload).__name__}, where a dict with a "kind" is expected')
    kind = payload.get('kind')
    if kind == 'tool_return':
        if 'tool_return' in payload:
            return _TOOL_RETURN_ADAPTER.validate_python(payload['tool_return'])  # ValidationError is a ValueError
        if 'result' in payload:
            return payload['result']
    elif kind in _MESSAGE_KINDS:
        message = payload.get('message')
        if isinstance(message, str):
            return ModelRetry(message) if kind == 'model_retry' else ToolFailed(message)
    elif kind == 'approval_required':
        return ApprovalRequired(metadata=payload.get('metadata'))
    elif kind == 'call_deferred':
        return CallDeferred(metadata=payload.get('metadata'))
    raise ValueError(f'a tool payload of kind {kind!r} with keys {sorted(map(str, payload))}')


def outcome(value: object) -> object:
    """Return a loaded outcome's value, or raise it if it is a control-flow exception."""
    if isinstance(value, CONTROL_FLOW_EXCEPTIONS):
        raise value
    return value


def decode_payload(payload: object) -> object:
    """Return the recorded value, or raise the recorded control-flow exception.

    Replay must look exactly like the live call to the agent loop: a value comes back, a signal is
    raised with the same message or metadata, and the tool itself is not run.
    """
    try:
        loaded = load_outcome(payload)
    except ValueError as exc:
        raise JournalError(
            f'cannot replay {exc}. It was probably written by another version of pydantic_ai_durable; clear the '
            'execution to run it live.'
        ) from exc
    return outcome(loaded)


_MAX_DEPTH = 254
"""How deeply pydantic's serializer (the journal's encoder) lets values nest."""


_UNSEEN = object()


def why_not_journalable(error: BaseException, value: object = _UNSEEN) -> str:
    """The encoder's complaint in words a user can act on.

    pydantic reports a value nested too deeply sometimes as "maximum depth exceeded" and sometimes as
    a "circular reference (id repeated)", which sends users hunting for a cycle that is not there; so
    when the value is at hand its shape decides which it is.
    """
    text = str(error)
    shape = _shape_problem(value) if value is not _UNSEEN else None
    if shape is not None:
        return shape
    if isinstance(error, RecursionError) or 'depth exceeded' in text:
        return _TOO_DEEP
    if 'id repeated' in text:
        return _CIRCULAR
    return text


_TOO_DEEP = f'it is nested more than {_MAX_DEPTH} levels deep, deeper than the journal encoder allows; flatten it'
_CIRCULAR = 'it contains itself (a circular reference)'


def _children(node: object) -> list[object]:
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    if isinstance(node, (list, tuple, set, frozenset)):
        return list(node)
    fields = getattr(node, '__dict__', None)
    return list(fields.values()) if isinstance(fields, dict) else []


def _shape_problem(value: object) -> str | None:
    """`_CIRCULAR` or `_TOO_DEEP` when the value's own structure is what the encoder refuses, else `None`."""
    stack: list[tuple[object, int, bool]] = [(value, 0, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            continue
        children = _children(node)
        if not children:
            continue
        if id(node) in on_path:
            return _CIRCULAR
        if depth >= _MAX_DEPTH:
            return _TOO_DEEP
        on_path.add(id(node))
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children)
    return None


def _message_of(exc: ModelRetry | ToolFailed) -> str:
    """Return the exception's message as text, whatever the tool passed to the constructor."""
    message = getattr(exc, 'message', None)
    return message if isinstance(message, str) else str(exc)


def _to_json_data(value: object, *, tool_name: str | None, what: str) -> Any:
    """Dump `value` to JSON-compatible Python data, turning a failure into a non-retryable `JournalError`.

    The same value fails the same way on every attempt, so the message tells the user to change the tool
    rather than retry; the model could not have read the value either.
    """
    try:
        return _ANY_ADAPTER.dump_python(value, mode='json')
    except (*_ENCODE_ERRORS, RecursionError) as exc:
        who = f'Tool {tool_name!r}' if tool_name else 'A tool'
        module = type(value).__module__
        type_name = type(value).__qualname__ if module == 'builtins' else f'{module}.{type(value).__qualname__}'
        raise ResultNotJournalable(
            f'{who} {what} a value of type {type_name} that is not '
            f'JSON-serializable ({why_not_journalable(exc, value)}), so its outcome cannot be journaled. This is not '
            'retryable: the same value fails on every attempt. Make the tool return JSON-compatible data (str, '
            'numbers, lists, dicts, pydantic models, dataclasses, UTF-8 bytes) or convert the value before '
            'returning it.',
            step=current_step(),
        ) from exc
