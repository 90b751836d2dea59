"""A response's tokens count from the moment its step is recorded, and a request from before it is sent (UW-1, UW-2).

The child is a real process that SIGKILLs itself at one of two points of a live model step: while
pydantic-ai's codec encodes the response (after the provider billed it, before its entry exists), or
while pydantic-ai decodes the step's result (after the entry, with its tokens, was committed). The
first is the one window left where a billed response's tokens can be lost; its request still counts.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from pathlib import Path
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec import JSON_CODEC
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import RequestUsage, UsageLimits
    from pydantic_ai_durable import DiskJournal, Durable, execution

    journal_dir, billed, kill = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    limit, turns, limited = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    codec = type(JSON_CODEC)
    encode, decode = codec.dump, codec.load
    fresh = set()  # responses billed in this process: a replayed one is read back, and must not kill again

    def dying_encode(self, tp, value):
        # The provider has answered and billed: die while the response is encoded, before it is recorded.
        if kill == 'encoding' and getattr(value, 'provider_response_id', None) in fresh:
            os.kill(os.getpid(), signal.SIGKILL)
        return encode(self, tp, value)

    def dying_decode(self, tp, payload):
        # The step's entry, with the response's tokens, is committed: die before the agent reads the response.
        if kill == 'recorded' and any(f'"{id}"' in json.dumps(payload, default=str) for id in fresh):
            os.kill(os.getpid(), signal.SIGKILL)
        return decode(self, tp, payload)

    codec.dump, codec.load = dying_encode, dying_decode

    def model(messages, info):
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        with billed.open('a') as f:
            f.write(json.dumps({'turn': turn, 'tokens': 117}) + '\\n')
        usage = RequestUsage(input_tokens=100, output_tokens=17)
        fresh.add(f'billed-{turn}')
        if turn < turns:
            parts = [ToolCallPart('look', {}, tool_call_id=f'c{turn}')]
        else:
            parts = [TextPart('done')]
        return ModelResponse(parts=parts, usage=usage, provider_response_id=f'billed-{turn}')

    durable = Durable(DiskJournal(journal_dir))
    agent = Agent(FunctionModel(model, model_name='window'), name='window', capabilities=[durable])

    @agent.tool_plain
    def look() -> str:
        return 'seen'

    async def main():
        limits = UsageLimits(**{limited: limit}) if limit else None
        try:
            async with execution('order-window') as handle:
                await agent.run('go', usage_limits=limits)
        except UsageLimitExceeded as exc:
            print(json.dumps({'limit': str(exc)}))
            return
        total = handle.usage.total
        spent = {'requests': total.requests, 'input_tokens': total.input_tokens, 'output_tokens': total.output_tokens}
        print(json.dumps(spent))

    asyncio.run(main())
    """
)


def _attempt(
    tmp_path: Path, *, kill: str = 'no', limit: int = 0, turns: int = 1, limited: str = 'total_tokens_limit'
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / 'child.py'
    script.write_text(CHILD)
    return subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path / 'journal'),
            str(tmp_path / 'billed'),
            kill,
            str(limit),
            str(turns),
            limited,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _billed(tmp_path: Path) -> list[dict[str, int]]:
    path = tmp_path / 'billed'
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


pytestmark = pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')


def test_uw_1_a_response_killed_after_its_record_counts_once_and_is_not_billed_again(tmp_path: Path) -> None:
    killed = _attempt(tmp_path, kill='recorded')
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(_billed(tmp_path)) == 1  # the first response was billed and recorded, then the process died

    resumed = _attempt(tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    total = json.loads(resumed.stdout.splitlines()[-1])
    assert len(_billed(tmp_path)) == 2  # the recorded response replayed; only the final answer was billed
    assert total == {'requests': 2, 'input_tokens': 200, 'output_tokens': 34}  # every billed response, once


def test_uw_1_a_response_killed_while_it_is_encoded_loses_its_tokens_but_not_its_request(tmp_path: Path) -> None:
    killed = _attempt(tmp_path, kill='encoding')
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(_billed(tmp_path)) == 1

    resumed = _attempt(tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    total = json.loads(resumed.stdout.splitlines()[-1])
    assert len(_billed(tmp_path)) == 3  # the lost response again, then the final answer
    # The request was counted before it was sent (U2-1); the tokens of the lost response were never recorded.
    assert total == {'requests': 3, 'input_tokens': 200, 'output_tokens': 34}


def test_uw_2_a_crash_loop_after_each_record_stops_at_total_tokens_limit(tmp_path: Path) -> None:
    limit = 300
    outcomes = []
    for _ in range(6):
        attempt = _attempt(tmp_path, kill='recorded', limit=limit, turns=10)
        outcomes.append('killed' if attempt.returncode == -signal.SIGKILL else attempt.stdout.strip())
    billed = sum(line['tokens'] for line in _billed(tmp_path))
    # Each attempt starts from what the dead ones spent: the one that would start above the limit is refused
    # before it calls the model, so at most the response that crossed the limit is billed past it.
    assert billed <= limit + 117, (billed, outcomes)
    assert outcomes[:3] == ['killed'] * 3
    assert all('total_tokens' in outcome for outcome in outcomes[3:]), outcomes


def test_uw_2_a_crash_loop_inside_the_encoding_stops_at_request_limit(tmp_path: Path) -> None:
    outcomes = []
    for _ in range(6):
        attempt = _attempt(tmp_path, kill='encoding', limit=3, limited='request_limit')
        outcomes.append('killed' if attempt.returncode == -signal.SIGKILL else attempt.stdout.strip())
    # Every request was counted before it went out, so the fourth attempt is refused before it calls the model.
    assert len(_billed(tmp_path)) == 3, outcomes
    assert outcomes[:3] == ['killed'] * 3
    assert all('request_limit' in outcome for outcome in outcomes[3:]), outcomes


async def test_uw_3_the_response_encoder_is_built_before_the_first_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec import JSON_CODEC
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from pydantic_ai_durable import Durable, MemoryJournal, execution

    events: list[str] = []
    encode = type(JSON_CODEC).dump

    def watched(self: object, tp: object, value: object) -> object:
        if isinstance(value, ModelResponse):
            events.append('encode')
        return encode(self, tp, value)  # type: ignore[arg-type]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        events.append('request')
        return ModelResponse(parts=[TextPart('done')])

    monkeypatch.setattr(type(JSON_CODEC), 'dump', watched)
    warmed = sys.modules.get('pydantic_ai_durable._steps._warm')
    if warmed is not None:
        monkeypatch.setattr(warmed, '_WARMED', set())  # as in a fresh process
    agent = Agent(FunctionModel(model, model_name='warm-test'), name='warm_test', capabilities=[Durable()])
    async with execution('order-warm', journal=MemoryJournal()):
        await agent.run('go')
    assert events[0] == 'encode' and 'request' in events, events  # built before the request, not in its window


async def test_uw_1_a_response_that_cannot_be_encoded_still_counts_its_tokens() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage, RunUsage

    from pydantic_ai_durable import Durable, JournalError, MemoryJournal, execution

    class Opaque:
        pass

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        usage = RequestUsage(input_tokens=100, output_tokens=17)
        return ModelResponse(parts=[TextPart('done')], usage=usage, provider_details={'opaque': Opaque()})

    journal = MemoryJournal()
    agent = Agent(FunctionModel(model, model_name='opaque'), name='opaque', capabilities=[Durable(journal=journal)])
    with pytest.raises(JournalError, match='not JSON-serializable'):
        async with execution('order-opaque', journal=journal):
            await agent.run('go')
    # The response was billed but has no entry: its tokens were written as the run's usage record (JF-5 fence).
    with pytest.raises(JournalError, match='could not be journaled'):
        async with execution('order-opaque', journal=journal) as handle:
            await agent.run('go')
    assert handle.usage.total == RunUsage(requests=1, input_tokens=100, output_tokens=17)
