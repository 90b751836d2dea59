"""A fleet: the durable tasks of one app of a job queue, how each delivery runs, and how a task is sent again.

An adapter makes one `Fleet` per app (`fleet_of`), giving it the one thing only the adapter knows: how to
send a task again from its recorded `Delivery`, plus, if its broker needs it, a recovery of its own that
each sweep round runs. Everything else is here once: the settings of each task, the execution every
delivery runs in (`run`, `run_sync`) and what it returns when the execution ends waiting, the wait
of a delivery that has no queue to retry it, the sweep over the executions left interrupted or
decided, and `redispatch`, which sends one execution's task again from its metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .. import DurableError, ExecutionBusy, ExecutionInfo, ExecutionWaiting, Journal, sweep_interrupted
from ._delivery import FIXED_FIELDS, Delivery
from ._waiting import Waiting

if TYPE_CHECKING:
    from .. import Execution, execution

__all__ = ('DurableTask', 'Fleet', 'Recover', 'Send', 'check_timing', 'fleet_of', 'redispatch')

log = logging.getLogger('pydantic_ai_durable')

_T = TypeVar('_T')

Send = Callable[[Delivery], Awaitable[None] | None]
"""How an adapter sends a task again: enqueue `delivery.task` under `delivery.id` with its arguments and queue."""

Recover = Callable[[], Awaitable[list[str]]]
"""A recovery of the adapter's own broker, run after each sweep round; returns the keys it sent again."""

_POLL = 0.5
"""The most seconds a delivery that waits for a busy execution sleeps between two tries."""


@dataclass(frozen=True)
class DurableTask:
    """One durable task of a fleet: where its executions go and how soon an interrupted one is sent again."""

    name: str
    journal: Journal
    lease_ttl: float
    """As for `execution()`: how long a dead holder keeps the execution on a store that cannot prove it dead."""
    resume_after: float
    """Seconds an execution stays interrupted before the sweep sends its task again."""


def check_timing(lease_ttl: object, resume_after: object = None) -> tuple[float, float]:
    """`(lease_ttl, resume_after)` in seconds (`resume_after` defaults to `lease_ttl`); `ValueError` unless positive."""
    ttl = _seconds('lease_ttl', lease_ttl)
    return ttl, ttl if resume_after is None else _seconds('resume_after', resume_after)


def _seconds(name: str, value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f'{name} must be a positive number of seconds, not {value!r}.')
    return float(value)


class Fleet:
    """The durable tasks of one app, and what runs them, sweeps them and sends them again (FL-7)."""

    def __init__(self, engine: str, send: Send, *, recover: Recover | None = None) -> None:
        self.engine = engine
        """The `engine` field of every delivery's metadata: which fleet sends the task again."""
        self.tasks: dict[str, DurableTask] = {}
        self._send = send
        self._recover = recover

    def add(
        self, name: str, *, journal: Journal, lease_ttl: float = 30.0, resume_after: float | None = None
    ) -> DurableTask:
        """Register task `name`: `resume_after` defaults to `lease_ttl`; both must be positive seconds."""
        task = DurableTask(name, journal, *check_timing(lease_ttl, resume_after))
        self.tasks[name] = task
        return task

    def task(self, name: str) -> DurableTask:
        found = self.tasks.get(name)
        if found is None:
            raise DurableError(
                f'No durable task named {name!r} is registered in this process for {self.engine}: import the module '
                'that defines it before sending it again.'
            )
        return found

    def delivery(
        self, task: str, task_id: str | int, args: Any = (), kwargs: Any = None, queue: str | None = None
    ) -> Delivery:
        """A delivery of this fleet's task `task` under the queue's id `task_id`."""
        return Delivery(self.engine, task, task_id, tuple(args), dict(kwargs or {}), queue)

    # -- running one delivery --------------------------------------------------------------------

    def _scope(self, delivery: Delivery) -> execution:
        """The execution the delivery runs in: keyed by task and id, its metadata fixed by the first delivery."""
        # Imported here, not with the module: `execution` loads pydantic-ai, and a worker must be able to load
        # an adapter, and refuse a pool or a process it cannot run in, before anything imports pydantic-ai
        # (under eventlet's patching, a dependency of pydantic-ai fails to import at all).
        from .. import execution

        task = self.task(delivery.task)
        return execution(
            delivery.key,
            journal=task.journal,
            lease_ttl=task.lease_ttl,
            metadata=delivery.metadata(),
            fixed_metadata=FIXED_FIELDS,
        )

    async def run(self, delivery: Delivery, body: Callable[[], Awaitable[_T]], *, wait: bool = False) -> _T | Waiting:
        """Run `body()` inside the delivery's execution; see `run_sync` for `wait` and for what it returns."""
        deadline = self._deadline(delivery, wait)
        async with contextlib.AsyncExitStack() as stack:
            while True:
                try:
                    handle = await stack.enter_async_context(self._scope(delivery))
                    break
                except ExecutionBusy as busy:
                    await asyncio.sleep(_pause(busy, deadline))
            try:
                value: _T | None = await body()
            except ExecutionWaiting:  # EV-6: the run handed a resume token on; the delivery ends like WT-4's
                value = None
        return _outcome(delivery, handle, value)

    def run_sync(self, delivery: Delivery, body: Callable[[], _T], *, wait: bool = False) -> _T | Waiting:
        """Run `body()` inside the delivery's execution, in this thread (a plain body that calls `run_sync`).

        Returns what `body()` returned, unless the execution ended waiting for a decision: then a `Waiting`
        (`{"state": "waiting", "key": ..., "pending": [call ids]}`), which any queue's JSON serializer takes,
        in place of pydantic-ai's `DeferredToolRequests`. A delivery the queue can retry raises the
        journal's errors for `retry_after` to judge. One it cannot (`wait=True`: Celery's `.apply()`, an
        eager app, a direct call) waits for a busy execution's holder at most one `lease_ttl`, long enough
        for a dead holder to be taken over, then raises `ExecutionBusy` naming the holder (FL-9).
        """
        deadline = self._deadline(delivery, wait)
        with contextlib.ExitStack() as stack:
            while True:
                try:
                    handle = stack.enter_context(self._scope(delivery))
                    break
                except ExecutionBusy as busy:
                    time.sleep(_pause(busy, deadline))
            try:
                value: _T | None = body()
            except ExecutionWaiting:  # EV-6
                value = None
        return _outcome(delivery, handle, value)

    def _deadline(self, delivery: Delivery, wait: bool) -> float | None:
        return time.monotonic() + self.task(delivery.task).lease_ttl if wait else None

    # -- sending again and sweeping --------------------------------------------------------------

    async def send(self, delivery: Delivery) -> None:
        """Enqueue the delivery's task again through the adapter (same id, arguments and queue)."""
        pending = self._send(delivery)
        if pending is not None:
            await pending

    @property
    def period(self) -> float:
        """Seconds between two sweep rounds: a third of the shortest `resume_after`, at least one."""
        return max(1.0, min((task.resume_after for task in self.tasks.values()), default=3.0) / 3)

    async def sweep(self) -> list[str]:
        """One round: send again each execution of these tasks left interrupted, or waiting with every call
        decided, then run the adapter's recovery.

        Executions are grouped by journal and `resume_after`; each is claimed for no longer than the
        sweep's period, so a sweeping process that dies holding a claim delays it by one period at most.
        Returns the keys sent again.
        """
        groups: dict[tuple[int, float], tuple[Journal, set[str]]] = {}
        for task in self.tasks.values():
            groups.setdefault((id(task.journal), task.resume_after), (task.journal, set()))[1].add(task.name)
        sent: list[str] = []
        for (_, idle), (journal, names) in groups.items():

            async def dispatch(info: ExecutionInfo, journal: Journal = journal) -> None:
                await redispatch(journal, info.key, fleet=self)

            sent += await sweep_interrupted(
                journal, dispatch, idle=idle, select=self._selector(names), claim_ttl=min(idle, self.period)
            )
        if self._recover is not None:
            sent += await self._recover()
        return sent

    def _selector(self, names: set[str]) -> Callable[[ExecutionInfo], bool]:
        def select(info: ExecutionInfo) -> bool:
            delivery = Delivery.from_metadata(info.key, info.metadata)
            return delivery is not None and delivery.engine == self.engine and delivery.task in names

        return select


def _outcome(delivery: Delivery, handle: Execution, value: _T | None) -> _T | Waiting:
    """What a delivery returns: the body's value, or `Waiting` when its execution ended waiting."""
    pending = handle.waiting_on
    if pending:
        log.info('Execution %r waits on %s; its delivery ends, and a decision sends it on.', delivery.key, pending)
        return Waiting(delivery.key, pending)
    return value  # type: ignore[return-value]  # `None` only with a wait, which returned above


def _pause(busy: ExecutionBusy, deadline: float | None) -> float:
    """How long to sleep before trying a busy execution again; re-raises `busy` when there is no more waiting."""
    left = -1.0 if deadline is None else deadline - time.monotonic()
    if left <= 0:
        raise busy
    return min(left, _POLL, max(busy.expires_at - time.time(), 0.05))


# -- the fleets of this process ----------------------------------------------------------------------

_FLEETS: dict[tuple[str, int], tuple[object, Fleet]] = {}
_GUARD = threading.Lock()


def fleet_of(app: object, engine: str, start: Callable[[], Fleet]) -> Fleet:
    """The fleet of `app`, made by `start` the first time (which is where an adapter installs its worker hooks)."""
    with _GUARD:
        found = _FLEETS.get((engine, id(app)))
        if found is None:
            found = _FLEETS[(engine, id(app))] = (app, start())  # the app is kept, so its id is not reused
        return found[1]


def _owner(delivery: Delivery) -> Fleet:
    with _GUARD:
        fleets = [fleet for _, fleet in _FLEETS.values()]
    for fleet in reversed(fleets):  # the newest app that registered the task
        if fleet.engine == delivery.engine and delivery.task in fleet.tasks:
            return fleet
    raise DurableError(
        f'Execution {delivery.key!r} is a {delivery.engine} task {delivery.task!r}, and no app of this process '
        'registered a durable task of that name: import the module that defines it before sending it again.'
    )


async def redispatch(journal: Journal, key: str, *, fleet: Fleet | None = None) -> None:
    """Send the task of execution `key` again, from the metadata it recorded, through its fleet.

    The task comes back under its own id, with the arguments and to the queue recorded, and its execution
    replays what was done. The sweep sends interrupted and decided executions through it, and so does
    `resolve(..., dispatch=True)` (the fleet core makes it the process's dispatcher when it is imported).
    `fleet` defaults to the fleet of this process that registered the task. Raises `DurableError` when the
    execution recorded no delivery, or no fleet knows its task.
    """
    record = await journal.read_execution(key)
    delivery = Delivery.from_metadata(key, record.get('metadata') if isinstance(record, dict) else None)
    if delivery is None:
        raise DurableError(
            f'Execution {key!r} recorded no delivery of a durable task (engine, task, id and arguments in its '
            'metadata), so there is nothing to send again; only executions a fleet started can be redispatched.'
        )
    await (fleet if fleet is not None else _owner(delivery)).send(delivery)
