"""The Celery adapter where no worker delivers: `.apply()`, eager apps, direct calls (FL-9), and its checks.

Tests and scripts run a Celery task in the calling process. Such a run has no delivery to retry, so a
busy execution is waited for (at most one `lease_ttl`) and then refused with `ExecutionBusy` naming its
holder, never retried by recursion; a free one runs durably under its task id; and a call of the task
function has an id of its own, never shared with another call. Real agents, real disk journals, the
effects log of the fleet tests; no broker is needed. Beside them, the checks the adapter makes without a
worker: a process patched for green threads (FL-10) and the Kombu internals it reads (FL-13).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Effects
from fleet_agent import TOOLS, approval_output, expected_output, make_agent, make_approval_agent, note

from pydantic_ai_durable import DiskJournal, ExecutionBusy, execution

pytestmark = pytest.mark.fleet

LEASE_TTL = 1.0


class App:
    """A Celery app of its own with one durable task over a disk journal, and the effects log."""

    def __init__(self, root: Path, *, eager: bool = False) -> None:
        from celery import Celery

        from pydantic_ai_durable.celery import durable_task

        self.path = root / 'journal'
        self.effects = Effects(root / 'effects.log', root / 'holds')
        self.celery = Celery(f'eager-{root.name}', broker='memory://', backend='cache+memory://')
        self.celery.conf.update(task_always_eager=eager, task_store_eager_result=True)
        agent = make_agent()

        @durable_task(
            self.celery, journal=DiskJournal(self.path), lease_ttl=LEASE_TTL, name='eager.research', shared=False
        )
        async def research(prompt: str) -> str:
            note({'prompt': prompt, 'what': 'body', 'phase': 'start'})
            return (await agent.run(prompt)).output

        self.research: Any = research
        payer = make_approval_agent()

        @durable_task(
            self.celery, journal=DiskJournal(self.path), lease_ttl=LEASE_TTL, name='eager.approve', shared=False
        )
        async def approve(prompt: str) -> object:
            return (await payer.run(prompt)).output

        self.approve: Any = approve

    def states(self) -> dict[str, str]:
        async def read() -> dict[str, str]:
            return {info.key: info.state for info in await DiskJournal(self.path).list_executions()}

        return asyncio.run(read())

    def tool_ends(self, prompt: str) -> int:
        return sum(count for (said, _), count in self.effects.ends().items() if said == prompt)


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> App:
    monkeypatch.setenv('FLEET_EFFECTS', str(tmp_path / 'effects.log'))
    monkeypatch.setenv('FLEET_HOLDS', str(tmp_path / 'holds'))
    return App(tmp_path)


class Holder:
    """Another attempt that holds `key` in a thread of its own until told to let go."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key
        self.holding, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)

    async def _hold(self) -> None:
        async with execution(self.key, journal=DiskJournal(self.path), lease_ttl=LEASE_TTL):
            self.holding.set()
            await asyncio.to_thread(self.release.wait, 60)

    def __enter__(self) -> Holder:
        self.thread.start()
        assert self.holding.wait(30), 'the holder never entered the execution'
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(30)


@pytest.fixture
def eager_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    monkeypatch.setenv('FLEET_EFFECTS', str(tmp_path / 'effects.log'))
    monkeypatch.setenv('FLEET_HOLDS', str(tmp_path / 'holds'))
    yield App(tmp_path, eager=True)


# -- eager: a busy execution is waited for, then refused; a free one runs durably -------------------


def test_fl9_apply_on_a_busy_execution_raises_execution_busy_naming_the_holder(app: App) -> None:
    with Holder(app.path, 'eager.research:busy-1'):
        result = app.research.apply(args=['busy'], task_id='busy-1')
    assert isinstance(result.result, ExecutionBusy), repr(result.result)
    assert result.result.holder and result.result.holder in str(result.result)
    assert app.effects.count('busy') == 0


def test_fl9_task_always_eager_on_a_busy_execution_raises_execution_busy(eager_app: App) -> None:
    with Holder(eager_app.path, 'eager.research:busy-2'):
        result = eager_app.research.apply_async(args=['busy-eager'], task_id='busy-2')
    assert isinstance(result.result, ExecutionBusy), repr(result.result)
    assert eager_app.effects.count('busy-eager') == 0


def test_fl9_apply_waits_for_a_holder_that_lets_go_within_its_lease(app: App) -> None:
    holder = Holder(app.path, 'eager.research:wait-1').__enter__()
    threading.Timer(0.3, holder.release.set).start()
    result = app.research.apply(args=['waited'], task_id='wait-1')
    holder.__exit__()
    assert result.get() == expected_output('waited')
    assert app.tool_ends('waited') == TOOLS


def test_fl9_apply_on_a_free_execution_runs_durably_under_its_task_id(app: App) -> None:
    first = app.research.apply(args=['free'], task_id='free-1')
    assert first.get() == expected_output('free')
    assert app.states() == {'eager.research:free-1': 'finished'}
    again = app.research.apply(args=['free'], task_id='free-1')  # the same id replays
    assert again.get() == expected_output('free')
    assert app.tool_ends('free') == TOOLS
    assert app.effects.count('free', what='model', phase='start') == TOOLS + 1


def test_fl9_task_always_eager_runs_durably_under_the_task_id(eager_app: App) -> None:
    result = eager_app.research.delay('eager')
    assert result.get() == expected_output('eager')
    assert eager_app.states() == {f'eager.research:{result.id}': 'finished'}


def test_wt4_fl9_apply_of_a_task_that_ends_waiting_returns_the_waiting_object_and_goes_on_once_approved(
    app: App,
) -> None:
    from pydantic_ai_durable import resolve
    from pydantic_ai_durable.fleet import Waiting

    waiting = app.approve.apply(args=['pay'], task_id='pay-1').get()  # nothing retries it: no WAITING state
    assert isinstance(waiting, Waiting) and waiting == {
        'state': 'waiting',
        'key': 'eager.approve:pay-1',
        'pending': ['pay-1'],
    }
    asyncio.run(resolve(DiskJournal(app.path), 'eager.approve:pay-1', approvals={'pay-1': True}))
    assert app.approve.apply(args=['pay'], task_id='pay-1').get() == approval_output('pay')
    assert app.effects.ends()[('pay', 1)] == 1


# -- a direct call of the task function is an execution of its own ---------------------------------


def test_fl9_two_direct_calls_are_two_executions(app: App) -> None:
    assert app.research('direct') == expected_output('direct')
    assert app.research('direct') == expected_output('direct')
    assert app.tool_ends('direct') == 2 * TOOLS  # the second call ran, it did not replay the first
    states = app.states()
    assert len(states) == 2 and set(states.values()) == {'finished'}, states


def test_fl9_direct_calls_from_two_threads_at_once_are_two_executions(app: App) -> None:
    start = threading.Barrier(2)
    outputs: list[Any] = []

    def call(prompt: str) -> None:
        start.wait()
        try:
            outputs.append(app.research(prompt))
        except BaseException as exc:
            outputs.append(exc)

    threads = [threading.Thread(target=call, args=(f'thread-{n}',)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(map(str, outputs)) == [expected_output('thread-0'), expected_output('thread-1')], outputs
    assert len(app.states()) == 2


# -- the one Kombu internal the adapter reads (FL-13) -----------------------------------------------


def test_fl13_the_kombu_internals_are_checked_against_the_tested_range() -> None:
    import re
    import tomllib

    import kombu

    from pydantic_ai_durable.celery import _KOMBU_TESTED, _kombu_redis_problem

    assert _kombu_redis_problem() is None  # the installed Kombu
    root = Path(__file__).resolve().parent.parent
    declared = tomllib.loads((root / 'pyproject.toml').read_text())['project']['optional-dependencies']['celery']
    [bound] = [line for line in declared if line.startswith('kombu')]
    first, last = _KOMBU_TESTED
    assert bound == f'kombu>={first[0]}.{first[1]},<{last[0]}.{last[1] + 1}', bound
    installed = tuple(int(part) for part in re.findall(r'\d+', kombu.__version__)[:2])
    assert first <= installed <= last, f'Kombu {kombu.__version__} is outside the range the adapter was tested with'


def test_fl13_a_kombu_whose_redis_transport_differs_stops_the_worker_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import kombu
    from celery import Celery
    from celery.exceptions import ImproperlyConfigured
    from kombu.transport import redis as transport

    from pydantic_ai_durable import DurableError
    from pydantic_ai_durable.celery import _RedisUnacked, check_settings, durable_task

    app = Celery('kombu-check', broker='redis://127.0.0.1:1/0')
    app.conf.worker_prefetch_multiplier = 1

    @durable_task(app, journal=DiskJournal(tmp_path), name='kombu.check', shared=False)
    def check() -> None: ...

    assert check_settings(app) == []
    monkeypatch.delattr(transport.QoS, 'restore_by_tag')  # as a Kombu that renamed it would be
    with pytest.raises(ImproperlyConfigured, match=r'QoS\.restore_by_tag') as refused:
        check_settings(app)
    assert f'Kombu {kombu.__version__}' in str(refused.value) and 'tested with Kombu 5.5 to 5.7' in str(refused.value)

    class Channel(transport.Channel):  # type: ignore[misc]
        def __init__(self) -> None: ...

    with pytest.raises(DurableError, match=r'QoS\.restore_by_tag'):
        _RedisUnacked(Channel())


@pytest.mark.parametrize('library', ['gevent', 'eventlet'])
def test_fl10_a_durable_task_in_a_process_patched_for_green_threads_refuses_to_run(
    library: str, tmp_path: Path
) -> None:
    import subprocess
    import sys

    patch = (
        'from gevent import monkey; monkey.patch_all()'
        if library == 'gevent'
        else 'import eventlet; eventlet.monkey_patch()'
    )
    script = f"""{patch}
from celery import Celery
from pydantic_ai_durable import DiskJournal
from pydantic_ai_durable.celery import durable_task

app = Celery('green', broker='memory://')

@durable_task(app, journal=DiskJournal({str(tmp_path)!r}), name='green.task', shared=False)
def task():
    print('the body ran')

result = task.apply()
print(type(result.result).__name__, result.result)
"""
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith('DurableError'), done.stdout + done.stderr
    assert f'the {library} pool' in done.stdout and 'prefork' in done.stdout and 'the body ran' not in done.stdout
