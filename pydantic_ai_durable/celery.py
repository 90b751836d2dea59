"""Celery tasks that run durable agents, and resume them when a worker dies (extra `celery`).

```python
from pydantic_ai_durable.celery import durable_task

@durable_task(app, journal=journal)
async def research(prompt: str) -> str:
    return (await agent.run(prompt)).output
```

What every queue needs is the fleet core's (`pydantic_ai_durable.fleet`: the key, the metadata, the
sweep, the retry delays). This adapter holds what is Celery's: the task options that keep a killed
worker's message, Celery's retries, one event loop per worker process for async bodies,
the worker step that checks settings and pools and runs the sweep, `.apply()`,
eager apps and direct calls, and on Redis the return of a message a dead worker took but never
started (the one place that reads Kombu's internals).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import inspect
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from . import DurableError, Journal
from .fleet import Delivery, Fleet, SweepThread, Waiting, check_timing, execution_key, fleet_of, retry_after

try:
    import kombu
    from celery import Celery, Task, bootsteps
    from celery.exceptions import Ignore, ImproperlyConfigured
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError(
        "pydantic_ai_durable.celery needs Celery, the extra 'celery' of pydantic-ai-durable-journal: "
        f"pip install 'pydantic-ai-durable-journal[celery]' ({exc})."
    ) from exc

__all__ = ('ENGINE', 'POOLS', 'WAITING', 'check_settings', 'durable_task', 'execution_key', 'sweep')

log = logging.getLogger('pydantic_ai_durable')


ENGINE = 'celery'
"""The `engine` field of the metadata a durable task stores with its execution."""

POOLS = ('prefork', 'threads', 'solo')
"""The worker pools durable tasks run on; green pools (gevent, eventlet) are refused."""

WAITING = 'WAITING'
"""The Celery state of a durable task whose execution waits for a decision; its `info` is the fleet's `Waiting`.
Not a ready state: `AsyncResult.get()` returns the output once the task has gone on to it."""

_REDIS_TRANSPORTS = ('redis', 'rediss', 'sentinel')
_VISIBILITY_TRANSPORTS = (*_REDIS_TRANSPORTS, 'sqs')
"""Brokers that hand an unacknowledged message to another worker after a visibility timeout."""

_DEFAULT_VISIBILITY = 3600.0
"""Kombu's visibility timeout for those brokers when the app sets none."""


def _fleet(app: Celery) -> Fleet:
    def start() -> Fleet:
        def send(delivery: Delivery) -> None:
            app.send_task(
                delivery.task,
                args=list(delivery.args),
                kwargs=dict(delivery.kwargs),
                task_id=str(delivery.id),
                queue=delivery.queue,
            )

        fleet = Fleet(ENGINE, send, recover=lambda: _restore_unstarted(app, fleet))
        _install(app, fleet)
        return fleet

    return fleet_of(app, ENGINE, start)


def durable_task(
    app: Celery,
    *,
    journal: Journal,
    lease_ttl: float = 30.0,
    resume_after: float | None = None,
    **options: Any,
) -> Callable[[Callable[..., Any]], Task]:
    """A decorator like `app.task` whose body runs inside `execution(key)`, so a task that comes back replays.

    The key is the task's name and id (`execution_key`); the execution's metadata holds what the sweep
    needs to send it again (`engine`, `task`, `id`, `args`, `kwargs`, `queue`), so keep arguments small
    (ids, not documents: 16 KiB in all), and a later delivery of the id with other arguments is refused
    (`MetadataMismatch`). The body may be `async def` (one event loop per worker process runs it) or a
    plain function that calls `run_sync`. `ExecutionBusy` retries when the holder's lease would end,
    `JournalUnavailable` retries with backoff, and `LeaseLost` is never retried. `.apply()`, an eager app
    and a direct call run durably too, under their task id (a fresh one for a direct call), waiting at most
    `lease_ttl` for a busy execution. A delivery whose run ends waiting for a decision ends in the state
    `WAITING`, its info the fleet's `Waiting`, with no result (an `.apply()` or a direct call returns the
    `Waiting`), and is sent again once decided. Every worker of the app checks its settings and pool
    when it starts and sweeps for executions left interrupted for `resume_after` seconds (default:
    `lease_ttl`), or decided that long ago, to send them again. Other keyword arguments go to `app.task`.
    """
    check_timing(lease_ttl, resume_after)
    durable = _fleet(app)
    for name in ('acks_late', 'reject_on_worker_lost'):
        if options.get(name, True) is not True:
            raise ValueError(
                f'durable_task needs {name}=True: without it a task whose worker is killed is acknowledged and '
                'never comes back, so its execution is never resumed.'
            )
    if options.get('bind'):
        raise ValueError('durable_task binds the task itself; read the task through celery.current_task instead.')

    def decorate(function: Callable[..., Any]) -> Task:
        is_async = inspect.iscoroutinefunction(function)

        @functools.wraps(function)
        def run(self: Task, *args: Any, **kwargs: Any) -> Any:
            _refuse_a_green_process()
            request, name = self.request, str(self.name)
            direct = bool(request.called_directly)  # task(...): no id, no delivery; an execution of its own
            task_id = str(uuid.uuid4()) if direct else request.id
            delivery = durable.delivery(name, task_id, args, kwargs, _queue_of(request))
            wait = direct or bool(request.is_eager)  # no queue retries these: wait here, within a bound (FL-9)
            try:
                if is_async:
                    call = durable.run(delivery, lambda: function(*args, **kwargs), wait=wait)
                    outcome = _worker_loop().run_until_complete(call)
                else:
                    outcome = durable.run_sync(delivery, lambda: function(*args, **kwargs), wait=wait)
            except DurableError as error:
                ttl = durable.task(name).lease_ttl
                retry = None if wait else retry_after(error, attempt=request.retries or 0, lease_ttl=ttl)
                if retry is None:
                    raise
                if retry.taken_over:  # the other delivery of this same id runs it and reports its outcome
                    log.warning('Execution %r was taken over by another delivery, which runs it.', delivery.key)
                    raise Ignore() from None
                retry.log(delivery.key)
                raise self.retry(countdown=retry.delay, exc=None if retry.busy else error) from None
            if wait or not isinstance(outcome, Waiting):
                return outcome
            # The delivery ends, acknowledged and never retried, and the task id keeps no result yet, so
            # its continuation stores the output under it (a backend never overwrites a success).
            try:
                self.update_state(state=WAITING, meta=dict(outcome))
            except Exception as exc:  # the state only informs: the execution record keeps what it waits on
                log.warning('Execution %r waits; its state could not be stored (%r).', delivery.key, exc)
            raise Ignore()

        task_options = {'acks_late': True, 'reject_on_worker_lost': True, 'max_retries': None, **options}
        task = cast(Task, app.task(bind=True, **task_options)(run))
        durable.add(str(task.name), journal=journal, lease_ttl=lease_ttl, resume_after=resume_after)
        return task

    return decorate


def _queue_of(request: Any) -> str | None:
    info = request.delivery_info or {}
    queue = info.get('routing_key') if info.get('exchange') in ('', None) else None
    return queue if isinstance(queue, str) and queue else None


async def sweep(app: Celery) -> list[str]:
    """One sweep round of the app's durable tasks, as every worker runs it; returns the keys sent again."""
    return await _fleet(app).sweep()


# -- one event loop per worker process (FL-5) --------------------------------------------------------

_loops = threading.local()


def _worker_loop() -> asyncio.AbstractEventLoop:
    """The event loop this worker process (or pool thread) runs every async durable task on.

    One loop for the process's life, not one per task: clients the agent keeps (an HTTP client of the model
    provider) stay bound to the loop they were made on.
    """
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, 'loop', None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
    return loop


def _forget_loops() -> None:
    """A forked pool process shares its parent's loop object, and the selector under it: it makes its own."""
    global _loops
    _loops = threading.local()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_loops)


# -- at worker start: the settings, the pool, and the sweep (FL-4) --------------------------------------


def check_settings(app: Celery) -> list[str]:
    """Raise `ImproperlyConfigured` naming each setting that would lose or strand a killed worker's task.

    Returns the warnings for settings that only delay a resume (a prefetch multiplier over 1). Workers call
    it when they start; call it in a deployment check too.
    """
    durable = _fleet(app)
    errors: list[str] = []
    for name, spec in sorted(durable.tasks.items()):
        task = app.tasks.get(name)
        if task is None:
            continue
        if not task.acks_late:
            errors.append(
                f"task {name!r} has acks_late off (task_acks_late, or an annotation): a killed worker's message "
                'was acknowledged when it started, so it never comes back'
            )
        if not task.reject_on_worker_lost:
            errors.append(
                f'task {name!r} has reject_on_worker_lost off (task_reject_on_worker_lost): a killed pool '
                "process's message is acknowledged as failed instead of coming back"
            )
        visibility = _visibility_timeout(app)
        if visibility is not None and visibility < spec.lease_ttl:
            errors.append(
                f"broker_transport_options['visibility_timeout'] is {visibility:g} s, shorter than the lease_ttl of "
                f'task {name!r} ({spec.lease_ttl:g} s): the broker hands every running message to a second '
                'worker before a holder can even be taken over; set it above the longest task'
            )
    if durable.tasks and _transport(app) in _REDIS_TRANSPORTS:
        problem = _kombu_redis_problem()
        if problem is not None:
            errors.append(problem)
    if errors:
        raise ImproperlyConfigured(
            "pydantic_ai_durable: these settings would lose a killed worker's durable task: " + '; '.join(errors) + '.'
        )
    warnings: list[str] = []
    prefetch = app.conf.worker_prefetch_multiplier
    if durable.tasks and isinstance(prefetch, int) and prefetch > 1:
        warnings.append(
            f"worker_prefetch_multiplier is {prefetch}: a killed worker's prefetched messages, which never "
            "started an execution, come back only after the broker's visibility timeout; set it to 1"
        )
    return warnings


def _transport(app: Celery) -> str:
    url = app.conf.broker_url or ''
    return (url.split('://', 1)[0] if '://' in url else str(app.conf.broker_transport or '')).lower()


def _visibility_timeout(app: Celery) -> float | None:
    """The broker's visibility timeout in seconds, or `None` for a broker that has none (AMQP)."""
    if _transport(app) not in _VISIBILITY_TRANSPORTS:
        return None
    options = app.conf.broker_transport_options or {}
    value = options.get('visibility_timeout', _DEFAULT_VISIBILITY)
    return float(value) if isinstance(value, (int, float)) else _DEFAULT_VISIBILITY


def _refuse_a_green_pool(worker: Any) -> None:
    """Stop a worker whose pool runs tasks as greenlets (gevent, eventlet) before it takes a task (FL-10)."""
    pool = getattr(worker, 'pool_cls', None)
    if getattr(pool, 'is_green', False):
        name = str(getattr(pool, '__module__', pool)).rsplit('.', 1)[-1]
        raise ImproperlyConfigured(_green_refusal(name))


def _refuse_a_green_process() -> None:
    """Refuse to run a durable task in a process gevent or eventlet has patched, whatever started it (FL-10)."""
    gevent, eventlet = sys.modules.get('gevent.monkey'), sys.modules.get('eventlet.patcher')
    if gevent is not None and gevent.is_module_patched('socket'):
        raise DurableError(_green_refusal('gevent'))
    if eventlet is not None and eventlet.is_monkey_patched('socket'):
        raise DurableError(_green_refusal('eventlet'))


def _green_refusal(pool: str) -> str:
    return (
        f'pydantic_ai_durable: durable tasks do not run on the {pool} pool, whose tasks are greenlets of one '
        'thread: an agent run needs an asyncio event loop and the journal its own threads and locks, which '
        f'greenlets share and block. Start the worker with -P {" / -P ".join(POOLS)} (an agent that waits on '
        'model APIs runs well on -P threads).'
    )


def _install(app: Celery, fleet: Fleet) -> None:
    """Add the worker step: the settings and pool checks at start, the sweep while the worker runs."""

    class DurableStep(bootsteps.StartStopStep):  # type: ignore[misc]
        """Checks the durable tasks' settings and the pool when the worker starts, then sweeps until it stops."""

        def __init__(self, worker: Any, **kwargs: Any) -> None:
            _refuse_a_green_pool(worker)
            for warning in check_settings(app):
                log.warning('pydantic_ai_durable: %s.', warning)
            self.sweeper: SweepThread | None = None
            super().__init__(worker, **kwargs)

        def start(self, parent: Any) -> None:
            self.sweeper = SweepThread(fleet)
            self.sweeper.start()

        def stop(self, parent: Any) -> None:
            if self.sweeper is not None:
                self.sweeper.stop()

    if app.steps is None:
        raise ImproperlyConfigured('pydantic_ai_durable: this Celery app has no worker steps to add the sweep to.')
    app.steps['worker'].add(DurableStep)


# -- on Redis: a message a dead worker took, but never started ----------------------------------------


@dataclass
class _Taken:
    """A message of the Redis broker a worker took and has not acknowledged."""

    tag: str
    taken_at: float
    headers: dict[str, Any]


class _RedisUnacked:
    """The Redis transport's record of taken messages: the one place that reads Kombu's internals (FL-13).

    Kombu keeps no public API for it. `_kombu_redis_problem` checks what is read here before a worker
    starts, and pyproject.toml bounds Kombu to the versions the tests ran against.
    """

    def __init__(self, channel: Any) -> None:
        problem = _kombu_redis_problem(type(channel))
        if problem is not None:
            raise DurableError(f'pydantic_ai_durable: {problem}.')
        self._qos, self._client = channel.qos, channel.client

    def taken_before(self, ceiling: float) -> list[_Taken]:
        found: list[_Taken] = []
        index, messages = self._qos.unacked_index_key, self._qos.unacked_key
        for tag, taken_at in self._client.zrangebyscore(index, '-inf', ceiling, withscores=True):
            raw = self._client.hget(messages, tag)
            stored = json.loads(raw) if raw else None
            if not (isinstance(stored, list) and stored and isinstance(stored[0], dict)):
                continue  # gone meanwhile (acknowledged), or of a shape this release cannot read
            headers = stored[0].get('headers')
            found.append(_Taken(tag, float(taken_at), headers if isinstance(headers, dict) else {}))
        return found

    def put_back(self, tag: str) -> None:
        self._qos.restore_by_tag(tag, self._client)  # a transaction: of two sweeps, one puts it back


_KOMBU_TESTED = ((5, 5), (5, 7))
"""The Kombu versions, first and last minor, whose Redis transport the tests ran against."""


def _kombu_redis_problem(channel_class: Any = None) -> str | None:
    """What is missing of the Kombu internals `_RedisUnacked` reads, said for a person; `None` if nothing."""
    if channel_class is None:
        from kombu.transport import redis as transport

        channel_class = transport.Channel
    qos = getattr(channel_class, 'QoS', None)
    missing = [
        f'{owner}.{name}'
        for owner, cls, names in (
            ('Channel', channel_class, ('client', 'unacked_key', 'unacked_index_key', 'QoS')),
            ('QoS', qos, ('restore_by_tag', 'unacked_key', 'unacked_index_key')),
        )
        for name in names
        if not hasattr(cls, name)
    ]
    if not missing:
        return None
    first, last = _KOMBU_TESTED
    return (
        f'the Redis transport of Kombu {kombu.__version__} lacks {", ".join(missing)}, which pydantic_ai_durable '
        'reads to put back in its queue a message a dead worker took but never started; it was tested with '
        f'Kombu {first[0]}.{first[1]} to {last[0]}.{last[1]}: install a Kombu in that range'
    )


async def _restore_unstarted(app: Celery, fleet: Fleet) -> list[str]:
    """Put back in its queue each durable message a Redis broker saw taken, but whose execution never started.

    A worker killed between taking a message and entering its execution leaves no trace in the journal,
    so the sweep cannot see it, and Redis would hand the message out again only after its visibility
    timeout. With prefetch 1 and late acks a live worker starts what it takes at once, so a message taken
    `resume_after` seconds ago (not held for a countdown) with no execution, or whose execution finished
    or ended waiting but was never acknowledged, belonged to a dead worker. Should the worker be alive after
    all, the second delivery is fenced by the lease and replays.
    """
    restored: list[str] = []
    with app.connection_for_write() as connection:
        if connection.transport.driver_type != 'redis':
            return restored  # AMQP returns a dead consumer's messages at once; SQS has its own visibility
        unacked, now = _RedisUnacked(connection.default_channel), time.time()
        for taken in unacked.taken_before(now - min(task.resume_after for task in fleet.tasks.values())):
            name, task_id, eta = (taken.headers.get(field) for field in ('task', 'id', 'eta'))
            spec = fleet.tasks.get(name) if isinstance(name, str) else None
            if spec is None or not isinstance(task_id, str) or taken.taken_at > now - spec.resume_after:
                continue
            if eta and _epoch(eta) > now - spec.resume_after:
                continue  # a countdown a live worker holds until it is due
            record = await spec.journal.read_execution(execution_key(spec.name, task_id))
            if record is None or record.get('status') in ('finished', 'waiting'):
                unacked.put_back(taken.tag)
                log.info('Task %s[%s] was taken by a worker that died before it ran; it was put back.', name, task_id)
                restored.append(execution_key(spec.name, task_id))
    return restored


def _epoch(iso: Any) -> float:
    try:
        return datetime.datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return float('inf')  # an ETA we cannot read: leave the message to the broker
