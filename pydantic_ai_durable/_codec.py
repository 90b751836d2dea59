"""The codec pydantic-ai encodes every step's result with: its JSON codec plus the journal's own limits.

pydantic-ai calls the engine's codec (`DurabilityEngineSpec.codec`, public API) inside each durable unit,
so this is where a result the journal cannot hold is refused, once for every kind of step, and where the
live model step picks up the response it just encoded instead of decoding its payload a second time.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from pydantic_ai.durable_exec import JSON_CODEC, CallToolResult

from ._errors import ResultNotJournalable
from ._journal import current_step
from ._payloads import why_not_journalable
from .journals import _json

__all__ = ('JOURNAL_CODEC', 'LIVE_RESULTS', 'JournalCodec', 'not_journalable')

LIVE_RESULTS: ContextVar[list[object] | None] = ContextVar('pydantic_ai_durable.live_results', default=None)
"""While a live model step runs: the results its body encodes, so usage is read off the live response
instead of decoding the payload a second time (pydantic-ai decodes it once more after `execute`)."""


_UNSEEN = object()


def not_journalable(error: BaseException, value: object = _UNSEEN) -> ResultNotJournalable:
    """The error for a result the journal cannot hold; the same value fails on every attempt (T-4).

    It names the step whose body produced the result, so the journal fences that step (JF-5); with the
    value at hand, its shape tells a result nested too deeply from a circular one (JF-6).
    """
    reason = why_not_journalable(error) if value is _UNSEEN else why_not_journalable(error, value)
    return ResultNotJournalable(
        f'A result is not JSON-serializable, so it cannot be journaled: {reason}. This error '
        'is not retryable: return JSON-compatible data (dicts, lists, strings, numbers, pydantic models, '
        'dataclasses) instead.',
        step=current_step(),
    )


class JournalCodec:
    """`JSON_CODEC`, refusing (not retrying) what the journal cannot hold (T-4).

    pydantic-ai maps only the codec's `PydanticSerializationError` and `TypeError` to the engine's error;
    a result nested too deeply raises `RecursionError`, and an integer too long for JSON text passes the
    codec but not the journal, so a tool result is checked for both here.
    """

    def dump(self, tp: Any, value: Any) -> Any:
        try:
            encoded = JSON_CODEC.dump(tp, value)
        except (ValueError, RecursionError) as exc:
            raise not_journalable(exc, value) from exc
        if tp is CallToolResult and not _json.encodable(encoded):
            raise not_journalable(ValueError('it cannot be written as JSON text (an integer over 4300 digits?)'))
        live = LIVE_RESULTS.get()
        if live is not None:
            live.append(value)
        return encoded

    def load(self, tp: Any, payload: Any) -> Any:
        return JSON_CODEC.load(tp, payload)


JOURNAL_CODEC = JournalCodec()
