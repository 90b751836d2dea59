"""Leases that fence (B-9..B-14): an attempt that lost its execution writes nothing and runs nothing.

Real processes paused with SIGSTOP, a holder in another pid namespace, clocks that disagree, a
forced delete while an attempt runs, on DiskJournal and PostgresJournal (and MemoryJournal where
no second process is involved).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Calls, elsewhere, two_step_agent
from pg import fresh_schema

from pydantic_ai_durable import (
    DiskJournal,
    ExecutionBusy,
    Journal,
    JournalUnavailable,
    LeaseLost,
    MemoryJournal,
    PostgresJournal,
    execution,
)
from pydantic_ai_durable._cli import main as cli_main
from pydantic_ai_durable._core import Attempt
from pydantic_ai_durable._core._lease import LeaseRenewer
from pydantic_ai_durable._runtime import end_holding, new_holder, ours_and_ended, start_holding
from pydantic_ai_durable.journals import Lease, LeaseRenewal

POSIX = pytest.mark.skipif(sys.platform == 'win32', reason='needs POSIX signals')

CHILD = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai_durable import DiskJournal, Durable, ExecutionBusy, PostgresJournal, execution

    config = json.loads(sys.argv[1])
    role = config['role']

    def note(line):
        with open(config['effects'], 'a') as file:  # closed: in the kernel before anything else happens
            file.write(line + '\\n')

    def model(messages, info):
        returns = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if len(returns) < config['steps']:
            n = len(returns) + 1
            return ModelResponse(parts=[ToolCallPart('work', {'n': n}, tool_call_id=f'call-{n}')])
        return ModelResponse(parts=[TextPart(' '.join(returns))])

    def work(n: int) -> str:
        note(f'{role} {n}')
        time.sleep(config['pause'])
        return f'{role}-{n}'

    if 'disk' in config:
        journal = DiskJournal(config['disk'])
    else:
        journal = PostgresJournal(config['dsn'], schema=config['schema'])
    agent = Agent(
        FunctionModel(model, model_name='split'),
        name='split',
        toolsets=[FunctionToolset([work], id='w')],
        capabilities=[Durable()],
    )

    async def main():
        deadline = time.monotonic() + 60
        while True:
            try:
                scope = execution(config['key'], journal=journal, lease_ttl=config['ttl'], cleanup='keep')
                async with scope as handle:
                    note(f'{role} holds the lease')
                    result = await agent.run('go')
                print(json.dumps({'output': result.output, 'replayed': sum(handle.stats.replayed.values())}))
                return
            except ExecutionBusy:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
            except Exception as exc:
                print(json.dumps({'error': type(exc).__name__, 'message': str(exc)}))
                return

    asyncio.run(main())
    """
)


class Effects:
    """The side effects every attempt's tools noted in one file, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []

    def of(self, role: str) -> list[str]:
        return [line for line in self.lines() if line.startswith(f'{role} ') and line.split()[1].isdigit()]

    def wait_for(self, line: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines():
            assert time.monotonic() < deadline, f'{line!r} never happened: {self.lines()}'
            time.sleep(0.02)


@pytest.fixture(params=['disk', 'postgres'])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[dict[str, Any], Callable[[], Journal]]]:
    """Where the child attempts keep their journal, and how this process opens the same one."""
    if request.param == 'disk':
        path = tmp_path / 'journal'
        yield {'disk': str(path)}, lambda: DiskJournal(path)
    else:
        dsn, schema = fresh_schema()
        yield {'dsn': dsn, 'schema': schema}, lambda: PostgresJournal(dsn, schema=schema)


def start(script: Path, config: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def outcome(process: subprocess.Popen[str]) -> dict[str, Any]:
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


@POSIX
async def test_b9_b10_split_brain_the_paused_attempt_stops_and_the_new_holders_entries_stand(
    tmp_path: Path, store: tuple[dict[str, Any], Callable[[], Journal]]
) -> None:
    where, open_journal = store
    script = tmp_path / 'attempt.py'
    script.write_text(CHILD)
    effects = Effects(tmp_path / 'effects')
    base = {**where, 'key': 'split-brain', 'steps': 6, 'effects': str(effects.path), 'ttl': 2.0}

    a = start(script, {**base, 'role': 'A', 'pause': 0.4})
    effects.wait_for('A 2')  # A is inside its second tool call, its first one recorded
    a.send_signal(signal.SIGSTOP)  # a GC pause, a frozen VM: alive, but neither running nor renewing
    try:
        paused_at = len(effects.of('A'))
        b = start(script, {**base, 'role': 'B', 'pause': 0.4})  # takes the lease once A's has lapsed
        effects.wait_for('B 3')  # B replayed A's first call and runs the rest live
    finally:
        a.send_signal(signal.SIGCONT)
    stale, current = outcome(a), outcome(b)

    assert stale['error'] == 'LeaseLost', stale
    assert 'took it over' in stale['message']
    assert len(effects.of('A')) == paused_at  # 0 side effects of A after B took over
    assert current['output'] == 'A-1 B-2 B-3 B-4 B-5 B-6'

    journal = open_journal()
    try:
        snapshot = await journal.read_run('split-brain', '0')
        tools = [entry['payload'] for _, entry in sorted(snapshot.entries.items()) if entry['kind'] == 'tool']
        assert [tool['result'] for tool in tools] == ['A-1', 'B-2', 'B-3', 'B-4', 'B-5', 'B-6']  # A overwrote none
        record = await journal.read_execution('split-brain')
        assert record is not None and (record['attempts'], record['status']) == (2, 'finished')  # B's record stands
    finally:
        await journal.close()

    later = outcome(start(script, {**base, 'role': 'C', 'pause': 0}))  # a later resume replays B's answer
    assert later == {'output': current['output'], 'replayed': 13}
    assert effects.of('C') == []


async def test_b10_cleanup_of_a_stale_attempt_deletes_nothing(new_journal: Callable[[], Journal]) -> None:
    calls = Calls()
    with pytest.raises(LeaseLost) as lost:
        async with execution('stale', journal=new_journal(), cleanup='execution'):
            await two_step_agent(None, calls).run('q')
            taken = await new_journal().acquire_lease('stale', 'attempt-B', 60, force=True)  # B takes over
            assert await new_journal().write_execution('stale', {'v': 1, 'attempts': 2}, epoch=taken.epoch)
    assert lost.value.holder == 'attempt-B'
    assert 'attempt-B' in str(lost.value)
    assert await new_journal().read_execution('stale') == {'v': 1, 'attempts': 2}  # B's execution stays whole
    assert len((await new_journal().read_run('stale', '0')).entries) == 3


async def test_b10_lease_loss_is_noticed_within_a_third_of_the_ttl_and_stops_the_next_step(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    attempt = Attempt('noticed', journal=journal, default_journal=lambda: journal, cleanup='keep', lease_ttl=1.5)
    run = await attempt.start_run(journal)
    step = run.claim('first', 'tool', 'f')
    await step.start()
    assert await step.record('done')

    took_at = time.monotonic()
    await new_journal().acquire_lease('noticed', 'intruder', 60, force=True)
    keeper = run.state.keeper
    while keeper.lost is None:
        assert time.monotonic() - took_at < 1.5 / 3 + 0.3, 'the renewer did not notice the loss in time'
        await asyncio.sleep(0.01)

    with pytest.raises(LeaseLost, match='intruder'):  # the next step never starts its body
        run.claim('second', 'tool', 's')
    with pytest.raises(LeaseLost):
        await attempt.finish(None)


async def test_b10_a_paused_attempt_renews_before_its_next_step_and_goes_on_when_nobody_took_over(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    attempt = Attempt('paused', journal=journal, default_journal=lambda: journal, cleanup='keep', lease_ttl=0.6)
    run = await attempt.start_run(journal)
    keeper = run.state.keeper
    renewer = LeaseRenewer.of(journal)
    with renewer._guard:
        renewer._keepers.discard(keeper)  # the renewer no longer reaches it, as in a long pause
    await asyncio.sleep(0.8)  # the lease has lapsed by this process's clock

    step = run.claim('after the pause', 'tool', 'f')
    await step.start()  # renewed on the spot: the store says the lease is still this attempt's
    assert await step.record('done')
    await attempt.finish(None)


# -- B-11: one clock -------------------------------------------------------------------------------


@pytest.mark.parametrize('skew', [-600.0, 600.0], ids=['client-behind', 'client-ahead'])
async def test_b11_attempts_whose_clocks_disagree_agree_on_the_holder(
    store: tuple[dict[str, Any], Callable[[], Journal]], monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    _, open_journal = store
    calls = Calls()
    async with execution('clocks', journal=open_journal(), cleanup='keep', lease_ttl=30) as first:
        real_time = time.time
        monkeypatch.setattr(time, 'time', lambda: real_time() + skew)  # the second host's clock is off by 10 min
        try:

            async def second() -> None:
                async with execution('clocks', journal=open_journal()):
                    await two_step_agent(None, calls).run('q')

            with pytest.raises(ExecutionBusy) as busy:
                await elsewhere(second())
        finally:
            monkeypatch.setattr(time, 'time', real_time)
        await two_step_agent(None, calls).run('q')
    assert busy.value.holder == first._attempt.holder
    assert calls['model'] == 2  # only the holder ran


async def test_b11_postgres_lease_expiry_is_the_servers_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema)
    try:
        real_time = time.time
        monkeypatch.setattr(time, 'time', lambda: real_time() - 3600)  # a client an hour behind
        first = await journal.acquire_lease('expiry', 'A', 0.5)
        assert abs(first.expires_at - (real_time() + 0.5)) < 5  # the server's now, not the client's
        await asyncio.sleep(0.7)
        assert (await journal.acquire_lease('expiry', 'B', 30)).holder == 'B'  # expired by the server's clock
    finally:
        await journal.close()


# -- B-12: holder identity that survives containers ------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from pydantic_ai_durable import DiskJournal, PostgresJournal, execution

    config = json.loads(sys.argv[1])
    if 'disk' in config:
        journal = DiskJournal(config['disk'])
    else:
        journal = PostgresJournal(config['dsn'], schema=config['schema'])

    async def main():
        async with execution(config['key'], journal=journal, lease_ttl=600):
            print(json.dumps({'pid': os.getpid()}), flush=True)
            sys.stdin.readline()  # hold the lease until told to go

    asyncio.run(main())
    """
)


def _pid_free_here(start: int = 200) -> int:
    """A pid that no process of this pid namespace has, so a holder with it looks dead to a pid check."""
    pid = start
    while Path(f'/proc/{pid}').exists():
        pid += 1
    return pid


@pytest.mark.skipif(not sys.platform.startswith('linux') or shutil.which('unshare') is None, reason='needs unshare')
async def test_b12_a_live_holder_in_another_pid_namespace_is_not_taken_for_dead(
    tmp_path: Path, store: tuple[dict[str, Any], Callable[[], Journal]]
) -> None:
    where, open_journal = store
    script = tmp_path / 'holder.py'
    script.write_text(HOLDER)
    target = _pid_free_here()
    # In a new pid namespace pids start at 1: spend them until the holder's pid is one this namespace lacks.
    command = f'i=2; while [ $i -lt {target - 1} ]; do /bin/true; i=$((i+1)); done; "$0" "$@"'
    config = json.dumps({**where, 'key': 'namespaced'})
    probe = subprocess.run(['unshare', '--pid', '--fork', 'true'], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f'unshare --pid is not permitted here: {probe.stderr.decode().strip()}')
    holder = subprocess.Popen(
        ['unshare', '--pid', '--fork', '--kill-child', 'sh', '-c', command, sys.executable, str(script), config],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        seen = json.loads(holder.stdout.readline())['pid']
        if Path(f'/proc/{seen}').exists():
            pytest.skip(f'the holder got pid {seen}, which this namespace also has')
        calls = Calls()
        with pytest.raises(ExecutionBusy) as busy:  # same hostname, its pid missing here: yet alive
            async with execution('namespaced', journal=open_journal()):
                await two_step_agent(None, calls).run('q')
        assert f':{seen}:' in busy.value.holder
        assert calls['model'] == 0
    finally:
        holder.kill()  # unshare --kill-child: the namespace's processes die with it, a moment later
        holder.wait()
    if 'dsn' in where:  # a session that ended proves nothing on PostgreSQL: the lease is waited out (CC-4)
        await asyncio.sleep(1.0)
        with pytest.raises(ExecutionBusy):
            async with execution('namespaced', journal=open_journal()):
                pass
        return
    deadline = time.monotonic() + 5  # far below the holder's 600 s lease: taken over once it is gone
    while True:
        try:
            async with execution('namespaced', journal=open_journal()):
                await two_step_agent(None, Calls()).run('q')
            break
        except ExecutionBusy:
            assert time.monotonic() < deadline, 'the dead holder was not taken over'
            await asyncio.sleep(0.05)


# -- B-13: delete and prune respect live leases ----------------------------------------------------


async def test_b13_delete_force_takes_the_lease_so_the_running_attempt_stops(tmp_path: Path) -> None:
    path = tmp_path / 'journal'
    calls = Calls()
    agent = two_step_agent(None, calls)
    with pytest.raises(LeaseLost):
        async with execution('forced', journal=DiskJournal(path), cleanup='keep'):
            await agent.run('first run')
            code = await asyncio.to_thread(cli_main, ['--journal', str(path), 'delete', 'forced', '--force'])
            assert code == 0
            await agent.run('second run')  # stops before its first step: the lease is the deleter's
    assert calls['model'] == 2 and calls['tool'] == 1  # nothing of the second run ran
    journal = DiskJournal(path)
    assert await journal.list_executions() == []  # and the stale attempt wrote nothing back
    await journal.close()


def test_b13_delete_without_force_refuses_a_running_execution_even_when_its_status_reads_stale(
    tmp_path: Path,
) -> None:
    path = tmp_path / 'journal'

    async def hold_and_delete() -> int:
        async with execution('held', journal=DiskJournal(path), cleanup='keep'):
            await two_step_agent(None, Calls()).run('q')
            return await asyncio.to_thread(cli_main, ['--journal', str(path), 'delete', 'held'])

    assert asyncio.run(hold_and_delete()) == 1
    assert [info.key for info in asyncio.run(DiskJournal(path).list_executions())] == ['held']


# -- B-14: the renewer keeps one connection --------------------------------------------------------


async def test_cc2_renewals_reuse_the_pools_connections() -> None:
    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema)
    renewals = 0
    real = journal.renew_leases

    async def counting(leases: Any) -> Any:
        nonlocal renewals
        renewals += 1
        return await real(leases)

    journal.renew_leases = counting  # type: ignore[method-assign]
    calls = Calls()
    async with execution('renewals', journal=journal, lease_ttl=0.3):  # a renewal every 0.1 s
        await asyncio.sleep(1.5)
        await two_step_agent(None, calls).run('q')
    pool = journal._connections._pool
    assert pool is not None
    opened = pool.get_stats().get('connections_num', 0)
    await journal.close()
    assert renewals >= 5
    assert 1 <= opened <= 2, opened  # however many renewals: the pool's connections serve them all


# -- B-18: an entry that fails holds nothing afterwards --------------------------------------------


class _Entering(MemoryJournal):
    """A memory journal whose lease is taken only when the test lets it, and whose renewals are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.taking = asyncio.Event()
        self.go_on = asyncio.Event()
        self.renewed: list[str] = []  # appended on the background loop's thread

    async def acquire_lease(self, key: str, holder: str, ttl: float, *, force: bool = False) -> Lease:
        self.taking.set()
        await self.go_on.wait()
        return await super().acquire_lease(key, holder, ttl, force=force)

    async def renew_leases(self, renewals: list[LeaseRenewal]) -> list[Lease | None]:
        self.renewed.extend(renewal.holder for renewal in renewals)
        return await super().renew_leases(renewals)


async def test_b18_an_entry_cancelled_while_taking_its_lease_leaves_no_lease_and_nothing_renewing_it() -> None:
    journal = _Entering()
    scope = execution('cancelled', journal=journal, lease_ttl=0.3)  # a renewal every 0.1 s while held
    entering = asyncio.ensure_future(scope.__aenter__())
    await journal.taking.wait()
    entering.cancel()  # the caller gave up (a timeout, a shutdown) while the lease was being taken
    with pytest.raises(asyncio.CancelledError):
        await entering
    journal.go_on.set()  # the store answers after all
    for _ in range(50):  # room for several renewal rounds, had anything kept the lease
        await asyncio.sleep(0.02)
    holder = scope._attempt.holder
    assert holder not in journal.renewed, 'a lease nobody holds was renewed'
    assert ours_and_ended(holder)
    async with execution('cancelled', journal=journal) as handle:  # taken at once, no ExecutionBusy
        assert handle.attempt == 1  # the abandoned entry recorded no attempt


async def test_b18_entries_refused_as_busy_leave_no_holder_registered() -> None:
    journal = MemoryJournal()
    holding = new_holder()  # another attempt of this process, running
    start_holding(holding)
    try:
        await journal.acquire_lease('busy', holding, 3600)
        refused = [execution('busy', journal=journal) for _ in range(3)]
        for scope in refused:
            with pytest.raises(ExecutionBusy):
                await scope.__aenter__()
    finally:
        end_holding(holding)
    assert all(ours_and_ended(scope._attempt.holder) for scope in refused)


async def test_b18_jf3_an_entry_whose_start_was_refused_leaves_a_lease_this_process_takes_over_at_once() -> None:
    class RefusesTheStart(MemoryJournal):  # the store fails as the entry writes its record, and as it lets go
        failing = True

        async def write_execution(self, key: str, record: dict[str, Any], *, epoch: int) -> bool:
            if self.failing:
                raise OSError(28, 'No space left on device')
            return await super().write_execution(key, record, epoch=epoch)

        async def release_lease(self, key: str, holder: str, epoch: int) -> None:
            if self.failing:
                raise OSError(28, 'No space left on device')
            await super().release_lease(key, holder, epoch)

    journal = RefusesTheStart()
    with pytest.raises(JournalUnavailable, match='No space left'):
        async with execution('refused', journal=journal, lease_ttl=3600, write_timeout=0):
            pass
    journal.failing = False
    async with execution('refused', journal=journal, lease_ttl=3600) as handle:  # no waiting for the hour
        assert handle.attempt == 1
