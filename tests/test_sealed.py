"""Sealed journals that let nothing in plain, on memory, disk and PostgreSQL (EN-1..EN-6, J-3, B-6).

A journal that was given keys once keeps a marker of it, and a journal object without keys is refused
there before it writes anything: an attempt, an import, a copy. A sealed value that does not decode, and a
step deleted from under a later one, stop the attempt instead of running a step again. Fingerprints are
sealed with the payloads, so a short secret in a prompt or an argument cannot be guessed from the store.
No message ever holds key material. One damaged execution is listed as such and skipped by `rekey`, never
the end of the listing or of the rewrite. Each test fails on the tree before these rules.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from stores import Store, disk_store, memory_store, postgres_store
from test_encryption import KEY_A, KEY_B, MARKER, Shop, _close, _keys_env, _run

from pydantic_ai_durable import (
    Durable,
    Encryption,
    EncryptionMismatch,
    JournalCorrupt,
    MemoryJournal,
    copy_execution,
    execution,
    export_execution,
    import_execution,
)
from pydantic_ai_durable._cli import main
from pydantic_ai_durable._core import rekey
from pydantic_ai_durable._fingerprint import fingerprint_run_start, tool_call_digests
from pydantic_ai_durable.journals import Journal, reseal

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

FACTORIES = [memory_store, disk_store, postgres_store]
IDS = ['memory', 'disk', 'postgres']


@pytest.fixture(params=FACTORIES, ids=IDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    made: Store = request.param(tmp_path)
    return made


def _sealed(*pairs: tuple[str, bytes]) -> Encryption:
    return Encryption(list(pairs) or [('a', KEY_A)])


async def _sealed_run(store: Store, shop: Shop, *keys: str) -> dict[str, str]:
    journal = store.make(_sealed())
    outputs = {key: await _run(journal, shop, key=key) for key in keys or ('order-1',)}
    await _close(journal)
    return outputs


async def _keys(journal: Journal) -> list[str]:
    return [info.key for info in await journal.list_executions()]


def _cli(store: Store, *args: str, keys: str | None = None) -> subprocess.CompletedProcess[str]:
    assert store.cli is not None
    env = {name: value for name, value in os.environ.items() if name != 'PYDANTIC_AI_DURABLE_KEYS'}
    if keys is not None:
        env['PYDANTIC_AI_DURABLE_KEYS'] = keys
    command = [sys.executable, '-m', 'pydantic_ai_durable', *store.cli, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True)


# -- EN-6: a journal given keys once refuses whoever comes without them ------------------------------------


async def test_en6_a_worker_without_keys_is_refused_by_a_sealed_journal_before_anything_is_written(
    store: Store,
) -> None:
    shop = Shop()
    await _sealed_run(store, shop)
    keyless = store.make(None)
    with pytest.raises(EncryptionMismatch) as caught:
        await _run(keyless, shop, key='order-2')
    await _close(keyless)
    message = str(caught.value)
    assert 'marker' in message and "'a'" in message and 'Nothing was written' in message, message
    assert (shop.model_calls, shop.tool_calls) == (2, 1)  # no model was called for order-2
    assert b'order-2' not in store.raw()
    sealed = store.make(_sealed())
    assert await _keys(sealed) == ['order-1']
    assert await _run(sealed, shop, key='order-1')  # the sealed execution is untouched: it replays
    assert (shop.model_calls, shop.tool_calls) == (2, 1)
    await _close(sealed)


async def test_en6_an_import_or_copy_into_a_sealed_journal_without_keys_is_refused_by_the_same_marker(
    store: Store,
) -> None:
    shop = Shop()
    source = MemoryJournal()
    await _run(source, shop, key='order-9')
    document = await export_execution(source, 'order-9')
    assert document['payloads'] == 'plaintext'
    await _sealed_run(store, shop)
    keyless = store.make(None)
    with pytest.raises(EncryptionMismatch, match='marker'):
        await import_execution(keyless, document)
    with pytest.raises(EncryptionMismatch, match='marker'):
        await copy_execution(source, keyless, 'order-9')
    await _close(keyless)
    assert MARKER.encode() not in store.raw() and b'order-9' not in store.raw()
    sealed = store.make(_sealed())
    report = await import_execution(sealed, document)  # with the keys it is sealed like the journal's own
    assert report.key == 'order-9' and await _keys(sealed) == ['order-1', 'order-9']
    await _close(sealed)
    assert MARKER.encode() not in store.raw()


async def test_en6_rekey_to_plain_clears_the_marker_and_only_then_a_worker_without_keys_records(
    store: Store,
) -> None:
    shop = Shop()
    outputs = await _sealed_run(store, shop)
    if store.cli is None:
        decrypting = store.make(_sealed())
        reseal(decrypting, _sealed(), 'decrypt')
        report = await rekey(decrypting, decrypt=True)
        assert report.rewritten == ['order-1'] and report.marker_cleared and not report.skipped
    else:
        done = _cli(store, 'rekey', '--decrypt', keys=_keys_env(('a', KEY_A)))
        assert done.returncode == 0, done.stdout + done.stderr
        assert 'stored in plain text' in done.stdout and 'marker' in done.stdout, done.stdout
    keyless = store.make(None)
    assert await _run(keyless, shop, key='order-1') == outputs['order-1']  # plain now: it replays without keys
    await _run(keyless, shop, key='order-2')
    await _close(keyless)
    assert (shop.model_calls, shop.tool_calls) == (4, 2)
    assert MARKER.encode() in store.raw()


# -- EN-3 and J-3: in a sealed journal nothing that fails to decode runs live; a deleted step is noticed ---------


def _stored_text(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(',', ':'), ensure_ascii=True)


async def _raw_entries(store: Store, key: str = 'order-1') -> dict[int, Any]:
    view = store.make(None)
    reseal(view, None, 'show')
    try:
        return (await view.read_run(key, '0')).entries
    finally:
        await _close(view)


async def test_en3_a_sealed_entry_whose_json_does_not_decode_is_journal_corrupt_and_nothing_runs(
    store: Store,
) -> None:
    shop = Shop()
    await _sealed_run(store, shop)
    entries = await _raw_entries(store)
    tool = next(position for position, entry in entries.items() if entry['kind'] == 'tool')
    text = _stored_text(entries[tool])
    store.put_raw(('entry', 'order-1', '0', tool), text[:-1] + ' ')  # one character changed: no longer JSON
    sealed = store.make(_sealed())
    with pytest.raises(JournalCorrupt) as caught:
        await _run(sealed, shop)
    await _close(sealed)
    assert caught.value.where == f'run 0, step {tool}' and 'does not decode' in str(caught.value)
    assert (shop.model_calls, shop.tool_calls) == (2, 1)  # neither the tool nor the model ran again


@pytest.mark.parametrize('keys', [False, True], ids=['plain', 'sealed'])
async def test_en3_a_missing_position_between_stored_entries_is_journal_corrupt(store: Store, keys: bool) -> None:
    shop = Shop()
    journal = store.make(_sealed() if keys else None)
    await _run(journal, shop)
    await _close(journal)
    entries = await _raw_entries(store)
    tool = next(position for position, entry in entries.items() if entry['kind'] == 'tool')
    assert max(entries) > tool  # a later step was recorded after it
    store.delete_raw(('entry', 'order-1', '0', tool))
    again = store.make(_sealed() if keys else None)
    with pytest.raises(JournalCorrupt) as caught:
        await _run(again, shop)
    await _close(again)
    assert caught.value.where == f'run 0, step {tool}' and 'missing' in str(caught.value)
    assert (shop.model_calls, shop.tool_calls) == (2, 1)


# -- EN-1: a fingerprint of a short secret is no dictionary lookup away --------------------------------------

PIN = '4821'


def _pin_agent(journal: Journal) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart('check_pin', {'pin': PIN}, tool_call_id='c1')])
        return ModelResponse(parts=[TextPart('checked')])

    def check_pin(pin: str) -> str:
        return 'ok' if pin == PIN else 'no'

    return Agent(
        FunctionModel(model, model_name='bank'), name='bank', tools=[check_pin], capabilities=[Durable(journal=journal)]
    )


def _guess_pin(raw: bytes) -> set[str]:
    """Every PIN whose run-start or tool-call fingerprint lies in the raw store: at most 2 x 10^4 hashes."""
    found: set[str] = set()
    for number in range(10_000):
        guess = f'{number:04d}'
        start = fingerprint_run_start(f'My PIN is {guess}.', [])
        call = tool_call_digests('check_pin', {'pin': guess}, 'c1')[0]
        if start.encode() in raw or (call is not None and call.encode() in raw):
            found.add(guess)
    return found


@pytest.mark.parametrize('factory', FACTORIES, ids=IDS)
async def test_en1_a_fingerprint_of_a_short_secret_cannot_be_tested_without_the_keys(
    factory: Callable[[Path], Store], tmp_path: Path
) -> None:
    found: dict[str, set[str]] = {}
    for name, keys in (('plain', None), ('sealed', _sealed())):
        store = factory(tmp_path / name)
        journal = store.make(keys)
        async with execution('bank-1', journal=journal):
            assert (await _pin_agent(journal).run(f'My PIN is {PIN}.')).output == 'checked'
        await _close(journal)
        raw = store.raw()
        assert PIN.encode() not in raw or name == 'plain'  # the scan does not find it written out
        found[name] = _guess_pin(raw)
    assert found['plain'] == {PIN}  # the lookup works: from a plain journal's fingerprints it recovers the PIN
    assert found['sealed'] == set()


async def test_en1_sealed_fingerprints_still_replay_diverge_and_match_by_arguments(store: Store) -> None:
    shop = Shop()
    outputs = await _sealed_run(store, shop)
    journal = store.make(_sealed())
    assert await _run(journal, shop) == outputs['order-1']  # every fingerprint matched once opened: all replayed
    assert (shop.model_calls, shop.tool_calls) == (2, 1)
    async with execution('order-1', journal=journal) as handle:  # another prompt: the first request differs
        await shop.agent(journal).run('Find it again')
    await _close(journal)
    assert [divergence.position for divergence in handle.stats.divergences] == [0]
    assert handle.stats.replayed_by_arguments['tool'] == 1  # the same call and arguments: its recorded result
    assert (shop.model_calls, shop.tool_calls) == (4, 1)


# -- EN-2: key material is never in an error, a log line or the CLI's output ---------------------------------

KEY_32 = base64.b64encode(bytes(range(100, 132))).decode()  # 44 characters, ends with '='
KEY_24 = base64.b64encode(bytes(range(200, 224))).decode()  # 32 characters, no padding: looks like an id
KEY_20 = base64.b64encode(bytes(range(1, 21))).decode()
NOT_BASE64 = 'hunter2-correct-horse-battery'
MATERIAL = (KEY_32, KEY_24, KEY_20, NOT_BASE64)

ENV_MISTAKES = [
    pytest.param(KEY_32, id='a key without its id'),
    pytest.param(KEY_24, id='a key of 24 bytes without its id'),
    pytest.param(f'{KEY_32}:a', id='key and id swapped'),
    pytest.param(f'{KEY_24}:a', id='key of 24 bytes and id swapped'),
    pytest.param(f'a:{NOT_BASE64}', id='not base64'),
    pytest.param(f'a:{KEY_20}', id='a key of 20 bytes'),
    pytest.param(f'a:{KEY_32},a:{KEY_24}', id='an id twice'),
    pytest.param(f'a:{KEY_32},,{KEY_24}', id='an empty item, then a key without id'),
    pytest.param(f'a:{KEY_32} {KEY_24}', id='two keys without a comma'),
]


def _no_material(text: str) -> None:
    for material in MATERIAL:
        for start in range(len(material) - 7):
            assert material[start : start + 8] not in text, f'key material in: {text}'


@pytest.mark.parametrize('value', ENV_MISTAKES)
def test_en2_a_mistyped_key_in_the_environment_is_never_echoed(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv('PYDANTIC_AI_DURABLE_KEYS', value)
    with pytest.raises(ValueError) as caught:
        Encryption.from_env()
    _no_material(str(caught.value))
    assert 'PYDANTIC_AI_DURABLE_KEYS' in str(caught.value)
    for command in (['list'], ['rekey'], ['show', 'x'], ['export', 'x']):
        with pytest.raises(SystemExit) as exited:
            main(['--journal', str(Path.cwd() / 'no-journal-here'), *command])
        assert exited.value.code == 2
        out, err = capsys.readouterr()
        assert 'PYDANTIC_AI_DURABLE_KEYS' in err
        _no_material(out + err)
    _no_material(caplog.text)


CODE_MISTAKES: list[Any] = [
    pytest.param({KEY_32: KEY_A}, id='a key as the id'),
    pytest.param({KEY_24: base64.b64decode(KEY_20)}, id='a key as the id, and a key of 20 bytes'),
    pytest.param({'a': KEY_32}, id='the key as text, not bytes'),
    pytest.param({'a': NOT_BASE64.encode()}, id='a passphrase'),
    pytest.param([(base64.b64decode(KEY_32), 'a')], id='key and id swapped'),
    pytest.param([('a', base64.b64decode(KEY_32)), ('a', base64.b64decode(KEY_24))], id='an id twice'),
]


@pytest.mark.parametrize('keys', CODE_MISTAKES)
def test_en2_a_mistaken_key_in_code_is_never_echoed(keys: Any) -> None:
    with pytest.raises((ValueError, TypeError)) as caught:
        Encryption(keys)
    _no_material(str(caught.value))
    _no_material(repr(caught.value))
    for material in (base64.b64decode(KEY_32), base64.b64decode(KEY_24), NOT_BASE64.encode()):
        assert repr(material)[2:14] not in str(caught.value)


# -- EN-5: the CLI calls a sealed step sealed --------------------------------------------------------------


async def test_en5_show_without_keys_calls_a_sealed_step_sealed_with_its_key_id(store: Store) -> None:
    if store.cli is None:
        pytest.skip('the CLI opens journals other processes can reach')
    await _sealed_run(store, Shop())
    shown = _cli(store, 'show', 'order-1')
    assert shown.returncode == 0, shown.stderr
    assert 'unreadable' not in shown.stdout and 'runs live' not in shown.stdout, shown.stdout
    steps = [line for line in shown.stdout.splitlines() if re.match(r'\s+\d+\s', line)]
    assert steps and all('sealed (key id a)' in line for line in steps), shown.stdout
    assert MARKER not in shown.stdout
    as_json = json.loads(_cli(store, 'show', 'order-1', '--json').stdout)
    step = as_json['runs'][0]['steps'][0]
    assert step['sealed'] == 'a' and step['fingerprint'] is None and step['readable'] is None
    opened = json.loads(_cli(store, 'show', 'order-1', '--json', keys=_keys_env(('a', KEY_A))).stdout)
    step = opened['runs'][0]['steps'][0]  # with the keys: the fingerprint, and a step a retry replays
    assert re.fullmatch(r'[0-9a-f]{64}', step['fingerprint']) and step['readable'] is True and step['sealed'] is None


async def test_en5_show_without_keys_calls_a_runs_sealed_spend_sealed_and_warns_of_nothing(store: Store) -> None:
    if store.cli is None:
        pytest.skip('the CLI opens journals other processes can reach')
    await _sealed_run(store, Shop())
    shown = _cli(store, 'show', 'order-1')
    assert shown.returncode == 0 and shown.stderr == '', shown.stderr  # no "unknown shape" warning
    assert '  live spend (all attempts): sealed (key id a)' in shown.stdout.splitlines(), shown.stdout
    opened = _cli(store, 'show', 'order-1', keys=_keys_env(('a', KEY_A)))
    assert opened.stderr == '' and re.search(r'live spend \(all attempts\): \d+ requests?,', opened.stdout), opened


# -- B-6 and EN-2: one damaged execution is reported, the others listed and rewritten -------------------------


def _flip_sealed(value: dict[str, Any]) -> dict[str, Any]:
    sealed = dict(value['sealed'])
    blob = bytearray(base64.b64decode(sealed['c']))
    blob[-1] ^= 0x01
    return {**value, 'sealed': {**sealed, 'c': base64.b64encode(bytes(blob)).decode()}}


async def test_b6_one_corrupt_execution_is_listed_as_such_and_rekey_rewrites_every_other_then_fails(
    store: Store,
) -> None:
    shop = Shop()
    keys = [f'order-{n}' for n in range(4)]
    outputs = await _sealed_run(store, shop, *keys)
    view = store.make(None)
    reseal(view, None, 'show')
    record = await view.read_execution('order-1')
    entry = (await view.read_run('order-2', '0')).entries[0]
    await _close(view)
    assert record is not None
    store.put_raw(('execution', 'order-1'), _stored_text(_flip_sealed(record)))  # the record fails authentication
    store.put_raw(('entry', 'order-2', '0', 0), _stored_text(_flip_sealed(entry)))  # one of its entries does

    rotated = Encryption([('b', KEY_B), ('a', KEY_A)])
    listing = store.make(rotated)
    infos = {info.key: info for info in await listing.list_executions()}
    assert [(key, info.state) for key, info in infos.items()] == [
        ('order-0', 'finished'),
        ('order-1', 'corrupt'),
        ('order-2', 'finished'),
        ('order-3', 'finished'),
    ]
    problem = infos['order-1'].problem
    assert problem is not None and 'failed authentication' in problem
    assert [info.key for info in await listing.list_executions(state='corrupt')] == ['order-1']
    assert [info.key for info in await listing.list_executions(state='finished')] == ['order-0', 'order-2', 'order-3']
    page = await listing.page_executions()  # the console's paged listing: the same states, never raised (B-6)
    assert {info.key: info.state for info in page.executions} == {key: info.state for key, info in infos.items()}
    paged = next(info for info in page.executions if info.key == 'order-1')
    assert paged.problem is not None and 'failed authentication' in paged.problem
    await _close(listing)

    if store.cli is None:
        reseal(listing, rotated, 'migrate')
        report = await rekey(listing)
        assert report.rewritten == ['order-0', 'order-3'] and sorted(report.skipped) == ['order-1', 'order-2']
    else:
        listed = _cli(store, 'list', keys=_keys_env(('b', KEY_B), ('a', KEY_A)))
        assert listed.returncode == 0 and 'corrupt' in listed.stdout and 'failed authentication' in listed.stdout
        done = _cli(store, 'rekey', keys=_keys_env(('b', KEY_B), ('a', KEY_A)))
        assert done.returncode == 1, done.stdout + done.stderr
        assert '2 executions (' in done.stdout and 'skipped' in done.stdout
        assert 'order-1' in done.stdout and 'order-2' in done.stdout
    only_b = store.make(Encryption({'b': KEY_B}))
    for key in ('order-0', 'order-3'):  # rewritten under b though two executions before them failed
        assert await _run(only_b, shop, key=key) == outputs[key]
    await _close(only_b)
    assert (shop.model_calls, shop.tool_calls) == (8, 4)


# -- EN-2: rekey says how to reclaim the plain text PostgreSQL keeps in its old row versions ----------------------


def _table_files(dsn: str, schema: str) -> bytes:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('CHECKPOINT')
        rows = conn.execute(
            'SELECT pg_read_binary_file(pg_relation_filepath(c.oid)) FROM pg_class c '
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r' "
            'UNION ALL SELECT pg_read_binary_file(pg_relation_filepath(c.reltoastrelid)) FROM pg_class c '
            'JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.reltoastrelid <> 0',
            (schema, schema),
        ).fetchall()
    return b''.join(bytes(row[0]) for row in rows)


async def test_en2_rekey_of_a_plain_postgres_journal_prints_the_vacuum_full_that_removes_the_old_plain_text(
    tmp_path: Path,
) -> None:
    store = postgres_store(tmp_path)
    assert store.cli is not None
    dsn, schema = store.cli[1], store.cli[3]
    journal = store.make(None)
    await _run(journal, Shop())
    await _close(journal)
    done = _cli(store, 'rekey', keys=_keys_env(('a', KEY_A)))
    assert done.returncode == 0, done.stderr
    command = next(line.strip() for line in done.stdout.splitlines() if 'VACUUM FULL' in line)
    assert MARKER.encode() not in store.raw()  # no live row holds it
    assert MARKER.encode() in _table_files(dsn, schema)  # the old row versions still do
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(command.encode())
    assert MARKER.encode() not in _table_files(dsn, schema)
