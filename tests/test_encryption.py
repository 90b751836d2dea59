"""Journals encrypted at rest (EN-1..EN-6), on memory, disk and PostgreSQL.

A real agent runs with a marker string in its prompt, its model's responses, its tool's arguments and
result and its execution's metadata, and with a registered secret that the model repeats. With keys, none
of it is anywhere in the raw store, scanned byte by byte: the disk journal's files, every row of the
PostgreSQL schema, the memory journal's stored texts. The same run without keys shows the marker, so the
scan can fail. Tampered, swapped, wrongly keyed and mixed journals each raise their own error, and no
stored step changes.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import Operator, tool_returns
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from stores import Store, disk_store, memory_store, postgres_store

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    Encryption,
    EncryptionMismatch,
    JournalCorrupt,
    MemoryJournal,
    SecretRegistry,
    execution,
)
from pydantic_ai_durable._core import rekey
from pydantic_ai_durable.journals import Journal, reseal

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

MARKER = 'zebra-marker-9f3c'
SECRET = 'sk-live-7d1e2a44'
KEY_A = bytes(range(32))
KEY_B = bytes(range(32, 64))


@pytest.fixture(params=[memory_store, disk_store, postgres_store], ids=['memory', 'disk', 'postgres'])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    made: Store = request.param(tmp_path)
    return made


@dataclass
class Shop:
    """A real agent whose every step carries the marker, and counters of what reached the model and the tool."""

    model_calls: int = 0
    tool_calls: int = 0

    def agent(self, journal: Journal) -> Agent[None, str]:
        secrets = SecretRegistry()
        secrets.register(SECRET)

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            self.model_calls += 1
            returned = tool_returns(messages)
            if not returned:
                return ModelResponse(
                    parts=[
                        TextPart(f'Looking up {MARKER} with {SECRET}.'),
                        ToolCallPart('lookup', {'query': f'{MARKER} for {SECRET}'}, tool_call_id='c1'),
                    ]
                )
            return ModelResponse(parts=[TextPart(f'Done: {returned[0].content}; key {SECRET}')])

        def lookup(query: str) -> str:
            self.tool_calls += 1
            return f'found {MARKER} ({len(query)} characters asked)'  # no secret: K-8 would run it again

        return Agent(
            FunctionModel(model, model_name='shop'),
            name='shop',
            tools=[lookup],
            capabilities=[Durable(journal=journal, secrets=secrets)],
        )


async def _run(journal: Journal, shop: Shop, key: str = 'order-1') -> str:
    async with execution(key, journal=journal, metadata={'note': MARKER}):
        result = await shop.agent(journal).run(f'Find {MARKER}')
    return result.output


async def _close(journal: Journal) -> None:
    if not isinstance(journal, MemoryJournal):
        await journal.close()


# -- EN-1: nothing of the conversation in the raw store ------------------------------------------------


async def test_en1_with_keys_no_marker_or_secret_is_in_the_raw_store_and_the_run_replays(store: Store) -> None:
    shop = Shop()
    journal = store.make(Encryption({'a': KEY_A}))
    output = await _run(journal, shop)
    await _close(journal)
    assert MARKER in output and shop.model_calls == 2 and shop.tool_calls == 1
    raw = store.raw()
    assert raw, 'the scan read nothing'
    assert MARKER.encode() not in raw and SECRET.encode() not in raw
    assert b'shop' in raw  # names stay in clear (EN-1): the scan does see the store

    again = store.make(Encryption({'a': KEY_A}))
    assert await _run(again, shop) == output
    assert (shop.model_calls, shop.tool_calls) == (2, 1)  # replayed: no model request, no second lookup
    infos = await again.list_executions()
    assert [info.metadata for info in infos] == [{'note': MARKER}]
    await _close(again)


async def test_en1_without_keys_the_same_scan_finds_the_marker(store: Store) -> None:
    journal = store.make(None)
    await _run(journal, Shop())
    await _close(journal)
    assert MARKER.encode() in store.raw()


# -- EN-3: what fails authentication is refused, and nothing stored changes ---------------------------------


def _raw_view(store: Store) -> Journal:
    journal = store.make(None)
    reseal(journal, None, 'show')
    return journal


async def _entries(store: Store, key: str = 'order-1') -> dict[str, Any]:
    view = _raw_view(store)
    try:
        record = await view.read_execution(key)
        assert record is not None
        return {run: (await view.read_run(key, run)).entries for run in record['runs']}
    finally:
        await _close(view)


async def _first_run(store: Store, key: str = 'order-1') -> str:
    return next(iter(await _entries(store, key)))


def _text(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(',', ':'), ensure_ascii=True)


async def _tamper(store: Store, change: Callable[[dict[int, Any]], tuple[int, dict[str, Any]]]) -> str:
    """Change a stored value as someone with write access to the store would: past the journal (EN-6 refuses a
    journal object without keys)."""
    run = await _first_run(store)
    view = _raw_view(store)
    try:
        entries = (await view.read_run('order-1', run)).entries
    finally:
        await _close(view)
    position, value = change(entries)
    store.put_raw(('entry', 'order-1', run, position), _text(value))
    return run


def _flip(entries: dict[int, Any]) -> tuple[int, dict[str, Any]]:
    sealed = dict(entries[0]['sealed'])
    blob = bytearray(base64.b64decode(sealed['c']))
    blob[-1] ^= 0x01
    return 0, {**entries[0], 'sealed': {**sealed, 'c': base64.b64encode(bytes(blob)).decode()}}


def _swap(entries: dict[int, Any]) -> tuple[int, dict[str, Any]]:
    return 0, {**entries[0], 'sealed': entries[1]['sealed']}  # another step's sealed part, under step 0's name


@pytest.mark.parametrize('change', [_flip, _swap], ids=['flipped_byte', 'swapped_row'])
async def test_en3_a_tampered_or_swapped_value_is_journal_corrupt_and_nothing_runs(
    store: Store, change: Callable[[dict[int, Any]], tuple[int, dict[str, Any]]]
) -> None:
    shop = Shop()
    journal = store.make(Encryption({'a': KEY_A}))
    await _run(journal, shop)
    await _close(journal)
    run = await _tamper(store, change)
    before = await _entries(store)
    again = store.make(Encryption({'a': KEY_A}))
    with pytest.raises(JournalCorrupt) as caught:
        await _run(again, shop)
    await _close(again)
    assert caught.value.key == 'order-1' and caught.value.where == f'run {run}, step 0'
    assert 'failed authentication' in str(caught.value)
    assert (shop.model_calls, shop.tool_calls) == (2, 1)  # neither replayed nor run again
    assert await _entries(store) == before


async def test_en3_a_value_copied_from_another_execution_is_journal_corrupt(store: Store) -> None:
    shop = Shop()
    journal = store.make(Encryption({'a': KEY_A}))
    await _run(journal, shop, key='order-1')
    await _run(journal, shop, key='order-2')
    await _close(journal)
    run = await _first_run(store, 'order-1')
    view = _raw_view(store)
    try:
        other = (await view.read_run('order-2', await _first_run(store, 'order-2'))).entries[0]
    finally:
        await _close(view)
    store.put_raw(('entry', 'order-1', run, 0), _text(other))  # the same step of another execution
    again = store.make(Encryption({'a': KEY_A}))
    with pytest.raises(JournalCorrupt) as caught:
        await _run(again, shop, key='order-1')
    await _close(again)
    assert caught.value.key == 'order-1' and caught.value.where == f'run {run}, step 0'
    assert shop.tool_calls == 2


async def test_en3_a_wrong_key_under_the_same_id_is_journal_corrupt(store: Store) -> None:
    shop = Shop()
    journal = store.make(Encryption({'a': KEY_A}))
    await _run(journal, shop)
    await _close(journal)
    before = await _entries(store)
    wrong = store.make(Encryption({'a': KEY_B}))
    with pytest.raises(JournalCorrupt, match="'order-1'"):
        await _run(wrong, shop)
    await _close(wrong)
    assert (shop.model_calls, shop.tool_calls) == (2, 1)
    assert await _entries(store) == before


async def test_en4_a_missing_key_id_is_named(store: Store) -> None:
    shop = Shop()
    journal = store.make(Encryption({'a': KEY_A}))
    await _run(journal, shop)
    await _close(journal)
    other = store.make(Encryption({'b': KEY_B}))
    with pytest.raises(EncryptionMismatch) as caught:
        await _run(other, shop)
    await _close(other)
    assert caught.value.key_id == 'a' and "key id 'a'" in str(caught.value)
    assert (shop.model_calls, shop.tool_calls) == (2, 1)


async def test_en4_a_plain_journal_opened_with_keys_and_an_encrypted_one_without_are_reported(store: Store) -> None:
    shop = Shop()
    plain = store.make(None)
    await _run(plain, shop, key='plain')
    await _close(plain)
    with_keys = store.make(Encryption({'a': KEY_A}))
    with pytest.raises(EncryptionMismatch, match=r'plain text.*rekey'):
        await _run(with_keys, shop, key='plain')
    await _run(with_keys, shop, key='sealed')
    await _close(with_keys)
    without = store.make(None)  # refused by the journal's marker before the sealed record is even read (EN-6)
    with pytest.raises(EncryptionMismatch, match=r'sealed, and was opened without keys') as caught:
        await _run(without, shop, key='sealed')
    await _close(without)
    assert caught.value.key_id == 'a'
    reseal(without, None, 'strict')
    with pytest.raises(EncryptionMismatch, match=r'encrypted .*no keys') as caught:
        await without.read_execution('sealed')  # a read meets the sealed value itself
    await _close(without)
    assert caught.value.key_id == 'a'
    assert shop.tool_calls == 2  # one per execution: nothing ran again


# -- EN-2: rotation, and rekey killed at random points -------------------------------------------------------


def _keys_env(*pairs: tuple[str, bytes]) -> str:
    return ','.join(f'{key_id}:{base64.b64encode(key).decode()}' for key_id, key in pairs)


def _rekey(store: Store, env: dict[str, str]) -> subprocess.Popen[str]:
    assert store.cli is not None
    return subprocess.Popen(
        [sys.executable, '-m', 'pydantic_ai_durable', *store.cli, 'rekey'],
        env={**env, 'PYTHONUNBUFFERED': '1'},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_en2_rotated_keys_read_old_values_and_rekey_killed_at_random_points_loses_nothing(store: Store) -> None:
    if store.cli is None:
        pytest.skip('a memory journal lives in one process: rekey cannot be killed and re-run on it')
    shop = Shop()
    keys = [f'order-{n}' for n in range(12)]
    journal = store.make(Encryption({'a': KEY_A}))
    outputs = {key: await _run(journal, shop, key=key) for key in keys}
    await _close(journal)
    assert shop.tool_calls == len(keys)

    rotated = store.make(Encryption([('b', KEY_B), ('a', KEY_A)]))  # new writes under b, reads accept a too
    assert await _run(rotated, shop, key='order-0') == outputs['order-0']
    await _close(rotated)

    env = {**os.environ, 'PYDANTIC_AI_DURABLE_KEYS': _keys_env(('b', KEY_B), ('a', KEY_A))}
    chance = random.Random(35)
    for _ in range(3):  # killed after a random number of executions, inside the rewrite of the next one
        process = _rekey(store, env)
        assert process.stdout is not None
        for _ in range(chance.randint(1, len(keys) - 1)):
            assert process.stdout.readline().startswith('rekeyed '), process.communicate()
        process.send_signal(signal.SIGKILL)
        process.communicate()
        assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 60  # on PostgreSQL a killed rekey's lease ends after its 10 s
    while True:
        process = _rekey(store, env)
        out, err = process.communicate()
        if process.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert process.returncode == 0, out + err
    assert f'{len(keys)} executions' in out

    only_b = store.make(Encryption({'b': KEY_B}))  # key a is gone: everything must be under b now
    assert {key: await _run(only_b, shop, key=key) for key in keys} == outputs
    await _close(only_b)
    assert shop.tool_calls == len(keys)  # every acknowledged side effect once, over every attempt
    assert shop.model_calls == 2 * len(keys)


async def test_en2_rekey_in_process_rotates_every_backend(store: Store) -> None:
    shop = Shop()
    journal = store.make(Encryption({'a': KEY_A}))
    output = await _run(journal, shop)
    await _close(journal)
    rotating = store.make(Encryption([('b', KEY_B), ('a', KEY_A)]))
    reseal(rotating, Encryption([('b', KEY_B), ('a', KEY_A)]), 'migrate')
    report = await rekey(rotating)
    await _close(rotating)
    assert report.rewritten == ['order-1'] and report.busy == [] and report.values >= 4
    only_b = store.make(Encryption({'b': KEY_B}))
    assert await _run(only_b, shop) == output
    await _close(only_b)
    assert (shop.model_calls, shop.tool_calls) == (2, 1)


async def test_en2_rekey_leaves_an_execution_an_attempt_holds_alone(store: Store) -> None:
    journal = store.make(Encryption({'a': KEY_A}))
    await _run(journal, Shop())
    lease = await journal.acquire_lease('order-1', Operator.HOLDER, 60)  # a live holder, as a running attempt
    before = await _entries(store)
    rotating = store.make(Encryption([('b', KEY_B), ('a', KEY_A)]))
    reseal(rotating, Encryption([('b', KEY_B), ('a', KEY_A)]), 'migrate')
    report = await rekey(rotating)
    assert report.busy == ['order-1'] and report.rewritten == [] and report.values == 0
    assert await _entries(store) == before  # still sealed under a, byte for byte
    await journal.release_lease('order-1', Operator.HOLDER, lease.epoch)
    await _close(rotating)
    await _close(journal)


async def test_en2_rekey_encrypts_a_plain_journal(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    if store.cli is None:
        pytest.skip('the CLI opens journals other processes can reach')
    shop = Shop()
    journal = store.make(None)
    output = await _run(journal, shop)
    await _close(journal)
    env = {**os.environ, 'PYDANTIC_AI_DURABLE_KEYS': _keys_env(('a', KEY_A))}
    out, err = _rekey(store, env).communicate()
    assert '1 execution' in out, out + err
    assert MARKER.encode() not in store.raw() or store.name == 'disk'  # SQLite may keep freed pages
    sealed = store.make(Encryption({'a': KEY_A}))
    assert await _run(sealed, shop) == output
    await _close(sealed)
    assert shop.tool_calls == 1


def test_en5_rekey_without_keys_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / 'j').mkdir()
    env = {key: value for key, value in os.environ.items() if key != 'PYDANTIC_AI_DURABLE_KEYS'}
    result = subprocess.run(
        [sys.executable, '-m', 'pydantic_ai_durable', '--journal', str(tmp_path / 'j'), 'rekey'],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and 'PYDANTIC_AI_DURABLE_KEYS' in result.stderr


async def test_en5_the_cli_shows_encrypted_values_as_such_and_decrypts_them_with_the_keys(store: Store) -> None:
    if store.cli is None:
        pytest.skip('the CLI opens journals other processes can reach')
    journal = store.make(Encryption({'a': KEY_A}))
    await _run(journal, Shop())
    await _close(journal)
    assert store.cli is not None
    command = [sys.executable, '-m', 'pydantic_ai_durable', *store.cli, 'show', 'order-1']
    env = {key: value for key, value in os.environ.items() if key != 'PYDANTIC_AI_DURABLE_KEYS'}
    shown = subprocess.run(command, env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert 'sealed (key id a)' in shown.stdout and 'metadata   sealed' in shown.stdout
    assert MARKER not in shown.stdout
    env['PYDANTIC_AI_DURABLE_KEYS'] = _keys_env(('a', KEY_A))
    opened = subprocess.run(command, env=env, capture_output=True, text=True)
    assert opened.returncode == 0, opened.stderr
    assert 'sealed (' not in opened.stdout and MARKER in opened.stdout  # the metadata, decrypted


def test_en2_keys_are_checked_when_given() -> None:
    with pytest.raises(ValueError, match='16, 24 or 32 bytes'):
        Encryption({'a': b'short'})
    with pytest.raises(ValueError, match='key id'):
        Encryption({'a b': KEY_A})
    with pytest.raises(ValueError, match='at least one key'):
        Encryption({})
    assert 'KEY' not in repr(Encryption({'a': KEY_A})) and repr(KEY_A) not in repr(Encryption({'a': KEY_A}))
    with pytest.raises(TypeError, match='Encryption'):
        DiskJournal('x', encryption='secret')  # type: ignore[arg-type]


def test_en2_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('PYDANTIC_AI_DURABLE_KEYS', _keys_env(('b', KEY_B), ('a', KEY_A)))
    keys = Encryption.from_env()
    assert keys.current == 'b' and keys.key_ids == ('b', 'a')
    monkeypatch.setenv('PYDANTIC_AI_DURABLE_KEYS', 'a:not base64!')
    with pytest.raises(ValueError, match='not base64'):
        Encryption.from_env()
    monkeypatch.delenv('PYDANTIC_AI_DURABLE_KEYS')
    with pytest.raises(ValueError, match='is not set'):
        Encryption.from_env()
