"""A Celery app whose task runs the shop's durable agent; `celery -A celery_orders worker` from this directory.

Settings come from the environment: `ORDERS_BROKER` (a Redis URL) and `ORDERS_JOURNAL` (the journal
directory). `lease_ttl` and `resume_after` are short so the demo resumes within seconds.
"""

from __future__ import annotations

import os

from celery import Celery
from shop import process

from pydantic_ai_durable import DiskJournal
from pydantic_ai_durable.celery import durable_task

BROKER = os.environ.get('ORDERS_BROKER', 'redis://127.0.0.1:6379/0')

app = Celery('orders', broker=BROKER, backend=BROKER)
app.conf.update(
    worker_prefetch_multiplier=1,  # a killed worker holds no message it has not started
    broker_transport_options={'visibility_timeout': 3600},  # >= lease_ttl; the sweep does not wait for it
    broker_connection_retry_on_startup=True,
)


@durable_task(app, journal=DiskJournal(os.environ.get('ORDERS_JOURNAL', '.durable')), lease_ttl=5, resume_after=5)
async def process_order(order: str) -> str:
    return await process(order)
