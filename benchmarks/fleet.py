"""A fleet: N tasks of a durable agent through 2 real workers, against the same tasks with no journal.

The workload is the fleet tests' agent (`tests/fleet_agent.py`): 4 model requests and 3 tool calls of
`--tool-seconds` each, so 7 journaled steps per task. For each engine (Celery on a private Redis, 2 prefork
workers x 2 processes; Procrastinate, 2 workers x 2 jobs at once) and each journal (disk, PostgreSQL,
PostgreSQL through PgBouncer in transaction mode), one run prints:

- tasks per second with `durable_task` / `durable_job` against the same app's plain task with no journal
  (best of `--rounds` interleaved rounds; target >= 0.85x);
- the peak of PostgreSQL server connections while the durable tasks ran, and per worker process the
  connections the journal added to what the workers held before any journal was used (the queue's own,
  for Procrastinate);
- with `--kills`, a second batch of N tasks during which whole workers are SIGKILLed at random and
  replaced, and the time from the last kill to the last task done, against the recovery bound the
  configuration promises (docs/fleet.md).

    python benchmarks/fleet.py                       # N = 200, both engines, every journal (~6 minutes)
    python benchmarks/fleet.py --n 20 --engines celery --journals disk --kills 0
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / 'tests'))

import fleet  # noqa: E402  (the fleet tests' helpers: Redis, workers, the effects log)
import pg  # noqa: E402

LEASE_TTL = 5.0
RESUME_AFTER = 5.0


class Run(fleet.Fleet):
    """One engine on one journal: the services, the workers, and a client that sends tasks."""

    def __init__(self, engine: str, journal: str, root: Path, tool_seconds: float) -> None:
        super().__init__(engine, root, tool_seconds=tool_seconds, lease_ttl=LEASE_TTL, resume_after=RESUME_AFTER)
        self.journal_kind = journal
        if journal == 'disk':
            self.settings['FLEET_JOURNAL'] = f'disk:{root / "journal"}'
        else:
            dsn = self.database if journal == 'postgres' else _through_bouncer(self.database)
            self.settings['FLEET_JOURNAL'] = f'postgres:pad_bench:{dsn}'

    def finished_at(self, prompts: set[str]) -> dict[str, float]:
        at: dict[str, float] = {}
        for line in self.effects.lines():
            if line['what'] == 'finished' and line.get('prompt') in prompts:
                at[line['prompt']] = max(at.get(line['prompt'], 0.0), line['at'])
        return at

    def processes(self) -> int:
        alive = [worker for worker in self.workers if worker.process and worker.process.poll() is None]
        return sum(1 + len(worker.children()) for worker in alive)


def _through_bouncer(database: str) -> str:
    """The same database through the test PgBouncer (transaction mode), which serves any database name."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    bouncer = conninfo_to_dict(pg.pgbouncer_dsn())
    return make_conninfo(database, host=bouncer['host'], port=bouncer['port'])


class ConnectionSampler:
    """Samples the server's client connections (besides its own) every 50 ms while a batch runs."""

    def __init__(self) -> None:
        import psycopg

        self.conn = psycopg.connect(pg.server_dsn(), autocommit=True)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            row = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                'AND pid <> pg_backend_pid()'
            ).fetchone()
            self.peak = max(self.peak, int(row[0]) if row else 0)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.conn.close()


def batch(run: Run, task: str, prompts: list[str], *, during: Callable[[], None] | None = None) -> tuple[float, float]:
    """Send every prompt, wait for all to finish; return (tasks per second, the last task's end, epoch)."""
    wanted = set(prompts)
    started = time.time()
    for prompt in prompts:
        run.send(task, prompt)
    if during is not None:
        during()
    fleet.eventually(f'{len(prompts)} {task} tasks to finish', lambda: len(run.finished_at(wanted)) == len(wanted),
                     within=900, every=0.5)  # fmt: skip
    last = max(run.finished_at(wanted).values())
    return len(prompts) / (last - started), last


def measure(engine: str, journal: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix='pad-fleet-') as directory:
        run = Run(engine, journal, Path(directory), args.tool_seconds)
        try:
            run.start_worker()
            run.start_worker()
            with ConnectionSampler() as sampler:  # what the workers hold before any journal is used
                batch(run, 'fleet.plain', [f'warm-plain-{n}' for n in range(8)])
            before_journal = sampler.peak
            batch(run, 'fleet.research', [f'warm-durable-{n}' for n in range(8)])
            plain: list[float] = []
            durable: list[float] = []
            peak = 0
            for round_ in range(args.rounds):
                plain.append(batch(run, 'fleet.plain', [f'plain-{round_}-{n}' for n in range(args.n)])[0])
                with ConnectionSampler() as sampler:
                    durable.append(batch(run, 'fleet.research', [f'durable-{round_}-{n}' for n in range(args.n)])[0])
                peak = max(peak, sampler.peak)
            result: dict[str, Any] = {
                'plain': max(plain),
                'durable': max(durable),
                'processes': run.processes(),
                'connections': peak,
                'before_journal': before_journal,
            }
            if args.kills:
                result.update(recovery(run, args))
            return result
        finally:
            run.close()


def recovery(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """N more tasks; `--kills` whole workers SIGKILLed at random moments and replaced at once."""
    chance = random.Random(7)
    prompts = [f'killed-{n}' for n in range(args.n)]
    last_kill = [0.0]
    ends = {'tool': 0}

    def kill() -> None:
        for _ in range(args.kills):
            time.sleep(chance.uniform(0.5, 2.0))
            alive = [worker for worker in run.workers if worker.process and worker.process.poll() is None]
            victim = chance.choice(alive)
            victim.kill()
            last_kill[0] = time.time()
            run.start_worker()
        ends['tool'] = run.effects.count(what='tool', phase='end')

    _, last = batch(run, 'fleet.research', prompts, during=kill)
    tool_ends = run.effects.ends()
    repeated = sum(count - 1 for (prompt, _), count in tool_ends.items() if prompt.startswith('killed-'))
    # A batch that ended before the last kill (it hit idle workers) was delayed by nothing: 0.
    return {'kills': args.kills, 'kill_to_done': max(0.0, last - last_kill[0]), 'repeated_tool_ends': repeated}


def bound(engine: str, journal: str) -> float:
    """The recovery bound of docs/fleet.md: takeover, then idle, then one sweep round, then the task."""
    takeover = LEASE_TTL if journal != 'disk' else 0.0
    sweep_round = 1.2 * max(1.0, RESUME_AFTER / 3)
    return takeover + RESUME_AFTER + sweep_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--n', type=int, default=200, help='tasks per batch (default 200)')
    parser.add_argument('--rounds', type=int, default=2, help='interleaved plain/durable rounds; the best counts')
    parser.add_argument('--engines', default='celery,procrastinate')
    parser.add_argument('--journals', default='disk,postgres,pgbouncer')
    parser.add_argument('--kills', type=int, default=6, help='workers SIGKILLed during the recovery batch (0: none)')
    parser.add_argument('--tool-seconds', type=float, default=0.05)
    parser.add_argument('--json', action='store_true', help='also print each result as a JSON line')
    args = parser.parse_args()
    print(
        f'N = {args.n} tasks of 7 steps (tools of {args.tool_seconds * 1000:.0f} ms), 2 workers; '
        f'lease_ttl {LEASE_TTL:g} s, resume_after {RESUME_AFTER:g} s\n'
    )
    print(
        '| engine | journal | plain tasks/s | durable tasks/s | ratio | processes '
        '| PG connections (journal per process) | kills | last kill -> last done | bound | tool ends repeated |'
    )
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for engine in args.engines.split(','):
        for journal in args.journals.split(','):
            result = measure(engine, journal, args)
            journal_connections = result['connections'] - result['before_journal']
            per = f'{result["connections"]} ({journal_connections / result["processes"]:.1f})'
            recovered = (
                f'| {result["kills"]} | {result["kill_to_done"]:.1f} s | {bound(engine, journal):.1f} s '
                f'| {result["repeated_tool_ends"]} |'
                if 'kills' in result
                else '| - | - | - | - |'
            )
            print(
                f'| {engine} | {journal} | {result["plain"]:.1f} | {result["durable"]:.1f} '
                f'| {result["durable"] / result["plain"]:.2f}x | {result["processes"]} | {per} {recovered}',
                flush=True,
            )
            if args.json:
                print(json.dumps({'engine': engine, 'journal': journal, **result}), flush=True)


if __name__ == '__main__':
    main()
