"""Crash an agent in the middle of a run, resume it, and see which steps replayed.

Runs offline: a scripted model stands in for the LLM. The first attempt runs in a child process
that is killed with SIGKILL inside the agent's second tool call; the second attempt, in a new
process, resumes the same execution from the journal on disk.

    python examples/crash_and_resume.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic_ai import Agent, FunctionToolset

from pydantic_ai_durable import DiskJournal, Durable, execution
from pydantic_ai_durable.testing import ScriptedModel, ToolCall, crash_at

KEY = 'order-42'


def build_agent(journal_dir: Path, effects: Path) -> tuple[Agent[None, str], ScriptedModel]:
    """An agent that charges a card, ships the order and then reports; each tool call is a side effect."""

    def charge_card(amount: int) -> str:
        with effects.open('a') as file:
            file.write(f'charged {amount}\n')
        return f'charged {amount} EUR'

    def ship_order(order: str) -> str:
        with effects.open('a') as file:
            file.write(f'shipped {order}\n')
        return f'{order} shipped'

    model = ScriptedModel(
        [
            [ToolCall('charge_card', {'amount': 30})],
            [ToolCall('ship_order', {'order': KEY})],
            'Order 42: charged 30 EUR and shipped.',
        ]
    )
    agent = Agent(
        model,
        name='shop',
        toolsets=[FunctionToolset([charge_card, ship_order], id='shop_tools')],
        capabilities=[Durable(journal=DiskJournal(journal_dir))],
    )
    return agent, model


def attempt(journal_dir: Path, effects: Path, *, kill_in_second_tool: bool) -> None:
    agent, model = build_agent(journal_dir, effects)
    with execution(KEY) as handle:
        if kill_in_second_tool:
            with crash_at(kind='tool', nth=2, point='before_body', kill=True):
                agent.run_sync('Process order 42')
        result = agent.run_sync('Process order 42')
    for step in handle.stats.steps:
        print(f'  step {step.position}  {step.outcome:<8}  {step.name}')
    print(f'  output: {result.output!r}')
    print(f'  model calls in this process: {model.calls}')


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == '--attempt':
        attempt(Path(sys.argv[2]), Path(sys.argv[3]), kill_in_second_tool=False)
        return
    if len(sys.argv) == 4 and sys.argv[1] == '--doomed-attempt':
        attempt(Path(sys.argv[2]), Path(sys.argv[3]), kill_in_second_tool=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        journal_dir, effects = Path(tmp) / 'journal', Path(tmp) / 'effects.txt'
        print('Attempt 1 (killed with SIGKILL as the second tool call starts):')
        first = subprocess.run([sys.executable, __file__, '--doomed-attempt', str(journal_dir), str(effects)])
        print(f'  process exited with {first.returncode} (-9 = SIGKILL)')
        print('Attempt 2 (a new process, same execution key):')
        second = subprocess.run([sys.executable, __file__, '--attempt', str(journal_dir), str(effects)])
        if second.returncode != 0:
            sys.exit(second.returncode)
        print('Side effects over both attempts:')
        for line in effects.read_text().splitlines():
            print(f'  {line}')


if __name__ == '__main__':
    main()
