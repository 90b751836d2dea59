"""Journal files are data, never code (issue 16): each attack of someone who can write a journal.

The attacker here can write to a journal directory (a shared volume, a restored backup) or hand an
operator a DSN; the victim resumes an agent or runs the CLI over it. Every attack is planted the way
an attacker would, with `sqlite3` straight into `cache.db`, and every test checks the harm itself: no
marker file appears (no pickle ran), nothing outside the directory changes, the planted step runs
live, the CLI prints no raw control character, no piece of a password is shown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import Calls, Operator, two_step_agent

from pydantic_ai_durable import DiskJournal, JournalUnavailable, PostgresJournal, execution
from pydantic_ai_durable.journals._common import execution_id
from pydantic_ai_durable.journals._disk_format import BAD_VALUE

_T = TypeVar('_T')

KEY = 'order-42'
EID = execution_id(KEY)
LOGGER = 'pydantic_ai_durable'
MODE_RAW, MODE_BINARY, MODE_TEXT, MODE_PICKLE = 1, 2, 3, 4
"""diskcache's storage modes, as an attacker writes them into the `mode` column."""


def run(coro: Awaitable[_T]) -> _T:
    async def go() -> _T:
        return await coro

    return asyncio.run(go())


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a new process, as an operator runs it; output kept byte-exact (no newline translation)."""
    return subprocess.run(
        [sys.executable, '-m', 'pydantic_ai_durable', *args],
        capture_output=True,
        text=True,
        encoding='utf-8',
        errors='surrogateescape',
        timeout=120,
        env={**os.environ, 'PYTHONIOENCODING': 'utf-8'},
        check=False,
    )


class _RunsCode:
    """Unpickling this creates the directory `marker`: proof that a stored pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.marker,))


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps(_RunsCode(marker))


def sql(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on the journal's database directly, the way an attacker plants a row."""
    con = sqlite3.connect(path / 'cache.db', isolation_level=None)
    try:
        return con.execute(statement, params).fetchall()
    finally:
        con.close()


def plant(path: Path, key: str, *, mode: int, value: Any = None, filename: str | None = None) -> None:
    """Overwrite the stored row of `key` with another storage mode, value and side file."""
    sql(
        path,
        'UPDATE Cache SET mode = ?, value = ?, filename = ? WHERE key = ? AND raw = 1',
        (mode, value, filename, key),
    )
    assert sql(path, 'SELECT mode FROM Cache WHERE key = ? AND raw = 1', (key,)) == [(mode,)], f'no row {key!r}'


def stored_text(path: Path, key: str) -> str:
    [(value,)] = sql(path, 'SELECT value FROM Cache WHERE key = ? AND raw = 1', (key,))
    assert isinstance(value, str)
    return value


def record(path: Path) -> Calls:
    """A real two-step agent run (model, tool, model) kept in a journal at `path`."""
    calls = Calls()

    async def go() -> None:
        async with execution(KEY, cleanup='keep'):
            assert (await two_step_agent(DiskJournal(path), calls).run('count the rows')).output == 'answer: 3 rows'

    asyncio.run(go())
    assert calls['model'] == 2 and calls['tool'] == 1
    return calls


def resume(path: Path, calls: Calls, *, cleanup: str = 'keep') -> None:
    async def go() -> None:
        async with execution(KEY, cleanup=cleanup):  # type: ignore[arg-type]
            assert (await two_step_agent(DiskJournal(path), calls).run('count the rows')).output == 'answer: 3 rows'

    asyncio.run(go())


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.fixture
def journal_dir(tmp_path: Path) -> Path:
    return tmp_path / 'journal'


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / 'pwned'
    yield path
    assert not path.exists(), 'a pickle stored in the journal was executed'


# -- 1. code execution: nothing in the journal is ever unpickled -------------------------------------


def test_j8_a_pickled_entry_never_runs_when_the_agent_resumes(
    journal_dir: Path, marker: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls = record(journal_dir)
    plant(journal_dir, f'{EID}/e/0/0', mode=MODE_PICKLE, value=evil_pickle(marker))

    resume(journal_dir, calls)

    assert not marker.exists()
    assert calls['model'] == 3  # the planted step ran live; the rest replayed
    [warning] = warnings_of(caplog)  # a bad entry, reported once (B-3)
    assert 'positions [0]' in warning


def test_j8_a_pickled_key_never_runs_when_an_unreadable_index_is_rebuilt(journal_dir: Path, marker: Path) -> None:
    calls = record(journal_dir)
    sql(
        journal_dir,
        'INSERT INTO Cache (key, raw, store_time, access_time, mode, value) VALUES (?, 0, 0, 0, ?, ?)',
        (evil_pickle(marker), MODE_RAW, '{}'),
    )
    plant(journal_dir, f'{EID}/h', mode=MODE_RAW, value='not an index')  # rebuilding walks every key

    resume(journal_dir, calls)

    assert not marker.exists()
    assert calls['model'] == 2  # the index was rebuilt from the real keys: everything replayed


@pytest.mark.parametrize('where', ['entry', 'index', 'execution record', 'lease'])
def test_j8_a_pickled_value_never_runs_in_cli_list_or_show(journal_dir: Path, marker: Path, where: str) -> None:
    record(journal_dir)
    item = {'entry': f'{EID}/e/0/1', 'index': f'{EID}/h', 'execution record': f'{EID}/x', 'lease': f'{EID}/l'}[where]
    if where == 'lease':
        sql(
            journal_dir,
            'INSERT INTO Cache (key, raw, store_time, access_time, mode, value) VALUES (?, 1, 0, 0, ?, ?)',
            (item, MODE_PICKLE, evil_pickle(marker)),
        )
    else:
        plant(journal_dir, item, mode=MODE_PICKLE, value=evil_pickle(marker))

    listed = cli('--journal', str(journal_dir), 'list')
    shown = cli('--journal', str(journal_dir), 'show', KEY)

    assert not marker.exists()
    assert listed.returncode == 0, listed.stderr
    if where == 'entry':
        assert shown.returncode == 0, shown.stderr
        row = next(line for line in shown.stdout.splitlines() if line.split()[:1] == ['1'])
        assert '(unreadable: runs live)' in row


def test_j8_a_pickled_key_never_runs_in_cli_list(journal_dir: Path, marker: Path) -> None:
    record(journal_dir)
    sql(
        journal_dir,
        'INSERT INTO Cache (key, raw, store_time, access_time, mode, value) VALUES (?, 0, 0, 0, ?, ?)',
        (evil_pickle(marker), MODE_RAW, '{}'),
    )

    listed = cli('--journal', str(journal_dir), 'list', '--json')

    assert not marker.exists()
    assert listed.returncode == 0, listed.stderr
    assert [item['key'] for item in json.loads(listed.stdout)] == [KEY]
    assert 'a pickled key' in listed.stderr and 'never loads' in listed.stderr  # nothing else reports a key


def test_j8_journal_values_are_json_text_inside_the_database(journal_dir: Path) -> None:
    """What this format writes: str keys, MODE_RAW TEXT values that are JSON, no side file."""
    record(journal_dir)
    rows = sql(journal_dir, 'SELECT key, raw, mode, filename, typeof(value), value FROM Cache')
    assert rows
    for key, raw, mode, filename, kind, value in rows:
        assert (type(key), raw, mode, filename, kind) == (str, 1, MODE_RAW, None, 'text'), key
        json.loads(value)
    others = [p.name for p in journal_dir.iterdir() if not p.name.startswith('cache.db')]
    assert sorted(others) == ['journal-id', 'locks']  # the journal's id (JF-4) and live holders' lock files (B-12)
    assert list((journal_dir / 'locks').iterdir()) == []  # each removed with its lease


async def test_j8_the_journal_refuses_to_store_anything_but_text(journal_dir: Path) -> None:
    journal = DiskJournal(journal_dir)
    await journal.open()
    try:
        cache = journal._open_cache()
        for value in (b'bytes', 12, 1.5, {'a': 1}, None):
            with pytest.raises(TypeError):
                cache.set(f'{EID}/x', value)
        with pytest.raises(TypeError):
            cache.set(('tuple', 'key'), '{}')
    finally:
        await journal.close()


async def test_j8_the_fast_write_path_stores_exactly_what_diskcache_would(journal_dir: Path) -> None:
    """`put_text`/`read_text`, the one-statement calls every recorded step uses, agree with `set`/`get`.

    Same columns and metadata as diskcache's own `set` (so 0.1.0 and the CLI read the rows unchanged),
    and the same refusals as `get` for a row this format never writes.
    """
    journal = DiskJournal(journal_dir)
    await journal.open()
    try:
        cache = journal._open_cache()
        columns = 'raw, expire_time, access_count, tag, size, mode, filename, typeof(value), value'
        cache.set('by-set', '{"a":1}')
        cache.put_text('by-put', '{"a":1}')  # a new row: diskcache's own insert
        assert sql(journal_dir, f"SELECT {columns} FROM Cache WHERE key = 'by-put'") == sql(
            journal_dir, f"SELECT {columns} FROM Cache WHERE key = 'by-set'"
        )
        sql(journal_dir, "UPDATE Cache SET access_count = 7, tag = 'x', size = 3 WHERE key = 'by-put'")
        cache.set('by-set', '{"b":2}')
        cache.put_text('by-put', '{"b":2}')  # an existing row: the one-statement update
        assert sql(journal_dir, f"SELECT {columns} FROM Cache WHERE key = 'by-put'") == sql(
            journal_dir, f"SELECT {columns} FROM Cache WHERE key = 'by-set'"
        )
        [(count,)] = sql(journal_dir, 'SELECT count(*) FROM Cache')
        [(size,)] = sql(journal_dir, 'SELECT sum(size) FROM Cache')
        assert sql(journal_dir, "SELECT key, value FROM Settings WHERE key IN ('count', 'size') ORDER BY key") == [
            ('count', count),
            ('size', size),
        ]
        with pytest.raises(TypeError):
            cache.put_text('by-put', b'{}')  # type: ignore[arg-type]

        for key in ('by-put', 'missing'):
            assert cache.read_text(key) == cache.get(key)
        plant(journal_dir, 'by-put', mode=MODE_PICKLE, value=b'not a pickle')
        assert cache.read_text('by-put') is cache.get('by-put') is BAD_VALUE
        plant(journal_dir, 'by-put', mode=MODE_RAW, value=b'{"a":1}')  # a BLOB, not TEXT
        assert cache.read_text('by-put') is BAD_VALUE
        plant(journal_dir, 'by-put', mode=MODE_RAW, value='{"a":1}', filename='ab/cd/' + 'e' * 28 + '.val')
        assert cache.read_text('by-put') is BAD_VALUE
        sql(journal_dir, "UPDATE Cache SET expire_time = 1 WHERE key = 'by-set'")  # expired, as `get` sees it
        assert cache.read_text('by-set') is cache.get('by-set') is None
    finally:
        await journal.close()


def test_j8_a_journal_written_before_this_format_reads_unchanged(journal_dir: Path) -> None:
    """0.1.0 wrote the same rows (str keys, JSON text inline) through diskcache's own `Disk`."""
    import diskcache

    calls = record(journal_dir)
    rows = sql(journal_dir, 'SELECT key, value FROM Cache ORDER BY key')
    sql(journal_dir, 'DELETE FROM Cache')
    with diskcache.Cache(str(journal_dir), eviction_policy='none', disk_min_file_size=2**40) as cache:
        for key, value in rows:
            cache.set(key, value)

    resume(journal_dir, calls)

    assert calls['model'] == 2 and calls['tool'] == 1  # everything replayed


# -- 1b. the Settings table of a planted database cannot reconfigure the journal ----------------------


def test_j8_planted_settings_cannot_turn_recording_off(journal_dir: Path) -> None:
    record(journal_dir)
    sql(journal_dir, "INSERT OR REPLACE INTO Settings VALUES ('sqlite_query_only', 1)")  # every write fails
    sql(journal_dir, "INSERT OR REPLACE INTO Settings VALUES ('sqlite_journal_mode', 'off')")  # no atomic commit
    sql(journal_dir, "INSERT OR REPLACE INTO Settings VALUES ('eviction_policy', 'least-recently-stored')")
    sql(journal_dir, "INSERT OR REPLACE INTO Settings VALUES ('size_limit', 0)")  # evict everything
    sql(journal_dir, "INSERT OR REPLACE INTO Settings VALUES ('cull_limit', 100)")

    async def check() -> None:
        journal = DiskJournal(journal_dir)
        try:
            await journal.open()
            assert await Operator(journal).write_entry(KEY, '0', 7, {'v': 1, 'x': 1}) is True
            cache = journal._open_cache()
            assert cache._sql('PRAGMA journal_mode').fetchone() == ('wal',)
            assert cache._sql('PRAGMA query_only').fetchone() == (0,)
            assert sorted((await journal.read_run(KEY, '0')).entries) == [0, 1, 2, 7]  # nothing was evicted
        finally:
            await journal.close()

    run(check())


@pytest.mark.parametrize('setting', ['_directory', 'disk__directory'])
def test_j8_planted_settings_cannot_move_the_database(journal_dir: Path, tmp_path: Path, setting: str) -> None:
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    record(journal_dir)
    sql(journal_dir, 'INSERT OR REPLACE INTO Settings VALUES (?, ?)', (setting, str(elsewhere)))

    async def check() -> None:
        journal = DiskJournal(journal_dir)
        try:
            await journal.open()
            assert await Operator(journal).write_entry(KEY, '0', 7, {'v': 1}) is True
            assert sorted((await journal.read_run(KEY, '0')).entries) == [0, 1, 2, 7]
        finally:
            await journal.close()

    run(check())
    assert list(elsewhere.iterdir()) == []


async def test_j8_every_connection_distrusts_the_schema(journal_dir: Path) -> None:
    """`trusted_schema=OFF`: a planted trigger or view cannot call functions that have side effects."""
    journal = DiskJournal(journal_dir)
    await journal.open()
    try:
        cache = journal._open_cache()
        assert cache._sql('PRAGMA trusted_schema').fetchone() == (0,)
        other: list[Any] = []

        def in_thread() -> None:  # diskcache opens one connection per thread
            other.append(cache._sql('PRAGMA trusted_schema').fetchone())

        await asyncio.to_thread(in_thread)
        assert other == [(0,)]
    finally:
        await journal.close()


# -- 2. file deletion: a row's side file never reaches outside the journal --------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the journal with one file: what a planted row tries to read and delete."""
    directory = tmp_path / 'outside'
    directory.mkdir()
    (directory / 'victim').write_text('precious')
    return directory


def _snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob('*')) if p.is_file()}


@pytest.mark.parametrize('how', ['absolute', 'dotdot'])
def test_j8_a_planted_side_file_outside_is_never_read_nor_deleted(
    journal_dir: Path, outside: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls = record(journal_dir)
    victim = outside / 'victim'
    # The victim holds a valid entry: a journal that reads it would replay from a file it must not touch.
    victim.write_text(stored_text(journal_dir, f'{EID}/e/0/0'))
    before = _snapshot(outside)
    filename = str(victim) if how == 'absolute' else os.path.join('..', 'outside', 'victim')
    plant(journal_dir, f'{EID}/e/0/0', mode=MODE_TEXT, filename=filename)

    resume(journal_dir, calls, cleanup='execution')  # a success deletes the execution, row by row

    assert calls['model'] == 3  # the planted row was a miss: step 0 ran live
    assert _snapshot(outside) == before
    assert outside.is_dir()


@pytest.mark.parametrize('how', ['absolute', 'dotdot', 'database', 'symlinked'])
def test_j8_cli_delete_never_deletes_a_file_a_row_names(journal_dir: Path, outside: Path, how: str) -> None:
    record(journal_dir)
    name = 'ab/cd/' + 'e' * 28 + '.val'  # the shape of diskcache's own side files
    if how == 'symlinked':
        (journal_dir / 'ab').mkdir()
        (journal_dir / 'ab' / 'cd').symlink_to(outside)
        (outside / ('e' * 28 + '.val')).write_text('also precious')
    filename = {
        'absolute': str(outside / 'victim'),
        'dotdot': '../outside/victim',
        'database': 'cache.db',
        'symlinked': name,
    }[how]
    before = _snapshot(outside)
    plant(journal_dir, f'{EID}/e/0/1', mode=MODE_BINARY, filename=filename)

    deleted = cli('--journal', str(journal_dir), 'delete', KEY)

    assert deleted.returncode == 0, deleted.stderr
    assert _snapshot(outside) == before and outside.is_dir()
    assert (journal_dir / 'cache.db').stat().st_size > 0
    assert cli('--journal', str(journal_dir), 'list', '--json').stdout.strip() == '[]'


# -- 3. permissions: a new journal is private whatever the umask ------------------------------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.skipif(os.name != 'posix', reason='POSIX permissions')
async def test_disk_journal_is_private_under_umask_022(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / 'parent' / 'journal'
    journal = DiskJournal(path)
    await journal.open()
    try:
        assert await Operator(journal).write_entry(KEY, '0', 0, {'v': 1, 'prompt': 'secret'})
        files = {p.name: _mode(p) for p in path.iterdir()}
        assert files == {
            'cache.db': 0o600,
            'cache.db-wal': 0o600,
            'cache.db-shm': 0o600,
            'journal-id': 0o600,
            'locks': 0o700,  # lock files of live holders (B-12) are made the same way
        }
        assert _mode(path) == 0o700
        assert _mode(tmp_path / 'parent') == 0o700
    finally:
        await journal.close()


@pytest.mark.skipif(os.name != 'posix', reason='POSIX permissions')
async def test_disk_journal_shared_on_purpose(tmp_path: Path) -> None:
    old = os.umask(0o077)  # even a strict umask does not take back what the owner asked for
    try:
        journal = DiskJournal(tmp_path / 'shared', mode=0o660)
        await journal.open()
        assert await Operator(journal).write_entry(KEY, '0', 0, {'v': 1})
        assert {p.name: _mode(p) for p in (tmp_path / 'shared').iterdir()} == {
            **dict.fromkeys(['cache.db', 'cache.db-wal', 'cache.db-shm', 'journal-id'], 0o660),
            'locks': 0o770,
        }
        assert _mode(tmp_path / 'shared') == 0o770
        assert 'mode=0o660' in repr(journal)
        await journal.close()
    finally:
        os.umask(old)


@pytest.mark.skipif(os.name != 'posix', reason='POSIX permissions')
async def test_disk_journal_leaves_an_existing_directory_mode_alone(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / 'made-by-hand'
    path.mkdir(mode=0o750)
    journal = DiskJournal(path)
    await journal.open()
    await journal.close()
    assert _mode(path) == 0o750
    assert _mode(path / 'cache.db') == 0o600


@pytest.mark.skipif(os.name != 'posix', reason='POSIX permissions')
async def test_disk_journal_warns_about_a_database_others_can_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / 'journal'
    journal = DiskJournal(path)
    await journal.open()
    await journal.close()
    (path / 'cache.db').chmod(0o644)  # as 0.1.0 created it under umask 022

    reopened = DiskJournal(path)
    await reopened.open()
    await Operator(reopened).write_entry(KEY, '0', 0, {'v': 1})
    await reopened.close()

    [warning] = [w for w in warnings_of(caplog) if 'other users' in w]
    assert 'cache.db' in warning and '0o644' in warning and 'chmod' in warning
    assert _mode(path / 'cache.db') == 0o644  # reported, never changed behind the owner's back


@pytest.mark.parametrize('mode', [0o400, 0o1600, -1, 384.0, '0o600', True])
def test_disk_journal_refuses_a_mode_it_cannot_work_with(tmp_path: Path, mode: Any) -> None:
    with pytest.raises((ValueError, TypeError), match='DiskJournal mode'):
        DiskJournal(tmp_path / 'journal', mode=mode)


async def test_disk_journal_refuses_a_database_that_is_a_symbolic_link(journal_dir: Path, outside: Path) -> None:
    journal_dir.mkdir()
    (journal_dir / 'cache.db').symlink_to(outside / 'victim')
    with pytest.raises(JournalUnavailable, match='symbolic link'):
        await DiskJournal(journal_dir).open()
    assert (outside / 'victim').read_text() == 'precious'


# -- 4. terminal injection: the CLI prints no raw control character ----------------------------------

CONTROL = '\x1b]0;pwned\x07\x1b[2J\x9b31m'
"""An OSC title change ended by BEL, a clear screen, and a C1 CSI: what a crafted journal sends."""


def _craft(path: Path) -> str:
    """A journal whose every stored text field carries control characters; returns the execution key."""
    key = f'key{CONTROL}'
    run_key = f'0{CONTROL}'
    readable = {
        'v': 1,
        'name': f'n{CONTROL}',
        'kind': 'tool',
        'fingerprint': f'{CONTROL}abcdef',
        'payload': {'kind': 'tool_return', 'result': CONTROL},
        't': 1_700_000_000.0,
    }
    unreadable = {**readable, 'kind': f'tool{CONTROL}', 'fingerprint': CONTROL}

    async def write() -> None:
        journal = DiskJournal(path)
        await journal.open()
        record = {'v': 1, 'key': key, 'runs': [run_key], 'attempts': 1, 'status': f'finished{CONTROL}'}
        assert await Operator(journal).write_execution(key, record)
        assert await Operator(journal).write_entry(key, run_key, 0, readable)
        assert await Operator(journal).write_entry(key, run_key, 1, unreadable)
        assert await Operator(journal).write_record(key, run_key, 'meta', {'v': 1, 'high_water': 2, 'note': CONTROL})
        await journal.close()

    run(write())
    return key


def _clean(text: str) -> None:
    for char in ('\x1b', '\x07', '\x9b'):
        assert char not in text, f'raw {char!r} in CLI output: {text!r}'


def test_cli1_every_printed_field_is_escaped(journal_dir: Path) -> None:
    key = _craft(journal_dir)
    for args in (['list'], ['show', key], ['show', key + 'x'], ['delete', key + 'x']):
        result = cli('--journal', str(journal_dir), *args)
        assert result.returncode in (0, 1), result.stderr
        _clean(result.stdout + result.stderr)
    shown = cli('--journal', str(journal_dir), 'show', key).stdout
    assert '\\x1b]0;pwned\\x07' in shown  # escaped, still readable: kind, fingerprint and run key
    assert f'run 0{CONTROL}' not in shown and 'run 0\\x1b' in shown
    deleted = cli('--journal', str(journal_dir), 'delete', key)
    assert deleted.returncode == 0, deleted.stderr
    _clean(deleted.stdout + deleted.stderr)


def test_cli1_json_output_keeps_every_field_exact(journal_dir: Path) -> None:
    key = _craft(journal_dir)
    listed = cli('--journal', str(journal_dir), 'list', '--json')
    shown = cli('--journal', str(journal_dir), 'show', key, '--json')
    _clean(listed.stdout + shown.stdout)  # JSON escapes them as \u001b
    assert [item['key'] for item in json.loads(listed.stdout)] == [key]
    data = json.loads(shown.stdout)
    [run_] = data['runs']
    assert run_['run'] == f'0{CONTROL}'
    assert [step['kind'] for step in run_['steps']] == ['tool', f'tool{CONTROL}']
    assert run_['steps'][0]['fingerprint'] == f'{CONTROL}abcdef'
    assert run_['records']['meta']['note'] == CONTROL


def test_cli1_pruned_keys_are_escaped(journal_dir: Path) -> None:
    _craft(journal_dir)
    pruned = cli('--journal', str(journal_dir), 'prune', '--older-than', '0s', '--state', 'interrupted,finished')
    assert pruned.returncode == 0, pruned.stderr
    _clean(pruned.stdout + pruned.stderr)
    assert 'key\\x1b' in pruned.stdout


# -- 5. DSN masking: no piece of a password in any repr, log line or error ---------------------------

SECRET_PIECES = ('s3cr', 'p4ss', 'w0rd')
"""The parts of every test password between its `@`, `:` and `/`: none may ever be shown."""

LEAKY_DSNS = [
    'postgresql://u:s3cr@p4ss:w0rd@127.0.0.1:9/db',
    'postgresql://u:s3cr@p4ss@w0rd@127.0.0.1:9/db',
    'postgresql://u:s3cr:p4ss:w0rd@127.0.0.1:9/db',
    'postgresql://u:s3cr/p4ss/w0rd@127.0.0.1:9/db',
    'postgres://u:s3cr%40p4ss%2Fw0rd@127.0.0.1:9/db',
    'postgresql://127.0.0.1:9/db?user=u&password=s3cr@p4ss/w0rd&sslmode=disable',
    'postgresql://127.0.0.1:9/db?sslmode=disable&PassWord=s3cr&p4ss=w0rd',
    "host=127.0.0.1 port=9 password='s3cr @p4ss:w0rd' dbname=db",
    "host=127.0.0.1 port=9 password='s3cr \\' p4ss w0rd' dbname=db",
    'host=127.0.0.1 port=9 password=s3cr\\ p4ss w0rd dbname=db',
    'host=127.0.0.1 port=9 password = s3cr@p4ss:w0rd/ dbname=db',
    "host=127.0.0.1 port=9 password='s3cr p4ss w0rd",
]


def _no_secret(text: str) -> None:
    for piece in SECRET_PIECES:
        assert piece not in text, f'{piece!r} leaked: {text!r}'


@pytest.mark.parametrize('dsn', LEAKY_DSNS)
def test_b8_repr_never_shows_a_password(dsn: str) -> None:
    from pydantic_ai_durable.journals.postgres import _safe_dsn

    _no_secret(repr(PostgresJournal(dsn)))
    _no_secret(_safe_dsn(dsn))


@pytest.mark.parametrize(
    ('dsn', 'shown'),
    [
        (
            'postgresql://u:pw@db.example:5432/app?sslmode=require',
            'postgresql://u:***@db.example:5432/app?sslmode=require',
        ),
        ('postgresql://u@db.example/app', 'postgresql://u@db.example/app'),
        ("host=db.example user=u password='a b' dbname=app", 'host=db.example user=u password=*** dbname=app'),
        ('host=db.example dbname=app', 'host=db.example dbname=app'),
    ],
)
def test_b8_masking_keeps_the_rest_of_the_dsn(dsn: str, shown: str) -> None:
    from pydantic_ai_durable.journals.postgres import _safe_dsn

    assert _safe_dsn(dsn) == shown


@pytest.mark.parametrize('dsn', LEAKY_DSNS)
async def test_b8_connection_errors_never_show_a_password(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    journal = PostgresJournal(dsn, connect_timeout=2)
    with pytest.raises(JournalUnavailable) as opened:
        await journal.open()
    _no_secret(str(opened.value))
    with pytest.raises(Exception) as read:  # what the core logs when a read fails mid-attempt
        await journal.read_run(KEY, '0')
    _no_secret(str(read.value))
    _no_secret(repr(read.value))
    with pytest.raises(JournalUnavailable) as leased:
        await journal.acquire_lease(KEY, 'me', 30)
    _no_secret(str(leased.value))
    await journal.close()


@pytest.mark.parametrize('dsn', LEAKY_DSNS)
def test_b8_cli_errors_never_show_a_password(dsn: str) -> None:
    result = cli('--journal', dsn, 'list')
    assert result.returncode in (1, 2), result
    _no_secret(result.stdout + result.stderr)


def test_b8_a_password_with_at_colon_slash_works_and_stays_hidden(postgres_dsn: str) -> None:
    """Against the real server (trust auth accepts any password): the journal works, nothing shows it."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(postgres_dsn)
    password = "s3cr@p4ss:w0rd/ 'x"
    keyword = (
        f'host={params["host"]} port={params["port"]} user={params["user"]} dbname={params["dbname"]} '
        f"password='{password.replace(chr(39), chr(92) + chr(39))}'"
    )
    schema = 'pad_security_' + os.urandom(4).hex()
    journal = PostgresJournal(keyword, schema=schema)

    async def use() -> None:
        await journal.open()
        assert await Operator(journal).write_execution(KEY, {'v': 1, 'runs': []})
        await journal.close()

    run(use())
    _no_secret(repr(journal))
    listed = cli('--journal', keyword, '--schema', schema, 'list')
    assert listed.returncode == 0, listed.stderr
    _no_secret(listed.stdout + listed.stderr)
    missing = cli('--journal', keyword, '--schema', schema, 'show', 'nope')
    assert missing.returncode == 1
    assert 'password=***' in missing.stderr
    _no_secret(missing.stdout + missing.stderr)
    from pg import drop_schema

    drop_schema(postgres_dsn, schema)
