"""Streaming inside an execution: live deltas reach an event stream handler as they arrive (ST-1).

pydantic-ai runs a streamed model request as one durable unit that drains the stream and returns the
final response; only then does `run_stream` get a stream, rebuilt from that response. So inside
`execution()` `run_stream` yields the text at once, and the way to show deltas live is
`Durable(event_stream_handler=...)`, which pydantic-ai feeds inside the unit while the model streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import AgentStreamEvent, ModelMessage, PartDeltaEvent, TextPartDelta
from pydantic_ai.models.function import AgentInfo, DeltaToolCalls, FunctionModel
from pydantic_ai.tools import RunContext

from pydantic_ai_durable import Durable, Journal, execution

CHUNKS = ['The ', 'order ', 'ships ', 'on ', 'Monday.']


def _streaming_model(timeline: list[str]) -> FunctionModel:
    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        for chunk in CHUNKS:
            timeline.append(f'model sent {chunk!r}')
            yield chunk

    def unused(messages: list[ModelMessage], info: AgentInfo) -> Any:
        raise AssertionError('a streamed run does not make a plain request')

    return FunctionModel(unused, stream_function=stream, model_name='streamer')


async def test_st_1_a_live_streamed_step_reaches_the_event_stream_handler_delta_by_delta(
    new_journal: Callable[[], Journal],
) -> None:
    timeline: list[str] = []

    async def handler(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                timeline.append(f'handler got {event.delta.content_delta!r}')

    agent = Agent(
        _streaming_model(timeline),
        name='streaming',
        capabilities=[Durable(new_journal(), event_stream_handler=handler)],
    )
    async with execution('order-st1', journal=new_journal()) as handle:
        result = await agent.run('when does it ship?')
    assert result.output == ''.join(CHUNKS)
    assert handle.stats.recorded['model'] == 1
    deltas = [line for line in timeline if line.startswith('handler')]
    assert len(deltas) == len(CHUNKS) - 1  # the first chunk starts the part; each later one is a delta
    # Live: each delta reaches the handler before the model sends the next chunk.
    for chunk in CHUNKS[1:-1]:
        got, next_sent = (
            timeline.index(f'handler got {chunk!r}'),
            timeline.index(f'model sent {CHUNKS[CHUNKS.index(chunk) + 1]!r}'),
        )
        assert got < next_sent, timeline


async def test_st_1_run_stream_inside_an_execution_yields_the_text_once_the_step_is_recorded(
    new_journal: Callable[[], Journal],
) -> None:
    """The documented limitation: pydantic-ai hands `run_stream` the response after the step, as one delta."""

    async def deltas_of(agent: Agent[None, str]) -> list[str]:
        async with agent.run_stream('when does it ship?') as streamed:
            return [delta async for delta in streamed.stream_text(delta=True, debounce_by=None)]

    timeline: list[str] = []
    agent = Agent(_streaming_model(timeline), name='streaming', capabilities=[Durable(new_journal())])
    outside = await deltas_of(agent)
    async with execution('order-st1-run-stream', journal=new_journal()):
        inside = await deltas_of(agent)
    assert ''.join(outside) == ''.join(inside) == ''.join(CHUNKS)
    assert len(outside) == len(CHUNKS)
    assert len(inside) == 1
