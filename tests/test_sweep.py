"""The recovery sweep (FL-3): interrupted executions go back to the queue, each once per interruption, and
waiting ones once their calls are decided (WT-4).

Every test counts dispatches on each backend; executions are interrupted the way a killed worker leaves
them (an attempt that never reached its end, its lease free), and sweeps race in threads of their own.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import DeferredToolRequests
from waiting_agent import KEY, attempt

from pydantic_ai_durable import ExecutionInfo, Journal, execution, resolve, sweep_interrupted
from pydantic_ai_durable._core import SimulatedCrash

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

IDLE = 0.3
"""Seconds an execution must be left before a sweep dispatches it, and between two dispatches of it."""


async def _interrupt(journal: Journal, key: str, metadata: dict[str, Any] | None = None, *, wait: bool = True) -> None:
    """Leave `key` as a killed worker leaves it: started, never ended, no live holder (for `IDLE` seconds)."""
    with pytest.raises(SimulatedCrash):
        async with execution(key, journal=journal, metadata=metadata or {'task': 'research', 'id': key}):
            raise SimulatedCrash('the worker died here')
    if wait:
        await asyncio.sleep(IDLE)


class _Queue:
    """What a dispatch enqueued, by key."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.metadata: dict[str, dict[str, Any] | None] = {}
        self._guard = threading.Lock()

    def __call__(self, info: ExecutionInfo) -> None:
        with self._guard:
            self.sent[info.key] += 1
            self.metadata[info.key] = info.metadata


async def test_fl3_an_interrupted_execution_is_dispatched_once_with_its_metadata(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    await _interrupt(journal, 'order-1', {'task': 'research', 'id': 'abc', 'args': ['q']})
    queue = _Queue()
    assert await sweep_interrupted(journal, queue, idle=IDLE) == ['order-1']
    assert queue.metadata['order-1'] == {'task': 'research', 'id': 'abc', 'args': ['q']}
    # The next sweep, and a sweep over another journal object on the same store, leave it alone.
    assert await sweep_interrupted(journal, queue, idle=60) == []
    assert await sweep_interrupted(new_journal(), queue, idle=60) == []
    assert queue.sent == {'order-1': 1}
    # Dispatching changed nothing of what the execution is.
    [info] = await journal.list_executions()
    assert (info.state, info.metadata) == ('interrupted', {'task': 'research', 'id': 'abc', 'args': ['q']})


async def test_fl3_two_sweeps_at_once_dispatch_each_execution_once(new_journal: Callable[[], Journal]) -> None:
    journal = new_journal()
    keys = [f'job-{n}' for n in range(20)]
    for key in keys:
        await _interrupt(journal, key, wait=False)
    await asyncio.sleep(IDLE)
    queue = _Queue()
    start = threading.Barrier(2)
    results: list[list[str]] = []

    def sweep() -> None:
        own = new_journal()  # each worker has a journal object of its own (the same one on memory)
        start.wait()
        results.append(asyncio.run(sweep_interrupted(own, queue, idle=IDLE)))

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results[0] + results[1]) == sorted(keys)
    assert queue.sent == Counter(dict.fromkeys(keys, 1))


async def test_fl3_running_finished_failed_and_recent_executions_are_left_alone(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    queue = _Queue()
    async with execution('finished', journal=journal, metadata={'task': 't'}):
        pass
    with pytest.raises(RuntimeError):
        async with execution('failed', journal=journal, metadata={'task': 't'}):
            raise RuntimeError('the task raised')
    await _interrupt(journal, 'recent')
    async with execution('running', journal=journal, metadata={'task': 't'}):
        assert await sweep_interrupted(journal, queue, idle=IDLE) == ['recent']
        assert await sweep_interrupted(journal, queue, idle=IDLE) == []
    await _interrupt(journal, 'young', wait=False)
    assert await sweep_interrupted(journal, queue, idle=3600) == []  # interrupted, but not for an hour
    assert queue.sent == {'recent': 1}


async def test_fl3_select_keeps_the_sweep_to_its_own_executions(new_journal: Callable[[], Journal]) -> None:
    journal = new_journal()
    await _interrupt(journal, 'ours', {'engine': 'celery', 'task': 'research'})
    await _interrupt(journal, 'theirs', {'engine': 'procrastinate', 'task': 'research'})
    queue = _Queue()

    def ours(info: ExecutionInfo) -> bool:
        return (info.metadata or {}).get('engine') == 'celery'

    assert await sweep_interrupted(journal, queue, idle=IDLE, select=ours) == ['ours']
    # What it did not select is not marked: the other engine's sweep still dispatches it.
    assert await sweep_interrupted(journal, queue, idle=IDLE) == ['theirs']


async def test_fl3_a_dispatch_that_fails_is_tried_again_once_idle_has_passed(
    new_journal: Callable[[], Journal], caplog: pytest.LogCaptureFixture
) -> None:
    journal = new_journal()
    await _interrupt(journal, 'order-2', wait=False)
    sent: list[str] = []

    def broker_down(info: ExecutionInfo) -> None:
        raise ConnectionError('the broker is down')

    assert await sweep_interrupted(journal, broker_down, idle=0.5) == []  # interrupted only just now
    await asyncio.sleep(0.6)
    assert await sweep_interrupted(journal, broker_down, idle=0.5) == []
    assert 'dispatching it again failed (ConnectionError: the broker is down)' in caplog.text
    assert await sweep_interrupted(journal, lambda info: sent.append(info.key), idle=0.5) == []  # marked just now
    await asyncio.sleep(0.6)
    assert await sweep_interrupted(journal, lambda info: sent.append(info.key), idle=0.5) == ['order-2']
    assert sent == ['order-2']


async def test_fl3_an_execution_interrupted_again_after_a_dispatch_is_dispatched_again(
    new_journal: Callable[[], Journal],
) -> None:
    journal = new_journal()
    queue = _Queue()
    await _interrupt(journal, 'order-3')
    assert await sweep_interrupted(journal, queue, idle=IDLE) == ['order-3']
    await _interrupt(journal, 'order-3')  # the dispatched task ran, and its worker died too
    assert await sweep_interrupted(journal, queue, idle=IDLE) == ['order-3']
    async with execution('order-3', journal=journal) as handle:  # the third attempt ends it
        pass
    assert handle.attempt == 3
    assert await sweep_interrupted(journal, queue, idle=IDLE) == []
    assert queue.sent == {'order-3': 2}


async def test_fl3_an_async_dispatch_is_awaited(new_journal: Callable[[], Journal]) -> None:
    journal = new_journal()
    await _interrupt(journal, 'order-4')
    sent: list[str] = []

    async def enqueue(info: ExecutionInfo) -> None:
        await asyncio.sleep(0)
        sent.append(info.key)

    assert await sweep_interrupted(journal, enqueue, idle=IDLE) == ['order-4']
    assert sent == ['order-4']


@pytest.mark.parametrize('idle', [0, -1, 'soon', True])
async def test_fl3_a_bad_idle_is_refused(idle: Any) -> None:
    from pydantic_ai_durable import MemoryJournal

    with pytest.raises(ValueError, match='idle must be a positive number of seconds'):
        await sweep_interrupted(MemoryJournal(), lambda info: None, idle=idle)


@pytest.mark.parametrize('claim_ttl', [0, -1, 'soon', True])
async def test_fl8_a_bad_claim_ttl_is_refused(claim_ttl: Any) -> None:
    from pydantic_ai_durable import MemoryJournal

    with pytest.raises(ValueError, match='claim_ttl must be a positive number of seconds'):
        await sweep_interrupted(MemoryJournal(), lambda info: None, idle=IDLE, claim_ttl=claim_ttl)


async def test_fl3_the_sweep_takes_only_interrupted_executions_never_a_record_of_another_status(
    new_journal: Callable[[], Journal],
) -> None:
    """An execution whose last attempt ended in a state of its own (one that waits for a person) stays put."""
    journal = new_journal()
    await _interrupt(journal, 'order-5', wait=False)
    record = await journal.read_execution('order-5')
    assert record is not None
    lease = await journal.acquire_lease('order-5', 'someone:1:t:1', 30.0, force=True)
    assert await journal.write_execution('order-5', {**record, 'status': 'waiting'}, epoch=lease.epoch)
    await journal.release_lease('order-5', 'someone:1:t:1', lease.epoch)
    await asyncio.sleep(IDLE)
    queue = _Queue()
    assert await sweep_interrupted(journal, queue, idle=IDLE) == []
    assert queue.sent == {}


async def test_wt4_a_waiting_execution_is_sent_once_idle_has_passed_since_its_last_decision_and_never_before(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    """Ready to go on once every call is decided: sent like an interrupted one, once per `idle`; never while a
    call is pending, however long it has waited."""
    journal, log, queue = new_journal(), tmp_path / 'log', _Queue()
    assert isinstance(await attempt(journal, log, 'three'), DeferredToolRequests)  # c2, c3 and c4 pending
    await asyncio.sleep(IDLE)
    assert await sweep_interrupted(journal, queue, idle=IDLE) == []
    await resolve(journal, KEY, approvals={'c2': True, 'c3': False})
    await asyncio.sleep(IDLE)
    assert await sweep_interrupted(journal, queue, idle=IDLE) == []  # c4 still waits for its outside result
    await resolve(journal, KEY, results={'c4': 'delivered'})
    assert await sweep_interrupted(journal, queue, idle=IDLE) == []  # decided just now: its resolver may send it
    await asyncio.sleep(IDLE)
    assert await sweep_interrupted(journal, queue, idle=IDLE) == [KEY]
    assert await sweep_interrupted(new_journal(), queue, idle=IDLE) == []  # once per idle, whoever sweeps
    await asyncio.sleep(IDLE)
    assert await sweep_interrupted(journal, queue, idle=IDLE) == [KEY]  # not started since: sent again
    assert queue.sent == {KEY: 2} and queue.metadata[KEY] is None
    assert isinstance(await attempt(journal, log, 'three'), str)  # the attempt it was sent for goes on
    await asyncio.sleep(IDLE)
    assert await sweep_interrupted(journal, queue, idle=IDLE) == []
    assert [info.state for info in await journal.list_executions()] == ['finished']
