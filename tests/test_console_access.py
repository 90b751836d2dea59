"""Who may use the console, and what it sends (UI-4, UI-6): checked over HTTP, without a browser.

The application is the one `serve` runs, called in process through Starlette's test client: the token, the
CSRF token, read-only mode, the loopback-only default, the refusal to bind others can reach without a token,
and the JSON API's answers.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_fixtures import LOCAL, console_client, record_order
from helpers import Calls, two_step_agent
from pydantic_ai.usage import RequestUsage
from starlette.testclient import TestClient

from pydantic_ai_durable import execution
from pydantic_ai_durable._cli import EXIT_USAGE, main
from pydantic_ai_durable._console import TOKEN_VARIABLE, ConsoleSettings, build_app, check_bind
from pydantic_ai_durable._errors import ConsoleRefused
from pydantic_ai_durable.journals import KEYS_VARIABLE, DiskJournal, Encryption, reseal

TOKEN = 'a-token-of-sixteen-or-more'
PAGES = [
    '/executions',
    '/execution?key=order-1',
    '/execution/live?key=order-1',
    '/execution/conversation?key=order-1',
    '/waiting',
    '/execution/fork/confirm?key=order-1&run=0&at=1',
]
API = [
    '/api/executions',
    '/api/execution?key=order-1',
    '/api/execution/messages?key=order-1',
    '/api/waiting',
    '/api/session',
]


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return record_order(tmp_path / 'journal')


_client = console_client


@pytest.fixture
def client(journal_path: Path) -> Iterator[TestClient]:
    with _client(journal_path) as found:
        yield found


def _csrf(client: TestClient) -> str:
    return str(client.get('/api/session').json()['csrf'])


def test_ui4_without_the_token_every_page_and_the_api_answer_401(journal_path: Path) -> None:
    with _client(journal_path, 'http://console.example:8765', token=TOKEN) as client:
        for path in [*PAGES, *API]:
            assert client.get(path, follow_redirects=False).status_code == 401, path
        assert client.post('/api/execution/delete', json={'key': 'order-1'}).status_code == 401
        wrong = client.get('/api/executions', headers={'Authorization': 'Bearer not-the-token-at-all'})
        assert wrong.status_code == 401
        assert client.get('/api/executions', headers={'Authorization': f'Bearer {TOKEN}'}).status_code == 200
        login = client.get(f'/executions?token={TOKEN}', follow_redirects=False)
        assert login.status_code == 303 and login.headers['location'] == '/executions'  # the token leaves the URL
        for path in PAGES:  # the session cookie now opens every page
            assert client.get(path).status_code == 200, path


def test_ui4_a_post_without_the_csrf_token_is_refused_and_changes_nothing(client: TestClient) -> None:
    for action in ('delete', 'fork', 'export'):
        form = {'key': 'order-1', 'new_key': 'copy', 'run': '0', 'at': '1'}
        assert client.post(f'/execution/{action}', data=form).status_code == 403
        assert client.post(f'/execution/{action}', data={**form, 'csrf': 'forged'}).status_code == 403
        assert client.post(f'/api/execution/{action}', json=form).status_code == 403
    assert client.get('/api/executions').json()['total'] == 1  # nothing deleted, nothing forked
    cross = client.post(
        '/execution/delete', data={'key': 'order-1', 'csrf': _csrf(client)}, headers={'Sec-Fetch-Site': 'cross-site'}
    )
    assert cross.status_code == 403
    done = client.post('/execution/delete', data={'key': 'order-1', 'csrf': _csrf(client)}, follow_redirects=False)
    assert done.status_code == 303 and client.get('/api/executions').json()['total'] == 0


def test_ui4_read_only_shows_no_action_and_refuses_every_one(journal_path: Path) -> None:
    with _client(journal_path, read_only=True) as client:
        page = client.get('/execution?key=order-1').text
        assert 'method="post"' not in page and 'fork here' not in page and '/delete/confirm' not in page
        csrf = _csrf(client)
        for action in ('delete', 'fork', 'export'):
            form = {'key': 'order-1', 'new_key': 'copy', 'at': '1', 'csrf': csrf}
            assert client.post(f'/execution/{action}', data=form).status_code == 403
            assert client.post(f'/api/execution/{action}', json=form, headers={'X-CSRF-Token': csrf}).status_code == 403
        assert client.get('/execution/delete/confirm?key=order-1').status_code == 403
        assert client.get('/api/executions').json()['total'] == 1


def test_ui4_binding_where_others_reach_it_without_a_token_refuses_to_start(
    journal_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    for host in ('0.0.0.0', '::', '192.0.2.7', 'console.example'):
        with pytest.raises(ConsoleRefused, match='without a token'):
            check_bind(host, None)
    with pytest.raises(SystemExit) as exited:  # a usage error, as argparse reports one (CLI-2)
        main(['--journal', str(journal_path), 'serve', '--host', '0.0.0.0'])
    assert exited.value.code == EXIT_USAGE
    assert 'without a token' in capsys.readouterr().err
    assert check_bind('127.0.0.1', None) is None and check_bind('::1', None) is None
    assert check_bind('0.0.0.0', TOKEN) == TOKEN
    monkeypatch.setenv(TOKEN_VARIABLE, TOKEN)
    assert check_bind('0.0.0.0', None) == TOKEN
    with pytest.raises(ConsoleRefused, match='16 characters'):
        check_bind('0.0.0.0', 'short')


def test_wt4_serve_with_dispatch_refuses_to_start_when_the_apps_tasks_cannot_be_imported(
    journal_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(['--journal', str(journal_path), 'serve', '--dispatch', 'no_such_tasks']) == 1  # before it binds
    assert "--dispatch: cannot import 'no_such_tasks'" in capsys.readouterr().err


def test_ui4_without_a_token_only_requests_naming_a_loopback_host_are_answered(journal_path: Path) -> None:
    with _client(journal_path, 'http://attacker.example') as client:  # a page of theirs resolved to 127.0.0.1
        assert client.get('/api/executions').status_code == 421
    for base in (LOCAL, 'http://localhost:8765', 'http://[::1]:8765'):
        with _client(journal_path, base) as client:
            assert client.get('/api/executions').status_code == 200, base


def test_ui4_every_response_forbids_inline_script_and_framing(client: TestClient) -> None:
    for path in [*PAGES, *API, '/static/console.css']:
        headers = client.get(path).headers
        assert (
            "script-src 'self'" in headers['content-security-policy']
            and "default-src 'none'" in headers['content-security-policy']
        )
        assert headers['x-frame-options'] == 'DENY' and headers['x-content-type-options'] == 'nosniff'


def test_ui4_no_page_or_answer_holds_key_material(
    journal_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = os.urandom(32)
    encoded = base64.b64encode(key).decode()
    monkeypatch.setenv(KEYS_VARIABLE, f'k1:{encoded}')
    sealed = tmp_path / 'sealed'

    async def record() -> None:
        journal = DiskJournal(sealed, encryption=Encryption({'k1': key}))
        async with execution('secret-1', journal=journal, metadata={'customer': 'Lovelace'}):
            await two_step_agent(journal, Calls()).run('count the rows')
        await journal.close()

    import asyncio

    asyncio.run(record())
    shown = DiskJournal(sealed)
    reseal(shown, None, 'show')  # as `serve` opens a journal without $PYDANTIC_AI_DURABLE_KEYS
    with TestClient(build_app(shown, ConsoleSettings()), base_url=LOCAL) as client:  # sealed values shown sealed
        page = client.get('/execution?key=secret-1').text
        assert 'sealed' in page and 'Lovelace' not in page
        assert client.get('/api/execution/messages?key=secret-1').status_code == 409
    with TestClient(
        build_app(DiskJournal(sealed, encryption=Encryption.from_env()), ConsoleSettings()), base_url=LOCAL
    ) as client:
        answers = [client.get(path.replace('order-1', 'secret-1')).text for path in [*PAGES, *API]]
        csrf = _csrf(client)
        answers.append(
            client.post('/api/execution/export', json={'key': 'secret-1'}, headers={'X-CSRF-Token': csrf}).text
        )
        assert 'Lovelace' in answers[1]  # opened with the keys
        raw = key.decode('latin-1')
        for text in answers:
            assert encoded not in text and key.hex() not in text and raw not in text


def test_ui6_the_api_lists_shows_exports_and_forks(client: TestClient) -> None:
    listed = client.get('/api/executions?state=finished&prefix=order').json()
    assert listed['counts']['finished'] == 1 and [e['key'] for e in listed['executions']] == ['order-1']
    assert client.get('/api/executions?state=stuck').status_code == 400
    shown = client.get('/api/execution?key=order-1').json()
    assert [step['kind'] for step in shown['runs'][0]['steps']] == ['model', 'tool', 'model']
    assert shown['history'][0]['outcome'] == 'finished' and shown['runs'][0]['steps'][1]['attempt'] == 1
    assert client.get('/api/execution/messages?key=order-1').json()[0]['kind'] == 'request'
    csrf = _csrf(client)
    exported = client.post('/api/execution/export', json={'key': 'order-1'}, headers={'X-CSRF-Token': csrf})
    assert exported.headers['content-disposition'] == 'attachment; filename="order-1.json"'
    assert exported.json()['key'] == 'order-1'
    forked = client.post(
        '/api/execution/fork', json={'key': 'order-1', 'new_key': 'order-1b', 'at': 2}, headers={'X-CSRF-Token': csrf}
    ).json()
    assert forked['into'] == 'order-1b' and forked['steps'] == 2
    missing = client.post('/api/execution/delete', json={'key': 'nothing'}, headers={'X-CSRF-Token': csrf})
    assert missing.status_code == 404


def _priced_journal(path: Path) -> DiskJournal:
    """An execution whose model is priced (gpt-4o, with tokens reported), so its spend snapshots carry a cost."""
    usages = (RequestUsage(input_tokens=1000, output_tokens=20), RequestUsage(input_tokens=1500, output_tokens=30))

    async def record() -> None:
        journal = DiskJournal(path)
        async with execution('priced-1', journal=journal):
            await two_step_agent(journal, Calls(), usages=usages, model_name='gpt-4o').run('count the rows')
        await journal.close()

    import asyncio

    asyncio.run(record())
    return DiskJournal(path)


def test_ui2_the_execution_page_shows_the_cost_of_a_priced_run_and_of_each_model_step(tmp_path: Path) -> None:
    journal = _priced_journal(tmp_path / 'journal')
    with TestClient(build_app(journal, ConsoleSettings()), base_url=LOCAL) as client:
        view = client.get('/api/execution?key=priced-1').json()
        page = client.get('/execution?key=priced-1').text
    [run] = view['runs']
    # gpt-4o: 2,500 input and 50 output tokens. The snapshot keeps the cost as a decimal string, which the
    # view read as no cost at all.
    assert run['cost'] == pytest.approx(2500 * 2.5e-6 + 50 * 10e-6)
    model_costs = [step['cost'] for step in run['steps'] if step['kind'] == 'model']
    assert len(model_costs) == 2 and all(cost is not None and cost > 0 for cost in model_costs)
    assert sum(model_costs) == pytest.approx(run['cost'])
    assert f', cost {run["cost"]:.6g}' in page
