"""Kill a Celery worker in the middle of durable tasks and watch the others finish them.

Starts its own `redis-server` (Debian package `redis-server`) and two Celery workers of
`celery_orders.py` (2 processes each), sends 6 orders, SIGKILLs the first worker with all its processes
while it charges cards, and starts a replacement. The sweep in the surviving workers sends the
interrupted tasks again within seconds, and each resumes from the journal: every order is charged once
and shipped once. A payment call the kill interrupted never ended, so it runs again; one that ended and
was journaled never does. (One that ended in the microseconds before its result was journaled would run
again too, since the journal never acknowledged it: give such tools an idempotency key.)

    pip install -e '.[celery]'
    python examples/fleet/celery_demo.py
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _demo import HERE, ORDERS, Workers, kill_in_the_middle, report


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def celery_worker(name: str) -> list[str]:
    return [
        sys.executable, '-m', 'celery', '-A', 'celery_orders', 'worker', '-P', 'prefork', '-c', '2',
        '-n', f'{name}@%h', '--without-gossip', '--without-mingle', '--loglevel', 'INFO',
    ]  # fmt: skip


def main() -> None:
    redis_server = shutil.which('redis-server')
    if redis_server is None:
        sys.exit('This demo starts its own Redis: install redis-server (Debian package redis-server).')
    with tempfile.TemporaryDirectory() as tmp:
        root, port = Path(tmp), free_port()
        redis = subprocess.Popen(
            [redis_server, '--port', str(port), '--bind', '127.0.0.1', '--save', '', '--dir', tmp],
            stdout=subprocess.DEVNULL,
        )
        effects = root / 'effects.txt'
        os.environ.update(
            ORDERS_BROKER=f'redis://127.0.0.1:{port}/0',
            ORDERS_JOURNAL=str(root / 'journal'),
            ORDERS_EFFECTS=str(effects),
        )
        sys.path.insert(0, str(HERE))
        import celery_orders  # the client side of the same app: it sends the tasks and reads their results

        workers = Workers(celery_worker, dict(os.environ), root, ready=' ready.')
        try:
            workers.start('w1')
            workers.start('w2')
            results = {order: celery_orders.process_order.delay(order) for order in ORDERS}
            print(f'sent {len(ORDERS)} orders to 2 workers x 2 processes')
            kill_in_the_middle(workers, effects)
            started = time.monotonic()
            for result in results.values():
                print(f'  {result.get(timeout=120)}')
            print(f'all done {time.monotonic() - started:.1f} s after the replacement started')
        finally:
            workers.stop()
            redis.terminate()
            redis.wait()
        report(effects)


if __name__ == '__main__':
    main()
