"""Imports and exports under faults and hostile input (XP-1, XP-2, XP-4).

An import is killed with SIGKILL at ten points in a real subprocess, on disk and PostgreSQL: what it
leaves is either nothing, or the whole execution, or a record an attempt refuses (`JournalCorrupt`,
naming the import), never a fragment that replays part of a run and runs the rest live. An import held
longer than its lease keeps it; the CLI stores imported values as the target journal stores its own;
JSON with a duplicated field or a number JSON cannot hold is refused naming the field; a FIFO is not read;
an import's peak memory is a small multiple of its file; and an export never replaces a symbolic link.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from stores import Store, disk_store, memory_store, postgres_store
from test_transfer import MARKER, SIX_STEPS, Shop, _close, _exported, _Paused, _record

from pydantic_ai_durable import (
    Encryption,
    ExecutionBusy,
    ExportInvalid,
    ImportRefused,
    JournalCorrupt,
    MemoryJournal,
    execution,
    export_execution,
    import_execution,
)
from pydantic_ai_durable.journals import Journal, delete_under_lease
from pydantic_ai_durable.testing import SimulatedCrash

pytestmark = [
    pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL, FIFOs and symbolic links are POSIX'),
    pytest.mark.once,  # the package's own machinery: CI's second job skips it
]

STORES = {'memory': memory_store, 'disk': disk_store, 'postgres': postgres_store}
KEYS_VARIABLE = 'PYDANTIC_AI_DURABLE_KEYS'
KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))


def _keys_text(*pairs: tuple[str, bytes]) -> str:
    return ','.join(f'{key_id}:{base64.b64encode(key).decode()}' for key_id, key in pairs)


def _cli(*args: str, keys: str | None = None, stdin: str | None = None, timeout: float = 120) -> Any:
    env = {k: v for k, v in os.environ.items() if k != KEYS_VARIABLE}
    if keys is not None:
        env[KEYS_VARIABLE] = keys
    return subprocess.run(
        [sys.executable, '-m', 'pydantic_ai_durable', *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
        env={**env, 'PYTHONIOENCODING': 'utf-8'},
        check=False,
    )


def _one_line(result: Any, code: int = 1) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert 'Traceback' not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    return str(result.stderr)


async def _attempt(journal: Journal, shop: Shop, key: str = 'order-42') -> str:
    async with execution(key, journal=journal):
        return (await shop.agent(journal).run(f'order for {MARKER}')).output


# -- XP-2: an import killed part way leaves nothing an attempt replays --------------------------------------

KILLED = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from pydantic_ai_durable import DiskJournal, PostgresJournal, import_execution
    from pydantic_ai_durable._core import _import

    _import._IMPORT_TTL = 1.0  # on PostgreSQL a killed holder's lease is waited out (CC-4): keep it short

    where, document, point = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    journal = DiskJournal(where['path']) if 'path' in where else PostgresJournal(where['dsn'], schema=where['schema'])

    class Dying:
        # Every write that changes the store is counted; the process kills itself right after the one named.
        def __init__(self, inner):
            self.inner, self.writes = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        async def _counted(self, write):
            done = await write
            self.writes += 1
            if self.writes == point:
                os.kill(os.getpid(), signal.SIGKILL)
            return done

        def write_entry(self, *args, **kwargs):
            return self._counted(self.inner.write_entry(*args, **kwargs))

        def write_record(self, *args, **kwargs):
            return self._counted(self.inner.write_record(*args, **kwargs))

        def write_execution(self, *args, **kwargs):
            return self._counted(self.inner.write_execution(*args, **kwargs))

        def delete_execution(self, *args, **kwargs):
            return self._counted(self.inner.delete_execution(*args, **kwargs))

    asyncio.run(import_execution(Dying(journal), open(document).read()))
    print('finished')
    """
)
POINTS = range(1, 11)
"""After the n-th write of the import: the deletion of the key, the record marked as an import, six entries, two
run records, and the record that publishes the execution."""
EXPECTED = {1: 'fresh', **dict.fromkeys(range(2, 10), 'refused'), 10: 'replayed'}
"""Nothing stored yet, then what an attempt refuses, then the whole execution: never a part of it replayed."""


def _settled(store: Store) -> list[Any]:
    """The listing once the killed importer's lease lapsed (at once on disk, whose lock proves it dead)."""

    async def listed() -> list[Any]:
        journal = store.make(None)
        for _ in range(150):
            infos = await journal.list_executions()
            if all(info.state != 'running' for info in infos):
                break
            await asyncio.sleep(0.1)
        await _close(journal)
        return infos

    return asyncio.run(listed())


def _outcome(journal: Journal, shop: Shop) -> str:
    """What an attempt makes of what the killed import left: a whole replay, a refusal, or a fresh run."""

    async def go() -> str:
        try:
            await _attempt(journal, shop)
        except JournalCorrupt as refused:
            assert 'import' in str(refused) and refused.where == 'the import', refused
            assert shop.live_calls() == 0, 'a refused execution ran something'
            return 'refused'
        if shop.live_calls() == 0:
            return 'replayed'
        assert shop.live_calls() == SIX_STEPS, f'{shop.live_calls()} live calls: a fragment was replayed'
        return 'fresh'

    return asyncio.run(go())


def _where(store: Store) -> dict[str, str]:
    """How the child opens the store: a directory, or a DSN and a schema (from the store's CLI options)."""
    assert store.cli is not None
    options = dict(zip(store.cli[::2], store.cli[1::2], strict=True))
    if store.name == 'disk':
        return {'path': options['--journal']}
    return {'dsn': options['--journal'], 'schema': options['--schema']}


@pytest.mark.once
@pytest.mark.parametrize('name', ['disk', 'postgres'])
def test_xp2_an_import_killed_at_ten_points_leaves_nothing_an_attempt_replays(tmp_path: Path, name: str) -> None:
    document = tmp_path / 'order-42.json'
    document.write_text(json.dumps(asyncio.run(_exported())))
    outcomes: dict[int, str] = {}
    for point in POINTS:
        (tmp_path / str(point)).mkdir()
        store = STORES[name](tmp_path / str(point))
        child = subprocess.run(
            [sys.executable, '-c', KILLED, json.dumps(_where(store)), str(document), str(point)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert child.returncode in (-signal.SIGKILL, 0), child.stderr
        listed = _settled(store)
        assert all(info.state != 'interrupted' for info in listed), (point, listed)  # no sweep dispatches it
        journal = store.make(None)
        outcomes[point] = _outcome(journal, Shop())
        asyncio.run(_close(journal))
        if outcomes[point] == 'refused':  # importing again replaces what was left: it is no execution
            journal = store.make(None)
            assert asyncio.run(import_execution(journal, document.read_text())).replaced is False
            assert _outcome(journal, Shop()) == 'replayed', point
            asyncio.run(_close(journal))
    assert outcomes == EXPECTED, outcomes


class _Stopped(MemoryJournal):
    """A memory journal whose importer stops answering after its n-th write: nothing it calls later happens."""

    def __init__(self, point: int) -> None:
        super().__init__()
        self.point = point
        self.writes = 0
        self.dead = False

    async def _counted(self, write: Any) -> Any:
        if self.dead:
            write.close()
            raise SimulatedCrash('the importer is gone')
        done = await write
        self.writes += 1
        if self.writes == self.point:
            self.dead = True
            raise SimulatedCrash('the importer is gone')
        return done

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        return bool(await self._counted(super().write_entry(key, run, position, entry, epoch=epoch)))

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        return bool(await self._counted(super().write_record(key, run, name, value, epoch=epoch)))

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        return bool(await self._counted(super().write_execution(key, value, epoch=epoch)))

    async def delete_execution(self, key: str, *, epoch: int) -> None:
        await self._counted(super().delete_execution(key, epoch=epoch))


async def test_xp2_a_memory_import_stopped_at_ten_points_leaves_nothing_an_attempt_replays() -> None:
    document = await _exported()
    outcomes: dict[int, str] = {}
    for point in POINTS:
        journal = _Stopped(point)
        with pytest.raises(SimulatedCrash):
            await import_execution(journal, document)
        journal.dead = False
        journal.point = 0
        shop = Shop()
        try:
            await _attempt(journal, shop)
            outcomes[point] = 'replayed' if shop.live_calls() == 0 else 'fresh'
            assert shop.live_calls() in (0, SIX_STEPS), (point, shop.live_calls())
        except JournalCorrupt as refused:
            assert 'import' in str(refused) and shop.live_calls() == 0
            outcomes[point] = 'refused'
            with pytest.raises(JournalCorrupt, match='import'):
                await export_execution(journal, 'order-42')  # nor exported, nor forked
            assert (await import_execution(journal, document)).replaced is False  # a leftover is no execution
            assert shop.live_calls() == 0 and await _attempt(journal, shop) and shop.live_calls() == 0
    assert outcomes == EXPECTED, outcomes


# -- XP-2: an import holds its lease as an attempt does ---------------------------------------------------


@pytest.mark.once
@pytest.mark.parametrize('name', list(STORES))
async def test_xp2_an_import_held_past_its_lease_keeps_it_and_leaves_nothing_when_it_fails(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic_ai_durable._core import _import

    monkeypatch.setattr(_import, '_IMPORT_TTL', 2.0)
    document = await _exported()
    store = STORES[name](tmp_path)
    journal = store.make(None)
    for refuse in (False, True):
        held = _Paused(journal, pause_at=3, refuse_at=3 if refuse else None)
        importing = asyncio.create_task(import_execution(held, document))  # type: ignore[arg-type]
        await held.reached.wait()
        await asyncio.sleep(3.0)  # one and a half leases: an import that did not renew has lost it
        shop = Shop()
        with pytest.raises(ExecutionBusy):
            await _attempt(journal, shop)
        assert shop.live_calls() == 0
        held.go_on.set()
        if refuse:
            with pytest.raises(ImportRefused, match='refused a value'):
                await importing
            assert await journal.read_execution('order-42') is None
            assert (await journal.read_run('order-42', '0')).entries == {}
            assert await journal.list_executions() == []
        else:
            assert (await importing).steps == SIX_STEPS
            assert await _attempt(journal, shop) and shop.live_calls() == 0
            await delete_under_lease(journal, 'order-42', force=False)
    await _close(journal)


# -- XP-2: imported values are stored as the target journal stores its own --------------------------------


@pytest.mark.parametrize('name', ['disk', 'postgres'])
def test_xp2_the_cli_stores_imported_values_as_the_target_journal_stores_its_own(tmp_path: Path, name: str) -> None:
    file_keys = Encryption({'file-key': KEY_A})
    journal_keys = Encryption({'journal-key': KEY_B})

    async def files() -> tuple[Path, Path]:
        source = MemoryJournal(encryption=file_keys)
        await _record(source, Shop())
        sealed, plain = tmp_path / 'sealed.json', tmp_path / 'plain.json'
        sealed.write_text(json.dumps(await export_execution(source, 'order-42')))
        plain.write_text(json.dumps(await export_execution(source, 'order-42', plaintext=True)))
        return sealed, plain

    sealed_file, plain_file = asyncio.run(files())
    for place in ('plain', 'sealed'):
        (tmp_path / place).mkdir()
    plain_store, sealed_store = STORES[name](tmp_path / 'plain'), STORES[name](tmp_path / 'sealed')
    assert plain_store.cli is not None and sealed_store.cli is not None

    async def prepare(store: Store, keys: Encryption | None) -> None:
        journal = store.make(keys)
        await _record(journal, Shop(), key='already-here')
        await _close(journal)

    asyncio.run(prepare(plain_store, None))
    asyncio.run(prepare(sealed_store, journal_keys))

    # A plain journal: a ciphertext file is opened with the keys given and stored in plain text.
    done = _cli(*plain_store.cli, 'import', str(sealed_file), keys=_keys_text(('file-key', KEY_A)))
    assert done.returncode == 0, done.stderr
    shop = Shop()
    journal = plain_store.make(None)  # the app of a plain journal, without keys
    assert asyncio.run(_attempt(journal, shop)) and shop.live_calls() == 0
    asyncio.run(_close(journal))
    line = _one_line(_cli(*plain_store.cli, 'import', str(sealed_file), '--as', 'no-keys'))
    assert 'file-key' in line and KEYS_VARIABLE in line, line
    line = _one_line(_cli('--journal', str(tmp_path / 'new'), 'import', str(sealed_file)))
    assert 'file-key' in line and not (tmp_path / 'new').exists(), line  # a refused import creates no journal

    # A sealed journal: refused without its keys, naming them; stored sealed under its current key with them.
    def listed() -> list[str]:
        async def keys() -> list[str]:
            journal = sealed_store.make(journal_keys)
            found = [info.key for info in await journal.list_executions()]
            await _close(journal)
            return found

        return asyncio.run(keys())

    before = listed()
    line = _one_line(_cli(*sealed_store.cli, 'import', str(plain_file)))
    assert 'journal-key' in line and KEYS_VARIABLE in line and 'Nothing was written' in line, line
    line = _one_line(_cli(*sealed_store.cli, 'import', str(sealed_file)))
    assert 'journal-key' in line and 'file-key' in line and KEYS_VARIABLE in line, line
    wrong = _keys_text(('journal-key', KEY_A), ('file-key', KEY_A))
    line = _one_line(_cli(*sealed_store.cli, 'import', str(plain_file), keys=wrong))
    assert 'journal-key' in line and 'do not open' in line, line
    assert listed() == before == ['already-here']
    both = _keys_text(('journal-key', KEY_B), ('file-key', KEY_A))
    assert _cli(*sealed_store.cli, 'import', str(sealed_file), keys=both).returncode == 0
    assert _cli(*sealed_store.cli, 'import', str(plain_file), '--as', 'from-plain', keys=both).returncode == 0
    assert MARKER.encode() not in sealed_store.raw()

    async def replay() -> None:
        journal = sealed_store.make(journal_keys)  # the sealed journal's app: its own key only
        for key in ('order-42', 'from-plain'):
            assert (await export_execution(journal, key))['key_ids'] == ['journal-key']
            await _attempt(journal, shop, key)
        await _close(journal)

    asyncio.run(replay())
    assert shop.live_calls() == 0


# -- XP-4: one meaning per document ---------------------------------------------------------------------


def _doubtful(document: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Texts that JSON readers disagree on or that hold numbers JSON has not, with the field each must name."""
    edited = json.loads(json.dumps(document))
    edited['runs'][0]['entries'][1]['entry']['payload'] = {'walrus_count': 7, 'note': 'n'}
    text = json.dumps(edited)
    assert text.count('"walrus_count": 7') == 1 and text.count('"key": "order-42"') >= 1

    def nan_in(field: str, value: float) -> str:
        changed = json.loads(text)
        if field == 'exported':
            changed['exported'] = value
        else:
            changed['execution']['metadata'] = {field: value}
        return json.dumps(changed)

    return {
        'a duplicated top-level key': (text.replace('"key": "order-42"', '"key": "order-42", "key": "evil"', 1), 'key'),
        'a duplicated key in a payload': (
            text.replace('"walrus_count": 7', '"walrus_count": 7, "walrus_count": 9000'),
            'walrus_count',
        ),
        'a duplicated run name': (text.replace('"run": "0"', '"run": "0", "run": "0"'), 'run'),
        'NaN in a payload': (text.replace('"walrus_count": 7', '"walrus_count": NaN'), 'walrus_count'),
        'Infinity in the metadata': (nan_in('budget', float('inf')), 'budget'),
        '-Infinity as the export time': (nan_in('exported', float('-inf')), 'exported'),
        'a number too large for a float': (text.replace('"walrus_count": 7', '"walrus_count": 1e999'), 'walrus_count'),
    }


@pytest.mark.parametrize('name', list(STORES))
async def test_xp4_a_duplicated_field_or_a_number_json_has_not_is_refused_naming_the_field(
    tmp_path: Path, name: str
) -> None:
    document = await _exported()
    store = STORES[name](tmp_path)
    journal = store.make(None)
    await _record(journal, Shop(), key='already-here')
    before = store.raw()
    for case, (text, field) in _doubtful(document).items():
        with pytest.raises(ExportInvalid) as refused:
            await import_execution(journal, text)
        assert f'"{field}"' in str(refused.value) or f'.{field}' in str(refused.value), (case, str(refused.value))
    python = json.loads(json.dumps(document))
    python['runs'][0]['entries'][1]['entry']['payload'] = {'amount': float('nan')}
    with pytest.raises(ExportInvalid, match='amount'):
        await import_execution(journal, python)  # a Python document is held to the same: NaN is no JSON
    assert store.raw() == before
    await _close(journal)


# -- XP-4: only a regular file or standard input ------------------------------------------------------------


def test_xp4_the_cli_imports_only_a_regular_file_or_standard_input(tmp_path: Path) -> None:
    fifo = tmp_path / 'pipe.json'
    os.mkfifo(fifo)
    journal = ['--journal', str(tmp_path / 'journal')]
    for source in (str(fifo), str(tmp_path), '/dev/zero'):
        line = _one_line(_cli(*journal, 'import', source, timeout=60))
        assert 'not a regular file' in line and 'Nothing was written' in line, line
    text = json.dumps(asyncio.run(_exported()))
    assert _cli(*journal, 'import', '-', stdin=text).returncode == 0


# -- XP-4: memory bounded by the file ----------------------------------------------------------------------

MEASURED = textwrap.dedent(
    """
    import sys
    from pydantic_ai_durable._cli import main

    def peak():  # this process's peak resident memory (ru_maxrss would carry the forking parent's over exec)
        line = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))
        return int(line.split()[1]) * 1024

    baseline = peak()
    code = main(['--journal', sys.argv[1], 'import', sys.argv[2]])
    print(code, baseline, peak())
    """
)


@pytest.mark.once
def test_xp4_an_imports_peak_memory_is_a_small_multiple_of_its_file(tmp_path: Path) -> None:
    document = asyncio.run(_exported())
    count, elements = 7, 3 * 1024 * 1024  # seven payloads of 6 MiB of JSON: [1,1,1,...]
    for slot in range(count):
        document['runs'][0]['entries'].append(
            {'position': 100 + slot, 'entry': {'v': 1, 'name': 'big', 'kind': 'tool', 'payload': [1] * elements}}
        )
    path = tmp_path / 'big.json'
    path.write_text(json.dumps(document, separators=(',', ':')))
    del document
    size, largest = path.stat().st_size, 2 * elements
    done = subprocess.run(
        [sys.executable, '-c', MEASURED, str(tmp_path / 'journal'), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    code, baseline, peak = (int(part) for part in done.stdout.split()[-3:])
    assert code == 0, done.stdout
    grown = peak - baseline
    print(f'file {size / 2**20:.1f} MiB, largest value {largest / 2**20:.1f} MiB, peak grew {grown / 2**20:.1f} MiB')
    assert grown <= 3 * size + 8 * largest, (grown, size, largest)


# -- XP-1: an export never replaces a link or a file that is not a regular one ---------------------------


def test_xp1_export_writes_through_a_link_and_to_standard_output_never_replacing_them(tmp_path: Path) -> None:
    store = disk_store(tmp_path)
    assert store.cli is not None
    journal = store.make(None)
    asyncio.run(_record(journal, Shop()))
    asyncio.run(_close(journal))
    real, link = tmp_path / 'real.json', tmp_path / 'link.json'
    real.write_text('old')
    link.symlink_to(real)
    assert _cli(*store.cli, 'export', 'order-42', '-o', str(link)).returncode == 0
    assert link.is_symlink() and json.loads(real.read_text())['key'] == 'order-42'

    stdout = tmp_path / 'stdout'
    stdout.symlink_to('/proc/self/fd/1')  # what /dev/stdout is
    done = _cli(*store.cli, 'export', 'order-42', '-o', str(stdout))
    assert done.returncode == 0, done.stderr
    assert stdout.is_symlink() and json.loads(done.stdout)['key'] == 'order-42'
    done = _cli(*store.cli, 'export', 'order-42', '-o', '-')
    assert json.loads(done.stdout)['key'] == 'order-42'

    refused = _cli(*store.cli, 'export', 'order-42', '-o', str(tmp_path))
    assert refused.returncode == 2 and 'not a regular file' in refused.stderr and tmp_path.is_dir(), refused.stderr
    fifo = tmp_path / 'fifo'
    os.mkfifo(fifo)
    exporting = subprocess.Popen(
        [sys.executable, '-m', 'pydantic_ai_durable', *store.cli, 'export', 'order-42', '-o', str(fifo)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    with open(fifo) as reader:
        assert json.loads(reader.read())['key'] == 'order-42'
    assert exporting.wait(timeout=120) == 0
    assert fifo.is_fifo()


def test_xp1_an_export_never_replaces_a_file_of_a_disk_journal(tmp_path: Path) -> None:
    store = disk_store(tmp_path)
    assert store.cli is not None
    journal = store.make(None)
    asyncio.run(_record(journal, Shop()))
    asyncio.run(_close(journal))
    database = next(tmp_path.rglob('cache.db'))
    before = database.stat().st_ino
    for target in (database, database.with_name('cache.db-wal')):
        refused = _cli(*store.cli, 'export', 'order-42', '-o', str(target))
        assert refused.returncode == 2 and 'journal' in refused.stderr, refused.stderr
    assert database.stat().st_ino == before  # the same file, not one renamed over it
    listed = _cli(*store.cli, 'list', '--json')
    assert listed.returncode == 0 and [row['key'] for row in json.loads(listed.stdout)] == ['order-42']
