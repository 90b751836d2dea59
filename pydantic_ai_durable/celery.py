"""Celery tasks that run durable agents, and resume them when a worker dies (extra `celery`).

```python
from pydantic_ai_durable.celery import durable_task

@durable_task(app, journal=journal)
async def research(prompt: str) -> str:
    return (await agent.run(prompt)).output
```

The glue every fleet needs lives here once: the execution key from the task's stable id (FL-1), the
settings that bring a killed worker's task back (FL-4), busy and failing journals turned into retries
(FL-2), one event loop per worker process for async bodies (FL-5), and a sweep in every worker that
dispatches again what a dead worker left interrupted, whatever the broker does with its messages (FL-3).
Only the public API of the package is used.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import inspect
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from . import (
    DurableError,
    ExecutionBusy,
    ExecutionInfo,
    Journal,
    JournalUnavailable,
    LeaseLost,
    execution,
    retry_delay,
    sweep_interrupted,
)

try:
    from celery import Celery, Task, bootsteps
    from celery.exceptions import Ignore, ImproperlyConfigured
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError(
        "pydantic_ai_durable.celery needs Celery, the extra 'celery' of pydantic-ai-durable-journal: "
        f"pip install 'pydantic-ai-durable-journal[celery]' ({exc})."
    ) from exc

__all__ = ('ENGINE', 'check_settings', 'durable_task', 'execution_key')

log = logging.getLogger('pydantic_ai_durable')


ENGINE = 'celery'
"""The `engine` field of the metadata a durable task stores with its execution."""

_VISIBILITY_TRANSPORTS = ('redis', 'rediss', 'sentinel', 'sqs')
"""Brokers that hand an unacknowledged message to another worker after a visibility timeout."""

_DEFAULT_VISIBILITY = 3600.0
"""Kombu's visibility timeout for those brokers when the app sets none."""


def execution_key(task_name: str, task_id: str) -> str:
    """The execution key of one task: its name and its id, which Celery keeps over retries and redeliveries (FL-1)."""
    return f'{task_name}:{task_id}'


@dataclass
class _Durable:
    """What one durable task needs at run time and at worker start."""

    journal: Journal
    lease_ttl: float
    resume_after: float


@dataclass
class _AppState:
    """The durable tasks of one app, and the sweep its workers run."""

    tasks: dict[str, _Durable] = field(default_factory=dict)
    installed: bool = False


_APPS: dict[int, _AppState] = {}
_APPS_GUARD = threading.Lock()


def _state(app: Celery) -> _AppState:
    with _APPS_GUARD:
        return _APPS.setdefault(id(app), _AppState())


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
    (ids, not documents: 16 KiB in all). The body may be `async def` (one event loop per worker process
    runs it) or a plain function that calls `run_sync`. `ExecutionBusy` retries when the holder's lease
    would end, `JournalUnavailable` retries with backoff, and `LeaseLost` is never retried. Every worker
    of the app checks its settings when it starts and sweeps for executions left interrupted for
    `resume_after` seconds (default: `lease_ttl`) to send them again. Other keyword arguments go to `app.task`.
    """
    if not isinstance(lease_ttl, (int, float)) or isinstance(lease_ttl, bool) or not lease_ttl > 0:
        raise ValueError(f'lease_ttl must be a positive number of seconds, not {lease_ttl!r}.')
    resume = float(lease_ttl if resume_after is None else resume_after)
    if not resume > 0:
        raise ValueError(f'resume_after must be a positive number of seconds, not {resume_after!r}.')
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
            request, name = self.request, str(self.name)
            key = execution_key(name, request.id)
            metadata = {
                'engine': ENGINE,
                'task': name,
                'id': request.id,
                'args': list(args),
                'kwargs': kwargs,
                'queue': _queue_of(request),
            }
            scope = execution(key, journal=journal, lease_ttl=lease_ttl, metadata=_checked(metadata, name))
            try:
                if is_async:
                    return _worker_loop().run_until_complete(_in_scope_async(scope, function, args, kwargs))
                with scope:
                    return function(*args, **kwargs)
            except LeaseLost as lost:
                if lost.holder is None:
                    raise  # deleted under it: nobody else will report this task's outcome
                # The other holder is a delivery of this same task id: it reports the outcome (FL-2).
                log.warning('Execution %r was taken over by %s, which runs it; this delivery stops.', key, lost.holder)
                raise Ignore() from None
            except (ExecutionBusy, JournalUnavailable) as error:
                countdown = retry_delay(error, attempt=request.retries or 0, lease_ttl=lease_ttl)
                assert countdown is not None
                if isinstance(error, ExecutionBusy):
                    log.info('Execution %r is held by %s; the task retries in %.1f s.', key, error.holder, countdown)
                    raise self.retry(countdown=countdown) from None
                raise self.retry(exc=error, countdown=countdown) from None

        task_options = {'acks_late': True, 'reject_on_worker_lost': True, 'max_retries': None, **options}
        task = cast(Task, app.task(bind=True, **task_options)(run))
        state = _state(app)
        state.tasks[str(task.name)] = _Durable(journal, float(lease_ttl), resume)
        _install(app, state)
        return task

    return decorate


async def _in_scope_async(
    scope: execution, function: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    async with scope:
        return await function(*args, **kwargs)


def _checked(metadata: dict[str, Any], task: str) -> dict[str, Any]:
    """The metadata, or an error saying why this task's arguments cannot be stored with its execution."""
    try:
        size = len(json.dumps(metadata, separators=(',', ':')).encode())
    except (TypeError, ValueError) as exc:
        raise DurableError(
            f'Task {task!r}: its arguments are not JSON ({exc}); a durable task stores them with its execution so '
            'that a sweep can send it again. Pass JSON values (ids, not objects).'
        ) from exc
    if size > 16 * 1024:
        raise DurableError(
            f"Task {task!r}: its arguments take {size} bytes as JSON, over the 16 KiB an execution's metadata holds. "
            'Pass ids and let the task load the documents.'
        )
    return metadata


def _queue_of(request: Any) -> str | None:
    info = request.delivery_info or {}
    queue = info.get('routing_key') if info.get('exchange') in ('', None) else None
    return queue if isinstance(queue, str) and queue else None


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


# -- at worker start: the settings, and the sweep (FL-3, FL-4) ----------------------------------------


def check_settings(app: Celery) -> list[str]:
    """Raise `ImproperlyConfigured` naming each setting that would lose or strand a killed worker's task.

    Returns the warnings for settings that only delay a resume (a prefetch multiplier over 1). Workers call
    it when they start; call it in a deployment check too.
    """
    state = _state(app)
    conf = app.conf
    errors: list[str] = []
    for name, durable in sorted(state.tasks.items()):
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
        if visibility is not None and visibility < durable.lease_ttl:
            errors.append(
                f"broker_transport_options['visibility_timeout'] is {visibility:g} s, shorter than the lease_ttl of "
                f'task {name!r} ({durable.lease_ttl:g} s): the broker hands every running message to a second '
                'worker before a holder can even be taken over; set it above the longest task'
            )
    if errors:
        raise ImproperlyConfigured(
            "pydantic_ai_durable: these settings would lose a killed worker's durable task: " + '; '.join(errors) + '.'
        )
    warnings: list[str] = []
    prefetch = conf.worker_prefetch_multiplier
    if state.tasks and isinstance(prefetch, int) and prefetch > 1:
        warnings.append(
            f"worker_prefetch_multiplier is {prefetch}: a killed worker's prefetched messages, which never "
            "started an execution, come back only after the broker's visibility timeout; set it to 1"
        )
    return warnings


def _visibility_timeout(app: Celery) -> float | None:
    """The broker's visibility timeout in seconds, or `None` for a broker that has none (AMQP)."""
    url = app.conf.broker_url or ''
    transport = (url.split('://', 1)[0] if '://' in url else str(app.conf.broker_transport or '')).lower()
    if transport not in _VISIBILITY_TRANSPORTS:
        return None
    options = app.conf.broker_transport_options or {}
    value = options.get('visibility_timeout', _DEFAULT_VISIBILITY)
    return float(value) if isinstance(value, (int, float)) else _DEFAULT_VISIBILITY


def _install(app: Celery, state: _AppState) -> None:
    """Add the worker steps once per app: the settings check at start, the sweep while the worker runs."""
    with _APPS_GUARD:
        if state.installed:
            return
        state.installed = True

    class DurableStep(bootsteps.StartStopStep):  # type: ignore[misc]
        """Checks the durable tasks' settings when the worker starts, then sweeps until it stops."""

        def __init__(self, worker: Any, **kwargs: Any) -> None:
            for warning in check_settings(app):
                log.warning('pydantic_ai_durable: %s.', warning)
            self.sweeper: _Sweeper | None = None
            super().__init__(worker, **kwargs)

        def start(self, parent: Any) -> None:
            self.sweeper = _Sweeper(app, state)
            self.sweeper.start()

        def stop(self, parent: Any) -> None:
            if self.sweeper is not None:
                self.sweeper.stop()

    steps = app.steps
    assert steps is not None, 'Celery makes the steps of every app in its constructor'
    steps['worker'].add(DurableStep)


class _Sweeper:
    """A thread of the worker's main process that sends interrupted executions of its app's tasks again."""

    def __init__(self, app: Celery, state: _AppState) -> None:
        self.app = app
        self.state = state
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='pydantic-ai-durable-sweep', daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        interval = max(1.0, min(d.resume_after for d in self.state.tasks.values()) / 3)
        while not self._stop.wait(interval * random.uniform(0.8, 1.2)):  # workers' sweeps drift apart
            try:
                asyncio.run(self.sweep())
            except Exception as exc:  # a journal or broker that is down now may be back at the next round
                log.warning('pydantic_ai_durable: sweeping for interrupted executions failed: %r', exc)

    async def sweep(self) -> list[str]:
        groups: dict[tuple[int, float], tuple[Journal, set[str]]] = {}
        for name, durable in self.state.tasks.items():
            journal, names = groups.setdefault((id(durable.journal), durable.resume_after), (durable.journal, set()))
            names.add(name)
        sent: list[str] = []
        for (_, idle), (journal, names) in groups.items():
            sent += await sweep_interrupted(journal, self._send, idle=idle, select=_selector(names))
        return sent + await _restore_unstarted(self.app, self.state)

    def _send(self, info: ExecutionInfo) -> None:
        meta = info.metadata or {}
        self.app.send_task(
            meta['task'],
            args=meta.get('args') or [],
            kwargs=meta.get('kwargs') or {},
            task_id=meta['id'],
            queue=meta.get('queue'),
        )


async def _restore_unstarted(app: Celery, state: _AppState) -> list[str]:
    """Put back in its queue each durable message a Redis broker saw taken, but whose execution never started.

    A worker killed between taking a message and entering its execution leaves no trace in the journal,
    so the sweep above cannot see it, and Redis would hand the message out again only after its
    visibility timeout. With prefetch 1 and late acks a live worker starts what it takes at once, so a
    message taken `resume_after` seconds ago (not held for a countdown) with no execution, or whose
    execution finished but was never acknowledged, belonged to a dead worker. Should the worker be alive
    after all, the second delivery is fenced by the lease and replays (FL-3).
    """
    restored: list[str] = []
    with app.connection_for_write() as connection:
        if connection.transport.driver_type != 'redis':
            return restored  # AMQP returns a dead consumer's messages at once; SQS has its own visibility
        channel: Any = connection.default_channel
        qos, client, now = channel.qos, channel.client, time.time()
        ceiling = now - min(durable.resume_after for durable in state.tasks.values())
        for tag, taken_at in client.zrangebyscore(qos.unacked_index_key, '-inf', ceiling, withscores=True):
            raw = client.hget(qos.unacked_key, tag)
            headers = (json.loads(raw)[0].get('headers') or {}) if raw else {}
            name, task_id, eta = headers.get('task'), headers.get('id'), headers.get('eta')
            if not isinstance(name, str) or not isinstance(task_id, str):
                continue
            durable = state.tasks.get(name)
            if durable is None or taken_at > now - durable.resume_after:
                continue
            if eta and _epoch(eta) > now - durable.resume_after:
                continue  # a countdown a live worker holds until it is due
            record = await durable.journal.read_execution(execution_key(name, task_id))
            if record is None or record.get('status') == 'finished':
                qos.restore_by_tag(tag, client)  # a transaction: of two sweeps, one puts it back
                log.info('Task %s[%s] was taken by a worker that died before it ran; it was put back.', name, task_id)
                restored.append(execution_key(name, task_id))
    return restored


def _epoch(iso: Any) -> float:
    try:
        return datetime.datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return float('inf')  # an ETA we cannot read: leave the message to the broker


def _selector(names: set[str]) -> Callable[[ExecutionInfo], bool]:
    def select(info: ExecutionInfo) -> bool:
        meta = info.metadata or {}
        return (
            meta.get('engine') == ENGINE
            and meta.get('task') in names
            and isinstance(meta.get('id'), str)
            and info.key == execution_key(meta['task'], meta['id'])
        )

    return select
