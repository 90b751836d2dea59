"""The framework-neutral journal core (the R, P, M, D, W, F, X, C and S rules, B-3, B-5, B-7), over every backend.

Each rule is driven through
`Attempt` / `Run` / `Step` exactly as the pydantic-ai adapter drives them: claim synchronously, run the
body only when the step did not replay, record its result, note a raise, fail the run.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from helpers import Operator
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded

from pydantic_ai_durable import ExecutionBusy, JournalError, JournalUnavailable
from pydantic_ai_durable._core import Attempt, CleanupMode, Kind, Run, SimulatedCrash, Step
from pydantic_ai_durable._runtime import end_holding, new_holder, start_holding
from pydantic_ai_durable.journals import DiskJournal, Journal, MemoryJournal, RunSnapshot

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

if TYPE_CHECKING:
    from conftest import BackendCase

KEY = 'order-42'
LOGGER = 'pydantic_ai_durable'


# -- helpers -------------------------------------------------------------------------------------


def make_attempt(
    journal: Journal, key: str = KEY, cleanup: CleanupMode = 'keep', lease_ttl: float = 30, **options: Any
) -> Attempt:
    options.setdefault('write_timeout', 0.2)  # a failing store is retried this long before the attempt stops
    return Attempt(
        key, journal=journal, default_journal=lambda: journal, cleanup=cleanup, lease_ttl=lease_ttl, **options
    )


class Bodies:
    """Counts how often each step's live body ran: what a replay must not increase."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def run(
        self,
        run: Run,
        name: str,
        result: Any = None,
        *,
        kind: Kind = 'tool',
        fp: str | None = 'fp',
        raises: BaseException | None = None,
        replayable: bool = True,
        to_record: Any = None,
    ) -> Step:
        """Claim a step; when it does not replay run its body (count it), then record or note the raise."""
        step = run.claim(name, kind, fp, replayable=replayable)
        if step.replayed:
            return step
        with step.executing():
            self.calls[name] += 1
            await asyncio.sleep(0)
            if raises is not None:
                step.failed(raises)
                raise raises
        await step.record(name if result is None else result, to_record=to_record)
        return step


async def record_all(journal: Journal, steps: list[tuple[str, Kind, str | None]], *, key: str = KEY) -> Attempt:
    """One finished attempt (cleanup never) whose run 0 recorded `steps` with payload = step name."""
    attempt = make_attempt(journal, key)
    run = await attempt.start_run(journal)
    for name, kind, fp in steps:
        step = run.claim(name, kind, fp)
        assert not step.replayed
        assert await step.record(f'{name} result') is True
    await attempt.finish(None)
    return attempt


async def meta_of(journal: Journal, run: str = '0', key: str = KEY) -> dict[str, Any] | None:
    return (await journal.read_run(key, run)).records.get('meta')


ENTRY_FIELDS = ('v', 'name', 'kind', 'fingerprint', 'payload')


def identity(entry: dict[str, Any]) -> dict[str, Any]:
    """The fields of an entry that replay reads (W-1); others (timestamps, spend) may ride along."""
    return {name: entry[name] for name in ENTRY_FIELDS if name in entry}


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


class Wrapped:
    """A journal delegating to another; subclasses override the one method they break."""

    def __init__(self, inner: Journal) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RefusesNames(Wrapped):
    """Storage that refuses the entries of some steps (W-2)."""

    def __init__(self, inner: Journal, names: set[str]) -> None:
        super().__init__(inner)
        self.names = names

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        if entry['name'] in self.names:
            return False
        return await self.inner.write_entry(key, run, position, entry, epoch=epoch)


class LosesNames(Wrapped):
    """Storage that acknowledges the entries of some steps and keeps nothing: their positions stay empty,
    as a crash between a parallel step's body and its record leaves them (M-3). The later entries then name
    no lost position as stored before them (`after`, EN-3), as they would not have after such a crash."""

    def __init__(self, inner: Journal, names: set[str]) -> None:
        super().__init__(inner)
        self.names = names
        self.lost: set[int] = set()

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        if entry['name'] in self.names:
            self.lost.add(position)
            return True
        if entry.get('after') in self.lost:
            entry = {name: value for name, value in entry.items() if name != 'after'}
        return await self.inner.write_entry(key, run, position, entry, epoch=epoch)


class FailsNames(Wrapped):
    """Storage that fails to write the entries of some steps, as a full disk would."""

    def __init__(self, inner: Journal, names: set[str]) -> None:
        super().__init__(inner)
        self.names = names

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        if entry['name'] in self.names:
            raise OSError(28, 'No space left on device')
        return await self.inner.write_entry(key, run, position, entry, epoch=epoch)


class WriteRaises(Wrapped):
    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        raise OSError('disk I/O error')


class DeleteRaises(Wrapped):
    async def delete_run(self, key: str, run: str, *, epoch: int) -> None:
        raise OSError('delete failed')

    async def delete_execution(self, key: str, *, epoch: int) -> None:
        raise OSError('delete failed')


class RecordRefused(Wrapped):
    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        return False


class ReadRunRaises(Wrapped):
    async def read_run(self, key: str, run: str) -> RunSnapshot:
        raise OSError('connection reset')


def dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True, check=True
    )
    return int(child.stdout)


# -- B. Matching: M-1..M-7, D-1..D-5 -------------------------------------------------------------


async def test_m7_matching_step_replays_its_payload_without_running_the_body(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    step = await bodies.run(run, 'agent__model.request', {'text': 'hi', 'n': (1, 2)}, kind='model', fp='fp')
    assert not step.replayed
    await first.finish(None)

    caplog.set_level(logging.DEBUG, logger=LOGGER)
    second = make_attempt(j)
    run = await second.start_run(j)
    step = await bodies.run(run, 'agent__model.request', {'text': 'other'}, kind='model', fp='fp')
    await second.finish(None)

    assert step.replayed
    assert step.payload == {'text': 'hi', 'n': [1, 2]}
    assert bodies.calls['agent__model.request'] == 1
    assert [s.outcome for s in first.stats.steps] == ['live']
    assert [(s.run, s.position, s.name, s.outcome) for s in second.stats.steps] == [
        ('0', 0, 'agent__model.request', 'replayed')
    ]
    assert second.stats.replayed == Counter(model=1)
    assert sum(second.stats.recorded.values()) == 0
    assert any('replayed step 0 (agent__model.request)' in r.getMessage() for r in caplog.records)  # S-4


async def test_m4_name_mismatch_diverges(backend_journal: Journal, caplog: pytest.LogCaptureFixture) -> None:
    j = backend_journal
    await record_all(j, [('a', 'tool', 'f0'), ('b', 'tool', 'f1')])
    bodies = Bodies()
    attempt = make_attempt(j)
    run = await attempt.start_run(j)

    zero = await bodies.run(run, 'x', 'x live', fp='f0')
    one = await bodies.run(run, 'b', 'b live', fp='f1')
    await attempt.finish(None)

    assert not zero.replayed and not one.replayed
    assert run.diverged
    assert bodies.calls == Counter(x=1, b=1)
    assert attempt.stats.replayed.total() == 0
    entries = (await j.read_run(KEY, '0')).entries
    assert entries[0]['name'] == 'x' and entries[0]['payload'] == 'x live'
    assert entries[1]['payload'] == 'b live'  # D-2: the live step overwrote its own position
    (warning,) = [w for w in warnings_of(caplog) if 'diverged' in w]
    assert 'position 0 (x)' in warning and 'previous attempt ran a here' in warning  # D-3


@pytest.mark.parametrize(('recorded', 'claimed'), [('f0', 'changed'), ('f0', None), (None, 'f0')])
async def test_m4_fingerprint_mismatch_diverges(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture, recorded: str | None, claimed: str | None
) -> None:
    j = backend_journal
    await record_all(j, [('a', 'model', recorded), ('b', 'tool', 'f1')])
    bodies = Bodies()
    attempt = make_attempt(j)
    run = await attempt.start_run(j)

    zero = await bodies.run(run, 'a', 'a live', kind='model', fp=claimed)
    one = await bodies.run(run, 'b', 'b live', fp='f1')
    await attempt.finish(None)

    assert not zero.replayed and not one.replayed
    assert run.diverged
    assert (await j.read_run(KEY, '0')).entries[1]['payload'] == 'b live'
    assert any('request differs' in w for w in warnings_of(caplog))


async def test_m5_unfingerprinted_first_step_replays(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('agent__capability__c.op', 'other', None)])
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    step = run.claim('agent__capability__c.op', 'other', None)
    await attempt.finish(None)
    assert step.replayed
    assert step.payload == 'agent__capability__c.op result'
    assert attempt.stats.replayed == Counter(other=1)


@pytest.mark.parametrize(('recorded_start', 'start', 'replays'), [('in-A', 'in-A', True), ('in-A', 'in-B', False)])
async def test_m5_unfingerprinted_first_step_replays_only_for_a_run_started_alike(
    backend_journal: Journal, recorded_start: str, start: str, replays: bool
) -> None:
    j = backend_journal
    first = make_attempt(j)
    run = await first.start_run(j, start=recorded_start)
    await run.claim('agent__model.request', 'model', None).record('the answer to prompt A')
    await run.claim('agent__function_toolset__t.call_tool:t', 'tool', 'ft').record('tool result')
    await first.finish(None)

    second = make_attempt(j)
    run = await second.start_run(j, start=start)  # started with another prompt: nothing verified before step 0
    model = run.claim('agent__model.request', 'model', None)
    tool = run.claim('agent__function_toolset__t.call_tool:t', 'tool', 'ft')
    await second.finish(None)
    assert model.replayed is replays
    assert tool.replayed  # a fingerprinted step stands on its own fingerprint
    assert not run.diverged  # M-5: an unverifiable step that does not replay is no divergence


async def test_m5_unfingerprinted_step_replays_only_after_a_replay(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(LosesNames(j, {'t'}))
    await bodies.run(run, 't', fp='t')  # its position stays empty
    await bodies.run(run, 'o', kind='other', fp=None)
    await bodies.run(run, 'm', kind='model', fp='fm')
    await first.finish(None)
    assert 0 not in (await j.read_run(KEY, '0')).entries

    second = make_attempt(j)
    run = await second.start_run(j)
    t = await bodies.run(run, 't', fp='t')
    o = await bodies.run(run, 'o', kind='other', fp=None)
    m = await bodies.run(run, 'm', kind='model', fp='fm')
    await second.finish(None)

    assert (t.replayed, o.replayed, m.replayed) == (False, False, True)
    assert not run.diverged  # M-3: a missing entry is not a divergence; M-5: neither is a chained None
    assert bodies.calls == Counter(t=2, o=2, m=1)
    assert not any('diverged' in w for w in warnings_of(caplog))


async def test_m6_a9_non_replayable_claim_keeps_the_chain_so_the_next_unfingerprinted_step_replays(
    backend_journal: Journal,
) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    await bodies.run(run, 'a', fp='fa')
    await bodies.run(run, 'remote', replayable=False)
    await bodies.run(run, 'event', kind='other', fp=None)
    await bodies.run(run, 'b', fp='fb')
    await first.finish(None)

    second = make_attempt(j)
    run = await second.start_run(j)
    steps = [
        await bodies.run(run, 'a', fp='fa'),
        await bodies.run(run, 'remote', replayable=False),
        await bodies.run(run, 'event', kind='other', fp=None),
        await bodies.run(run, 'b', fp='fb'),
    ]
    await second.finish(None)

    assert [s.replayed for s in steps] == [True, False, True, True]
    assert not run.diverged
    assert bodies.calls == Counter(a=1, remote=2, event=1, b=1)


async def test_m3_a_step_missing_from_the_journal_runs_live_and_a_later_step_replays(
    backend_journal: Journal,
) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(LosesNames(j, {'agent__function_toolset__t.call_tool:send'}))
    await bodies.run(run, 'agent__function_toolset__t.call_tool:send', fp='s')
    await bodies.run(run, 'agent__model.request', kind='model', fp='m')
    await first.finish(None)
    assert list((await j.read_run(KEY, '0')).entries) == [1]

    second = make_attempt(j)
    run = await second.start_run(j)
    send = await bodies.run(run, 'agent__function_toolset__t.call_tool:send', fp='s')
    model = await bodies.run(run, 'agent__model.request', kind='model', fp='m')
    await second.finish(None)

    assert not send.replayed and model.replayed
    assert not run.diverged
    assert second.stats.replayed == Counter(model=1)
    assert second.stats.recorded == Counter(tool=1)


async def test_m2_w3_non_replayable_step_runs_live_every_attempt_and_is_never_stored(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = backend_journal
    bodies = Bodies()
    for attempt_number in (1, 2, 3):
        attempt = make_attempt(j)
        run = await attempt.start_run(j)
        remote = run.claim('remote_agent', 'tool', 'fr', replayable=False)
        assert remote.position == 0 and not remote.replayed
        bodies.calls['remote_agent'] += 1
        assert await remote.record('remote result') is False  # W-3: silently
        after = await bodies.run(run, 'after', fp='fa')
        await attempt.finish(None)

        assert after.position == 1
        assert after.replayed is (attempt_number > 1)
        assert attempt.stats.not_recorded == []
        assert attempt.stats.recorded == (Counter(tool=1) if attempt_number == 1 else Counter())
        assert list((await j.read_run(KEY, '0')).entries) == [1]
    assert bodies.calls == Counter(remote_agent=3, after=1)
    assert warnings_of(caplog) == []


async def test_m2_non_replayable_claim_ignores_an_entry_at_its_position(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('tool', 'tool', 'f0'), ('next', 'tool', 'f1')])  # recorded while it was replayable
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    zero = run.claim('tool', 'tool', 'f0', replayable=False)
    one = run.claim('next', 'tool', 'f1')
    await attempt.finish(None)
    assert not zero.replayed and zero.payload is None
    assert one.replayed and one.payload == 'next result'


async def test_w4_to_record_transforms_only_the_stored_copy(backend_journal: Journal) -> None:
    j = backend_journal
    first = make_attempt(j)
    run = await first.start_run(j)
    step = run.claim('login', 'tool', 'fp')
    live = {'password': 'secret', 'user': 'ann'}
    seen: list[Any] = []

    def mask(value: Any) -> Any:
        seen.append(value)
        return {**value, 'password': '***'}

    assert await step.record(live, to_record=mask) is True
    assert await run.claim('next', 'other', None).record('after the login')
    await first.finish(None)

    assert seen == [{'password': 'secret', 'user': 'ann'}]
    assert live == {'password': 'secret', 'user': 'ann'}  # the caller's value is unchanged
    assert (await j.read_run(KEY, '0')).entries[0]['payload'] == {'password': '***', 'user': 'ann'}
    assert (await j.read_run(KEY, '0')).entries[0]['redacted'] is True
    second = make_attempt(j)
    run = await second.start_run(j)
    again = run.claim('login', 'tool', 'fp')
    after = run.claim('next', 'other', None)
    await second.finish(None)
    assert not again.replayed and again.redacted  # K-8: a redacted copy never stands in for the result
    assert after.replayed  # and the unfingerprinted step after it still replays (M-6)
    assert not run.diverged


async def test_w4_k8_an_unchanged_value_is_recorded_as_it_is_and_replays(backend_journal: Journal) -> None:
    j = backend_journal
    first = make_attempt(j)
    run = await first.start_run(j)
    assert await run.claim('lookup', 'tool', 'fp').record({'user': 'ann'}, to_record=lambda value: value)
    await first.finish(None)
    assert 'redacted' not in (await j.read_run(KEY, '0')).entries[0]
    second = make_attempt(j)
    run = await second.start_run(j)
    assert run.claim('lookup', 'tool', 'fp').replayed
    await second.finish(None)


async def test_w1_entry_holds_version_name_kind_fingerprint_and_payload(backend_journal: Journal) -> None:
    j = backend_journal
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    step = run.claim('agent__model.request', 'model', 'abc123')
    assert await step.record({'parts': [{'text': 'x'}]}) is True
    await attempt.finish(None)
    entries = (await j.read_run(KEY, '0')).entries
    assert list(entries) == [0]
    assert identity(entries[0]) == {
        'v': 1,
        'name': 'agent__model.request',
        'kind': 'model',
        'fingerprint': 'abc123',
        'payload': {'parts': [{'text': 'x'}]},
    }
    assert attempt.stats.recorded == Counter(model=1)


SAVE_FAILURES = ['refused', 'raises', 'unstorable', 'to_record_raises']


def failing_save(j: Journal, failure: str) -> tuple[Any, Any, Any]:
    """The journal, payload and `to_record` of a save that fails in the way named."""
    payload: Any = 'result'
    to_record = None
    journal: Any = j
    if failure == 'refused':
        journal = RefusesNames(j, {'send_email'})
    elif failure == 'raises':
        journal = WriteRaises(j)
    elif failure == 'unstorable':
        payload = {'handle': object()}
    else:

        def to_record(value: Any) -> Any:
            raise ValueError('cannot mask')

    return journal, payload, to_record


@pytest.mark.parametrize('failure', SAVE_FAILURES)
async def test_jf2_jf5_save_that_fails_stops_the_attempt_before_the_next_step(
    backend_journal: Journal, failure: str
) -> None:
    j = backend_journal
    journal, payload, to_record = failing_save(j, failure)
    attempt = make_attempt(j)
    run = await attempt.start_run(journal)
    run.claim('first', 'tool', 'f')
    step = run.claim('send_email', 'tool', 'fp')

    expected = JournalUnavailable if failure == 'raises' else JournalError
    with pytest.raises(expected) as stopped:
        await step.record(payload, to_record=to_record)
    assert (type(stopped.value) is JournalUnavailable) == (failure == 'raises')  # a refusal is not retryable

    assert 'send_email' in str(stopped.value) or failure == 'raises'
    if failure == 'raises':  # the store is broken: no later step of this attempt starts
        assert 'nothing ran unrecorded' in str(stopped.value)
        with pytest.raises(JournalUnavailable):
            run.claim('later', 'tool', 'fl')
        assert 1 not in (await j.read_run(KEY, '0')).entries
    elif failure == 'refused':  # this store refuses the step's name, its fence included
        assert 1 not in (await j.read_run(KEY, '0')).entries
    else:  # the result cannot be journaled: a fence stands at its position (JF-5)
        fence = (await j.read_run(KEY, '0')).entries[1]
        assert fence['name'] == 'send_email' and fence['payload'] is None and fence['unjournalable']
    assert attempt.stats.recorded.total() == 0
    await attempt.finish(stopped.value)


async def test_w5_raising_body_records_nothing_and_propagates(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    error = RuntimeError('boom')
    with pytest.raises(RuntimeError) as caught:
        await bodies.run(run, 'flaky', raises=error)
    await attempt.finish(caught.value)
    assert caught.value is error
    assert (await j.read_run(KEY, '0')).entries == {}
    assert attempt.stats.recorded.total() == 0 and attempt.stats.not_recorded == []


async def test_w5_f2_error_noted_by_two_steps_keeps_the_earliest_position(backend_journal: Journal) -> None:
    j = backend_journal
    error = RuntimeError('shared failure')
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    run.claim('first', 'tool', 'f0').failed(error)  # noted with next position 1
    await run.claim('sibling', 'tool', 'f1').record('ok')
    run.claim('rethrows', 'tool', 'f2').failed(error)  # the same object again, noted later
    await run.claim('handler', 'tool', 'f3').record('handled')
    await run.fail(error, model_at_fault=False)
    await attempt.finish(error)
    assert (await meta_of(j) or {})['diverge_from'] == 1


async def test_d2_divergence_never_deletes_entries(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('a', 'tool', 'f0'), ('b', 'tool', 'f1'), ('c', 'tool', 'f2')])
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    run.claim('other', 'tool', 'f0')  # diverges, records nothing
    await attempt.finish(RuntimeError('stopped'))
    entries = (await j.read_run(KEY, '0')).entries
    assert [entries[p]['payload'] for p in (0, 1, 2)] == ['a result', 'b result', 'c result']


async def test_d5_divergence_is_per_run(backend_journal: Journal) -> None:
    j = backend_journal
    first = make_attempt(j)
    for _ in range(2):
        run = await first.start_run(j)
        for name in ('a', 'b'):
            await run.claim(name, 'tool', name).record(f'{run.key}:{name}')
    await first.finish(None)

    second = make_attempt(j)
    run0 = await second.start_run(j)
    run1 = await second.start_run(j)
    diverging = run0.claim('changed', 'tool', 'a')
    a1 = run1.claim('a', 'tool', 'a')
    b1 = run1.claim('b', 'tool', 'b')
    await second.finish(None)

    assert run0.diverged and not diverging.replayed
    assert not run1.diverged
    assert (a1.payload, b1.payload) == ('1:a', '1:b')


async def test_s3_m8_peek_reads_ahead_obeys_fences_and_is_consumed_by_the_claim(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('a', 'model', 'f0'), ('b', 'tool', 'f1'), ('c', 'model', 'f2')])
    await Operator(j).write_record(
        KEY, '0', 'meta', {'v': 1, 'diverge_from': 2, 'high_water': 3, 'model_at_fault': False}
    )
    attempt = make_attempt(j)
    run = await attempt.start_run(j)

    peeked = run.peek(1)
    assert peeked is not None and peeked['name'] == 'b' and peeked['payload'] == 'b result'
    assert run.next_position == 0  # peeking claims nothing
    assert run.peek(2) is None  # at the fence
    assert run.peek(9) is None  # absent
    assert run.claim('a', 'model', 'f0').replayed
    one = run.claim('b', 'tool', 'f1')
    assert one.replayed and one.payload == 'b result'
    assert run.peek(1) is None  # consumed by its claim
    assert not run.claim('c', 'model', 'f2').replayed  # the fence
    assert run.diverged
    assert run.peek(1) is None
    await attempt.finish(None)


async def test_d1_peek_returns_nothing_after_a_divergence(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('a', 'model', 'f0'), ('b', 'tool', 'f1'), ('c', 'model', 'f2')])
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    assert run.peek(2) is not None
    run.claim('a', 'model', 'different')
    assert run.peek(1) is None and run.peek(2) is None  # read-ahead cache dropped
    assert not run.claim('b', 'tool', 'f1').replayed
    await attempt.finish(None)


# -- P: positions and claim order ----------------------------------------------------------------


async def test_p1_positions_are_taken_at_claim_time_and_only_increase(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('a', 'tool', 'f0')])
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    steps = [
        run.claim('a', 'tool', 'f0'),  # replays
        run.claim('n', 'tool', 'fn', replayable=False),
        run.claim('b', 'tool', 'f1'),  # live, never recorded
        run.claim('c', 'other', None),
    ]
    assert [s.position for s in steps] == [0, 1, 2, 3]
    assert run.next_position == 4
    await steps[3].record('c')
    assert run.claim('d', 'tool', 'f4').position == 4
    await attempt.finish(None)


async def test_p2_claims_are_synchronous_so_parallel_steps_keep_start_order(backend_journal: Journal) -> None:
    j = backend_journal

    class Spy(Wrapped):
        def __init__(self, inner: Journal) -> None:
            super().__init__(inner)
            self.order: list[int] = []

        async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
            self.order.append(position)
            return await self.inner.write_entry(key, run, position, entry, epoch=epoch)

    spy = Spy(j)
    first = make_attempt(j)
    run = await first.start_run(spy)
    steps = [run.claim(f'charge_{n}', 'tool', f'fp{n}') for n in (1, 2, 3)]  # no await between claims
    assert [s.position for s in steps] == [0, 1, 2]

    async def finish_after(step: Step, delay: float) -> None:
        await asyncio.sleep(delay)
        await step.record(f'charged {step.position + 1}')

    await asyncio.gather(*(finish_after(step, 0.03 * (3 - step.position)) for step in steps))
    await first.finish(None)
    assert spy.order == [2, 1, 0]  # recorded in reverse

    second = make_attempt(j)
    run = await second.start_run(j)
    replayed = [run.claim(f'charge_{n}', 'tool', f'fp{n}') for n in (1, 2, 3)]
    await second.finish(None)
    assert all(s.replayed for s in replayed)
    assert [s.payload for s in replayed] == ['charged 1', 'charged 2', 'charged 3']


# -- R: attempts and runs ------------------------------------------------------------------------


async def test_r2_second_attempt_in_one_process_gets_a_fresh_view(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    for name in ('a', 'b', 'c'):
        await bodies.run(run, name, fp=name)
    await first.start_run(j)
    await first.finish(None)
    assert first.number == 1

    second = make_attempt(j)
    assert second.stats.replayed.total() == 0 and second.stats.recorded.total() == 0
    run = await second.start_run(j)
    assert run.key == '0' and run.next_position == 0
    steps = [await bodies.run(run, name, fp=name) for name in ('a', 'b', 'c')]
    await second.finish(None)

    assert [s.position for s in steps] == [0, 1, 2]
    assert all(s.replayed for s in steps)
    assert second.stats.replayed == Counter(tool=3)
    assert second.number == 2
    assert bodies.calls == Counter(a=1, b=1, c=1)


async def test_r3_runs_are_numbered_in_start_order_and_replay_independently(backend_journal: Journal) -> None:
    j = backend_journal
    first = make_attempt(j)
    runs = [await first.start_run(j) for _ in range(3)]
    assert [r.key for r in runs] == ['0', '1', '2']
    for run in runs:
        await run.claim('agent__model.request', 'model', 'same').record(f'answer of run {run.key}')
    await first.finish(None)

    second = make_attempt(j)
    runs = [await second.start_run(j) for _ in range(3)]
    steps = [run.claim('agent__model.request', 'model', 'same') for run in runs]
    await second.finish(None)
    assert [s.payload for s in steps] == ['answer of run 0', 'answer of run 1', 'answer of run 2']


async def test_r4_nested_runs_are_keyed_under_their_parent_step(backend_journal: Journal) -> None:
    j = backend_journal
    attempt = make_attempt(j)
    outer = await attempt.start_run(j)
    s0 = outer.claim('first', 'tool', 'f0')
    s1 = outer.claim('second', 'tool', 'f1')
    with s0.executing():
        assert (await attempt.start_run(j)).key == '0.0.1'
    with s1.executing():
        nested = await attempt.start_run(j)
        assert (await attempt.start_run(j)).key == '0.1.2'
        inner = nested.claim('sub', 'tool', 'fs')
        with inner.executing():
            assert (await attempt.start_run(j)).key == '0.1.1.0.1'
    assert nested.key == '0.1.1'
    assert (await attempt.start_run(j)).key == '1'  # nested runs take no top-level number
    await attempt.finish(None)


async def test_r5_nesting_follows_each_tasks_own_step_and_ignores_foreign_steps(backend_journal: Journal) -> None:
    j = backend_journal
    attempt = make_attempt(j)
    outer = await attempt.start_run(j)
    parents = [outer.claim(f'tool_{n}', 'tool', f'f{n}') for n in range(3)]

    async def nested_key(step: Step, delay: float) -> str:
        with step.executing():
            await asyncio.sleep(delay)
            return (await attempt.start_run(j)).key

    keys = await asyncio.gather(*(nested_key(step, 0.02 * (3 - step.position)) for step in parents))
    assert keys == ['0.0.1', '0.1.1', '0.2.1']

    foreign = make_attempt(j, key='another execution')
    foreign_run = await foreign.start_run(j)
    foreign_step = foreign_run.claim('tool', 'tool', 'f')
    with foreign_step.executing():
        assert (await attempt.start_run(j)).key == '1'  # another execution's step is not our parent
        assert (await foreign.start_run(j)).key == '0.0.1'  # but it is the parent of its own runs
    other_journal = MemoryJournal()
    with parents[0].executing():
        assert (await attempt.start_run(other_journal)).key == '2'  # nor is a step on another journal
    assert (await attempt.start_run(j)).key == '3'
    await foreign.finish(None)
    await attempt.finish(None)


async def test_r2_two_disk_journal_objects_on_one_directory_share_one_lease_and_record(tmp_path: Any) -> None:
    first, second = DiskJournal(tmp_path / 'j'), DiskJournal(str(tmp_path / 'j'))
    attempt = make_attempt(first)
    run0 = await attempt.start_run(first)
    run1 = await attempt.start_run(second)  # not refused as busy by its own lease
    await run1.claim('s', 'tool', 'f').record('from run 1')
    assert (run0.key, run1.key) == ('0', '1')
    assert (await first.read_execution(KEY) or {})['runs'] == ['0', '1']
    assert (await first.read_run(KEY, '1')).entries[0]['payload'] == 'from run 1'
    await attempt.finish(None)
    again = make_attempt(second)
    await again.open(second)
    assert again.number == 2
    await again.finish(None)
    await first.close()
    await second.close()


async def test_r6_every_run_key_is_persisted_at_run_start(backend_journal: Journal) -> None:
    j = backend_journal
    attempt = make_attempt(j)
    outer = await attempt.start_run(j)
    assert (await j.read_execution(KEY) or {})['runs'] == ['0']
    parent = outer.claim('tool', 'tool', 'f')
    with parent.executing():
        await attempt.start_run(j)
    await attempt.start_run(j)
    assert (await j.read_execution(KEY) or {})['runs'] == ['0', '0.0.1', '1']
    await attempt.finish(RuntimeError('failed'))

    second = make_attempt(j)
    await second.start_run(j)  # only the top-level run starts again
    await second.finish(RuntimeError('failed again'))
    record = await j.read_execution(KEY)
    assert record is not None
    assert record['runs'] == ['0', '0.0.1', '1']
    assert record['attempts'] == 2 and record['status'] == 'failed'


async def test_r6_c2_nested_run_under_a_replayed_parent_is_still_cleaned(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()

    async def tool_with_subagent(run: Run, name: str, sub: str, *, fail: bool = False) -> Step:
        step = run.claim(name, 'tool', name)
        if step.replayed:
            return step
        with step.executing():
            nested = await run.attempt.start_run(j)
            await bodies.run(nested, sub, fp=sub)
            if fail:
                error = RuntimeError('second failed')
                step.failed(error)
                raise error
        await step.record(f'{name} done')
        return step

    first = make_attempt(j, cleanup='execution')
    run = await first.start_run(j)
    await tool_with_subagent(run, 'first', 'sub_first')
    with pytest.raises(RuntimeError) as caught:
        await tool_with_subagent(run, 'second', 'sub_second', fail=True)
    await run.fail(caught.value, model_at_fault=False)
    await first.finish(caught.value)
    assert (await j.read_execution(KEY) or {})['runs'] == ['0', '0.0.1', '0.1.1']

    second = make_attempt(j, cleanup='execution')
    run = await second.start_run(j)
    first_step = await tool_with_subagent(run, 'first', 'sub_first')
    await tool_with_subagent(run, 'second', 'sub_second')
    await second.finish(None)

    assert first_step.replayed  # its sub-agent never starts this attempt
    assert [r.key for r in second.runs] == ['0', '0.1.1']
    assert bodies.calls == Counter(sub_first=1, sub_second=1)  # the nested run replayed its own step
    for run_key in ('0', '0.0.1', '0.1.1'):
        assert await j.read_run(KEY, run_key) == RunSnapshot()
    assert await j.read_execution(KEY) is None
    assert await j.list_executions() == []


async def test_r2_attempt_number_counts_every_opening(backend_journal: Journal) -> None:
    j = backend_journal
    for expected in (1, 2, 3):
        attempt = make_attempt(j)
        await attempt.open(j)
        assert attempt.number == expected
        assert (await attempt.open(j)) is (await attempt.open(j))  # opened once per attempt
        await attempt.finish(RuntimeError('again'))


# -- C. Failure bookkeeping (F-rules) ------------------------------------------------------------


async def test_f2_f3_step_recorded_after_the_failure_is_fenced(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = backend_journal
    bodies = Bodies()
    error = RuntimeError('flaky failed')
    first = make_attempt(j)
    run = await first.start_run(j)
    with pytest.raises(RuntimeError):
        await bodies.run(run, 'flaky', raises=error)
    await bodies.run(run, 'record_effect')
    await run.fail(error, model_at_fault=False)
    await first.finish(error)
    assert await meta_of(j) == {'v': 1, 'diverge_from': 1, 'high_water': 2, 'model_at_fault': False}

    second = make_attempt(j)
    run = await second.start_run(j)
    flaky = await bodies.run(run, 'flaky')
    effect = await bodies.run(run, 'record_effect')
    await second.finish(None)

    assert not flaky.replayed and not effect.replayed
    assert bodies.calls == Counter(flaky=2, record_effect=2)
    assert any(
        'position 1 (record_effect)' in w and 'previous attempt failed before this step' in w
        for w in warnings_of(caplog)
    )


async def test_f2_sibling_claimed_before_the_raise_stays_replayable(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()
    error = RuntimeError('flaky failed')
    first = make_attempt(j)
    run = await first.start_run(j)
    flaky = run.claim('flaky', 'tool', 'f0')
    sibling = run.claim('sibling', 'tool', 'f1')
    flaky.failed(error)  # raised while the sibling was still running
    await sibling.record('sibling result')
    await bodies.run(run, 'on_error', fp='f2')
    await run.fail(error, model_at_fault=False)
    await first.finish(error)
    assert (await meta_of(j) or {})['diverge_from'] == 2

    second = make_attempt(j)
    run = await second.start_run(j)
    steps = [await bodies.run(run, name, fp=f'f{n}') for n, name in enumerate(('flaky', 'sibling', 'on_error'))]
    await second.finish(None)

    assert [s.replayed for s in steps] == [False, True, False]
    assert steps[1].payload == 'sibling result'


async def test_f8_failure_the_run_recovered_from_has_no_effect(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    with pytest.raises(RuntimeError):
        await bodies.run(run, 'flaky', raises=RuntimeError('transient'))
    await bodies.run(run, 'retry_model', kind='model', fp='m')
    await bodies.run(run, 'next_tool', fp='t')
    await first.finish(None)  # the run succeeded: no fail()
    assert await meta_of(j) is None

    second = make_attempt(j)
    run = await second.start_run(j)
    steps = [
        await bodies.run(run, 'flaky'),
        await bodies.run(run, 'retry_model', kind='model', fp='m'),
        await bodies.run(run, 'next_tool', fp='t'),
    ]
    await second.finish(None)
    assert [s.replayed for s in steps] == [False, True, True]


async def test_f9_failure_no_step_raised_keeps_everything_replayable(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('m0', 'model', 'a'), ('t1', 'tool', 'b'), ('m2', 'model', 'c')])
    first = make_attempt(j)
    run = await first.start_run(j)
    assert all(
        run.claim(n, k, f).replayed for n, k, f in [('m0', 'model', 'a'), ('t1', 'tool', 'b'), ('m2', 'model', 'c')]
    )
    await run.fail(UsageLimitExceeded('request_limit of 3 exceeded'), model_at_fault=False)
    await first.finish(None)
    assert await meta_of(j) == {'v': 1, 'diverge_from': None, 'high_water': 3, 'model_at_fault': False}

    second = make_attempt(j)
    run = await second.start_run(j)
    steps = [run.claim(n, k, f) for n, k, f in [('m0', 'model', 'a'), ('t1', 'tool', 'b'), ('m2', 'model', 'c')]]
    await second.finish(None)
    assert all(s.replayed for s in steps)


@pytest.mark.parametrize('link', ['cause', 'context', 'cause_of_cause'])
async def test_f2_wrapped_error_is_traced_through_its_cause_and_context(backend_journal: Journal, link: str) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    original = RuntimeError('flaky failed')
    with pytest.raises(RuntimeError):
        await bodies.run(run, 'flaky', raises=original)
    await bodies.run(run, 'record_effect')
    try:
        try:
            raise original
        except RuntimeError as exc:
            if link == 'cause':
                raise ValueError('wrapped') from exc
            if link == 'context':
                raise ValueError('while handling')  # noqa: B904 - the implicit __context__ is the point
            try:
                raise KeyError('middle') from exc
            except KeyError as middle:
                raise ValueError('outer') from middle
    except ValueError as wrapped:
        await run.fail(wrapped, model_at_fault=False)
    await first.finish(RuntimeError('attempt failed'))

    assert (await meta_of(j) or {})['diverge_from'] == 1
    second = make_attempt(j)
    run = await second.start_run(j)
    assert not run.claim('flaky', 'tool', 'fp').replayed
    assert not run.claim('record_effect', 'tool', 'fp').replayed
    await second.finish(None)


async def test_f2_a_member_of_an_exception_group_is_traced(backend_journal: Journal) -> None:
    """A fallback that ran out of models raises a group of their errors: the fence goes to the first one's step."""
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    await bodies.run(run, 'before')
    primary, backup = RuntimeError('primary failed'), RuntimeError('backup failed')
    for name, error in (('primary', primary), ('backup', backup)):
        with pytest.raises(RuntimeError):
            await bodies.run(run, name, raises=error)
        await bodies.run(run, f'{name}_handled')
    await run.fail(ExceptionGroup('every model failed', [primary, backup]), model_at_fault=False)
    await first.finish(RuntimeError('attempt failed'))
    assert (await meta_of(j) or {})['diverge_from'] == 2  # where `primary` was noted: the run's next position


async def test_f2_a_recorded_outcome_is_noted_where_its_failures_began(backend_journal: Journal) -> None:
    """A model error recorded as its step's outcome fences the streak it ended, so the next attempt sends it all."""
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    await bodies.run(run, 'answer', kind='model')
    errors = [RuntimeError('first failure'), RuntimeError('second failure')]
    for error in errors:
        step = await bodies.run(run, 'request', {'model_error': str(error)}, kind='model')
        step.failed(error, recorded=1)  # the streak began at position 1
    await run.fail(errors[-1], model_at_fault=False)
    await first.finish(errors[-1])
    assert (await meta_of(j) or {})['diverge_from'] == 1

    second = make_attempt(j)
    run = await second.start_run(j)
    steps = [run.claim(name, 'model', 'fp') for name in ('answer', 'request', 'request')]
    await second.finish(None)
    assert [s.replayed for s in steps] == [True, False, False]


async def test_f10_a_run_that_succeeds_moves_its_fence_past_what_it_recorded_again(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    await bodies.run(run, 'a')
    error = RuntimeError('b failed')
    with pytest.raises(RuntimeError):
        await bodies.run(run, 'b', raises=error)
    for name in ('c', 'd', 'e'):
        await bodies.run(run, name)
    await run.fail(error, model_at_fault=False)
    await first.finish(error)
    assert (await meta_of(j) or {})['diverge_from'] == 2

    second = make_attempt(j)  # goes as far as `d` again, and ends without an exception
    run = await second.start_run(j)
    for name in ('a', 'b', 'c', 'd'):
        await bodies.run(run, name)
    await run.succeeded()
    await second.finish(None)
    assert await meta_of(j) == {'v': 1, 'diverge_from': 4, 'high_water': 5, 'model_at_fault': False}

    third = make_attempt(j)
    run = await third.start_run(j)
    steps = [await bodies.run(run, name) for name in ('a', 'b', 'c', 'd', 'e')]
    await run.succeeded()
    await third.finish(None)
    assert [s.replayed for s in steps] == [True, True, True, True, False]  # `e` is still the failed attempt's
    assert await meta_of(j) == {'v': 1, 'diverge_from': None, 'high_water': 5, 'model_at_fault': False}
    assert bodies.calls == Counter(a=1, b=2, c=2, d=2, e=2)


async def test_f10_a_run_without_a_fence_writes_nothing_when_it_succeeds(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    await bodies.run(run, 'a')
    await run.succeeded()
    await attempt.finish(None)
    assert await meta_of(j) is None


@pytest.mark.parametrize('ending', ['fails', 'killed'])
async def test_f3_killed_while_replaying_keeps_progress(backend_journal: Journal, ending: str) -> None:
    j = backend_journal
    plan: list[tuple[str, Kind, str | None]] = [('a', 'model', 'fa'), ('b', 'tool', 'fb'), ('c', 'model', 'fc')]
    await record_all(j, plan)

    second = make_attempt(j)
    run = await second.start_run(j)
    assert run.claim('a', 'model', 'fa').replayed
    if ending == 'fails':
        error = RuntimeError('failed after replaying a')
        await run.fail(error, model_at_fault=False)
        await second.finish(error)
        assert (await meta_of(j) or {})['diverge_from'] is None
    else:
        await second.finish(SimulatedCrash())
        assert await meta_of(j) is None  # a dead process writes nothing

    third = make_attempt(j)
    run = await third.start_run(j)
    steps = [run.claim(name, kind, fp) for name, kind, fp in plan]
    await third.finish(None)
    assert all(s.replayed for s in steps)
    assert third.stats.replayed == Counter(model=2, tool=1)


async def test_f4_model_at_fault_fences_the_last_model_request(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = backend_journal
    bodies = Bodies()
    plan: list[tuple[str, Kind, str]] = [
        ('m0', 'model', 'a'),
        ('t1', 'tool', 'b'),
        ('m2', 'model', 'c'),
        ('m3', 'model', 'd'),
    ]
    first = make_attempt(j)
    run = await first.start_run(j)
    for name, kind, fp in plan:
        await bodies.run(run, name, kind=kind, fp=fp)
    await run.fail(UnexpectedModelBehavior('Exceeded maximum retries for output validation'), model_at_fault=True)
    await first.finish(RuntimeError('run failed'))
    assert await meta_of(j) == {'v': 1, 'diverge_from': 3, 'high_water': 4, 'model_at_fault': True}

    second = make_attempt(j)
    run = await second.start_run(j)
    steps = [await bodies.run(run, name, kind=kind, fp=fp) for name, kind, fp in plan]
    await second.finish(None)

    assert [s.replayed for s in steps] == [True, True, True, False]
    assert bodies.calls == Counter(m0=1, t1=1, m2=1, m3=2)
    assert any(
        'position 3 (m3)' in w and "model's answers from here failed the previous attempt" in w
        for w in warnings_of(caplog)
    )


@pytest.mark.parametrize('handler_recorded', [False, True])
async def test_f4_model_at_fault_is_ignored_when_a_step_raised(
    backend_journal: Journal, handler_recorded: bool
) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    await bodies.run(run, 'm0', kind='model', fp='a')
    await bodies.run(run, 't1', fp='b')
    error = UnexpectedModelBehavior('raised inside the model step')
    with pytest.raises(UnexpectedModelBehavior):
        await bodies.run(run, 'm2', kind='model', fp='c', raises=error)
    if handler_recorded:
        await bodies.run(run, 'handler', fp='h')
    await run.fail(error, model_at_fault=True)
    await first.finish(error)

    meta = await meta_of(j)
    assert meta is not None and meta['model_at_fault'] is False
    assert meta['diverge_from'] == (3 if handler_recorded else None)  # never the last model position 2
    second = make_attempt(j)
    run = await second.start_run(j)
    assert run.claim('m0', 'model', 'a').replayed
    assert run.claim('t1', 'tool', 'b').replayed
    assert not run.claim('m2', 'model', 'c').replayed
    await second.finish(None)


async def test_f5_fence_does_not_move_past_an_entry_still_untrusted(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    await bodies.run(run, 'a')
    await bodies.run(run, 'b')
    error = RuntimeError('c failed')
    with pytest.raises(RuntimeError):
        await bodies.run(run, 'c', raises=error)
    await bodies.run(run, 'h')
    await run.fail(error, model_at_fault=False)
    await first.finish(error)
    assert await meta_of(j) == {'v': 1, 'diverge_from': 3, 'high_water': 4, 'model_at_fault': False}

    second = make_attempt(j)
    run = await second.start_run(j)
    a = await bodies.run(run, 'a')
    b = await bodies.run(run, 'b')
    c = await bodies.run(run, 'c')
    error2 = RuntimeError('the step at 3 failed')
    with pytest.raises(RuntimeError):
        await bodies.run(run, 'h', raises=error2)
    await bodies.run(run, 'h2')
    await run.fail(error2, model_at_fault=False)
    await second.finish(error2)

    assert (a.replayed, b.replayed, c.replayed) == (True, True, False)
    assert await meta_of(j) == {'v': 1, 'diverge_from': 3, 'high_water': 5, 'model_at_fault': False}


async def test_f6_high_water_keeps_the_furthest_position(backend_journal: Journal) -> None:
    j = backend_journal
    bodies = Bodies()
    first = make_attempt(j)
    run = await first.start_run(j)
    for n in range(6):
        await bodies.run(run, f's{n}')
    await run.fail(RuntimeError('failed at 6'), model_at_fault=False)
    await first.finish(RuntimeError('failed'))
    assert await meta_of(j) == {'v': 1, 'diverge_from': None, 'high_water': 6, 'model_at_fault': False}

    second = make_attempt(j)
    run = await second.start_run(j)
    for n in range(3):
        await bodies.run(run, f'x{n}')  # diverges at 0
    assert run.diverged
    await run.fail(RuntimeError('failed at 3'), model_at_fault=False)
    await second.finish(RuntimeError('failed'))
    assert await meta_of(j) == {'v': 1, 'diverge_from': 3, 'high_water': 6, 'model_at_fault': False}

    third = make_attempt(j)
    run = await third.start_run(j)
    steps = [await bodies.run(run, name) for name in ('x0', 'x1', 'x2', 's3')]
    await third.finish(None)
    assert [s.replayed for s in steps] == [True, True, True, False]


async def test_f6_refused_meta_write_is_ignored(backend_journal: Journal) -> None:
    j = backend_journal
    attempt = make_attempt(j)
    refusing = RecordRefused(j)
    run = await attempt.start_run(refusing)
    await run.claim('a', 'tool', 'fa').record('a')
    await run.fail(RuntimeError('boom'), model_at_fault=False)  # does not raise
    await attempt.finish(RuntimeError('boom'))
    assert await meta_of(j) is None
    assert (await j.read_run(KEY, '0')).entries[0]['payload'] == 'a'


@pytest.mark.parametrize(
    ('meta', 'fenced_at', 'reason'),
    [
        ({'v': 1, 'diverge_from': '1', 'high_water': 'x', 'model_at_fault': 'true'}, None, None),
        ({'v': 1, 'diverge_from': True}, None, None),
        ({'v': 1, 'diverge_from': 1.0}, None, None),
        ({'v': 1, 'diverge_from': 1, 'model_at_fault': 1}, 1, 'previous attempt failed before this step'),
        (
            {'v': 1, 'diverge_from': 1, 'model_at_fault': True},
            1,
            "model's answers from here failed the previous attempt",
        ),
        ({'v': 1, 'diverge_from': 0, 'high_water': 2}, 0, 'previous attempt failed before this step'),
    ],
)
async def test_f7_meta_fence_is_read_leniently_and_applied_at_claim_time(
    backend_journal: Journal,
    caplog: pytest.LogCaptureFixture,
    meta: dict[str, Any],
    fenced_at: int | None,
    reason: str | None,
) -> None:
    j = backend_journal
    await record_all(j, [('a', 'model', 'fa'), ('b', 'tool', 'fb')])
    assert await Operator(j).write_record(KEY, '0', 'meta', meta)
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    steps = [run.claim('a', 'model', 'fa'), run.claim('b', 'tool', 'fb')]
    await attempt.finish(None)

    assert [s.replayed for s in steps] == [fenced_at is None or p < fenced_at for p in (0, 1)]
    divergences = [w for w in warnings_of(caplog) if 'diverged' in w]
    if reason is None:
        assert divergences == []
    else:
        (warning,) = divergences
        assert f'position {fenced_at}' in warning and reason in warning


async def test_f6_high_water_of_an_unreadable_meta_counts_as_zero(backend_journal: Journal) -> None:
    j = backend_journal
    assert await Operator(j).write_record(KEY, '0', 'meta', {'v': 1, 'diverge_from': None, 'high_water': 'lots'})
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    run.claim('a', 'tool', 'f')
    run.claim('b', 'tool', 'f')
    await run.fail(RuntimeError('x'), model_at_fault=False)
    await attempt.finish(RuntimeError('x'))
    assert (await meta_of(j) or {})['high_water'] == 2


# -- X-1..X-3: rejecting recorded payloads -- --------------------------------------------------------


async def test_x2_reject_unreplays_the_step_and_diverges_the_run(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = backend_journal
    await record_all(j, [('m0', 'model', 'a'), ('t1', 'tool', 'b'), ('e2', 'other', None)])
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    step = run.claim('m0', 'model', 'a')
    assert step.replayed and attempt.stats.replayed == Counter(model=1)

    step.reject()

    assert not step.replayed and step.payload is None
    assert attempt.stats.replayed['model'] == 0
    assert [s.outcome for s in attempt.stats.steps] == ['live']
    assert run.diverged
    assert any('position 0 (m0)' in w and 'recorded result no longer loads' in w for w in warnings_of(caplog))
    assert await step.record('fresh answer') is True  # runs live and records over the bad entry
    assert not run.claim('t1', 'tool', 'b').replayed  # later matching entries run live
    assert not run.claim('e2', 'other', None).replayed
    await attempt.finish(None)
    assert (await j.read_run(KEY, '0')).entries[0]['payload'] == 'fresh answer'
    assert attempt.stats.recorded == Counter(model=1)


async def test_x3_reject_on_a_step_that_did_not_replay_is_a_noop(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('m0', 'model', 'a'), ('t1', 'tool', 'b'), ('t2', 'tool', 'c')])
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    replayed = run.claim('m0', 'model', 'a')
    live = run.claim('new', 'tool', 'n')  # position 1: diverges
    assert run.diverged
    counters = Counter(attempt.stats.replayed)
    live.reject()
    assert attempt.stats.replayed == counters == Counter(model=1)
    await attempt.finish(None)

    third = make_attempt(j)
    run = await third.start_run(j)
    first_step = run.claim('m0', 'model', 'a')
    first_step.reject()
    first_step.reject()  # a second reject changes nothing
    assert third.stats.replayed['model'] == 0
    assert replayed.replayed
    await third.finish(None)


async def test_x3_reject_of_a_live_step_keeps_the_run_replaying(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('t1', 'tool', 'b')])
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    run.claim('t1', 'tool', 'b', replayable=False).reject()
    assert not run.diverged
    assert attempt.stats.replayed.total() == 0
    await attempt.finish(None)


# -- B-3 / J-3: entries this version cannot read -------------------------------------------------

GOOD = {'v': 1, 'name': 's0', 'kind': 'tool', 'fingerprint': 'f0', 'payload': 'old'}
BAD_ENTRIES = {
    'unknown_version': {**GOOD, 'v': 2},
    'no_version': {k: v for k, v in GOOD.items() if k != 'v'},
    'name_not_text': {**GOOD, 'name': 7},
    'unknown_kind': {**GOOD, 'kind': 'renamed_in_a_later_version'},
    'no_payload': {k: v for k, v in GOOD.items() if k != 'payload'},
    'fingerprint_not_text': {**GOOD, 'fingerprint': 42},
}


@pytest.mark.parametrize('bad', BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
async def test_b3_entry_of_unknown_version_or_shape_runs_live_with_one_warning(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture, bad: dict[str, Any]
) -> None:
    j = backend_journal
    assert await Operator(j).write_entry(KEY, '0', 0, bad)
    assert await Operator(j).write_entry(
        KEY, '0', 1, {**GOOD, 'name': 's1', 'fingerprint': 'f1', 'payload': 'recorded'}
    )
    bodies = Bodies()
    attempt = make_attempt(j)
    run = await attempt.start_run(j)

    zero = await bodies.run(run, 's0', 'live', fp='f0')
    one = await bodies.run(run, 's1', fp='f1')
    await attempt.finish(None)

    assert not zero.replayed and one.replayed and one.payload == 'recorded'
    assert not run.diverged
    assert bodies.calls == Counter(s0=1)
    (warning,) = warnings_of(caplog)
    assert 'positions [0]' in warning
    assert identity((await j.read_run(KEY, '0')).entries[0]) == {**GOOD, 'payload': 'live'}  # recorded over


@pytest.mark.parametrize('raw', ['not json {', '[1, 2]', '"text"', 'null'])
async def test_j3_stored_non_dict_entry_runs_live(
    backend_case: BackendCase, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    j = backend_case.journal
    await record_all(j, [('s0', 'tool', 'f0'), ('s1', 'tool', 'f1')])
    backend_case.put_raw(('entry', KEY, '0', 0), raw)
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    zero = run.claim('s0', 'tool', 'f0')
    one = run.claim('s1', 'tool', 'f1')
    await attempt.finish(None)
    assert not zero.replayed and one.replayed
    assert len(warnings_of(caplog)) == 1


async def test_j3_unreadable_meta_is_no_fence(backend_case: BackendCase) -> None:
    j = backend_case.journal
    await record_all(j, [('s0', 'tool', 'f0'), ('s1', 'tool', 'f1')])
    await Operator(j).write_record(KEY, '0', 'meta', {'v': 1, 'diverge_from': 0, 'high_water': 2})
    backend_case.put_raw(('record', KEY, '0', 'meta'), 'not json {')
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    assert run.claim('s0', 'tool', 'f0').replayed
    assert run.claim('s1', 'tool', 'f1').replayed
    await attempt.finish(None)


async def test_jf1_a_run_whose_entries_cannot_be_read_stops_before_any_step(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('s0', 'tool', 'f0')])
    attempt = make_attempt(j)
    with pytest.raises(JournalUnavailable) as unavailable:
        await attempt.start_run(ReadRunRaises(j))
    await attempt.finish(unavailable.value)
    message = str(unavailable.value)
    assert 'connection reset' in message and 'never taken for an empty one' in message
    assert attempt.runs == []  # no run started, so no step could run live

    retry = make_attempt(j)  # once the store reads again, everything recorded replays
    run = await retry.start_run(j)
    assert run.claim('s0', 'tool', 'f0').replayed
    await retry.finish(None)


async def test_jf1_an_execution_record_that_cannot_be_read_is_no_fresh_start(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('s0', 'tool', 'f0')])

    class RecordUnreadable(Wrapped):
        async def read_execution(self, key: str) -> dict[str, Any] | None:
            raise OSError('statement timeout')

    attempt = make_attempt(j)
    with pytest.raises(JournalUnavailable, match='statement timeout'):
        await attempt.open(RecordUnreadable(j))
    await attempt.finish(None)
    assert (await j.read_execution(KEY) or {})['attempts'] == 1  # nothing was overwritten as if new


# -- E. Cleanup (C) ------------------------------------------------------------------------------


async def test_c3_per_run_cleanup_deletes_the_run_when_it_succeeds(backend_journal: Journal) -> None:
    j = backend_journal
    first = make_attempt(j, cleanup='run')
    run0 = await first.start_run(j)
    await run0.claim('a', 'tool', 'f').record('a')
    await run0.fail(RuntimeError('x'), model_at_fault=False)  # leaves a meta behind
    await first.finish(RuntimeError('x'))
    assert await meta_of(j) is not None

    second = make_attempt(j, cleanup='run')
    run0 = await second.start_run(j)
    run1 = await second.start_run(j)
    assert run0.claim('a', 'tool', 'f').replayed
    await run0.claim('b', 'tool', 'f').record('b')
    await run1.claim('c', 'tool', 'f').record('c')

    await second.cleanup_run(run0)

    assert await j.read_run(KEY, '0') == RunSnapshot()  # entries and meta
    assert (await j.read_execution(KEY) or {})['runs'] == ['1']
    assert (await j.read_run(KEY, '1')).entries[0]['payload'] == 'c'
    await second.cleanup_run(run1)
    assert await j.read_run(KEY, '1') == RunSnapshot()
    await second.finish(None)
    assert await j.read_execution(KEY) is None  # no runs list once it is empty
    assert await j.list_executions() == []


async def test_c1_cleanup_reaches_positions_this_attempt_never_claimed(backend_journal: Journal) -> None:
    j = backend_journal
    first = make_attempt(j)
    run = await first.start_run(j)
    for name in ('a', 'b', 'c'):
        await run.claim(name, 'tool', name).record(name)
    await run.fail(RuntimeError('failed'), model_at_fault=False)
    await first.finish(RuntimeError('failed'))

    second = make_attempt(j, cleanup='execution')
    run = await second.start_run(j)
    await run.claim('different', 'tool', 'z').record('z')
    await second.finish(None)

    assert await j.read_run(KEY, '0') == RunSnapshot()
    assert await j.read_execution(KEY) is None
    assert await j.list_executions() == []


async def test_c1_cleanup_after_a_kill_without_meta_leaves_nothing(backend_journal: Journal) -> None:
    j = backend_journal
    first = make_attempt(j)
    run = await first.start_run(j)
    for name in ('a', 'b', 'c'):
        await run.claim(name, 'tool', name).record(name)
    await first.finish(SimulatedCrash())
    assert (await j.read_run(KEY, '0')).records == {}
    assert len((await j.read_run(KEY, '0')).entries) == 3

    second = make_attempt(j, cleanup='execution')
    run = await second.start_run(j)
    assert run.claim('a', 'tool', 'a').replayed
    await second.finish(None)

    assert await j.read_run(KEY, '0') == RunSnapshot()
    assert await j.list_executions() == []


async def test_c4_fully_replayed_attempt_still_leaves_an_empty_journal(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('a', 'model', 'fa'), ('b', 'tool', 'fb')])
    attempt = make_attempt(j, cleanup='execution')
    run = await attempt.start_run(j)
    assert run.claim('a', 'model', 'fa').replayed and run.claim('b', 'tool', 'fb').replayed
    await attempt.finish(None)
    assert attempt.stats.recorded.total() == 0
    assert await j.list_executions() == []
    assert await j.read_run(KEY, '0') == RunSnapshot()


@pytest.mark.parametrize(
    ('cleanup', 'error', 'status'),
    [('execution', RuntimeError('failed'), 'failed'), ('keep', None, 'finished'), ('run', None, 'finished')],
)
async def test_c3_entries_stay_unless_execution_cleanup_succeeds(
    backend_journal: Journal, cleanup: CleanupMode, error: BaseException | None, status: str
) -> None:
    j = backend_journal
    attempt = make_attempt(j, cleanup=cleanup)
    run = await attempt.start_run(j)
    await run.claim('a', 'tool', 'f').record('a')
    assert [info.state for info in await j.list_executions()] == ['running']
    await attempt.finish(error)
    assert (await j.read_run(KEY, '0')).entries[0]['payload'] == 'a'
    (info,) = await j.list_executions()
    assert (info.state, info.steps) == (status, 1)
    assert (await j.read_execution(KEY) or {})['status'] == status


async def test_c3_simulated_crash_writes_nothing_but_frees_the_lease(backend_journal: Journal) -> None:
    j = backend_journal
    attempt = make_attempt(j, cleanup='execution')
    run = await attempt.start_run(j)
    await run.claim('a', 'tool', 'f').record('a')
    await attempt.finish(SimulatedCrash())
    (info,) = await j.list_executions()
    assert info.state == 'interrupted'  # the record still says running, but nobody holds it
    assert (await j.read_execution(KEY) or {})['status'] == 'running'
    assert (await j.acquire_lease(KEY, 'next attempt', 30)).holder == 'next attempt'


async def test_c5_cleanup_never_raises_when_delete_raises(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = backend_journal
    broken = DeleteRaises(j)
    attempt = make_attempt(j, cleanup='execution')
    run = await attempt.start_run(broken)
    await run.claim('a', 'tool', 'f').record('a')

    await attempt.cleanup_run(run)
    await attempt.finish(None)

    cleanup_warnings = [w for w in warnings_of(caplog) if 'cleanup failed' in w and 'delete failed' in w]
    assert len(cleanup_warnings) == 2
    assert (await j.read_run(KEY, '0')).entries[0]['payload'] == 'a'  # only entries a retry would replay
    again = make_attempt(j)
    await again.open(j)  # the lease was released all the same
    await again.finish(None)


# -- S: stats and summary ------------------------------------------------------------------------


async def test_s2_summary_and_warnings_for_steps_that_ran_but_were_not_recorded(
    backend_journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    j = backend_journal
    caplog.set_level(logging.INFO, logger=LOGGER)
    journal = FailsNames(j, {'send_email', 'notify', 'agent__model.request.big'})
    attempt = make_attempt(j, write_timeout=0)
    run = await attempt.start_run(journal)
    await run.claim('agent__model.request', 'model', 'm').record('answer')
    await run.claim('agent__capability__c.op', 'other', None).record('op')
    # A parallel batch whose records all fail: each ran, none is recorded, and the attempt stops (JF-2).
    batch = [run.claim(name, 'tool', name) for name in ('send_email', 'notify', 'send_email')]
    batch.append(run.claim('agent__model.request.big', 'model', 'mb'))
    outcomes = await asyncio.gather(*(step.record('sent') for step in batch), return_exceptions=True)
    assert all(isinstance(outcome, JournalUnavailable) for outcome in outcomes)

    caplog.clear()
    await attempt.finish(JournalUnavailable('stopped'))

    assert attempt.stats.recorded == Counter(model=1, other=1)
    assert attempt.stats.not_recorded == [
        ('tool', 'send_email'),
        ('tool', 'notify'),
        ('tool', 'send_email'),
        ('model', 'agent__model.request.big'),
    ]
    summary = 'replayed 0 steps (0 model, 0 tool, 0 other), recorded 2 new steps (1 model, 0 tool, 1 other)'
    assert attempt.stats.summary() == summary
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name == LOGGER]
    assert any(summary in message and KEY in message for message in infos)
    tool_warning, model_warning = warnings_of(caplog)
    assert 'send_email (x2), notify' in tool_warning
    assert 'notify (x' not in tool_warning
    assert '1 model step was not recorded' in model_warning
    assert 'every step after the first' in model_warning


async def test_s1_stats_count_replayed_and_recorded_per_kind(backend_journal: Journal) -> None:
    j = backend_journal
    await record_all(j, [('m', 'model', 'a'), ('t', 'tool', 'b'), ('o', 'other', None), ('t2', 'tool', 'c')])
    attempt = make_attempt(j)
    run = await attempt.start_run(j)
    for name, kind, fp in [('m', 'model', 'a'), ('t', 'tool', 'b'), ('o', 'other', None)]:
        assert run.claim(name, kind, fp).replayed  # type: ignore[arg-type]
    await run.claim('t2', 'tool', 'changed').record('new')
    await run.claim('m2', 'model', 'd').record('new')
    await attempt.finish(None)
    assert attempt.stats.replayed == Counter(model=1, tool=1, other=1)
    assert attempt.stats.recorded == Counter(tool=1, model=1)
    assert attempt.stats.summary() == (
        'replayed 3 steps (1 model, 1 tool, 1 other), recorded 2 new steps (1 model, 1 tool, 0 other)'
    )


# -- B-5: leases through the core ----------------------------------------------------------------


async def test_b5_second_attempt_is_busy_while_the_first_is_open(backend_journal: Journal) -> None:
    j = backend_journal
    first = make_attempt(j, lease_ttl=120)
    before = time.time()
    await first.start_run(j)

    second = make_attempt(j)
    with pytest.raises(ExecutionBusy) as caught:
        await second.start_run(j)

    busy = caught.value
    assert busy.key == KEY
    assert busy.holder == first.holder
    assert before + 119 <= busy.expires_at <= time.time() + 121
    assert first.holder in str(busy) and KEY in str(busy)
    assert (await j.read_execution(KEY) or {})['attempts'] == 1  # refused before touching anything
    assert second.runs == []

    await first.finish(None)
    third = make_attempt(j)
    await third.start_run(j)  # free after finish
    assert third.number == 2
    await third.finish(None)


async def test_b12_jf3_lease_left_by_an_ended_attempt_of_this_process_is_taken_over_at_once(
    backend_journal: Journal,
) -> None:
    j = backend_journal

    class ReleaseFails(Wrapped):  # the store failed as the first attempt ended: its lease stays behind
        async def release_lease(self, key: str, holder: str, epoch: int) -> None:
            raise OSError('connection lost')

    first = make_attempt(j, lease_ttl=3600)
    await first.start_run(ReleaseFails(j))
    await first.finish(RuntimeError('the run failed'))
    # Still leased, for an hour, but by an ended attempt of this process: not running, as the engine judges (FN-3).
    assert [info.state for info in await j.list_executions()] == ['failed']

    attempt = make_attempt(j)
    started = time.monotonic()
    await attempt.start_run(j)
    assert time.monotonic() - started < 5  # no waiting for the hour-long lease: its holder is this process's, ended

    held = await j.acquire_lease(KEY, 'someone else', 30)
    assert held.holder == attempt.holder
    await attempt.finish(None)


@pytest.mark.parametrize(
    'holder',
    [
        'elsewhere.example.com:1:x',  # an older release's format: nothing can be proved
        'this-process-live',  # another attempt of this process, still running
        f'{socket.gethostname()}:1:0123456789ab:1',  # this release's format, another process, unprovable
        'no-pid-at-all',
    ],
)
async def test_b5_b12_live_lease_of_another_host_or_a_live_attempt_is_respected(
    backend_journal: Journal, holder: str
) -> None:
    j = backend_journal
    live = holder == 'this-process-live'
    if live:
        holder = new_holder()
        start_holding(holder)
    try:
        assert (await j.acquire_lease(KEY, holder, 3600)).holder == holder
        with pytest.raises(ExecutionBusy) as caught:
            await make_attempt(j).open(j)
        assert caught.value.holder == holder
    finally:
        if live:
            end_holding(holder)


async def test_b5_expired_lease_is_taken_over(backend_journal: Journal) -> None:
    j = backend_journal
    assert (await j.acquire_lease(KEY, 'elsewhere.example.com:1:x', 0.05)).holder == 'elsewhere.example.com:1:x'
    time.sleep(0.1)
    attempt = make_attempt(j)
    await attempt.open(j)
    await attempt.finish(None)


# -- B-7: journals that cannot be used -----------------------------------------------------------


async def test_b7_journal_path_that_is_a_file_fails_before_any_step(tmp_path: Any) -> None:
    path = tmp_path / 'journal'
    path.write_text('a file')
    journal = DiskJournal(path)
    attempt = make_attempt(journal)
    with pytest.raises(JournalUnavailable, match='is a file'):
        await attempt.start_run(journal)
    assert attempt.runs == []
    await attempt.finish(None)


async def test_b7_refused_execution_record_is_unavailable_and_frees_the_lease(backend_journal: Journal) -> None:
    j = backend_journal

    class ExecutionRefused(Wrapped):
        async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
            return False

    attempt = make_attempt(j)
    with pytest.raises(JournalUnavailable, match='refused to record the start'):
        await attempt.open(ExecutionRefused(j))
    again = make_attempt(j)
    await again.open(j)
    await again.finish(None)


# -- regressions: bugs found while writing this suite (fixed in the package since) -------------


@pytest.mark.parametrize('runs', [5, None])
async def test_b3_execution_record_of_the_wrong_shape_does_not_break_open(backend_journal: Journal, runs: Any) -> None:
    j = backend_journal
    assert await Operator(j).write_execution(KEY, {'v': 1, 'runs': runs, 'attempts': 1})
    attempt = make_attempt(j)
    try:
        run = await attempt.start_run(j)
        assert run.key == '0'
        assert (await j.read_execution(KEY) or {})['runs'] == ['0']
    finally:
        await attempt.finish(None)


async def test_b5_lease_is_released_when_opening_fails_after_taking_it(backend_journal: Journal) -> None:
    j = backend_journal

    class ExecutionWriteRaises(Wrapped):
        async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
            raise OSError('connection lost')

    failing = make_attempt(j, lease_ttl=3600)
    with pytest.raises(JournalUnavailable, match='connection lost'):
        await failing.open(ExecutionWriteRaises(j))
    await failing.finish(None)

    retry = make_attempt(j)
    await retry.open(j)
    await retry.finish(None)


@pytest.mark.parametrize('method', ['acquire_lease', 'write_execution'])
async def test_b7_backend_error_at_execution_start_is_journal_unavailable(
    backend_journal: Journal, method: str
) -> None:
    j = backend_journal

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError('database is locked')

    journal = Wrapped(j)
    setattr(journal, method, broken)
    attempt = make_attempt(j)
    try:
        with pytest.raises(JournalUnavailable):
            await attempt.open(journal)  # type: ignore[arg-type]
    finally:
        await attempt.finish(None)


async def test_r2_concurrent_first_runs_open_the_journal_once(backend_journal: Journal) -> None:
    j = backend_journal

    class AsyncOpen(Wrapped):
        async def open(self) -> None:
            await asyncio.sleep(0)  # a network backend awaits here
            await self.inner.open()

    journal = AsyncOpen(j)
    attempt = make_attempt(j, lease_ttl=3600)  # an orphaned renewer must not fire during the session
    runs = await asyncio.gather(attempt.start_run(journal), attempt.start_run(journal))  # type: ignore[arg-type]
    await attempt.finish(None)
    assert sorted(r.key for r in runs) == ['0', '1']
    assert attempt.number == 1
    assert (await j.read_execution(KEY) or {})['attempts'] == 1


class UnavailableTwice(Wrapped):
    """A store whose first two entry writes raise `JournalUnavailable`, as a backend that lost its server does."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(journal)
        self.failed = 0

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        if self.failed < 2:
            self.failed += 1
            raise JournalUnavailable('the server closed the connection')
        return await self.inner.write_entry(key, run, position, entry, epoch=epoch)


def test_e4_every_fault_of_the_journal_is_a_journal_error() -> None:
    from pydantic_ai_durable import EncryptionMismatch, JournalCorrupt, ResultNotJournalable

    for fault in (JournalUnavailable, ResultNotJournalable, JournalCorrupt, EncryptionMismatch):
        assert issubclass(fault, JournalError), fault


async def test_e4_jf2_a_store_that_raises_journal_unavailable_for_now_is_retried_not_given_up_at_once(
    backend_journal: Journal,
) -> None:
    journal = UnavailableTwice(backend_journal)
    attempt = make_attempt(backend_journal, write_timeout=5.0)
    run = await attempt.start_run(journal)
    step = run.claim('send_email', 'tool', 'fp')
    await step.record('sent')  # retried past the two failures: a JournalError that may pass is not a refusal
    assert journal.failed == 2
    assert (await backend_journal.read_run(KEY, run.key)).entries[0] is not None
    await attempt.finish(None)
