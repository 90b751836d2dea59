"""What durability costs: a FunctionModel agent doing N tool-call round trips, bare and durable.

Runs the bare agent and the same agent with `Durable` on `MemoryJournal`, on `DiskJournal` (record,
then replay), on a `DiskJournal` encrypted at rest (EN-1; record, then replay), on Postgres when
`PYDANTIC_AI_DURABLE_PG_DSN` is set, and the reference design when it
is importable, interleaved in one process; prints the median wall time of each as a ratio to the bare
agent, the time added per round trip, the memory allocated per round trip (tracemalloc), how many
backend reads a resumed run made, and each PERF target of docs/rules.md next to its measured figure.

    python benchmarks/agent_overhead.py            # N = 50, 200 (5 samples) and 1000 (1 sample), ~2 minutes
    python benchmarks/agent_overhead.py --quick    # N = 50 and 200 only, under a minute
    python benchmarks/agent_overhead.py --smoke    # N = 5, one sample: that the script still runs (tests do)

The row "durable layer only" is `Durable` inside an execution with every operation passed straight
through: what pydantic-ai's durable machinery costs before any journaling. pydantic-ai's own agent loop
grows with the history (the bare agent takes about 11 s at N = 1000 here), so N = 1000 runs once.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shutil
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits

from pydantic_ai_durable import DiskJournal, Durable, Encryption, Journal, MemoryJournal, execution


def _text(seed: int) -> str:
    rng = random.Random(seed)
    return ''.join(rng.choices('abcdefghij klmnop', k=rng.randint(200, 2000)))


TEXTS = [_text(seed) for seed in range(64)]
"""Tool results of 200-2,000 characters."""


def build_agent(steps: int, capabilities: list[Any], model_name: str = 'bench') -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # The answer depends only on the last message, and usage is reported like a real provider does
        # (a FunctionModel without usage would estimate tokens over the whole history at every step).
        last = messages[-1].parts[-1]
        done = int(last.tool_call_id.split('-')[1]) + 1 if isinstance(last, ToolReturnPart) else 0
        usage = RequestUsage(input_tokens=1000 + 500 * done, output_tokens=20)
        if done < steps:
            call = ToolCallPart('fetch', {'page': done}, tool_call_id=f'call-{done}')
            return ModelResponse(parts=[call], usage=usage)
        return ModelResponse(parts=[TextPart(f'read {done} pages')], usage=usage)

    def fetch(page: int) -> str:
        return TEXTS[page % len(TEXTS)]

    return Agent(
        FunctionModel(model, model_name=model_name),  # a priced name (gpt-4o) makes every response priced
        name='bench',
        toolsets=[FunctionToolset([fetch], id='pages')],
        capabilities=capabilities,
    )


LIMITS = UsageLimits(request_limit=None)


async def run_bare(steps: int) -> float:
    agent = build_agent(steps, [])
    start = time.perf_counter()
    await agent.run('go', usage_limits=LIMITS)
    return time.perf_counter() - start


class _PassThrough(Durable[None]):
    """`Durable` with no journaling at all: it opens no journal run, so every durable operation finds no active
    run and runs its body directly (what the layer costs around a step, without a journal)."""

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        return await handler()


async def run_layer_only(steps: int) -> float:
    agent = build_agent(steps, [_PassThrough(MemoryJournal())])
    start = time.perf_counter()
    async with execution(f'layer-{steps}', journal=MemoryJournal()) as handle:
        await agent.run('go', usage_limits=LIMITS)
    elapsed = time.perf_counter() - start
    if handle.stats.recorded or handle.stats.replayed:
        # The row would measure a journal, as it did when the hook above went stale after a refactor.
        raise SystemExit(f'"durable layer only" journaled steps ({handle.stats.summary()}): fix _PassThrough.')
    return elapsed


async def run_durable(steps: int, journal: Journal, key: str, *, cleanup: Any = 'keep') -> float:
    agent = build_agent(steps, [Durable(journal)])
    start = time.perf_counter()
    async with execution(key, cleanup=cleanup):
        await agent.run('go', usage_limits=LIMITS)
    return time.perf_counter() - start


def reference_available() -> bool:
    try:
        import airflow.providers.common.ai.durable  # type: ignore[import-not-found]  # noqa: F401
    except Exception:
        return False
    return True


async def median(samples: int, run: Callable[[int], Awaitable[float]]) -> float:
    return statistics.median([await run(i) for i in range(samples)])


async def memory_per_step(steps: int, run: Callable[[], Awaitable[float]]) -> float:
    gc.collect()
    tracemalloc.start()
    await run()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / steps


class CountingDiskJournal(DiskJournal):
    """A `DiskJournal` that counts how often a run's entries are read (PERF-3: once per resumed run)."""

    reads = 0

    async def read_run(self, key: str, run: str) -> Any:
        CountingDiskJournal.reads += 1
        return await super().read_run(key, run)


async def measure(steps: int, samples: int, root: Path) -> dict[str, float]:
    """Median wall time per configuration, every configuration run once per sample, in turn."""
    rows: dict[str, list[float]] = {
        'bare': [],
        'durable layer only': [],
        'memory (record)': [],
        'disk (record)': [],
        'disk (replay)': [],
        'disk, encrypted (record)': [],
        'disk, encrypted (replay)': [],
    }
    sealed = Encryption({'bench': bytes(range(32))})
    pg_dsn = os.environ.get('PYDANTIC_AI_DURABLE_PG_DSN')
    for sample in range(samples):  # interleaved, so drift hits every configuration alike
        rows['bare'].append(await run_bare(steps))
        rows['durable layer only'].append(await run_layer_only(steps))
        rows['memory (record)'].append(await run_durable(steps, MemoryJournal(), f'm{steps}-{sample}'))
        directory = root / f'disk-{steps}-{sample}'
        rows['disk (record)'].append(await run_durable(steps, DiskJournal(directory), 'bench'))
        rows['disk (replay)'].append(await run_durable(steps, DiskJournal(directory), 'bench'))
        shutil.rmtree(directory, ignore_errors=True)
        rows['disk, encrypted (record)'].append(
            await run_durable(steps, DiskJournal(directory, encryption=sealed), 'b')
        )
        rows['disk, encrypted (replay)'].append(
            await run_durable(steps, DiskJournal(directory, encryption=sealed), 'b')
        )
        shutil.rmtree(directory, ignore_errors=True)
        if pg_dsn:
            from pydantic_ai_durable.journals.postgres import PostgresJournal  # type: ignore[import-not-found]

            journal = PostgresJournal(pg_dsn)
            key = f'bench-{steps}-{sample}-{os.getpid()}'
            rows.setdefault('postgres (record)', []).append(await run_durable(steps, journal, key))
            rows.setdefault('postgres (replay)', []).append(await run_durable(steps, journal, key, cleanup='execution'))
    return {name: statistics.median(times) for name, times in rows.items()}


def added_per_step(medians: dict[str, float], name: str, steps: int) -> float:
    """Milliseconds a configuration adds to the bare agent per round trip."""
    return 1000 * (medians[name] - medians['bare']) / steps


def print_table(steps: int, medians: dict[str, float]) -> None:
    bare = medians['bare']
    for name, value in medians.items():
        ratio = f'{value / bare:5.2f}x  {added_per_step(medians, name, steps):+7.3f} ms/round trip'
        print(f'{steps:>5}  {name:<26} {value:9.3f}  {ratio}')
    if 'postgres (record)' not in medians:
        print(f'{steps:>5}  {"postgres":<20} {"":9}  not run: set PYDANTIC_AI_DURABLE_PG_DSN')
    if not reference_available():
        why = 'not run: apache-airflow-providers-common-ai is not importable'
        print(f'{steps:>5}  {"reference design":<20} {"":9}  {why}')


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='skip N = 1000')
    parser.add_argument('--samples', type=int, default=5, help='samples per configuration at N = 50 and 200')
    parser.add_argument('--smoke', action='store_true', help='N = 5, one sample, no targets: the script runs')
    args = parser.parse_args()
    sizes = [5] if args.smoke else [50, 200] if args.quick else [50, 200, 1000]
    if args.smoke:
        args.samples = 1
    root = Path(tempfile.mkdtemp(prefix='durable-bench-'))
    results: dict[int, dict[str, float]] = {}
    try:
        await run_bare(5)
        await run_durable(5, MemoryJournal(), 'warm-up')
        print(f'{"N":>5}  {"configuration":<20} {"median s":>9}  ratio to bare, added time')
        for steps in sizes:
            results[steps] = await measure(steps, args.samples if steps < 1000 else 1, root)
            print_table(steps, results[steps])

        steps = 5 if args.smoke else 200
        directory = root / 'mem'
        bare_mem = await memory_per_step(steps, lambda: run_bare(steps))
        disk_mem = await memory_per_step(steps, lambda: run_durable(steps, DiskJournal(directory), 'mem'))
        CountingDiskJournal.reads = 0
        replay_mem = await memory_per_step(steps, lambda: run_durable(steps, CountingDiskJournal(directory), 'mem'))
        print(
            f'\npeak memory per round trip at N={steps} (tracemalloc): bare {bare_mem / 1024:.1f} KiB, '
            f'disk record {disk_mem / 1024:.1f} KiB, disk replay {replay_mem / 1024:.1f} KiB'
        )

        if args.smoke:
            return
        at200 = results[200]
        record, replay = at200['disk (record)'] / at200['bare'], at200['disk (replay)'] / at200['bare']
        print('\nPERF targets of docs/rules.md (measured in this run):')
        print(f'  PERF-2 record on disk at N=200: {record:.2f}x bare (target <= 1.30x)')
        print(f'  PERF-2 replay from disk at N=200: {replay:.2f}x bare (target <= 1.20x)')
        if 1000 in results:
            small = added_per_step(at200, 'disk (record)', 200)
            large = added_per_step(results[1000], 'disk (record)', 1000)
            print(
                f'  PERF-2 added time per round trip, disk record: {small:.3f} ms at N=200, {large:.3f} ms at N=1000 '
                f'({100 * (large / small - 1):+.0f}%, target within 10%; one sample at N=1000)'
            )
        reads = CountingDiskJournal.reads
        print(f'  PERF-3 backend reads by the resumed run of {2 * steps + 1} steps: {reads} (target: one)')
        print(
            f'  PERF-3 memory the journal adds per round trip: {(disk_mem - bare_mem) / 1024:.1f} KiB recording, '
            f'{(replay_mem - bare_mem) / 1024:.1f} KiB replaying (target: one entry, not the history)'
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    asyncio.run(main())
