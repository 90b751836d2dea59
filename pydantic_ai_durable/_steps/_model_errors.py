"""A failed model request as a recorded outcome: the `ModelAPIError` it raised, written with pydantic-ai's own codec.

`ModelFallback`, `RetryOnModelErrors` and `on_model_request_error` hooks decide what a run does next from the
error a request raised, inside the same run step. So the error is the request's outcome, like a response: a
replay must raise it again, with its original type, instead of sending the request live (A-16). pydantic-ai
encodes such an error for durable engines (`durable_exec._model_error_codec`: 2.78 has it, 2.62 not); on a
release without it nothing is recorded, as on every release before, since the rule is to keep pydantic-ai's
contract where a release has the feature and leave the rest as it is on the oldest supported release.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any, cast

from pydantic_ai.exceptions import ModelAPIError, UnexpectedModelBehavior

from .._core import MODEL_ERROR
from ..journals import encodable

__all__ = ('MODEL_ERRORS_RECORDED', 'error_payload', 'recorded_error')

log = logging.getLogger('pydantic_ai_durable')

_STREAMED_MARK = '_pydantic_ai_streamed_before_failing'
"""The attribute pydantic-ai marks an error with when its stream produced output before failing."""

_Encode = Callable[[ModelAPIError], 'dict[str, Any] | None']
_Decode = Callable[['dict[str, Any]'], 'ModelAPIError | None']


def _codec() -> tuple[_Encode, _Decode] | None:
    """pydantic-ai's `encode_model_error` and `decode_model_error`, on a release that has them."""
    try:
        module = importlib.import_module('pydantic_ai.durable_exec._model_error_codec')
    except ImportError:
        return None
    return cast(_Encode, module.encode_model_error), cast(_Decode, module.decode_model_error)


_CODEC = _codec()

MODEL_ERRORS_RECORDED = _CODEC is not None
"""Whether this pydantic-ai can encode a model error, so a failed request is recorded (A-16)."""


def error_payload(error: ModelAPIError) -> dict[str, Any] | None:
    """The payload that records `error` as the outcome of its request, or `None` to leave the request unrecorded.

    `None` for an `UnexpectedModelBehavior` (the model's answer was at fault: F-4 asks the model again), for a
    stream that produced output before failing (its events went out already, and a replay cannot hand them
    back), and for an error pydantic-ai's codec cannot rebuild exactly, such as an application's subclass: a
    replay would raise something else in its place, so the request runs live again instead, with a WARNING.
    """
    if _CODEC is None or isinstance(error, UnexpectedModelBehavior) or hasattr(error, _STREAMED_MARK):
        return None
    encode, decode = _CODEC
    try:
        encoded = encode(error)
        rebuilt = decode(encoded) if encoded is not None else None
    except Exception:  # a field the codec cannot handle: the error cannot be recorded
        encoded = rebuilt = None
    payload = {MODEL_ERROR: encoded}
    if rebuilt is None or type(rebuilt) is not type(error) or not encodable(payload):
        log.warning(
            'A model request failed with %s, which pydantic-ai cannot rebuild from a record, so the failure is not '
            'journaled and the request is sent again on the next attempt instead of being replayed (A-16).',
            type(error).__qualname__,
        )
        return None
    return payload


def recorded_error(payload: object) -> ModelAPIError | None:
    """The error a model step's payload records, rebuilt; `None` when the payload records no error.

    Raises `ValueError` when it records one this pydantic-ai cannot rebuild: the replay is then rejected and
    the request runs live (X-1).
    """
    if type(payload) is not dict or MODEL_ERROR not in payload:
        return None
    encoded = payload[MODEL_ERROR]
    error = _CODEC[1](encoded) if _CODEC is not None and isinstance(encoded, dict) else None
    if error is None:
        raise ValueError('a recorded model error this pydantic-ai cannot rebuild')
    return error
