"""Procrastinate jobs that run durable agents, and resume them when a worker dies (extra `procrastinate`).

```python
from pydantic_ai_durable.procrastinate import durable_job

@durable_job(app, journal=journal)
async def research(prompt: str) -> str:
    return (await agent.run(prompt)).output
```

Procrastinate keeps its queue in PostgreSQL, so it can share the `PostgresJournal`'s database. What every
queue needs is the fleet core's (`pydantic_ai_durable.fleet`): the key of each execution is the task's
name and the job's id, which a retry keeps, and busy, lost and failing journals become retries.
This adapter holds what is Procrastinate's: its retry strategy, how a job is sent again (retried
at the highest priority; a job whose execution ended waiting succeeded, and is put back in the queue once
it is decided), the jobs of workers that stopped heart-beating, and where the sweep runs: on
each worker's event loop beside its jobs, never behind them in the queue.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, LiteralString

from . import DurableError, Journal, MetadataMismatch
from .fleet import Delivery, Fleet, check_timing, execution_key, fleet_of, retry_after, sweep_on_this_loop

try:
    from procrastinate import App, JobContext, RetryDecision
    from procrastinate.exceptions import AppNotOpen, ConnectorException
    from procrastinate.jobs import DEFAULT_QUEUE, Job
    from procrastinate.retry import BaseRetryStrategy, get_retry_strategy
    from procrastinate.tasks import Task
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError(
        "pydantic_ai_durable.procrastinate needs Procrastinate, the extra 'procrastinate' of "
        f"pydantic-ai-durable-journal: pip install 'pydantic-ai-durable-journal[procrastinate]' ({exc})."
    ) from exc

__all__ = (
    'ENGINE',
    'PRIORITY',
    'RECOVERY_TASK',
    'DurableRetry',
    'durable_job',
    'execution_key',
    'recover_stalled_jobs',
)

log = logging.getLogger('pydantic_ai_durable')


ENGINE = 'procrastinate'
"""The `engine` field of the metadata a durable job stores with its execution."""

RECOVERY_TASK = 'pydantic_ai_durable.recover_stalled_jobs'
"""The name of the periodic task `durable_job` adds to the app."""

PRIORITY = 2**31 - 1
"""The highest priority a Procrastinate job can have (a PostgreSQL integer): the recovery task's, and that of
every job recovery retries, so neither waits behind a backlog."""


class DurableRetry(BaseRetryStrategy):
    """Retries a job whose execution was busy, taken over or met a failing journal, when `retry_delay` says.

    Any other error of the body goes to the task's own strategy (`retry=` of `durable_job`), if it has one;
    `MetadataMismatch` never does, since the job would be refused the same way every time. Retries
    of the first kind count in the job's `attempts` too, so give such a strategy room for them.
    """

    def __init__(self, lease_ttl: float, then: BaseRetryStrategy | None = None) -> None:
        self.lease_ttl = lease_ttl
        self.then = then

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        retry = retry_after(exception, attempt=job.attempts, lease_ttl=self.lease_ttl)
        if retry is not None:
            retry.log(execution_key(job.task_name, job.id if job.id is not None else '?'))
            return RetryDecision(retry_at=_now() + datetime.timedelta(seconds=retry.delay))
        if self.then is None or isinstance(exception, MetadataMismatch):
            return None
        return self.then.get_retry_decision(exception=exception, job=job)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _fleet(app: App) -> Fleet:
    def start() -> Fleet:
        async def send(delivery: Delivery) -> None:
            try:
                await _send_again(app, delivery)
            except AppNotOpen:  # a web handler or the CLI that resolves with dispatch=True, outside a worker
                async with app.open_async():
                    await _send_again(app, delivery)

        fleet = Fleet(ENGINE, send, recover=lambda: _retry_stalled(app, fleet))
        return fleet

    return fleet_of(app, ENGINE, start)


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
    `engine`, `task`, `id`, arguments and `queue`. The body may be `async def` (it runs on the worker's
    loop) or a plain function that calls `run_sync` (Procrastinate runs it in a thread); with
    `pass_context=True` it gets the `JobContext` first, as with `app.task`. `retry=` applies to the body's
    own errors only (`DurableRetry`). A job whose run ends waiting for a decision succeeds with the fleet's
    `Waiting` as its result, and is put back in the queue once decided. Each worker that runs an
    async durable job (or the recovery task) sweeps on its event loop every `resume_after / 3` seconds or
    so (default: `lease_ttl`), beside its jobs: it retries, at `PRIORITY`, the jobs of workers that stopped
    heart-beating for `resume_after` seconds and the executions left interrupted that long, or decided
    that long ago (`recover_stalled_jobs`). The first durable
    job of an app also adds `RECOVERY_TASK`, a periodic task at `PRIORITY` that does the same and starts
    the sweep of a worker that runs only plain-function jobs. Keep `resume_after` above three heartbeats of
    the worker (`update_heartbeat_interval`, 10 s unless set), or live workers' jobs are retried, and then wait.
    """
    check_timing(lease_ttl, resume_after)
    durable = _fleet(app)
    pass_context = bool(options.pop('pass_context', False))
    strategy = DurableRetry(float(lease_ttl), get_retry_strategy(options.pop('retry', False)))

    def decorate(function: Callable[..., Any]) -> Task[Any, Any, Any]:
        name: list[str] = []  # the task's name, known once app.task has made it (aliases map to it)

        def delivery(context: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Delivery:
            job = context.job
            if job.id is None:
                raise DurableError(f'Procrastinate ran a job of task {name[0]!r} it never stored (no job id).')
            return durable.delivery(name[0], job.id, args, kwargs, job.queue)

        def call(context: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return function(*((context, *args) if pass_context else args), **kwargs)

        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def run_async(context: JobContext, *args: Any, **kwargs: Any) -> Any:
                sweep_on_this_loop(durable)  # this worker's sweep, beside its jobs
                return await durable.run(delivery(context, args, kwargs), lambda: call(context, args, kwargs))

            body: Callable[..., Any] = run_async
        else:

            @functools.wraps(function)
            def run_sync(context: JobContext, *args: Any, **kwargs: Any) -> Any:
                return durable.run_sync(delivery(context, args, kwargs), lambda: call(context, args, kwargs))

            body = run_sync

        task = app.task(pass_context=True, retry=strategy, **options)(body)
        name.append(task.name)
        durable.add(task.name, journal=journal, lease_ttl=lease_ttl, resume_after=resume_after)
        if RECOVERY_TASK not in app.tasks:
            _install(app, durable, options.get('queue'))
        return task

    return decorate


def _install(app: App, fleet: Fleet, queue: str | None) -> None:
    """Add the recovery task to the app once, on the queue of its first durable job, at `PRIORITY` (FL-6)."""
    every = max(1, min(59, round(fleet.period)))  # the step of a cron's sixth field, seconds: 1..59

    async def recover(context: JobContext, timestamp: int) -> None:
        sweep_on_this_loop(fleet)
        await recover_stalled_jobs(context.app)

    task = app.task(
        name=RECOVERY_TASK,
        pass_context=True,
        queueing_lock=RECOVERY_TASK,
        queue=queue or DEFAULT_QUEUE,
        priority=PRIORITY,
    )(recover)
    app.periodic(cron=f'* * * * * */{every}', periodic_id='pydantic_ai_durable')(task)


async def recover_stalled_jobs(app: App) -> list[str]:
    """Retry the durable jobs a dead worker left behind; return their execution keys.

    Two kinds are found: jobs whose execution was left `interrupted` for the task's `resume_after`
    seconds (the sweep, so two recoveries at once retry each job once), and jobs still `doing` on a
    worker that has not heart-beaten that long. Each is retried at once, at `PRIORITY`. Only this app's
    durable tasks are looked at: a plain task that is retried would run its side effects again. Every
    worker's sweep and the periodic `RECOVERY_TASK` call this.
    """
    return await _fleet(app).sweep()


async def _retry_stalled(app: App, fleet: Fleet) -> list[str]:
    """Retry each durable job still `doing` on a worker that has not heart-beaten for its `resume_after`."""
    retried: list[str] = []
    for name, task in sorted(fleet.tasks.items()):
        stalled = await app.job_manager.get_stalled_jobs(task_name=name, seconds_since_heartbeat=task.resume_after)
        for job in stalled:
            if job.id is not None and await _retry(app, job.id):
                log.info('Job %s of task %r: its worker stopped heart-beating; it was retried.', job.id, name)
                retried.append(execution_key(name, job.id))
    return retried


async def _retry(app: App, job_id: int) -> bool:
    """Put a `doing` job back to `todo` now, at `PRIORITY`; `False` if it is not `doing` (queued, or ended)."""
    if not await _doing(app, job_id):
        return False
    try:
        await app.job_manager.retry_job_by_id_async(job_id, retry_at=_now(), priority=PRIORITY)
    except ConnectorException:
        if await _doing(app, job_id):
            raise  # the database failed, not the race: the caller logs it and a later round tries again
        return False  # it moved on between the two statements: another recovery retried it, or it ended
    return True


_PUT_BACK: LiteralString = (
    "UPDATE procrastinate_jobs SET status = 'todo', scheduled_at = now(), priority = %(priority)s "
    "WHERE id = %(job_id)s AND status = 'succeeded' RETURNING id"
)
"""A job that succeeded back to `todo`, at `PRIORITY`: Procrastinate retries only jobs `doing` or `failed`."""


async def _send_again(app: App, delivery: Delivery) -> None:
    """Run the delivery's job again under its id: retried if still `doing`, put back if it ended.

    A job whose execution ended waiting succeeded: once its calls are decided it goes back to `todo`, in one
    statement that only a succeeded job passes, so two senders put it back once. A job still `todo` is
    already on its way. One no longer in the table was deleted when it ended (a worker run with
    `delete_jobs`), and cannot be sent again.
    """
    job_id = int(delivery.id)
    if await _retry(app, job_id):
        return
    if await app.connector.execute_query_all_async(_PUT_BACK, job_id=job_id, priority=PRIORITY):
        log.info('Job %s of task %r was put back in its queue to go on.', job_id, delivery.task)
        return
    if not list(await app.job_manager.list_jobs_async(id=job_id)):
        raise DurableError(
            f'Execution {delivery.key!r}: its Procrastinate job {job_id} is no longer in the queue, so it cannot be '
            "sent again: a worker run with delete_jobs='successful' or 'always' deletes the job of an execution that "
            "ended waiting. Run the workers of durable jobs with delete_jobs='never' (the default)."
        )


async def _doing(app: App, job_id: int) -> bool:
    jobs = list(await app.job_manager.list_jobs_async(id=job_id))
    return bool(jobs) and jobs[0].status == 'doing'
