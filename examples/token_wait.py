"""An approval asked with a resume token, the execution waiting with nothing held, answered from the CLI.

Runs offline (a scripted model stands in for the LLM) and needs pydantic-ai 2.68 or later. The refund tool needs
approval; `HandleDeferredToolCalls` hands the requests and a resume token to `ask_approver`, which writes them
to an outbox file (standing for a Slack message) and returns `None`. The first attempt then ends with
`ExecutionWaiting`: the execution is `waiting`, and this process could exit. The approver resolves the token
from a shell, here the CLI in a child process:

    pydantic-ai-durable --journal DIR resolve-event - --payload '{"approvals": {"CALL_ID": true}}' < token

and the same code, run again, replays the first model request, gets the approval without asking again, pays
the refund once and answers. A third run replays everything: no model request, no tool, no ask (EV-1..EV-3).

    python examples/token_wait.py
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext

from pydantic_ai_durable import DiskJournal, Durable, ExecutionWaiting, execution
from pydantic_ai_durable.testing import ScriptedModel, ToolCall

KEY = 'refund-17'


def build_agent(data: Path) -> Agent[None, str]:
    outbox, effects = data / 'outbox.json', data / 'effects.log'

    def ask_approver(ctx: RunContext[None], requests: DeferredToolRequests, token: str) -> DeferredToolResults | None:
        with effects.open('a') as file:
            file.write('asked the approver\n')
        calls = {call.tool_call_id: call.args_as_dict() for call in requests.approvals}
        outbox.write_text(json.dumps({'token': token, 'calls': calls}))  # keyed by the token: safe to send again
        return None  # the token is handed on: wait for its resolution

    def refund(amount: int) -> str:
        with effects.open('a') as file:
            file.write(f'refunded {amount}\n')
        return f'refunded {amount} EUR'

    model = ScriptedModel([[ToolCall('refund', {'amount': 40})], 'Refund 17: 40 EUR paid back.'])
    agent: Agent[None, str] = Agent(
        model,
        name='refunds',
        capabilities=[
            HandleDeferredToolCalls(ask_approver, name='approve_refund'),
            Durable(journal=DiskJournal(data / 'journal')),
        ],
    )
    agent.tool_plain(requires_approval=True)(refund)
    return agent


async def handle(data: Path) -> str | None:
    """The app's code, the same on every attempt: the answer, or `None` while the execution waits."""
    try:
        async with execution(KEY):
            result = await build_agent(data).run('Refund order 17.')
    except ExecutionWaiting as waiting:
        print(f'attempt: waiting on {waiting.name} ({waiting.wait}); nothing is held')
        return None
    print(f'attempt: {result.output}')
    return result.output


def approve_from_the_cli(data: Path) -> None:
    """What the approver does in a shell, with the token from the outbox and nothing else."""
    request = json.loads((data / 'outbox.json').read_text())
    payload = json.dumps({'approvals': {call_id: True for call_id in request['calls']}})
    command = [sys.executable, '-m', 'pydantic_ai_durable', '--journal', str(data / 'journal')]
    command += ['resolve-event', '-', '--payload', payload, '--by', 'alice']
    done = subprocess.run(command, input=request['token'], capture_output=True, text=True, check=True)
    print(f'cli: {done.stdout.strip()}')


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        data = Path(directory)
        assert asyncio.run(handle(data)) is None
        approve_from_the_cli(data)
        answer = asyncio.run(handle(data))
        assert asyncio.run(handle(data)) == answer  # a replay of the finished execution
        print('effects:', ', '.join((data / 'effects.log').read_text().splitlines()))


if __name__ == '__main__':
    main()
