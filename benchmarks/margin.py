"""The cost of one more round trip: what the package adds at the margin, in instructions and in CPU time (issue 51).

    python benchmarks/margin.py                     # callgrind at N = 1, 20, 200; CPU time at 20, 200, 1000
    python benchmarks/margin.py --callgrind 1 20 200 1000 --cpu 20 200 1000 --rounds 3
    python benchmarks/margin.py --cpu --rounds 1    # instructions only (no CPU-time sizes)
    python benchmarks/margin.py --base 6966c29      # the package as it was at a revision (before/after)
    python benchmarks/margin.py --ceiling 5 25      # only what memory recording adds per round trip (the test's)

A long agent run pays an execution's fixed costs (binding the agent's durable copy, entering the execution,
the first reads) once; what it pays for every further step is the margin, (cost(N = 200) - cost(N = 20)) /
180. This script measures it for the bare agent, for pydantic-ai's `BaseDurabilityCapability` with a
pass-through backend and no journal (the floor: what pydantic-ai's durable layer costs before any journal),
and for the package on `MemoryJournal` and `DiskJournal`, recording and replaying, with the workload of
`agent_overhead.py` (a `FunctionModel` calling one tool N times, usage reported as a provider does, tool
results of 200-2,000 characters). Each figure is one measured agent run in a child process of its own,
after a short warm-up run there (imports, encoders, caches); a replay is measured after its recording.

Instructions are counted under valgrind's callgrind, which a busy machine does not change: the child
switches instrumentation on right before the measured run and off right after it, with garbage collection
off while it runs (a collection's cost depends on when allocations cross a threshold, which blurs
instruction counts). CPU time is `time.process_time()` of the measured run with garbage collection on, as
a real run has it, in alternated rounds (every configuration once per round), medians. It prints, for each
configuration, the margin, its ratio to the bare agent's margin, what the configuration adds per round trip
at N = 20 (fixed costs included) against what it adds at the margin, the margin between N = 200 and
N = 1,000 when measured, the fixed cost of an execution of one round trip (N = 1) against the bare agent's
run of one round trip, and the targets of issue 51 beside the figures. Needs `valgrind` for instructions.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CONFIGS = ('bare', 'floor', 'memory-record', 'memory-replay', 'disk-record', 'disk-replay')
LABELS = {
    'bare': 'bare agent',
    'floor': "pydantic-ai's durable layer, pass-through",
    'memory-record': 'MemoryJournal, recording',
    'memory-replay': 'MemoryJournal, replaying',
    'disk-record': 'DiskJournal, recording',
    'disk-replay': 'DiskJournal, replaying',
}
INSTRUCTION_TARGETS = {'disk-record': 1.09, 'memory-record': 1.08, 'disk-replay': 1.07}
"""Issue 51: instructions per extra round trip, as a ratio to the bare agent's, at most."""
CPU_TARGETS = {'disk-record': 1.20, 'memory-record': 1.12}
CEILING_CONFIGS = ('bare', 'memory-record')
"""What `--ceiling` measures: the package's instructions per extra round trip, recording on memory."""
"""Issue 51: CPU time per extra round trip, as a ratio to the bare agent's, at most."""
WARM_UP = 3
"""Round trips of the warm-up run each child makes before the measured one."""


# -- the child: one measured run ------------------------------------------------------------------------


def _floor_capability() -> Any:
    """pydantic-ai's `BaseDurabilityCapability` with a backend that runs every durable unit's body directly.

    What pydantic-ai's durable layer costs around each step (operation binding, naming, the JSON codec's
    encode and decode of every result) before any journal is involved: no engine can go below it.
    """
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        DurabilityEngineSpec,
        JournalCallableOperationBackend,
        RoleBasedOperationConfig,
    )

    class PassThroughBackend(JournalCallableOperationBackend[None]):
        async def execute(self, *, operation_id: Any, name: str, body: Any, cache_key: Any, config: Any) -> object:
            return await body()

    class Floor(BaseDurabilityCapability[None]):
        engine_spec = DurabilityEngineSpec(
            engine_name='floor', durable_unit_noun='step', durable_container_noun='run', codec=JSON_CODEC
        )

        @property
        def in_durable_context(self) -> bool:
            return True

        def get_durable_operation_backend(self) -> PassThroughBackend:
            backend = self.__dict__.get('_pass_through')
            if backend is None:
                config = RoleBasedOperationConfig[None](model=None, event=None, capability=None, tool=None)
                backend = self.__dict__['_pass_through'] = PassThroughBackend(
                    agent_name=self.name, default_model_id=self.default_model_id, config=config
                )
            return backend

    return Floor()


def _attempts(config: str, directory: Path) -> Callable[[int, str], Awaitable[None]]:
    """One agent run of `config` with `n` round trips, under execution `key` where it journals."""
    sys.path.insert(0, str(HERE))
    from agent_overhead import LIMITS, build_agent

    from pydantic_ai_durable import DiskJournal, Durable, Journal, MemoryJournal, execution

    memory = MemoryJournal()

    def journal(name: str) -> Journal:
        return memory if config.startswith('memory') else DiskJournal(directory / name)

    async def attempt(n: int, key: str) -> None:
        if config == 'bare':
            await build_agent(n, []).run('go', usage_limits=LIMITS)
        elif config == 'floor':
            await build_agent(n, [_floor_capability()]).run('go', usage_limits=LIMITS)
        else:
            async with execution(key, journal=journal(key), cleanup='keep'):
                await build_agent(n, [Durable()]).run('go', usage_limits=LIMITS)

    return attempt


def _announce_package() -> None:
    import pydantic_ai_durable

    print(f'package: {Path(pydantic_ai_durable.__file__).parent}', file=sys.stderr)


async def _child(config: str, steps: int, directory: Path, measure: str) -> None:
    _announce_package()
    attempt = _attempts(config, directory)
    await attempt(WARM_UP, 'warm-up')
    if config.endswith('replay'):
        await attempt(steps, 'measured')  # the recording the measured run replays
    gc.collect()
    if measure == 'callgrind':
        gc.disable()
        _toggle('on')
        await attempt(steps, 'measured')
        _toggle('off')
        return
    started, wall = time.process_time(), time.perf_counter()
    await attempt(steps, 'measured')
    print(json.dumps({'cpu': time.process_time() - started, 'wall': time.perf_counter() - wall}))


async def _ceiling_child(small: int, large: int, directory: Path) -> None:
    """The bare agent and memory recording at two sizes in one process, each measured run dumped on its own."""
    _announce_package()
    for config in CEILING_CONFIGS:
        attempt = _attempts(config, directory)
        await attempt(WARM_UP, 'warm-up')
        for steps in (small, large):
            gc.collect()
            gc.disable()
            _toggle('on')
            await attempt(steps, f'measured-{steps}')
            _toggle('off')
            gc.enable()
            subprocess.run(
                ['callgrind_control', '-d', f'{config}-{steps}', str(os.getpid())], check=True, capture_output=True
            )


def _toggle(state: str) -> None:
    subprocess.run(['callgrind_control', '-i', state, str(os.getpid())], check=True, capture_output=True)


def _dump(label: str) -> None:
    """Write the counts since the last dump to a file of their own, labelled, and start counting from zero."""
    subprocess.run(['callgrind_control', '-d', label, str(os.getpid())], check=True, capture_output=True)


# -- the parent: rounds, medians, margins ---------------------------------------------------------------


def _child_env(package: Path) -> dict[str, str]:
    """The measured child's environment: the package under test, a fixed hash seed, and the fingerprint
    equality switch off (CI sets it for the tests; on, every model fingerprint is computed twice, about
    three times what recording adds, which would be measured as the package's cost)."""
    env = {**os.environ, 'PYTHONPATH': str(package), 'PYTHONHASHSEED': '0'}
    env.pop('PYDANTIC_AI_DURABLE_VERIFY_FINGERPRINTS', None)
    return env


def _callgrind(out: Path) -> list[str]:
    """valgrind's callgrind, counting only while the child switches instrumentation on, writing to `out`."""
    return ['valgrind', '--tool=callgrind', '--instr-atstart=no', f'--callgrind-out-file={out}']


def _run_child(package: Path, config: str, steps: int, directory: Path, measure: str) -> float:
    """One measured run: its instructions (callgrind) or its CPU seconds."""
    directory.mkdir(parents=True, exist_ok=True)
    env = _child_env(package)
    command = [sys.executable, __file__, '--child', config, str(steps), str(directory), measure]
    out = directory / 'callgrind.out'
    if measure == 'callgrind':
        command = [*_callgrind(out), *command]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f'the measured child ({config}, N = {steps}) failed:\n{result.stderr[-3000:]}')
    imported = re.search(r'package: (\S+)', result.stderr)
    assert imported is not None and Path(imported[1]).is_relative_to(package), f'imported the wrong package: {imported}'
    if measure == 'callgrind':
        totals = re.search(r'^totals: (\d+)', out.read_text(), re.MULTILINE)
        assert totals is not None, f'no totals in {out}'
        shutil.rmtree(directory, ignore_errors=True)
        return float(totals[1])
    shutil.rmtree(directory, ignore_errors=True)
    return float(json.loads(result.stdout.strip().splitlines()[-1])['cpu'])


def _measure(
    package: Path, configs: list[str], sizes: list[int], rounds: int, measure: str, root: Path
) -> dict[tuple[str, int], float]:
    """Medians over alternated rounds: every configuration and size once per round, in turn."""
    samples: dict[tuple[str, int], list[float]] = {}
    for round_ in range(rounds):
        for steps in sizes:
            for config in configs:
                value = _run_child(package, config, steps, root / f'{measure}-{round_}-{config}-{steps}', measure)
                samples.setdefault((config, steps), []).append(value)
                print(f'  round {round_ + 1}, N = {steps:>4}, {config:<14} {value:,.4f}', file=sys.stderr, flush=True)
    return {key: statistics.median(values) for key, values in samples.items()}


def _report(title: str, medians: dict[tuple[str, int], float], configs: list[str], unit: str, scale: float) -> None:
    """Print each configuration's margin, its ratio to bare, and how it compares with N = 20 and N = 1,000."""
    sizes = sorted({steps for _, steps in medians})

    def cost(config: str, steps: int) -> float:
        return medians[(config, steps)] / scale

    print(f'\n{title}')
    if 20 not in sizes or 200 not in sizes:
        print('  (the margin needs N = 20 and N = 200)')
        return
    bare_margin = (cost('bare', 200) - cost('bare', 20)) / 180
    header = (
        f'  {"configuration":<42} {"per extra round trip":>20} {"ratio":>7} {"adds at margin":>15} '
        f'{"adds at N=20":>13} {"margin 200->1000 adds":>22} {"target":>8}'
    )
    print(header)
    targets = INSTRUCTION_TARGETS if unit == 'M' else CPU_TARGETS
    for config in configs:
        margin = (cost(config, 200) - cost(config, 20)) / 180
        adds = margin - bare_margin
        at20 = (cost(config, 20) - cost('bare', 20)) / 20
        far = ''
        if 1000 in sizes:
            far_margin = (cost(config, 1000) - cost(config, 200)) / 800
            far_adds = far_margin - (cost('bare', 1000) - cost('bare', 200)) / 800
            change = f' ({far_adds / adds - 1:+.0%})' if config != 'bare' and adds else ''
            far = f'{far_adds:,.3f}{change}'
        target = f'<= {targets[config]:.2f}x' if config in targets else ''
        print(
            f'  {LABELS[config]:<42} {margin:>17,.3f} {unit:<2} {margin / bare_margin:>6.3f}x {adds:>+15,.3f}'
            f' {at20:>+13,.3f} {far:>22} {target:>8}'
        )
    if 1 in sizes:
        for config in configs:
            if config != 'bare':
                fixed = cost(config, 1) - cost('bare', 1)
                print(f'  fixed cost, one round trip, {LABELS[config]}: {fixed:+,.3f} {unit} over the bare run of one')
    print(
        '  targets (issue 51): what recording adds at the margin no more than at N = 20, fixed costs included; '
        'the margin from N = 200 to 1,000 within 10% of the margin from 20 to 200'
    )


def quick_margin(small: int, large: int, package: Path = ROOT) -> dict[str, float]:
    """What recording on `MemoryJournal` adds per extra round trip between N = `small` and `large`, in instructions.

    One child under callgrind runs the bare agent and the recording one at both sizes (so it pays valgrind's
    start once) and dumps the count of each measured run; what the package adds is the recording margin
    less the bare margin. Small sizes keep it within a test's budget (tests/test_benchmarks.py).
    """
    with tempfile.TemporaryDirectory(prefix='margin-ceiling-') as tmp:
        out = Path(tmp) / 'callgrind.out'
        env = _child_env(package)
        command = [*_callgrind(out), sys.executable, __file__, '--ceiling-child', str(small), str(large), tmp]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f'the measured child failed:\n{result.stderr[-3000:]}')
        counts: dict[str, float] = {}
        for dump in Path(tmp).glob('callgrind.out.*'):
            text = dump.read_text()
            label = re.search(r'^desc: Trigger: dump (\S+)', text, re.MULTILINE)
            totals = re.search(r'^totals: (\d+)', text, re.MULTILINE)
            if label is not None and totals is not None:
                counts[label[1]] = float(totals[1])
    per = {
        config: (counts[f'{config}-{large}'] - counts[f'{config}-{small}']) / (large - small)
        for config in CEILING_CONFIGS
    }
    return {**per, 'adds': per['memory-record'] - per['bare']}


def _package_tree(revision: str | None, into: Path) -> Path:
    """This checkout, or the package as it was at `revision` (extracted as `argument_matching.py` does)."""
    if revision is None:
        return ROOT
    sys.path.insert(0, str(HERE))
    from argument_matching import _base_tree

    return _base_tree(revision, into)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--callgrind', nargs='*', type=int, default=[1, 20, 200], help='sizes counted in instructions')
    parser.add_argument('--cpu', nargs='*', type=int, default=[20, 200, 1000], help='sizes timed in CPU time')
    parser.add_argument('--rounds', type=int, default=3, help='alternated rounds (default: %(default)s)')
    parser.add_argument('--configs', nargs='+', choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument('--base', help='measure the package as it was at this revision instead of this checkout')
    parser.add_argument(
        '--ceiling',
        nargs=2,
        type=int,
        metavar=('SMALL', 'LARGE'),
        help='only what memory recording adds per extra round trip from N = SMALL to LARGE (instructions, one child)',
    )
    parser.add_argument('--child', nargs=4, help=argparse.SUPPRESS)
    parser.add_argument('--ceiling-child', nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        config, steps, directory, measure = args.child
        asyncio.run(_child(config, int(steps), Path(directory), measure))
        return
    if args.ceiling_child:
        small, large, directory = args.ceiling_child
        asyncio.run(_ceiling_child(int(small), int(large), Path(directory)))
        return
    if args.ceiling:
        if shutil.which('valgrind') is None:
            raise SystemExit('valgrind is not installed: --ceiling counts instructions under callgrind.')
        small, large = args.ceiling
        with tempfile.TemporaryDirectory(prefix='margin-') as tmp:
            figures = quick_margin(small, large, _package_tree(args.base, Path(tmp) / 'base'))
        bare, recording = figures['bare'] / 1e6, figures['memory-record'] / 1e6
        print(
            f'MemoryJournal recording adds {figures["adds"] / 1e6:,.3f} M instructions per extra round trip '
            f'(N = {small} to {large}; bare {bare:,.3f} M, recording {recording:,.3f} M)'
        )
        print(json.dumps(figures))
        return
    configs = args.configs if 'bare' in args.configs else ['bare', *args.configs]
    with tempfile.TemporaryDirectory(prefix='margin-') as tmp:
        root = Path(tmp)
        package = _package_tree(args.base, root / 'base')
        print(
            f'package: {args.base or "this checkout"}; {os.cpu_count()} CPUs, load average '
            f'{" ".join(f"{load:.1f}" for load in os.getloadavg())} at the start'
        )
        if args.callgrind:
            if shutil.which('valgrind') is None:
                raise SystemExit('valgrind is not installed: pass --callgrind with no sizes to time CPU only.')
            counts = _measure(package, configs, sorted(args.callgrind), args.rounds, 'callgrind', root)
            _report(
                f'Instructions (callgrind, garbage collection off), millions, medians of {args.rounds} rounds',
                counts,
                configs,
                'M',
                1e6,
            )
        if args.cpu:
            times = _measure(package, configs, sorted(args.cpu), args.rounds, 'cpu', root)
            _report(
                f'CPU time (process_time, garbage collection on), milliseconds, medians of {args.rounds} rounds',
                times,
                configs,
                'ms',
                1e-3,
            )
        print(f'load average at the end: {" ".join(f"{load:.1f}" for load in os.getloadavg())}')


if __name__ == '__main__':
    main()
