"""Real crashes: an attempt in a child process killed with SIGKILL, resumed by a new process (A4)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai_durable import DiskJournal, Durable, execution

    journal_dir, effects, kill_at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

    def model(messages, info):
        with effects.open('a') as f:
            f.write('model\\n')
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done < 5:
            return ModelResponse(parts=[ToolCallPart('step', {'n': done + 1}, tool_call_id=f'c{done + 1}')])
        return ModelResponse(parts=[TextPart('finished 5 steps')])

    def step(n: int) -> str:
        if n == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        with effects.open('a') as f:
            f.write(f'tool {n}\\n')
        return f'done {n}'

    agent = Agent(
        FunctionModel(model, model_name='kill'),
        name='killed',
        toolsets=[FunctionToolset([step], id='steps')],
        capabilities=[Durable(DiskJournal(journal_dir))],
    )
    with execution('order-4') as handle:
        result = agent.run_sync('go')
    print(result.output)
    print(sorted(handle.stats.replayed.items()), sorted(handle.stats.recorded.items()))
    """
)


def run_child(tmp_path: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / 'child.py'
    script.write_text(CHILD)
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / 'journal'), str(tmp_path / 'effects'), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
def test_sigkill_inside_a_tool_then_resume_in_a_new_process(tmp_path: Path) -> None:
    first = run_child(tmp_path, kill_at=3)
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = run_child(tmp_path, kill_at=0)
    assert second.returncode == 0, second.stderr
    lines = second.stdout.splitlines()
    assert lines[0] == 'finished 5 steps'
    assert lines[1] == "[('model', 3), ('tool', 2)] [('model', 3), ('tool', 3)]"
    effects = (tmp_path / 'effects').read_text().splitlines()
    assert [effects.count(f'tool {n}') for n in range(1, 6)] == [1, 1, 1, 1, 1]
    assert effects.count('model') == 6

    import asyncio

    from pydantic_ai_durable import DiskJournal

    infos = asyncio.run(DiskJournal(tmp_path / 'journal').list_executions())
    assert [info.state for info in infos] == ['finished']  # kept: a retry replays it (FN-1)
