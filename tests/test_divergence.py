"""A changed agent never silently repeats an acknowledged side effect (DV-2, DV-3), on every backend.

The usual resume runs a fixed agent: its instructions, tools or MCP server changed, so the run diverges
and the model is asked again. These tests change the agent between attempts and count what the tools
really did (a ledger that outlives every crash, as a payment provider would), over all attempts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from helpers import Calls, Warehouse, responses
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, FunctionToolset, ModelRetry, ToolOutput
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.exceptions import ToolFailed, UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.usage import UsageLimits

from pydantic_ai_durable import Durable, Journal, execution
from pydantic_ai_durable.testing import SimulatedCrash, crash_at

Plan = list[list[tuple[str, dict[str, Any]]]]
"""What the model asks for, turn by turn: each turn a batch of (tool, arguments); then it answers."""

LOGGER = 'pydantic_ai_durable'


def planner(plans: dict[str, Plan], calls: Calls) -> FunctionModel:
    """A model whose plan depends on the agent's instructions, with fresh tool call ids, as a provider gives."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        plan = plans[info.instructions or '']
        turn = responses(messages)
        if turn < len(plan):
            return ModelResponse(
                parts=[ToolCallPart(tool, args, tool_call_id=f'call_{uuid4().hex[:12]}') for tool, args in plan[turn]]
            )
        return ModelResponse(parts=[TextPart(f'done after {turn} turns')])

    return FunctionModel(model, model_name='planner')


class Provider:
    """What the outside world saw: every side effect a tool performed, across every attempt."""

    def __init__(self) -> None:
        self.effects: list[str] = []

    def counts(self) -> Counter[str]:
        return Counter(self.effects)

    def toolset(self) -> FunctionToolset[Any]:
        def charge(amount: int) -> str:
            self.effects.append(f'charge {amount}')
            return f'charged {amount}'

        def ship(order: str) -> str:
            self.effects.append(f'ship {order}')
            return f'shipped {order}'

        def ping(n: int) -> str:
            self.effects.append(f'ping {n}')
            return f'pong {n} #{len(self.effects)}'

        return FunctionToolset([charge, ship, ping], id='shop')


def shop(provider: Provider, plans: dict[str, Plan], calls: Calls, version: str, **durable: Any) -> Agent[None, str]:
    return Agent(
        planner(plans, calls),
        name='shop',
        instructions=version,
        toolsets=[provider.toolset()],
        capabilities=[Durable(**durable)],
    )


async def crashed_attempt(key: str, journal: Journal, agent: Agent[None, str], *, model_turn: int) -> None:
    """An attempt killed right before its `model_turn`-th model request (everything before it recorded)."""
    with pytest.raises(SimulatedCrash):
        async with execution(key, journal=journal, cleanup='keep'):
            with crash_at(kind='model', nth=model_turn, point='before_body'):
                await agent.run('process order 42')


# -- DV-2: argument-matched replay after a divergence ------------------------------------------------


def effects_server(lines: Path, tools: tuple[str, ...]) -> Any:
    """An in-process MCP server whose tools each append a line to a file: acknowledged side effects."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer('effects')

    def effect(name: str) -> Callable[[int], str]:
        def tool(x: int) -> str:
            with lines.open('a') as file:
                file.write(f'{name} {x}\n')
            return f'{name} {x} done'

        return tool

    for name in tools:
        server.add_tool(effect(name), name=name, description=f'{name}: appends a line')
    return server


async def test_dv2_dv3_an_mcp_server_whose_tools_grew_repeats_no_acknowledged_side_effect(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    pytest.importorskip('pydantic_ai.mcp', reason='pydantic-ai-slim[mcp] (fastmcp) is not installed')
    from pydantic_ai.mcp import MCPToolset

    lines = tmp_path / 'lines.txt'
    calls = Calls()
    plan: Plan = [[('alpha', {'x': 1})], [('beta', {'x': 2})], [('gamma', {'x': 3})]]

    def agent(tools: tuple[str, ...], **durable: Any) -> Agent[None, str]:
        toolset = MCPToolset(effects_server(lines, tools), id='effects')
        return Agent(planner({'': plan}, calls), name='mcp', toolsets=[toolset], capabilities=[Durable(**durable)])

    await crashed_attempt('mcp-1', new_journal(), agent(('alpha', 'beta', 'gamma')), model_turn=4)
    assert lines.read_text().splitlines() == ['alpha 1', 'beta 2', 'gamma 3']
    assert calls['model'] == 3

    grown = ('alpha', 'beta', 'gamma', 'delta')  # the server was redeployed with one more tool
    from pydantic_ai_durable import ReplayDiverged

    with pytest.raises(ReplayDiverged) as stopped:  # DV-3: the strict mode stops before anything runs live
        async with execution('mcp-1', journal=new_journal(), cleanup='keep', on_divergence='raise'):
            await agent(grown).run('process order 42')
    assert calls['model'] == 3 and len(lines.read_text().splitlines()) == 3
    assert stopped.value.position == 0 and 'now lists other tools' in stopped.value.reason

    async with execution('mcp-1', journal=new_journal()) as handle:  # the default policy, after the strict stop
        result = await agent(grown).run('process order 42')
    assert result.output == 'done after 3 turns'
    assert lines.read_text().splitlines() == ['alpha 1', 'beta 2', 'gamma 3']  # 0 acknowledged effects repeated
    assert calls['model'] == 3 + 4  # the model was asked again: its request changed with the tool list
    assert handle.stats.replayed_by_arguments == Counter(tool=3)
    by_arguments = [step.name for step in handle.stats.steps if step.by_arguments]
    assert by_arguments == ['mcp__mcp_server__effects.call_tool'] * 3
    [divergence] = handle.stats.divergences
    assert divergence.position == 0 and 'now lists other tools' in divergence.reason


async def test_dv2_changed_instructions_replay_equal_arguments_and_run_a_changed_argument_live(
    new_journal: Callable[[], Journal], caplog: pytest.LogCaptureFixture
) -> None:
    provider, calls = Provider(), Calls()
    plans: dict[str, Plan] = {
        'v1': [[('charge', {'amount': 30})], [('ship', {'order': 'A'})]],
        'v2': [[('charge', {'amount': 30})], [('ship', {'order': 'B'})]],
    }
    await crashed_attempt('order-dv2', new_journal(), shop(provider, plans, calls, 'v1'), model_turn=3)
    assert provider.effects == ['charge 30', 'ship A']

    caplog.set_level(logging.INFO, logger=LOGGER)
    async with execution('order-dv2', journal=new_journal()) as handle:  # redeployed with new instructions
        result = await shop(provider, plans, calls, 'v2').run('process order 42')
    assert result.output == 'done after 2 turns'
    assert provider.effects == ['charge 30', 'ship A', 'ship B']  # the charge replayed, the new order shipped
    assert calls['model'] == 2 + 3
    outcomes = [(step.kind, step.outcome, step.by_arguments) for step in handle.stats.steps]
    assert outcomes == [
        ('model', 'live', False),
        ('tool', 'replayed', True),
        ('model', 'live', False),
        ('tool', 'live', False),
        ('model', 'live', False),
    ]
    assert handle.stats.replayed == Counter(tool=1) and handle.stats.replayed_by_arguments == Counter(tool=1)
    summary = [r.getMessage() for r in caplog.records if r.name == LOGGER and 'attempt 2:' in r.getMessage()]
    assert summary and '1 tool step by its arguments after a divergence' in summary[0]


async def test_dv2_each_recorded_result_serves_one_call_in_recorded_order(new_journal: Callable[[], Journal]) -> None:
    provider, calls = Provider(), Calls()
    plans: dict[str, Plan] = {
        'v1': [[('ping', {'n': 1})], [('ping', {'n': 1})]],  # recorded twice
        'v2': [[('ping', {'n': 1}), ('ping', {'n': 1}), ('ping', {'n': 1})]],  # asked three times, in one batch
    }
    await crashed_attempt('order-many', new_journal(), shop(provider, plans, calls, 'v1'), model_turn=3)
    assert provider.counts() == Counter({'ping 1': 2})
    recorded = ['pong 1 #1', 'pong 1 #2']

    async with execution('order-many', journal=new_journal()) as handle:
        result = await shop(provider, plans, calls, 'v2').run('process order 42')
    assert provider.counts() == Counter({'ping 1': 3})  # two replayed, the third ran
    returned = [
        part.content for message in result.all_messages() for part in message.parts if part.part_kind == 'tool-return'
    ]
    assert returned == [*recorded, 'pong 1 #3']
    assert handle.stats.replayed_by_arguments == Counter(tool=2)


@pytest.mark.parametrize('failure', ['model_retry', 'tool_failed'])
async def test_dv2_a_recorded_failure_is_not_served_it_runs_live(
    new_journal: Callable[[], Journal], failure: str
) -> None:
    """A recorded `ModelRetry` (function tool) or `ToolFailed` (custom leaf) would lead down the old error path."""
    calls = Calls()
    done: list[str] = []
    service = {'up': False}

    def reserve(sku: str) -> str:
        done.append(f'reserve {sku}')
        if not service['up']:
            raise ModelRetry('inventory is down') if failure == 'model_retry' else ToolFailed('inventory is down')
        return f'reserved {sku}'

    def notify(sku: str) -> str:
        done.append(f'notify {sku}')
        return f'notified {sku}'

    plans: dict[str, Plan] = {
        version: [[('reserve', {'sku': 'A'}), ('notify', {'sku': 'A'})]] for version in ('v1', 'v2')
    }

    def agent(version: str) -> Agent[None, str]:
        tools = {'reserve': reserve, 'notify': notify}
        toolset = FunctionToolset(list(tools.values()), id='stock') if failure == 'model_retry' else Warehouse(tools)
        return Agent(
            planner(plans, calls), name='stock', instructions=version, toolsets=[toolset], capabilities=[Durable()]
        )

    await crashed_attempt('order-fail', new_journal(), agent('v1'), model_turn=2)
    assert Counter(done) == Counter({'reserve A': 1, 'notify A': 1})  # parallel calls: either may finish first

    service['up'] = True  # the fix that came with the new instructions
    async with execution('order-fail', journal=new_journal()) as handle:
        await agent('v2').run('process order 42')
    assert Counter(done) == Counter(
        {'reserve A': 2, 'notify A': 1}
    )  # the failure ran again (and worked), the notice did not
    assert handle.stats.replayed_by_arguments == Counter(tool=1)


HAZARD_PLANS: dict[str, Plan] = {
    'v1': [[('ping', {'n': 1})], [('ping', {'n': 2})], [('ping', {'n': 3})]],
    # Another order and one new call: each matched result lands on a position another recorded result held.
    'v2': [[('ping', {'n': 3})], [('ping', {'n': 9})], [('ping', {'n': 1})], [('ping', {'n': 2})]],
}
CRASH_POINTS: list[dict[str, Any]] = [
    *({'kind': 'model', 'nth': nth, 'point': 'after_record'} for nth in (1, 2, 3, 4, 5)),
    *({'kind': 'model', 'nth': nth, 'point': 'before_body'} for nth in (2, 3, 4)),
    {'kind': 'tool', 'nth': 1, 'point': 'after_record'},  # the new call, ping(9)
]


@pytest.mark.parametrize('where', CRASH_POINTS, ids=lambda where: f'{where["point"]}-{where["kind"]}{where["nth"]}')
@pytest.mark.parametrize('backend', ['memory', 'disk'])
async def test_dv2_a_crash_of_the_diverged_attempt_repeats_no_acknowledged_side_effect(
    where: dict[str, Any], backend: str, tmp_path: Path
) -> None:
    """The diverged attempt writes where the recorded results were; a crash at any of its steps loses none of them."""
    from pydantic_ai_durable import DiskJournal, MemoryJournal

    journal: Journal = MemoryJournal() if backend == 'memory' else DiskJournal(tmp_path / 'journal')
    provider, calls = Provider(), Calls()
    await crashed_attempt('order-hazard', journal, shop(provider, HAZARD_PLANS, calls, 'v1'), model_turn=4)
    with pytest.raises(SimulatedCrash):
        async with execution('order-hazard', journal=journal, cleanup='keep'):
            with crash_at(**where):
                await shop(provider, HAZARD_PLANS, calls, 'v2').run('process order 42')
    async with execution('order-hazard', journal=journal):
        result = await shop(provider, HAZARD_PLANS, calls, 'v2').run('process order 42')
    assert result.output == 'done after 4 turns'
    assert provider.counts() == Counter({'ping 1': 1, 'ping 2': 1, 'ping 3': 1, 'ping 9': 1})


async def test_dv2_a_crash_of_the_diverged_attempt_repeats_no_acknowledged_side_effect_on_every_backend(
    new_journal: Callable[[], Journal],
) -> None:
    provider, calls = Provider(), Calls()
    await crashed_attempt('order-hz', new_journal(), shop(provider, HAZARD_PLANS, calls, 'v1'), model_turn=4)
    await crashed_attempt('order-hz', new_journal(), shop(provider, HAZARD_PLANS, calls, 'v2'), model_turn=3)
    assert provider.counts() == Counter({'ping 1': 1, 'ping 2': 1, 'ping 3': 1, 'ping 9': 1})  # ping(9) ran
    async with execution('order-hz', journal=new_journal()):
        await shop(provider, HAZARD_PLANS, calls, 'v2').run('process order 42')
    assert provider.counts() == Counter({'ping 1': 1, 'ping 2': 1, 'ping 3': 1, 'ping 9': 1})


async def test_dv2_a_result_matched_in_one_attempt_is_not_served_again_in_the_next(
    new_journal: Callable[[], Journal],
) -> None:
    provider, calls = Provider(), Calls()
    plans: dict[str, Plan] = {
        'v1': [[('ping', {'n': 1})]],
        'v2': [[('ping', {'n': 2})], [('ping', {'n': 1})]],
        'v3': [[('ping', {'n': 1})], [('ping', {'n': 1})]],
    }
    await crashed_attempt('order-once', new_journal(), shop(provider, plans, calls, 'v1'), model_turn=2)
    await crashed_attempt('order-once', new_journal(), shop(provider, plans, calls, 'v2'), model_turn=3)
    assert provider.counts() == Counter({'ping 1': 1, 'ping 2': 1})  # attempt 2 matched ping(1)
    async with execution('order-once', journal=new_journal()) as handle:
        await shop(provider, plans, calls, 'v3').run('process order 42')
    assert provider.counts() == Counter({'ping 1': 2, 'ping 2': 1})  # one recorded ping(1): one replays, one runs
    assert handle.stats.replayed_by_arguments == Counter(tool=1)


async def test_dv2_u_argument_matched_replays_are_free_under_a_tool_calls_limit(
    new_journal: Callable[[], Journal],
) -> None:
    provider, calls = Provider(), Calls()
    plans: dict[str, Plan] = {
        version: [[('charge', {'amount': 30})], [('ship', {'order': 'A'})]] for version in ('v1', 'v2')
    }
    limits = UsageLimits(tool_calls_limit=2)
    with pytest.raises(SimulatedCrash):
        async with execution('order-limit', journal=new_journal(), cleanup='keep'):
            with crash_at(kind='model', nth=3, point='before_body'):
                await shop(provider, plans, calls, 'v1').run('process order 42', usage_limits=limits)
    async with execution('order-limit', journal=new_journal()) as handle:
        result = await shop(provider, plans, calls, 'v2').run('process order 42', usage_limits=limits)
    assert provider.effects == ['charge 30', 'ship A']
    assert result.usage.tool_calls == 2  # what an uninterrupted run used, over both attempts
    assert handle.usage.attempt.tool_calls == 0 and handle.usage.attempt.requests == 3

    # A call that runs live is still counted: one more than the limit allows is refused before it runs.
    plans['v3'] = [[('charge', {'amount': 30})], [('ship', {'order': 'A'})], [('ship', {'order': 'B'})]]
    await crashed_attempt('order-limit-2', new_journal(), shop(provider, plans, calls, 'v1'), model_turn=3)
    with pytest.raises(UsageLimitExceeded):
        async with execution('order-limit-2', journal=new_journal()):
            await shop(provider, plans, calls, 'v3').run('process order 42', usage_limits=limits)
    assert provider.effects == ['charge 30', 'ship A'] * 2  # attempt 1 of order-limit-2 ran both; nothing more


async def test_dv2_tr_a_step_replayed_by_arguments_says_so_on_its_span(new_journal: Callable[[], Journal]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    shop_provider, calls = Provider(), Calls()
    plans: dict[str, Plan] = {version: [[('charge', {'amount': 30})]] for version in ('v1', 'v2')}

    def agent(version: str) -> Agent[None, str]:
        instrumentation = Instrumentation(settings=InstrumentationSettings(tracer_provider=provider))
        return Agent(
            planner(plans, calls),
            name='shop',
            instructions=version,
            toolsets=[shop_provider.toolset()],
            capabilities=[Durable(), instrumentation],
        )

    await crashed_attempt('order-tr', new_journal(), agent('v1'), model_turn=2)
    exporter.clear()
    async with execution('order-tr', journal=new_journal()):
        await agent('v2').run('process order 42')
    spans = [
        span
        for span in exporter.get_finished_spans()
        if (span.attributes or {}).get('pydantic_ai_durable.kind') == 'tool'
    ]
    [span] = spans
    attributes = span.attributes or {}
    assert attributes['pydantic_ai_durable.replayed'] is True
    assert attributes['pydantic_ai_durable.replayed_by_arguments'] is True
    assert shop_provider.effects == ['charge 30']


async def test_dv2_a11_an_output_function_asked_again_with_equal_arguments_replays(
    new_journal: Callable[[], Journal],
) -> None:
    filed: list[str] = []
    calls = Calls()

    def file_report(title: str) -> str:
        filed.append(title)
        return f'ticket for {title}'

    def agent(version: str) -> Agent[None, str]:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.hit('model')
            call = ToolCallPart(info.output_tools[0].name, {'title': 'disk full'}, tool_call_id=f'o_{uuid4().hex}')
            return ModelResponse(parts=[call])

        return Agent(
            FunctionModel(model, model_name='reporter'),
            name='reporter',
            instructions=version,
            output_type=ToolOutput(file_report),
            capabilities=[Durable()],
        )

    with pytest.raises(SimulatedCrash):
        async with execution('report', journal=new_journal(), cleanup='keep'):
            with crash_at(kind='tool', point='after_record'):  # the ticket was filed and recorded
                await agent('v1').run('file it')
    async with execution('report', journal=new_journal()) as handle:
        result = await agent('v2').run('file it')
    assert result.output == 'ticket for disk full'
    assert filed == ['disk full'] and calls['model'] == 2  # asked again; the ticket was not filed again
    assert handle.stats.replayed_by_arguments == Counter(tool=1)


# -- DV-3: the strict mode -------------------------------------------------------------------------


async def test_dv3_strict_mode_raises_before_any_model_request_or_tool_body(new_journal: Callable[[], Journal]) -> None:
    from pydantic_ai_durable import DurableError, ReplayDiverged

    provider, calls = Provider(), Calls()
    plans: dict[str, Plan] = {
        'v1': [[('charge', {'amount': 30})], [('ship', {'order': 'A'})]],
        'v2': [[('charge', {'amount': 30})], [('ship', {'order': 'B'})]],
    }
    await crashed_attempt('order-strict', new_journal(), shop(provider, plans, calls, 'v1'), model_turn=3)
    assert (calls['model'], len(provider.effects)) == (2, 2)

    for options, durable in (({'on_divergence': 'raise'}, {}), ({}, {'on_divergence': 'raise'})):
        with pytest.raises(ReplayDiverged) as stopped:
            async with execution('order-strict', journal=new_journal(), cleanup='keep', **options):
                await shop(provider, plans, calls, 'v2', **durable).run('process order 42')
        assert (calls['model'], len(provider.effects)) == (2, 2)  # no model request, no tool body
        error = stopped.value
        assert isinstance(error, DurableError)
        assert (error.run, error.position, error.name) == ('0', 0, 'shop__model.request')
        assert error.reason.startswith('request differs') and error.recorded_after == 3
        message = str(error)
        assert "Execution 'order-strict' run 0 diverged at step 0 (shop__model.request)" in message
        assert '3 recorded steps of this run lie after it' in message
        assert "on_divergence='run_live'" in message and 'delete' in message

    # The strict stop left no failure fence: the agent as recorded still replays every recorded step.
    async with execution('order-strict', journal=new_journal(), cleanup='keep') as handle:
        await shop(provider, plans, calls, 'v1').run('process order 42')
    assert handle.stats.divergences == [] and handle.stats.replayed == Counter(model=2, tool=2)
    assert (calls['model'], len(provider.effects)) == (3, 2)

    # The execution's setting wins over the capability's.
    async with execution('order-strict', journal=new_journal(), on_divergence='run_live') as handle:
        await shop(provider, plans, calls, 'v2', on_divergence='raise').run('process order 42')
    assert provider.effects == ['charge 30', 'ship A', 'ship B']


def test_dv3_on_divergence_values_are_checked() -> None:
    with pytest.raises(ValueError, match="on_divergence must be 'run_live' or 'raise', not 'stop'"):
        execution('k', on_divergence='stop')  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_divergence must be 'run_live' or 'raise', not 'stop'"):
        Durable(on_divergence='stop')  # type: ignore[arg-type]


# -- DV-2 in the journal core ----------------------------------------------------------------------


def core_attempt(journal: Journal, **options: Any) -> Any:
    from pydantic_ai_durable._core import Attempt

    return Attempt('core', journal=journal, default_journal=lambda: journal, cleanup='keep', lease_ttl=30, **options)


async def test_dv2_entries_without_a_call_digest_are_never_matched(backend_journal: Journal) -> None:
    """Entries of earlier releases carry no `call`: they replay by position as before, never by arguments."""
    first = core_attempt(backend_journal)
    run = await first.start_run(backend_journal)
    await run.claim('model', 'model', 'm1').record('ask for t')
    await run.claim('tool:t', 'tool', 't-old-id').record({'kind': 'tool_return', 'result': 1})  # no call digest
    await first.finish(None)

    second = core_attempt(backend_journal)
    run = await second.start_run(backend_journal)
    assert not run.claim('model', 'model', 'm2').replayed  # diverges
    step = run.claim('tool:t', 'tool', 't-new-id', call='digest-of-t')
    await second.finish(None)
    assert not step.replayed and second.stats.replayed_by_arguments.total() == 0


async def test_dv2_jf5_h7_a_fence_stops_a_diverged_call_with_the_same_arguments(backend_journal: Journal) -> None:
    from pydantic_ai_durable import JournalError
    from pydantic_ai_durable.testing._record import AttemptRecord as Events
    from pydantic_ai_durable.testing._record import Recorder

    first = core_attempt(backend_journal)
    run = await first.start_run(backend_journal)
    await run.claim('model', 'model', 'm1').record('ask for t')
    await run.writes.fence(run.claim('tool:t', 'tool', 't-old-id', call='digest-of-t'), TypeError('a socket'))
    await first.finish(None)

    second = core_attempt(backend_journal)
    run = await second.start_run(backend_journal)
    run.claim('model', 'model', 'm2')  # the model was asked again
    with pytest.raises(JournalError, match='could not be journaled'):
        run.claim('tool:t', 'tool', 't-new-id', call='digest-of-t')
    await second.finish(None)

    events: list[dict[str, Any]] = []
    third = core_attempt(backend_journal, rerun_unjournalable=True)
    run = await third.start_run(backend_journal)
    run.claim('model', 'model', 'm3')
    step = run.claim('tool:t', 'tool', 't-newer-id', call='digest-of-t')
    Recorder(events.append)(step, 'before_body')
    await third.finish(None)
    assert not step.replayed and step.rerun
    [live] = Events.parse(events).steps.values()
    assert live.rule is not None and live.rule.endswith('(JF-5)')
