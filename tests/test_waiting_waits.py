"""Which wait a decision belongs to (WT-7..WT-10), on a disk journal, with real agents.

A model may reuse a tool call id (pydantic-ai's `TestModel` always does, and two runs of one execution
reuse each other's), a fork starts from a cut of an execution that was decided, a decision may come after
its deadline, and an attempt may start while some calls are decided and others not. Every test counts what
the tool bodies did and compares the outcome with pydantic-ai's own runs given the history and the decisions.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from waiting_agent import KEY, lines, plain_two_runs
from waiting_agent import attempt as three_calls_attempt

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    Journal,
    ResolutionRefused,
    deny_overdue,
    execution,
    fork_execution,
    pending_calls,
    resolve,
)
from pydantic_ai_durable.journals import DEFERRED

PROMPT = 'refund order 7'


def refunding_agent(journal: Journal | None, paid: list[int], *, wait_timeout: float | None = None) -> Agent[Any, Any]:
    """A model that asks `refund(5)` as call `c1`, then, once it has that result, `refund(10)` as `c1` again."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returned:
            return ModelResponse(parts=[ToolCallPart('refund', {'amount': 5}, tool_call_id='c1')])
        if len(returned) == 1:
            return ModelResponse(parts=[ToolCallPart('refund', {'amount': 10}, tool_call_id='c1')])
        return ModelResponse(parts=[TextPart(' | '.join(str(p.content) for p in returned))])

    agent: Agent[Any, Any] = Agent(
        FunctionModel(model, model_name='reusing'),
        name='refunds',
        output_type=[str, DeferredToolRequests],
        capabilities=[Durable(journal, wait_timeout=wait_timeout)] if journal is not None else [],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        paid.append(amount)
        return f'refunded {amount}'

    return agent


async def attempt(journal: Journal, paid: list[int], key: str = KEY, **options: Any) -> Any:
    """The app's code, the same every time: no history kept, no results passed."""
    agent = refunding_agent(journal, paid, **options)
    async with execution(key, journal=journal):
        result = await agent.run(PROMPT)
    return result.output


async def plain_runs(decisions: list[DeferredToolResults]) -> tuple[Any, list[int]]:
    """pydantic-ai without this package: each run gets the history and the next decisions."""
    paid: list[int] = []
    agent = refunding_agent(None, paid)
    result = await agent.run(PROMPT)
    for decision in decisions:
        assert isinstance(result.output, DeferredToolRequests)
        result = await agent.run(message_history=result.all_messages(), deferred_tool_results=decision)
    return result.output, paid


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, '-m', 'pydantic_ai_durable', *args],
        capture_output=True,
        text=True,
        encoding='utf-8',
        env={**os.environ, 'PYTHONIOENCODING': 'utf-8'},
        timeout=120,
        check=False,
    )


def disk(tmp_path: Path) -> DiskJournal:
    """A new journal object on the same directory, as another process would open it."""
    return DiskJournal(tmp_path / 'journal')


async def test_wt7_a_reused_call_id_is_a_new_call_each_refund_runs_once_and_the_execution_finishes(
    tmp_path: Path,
) -> None:
    paid: list[int] = []
    first = await attempt(disk(tmp_path), paid)
    assert isinstance(first, DeferredToolRequests) and [c.args_as_dict() for c in first.approvals] == [{'amount': 5}]
    assert (await resolve(disk(tmp_path), KEY, approvals={'c1': True}, by='alice')).completed

    second = await attempt(disk(tmp_path), paid)  # refund(5) runs, then the model asks refund(10) as c1 again
    assert isinstance(second, DeferredToolRequests) and [c.args_as_dict() for c in second.approvals] == [{'amount': 10}]
    assert paid == [5]
    (waiting,) = await pending_calls(disk(tmp_path), KEY)
    assert (waiting.call_id, waiting.arguments) == ('c1', {'amount': 10})
    calls = await pending_calls(disk(tmp_path), KEY, decided=True)
    assert [(c.call_id, c.arguments, c.decision is not None) for c in calls] == [
        ('c1', {'amount': 5}, True),  # the first wait keeps its decision
        ('c1', {'amount': 10}, False),
    ]
    resolution = await resolve(disk(tmp_path), KEY, approvals={'c1': True}, by='bob')
    assert (resolution.decided, resolution.completed) == (('c1',), True)

    output = await attempt(disk(tmp_path), paid)
    expected, plain_paid = await plain_runs([DeferredToolResults(approvals={'c1': True})] * 2)
    assert output == expected == 'refunded 5 | refunded 10'
    assert paid == plain_paid == [5, 10]  # each refund once: nobody was asked twice, nothing paid twice
    assert await attempt(disk(tmp_path), paid) == expected and paid == [5, 10]  # finished: replays
    (info,) = await disk(tmp_path).list_executions()
    assert info.state == 'finished'
    with pytest.raises(ResolutionRefused, match='finished'):
        await resolve(disk(tmp_path), KEY, approvals={'c1': True})


def two_runs_app(journal: Journal, paid: list[int], *, stop_waiting: bool) -> Any:
    """Two runs of `TestModel` in one execution, which name their refund calls alike; `stop_waiting`: the app
    does not start the second while the first waits."""

    async def app() -> list[Any]:
        agent: Agent[Any, Any] = Agent(
            TestModel(),
            name='refunds',
            output_type=[str, DeferredToolRequests],
            capabilities=[Durable(journal)],
        )

        @agent.tool_plain(requires_approval=True)
        def refund(amount: int) -> str:
            paid.append(amount)
            return f'refunded {amount}'

        outputs: list[Any] = []
        async with execution(KEY, journal=journal):
            for prompt in ('first order', 'second order'):
                outputs.append((await agent.run(prompt)).output)
                if stop_waiting and isinstance(outputs[-1], DeferredToolRequests):
                    break
        return outputs

    return app()


async def test_wt7_two_runs_of_one_execution_with_test_models_ids_each_wait_for_their_own_decision(
    tmp_path: Path,
) -> None:
    paid: list[int] = []

    async def app() -> list[Any]:
        result: list[Any] = await two_runs_app(disk(tmp_path), paid, stop_waiting=True)
        return result

    (first,) = await app()
    assert isinstance(first, DeferredToolRequests)
    (call_id,) = [call.tool_call_id for call in first.approvals]
    assert call_id == 'pyd_ai_tool_call_id__refund'
    await resolve(disk(tmp_path), KEY, approvals={call_id: True})

    done, second = await app()  # the first run goes on; the second asks with the same id
    assert not isinstance(done, DeferredToolRequests) and isinstance(second, DeferredToolRequests)
    assert [call.tool_call_id for call in second.approvals] == [call_id] and paid == [0]
    (waiting,) = await pending_calls(disk(tmp_path), KEY)
    assert waiting.run == '1'
    await resolve(disk(tmp_path), KEY, approvals={call_id: True})

    outputs = await app()
    assert len(outputs) == 2 and not any(isinstance(output, DeferredToolRequests) for output in outputs)
    assert paid == [0, 0]  # one refund per run
    (info,) = await disk(tmp_path).list_executions()
    assert info.state == 'finished'


async def test_wt7_two_calls_pending_with_one_id_are_decided_by_their_refs(tmp_path: Path) -> None:
    paid: list[int] = []
    outputs = await two_runs_app(disk(tmp_path), paid, stop_waiting=False)
    assert [type(output) for output in outputs] == [DeferredToolRequests] * 2
    calls = await pending_calls(disk(tmp_path), KEY)
    assert [(call.call_id, call.run) for call in calls] == [
        ('pyd_ai_tool_call_id__refund', '0'),
        ('pyd_ai_tool_call_id__refund', '1'),
    ]
    with pytest.raises(ResolutionRefused, match='share the id') as refused:
        await resolve(disk(tmp_path), KEY, approvals={'pyd_ai_tool_call_id__refund': True})
    assert calls[0].ref in str(refused.value) and calls[1].ref in str(refused.value)
    journal_dir = str(tmp_path / 'journal')
    shown = cli('--journal', journal_dir, 'show', KEY)
    assert shown.returncode == 0 and calls[0].ref in shown.stdout and calls[1].ref in shown.stdout, shown
    approved = cli('--journal', journal_dir, 'approve', KEY, calls[0].ref, '--by', 'alice')
    assert approved.returncode == 0, approved.stderr
    resolution = await resolve(disk(tmp_path), KEY, approvals={calls[1].ref: False})
    assert resolution.completed and resolution.decided == ('pyd_ai_tool_call_id__refund',)
    decided = await pending_calls(disk(tmp_path), KEY, decided=True)
    assert [(c.run, c.decision.kind, c.decision.by) for c in decided if c.decision] == [
        ('0', 'approved', 'alice'),
        ('1', 'denied', None),
    ]

    outputs = await two_runs_app(disk(tmp_path), paid, stop_waiting=False)
    assert not any(isinstance(output, DeferredToolRequests) for output in outputs)
    assert paid == [0]  # the first run's refund approved, the second's denied
    (info,) = await disk(tmp_path).list_executions()
    assert info.state == 'finished'


async def test_wt7_decisions_recorded_by_a_release_that_keyed_them_by_call_id_alone_still_apply(
    tmp_path: Path,
) -> None:
    paid: list[int] = []
    await attempt(disk(tmp_path), paid)
    journal = disk(tmp_path)
    record = await journal.read_execution(KEY)
    assert record is not None
    (stored,) = record[DEFERRED].values()
    # The shape the earlier release wrote: keyed by call id, without the call id and the wait inside.
    legacy = {key: value for key, value in stored.items() if key not in ('id', 'wait')}
    await _write_record(journal, {**record, DEFERRED: {'c1': legacy}})
    await resolve(disk(tmp_path), KEY, approvals={'c1': True}, by='alice')

    second = await attempt(disk(tmp_path), paid)
    assert isinstance(second, DeferredToolRequests) and paid == [5]  # the old decision applied
    await resolve(disk(tmp_path), KEY, approvals={'c1': True}, by='bob')
    assert await attempt(disk(tmp_path), paid) == 'refunded 5 | refunded 10' and paid == [5, 10]


async def _write_record(journal: Journal, record: dict[str, Any]) -> None:
    lease = await journal.acquire_lease(KEY, 'test-operator', 30)
    try:
        assert await journal.write_execution(KEY, record, epoch=lease.epoch)
    finally:
        await journal.release_lease(KEY, 'test-operator', lease.epoch)


async def test_wt8_a_fork_before_a_decided_wait_waits_for_its_own_decision(tmp_path: Path) -> None:
    paid: list[int] = []
    await attempt(disk(tmp_path), paid)
    await resolve(disk(tmp_path), KEY, approvals={'c1': True}, by='alice')
    await fork_execution(disk(tmp_path), KEY, 'fork', at=0)

    forked = await attempt(disk(tmp_path), paid, key='fork')
    assert isinstance(forked, DeferredToolRequests) and paid == []  # the original's approval stays behind
    (waiting,) = await pending_calls(disk(tmp_path), 'fork')
    assert (waiting.call_id, waiting.arguments, waiting.decision) == ('c1', {'amount': 5}, None)

    await attempt(disk(tmp_path), paid)  # the original pays on its own approval
    assert paid == [5]
    await resolve(disk(tmp_path), 'fork', approvals={'c1': True}, by='bob')
    await attempt(disk(tmp_path), paid, key='fork')
    assert paid == [5, 5]  # two approvals, two payments


async def test_wt8_a_fork_after_a_decided_wait_keeps_its_decision_and_replays_what_it_ran(tmp_path: Path) -> None:
    paid: list[int] = []
    await attempt(disk(tmp_path), paid)
    await resolve(disk(tmp_path), KEY, approvals={'c1': True})
    await attempt(disk(tmp_path), paid)  # refund(5) runs, then the execution waits on refund(10)
    assert paid == [5]
    journal = disk(tmp_path)
    (first,) = [c for c in await pending_calls(journal, KEY, decided=True) if c.decision is not None]
    assert first.wait is not None
    run = await journal.read_run(KEY, '0')
    after = max(run.entries) + 1  # every step recorded so far: the refund(5) the decision ran is kept
    await fork_execution(journal, KEY, 'fork', at=after)

    forked = await attempt(disk(tmp_path), paid, key='fork')
    assert isinstance(forked, DeferredToolRequests) and [c.args_as_dict() for c in forked.approvals] == [{'amount': 10}]
    assert paid == [5]  # refund(5) replayed from the fork's copy, not run again
    calls = await pending_calls(disk(tmp_path), 'fork', decided=True)
    assert [(c.arguments, c.decision is not None) for c in calls] == [({'amount': 5}, True), ({'amount': 10}, False)]


async def test_wt9_a_decision_after_the_deadline_is_refused_and_the_deadline_decides(tmp_path: Path) -> None:
    paid: list[int] = []
    await attempt(disk(tmp_path), paid, wait_timeout=0.01)
    await asyncio.sleep(0.05)  # past the deadline; no deadline pass has run yet
    with pytest.raises(ResolutionRefused, match='deadline') as refused:
        await resolve(disk(tmp_path), KEY, approvals={'c1': True}, by='alice')
    assert refused.value.call_id == 'c1'
    (call,) = await pending_calls(disk(tmp_path), KEY)
    assert call.decision is None  # nothing was written
    (resolution,) = await deny_overdue(disk(tmp_path))
    assert resolution.completed
    output = await attempt(disk(tmp_path), paid, wait_timeout=0.01)
    assert isinstance(output, DeferredToolRequests) and paid == []  # denied, so the model asks refund(10)


async def test_wt10_an_attempt_that_starts_while_calls_are_pending_lists_only_what_waits(tmp_path: Path) -> None:
    log = tmp_path / 'log'
    await three_calls_attempt(disk(tmp_path), log, 'three')
    await resolve(disk(tmp_path), KEY, approvals={'c2': True}, by='alice')

    output = await three_calls_attempt(disk(tmp_path), log, 'three')
    assert isinstance(output, DeferredToolRequests)
    assert [call.tool_call_id for call in output.approvals] == ['c3']  # c2 is decided: nobody is asked again
    assert [call.tool_call_id for call in output.calls] == ['c4'] and set(output.metadata) == {'c4'}
    assert lines(log) == ['model']
    await resolve(disk(tmp_path), KEY, approvals={'c3': False}, results={'c4': 'tomorrow'})
    final = await three_calls_attempt(disk(tmp_path), log, 'three')
    plain = DeferredToolResults(approvals={'c2': True, 'c3': False}, calls={'c4': 'tomorrow'})
    assert final == (await plain_two_runs(tmp_path / 'plain', 'three', plain))[0]
    assert lines(log).count('refund 5') == 1


@pytest.mark.once
async def test_wt7_ui7_the_console_decides_two_calls_pending_with_one_id_each_by_its_own_form(tmp_path: Path) -> None:
    import re

    from starlette.testclient import TestClient

    from pydantic_ai_durable._console import ConsoleSettings, build_app

    paid: list[int] = []
    await two_runs_app(disk(tmp_path), paid, stop_waiting=False)
    calls = await pending_calls(disk(tmp_path), KEY)
    assert calls[0].call_id == calls[1].call_id  # one id, two waits

    def decide_from_the_page() -> list[str]:
        app = build_app(DiskJournal(tmp_path / 'journal'), ConsoleSettings(by='ops'))
        with TestClient(app, base_url='http://127.0.0.1:8765') as client:
            page = client.get('/waiting').text
            targets = sorted(set(re.findall(r'name="call" value="([^"]+)"', page)))
            csrf = client.get('/api/session').json()['csrf']
            for target, decision in zip(targets, ('approve', 'deny'), strict=True):
                form = {'key': KEY, 'call': target, 'decision': decision, 'csrf': csrf}
                answer = client.post('/execution/resolve', data=form, follow_redirects=False)
                assert answer.status_code == 303, answer.text[-2000:]
        return targets

    targets = await asyncio.to_thread(decide_from_the_page)
    assert targets == sorted(call.ref for call in calls)  # each form names its own wait
    decided = await pending_calls(disk(tmp_path), KEY, decided=True)
    assert sorted((c.run, c.decision.kind) for c in decided if c.decision) == [('0', 'approved'), ('1', 'denied')]
    outputs = await two_runs_app(disk(tmp_path), paid, stop_waiting=False)
    assert not any(isinstance(output, DeferredToolRequests) for output in outputs) and paid == [0]
