"""Where a fleet's sweep runs: a thread of a worker's main process, or a task on a worker's event loop.

A worker whose main process runs no event loop (Celery, RQ, Dramatiq) starts a `SweepThread`; a worker
that is an event loop (Procrastinate, arq) calls `sweep_on_this_loop` from any coroutine it runs. Either
way the sweep runs beside the queue, never as a job of it, so it never waits behind the work it recovers
(FL-11). A round that fails is logged and the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading

from ._fleet import Fleet

__all__ = ('SweepThread', 'sweep_on_this_loop')

log = logging.getLogger('pydantic_ai_durable')


def _next_round(fleet: Fleet) -> float:
    return fleet.period * random.uniform(0.8, 1.2)  # workers' sweeps drift apart


async def _round(fleet: Fleet) -> None:
    try:
        await fleet.sweep()
    except Exception as exc:  # a journal or broker that is down now may be back at the next round
        log.warning('pydantic_ai_durable: sweeping for interrupted executions failed: %r', exc)


class SweepThread:
    """A daemon thread that sweeps `fleet` every period, each round on an event loop of its own, until stopped."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='pydantic-ai-durable-sweep', daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(_next_round(self.fleet)):
            asyncio.run(_round(self.fleet))


_ON_LOOPS: dict[tuple[int, int], tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]] = {}
_GUARD = threading.Lock()


def sweep_on_this_loop(fleet: Fleet) -> None:
    """Make sure a task on the running event loop sweeps `fleet` every period (once per loop and fleet).

    The task ends with its loop (a worker's `asyncio.run` cancels it when the worker stops).
    """
    loop = asyncio.get_running_loop()
    with _GUARD:
        for ident, (other, task) in list(_ON_LOOPS.items()):
            if task.done() or other.is_closed():
                del _ON_LOOPS[ident]
        ident = (id(loop), id(fleet))
        if ident not in _ON_LOOPS:
            _ON_LOOPS[ident] = (loop, loop.create_task(_forever(fleet), name='pydantic-ai-durable-sweep'))


async def _forever(fleet: Fleet) -> None:
    while True:
        await asyncio.sleep(_next_round(fleet))
        await _round(fleet)
