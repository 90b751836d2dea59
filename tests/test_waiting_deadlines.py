"""Deadlines of waiting calls (WT-5), on memory, disk and PostgreSQL: denied when they pass, and the run goes on.

The deadline pass is judged with a clock the test sets (`deny_overdue(journal, now=...)`); through the sweep,
with a deadline a few milliseconds long. Each outcome is compared with pydantic-ai's own second run given the
same denial.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic_ai import DeferredToolRequests, DeferredToolResults
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import ToolDenied
from stores import Store, disk_store
from waiting_agent import KEY, attempt, lines, plain_two_runs

from pydantic_ai_durable import Durable, Journal, MemoryJournal, deny_overdue, pending_calls, resolve, sweep_interrupted


async def test_wt5_a_call_pending_past_its_deadline_is_denied_and_the_run_goes_on(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    await attempt(new_journal(), log, wait_timeout=3600)
    (call,) = await pending_calls(new_journal(), KEY)
    assert call.deadline == pytest.approx(call.since + 3600)

    assert await deny_overdue(new_journal(), now=call.since + 3599) == []  # not yet
    (resolution,) = await deny_overdue(new_journal(), now=call.since + 3601)
    assert (resolution.key, resolution.decided, resolution.completed) == (KEY, ('c2',), True)
    (decided,) = await pending_calls(new_journal(), KEY, decided=True)
    assert decided.decision is not None
    assert (decided.decision.kind, decided.decision.via, decided.decision.by) == ('denied', 'deadline', None)
    message = decided.decision.message
    assert message == 'Nobody decided this call within 1 hour: it timed out and was denied.'

    output = await attempt(new_journal(), log, wait_timeout=3600)
    plain = DeferredToolResults(approvals={'c2': ToolDenied(message)})
    assert output == (await plain_two_runs(tmp_path / 'plain', 'one', plain))[0]
    assert 'timed out' in output and 'refund 5' not in lines(log)
    assert await deny_overdue(new_journal(), now=call.since + 10**9) == []  # finished: nothing waits


async def test_wt5_each_call_takes_its_deadline_from_its_deferral_its_tool_or_the_capability(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    await attempt(new_journal(), tmp_path / 'log', 'three', wait_timeout=3600, refund_timeout=600, carrier_timeout=60)
    calls = {call.call_id: call for call in await pending_calls(new_journal(), KEY)}
    assert {call_id: call.deadline - call.since for call_id, call in calls.items() if call.deadline} == {
        'c2': pytest.approx(600),
        'c3': pytest.approx(600),
        'c4': pytest.approx(60),
    }
    since = min(call.since for call in calls.values())
    (resolution,) = await deny_overdue(new_journal(), now=since + 61)  # only the carrier's answer is late
    assert (resolution.decided, resolution.pending) == (('c4',), ('c2', 'c3'))
    await resolve(new_journal(), KEY, approvals={'c2': True, 'c3': False})
    output = await attempt(new_journal(), tmp_path / 'log', 'three')
    refused = 'Nobody decided this call within 1 minute: it timed out and was denied.'
    plain = DeferredToolResults(approvals={'c2': True, 'c3': False}, calls={'c4': ToolFailed(refused)})
    assert output == (await plain_two_runs(tmp_path / 'plain', 'three', plain))[0]


async def test_wt5_without_a_deadline_a_call_waits_for_ever(new_journal: Callable[[], Journal], tmp_path: Path) -> None:
    await attempt(new_journal(), tmp_path / 'log')
    assert await deny_overdue(new_journal(), now=10**12) == []
    (call,) = await pending_calls(new_journal(), KEY)
    assert call.deadline is None


async def test_wt5_a_deadline_that_is_not_a_positive_number_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for wrong in (0, -1, float('nan'), True, '60'):
        with pytest.raises(ValueError, match='wait_timeout'):
            Durable(wait_timeout=wrong)  # type: ignore[arg-type]
    memory = MemoryJournal()
    with caplog.at_level(logging.WARNING, logger='pydantic_ai_durable'):
        await attempt(memory, tmp_path / 'log', refund_timeout='soon', wait_timeout=30)
    (call,) = await pending_calls(memory, KEY)
    assert call.deadline == pytest.approx(call.since + 30)  # the capability's default applies
    assert 'wait_timeout in the metadata of the tool' in caplog.text


async def test_wt5_wt4_the_sweep_denies_overdue_calls_first_and_sends_the_execution_they_leave_ready(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    output = await attempt(new_journal(), log, wait_timeout=0.01)
    assert isinstance(output, DeferredToolRequests)
    await asyncio.sleep(0.05)
    sent: list[str] = []
    # The deadline decided its last call: it is ready, and sent at once, not `idle` seconds later (WT-4).
    assert await sweep_interrupted(new_journal(), lambda info: sent.append(info.key), idle=3600) == [KEY]
    assert await sweep_interrupted(new_journal(), lambda info: sent.append(info.key), idle=3600) == []
    assert sent == [KEY]
    (call,) = await pending_calls(new_journal(), KEY, decided=True)
    assert call.decision is not None and call.decision.via == 'deadline'
    output = await attempt(new_journal(), log, wait_timeout=0.01)
    assert 'timed out and was denied' in output


async def test_wt5_a_deadline_further_than_a_hundred_years_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for far in (1e12, 100 * 365 * 86400 + 1):
        with pytest.raises(ValueError, match=r'Durable\(wait_timeout=...\) is .* \(a hundred years\)'):
            Durable(wait_timeout=far)
    assert Durable(wait_timeout=100 * 365 * 86400) is not None  # a hundred years is still a deadline
    memory = MemoryJournal()
    with caplog.at_level(logging.WARNING, logger='pydantic_ai_durable'):
        await attempt(memory, tmp_path / 'log', refund_timeout=1e12, wait_timeout=30)
    (call,) = await pending_calls(memory, KEY)
    assert call.deadline == pytest.approx(call.since + 30)  # the capability's default applies, as for any wrong one
    assert 'wait_timeout in the metadata of the tool is 1e+12 seconds' in caplog.text


FAR = 1e13
"""Epoch seconds in the year 318857: past the calendar `datetime` knows."""


def _cli(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    assert store.cli is not None
    command = [sys.executable, '-m', 'pydantic_ai_durable', *store.cli, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_wt5_a_stored_deadline_beyond_the_calendar_is_shown_by_show_list_and_the_console(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from pydantic_ai_durable._console import ConsoleSettings, build_app

    store = disk_store(tmp_path)

    async def plant() -> None:
        journal = store.make(None)
        await attempt(journal, tmp_path / 'log', 'three', wait_timeout=3600)
        record = await journal.read_execution(KEY)
        await journal.close()
        assert record is not None
        record['deferred']['c2']['deadline'] = FAR  # as someone who can write the store, or an older release, left it
        record['deferred']['c3']['decision'] = {'kind': 'approved', 'at': FAR, 'by': 'mallory', 'via': 'resolve'}
        store.put_raw(('execution', KEY), json.dumps(record))

    asyncio.run(plant())
    shown = _cli(store, 'show', KEY)
    assert shown.returncode == 0 and shown.stderr == '', shown.stderr
    assert shown.stdout.count('1e+13 epoch seconds (beyond the calendar)') == 2, shown.stdout  # c2's deadline, c3's
    for args in (['list', '--json'], ['list', '--state', 'waiting', '--json'], ['show', KEY, '--json']):
        listed = _cli(store, *args)
        assert listed.returncode == 0 and listed.stderr == '', (args, listed.stderr)
        assert '"1e+13 epoch seconds (beyond the calendar)"' in listed.stdout, (args, listed.stdout)
    app = build_app(store.make(None), ConsoleSettings(by='ops'))
    with TestClient(app, base_url='http://127.0.0.1:8765') as client:
        for page in (
            '/waiting',
            f'/execution?key={KEY}',
            '/api/waiting',
            f'/api/execution?key={KEY}',
        ):
            answer = client.get(page)
            assert answer.status_code == 200 and '1e+13 epoch seconds (beyond the calendar)' in answer.text, page


def test_wt5_a_busy_execution_whose_lease_expiry_is_beyond_the_calendar_is_still_reported() -> None:
    # a lease's expiry is a stored time too: a planted one must not turn the refusal into an OverflowError
    from pydantic_ai_durable import ExecutionBusy

    busy = ExecutionBusy('k', holder='someone', expires_at=1e13)
    assert '1e+13 epoch seconds (beyond the calendar)' in str(busy) and busy.expires_at == 1e13
