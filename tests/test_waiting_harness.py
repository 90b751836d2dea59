"""pydantic-ai-harness's deferring capabilities under `Durable` (WT-6), on memory, disk and PostgreSQL.

`AskUser(answerer=None)`: the model's questions wait in the execution, are listed with their validated
`AskUserRequest`, and are answered with the person's `AskUserResponse`; the run goes on as pydantic-ai's own
second run does with `ask_user_result(...)`. `ApprovalReviewer`: a second model approves the small refund and
leaves the big one to a person; its reviews are replayed on the resume, not asked again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import harness_mismatch
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import (
    Durable,
    Journal,
    ResolutionRefused,
    ask_user_request,
    execution,
    pending_calls,
    resolve,
)

if (_mismatch := harness_mismatch()) is not None:
    pytest.skip(f'pydantic-ai-harness capabilities not tested: {_mismatch}', allow_module_level=True)

from pydantic_ai_harness.approval_reviewer import ApprovalReviewer
from pydantic_ai_harness.ask_user import (
    AskUserAnswer,
    AskUserRequest,
    AskUserResponse,
    ask_user_result,
)
from waiting_agent import asking_agent, lines, note, summary

KEY = 'trip-3'
ANSWER = AskUserResponse(
    answers=(
        AskUserAnswer(header='Seat', selected=('Aisle',)),
        AskUserAnswer(header='Meals', selected=('Breakfast', 'Dinner')),
    )
)


async def _ask(journal: Journal, log: Path) -> Any:
    async with execution(KEY, journal=journal):
        return (await asking_agent(journal, log).run('book my trip')).output


async def test_wt6_an_ask_user_question_waits_is_listed_with_its_request_and_is_answered_by_a_response(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    output = await _ask(new_journal(), log)
    assert isinstance(output, DeferredToolRequests)
    (call,) = await pending_calls(new_journal(), KEY)
    assert (call.tool_name, call.kind) == ('ask_user_question', 'external')
    request = ask_user_request(call)
    assert request == AskUserRequest.from_tool_call(output.calls[0])  # the validated request, with the call's id
    assert call.request is not None and call.request['questions'][1]['multi_select'] is True

    wrong = AskUserResponse(answers=(AskUserAnswer(header='Seat', selected=('Roof',)),))
    with pytest.raises(ValueError):
        await resolve(new_journal(), KEY, results={'q1': wrong})
    assert [c.call_id for c in await pending_calls(new_journal(), KEY)] == ['q1']  # nothing recorded

    assert (await resolve(new_journal(), KEY, results={'q1': ANSWER}, by='traveller')).completed
    answered = await _ask(new_journal(), log)

    plain = asking_agent(None, tmp_path / 'plain')
    first = await plain.run('book my trip')
    assert isinstance(first.output, DeferredToolRequests)
    rendered = ask_user_result(AskUserRequest.from_tool_call(first.output.calls[0]), ANSWER)
    second = await plain.run(
        message_history=first.all_messages(), deferred_tool_results=DeferredToolResults(calls={'q1': rendered})
    )
    assert answered == second.output
    assert "'Seat': ['Aisle']" in answered and lines(log) == lines(tmp_path / 'plain') == ['model', 'model']


async def test_wt6_the_rendered_result_answers_a_question_too(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    await _ask(new_journal(), tmp_path / 'log')
    (call,) = await pending_calls(new_journal(), KEY)
    rendered = ask_user_result(ask_user_request(call), AskUserResponse(cancelled=True))
    await resolve(new_journal(), KEY, results={'q1': rendered})
    assert 'declined' in await _ask(new_journal(), tmp_path / 'log')
    with pytest.raises(ResolutionRefused, match='finished'):
        await resolve(new_journal(), KEY, results={'q1': ANSWER})


def reviewing_agent(
    journal: Journal | None, log: Path, *, big_first: bool = False
) -> Agent[None, str | DeferredToolRequests]:
    """Two refunds need approval; the reviewer's model clears the small one and leaves the big one."""

    def reviewer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        note(log, 'reviewer')
        prompt = str(messages[-1].parts[-1].content)  # type: ignore[union-attr]
        answer = 'yes' if '900' in prompt else 'no'
        if info.output_tools:  # the reviewer's output is a `Literal`, given through pydantic-ai's output tool
            return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {'response': answer})])
        return ModelResponse(parts=[TextPart(answer)])

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        note(log, 'model')
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            amounts = [900, 5] if big_first else [5, 900]
            return ModelResponse(
                parts=[
                    ToolCallPart('refund', {'amount': amount}, tool_call_id=f'c{index}')
                    for index, amount in enumerate(amounts, start=2)
                ]
            )
        return ModelResponse(parts=[TextPart(summary(messages))])

    review = ApprovalReviewer(
        FunctionModel(reviewer, model_name='reviewer'), question='Is this refund over 100?', id='refund-reviewer'
    )
    capabilities: list[Any] = [review] + ([Durable(journal)] if journal is not None else [])
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model, model_name='refunds'),
        name='reviewed',
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        capabilities=capabilities,
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        note(log, f'refund {amount}')
        return f'refunded {amount}'

    return agent


@pytest.mark.parametrize('big_first', [False, True], ids=['small-first', 'big-first'])
async def test_wt6_an_approval_reviewers_decisions_are_replayed_and_only_what_it_left_waits(
    new_journal: Callable[[], Journal], tmp_path: Path, big_first: bool
) -> None:
    log = tmp_path / 'log'
    person = 'c2' if big_first else 'c3'

    async def attempt() -> Any:
        journal = new_journal()
        async with execution(KEY, journal=journal) as handle:
            output = (await reviewing_agent(journal, log, big_first=big_first).run('refund both')).output
        return output, handle

    output, _ = await attempt()
    assert isinstance(output, DeferredToolRequests) and [c.tool_call_id for c in output.approvals] == [person]
    assert lines(log) == ['model', 'reviewer', 'reviewer', 'refund 5']
    assert [call.call_id for call in await pending_calls(new_journal(), KEY)] == [person]

    await resolve(new_journal(), KEY, approvals={person: True}, by='manager')
    output, handle = await attempt()
    # no review asked again, the small refund not paid again, the approved big one paid once
    assert lines(log) == ['model', 'reviewer', 'reviewer', 'refund 5', 'refund 900', 'model']

    plain_log = tmp_path / 'plain'
    plain = reviewing_agent(None, plain_log, big_first=big_first)
    first = await plain.run('refund both')
    second = await plain.run(
        message_history=first.all_messages(), deferred_tool_results=DeferredToolResults(approvals={person: True})
    )
    assert output == second.output
    assert lines(plain_log) == lines(log)
    # The approved calls run as one batch, in the model's order: when the person's comes first, it takes the
    # position the reviewer's call was recorded at, and the reviewer's call replays by its arguments (DV-2).
    assert handle.stats.replayed_by_arguments['tool'] == (1 if big_first else 0)
    assert len(handle.stats.divergences) == (1 if big_first else 0)


async def test_wt6_show_prints_a_waiting_questions_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pydantic_ai_durable import DiskJournal
    from pydantic_ai_durable._cli import main

    await _ask(DiskJournal(tmp_path / 'journal'), tmp_path / 'log')
    arguments = ['--journal', str(tmp_path / 'journal'), 'show', KEY]
    assert await asyncio.to_thread(main, arguments) == 0  # the CLI runs its own event loop
    shown = capsys.readouterr().out
    expected = ['q1 asks:', 'Seat: Which seat do you want?', '[Window | Aisle]']
    expected.append('[Breakfast | Dinner | None] (several)')
    for line in expected:
        assert line in shown, shown


async def test_wt6_an_answer_given_as_json_is_checked_against_the_question_as_a_response_is(
    new_journal: Callable[[], Journal], tmp_path: Path
) -> None:
    await _ask(new_journal(), tmp_path / 'log')
    wrong = [
        {'Seat': ['Roof']},  # a label the question does not offer
        {'Seat': ['Aisle']},  # Meals unanswered
        {'Seat': ['Aisle', 'Window'], 'Meals': ['Dinner']},  # two seats on a single choice
        {'answers': [{'header': 'Seat', 'selected': ['Roof']}]},  # the response's JSON is checked too
        'anything at all',
        42,
    ]
    for answer in wrong:
        with pytest.raises(ResolutionRefused, match="the answer to question 'q1' does not fit it"):
            await resolve(new_journal(), KEY, results={'q1': answer})
    assert [call.call_id for call in await pending_calls(new_journal(), KEY)] == ['q1']  # nothing recorded
    custom = {'answers': [{'header': 'Seat', 'custom_answer': 'by the door'}, {'header': 'Meals', 'selected': []}]}
    with pytest.raises(ResolutionRefused, match='picked nothing'):
        await resolve(new_journal(), KEY, results={'q1': custom})

    rendered = {'Seat': ['Aisle'], 'Meals': ['Breakfast', 'Dinner']}  # what the tool gives, as the console shows it
    assert (await resolve(new_journal(), KEY, results={'q1': rendered})).completed
    (call,) = await pending_calls(new_journal(), KEY, decided=True)
    assert call.decision is not None and call.decision.value == ask_user_result(ask_user_request(call), ANSWER)


def test_wt6_complete_checks_an_answer_against_its_question_in_one_line(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from pydantic_ai_durable import DiskJournal

    path = tmp_path / 'journal'
    asyncio.run(_ask(DiskJournal(path), tmp_path / 'log'))

    def complete(result: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, '-m', 'pydantic_ai_durable', '--journal', str(path), 'complete', KEY, 'q1']
        env = {**os.environ, 'PYTHONIOENCODING': 'utf-8'}
        return subprocess.run([*command, f'--result={result}'], capture_output=True, text=True, env=env, timeout=120)

    for wrong, says in (('{"Seat": ["Roof"]}', 'does not offer'), ('"sure"', 'neither a response')):
        done = complete(wrong)
        assert done.returncode == 1 and 'Traceback' not in done.stderr and len(done.stderr.splitlines()) == 1, done
        assert "the answer to question 'q1' does not fit it" in done.stderr and says in done.stderr, done.stderr
    assert [call.call_id for call in asyncio.run(pending_calls(DiskJournal(path), KEY))] == ['q1']
    done = complete(json.dumps({'Seat': ['Aisle'], 'Meals': ['Breakfast', 'Dinner']}))
    assert done.returncode == 0 and 'nothing is pending' in done.stdout, done
    assert "'Seat': ['Aisle']" in asyncio.run(_ask(DiskJournal(path), tmp_path / 'log'))


def test_wt6_ui7_the_console_checks_an_answer_against_its_question(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from pydantic_ai_durable import DiskJournal
    from pydantic_ai_durable._console import ConsoleSettings, build_app

    path = tmp_path / 'journal'
    asyncio.run(_ask(DiskJournal(path), tmp_path / 'log'))
    with TestClient(
        build_app(DiskJournal(path), ConsoleSettings(by='ops')), base_url='http://127.0.0.1:8765'
    ) as client:
        csrf = client.get('/api/session').json()['csrf']
        body = {'key': KEY, 'results': {'q1': {'Seat': ['Roof']}}}
        answer = client.post('/api/execution/resolve', json=body, headers={'X-CSRF-Token': csrf})
        assert answer.status_code == 409 and 'does not offer' in answer.json()['error'], answer.json()
        form = {'key': KEY, 'call': 'q1', 'decision': 'complete', 'result': '{"Seat": ["Roof"]}', 'csrf': csrf}
        page = client.post('/execution/resolve', data=form)
        assert page.status_code == 409 and 'does not offer' in page.text
    assert [call.call_id for call in asyncio.run(pending_calls(DiskJournal(path), KEY))] == ['q1']
