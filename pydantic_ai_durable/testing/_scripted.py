"""A scripted model: answers from a fixed list of turns and counts the calls that really reached it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.usage import RequestUsage

__all__ = ('ScriptedModel', 'ToolCall', 'Turn')


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asks for; a fixed id keeps independent runs comparable."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


Turn = str | Sequence[ToolCall]
"""A model turn: final text, or the tool calls to make."""


class ScriptedModel(FunctionModel):
    """A `FunctionModel` that answers turn `n` for the `n`-th request of a run.

    The turn is chosen from the history (how many responses it holds), not from a counter, so a
    resumed run that replays its first requests still gets the right answer for the next live one.
    `calls` counts requests that reached the model, which is what a replay must not increase.
    """

    def __init__(
        self,
        turns: Sequence[Turn],
        *,
        name: str = 'scripted',
        usage: RequestUsage | None = None,
        settings: Any = None,
    ) -> None:
        if not turns:
            raise ValueError('ScriptedModel needs at least one turn.')
        self.turns = list(turns)
        self.calls = 0
        self._usage = usage
        super().__init__(self._answer, stream_function=self._stream, model_name=name, settings=settings)

    def _turn(self, messages: list[ModelMessage]) -> Turn:
        self.calls += 1
        index = sum(isinstance(message, ModelResponse) for message in messages)
        return self.turns[min(index, len(self.turns) - 1)]

    def _calls(self, index: int, turn: Sequence[ToolCall]) -> list[ToolCallPart]:
        return [
            ToolCallPart(call.tool, dict(call.args), tool_call_id=call.id or f'call-{index}-{i}')
            for i, call in enumerate(turn)
        ]

    def _answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = self._turn(messages)
        index = sum(isinstance(message, ModelResponse) for message in messages)
        parts = [TextPart(turn)] if isinstance(turn, str) else self._calls(index, turn)
        if self._usage is not None:
            return ModelResponse(parts=list(parts), usage=self._usage)
        return ModelResponse(parts=list(parts))

    async def _stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        turn = self._turn(messages)
        index = sum(isinstance(message, ModelResponse) for message in messages)
        if isinstance(turn, str):
            for start in range(0, len(turn), 8):
                yield turn[start : start + 8]
            return
        deltas: DeltaToolCalls = {}
        for i, part in enumerate(self._calls(index, turn)):
            deltas[i] = DeltaToolCall(
                name=part.tool_name, json_args=json.dumps(part.args), tool_call_id=part.tool_call_id
            )
        yield deltas
