"""Real parts for the fleet tests: a Redis server, Celery and Procrastinate workers, and the effects log.

Everything is started by the tests themselves from what `.ci/run` installs (Debian's `redis-server`, the
`celery` and `procrastinate` packages), on private ports and in temporary directories, and killed with
SIGKILL where a test says so. Nothing here times anything: tests wait for counts, with a generous
deadline that only turns a hang into a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pg import in_ci, server_dsn

TESTS = Path(__file__).resolve().parent

__all__ = [
    'TESTS',
    'Effects',
    'Fleet',
    'Redis',
    'Worker',
    'celery_worker',
    'eventually',
    'execution_states',
    'procrastinate_worker',
    'queue_client',
    'queue_database',
    'redis_server',
    'worker_env',
    'worker_logs',
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(('127.0.0.1', 0))
        return int(probe.getsockname()[1])


def eventually(what: str, check: Callable[[], Any], *, within: float = 120.0, every: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f'gave up waiting for {what} after {within:g} s')
        time.sleep(every)


class Redis:
    """A `redis-server` on a free port of 127.0.0.1, without persistence."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.url = f'redis://127.0.0.1:{self.port}/0'
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Redis:
        binary = shutil.which('redis-server')
        if binary is None:
            message = 'The fleet tests need redis-server (Debian package redis-server).'
            if in_ci():
                pytest.fail(f'{message} (CI=true: not skipping)', pytrace=False)
            pytest.skip(message)
        self.root.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                '--port',
                str(self.port),
                '--bind',
                '127.0.0.1',
                '--save',
                '',
                '--appendonly',
                'no',
                '--dir',
                str(self.root),
                '--protected-mode',
                'no',
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(port=self.port)
        eventually('redis-server to answer', lambda: _pings(client), within=30)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


@contextlib.contextmanager
def redis_server(root: Path) -> Iterator[Redis]:
    server = Redis(root).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Worker:
    """One worker process started in a session of its own, so the whole of it (children too) can be killed."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    ready_text: str
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open('ab') as out:
            self.process = subprocess.Popen(
                self.command, cwd=TESTS, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        eventually(f'worker {self.name} to be ready', self._ready, within=90)
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f'worker {self.name} exited with {self.process.returncode}:\n{self.tail()}')
        return self.ready_text in self.log.read_text(errors='replace')

    def tail(self, lines: int = 60) -> str:
        return '\n'.join(self.log.read_text(errors='replace').splitlines()[-lines:]) if self.log.exists() else ''

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        """The pool processes of a prefork worker (the main process's children)."""
        found: list[int] = []
        for task in Path(f'/proc/{self.pid}/task').glob('*'):
            with contextlib.suppress(OSError):
                found += [int(pid) for pid in (task / 'children').read_text().split()]
        return found

    def kill(self) -> None:
        """SIGKILL the whole worker: its main process and every child, at once."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """A warm shutdown (SIGTERM), then SIGKILL for whatever is left."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # pool processes a killed main process left behind


def celery_worker(name: str, env: dict[str, str], root: Path, *, concurrency: int = 2, pool: str = 'prefork') -> Worker:
    command = [
        sys.executable, '-m', 'celery', '-A', 'fleet_celery_app', 'worker',
        '-P', pool, '-c', str(concurrency), '-n', f'{name}@%h', '-O', 'fair',
        '--without-gossip', '--without-mingle', '--without-heartbeat', '--loglevel', 'INFO',
    ]  # fmt: skip
    return Worker(name, command, env, root / f'{name}.log', ready_text=' ready.')


def procrastinate_worker(name: str, env: dict[str, str], root: Path) -> Worker:
    command = [sys.executable, '-c', 'import fleet_procrastinate_app; fleet_procrastinate_app.run()']
    return Worker(
        name, command, {**env, 'FLEET_WORKER_NAME': name}, root / f'{name}.log', ready_text='fleet worker ready'
    )


def queue_database(dsn: str) -> str:
    """A new database on the test server with Procrastinate's schema in it; returns its DSN."""
    import uuid

    import procrastinate
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f'pad_queue_{uuid.uuid4().hex[:12]}'
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL('CREATE DATABASE {}').format(sql.Identifier(name)))
    queue_dsn = make_conninfo(dsn, dbname=name)
    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=queue_dsn))
    with app.open():
        app.schema_manager.apply_schema()
    return queue_dsn


def queue_client(dsn: str) -> Any:
    """An open Procrastinate app that defers jobs to the queue at `dsn` (made here, not in a `__main__`)."""
    import procrastinate

    client = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=dsn))
    client.open()
    return client


def worker_logs(workers: list[Worker]) -> str:
    """The end of each worker's log, for a failure message."""
    return '\n\n'.join(f'--- {worker.name}\n{worker.tail(80)}' for worker in workers)


def execution_states(journal_setting: str) -> dict[str, str]:
    """Each execution's state in the journal a `FLEET_JOURNAL` setting names, read from the test process."""
    import asyncio

    from fleet_agent import journal_from_setting

    async def read() -> dict[str, str]:
        journal = journal_from_setting(journal_setting)
        try:
            return {info.key: info.state for info in await journal.list_executions()}
        finally:
            await journal.close()

    return asyncio.run(read())


def worker_env(**settings: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(('FLEET_', 'CELERY_'))}
    env['PYTHONPATH'] = os.pathsep.join([str(TESTS), *filter(None, [os.environ.get('PYTHONPATH')])])
    env.update(settings)
    return env


class Effects:
    """The effects log: one JSON line per model request and tool body start and end, with the process's pid."""

    def __init__(self, path: Path, holds: Path) -> None:
        self.path = path
        self.holds = holds
        holds.mkdir(parents=True, exist_ok=True)

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def count(self, prompt: str | None = None, **match: Any) -> int:
        return sum(
            1
            for line in self.lines()
            if (prompt is None or line.get('prompt') == prompt) and all(line.get(k) == v for k, v in match.items())
        )

    def ends(self) -> Counter[tuple[str, int]]:
        """Completed tool side effects by (prompt, n)."""
        return Counter(
            (line['prompt'], line['n']) for line in self.lines() if (line['what'], line['phase']) == ('tool', 'end')
        )

    def repeats_no_kill_explains(self, killed: set[int]) -> list[tuple[str, int, list[int]]]:
        """Tool side effects that ended more than once although the process of an earlier end lived on.

        A worker killed after a tool's side effect ended and before the step's commit returned never had
        that step acknowledged, so the retry runs it again: at least once is all a SIGKILL there allows.
        Every end but the last must therefore come from a killed process; any other repeat is a replay bug.
        """
        pids: dict[tuple[str, int], list[int]] = {}
        for line in self.lines():
            if (line['what'], line['phase']) == ('tool', 'end'):
                pids.setdefault((line['prompt'], line['n']), []).append(line['pid'])
        return [
            (prompt, n, ended) for (prompt, n), ended in pids.items() if any(pid not in killed for pid in ended[:-1])
        ]

    def hold(self, prompt: str, point: str) -> Path:
        path = self.holds / f'hold-{prompt}-{point}'
        path.touch()
        return path

    def pid_at(self, prompt: str, what: str, n: int | None = None) -> int:
        """The pid of the process that started `what` for `prompt`, once it has (waiting for it)."""

        def started() -> int | None:
            for line in self.lines():
                started_here = line.get('prompt') == prompt and (line['what'], line['phase']) == (what, 'start')
                if started_here and (n is None or line.get('n') == n):
                    return int(line['pid'])
            return None

        return int(eventually(f'{prompt} to start {what} {n or ""}', started))


class Fleet:
    """One engine's fleet for a benchmark script: its broker or queue, the workers it started, and a client.

    Celery gets a Redis of its own and journals on the test server's database; Procrastinate gets a new
    queue database, which is also the one its journal may use (`database`). `settings` are the workers'
    `FLEET_*` environment; the script adds `FLEET_JOURNAL` before it starts a worker.
    """

    def __init__(self, engine: str, root: Path, *, tool_seconds: float, lease_ttl: float, resume_after: float) -> None:
        self.engine, self.root = engine, root
        self.effects_path = root / 'effects.log'
        self.effects = Effects(self.effects_path, root / 'holds')
        self.workers: list[Worker] = []
        self.redis: Redis | None = None
        self.client: Any = None
        self.settings = {
            'FLEET_EFFECTS': str(self.effects_path),
            'FLEET_HOLDS': str(root / 'holds'),
            'FLEET_TOOL_SECONDS': str(tool_seconds),
            'FLEET_LEASE_TTL': str(lease_ttl),
            'FLEET_RESUME_AFTER': str(resume_after),
            'FLEET_HEARTBEAT': '1',
        }
        if engine == 'celery':
            from celery import Celery

            self.redis = Redis(root / 'redis').start()
            self.settings['FLEET_BROKER'] = self.redis.url
            self.client = Celery('client', broker=self.redis.url)
            self.database = server_dsn()
        else:
            self.database = queue_database(server_dsn())
            self.settings['FLEET_QUEUE_DSN'] = self.database
            self.client = queue_client(self.database)

    def start_worker(self) -> Worker:
        name = f'w{len(self.workers) + 1}'
        make = celery_worker if self.engine == 'celery' else procrastinate_worker
        worker = make(name, worker_env(**self.settings), self.root).start()
        self.workers.append(worker)
        return worker

    def send(self, task: str, prompt: str) -> None:
        if self.engine == 'celery':
            self.client.send_task(task, args=[prompt], ignore_result=True)
        else:
            self.client.configure_task(task).defer(prompt=prompt)

    def close(self) -> None:
        """Stop the workers, then the broker, and close the client."""
        for worker in self.workers:
            worker.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.engine == 'procrastinate':
            self.client.close()
