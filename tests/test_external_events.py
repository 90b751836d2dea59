"""Waits on external events: resume tokens journaled, waited on with nothing held, resolved by token (EV-1..EV-6).

The agent (`event_agent.py`) asks for a refund that needs approval; `HandleDeferredToolCalls` with a handler
that takes a resume token decides it, in place or by handing the token on. Real agents, a real `DiskJournal`,
and the CLI and killed attempts in real child processes; every model request, `ask` and refund is a line of a
log file, so the tests count what ran.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    'pydantic_ai.external_events', reason='pydantic-ai before 2.68 has no waits on external events (EV-6)'
)

from event_agent import KEY, PROMPT, WAIT, build, lines, token_file
from journal_cli import cli
from pydantic_ai.tools import DeferredToolResults

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    DurableError,
    ExecutionWaiting,
    Journal,
    ResolutionRefused,
    deny_overdue,
    execution,
    fail_external_event,
    pending_calls,
    resolve,
    resolve_external_event,
)

HERE = Path(__file__).parent
APPROVE = DeferredToolResults(approvals={'c1': True})
LOCAL = 'http://127.0.0.1:8765'


async def attempt(journal: Journal, log: Path, prompt: str = PROMPT, **options: Any) -> Any:
    """One attempt of the app's code, the same every time: its output, or the `ExecutionWaiting` it raised."""
    agent = build(journal, log, **options)
    try:
        async with execution(KEY, journal=journal):
            result = await agent.run(prompt)
    except ExecutionWaiting as waiting:
        return waiting
    return result.output


def child(journal: Path, log: Path, point: str = '') -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HERE / 'event_child.py'), str(journal), str(log), point],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=HERE,
    )


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / 'log'


@pytest.fixture
def journal(tmp_path: Path) -> DiskJournal:
    return DiskJournal(tmp_path / 'journal')


async def test_ev1_ev2_ev3_a_token_wait_ends_waiting_is_resolved_from_another_process_and_goes_on_asking_once(
    journal: DiskJournal, log: Path, tmp_path: Path
) -> None:
    first = await attempt(journal, log, timeout=timedelta(hours=1))
    assert isinstance(first, ExecutionWaiting) and first.name == WAIT and first.wait == f'{WAIT}@0:1'
    assert lines(log) == ['model', 'ask hand-on']
    (info,) = await journal.list_executions(state='waiting')
    (wait,) = info.pending
    assert (wait.kind, wait.tool_name, wait.run, wait.wait) == ('event', WAIT, '0', 1)
    assert wait.deadline is not None and wait.deadline - wait.since == pytest.approx(3600)
    listed = cli(tmp_path / 'journal', 'list', '--state', 'waiting')
    shown = cli(tmp_path / 'journal', 'show', KEY)
    assert 'waiting' in listed.stdout and WAIT in shown.stdout and 'event' in shown.stdout, shown.stdout

    again = await attempt(journal, log)  # started too early: replays, ends waiting again, asks nobody
    assert isinstance(again, ExecutionWaiting) and lines(log) == ['model', 'ask hand-on']

    token = token_file(log).read_text()
    done = cli(tmp_path / 'journal', 'resolve-event', token, '--payload', '{"approvals": {"c1": true}}', '--by', 'ops')
    assert done.returncode == 0, done.stderr
    (decided,) = await pending_calls(journal, KEY, decided=True)
    assert decided.decision is not None and (decided.decision.kind, decided.decision.by) == ('result', 'ops')

    output = await attempt(journal, log)
    assert output == 'c1 refund: refunded 5'
    assert lines(log) == ['model', 'ask hand-on', 'refund 5', 'model']
    (info,) = await journal.list_executions()
    assert info.state == 'finished'

    replayed = await attempt(journal, log, policy='deny')  # a finished execution: replayed, whatever the policy
    assert replayed == output
    assert lines(log) == ['model', 'ask hand-on', 'refund 5', 'model']  # 0 requests, 0 tools, 0 asks


async def test_ev1_an_answer_given_in_place_is_what_every_replay_gets(journal: DiskJournal, log: Path) -> None:
    assert await attempt(journal, log, policy='approve') == 'c1 refund: refunded 5'
    assert lines(log) == ['model', 'ask approve', 'refund 5', 'model']
    (info,) = await journal.list_executions()
    assert info.state == 'finished' and info.pending == ()

    # The policy changed between attempts: the replay keeps the answer the refund was paid on.
    assert await attempt(journal, log, policy='deny') == 'c1 refund: refunded 5'
    assert lines(log) == ['model', 'ask approve', 'refund 5', 'model']


async def test_ev3_a_guessed_or_forged_token_resolves_nothing(journal: DiskJournal, log: Path, tmp_path: Path) -> None:
    assert isinstance(await attempt(journal, log), ExecutionWaiting)
    token = token_file(log).read_text()
    prefix, key, ref, secret = token.split('.')
    forged = [
        f'{prefix}.{key}.{ref}.{secret[:-1]}{"A" if secret[-1] != "A" else "B"}',  # one character off
        f'{prefix}.{key}.{ref}.' + 'A' * len(secret),  # the key and the wait's name guessed, the secret not
        f'{prefix}.{key}.{ref}',
        f'other.{key}.{ref}.{secret}',
        'not a token',
    ]
    for guess in forged:
        with pytest.raises(ResolutionRefused):
            await resolve_external_event(journal, guess, APPROVE)
        with pytest.raises(ResolutionRefused):
            await fail_external_event(journal, guess, 'no')
    with pytest.raises(ResolutionRefused, match='resolve it with the token'):
        await resolve(journal, KEY, results={WAIT: {'approvals': {'c1': True}}})  # by key and name: no token
    refused = cli(tmp_path / 'journal', 'complete', KEY, WAIT, '--result', '{"approvals": {"c1": true}}')
    assert refused.returncode != 0 and 'token' in refused.stderr
    forged_cli = cli(tmp_path / 'journal', 'resolve-event', forged[1], '--payload', '{}')
    assert forged_cli.returncode != 0 and 'not the one this wait handed out' in forged_cli.stderr
    (wait,) = await pending_calls(journal, KEY)
    assert wait.pending
    assert isinstance(await attempt(journal, log), ExecutionWaiting)
    assert lines(log) == ['model', 'ask hand-on']  # nothing ran on a forged resolution


async def test_ev3_the_first_resolution_wins(journal: DiskJournal, log: Path) -> None:
    assert isinstance(await attempt(journal, log), ExecutionWaiting)
    token = token_file(log).read_text()
    first = await resolve_external_event(journal, token, APPROVE, by='alice')
    assert first.completed and first.decided == (WAIT,)
    with pytest.raises(ResolutionRefused, match='decided already'):
        await resolve_external_event(journal, token, DeferredToolResults(approvals={'c1': False}), by='bob')
    with pytest.raises(ResolutionRefused, match='decided already'):
        await fail_external_event(journal, token, 'too late', by='bob')
    same = await resolve_external_event(journal, token, APPROVE, by='alice')  # a retried request: accepted
    assert same.unchanged and not same.decided
    assert await attempt(journal, log) == 'c1 refund: refunded 5'
    with pytest.raises(ResolutionRefused, match='finished'):
        await resolve_external_event(journal, token, APPROVE)  # the wait ended with its execution
    assert lines(log).count('refund 5') == 1 and lines(log).count('ask hand-on') == 1


async def test_ev4_a_failed_wait_denies_the_calls_with_the_reason(journal: DiskJournal, log: Path) -> None:
    assert isinstance(await attempt(journal, log), ExecutionWaiting)
    await fail_external_event(journal, token_file(log).read_text(), 'the approver is on leave')
    output = await attempt(journal, log)
    assert output == 'c1 refund: No decision on this tool call arrived: the approver is on leave'
    assert 'refund 5' not in lines(log) and lines(log).count('ask hand-on') == 1


async def test_ev4_the_cli_fails_a_wait_by_its_token(journal: DiskJournal, log: Path, tmp_path: Path) -> None:
    assert isinstance(await attempt(journal, log), ExecutionWaiting)
    done = cli(tmp_path / 'journal', 'fail-event', '-', '--reason', 'nobody home', '--json')
    assert done.returncode != 0  # no token on stdin
    piped = subprocess.run(
        [
            sys.executable,
            '-m',
            'pydantic_ai_durable',
            '--journal',
            str(tmp_path / 'journal'),
            'fail-event',
            '-',
            '--reason',
            'nobody home',
        ],
        input=token_file(log).read_text(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )
    assert piped.returncode == 0, piped.stderr
    assert await attempt(journal, log) == 'c1 refund: No decision on this tool call arrived: nobody home'


async def test_ev5_a_deadline_passed_denies_the_calls(journal: DiskJournal, log: Path) -> None:
    assert isinstance(await attempt(journal, log, timeout=timedelta(minutes=30)), ExecutionWaiting)
    (resolution,) = await deny_overdue(journal, now=time.time() + 3600)  # the sweep's deadline pass
    assert resolution.completed
    output = await attempt(journal, log, timeout=timedelta(minutes=30))
    assert output == 'c1 refund: No decision on this tool call arrived: No resolution arrived within 30 minutes.'
    assert 'refund 5' not in lines(log)


async def test_ev5_a_wait_reached_past_its_deadline_is_denied_by_it_and_refuses_a_late_resolution(
    journal: DiskJournal, log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(await attempt(journal, log, timeout=timedelta(minutes=30)), ExecutionWaiting)
    token = token_file(log).read_text()
    later = time.time() + 3600
    monkeypatch.setattr(time, 'time', lambda: later)  # the clock moved on; no deadline pass ran
    with pytest.raises(ResolutionRefused, match='deadline'):
        await resolve_external_event(journal, token, APPROVE)
    output = await attempt(journal, log, timeout=timedelta(minutes=30))
    assert output.startswith('c1 refund: No decision on this tool call arrived: No resolution arrived within')
    assert 'refund 5' not in lines(log) and lines(log).count('ask hand-on') == 1


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
async def test_ev2_an_attempt_killed_in_the_wait_keeps_its_token_and_asks_once(tmp_path: Path, log: Path) -> None:
    directory = tmp_path / 'journal'
    killed = child(directory, log, 'after-ask')  # the ask step recorded, the attempt never ended
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert lines(log) == ['model', 'ask hand-on']
    token = token_file(log).read_text()

    rerun = child(directory, log)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rerun.stdout.strip() == f'waiting {WAIT}@0:1'
    assert lines(log) == ['model', 'ask hand-on'] and token_file(log).read_text() == token  # no second ask

    done = cli(directory, 'resolve-event', token, '--payload', '{"approvals": {"c1": true}}')
    assert done.returncode == 0, done.stderr  # the token handed out before the kill still resolves the wait
    finished = child(directory, log)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert finished.stdout.strip() == repr('c1 refund: refunded 5')
    assert lines(log) == ['model', 'ask hand-on', 'refund 5', 'model']
    replayed = child(directory, log)
    assert replayed.stdout.strip() == repr('c1 refund: refunded 5') and len(lines(log)) == 4


@pytest.mark.skipif(sys.platform == 'win32', reason='SIGKILL is POSIX')
async def test_ev2_an_ask_killed_before_its_step_was_recorded_is_asked_again(tmp_path: Path, log: Path) -> None:
    """At least once, like any step: the documented reason `ask` must be safe to call again."""
    killed = child(tmp_path / 'journal', log, 'in-ask')
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    rerun = child(tmp_path / 'journal', log)
    assert rerun.stdout.strip() == f'waiting {WAIT}@0:1', rerun.stderr[-3000:]
    assert lines(log) == ['model', 'ask kill', 'ask hand-on']  # the model's step replays, the ask does not


async def test_ev1_ev3_a_hook_waits_with_wait_for_external_event(journal: DiskJournal) -> None:
    """Not only `HandleDeferredToolCalls`: any capability hook of the run the app started may wait."""
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.external_events import wait_for_external_event
    from pydantic_ai.models.test import TestModel

    tokens: list[str] = []
    seen: list[object] = []

    class GoAhead(AbstractCapability[None]):
        async def before_run(self, ctx: Any) -> None:
            async def ask(token: str) -> None:
                tokens.append(token)

            seen.append(await wait_for_external_event('go_ahead', ask=ask))

    agent = Agent(TestModel(), name='hooked', capabilities=[GoAhead(), Durable(journal)])
    with pytest.raises(ExecutionWaiting) as waiting:
        async with execution('hook-1', journal=journal):
            await agent.run('go')
    assert waiting.value.wait == 'go_ahead@0:0' and seen == []
    await resolve_external_event(journal, tokens[0], {'go': True})
    async with execution('hook-1', journal=journal):
        assert (await agent.run('go')).output == 'success (no tool calls)'
    assert seen == [{'go': True}] and len(tokens) == 1


async def test_ev2_a_run_started_inside_a_tool_cannot_wait(journal: DiskJournal, log: Path) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.models.test import TestModel

    inner = build(journal, log)
    outer = Agent(TestModel(call_tools=['delegate']), name='outer', capabilities=[Durable(journal)])

    @outer.tool_plain
    async def delegate() -> str:
        return (await inner.run(PROMPT)).output

    with pytest.raises((DurableError, UserError), match='inside a'):  # pydantic-ai refuses it first, in a unit
        async with execution('nested-1', journal=journal):
            await outer.run('delegate it')
    assert 'ask hand-on' not in lines(log)


async def test_ev6_a_fleet_delivery_ends_waiting_and_a_resolution_with_dispatch_sends_it_on(
    journal: DiskJournal, log: Path
) -> None:
    from test_fleet_core import ToyAdapter, ToyQueue

    adapter = ToyAdapter(ToyQueue())
    agent = build(journal, log)

    @adapter.task(journal=journal, resume_after=60.0)
    async def refunds(prompt: str) -> str:
        return (await agent.run(prompt)).output

    adapter.delay(refunds, 'job-1', PROMPT)
    waiting = await adapter.work_one()
    assert waiting == {'state': 'waiting', 'key': 'refunds:job-1', 'pending': [WAIT]}
    assert adapter.queue.messages == []  # nothing retries it
    resolution = await resolve_external_event(journal, token_file(log).read_text(), APPROVE, dispatch=True)
    assert (resolution.completed, resolution.dispatched) == (True, True)
    assert await adapter.work_one() == 'c1 refund: refunded 5'
    assert lines(log) == ['model', 'ask hand-on', 'refund 5', 'model']


async def test_ev3_the_console_lists_a_token_wait_and_offers_no_way_to_resolve_it_without_the_token(
    journal: DiskJournal, log: Path, tmp_path: Path
) -> None:
    pytest.importorskip('starlette', reason='the console needs the extra console')
    from starlette.testclient import TestClient

    from pydantic_ai_durable._console import ConsoleSettings, build_app

    assert isinstance(await attempt(journal, log, timeout=timedelta(hours=2)), ExecutionWaiting)
    with TestClient(build_app(DiskJournal(tmp_path / 'journal'), ConsoleSettings(by='ops')), base_url=LOCAL) as client:
        (listed,) = client.get('/api/waiting').json()['executions']
        (wait,) = listed['calls']
        assert (wait['call_id'], wait['kind'], wait['deadline'] is not None) == (WAIT, 'event', True)
        page = client.get('/waiting').text
        assert 'waits on an external event' in page and 'resolve-event' in page
        assert 'action="/execution/resolve"' not in page  # no form: the console holds no token
        csrf = client.get('/api/session').json()['csrf']
        refused = client.post(
            '/api/execution/resolve',
            json={'key': KEY, 'results': {WAIT: {'approvals': {'c1': True}}}},
            headers={'X-CSRF-Token': csrf},
        )
        assert 400 <= refused.status_code < 500 and 'token' in refused.text
    (still,) = await pending_calls(journal, KEY)
    assert still.pending


async def test_ev3_a_resolution_reaches_only_the_ask_whose_token_it_was_made_for(
    journal: DiskJournal, log: Path
) -> None:
    """A run that diverged before its wait asks anew, with a new token: the earlier approval is not for it."""
    assert isinstance(await attempt(journal, log), ExecutionWaiting)
    await resolve_external_event(journal, token_file(log).read_text(), APPROVE)
    first_token = token_file(log).read_text()

    again = await attempt(journal, log, prompt='refund order 9, and be quick')  # the model's step runs live
    assert isinstance(again, ExecutionWaiting) and again.wait == f'{WAIT}@0:1'
    assert lines(log) == ['model', 'ask hand-on', 'model', 'ask hand-on'] and 'refund 5' not in lines(log)
    with pytest.raises(ResolutionRefused, match='not the one'):
        await resolve_external_event(journal, first_token, APPROVE)  # the old token names the same wait
    await resolve_external_event(journal, token_file(log).read_text(), APPROVE)
    assert await attempt(journal, log, prompt='refund order 9, and be quick') == 'c1 refund: refunded 5'
    assert lines(log).count('refund 5') == 1


async def test_ev6_the_sweep_sends_on_a_delivery_whose_wait_was_resolved_without_dispatch(
    journal: DiskJournal, log: Path
) -> None:
    import asyncio

    from test_fleet_core import ToyAdapter, ToyQueue

    adapter = ToyAdapter(ToyQueue())
    agent = build(journal, log)

    @adapter.task(journal=journal, resume_after=0.3)
    async def refunds(prompt: str) -> str:
        return (await agent.run(prompt)).output

    adapter.delay(refunds, 'job-2', PROMPT)
    assert (await adapter.work_one()).pending == [WAIT]
    await asyncio.sleep(0.3)
    assert await adapter.fleet.sweep() == []  # still waiting on its token: never sent
    await resolve_external_event(journal, token_file(log).read_text(), APPROVE)
    await asyncio.sleep(0.3)
    assert await adapter.fleet.sweep() == ['refunds:job-2']
    assert await adapter.fleet.sweep() == []
    assert await adapter.work_one() == 'c1 refund: refunded 5'
    assert lines(log) == ['model', 'ask hand-on', 'refund 5', 'model']


async def test_ev2_ev3_an_encrypted_journal_seals_the_wait_and_resolves_it_only_with_its_keys(
    tmp_path: Path, log: Path
) -> None:
    from pydantic_ai_durable import EncryptionMismatch
    from pydantic_ai_durable.journals import Encryption

    keys = Encryption({'a': bytes(range(32))})
    sealed = DiskJournal(tmp_path / 'sealed', encryption=keys)
    assert isinstance(await attempt(sealed, log), ExecutionWaiting)
    token = token_file(log).read_text()
    with pytest.raises(EncryptionMismatch):  # the record, the wait's digest with it, is sealed
        await resolve_external_event(DiskJournal(tmp_path / 'sealed'), token, APPROVE)
    await resolve_external_event(DiskJournal(tmp_path / 'sealed', encryption=keys), token, APPROVE)
    assert await attempt(sealed, log) == 'c1 refund: refunded 5'
    assert lines(log).count('ask hand-on') == 1


async def test_ev1_ev2_ev3_a_token_wait_on_postgres_waits_is_resolved_and_goes_on_asking_once(log: Path) -> None:
    from pg import fresh_schema

    from pydantic_ai_durable import PostgresJournal

    dsn, schema = fresh_schema()
    journal = PostgresJournal(dsn, schema=schema)
    try:
        assert isinstance(await attempt(journal, log), ExecutionWaiting)
        (info,) = await journal.list_executions(state='waiting')
        assert [(wait.kind, wait.tool_name) for wait in info.pending] == [('event', WAIT)]
        with pytest.raises(ResolutionRefused):
            await resolve_external_event(journal, token_file(log).read_text()[:-2] + 'xy', APPROVE)
        await resolve_external_event(journal, token_file(log).read_text(), APPROVE)
        assert await attempt(journal, log) == 'c1 refund: refunded 5'
        assert lines(log) == ['model', 'ask hand-on', 'refund 5', 'model']
    finally:
        await journal.close()


async def test_ev1_a_handler_of_a_capability_with_an_id_is_asked_once_too(journal: DiskJournal) -> None:
    """With an `id`, pydantic-ai hands the wait its handler as the capability's durable operation: one step still."""
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import HandleDeferredToolCalls
    from pydantic_ai.models.test import TestModel

    asked: list[tuple[str, list[str]]] = []

    def ask(ctx: Any, requests: Any, token: str) -> None:
        asked.append((token, [call.tool_call_id for call in requests.approvals]))

    agent = Agent(
        TestModel(), name='ided', capabilities=[HandleDeferredToolCalls(ask, id='approvals'), Durable(journal)]
    )
    paid: list[int] = []

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        paid.append(amount)
        return 'ok'

    with pytest.raises(ExecutionWaiting):
        async with execution('ided-1', journal=journal):
            await agent.run('refund')
    token, ids = asked[0]
    await resolve_external_event(journal, token, DeferredToolResults(approvals=dict.fromkeys(ids, True)))
    for _ in range(2):  # going on, then a replay of the finished execution
        async with execution('ided-1', journal=journal):
            assert (await agent.run('refund')).output == '{"refund":"ok"}'
    assert len(asked) == 1 and len(paid) == 1


async def test_ev3_a_fork_past_an_unresolved_wait_is_refused_and_one_at_the_wait_asks_with_a_token_of_its_own(
    journal: DiskJournal, log: Path
) -> None:
    from pydantic_ai_durable import ImportRefused, fork_execution

    first = await attempt(journal, log)
    assert isinstance(first, ExecutionWaiting) and first.wait == f'{WAIT}@0:1'
    source_token = token_file(log).read_text()
    with pytest.raises(ImportRefused, match='its resume token names'):
        await fork_execution(journal, KEY, 'order-9-again', at=2)  # it would keep a wait no token resolves
    assert await journal.read_execution('order-9-again') is None

    await fork_execution(journal, KEY, 'order-9-again', at=1)  # at the wait: the fork's run asks again
    agent = build(journal, log)
    with pytest.raises(ExecutionWaiting):
        async with execution('order-9-again', journal=journal):
            await agent.run(PROMPT)
    assert lines(log) == ['model', 'ask hand-on', 'ask hand-on']  # the model step replayed; the fork asked anew
    fork_token = token_file(log).read_text()
    assert fork_token != source_token
    await resolve_external_event(journal, source_token, {'approvals': {'c1': False}})  # the source's own wait
    with pytest.raises(ExecutionWaiting):  # which leaves the fork's waiting
        async with execution('order-9-again', journal=journal):
            await agent.run(PROMPT)
    await resolve_external_event(journal, fork_token, {'approvals': {'c1': True}})
    async with execution('order-9-again', journal=journal):
        assert (await agent.run(PROMPT)).output == 'c1 refund: refunded 5'
