"""Deciding waiting executions from a shell (WT-2): `list --state waiting`, `show`, `approve`, `deny`, `complete`.

The run happens in this process; every decision is made by the CLI in a process of its own, on disk and
PostgreSQL, and the same code run again here goes on exactly as pydantic-ai's own second run would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg import fresh_schema
from pydantic_ai import DeferredToolResults
from pydantic_ai.tools import ToolDenied
from waiting_agent import PROMPT, build, lines, plain_two_runs

from pydantic_ai_durable import DiskJournal, Encryption, Journal, PostgresJournal, execution, pending_calls
from pydantic_ai_durable.fleet import Fleet, Waiting

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

KEY = 'order-7'


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, '-m', 'pydantic_ai_durable', *args],
        capture_output=True,
        text=True,
        encoding='utf-8',
        env={**os.environ, 'PYTHONIOENCODING': 'utf-8', **(env or {})},
        timeout=120,
    )


@pytest.fixture(params=['disk', 'postgres'])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[list[str], type[Journal], dict[str, str]]]:
    """The CLI's options naming a journal, and how this process opens the same one."""
    if request.param == 'disk':
        yield ['--journal', str(tmp_path / 'journal')], DiskJournal, {'path': str(tmp_path / 'journal')}
    else:
        dsn, schema = fresh_schema()
        yield ['--journal', dsn, '--schema', schema], PostgresJournal, {'dsn': dsn, 'schema': schema}


def _open(kind: type[Journal], where: dict[str, str], encryption: Encryption | None = None) -> Journal:
    return kind(**where, encryption=encryption)  # type: ignore[call-arg]


async def _attempt(journal: Journal, log: Path) -> object:
    agent = build(journal, log, scenario='three')
    async with execution(KEY, journal=journal):
        result = await agent.run(PROMPT)
    await journal.close()
    return result.output


async def test_wt2_the_cli_decides_calls_from_another_process(
    place: tuple[list[str], type[Journal], dict[str, str]], tmp_path: Path
) -> None:
    options, kind, where = place
    log = tmp_path / 'log'
    await _attempt(_open(kind, where), log)

    listed = cli(*options, 'list', '--state', 'waiting')
    assert listed.returncode == 0, listed.stderr
    assert 'waiting (3)' in listed.stdout and KEY in listed.stdout
    shown = cli(*options, 'show', KEY)
    assert 'waiting on 3 calls' in shown.stdout
    for expected in ('c2', 'refund', 'approval', '{"amount":5}', 'c4', 'carrier', 'external', '{"parcel":"p-1"}'):
        assert expected in shown.stdout, shown.stdout

    assert cli(*options, 'approve', KEY, 'c2', '--by', 'alice').returncode == 0
    denied = cli(*options, 'deny', KEY, 'c3', '--message', 'too much', '--by', 'bob', '--json')
    assert json.loads(denied.stdout) == {
        'key': KEY,
        'decided': ['c3'],
        'unchanged': [],
        'pending': ['c4'],
        'completed': False,
        'dispatched': False,
    }
    again = cli(*options, 'approve', KEY, 'c2')
    assert again.returncode == 0 and 'already approved' in again.stdout
    refused = cli(*options, 'approve', KEY, 'c3')
    assert refused.returncode == 1 and "'c3' was decided already: denied by bob" in refused.stderr
    unknown = cli(*options, 'deny', KEY, 'c9')
    assert unknown.returncode == 1 and "no deferred call 'c9'" in unknown.stderr
    assert cli(*options, 'complete', KEY, 'c4', '--result', 'not json').returncode == 2
    done = cli(*options, 'complete', KEY, 'c4', '--result', '{"eta": "tomorrow"}', '--by', 'carol')
    assert done.returncode == 0 and 'nothing is pending' in done.stdout

    trail = cli(*options, 'show', KEY, '--json')
    decided = {call['call_id']: call['decision'] for call in json.loads(trail.stdout)['calls']}
    assert {call: (d['kind'], d['by']) for call, d in decided.items()} == {
        'c2': ('approved', 'alice'),
        'c3': ('denied', 'bob'),
        'c4': ('result', 'carol'),
    }
    assert 'approved by alice' in cli(*options, 'show', KEY).stdout

    output = await _attempt(_open(kind, where), log)
    plain = DeferredToolResults(approvals={'c2': True, 'c3': ToolDenied('too much')}, calls={'c4': {'eta': 'tomorrow'}})
    expected, plain_log = await plain_two_runs(tmp_path / 'plain', 'three', plain)
    assert output == expected and lines(log) == plain_log


async def test_wt2_complete_refuses_nan_and_infinity_and_show_json_stays_json(
    place: tuple[list[str], type[Journal], dict[str, str]], tmp_path: Path
) -> None:
    options, kind, where = place
    await _attempt(_open(kind, where), tmp_path / 'log')
    for given, name in (('NaN', 'NaN'), ('-Infinity', '-Infinity'), ('{"eta": [1e999]}', "'c4'.eta[0]: Infinity")):
        done = cli(*options, 'complete', KEY, 'c4', f'--result={given}')
        assert done.returncode == 1 and 'Traceback' not in done.stderr and len(done.stderr.splitlines()) == 1, done
        assert f'{name} is not a JSON number' in done.stderr and 'Nothing was recorded' in done.stderr, done.stderr
    shown = cli(*options, 'show', KEY, '--json')

    def strict(constant: str) -> None:
        raise AssertionError(f'show --json printed {constant}, which is not JSON')

    calls = json.loads(shown.stdout, parse_constant=strict)['calls']
    assert [(call['call_id'], call['pending']) for call in calls] == [('c2', True), ('c3', True), ('c4', True)]


async def test_wt2_an_encrypted_journal_is_decided_only_with_its_keys(tmp_path: Path) -> None:
    key = bytes(range(32))
    keys = Encryption({'k1': key})
    journal_dir = tmp_path / 'journal'
    await _attempt(DiskJournal(journal_dir, encryption=keys), tmp_path / 'log')
    options = ['--journal', str(journal_dir)]
    without = cli(*options, 'approve', KEY, 'c2')
    assert without.returncode == 1 and 'PYDANTIC_AI_DURABLE_KEYS' in without.stderr, without.stderr
    assert 'calls      encrypted' in cli(*options, 'show', KEY).stdout
    import base64

    env = {'PYDANTIC_AI_DURABLE_KEYS': 'k1:' + base64.b64encode(key).decode()}
    assert cli(*options, 'approve', KEY, 'c2', env=env).returncode == 0
    shown = cli(*options, 'show', KEY, env=env)
    assert 'waiting on 2 calls' in shown.stdout and 'c2 (refund): approved' in shown.stdout


async def test_wt4_approve_with_dispatch_imports_the_apps_tasks_and_sends_the_task_on_through_their_fleet(
    tmp_path: Path,
) -> None:
    journal, sent = DiskJournal(tmp_path / 'journal'), tmp_path / 'sent'
    fleet = Fleet('cli-toy', lambda delivery: None)  # the worker's side: the same engine and task
    fleet.add('pay_out', journal=journal)
    agent = build(journal, tmp_path / 'log')
    delivery = fleet.delivery('pay_out', 'job-1', ['A-1'])
    assert isinstance(await fleet.run(delivery, lambda: agent.run(PROMPT)), Waiting)
    await journal.close()
    options = ['--journal', str(tmp_path / 'journal')]
    env = {'CLI_DISPATCH_SENT': str(sent), 'CLI_DISPATCH_JOURNAL': str(tmp_path / 'journal')}
    tests = str(Path(__file__).parent)

    def approve(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, '-m', 'pydantic_ai_durable', *options, 'approve', 'pay_out:job-1', 'c2', *extra],
            capture_output=True,
            text=True,
            cwd=tests,  # where the app's module is found, as with `celery -A`
            env={**os.environ, **env},
            timeout=120,
        )

    missing = approve('--dispatch', 'no_such_tasks')
    assert missing.returncode == 1 and "--dispatch: cannot import 'no_such_tasks'" in missing.stderr
    no_fleet = approve('--dispatch', 'json')  # imports, but defines no durable task: nothing is written
    assert no_fleet.returncode == 1 and 'no fleet is loaded here' in no_fleet.stderr, no_fleet.stderr
    assert [call.call_id for call in await pending_calls(journal, 'pay_out:job-1')] == ['c2']
    done = approve('--dispatch', 'cli_dispatch_tasks', '--json')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)['completed'] is json.loads(done.stdout)['dispatched'] is True
    assert [json.loads(line) for line in lines(sent)] == [['pay_out', 'job-1', ['A-1']]]
    await journal.close()
