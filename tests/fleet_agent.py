"""The agents the fleet tests run: three side-effecting tool calls, each logged, each one a place to kill;
and one whose payment needs a person's approval, so its run ends waiting (WT-4).

Workers of both engines import it. Every model request and tool body appends a JSON line to the effects
log (`FLEET_EFFECTS`): `start` when it begins, `end` when its side effect is done, with the worker's pid.
When a hold file `hold-<prompt>-<point>` exists in `FLEET_HOLDS`, the body waits there (after `start`)
until the file is removed, so a test can SIGKILL the process at exactly that point.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import DiskJournal, Durable, Journal, PostgresJournal

TOOLS = 3
"""Tool calls per run; the model asks for them one at a time."""


def journal_from_environment() -> Journal:
    """The journal `FLEET_JOURNAL` names (`journal_from_setting`), stalling in a sweep's claim if told to."""
    journal = journal_from_setting(os.environ['FLEET_JOURNAL'])
    stall = os.environ.get('FLEET_STALL_CLAIM')
    return StallInClaim(journal, Path(stall)) if stall else journal  # type: ignore[return-value]


class StallInClaim:
    """A real journal that, when a sweep writes its dispatch mark, touches a file and waits there for good.

    The sweep holds its claim (the execution's lease) while it marks, so a test that sees the file can
    SIGKILL the process exactly while it holds the claim. Every other call goes to the journal unchanged.
    """

    def __init__(self, journal: Journal, signal: Path) -> None:
        self._journal = journal
        self._signal = signal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._journal, name)

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        mark = value.get('dispatched')
        if isinstance(mark, dict) and mark.get('attempt') == value.get('attempts'):  # a sweep's claim, not a task
            self._signal.write_text(f'{os.getpid()} {key}')
            await asyncio.sleep(3600)
        return await self._journal.write_execution(key, value, epoch=epoch)


def journal_from_setting(setting: str) -> Journal:
    """`disk:<directory>` or `postgres:<schema>:<dsn>`."""
    kind, _, rest = setting.partition(':')
    if kind == 'disk':
        return DiskJournal(rest)
    schema, _, dsn = rest.partition(':')
    return PostgresJournal(dsn, schema=schema)


def note(event: dict[str, Any]) -> None:
    """Append one line to the effects log; one `write` of a short line with O_APPEND is atomic."""
    line = json.dumps({**event, 'pid': os.getpid(), 'at': time.time()}, default=repr) + '\n'
    fd = os.open(os.environ['FLEET_EFFECTS'], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def held(prompt: str, point: str) -> bool:
    holds = os.environ.get('FLEET_HOLDS')
    return bool(holds) and Path(holds, f'hold-{prompt}-{point}').exists()


async def hold(prompt: str, point: str) -> None:
    """Wait while the test holds this point (it kills the process here, then releases it)."""
    deadline = time.monotonic() + 120
    while held(prompt, point) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _prompt(messages: list[ModelMessage]) -> str:
    first = messages[0].parts[0]
    content = getattr(first, 'content', '')
    return content if isinstance(content, str) else str(content)


async def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt = _prompt(messages)
    done = sum(isinstance(part, ToolReturnPart) for message in messages for part in message.parts)
    note({'prompt': prompt, 'what': 'model', 'n': done + 1, 'phase': 'start'})
    await hold(prompt, f'model-{done + 1}')
    note({'prompt': prompt, 'what': 'model', 'n': done + 1, 'phase': 'end'})
    if done < TOOLS:
        return ModelResponse(
            parts=[ToolCallPart('work', {'prompt': prompt, 'n': done + 1}, tool_call_id=f'w{done + 1}')]
        )
    results = [part.content for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
    return ModelResponse(parts=[TextPart(f'{prompt}: ' + ','.join(str(result) for result in results))])


async def work(prompt: str, n: int) -> str:
    """The side effect: logged at its start and at its end; `FLEET_TOOL_SECONDS` long."""
    note({'prompt': prompt, 'what': 'tool', 'n': n, 'phase': 'start'})
    await hold(prompt, f'tool-{n}')
    await asyncio.sleep(float(os.environ.get('FLEET_TOOL_SECONDS', '0.05')))
    note({'prompt': prompt, 'what': 'tool', 'n': n, 'phase': 'end'})
    return f'r{n}'


def expected_output(prompt: str) -> str:
    return f'{prompt}: ' + ','.join(f'r{n}' for n in range(1, TOOLS + 1))


def make_agent(journal: Journal | None = None, *, durable: bool = True) -> Agent[None, str]:
    return Agent(
        FunctionModel(_model, model_name='fleet'),
        name='fleet',
        toolsets=[FunctionToolset([work], id='effects')],
        capabilities=[Durable(journal=journal)] if durable else [],
    )


async def _approval_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt = _prompt(messages)
    returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
    note({'prompt': prompt, 'what': 'model', 'n': len(returned) + 1, 'phase': 'start'})
    if not returned:
        return ModelResponse(parts=[ToolCallPart('pay', {'prompt': prompt}, tool_call_id='pay-1')])
    return ModelResponse(parts=[TextPart(f'{prompt}: {returned[-1].content}')])


async def pay(prompt: str) -> str:
    """The side effect a person approves: logged at its start and its end."""
    note({'prompt': prompt, 'what': 'tool', 'n': 1, 'phase': 'start'})
    note({'prompt': prompt, 'what': 'tool', 'n': 1, 'phase': 'end'})
    return 'paid'


def approval_output(prompt: str) -> str:
    return f'{prompt}: paid'


def make_approval_agent() -> Agent[None, str | DeferredToolRequests]:
    """One model request asks to pay, which needs approval: the run ends waiting, and goes on once approved."""
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(_approval_model, model_name='fleet-approval'),
        name='fleet-approval',
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        capabilities=[Durable()],
    )
    agent.tool_plain(requires_approval=True)(pay)
    return agent
