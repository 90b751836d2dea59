"""Durable agents in real Procrastinate workers, killed with SIGKILL (FL-1..FL-3, FL-6; on disk and on PostgreSQL).

Each test makes a queue database on the test server, starts workers (`fleet_procrastinate_app.run()`),
defers jobs from a client app, and kills whole workers at points the agent holds still for
(`fleet_agent`); a Procrastinate worker runs its jobs in one process, so a kill is always a worker's. With
the PostgreSQL journal, the journal lives in the queue's own database. Tests count what the effects log
shows: every job returns the right output, and no tool body that ended runs again.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet import (
    Effects,
    Worker,
    eventually,
    execution_states,
    procrastinate_worker,
    queue_client,
    queue_database,
    worker_env,
    worker_logs,
)
from fleet_agent import TOOLS, expected_output
from pg import server_dsn

pytestmark = [
    pytest.mark.fleet,
    pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX'),
]

LEASE_TTL = 2.0
"""Short, so that a killed holder on PostgreSQL is taken over within seconds."""

SETTINGS = {'FLEET_LEASE_TTL': str(LEASE_TTL), 'FLEET_RESUME_AFTER': '3', 'FLEET_HEARTBEAT': '0.5'}
"""A worker that misses six heartbeats (3 s) counts as dead; the recovery task runs every second."""


@dataclass
class Fleet:
    """The queue's database, the workers started so far, the effects log, and a client app that defers jobs."""

    root: Path
    backend: str
    queue_dsn: str
    effects: Effects
    settings: dict[str, str]
    workers: list[Worker] = field(default_factory=list)
    client: Any = None

    def start_worker(self, **overrides: str) -> Worker:
        name = f'w{len(self.workers) + 1}'
        worker = procrastinate_worker(name, worker_env(**{**self.settings, **overrides}), self.root).start()
        self.workers.append(worker)
        return worker

    def defer(self, prompt: str, *, task: str = 'fleet.research') -> int:
        return int(self.client.configure_task(task).defer(prompt=prompt))

    def status(self, job_id: int) -> str:
        with psycopg.connect(self.queue_dsn) as conn:
            row = conn.execute('SELECT status FROM procrastinate_jobs WHERE id = %s', (job_id,)).fetchone()
        return str(row[0]) if row else 'missing'

    def output(self, prompt: str, job_id: int, within: float = 120.0) -> str:
        """The output the last run of the job returned, once the job has succeeded."""

        def done() -> bool:
            status = self.status(job_id)
            if status == 'failed':
                raise AssertionError(f'job {job_id} failed:\n{self.logs()}')
            return status == 'succeeded'

        try:
            eventually(f'job {job_id} ({prompt}) to succeed', done, within=within)
        except AssertionError as exc:
            raise AssertionError(f'{exc}\n{self.logs()}') from None
        outputs = [
            line['output']
            for line in self.effects.lines()
            if line.get('prompt') == prompt and line['what'] == 'finished'
        ]
        return str(outputs[-1])

    def states(self) -> dict[str, str]:
        return execution_states(self.settings['FLEET_JOURNAL'])

    def logs(self) -> str:
        return worker_logs(self.workers)


@pytest.fixture(params=['disk', 'postgres'])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    queue_dsn = queue_database(server_dsn())
    # With PostgreSQL, the journal shares the queue's database.
    journal = f'postgres:pad_journal:{queue_dsn}' if request.param == 'postgres' else f'disk:{tmp_path / "journal"}'
    settings = {
        **SETTINGS,
        'FLEET_QUEUE_DSN': queue_dsn,
        'FLEET_JOURNAL': journal,
        'FLEET_EFFECTS': str(tmp_path / 'effects.log'),
        'FLEET_HOLDS': str(tmp_path / 'holds'),
        'FLEET_TOOL_SECONDS': '0.05',
    }
    fleet = Fleet(tmp_path, request.param, queue_dsn, Effects(tmp_path / 'effects.log', tmp_path / 'holds'), settings)
    fleet.client = queue_client(queue_dsn)
    try:
        yield fleet
    finally:
        for worker in fleet.workers:
            worker.stop()
        fleet.client.close()


def _each_tool_ended_once(fleet: Fleet, prompt: str) -> None:
    ends = fleet.effects.ends()
    assert {n: ends[(prompt, n)] for n in range(1, TOOLS + 1)} == dict.fromkeys(range(1, TOOLS + 1), 1), ends


# -- a worker killed at each point of a job; another one resumes it with no operator (FL-6) ---------


@pytest.mark.parametrize('point', ['tool-2', 'model-2'])
def test_fl6_a_worker_killed_inside_a_step_is_resumed_by_another_and_no_ended_tool_runs_again(
    fleet: Fleet, point: str
) -> None:
    first = fleet.start_worker()
    prompt = f'inside-{point}'
    release = fleet.effects.hold(prompt, point)
    job = fleet.defer(prompt)
    what, n = point.split('-')
    fleet.effects.pid_at(prompt, 'tool' if what == 'tool' else 'model', int(n))
    first.kill()
    release.unlink()
    fleet.start_worker()
    assert fleet.output(prompt, job) == expected_output(prompt)
    _each_tool_ended_once(fleet, prompt)
    starts = {n: fleet.effects.count(prompt, what='tool', phase='start', n=n) for n in range(1, TOOLS + 1)}
    assert starts == {1: 1, 2: 2 if what == 'tool' else 1, 3: 1}
    assert fleet.effects.count(prompt, what='model', phase='start', n=1) == 1
    assert fleet.effects.count(prompt, what='model', phase='start', n=2) == (2 if what == 'model' else 1)
    assert fleet.states() == {f'fleet.research:{job}': 'finished'}


def test_fl6_a_worker_killed_after_the_execution_finished_but_before_the_job_ended_replays(fleet: Fleet) -> None:
    first = fleet.start_worker()
    prompt = 'after-finish'
    release = fleet.effects.hold(prompt, 'after-finish')
    job = fleet.defer(prompt)
    fleet.effects.pid_at(prompt, 'finished')
    first.kill()
    release.unlink()
    fleet.start_worker()
    assert fleet.output(prompt, job) == expected_output(prompt)
    assert fleet.effects.count(prompt, what='finished') == 2
    assert fleet.effects.count(prompt, what='body', phase='start') == 2  # the job ran again ...
    assert fleet.effects.count(prompt, what='model', phase='start') == TOOLS + 1  # ... with no model request
    _each_tool_ended_once(fleet, prompt)


def test_fl6_a_sync_body_with_run_sync_resumes_too(fleet: Fleet) -> None:
    first = fleet.start_worker()
    prompt = 'sync-body'
    release = fleet.effects.hold(prompt, 'tool-3')
    job = fleet.defer(prompt, task='fleet.research_sync')
    fleet.effects.pid_at(prompt, 'tool', 3)
    first.kill()
    release.unlink()
    fleet.start_worker()
    assert fleet.output(prompt, job) == expected_output(prompt)
    _each_tool_ended_once(fleet, prompt)
    assert fleet.states() == {f'fleet.research_sync:{job}': 'finished'}


# -- a live worker's job retried by the recovery: one holder runs, the copy waits (FL-2) --------------


def test_fl2_a_job_retried_while_its_worker_still_runs_it_runs_its_steps_once(fleet: Fleet) -> None:
    # A worker that heart-beats once a minute looks stalled to the recovery after 3 s: its running job is
    # put back in the queue while it still holds the execution, and its second slot takes the copy.
    worker = fleet.start_worker(FLEET_HEARTBEAT='60')
    prompt = 'duplicate'
    release = fleet.effects.hold(prompt, 'tool-1')
    job = fleet.defer(prompt)
    fleet.effects.pid_at(prompt, 'tool', 1)
    eventually('the copy to find the execution busy', lambda: 'its task runs again in' in worker.tail(400))
    release.unlink()
    assert fleet.output(prompt, job) == expected_output(prompt)
    assert {n: fleet.effects.count(prompt, what='tool', phase='start', n=n) for n in range(1, TOOLS + 1)} == {
        1: 1,
        2: 1,
        3: 1,
    }
    assert fleet.effects.count(prompt, what='model', phase='start') == TOOLS + 1
    assert fleet.effects.count(prompt, what='body', phase='start') == 1  # the copy never entered the execution
    assert fleet.states() == {f'fleet.research:{job}': 'finished'}


# -- a full queue: recovery does not wait behind the backlog (FL-11) -------------------------------------


BACKLOG = 24
"""Jobs queued behind a killed worker's job, each of three tools of 0.4 s: about 16 s of work for two slots."""


def test_fl11_a_killed_workers_job_resumes_before_the_backlog_of_a_full_queue_has_run(fleet: Fleet) -> None:
    fleet.settings['FLEET_TOOL_SECONDS'] = '0.4'
    first = fleet.start_worker()
    prompt = 'behind-backlog'
    release = fleet.effects.hold(prompt, 'tool-2')
    job = fleet.defer(prompt)
    fleet.effects.pid_at(prompt, 'tool', 2)
    fleet.start_worker()
    backlog = [f'backlog-{n}' for n in range(BACKLOG)]
    for name in backlog:
        fleet.defer(name)
    eventually('both workers to run the backlog', lambda: fleet.effects.count(what='body', phase='start') >= 4)
    first.kill()  # every slot left (the second worker's two) is taken, and the queue is full
    release.unlink()
    assert fleet.output(prompt, job, within=180) == expected_output(prompt)
    _each_tool_ended_once(fleet, prompt)
    lines = fleet.effects.lines()
    resumed = [
        index
        for index, line in enumerate(lines)
        if line.get('prompt') == prompt and (line['what'], line.get('n'), line['phase']) == ('tool', 2, 'start')
    ]
    assert len(resumed) >= 2, 'the job did not run tool 2 again'
    started = {line['prompt'] for line in lines[: resumed[1]] if line['what'] == 'body' and line['prompt'] in backlog}
    # Recovery and the job it sends again go ahead of the queue: a quarter of the backlog at least is
    # still waiting when the job runs again (before, it ran again only once the backlog had drained).
    assert BACKLOG - len(started) >= BACKLOG // 4, f'{len(started)} of {BACKLOG} backlog jobs started first'


# -- fifty jobs, two workers, random kills (FL-1..FL-3, FL-6) --------------------------------------------


def test_fl1_fl3_fl6_fifty_jobs_over_two_workers_with_random_kills_all_finish_with_no_repeated_side_effect(
    fleet: Fleet,
) -> None:
    fleet.settings['FLEET_TOOL_SECONDS'] = '0.2'
    fleet.start_worker()
    fleet.start_worker()
    chance = random.Random(33)
    prompts = [f'many-{n}' for n in range(50)]
    jobs = [fleet.defer(prompt) for prompt in prompts]
    killed: set[int] = set()
    for _ in range(5):
        eventually('a job to be running', lambda: fleet.effects.count(what='tool', phase='start') > 0)
        time.sleep(chance.uniform(0.3, 1.2))
        alive = [worker for worker in fleet.workers if worker.process and worker.process.poll() is None]
        victim = chance.choice(alive)
        killed.add(victim.pid)
        victim.kill()
        fleet.start_worker()
    outputs = [fleet.output(prompt, job, within=240) for prompt, job in zip(prompts, jobs, strict=True)]
    assert outputs == [expected_output(prompt) for prompt in prompts]
    # A task can be delivered again after its first delivery reported (the broker restores a message
    # whose worker died before acknowledging it): that delivery replays the finished execution, which
    # reads 'running' meanwhile. Every execution must come to rest finished, and only then are the
    # side effects counted, so that a late delivery that ran a tool again would be seen.
    eventually(
        'every execution to come to rest finished (an execution was left behind)',
        lambda: set(fleet.states().values()) == {'finished'},
        within=120,
    )
    ends = fleet.effects.ends()
    assert len(ends) == 50 * TOOLS, 'a tool never ended'
    # A kill between a tool's end and its step's commit repeats it (never acknowledged); nothing else may.
    assert not fleet.effects.repeats_no_kill_explains(killed), 'a tool that had ended ran again with no kill'
    assert sum(ends.values()) - len(ends) <= len(killed), ends
    lines = fleet.effects.lines()
    ended = {
        (line['pid'], line['prompt'], line['n']) for line in lines if (line['what'], line['phase']) == ('tool', 'end')
    }
    for line in lines:
        if (line['what'], line['phase']) == ('tool', 'start') and (line['pid'], line['prompt'], line['n']) not in ended:
            assert line['pid'] in killed, f'a tool body was cut short by no kill: {line}'


def test_fl12_a_refused_delivery_is_never_handed_to_the_tasks_own_retry_strategy() -> None:
    from procrastinate.jobs import Job
    from procrastinate.retry import get_retry_strategy

    from pydantic_ai_durable import ExecutionBusy, MetadataMismatch
    from pydantic_ai_durable.procrastinate import DurableRetry

    strategy = DurableRetry(5.0, get_retry_strategy(3))
    job = Job(id=7, queue='default', lock=None, queueing_lock=None, task_name='fleet.research', attempts=0)
    refused = MetadataMismatch('fleet.research:7', recorded={'kwargs': {'a': 1}}, given={'kwargs': {'a': 2}})
    assert strategy.get_retry_decision(exception=refused, job=job) is None
    assert strategy.get_retry_decision(exception=RuntimeError('the body failed'), job=job) is not None
    busy = ExecutionBusy('fleet.research:7', holder='h:1:t:1', expires_at=time.time() + 2)
    assert strategy.get_retry_decision(exception=busy, job=job) is not None
