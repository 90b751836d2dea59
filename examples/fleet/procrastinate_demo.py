"""Kill a Procrastinate worker in the middle of durable jobs and watch the others finish them.

Queue and journal share one PostgreSQL database. The demo creates a fresh one on the server the DSN
names (the user needs `CREATEDB`), applies Procrastinate's schema, starts two workers of
`procrastinate_orders.py` (2 jobs at once each), defers 6 orders, SIGKILLs the first worker while it
charges cards, and starts a replacement. The recovery task that `durable_job` added retries the jobs the
dead worker left `doing` once it has missed its heartbeats, and each resumes from the journal: every
order is charged once and shipped once. The database is dropped at the end.

    pip install -e '.[procrastinate,postgres]'
    python examples/fleet/procrastinate_demo.py postgresql://me@localhost/postgres
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import procrastinate_orders
import psycopg
from _demo import ORDERS, Workers, kill_in_the_middle, report, wait_for
from psycopg import sql
from psycopg.conninfo import make_conninfo


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f'usage: python {sys.argv[0]} DSN   (a PostgreSQL server where you may create a database)')
    server = sys.argv[1]
    name = f'orders_demo_{uuid.uuid4().hex[:8]}'
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL('CREATE DATABASE {}').format(sql.Identifier(name)))
    try:
        run(make_conninfo(server, dbname=name))
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL('DROP DATABASE {} WITH (FORCE)').format(sql.Identifier(name)))


def run(dsn: str) -> None:
    client = procrastinate_orders.client(dsn)
    with tempfile.TemporaryDirectory() as tmp, client.open():
        client.schema_manager.apply_schema()
        root = Path(tmp)
        effects = root / 'effects.txt'
        os.environ.update(ORDERS_DSN=dsn, ORDERS_EFFECTS=str(effects))
        workers = Workers(
            lambda worker: [
                sys.executable,
                '-c',
                f'import procrastinate_orders; procrastinate_orders.work({worker!r})',
            ],
            dict(os.environ),
            root,
            'worker ready',
        )
        try:
            workers.start('w1')
            workers.start('w2')
            task = client.configure_task('orders.process_order')
            ids = [task.defer(order=order) for order in ORDERS]
            print(f'deferred {len(ORDERS)} orders to 2 workers x 2 jobs')
            kill_in_the_middle(workers, effects)
            started = time.monotonic()

            def all_done() -> bool:
                return all(next(iter(client.job_manager.list_jobs(id=i))).status == 'succeeded' for i in ids)

            wait_for('every order', all_done, within=120)
            print(f'all {len(ids)} jobs succeeded {time.monotonic() - started:.1f} s after the replacement started')
        finally:
            workers.stop()
        report(effects)


if __name__ == '__main__':
    main()
