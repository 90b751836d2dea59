"""Executions that wait, killed with SIGKILL at every point (WT-1..WT-3), on disk and PostgreSQL.

One execution goes through every point in turn, each in a real child process that kills itself there:
after the deferral is recorded, inside `resolve` before and after its write, after the decision and before
the continuation runs, inside the approved tool, and after it. A last process finishes the run. Every
acknowledged side effect happened once, the decision made by the resolver killed after its write is kept,
and the output is pydantic-ai's own second run's, given the same decision.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_agent import journal_from_setting as open_journal
from pg import fresh_schema
from pydantic_ai import DeferredToolResults
from waiting_agent import KEY, lines, plain_two_runs

from pydantic_ai_durable import pending_calls

pytestmark = pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')

HERE = Path(__file__).parent


@pytest.fixture(params=['disk', 'postgres'])
def journal_setting(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == 'disk':
        yield f'disk:{tmp_path / "journal"}'
    else:
        dsn, schema = fresh_schema()
        yield f'postgres:{schema}:{dsn}'


def child(setting: str, log: Path, phase: str, point: str = '') -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HERE / 'waiting_child.py'), setting, str(log), phase, point],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=HERE,
    )


def killed(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == -signal.SIGKILL, (result.returncode, result.stdout, result.stderr[-3000:])


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-3000:])
    return result.stdout.strip()


async def state_and_pending(setting: str) -> tuple[str, list[str]]:
    journal = open_journal(setting)
    try:
        (info,) = await journal.list_executions()
        return info.state, [call.call_id for call in info.pending]
    finally:
        await journal.close()


@pytest.mark.once  # 20 to 30 s of child processes, each killed at a point of the package's own machinery
async def test_wt1_wt2_wt3_sigkill_at_every_point_of_a_wait_keeps_each_effect_once_and_each_decision(
    journal_setting: str, tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    killed(child(journal_setting, log, 'run', 'after-run'))  # the deferral is recorded, the scope never ended
    assert lines(log) == ['model', 'lookup 7']
    assert 'DeferredToolRequests' in ok(child(journal_setting, log, 'run'))  # ends waiting at once
    assert lines(log) == ['model', 'lookup 7'] and await state_and_pending(journal_setting) == ('waiting', ['c2'])

    killed(child(journal_setting, log, 'resolve', 'before-write'))  # nothing recorded
    journal = open_journal(journal_setting)
    try:
        assert [call.call_id for call in await pending_calls(journal, KEY)] == ['c2']
    finally:
        await journal.close()
    killed(child(journal_setting, log, 'resolve', 'after-write'))  # recorded, lease left behind
    journal = open_journal(journal_setting)
    try:
        (call,) = await pending_calls(journal, KEY, decided=True)
    finally:
        await journal.close()
    assert call.decision is not None and (call.decision.kind, call.decision.by) == ('approved', 'killed-resolver')
    assert "unchanged=('c2',)" in ok(child(journal_setting, log, 'resolve'))  # the same decision: accepted

    killed(child(journal_setting, log, 'run', 'start'))  # after the decision, before the continuation
    killed(child(journal_setting, log, 'run', 'refund'))  # inside the approved tool, before its effect
    assert 'refund 5' not in lines(log)
    killed(child(journal_setting, log, 'run', 'model-2'))  # after the approved tool's step was recorded
    assert lines(log).count('refund 5') == 1
    output = ok(child(journal_setting, log, 'run'))

    expected, plain_log = await plain_two_runs(tmp_path / 'plain', 'one', DeferredToolResults(approvals={'c2': True}))
    assert output == repr(expected)
    effects = lines(log)
    assert [effects.count(effect) for effect in ('lookup 7', 'refund 5')] == [1, 1], effects
    assert [line for line in effects if line != 'model'] == [line for line in plain_log if line != 'model']
    assert await state_and_pending(journal_setting) == ('finished', [])
