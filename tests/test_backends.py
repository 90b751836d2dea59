"""The journal backend contract (J-1..J-8, B-1..B-7), one suite for every backend.

Each test runs against every factory in `conftest.BACKEND_FACTORIES` (memory and disk today); a new
backend joins by adding its factory there. Disk-only tests (directories, processes) are at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import diskcache
import pytest
from helpers import Operator, renew
from pydantic import TypeAdapter
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.usage import RequestUsage

from pydantic_ai_durable import JournalUnavailable, LeaseLost
from pydantic_ai_durable._runtime import end_holding, new_holder, start_holding
from pydantic_ai_durable.journals import DiskJournal, ExecutionInfo, Journal, Lease, LeaseRenewal, RunSnapshot
from pydantic_ai_durable.journals._common import execution_id

pytestmark = pytest.mark.once  # the backends' own contract, whatever the pydantic-ai release

if TYPE_CHECKING:
    from conftest import BackendCase

KEY = 'order-42'


def entry(
    payload: Any, name: str = 'agent__model.request', kind: str = 'model', fingerprint: str | None = 'fp'
) -> dict[str, Any]:
    return {'v': 1, 'name': name, 'kind': kind, 'fingerprint': fingerprint, 'payload': payload}


async def only_info(journal: Journal, key: str = KEY) -> ExecutionInfo:
    infos = [info for info in await journal.list_executions() if info.key == key]
    assert len(infos) == 1, infos
    return infos[0]


@pytest.fixture
def backend_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Shift `time.time()` forward by `clock[0]` seconds, to age executions without sleeping."""
    real_time = time.time
    offset = [0.0]
    monkeypatch.setattr(time, 'time', lambda: real_time() + offset[0])
    return offset


# -- B-1: the protocol, reads and writes ---------------------------------------------------------


async def test_b1_backend_satisfies_the_journal_protocol(backend_journal: Journal) -> None:
    assert isinstance(backend_journal, Journal)
    assert await backend_journal.read_run(KEY, '0') == RunSnapshot()
    assert await backend_journal.read_execution(KEY) is None
    assert await backend_journal.list_executions() == []


async def test_b1_read_run_returns_every_entry_and_record_in_one_call(backend_store: Journal) -> None:
    j = backend_store
    for position in (0, 1, 2):
        assert await j.write_entry(KEY, '0', position, entry({'n': position}, name=f's{position}')) is True
    assert await j.write_record(KEY, '0', 'meta', {'v': 1, 'diverge_from': None, 'high_water': 3}) is True
    assert await j.write_record(KEY, '0', 'usage', {'v': 1, 'requests': 2}) is True
    assert await j.write_entry(KEY, '1', 0, entry('other run')) is True
    assert await j.write_entry(KEY, '0.1.1', 5, entry('nested run')) is True

    snapshot = await j.read_run(KEY, '0')

    assert snapshot.entries == {p: entry({'n': p}, name=f's{p}') for p in (0, 1, 2)}
    assert snapshot.records == {
        'meta': {'v': 1, 'diverge_from': None, 'high_water': 3},
        'usage': {'v': 1, 'requests': 2},
    }
    assert await j.read_run(KEY, '1') == RunSnapshot(entries={0: entry('other run')})
    assert await j.read_run(KEY, '0.1.1') == RunSnapshot(entries={5: entry('nested run')})
    assert await j.read_run(KEY, '2') == RunSnapshot()
    assert await j.read_run('another key', '0') == RunSnapshot()


async def test_b1_write_entry_replaces_what_was_at_its_position(backend_store: Journal) -> None:
    j = backend_store
    await j.write_entry(KEY, '0', 0, entry('old', name='old_step'))
    await j.write_entry(KEY, '0', 1, entry('kept'))
    assert await j.write_entry(KEY, '0', 0, entry('new', name='new_step')) is True
    assert await j.write_record(KEY, '0', 'meta', {'v': 1, 'high_water': 1}) is True
    assert await j.write_record(KEY, '0', 'meta', {'v': 1, 'high_water': 7}) is True

    snapshot = await j.read_run(KEY, '0')

    assert snapshot.entries == {0: entry('new', name='new_step'), 1: entry('kept')}
    assert snapshot.records == {'meta': {'v': 1, 'high_water': 7}}


async def test_b1_execution_record_is_read_and_replaced(backend_store: Journal) -> None:
    j = backend_store
    assert await j.read_execution(KEY) is None
    assert await j.write_execution(KEY, {'v': 1, 'runs': ['0'], 'status': 'running'}) is True
    assert await j.read_execution(KEY) == {'v': 1, 'runs': ['0'], 'status': 'running'}
    assert await j.write_execution(KEY, {'v': 1, 'runs': ['0', '1'], 'status': 'finished'}) is True
    assert await j.read_execution(KEY) == {'v': 1, 'runs': ['0', '1'], 'status': 'finished'}
    assert await j.read_run(KEY, '0') == RunSnapshot()  # the execution record is not a run
    assert await j.read_execution('another key') is None


# -- J-5: JSON round trip, fresh copies ----------------------------------------------------------


async def test_j5_values_come_back_as_their_json_round_trip(backend_store: Journal) -> None:
    j = backend_store
    payload = {'rows': (1, (2, 'x')), 'by_id': {1: 'one', 2: {3: 'three'}}, 'big': 2**70, 'f': 0.1, 'none': None}
    expected = {'rows': [1, [2, 'x']], 'by_id': {'1': 'one', '2': {'3': 'three'}}, 'big': 2**70, 'f': 0.1, 'none': None}
    await j.write_entry(KEY, '0', 0, entry(payload))
    await j.write_record(KEY, '0', 'usage', {'v': 1, 'pair': (1, 2), 'ids': {7: True}})
    await j.write_execution(KEY, {'v': 1, 'runs': ('0',), 'n': {1: 1}})

    snapshot = await j.read_run(KEY, '0')

    assert snapshot.entries[0]['payload'] == expected
    assert snapshot.records['usage'] == {'v': 1, 'pair': [1, 2], 'ids': {'7': True}}
    assert await j.read_execution(KEY) == {'v': 1, 'runs': ['0'], 'n': {'1': 1}}


async def test_j5_every_read_is_a_fresh_copy(backend_store: Journal) -> None:
    j = backend_store
    written = entry({'items': ['a'], 'nested': {'k': 'v'}})
    await j.write_entry(KEY, '0', 0, written)
    await j.write_record(KEY, '0', 'meta', {'v': 1, 'list': [1]})
    await j.write_execution(KEY, {'v': 1, 'runs': ['0']})
    written['payload']['items'].append('mutated after write')

    first = await j.read_run(KEY, '0')
    first.entries[0]['payload']['items'].append('mutated after read')
    first.entries[0]['payload']['nested']['k'] = 'changed'
    first.records['meta']['list'].append(2)
    record = await j.read_execution(KEY)
    assert record is not None
    record['runs'].append('1')

    second = await j.read_run(KEY, '0')
    assert second.entries[0]['payload'] == {'items': ['a'], 'nested': {'k': 'v'}}
    assert second.records['meta'] == {'v': 1, 'list': [1]}
    assert await j.read_execution(KEY) == {'v': 1, 'runs': ['0']}
    assert second.entries[0] is not first.entries[0]


async def test_j5_strings_round_trip_exactly(backend_store: Journal) -> None:
    j = backend_store
    text = 'NUL\x00 tab\t quote" backslash\\ emoji 🙂 rtl שלום cjk 漢字 \u2028'
    assert await j.write_entry(KEY, '0', 0, entry({text: text})) is True
    assert (await j.read_run(KEY, '0')).entries[0]['payload'] == {text: text}
    # A lone surrogate is not valid Unicode: a backend may refuse it, but must never alter it.
    lone = 'half \ud800 pair'
    if await j.write_entry(KEY, '0', 1, entry(lone)):
        assert (await j.read_run(KEY, '0')).entries[1]['payload'] == lone
    else:
        assert 1 not in (await j.read_run(KEY, '0')).entries


async def test_decimal_cost_survives_the_round_trip(backend_case: BackendCase) -> None:
    adapter = TypeAdapter(ModelResponse)
    cost = Decimal('0.000123456789012345678901234567')
    response = ModelResponse(
        parts=[TextPart('answer')],
        usage=RequestUsage(input_tokens=100, output_tokens=10, cost=cost),
        model_name='priced-model',
    )
    payload = adapter.dump_python(response, mode='json')
    assert payload['usage']['cost'] == str(cost)  # stored as JSON text, not a lossy float
    await Operator(backend_case.journal).write_entry(KEY, '0', 0, entry(payload))

    stored = (await backend_case.reopen().read_run(KEY, '0')).entries[0]['payload']
    loaded = adapter.validate_python(stored)

    assert isinstance(loaded.usage.cost, Decimal)
    assert loaded.usage.cost == cost
    assert loaded == response


# -- J-2: unstorable values ----------------------------------------------------------------------


def _circular() -> dict[str, Any]:
    value: dict[str, Any] = {'a': 1}
    value['self'] = value
    return value


UNSTORABLE = {
    'object': lambda: object(),
    'circular_dict': _circular,
    'set': lambda: {1, 2},
    'bytes': lambda: b'raw',
    'tuple_key': lambda: {(1, 2): 'x'},
    'nested_object': lambda: {'ok': [1, {'deep': object()}]},
}


@pytest.mark.parametrize('make', UNSTORABLE.values(), ids=UNSTORABLE.keys())
async def test_j2_unstorable_entry_is_refused_and_earlier_entries_stay(backend_store: Journal, make: Any) -> None:
    j = backend_store
    await j.write_entry(KEY, '0', 0, entry('first'))
    await j.write_entry(KEY, '0', 1, entry('second'))

    assert await j.write_entry(KEY, '0', 1, entry(make())) is False  # over an existing entry
    assert await j.write_entry(KEY, '0', 2, entry(make())) is False  # at a new position

    snapshot = await j.read_run(KEY, '0')
    assert snapshot.entries == {0: entry('first'), 1: entry('second')}
    assert (await only_info(j)).steps == 2


@pytest.mark.parametrize('make', UNSTORABLE.values(), ids=UNSTORABLE.keys())
async def test_j2_unstorable_record_and_execution_are_refused(backend_store: Journal, make: Any) -> None:
    j = backend_store
    await j.write_record(KEY, '0', 'meta', {'v': 1, 'high_water': 1})
    await j.write_execution(KEY, {'v': 1, 'runs': ['0']})

    assert await j.write_record(KEY, '0', 'meta', {'v': 1, 'bad': make()}) is False
    assert await j.write_record(KEY, '0', 'usage', {'v': 1, 'bad': make()}) is False
    assert await j.write_execution(KEY, {'v': 1, 'bad': make()}) is False

    assert (await j.read_run(KEY, '0')).records == {'meta': {'v': 1, 'high_water': 1}}
    assert await j.read_execution(KEY) == {'v': 1, 'runs': ['0']}


async def test_j2_unstorable_value_for_a_new_execution_leaves_nothing(backend_store: Journal) -> None:
    j = backend_store
    assert await j.write_entry(KEY, '0', 0, entry(object())) is False
    assert await j.write_execution(KEY, {'v': 1, 'bad': object()}) is False
    assert await j.read_run(KEY, '0') == RunSnapshot()
    assert await j.read_execution(KEY) is None
    assert await j.list_executions() == []


# -- J-3: garbage in the store reads as absent ---------------------------------------------------

GARBAGE = {
    'not_json': 'not json {',
    'empty': '',
    'json_list': '[1, 2]',
    'json_string': '"text"',
    'json_number': '42',
    'json_null': 'null',
}


@pytest.mark.parametrize('raw', GARBAGE.values(), ids=GARBAGE.keys())
async def test_j3_garbage_entry_reads_as_absent(backend_case: BackendCase, raw: str) -> None:
    j = Operator(backend_case.journal)
    await j.write_entry(KEY, '0', 0, entry('good'))
    await j.write_entry(KEY, '0', 1, entry('to be corrupted'))
    backend_case.put_raw(('entry', KEY, '0', 1), raw)

    snapshot = await j.read_run(KEY, '0')

    assert not isinstance(snapshot.entries.get(1), dict)
    assert snapshot.entries[0] == entry('good')
    assert (await only_info(j)).key == KEY  # listing does not trip over it either


def unreadable_record(record: object) -> bool:
    """How a stored execution record that does not decode reads back: absent, or of no known version (B-3)."""
    return record is None or (isinstance(record, dict) and record.get('v') != 1)


@pytest.mark.parametrize('raw', GARBAGE.values(), ids=GARBAGE.keys())
async def test_j3_garbage_record_and_execution_read_as_absent(backend_case: BackendCase, raw: str) -> None:
    j = Operator(backend_case.journal)
    await j.write_record(KEY, '0', 'meta', {'v': 1, 'diverge_from': 0})
    await j.write_record(KEY, '0', 'usage', {'v': 1, 'requests': 1})
    await j.write_execution(KEY, {'v': 1, 'runs': ['0']})
    backend_case.put_raw(('record', KEY, '0', 'meta'), raw)
    backend_case.put_raw(('execution', KEY), raw)

    snapshot = await j.read_run(KEY, '0')

    assert not isinstance(snapshot.records.get('meta'), dict)
    assert snapshot.records['usage'] == {'v': 1, 'requests': 1}
    assert unreadable_record(await j.read_execution(KEY))
    assert (await only_info(j)).state == 'interrupted'


# -- deleting ------------------------------------------------------------------------------------


async def test_j7_delete_run_removes_only_that_run(backend_store: Journal) -> None:
    j = backend_store
    for run in ('0', '0.1.1', '1'):
        await j.write_entry(KEY, run, 0, entry(run))
        await j.write_entry(KEY, run, 9, entry(run))
        await j.write_record(KEY, run, 'meta', {'v': 1, 'run': run})
    await j.write_entry('other', '0', 0, entry('other execution'))
    await j.write_execution(KEY, {'v': 1, 'runs': ['0', '0.1.1', '1']})

    await j.delete_run(KEY, '0')

    assert await j.read_run(KEY, '0') == RunSnapshot()
    assert (await j.read_run(KEY, '0.1.1')).entries == {0: entry('0.1.1'), 9: entry('0.1.1')}
    assert (await j.read_run(KEY, '1')).records == {'meta': {'v': 1, 'run': '1'}}
    assert await j.read_execution(KEY) == {'v': 1, 'runs': ['0', '0.1.1', '1']}
    assert (await j.read_run('other', '0')).entries == {0: entry('other execution')}
    assert (await only_info(j)).steps == 4
    # a later write to the deleted run starts from nothing: no old entry resurfaces
    await j.write_entry(KEY, '0', 3, entry('again'))
    assert (await j.read_run(KEY, '0')).entries == {3: entry('again')}


async def test_j4_deleting_absent_things_is_a_noop(backend_store: Journal, backend_journal: Journal) -> None:
    j = backend_store
    await j.delete_run('never written', '0')
    await j.delete_execution('never written')
    await j.write_entry(KEY, '0', 0, entry('x'))
    await j.delete_run(KEY, '7')
    await backend_journal.release_lease(KEY, 'nobody', 1)
    assert (await j.read_run(KEY, '0')).entries == {0: entry('x')}


async def test_c2_delete_execution_leaves_nothing(backend_journal: Journal) -> None:
    j = backend_journal
    lease = await j.acquire_lease(KEY, 'holder-a', 60)
    for run in ('0', '0.3.1', '1'):
        await j.write_entry(KEY, run, 0, entry(run), epoch=lease.epoch)
        await j.write_entry(KEY, run, 4, entry(run), epoch=lease.epoch)
        await j.write_record(KEY, run, 'meta', {'v': 1}, epoch=lease.epoch)
    await j.write_execution(KEY, {'v': 1, 'runs': ['0', '0.3.1', '1']}, epoch=lease.epoch)
    await Operator(j).write_entry('neighbour', '0', 0, entry('stays'))

    await j.delete_execution(KEY, epoch=lease.epoch)

    for run in ('0', '0.3.1', '1'):
        assert await j.read_run(KEY, run) == RunSnapshot()
    assert await j.read_execution(KEY) is None
    assert [info.key for info in await j.list_executions()] == ['neighbour']
    taken = await j.acquire_lease(KEY, 'holder-b', 60)  # the lease went too
    assert taken.holder == 'holder-b'
    assert taken.epoch > lease.epoch  # and its epoch is never handed out again
    await j.release_lease(KEY, 'holder-b', taken.epoch)
    await Operator(j).delete_execution('neighbour')
    assert await j.list_executions() == []


# -- B-6: listing and retention ------------------------------------------------------------------


async def test_b6_list_executions_reports_key_runs_steps_bytes_and_update(backend_store: Journal) -> None:
    j = backend_store
    before = time.time()
    await j.write_execution('a', {'v': 1, 'runs': ['0', '1'], 'status': 'finished'})
    for position in range(3):
        await j.write_entry('a', '0', position, entry('x' * 100))
    await j.write_entry('a', '1', 0, entry('y'))
    await j.write_record('a', '1', 'meta', {'v': 1})
    await j.write_entry('b', '0', 0, entry('z'))
    after = time.time()

    infos = await j.list_executions()

    assert [info.key for info in infos] == ['a', 'b']
    a, b = infos
    assert (a.runs, a.steps, b.runs, b.steps) == (2, 4, 1, 1)
    assert a.bytes > 300 and b.bytes > 0
    assert a.bytes > b.bytes
    assert before - 1 <= a.updated <= after + 1
    assert before - 1 <= b.updated <= after + 1
    await j.write_entry('b', '0', 1, entry('more' * 50))
    assert (await only_info(j, 'b')).bytes > b.bytes


@pytest.mark.parametrize(
    ('record_status', 'leased', 'expected'),
    [
        ('running', True, 'running'),
        ('finished', True, 'running'),
        ('running', 'expired', 'interrupted'),  # an expired lease is no proof of life
        ('running', False, 'interrupted'),  # its attempt died without saying so
        ('failed', False, 'failed'),
        ('finished', False, 'finished'),
    ],
)
async def test_b6_fn3_list_executions_state(
    backend_journal: Journal, record_status: str, leased: bool | str, expected: str
) -> None:
    j = backend_journal
    await Operator(j).write_execution(KEY, {'v': 1, 'runs': [], 'status': record_status})
    if leased:
        assert (await j.acquire_lease(KEY, 'holder', 0.05 if leased == 'expired' else 60)).holder == 'holder'
        time.sleep(0.1 if leased == 'expired' else 0)
    assert (await only_info(j)).state == expected


async def test_b6_b13_prune_deletes_old_unleased_executions_only(backend_journal: Journal) -> None:
    j, operator = backend_journal, Operator(backend_journal)
    await operator.write_entry('old', '0', 0, entry('old'))
    await operator.write_execution('old', {'v': 1, 'status': 'finished'})
    await operator.write_entry('old-but-leased', '0', 0, entry('leased'))
    assert (await j.acquire_lease('old-but-leased', 'live-holder', 100_000)).holder == 'live-holder'
    await operator.write_entry('old-lease-expired', '0', 0, entry('expired'))
    assert (await j.acquire_lease('old-lease-expired', 'dead-holder', 0.05)).holder == 'dead-holder'
    time.sleep(1.2)  # the store's own clock ages them: no client clock is consulted (B-11)
    await operator.write_entry('recent', '0', 0, entry('recent'))

    pruned = await j.prune(older_than=0.6, states=('finished', 'interrupted'))

    assert sorted(pruned) == ['old', 'old-lease-expired']
    assert [info.key for info in await j.list_executions()] == ['old-but-leased', 'recent']
    assert await j.read_run('old', '0') == RunSnapshot()
    assert await j.read_execution('old') is None
    assert (await j.read_run('old-but-leased', '0')).entries == {0: entry('leased')}
    assert (await j.read_run('recent', '0')).entries == {0: entry('recent')}


async def test_b13_prune_never_deletes_a_live_lease_whatever_the_client_clock_says(
    backend_journal: Journal, backend_clock: list[float]
) -> None:
    j = backend_journal
    lease = await j.acquire_lease(KEY, 'running-attempt', 30)
    assert await j.write_entry(KEY, '0', 0, entry('in progress'), epoch=lease.epoch)
    backend_clock[0] = 2 * 86400.0  # this host's wall clock jumps two days ahead

    assert await j.prune(older_than=86400) == []
    assert (await j.read_run(KEY, '0')).entries == {0: entry('in progress')}
    assert (await only_info(j)).state == 'running'
    assert await j.write_entry(KEY, '0', 1, entry('still its own'), epoch=lease.epoch)


async def test_b6_prune_keeps_executions_touched_recently(backend_store: Journal) -> None:
    j = backend_store
    await j.write_entry('k', '0', 0, entry('first'))
    time.sleep(2.1)  # a disk journal stamps an execution's update time at most every 2 s
    await j.write_entry('k', '0', 1, entry('touched later'))  # any write refreshes the execution
    assert await j.prune(older_than=2.0, states=('interrupted',)) == []
    assert (await j.read_run('k', '0')).entries == {0: entry('first'), 1: entry('touched later')}
    time.sleep(2.1)
    assert await j.prune(older_than=2.0, states=('interrupted',)) == ['k']
    assert await j.list_executions() == []


# -- B-5, B-9: leases and fencing -----------------------------------------------------------------


async def test_b5_lease_refuses_another_holder_while_live(backend_journal: Journal) -> None:
    j = backend_journal
    before = time.time()
    mine = await j.acquire_lease(KEY, 'A', 30)
    assert mine.holder == 'A'

    held = await j.acquire_lease(KEY, 'B', 30)

    assert isinstance(held, Lease)
    assert (held.holder, held.epoch) == ('A', mine.epoch)
    assert before + 29 <= held.expires_at <= time.time() + 31
    renewed = await renew(j, KEY, 'B', mine.epoch, 30)
    assert renewed is not None and renewed.holder == 'A'  # B renews nothing
    assert (await j.acquire_lease('another key', 'B', 30)).holder == 'B'  # leases are per execution


async def test_b9_every_acquisition_takes_a_new_epoch_never_reused(backend_journal: Journal) -> None:
    j = backend_journal
    first = await j.acquire_lease(KEY, 'A', 0.05)
    again = await j.acquire_lease(KEY, 'A', 0.05)  # the holder itself, again
    other = await j.acquire_lease('other key', 'A', 60)
    time.sleep(0.1)
    taken = await j.acquire_lease(KEY, 'B', 60)
    assert first.epoch < again.epoch < other.epoch < taken.epoch
    await j.delete_execution(KEY, epoch=taken.epoch)
    fresh = await j.acquire_lease(KEY, 'C', 60)  # the execution is gone, its epochs are not reused
    assert fresh.epoch > taken.epoch


async def test_b9_a_write_with_a_stale_epoch_stores_nothing_and_raises_lease_lost(backend_journal: Journal) -> None:
    j = backend_journal
    stale = await j.acquire_lease(KEY, 'A', 0.05)
    assert await j.write_entry(KEY, '0', 0, entry('A wrote this'), epoch=stale.epoch)
    time.sleep(0.1)
    current = await j.acquire_lease(KEY, 'B', 60)
    assert await j.write_entry(KEY, '0', 0, entry('B wrote this'), epoch=current.epoch)
    assert await j.write_execution(KEY, {'v': 1, 'attempts': 2}, epoch=current.epoch)

    writes = [
        j.write_entry(KEY, '0', 0, entry('A again'), epoch=stale.epoch),
        j.write_entry(KEY, '0', 5, entry('A, new position'), epoch=stale.epoch),
        j.write_record(KEY, '0', 'meta', {'v': 1}, epoch=stale.epoch),
        j.write_execution(KEY, {'v': 1, 'attempts': 1}, epoch=stale.epoch),
        j.delete_run(KEY, '0', epoch=stale.epoch),
        j.delete_execution(KEY, epoch=stale.epoch),
    ]
    for write in writes:
        with pytest.raises(LeaseLost) as lost:
            await write
        assert lost.value.holder == 'B'
        assert 'B' in str(lost.value)

    assert await j.read_run(KEY, '0') == RunSnapshot(entries={0: entry('B wrote this')})
    assert await j.read_execution(KEY) == {'v': 1, 'attempts': 2}


async def test_b9_a_write_without_the_lease_is_refused(backend_journal: Journal) -> None:
    j = backend_journal
    with pytest.raises(LeaseLost) as never:
        await j.write_entry(KEY, '0', 0, entry('no lease taken'), epoch=1)
    assert never.value.holder is None
    lease = await j.acquire_lease(KEY, 'A', 60)
    assert await j.write_entry(KEY, '0', 0, entry('leased'), epoch=lease.epoch)
    await j.release_lease(KEY, 'A', lease.epoch)
    with pytest.raises(LeaseLost):  # given back: the epoch no longer writes
        await j.write_entry(KEY, '0', 1, entry('after release'), epoch=lease.epoch)
    assert (await j.read_run(KEY, '0')).entries == {0: entry('leased')}


async def test_b5_expired_lease_is_taken_over(backend_journal: Journal) -> None:
    j = backend_journal
    first = await j.acquire_lease(KEY, 'A', 0.05)
    time.sleep(0.1)

    assert (await j.acquire_lease(KEY, 'B', 30)).holder == 'B'

    held = await j.acquire_lease(KEY, 'A', 30)
    assert held.holder == 'B'
    renewed = await renew(j, KEY, 'A', first.epoch, 30)
    assert renewed is not None and renewed.holder == 'B'  # A lost it


async def test_cc2_renew_leases_renews_many_in_one_call_and_answers_each_in_order(backend_journal: Journal) -> None:
    j = backend_journal
    mine = await j.acquire_lease('one', 'A', 1)
    taken = await j.acquire_lease('two', 'A', 0.05)
    time.sleep(0.1)
    other = await j.acquire_lease('two', 'B', 60)
    third = await j.acquire_lease('three', 'A', 1)

    answers = await j.renew_leases(
        [
            LeaseRenewal('one', 'A', mine.epoch, 600),
            LeaseRenewal('two', 'A', taken.epoch, 600),  # B took it over: B's lease comes back, unchanged
            LeaseRenewal('none', 'A', 1, 600),  # nothing held: None
            LeaseRenewal('three', 'A', third.epoch, 600),
        ]
    )

    one, two, none, three = answers
    assert one is not None and (one.holder, one.epoch) == ('A', mine.epoch) and one.expires_at > time.time() + 500
    assert two is not None and (two.holder, two.epoch) == ('B', other.epoch) and two.expires_at < time.time() + 61
    assert none is None
    assert three is not None and three.holder == 'A' and three.expires_at > time.time() + 500
    assert (await j.acquire_lease('one', 'X', 1)).holder == 'A'  # renewed: still held after its first TTL
    assert await j.renew_leases([]) == []


async def test_b13_force_takes_a_live_lease_under_a_new_epoch(backend_journal: Journal) -> None:
    j = backend_journal
    first = await j.acquire_lease(KEY, 'A', 60)
    assert (await j.acquire_lease(KEY, 'B', 60)).holder == 'A'

    forced = await j.acquire_lease(KEY, 'B', 60, force=True)

    assert forced.holder == 'B' and forced.epoch > first.epoch
    with pytest.raises(LeaseLost):
        await j.write_entry(KEY, '0', 0, entry('A after the force'), epoch=first.epoch)
    assert (await j.acquire_lease(KEY, 'C', 60)).holder == 'B'


async def test_b12_a_holder_of_this_process_that_ended_is_taken_over_at_once(backend_journal: Journal) -> None:
    j = backend_journal
    ended, running = new_holder(), new_holder()
    start_holding(running)
    try:
        assert (await j.acquire_lease(KEY, ended, 60)).holder == ended  # never marked running: it ended
        assert (await j.acquire_lease('other', running, 60)).holder == running

        assert (await j.acquire_lease(KEY, new_holder(), 60)).holder != ended  # taken at once
        assert (await j.acquire_lease('other', new_holder(), 60)).holder == running  # a live one is respected
    finally:
        end_holding(running)


async def test_b5_renew_extends_only_the_holders_lease(backend_journal: Journal) -> None:
    j = backend_journal
    assert await renew(j, KEY, 'A', 1, 30) is None  # nothing to renew
    mine = await j.acquire_lease(KEY, 'A', 1)
    first = await j.acquire_lease(KEY, 'X', 1)

    wrong_epoch = await renew(j, KEY, 'A', mine.epoch + 1000, 1000)
    assert wrong_epoch is not None and wrong_epoch.expires_at < first.expires_at + 1
    renewed = await renew(j, KEY, 'A', mine.epoch, 1000)

    assert renewed is not None and (renewed.holder, renewed.epoch) == ('A', mine.epoch)
    held = await j.acquire_lease(KEY, 'X', 1)
    assert held.holder == 'A'
    assert held.expires_at >= first.expires_at + 900


async def test_b5_release_frees_only_the_holders_lease_and_keeps_data(backend_journal: Journal) -> None:
    j = backend_journal
    await Operator(j).write_entry(KEY, '0', 0, entry('kept'))
    await Operator(j).write_execution(KEY, {'v': 1, 'status': 'finished'})
    a = await j.acquire_lease(KEY, 'A', 60)

    await j.release_lease(KEY, 'B', a.epoch)  # not the holder: no effect
    await j.release_lease(KEY, 'A', a.epoch + 1)  # not its epoch: no effect
    assert (await j.acquire_lease(KEY, 'B', 60)).holder == 'A'

    await j.release_lease(KEY, 'A', a.epoch)
    assert await renew(j, KEY, 'A', a.epoch, 60) is None
    assert (await j.read_run(KEY, '0')).entries == {0: entry('kept')}
    assert (await only_info(j)).state == 'finished'
    b = await j.acquire_lease(KEY, 'B', 60)
    assert b.holder == 'B'
    await j.release_lease(KEY, 'A', a.epoch)  # released twice: no effect on B
    assert (await j.acquire_lease(KEY, 'C', 60)).holder == 'B'


async def test_b5_a_lease_alone_is_not_an_execution(backend_journal: Journal) -> None:
    j = backend_journal
    lease = await j.acquire_lease(KEY, 'A', 60)
    assert await j.list_executions() == []  # held, but nothing stored yet
    assert await j.prune(older_than=0) == []
    await j.release_lease(KEY, 'A', lease.epoch)
    assert await j.list_executions() == []
    assert await j.read_execution(KEY) is None


# -- J-6 / B-4: key namespacing ------------------------------------------------------------------

TEN_KB = 'k' * 10_240
KEY_PAIRS = {
    'underscore_join': ('etl/load_data', 'etl_load/data'),
    'colon_join': ('etl:load_data', 'etl_load:data'),
    'nul_join': ('etl\x00load_data', 'etl_load\x00data'),
    'plain_vs_slash': ('etl_load_data', 'etl/load/data'),
    'looks_like_layout': ('a/h', 'a'),
    'looks_like_entry_key': ('x/e/0/0', 'x'),
    'trailing_nul': ('a', 'a\x00'),
    'unicode_nfc_nfd': ('café', 'cafe\u0301'),
    'unicode_suffix': ('ключ', 'ключ/'),
    'ten_kb_prefix': (TEN_KB, TEN_KB + '/'),
    'ten_kb_last_char': (TEN_KB + 'a', TEN_KB + 'b'),
}


@pytest.mark.parametrize(('first', 'second'), KEY_PAIRS.values(), ids=KEY_PAIRS.keys())
async def test_j6_b4_keys_never_alias(backend_case: BackendCase, first: str, second: str) -> None:
    j = Operator(backend_case.journal)
    for key in (first, second):
        assert await j.write_entry(key, '0', 0, entry(key)) is True
        assert await j.write_record(key, '0', 'meta', {'v': 1, 'key': key}) is True
        assert await j.write_execution(key, {'v': 1, 'key': key}) is True
    assert await j.write_entry(first, '0', 1, entry('only in first')) is True

    reader = backend_case.reopen()
    assert (await reader.read_run(first, '0')).entries == {0: entry(first), 1: entry('only in first')}
    assert await reader.read_run(second, '0') == RunSnapshot(
        entries={0: entry(second)}, records={'meta': {'v': 1, 'key': second}}
    )
    assert await reader.read_execution(first) == {'v': 1, 'key': first}
    assert await reader.read_execution(second) == {'v': 1, 'key': second}
    infos = {info.key: info for info in await reader.list_executions()}
    assert set(infos) == {first, second}  # keys come back exactly, however long or odd
    assert (infos[first].steps, infos[second].steps) == (2, 1)

    raw = backend_case.journal
    one, two = await raw.acquire_lease(first, 'holder-1', 60), await raw.acquire_lease(second, 'holder-2', 60)
    assert (one.holder, two.holder) == ('holder-1', 'holder-2')  # independent leases
    await raw.delete_run(second, '0', epoch=two.epoch)
    assert (await j.read_run(first, '0')).entries == {0: entry(first), 1: entry('only in first')}
    with pytest.raises(LeaseLost):  # one execution's epoch never writes another's
        await raw.delete_execution(first, epoch=two.epoch)
    await raw.delete_execution(first, epoch=one.epoch)
    assert await j.read_execution(second) == {'v': 1, 'key': second}
    assert (await raw.acquire_lease(second, 'intruder', 60)).holder == 'holder-2'


async def test_j8_second_journal_object_reads_and_writes_what_the_first_wrote(backend_case: BackendCase) -> None:
    first = backend_case.journal
    lease = await first.acquire_lease(KEY, 'first', 60)
    await first.write_entry(KEY, '0', 0, entry({'answer': 42}), epoch=lease.epoch)
    await first.write_record(KEY, '0', 'meta', {'v': 1, 'high_water': 1}, epoch=lease.epoch)
    await first.write_execution(KEY, {'v': 1, 'runs': ['0']}, epoch=lease.epoch)

    second = backend_case.reopen()  # a new object over the same store, used without open()
    assert await second.read_run(KEY, '0') == RunSnapshot(
        entries={0: entry({'answer': 42})}, records={'meta': {'v': 1, 'high_water': 1}}
    )
    assert await second.read_execution(KEY) == {'v': 1, 'runs': ['0']}
    held = await second.acquire_lease(KEY, 'second', 60)
    assert held.holder == 'first'
    await second.write_entry(
        KEY, '0', 1, entry('from the second object'), epoch=lease.epoch
    )  # the lease is the store's
    assert (await first.read_run(KEY, '0')).entries[1] == entry('from the second object')


# -- Disk only: directories, processes, bad environments (J-8, B-2, B-7) -------------------------


CHILD = """
import asyncio, json, sys
from pydantic_ai_durable.journals import DiskJournal

async def main():
    journal = DiskJournal(sys.argv[1])
    await journal.open()
    snapshot = await journal.read_run(sys.argv[2], '0')
    lease = await journal.acquire_lease(sys.argv[2], 'child', 60)
    epoch = int(sys.argv[3])  # the parent's lease: the store, not the process, decides who may write
    await journal.write_entry(sys.argv[2], '0', 1, {'v': 1, 'name': 'child', 'kind': 'tool', 'fingerprint': None,
                                                     'payload': 'written by the child'}, epoch=epoch)
    print(json.dumps({'entries': {str(k): v for k, v in snapshot.entries.items()}, 'records': snapshot.records,
                      'execution': await journal.read_execution(sys.argv[2]),
                      'lease_holder': lease.holder}))
    await journal.close()

asyncio.run(main())
"""


async def test_j8_another_process_reads_and_writes_the_same_directory(tmp_path: Path) -> None:
    path = tmp_path / 'j'
    journal = DiskJournal(path)
    await journal.open()
    key = 'proc/key:\u00e9'
    lease = await journal.acquire_lease(key, 'parent', 60)
    await journal.write_entry(key, '0', 0, entry({'rows': (1, 2)}), epoch=lease.epoch)
    await journal.write_record(key, '0', 'meta', {'v': 1, 'diverge_from': None}, epoch=lease.epoch)
    await journal.write_execution(key, {'v': 1, 'runs': ['0']}, epoch=lease.epoch)

    child = subprocess.run(
        [sys.executable, '-c', CHILD, str(path), key, str(lease.epoch)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert child.returncode == 0, child.stderr
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert seen == {
        'entries': {'0': entry({'rows': [1, 2]})},
        'records': {'meta': {'v': 1, 'diverge_from': None}},
        'execution': {'v': 1, 'runs': ['0']},
        'lease_holder': 'parent',
    }
    assert (await journal.read_run(key, '0')).entries[1]['payload'] == 'written by the child'
    await journal.close()


async def test_j8_disk_store_never_evicts_and_keeps_values_inside_sqlite(tmp_path: Path) -> None:
    path = tmp_path / 'j'
    journal = DiskJournal(path)
    await journal.open()
    big = 'x' * 300_000
    assert await Operator(journal).write_entry(KEY, '0', 0, entry(big)) is True
    await journal.close()

    with diskcache.Cache(str(path)) as cache:  # settings persist in the directory
        assert cache.eviction_policy == 'none'
        assert cache.cull_limit == 0  # no expiry query on every write: nothing here ever expires
        assert cache.get(f'{execution_id(KEY)}/e/0/0') is not None
    side_files = [p for p in path.rglob('*') if p.is_file() and not p.name.startswith(('cache.db', 'journal-id'))]
    assert side_files == []  # diskcache never fsyncs side files (B-2)
    reopened = DiskJournal(path)
    assert (await reopened.read_run(KEY, '0')).entries[0]['payload'] == big
    await reopened.close()


FOREIGN = {'int': 12345, 'pickled_dict': {'v': 1, 'name': 'n', 'kind': 'tool', 'payload': 1}, 'bytes': b'\xff\xfe'}


@pytest.mark.parametrize('raw', FOREIGN.values(), ids=FOREIGN.keys())
async def test_j3_disk_value_of_a_foreign_type_reads_as_absent(tmp_path: Path, raw: object) -> None:
    path = tmp_path / 'j'
    journal = DiskJournal(path)
    await journal.open()
    await Operator(journal).write_entry(KEY, '0', 0, entry('good'))
    await Operator(journal).write_entry(KEY, '0', 1, entry('replaced by a foreign value'))
    await Operator(journal).write_execution(KEY, {'v': 1})
    with diskcache.Cache(str(path)) as cache:
        cache.set(f'{execution_id(KEY)}/e/0/1', raw)
        cache.set(f'{execution_id(KEY)}/x', raw)

    snapshot = await journal.read_run(KEY, '0')

    assert not isinstance(snapshot.entries.get(1), dict) or snapshot.entries[1] == raw
    assert snapshot.entries[0] == entry('good')
    assert unreadable_record(await journal.read_execution(KEY))
    await journal.close()


async def test_b6_disk_listing_survives_a_foreign_typed_value(tmp_path: Path) -> None:
    path = tmp_path / 'j'
    journal = DiskJournal(path)
    await journal.open()
    await Operator(journal).write_entry(KEY, '0', 0, entry('good'))
    with diskcache.Cache(str(path)) as cache:
        cache.set(f'{execution_id(KEY)}/e/0/0', 12345)
        cache.set(f'{execution_id(KEY)}/x', 12345.5)
    try:
        assert [info.key for info in await journal.list_executions()] == [KEY]
    finally:
        await journal.close()


async def test_c1_disk_unreadable_head_does_not_orphan_entries(tmp_path: Path) -> None:
    path = tmp_path / 'j'
    journal = DiskJournal(path)
    await journal.open()
    for position in range(3):
        await Operator(journal).write_entry(KEY, '0', position, entry(position))
    eid = execution_id(KEY)
    with diskcache.Cache(str(path)) as cache:
        cache.set(f'{eid}/h', 'written by another release')

    await Operator(journal).delete_execution(KEY)
    await journal.close()

    with diskcache.Cache(str(path)) as cache:
        left = [item for item in cache.iterkeys() if isinstance(item, str) and item.startswith(eid)]
    assert left == []


async def test_c1_disk_cleanup_after_an_unreadable_head_leaves_nothing(tmp_path: Path) -> None:
    from pydantic_ai_durable._core import Attempt

    path = tmp_path / 'j'
    journal = DiskJournal(path)
    await journal.open()
    for position in range(3):
        await Operator(journal).write_entry(KEY, '0', position, entry(position))
    eid = execution_id(KEY)
    with diskcache.Cache(str(path)) as cache:
        cache.set(f'{eid}/h', 'written by another release')

    attempt = Attempt(KEY, journal=journal, default_journal=lambda: journal, cleanup='execution', lease_ttl=30)
    run = await attempt.start_run(journal)
    await run.claim('step', 'tool', 'fp').record('new')  # a fresh head now knows position 0 only
    await attempt.finish(None)
    await journal.close()

    with diskcache.Cache(str(path)) as cache:
        left = sorted(item for item in cache.iterkeys() if isinstance(item, str) and item.startswith(eid))
    assert left == []


async def test_b7_disk_path_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / 'journal'
    path.write_text('not a directory')
    with pytest.raises(JournalUnavailable, match='is a file, not a directory') as caught:
        await DiskJournal(path).open()
    assert str(path) in str(caught.value)
    assert path.read_text() == 'not a directory'


async def test_b7_disk_path_that_cannot_be_created_is_unavailable(tmp_path: Path) -> None:
    parent = tmp_path / 'a-file'
    parent.write_text('x')
    with pytest.raises(JournalUnavailable, match='cannot be opened for writing') as caught:
        await DiskJournal(parent / 'journal').open()
    assert str(parent / 'journal') in str(caught.value)


@pytest.mark.skipif(not hasattr(os, 'geteuid') or os.geteuid() == 0, reason='root ignores directory permissions')
async def test_b7_disk_unwritable_directory_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / 'readonly'
    path.mkdir()
    path.chmod(0o500)
    try:
        with pytest.raises(JournalUnavailable, match='cannot be opened for writing'):
            await DiskJournal(path).open()
    finally:
        path.chmod(0o700)
