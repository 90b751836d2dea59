"""Durable tasks that wait for a person's approval, in real Celery and Procrastinate workers (WT-4).

One worker with one slot runs tasks whose payment needs approval: each run ends waiting, its delivery ends
with a small JSON result that says so, and the slot is free for other work. A decision made here with
`resolve(..., dispatch=True)` sends the task on, and it runs to its output with the payment made once and
no model request repeated. A resolver SIGKILLed after writing its decision and before sending leaves the
execution to the workers' sweep, which sends it on; while a call is still pending the sweep never sends it.
On disk and PostgreSQL journals; the tests count effects and deliveries, never time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet import (
    TESTS,
    Effects,
    Redis,
    Worker,
    celery_worker,
    eventually,
    procrastinate_worker,
    queue_client,
    queue_database,
    worker_env,
    worker_logs,
)
from fleet_agent import approval_output, expected_output, journal_from_setting
from pg import fresh_schema, server_dsn

from pydantic_ai_durable import ExecutionInfo, Resolution, resolve

pytestmark = [pytest.mark.fleet, pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')]

RESUME_AFTER = 2.0
"""Seconds after which the sweep sends a decided execution nobody sent (its rounds: one a second)."""


@dataclass
class Queue:
    """One engine's broker, its workers, the effects log, and this process's app, which sends tasks."""

    engine: str
    root: Path
    settings: dict[str, str]
    effects: Effects
    client: Any
    workers: list[Worker] = field(default_factory=list)

    def start_worker(self) -> Worker:
        """A worker that runs one task at a time."""
        env, name = worker_env(**self.settings), f'w{len(self.workers) + 1}'
        if self.engine == 'celery':
            worker = celery_worker(name, env, self.root, concurrency=1)
        else:
            worker = procrastinate_worker(name, {**env, 'FLEET_CONCURRENCY': '1'}, self.root)
        self.workers.append(worker)
        return worker.start()

    def send(self, prompt: str, task: str = 'fleet.approve') -> str:
        """Send a task; returns its execution key."""
        if self.engine == 'celery':
            return f'{task}:{self.client.send_task(task, args=[prompt]).id}'
        return f'{task}:{self.client.configure_task(task).defer(prompt=prompt)}'

    def waits(self, prompt: str, key: str) -> Any:
        """What the task's delivery left as its outcome once it ended, its execution waiting (WT-4)."""
        task_id = key.split(':', 1)[1]
        if self.engine == 'celery':  # the state and info of the task id, through the JSON serializer

            def stored() -> Any:
                meta = self.client.backend.get_task_meta(task_id, cache=False)
                if meta['status'] == 'FAILURE':
                    raise AssertionError(f'{key} failed: {meta["result"]!r}\n{self.logs()}')
                return meta['status'] == 'WAITING' and meta

            return eventually(f'the delivery of {key} to end waiting', stored, within=90)['result']
        return self.output(prompt, key)

    def output(self, prompt: str, key: str, delivery: int = 1) -> Any:
        """The task's output: on Celery what `AsyncResult.get()` returns, on Procrastinate what delivery
        number `delivery` of the job returned, once Procrastinate stored the job as succeeded."""
        task_id = key.split(':', 1)[1]
        if self.engine == 'celery':
            try:
                return self.client.AsyncResult(task_id).get(timeout=90)
            except Exception as exc:
                raise AssertionError(f'{key}: {exc!r}\n{self.logs()}') from exc
        eventually(
            f'delivery {delivery} of {key} to end', lambda: self.effects.count(prompt, what='finished') >= delivery
        )
        eventually(f'job {task_id} to be stored as succeeded', lambda: self.status(task_id) == 'succeeded')
        finished = [line for line in self.effects.lines() if (line.get('prompt'), line['what']) == (prompt, 'finished')]
        return finished[delivery - 1]['output']

    def status(self, job_id: str) -> str:
        with psycopg.connect(self.settings['FLEET_QUEUE_DSN']) as conn:
            row = conn.execute('SELECT status FROM procrastinate_jobs WHERE id = %s', (int(job_id),)).fetchone()
        return str(row[0]) if row else 'missing'

    def listed(self) -> dict[str, ExecutionInfo]:
        async def read() -> dict[str, ExecutionInfo]:
            journal = journal_from_setting(self.settings['FLEET_JOURNAL'])
            try:
                return {info.key: info for info in await journal.list_executions()}
            finally:
                await journal.close()

        return asyncio.run(read())

    def decide_here(self, key: str) -> Resolution:
        """`resolve(..., dispatch=True)` in this process, as a web handler that imports the app's tasks would."""

        async def decide() -> Resolution:
            journal = journal_from_setting(self.settings['FLEET_JOURNAL'])
            try:
                return await resolve(journal, key, approvals={'pay-1': True}, by='alice', dispatch=True)
            finally:
                await journal.close()

        return asyncio.run(decide())

    def logs(self) -> str:
        return worker_logs(self.workers)


def _register_here(engine: str, app: Any, journal_setting: str) -> None:
    """Define `fleet.approve` in this process too, the way a web app imports the module of its tasks."""
    journal = journal_from_setting(journal_setting)
    if engine == 'celery':
        from pydantic_ai_durable.celery import durable_task

        durable_task(app, journal=journal, lease_ttl=RESUME_AFTER, name='fleet.approve', shared=False)(
            _runs_on_a_worker
        )
    else:
        from pydantic_ai_durable.procrastinate import durable_job

        durable_job(app, journal=journal, lease_ttl=RESUME_AFTER, name='fleet.approve')(_runs_on_a_worker)


async def _runs_on_a_worker(prompt: str) -> str:
    raise AssertionError('the body runs on a worker, never in the test process')


@pytest.fixture(params=['celery-disk', 'celery-postgres', 'procrastinate-disk', 'procrastinate-postgres'])
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Queue]:
    engine, backend = request.param.split('-')
    settings = {
        'FLEET_EFFECTS': str(tmp_path / 'effects.log'),
        'FLEET_HOLDS': str(tmp_path / 'holds'),
        'FLEET_LEASE_TTL': str(RESUME_AFTER),
        'FLEET_RESUME_AFTER': str(RESUME_AFTER),
        'FLEET_HEARTBEAT': '0.5',
    }
    redis: Redis | None = None
    if engine == 'celery':
        from celery import Celery

        redis = Redis(tmp_path / 'redis').start()
        settings['FLEET_BROKER'] = redis.url
        client: Any = Celery('client', broker=redis.url, backend=redis.url)
        sender = client
    else:
        import procrastinate

        settings['FLEET_QUEUE_DSN'] = queue_dsn = queue_database(server_dsn())
        client = queue_client(queue_dsn)
        sender = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=queue_dsn))  # opened when sending
    if backend == 'postgres':
        dsn, schema = fresh_schema()
        settings['FLEET_JOURNAL'] = f'postgres:{schema}:{dsn}'
    else:
        settings['FLEET_JOURNAL'] = f'disk:{tmp_path / "journal"}'
    _register_here(engine, sender, settings['FLEET_JOURNAL'])
    running = Queue(engine, tmp_path, settings, Effects(tmp_path / 'effects.log', tmp_path / 'holds'), client)
    try:
        yield running
    finally:
        for worker in running.workers:
            worker.stop()
        if redis is not None:
            redis.stop()
        else:
            client.close()


def _resolver_killed_before_its_send(queue: Queue, key: str) -> None:
    """A web handler that decides the last call with `dispatch=True`, SIGKILLed between its write and its send."""
    held = queue.root / 'resolver-held'
    resolver = subprocess.Popen(
        [sys.executable, str(TESTS / 'fleet_resolver.py'), queue.engine, key, 'pay-1', str(held)],
        cwd=TESTS,
        env=worker_env(**queue.settings),
    )
    try:
        eventually('the resolver to write its decision and reach its send', held.exists, within=60)
    finally:
        os.kill(resolver.pid, signal.SIGKILL)
        resolver.wait(timeout=30)


def test_wt4_a_task_that_waits_frees_its_worker_and_goes_on_once_decided_by_a_resolver_or_by_the_sweep(
    queue: Queue,
) -> None:
    worker = queue.start_worker()
    first, second = queue.send('wait-a'), queue.send('wait-b')
    # Each delivery ended: the slot ran one, then the other, and returned what says it waits, as JSON.
    assert queue.waits('wait-a', first) == {'state': 'waiting', 'key': first, 'pending': ['pay-1']}
    assert queue.waits('wait-b', second) == {'state': 'waiting', 'key': second, 'pending': ['pay-1']}
    assert queue.listed()[first].state == queue.listed()[second].state == 'waiting'
    other = queue.send('free', task='fleet.research')  # the one slot is free while both wait
    assert queue.output('free', other) == expected_output('free')

    resolution = queue.decide_here(first)
    assert (resolution.completed, resolution.dispatched) == (True, True)
    assert queue.output('wait-a', first, delivery=2) == approval_output('wait-a')
    assert queue.effects.ends()[('wait-a', 1)] == 1  # the approved payment, once
    assert queue.effects.count('wait-a', what='model', n=1) == 1  # the first request replayed, not repeated
    assert queue.effects.count('wait-a', what='model', n=2) == 1
    assert queue.effects.count('wait-a', what='body') == 2  # one delivery each: the wait, the continuation

    # Still pending: no sweep sends it, however many rounds pass (one a second, `resume_after` 2 s): by now it
    # has waited past `resume_after` and two rounds more.
    idle = time.time() - queue.listed()[second].updated
    time.sleep(max(0.0, RESUME_AFTER + 2.0 - idle))
    assert queue.effects.count('wait-b', what='body') == 1
    assert 'it was dispatched to go on' not in worker.tail(400)

    _resolver_killed_before_its_send(queue, second)
    assert queue.listed()[second].state == 'waiting' and queue.listed()[second].pending == ()  # decided, not sent
    assert queue.output('wait-b', second, delivery=2) == approval_output('wait-b')  # the sweep sent it on
    assert f"Execution '{second}': every call it waited on is decided; it was dispatched to go on" in worker.tail(400)
    assert queue.effects.ends()[('wait-b', 1)] == 1
    assert queue.effects.count('wait-b', what='model', n=1) == queue.effects.count('wait-b', what='model', n=2) == 1
    assert queue.effects.count('wait-b', what='body') == 2
    states = {key: info.state for key, info in queue.listed().items()}
    assert states == dict.fromkeys([first, second, other], 'finished')
