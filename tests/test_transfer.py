"""Executions moved between journals, forked at a step, and read back as messages (XP-1..XP-5).

A real agent of six steps (a model request asking for two tools, both tools, a request asking for a third,
the third, and the final answer) runs on one backend; its export is imported into every other backend and
run again with the same agent, which must call neither its model nor its tools. Interrupted executions
resume across backends, forks replay exactly the steps before their cut, and the messages read back equal
what the live run held. Hostile files are refused with the target store unchanged, byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import tool_returns
from pg import server_dsn
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from stores import Store, disk_store, memory_store, postgres_store

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    Encryption,
    EncryptionMismatch,
    ExecutionBusy,
    ExportInvalid,
    ImportRefused,
    Limits,
    MemoryJournal,
    PostgresJournal,
    SecretRegistry,
    copy_execution,
    execution,
    export_execution,
    fork_execution,
    import_execution,
    recorded_messages,
)
from pydantic_ai_durable._fingerprint import Renderings
from pydantic_ai_durable.journals import Journal
from pydantic_ai_durable.testing import SimulatedCrash, crash_at

STORES = {'memory': memory_store, 'disk': disk_store, 'postgres': postgres_store}
PAIRS = [(a, b) for a in STORES for b in STORES]
MARKER = 'walrus-marker-51ab'


class Shop:
    """Counts what reached the model and each tool; a replay must not add to any counter."""

    def __init__(self) -> None:
        self.model_calls = 0
        self.effects: dict[str, int] = {}

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.model_calls += 1
        returned = len(tool_returns(messages))
        if returned == 0:
            return ModelResponse(
                parts=[
                    TextPart(f'checking {MARKER}'),
                    ToolCallPart('reserve', {'item': 'a'}, tool_call_id='r1'),
                    ToolCallPart('reserve', {'item': 'b'}, tool_call_id='r2'),
                ]
            )
        if returned == 2:
            return ModelResponse(parts=[ToolCallPart('charge', {'amount': 7}, tool_call_id='c1')])
        return ModelResponse(parts=[TextPart(f'done: {tool_returns(messages)[-1].content}')])

    def agent(self, journal: Journal, model: FunctionModel | None = None) -> Agent[None, str]:
        def reserve(item: str) -> str:
            self.effects[f'reserve {item}'] = self.effects.get(f'reserve {item}', 0) + 1
            return f'reserved {item} for {MARKER}'

        def charge(amount: int) -> str:
            self.effects['charge'] = self.effects.get('charge', 0) + 1
            return f'charged {amount}'

        return Agent(
            model or FunctionModel(self.model, model_name='shop'),
            name='shop',
            tools=[reserve, charge],
            capabilities=[Durable(journal=journal)],
        )

    def live_calls(self) -> int:
        return self.model_calls + sum(self.effects.values())


SIX_STEPS = 6  # model, reserve a, reserve b, model, charge, model


async def _record(journal: Journal, shop: Shop, key: str = 'order-42') -> tuple[str, Any, list[ModelMessage]]:
    async with execution(key, journal=journal, metadata={'customer': 7}) as handle:
        result = await shop.agent(journal).run(f'order for {MARKER}')
    return result.output, handle.usage.total, result.all_messages()


async def _close(*journals: Journal) -> None:
    for journal in journals:
        if not isinstance(journal, MemoryJournal):
            await journal.close()


def _pair(tmp_path: Path, source: str, target: str) -> tuple[Store, Store]:
    (tmp_path / 'source').mkdir()
    (tmp_path / 'target').mkdir()
    return STORES[source](tmp_path / 'source'), STORES[target](tmp_path / 'target')


def _without_time(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != 'exported'}


# -- XP-1, XP-2: across every pair of backends ----------------------------------------------------------


@pytest.mark.parametrize(('source', 'target'), PAIRS, ids=[f'{a}-to-{b}' for a, b in PAIRS])
async def test_xp1_xp2_an_export_imported_elsewhere_replays_with_zero_calls_and_the_same_usage(
    tmp_path: Path, source: str, target: str
) -> None:
    src_store, dst_store = _pair(tmp_path, source, target)
    shop = Shop()
    src = src_store.make(None)
    output, usage, _ = await _record(src, shop)
    assert (shop.model_calls, sum(shop.effects.values())) == (3, 3)
    document = json.loads(json.dumps(await export_execution(src, 'order-42')))  # through a file's text
    assert document['payloads'] == 'plaintext' and document['state'] == 'finished'
    assert 'lease' not in json.dumps(document) and 'epoch' not in json.dumps(document)

    dst = dst_store.make(None)
    report = await import_execution(dst, json.dumps(document))
    assert (report.key, report.runs, report.steps, report.replaced) == ('order-42', 1, SIX_STEPS, False)
    async with execution('order-42', journal=dst) as handle:
        again = await shop.agent(dst).run(f'order for {MARKER}')
    assert again.output == output
    assert (shop.model_calls, sum(shop.effects.values())) == (3, 3)  # zero model requests, zero tool calls
    assert handle.usage.total == usage
    assert [info.metadata for info in await dst.list_executions()] == [{'customer': 7}]
    await _close(src, dst)


@pytest.mark.parametrize(('source', 'target'), PAIRS, ids=[f'{a}-to-{b}' for a, b in PAIRS])
async def test_xp2_an_interrupted_execution_exported_mid_run_resumes_elsewhere_each_effect_once(
    tmp_path: Path, source: str, target: str
) -> None:
    src_store, dst_store = _pair(tmp_path, source, target)
    shop = Shop()
    src = src_store.make(None)
    with pytest.raises(SimulatedCrash):
        async with execution('order-42', journal=src):
            with crash_at(position=4):  # the charge ran and was recorded; the process "dies"
                await shop.agent(src).run(f'order for {MARKER}')
    assert shop.effects == {'reserve a': 1, 'reserve b': 1, 'charge': 1}
    document = await export_execution(src, 'order-42')
    assert document['state'] == 'interrupted'

    dst = dst_store.make(None)
    await import_execution(dst, document)
    async with execution('order-42', journal=dst):
        result = await shop.agent(dst).run(f'order for {MARKER}')
    assert result.output == 'done: charged 7'
    assert shop.effects == {'reserve a': 1, 'reserve b': 1, 'charge': 1}  # every acknowledged effect once
    assert shop.model_calls == 3  # two before the crash; the recorded ones replayed, only the final answer ran live
    await _close(src, dst)


async def test_xp2_copy_execution_copies_between_journals_under_another_key(tmp_path: Path) -> None:
    src, dst = disk_store(tmp_path / 'a').make(None), MemoryJournal()
    shop = Shop()
    output, _, _ = await _record(src, shop)
    report = await copy_execution(src, dst, 'order-42', as_key='order-42-copy')
    assert report.key == 'order-42-copy'
    async with execution('order-42-copy', journal=dst):
        assert (await shop.agent(dst).run(f'order for {MARKER}')).output == output
    assert shop.live_calls() == 6
    await _close(src)


# -- XP-2: never over what exists, never over what runs, all or nothing -------------------------------


@pytest.mark.parametrize('name', list(STORES))
async def test_xp2_an_existing_execution_needs_force_and_a_running_one_is_refused_even_with_it(
    tmp_path: Path, name: str
) -> None:
    journal = STORES[name](tmp_path).make(None)
    shop = Shop()
    await _record(journal, shop)
    document = await export_execution(journal, 'order-42')
    with pytest.raises(ImportRefused, match='already exists'):
        await import_execution(journal, document)
    report = await import_execution(journal, document, force=True)
    assert report.replaced

    running = execution('order-42', journal=journal)
    await running.__aenter__()  # a live attempt holds the lease
    try:
        with pytest.raises(ImportRefused, match='running'):
            await import_execution(journal, document, force=True)
        with pytest.raises(ImportRefused, match='running'):
            await import_execution(journal, document)  # the lease is asked first: running, not merely existing
    finally:
        await running.__aexit__(None, None, None)
    await _close(journal)


class _Paused:
    """A journal (a memory one by default) whose import waits at an entry until told to go on, or refuses one.

    `pause_at`: the entry, counted from 1, that waits for `go_on` (`None`: none waits); `refuse_at`: the entry
    that the journal refuses, after its wait if it has one.
    """

    def __init__(self, inner: Journal | None = None, *, pause_at: int | None = 1, refuse_at: int | None = None) -> None:
        self.inner = inner if inner is not None else MemoryJournal()
        self.reached = asyncio.Event()
        self.go_on = asyncio.Event()
        self.pause_at = pause_at
        self.refuse_at = refuse_at
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        self.writes += 1
        if self.writes == self.pause_at:
            self.reached.set()
            await self.go_on.wait()
        if self.writes == self.refuse_at:
            return False
        return await self.inner.write_entry(key, run, position, entry, epoch=epoch)


async def test_xp2_an_attempt_racing_an_import_finds_the_key_busy(tmp_path: Path) -> None:
    source = MemoryJournal()
    await _record(source, Shop())
    document = await export_execution(source, 'order-42')
    paused = _Paused()
    target: Journal = paused  # type: ignore[assignment]
    importing = asyncio.create_task(import_execution(target, document))
    await paused.reached.wait()
    with pytest.raises(ExecutionBusy):
        async with execution('order-42', journal=paused.inner):
            pass
    paused.go_on.set()
    assert (await importing).steps == SIX_STEPS


async def test_xp2_an_import_that_fails_halfway_leaves_nothing_behind() -> None:
    source = MemoryJournal()
    await _record(source, Shop())
    document = await export_execution(source, 'order-42')
    refusing = _Paused(pause_at=None, refuse_at=4)
    with pytest.raises(ImportRefused, match='refused a value'):
        await import_execution(refusing, document)  # type: ignore[arg-type]
    assert refusing.writes == 4
    assert await refusing.inner.read_execution('order-42') is None
    assert (await refusing.inner.read_run('order-42', '0')).entries == {}
    assert await refusing.inner.list_executions() == []


# -- XP-3: fork ------------------------------------------------------------------------------------------


@pytest.mark.parametrize('name', list(STORES))
async def test_xp3_a_fork_at_every_step_replays_the_steps_before_it_and_runs_the_rest_live(
    tmp_path: Path, name: str
) -> None:
    journal = STORES[name](tmp_path).make(None)
    shop = Shop()
    output, _, _ = await _record(journal, shop)
    before = _without_time(await export_execution(journal, 'order-42'))
    live_at = {0: 'model', 1: 'reserve a', 2: 'reserve b', 3: 'model', 4: 'charge', 5: 'model'}
    for at in range(SIX_STEPS + 1):
        counted = Shop()
        report = await fork_execution(journal, 'order-42', f'fork-{at}', at=at)
        assert report.steps == at
        async with execution(f'fork-{at}', journal=journal):
            assert (await counted.agent(journal).run(f'order for {MARKER}')).output == output
        ran = [live_at[p] for p in range(at, SIX_STEPS)]
        assert counted.model_calls == ran.count('model'), at
        assert counted.effects == {e: ran.count(e) for e in set(ran) if e != 'model'}, at
    assert _without_time(await export_execution(journal, 'order-42')) == before  # the source is untouched
    with pytest.raises(ImportRefused, match='already exists'):
        await fork_execution(journal, 'order-42', 'fork-1', at=1)
    with pytest.raises(ImportRefused, match='no top-level run'):
        await fork_execution(journal, 'order-42', 'fork-x', at=1, run='3')
    await _close(journal)


async def test_xp3_a_fork_of_a_running_execution_reads_a_consistent_snapshot() -> None:
    journal = MemoryJournal()
    shop = Shop()
    await _record(journal, shop)
    running = execution('order-42', journal=journal)
    await running.__aenter__()
    try:
        report = await fork_execution(journal, 'order-42', 'fork', at=3)
    finally:
        await running.__aexit__(None, None, None)
    assert report.steps == 3
    record = await journal.read_execution('fork')
    assert record is not None and record['forked_from'] == {'key': 'order-42', 'run': '0', 'at': 3}
    assert [info.state for info in await journal.list_executions() if info.key == 'fork'] == ['interrupted']


# -- XP-5: messages --------------------------------------------------------------------------------------


@pytest.mark.parametrize('name', list(STORES))
async def test_xp5_the_messages_before_every_step_equal_the_live_runs_history(tmp_path: Path, name: str) -> None:
    journal = STORES[name](tmp_path).make(None)
    _, _, live = await _record(journal, Shop())
    assert await recorded_messages(journal, 'order-42') == live
    # Before step N: what the run held when step N began (the model requests at 0, 3 and 5).
    held_before = {0: 0, 1: 2, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6}
    for until, count in held_before.items():
        assert await recorded_messages(journal, 'order-42', until=until) == live[:count], until
    with pytest.raises(LookupError):
        await recorded_messages(journal, 'order-42', run='1')
    await _close(journal)


async def test_xp5_another_model_continues_the_recorded_conversation() -> None:
    journal = MemoryJournal()
    await _record(journal, Shop())
    history = await recorded_messages(journal, 'order-42')
    seen: list[list[ModelMessage]] = []

    def other(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(messages)
        return ModelResponse(parts=[TextPart('a second opinion')])

    result = await Agent(FunctionModel(other)).run('what would you do next?', message_history=history)
    assert result.output == 'a second opinion'
    assert seen[0][: len(history)] == history
    assert len(seen[0]) == len(history) + 1 and isinstance(seen[0][-1], ModelRequest)
    assert any(isinstance(p, UserPromptPart) and p.content == 'what would you do next?' for p in seen[0][-1].parts)


async def test_xp5_the_recorded_messages_are_byte_for_byte_the_masked_dump_of_what_each_request_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step records the fingerprint's rendering of its new messages where there is one (issue 51).

    That must be exactly the masked dump the step would make itself: also after a secret was registered
    mid-run, and where the fingerprint's rendering of a message is reordered (FP-8: a set and integer keys
    in a tool return of the history the run is given, which no codec normalized).
    """
    secrets = SecretRegistry()
    token = f'T-{uuid.uuid4().hex}'
    expected: list[list[str]] = []  # for each request: each message's masked dump, as the model got it

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        dumped = secrets.mask(ModelMessagesTypeAdapter.dump_python(messages, mode='json'))
        expected.append([json.dumps(message) for message in dumped])
        step = len(tool_returns(messages)) - 1
        if step < 2:
            return ModelResponse(parts=[ToolCallPart(['login', 'echo'][step], {}, tool_call_id=f'c{step}')])
        return ModelResponse(parts=[TextPart('done')])

    def login() -> str:
        secrets.register(token)
        return f'token={token}'

    def echo() -> str:
        return f'still {token}'

    special = {'set': {'delta', 'alpha', 'echo', 'charlie', 'bravo'}, 2: 'two', 1: 'one'}
    earlier: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart('earlier')]),
        ModelResponse(parts=[ToolCallPart('tags', {}, tool_call_id='h0')]),
        ModelRequest(parts=[ToolReturnPart('tags', special, tool_call_id='h0')]),
        ModelResponse(parts=[TextPart('noted')]),
    ]
    seen: list[bool] = []
    original = Renderings.of

    def spied(self: Renderings, messages: Any) -> list[Any] | None:
        found = original(self, messages)
        seen.append(found is not None)
        return found

    monkeypatch.setattr(Renderings, 'of', spied)
    journal = MemoryJournal()
    agent = Agent(
        FunctionModel(model, model_name='sent'),
        name='sent',
        tools=[login, echo],
        capabilities=[Durable(journal, secrets=secrets)],
    )
    async with execution('sent', journal=journal, cleanup='keep'):
        await agent.run('go', message_history=earlier)
    entries = [e for e in (await journal.read_run('sent', '0')).entries.values() if e['kind'] == 'model']
    assert token not in json.dumps(entries)
    assert [len(e['sent']['messages']) for e in entries] == [5, 1, 1]
    for entry, dumps in zip(entries, expected, strict=True):
        sent = entry['sent']
        assert [json.dumps(message) for message in sent['messages']] == dumps[sent['from'] :]
    # Reused where it could be; the first request, holding the reordered tool return, was dumped again.
    assert seen == [False, True, True]


# -- EN-1 with XP-1: encrypted journals -------------------------------------------------------------------


@pytest.mark.parametrize('name', list(STORES))
async def test_xp1_en1_an_encrypted_journal_exports_ciphertext_unless_plaintext_is_asked(
    tmp_path: Path, name: str
) -> None:
    keys = Encryption({'k1': bytes(range(32))})
    store = STORES[name](tmp_path)
    journal = store.make(keys)
    shop = Shop()
    output, _, _ = await _record(journal, shop)
    sealed = await export_execution(journal, 'order-42')
    assert sealed['payloads'] == 'ciphertext' and sealed['key_ids'] == ['k1']
    assert MARKER not in json.dumps(sealed)
    plain = await export_execution(journal, 'order-42', plaintext=True)
    assert plain['payloads'] == 'plaintext' and MARKER in json.dumps(plain)

    bare = MemoryJournal()
    with pytest.raises(ExportInvalid, match='ciphertext'):
        await import_execution(bare, sealed)
    assert await bare.list_executions() == []
    await import_execution(bare, sealed, encryption=keys)  # opened with the keys, stored as the target keeps it
    async with execution('order-42', journal=bare):
        assert (await shop.agent(bare).run(f'order for {MARKER}')).output == output
    other = MemoryJournal(encryption=Encryption({'k2': bytes(range(1, 33))}))
    await import_execution(other, plain, key='moved')
    assert (await export_execution(other, 'moved'))['key_ids'] == ['k2']
    assert (await import_execution(MemoryJournal(), sealed, key='moved', encryption=keys)).key == 'moved'
    relabelled = {**sealed, 'key': 'another-order'}  # sealed values are bound to the key they were exported under
    with pytest.raises(ExportInvalid, match='does not open'):
        await import_execution(MemoryJournal(), relabelled, encryption=keys)
    assert shop.live_calls() == 6
    await _close(journal)


async def test_xp1_en1_without_keys_an_encrypted_journal_exports_what_it_stores() -> None:
    keys = Encryption({'k1': bytes(range(32))})
    journal = MemoryJournal(encryption=keys)
    await _record(journal, Shop())
    from pydantic_ai_durable.journals import reseal

    reseal(journal, None, 'show')  # as the CLI opens it without $PYDANTIC_AI_DURABLE_KEYS
    document = await export_execution(journal, 'order-42')
    assert document['payloads'] == 'ciphertext' and MARKER not in json.dumps(document)
    with pytest.raises(EncryptionMismatch, match='plaintext export needs them'):
        await export_execution(journal, 'order-42', plaintext=True)
    with pytest.raises(EncryptionMismatch, match='forking'):
        await fork_execution(journal, 'order-42', 'fork', at=1)
    target = MemoryJournal(encryption=keys)
    await import_execution(target, document)
    assert await recorded_messages(target, 'order-42') != []


# -- XP-4: hostile files ----------------------------------------------------------------------------------


def _hostile(document: dict[str, Any]) -> dict[str, Callable[[], str | bytes]]:
    def changed(edit: Callable[[dict[str, Any]], None]) -> Callable[[], str]:
        def make() -> str:
            copy = json.loads(json.dumps(document))
            edit(copy)
            return json.dumps(copy)

        return make

    def entry(n: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda d: d['runs'][0]['entries'][n]['entry']

    text = json.dumps(document)
    return {
        'truncated': lambda: text[: len(text) // 2],
        'not json': lambda: b'\xff\xfe not json',
        'a list': lambda: '[1, 2]',
        'deep': lambda: '[' * 100_000 + ']' * 100_000,
        'wrong version': changed(lambda d: d.update(version=99)),
        'wrong format': changed(lambda d: d.update(format='langgraph-checkpoint')),
        'extra field': changed(lambda d: d.update(lease={'holder': 'x', 'epoch': 9})),
        'missing field': changed(lambda d: d.pop('execution')),
        'missing entry field': changed(lambda d: entry(0)(d).pop('kind')),
        'payload of 100 MB': changed(lambda d: entry(1)(d).update(payload='x' * 100_000_000)),
        'terminal escape in a name': changed(lambda d: entry(1)(d).update(name='shop\x1b]0;pwned\x07')),
        'path parts in a name': changed(lambda d: entry(1)(d).update(name='../../etc/passwd')),
        'path parts in a run': changed(
            lambda d: (d['runs'][0].update(run='../0'), d['execution'].update(runs=['../0']))
        ),
        'duplicate positions': changed(lambda d: d['runs'][0]['entries'].append(d['runs'][0]['entries'][2])),
        'control character in the key': changed(lambda d: d.update(key='order\r42')),
        'a run not listed': changed(lambda d: d['execution'].update(runs=[])),
        'a float position': changed(lambda d: d['runs'][0]['entries'][0].update(position=0.5)),
        'a bad fingerprint': changed(lambda d: entry(0)(d).update(fingerprint='not hex; rm -rf')),
        'sealed values called plaintext': changed(lambda d: entry(0)(d).update(sealed={'k': 'x', 'c': 'AAAA'})),
        'deep payload': changed(lambda d: entry(1)(d).update(payload=json.loads('[' * 300 + ']' * 300))),
    }


@pytest.mark.parametrize('name', list(STORES))
async def test_xp4_every_hostile_file_is_refused_and_the_target_is_unchanged_byte_for_byte(
    tmp_path: Path, name: str
) -> None:
    source = MemoryJournal()
    await _record(source, Shop())
    document = await export_execution(source, 'order-42')
    store = STORES[name](tmp_path)
    target = store.make(None)
    await _record(target, Shop(), key='already-here')
    await _close(target)
    before = store.raw()
    target = store.make(None)
    for case, make in _hostile(document).items():
        with pytest.raises(ExportInvalid) as refused:
            await import_execution(target, make())
        message = str(refused.value)
        assert message.startswith('Not imported:') and message.endswith('Nothing was written.'), (case, message)
        assert '\x1b' not in message and '\r' not in message, case
    await _close(target)
    assert store.raw() == before


def test_xp4_limits_are_the_callers_to_raise() -> None:
    document = asyncio.run(_exported())
    big = json.loads(json.dumps(document))
    big['runs'][0]['entries'][1]['entry']['payload'] = 'x' * 2_000
    with pytest.raises(ExportInvalid, match='more than the 1000'):
        asyncio.run(import_execution(MemoryJournal(), big, limits=Limits(value_bytes=1_000)))
    assert asyncio.run(import_execution(MemoryJournal(), big)).steps == SIX_STEPS


async def _exported() -> dict[str, Any]:
    source = MemoryJournal()
    await _record(source, Shop())
    return await export_execution(source, 'order-42')


# -- the command line -------------------------------------------------------------------------------------


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, '-m', 'pydantic_ai_durable', *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        env={**os.environ, 'PYTHONIOENCODING': 'utf-8'},
        check=False,
    )


def _refused(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert 'Traceback' not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    return result.stderr


def test_xp1_xp3_xp5_cli_export_from_postgres_import_on_disk_fork_and_messages(tmp_path: Path) -> None:
    production = postgres_store(tmp_path)
    assert production.cli is not None
    shop = Shop()

    async def record() -> tuple[str, list[ModelMessage]]:
        journal = production.make(None)
        output, _, messages = await _record(journal, shop)
        await _close(journal)
        return output, messages

    output, live = asyncio.run(record())
    exported = tmp_path / 'order-42.json'
    done = _cli(*production.cli, 'export', 'order-42', '-o', str(exported))
    assert done.returncode == 0, done.stderr
    assert 'exported' in done.stdout and 'plaintext' in done.stdout and '6 steps' in done.stdout
    laptop = tmp_path / 'laptop'  # a journal that does not exist yet: import makes it
    done = _cli('--journal', str(laptop), 'import', str(exported))
    assert done.returncode == 0, done.stderr
    assert "imported 'order-42' (1 run, 6 steps)" in done.stdout
    assert 'already exists' in _refused(_cli('--journal', str(laptop), 'import', str(exported)))
    assert _cli('--journal', str(laptop), 'import', str(exported), '--force').returncode == 0
    assert (
        _cli('--journal', str(laptop), 'import', '-', '--as', 'from-stdin', stdin=exported.read_text()).returncode == 0
    )

    messages = _cli('--journal', str(laptop), 'show', 'order-42', '--messages', '--json')
    assert messages.returncode == 0, messages.stderr
    assert ModelMessagesTypeAdapter.validate_json(messages.stdout) == live
    until = _cli('--journal', str(laptop), 'show', 'order-42', '--messages', '--until', '3')
    assert ModelMessagesTypeAdapter.validate_json(until.stdout) == live[:2]

    done = _cli('--journal', str(laptop), 'fork', 'order-42', 'order-42-retry', '--at', '4', '--json')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)['steps'] == 4
    assert "no execution 'nope'" in _refused(_cli('--journal', str(laptop), 'export', 'nope')).lower()

    async def replay() -> None:
        from pydantic_ai_durable import DiskJournal

        journal = DiskJournal(laptop)
        for key in ('order-42', 'from-stdin', 'order-42-retry'):
            async with execution(key, journal=journal):
                assert (await shop.agent(journal).run(f'order for {MARKER}')).output == output
        await journal.close()

    asyncio.run(replay())
    # zero calls for the two imports; the fork at step 4 runs the charge and the final answer again
    assert (shop.model_calls, shop.effects) == (3 + 1, {'reserve a': 1, 'reserve b': 1, 'charge': 2})


def test_xp4_cli_a_hostile_file_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    store = disk_store(tmp_path)
    assert store.cli is not None

    async def prepare() -> dict[str, Any]:
        journal = store.make(None)
        await _record(journal, Shop())
        await _close(journal)
        return await _exported()

    document = asyncio.run(prepare())
    before = store.raw()
    for case, make in _hostile(document).items():
        if case == 'payload of 100 MB':
            continue  # the same check as in Python; not worth 100 MB through a pipe
        made = make()
        path = tmp_path / 'hostile.json'
        path.write_bytes(made if isinstance(made, bytes) else made.encode())
        line = _refused(_cli(*store.cli, 'import', str(path)))
        assert 'Not imported' in line and '\x1b' not in line, (case, line)
    assert 'cannot read' in _refused(_cli(*store.cli, 'import', str(tmp_path / 'missing.json')))
    assert store.raw() == before


def _readme_walkthrough() -> str:
    text = (Path(__file__).resolve().parent.parent / 'README.md').read_text()
    section = text.split('## Debugging a production run', 1)[1]
    return section.split('```bash\n', 1)[1].split('```', 1)[0]


def test_xp1_the_readme_walkthrough_runs_as_written_against_a_postgresql_production_journal(tmp_path: Path) -> None:
    import psycopg

    server = server_dsn()
    database = f'production_{uuid.uuid4().hex[:12]}'
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE {database}')
    dsn = server.replace('dbname=postgres', f'dbname={database}')
    shop = Shop()

    async def record() -> None:
        journal = PostgresJournal(dsn)  # the default schema, as the README's commands expect
        await _record(journal, shop)
        await journal.close()

    asyncio.run(record())
    bin_dir = str(Path(sys.executable).parent)
    done = subprocess.run(
        ['bash', '-e', '-c', _readme_walkthrough()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, 'PROD': dsn, 'PATH': f'{bin_dir}:{os.environ["PATH"]}'},
        check=False,
    )
    assert done.returncode == 0, done.stderr

    async def check() -> None:
        journal = PostgresJournal(dsn)
        live = await recorded_messages(journal, 'order-42')
        await journal.close()
        written = ModelMessagesTypeAdapter.validate_json((tmp_path / 'order-42.messages.json').read_text())
        assert written == live and len(live) == 6
        laptop = DiskJournal(tmp_path / 'laptop')
        assert [info.key for info in await laptop.list_executions()] == ['order-42', 'order-42-fixed']
        for key in ('order-42', 'order-42-fixed'):
            async with execution(key, journal=laptop):
                await shop.agent(laptop).run(f'order for {MARKER}')
        await laptop.close()

    asyncio.run(check())
    assert shop.effects == {'reserve a': 1, 'reserve b': 1, 'charge': 2}  # the fork at 4 charged again
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE {database} WITH (FORCE)')
