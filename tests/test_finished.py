"""Finished means finished (FN-1..FN-5): kept after success, retried without repeating anything, retained, listed.

The crash tests kill real processes with SIGKILL before, inside and after the end of the `execution()`
scope, from a parent that imported the agent once and forks one process per attempt.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Calls, Operator, elsewhere, two_step_agent
from pg import fresh_schema

from pydantic_ai_durable import (
    DiskJournal,
    DurableError,
    Journal,
    JournalUnavailable,
    MemoryJournal,
    PostgresJournal,
    execution,
)
from pydantic_ai_durable._core import SimulatedCrash
from pydantic_ai_durable.testing import crash_at

POSIX = pytest.mark.skipif(sys.platform == 'win32', reason='needs fork and SIGKILL')


async def _states(journal: Journal) -> dict[str, str]:
    return {info.key: info.state for info in await journal.list_executions()}


# -- FN-1: a finished execution is kept, and a retry replays it -------------------------------------


async def test_fn1_a_retry_of_a_finished_key_makes_no_model_request_and_runs_no_tool(
    new_journal: Callable[[], Journal],
) -> None:
    calls = Calls()
    async with execution('done', journal=new_journal()):
        first = await two_step_agent(None, calls).run('q')
    assert (calls['model'], calls['tool']) == (2, 1)
    assert await _states(new_journal()) == {'done': 'finished'}

    async with execution('done', journal=new_journal()) as handle:
        again = await two_step_agent(None, calls).run('q')
    assert (calls['model'], calls['tool']) == (2, 1)  # nothing ran again
    assert again.output == first.output
    assert handle.stats.recorded.total() == 0 and handle.stats.replayed == {'model': 2, 'tool': 1}
    assert await _states(new_journal()) == {'done': 'finished'}


async def test_fn1_cleanup_execution_deletes_on_success_for_a_key_reused_for_new_work(
    new_journal: Callable[[], Journal],
) -> None:
    calls = Calls()
    for _ in range(2):
        async with execution('daily', journal=new_journal(), cleanup='execution'):
            await two_step_agent(None, calls).run('q')
    assert (calls['model'], calls['tool']) == (4, 2)
    assert await _states(new_journal()) == {}


def test_fn1_cleanup_never_names_its_replacement() -> None:
    with pytest.raises(ValueError, match=r"cleanup='keep'.*retention=None"):
        execution('k', cleanup='never')  # type: ignore[arg-type]


WORKER = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys, time
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai_durable import DiskJournal, Durable, ExecutionBusy, PostgresJournal, execution
    from pydantic_ai_durable.testing import crash_at

    config = json.loads(sys.argv[1])

    def note(line):
        with open(config['effects'], 'a') as file:
            file.write(line + '\\n')

    def model(messages, info):
        done = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        note(f'model {len(done)}')
        if not done:
            return ModelResponse(parts=[ToolCallPart('lookup', {'order': 7}, tool_call_id='l1')])
        if len(done) == 1:
            return ModelResponse(parts=[ToolCallPart('append', {'line': 'shipped 7'}, tool_call_id='a1')])
        return ModelResponse(parts=[TextPart(' / '.join(done))])

    def lookup(order: int) -> str:
        note('lookup')
        return f'order {order} found'

    def append(line: str) -> str:
        note('append ' + line)  # the side effect that must happen once over all attempts
        return 'appended'

    def journal():
        if 'disk' in config:
            return DiskJournal(config['disk'])
        return PostgresJournal(config['dsn'], schema=config['schema'])

    class Ending:
        '''Kills the process as the scope's end writes the finished record: before it, or after it.'''

        def __init__(self, inner, when):
            self.inner, self.when = inner, when

        def __getattr__(self, name):
            return getattr(self.inner, name)

        async def write_execution(self, key, value, *, epoch):
            if value.get('status') == 'finished' and self.when == 'before-finished':
                os.kill(os.getpid(), signal.SIGKILL)
            written = await self.inner.write_execution(key, value, epoch=epoch)
            if value.get('status') == 'finished' and self.when == 'after-finished':
                os.kill(os.getpid(), signal.SIGKILL)
            return written

    agent = Agent(
        FunctionModel(model, model_name='fn1'),
        name='fn1',
        toolsets=[FunctionToolset([lookup, append], id='t')],
        capabilities=[Durable()],
    )

    async def attempt(kill):
        j = journal()
        if kill['where'] in ('before-finished', 'after-finished'):
            j = Ending(j, kill['where'])
        deadline = time.monotonic() + 60
        while True:
            try:
                if kill['where'] == 'step':
                    with crash_at(position=kill['position'], point=kill['point'], kill=True):
                        async with execution('order-7', journal=j, lease_ttl=1.0) as handle:
                            result = await agent.run('ship order 7')
                else:
                    async with execution('order-7', journal=j, lease_ttl=1.0) as handle:
                        result = await agent.run('ship order 7')
                break
            except ExecutionBusy:  # a killed holder's lease is waited out on PostgreSQL (CC-4)
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        if kill['where'] == 'after-scope':
            os.kill(os.getpid(), signal.SIGKILL)
        report = {'output': result.output, 'recorded': handle.stats.recorded.total()}
        note('report ' + json.dumps(report))

    for line in sys.stdin:
        kill = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                asyncio.run(attempt(kill))
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({'signal': os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
                          'code': os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}), flush=True)
    """
)

KILL_POINTS: list[dict[str, Any]] = [
    *(
        {'where': 'step', 'position': position, 'point': point}
        for position in range(5)
        for point in ('before_body', 'after_record')
    ),
    {'where': 'before-finished'},
    {'where': 'after-finished'},
    {'where': 'after-scope'},
]
"""Where an attempt dies: at a step boundary (5 steps), while the scope's end marks it finished, or after it."""


class _Worker:
    """A process that imported the agent once and forks one attempt per line it is sent."""

    def __init__(self, tmp_path: Path, config: dict[str, Any]) -> None:
        script = tmp_path / 'worker.py'
        script.write_text(WORKER)
        self.process = subprocess.Popen(
            [sys.executable, str(script), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def attempt(self, kill: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(kill) + '\n')
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


@POSIX
@pytest.mark.once  # two minutes of killed processes at points of the package's own scope, whatever the pydantic-ai
@pytest.mark.parametrize('backend', ['disk', 'postgres'])
def test_fn1_sigkill_before_inside_and_after_the_scopes_end_repeats_no_side_effect(
    tmp_path: Path, backend: str
) -> None:
    chance = random.Random(24)
    trials = [chance.choice(KILL_POINTS) for _ in range(20)]
    for kill in KILL_POINTS[-3:]:  # every way to die at the end is tried at least once
        if kill not in trials:
            trials[chance.randrange(len(trials))] = kill
    worker = _Worker(tmp_path, {})
    try:
        for number, kill in enumerate(trials):
            config: dict[str, Any] = {'effects': str(tmp_path / f'effects-{number}')}
            if backend == 'disk':
                config['disk'] = str(tmp_path / f'journal-{number}')
            else:
                config['dsn'], config['schema'] = fresh_schema()
            worker.close()
            worker = _Worker(tmp_path, config)
            died = worker.attempt(kill)
            assert died['signal'] == signal.SIGKILL, (kill, died)
            retried = worker.attempt({'where': 'none'})
            assert retried == {'signal': 0, 'code': 0}, kill
            finished_again = worker.attempt({'where': 'none'})  # a retry of a finished key
            assert finished_again == {'signal': 0, 'code': 0}, kill
            lines = Path(config['effects']).read_text().splitlines()
            assert lines.count('append shipped 7') == 1, (kill, lines)
            assert lines.count('lookup') == 1, (kill, lines)
            reports = [json.loads(line.removeprefix('report ')) for line in lines if line.startswith('report ')]
            assert reports[-1] == {'output': 'order 7 found / appended', 'recorded': 0}, (kill, lines)
    finally:
        worker.close()


# -- FN-2: retention ----------------------------------------------------------------------------------


async def _finish(journal: Journal, key: str, **options: Any) -> None:
    async with execution(key, journal=journal, **options):
        await two_step_agent(None, Calls()).run('q')


async def test_fn2_retention_deletes_only_finished_executions_past_their_period(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    await _finish(journal, 'short', retention=0.5)
    await _finish(journal, 'forever', retention=None)
    await _finish(journal, 'week')  # the journal's default: seven days
    with pytest.raises(RuntimeError):
        async with execution('failed', journal=journal, retention=0.5):
            await two_step_agent(None, Calls(), fail_final=True).run('q')
    with pytest.raises(SimulatedCrash):
        async with execution('interrupted', journal=journal, retention=0.5):
            with crash_at(position=1):
                await two_step_agent(None, Calls()).run('q')
    running = execution('running', journal=journal, retention=0.5)
    await running.__aenter__()
    try:
        await asyncio.sleep(0.7)
        assert await journal.prune() == ['short']
        assert await journal.prune() == []
        assert await _states(journal) == {
            'failed': 'failed',
            'forever': 'finished',
            'interrupted': 'interrupted',
            'running': 'running',
            'week': 'finished',
        }
        infos = {info.key: info for info in await journal.list_executions()}
        assert infos['forever'].retain_until is None
        assert infos['week'].retain_until is not None and infos['week'].retain_until > time.time() + 6.9 * 86400
    finally:
        await running.__aexit__(None, None, None)


async def test_fn2_the_end_of_a_successful_attempt_prunes_expired_executions(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    deadline = time.time() + 3.0  # all ten expire after the last is written, whatever the pace of this machine
    for n in range(10):  # old-0 first, old-9 last, 50 ms apart
        await _finish(journal, f'old-{n}', retention=max(0.0, deadline + 0.05 * n - time.time()))
    await asyncio.sleep(max(0.0, deadline + 0.5 - time.time()) + 0.2)
    # the order is the stored retain_until, not the order of writing: on a loaded machine one finish can
    # take longer than the 50 ms between two deadlines
    until = {info.key: info.retain_until for info in await journal.list_executions() if info.key.startswith('old-')}
    present = sorted(until, key=lambda k: (until[k] or 0.0, k))
    await _finish(journal, 'next')  # deletes at most 8 of the expired ones, those whose retention ended first
    left = sorted(await _states(journal))
    assert left == sorted(['next', *present[8:]]), (present, left)
    await _finish(journal, 'after')
    assert sorted(await _states(journal)) == ['after', 'next']


async def test_fn2_prune_without_a_limit_deletes_every_expired_execution_however_many(
    new_journal: Callable[[], Journal],
) -> None:
    """`prune()` goes through the whole retention index, past any batch a backend reads it in.

    The disk journal read the index 1,000 rows at a time and stopped after the first batch, so a journal
    that fell behind (a process down for a while) kept the rest until later prunes got to them.
    """
    journal = new_journal()
    operator = Operator(journal)
    keys = [f'due-{n:04d}' for n in range(1_050)]
    for key in keys:
        record = {'v': 1, 'key': key, 'runs': [], 'attempts': 1, 'status': 'finished', 'retention': 0.0}
        assert await operator.write_execution(key, record)
    held = await journal.acquire_lease(keys[0], 'tests-live-holder', 60)  # due, but a live lease holds it
    try:
        first = await journal.prune(limit=1_020)  # past the first batch, and past the one it may not delete
        assert len(first) == 1_020 and keys[0] not in first
        assert sorted(first + await journal.prune()) == keys[1:]
        assert [info.key for info in await journal.list_executions()] == [keys[0]]
    finally:
        await journal.release_lease(keys[0], 'tests-live-holder', held.epoch)
    assert await journal.prune() == [keys[0]]


async def test_fn2_a_finished_execution_entered_again_is_out_of_retention_until_it_ends(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    await _finish(journal, 'again', retention=0.2)

    async def reenter() -> None:
        async with execution('again', journal=journal, retention=0.2):
            await asyncio.sleep(0.5)
            assert await journal.prune() == []  # running again: neither expired nor live-deletable
            assert (await _states(journal))['again'] == 'running'

    await reenter()
    assert (await _states(journal))['again'] == 'finished'
    await asyncio.sleep(0.3)
    assert await journal.prune() == ['again']


def test_fn2_retention_values_are_checked(tmp_path: Path) -> None:
    import datetime

    assert DiskJournal(tmp_path, retention=datetime.timedelta(hours=1)).retention == 3600.0
    with pytest.raises(ValueError, match='finite number of seconds'):
        execution('k', retention=-1)
    with pytest.raises(TypeError, match='timedelta, or None'):
        MemoryJournal(retention='7d')  # type: ignore[arg-type]


# -- FN-3: states -------------------------------------------------------------------------------------


async def test_fn3_states_after_success_failure_and_a_crash(new_journal: Callable[[], Journal]) -> None:
    journal = new_journal()
    await _finish(journal, 'ok')
    with pytest.raises(RuntimeError):
        async with execution('bad', journal=journal):
            await two_step_agent(None, Calls(), fail_final=True).run('q')
    with pytest.raises(SimulatedCrash):
        async with execution('crashed', journal=journal):
            with crash_at(position=1):
                await two_step_agent(None, Calls()).run('q')
    assert await _states(journal) == {'bad': 'failed', 'crashed': 'interrupted', 'ok': 'finished'}
    assert [info.key for info in await journal.list_executions(state='interrupted')] == ['crashed']
    assert [info.key for info in await journal.list_executions(state=('failed', 'finished'))] == ['bad', 'ok']
    with pytest.raises(ValueError, match='Unknown execution state asleep'):
        await journal.list_executions(state='asleep')  # type: ignore[arg-type]


KILLED_HOLDER = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from pydantic_ai_durable import DiskJournal, PostgresJournal, execution

    config = json.loads(sys.argv[1])
    if 'disk' in config:
        journal = DiskJournal(config['disk'])
    else:
        journal = PostgresJournal(config['dsn'], schema=config['schema'])

    async def main():
        async with execution('killed', journal=journal, lease_ttl=2.0, metadata={'order': 7}):
            os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


def _kill_a_holder(tmp_path: Path, config: dict[str, Any]) -> None:
    script = tmp_path / 'holder.py'
    script.write_text(KILLED_HOLDER)
    done = subprocess.run([sys.executable, str(script), json.dumps(config)], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr


@POSIX
def test_fn3_a_killed_holder_is_interrupted_at_once_on_disk_and_after_its_lease_on_postgres(tmp_path: Path) -> None:
    disk = tmp_path / 'disk'
    _kill_a_holder(tmp_path, {'disk': str(disk)})
    infos = asyncio.run(DiskJournal(disk).list_executions())
    assert [(info.key, info.state, info.metadata) for info in infos] == [('killed', 'interrupted', {'order': 7})]

    dsn, schema = fresh_schema()
    _kill_a_holder(tmp_path, {'dsn': dsn, 'schema': schema})

    async def states() -> list[str]:
        journal = PostgresJournal(dsn, schema=schema)
        try:
            return [info.state for info in await journal.list_executions()]
        finally:
            await journal.close()

    assert asyncio.run(states()) == ['running']  # a closed session proves nothing (CC-4)
    time.sleep(2.2)
    assert asyncio.run(states()) == ['interrupted']


@POSIX
def test_fn3_the_cli_judges_a_just_killed_holder_as_the_engine_does(tmp_path: Path) -> None:
    journal = tmp_path / 'journal'
    _kill_a_holder(tmp_path, {'disk': str(journal)})
    locks = list((journal / 'locks').iterdir())
    assert len(locks) == 1  # the dead process's lock file is still there

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, '-m', 'pydantic_ai_durable', '--journal', str(journal), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    listed = json.loads(cli('list', '--json').stdout)
    assert [(item['key'], item['state'], item['metadata']) for item in listed] == [
        ('killed', 'interrupted', {'order': 7})
    ]
    assert json.loads(cli('list', '--state', 'interrupted', '--json').stdout)[0]['key'] == 'killed'
    assert json.loads(cli('list', '--state', 'running', '--json').stdout) == []
    deleted = cli('delete', 'killed')  # no --force: nobody holds it
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted execution 'killed' (interrupted" in deleted.stdout
    assert list((journal / 'locks').iterdir()) == []
    assert json.loads(cli('list', '--json').stdout) == []


# -- FN-4: metadata -----------------------------------------------------------------------------------


async def test_fn4_metadata_round_trip(new_journal: Callable[[], Journal]) -> None:
    journal = new_journal()
    metadata = {'order': 42, 'queue': 'billing', 'tags': ['a', 'é'], 'retry': None, 'cost': 1.5}
    await _finish(journal, 'meta', metadata=metadata)
    [info] = await journal.list_executions()
    assert info.metadata == metadata
    await _finish(journal, 'meta')  # an attempt without metadata keeps what was stored
    assert [info.metadata for info in await journal.list_executions()] == [metadata]
    await _finish(journal, 'meta', metadata={'order': 43})
    assert [info.metadata for info in await journal.list_executions()] == [{'order': 43}]


@pytest.mark.parametrize(
    ('metadata', 'error', 'match'),
    [
        ({'when': object()}, TypeError, 'only JSON data'),
        ({'nan': float('nan')}, TypeError, 'only JSON data'),
        ({1: 'int key'}, TypeError, 'str keys'),
        (['a', 'list'], TypeError, 'JSON object'),
        ({'big': 'x' * 20_000}, ValueError, 'more than 16384'),
    ],
)
def test_fn4_metadata_that_is_not_a_small_json_object_is_refused_before_anything_runs(
    tmp_path: Path, metadata: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        execution('k', journal=DiskJournal(tmp_path / 'j'), metadata=metadata)
    assert not (tmp_path / 'j').exists()  # nothing was opened, nothing ran


# -- FN-5: one scope per key ----------------------------------------------------------------------------


async def test_fn5_an_execution_entered_inside_itself_raises() -> None:
    journal = MemoryJournal()
    async with execution('outer', journal=journal):
        with pytest.raises(DurableError, match=r"execution\('outer'\) is already active"):
            async with execution('outer', journal=journal):
                pass
        async with execution('another', journal=journal):  # another key nests as before
            pass

        async def elsewhere_attempt() -> None:
            async with execution('outer', journal=journal):
                pass

        with pytest.raises(Exception, match='held by another live attempt'):
            await elsewhere(elsewhere_attempt())  # a separate attempt of the same key is busy, not nested


def test_fn5_a_sync_execution_entered_inside_itself_raises() -> None:
    with (
        execution('outer', journal=MemoryJournal()),
        pytest.raises(DurableError, match='already active'),
        execution('outer'),
    ):
        pass


# -- B-15, B-16: the directory an attempt writes to ------------------------------------------------------


async def test_b15_a_journal_directory_moved_while_an_attempt_runs_stops_it_at_its_next_write(tmp_path: Path) -> None:
    path = tmp_path / 'journal'
    calls = Calls()
    agent = two_step_agent(DiskJournal(path), calls)
    with pytest.raises(JournalUnavailable, match='no longer the one this process opened'):
        async with execution('moved', cleanup='keep', write_timeout=0.3):
            await agent.run('first')  # recorded in the directory as it was
            path.rename(tmp_path / 'moved-away')
            await agent.run('second')
    assert calls['model'] == 2 and calls['tool'] == 1  # the second run stopped before its first step
    moved = DiskJournal(tmp_path / 'moved-away')
    assert [info.key for info in await moved.list_executions()] == ['moved']
    await moved.close()

    calls = Calls()  # a new attempt at the old path follows the path: a journal of its own, nothing mixed
    async with execution('moved', journal=DiskJournal(path)):
        await two_step_agent(None, calls).run('first')
    assert calls['model'] == 2


def test_b16_a_journal_directory_every_user_may_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / 'open-to-all'
    path.mkdir()
    path.chmod(0o777)
    journal = DiskJournal(path)
    for _ in range(2):  # asked again, the journal refuses again: nothing of the first opening was kept
        with pytest.raises(JournalUnavailable, match=r'can be written by every user \(mode 0o777\).*chmod o-w'):
            asyncio.run(journal.open())


def test_b16_a_group_writable_journal_directory_is_reported_once_unless_shared_on_purpose(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / 'group'
    path.mkdir()
    path.chmod(0o770)
    for _ in range(2):
        journal = DiskJournal(path)
        asyncio.run(journal.open())
        asyncio.run(journal.close())
    warnings = [r.getMessage() for r in caplog.records if 'can be written by its group' in r.getMessage()]
    assert len(warnings) == 1 and 'DiskJournal(mode=0o660)' in warnings[0]
    shared = tmp_path / 'shared'
    shared.mkdir()
    shared.chmod(0o2770)
    caplog.clear()
    asyncio.run(DiskJournal(shared, mode=0o660).open())
    assert not [r for r in caplog.records if 'can be written by its group' in r.getMessage()]
