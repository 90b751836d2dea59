"""The fleet examples run as a user would run them, and prove what they print (FL-3, FL-6).

Each demo starts real workers, SIGKILLs one in the middle of its tasks and checks from the side effects
file that every order was charged and shipped exactly once; here the test also checks that the kill hit
running payment calls, so that a demo that killed an idle worker would not pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fleet import in_ci
from pg import server_dsn

EXAMPLES = Path(__file__).resolve().parent.parent / 'examples' / 'fleet'

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(300)]


def _run(script: str, *args: str) -> str:
    env = {key: value for key, value in os.environ.items() if not key.startswith(('ORDERS_', 'CELERY_'))}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, env=env, timeout=280
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _killed_calls_started_again(output: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith('payment calls started again'))
    return [part.strip() for part in line.split(':', 1)[1].split(',') if part.strip() != 'none']


def test_fl3_the_celery_demo_resumes_a_killed_workers_tasks_with_each_side_effect_once() -> None:
    if shutil.which('redis-server') is None and not in_ci():
        pytest.skip('the Celery demo needs redis-server (Debian package redis-server)')
    output = _run('celery_demo.py')
    assert 'every order charged once and shipped once' in output
    assert output.count(': Charged and shipped.') == 6
    assert _killed_calls_started_again(output), 'the kill hit no running payment call:\n' + output


def test_fl6_the_procrastinate_demo_resumes_a_killed_workers_jobs_with_each_side_effect_once() -> None:
    output = _run('procrastinate_demo.py', server_dsn())
    assert 'every order charged once and shipped once' in output
    assert 'all 6 jobs succeeded' in output
    assert _killed_calls_started_again(output), 'the kill hit no running payment call:\n' + output
