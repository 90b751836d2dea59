"""The disk journal and its SQLite database: the locks SQLite holds are SQLite's alone (J-9).

On POSIX, closing any descriptor of a file releases every fcntl lock the process holds on it, those of
SQLite's connections included. A journal that opens and closes `cache.db` beside a live connection of its
own process lets another process checkpoint and reset the write-ahead log under that connection. These
tests run the sequences a real deployment runs (a journal object per request, several processes on one
directory) and check the database and every execution in it afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import diskcache
import pytest
from disk_worker import TICK, read_ticks, record, tick
from helpers import Calls, Operator, two_step_agent
from packaging.version import Version

from pydantic_ai_durable import DiskJournal, JournalError, JournalUnavailable, execution

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

WORKER = Path(__file__).resolve().parent / 'disk_worker.py'
POSIX = pytest.mark.skipif(sys.platform == 'win32', reason='fcntl locks are POSIX')


def _worker(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), *arguments], capture_output=True, text=True, timeout=timeout, check=False
    )


def _integrity(path: Path) -> str:
    connection = sqlite3.connect(path / 'cache.db')
    try:
        return str(connection.execute('PRAGMA integrity_check').fetchone()[0])
    finally:
        connection.close()


async def _replays_without_calls(journal: DiskJournal, key: str) -> Calls:
    calls = Calls()
    async with execution(key, journal=journal):
        await two_step_agent(None, calls).run('go')
    return calls


@POSIX
async def test_j9_a_second_journal_object_in_a_process_keeps_the_first_ones_locks(tmp_path: Path) -> None:
    """Record with one journal object, open a second on the same directory, let another process record and exit.

    When opening the second object closed a descriptor of `cache.db`, the first object's connection lost its
    locks; the other process, finding no reader, checkpointed and removed the write-ahead log on exit, and
    every journal opened afterwards in this process failed with "database disk image is malformed".
    """
    path = tmp_path / 'journal'
    first = DiskJournal(path)
    async with execution('here', journal=first):
        await two_step_agent(None, Calls()).run('go')
    second = DiskJournal(path)
    await second.open()

    child = _worker('record', str(path), 'there')
    assert child.returncode == 0, child.stderr

    for attempt in range(3):  # an app that builds a journal per request
        later = DiskJournal(path)
        await later.open()
        assert sorted(info.key for info in await later.list_executions()) == ['here', 'there'], attempt
        await later.close()
    for journal in (first, second):
        assert sorted(info.key for info in await journal.list_executions()) == ['here', 'there']
        for key in ('here', 'there'):
            assert (await _replays_without_calls(journal, key)).counts == {}
        await journal.close()
    assert _integrity(path) == 'ok'


@pytest.mark.parametrize('where', ['new', 'existing', 'no hard links'])
async def test_j9_no_code_of_the_package_opens_the_database_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Every descriptor of `cache.db`, `-wal` and `-shm` is SQLite's: Python's `os.open` never sees one.

    Where the file system has no hard links, a new database is created in place, exclusively: the one
    descriptor closed is of a file nobody else can have open yet.
    """
    path = tmp_path / 'journal'
    first = DiskJournal(path)
    if where == 'existing':  # and open in this process: the case where a descriptor closed would cost its locks
        await first.open()
    if where == 'no hard links':

        def refuse(*args: object, **kwargs: object) -> None:
            raise PermissionError(1, 'Operation not permitted')

        monkeypatch.setattr(os, 'link', refuse)
    opened: list[str] = []
    real_open = os.open

    def watching(file: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fsdecode(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, 'open', watching)
    journal = DiskJournal(path)
    await journal.open()
    assert await Operator(journal).write_entry('k', '0', 0, {'v': 1})
    monkeypatch.undo()
    await journal.close()
    await first.close()
    database = [name for name in opened if Path(name).name.startswith('cache.db')]
    assert database == ([str(path / 'cache.db')] if where == 'no hard links' else []), opened
    assert stat.S_IMODE((path / 'cache.db').stat().st_mode) == 0o600
    assert sorted(p.name for p in path.iterdir() if p.name.endswith('.tmp')) == []  # no temporary left behind


@POSIX
@pytest.mark.once
@pytest.mark.skipif(not hasattr(os, 'fork'), reason='needs fork')
@pytest.mark.skipif(sys.platform == 'win32', reason='flock is POSIX')
async def test_b12_a_process_whose_lock_file_another_is_checking_still_takes_its_lease(tmp_path: Path) -> None:
    """Another process proving a holder dead locks the holder's file for an instant (`lockable`). Caught in
    that instant, the live process failed to lock its own file (`BlockingIOError`, so `JournalUnavailable`),
    and the checker took it for dead: the file must be locked from the moment it exists."""
    import fcntl

    from pydantic_ai_durable._runtime import process_token
    from pydantic_ai_durable.journals._process_lock import lock_file, lockable

    path = lock_file(tmp_path / 'journal', f'-:0:{process_token()}:0')
    assert path is not None
    path.parent.mkdir(parents=True)
    checker = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # the file as another process's check holds it
    fcntl.flock(checker, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        journal = DiskJournal(tmp_path / 'journal')
        calls = Calls()
        async with execution('order-5', journal=journal):
            await two_step_agent(journal, calls).run('go')
            assert not lockable(path)  # while it holds a lease, its file is locked: it lives
        await journal.close()
    finally:
        os.close(checker)
    assert calls['tool'] == 1


def test_j9_a_forked_child_takes_its_own_locks_whatever_its_parent_had_open(tmp_path: Path) -> None:
    """A process with journal connections in two threads forks; the child records, the parent exits.

    SQLite records per process which locks its connections hold, and a child inherits the record without
    the locks: its own connections then took theirs for held and held none, so once the parent was gone
    another process's exit reset the write-ahead log under the child ("database disk image is malformed").
    """
    path, gate = tmp_path / 'journal', tmp_path / 'gate'
    gate.mkdir()
    with open(tmp_path / 'forked.log', 'w') as log:  # a file, not a pipe: the child outlives the parent
        parent = subprocess.Popen([sys.executable, str(WORKER), 'forked', str(path), str(gate)], stderr=log)
    assert parent.wait(timeout=120) == 0, (tmp_path / 'forked.log').read_text()
    assert (gate / 'child').exists()  # the parent exited once its child had recorded
    other = _worker('record', str(path), 'third')
    assert other.returncode == 0, other.stderr
    (gate / 'go').touch()
    deadline = time.monotonic() + 120
    while not (gate / 'result').exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads((gate / 'result').read_text()) == [['child', 'parent', 'third']] * 6
    assert _integrity(path) == 'ok'


STRESS_SECONDS = float(os.environ.get('DISK_STRESS_SECONDS', '60'))
"""How long the stress test below runs, over all its shapes together (60 s in CI, once)."""
SHAPES = ((1, 2), (2, 3), (3, 4), (4, 2))
"""(journal objects in this process, other processes recording, forking and importing beside it)."""


@POSIX
@pytest.mark.once
@pytest.mark.parametrize(('objects', 'others'), SHAPES)
async def test_j9_journal_objects_and_processes_working_on_one_directory_leave_it_whole(
    tmp_path: Path, objects: int, others: int
) -> None:
    """N journal objects here, and 2-4 processes beside them, record, fork, export, import and read at once.

    Afterwards the database passes SQLite's integrity check, nobody met a malformed database, every
    execution replays without one model request or tool call, and no counter one process wrote was ever
    read back at an older value by another.
    """
    seconds = STRESS_SECONDS / len(SHAPES)
    path = tmp_path / 'journal'
    journals = [DiskJournal(path) for _ in range(objects)]
    for journal in journals:
        await journal.open()
    names = [f'worker-{n}' for n in range(others)]
    gate = tmp_path / 'gate'
    gate.mkdir()
    workers = []
    for name in names:
        with open(tmp_path / f'{name}.out', 'w') as out, open(tmp_path / f'{name}.log', 'w') as log:
            others_of = [other for other in names if other != name]
            command = [
                sys.executable,
                str(WORKER),
                'churn',
                str(path),
                name,
                str(seconds),
                str(gate),
                'main',
                *others_of,
            ]
            workers.append(subprocess.Popen(command, stdout=out, stderr=log))
    while not all((gate / name).exists() for name in names):  # imported and ready
        assert all(worker.poll() is None for worker in workers), 'a worker ended before it started'
        await asyncio.sleep(0.05)
    (gate / 'go').touch()
    keys: list[str] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1
        journal = journals[rounds % objects]
        try:
            await record(journal, f'main/{rounds}')
            keys.append(f'main/{rounds}')
            await tick(journal, 'main', rounds)
            errors += await read_ticks(journal, names, seen)
            fresh = DiskJournal(path)  # as an app that builds a journal per request
            try:
                errors += await read_ticks(fresh, names, seen)
            finally:
                await fresh.close()
        except Exception as exc:
            errors.append(f'{type(exc).__name__}: {exc}')
            break
    reports = []
    for name, worker in zip(names, workers, strict=True):
        worker.wait(timeout=seconds + 120)
        log = (tmp_path / f'{name}.log').read_text()
        assert worker.returncode == 0, log
        assert 'malformed' not in log, log
        reports.append(json.loads((tmp_path / f'{name}.out').read_text().strip().splitlines()[-1]))
    errors += [error for report in reports for error in report['errors']]
    assert not errors, '\n'.join(errors)
    assert all(report['reads'] > 0 and report['rounds'] > 1 for report in reports), reports
    assert len(seen) == len(names) and rounds > 1

    made = sorted([*keys, *(key for report in reports for key in report['keys'])])
    listed = {info.key: info.state for info in await journals[0].list_executions()}
    assert sorted(key for key in listed if not key.startswith(TICK)) == made
    assert set(listed.values()) == {'finished'}
    for start in range(0, len(made), 20):  # twenty at a time: their writes share commits (CC-9)
        chunk = made[start : start + 20]
        replays = [_replays_without_calls(journals[n % objects], key) for n, key in enumerate(chunk)]
        for key, calls in zip(chunk, await asyncio.gather(*replays), strict=True):
            assert calls.counts == {}, (key, calls.counts)
    for journal in journals:
        await journal.close()
    assert _integrity(path) == 'ok'


# -- J-10: the diskcache the journal was tested with --------------------------------------------------

TESTED = ('5.6.3', '5.7')
"""The range pyproject.toml declares and the journal checks; both must say the same."""
INSTALL = f'pip install "diskcache>={TESTED[0]},<{TESTED[1]}"'


def test_j10_the_declared_range_of_diskcache_is_the_one_checked_and_the_installed_one_is_in_it() -> None:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / 'pyproject.toml').read_text())
    [declared] = [line for line in project['project']['dependencies'] if line.startswith('diskcache')]
    assert declared.replace(' ', '') == f'diskcache>={TESTED[0]},<{TESTED[1]}'
    assert Version(TESTED[0]) <= Version(diskcache.__version__) < Version(TESTED[1])


def _drop_a_column(path: Path) -> None:
    """A journal directory whose Cache table lacks a column the journal writes, as another diskcache might make it."""
    with diskcache.Cache(str(path), eviction_policy='none'):
        pass
    connection = sqlite3.connect(path / 'cache.db')
    connection.execute('ALTER TABLE Cache DROP COLUMN access_count')
    connection.close()


@pytest.mark.parametrize(
    ('change', 'named'),
    [
        ('a later release', '5.7.0'),
        ('an earlier release', '5.6.2'),
        ('a storage mode renumbered', 'diskcache.core.MODE_RAW = 7, not 1'),
        ('a constant gone', 'diskcache.core.ENOVAL'),
        ('a Disk hook renamed', 'diskcache.Disk.fetch'),
        ('a Cache internal gone', 'diskcache.Cache._con'),
        ('a column gone', "'access_count'"),
    ],
)
async def test_j10_a_diskcache_whose_parts_differ_is_refused_when_a_journal_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, named: str
) -> None:
    path = tmp_path / 'journal'
    if change == 'a later release':
        monkeypatch.setattr(diskcache, '__version__', '5.7.0')
    elif change == 'an earlier release':
        monkeypatch.setattr(diskcache, '__version__', '5.6.2')
    elif change == 'a storage mode renumbered':
        monkeypatch.setattr(diskcache.core, 'MODE_RAW', 7)
    elif change == 'a constant gone':
        monkeypatch.delattr(diskcache.core, 'ENOVAL')
    elif change == 'a Disk hook renamed':
        monkeypatch.delattr(diskcache.Disk, 'fetch')
    elif change == 'a Cache internal gone':
        monkeypatch.delattr(diskcache.Cache, '_con')
    else:
        _drop_a_column(path)
    journal = DiskJournal(path)
    with pytest.raises(JournalError) as refused:
        await journal.open()
    assert not isinstance(refused.value, JournalUnavailable)  # no retry installs another diskcache (E-1)
    message = str(refused.value)
    assert named in message and INSTALL in message and 'tested with' in message, message
    if change != 'a column gone':  # found before anything is created
        assert not path.exists()
    await journal.close()


def test_j10_a_journal_write_leaves_the_row_and_the_counts_diskcache_set_would(tmp_path: Path) -> None:
    """`put_text` writes in one statement what `set` writes in several: the same row, counted the same way."""
    from diskcache.core import MODE_TEXT

    journal = DiskJournal(tmp_path / 'journal')
    cache = journal._open_cache()
    columns = 'raw, expire_time, access_count, tag, size, mode, filename, value'

    def row(key: str) -> tuple[Any, ...]:
        return tuple(cache._con.execute(f'SELECT {columns} FROM Cache WHERE key = ?', (key,)).fetchone())

    before = len(cache)  # the journal's own rows
    cache.set('by-set', '{"a":1}')
    cache.put_text('by-journal', '{"a":1}')  # a new row
    assert row('by-journal') == row('by-set') and cache.get('by-journal') == '{"a":1}'
    assert len(cache) == before + 2
    cache.put_text('by-journal', '{"a":2}')  # the row there, updated
    cache.set('by-set', '{"a":2}')
    assert row('by-journal') == row('by-set') and len(cache) == before + 2
    # A row whose value lies in a side file (another diskcache wrote it): `set` replaces it and removes the file.
    name = 'ab/cd/' + '0' * 28 + '.val'  # the shape of diskcache's own names, which alone it removes
    (tmp_path / 'journal' / 'ab' / 'cd').mkdir(parents=True)
    (tmp_path / 'journal' / name).write_text('"old"')
    cache._con.execute(
        'UPDATE Cache SET filename = ?, mode = ?, value = NULL WHERE key = ?', (name, MODE_TEXT, 'by-journal')
    )
    cache.put_text('by-journal', '{"a":3}')
    assert row('by-journal') == (*row('by-set')[:-1], '{"a":3}') and not (tmp_path / 'journal' / name).exists()
    assert len(cache) == before + 2 and cache.get('by-journal') == '{"a":3}'
    cache.close()
