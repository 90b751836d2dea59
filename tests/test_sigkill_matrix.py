"""B-2: an agent killed with SIGKILL at every step boundary, then resumed by a new process.

A child process runs an 11-step agent (6 model requests, 5 tool calls) on a `DiskJournal` and is
killed with SIGKILL by `crash_at(position=i, point=p, kill=True)`; a second, new process resumes the
same execution until it finishes. After each pair the resume must give the uninterrupted output,
every side effect must have run exactly once (the step killed between its body and its record at
most twice), and every entry whose write was acknowledged before the kill must replay.

Each attempt is its own process. To keep the 66 scenarios fast, the attempts are forked from a small
server process that has already imported pydantic-ai (an interpreter start costs about a second);
a forked attempt shares nothing with its parent but the imported modules, and opens its own journal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL and fork are POSIX'),
]

STEPS = 11
"""Positions 0, 2, ..., 10 are model requests; 1, 3, ..., 9 are tool calls."""

POINTS = ('before_body', 'after_body', 'after_record')
DURABILITIES = ('process', 'power')

SERVER = textwrap.dedent(
    """
    import asyncio, json, os, sys, traceback
    from pathlib import Path
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai_durable import DiskJournal, Durable, execution
    from pydantic_ai_durable.testing import crash_at

    def append(path, line):
        with path.open('a') as f:  # closed, so handed to the kernel, before the next step can kill us
            f.write(line + '\\n')

    def attempt(workdir, durability, position, point, name):
        workdir = Path(workdir)
        effects, acks = workdir / 'effects', workdir / f'acks-{name}'

        class AckJournal(DiskJournal):
            # An entry is acknowledged when write_entry returned True: log it right then.
            async def write_entry(self, key, run, pos, entry, *, epoch):
                stored = await super().write_entry(key, run, pos, entry, epoch=epoch)
                if stored:
                    append(acks, f'{run} {pos}')
                return stored

        def model(messages, info):
            returns = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
            append(effects, f'model {2 * len(returns)}')
            if len(returns) < 5:
                n = len(returns) + 1
                return ModelResponse(parts=[ToolCallPart('step', {'n': n}, tool_call_id=f'call-{n}')])
            return ModelResponse(parts=[TextPart(' '.join(returns))])

        def step(n: int) -> str:
            append(effects, f'tool {2 * n - 1}')
            return f'result-{n}'

        journal = AckJournal(workdir / 'journal', durability=durability)
        agent = Agent(
            FunctionModel(model, model_name='matrix'),
            name='matrix',
            toolsets=[FunctionToolset([step], id='steps')],
            capabilities=[Durable(journal)],
        )

        async def main():
            with crash_at(position=position, point=point, kill=True):  # position -1 never fires
                async with execution('matrix-order') as handle:
                    result = await agent.run('go')
            left = await journal.list_executions()
            steps = [[s.run, s.position, s.outcome] for s in handle.stats.steps]
            states = [info.state for info in left]
            report = {'output': result.output, 'steps': steps, 'attempt': handle.attempt, 'left': states}
            (workdir / f'report-{name}.json').write_text(json.dumps(report))

        asyncio.run(main())

    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                attempt(**job)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        killed_by = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        print(json.dumps({'pid': pid, 'signal': killed_by, 'code': code}), flush=True)
    """
)


@dataclass
class Attempt:
    pid: int
    signal: int | None
    code: int | None


class AttemptServer:
    """One server process; each `attempt` forks a fresh process for one attempt and reports how it ended."""

    def __init__(self, script: Path, log: Path) -> None:
        self._log = log.open('w')
        self._process = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, 'PYTHONDONTWRITEBYTECODE': '1'},
        )

    def attempt(self, workdir: Path, durability: str, position: int, point: str, name: str) -> Attempt:
        assert self._process.stdin is not None and self._process.stdout is not None
        job = {'workdir': str(workdir), 'durability': durability, 'position': position, 'point': point, 'name': name}
        self._process.stdin.write(json.dumps(job) + '\n')
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        assert line, 'the attempt server died; see its log'
        return Attempt(**json.loads(line))

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=60)
        self._log.close()


@dataclass
class Scenario:
    durability: str
    point: str
    position: int
    killed: Attempt
    resumed: Attempt
    report: dict[str, Any] | None
    effects: list[str]
    acks: list[str]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def run_scenario(server: AttemptServer, workdir: Path, durability: str, point: str, position: int) -> Scenario:
    workdir.mkdir(parents=True)
    killed = server.attempt(workdir, durability, position, point, 'killed')
    resumed = server.attempt(workdir, durability, -1, point, 'resumed')
    report_file = workdir / 'report-resumed.json'
    report = json.loads(report_file.read_text()) if report_file.exists() else None
    return Scenario(
        durability,
        point,
        position,
        killed,
        resumed,
        report,
        _lines(workdir / 'effects'),
        _lines(workdir / 'acks-killed'),
    )


def identity(position: int) -> str:
    return f'model {position}' if position % 2 == 0 else f'tool {position}'


Matrix = dict[tuple[str, str, int], Scenario]


@pytest.fixture(scope='module')
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Matrix, dict[str, Any]]]:
    root = tmp_path_factory.mktemp('sigkill-matrix')
    script = root / 'server.py'
    script.write_text(SERVER)
    workers = max(2, min(4, os.cpu_count() or 2))
    servers = [AttemptServer(script, root / f'server-{n}.log') for n in range(workers)]
    try:
        baseline_dir = root / 'uninterrupted'
        baseline_dir.mkdir()
        plain = servers[0].attempt(baseline_dir, 'process', -1, 'after_record', 'resumed')
        assert plain.code == 0, (root / 'server-0.log').read_text()
        baseline: dict[str, Any] = json.loads((baseline_dir / 'report-resumed.json').read_text())
        baseline['effects'] = _lines(baseline_dir / 'effects')

        jobs = [(d, p, i) for d in DURABILITIES for p in POINTS for i in range(STEPS)]
        chunks = [jobs[n::workers] for n in range(workers)]

        def run_chunk(n: int) -> list[Scenario]:
            return [
                run_scenario(servers[n], root / f'{d}-{p}-{i}', d, p, i)
                for d, p, i in chunks[n]  # one server runs its attempts one after another
            ]

        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = [scenario for chunk in pool.map(run_chunk, range(workers)) for scenario in chunk]
    finally:
        for server in servers:
            server.close()
    yield {(s.durability, s.point, s.position): s for s in results}, baseline


def test_b2_sigkill_matrix_uninterrupted_run_is_the_reference(matrix: tuple[Matrix, dict[str, Any]]) -> None:
    _, baseline = matrix
    assert baseline['output'] == 'result-1 result-2 result-3 result-4 result-5'
    assert [outcome for _, _, outcome in baseline['steps']] == ['live'] * STEPS
    assert Counter(baseline['effects']) == Counter(identity(position) for position in range(STEPS))


@pytest.mark.parametrize('durability', DURABILITIES)
@pytest.mark.parametrize('point', POINTS)
def test_b2_sigkill_matrix_every_step_boundary_resumes_exactly_once(
    durability: str, point: str, matrix: tuple[Matrix, dict[str, Any]]
) -> None:
    scenarios, baseline = matrix
    for position in range(STEPS):
        scenario = scenarios[(durability, point, position)]
        where = f'durability={durability}, killed {point} step {position}'
        assert scenario.killed.signal == signal.SIGKILL, where
        assert scenario.resumed.code == 0 and scenario.report is not None, where
        report = scenario.report

        # The resume gives the output of an uninterrupted run and leaves nothing behind (C-3).
        assert report['output'] == baseline['output'], where
        assert report['attempt'] == 2, where
        assert report['left'] == ['finished'], where  # kept, so a retry after a later crash replays it (FN-1)
        assert [step_position for _, step_position, _ in report['steps']] == list(range(STEPS)), where

        # Every side effect ran exactly once; the step killed between body and record at most twice.
        counts = Counter(scenario.effects)
        for other in range(STEPS):
            twice = other == position and point == 'after_body'
            assert counts[identity(other)] == (2 if twice else 1), (where, identity(other), scenario.effects)
        assert sum(counts.values()) == STEPS + (point == 'after_body'), (where, scenario.effects)

        # No acknowledged entry was lost: what the killed attempt saw stored replays, and nothing else.
        acked = {int(line.split()[1]) for line in scenario.acks}
        assert acked == set(range(position + (point == 'after_record'))), (where, scenario.acks)
        replayed = {pos for run, pos, outcome in report['steps'] if run == '0' and outcome == 'replayed'}
        assert replayed == acked, (where, report['steps'])
