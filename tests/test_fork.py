"""A forked child keeps its own leases and connections (CC-7).

Job queues fork their workers from a parent that may already have used a journal: a Celery worker's
main process sweeps for interrupted executions, then forks a new pool process when one was killed. Each
test runs a fresh interpreter that uses a journal, forks, and reports what the child and the parent saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pg import fresh_schema

pytestmark = [pytest.mark.skipif(sys.platform == 'win32', reason='needs fork'), pytest.mark.once]

_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from pydantic_ai_durable import DiskJournal, PostgresJournal, execution

    config = json.loads(sys.argv[1])

    def journal():
        if config['backend'] == 'disk':
            return DiskJournal(config['path'])
        return PostgresJournal(config['dsn'], schema=config['schema'])

    shared = journal()

    async def taken_over(key):
        # Another holder tries the lease; it gets it only when nobody renewed it.
        other = journal()
        try:
            lease = await other.acquire_lease(key, 'elsewhere:1:0000:1', 1.0)
            return lease.holder == 'elsewhere:1:0000:1'
        finally:
            await other.close()

    async def child():
        async with execution('child', journal=shared, lease_ttl=1.0):
            await asyncio.sleep(3.5)  # several renewal rounds
            lost = await taken_over('child')
        return {'lease_lapsed': lost}

    async def parent():
        async with execution('parent', journal=shared, lease_ttl=1.0):
            before = shared._connections._pool.get_stats()['connections_num'] if config['backend'] == 'postgres' else 0
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.alarm(30)  # a child stuck on its parent's loop must not hang the test
                os.close(read)
                try:
                    report = asyncio.run(child())
                except BaseException as exc:
                    report = {'error': f'{type(exc).__name__}: {exc}'}
                del globals()['shared']
                import gc; gc.collect()  # the parent's pool, inherited, is dropped here: it must not be closed
                os.write(write, json.dumps(report).encode())
                os._exit(0)
            os.close(write)
            while True:
                waited, status = os.waitpid(pid, os.WNOHANG)
                if waited:
                    break
                await asyncio.sleep(0.05)
            with os.fdopen(read) as pipe:
                report = json.loads(pipe.read() or '{}')
            report['child_signal'] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            await asyncio.sleep(0.2)
            report['parent_lease_lapsed'] = await taken_over('parent')
            if config['backend'] == 'postgres':
                await shared.list_executions()
                report['parent_new_connections'] = shared._connections._pool.get_stats()['connections_num'] - before
        return report

    print(json.dumps(asyncio.run(parent())))
    """
)


def _run(config: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / 'fork_script.py'
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(config)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize('backend', ['disk', 'postgres'])
def test_cc7_a_forked_child_renews_its_own_leases_and_leaves_the_parents_alone(backend: str, tmp_path: Path) -> None:
    if backend == 'postgres':
        dsn, schema = fresh_schema()
        config = {'backend': backend, 'dsn': dsn, 'schema': schema}
    else:
        config = {'backend': backend, 'path': str(tmp_path / 'journal')}
    report = _run(config, tmp_path)
    assert report.get('error') is None, report
    assert report['child_signal'] == 0, 'the child hung on its parent`s background loop'
    assert report['lease_lapsed'] is False, "the child's lease was not renewed: another holder took it"
    assert report['parent_lease_lapsed'] is False, "the parent's lease stopped being renewed"
    if backend == 'postgres':
        # The child dropped the inherited pool without closing the parent's sessions: the parent's
        # pool needed no new connection afterwards.
        assert report['parent_new_connections'] == 0, report
