"""The approval example (`examples/approval/`) through its HTTP interface, its worker killed mid-run (WT-1..WT-4).

The web app runs under uvicorn and the worker as a process of its own, as a user runs them; the worker is
a queue adapter of the example's own over the fleet core. One refund is ordered, listed as waiting, its job
ended; it is approved over HTTP, and the app sends it on (`dispatch=True`); the worker that goes on is
SIGKILLed after the refund was paid and recorded, while the model writes its answer; a new worker's sweep
sends the execution again and it finishes, the refund paid once. A second refund is denied and never paid.
Decisions that cannot be recorded are answered 409.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / 'examples' / 'approval'

pytestmark = [pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX'), pytest.mark.timeout(300)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port: int = sock.getsockname()[1]
        return port


class Example:
    """The app and its workers, started in `data`, each a real process."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = _free_port()
        self.env = {**os.environ, 'APPROVAL_DATA': str(data), 'PORT': str(self.port)}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.client = httpx.Client(base_url=f'http://127.0.0.1:{self.port}', timeout=30)

    def start(self, script: str) -> subprocess.Popen[bytes]:
        log = (self.data / f'{script}.{len(self.processes)}.log').open('wb')
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE / script)], cwd=EXAMPLE, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes.append(process)
        return process

    def effects(self) -> list[str]:
        path = self.data / 'effects.txt'
        return path.read_text().splitlines() if path.exists() else []

    def logs(self) -> str:
        return '\n'.join(f'--- {p.name}\n{p.read_text()[-3000:]}' for p in sorted(self.data.glob('*.log')))

    def until(self, what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                found = check()
            except httpx.TransportError:
                found = None
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f'timed out waiting for {what}\n{self.logs()}')

    def order(self, key: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.get(f'/orders/{key}').json()
        return answer

    def waiting(self, key: str) -> dict[str, Any] | None:
        return next((call for call in self.client.get('/approvals').json() if call['key'] == key), None)

    def stop(self) -> None:
        self.client.close()
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


@pytest.fixture
def example(tmp_path: Path) -> Iterator[Example]:
    running = Example(tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.once  # three processes, one killed: about 15 s of the example's own machinery
def test_wt1_wt2_wt3_wt4_the_approval_example_over_http_with_its_worker_killed_after_the_approval(
    example: Example,
) -> None:
    example.start('app.py')
    worker = example.start('worker.py')
    example.until('the app to answer', lambda: example.client.get('/approvals').status_code == 200)

    created = example.client.post('/orders', json={'order': 'A-1', 'amount': 25})
    assert created.status_code == 202 and created.json() == {'key': 'refund:A-1'}
    call = example.until('the refund to wait for approval', lambda: example.waiting('refund:A-1'))
    assert (call['tool'], call['arguments']) == ('refund', {'order': 'A-1', 'amount': 25})
    assert call['deadline'] == pytest.approx(call['since'] + 3 * 24 * 3600)
    assert example.order('refund:A-1')['state'] == 'waiting' and example.effects() == []
    example.until('its job to end', lambda: 'refund:A-1 waits for a decision on' in example.logs())

    decided = example.client.post(f'/approvals/refund:A-1/{call["call_id"]}', json={'approve': True, 'by': 'alice'})
    assert decided.json() == {'pending': [], 'dispatched': True}  # the app sent it on to the worker
    example.until('the worker to answer after the refund', lambda: 'answering A-1' in example.effects())
    worker.send_signal(signal.SIGKILL)  # the refund is paid and recorded; the run has not ended
    worker.wait()
    assert example.effects() == ['refunded A-1', 'answering A-1']
    assert example.order('refund:A-1')['state'] == 'interrupted'

    example.start('worker.py')  # its sweep finds the interrupted execution and sends it again
    done = example.until('the refund to finish', lambda: example.order('refund:A-1')['output'])
    assert done == 'A-1: refunded 25 EUR'
    assert example.effects().count('refunded A-1') == 1
    assert example.order('refund:A-1')['state'] == 'finished'

    again = example.client.post(f'/approvals/refund:A-1/{call["call_id"]}', json={'approve': True})
    assert again.status_code == 409 and 'it is finished' in again.json()['error']

    example.client.post('/orders', json={'order': 'B-2', 'amount': 900})
    other = example.until('the second refund to wait', lambda: example.waiting('refund:B-2'))
    unknown = example.client.post('/approvals/refund:B-2/nope', json={'approve': True})
    assert unknown.status_code == 409 and "no deferred call 'nope'" in unknown.json()['error']
    denied = example.client.post(
        f'/approvals/refund:B-2/{other["call_id"]}', json={'approve': False, 'message': 'Too much.', 'by': 'bob'}
    )
    assert denied.json() == {'pending': [], 'dispatched': True}
    output = example.until('the denial to reach the model', lambda: example.order('refund:B-2')['output'])
    assert output == 'B-2: Too much.'
    assert 'refunded B-2' not in example.effects() and example.client.get('/approvals').json() == []
