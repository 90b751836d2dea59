"""What both demos do around their engine: start workers, kill one with its processes, count side effects."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDERS = [f'order-{n}' for n in range(1, 7)]


def wait_for(what: str, check: Callable[[], bool], within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f'gave up waiting for {what}')
        time.sleep(0.1)


class Workers:
    """Worker processes, each in a session of its own so that a kill takes its pool processes too."""

    def __init__(self, command: Callable[[str], list[str]], env: dict[str, str], logs: Path, ready: str) -> None:
        self.command, self.env, self.logs, self.ready = command, env, logs, ready
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, name: str) -> None:
        log_path = self.logs / f'{name}.log'
        with log_path.open('ab') as log:
            worker = subprocess.Popen(
                self.command(name), cwd=HERE, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        self.running.append(worker)
        wait_for(f'worker {name}', lambda: self.ready in log_path.read_text())

    def kill_first(self) -> None:
        os.killpg(self.running[0].pid, signal.SIGKILL)
        self.running[0].wait()

    def stop(self) -> None:
        for worker in self.running:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=30)


def kill_in_the_middle(workers: Workers, effects: Path) -> None:
    """SIGKILL the first worker while its tasks are inside their payment call, and start a replacement."""
    wait_for('a first card being charged', lambda: effects.exists() and 'charging' in effects.read_text())
    time.sleep(0.3)  # inside the payment call of each running task
    workers.kill_first()
    print('SIGKILLed worker w1 and its processes in the middle of its tasks')
    workers.start('w3')
    print('started worker w3; waiting for every order (interrupted ones are sent again within seconds)')


def report(effects: Path) -> None:
    """Print the side effects; exit with an error if one ran twice or never."""
    lines = effects.read_text().splitlines()
    again = sorted(line for line, n in Counter(lines).items() if line.startswith('charging') and n > 1)
    print('payment calls started again (killed before they ended):', ', '.join(again) or 'none')
    counts = Counter(line for line in lines if not line.startswith('charging'))
    print('side effects:', ', '.join(f'{line} x{n}' for line, n in sorted(counts.items())))
    repeated = [line for line, n in counts.items() if n > 1]
    missing = [
        f'{what} {order}' for order in ORDERS for what in ('charged', 'shipped') if not counts[f'{what} {order}']
    ]
    if repeated or missing:
        sys.exit(f'repeated: {repeated}; missing: {missing}')
    print('every order charged once and shipped once')
