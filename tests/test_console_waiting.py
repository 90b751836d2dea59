"""Deciding from the console, over HTTP without a browser (UI-7): the JSON API, the forms' refusals, CSRF, seals.

The application is the one `serve` runs, called in process through Starlette's test client, over a disk journal
where `order-7` waits on two refunds that need approval (`c2`, `c3`) and a carrier's answer from outside (`c4`),
made by the waiting tests' agent, `trip-3` on a question of pydantic-ai-harness's `AskUser`, and `order-1` is
finished. Every refusal `resolve` makes comes back as a 4xx
with the reason, and nothing is written; what is accepted is read back from the journal.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_fixtures import record_order
from starlette.testclient import TestClient
from waiting_agent import KEY, QUESTIONS, asking_agent, attempt, lines

from pydantic_ai_durable import (
    DeferredCall,
    DispatchFailed,
    DurableError,
    ExecutionBusy,
    JournalUnavailable,
    deny_overdue,
    execution,
    pending_calls,
)
from pydantic_ai_durable._console import ConsoleSettings, build_app
from pydantic_ai_durable._console._actions import decision_refused
from pydantic_ai_durable.journals import DiskJournal, Encryption, reseal

pytestmark = pytest.mark.once  # the console's own machinery, whatever the pydantic-ai version

LOCAL = 'http://127.0.0.1:8765'


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    path = tmp_path / 'journal'

    record_order(path)

    async def record() -> None:
        journal = DiskJournal(path)
        async with execution('trip-3', journal=journal):
            await asking_agent(journal, tmp_path / 'asked').run('book my trip')
        await attempt(journal, tmp_path / 'log', scenario='three', refund_timeout=3600)  # the refunds: 1 h each
        await journal.close()

    asyncio.run(record())
    return path


@pytest.fixture
def client(journal_path: Path) -> Iterator[TestClient]:
    app = build_app(DiskJournal(journal_path), ConsoleSettings(by='ops'))
    with TestClient(app, base_url=LOCAL) as found:
        yield found


def _calls(path: Path) -> dict[str, DeferredCall]:
    async def read() -> list[DeferredCall]:
        journal = DiskJournal(path)
        try:
            return await pending_calls(journal, KEY, decided=True)
        finally:
            await journal.close()

    return {call.call_id: call for call in asyncio.run(read())}


def _decide(client: TestClient, body: Any, csrf: str | None = None) -> Any:
    token = csrf if csrf is not None else client.get('/api/session').json()['csrf']
    return client.post('/api/execution/resolve', json=body, headers={'X-CSRF-Token': token})


def test_ui7_the_api_lists_the_waiting_executions_with_their_pending_calls(client: TestClient) -> None:
    listed = client.get('/api/waiting').json()
    assert listed['total'] == 2 and [e['key'] for e in listed['executions']] == [KEY, 'trip-3']  # last changed first
    waiting, asking = listed['executions']
    assert waiting['state'] == 'waiting' and waiting['problem'] is None
    calls = {call['call_id']: call for call in waiting['calls']}
    assert {call_id: call['kind'] for call_id, call in calls.items()} == {
        'c2': 'approval',
        'c3': 'approval',
        'c4': 'external',
    }
    assert calls['c3']['arguments'] == {'amount': 900} and calls['c3']['tool_metadata'] == {
        'team': 'billing',
        'wait_timeout': 3600,
    }
    assert calls['c4']['metadata'] == {'queue': 'carriers', 'parcel': 'p-1'} and calls['c4']['deadline'] is None
    since, deadline = (datetime.datetime.fromisoformat(calls['c3'][name]) for name in ('since', 'deadline'))
    assert deadline - since == datetime.timedelta(hours=1)
    page = client.get('/waiting').text
    assert deadline.strftime('%Y-%m-%d %H:%M:%S UTC') in page and 'none: it waits until decided' in page
    assert calls['c2']['since'].endswith('Z') and calls['c2']['decision'] is None
    (question,) = asking['calls']
    assert (question['tool'], question['kind']) == ('ask_user_question', 'external')
    asked = question['request']['questions']  # the validated request: what AskUser puts to the person
    assert [(q['header'], q['multi_select']) for q in asked] == [('Seat', False), ('Meals', True)]
    assert [o['label'] for o in asked[0]['options']] == [o['label'] for o in QUESTIONS['questions'][0]['options']]
    assert [e['key'] for e in client.get('/api/waiting?offset=1&limit=1').json()['executions']] == ['trip-3']


def test_ui7_the_waiting_page_is_paged_on_the_server(journal_path: Path) -> None:
    with TestClient(build_app(DiskJournal(journal_path), ConsoleSettings(page_size=1)), base_url=LOCAL) as client:
        first, second = client.get('/waiting').text, client.get('/waiting?page=2').text
    assert f'data-key="{KEY}"' in first and 'data-key="trip-3"' not in first and 'rel="next"' in first
    assert 'data-key="trip-3"' in second and f'data-key="{KEY}"' not in second and 'rel="prev"' in second
    assert 'Which seat do you want?' in second and 'Aisle' in second  # the question and its options
    assert '2 waiting' in first


def test_ui7_a_decision_needs_the_csrf_token_and_is_refused_read_only(client: TestClient, journal_path: Path) -> None:
    body = {'key': KEY, 'approvals': {'c2': True}}
    token = ConsoleSettings(token='a-token-of-sixteen-or-more')
    with TestClient(build_app(DiskJournal(journal_path), token), base_url='http://console.example') as outside:
        assert outside.post('/api/execution/resolve', json=body).status_code == 401
    assert client.post('/api/execution/resolve', json=body).status_code == 403
    assert _decide(client, body, csrf='forged').status_code == 403
    form = {'key': KEY, 'call': 'c2', 'decision': 'approve'}
    assert client.post('/execution/resolve', data=form).status_code == 403
    assert client.post('/execution/resolve', data={**form, 'csrf': 'forged'}).status_code == 403
    csrf = client.get('/api/session').json()['csrf']
    cross = client.post('/execution/resolve', data={**form, 'csrf': csrf}, headers={'Sec-Fetch-Site': 'cross-site'})
    assert cross.status_code == 403
    with TestClient(build_app(DiskJournal(journal_path), ConsoleSettings(read_only=True)), base_url=LOCAL) as reader:
        csrf = reader.get('/api/session').json()['csrf']
        assert _decide(reader, body, csrf).status_code == 403
        assert reader.post('/execution/resolve', data={**form, 'csrf': csrf}).status_code == 403
        page = reader.get('/waiting').text
        assert 'data-call="c2"' in page and 'method="post"' not in page
    assert all(call.pending for call in _calls(journal_path).values())


def test_ui7_the_api_refuses_what_resolve_refuses_with_a_4xx_and_the_reason(
    client: TestClient, journal_path: Path
) -> None:
    refusals = [
        ({'key': KEY, 'approvals': {'c9': True}}, 409, "it has no deferred call 'c9'"),
        ({'key': 'order-404', 'approvals': {'c2': True}}, 404, "there is no execution 'order-404'"),
        ({'key': 'order-1', 'approvals': {'c2': True}}, 409, 'it is finished'),
        ({'key': KEY, 'approvals': {'c4': True}}, 409, 'waits for an external decision'),
        ({'key': KEY, 'results': {'c2': 'refunded'}}, 409, 'waits for an approval decision'),
        ({'key': KEY, 'approvals': {'c2': 'yes'}}, 400, 'must be true, false'),
        ({'key': KEY, 'approvals': ['c2']}, 400, 'JSON objects keyed by tool call id'),
        ({'key': KEY, 'approvals': {'c2': True}, 'results': {'c2': 1}}, 400, 'both an approval and a result'),
        ({'key': KEY}, 400, 'Nothing to decide'),
        ({'approvals': {'c2': True}}, 400, 'send a JSON object'),
        ({'key': KEY, 'approvals': {'c2': True}, 'by': 7}, 400, '"by" names who decides'),
    ]
    for body, status, reason in refusals:
        answer = _decide(client, body)
        assert (answer.status_code, answer.headers['content-type']) == (status, 'application/json'), body
        assert reason in answer.json()['error'], (body, answer.json())
    csrf = client.get('/api/session').json()['csrf']
    for raw in (b'{"key": "order-7", "results": {"c4": NaN}}', b'not json'):
        answer = client.post(
            '/api/execution/resolve', content=raw, headers={'X-CSRF-Token': csrf, 'Content-Type': 'application/json'}
        )
        assert answer.status_code == 400 and 'not JSON' in answer.json()['error']
    assert all(call.pending for call in _calls(journal_path).values())  # nothing was written


def test_wt2_ui7_the_api_and_the_form_refuse_a_result_beyond_the_range_of_a_float(
    client: TestClient, journal_path: Path
) -> None:
    csrf = client.get('/api/session').json()['csrf']
    for raw in (
        b'{"key": "order-7", "results": {"c4": 1e999}}',
        b'{"key": "order-7", "results": {"c4": {"eta": -1e400}}}',
    ):
        answer = client.post(
            '/api/execution/resolve', content=raw, headers={'X-CSRF-Token': csrf, 'Content-Type': 'application/json'}
        )
        assert answer.status_code == 400 and 'beyond the range of a float' in answer.json()['error'], answer.json()
    form = {'key': KEY, 'call': 'c4', 'decision': 'complete', 'result': '{"eta": 1e999}', 'csrf': csrf}
    answer = client.post('/execution/resolve', data=form)
    assert answer.status_code == 400 and 'beyond the range of a float' in answer.text
    assert all(call.pending for call in _calls(journal_path).values())  # neither stored, as infinity nor as null


def test_ui7_the_api_decides_idempotently_records_who_and_the_run_goes_on(
    client: TestClient, journal_path: Path, tmp_path: Path
) -> None:
    first = _decide(client, {'key': KEY, 'approvals': {'c2': True}, 'by': 'bob'})
    assert first.json() == {
        'key': KEY,
        'decided': ['c2'],
        'unchanged': [],
        'pending': ['c3', 'c4'],
        'completed': False,
        'dispatched': False,
    }
    again = _decide(client, {'key': KEY, 'approvals': {'c2': True}})  # a retried request: accepted, nothing new
    assert again.status_code == 200 and again.json()['unchanged'] == ['c2'] and again.json()['decided'] == []
    other = _decide(client, {'key': KEY, 'approvals': {'c2': False}})
    assert other.status_code == 409 and 'was decided already: approved by bob (console API)' in other.json()['error']
    last = _decide(
        client,
        {
            'key': KEY,
            'approvals': {'c3': {'kind': 'tool-denied', 'message': 'over the limit'}},
            'results': {'c4': {'status': 'delivered'}},
        },
    )
    assert last.json()['completed'] is True
    calls = _calls(journal_path)
    assert (calls['c2'].decision and calls['c2'].decision.by) == 'bob (console API)'
    assert calls['c3'].decision and calls['c3'].decision.message == 'over the limit'
    assert calls['c4'].decision and (calls['c4'].decision.by, calls['c4'].decision.value) == (
        'ops (console API)',
        {'status': 'delivered'},
    )
    shown = client.get(f'/api/execution?key={KEY}').json()['calls']  # the audit trail, as the execution page has it
    assert [(c['call_id'], c['decision']['kind'], c['decision']['via']) for c in shown] == [
        ('c2', 'approved', 'resolve'),
        ('c3', 'denied', 'resolve'),
        ('c4', 'result', 'resolve'),
    ]

    async def go_on() -> Any:
        journal = DiskJournal(journal_path)
        try:
            return await attempt(journal, tmp_path / 'log', scenario='three', refund_timeout=3600)
        finally:
            await journal.close()

    output = asyncio.run(go_on())
    assert 'c2 refund: refunded 5' in output and "c4 carrier: {'status': 'delivered'}" in output
    assert lines(tmp_path / 'log') == ['model', 'refund 5', 'model']
    assert client.get('/api/waiting').json()['total'] == 1  # only trip-3 still waits


def test_ui7_a_refused_decision_from_a_form_shows_its_reason_on_the_page_never_a_500(
    client: TestClient, journal_path: Path
) -> None:
    csrf = client.get('/api/session').json()['csrf']
    cases = [
        ({'key': KEY, 'call': 'c9', 'decision': 'approve'}, 409, 'it has no deferred call &#39;c9&#39;'),
        ({'key': 'order-1', 'call': 'c2', 'decision': 'approve'}, 409, 'it is finished'),
        ({'key': 'order-404', 'call': 'c2', 'decision': 'deny'}, 404, 'there is no execution'),
        ({'key': KEY, 'call': 'c4', 'decision': 'complete', 'result': '{"status": '}, 400, 'is not JSON'),
        ({'key': KEY, 'call': 'c4', 'decision': 'complete', 'result': 'NaN'}, 400, 'is not JSON'),
        ({'key': KEY, 'call': 'c2', 'decision': 'complete', 'result': '1'}, 409, 'waits for an approval decision'),
        ({'key': KEY, 'call': 'c2', 'decision': 'maybe'}, 400, 'No decision &#39;maybe&#39;'),
    ]
    for form, status, reason in cases:
        for back in ('waiting', 'execution'):
            answer = client.post('/execution/resolve', data={**form, 'csrf': csrf, 'back': back})
            if back == 'execution' and form['key'] == 'order-404':
                assert answer.status_code == 404  # no execution page to go back to
                continue
            assert answer.status_code == status, (form, back)
            assert 'id="error"' in answer.text and reason in answer.text, (form, back)
    kept = client.post('/execution/resolve', data={**cases[3][0], 'csrf': csrf}).text
    assert '>{&#34;status&#34;: </textarea>' in kept  # what was typed is kept in its form
    assert all(call.pending for call in _calls(journal_path).values())
    done = client.post(
        '/execution/resolve',
        data={'key': KEY, 'call': 'c3', 'decision': 'deny', 'csrf': csrf, 'back': 'execution'},
        follow_redirects=False,
    )
    assert done.status_code == 303 and done.headers['location'] == f'/execution?key={KEY}&note=decided&call=c3'
    page = client.get(done.headers['location']).text
    assert 'Call c3 (refund) is denied by ops (console)' in page and 'data-decision="denied"' in page
    assert _calls(journal_path)['c3'].decision.message == 'The tool call was denied.'  # type: ignore[union-attr]
    assert 'id="note"' not in client.get(f'/execution?key={KEY}&note=anything+the+address+says').text


def test_ui7_sealed_calls_read_without_keys_show_as_sealed_and_are_not_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = os.urandom(32)
    path = tmp_path / 'sealed'

    async def record() -> None:
        journal = DiskJournal(path, encryption=Encryption({'k1': key}))
        await attempt(journal, tmp_path / 'log', scenario='three')
        await journal.close()

    asyncio.run(record())
    shown = DiskJournal(path)
    reseal(shown, None, 'show')  # as `serve` opens a journal without $PYDANTIC_AI_DURABLE_KEYS
    with TestClient(build_app(shown, ConsoleSettings()), base_url=LOCAL) as client:
        (listed,) = client.get('/api/waiting').json()['executions']
        assert listed['calls'] == [] and listed['sealed'] is True and 'sealed' in listed['problem']
        page = client.get('/waiting').text
        assert 'class="sealed problem"' in page and 'data-call=' not in page and '900' not in page
        assert 'id="calls-sealed"' in client.get(f'/execution?key={KEY}').text
        refused = _decide(client, {'key': KEY, 'approvals': {'c2': True}})
        assert refused.status_code == 409 and 'sealed' in refused.json()['error']
    opened = DiskJournal(path, encryption=Encryption({'k1': key}))
    with TestClient(build_app(opened, ConsoleSettings()), base_url=LOCAL) as client:
        (listed,) = client.get('/api/waiting').json()['executions']
        assert [call['call_id'] for call in listed['calls']] == ['c2', 'c3', 'c4']
        assert _decide(client, {'key': KEY, 'approvals': {'c2': True}}).json()['decided'] == ['c2']
        assert base64.b64encode(key).decode() not in client.get('/waiting').text


def test_ui7_a_call_denied_by_its_deadline_shows_how_it_was_decided(client: TestClient, journal_path: Path) -> None:
    async def sweep() -> None:
        journal = DiskJournal(journal_path)
        try:
            await deny_overdue(journal, now=time.time() + 7200)  # two hours on: the refunds' hour has passed
        finally:
            await journal.close()

    asyncio.run(sweep())
    page = client.get(f'/execution?key={KEY}').text
    for call_id in ('c2', 'c3'):
        row = page[page.index(f'data-call="{call_id}" data-decision="denied"') :]
        row = row[: row.index('</tr>')]
        assert 'its deadline passed' in row and 'it timed out and was denied' in row
    assert 'data-call="c4" data-kind="external"' in page  # still waits, with its forms
    shown = {c['call_id']: c for c in client.get(f'/api/execution?key={KEY}').json()['calls']}
    assert shown['c2']['decision']['via'] == 'deadline' and shown['c4']['decision'] is None


def test_ui7_a_failed_send_is_told_from_a_refusal_by_its_type_not_by_its_cause() -> None:
    """A 502 says the decision stands and only the send failed; a 4xx says nothing was written."""
    unsent = DispatchFailed(KEY, 'ConnectionError: the broker is down')  # no __cause__: pickled, or raised bare
    assert unsent.__cause__ is None and decision_refused(unsent).status == 502
    try:
        try:
            raise ImportError('no module named shop.tasks')
        except ImportError as exc:
            raise DurableError('no fleet is loaded here') from exc  # a refusal chained to a cause: nothing written
    except DurableError as refusal:
        assert refusal.__cause__ is not None and decision_refused(refusal).status == 409
    busy = ExecutionBusy(KEY, holder='h:1:t:1', expires_at=1e9)
    assert decision_refused(busy).status == 409
    assert decision_refused(JournalUnavailable('the server closed the connection')).status == 503
