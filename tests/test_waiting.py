"""Executions that wait (WT-1..WT-3), on memory, disk and PostgreSQL, with a real agent.

A refund needs a person's approval and a carrier's answer comes from outside: the run ends with
`DeferredToolRequests`, the execution is `waiting` on those calls, `resolve` decides them from a journal
object of its own (another process's view, for disk and PostgreSQL), and the same code run again goes on.
Every outcome is compared with pydantic-ai's own two runs (the history and `DeferredToolResults` passed
by hand) given the same decisions, and what ran is counted in a log the agent writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import DeferredToolRequests, DeferredToolResults
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import ToolApproved, ToolDenied
from stores import Store, disk_store, memory_store, postgres_store
from waiting_agent import KEY, PROMPT, build, lines, plain_two_runs

from pydantic_ai_durable import (
    Encryption,
    ExecutionBusy,
    Journal,
    ResolutionRefused,
    SecretRegistry,
    execution,
    pending_calls,
    resolve,
    sweep_interrupted,
)


async def run(journal: Journal, log: Path, scenario: str = 'one', **options: Any) -> Any:
    """One attempt of the app's code, and its handle (what it replayed and recorded)."""
    agent = build(journal, log, scenario=scenario, **options)
    async with execution(KEY, journal=journal) as handle:
        result = await agent.run(PROMPT)
    return result.output, handle


async def test_wt1_a_run_that_ends_deferring_leaves_its_execution_waiting_with_its_calls(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    output, _ = await run(new_journal(), log, 'three')
    assert isinstance(output, DeferredToolRequests)

    reader = new_journal()
    infos = await reader.list_executions(state='waiting')
    assert [info.key for info in infos] == [KEY]
    assert await reader.list_executions(state='finished') == []
    pending = {call.call_id: call for call in infos[0].pending}
    assert sorted(pending) == ['c2', 'c3', 'c4']
    refund, carrier = pending['c2'], pending['c4']
    assert (refund.tool_name, refund.kind, refund.arguments, refund.run) == ('refund', 'approval', {'amount': 5}, '0')
    assert refund.tool_metadata == {'team': 'billing'}
    assert (carrier.tool_name, carrier.kind, carrier.arguments) == ('carrier', 'external', {'parcel': 'p-1'})
    assert carrier.metadata == {'queue': 'carriers', 'parcel': 'p-1'}
    assert all(call.since > 0 and call.deadline is None and call.decision is None for call in pending.values())
    assert await pending_calls(reader, KEY) == list(infos[0].pending)
    assert lines(log).count('model') == 1
    record = await reader.read_execution(KEY)
    assert record is not None
    assert set(record) == {'v', 'key', 'runs', 'status', 'attempts', 'updated', 'deferred', 'history'}
    assert record['history'][-1]['outcome'] == 'waiting'  # the console's attempts table says how it ended (UI-2)
    lease = await reader.acquire_lease(KEY, 'another-holder', 5)  # nothing is held while it waits
    assert lease.holder == 'another-holder'
    await reader.release_lease(KEY, 'another-holder', lease.epoch)


async def test_wt1_secrets_in_the_arguments_of_a_waiting_call_are_masked(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    secrets = SecretRegistry()
    secrets.register('p-1')  # the parcel's id stands for a secret the model repeated
    await run(new_journal(), tmp_path / 'log', 'three', secrets=secrets)
    (call,) = [call for call in await pending_calls(new_journal(), KEY) if call.call_id == 'c4']
    assert 'p-1' not in str((call.arguments, call.metadata)), call
    assert call.arguments == {'parcel': '***'}


async def test_wt1_the_sweep_never_takes_a_waiting_execution_for_an_interrupted_one(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    await run(new_journal(), tmp_path / 'log')
    sent: list[str] = []
    journal = new_journal()
    assert await sweep_interrupted(journal, lambda info: sent.append(info.key), idle=0.001) == []
    assert sent == []
    assert [info.state for info in await journal.list_executions()] == ['waiting']


async def test_wt1_retention_and_cleanup_never_delete_a_waiting_execution(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    journal = new_journal()
    for key, options in (
        ('kept', {'retention': 0}),
        ('cleaned', {'cleanup': 'execution'}),
        ('runs', {'cleanup': 'run'}),
    ):
        agent = build(journal, tmp_path / 'log')
        async with execution(key, journal=journal, **options):
            await agent.run(PROMPT)
    assert await journal.prune() == []
    infos = await new_journal().list_executions()
    assert {info.key: (info.state, len(info.pending), info.retain_until) for info in infos} == {
        'cleaned': ('waiting', 1, None),
        'kept': ('waiting', 1, None),
        'runs': ('waiting', 1, None),
    }


async def test_wt3_wt10_an_attempt_that_starts_while_calls_are_pending_ends_waiting_again_without_the_model(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    await run(new_journal(), log, 'three')
    first = await resolve(new_journal(), KEY, approvals={'c2': True}, by='alice')
    assert (first.decided, first.pending, first.completed) == (('c2',), ('c3', 'c4'), False)

    output, handle = await run(new_journal(), log, 'three')
    assert isinstance(output, DeferredToolRequests)
    assert sorted(call.tool_call_id for call in [*output.approvals, *output.calls]) == ['c3', 'c4']  # WT-10
    assert sum(handle.stats.recorded.values()) == 0 and handle.stats.replayed['model'] == 1
    assert lines(log) == ['model']  # neither the model nor the approved refund ran
    (info,) = await new_journal().list_executions()
    assert (info.state, [call.call_id for call in info.pending]) == ('waiting', ['c3', 'c4'])


@pytest.mark.parametrize(
    ('decision', 'plain'),
    [
        ({'approvals': {'c2': True}}, DeferredToolResults(approvals={'c2': True})),
        ({'approvals': {'c2': False}}, DeferredToolResults(approvals={'c2': False})),
        (
            {'approvals': {'c2': ToolApproved(override_args={'amount': 4})}},
            DeferredToolResults(approvals={'c2': ToolApproved(override_args={'amount': 4})}),
        ),
        (
            {'approvals': {'c2': ToolDenied('over the limit')}},
            DeferredToolResults(approvals={'c2': ToolDenied('over the limit')}),
        ),
    ],
    ids=['approve', 'deny', 'approve-changed', 'deny-message'],
)
async def test_wt2_wt3_a_decision_continues_the_run_as_pydantic_ais_own_second_run_would(
    new_journal: Callable[[], Journal], tmp_path: Path, decision: dict[str, Any], plain: DeferredToolResults
) -> None:
    log = tmp_path / 'log'
    await run(new_journal(), log)
    resolution = await resolve(new_journal(), KEY, by='alice', **decision)
    assert resolution.completed and resolution.pending == ()

    output, handle = await run(new_journal(), log)
    expected, plain_log = await plain_two_runs(tmp_path / 'plain', 'one', plain)
    assert output == expected
    assert lines(log) == plain_log  # the same model requests and side effects, each once
    assert handle.stats.replayed['model'] == 1 and handle.stats.recorded['model'] == 1

    again, handle = await run(new_journal(), log)  # finished: a retry replays everything
    assert again == expected and lines(log) == plain_log and sum(handle.stats.recorded.values()) == 0
    (info,) = await new_journal().list_executions()
    assert info.state == 'finished'


async def test_wt2_wt3_three_calls_resolved_one_by_one_by_different_people(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    await run(new_journal(), log, 'three')
    steps = [
        ('alice', {'approvals': {'c2': True}}),
        ('bob', {'approvals': {'c3': ToolDenied('too much')}}),
        ('carol', {'results': {'c4': {'eta': 'tomorrow'}}}),
    ]
    for index, (person, decision) in enumerate(steps):
        resolution = await resolve(new_journal(), KEY, by=person, **decision)
        assert resolution.completed == (index == 2), resolution
    calls = await pending_calls(new_journal(), KEY, decided=True)
    assert [(call.call_id, call.decision.kind, call.decision.by) for call in calls if call.decision] == [
        ('c2', 'approved', 'alice'),
        ('c3', 'denied', 'bob'),
        ('c4', 'result', 'carol'),
    ]
    output, _ = await run(new_journal(), log, 'three')
    plain = DeferredToolResults(approvals={'c2': True, 'c3': ToolDenied('too much')}, calls={'c4': {'eta': 'tomorrow'}})
    expected, plain_log = await plain_two_runs(tmp_path / 'plain', 'three', plain)
    assert output == expected
    assert lines(log) == plain_log and lines(log).count('refund 5') == 1 and 'refund 900' not in lines(log)


async def test_wt2_an_outside_result_can_be_refused(new_journal: Callable[[], Journal], tmp_path: Path) -> None:
    log = tmp_path / 'log'
    await run(new_journal(), log, 'three')
    decisions = {'approvals': {'c2': False, 'c3': False}, 'results': {'c4': ToolFailed('carrier is down')}}
    await resolve(new_journal(), KEY, **decisions)
    output, _ = await run(new_journal(), log, 'three')
    plain = DeferredToolResults(approvals={'c2': False, 'c3': False}, calls={'c4': ToolFailed('carrier is down')})
    assert output == (await plain_two_runs(tmp_path / 'plain', 'three', plain))[0]
    assert 'c4 carrier: carrier is down' in output


async def test_wt2_resolve_is_idempotent_and_refuses_what_it_cannot_record(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    with pytest.raises(ResolutionRefused, match='no execution'):
        await resolve(new_journal(), KEY, approvals={'c2': True})
    await run(new_journal(), log, 'three')
    journal = new_journal()
    refusals = [
        ({'approvals': {'c9': True}}, "no deferred call 'c9'; it waits on c2 \\(refund\\), c3 \\(refund\\), c4"),
        ({'approvals': {'c4': True}}, 'waits for an external decision: give its result'),
        ({'results': {'c2': 'done'}}, 'waits for an approval decision: approve or deny it'),
        ({'approvals': {'c2': True, 'c9': False}}, "no deferred call 'c9'"),  # all or nothing: c2 stays pending
    ]
    for decision, message in refusals:
        with pytest.raises(ResolutionRefused, match=message):
            await resolve(journal, KEY, **decision)
    assert [call.call_id for call in await pending_calls(journal, KEY)] == ['c2', 'c3', 'c4']

    await resolve(journal, KEY, approvals={'c2': True}, by='alice')
    same = await resolve(new_journal(), KEY, approvals={'c2': ToolApproved()}, by='bob')
    assert (same.decided, same.unchanged) == ((), ('c2',))
    with pytest.raises(ResolutionRefused, match="'c2' was decided already: approved by alice") as refused:
        await resolve(journal, KEY, approvals={'c2': False})
    assert refused.value.call_id == 'c2'
    (call,) = [call for call in await pending_calls(journal, KEY, decided=True) if call.call_id == 'c2']
    assert call.decision is not None and call.decision.by == 'alice'  # the refused one changed nothing

    await resolve(journal, KEY, approvals={'c3': True}, results={'c4': 'ok'})
    await run(new_journal(), log, 'three')
    with pytest.raises(ResolutionRefused, match='it is finished'):
        await resolve(journal, KEY, approvals={'c2': True})


async def test_wt2_nan_and_infinity_are_refused_in_a_result_or_arguments_saying_where(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    class Reading(BaseModel):
        level: float

    await run(new_journal(), tmp_path / 'log', 'three')
    journal = new_journal()
    refusals = [
        ({'results': {'c4': float('nan')}}, "the result of call 'c4': NaN is not a JSON number"),
        ({'results': {'c4': {'eta': [1, float('inf')]}}}, r"the result of call 'c4'\.eta\[1\]: Infinity is not"),
        ({'results': {'c4': Reading(level=float('-inf'))}}, r"the result of call 'c4'\.level: -Infinity is not"),
        (
            {'approvals': {'c2': ToolApproved(override_args={'amount': float('nan')})}},
            r"the arguments of call 'c2'\.amount: NaN is not",
        ),
    ]
    for decision, message in refusals:
        with pytest.raises(ResolutionRefused, match=message):
            await resolve(journal, KEY, **decision)
    calls = await pending_calls(journal, KEY, decided=True)
    assert [(call.call_id, call.decision) for call in calls] == [('c2', None), ('c3', None), ('c4', None)]


async def test_wt2_two_resolvers_racing_on_one_call_one_wins_and_the_outcome_follows_it(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    await run(new_journal(), log)
    outcomes = await asyncio.gather(
        resolve(new_journal(), KEY, approvals={'c2': True}, by='alice'),
        resolve(new_journal(), KEY, approvals={'c2': False}, by='bob'),
        return_exceptions=True,
    )
    won = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    lost = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert len(won) == 1 and won[0].completed, outcomes
    assert len(lost) == 1 and isinstance(lost[0], ResolutionRefused) and 'decided already' in str(lost[0])
    approved = outcomes[0] is won[0]
    output, _ = await run(new_journal(), log)
    assert ('refunded 5' in output) == approved and lines(log).count('refund 5') == int(approved)


async def test_wt2_a_resolution_waits_for_the_attempt_that_holds_the_execution(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    await run(new_journal(), tmp_path / 'log')
    journal = new_journal()
    async with execution(KEY, journal=journal):  # an attempt that holds it (and runs nothing)
        with pytest.raises(ExecutionBusy):
            await resolve(new_journal(), KEY, approvals={'c2': True}, wait=0)
        later = asyncio.ensure_future(resolve(new_journal(), KEY, approvals={'c2': True}, wait=30))
        await asyncio.sleep(0.2)
        assert not later.done()
    resolution = await later  # decided once the attempt ended, still waiting, for the next attempt
    assert resolution.completed
    (info,) = await new_journal().list_executions()
    assert (info.state, info.pending) == ('waiting', ())


async def test_wt3_an_app_that_passes_the_history_and_results_itself_gets_the_same_outcome(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    await run(new_journal(), log)
    results = DeferredToolResults(approvals={'c2': True})

    async def app_attempt() -> Any:
        journal = new_journal()
        agent = build(journal, log)
        async with execution(KEY, journal=journal):
            first = await agent.run(PROMPT)
            second = await agent.run(message_history=first.all_messages(), deferred_tool_results=results)
        return second.output

    output = await app_attempt()
    expected, plain_log = await plain_two_runs(tmp_path / 'plain', 'one', results)
    assert output == expected and lines(log) == plain_log
    (info,) = await new_journal().list_executions()
    assert info.state == 'finished'  # the app answered the call: nothing waits
    assert await app_attempt() == expected and lines(log) == plain_log  # a retry replays both runs


@pytest.fixture(params=[memory_store, disk_store, postgres_store], ids=['memory', 'disk', 'postgres'])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    made: Store = request.param(tmp_path)
    return made


async def test_wt1_wt2_the_arguments_and_decisions_of_waiting_calls_are_sealed(store: Store, tmp_path: Path) -> None:
    keys = Encryption({'k1': bytes(range(32))})
    log = tmp_path / 'log'
    agent = build(store.make(keys), log, scenario='three')
    async with execution(KEY, journal=store.make(keys)):
        await agent.run(PROMPT)
    await resolve(store.make(keys), KEY, approvals={'c3': ToolDenied('marker-denial-31')}, results={'c4': 'marker-eta'})
    raw = store.raw()
    for marker in (b'marker-denial-31', b'marker-eta', b'carriers', b'p-1', b'billing'):
        assert marker not in raw, marker
    assert b'waiting' in raw  # the state stays readable without keys
    assert [call.call_id for call in await pending_calls(store.make(keys), KEY)] == ['c2']


def charging_agent(journal: Journal | None, log: Path) -> Any:
    """A charge needs approval, and once approved it waits for the bank: two kinds of decision for one call."""
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import CallDeferred
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from waiting_agent import note, summary

    from pydantic_ai_durable import Durable

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        note(log, 'model')
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[ToolCallPart('charge', {'amount': 3}, tool_call_id='c1')])
        return ModelResponse(parts=[TextPart(summary(messages))])

    agent: Any = Agent(
        FunctionModel(model, model_name='charging'),
        name='charging',
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        capabilities=[Durable(journal)] if journal is not None else [],
    )

    @agent.tool_plain(requires_approval=True)
    def charge(amount: int) -> str:
        note(log, f'charge {amount}')
        raise CallDeferred(metadata={'bank': 'waits for the bank'})

    return agent


async def test_wt3_a_decided_call_that_defers_again_keeps_waiting_for_the_apps_own_run(
    new_journal: Callable[[], Journal], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / 'log'

    async def attempt(*, answer: bool = False) -> Any:
        journal = new_journal()
        agent = charging_agent(journal, log)
        async with execution(KEY, journal=journal):
            first = await agent.run(PROMPT)
            if not answer:
                return first.output
            results = DeferredToolResults(calls={'c1': 'the bank confirmed'})
            return (await agent.run(message_history=first.all_messages(), deferred_tool_results=results)).output

    await attempt()
    await resolve(new_journal(), KEY, approvals={'c1': True}, by='alice')
    with caplog.at_level('WARNING', logger='pydantic_ai_durable'):
        again = await attempt()  # the approved charge runs once and defers its result to the bank
    assert isinstance(again, DeferredToolRequests) and [call.tool_call_id for call in again.calls] == ['c1']
    assert 'pydantic-ai asks for only in a new run' in caplog.text
    (call,) = await pending_calls(new_journal(), KEY)
    assert call.kind == 'external' and call.earlier is not None and call.earlier.kind == 'approved'
    with pytest.raises(ResolutionRefused, match='only in a new run'):
        await resolve(new_journal(), KEY, results={'c1': 'the bank confirmed'})
    assert isinstance(await attempt(), DeferredToolRequests)  # still waiting, the charge not run again

    output = await attempt(answer=True)  # the app's own run answers it
    plain = charging_agent(None, tmp_path / 'plain')
    first = await plain.run(PROMPT)
    second = await plain.run(
        message_history=first.all_messages(), deferred_tool_results=DeferredToolResults(approvals={'c1': True})
    )
    third = await plain.run(
        message_history=second.all_messages(),
        deferred_tool_results=DeferredToolResults(calls={'c1': 'the bank confirmed'}),
    )
    assert output == third.output and lines(log).count('charge 3') == 1
    (info,) = await new_journal().list_executions()
    assert info.state == 'finished'
