"""Build the encoders a model step's record needs before the first request goes out (UW-3).

pydantic-ai's JSON codec builds a type's serializer the first time it encodes one, which made the first
live response of a process spend tens of milliseconds between arriving and being recorded. Encoding a
small response once, when the model operation is bound (before the run's first request), moves that
cost out of the window where a crash loses the response.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic_ai.durable_exec import BoundDurableOperation, DurableOperationId, ModelRequestId
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.usage import RequestUsage

from ..journals import dumps
from ._codec import Unencoded

__all__ = ('warm',)

log = logging.getLogger('pydantic_ai_durable')

_SAMPLE = ModelResponse(
    parts=[TextPart('warm'), ToolCallPart('warm', {'up': 1}, tool_call_id='warm')],
    usage=RequestUsage(input_tokens=1, output_tokens=1),
    model_name='warm',
)

_WARMED: set[tuple[type[Any], bool]] = set()
"""The model operations (by kind and streaming) whose encoders this process built already."""


def warm(operation_id: DurableOperationId, bound: BoundDurableOperation[Any, Any, Any]) -> None:
    """Encode, write as JSON text and decode one sample response with a model operation's own codec, once."""
    if not isinstance(operation_id, ModelRequestId):
        return
    kind = (type(operation_id), operation_id.streaming)
    if kind in _WARMED:
        return
    _WARMED.add(kind)
    codec = bound.operation.result_codec
    try:
        encoded = codec.dump(_SAMPLE)
        if isinstance(encoded, Unencoded):  # bound inside another model step's body
            encoded = encoded.encode()
        dumps({'payload': encoded})
        codec.load(encoded)
    except Exception as exc:  # best effort: the real response is encoded the same way and reports its own error
        log.debug('warming the encoders of %r failed: %r', operation_id, exc)
