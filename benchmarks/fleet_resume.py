"""How long a killed worker's task takes to run again, with the queue idle and with a backlog (FL-3, FL-11).

For each engine (Celery on a private Redis, Procrastinate), each journal (disk, PostgreSQL) and each
queue (idle, or a backlog that keeps every slot busy), one run: worker A starts the fleet tests' agent
(`tests/fleet_agent.py`) and holds still inside its second tool; worker B starts; with a backlog, `--backlog`
more tasks of three tools of `--tool-seconds` each are queued behind it; then A is SIGKILLed (main process
and pool). Printed: the seconds from the kill to the task's second tool starting again, against the bound
docs/fleet.md gives (takeover, `resume_after`, one sweep round; with a backlog on Procrastinate, one
running task's length more, for a slot to free), and how many backlog tasks started first.

    python benchmarks/fleet_resume.py                          # both engines, both journals (~5 minutes)
    python benchmarks/fleet_resume.py --engines procrastinate --journals disk --queues backlog --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / 'tests'))

import fleet  # noqa: E402  (the fleet tests' helpers: Redis, workers, the effects log)

LEASE_TTL = 5.0
RESUME_AFTER = 5.0
PROMPT = 'victim'


class Case(fleet.Fleet):
    """One engine on one journal: the services, two workers, a client that sends tasks."""

    def __init__(self, engine: str, journal: str, root: Path, tool_seconds: float) -> None:
        super().__init__(engine, root, tool_seconds=tool_seconds, lease_ttl=LEASE_TTL, resume_after=RESUME_AFTER)
        schema = f'pad_resume_{int(time.time() * 1000)}'
        self.settings['FLEET_JOURNAL'] = (
            f'disk:{root / "journal"}' if journal == 'disk' else f'postgres:{schema}:{self.database}'
        )


def resume(engine: str, journal: str, backlog: int, tool_seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix='pad-resume-') as directory:
        case = Case(engine, journal, Path(directory), tool_seconds)
        try:
            first = case.start_worker()
            release = case.effects.hold(PROMPT, 'tool-2')
            case.send('fleet.research', PROMPT)
            case.effects.pid_at(PROMPT, 'tool', 2)
            case.start_worker()
            names = [f'backlog-{n}' for n in range(backlog)]
            for name in names:
                case.send('fleet.research', name)
            if backlog:  # the second worker's two slots and the first worker's free one are taken
                fleet.eventually('the backlog to fill every slot', lambda: case.effects.count(
                    what='body', phase='start') >= 4)  # fmt: skip
            first.kill()
            killed = time.time()
            release.unlink()

            def again() -> float | None:
                starts = [
                    line['at']
                    for line in case.effects.lines()
                    if line.get('prompt') == PROMPT
                    and (line['what'], line.get('n'), line['phase']) == ('tool', 2, 'start')
                ]
                return starts[1] if len(starts) > 1 else None

            resumed = float(fleet.eventually('the task to run again', again, within=600, every=0.1))
            ahead = {
                line['prompt']
                for line in case.effects.lines()
                if line['what'] == 'body' and line['prompt'] in names and killed < line['at'] < resumed
            }
            return {'seconds': resumed - killed, 'ahead': len(ahead)}
        finally:
            case.close()


def bound(engine: str, journal: str, backlog: int, tool_seconds: float) -> float:
    """docs/fleet.md's bound: takeover, `resume_after`, one round; with a backlog on Procrastinate, one task more."""
    takeover = LEASE_TTL if journal != 'disk' else 0.0
    slot = 3 * tool_seconds + 0.5 if backlog and engine == 'procrastinate' else 0.0
    return takeover + RESUME_AFTER + 1.2 * max(1.0, RESUME_AFTER / 3) + slot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--engines', default='celery,procrastinate')
    parser.add_argument('--journals', default='disk,postgres')
    parser.add_argument('--backlog', type=int, default=40, help='tasks queued behind the killed one (default 40)')
    parser.add_argument('--tool-seconds', type=float, default=1.0, help='each of the 3 tools of every task')
    parser.add_argument('--queues', default='idle,backlog', help='idle, backlog or both (default both)')
    parser.add_argument('--repeats', type=int, default=1)
    args = parser.parse_args()
    print(
        f'lease_ttl {LEASE_TTL:g} s, resume_after {RESUME_AFTER:g} s; 2 workers x 2 slots; backlog: '
        f'{args.backlog} tasks of 3 tools of {args.tool_seconds:g} s\n'
    )
    print('| engine | journal | queue | kill -> running again | bound | backlog tasks that started first |')
    print('|---|---|---|---|---|---|')
    for engine in args.engines.split(','):
        for journal in args.journals.split(','):
            for backlog in [0 if queue == 'idle' else args.backlog for queue in args.queues.split(',')]:
                for _ in range(args.repeats):
                    result = resume(engine, journal, backlog, args.tool_seconds)
                    queue = f'backlog of {backlog}' if backlog else 'idle'
                    ahead = f'{result["ahead"]:.0f} of {backlog}' if backlog else '-'
                    print(
                        f'| {engine} | {journal} | {queue} | {result["seconds"]:.1f} s '
                        f'| {bound(engine, journal, backlog, args.tool_seconds):.1f} s | {ahead} |',
                        flush=True,
                    )


if __name__ == '__main__':
    main()
