"""Durable agents in real Celery workers, killed with SIGKILL (FL-1..FL-5, on disk and on PostgreSQL).

Each test starts its own `redis-server` and prefork workers (`celery -A fleet_celery_app worker`), sends
tasks from a client app, and kills pool processes or whole workers at points the agent holds still for
(`fleet_agent`). It counts what the effects log shows: every task returns the right output, and no tool
body that ended runs again (only a body killed inside itself starts twice).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fleet import Effects, Redis, Worker, celery_worker, eventually, execution_states, worker_env, worker_logs
from fleet_agent import TOOLS, expected_output
from pg import fresh_schema

pytestmark = [
    pytest.mark.fleet,
    pytest.mark.skipif(sys.platform == 'win32', reason='prefork workers and SIGKILL are POSIX'),
]

LEASE_TTL = 2.0
"""Short, so that a killed holder on PostgreSQL is taken over within seconds."""


@dataclass
class Fleet:
    """A broker, the workers started so far, the effects log, and a client app that sends tasks."""

    root: Path
    backend: str
    redis: Redis
    effects: Effects
    settings: dict[str, str]
    workers: list[Worker] = field(default_factory=list)
    client: Any = None

    def start_worker(self, *, pool: str = 'prefork', **overrides: str) -> Worker:
        worker = self.worker(pool=pool, **overrides).start()
        self.workers.append(worker)
        return worker

    def worker(self, *, pool: str = 'prefork', **overrides: str) -> Worker:
        """A worker not started yet (`start_worker` starts one and keeps it for the teardown)."""
        name = f'w{len(self.workers) + 1}'
        env = worker_env(**{**self.settings, **overrides})
        if pool in ('gevent', 'eventlet'):  # trio fails to import once eventlet patched (tests/green_shim)
            env['PYTHONPATH'] = os.pathsep.join([str(Path(__file__).parent / 'green_shim'), env['PYTHONPATH']])
        return celery_worker(name, env, self.root, pool=pool)

    def send(self, prompt: str, *, task: str = 'fleet.research', task_id: str | None = None) -> Any:
        return self.client.send_task(task, args=[prompt], task_id=task_id)

    def states(self) -> dict[str, str]:
        return execution_states(self.settings['FLEET_JOURNAL'])

    def retried(self) -> bool:
        """Whether a delivery found its execution held by another and asked Celery to retry it later."""
        return any('its task runs again in' in worker.log.read_text(errors='replace') for worker in self.workers)

    def logs(self) -> str:
        return worker_logs(self.workers)


@pytest.fixture(params=['disk', 'postgres'])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    from celery import Celery

    if request.param == 'postgres':
        dsn, schema = fresh_schema()
        journal = f'postgres:{schema}:{dsn}'
    else:
        journal = f'disk:{tmp_path / "journal"}'
    redis = Redis(tmp_path / 'redis').start()
    settings = {
        'FLEET_BROKER': redis.url,
        'FLEET_JOURNAL': journal,
        'FLEET_EFFECTS': str(tmp_path / 'effects.log'),
        'FLEET_HOLDS': str(tmp_path / 'holds'),
        'FLEET_LEASE_TTL': str(LEASE_TTL),
        'FLEET_RESUME_AFTER': str(LEASE_TTL),
        'FLEET_TOOL_SECONDS': '0.05',
    }
    fleet = Fleet(tmp_path, request.param, redis, Effects(tmp_path / 'effects.log', tmp_path / 'holds'), settings)
    fleet.client = Celery('client', broker=redis.url, backend=redis.url)
    try:
        yield fleet
    finally:
        for worker in fleet.workers:
            worker.stop()
        redis.stop()


def _output(fleet: Fleet, result: Any, timeout: float = 120.0) -> str:
    try:
        return str(result.get(timeout=timeout))
    except Exception as exc:
        raise AssertionError(f'task {result.id} did not succeed: {exc!r}\n{fleet.logs()}') from exc


def _each_tool_ended_once(fleet: Fleet, prompt: str) -> None:
    ends = fleet.effects.ends()
    assert {n: ends[(prompt, n)] for n in range(1, TOOLS + 1)} == dict.fromkeys(range(1, TOOLS + 1), 1), ends


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


# -- a pool process killed at each point of a task --------------------------------------------------


@pytest.mark.parametrize('point', ['tool-2', 'model-2'])
def test_fl2_a_pool_process_killed_inside_a_step_resumes_and_no_ended_tool_runs_again(fleet: Fleet, point: str) -> None:
    fleet.start_worker()
    prompt = f'inside-{point}'
    release = fleet.effects.hold(prompt, point)
    result = fleet.send(prompt)
    what, n = point.split('-')
    _kill(fleet.effects.pid_at(prompt, 'tool' if what == 'tool' else 'model', int(n)))
    release.unlink()
    assert _output(fleet, result) == expected_output(prompt)
    _each_tool_ended_once(fleet, prompt)
    # Only the step killed inside its own body started twice; what was recorded before it replayed.
    starts = {n: fleet.effects.count(prompt, what='tool', phase='start', n=n) for n in range(1, TOOLS + 1)}
    assert starts == {1: 1, 2: 2 if what == 'tool' else 1, 3: 1}
    assert fleet.effects.count(prompt, what='model', phase='start', n=1) == 1
    assert fleet.effects.count(prompt, what='model', phase='start', n=2) == (2 if what == 'model' else 1)
    assert fleet.states() == {f'fleet.research:{result.id}': 'finished'}


def test_fl2_a_pool_process_killed_after_the_execution_finished_but_before_the_ack_replays(fleet: Fleet) -> None:
    # With no result stored (ignore_result), Celery cannot tell that the body returned: the message comes back.
    fleet.start_worker()
    prompt = 'after-finish'
    release = fleet.effects.hold(prompt, 'after-finish')
    fleet.client.send_task('fleet.research', args=[prompt], ignore_result=True)
    _kill(fleet.effects.pid_at(prompt, 'finished'))
    release.unlink()
    eventually('the redelivered task to finish', lambda: fleet.effects.count(prompt, what='finished') == 2)
    outputs = [line['output'] for line in fleet.effects.lines() if line['what'] == 'finished']
    assert outputs == [expected_output(prompt)] * 2
    assert fleet.effects.count(prompt, what='body', phase='start') == 2  # the message came back and ran again
    assert fleet.effects.count(prompt, what='model', phase='start') == TOOLS + 1  # ... with no model request
    _each_tool_ended_once(fleet, prompt)
    assert set(fleet.states().values()) == {'finished'}


def test_fl2_fl5_a_sync_body_with_run_sync_resumes_too(fleet: Fleet) -> None:
    fleet.start_worker()
    prompt = 'sync-body'
    release = fleet.effects.hold(prompt, 'tool-3')
    result = fleet.send(prompt, task='fleet.research_sync')
    _kill(fleet.effects.pid_at(prompt, 'tool', 3))
    release.unlink()
    assert _output(fleet, result) == expected_output(prompt)
    _each_tool_ended_once(fleet, prompt)


# -- a whole worker killed: the sweep, not the broker, brings its tasks back (FL-3) ---------------------


def test_fl3_a_whole_worker_killed_is_resumed_by_the_sweep_of_another(fleet: Fleet) -> None:
    first = fleet.start_worker()
    prompts = [f'whole-{n}' for n in range(4)]
    releases = [fleet.effects.hold(prompt, 'tool-2') for prompt in prompts]
    results = [fleet.send(prompt) for prompt in prompts[:2]]
    eventually('both tasks to be inside tool 2 on the first worker', lambda: all(
        fleet.effects.count(prompt, what='tool', n=2, phase='start') for prompt in prompts[:2]
    ))  # fmt: skip
    fleet.start_worker()
    results += [fleet.send(prompt) for prompt in prompts[2:]]
    eventually('the other two to be inside tool 2', lambda: all(
        fleet.effects.count(prompt, what='tool', n=2, phase='start') for prompt in prompts
    ))  # fmt: skip
    first.kill()  # main process and pool: its two messages stay unacknowledged in Redis for an hour
    for release in releases:
        release.unlink()
    assert [_output(fleet, result) for result in results] == [expected_output(prompt) for prompt in prompts]
    for prompt in prompts:
        _each_tool_ended_once(fleet, prompt)
    assert set(fleet.states().values()) == {'finished'}
    assert 'was interrupted; it was dispatched again' in fleet.workers[1].log.read_text()


def test_fl3_a_message_taken_by_a_worker_killed_before_its_task_started_is_put_back(fleet: Fleet) -> None:
    # Between taking the message and entering the execution, the journal holds nothing of the task:
    # only the broker knows it, and Redis would hand it out again after its visibility timeout (an hour).
    first = fleet.start_worker()
    prompt = 'taken-not-started'
    release = fleet.effects.hold(prompt, 'before-body')
    result = fleet.send(prompt)
    fleet.effects.pid_at(prompt, 'taken')
    first.kill()
    release.unlink()
    assert fleet.states() == {}
    second = fleet.start_worker()
    assert _output(fleet, result) == expected_output(prompt)
    assert 'died before it ran; it was put back' in second.log.read_text()
    assert fleet.effects.count(prompt, what='body', phase='start') == 1
    _each_tool_ended_once(fleet, prompt)
    assert fleet.states() == {f'fleet.research:{result.id}': 'finished'}


def test_fl3_a_whole_worker_killed_after_the_execution_finished_but_before_the_ack_is_put_back(fleet: Fleet) -> None:
    first = fleet.start_worker()
    prompt = 'finished-not-acked'
    release = fleet.effects.hold(prompt, 'after-finish')
    fleet.client.send_task('fleet.research', args=[prompt], ignore_result=True)
    fleet.effects.pid_at(prompt, 'finished')
    first.kill()
    release.unlink()
    second = fleet.start_worker()
    eventually('the message to come back and replay', lambda: fleet.effects.count(prompt, what='finished') == 2)
    assert 'died before it ran; it was put back' in second.log.read_text()
    assert fleet.effects.count(prompt, what='model', phase='start') == TOOLS + 1  # the second delivery replayed
    _each_tool_ended_once(fleet, prompt)


# -- pools: the ones that keep durability run; green pools are refused when the worker starts (FL-10) ----


@pytest.mark.parametrize('pool', ['threads', 'solo'])
def test_fl10_a_threads_or_solo_worker_killed_inside_a_tool_is_resumed(fleet: Fleet, pool: str) -> None:
    if fleet.backend != 'disk':
        pytest.skip('the pool, not the journal, is under test')
    first = fleet.start_worker(pool=pool)
    prompt = f'pool-{pool}'
    release = fleet.effects.hold(prompt, 'tool-2')
    result = fleet.send(prompt)
    assert fleet.effects.pid_at(prompt, 'tool', 2) == first.pid  # the task runs in the worker's own process
    first.kill()
    release.unlink()
    fleet.start_worker(pool=pool)
    assert _output(fleet, result) == expected_output(prompt)
    _each_tool_ended_once(fleet, prompt)
    assert fleet.effects.count(prompt, what='tool', phase='start', n=1) == 1


@pytest.mark.parametrize('pool', ['gevent', 'eventlet'])
def test_fl10_a_green_pool_is_refused_when_the_worker_starts(fleet: Fleet, pool: str) -> None:
    if fleet.backend != 'disk':
        pytest.skip('the pool, not the journal, is under test')
    worker = fleet.worker(pool=pool)
    fleet.workers.append(worker)  # stopped at the end should it start after all
    with pytest.raises(AssertionError, match='exited with') as refused:
        worker.start()
    message = str(refused.value)
    assert f'the {pool} pool' in message and all(name in message for name in ('prefork', 'threads', 'solo')), message


# -- a sweeper killed while it holds its claim (FL-8) ------------------------------------------------


def test_fl8_a_sweeper_killed_holding_its_claim_blocks_the_execution_no_longer_than_its_claim(fleet: Fleet) -> None:
    import asyncio

    from fleet_agent import journal_from_setting

    from pydantic_ai_durable import ExecutionInfo, sweep_interrupted

    first = fleet.start_worker()
    prompt = 'claim-holder'
    release = fleet.effects.hold(prompt, 'tool-2')
    result = fleet.send(prompt)
    fleet.effects.pid_at(prompt, 'tool', 2)
    claimed = fleet.root / 'claimed'
    sweeper = fleet.start_worker(FLEET_STALL_CLAIM=str(claimed))  # its sweep stops inside its claim
    first.kill()
    release.unlink()
    eventually("the second worker's sweep to claim the interrupted execution", claimed.exists, within=60)
    sweeper.kill()
    # The claim lasts the sweep's period (resume_after / 3, at least 1 s) and never longer than
    # resume_after: once it has passed, one sweep round takes the execution over and sends it again.
    time.sleep(max(1.0, LEASE_TTL / 3) + 0.2)
    journal = journal_from_setting(fleet.settings['FLEET_JOURNAL'])

    def send(info: ExecutionInfo) -> None:
        meta = info.metadata or {}
        fleet.client.send_task(meta['task'], args=meta['args'], kwargs=meta['kwargs'], task_id=meta['id'])

    async def sweep() -> list[str]:
        try:
            return await sweep_interrupted(journal, send, idle=LEASE_TTL)
        finally:
            await journal.close()

    assert asyncio.run(sweep()) == [f'fleet.research:{result.id}']
    fleet.start_worker()
    assert _output(fleet, result) == expected_output(prompt)
    _each_tool_ended_once(fleet, prompt)


# -- a duplicate delivery races the original: one holder runs, the other retries and replays (FL-2) ----


def test_fl2_a_duplicate_delivery_past_the_visibility_timeout_retries_then_replays(fleet: Fleet) -> None:
    # A visibility timeout shorter than the task, looked at every second: Redis hands the running
    # message to the second pool process while the first still holds the execution.
    fleet.start_worker(FLEET_VISIBILITY='3', FLEET_RESTORE_EVERY='1')
    prompt = 'duplicate'
    release = fleet.effects.hold(prompt, 'tool-1')
    result = fleet.send(prompt)
    eventually('the broker to deliver the running task again and the copy to wait', fleet.retried, within=60)
    release.unlink()
    assert _output(fleet, result) == expected_output(prompt)
    eventually('the second delivery to replay the finished execution', lambda: fleet.effects.count(
        prompt, what='finished') >= 2)  # fmt: skip
    # One holder ran every step; the other delivery waited (ExecutionBusy) and then only replayed.
    assert {n: fleet.effects.count(prompt, what='tool', phase='start', n=n) for n in range(1, TOOLS + 1)} == {
        1: 1,
        2: 1,
        3: 1,
    }
    assert fleet.effects.count(prompt, what='model', phase='start') == TOOLS + 1


def test_fl2_the_same_task_id_sent_twice_runs_its_steps_once(fleet: Fleet) -> None:
    fleet.start_worker()
    prompt = 'same-id'
    release = fleet.effects.hold(prompt, 'tool-2')
    first = fleet.send(prompt, task_id='order-42')
    fleet.effects.pid_at(prompt, 'tool', 2)
    fleet.send(prompt, task_id='order-42')
    eventually('the second delivery to find the execution busy', fleet.retried)
    release.unlink()
    assert _output(fleet, first) == expected_output(prompt)
    eventually('both deliveries to end', lambda: fleet.effects.count(prompt, what='finished') >= 2)
    assert fleet.effects.count(prompt, what='tool', phase='start') == TOOLS
    assert fleet.states() == {'fleet.research:order-42': 'finished'}


def test_fl12_the_same_task_id_with_other_arguments_is_refused_and_runs_nothing(fleet: Fleet) -> None:
    fleet.start_worker()
    first = fleet.send('first-work', task_id='order-7')
    assert _output(fleet, first) == expected_output('first-work')
    fleet.send('other-work', task_id='order-7')
    # Celery keeps the first success of an id in its result backend, so the refusal shows in the worker's log.
    eventually('the second delivery to be refused', lambda: 'raised unexpected: MetadataMismatch' in fleet.logs())
    [refusal] = [line for line in fleet.logs().splitlines() if 'raised unexpected: MetadataMismatch' in line]
    assert "['first-work']" in refusal and "['other-work']" in refusal, refusal
    assert fleet.effects.count('other-work') == 0  # not a model request, not a tool
    assert fleet.states() == {'fleet.research:order-7': 'finished'}


# -- fifty tasks, two workers, random kills (FL-1..FL-3) -------------------------------------------------


def test_fl1_fl2_fl3_fifty_tasks_over_two_workers_with_random_kills_all_finish_with_no_repeated_side_effect(
    fleet: Fleet,
) -> None:
    settings = {'FLEET_VISIBILITY': '20', 'FLEET_RESTORE_EVERY': '1', 'FLEET_TOOL_SECONDS': '0.2'}
    fleet.start_worker(**settings)
    fleet.start_worker(**settings)
    chance = random.Random(33)
    prompts = [f'many-{n}' for n in range(50)]
    results = [fleet.send(prompt) for prompt in prompts]
    killed: set[int] = set()
    for kill in range(7):
        eventually('a task to be running', lambda: fleet.effects.count(what='tool', phase='start') > 0)
        time.sleep(chance.uniform(0.3, 1.2))
        if kill == 3:  # once, a whole worker, then another in its place
            victim = fleet.workers[chance.randrange(len(fleet.workers))]
            killed.update([victim.pid, *victim.children()])
            victim.kill()
            fleet.start_worker(**settings)
            continue
        alive = [worker for worker in fleet.workers if worker.process and worker.process.poll() is None]
        pool = [pid for worker in alive for pid in worker.children()]
        if pool:
            pid = chance.choice(pool)
            killed.add(pid)
            _kill(pid)
    outputs = [_output(fleet, result, timeout=240) for result in results]
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
    # A tool body that started more than once was killed inside itself every time but the last.
    lines = fleet.effects.lines()
    ended = {
        (line['pid'], line['prompt'], line['n']) for line in lines if (line['what'], line['phase']) == ('tool', 'end')
    }
    for line in lines:
        if (line['what'], line['phase']) == ('tool', 'start') and (line['pid'], line['prompt'], line['n']) not in ended:
            assert line['pid'] in killed, f'a tool body was cut short by no kill: {line}'
