"""A response's tokens count even when the process dies before its step is recorded (UW-1, UW-2).

The child is a real process that SIGKILLs itself while pydantic-ai encodes the model's response: after
the provider billed it, before its step's entry exists. That window is where the first live response of
a process spends most of its time (the encoder is built on first use), and where a crash loop used to
escape `total_tokens_limit`.
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

    journal_dir, billed, kill, limit = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == 'kill', int(sys.argv[4])
    codec = type(JSON_CODEC)
    encode = codec.dump

    def dying_encode(self, tp, value):
        # The provider has answered and billed: die while the response is encoded, before it is recorded.
        if kill and getattr(value, 'provider_response_id', '').startswith('billed-'):
            os.kill(os.getpid(), signal.SIGKILL)
        return encode(self, tp, value)

    codec.dump = dying_encode

    def model(messages, info):
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        with billed.open('a') as f:
            f.write(json.dumps({'turn': turn, 'tokens': 117}) + '\\n')
        usage = RequestUsage(input_tokens=100, output_tokens=17)
        if turn == 0:
            parts = [ToolCallPart('look', {}, tool_call_id='c1')]
        else:
            parts = [TextPart('done')]
        return ModelResponse(parts=parts, usage=usage, provider_response_id=f'billed-{turn}')

    durable = Durable(DiskJournal(journal_dir))
    agent = Agent(FunctionModel(model, model_name='window'), name='window', capabilities=[durable])

    @agent.tool_plain
    def look() -> str:
        return 'seen'

    async def main():
        limits = UsageLimits(total_tokens_limit=limit) if limit else None
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


def _attempt(tmp_path: Path, *, kill: bool, limit: int = 0) -> subprocess.CompletedProcess[str]:
    script = tmp_path / 'child.py'
    script.write_text(CHILD)
    mode = 'kill' if kill else 'run'
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / 'journal'), str(tmp_path / 'billed'), mode, str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _billed(tmp_path: Path) -> list[dict[str, int]]:
    path = tmp_path / 'billed'
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


pytestmark = pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')


def test_uw_1_a_response_killed_before_its_record_still_counts(tmp_path: Path) -> None:
    killed = _attempt(tmp_path, kill=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(_billed(tmp_path)) == 1  # the first response was billed, then the process died

    resumed = _attempt(tmp_path, kill=False)
    assert resumed.returncode == 0, resumed.stderr
    total = json.loads(resumed.stdout.splitlines()[-1])
    billed = _billed(tmp_path)
    assert len(billed) == 3  # the lost response again, then the final answer
    assert total == {'requests': 3, 'input_tokens': 300, 'output_tokens': 51}  # every billed response, once


def test_uw_2_a_crash_loop_in_the_response_window_stops_at_total_tokens_limit(tmp_path: Path) -> None:
    limit = 300
    outcomes = []
    for _ in range(6):
        attempt = _attempt(tmp_path, kill=True, limit=limit)
        outcomes.append('killed' if attempt.returncode == -signal.SIGKILL else attempt.stdout.strip())
    billed = sum(line['tokens'] for line in _billed(tmp_path))
    # Each attempt starts from what the dead ones spent: the one that would start above the limit is refused
    # before it calls the model, so at most the response that crossed the limit is billed past it.
    assert billed <= limit + 117, (billed, outcomes)
    assert outcomes[:3] == ['killed'] * 3
    assert all('total_tokens' in outcome for outcome in outcomes[3:]), outcomes


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
    warmed = sys.modules.get('pydantic_ai_durable._warm')
    if warmed is not None:
        monkeypatch.setattr(warmed, '_WARMED', set())  # as in a fresh process
    agent = Agent(FunctionModel(model, model_name='warm-test'), name='warm_test', capabilities=[Durable()])
    async with execution('order-warm', journal=MemoryJournal()):
        await agent.run('go')
    assert events[0] == 'encode' and 'request' in events, events  # built before the request, not in its window
