"""Many workers, one shared journal: a worker killed mid-run is finished by another (B-8)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pg import fresh_schema

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai_durable import Durable, ExecutionBusy, PostgresJournal, execution

    dsn, schema, effects, worker, kill_at = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])

    def model(messages, info):
        with effects.open('a') as f:
            f.write(f'{worker} model\\n')
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done < 4:
            return ModelResponse(parts=[ToolCallPart('ship', {'n': done + 1}, tool_call_id=f's{done + 1}')])
        return ModelResponse(parts=[TextPart('shipped 4 parcels')])

    def ship(n: int) -> str:
        if n == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        with effects.open('a') as f:
            f.write(f'{worker} ship {n}\\n')
        return f'parcel {n}'

    agent = Agent(
        FunctionModel(model, model_name='fleet'),
        name='fleet',
        toolsets=[FunctionToolset([ship], id='shipping')],
        capabilities=[Durable(PostgresJournal(dsn, schema=schema))],
    )
    deadline = time.monotonic() + 60
    while True:  # a killed worker's lease is waited out: a closed database session proves nothing (CC-4)
        try:
            with execution('order-fleet', lease_ttl=2) as handle:
                result = agent.run_sync('ship the order')
            break
        except ExecutionBusy:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    print(result.output)
    print(sorted(handle.stats.replayed.items()))
    """
)


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
def test_b8_a_worker_killed_mid_run_is_finished_by_another_worker(tmp_path: Path) -> None:
    dsn, schema = fresh_schema()
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    effects = tmp_path / 'effects'

    def worker(name: str, kill_at: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), dsn, schema, str(effects), name, str(kill_at)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    a = worker('A', kill_at=3)
    assert a.returncode == -signal.SIGKILL, a.stderr
    b = worker('B', kill_at=0)
    assert b.returncode == 0, b.stderr
    assert 'Traceback' not in b.stderr and 'destroyed' not in b.stderr, b.stderr
    output, replayed = b.stdout.splitlines()[:2]
    assert output == 'shipped 4 parcels'
    assert replayed == "[('model', 3), ('tool', 2)]"
    lines = effects.read_text().splitlines()
    assert [line for line in lines if 'ship' in line] == ['A ship 1', 'A ship 2', 'B ship 3', 'B ship 4']
    assert [line for line in lines if 'model' in line] == ['A model'] * 3 + ['B model'] * 2
