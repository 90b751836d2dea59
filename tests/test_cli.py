"""The inspection CLI (CLI-1, CLI-2) against journals written by real agent runs.

Every test runs the CLI as a separate process, the way a user does, over a journal that real
`Agent` runs (a `FunctionModel` and a `FunctionToolset` under `Durable`) recorded, and compares what
it prints with what the journal itself returns.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import Calls, Operator, two_step_agent
from pg import fresh_schema
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from pydantic_ai_durable import DiskJournal, Durable, Journal, PostgresJournal, execution
from pydantic_ai_durable._cli import parse_duration, run_order
from pydantic_ai_durable.journals._json import dumps

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

_T = TypeVar('_T')

ORDER = 'order-42'
NESTED = 'nested\nkey é'
"""A key with a newline and a non-ASCII letter: a table must escape it, JSON must keep it."""
FAILED = 'failing'
LONG = 'batch-' + 'x' * 150 + '-END'
KEYS = sorted([ORDER, NESTED, FAILED, LONG])
NESTED_RUNS = ['0', '0.1.1', *(str(n) for n in range(1, 11))]
"""Run keys of the nested execution in start order; sorted as strings, '10' would come before '2'."""

SCRIPT = shutil.which('pydantic-ai-durable') or str(Path(sys.executable).with_name('pydantic-ai-durable'))


def cli(
    *args: str,
    module: bool = False,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the console script (or `python -m pydantic_ai_durable`) with UTF-8 output."""
    command = [sys.executable, '-m', 'pydantic_ai_durable'] if module else [SCRIPT]
    environment = {**os.environ, 'PYTHONIOENCODING': 'utf-8', **(env or {})}
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        encoding='utf-8',
        errors='replace',
        timeout=120,
        cwd=cwd,
        env=environment,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert a CLI-2 failure: the exit code, one line on stderr, no traceback, nothing on stdout."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert 'Traceback' not in result.stderr
    assert result.stdout == ''
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def run(coro: Awaitable[_T]) -> _T:
    async def go() -> _T:
        return await coro

    return asyncio.run(go())


# -- journals written by real agent runs ---------------------------------------------------------


def outer_agent(journal: Journal, inner: Agent[None, str]) -> Agent[None, str]:
    """An agent whose tool runs another agent: the inner run is nested under the tool step (R-4)."""

    async def delegate(question: str) -> str:
        return (await inner.run(question)).output

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(message, ModelResponse) for message in messages):
            return ModelResponse(parts=[ToolCallPart('delegate', {'question': 'how many?'}, tool_call_id='d1')])
        return ModelResponse(parts=[TextPart('done')])

    return Agent(
        FunctionModel(model, model_name='outer'),
        name='outer',
        toolsets=[FunctionToolset([delegate], id='team')],
        capabilities=[Durable(journal=journal)],
    )


async def record_executions(journal: Journal) -> None:
    """Four executions kept by `cleanup='keep'`: plain, nested (twelve runs), failed, and a long key."""
    calls = Calls()
    agent = two_step_agent(journal, calls)
    async with execution(ORDER, cleanup='keep'):
        await agent.run('count the rows')
    async with execution(NESTED, cleanup='keep'):
        await outer_agent(journal, two_step_agent(journal, calls)).run('delegate it')
        for _ in range(10):
            await agent.run('again')
    with pytest.raises(RuntimeError, match='model crashed'):
        async with execution(FAILED, cleanup='keep'):
            await two_step_agent(journal, calls, fail_final=True).run('count the rows')
    async with execution(LONG, cleanup='keep'):
        await agent.run('count the rows')
    await journal.close()


@pytest.fixture(scope='module')
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp('cli') / 'journal'
    run(record_executions(DiskJournal(path)))
    return path


@pytest.fixture
def journal_copy(recorded: Path, tmp_path: Path) -> Path:
    """A private copy of the recorded journal, for the tests that delete from it."""
    return Path(shutil.copytree(recorded, tmp_path / 'journal'))


async def read_all(journal: Journal, key: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    try:
        record = await journal.read_execution(key)
        runs = {run: await journal.read_run(key, run) for run in (record or {}).get('runs', [])}
        return record, runs
    finally:
        await journal.close()


async def list_all(journal: Journal) -> list[Any]:
    try:
        return await journal.list_executions()
    finally:
        await journal.close()


# -- pure helpers ----------------------------------------------------------------------------------


def test_cli1_run_keys_sort_in_start_order() -> None:
    shuffled = ['10', '1', '0.3.1', '2', '0', '0.1.1', '0.1.2', '0.10.1']
    assert sorted(shuffled, key=run_order) == ['0', '0.1.1', '0.1.2', '0.3.1', '0.10.1', '1', '2', '10']


@pytest.mark.parametrize(
    ('text', 'seconds'),
    [('0s', 0), ('30s', 30), ('15m', 900), ('12h', 43200), ('7d', 604800), ('2w', 1209600), ('1d12h', 129600)],
)
def test_cli1_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize('text', ['7x', '7', '', 'd', '-1d', '1.d', '7 d'])
def test_cli2_durations_without_a_unit_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match='invalid duration'):
        parse_duration(text)


# -- list ------------------------------------------------------------------------------------------


def test_cli1_list_table(recorded: Path) -> None:
    result = cli('--journal', str(recorded), 'list')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ['KEY', 'STATE', 'RUNS', 'STEPS', 'SIZE', 'LAST', 'UPDATE', 'METADATA']
    assert len(lines) == 1 + len(KEYS)  # the newline inside a key does not break the table
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows[ORDER][1:4] == ['finished', '1', '3']
    assert rows[FAILED][1:4] == ['failed', '1', '2']
    assert rows['nested\\nkey'][2:5] == ['finished', '12', '36']  # escaped, then 'é' as its own word
    assert rows[ORDER][5] in ('B', 'KB')
    long_row = next(line for line in lines if line.startswith('batch-'))
    assert '…' in long_row and '-END' not in long_row


def test_cli1_list_json_matches_the_journal(recorded: Path) -> None:
    result = cli('--journal', str(recorded), 'list', '--json', module=True)
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    infos = run(list_all(DiskJournal(recorded)))
    assert [item['key'] for item in listed] == [info.key for info in infos] == KEYS
    for item, info in zip(listed, infos, strict=True):
        assert (item['state'], item['runs'], item['steps'], item['bytes']) == (
            info.state,
            info.runs,
            info.steps,
            info.bytes,
        )
        assert isinstance(item['bytes'], int)
        assert item['updated_epoch'] == info.updated
        parsed = datetime.datetime.fromisoformat(item['updated'].replace('Z', '+00:00'))
        assert abs(parsed.timestamp() - info.updated) < 0.001


def test_cli1_list_reads_the_default_journal_from_the_environment(recorded: Path, tmp_path: Path) -> None:
    result = cli('list', '--json', cwd=tmp_path, env={'PYDANTIC_AI_DURABLE_DIR': str(recorded)})
    assert result.returncode == 0, result.stderr
    assert [item['key'] for item in json.loads(result.stdout)] == KEYS


def test_cli1_a_key_a_terminal_cannot_encode_is_escaped_not_a_crash(recorded: Path) -> None:
    result = cli('--journal', str(recorded), 'list', env={'PYTHONIOENCODING': 'ascii'})
    assert result.returncode == 0, result.stderr
    assert 'nested\\nkey \\xe9' in result.stdout
    assert '\\u2026' in result.stdout  # the ellipsis of the long key


# -- show ------------------------------------------------------------------------------------------


def test_cli1_show_table(recorded: Path) -> None:
    _, runs = run(read_all(DiskJournal(recorded), ORDER))
    entries = runs['0'].entries
    result = cli('--journal', str(recorded), 'show', ORDER)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert ORDER in out and 'finished, 1 attempt' in out and 'run 0' in out
    assert 'POS' in out and 'FINGERPRINT' in out
    for position, entry in entries.items():
        row = next(line for line in out.splitlines() if line.split()[:1] == [str(position)])
        assert entry['name'] in row and entry['kind'] in row
        assert entry['fingerprint'][:12] in row and entry['fingerprint'][:13] not in row
    assert 'two_step__model.request' in out and 'call_tool:query' in out


def test_cli1_show_table_of_a_failed_execution(recorded: Path) -> None:
    result = cli('--journal', str(recorded), 'show', FAILED)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert 'failed, 1 attempt' in out
    assert 'meta: diverge_from=none high_water=3 model_at_fault=false' in out
    assert '(nothing recorded)' in out  # position 2, the model request that crashed
    assert '2 requests' in out  # the crashed request was counted before it was sent (U2-1)


def test_cli1_show_json_matches_read_run(recorded: Path) -> None:
    shown_runs: dict[str, list[str]] = {}
    for key in (ORDER, NESTED, FAILED):
        record, runs = run(read_all(DiskJournal(recorded), key))
        assert record is not None
        result = cli('--journal', str(recorded), 'show', key, '--json')
        assert result.returncode == 0, result.stderr
        shown = json.loads(result.stdout)
        assert shown['key'] == key
        assert shown['attempts'] == record['attempts'] == 1
        assert shown['state'] == ('failed' if key == FAILED else 'finished')
        assert [item['run'] for item in shown['runs']] == sorted(runs, key=run_order)
        shown_runs[key] = [item['run'] for item in shown['runs']]
        for item in shown['runs']:
            snapshot = runs[item['run']]
            assert item['records'] == snapshot.records
            assert [step['position'] for step in item['steps']] == sorted(snapshot.entries)
            for step in item['steps']:
                entry = snapshot.entries[step['position']]
                assert (step['name'], step['kind'], step['fingerprint']) == (
                    entry['name'],
                    entry['kind'],
                    entry['fingerprint'],
                )
                assert step['payload_bytes'] == len(dumps(entry['payload']) or '')
                assert step['recorded_epoch'] == entry['t']
                assert step['readable'] is True
    assert shown_runs[NESTED] == NESTED_RUNS
    assert shown_runs[ORDER] == shown_runs[FAILED] == ['0']


def test_cli1_show_table_orders_nested_runs(recorded: Path) -> None:
    result = cli('--journal', str(recorded), 'show', NESTED, module=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == 'execution  nested\\nkey é'
    headers = [line.removeprefix('run ') for line in result.stdout.splitlines() if line.startswith('run ')]
    assert headers == NESTED_RUNS
    assert 'outer__function_toolset__team.call_tool:delegate' in result.stdout


def test_cli1_show_an_entry_the_core_cannot_read(journal_copy: Path) -> None:
    """An entry of another format version, without a fingerprint or a record time, is shown as such."""

    async def write_foreign_entry() -> None:
        journal = DiskJournal(journal_copy)
        entry = {'v': 2, 'name': 'two_step__model.request', 'kind': 'model', 'fingerprint': None, 'payload': 'x'}
        assert await Operator(journal).write_entry(FAILED, '0', 2, entry)
        await journal.close()

    run(write_foreign_entry())
    table = cli('--journal', str(journal_copy), 'show', FAILED)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.split()[:1] == ['2'])
    assert row.split() == ['2', 'model', 'two_step__model.request', '(unreadable:', 'runs', 'live)', '-', '3', 'B', '-']
    assert '(nothing recorded)' not in table.stdout
    shown = json.loads(cli('--journal', str(journal_copy), 'show', FAILED, '--json').stdout)
    step = shown['runs'][0]['steps'][2]
    assert step == {
        'position': 2,
        'name': 'two_step__model.request',
        'kind': 'model',
        'fingerprint': None,
        'payload_bytes': 3,
        'sealed': None,
        'recorded': None,
        'recorded_epoch': None,
        'v': 2,
        'readable': False,
    }


def test_cli2_show_an_unknown_key(recorded: Path) -> None:
    line = one_line_error(cli('--journal', str(recorded), 'show', 'order-43'), 1)
    assert f"no execution 'order-43' in '{recorded}'" in line


# -- delete and prune ------------------------------------------------------------------------------


def test_cli2_delete_then_show(journal_copy: Path) -> None:
    result = cli('--journal', str(journal_copy), 'delete', ORDER)
    assert result.returncode == 0, result.stderr
    assert f"deleted execution '{ORDER}' (finished, 1 run, 3 steps)" in result.stdout
    assert 'no execution' in one_line_error(cli('--journal', str(journal_copy), 'show', ORDER), 1)
    assert 'no execution' in one_line_error(cli('--journal', str(journal_copy), 'delete', ORDER), 1)
    assert run(read_all(DiskJournal(journal_copy), ORDER)) == (None, {})
    assert [info.key for info in run(list_all(DiskJournal(journal_copy)))] == [k for k in KEYS if k != ORDER]
    deleted = cli('--journal', str(journal_copy), 'delete', NESTED, '--json', module=True)
    assert json.loads(deleted.stdout) == {'deleted': NESTED, 'state': 'finished', 'runs': 12, 'steps': 36}


def test_cli2_delete_refuses_a_running_execution(journal_copy: Path) -> None:
    async def hold() -> None:
        journal = DiskJournal(journal_copy)
        assert (await journal.acquire_lease(FAILED, 'worker-on-another-host', 600)).holder == 'worker-on-another-host'
        await journal.close()

    run(hold())
    listed = json.loads(cli('--journal', str(journal_copy), 'list', '--json').stdout)
    assert {item['key']: item['state'] for item in listed}[FAILED] == 'running'
    assert 'running' in cli('--journal', str(journal_copy), 'show', FAILED).stdout
    line = one_line_error(cli('--journal', str(journal_copy), 'delete', FAILED), 1)
    assert 'is running' in line and '--force' in line
    assert cli('--journal', str(journal_copy), 'delete', FAILED, '--force').returncode == 0
    assert run(read_all(DiskJournal(journal_copy), FAILED)) == (None, {})


def test_cli1_prune(journal_copy: Path) -> None:
    kept = cli('--journal', str(journal_copy), 'prune', '--older-than', '7d')
    assert kept.returncode == 0, kept.stderr
    assert 'nothing to prune' in kept.stdout
    assert len(run(list_all(DiskJournal(journal_copy)))) == len(KEYS)
    pruned = cli('--journal', str(journal_copy), 'prune', '--older-than', '0s', '--json')
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout) == [key for key in KEYS if key != FAILED]  # finished ones only, by default
    assert [info.key for info in run(list_all(DiskJournal(journal_copy)))] == [FAILED]
    again = cli('--journal', str(journal_copy), 'prune', '--older-than', '0s')
    assert 'it holds 1 failed, none finished (--state chooses others)' in again.stdout
    failed = cli('--journal', str(journal_copy), 'prune', '--older-than', '0s', '--state', 'failed,interrupted')
    assert failed.returncode == 0 and FAILED in failed.stdout
    assert run(list_all(DiskJournal(journal_copy))) == []
    assert 'no executions in' in cli('--journal', str(journal_copy), 'list').stdout


def test_cli2_prune_with_a_bad_duration_is_a_usage_error(journal_copy: Path) -> None:
    result = cli('--journal', str(journal_copy), 'prune', '--older-than', '7x')
    assert result.returncode == 2
    assert 'Traceback' not in result.stderr
    assert 'usage:' in result.stderr and "invalid duration '7x'" in result.stderr
    assert len(run(list_all(DiskJournal(journal_copy)))) == len(KEYS)


@pytest.mark.parametrize(
    'args',
    [
        [],
        ['explode'],
        ['show'],
        ['prune', '--state', 'failed'],
        ['prune', '--older-than', '1d', '--state', 'running'],
        ['list', '--state', 'asleep'],
        ['--schema', 'x', 'list'],
    ],
    ids=[
        'no-command',
        'unknown-command',
        'show-without-key',
        'prune-state-without-age',
        'prune-running',
        'unknown-state',
        'schema-for-a-directory',
    ],
)
def test_cli2_usage_errors(recorded: Path, args: list[str]) -> None:
    result = cli('--journal', str(recorded), *args)
    assert result.returncode == 2, result.stderr
    assert 'usage:' in result.stderr and 'Traceback' not in result.stderr


# -- journals that are not there -------------------------------------------------------------------


def test_cli2_a_missing_journal_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / 'nonexistent'
    for command in (['show', ORDER], ['prune', '--older-than', '0s']):  # reading and writing
        line = one_line_error(cli('--journal', str(missing), *command), 1)
        assert 'no journal at' in line and 'does not exist' in line
        assert not missing.exists()
    line = one_line_error(cli('--journal', '/nonexistent', 'list', module=True), 1)
    assert "no journal at '/nonexistent'" in line
    assert not Path('/nonexistent').exists()


def test_cli2_the_default_journal_is_not_created(tmp_path: Path) -> None:
    environment = {key: value for key, value in os.environ.items() if key != 'PYDANTIC_AI_DURABLE_DIR'}
    result = subprocess.run(
        [SCRIPT, 'list'], capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=120, check=False
    )
    line = one_line_error(result, 1)
    assert "'.durable'" in line and 'PYDANTIC_AI_DURABLE_DIR' in line
    assert list(tmp_path.iterdir()) == []


def test_cli2_a_file_is_not_a_journal(tmp_path: Path) -> None:
    file = tmp_path / 'journal.txt'
    file.write_text('not a journal')
    line = one_line_error(cli('--journal', str(file), 'list'), 1)
    assert 'is a file' in line
    assert file.read_text() == 'not a journal'


def test_cli2_a_directory_without_a_journal_is_left_alone(tmp_path: Path) -> None:
    empty = tmp_path / 'empty'
    empty.mkdir()
    line = one_line_error(cli('--journal', str(empty), 'prune', '--older-than', '0s'), 1)
    assert 'no journal at' in line
    assert list(empty.iterdir()) == []


def test_cli2_an_unreadable_journal_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'cache.db').write_bytes(b'this is not an SQLite database' * 100)
    line = one_line_error(cli('--journal', str(broken), 'list'), 1)
    assert 'cannot read the journal' in line or 'cannot open the journal' in line


def test_cli1_console_script_is_installed() -> None:
    assert Path(SCRIPT).is_file(), 'run `pip install -e .` to install the pydantic-ai-durable console script'
    result = cli('--help')
    assert result.returncode == 0
    assert result.stdout.startswith('usage: pydantic-ai-durable')
    assert 'exit codes:' in result.stdout
    assert cli('--help', module=True).stdout.startswith('usage: python -m pydantic_ai_durable')


# -- PostgreSQL ------------------------------------------------------------------------------------


@pytest.fixture
def pg_schema() -> Iterator[tuple[str, str]]:
    yield fresh_schema()  # skips without a server (fails when CI=true)


def _url(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    return f'postgresql://{params["user"]}@{params["host"]}:{params["port"]}/{params["dbname"]}'


def _schema_exists(dsn: str, schema: str) -> bool:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute('SELECT to_regnamespace(%s) IS NOT NULL', (schema,)).fetchone()
    return bool(row and row[0])


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return int(probe.getsockname()[1])


def test_cli1_postgres(pg_schema: tuple[str, str]) -> None:
    dsn, schema = pg_schema
    run(record_executions(PostgresJournal(dsn, schema=schema)))
    url = _url(dsn)
    listed = cli('--journal', url, '--schema', schema, 'list', '--json')
    assert listed.returncode == 0, listed.stderr
    infos = run(list_all(PostgresJournal(dsn, schema=schema)))
    assert [(i['key'], i['state'], i['runs'], i['steps'], i['bytes']) for i in json.loads(listed.stdout)] == [
        (info.key, info.state, info.runs, info.steps, info.bytes) for info in infos
    ]
    _, runs = run(read_all(PostgresJournal(dsn, schema=schema), FAILED))
    shown = cli('show', FAILED, '--journal', dsn, '--schema', schema)  # a libpq key=value DSN works too
    assert shown.returncode == 0, shown.stderr
    assert runs['0'].entries[0]['fingerprint'][:12] in shown.stdout and 'high_water=3' in shown.stdout
    nested = json.loads(cli('show', NESTED, '--json', '--journal', url, '--schema', schema).stdout)
    assert [item['run'] for item in nested['runs']] == NESTED_RUNS
    assert cli('--journal', url, '--schema', schema, 'delete', ORDER).returncode == 0
    assert 'no execution' in one_line_error(cli('--journal', url, '--schema', schema, 'show', ORDER), 1)
    pruned = cli('--journal', url, '--schema', schema, 'prune', '--older-than', '0s', '--json')
    assert json.loads(pruned.stdout) == [key for key in KEYS if key not in (ORDER, FAILED)]
    pruned = cli('--journal', url, '--schema', schema, 'prune', '--older-than', '0s', '--state', 'failed', '--json')
    assert json.loads(pruned.stdout) == [FAILED]

    missing = schema + '_missing'
    line = one_line_error(cli('--journal', url, '--schema', missing, 'list'), 1)
    assert 'no journal at' in line and missing in line
    assert not _schema_exists(dsn, missing)


def test_cli2_postgres_refusing_connections_is_one_line() -> None:
    url = f'postgresql://nobody:hunter2@127.0.0.1:{_closed_port()}/x?connect_timeout=2'
    line = one_line_error(cli('--journal', url, 'list'), 1)
    assert 'cannot open the journal' in line
    assert 'hunter2' not in line


def test_cli1_show_gives_the_cost_of_a_priced_run(tmp_path: Path) -> None:
    path = tmp_path / 'journal'

    async def record() -> None:
        journal = DiskJournal(path)
        usages = (RequestUsage(input_tokens=1000, output_tokens=20),) * 2
        async with execution('priced-1', journal=journal):
            await two_step_agent(journal, Calls(), usages=usages, model_name='gpt-4o').run('count the rows')
        await journal.close()

    asyncio.run(record())
    result = cli('--journal', str(path), 'show', 'priced-1')
    assert result.returncode == 0, result.stderr
    # 2,000 input and 40 output tokens of gpt-4o; the spend snapshot keeps the cost as a decimal string.
    assert (
        'live spend (all attempts): 2 requests, 1 tool call, 2000 input / 40 output tokens, cost 0.0054'
        in result.stdout
    )
