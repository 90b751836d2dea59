"""Procrastinate jobs that run durable agents, and resume them when a worker dies (extra `procrastinate`).

```python
from pydantic_ai_durable.procrastinate import durable_job

@durable_job(app, journal=journal)
async def research(prompt: str) -> str:
    return (await agent.run(prompt)).output
```

Procrastinate keeps its queue in PostgreSQL, so it can share the `PostgresJournal`'s database. The key of
each execution is the task's name and the job's id, which a retry keeps (FL-1); busy, lost and failing
journals become retries (FL-2); and a periodic task on the app retries the jobs of workers that stopped
heart-beating and the executions a dead worker left interrupted, with no operator (FL-3, FL-6). Only the
public API of the package is used.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import ExecutionInfo, Journal, execution, retry_delay, sweep_interrupted

try:
    from procrastinate import App, JobContext, RetryDecision
    from procrastinate.exceptions import ConnectorException
    from procrastinate.jobs import DEFAULT_QUEUE, Job
    from procrastinate.retry import BaseRetryStrategy, get_retry_strategy
    from procrastinate.tasks import Task
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError(
        "pydantic_ai_durable.procrastinate needs Procrastinate, the extra 'procrastinate' of "
        f"pydantic-ai-durable-journal: pip install 'pydantic-ai-durable-journal[procrastinate]' ({exc})."
    ) from exc

__all__ = ('ENGINE', 'RECOVERY_TASK', 'DurableRetry', 'durable_job', 'execution_key', 'recover_stalled_jobs')

log = logging.getLogger('pydantic_ai_durable')


ENGINE = 'procrastinate'
"""The `engine` field of the metadata a durable job stores with its execution."""

RECOVERY_TASK = 'pydantic_ai_durable.recover_stalled_jobs'
"""The name of the periodic task `durable_job` adds to the app (FL-6)."""


def execution_key(task_name: str, job_id: int) -> str:
    """The execution key of one job: its task's name and its id, which Procrastinate keeps over retries (FL-1)."""
    return f'{task_name}:{job_id}'


class DurableRetry(BaseRetryStrategy):
    """Retries a job whose execution was busy, taken over or met a failing journal, when `retry_delay` says.

    Any other error goes to the task's own strategy (`retry=` of `durable_job`), if it has one. Retries
    of the first kind count in the job's `attempts` too, so give such a strategy room for them.
    """

    def __init__(self, lease_ttl: float, then: BaseRetryStrategy | None = None) -> None:
        self.lease_ttl = lease_ttl
        self.then = then

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        delay = retry_delay(exception, attempt=job.attempts, lease_ttl=self.lease_ttl)
        if delay is not None:
            log.info('Job %s: %s; it runs again in %.1f s.', job.id, type(exception).__name__, delay)
            return RetryDecision(retry_at=datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=delay))
        return None if self.then is None else self.then.get_retry_decision(exception=exception, job=job)


@dataclass
class _Durable:
    journal: Journal
    resume_after: float


@dataclass
class _AppState:
    tasks: dict[str, _Durable] = field(default_factory=dict)
    installed: bool = False


_APPS: dict[int, _AppState] = {}
_APPS_GUARD = threading.Lock()


def _state(app: App) -> _AppState:
    with _APPS_GUARD:
        return _APPS.setdefault(id(app), _AppState())


def durable_job(
    app: App,
    *,
    journal: Journal,
    lease_ttl: float = 30.0,
    resume_after: float | None = None,
    **options: Any,
) -> Callable[[Callable[..., Any]], Task[Any, Any, Any]]:
    """A decorator like `app.task` whose body runs inside `execution(key)`, so a job that runs again replays.

    The key is the task's name and the job's id (`execution_key`); the execution's metadata holds the
    `engine`, `task`, `job` and `queue`. The body may be `async def` (it runs on the worker's loop) or a
    plain function that calls `run_sync` (Procrastinate runs it in a thread); with `pass_context=True` it
    gets the `JobContext` first, as with `app.task`. `retry=` applies to the body's own errors only
    (`DurableRetry`). The first durable job of an app adds `RECOVERY_TASK`, a periodic task that every
    `resume_after` seconds or so (default: `lease_ttl`) retries the jobs of workers that stopped
    heart-beating for `resume_after` seconds, and the executions left interrupted that long
    (`recover_stalled_jobs`). Keep `resume_after` above three heartbeats of the worker
    (`update_heartbeat_interval`, 10 s unless set), or live workers' jobs are retried, and then wait.
    """
    if not isinstance(lease_ttl, (int, float)) or isinstance(lease_ttl, bool) or not lease_ttl > 0:
        raise ValueError(f'lease_ttl must be a positive number of seconds, not {lease_ttl!r}.')
    resume = float(lease_ttl if resume_after is None else resume_after)
    if not resume > 0:
        raise ValueError(f'resume_after must be a positive number of seconds, not {resume_after!r}.')
    pass_context = bool(options.pop('pass_context', False))
    strategy = DurableRetry(float(lease_ttl), get_retry_strategy(options.pop('retry', False)))

    def decorate(function: Callable[..., Any]) -> Task[Any, Any, Any]:
        name: list[str] = []  # the task's name, known once app.task has made it (aliases map to it)

        def scope(context: JobContext) -> execution:
            job = context.job
            assert job.id is not None, 'Procrastinate runs only jobs it has stored'
            metadata = {'engine': ENGINE, 'task': name[0], 'job': job.id, 'queue': job.queue}
            return execution(execution_key(name[0], job.id), journal=journal, lease_ttl=lease_ttl, metadata=metadata)

        def call_args(context: JobContext, args: tuple[Any, ...]) -> tuple[Any, ...]:
            return (context, *args) if pass_context else args

        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def run_async(context: JobContext, *args: Any, **kwargs: Any) -> Any:
                async with scope(context):
                    return await function(*call_args(context, args), **kwargs)

            body: Callable[..., Any] = run_async
        else:

            @functools.wraps(function)
            def run_sync(context: JobContext, *args: Any, **kwargs: Any) -> Any:
                with scope(context):
                    return function(*call_args(context, args), **kwargs)

            body = run_sync

        task = app.task(pass_context=True, retry=strategy, **options)(body)
        name.append(task.name)
        state = _state(app)
        state.tasks[task.name] = _Durable(journal, resume)
        _install(app, state, resume, options.get('queue'))
        return task

    return decorate


def _install(app: App, state: _AppState, resume_after: float, queue: str | None) -> None:
    """Add the recovery task to the app once, on the queue of its first durable job (FL-6)."""
    with _APPS_GUARD:
        if state.installed:
            return
        state.installed = True
    every = max(1, min(59, round(resume_after / 3)))  # the step of a cron's sixth field, seconds: 1..59

    async def recover(context: JobContext, timestamp: int) -> None:
        await recover_stalled_jobs(context.app)

    task = app.task(name=RECOVERY_TASK, pass_context=True, queueing_lock=RECOVERY_TASK, queue=queue or DEFAULT_QUEUE)(
        recover
    )
    app.periodic(cron=f'* * * * * */{every}', periodic_id='pydantic_ai_durable')(task)


async def recover_stalled_jobs(app: App) -> list[int]:
    """Retry the durable jobs a dead worker left behind; return their ids (FL-3, FL-6).

    Two kinds are found: jobs still `doing` on a worker that has not heart-beaten for the task's
    `resume_after` seconds, and jobs whose execution was left `interrupted` that long (`sweep_interrupted`,
    so two recoveries at once retry each job once). Only this app's durable tasks are looked at: a plain
    task that is retried would run its side effects again. The periodic `RECOVERY_TASK` calls this.
    """
    state = _state(app)
    manager = app.job_manager
    retried: list[int] = []
    for name, durable in sorted(state.tasks.items()):
        stalled = await manager.get_stalled_jobs(task_name=name, seconds_since_heartbeat=durable.resume_after)
        for job in stalled:
            if job.id is not None and await _retry(app, job.id):
                log.info('Job %s of task %r: its worker stopped heart-beating; it was retried.', job.id, name)
                retried.append(job.id)
    groups: dict[tuple[int, float], tuple[Journal, set[str]]] = {}
    for name, durable in state.tasks.items():
        groups.setdefault((id(durable.journal), durable.resume_after), (durable.journal, set()))[1].add(name)

    async def dispatch(info: ExecutionInfo) -> None:
        job_id = int((info.metadata or {})['job'])
        if await _retry(app, job_id):
            retried.append(job_id)

    for (_, idle), (journal, names) in groups.items():
        await sweep_interrupted(journal, dispatch, idle=idle, select=_selector(names))
    return retried


async def _retry(app: App, job_id: int) -> bool:
    """Put a `doing` job back to `todo` now; `False` if it is not `doing` (queued, or ended) any more."""
    if not await _doing(app, job_id):
        return False
    try:
        await app.job_manager.retry_job_by_id_async(job_id, retry_at=datetime.datetime.now(datetime.UTC))
    except ConnectorException:
        if await _doing(app, job_id):
            raise  # the database failed, not the race: the caller logs it and a later round tries again
        return False  # it moved on between the two statements: another recovery retried it, or it ended
    return True


async def _doing(app: App, job_id: int) -> bool:
    jobs = list(await app.job_manager.list_jobs_async(id=job_id))
    return bool(jobs) and jobs[0].status == 'doing'


def _selector(names: set[str]) -> Callable[[ExecutionInfo], bool]:
    def select(info: ExecutionInfo) -> bool:
        meta = info.metadata or {}
        job = meta.get('job')
        return (
            meta.get('engine') == ENGINE
            and meta.get('task') in names
            and isinstance(job, int)
            and info.key == execution_key(meta['task'], job)
        )

    return select
