"""The async test harness (H-1, H-4, H-5, H-6) on real pydantic-ai agents, durable-safe or not.

The agents that are not durable-safe are the point: each shows that the harness catches a mistake a
user can make, and that its message names the step, the crash point and the cause.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from pydantic_ai import Agent, FunctionToolset, RunContext, Tool
from pydantic_ai.run import AgentRunResult
from pydantic_ai.toolsets import ToolsetTool, WrapperToolset

from pydantic_ai_durable import DiskJournal, Durable, Journal, MemoryJournal
from pydantic_ai_durable.testing import (
    ScriptedModel,
    SideEffects,
    ToolCall,
    _plugin,
    assert_replays,
    crash_everywhere,
)

ROOT = Path(__file__).resolve().parent.parent

effects = SideEffects()
"""Module-level, so the SIGKILL variant's child processes (which import this module) count into it."""


def steps_agent(tool_calls: int) -> Agent[None, str]:
    """A model that calls `step` `tool_calls` times, one call per turn, then answers."""

    def step(n: int) -> str:
        effects.record('step')
        return f'done {n}'

    turns: list[Any] = [[ToolCall('step', {'n': n}, id=f's{n}')] for n in range(tool_calls)]
    return Agent(
        ScriptedModel([*turns, f'finished {tool_calls} steps']),
        name='steps',
        toolsets=[FunctionToolset([step], id='work')],
        capabilities=[Durable()],
    )


async def two_steps() -> AgentRunResult[str]:
    """A small durable-safe scenario: one tool call, three journal steps."""
    return await steps_agent(1).run('go')


# -- H-1: the pytest plugin ------------------------------------------------------------------------


def test_h1_journal_fixture_gives_each_backend(journal: Journal, request: pytest.FixtureRequest) -> None:
    backend = request.node.callspec.params['journal']
    assert backend in ('memory', 'disk', 'postgres')
    assert isinstance(journal, Journal)
    if backend == 'memory':
        assert isinstance(journal, MemoryJournal)
    if backend == 'disk':
        assert isinstance(journal, DiskJournal)
        assert Path(journal.path).is_relative_to(request.getfixturevalue('tmp_path'))


def test_h1_postgres_joins_only_when_configured_and_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_plugin.PG_DSN_ENV, raising=False)
    assert _plugin._backends() == ['memory', 'disk']
    monkeypatch.setenv(_plugin.PG_DSN_ENV, 'postgresql://nowhere/test')
    monkeypatch.setitem(sys.modules, 'pydantic_ai_durable.journals.postgres', None)  # import fails
    assert _plugin._backends() == ['memory', 'disk']
    fake = types.ModuleType('pydantic_ai_durable.journals.postgres')
    fake.PostgresJournal = MemoryJournal  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, 'pydantic_ai_durable.journals.postgres', fake)
    assert _plugin._backends() == ['memory', 'disk', 'postgres']


def test_h1_plugin_imports_no_harness_module() -> None:
    code = (
        'import sys, pydantic_ai_durable.testing._plugin\n'
        "print(sorted(m for m in sys.modules if m.startswith('pydantic_ai_durable.testing.')))"
    )
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['pydantic_ai_durable.testing._plugin']"


@pytest.mark.parametrize('mode', ['strict', 'auto'])
def test_h1_example_runs_green_in_strict_and_auto_mode(mode: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            '-m',
            'pytest',
            str(ROOT / 'examples' / 'test_my_agent.py'),
            '-p',
            'asyncio',
            f'--asyncio-mode={mode}',
            '-p',
            'no:cacheprovider',
            '-q',
            '-k',
            'not sigkill',
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert '4 passed' in result.stdout


# -- H-4: assert_replays ---------------------------------------------------------------------------


async def test_h4_a_durable_agent_replays(journal: Journal) -> None:
    report = await assert_replays(lambda: steps_agent(3).run('go'), journal=journal)
    assert report.first.output == report.second.output == 'finished 3 steps'
    assert [ref.kind for ref in report.steps] == ['model', 'tool'] * 3 + ['model']
    assert await journal.list_executions() == []


async def test_h4_a_timestamp_in_the_prompt_diverges_at_the_first_model_step() -> None:
    async def scenario() -> AgentRunResult[str]:
        now = datetime.now().isoformat(timespec='microseconds')
        return await steps_agent(1).run(f'It is {now}. Go.')

    with pytest.raises(AssertionError) as caught:
        await assert_replays(scenario)
    message = str(caught.value)
    # The model was asked again; its tool call, with the recorded arguments, replayed them (DV-2).
    assert '2 of 3 recorded steps ran live again (2 model)' in message
    assert 'step 1 (tool steps__function_toolset__work.call_tool:step)' not in message
    assert 'step 0 (model steps__model.request) diverged from the journal: request differs' in message
    assert 'datetime.now()' in message


@dataclass
class StampRequestId(WrapperToolset[Any]):
    """A toolset wrapper that gives every call a fresh request id: a random tool argument."""

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        return await super().call_tool(name, {**tool_args, 'request_id': random.random()}, ctx, tool)


def stamped_agent(payments: SideEffects) -> Agent[None, str]:
    def charge(amount: int, request_id: float = 0.0) -> str:
        payments.record('charge')
        return f'charged {amount}'

    return Agent(
        ScriptedModel([[ToolCall('charge', {'amount': 30}, id='c1')], 'paid']),
        name='stamped',
        toolsets=[StampRequestId(FunctionToolset([charge], id='pay'))],
        capabilities=[Durable()],
    )


async def test_h4_a_random_tool_argument_diverges_at_the_tool_step() -> None:
    payments = SideEffects()
    with pytest.raises(AssertionError) as caught:
        await assert_replays(lambda: stamped_agent(payments).run('pay'))
    message = str(caught.value)
    assert '2 of 3 recorded steps ran live again (1 model, 1 tool)' in message
    assert 'step 1 (tool stamped__function_toolset__pay.call_tool:charge) diverged from the journal' in message
    assert 'request differs' in message and 'random' in message
    assert "side effects happened during the replay: 'charge' x1" in message
    assert payments['charge'] == 2


async def test_h4_an_agent_without_durable_has_nothing_to_replay() -> None:
    agent = Agent(ScriptedModel(['hi']), name='plain')
    with pytest.raises(AssertionError, match='ran no journaled step'):
        await assert_replays(lambda: agent.run('x'))


async def test_h4_a_failing_live_run_is_reported_with_its_error() -> None:
    def fail() -> str:
        raise RuntimeError('tool is broken')

    agent = Agent(ScriptedModel([[ToolCall('fail')], 'x']), name='broken', tools=[fail], capabilities=[Durable()])
    with pytest.raises(AssertionError, match='the live run failed: RuntimeError: tool is broken'):
        await assert_replays(lambda: agent.run('x'))


# -- H-5: crash_everywhere -------------------------------------------------------------------------


async def test_h5_crash_everywhere_over_a_ten_step_agent_runs_in_under_a_minute(journal: Journal) -> None:
    started = time.perf_counter()
    report = await crash_everywhere(lambda: steps_agent(10).run('go'), journal=journal)
    elapsed = time.perf_counter() - started
    print(f'crash_everywhere, 10 tool calls ({len(report.steps)} steps, {len(report.cases)} cases): {elapsed:.1f} s')
    assert len(report.steps) == 21 and len(report.cases) == 63
    assert all(case.ok for case in report.cases)
    assert report.output == 'finished 10 steps' and not report.killed
    assert elapsed < 60
    assert await journal.list_executions() == []


def charging_agent(payments: SideEffects, *, idempotent: bool) -> Agent[None, str]:
    charged: set[str] = set()

    def charge(ctx: RunContext[None], amount: int) -> str:
        key = ctx.tool_call_id or ''
        if not idempotent or key not in charged:
            charged.add(key)
            payments.record('charge')
        return f'charged {amount}'

    return Agent(
        ScriptedModel([[ToolCall('charge', {'amount': 30}, id='c1')], 'paid']),
        name='shop',
        toolsets=[FunctionToolset([charge], id='pay')],
        capabilities=[Durable()],
    )


async def test_h5_a_charge_that_is_not_idempotent_runs_twice_when_crashed_between_body_and_record() -> None:
    payments = SideEffects()
    with pytest.raises(AssertionError) as caught:
        await crash_everywhere(lambda: charging_agent(payments, idempotent=False).run('pay'), exactly_once=['charge'])
    message = str(caught.value)
    assert message.startswith('crash_everywhere: 1 of 9 crash points failed.')
    assert (
        '* crash after its body ran, before its result was recorded of step 1 (tool shop__function_toolset__pay.'
        'call_tool:charge), then resume:' in message
    )
    assert "side effect 'charge' happened 2 times (1 in the crashed attempt, 1 in the resume)" in message
    assert 'declared exactly_once' in message and 'idempotent' in message


async def test_h5_the_charge_may_run_twice_when_not_declared_exactly_once() -> None:
    payments = SideEffects()
    report = await crash_everywhere(lambda: charging_agent(payments, idempotent=False).run('pay'))
    assert all(case.ok for case in report.cases)


async def test_h5_an_idempotent_charge_passes_exactly_once(journal: Journal) -> None:
    """The fix the message asks for: key the charge on the tool call id, which a resume replays."""
    payments = SideEffects()
    charged: set[str] = set()

    def charge(ctx: RunContext[None], amount: int) -> str:
        if ctx.tool_call_id not in charged:
            charged.add(ctx.tool_call_id or '')
            payments.record('charge')
        return f'charged {amount}'

    def agent() -> Agent[None, str]:
        # Fresh tool call ids per model response, as a provider gives them, so executions never share a key.
        turns: list[Any] = [[ToolCall('charge', {'amount': 30}, id=f'c{random.random()}')], 'paid']
        return Agent(ScriptedModel(turns), name='shop', tools=[charge], capabilities=[Durable()])

    report = await crash_everywhere(lambda: agent().run('pay'), journal=journal, exactly_once=['charge'])
    assert len(report.cases) == 9


async def test_h5_a_timestamp_in_the_prompt_fails_every_resume() -> None:
    async def scenario() -> AgentRunResult[str]:
        return await steps_agent(1).run(f'It is {time.time_ns()}. Go.')

    with pytest.raises(AssertionError) as caught:
        await crash_everywhere(scenario)
    message = str(caught.value)
    assert 'crash_everywhere: 7 of 9 crash points failed.' in message  # a crash before anything was recorded is fine
    assert 'the crashed attempt recorded it, yet the resume ran it live again' in message
    assert 'step 0 (model steps__model.request) diverged from the journal: request differs' in message
    assert 'datetime.now()' in message


async def test_h5_a_random_tool_argument_runs_the_tool_again_on_resume() -> None:
    payments = SideEffects()
    with pytest.raises(AssertionError) as caught:
        await crash_everywhere(lambda: stamped_agent(payments).run('pay'))
    message = str(caught.value)
    assert 'crash after its result was recorded of step 1 (tool stamped__function_toolset__pay.call_tool:charge)' in (
        message
    )
    assert (
        'step 1 (tool stamped__function_toolset__pay.call_tool:charge): 2 times; the crashed attempt recorded it'
        in (message)
    )
    assert 'diverged from the journal: request differs' in message and 'random' in message


async def test_h5_a_side_effect_outside_any_step_repeats_on_every_attempt() -> None:
    async def scenario() -> AgentRunResult[str]:
        effects.record('email')  # sent by the scenario itself, not by a journaled tool
        return await steps_agent(1).run('go')

    with pytest.raises(AssertionError) as caught:
        await crash_everywhere(scenario, points=['after_record'])
    message = str(caught.value)
    assert "side effect 'email' happened 2 times" in message
    assert 'outside any journaled step' in message


async def test_h5_a_caught_crash_is_reported() -> None:
    async def scenario() -> str:
        try:
            return (await steps_agent(1).run('go')).output
        except BaseException:
            return 'recovered'

    with pytest.raises(AssertionError) as caught:
        await crash_everywhere(scenario, points=['before_body'])
    assert 'the agent or the scenario caught the crash' in str(caught.value)


async def test_h5_a_run_that_changes_shape_between_runs_is_reported() -> None:
    runs: list[int] = []

    async def scenario() -> str:
        runs.append(1)
        return (await steps_agent(1 if len(runs) == 1 else 0).run('go')).output

    with pytest.raises(AssertionError) as caught:
        await crash_everywhere(scenario, points=['after_record'])
    message = str(caught.value)
    assert 'never reached step 1 (tool steps__function_toolset__work.call_tool:step) live' in message


async def test_h5_parallel_tool_calls_may_repeat_only_the_calls_in_flight(journal: Journal) -> None:
    def agent() -> Agent[None, str]:
        async def charge(n: int) -> str:
            effects.record(f'charge {n}')
            return f'charged {n}'

        calls = [ToolCall('charge', {'n': n}, id=f'p{n}') for n in (1, 2, 3)]
        return Agent(ScriptedModel([calls, 'done']), name='par', tools=[charge], capabilities=[Durable()])

    report = await crash_everywhere(lambda: agent().run('pay'), journal=journal)
    assert len(report.steps) == 5 and all(case.ok for case in report.cases)


async def test_h5_nested_agent_runs_resume_under_their_parent_step() -> None:
    def outer() -> Agent[None, str]:
        inner = Agent(ScriptedModel([[ToolCall('lookup', id='l1')], 'found']), name='inner', capabilities=[Durable()])

        @inner.tool_plain
        def lookup() -> str:
            effects.record('lookup')
            return 'row'

        async def research() -> str:
            return (await inner.run('look')).output

        return Agent(
            ScriptedModel([[ToolCall('research', id='r1')], 'done']),
            name='outer',
            tools=[research],
            capabilities=[Durable()],
        )

    report = await crash_everywhere(lambda: outer().run('go'))
    assert {ref.run for ref in report.steps} == {'0', '0.1.1'}
    assert len(report.steps) == 6 and all(case.ok for case in report.cases)


async def test_h5_exactly_once_must_name_a_recorded_side_effect() -> None:
    with pytest.raises(ValueError, match="exactly_once names 'refund'"):
        await crash_everywhere(two_steps, exactly_once=['refund'])


async def test_h5_a_scenario_import_path_runs_in_process() -> None:
    report = await crash_everywhere('test_harness:two_steps', points=['after_body'])
    assert len(report.cases) == 3


# -- H-5: the SIGKILL variant ----------------------------------------------------------------------


async def non_idempotent_charge() -> AgentRunResult[str]:
    """A module-level scenario, so the SIGKILL variant's child processes can import it."""
    return await charging_agent(effects, idempotent=False).run('pay')


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL and fork are POSIX')
async def test_h5_sigkill_variant_resumes_a_small_agent_in_new_processes(tmp_path: Path) -> None:
    started = time.perf_counter()
    report = await crash_everywhere(two_steps, kill=True, journal=DiskJournal(tmp_path / 'journal'))
    print(f'crash_everywhere(kill=True), {len(report.cases)} cases: {time.perf_counter() - started:.1f} s')
    assert report.killed and report.output == 'finished 1 steps' and len(report.cases) == 9
    assert await DiskJournal(tmp_path / 'journal').list_executions() == []


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL and fork are POSIX')
async def test_h5_sigkill_variant_catches_a_charge_that_is_not_idempotent() -> None:
    with pytest.raises(AssertionError) as caught:
        await crash_everywhere(non_idempotent_charge, kill=True, exactly_once=['charge'], points=['after_body'])
    message = str(caught.value)
    assert 'killed with SIGKILL in a child process' in message
    assert "side effect 'charge' happened 2 times (1 in the crashed attempt, 1 in the resume)" in message


async def test_h5_sigkill_variant_needs_an_importable_scenario_and_a_shared_journal() -> None:
    with pytest.raises(ValueError, match='module-level async function'):
        await crash_everywhere(lambda: two_steps(), kill=True)
    with pytest.raises(TypeError, match='cannot be reopened by a child process'):
        await crash_everywhere(two_steps, kill=True, journal=MemoryJournal())


# -- H-7: steps that run live by rule are judged by that rule --------------------------------------

TOKEN = f'sk-h7-{uuid4().hex}'
"""A registered secret (K-1): a tool that returns it runs live on every attempt (K-8)."""


def secret_agent(*, stamp_arguments: bool = False) -> Agent[None, str]:
    """Reads a secret token, then sends an order with it: the read runs live every time by rule K-8."""
    from pydantic_ai_durable import register_secret

    register_secret(TOKEN)

    def read_token() -> str:
        effects.record('read')  # reading is no side effect to protect, and it happens on every attempt
        return TOKEN

    def send(order: str, token: str, request_id: str = '') -> str:
        effects.record('send')
        return f'sent {order}'

    turns: list[Any] = [
        [ToolCall('read_token', id='t1')],
        [ToolCall('send', {'order': 'o-1', 'token': TOKEN}, id='t2')],
    ]
    toolset: Any = FunctionToolset([read_token, send], id='vault')
    return Agent(
        ScriptedModel([*turns, 'sent']),
        name='vault',
        toolsets=[StampUuid(toolset) if stamp_arguments else toolset],
        capabilities=[Durable()],
    )


@dataclass
class StampUuid(WrapperToolset[Any]):
    """A wrapper that adds a fresh uuid4 to every call's arguments: a genuine replay bug."""

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        extra = {'request_id': uuid4().hex} if name == 'send' else {}
        return await super().call_tool(name, {**tool_args, **extra}, ctx, tool)


async def test_h7_assert_replays_passes_an_agent_whose_tool_returns_a_registered_secret(journal: Journal) -> None:
    report = await assert_replays(lambda: secret_agent().run('send o-1'), journal=journal)
    assert report.first.output == report.second.output == 'sent'
    [(ref, rule)] = report.by_rule
    assert ref.name.endswith('call_tool:read_token') and rule.endswith('(K-8)') and 'registered secret' in rule


async def test_h7_crash_everywhere_passes_an_agent_whose_tool_returns_a_registered_secret(journal: Journal) -> None:
    report = await crash_everywhere(lambda: secret_agent().run('send o-1'), journal=journal)
    assert all(case.ok for case in report.cases) and len(report.cases) == 15
    rules = {rule for case in report.cases for _, rule in case.by_rule}
    assert len(rules) == 1 and rules.pop().endswith('(K-8)')


async def test_h7_an_opted_out_tool_passes_assert_replays() -> None:
    def clock() -> str:
        return 'tick'

    opted_out = Tool(clock, metadata={'durable': {'replayable': False}})
    agent = Agent(
        ScriptedModel([[ToolCall('clock', id='c1')], 'ok']),
        name='clocked',
        toolsets=[FunctionToolset([opted_out], id='time')],
        capabilities=[Durable()],
    )
    report = await assert_replays(lambda: agent.run('time?'))
    [(ref, rule)] = report.by_rule
    assert ref.name.endswith('call_tool:clock') and rule.endswith('(A-9)') and 'opted out' in rule


async def test_h7_the_rule_exemption_still_fails_a_timestamp_in_the_prompt() -> None:
    async def scenario() -> AgentRunResult[str]:
        return await secret_agent().run(f'It is {datetime.now().isoformat(timespec="microseconds")}. Send o-1.')

    with pytest.raises(AssertionError) as replays:
        await assert_replays(scenario)
    assert '3 model' in str(replays.value) and 'datetime.now()' in str(replays.value)
    with pytest.raises(AssertionError) as crashes:
        await crash_everywhere(scenario, points=['after_record'])
    assert 'the crashed attempt recorded it, yet the resume ran it live again' in str(crashes.value)


async def test_h7_the_rule_exemption_still_fails_a_uuid4_in_the_tool_arguments() -> None:
    with pytest.raises(AssertionError) as replays:
        await assert_replays(lambda: secret_agent(stamp_arguments=True).run('send o-1'))
    message = str(replays.value)
    assert 'call_tool:send) diverged from the journal: request differs' in message
    assert "side effects happened during the replay: 'send' x1" in message
    with pytest.raises(AssertionError) as crashes:
        await crash_everywhere(lambda: secret_agent(stamp_arguments=True).run('send o-1'), points=['after_record'])
    assert 'call_tool:send): 2 times; the crashed attempt recorded it' in str(crashes.value)
