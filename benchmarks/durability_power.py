"""Cost per step of `DiskJournal(durability="power")` next to the default `"process"` (B-2).

Run: `python benchmarks/durability_power.py [--dir DIR] [--writes N] [--steps N] [--rounds N]`.
Not a test; prints one table. `--dir` must be on the file system you care about: a tmpfs makes
fsync free and the comparison meaningless (the table says which file system it measured).

Measured, side by side in one run and alternating the two modes round by round:
- `write_entry`: one ~2 KB entry per call into a journal that already holds the earlier ones.
- agent step: a `FunctionModel` agent doing N tool calls (2N+1 steps: model, tool, ..., model) inside
  `execution()`, per step, and the same agent without durability for reference; the difference is
  what the journal adds to each step (a step writes its entry and, for live usage, its run record).
Every figure is the median over the rounds; the minimum is shown too (the cost on a quiet disk).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from pydantic_ai_durable import DiskJournal, Durable, execution
from pydantic_ai_durable.journals.disk import Durability

MODES: tuple[Durability, ...] = ('process', 'power')
UNLIMITED = UsageLimits(request_limit=None)


def entry(position: int) -> dict[str, Any]:
    """An entry of about 2 KB once encoded, like a short model response."""
    return {
        'v': 1,
        'name': 'bench__model.request',
        'kind': 'model',
        'fingerprint': f'{position:064x}',
        'payload': {'parts': [{'part_kind': 'text', 'content': 'x' * 1_850}], 'model_name': 'bench'},
    }


async def time_writes(directory: Path, durability: Durability, writes: int) -> float:
    """Seconds per `write_entry` call."""
    journal = DiskJournal(directory, durability=durability)
    await journal.open()
    lease = await journal.acquire_lease('bench-writes', f'bench-{os.getpid()}', ttl=600.0)  # writes are fenced
    started = time.perf_counter()
    for position in range(writes):
        assert await journal.write_entry('bench-writes', '0', position, entry(position), epoch=lease.epoch)
    elapsed = time.perf_counter() - started
    await journal.release_lease('bench-writes', lease.holder, lease.epoch)
    await journal.close()
    return elapsed / writes


def agent(steps: int, journal: DiskJournal | None) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(part, ToolReturnPart) for message in messages for part in message.parts)
        if done < steps:
            return ModelResponse(parts=[ToolCallPart('lookup', {'n': done}, tool_call_id=f'call-{done}')])
        return ModelResponse(parts=[TextPart('done')])

    def lookup(n: int) -> str:
        return f'row {n}: ' + 'y' * 200

    return Agent(
        FunctionModel(model, model_name='bench'),
        name='bench',
        toolsets=[FunctionToolset([lookup], id='bench')],
        capabilities=[Durable(journal)] if journal is not None else [],
    )


async def time_agent(directory: Path | None, durability: Durability, steps: int) -> float:
    """Seconds per step of one recorded run (2*steps+1 steps); `directory=None` runs without durability."""
    if directory is None:
        bare = agent(steps, None)
        started = time.perf_counter()
        await bare.run('go', usage_limits=UNLIMITED)
        return (time.perf_counter() - started) / (2 * steps + 1)
    journal = DiskJournal(directory, durability=durability)
    durable = agent(steps, journal)
    async with execution('bench-agent', cleanup='keep') as handle:
        started = time.perf_counter()
        await durable.run('go', usage_limits=UNLIMITED)
        elapsed = time.perf_counter() - started
    assert sum(handle.stats.recorded.values()) == 2 * steps + 1
    await journal.close()
    return elapsed / (2 * steps + 1)


def file_system(path: Path) -> str:
    """The type of the file system holding `path`, from /proc/mounts (Linux), else 'unknown'."""
    try:
        mounts = [line.split() for line in Path('/proc/mounts').read_text().splitlines()]
    except OSError:
        return 'unknown'
    resolved = str(path.resolve())
    best = ('', 'unknown')
    for fields in mounts:
        point = fields[1]
        if (resolved == point or resolved.startswith(point.rstrip('/') + '/')) and len(point) > len(best[0]):
            best = (point, fields[2])
    return best[1]


def us(seconds: float) -> str:
    return f'{seconds * 1e6:,.0f} us'


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dir', type=Path, default=None, help='where to create the journals (default: a temp dir)')
    parser.add_argument('--writes', type=int, default=300, help='write_entry calls per round')
    parser.add_argument('--steps', type=int, default=50, help='tool calls of the agent run (2N+1 steps)')
    parser.add_argument('--rounds', type=int, default=5)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix='durability-power-', dir=args.dir))
    try:
        writes: dict[str, list[float]] = {mode: [] for mode in MODES}
        steps: dict[str, list[float]] = {mode: [] for mode in (*MODES, 'bare')}
        await time_agent(root / 'warm-up', 'process', 5)  # imports, schema and first-call costs
        await time_agent(None, 'process', 5)
        for round_ in range(args.rounds):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                writes[mode].append(await time_writes(root / f'writes-{mode}-{round_}', mode, args.writes))
                steps[mode].append(await time_agent(root / f'agent-{mode}-{round_}', mode, args.steps))
            steps['bare'].append(await time_agent(None, 'process', args.steps))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def median(values: list[float]) -> float:
        return statistics.median(values)

    bare = median(steps['bare'])
    rows = [
        ('write_entry, ~2 KB entry', {mode: writes[mode] for mode in MODES}),
        (f'agent step (N={args.steps}, {2 * args.steps + 1} steps)', {mode: steps[mode] for mode in MODES}),
        ('  of which the journal adds', {mode: [value - bare for value in steps[mode]] for mode in MODES}),
    ]
    print(
        f'DiskJournal cost per step, process vs power; {args.rounds} rounds, median (min); '
        f'file system: {file_system(root.parent)} at {root.parent}; '
        f'{os.cpu_count()} CPUs; Python {sys.version.split()[0]}'
    )
    header = f'{"":<36}{"process":>22}{"power":>22}{"power - process":>18}{"ratio":>8}'
    print(header)
    print('-' * len(header))
    for label, values in rows:
        process, power = median(values['process']), median(values['power'])
        cells = [f'{us(median(values[mode]))} ({us(min(values[mode]))})' for mode in MODES]
        ratio = f'{power / process:.1f}x' if process > 0 else '-'
        print(f'{label:<36}{cells[0]:>22}{cells[1]:>22}{us(power - process):>18}{ratio:>8}')
    print(f'{"agent step without durability":<36}{us(bare):>22}')


if __name__ == '__main__':
    asyncio.run(main())
