"""The console in a real headless Chromium (UI-1..UI-5, UI-7), over a journal on disk and on PostgreSQL.

Each backend's journal holds a finished, a failed, an interrupted (its process killed with SIGKILL) and a
running execution (an agent of this process, held inside a tool), one whose key, tool arguments and model
answer are HTML and script, and two waiting ones: refunds that need approval and a parcel whose result comes
from outside (its name is markup), and a question of pydantic-ai-harness's `AskUser`. The console runs as
`pydantic-ai-durable --journal J serve` in a process of its own; one browser serves the module. Screenshots go
to the test's directory, and to the docs with `PYDANTIC_AI_DURABLE_SCREENSHOTS=docs/images/console`.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from console_browser import chromium, console_server, screenshot
from helpers import Calls, two_step_agent
from pg import fresh_schema
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from waiting_agent import HOSTILE_PARCEL, asking_agent, build, lines

from pydantic_ai_durable import DeferredCall, Durable, execution, pending_calls
from pydantic_ai_durable.journals import DiskJournal, Journal, PostgresJournal

pytestmark = pytest.mark.once

HOSTILE_KEY = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
HOSTILE_ARGUMENT = '</code><script>window.__pwned=3</script><b id="injected">bold</b>'
HOSTILE_ANSWER = '<iframe src="javascript:window.__pwned=4"></iframe><svg onload="window.__pwned=5"></svg>'
HOSTILE_DENIAL = '<img src=x onerror="window.__pwned=7">too much<script>window.__pwned=8</script>'
WAITING = 'refund-7'
ASKING = 'trip-3'

_KILLED = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai_durable import DeferredCall, Durable, execution, pending_calls
    from pydantic_ai_durable.journals import DiskJournal, PostgresJournal

    def model(messages, info):
        return ModelResponse(parts=[ToolCallPart('charge', {'cents': 1200}, tool_call_id='c1')])

    def charge(cents: int) -> str:
        os.kill(os.getpid(), signal.SIGKILL)  # the process dies inside its tool step
        return 'unreachable'

    where, schema = sys.argv[1], sys.argv[2]
    journal = DiskJournal(where) if not schema else PostgresJournal(where, schema=schema)
    agent = Agent(
        FunctionModel(model), name='payer',
        toolsets=[FunctionToolset([charge], id='pay')], capabilities=[Durable(journal=journal)],
    )

    async def main():
        async with execution('payment-7', journal=journal, lease_ttl=1.0, metadata={'order': 7}):
            await agent.run('charge order 7')

    asyncio.run(main())
    """
)


@dataclass
class Setup:
    """One backend's journal, what the test process keeps running in it, and the console serving it."""

    name: str
    make: Callable[[], Journal]
    argument: list[str]
    release: threading.Event = field(default_factory=threading.Event)
    running: threading.Thread | None = None
    base: str = ''
    shots: Path = Path()
    argv: list[str] = field(default_factory=list)
    """`--journal J [--schema S]`, to start another console on the same journal."""

    def read(self, call: Callable[[Journal], Any]) -> Any:
        async def go() -> Any:
            journal = self.make()
            try:
                return await call(journal)
            finally:
                await journal.close()

        return asyncio.run(go())


def _hostile_agent(journal: Journal) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart('lookup', {'query': HOSTILE_ARGUMENT}, tool_call_id='h1')])
        return ModelResponse(parts=[TextPart(HOSTILE_ANSWER)])

    def lookup(query: str) -> str:
        return f'found {query}'

    return Agent(
        FunctionModel(model),
        name='hostile',
        toolsets=[FunctionToolset([lookup], id='look')],
        capabilities=[Durable(journal=journal)],
    )


def _held_agent(journal: Journal, release: threading.Event) -> Agent[None, str]:
    """Three tool calls; the second waits for `release`: the execution is running until then."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(message, ModelResponse) for message in messages)
        if turn < 3:
            return ModelResponse(parts=[ToolCallPart('step', {'n': turn}, tool_call_id=f's{turn}')])
        return ModelResponse(parts=[TextPart('all steps done')])

    def step(n: int) -> str:
        if n == 1:
            release.wait(60)
        return f'step {n} done'

    return Agent(
        FunctionModel(model),
        name='held',
        toolsets=[FunctionToolset([step], id='steps')],
        capabilities=[Durable(journal=journal)],
    )


def _populate(setup: Setup, where: str, schema: str) -> None:
    async def recorded() -> None:
        journal = setup.make()
        calls = Calls()
        async with execution('order-1', journal=journal, metadata={'customer': 'ada'}):
            await two_step_agent(journal, calls).run('count the rows')
        with pytest.raises(RuntimeError):
            async with execution('order-2', journal=journal):
                await two_step_agent(journal, calls, fail_final=True).run('count the rows')
        async with execution(HOSTILE_KEY, journal=journal):
            await _hostile_agent(journal).run('look it up')
        async with execution(ASKING, journal=journal):
            await asking_agent(journal, setup.shots / 'trip.log').run('book my trip')
        async with execution(WAITING, journal=journal, metadata={'order': 7}):
            await build(journal, setup.shots / 'refund.log', scenario='hostile').run('refund order 7')
        await journal.close()

    asyncio.run(recorded())
    killed = subprocess.run([sys.executable, '-c', _KILLED, where, schema], capture_output=True, timeout=60)
    assert killed.returncode == -9, killed.stderr.decode()

    async def interrupted(journal: Journal) -> bool:  # on PostgreSQL a dead holder's lease lapses after lease_ttl
        for _ in range(200):
            if (await journal.page_executions(key='payment-7')).counts['interrupted'] == 1:
                return True
            await asyncio.sleep(0.05)
        return False

    assert setup.read(interrupted), 'payment-7 did not become interrupted'

    started = threading.Event()

    def hold() -> None:
        async def run() -> None:
            journal = setup.make()
            async with execution('order-3', journal=journal):
                started.set()
                await _held_agent(journal, setup.release).run('three steps')
            await journal.close()

        asyncio.run(run())

    setup.running = threading.Thread(target=hold, daemon=True)
    setup.running.start()
    assert started.wait(30)


@pytest.fixture(scope='module')
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture(scope='module', params=['disk', 'postgres'])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    shots = tmp_path_factory.mktemp(f'console-{request.param}')
    if request.param == 'disk':
        where, schema = str(shots / 'journal'), ''
        setup = Setup('disk', lambda: DiskJournal(where), ['--journal', where])
    else:
        where, schema = fresh_schema()
        setup = Setup('postgres', lambda: PostgresJournal(where, schema=schema), ['--journal', where])
    setup.shots = shots
    _populate(setup, where, schema)
    extra = ['--schema', schema] if schema else []
    setup.argv = [where, *extra]
    try:
        with console_server(where, *extra, serving=('--by', 'ada')) as base:
            setup.base = base
            yield setup
    finally:
        setup.release.set()
        if setup.running is not None:
            setup.running.join(30)


def _wait(driver: Any, condition: Callable[[Any], Any], timeout: float = 20) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def _texts(driver: Any, selector: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [element.text for element in driver.find_elements(By.CSS_SELECTOR, selector)]


def _open(driver: Any, setup: Setup, path: str) -> None:
    driver.get(setup.base + path)
    _wait(driver, lambda d: d.execute_script('return document.readyState') == 'complete')


def test_ui1_the_executions_page_counts_every_state_and_lists_the_rows(browser: Any, setup: Setup) -> None:
    _open(browser, setup, '/executions')
    page = setup.read(lambda journal: journal.page_executions())
    for state, count in page.counts.items():  # a state no execution is in has no tab
        assert _texts(browser, f'#count-{state}') == ([str(count)] if count else [])
    assert page.counts == {'running': 1, 'interrupted': 1, 'waiting': 2, 'failed': 1, 'finished': 2, 'corrupt': 0}
    from selenium.webdriver.common.by import By

    rows = browser.find_elements(By.CSS_SELECTOR, 'tr.execution')
    shown = [(row.get_attribute('data-key'), row.get_attribute('data-state')) for row in rows]
    assert shown == [(info.key, info.state) for info in page.executions]
    screenshot(browser, setup.shots, f'executions-{setup.name}', docs=setup.name == 'disk')
    _open(browser, setup, '/executions?state=failed')
    assert [row.get_attribute('data-key') for row in browser.find_elements(By.CSS_SELECTOR, 'tr.execution')] == [
        'order-2'
    ]
    _open(browser, setup, '/executions?prefix=order-')
    keys = [row.get_attribute('data-key') for row in browser.find_elements(By.CSS_SELECTOR, 'tr.execution')]
    assert sorted(keys) == ['order-1', 'order-2', 'order-3']
    _open(browser, setup, '/waiting')  # what a retry would resume has a section of its own
    interrupted = browser.find_elements(By.CSS_SELECTOR, '#interrupted tr.execution')
    assert [row.get_attribute('data-key') for row in interrupted] == ['payment-7']


def test_ui2_an_execution_shows_its_attempts_and_a_timeline_that_matches_the_journal(
    browser: Any, setup: Setup
) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, setup, '/execution?key=order-1')
    snapshot = setup.read(lambda journal: journal.read_run('order-1', '0'))
    rows = browser.find_elements(By.CSS_SELECTOR, 'tr.step')
    shown = [
        (int(row.get_attribute('data-position')), row.get_attribute('data-kind'), row.get_attribute('data-name'))
        for row in rows
    ]
    assert shown == [(p, e['kind'], e['name']) for p, e in sorted(snapshot.entries.items())]
    bars = browser.find_elements(By.CSS_SELECTOR, '.lane[data-attempt="1"] rect.bar')
    assert sorted(int(bar.get_attribute('data-position')) for bar in bars) == sorted(snapshot.entries)
    assert _texts(browser, '#state') == ['finished'] and _texts(browser, '#attempts') == ['1']
    assert _texts(browser, 'tr.attempt td:nth-child(5)') == ['finished']
    screenshot(browser, setup.shots, f'execution-{setup.name}', docs=setup.name == 'disk')
    _open(browser, setup, '/execution?key=order-2')
    assert 'RuntimeError' in _texts(browser, 'tr.attempt td:nth-child(5)')[0]
    _open(browser, setup, '/execution/conversation?key=order-1&run=0')
    bubbles = _texts(browser, '.bubble')
    assert bubbles[0].lower().startswith('user') and 'count the rows' in bubbles[0]
    assert 'answer: 3 rows' in bubbles[-1]
    screenshot(browser, setup.shots, f'conversation-{setup.name}', docs=setup.name == 'disk')


def test_ui3_fork_at_a_step_from_the_page_then_the_fork_replays_the_steps_before_it(browser: Any, setup: Setup) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, setup, '/execution?key=order-1')
    browser.find_element(By.CSS_SELECTOR, 'tr.step[data-position="2"] a.fork').click()
    _wait(browser, lambda d: d.find_elements(By.ID, 'new-key'))
    field = browser.find_element(By.ID, 'new-key')
    field.clear()
    field.send_keys('order-1-again')
    browser.find_element(By.ID, 'confirm').click()
    _wait(browser, lambda d: d.find_elements(By.ID, 'note'))
    assert _texts(browser, '#key') == ['order-1-again']
    assert len(browser.find_elements(By.CSS_SELECTOR, 'tr.step')) == 2  # the steps before step 2

    async def run_fork(journal: Journal) -> tuple[str, Calls]:
        calls = Calls()
        async with execution('order-1-again', journal=journal):
            result = await two_step_agent(journal, calls).run('count the rows')
        return result.output, calls

    output, calls = setup.read(run_fork)
    assert output == 'answer: 3 rows'
    assert calls['tool'] == 0 and calls['model'] == 1  # steps 0 and 1 replayed, step 2 ran live


def test_ui5_a_running_execution_updates_as_steps_are_recorded_without_a_reload(browser: Any, setup: Setup) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, setup, '/execution?key=order-3')
    assert _texts(browser, '#state') == ['running']
    before = len(browser.find_elements(By.CSS_SELECTOR, 'tr.step'))
    browser.execute_script('window.__same_page = true')
    screenshot(browser, setup.shots, f'running-{setup.name}', docs=setup.name == 'disk')
    setup.release.set()
    _wait(browser, lambda d: d.find_element(By.ID, 'state').text == 'finished', timeout=30)
    after = len(browser.find_elements(By.CSS_SELECTOR, 'tr.step'))
    assert after > before
    assert after == len(setup.read(lambda journal: journal.read_run('order-3', '0')).entries)
    assert browser.execute_script('return window.__same_page') is True  # updated in place, never reloaded


def test_ui4_a_key_a_tool_argument_and_a_model_answer_holding_html_render_as_text(browser: Any, setup: Setup) -> None:
    from selenium.webdriver.common.by import By

    from pydantic_ai_durable._console._app import link

    pages = ['/executions', link('/execution', key=HOSTILE_KEY), link('/execution/conversation', key=HOSTILE_KEY)]
    for path in pages:
        _open(browser, setup, path)
        for details in browser.find_elements(By.CSS_SELECTOR, 'details'):
            browser.execute_script('arguments[0].open = true', details)
        assert browser.execute_script('return window.__pwned') is None
        injected = browser.find_elements(By.CSS_SELECTOR, 'main img, main iframe, #injected, main svg[onload]')
        assert injected == []
        scripts = [element.get_attribute('src') for element in browser.find_elements(By.TAG_NAME, 'script')]
        assert scripts == [f'{setup.base}/static/console.js']
        assert HOSTILE_KEY in browser.find_element(By.TAG_NAME, 'main').text
    assert any(HOSTILE_ARGUMENT in text for text in _texts(browser, '.bubble pre'))
    assert any(HOSTILE_ANSWER in text for text in _texts(browser, '.bubble .text'))
    screenshot(browser, setup.shots, f'hostile-{setup.name}', docs=setup.name == 'disk')


def _submit(driver: Any, button: Any) -> None:
    """Click a form's button and wait for the page it leads to (the old page gone, the new one loaded)."""
    driver.execute_script('window.__left = false')  # a new document has no such variable
    button.click()
    loaded = "return window.__left === undefined && document.readyState === 'complete'"
    _wait(driver, lambda d: d.execute_script(loaded))


def _call(driver: Any, key: str, call_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'article.call[data-key="{key}"][data-call="{call_id}"]')


def _decisions(setup: Setup, key: str) -> dict[str, DeferredCall]:
    calls = setup.read(lambda journal: pending_calls(journal, key, decided=True))
    return {call.call_id: call for call in calls}


def _clean(driver: Any) -> None:
    """Nothing the journal holds ran as script or became an element of the page (UI-4)."""
    from selenium.webdriver.common.by import By

    assert driver.execute_script('return window.__pwned') is None
    assert driver.find_elements(By.CSS_SELECTOR, 'main img, main iframe, #injected, main svg[onload]') == []
    assert [e.get_attribute('src') for e in driver.find_elements(By.TAG_NAME, 'script')] == [
        f'{driver.current_url.split("/", 3)[0]}//{driver.current_url.split("/", 3)[2]}/static/console.js'
    ]


def test_ui7_the_waiting_page_lists_each_pending_call_with_what_it_asks(browser: Any, setup: Setup) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, setup, '/waiting')
    sections = browser.find_elements(By.CSS_SELECTOR, 'section.waiting-execution')
    page = setup.read(lambda journal: journal.page_executions(state='waiting'))
    assert [section.get_attribute('data-key') for section in sections] == [info.key for info in page.executions]
    assert sorted(info.key for info in page.executions) == [WAITING, ASKING]
    shown = [
        (card.get_attribute('data-call'), card.get_attribute('data-kind'))
        for card in browser.find_elements(By.CSS_SELECTOR, f'article.call[data-key="{WAITING}"]')
    ]
    assert shown == [('c2', 'approval'), ('c3', 'approval'), ('c4', 'external')]
    refund = _call(browser, WAITING, 'c3')
    assert '"amount": 900' in refund.find_element(By.CSS_SELECTOR, 'pre.arguments').text
    assert '"team": "billing"' in refund.find_element(By.CSS_SELECTOR, 'pre.tool-metadata').text
    assert 'none' in refund.find_element(By.CSS_SELECTOR, 'dd.deadline').text  # it waits until decided
    assert len(refund.find_elements(By.CSS_SELECTOR, 'form.approve')) == 1  # approval: approve or deny
    parcel = _call(browser, WAITING, 'c4')  # its name is markup: shown as text in its arguments and metadata
    assert json.dumps(HOSTILE_PARCEL) in parcel.find_element(By.CSS_SELECTOR, 'pre.arguments').text
    assert json.dumps(HOSTILE_PARCEL) in parcel.find_element(By.CSS_SELECTOR, 'pre.metadata').text
    assert len(parcel.find_elements(By.CSS_SELECTOR, 'form.complete')) == 1  # outside result: complete or deny
    _clean(browser)
    question = _call(browser, ASKING, 'q1')  # AskUser's validated request: its questions and their options
    assert [item.text.splitlines()[0] for item in question.find_elements(By.CSS_SELECTOR, 'li.question')] == [
        'Seat: Which seat do you want?',
        'Meals: Which meals? (several answers)',
    ]
    assert 'Aisle easier to leave' in question.text
    screenshot(browser, setup.shots, f'waiting-{setup.name}', docs=setup.name == 'disk', whole=True)


def test_ui7_approve_deny_and_complete_from_the_page_then_the_same_code_goes_on(browser: Any, setup: Setup) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, setup, '/waiting')
    first = browser.current_window_handle
    browser.switch_to.new_window('tab')  # a second operator's page, opened before the first decides
    _open(browser, setup, '/waiting')
    stale = browser.current_window_handle
    browser.switch_to.window(first)

    _submit(browser, _call(browser, WAITING, 'c2').find_element(By.CSS_SELECTOR, 'form.approve button'))
    assert 'Call c2 (refund) is approved by ada (console)' in browser.find_element(By.ID, 'note').text
    decided = _decisions(setup, WAITING)['c2'].decision
    assert decided is not None and (decided.kind, decided.by, decided.via) == ('approved', 'ada (console)', 'resolve')

    browser.switch_to.window(stale)  # a different decision for the call just approved: refused, with the reason
    _submit(browser, _call(browser, WAITING, 'c2').find_element(By.CSS_SELECTOR, 'form.deny button'))
    refused = browser.find_element(By.ID, 'error').text  # the form names the call by its ref (WT-7)
    assert re.search(r"call 'c2@0:\d+' was decided already: approved by ada \(console\)", refused), refused
    assert _decisions(setup, WAITING)['c2'].decision == decided
    browser.close()
    browser.switch_to.window(first)

    denial = _call(browser, WAITING, 'c3').find_element(By.CSS_SELECTOR, 'form.deny')
    denial.find_element(By.NAME, 'message').send_keys(HOSTILE_DENIAL)
    _submit(browser, denial.find_element(By.TAG_NAME, 'button'))
    assert 'Call c3 (refund) is denied by ada (console)' in browser.find_element(By.ID, 'note').text
    denied = _decisions(setup, WAITING)['c3'].decision
    assert denied is not None and (denied.kind, denied.message) == ('denied', HOSTILE_DENIAL)

    result = _call(browser, WAITING, 'c4').find_element(By.CSS_SELECTOR, 'form.complete textarea')
    result.send_keys('delivered')  # not JSON: refused on the page, nothing written, the text kept
    _submit(browser, result.find_element(By.XPATH, './ancestor::form//button'))
    assert re.search(r"The result for call 'c4@0:\d+' is not JSON", browser.find_element(By.ID, 'error').text)
    assert _decisions(setup, WAITING)['c4'].pending
    result = _call(browser, WAITING, 'c4').find_element(By.CSS_SELECTOR, 'form.complete textarea')
    assert result.get_attribute('value') == 'delivered'
    result.clear()
    result.send_keys('{"status": "delivered"}')
    _submit(browser, result.find_element(By.XPATH, './ancestor::form//button'))
    assert 'waits on nothing more' in browser.find_element(By.ID, 'note').text
    completed = _decisions(setup, WAITING)['c4'].decision
    assert completed is not None and (completed.kind, completed.value) == ('result', {'status': 'delivered'})

    from pydantic_ai_durable._console._app import link

    _open(browser, setup, link('/execution', key=WAITING))  # the audit trail: what, who, when, how
    trail = {
        row.get_attribute('data-call'): row for row in browser.find_elements(By.CSS_SELECTOR, '#decided tr.decided')
    }
    assert {call: row.get_attribute('data-decision') for call, row in trail.items()} == {
        'c2': 'approved',
        'c3': 'denied',
        'c4': 'result',
    }
    assert {row.find_element(By.CSS_SELECTOR, 'td.by').text for row in trail.values()} == {'ada (console)'}
    assert trail['c3'].find_element(By.CSS_SELECTOR, 'td.detail').text == HOSTILE_DENIAL
    _clean(browser)
    screenshot(browser, setup.shots, f'decided-{setup.name}', docs=setup.name == 'disk')

    async def go_on(journal: Journal) -> Any:  # the app's own code, run again: no history, no results passed
        async with execution(WAITING, journal=journal):
            return (await build(journal, setup.shots / 'refund.log', scenario='hostile').run('refund order 7')).output

    output = setup.read(go_on)
    assert "c4 carrier: {'status': 'delivered'}" in output and 'c2 refund: refunded 5' in output
    ran = lines(setup.shots / 'refund.log')
    assert ran == ['model', 'refund 5', 'model']  # the approved refund once, the denied one never, 1 new request
    _open(browser, setup, '/waiting')
    assert WAITING not in [s.get_attribute('data-key') for s in browser.find_elements(By.CSS_SELECTOR, 'section')]


def test_ui7_read_only_hides_the_forms_and_refuses_a_decision(browser: Any, setup: Setup) -> None:
    import urllib.error
    import urllib.request

    from selenium.webdriver.common.by import By

    with console_server(*setup.argv, serving=('--read-only',)) as base:
        browser.get(base + '/waiting')
        _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'article.call[data-key="{ASKING}"]'))
        assert browser.find_elements(By.CSS_SELECTOR, 'form.decide') == []
        with urllib.request.urlopen(base + '/api/session') as answer:
            csrf = json.load(answer)['csrf']
        for path, body, kind in (
            ('/execution/resolve', f'csrf={csrf}&key={ASKING}&call=q1&decision=complete&result=%22Aisle%22', 'form'),
            ('/api/execution/resolve', json.dumps({'key': ASKING, 'results': {'q1': 'Aisle'}}), 'json'),
        ):
            request = urllib.request.Request(
                base + path,
                data=body.encode(),
                headers={
                    'Content-Type': 'application/json' if kind == 'json' else 'application/x-www-form-urlencoded',
                    'X-CSRF-Token': csrf,
                },
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request)
            assert refused.value.code == 403
    assert _decisions(setup, ASKING)['q1'].pending
