"""Replays you can see: span attributes of replayed and live steps, and usage that is not counted twice (TR-1..TR-4).

Spans go to an in-memory exporter through the agent's own `Instrumentation` capability, as a user's
logfire or OTLP setup would receive them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic_ai.durable_exec
import pytest
from helpers import Calls, two_step_model
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.toolsets import DynamicToolset
from pydantic_ai.usage import RequestUsage

from pydantic_ai_durable import Durable, Journal, execution

DROPS_REPLAYED_SPANS = getattr(pydantic_ai.durable_exec, 'replay_scope', None) is not None
"""pydantic-ai 2.68+ can leave replayed work out of traces: the replayed steps' own spans are then not exported."""

USAGES = (RequestUsage(input_tokens=100, output_tokens=10), RequestUsage(input_tokens=200, output_tokens=20))
"""What the provider bills for the first and the second request."""


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def _instrumentation(exporter: InMemorySpanExporter) -> Instrumentation:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Instrumentation(settings=InstrumentationSettings(tracer_provider=provider))


def _agent(journal: Journal, calls: Calls, exporter: InMemorySpanExporter, **kwargs: Any) -> Agent[None, str]:

    def query(sql: str) -> str:
        calls.hit('tool')
        return '3 rows'

    return Agent(
        two_step_model(calls, usages=USAGES, **kwargs),
        name='traced',
        toolsets=[FunctionToolset([query], id='db')],
        capabilities=[Durable(journal), _instrumentation(exporter)],
    )


async def _two_attempts(
    new_journal: Callable[[], Journal], exporter: InMemorySpanExporter, key: str, *, prompt: str = 'how many?'
) -> tuple[list[ReadableSpan], list[ReadableSpan]]:
    """Attempt 1 dies at its second model request (after the tool ran); attempt 2 resumes it."""
    with pytest.raises(RuntimeError, match='model crashed'):
        async with execution(key, journal=new_journal()):
            await _agent(new_journal(), Calls(), exporter, fail_final=True).run('how many?')
    first = list(exporter.get_finished_spans())
    exporter.clear()
    async with execution(key, journal=new_journal()):
        await _agent(new_journal(), Calls(), exporter).run(prompt)
    return first, list(exporter.get_finished_spans())


def _steps(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    steps = {}
    for span in spans:
        attributes = span.attributes or {}
        if 'pydantic_ai_durable.position' in attributes:
            steps[int(attributes['pydantic_ai_durable.position'])] = span  # type: ignore[arg-type]
    return steps


def _input_tokens(spans: list[ReadableSpan], *, replayed: bool | None = None) -> int:
    total = 0
    for span in spans:
        attributes = span.attributes or {}
        if replayed is not None and attributes.get('pydantic_ai_durable.replayed', False) is not replayed:
            continue
        total += int(attributes.get('gen_ai.usage.input_tokens', 0))  # type: ignore[arg-type]
    return total


async def test_tr_1_every_step_span_says_whether_it_replayed_and_where(
    new_journal: Callable[[], Journal], exporter: InMemorySpanExporter
) -> None:
    first, second = await _two_attempts(new_journal, exporter, 'order-tr1')
    steps = _steps(second)
    assert sorted(steps) == [0, 1, 2]
    for position, span in steps.items():
        attributes = span.attributes or {}
        assert attributes['pydantic_ai_durable.replayed'] is (position < 2), (position, span.name)
        assert attributes['pydantic_ai_durable.execution_key'] == 'order-tr1'
        assert attributes['pydantic_ai_durable.attempt'] == 2
        assert attributes['pydantic_ai_durable.run'] == '0'
        assert attributes['pydantic_ai_durable.kind'] == ('tool' if position == 1 else 'model')
        assert 'pydantic_ai_durable.divergence' not in attributes
    assert steps[2].name.startswith('chat')  # the live step is pydantic-ai's own span, marked
    assert all(span.attributes['pydantic_ai_durable.replayed'] is False for span in _steps(first).values())  # type: ignore[index]


async def test_tr_2_a_step_that_ran_live_after_a_mismatch_says_why(
    new_journal: Callable[[], Journal], exporter: InMemorySpanExporter
) -> None:
    _, second = await _two_attempts(new_journal, exporter, 'order-tr2', prompt='how many, really?')
    steps = _steps(second)
    attributes = steps[0].attributes or {}
    assert attributes['pydantic_ai_durable.replayed'] is False
    assert 'request differs' in str(attributes['pydantic_ai_durable.divergence'])
    assert 'pydantic_ai_durable.divergence' not in (steps[1].attributes or {})  # only where it diverged


async def test_tr_3_each_attempts_run_span_names_the_execution_and_attempt(
    new_journal: Callable[[], Journal], exporter: InMemorySpanExporter
) -> None:
    first, second = await _two_attempts(new_journal, exporter, 'order-tr3')
    roots = [
        next(span for span in spans if (span.attributes or {}).get('gen_ai.operation.name') == 'invoke_agent')
        for spans in (first, second)
    ]
    assert [root.parent for root in roots] == [None, None]
    assert roots[0].context.trace_id != roots[1].context.trace_id  # two traces ...
    for number, root in enumerate(roots, start=1):  # ... joined by the execution key
        assert (root.attributes or {})['pydantic_ai_durable.execution_key'] == 'order-tr3'
        assert (root.attributes or {})['pydantic_ai_durable.attempt'] == number


async def test_tr_4_replayed_model_spans_do_not_report_usage_as_spent(
    new_journal: Callable[[], Journal], exporter: InMemorySpanExporter
) -> None:
    first, second = await _two_attempts(new_journal, exporter, 'order-tr4')
    billed = USAGES[0].input_tokens + USAGES[1].input_tokens  # the first request once, the second once
    assert _input_tokens(first) + _input_tokens(second, replayed=False) == billed
    if DROPS_REPLAYED_SPANS:  # pydantic-ai 2.68+: no span of a replayed step reports usage at all
        assert _input_tokens(first) + _input_tokens(second) == billed
    root = next(span for span in second if (span.attributes or {}).get('gen_ai.operation.name') == 'invoke_agent')
    attributes = root.attributes or {}
    assert attributes['pydantic_ai_durable.spent.requests'] == 1
    assert attributes['pydantic_ai_durable.spent.input_tokens'] == USAGES[1].input_tokens
    assert attributes['pydantic_ai_durable.spent.output_tokens'] == USAGES[1].output_tokens


async def test_tr_1_discovery_steps_get_a_span_of_their_own(
    new_journal: Callable[[], Journal], exporter: InMemorySpanExporter
) -> None:
    calls = Calls()

    def query(sql: str) -> str:
        return '3 rows'

    agent = Agent(
        two_step_model(calls),
        name='discovering',
        toolsets=[DynamicToolset(lambda ctx: FunctionToolset([query]), id='dyn')],
        capabilities=[Durable(new_journal()), _instrumentation(exporter)],
    )
    async with execution('order-tr1-discovery', journal=new_journal(), cleanup='keep'):
        await agent.run('how many?')
    listings = [span for span in exporter.get_finished_spans() if span.name.endswith('.get_tools')]
    assert listings and all(span.name.startswith('durable step ') for span in listings)
    for span in listings:
        attributes = span.attributes or {}
        assert attributes['pydantic_ai_durable.kind'] == 'other'
        assert attributes['pydantic_ai_durable.replayed'] is False
        assert attributes['pydantic_ai_durable.execution_key'] == 'order-tr1-discovery'
    exporter.clear()
    async with execution('order-tr1-discovery', journal=new_journal()):
        await agent.run('how many?')
    replayed = [span for span in exporter.get_finished_spans() if span.name.endswith('.get_tools')]
    assert replayed and all((span.attributes or {})['pydantic_ai_durable.replayed'] is True for span in replayed)


async def test_tr_1_steps_of_leaf_toolsets_say_they_replayed(
    new_journal: Callable[[], Journal], exporter: InMemorySpanExporter
) -> None:
    from helpers import Warehouse

    calls = Calls()
    leaf = Warehouse({'query': lambda sql: '3 rows'}, id='db')
    agent = Agent(
        two_step_model(calls),
        name='leafy',
        toolsets=[leaf],
        capabilities=[Durable(new_journal()), _instrumentation(exporter)],
    )
    async with execution('order-tr1-leaf', journal=new_journal(), cleanup='keep'):
        await agent.run('how many?')
    exporter.clear()
    async with execution('order-tr1-leaf', journal=new_journal()) as handle:
        await agent.run('how many?')
    assert handle.stats.replayed['tool'] == 1
    steps = _steps(list(exporter.get_finished_spans()))
    assert sorted(steps) == [0, 1, 2]
    assert all((span.attributes or {})['pydantic_ai_durable.replayed'] is True for span in steps.values())
    assert (steps[1].attributes or {})['pydantic_ai_durable.kind'] == 'tool'
