"""The Procrastinate app the fleet tests start real workers of (`fleet_procrastinate_app.run()`).

Configured from the environment the test gives each worker: `FLEET_QUEUE_DSN` (the queue's database),
`FLEET_JOURNAL` (see `fleet_agent`), `FLEET_LEASE_TTL`, `FLEET_RESUME_AFTER` and `FLEET_HEARTBEAT`
(seconds between the worker's heartbeats).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import procrastinate
from fleet_agent import hold, journal_from_environment, make_agent, make_approval_agent, note

from pydantic_ai_durable.procrastinate import durable_job

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ['FLEET_QUEUE_DSN']))
journal = journal_from_environment()
agent = make_agent()
lease_ttl = float(os.environ.get('FLEET_LEASE_TTL', '30'))
resume_after = float(os.environ.get('FLEET_RESUME_AFTER', str(lease_ttl)))


@durable_job(app, journal=journal, lease_ttl=lease_ttl, resume_after=resume_after, name='fleet.research')
async def research(prompt: str) -> str:
    note({'prompt': prompt, 'what': 'body', 'phase': 'start'})
    return (await agent.run(prompt)).output


@durable_job(app, journal=journal, lease_ttl=lease_ttl, resume_after=resume_after, name='fleet.research_sync')
def research_sync(prompt: str) -> str:
    note({'prompt': prompt, 'what': 'body', 'phase': 'start'})
    return agent.run_sync(prompt).output


approval_agent = make_approval_agent()


@durable_job(app, journal=journal, lease_ttl=lease_ttl, resume_after=resume_after, name='fleet.approve')
async def approve(prompt: str) -> Any:
    """Ends waiting for the payment's approval; returns pydantic-ai's output as it is (WT-4)."""
    note({'prompt': prompt, 'what': 'body', 'phase': 'start'})
    return (await approval_agent.run(prompt)).output


bare = make_agent(durable=False)


@app.task(name='fleet.plain')
async def plain(prompt: str) -> str:
    """The same work with no journal at all: what `benchmarks/fleet.py` compares."""
    output = (await bare.run(prompt)).output
    note({'prompt': prompt, 'what': 'finished', 'phase': 'start', 'output': output})
    return output


async def _after_the_body(call_next: Callable[[], Awaitable[Any]], context: Any, worker: Any) -> Any:
    """After a job's body returned and before its status is stored: a place to kill."""
    result = await call_next()
    job = context.job
    if job.task_name.startswith(('fleet.research', 'fleet.approve')):
        prompt = str(job.task_kwargs.get('prompt'))
        note({'prompt': prompt, 'what': 'finished', 'phase': 'start', 'output': result})
        await hold(prompt, 'after-finish')
    return result


def run() -> None:
    logging.basicConfig(level=logging.WARNING, format='[%(asctime)s: %(levelname)s/%(name)s] %(message)s')
    logging.getLogger('pydantic_ai_durable').setLevel(logging.INFO)
    asyncio.run(main())


async def main() -> None:
    heartbeat = float(os.environ.get('FLEET_HEARTBEAT', '1'))
    async with app.open_async():
        print('fleet worker ready', flush=True)
        await app.run_worker_async(
            concurrency=int(os.environ.get('FLEET_CONCURRENCY', '2')),
            name=os.environ.get('FLEET_WORKER_NAME', 'fleet'),
            update_heartbeat_interval=heartbeat,
            stalled_worker_timeout=max(3 * heartbeat, 3.0),
            fetch_job_polling_interval=0.5,
            worker_middleware=[_after_the_body],
        )
