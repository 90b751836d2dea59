"""Durability tests for an agent, written the way you would write them for your own agent.

Needs only this package, pytest and pytest-asyncio (from a checkout of this repository:
`pip install -e . pytest pytest-asyncio`): the `journal` fixture comes from the pytest plugin the package
registers, and runs each test on every journal backend available.

    pytest examples/test_my_agent.py
"""

from __future__ import annotations

from uuid import uuid4

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.run import AgentRunResult

from pydantic_ai_durable import Durable, Journal
from pydantic_ai_durable.testing import ScriptedModel, SideEffects, ToolCall, assert_replays, crash_everywhere

pytestmark = pytest.mark.asyncio  # needed in pytest-asyncio's strict mode, harmless in auto mode

effects = SideEffects()
"""What the tools really did; the harness attributes each record to an attempt and a step."""

payments: dict[str, int] = {}
"""Stands in for the payment provider: it outlives any crash of our process."""


def build_agent() -> Agent[None, str]:
    """The agent under test. In production the model is an LLM; here a script plays its part."""
    model = ScriptedModel(
        [
            # Like a real provider, each response carries fresh tool call ids; a resumed run replays them.
            [ToolCall('charge_card', {'amount': 30}, id=f'call_{uuid4().hex}')],
            [ToolCall('ship_order', {'order': 'order-42'}, id=f'call_{uuid4().hex}')],
            'Order 42: charged 30 EUR and shipped.',
        ]
    )
    agent: Agent[None, str] = Agent(model, name='shop', capabilities=[Durable()])

    @agent.tool
    def charge_card(ctx: RunContext[None], amount: int) -> str:
        # The tool call id is the idempotency key: a resumed run that repeats this call charges nothing new.
        assert ctx.tool_call_id is not None
        if ctx.tool_call_id not in payments:
            payments[ctx.tool_call_id] = amount
            effects.record('charge')
        return f'charged {amount} EUR'

    @agent.tool_plain
    def ship_order(order: str) -> str:
        effects.record('ship')
        return f'{order} shipped'

    return agent


async def process_order() -> AgentRunResult[str]:
    """The scenario: build the agent and run it, exactly as the application does."""
    return await build_agent().run('Process order 42')


async def test_a_retry_replays_the_whole_run(journal: Journal) -> None:
    report = await assert_replays(process_order, journal=journal)
    assert report.second.output == 'Order 42: charged 30 EUR and shipped.'


async def test_the_agent_resumes_from_a_crash_at_any_step(journal: Journal) -> None:
    report = await crash_everywhere(process_order, journal=journal, exactly_once=['charge'])
    assert len(report.cases) == 3 * len(report.steps)  # three crash points per step


async def test_the_agent_resumes_after_sigkill() -> None:
    # Each attempt runs in a child process killed with SIGKILL; the journal is a DiskJournal in a
    # temporary directory. The in-memory `payments` dies with each process, so only the journal's
    # rule applies here: a step caught between its body and its record runs at most twice.
    report = await crash_everywhere(process_order, kill=True)
    assert report.killed and report.output == 'Order 42: charged 30 EUR and shipped.'
