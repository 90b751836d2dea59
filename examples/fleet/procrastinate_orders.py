"""A Procrastinate app whose job runs the shop's durable agent, and a worker of it (`work(name)`).

Queue and journal share one PostgreSQL database, `ORDERS_DSN`. `lease_ttl` and `resume_after` are short
so the demo resumes within seconds, and the worker heart-beats every second to match (keep
`resume_after` above three heartbeats).
"""

from __future__ import annotations

import asyncio
import os

import procrastinate
from shop import process

from pydantic_ai_durable import PostgresJournal
from pydantic_ai_durable.procrastinate import durable_job

DSN = os.environ.get('ORDERS_DSN', 'postgresql:///orders')

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DSN))


@durable_job(
    app, journal=PostgresJournal(DSN, schema='orders_journal'), lease_ttl=5, resume_after=5, name='orders.process_order'
)
async def process_order(order: str) -> str:
    return await process(order)


def work(name: str) -> None:
    """Run a worker of 2 jobs at once until it is stopped."""

    async def main() -> None:
        async with app.open_async():
            print('worker ready', flush=True)
            await app.run_worker_async(concurrency=2, name=name, update_heartbeat_interval=1, stalled_worker_timeout=3)

    asyncio.run(main())


def client(dsn: str) -> procrastinate.App:
    """A synchronous app on the same queue, for code that defers jobs and reads their status."""
    return procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=dsn))
