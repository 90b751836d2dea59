"""What argument-matched replay (DV-2) adds to a run that never diverges: instructions, before and after.

    python benchmarks/argument_matching.py                 # N = 20, 3 runs per tree: about 6 minutes
    python benchmarks/argument_matching.py --base REV -n 50 -r 5 --gc on
    python benchmarks/argument_matching.py --base d027bf1 --phases replay --model-name gpt-4o   # X-4
    python benchmarks/argument_matching.py --base ffcca58 --phases record --bare   # what the package adds
    python benchmarks/argument_matching.py --base 2177a83 --encryption   # journals given keys (EN-1, EN-6)

A run that never diverges still pays for what DV-2 needs from every step: a second digest of each tool
call (name and arguments without the call id), two more fields in each tool entry (`call`, `origin`),
and a little bookkeeping per claim. This script measures that cost as CPU instructions, which a busy
machine does not change: it runs the same workload (`agent_overhead.build_agent`, N tool-call round trips)
under valgrind's callgrind, once with the package of this checkout and once with the package as it was
at `--base` (default: the last commit before DV-2), both in one run of this script, and prints the
instructions per round trip of each and their difference. `--encryption` gives both journals keys, so
the sealing of every value (and, after issue 46, of the fingerprints) is counted too. Only the measured
attempt is counted: the child process switches callgrind's instrumentation on right before it and off right after it
(`callgrind_control`), so imports and warm-up are left out, and garbage collection is off while it runs
(`--gc on` keeps it: a collection's cost depends on when allocations cross a threshold, which blurs the
figures). Identical code still differs a little between runs (call ids, timestamps and object addresses
change), so each tree runs several times, alternately, and the script prints the spread. Needs
`valgrind` and `git`.

Phases: "record" is a first attempt (every step runs live and is recorded); "replay" is a second attempt
of the same execution (every step replays). Neither diverges, so neither ever matches by arguments.
`--model-name` names the workload's model: the default is unknown to genai-prices, `gpt-4o` makes every
response priced (what X-4 saves on a replay). The script serves any change whose cost is wanted in
instructions: `--base` is any revision.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = '181b1e4'
"""The last commit before argument-matched replay (issue 25)."""
PHASES = ('record', 'replay')
JOURNALS = ('memory', 'disk')
GC_MODES = ('off', 'on')


def _toggle(state: str) -> None:
    subprocess.run(['callgrind_control', '-i', state, str(os.getpid())], check=True, capture_output=True)


async def _child(
    phase: str,
    journal_kind: str,
    steps: int,
    directory: Path,
    collect_garbage: bool,
    model_name: str,
    encrypted: bool = False,
) -> None:
    """Run one attempt (and the one before it, for a replay) with callgrind collecting only the measured one."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from agent_overhead import LIMITS, _PassThrough, build_agent  # pyright: ignore[reportPrivateUsage]

    import pydantic_ai_durable
    from pydantic_ai_durable import DiskJournal, Durable, Encryption, Journal, MemoryJournal, execution

    print(f'package: {Path(pydantic_ai_durable.__file__).parent}', file=sys.stderr)
    from typing import get_args

    try:
        from pydantic_ai_durable._core import CleanupMode
    except ImportError:  # a tree from before the journal core was named `_core`
        from pydantic_ai_durable._journal import CleanupMode  # type: ignore[no-redef]

    keep = 'keep' if 'keep' in get_args(CleanupMode) else 'never'  # what keeps a finished execution, then and now

    keys = Encryption({'bench': bytes(range(32))}) if encrypted else None

    def journal(name: str) -> Journal:
        if journal_kind == 'memory':
            return MemoryJournal(encryption=keys)
        return DiskJournal(directory / name, encryption=keys)

    async def attempt(target: Journal, key: str) -> None:
        if journal_kind == 'bare':  # the agent alone, measured the same way, so the package's share shows
            await build_agent(steps, [], model_name).run('go', usage_limits=LIMITS)
            return
        if journal_kind == 'layer':  # pydantic-ai's durable layer around each step, with no journal under it
            async with execution(key, journal=MemoryJournal(), cleanup=keep):
                await build_agent(steps, [_PassThrough(MemoryJournal())], model_name).run('go', usage_limits=LIMITS)
            return
        async with execution(key, journal=target, cleanup=keep):
            await build_agent(steps, [Durable()], model_name).run('go', usage_limits=LIMITS)

    await attempt(journal('warm'), 'warm-up')  # imports, encoders, caches: the same for both trees
    measured = journal('measured')
    if phase == 'replay':
        await attempt(measured, 'measured')
    gc.collect()
    if not collect_garbage:
        gc.disable()  # the direct cost only: a collection's cost depends on when allocations cross a threshold
    _toggle('on')
    await attempt(measured, 'measured')
    _toggle('off')


def _base_tree(revision: str, into: Path) -> Path:
    """The package as it was at `revision`, extracted with `git archive` (the repository is not touched)."""
    archive = subprocess.run(
        ['git', '-C', str(ROOT), 'archive', revision, 'pydantic_ai_durable'], check=True, capture_output=True
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(['tar', '-x', '-C', str(into)], input=archive, check=True)
    return into


def _instructions(
    tree: Path,
    phase: str,
    journal_kind: str,
    steps: int,
    directory: Path,
    gc_mode: str,
    model_name: str,
    encrypted: bool = False,
) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f'callgrind.{tree.name}.{phase}.{journal_kind}.{gc_mode}'
    env = {**os.environ, 'PYTHONPATH': str(tree), 'PYTHONHASHSEED': '0'}
    command = [
        'valgrind',
        '--tool=callgrind',
        '--instr-atstart=no',
        f'--callgrind-out-file={out}',
        sys.executable,
        __file__,
        '--child',
        phase,
        journal_kind,
        '-n',
        str(steps),
        '--dir',
        str(directory / f'{tree.name}-{phase}-{journal_kind}-{gc_mode}'),
        '--gc',
        gc_mode,
        '--model-name',
        model_name,
        *(['--encryption'] if encrypted else []),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f'the measured child failed:\n{result.stderr[-3000:]}')
    package = re.search(r'package: (\S+)', result.stderr)
    assert package is not None and Path(package[1]).is_relative_to(tree), f'imported the wrong package: {package}'
    totals = re.search(r'^totals: (\d+)', out.read_text(), re.MULTILINE)
    assert totals is not None, f'no totals in {out}'
    return int(totals[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--base', default=BASE, help='the revision to compare with (default: %(default)s)')
    parser.add_argument('-n', type=int, default=20, help='tool-call round trips per run (default: %(default)s)')
    parser.add_argument('-r', '--repeats', type=int, default=3, help='runs of each tree (default: %(default)s)')
    parser.add_argument('--gc', choices=GC_MODES, default='off', help='garbage collection while measuring')
    parser.add_argument('--phases', nargs='+', choices=PHASES, default=list(PHASES), help='phases to measure')
    parser.add_argument('--model-name', default='bench', help="the workload's model name (default: %(default)s)")
    parser.add_argument(
        '--bare',
        action='store_true',
        help='also measure the agent without the package, and print what the package adds per round trip',
    )
    parser.add_argument('--encryption', action='store_true', help='give the journals keys (both trees)')
    parser.add_argument('--child', nargs=2, metavar=('PHASE', 'JOURNAL'), help=argparse.SUPPRESS)
    parser.add_argument('--dir', type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(
            _child(args.child[0], args.child[1], args.n, args.dir, args.gc == 'on', args.model_name, args.encryption)
        )
        return
    with tempfile.TemporaryDirectory(prefix='argument-matching-') as tmp:
        directory = Path(tmp)
        trees = {f'base {args.base}': _base_tree(args.base, directory / 'base'), 'this checkout': ROOT}
        print(
            f'Instructions per round trip (callgrind; one model request + one tool call), N = {args.n}, '
            f'median of {args.repeats} runs per tree, run alternately; garbage collection {args.gc}; '
            f'model {args.model_name!r}; journals {"with" if args.encryption else "without"} keys. '
            '"spread" is max - min over the runs of one tree: identical code differs by that much from run '
            'to run (call ids, timestamps, object addresses).'
        )
        names = list(trees)
        bare = 0.0
        if args.bare:  # the agent alone does not depend on the tree
            counts = [
                _instructions(ROOT, 'record', 'bare', args.n, directory / f'bare-{n}', args.gc, args.model_name)
                for n in range(args.repeats)
            ]
            bare = statistics.median(counts) / args.n
            print(f'bare agent: {bare:,.0f} per round trip (spread {(max(counts) - min(counts)) / args.n:,.0f})')
            counts = [
                _instructions(ROOT, 'record', 'layer', args.n, directory / f'layer-{n}', args.gc, args.model_name)
                for n in range(args.repeats)
            ]
            layer = statistics.median(counts) / args.n - bare
            print(f"pydantic-ai's durable layer alone (this checkout's Durable, no journal): +{layer:,.0f} per step")
        header = f'{"phase":<7} {"journal":<7} ' + ' '.join(f'{name:>16} {"spread":>8}' for name in names)
        print(header + f' {"added":>16}' + ('  package adds: base -> this checkout' if args.bare else ''))
        for phase in args.phases:
            for journal_kind in JOURNALS:
                runs: dict[str, list[float]] = {name: [] for name in names}
                for repeat in range(args.repeats):
                    for name, tree in trees.items():
                        count = _instructions(
                            tree,
                            phase,
                            journal_kind,
                            args.n,
                            directory / str(repeat),
                            args.gc,
                            args.model_name,
                            args.encryption,
                        )
                        runs[name].append(count / args.n)
                medians = [statistics.median(runs[name]) for name in names]
                spreads = [max(runs[name]) - min(runs[name]) for name in names]
                added = medians[1] - medians[0]
                print(
                    f'{phase:<7} {journal_kind:<7} '
                    + ' '.join(
                        f'{median:>16,.0f} {spread:>8,.0f}' for median, spread in zip(medians, spreads, strict=True)
                    )
                    + f' {added:>+8,.0f} {added / medians[0]:>+7.2%}'
                    + (_package_share(medians, bare) if args.bare else ''),
                    flush=True,
                )


def _package_share(medians: list[float], bare: float) -> str:
    """What the package adds per round trip over the bare agent in each tree, and how much that changed."""
    before, after = medians[0] - bare, medians[1] - bare
    return f'  {before:,.0f} -> {after:,.0f} ({(after - before) / before:+.1%})'


if __name__ == '__main__':
    main()
