"""The Celery app the fleet tests start real workers of (`celery -A fleet_celery_app worker`).

Configured from the environment the test gives each worker: `FLEET_BROKER` (a Redis URL), `FLEET_JOURNAL`
(see `fleet_agent`), `FLEET_LEASE_TTL`, `FLEET_RESUME_AFTER` and `FLEET_VISIBILITY` (seconds).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun
from fleet_agent import held, hold, journal_from_environment, make_agent, make_approval_agent, note

from pydantic_ai_durable.celery import durable_task

app = Celery('fleet', broker=os.environ['FLEET_BROKER'], backend=os.environ['FLEET_BROKER'])
transport: dict[str, float] = {'visibility_timeout': float(os.environ.get('FLEET_VISIBILITY', '3600'))}
if os.environ.get('FLEET_RESTORE_EVERY'):  # look for messages past their visibility timeout every N seconds
    transport.update(unacked_restore_interval=float(os.environ['FLEET_RESTORE_EVERY']), unacked_restore_throttle=1)
app.conf.update(
    broker_transport_options=transport,
    worker_prefetch_multiplier=1,
    task_serializer='json',
    result_serializer='json',
    accept_content=['json'],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

journal = journal_from_environment()
agent = make_agent()
lease_ttl = float(os.environ.get('FLEET_LEASE_TTL', '30'))
resume_after = float(os.environ.get('FLEET_RESUME_AFTER', str(lease_ttl)))


@durable_task(app, journal=journal, lease_ttl=lease_ttl, resume_after=resume_after, name='fleet.research')
async def research(prompt: str) -> str:
    note({'prompt': prompt, 'what': 'body', 'phase': 'start'})
    return (await agent.run(prompt)).output


@durable_task(app, journal=journal, lease_ttl=lease_ttl, resume_after=resume_after, name='fleet.research_sync')
def research_sync(prompt: str) -> str:
    note({'prompt': prompt, 'what': 'body', 'phase': 'start'})
    return agent.run_sync(prompt).output


approval_agent = make_approval_agent()


@durable_task(app, journal=journal, lease_ttl=lease_ttl, resume_after=resume_after, name='fleet.approve')
async def approve(prompt: str) -> Any:
    """Ends waiting for the payment's approval; returns pydantic-ai's output as it is (WT-4)."""
    note({'prompt': prompt, 'what': 'body', 'phase': 'start'})
    return (await approval_agent.run(prompt)).output


bare = make_agent(durable=False)
_loop = asyncio.new_event_loop()


@app.task(name='fleet.plain', acks_late=True, reject_on_worker_lost=True)
def plain(prompt: str) -> str:
    """The same work with no journal at all, on one loop per process too: what `benchmarks/fleet.py` compares."""
    output = _loop.run_until_complete(bare.run(prompt)).output
    note({'prompt': prompt, 'what': 'finished', 'phase': 'start', 'output': output})
    return output


@task_postrun.connect
def _after_the_body(
    task: Any = None, args: Any = None, state: str | None = None, retval: Any = None, **kwargs: Any
) -> None:
    """After a task's body returned and before its message is acknowledged: a place to kill."""
    if task is None or not task.name.startswith(('fleet.research', 'fleet.approve')) or not args or state != 'SUCCESS':
        return
    prompt = str(args[0])
    note({'prompt': prompt, 'what': 'finished', 'phase': 'start', 'output': retval})
    asyncio.run(hold(prompt, 'after-finish'))


@task_prerun.connect
def _before_the_body(task: Any = None, args: Any = None, **kwargs: Any) -> None:
    """In the pool process, after the worker took the message and before the execution starts: a place to kill."""
    if task is None or not task.name.startswith('fleet.research') or not args:
        return
    prompt = str(args[0])
    if held(prompt, 'before-body'):
        note({'prompt': prompt, 'what': 'taken', 'phase': 'start'})
        asyncio.run(hold(prompt, 'before-body'))
