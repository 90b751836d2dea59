"""Many executions at once: N concurrent `execution()`s of one agent in one process, on one journal object.

The workload: one agent, 3 tool calls of 50 ms each (an `asyncio.sleep`, as an HTTP call would be) and
4 model requests, so 7 journaled steps per execution. Each configuration runs in a child process of its
own, so threads, descriptors and memory are its alone: the bare agent (no `Durable` at all), one
`DiskJournal`, one `PostgresJournal` on a throwaway server started with `max_connections=100` (the
default of a PostgreSQL server), and 4 processes of 250 executions each on that one server. One run
prints one table, with each journal's steps per second as a ratio to the bare agent of the same run.

    python benchmarks/concurrency.py            # N = 50, 200, 1000, and 4 x 250 on PostgreSQL (~5 minutes)
    python benchmarks/concurrency.py --quick    # N = 50 and 200 only
    python benchmarks/concurrency.py --n 1000 --configs bare,disk

Targets (issue 23): every execution succeeds; peak threads <= bare + 4; descriptors <= bare + 32;
PostgreSQL connections <= the pool bound (10) per process; RSS <= bare + 0.1 MB per execution;
steps/s at N = 1000 >= 0.6 x bare on disk and >= 0.5 x bare on PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEPS_PER_EXECUTION = 7
TOOL_CALLS = 3
POOL_BOUND = 10


# -- the child: one configuration, measured from inside --------------------------------------------


class Sampler:
    """Samples threads, descriptors, RSS and PostgreSQL connections every 20 ms; keeps the peaks."""

    def __init__(self, dsn: str | None, application: str | None) -> None:
        self.peak: Counter[str] = Counter()
        self._stop = threading.Event()
        self._dsn, self._application = dsn, application
        self._thread = threading.Thread(target=self._run, name='benchmark-sampler', daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn = None
        if self._dsn is not None:
            import psycopg

            conn = psycopg.connect(self._dsn, autocommit=True, application_name='benchmark-sampler')
        try:
            while not self._stop.is_set():
                self._sample(conn)
                self._stop.wait(0.02)
            self._sample(conn)
        finally:
            if conn is not None:
                conn.close()

    def _sample(self, conn: Any) -> None:
        # The sampler's own thread and connection are not the workload's.
        self._keep('threads', threading.active_count() - 1)
        self._keep('fds', len(os.listdir('/proc/self/fd')) - (1 if conn is None else 2))
        with open('/proc/self/status') as status:
            for line in status:
                if line.startswith('VmRSS:'):
                    self._keep('rss_kb', int(line.split()[1]))
        if conn is not None:
            row = conn.execute(
                'SELECT count(*) FROM pg_stat_activity WHERE application_name = %s', (self._application,)
            ).fetchone()
            self._keep('pg_connections', int(row[0]))

    def _keep(self, name: str, value: int) -> None:
        self.peak[name] = max(self.peak[name], value)


def build_agent(journaled: bool) -> Any:
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from pydantic_ai_durable import Durable

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(part, ToolReturnPart) for message in messages for part in message.parts)
        if done < TOOL_CALLS:
            return ModelResponse(parts=[ToolCallPart('fetch', {'page': done}, tool_call_id=f'call-{done}')])
        return ModelResponse(parts=[TextPart(f'read {done} pages')])

    async def fetch(page: int) -> str:
        await asyncio.sleep(0.05)
        return f'page {page}: ' + 'x' * 400

    return Agent(
        FunctionModel(model, model_name='bench'),
        name='bench',
        toolsets=[FunctionToolset([fetch], id='web')],
        capabilities=[Durable()] if journaled else [],
    )


async def child_main(config: dict[str, Any]) -> dict[str, Any]:
    from pydantic_ai_durable import DiskJournal, PostgresJournal, execution

    n, kind = config['n'], config['kind']
    journal: Any = None
    application = config.get('application')
    if kind == 'disk':
        journal = DiskJournal(config['path'])
    elif kind == 'postgres':
        journal = PostgresJournal(f'{config["dsn"]} application_name={application}', schema=config['schema'])
    agent = build_agent(journal is not None)
    prefix = config.get('prefix', 'bench')

    async def one(index: int) -> str:
        if journal is None:
            return (await agent.run('go')).output
        async with execution(f'{prefix}-{index}', journal=journal):
            return (await agent.run('go')).output

    with Sampler(config.get('dsn') if kind == 'postgres' else None, application) as sampler:
        started = time.perf_counter()
        results = await asyncio.gather(*(one(index) for index in range(n)), return_exceptions=True)
        seconds = time.perf_counter() - started
    if journal is not None:
        await journal.close()
    errors = Counter(type(result).__name__ for result in results if isinstance(result, BaseException))
    first_error = next((f'{result!r}'[:300] for result in results if isinstance(result, BaseException)), None)
    succeeded = sum(1 for result in results if result == 'read 3 pages')
    return {
        'succeeded': succeeded,
        'errors': dict(errors),
        'first_error': first_error,
        'seconds': seconds,
        'steps_per_second': succeeded * STEPS_PER_EXECUTION / seconds,
        **sampler.peak,
    }


# -- the parent: start the server, run the children, print the table -------------------------------


def run_child(config: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, '--child', json.dumps(config)], capture_output=True, text=True, timeout=1800
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{')]
    if proc.returncode != 0 or not lines:
        return {'succeeded': 0, 'errors': {'child failed': 1}, 'first_error': proc.stderr[-600:], 'stderr': 0}
    result: dict[str, Any] = json.loads(lines[-1])
    result['stderr'] = len([line for line in proc.stderr.splitlines() if line.strip()])
    return result


def start_server() -> tuple[Any, str]:
    sys.path.insert(0, str(HERE.parent / 'tests'))
    import pg

    binaries = pg._find_binaries()
    if binaries is None:
        raise SystemExit('PostgreSQL binaries (initdb, pg_ctl) are needed for the PostgreSQL rows.')
    server = pg._Server(binaries)
    return server, server.start(max_connections=100)


def row(name: str, n: int, result: dict[str, Any], bare: dict[str, Any] | None) -> str:
    ratio = ''
    if bare is not None and bare.get('steps_per_second'):
        ratio = f' ({result.get("steps_per_second", 0) / bare["steps_per_second"]:.2f}x)'
    errors = ', '.join(f'{count} {name}' for name, count in result.get('errors', {}).items())
    pg_connections = result.get('pg_connections')
    return (
        f'| {n} | {name} | {result.get("succeeded", 0)}{f" ({errors})" if errors else ""} '
        f'| {result.get("steps_per_second", 0):.0f}{ratio} | {result.get("threads", "-")} | {result.get("fds", "-")} '
        f'| {result.get("rss_kb", 0) / 1024:.0f} | {pg_connections if pg_connections is not None else "-"} '
        f'| {result.get("stderr", 0)} |'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--child', help=argparse.SUPPRESS)
    parser.add_argument('--quick', action='store_true', help='N = 50 and 200 only, no multi-process row')
    parser.add_argument('--n', default=None, help='comma-separated N (default 50,200,1000)')
    parser.add_argument('--configs', default='bare,disk,postgres', help='comma-separated: bare, disk, postgres')
    parser.add_argument('--processes', type=int, default=4, help='processes of the fleet row (0: none)')
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child_main(json.loads(args.child)))))
        return

    sizes = [int(n) for n in args.n.split(',')] if args.n else ([50, 200] if args.quick else [50, 200, 1000])
    configs = args.configs.split(',')
    server, dsn = (None, None)
    if 'postgres' in configs or (args.processes and not args.quick):
        server, dsn = start_server()
    print(f'pydantic-ai-durable concurrency benchmark, {os.cpu_count()} cores, Python {sys.version.split()[0]}')
    print(
        '| N | configuration | succeeded | steps/s (vs bare) | peak threads | peak fds | peak RSS MB '
        '| PG connections | stderr lines |'
    )
    print('|---|---|---|---|---|---|---|---|---|')
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for n in sizes:
                bare: dict[str, Any] | None = None
                for kind in configs:
                    config: dict[str, Any] = {'n': n, 'kind': kind}
                    if kind == 'disk':
                        config['path'] = str(Path(scratch) / f'disk-{n}')
                    if kind == 'postgres':
                        config.update(dsn=dsn, schema=f'bench_{n}', application=f'bench-{n}')
                    result = run_child(config)
                    if kind == 'bare':
                        bare = result
                    print(
                        row(
                            {'bare': 'bare', 'disk': 'one DiskJournal', 'postgres': 'one PostgresJournal'}[kind],
                            n,
                            result,
                            bare,
                        ),
                        flush=True,
                    )
                    if result.get('first_error'):
                        print(f'|   | first error: {result["first_error"]!r} |', flush=True)
            if args.processes and not args.quick and dsn is not None:
                fleet(args.processes, 250, dsn)
    finally:
        if server is not None:
            server.stop()


def fleet(processes: int, each: int, dsn: str) -> None:
    """`processes` processes of `each` executions at once on one PostgreSQL schema, and the bare agent alike."""
    results: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    for kind in ('bare', 'postgres'):
        configs = [
            {
                'n': each,
                'kind': kind,
                'dsn': dsn,
                'schema': 'bench_fleet',
                'application': f'fleet-{index}',
                'prefix': f'fleet-{index}',
            }
            for index in range(processes)
        ]
        started = time.perf_counter()
        with __import__('concurrent.futures').futures.ThreadPoolExecutor(processes) as pool:
            results[kind] = list(pool.map(run_child, configs))
        seconds[kind] = time.perf_counter() - started
    total: dict[str, dict[str, Any]] = {}
    for kind, outcomes in results.items():
        succeeded = sum(outcome.get('succeeded', 0) for outcome in outcomes)
        errors: Counter[str] = Counter()
        for outcome in outcomes:
            errors.update(outcome.get('errors', {}))
        total[kind] = {
            'succeeded': succeeded,
            'errors': dict(errors),
            'steps_per_second': succeeded * STEPS_PER_EXECUTION / max(o.get('seconds', 1e9) for o in outcomes),
            'threads': max(o.get('threads', 0) for o in outcomes),
            'fds': max(o.get('fds', 0) for o in outcomes),
            'rss_kb': max(o.get('rss_kb', 0) for o in outcomes),
            'stderr': sum(o.get('stderr', 0) for o in outcomes),
        }
        if kind == 'postgres':
            total[kind]['pg_connections'] = max(o.get('pg_connections', 0) for o in outcomes)
    name = f'{processes} processes x {each}'
    print(row(f'bare, {name}', processes * each, total['bare'], None), flush=True)
    print(
        row(f'PostgresJournal, {name} (per-process peaks)', processes * each, total['postgres'], total['bare']),
        flush=True,
    )


if __name__ == '__main__':
    main()
