"""The codec pydantic-ai encodes every step's result with: its JSON codec plus the journal's own limits.

pydantic-ai calls the engine's codec (`DurabilityEngineSpec.codec`, public API) inside each durable unit,
so this is where a result the journal cannot hold is refused, once for every kind of step, where the
live model step picks up the response it just encoded instead of decoding its payload a second time, and
where a replay hands on the value its load check already decoded (X-4).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pydantic_ai.durable_exec import JSON_CODEC, CallToolResult
from pydantic_ai.messages import ModelResponse
from pydantic_core import PydanticSerializationError

from .._core import current_step
from .._errors import ResultNotJournalable
from ..journals import encodable
from ._payloads import why_not_journalable

__all__ = (
    'HOLD_RESPONSES',
    'PAYLOAD_CODEC',
    'Loaded',
    'PayloadCodec',
    'Unencoded',
    'hands_on_loaded',
    'not_journalable',
)

HOLD_RESPONSES: ContextVar[bool] = ContextVar('pydantic_ai_durable.hold_responses', default=False)
"""True while a live model step's body runs: its response comes back unencoded, so the step counts the
response's usage before encoding it and writes it with the entry (UW-1), and reads usage off the live
response instead of decoding the payload a second time (pydantic-ai decodes it once more after `execute`)."""


_UNSEEN = object()


def not_journalable(error: BaseException, value: object = _UNSEEN) -> ResultNotJournalable:
    """The error for a result the journal cannot hold; the same value fails on every attempt.

    It names the step whose body produced the result, so the journal fences that step; with the
    value at hand, its shape tells a result nested too deeply from a circular one (JF-6).
    """
    reason = why_not_journalable(error) if value is _UNSEEN else why_not_journalable(error, value)
    return ResultNotJournalable(
        f'A result is not JSON-serializable, so it cannot be journaled: {reason}. This error '
        'is not retryable: return JSON-compatible data (dicts, lists, strings, numbers, pydantic models, '
        'dataclasses) instead.',
        step=current_step(),
    )


class PayloadCodec:
    """`JSON_CODEC`, refusing (not retrying) what the journal cannot hold (T-4).

    pydantic-ai maps only the codec's `PydanticSerializationError` and `TypeError` to the engine's error;
    a result nested too deeply raises `RecursionError`, and an integer too long for JSON text passes the
    codec but not the journal, so a tool result is checked for both here.
    """

    def dump(self, tp: Any, value: Any) -> Any:
        if HOLD_RESPONSES.get() and isinstance(value, ModelResponse):
            return Unencoded(self, tp, value)
        return self.encode(tp, value)

    def encode(self, tp: Any, value: Any) -> Any:
        try:
            encoded = JSON_CODEC.dump(tp, value)
        except (ValueError, RecursionError) as exc:
            raise not_journalable(exc, value) from exc
        if tp is CallToolResult and not encodable(encoded):
            raise not_journalable(ValueError('it cannot be written as JSON text (an integer over 4300 digits?)'))
        return encoded

    def load(self, tp: Any, payload: Any) -> Any:
        if type(payload) is Loaded:
            return payload.value  # decoded once already, by the replay's load check
        return JSON_CODEC.load(tp, payload)


@dataclass(frozen=True, slots=True)
class Loaded:
    """A replayed payload as the load check before the replay decoded it, handed on as it is.

    pydantic-ai loads whatever `execute` returns; a `Loaded` passes through `PayloadCodec.load` untouched,
    so a replayed step is decoded once, not twice, and the value pydantic-ai gets is the one checked.
    """

    value: Any


def hands_on_loaded(load: Callable[[object], object]) -> bool:
    """Whether a bound operation's result `load` ends in `PayloadCodec.load`, so a `Loaded` may be returned.

    Operations whose result codec is pydantic-ai's own (capability operations) would try to validate it;
    one probe per binding tells them apart without knowing how pydantic-ai builds each codec.
    """
    probe = object()
    try:
        return load(Loaded(probe)) is probe
    except Exception:
        return False


@dataclass(frozen=True)
class Unencoded:
    """A live model response the codec handed back as it is, for the step to encode once its usage is written."""

    codec: PayloadCodec
    tp: Any
    response: ModelResponse

    def encode(self) -> Any:
        """The payload pydantic-ai's codec would have returned, failing the way it would."""
        try:
            return self.codec.encode(self.tp, self.response)
        except (PydanticSerializationError, TypeError) as exc:
            raise not_journalable(exc, self.response) from exc


PAYLOAD_CODEC = PayloadCodec()
