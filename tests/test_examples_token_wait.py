"""The token wait example (`examples/token_wait.py`) runs as a user runs it, in a process of its own (EV-1..EV-3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip('pydantic_ai.external_events', reason='pydantic-ai before 2.68 has no waits on external events')

ROOT = Path(__file__).resolve().parent.parent


def test_ev1_ev2_ev3_the_example_waits_is_answered_from_the_cli_and_pays_once(tmp_path: Path) -> None:
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    done = subprocess.run(
        [sys.executable, str(ROOT / 'examples' / 'token_wait.py')],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        'attempt: waiting on approve_refund (approve_refund@0:1); nothing is held',
        "cli: resolved the wait of execution 'refund-17'; its next attempt goes on with it",
        'attempt: Refund 17: 40 EUR paid back.',
        'attempt: Refund 17: 40 EUR paid back.',
        'effects: asked the approver, refunded 40',  # asked once, paid once, over three attempts
    ]
