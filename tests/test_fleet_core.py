"""The fleet core, through a queue adapter of our own (FL-7): what docs/fleet.md says an adapter provides.

`ToyQueue` is a job queue in a list, and `ToyAdapter` connects it to the fleet core the way the Celery and
Procrastinate adapters connect theirs, and the way a user would connect Dramatiq, arq or RQ: one `Fleet`
per app, with how to send a task again; each message run through `Fleet.run`; journal errors turned into
the queue's retries with `retry_after`; the sweep run beside the worker. A real agent, a real disk journal.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import (
    DiskJournal,
    DispatchFailed,
    Durable,
    DurableError,
    ExecutionBusy,
    Journal,
    LeaseLost,
    MetadataMismatch,
    execution,
    pending_calls,
    resolve,
    set_dispatcher,
)
from pydantic_ai_durable.fleet import Delivery, Fleet, Waiting, fleet_of, redispatch, retry_after
from pydantic_ai_durable.testing import SimulatedCrash, crash_at

pytestmark = pytest.mark.fleet

RESUME_AFTER = 0.3


# -- a queue of our own, and its adapter ------------------------------------------------------------


@dataclass
class Message:
    task: str
    id: str
    args: list[Any]
    kwargs: dict[str, Any]
    retries: int = 0


class ToyQueue:
    """Messages in a list; a worker takes the first one. A worker that dies loses the message it took."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.sent = 0
        self.down = False
        """A broker that is down: every send raises."""

    def put(self, message: Message) -> None:
        if self.down:
            raise ConnectionError('the broker is down')
        self.messages.append(message)
        self.sent += 1


class ToyAdapter:
    """All an adapter holds: how to send a task again, how a message runs, and what a retry is here."""

    def __init__(self, queue: ToyQueue) -> None:
        self.queue = queue
        self.functions: dict[str, Callable[..., Awaitable[Any]]] = {}

        def send(delivery: Delivery) -> None:  # the one thing only the adapter knows
            self.queue.put(Message(delivery.task, str(delivery.id), list(delivery.args), dict(delivery.kwargs)))

        self.fleet = fleet_of(self, 'toy', lambda: Fleet('toy', send))

    def task(self, *, journal: Journal, resume_after: float) -> Callable[[Callable[..., Awaitable[Any]]], str]:
        def decorate(function: Callable[..., Awaitable[Any]]) -> str:
            self.fleet.add(function.__name__, journal=journal, lease_ttl=30.0, resume_after=resume_after)
            self.functions[function.__name__] = function
            return function.__name__

        return decorate

    def delay(self, task: str, task_id: str, *args: Any) -> None:
        self.queue.put(Message(task, task_id, list(args), {}))

    async def die_in_tool(self, n: int) -> None:
        """A worker's turn that dies inside tool `n`: the message it took is gone with it."""
        with crash_at(kind='tool', nth=n), pytest.raises(SimulatedCrash):
            await self.work_one()

    async def work_one(self) -> Any:
        """A worker's turn: take a message and run it in its execution; a journal error puts it back."""
        message = self.queue.messages.pop(0)
        delivery = self.fleet.delivery(message.task, message.id, message.args, message.kwargs)
        function = self.functions[message.task]
        try:
            return await self.fleet.run(delivery, lambda: function(*message.args, **message.kwargs))
        except DurableError as error:
            retry = retry_after(error, attempt=message.retries, lease_ttl=self.fleet.task(message.task).lease_ttl)
            if retry is None:
                raise
            message.retries += 1
            self.queue.messages.append(message)  # a real queue would wait retry.delay first
            return retry


# -- a real agent whose tools count their side effects ---------------------------------------------


def research_agent(effects: Counter[str]) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(part, ToolReturnPart) for message in messages for part in message.parts)
        if done < 3:
            return ModelResponse(parts=[ToolCallPart('work', {'n': done + 1}, tool_call_id=f'w{done + 1}')])
        return ModelResponse(parts=[TextPart('done')])

    def work(n: int) -> str:
        effects[f'tool-{n}'] += 1
        return f'r{n}'

    return Agent(FunctionModel(model), name='toy', tools=[work], capabilities=[Durable()])


def approval_agent(effects: Counter[str]) -> Agent[None, str | DeferredToolRequests]:
    """Asks to pay twice in one response; each payment needs a person's approval."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        effects['model'] += 1
        returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
        if not returned:
            return ModelResponse(parts=[ToolCallPart('pay', {'n': n}, tool_call_id=f'pay-{n}') for n in (1, 2)])
        return ModelResponse(parts=[TextPart(', '.join(sorted(str(part.content) for part in returned)))])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model),
        name='payer',
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        capabilities=[Durable()],
    )

    @agent.tool_plain(requires_approval=True)
    def pay(n: int) -> str:
        effects[f'pay-{n}'] += 1
        return f'paid {n}'

    return agent


@pytest.fixture
def toy(tmp_path: Path) -> tuple[ToyAdapter, DiskJournal, Counter[str]]:
    journal = DiskJournal(tmp_path / 'journal')
    effects: Counter[str] = Counter()
    agent = research_agent(effects)
    adapter = ToyAdapter(ToyQueue())

    @adapter.task(journal=journal, resume_after=RESUME_AFTER)
    async def research(prompt: str) -> str:
        return (await agent.run(prompt)).output

    payer = approval_agent(effects)

    @adapter.task(journal=journal, resume_after=RESUME_AFTER)
    async def pay_out(order: str) -> object:  # ends waiting for a person (WT-4)
        return (await payer.run(f'pay out {order}')).output

    return adapter, journal, effects


async def test_fl7_a_toy_adapter_resumes_a_task_whose_worker_died_through_the_sweep(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]],
) -> None:
    adapter, journal, effects = toy
    adapter.delay('research', 'job-1', 'topic')
    await adapter.die_in_tool(2)
    assert adapter.queue.messages == []
    [info] = await journal.list_executions()
    assert (info.key, info.state) == ('research:job-1', 'interrupted')
    assert info.metadata == {
        'engine': 'toy',
        'task': 'research',
        'id': 'job-1',
        'args': ['topic'],
        'kwargs': {},
        'queue': None,
    }
    await asyncio.sleep(RESUME_AFTER)
    assert await adapter.fleet.sweep() == ['research:job-1']
    assert await adapter.fleet.sweep() == []  # sent once per interruption
    assert [(m.task, m.id, m.args) for m in adapter.queue.messages] == [('research', 'job-1', ['topic'])]
    assert await adapter.work_one() == 'done'
    assert effects == {'tool-1': 1, 'tool-2': 1, 'tool-3': 1}  # recorded before the crash: replayed
    assert {i.key: i.state for i in await journal.list_executions()} == {'research:job-1': 'finished'}


async def test_fl7_a_busy_execution_becomes_the_queues_retry_and_then_replays(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]],
) -> None:
    adapter, journal, effects = toy
    adapter.delay('research', 'job-2', 'topic')
    holding, done = asyncio.Event(), asyncio.Event()

    async def hold() -> None:  # another live attempt, in a task of its own
        async with execution('research:job-2', journal=DiskJournal(journal.path)):
            holding.set()
            await done.wait()

    holder = asyncio.create_task(hold())
    await holding.wait()
    retry = await adapter.work_one()
    done.set()
    await holder
    assert retry.busy and isinstance(retry.error, ExecutionBusy) and 1.0 <= retry.delay <= 31.0
    assert await adapter.work_one() == 'done'
    assert sum(effects.values()) == 3


async def test_fl7_fl12_the_same_id_with_other_arguments_is_refused_by_the_core(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]],
) -> None:
    adapter, _, effects = toy
    adapter.delay('research', 'job-3', 'first')
    assert await adapter.work_one() == 'done'
    adapter.delay('research', 'job-3', 'second')
    with pytest.raises(MetadataMismatch) as refused:
        await adapter.work_one()
    assert refused.value.recorded == {'args': ['first']} and refused.value.given == {'args': ['second']}
    assert "['first']" in str(refused.value) and "['second']" in str(refused.value)
    assert sum(effects.values()) == 3  # the second delivery ran nothing


async def test_fl14_redispatch_sends_one_execution_again_from_its_metadata(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]],
) -> None:
    adapter, journal, _ = toy
    adapter.delay('research', 'job-4', 'topic')
    await adapter.die_in_tool(1)
    await redispatch(journal, 'research:job-4')  # found through the fleet that registered the task
    assert [(m.task, m.id, m.args) for m in adapter.queue.messages] == [('research', 'job-4', ['topic'])]
    assert await adapter.work_one() == 'done'
    async with execution('plain', journal=journal):
        pass
    with pytest.raises(DurableError, match='recorded no delivery'):
        await redispatch(journal, 'plain')


def test_fl7_a_delivery_reads_back_only_what_a_fleet_wrote() -> None:
    delivery = Delivery('toy', 'research', 7, ['a'], {'b': 1}, 'q')
    assert Delivery.from_metadata('research:7', delivery.metadata()) == Delivery(
        'toy', 'research', 7, ['a'], {'b': 1}, 'q'
    )
    assert Delivery.from_metadata('research:8', delivery.metadata()) is None  # another key
    assert Delivery.from_metadata('research:7', {'task': 'research', 'id': 7}) is None  # no engine
    with pytest.raises(DurableError, match='not JSON'):
        Delivery('toy', 'research', 1, [object()]).metadata()
    with pytest.raises(DurableError, match='16 KiB'):
        Delivery('toy', 'research', 1, ['x' * 17_000]).metadata()


def test_e3_errors_cross_a_process_boundary_whole() -> None:
    """A pool process hands its task's error to its worker pickled: the type and attributes come back."""
    busy = ExecutionBusy('k', holder='h:1:t:1', expires_at=1e9)
    lost = LeaseLost('k', holder=None)
    mismatch = MetadataMismatch('k', recorded={'args': [1]}, given={'args': [2]})
    unsent = DispatchFailed('k', 'ConnectionError: the broker is down')
    for error in (busy, lost, mismatch, unsent):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error) and vars(again) == vars(error)


# -- tasks that wait for a person (WT-4) ---------------------------------------------------------------


async def _ends_waiting(adapter: ToyAdapter, job: str, order: str) -> Waiting:
    """Deliver `pay_out` as job `job`: its run ends waiting on both payments, and so does the delivery."""
    adapter.delay('pay_out', job, order)
    waiting = await adapter.work_one()
    assert isinstance(waiting, Waiting) and (waiting.key, waiting.pending) == (f'pay_out:{job}', ['pay-1', 'pay-2'])
    assert adapter.queue.messages == []  # nothing retries it
    return waiting


async def test_wt4_a_delivery_that_ends_waiting_returns_json_that_says_so_and_the_sweep_sends_it_once_decided(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]],
) -> None:
    adapter, journal, effects = toy
    waiting = await _ends_waiting(adapter, 'job-5', 'A-1')
    assert json.loads(json.dumps(waiting)) == {
        'state': 'waiting',
        'key': 'pay_out:job-5',
        'pending': ['pay-1', 'pay-2'],
    }
    await asyncio.sleep(RESUME_AFTER)
    assert await adapter.fleet.sweep() == []  # waiting on two calls: never sent
    await resolve(journal, 'pay_out:job-5', approvals={'pay-1': True, 'pay-2': False}, by='alice')
    assert await adapter.fleet.sweep() == []  # decided just now
    await asyncio.sleep(RESUME_AFTER)
    assert await adapter.fleet.sweep() == ['pay_out:job-5']  # its resolver never sent it: the sweep does, once
    assert await adapter.fleet.sweep() == []
    assert await adapter.work_one() == 'The tool call was denied., paid 1'
    assert effects == {'model': 2, 'pay-1': 1}  # the first request replayed, the denied payment never made
    assert adapter.queue.messages == []


async def test_wt4_resolve_with_dispatch_sends_the_task_only_when_it_decides_the_last_pending_call(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]],
) -> None:
    adapter, journal, effects = toy
    await _ends_waiting(adapter, 'job-6', 'B-2')
    first = await resolve(journal, 'pay_out:job-6', approvals={'pay-1': True}, dispatch=True)
    assert (first.completed, first.dispatched, first.pending) == (False, False, ('pay-2',))
    assert adapter.queue.messages == []  # a call still waits: nothing is sent
    last = await resolve(journal, 'pay_out:job-6', approvals={'pay-2': True}, dispatch=True)
    assert (last.completed, last.dispatched) == (True, True)
    assert [(m.task, m.id, m.args) for m in adapter.queue.messages] == [('pay_out', 'job-6', ['B-2'])]
    again = await resolve(journal, 'pay_out:job-6', approvals={'pay-2': True}, dispatch=True)  # a retried request
    assert (again.unchanged, again.dispatched, len(adapter.queue.messages)) == (('pay-2',), False, 1)
    assert await adapter.work_one() == 'paid 1, paid 2'
    assert effects == {'model': 2, 'pay-1': 1, 'pay-2': 1}


async def test_wt4_ui7_a_console_served_with_dispatch_sends_the_task_when_its_decision_leaves_nothing_pending(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]], tmp_path: Path
) -> None:
    from starlette.testclient import TestClient

    from pydantic_ai_durable._console import ConsoleSettings, build_app

    adapter, _, effects = toy
    await _ends_waiting(adapter, 'job-8', 'D-4')
    settings = ConsoleSettings(by='ops', dispatch=True)  # what `serve --dispatch MODULE` builds
    with TestClient(build_app(DiskJournal(tmp_path / 'journal'), settings), base_url='http://127.0.0.1:8765') as client:
        csrf = client.get('/api/session').json()['csrf']
        first = client.post(
            '/api/execution/resolve',
            json={'key': 'pay_out:job-8', 'approvals': {'pay-1': True}},
            headers={'X-CSRF-Token': csrf},
        ).json()
        assert (first['pending'], first['dispatched']) == (['pay-2'], False)
        assert adapter.queue.messages == []  # a call still waits: nothing is sent
        form = {'key': 'pay_out:job-8', 'call': 'pay-2', 'decision': 'approve', 'csrf': csrf}
        page = client.post('/execution/resolve', data=form)
        assert page.status_code == 200 and 'it was sent on to a worker' in page.text
    assert [(m.task, m.id, m.args) for m in adapter.queue.messages] == [('pay_out', 'job-8', ['D-4'])]
    assert await adapter.work_one() == 'paid 1, paid 2'
    assert effects == {'model': 2, 'pay-1': 1, 'pay-2': 1}


async def test_wt4_dispatch_with_no_fleet_loaded_is_refused_before_a_decision_is_written(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]],
) -> None:
    adapter, journal, _ = toy
    await _ends_waiting(adapter, 'job-7', 'C-3')
    fleet_core = set_dispatcher(None)  # a process that never imported the fleet core
    try:
        with pytest.raises(DurableError, match='no fleet is loaded here'):
            await resolve(journal, 'pay_out:job-7', approvals={'pay-1': True, 'pay-2': True}, dispatch=True)
    finally:
        set_dispatcher(fleet_core)
    assert fleet_core is redispatch  # importing the fleet core made it the dispatcher
    assert [call.call_id for call in await pending_calls(journal, 'pay_out:job-7')] == ['pay-1', 'pay-2']


async def test_wt4_ui7_a_send_that_fails_after_the_decision_is_a_dispatch_failed_502_and_the_decision_stands(
    toy: tuple[ToyAdapter, DiskJournal, Counter[str]], tmp_path: Path
) -> None:
    from starlette.testclient import TestClient

    from pydantic_ai_durable._console import ConsoleSettings, build_app

    adapter, journal, _ = toy
    await _ends_waiting(adapter, 'job-9', 'nine')
    await _ends_waiting(adapter, 'job-10', 'ten')
    adapter.queue.down = True
    with pytest.raises(DispatchFailed, match='the decisions are recorded') as failed:
        await resolve(journal, 'pay_out:job-9', approvals={'pay-1': True, 'pay-2': True}, dispatch=True)
    assert (failed.value.key, failed.value.reason) == ('pay_out:job-9', 'ConnectionError: the broker is down')
    settings = ConsoleSettings(by='ops', dispatch=True)  # what `serve --dispatch MODULE` builds
    with TestClient(build_app(DiskJournal(tmp_path / 'journal'), settings), base_url='http://127.0.0.1:8765') as client:
        csrf = client.get('/api/session').json()['csrf']
        answer = client.post(
            '/api/execution/resolve',
            json={'key': 'pay_out:job-10', 'approvals': {'pay-1': True, 'pay-2': True}},
            headers={'X-CSRF-Token': csrf},
        )
    assert answer.status_code == 502, answer.json()
    assert 'the decisions are recorded' in answer.json()['error'] and 'the broker is down' in answer.json()['error']
    for key in ('pay_out:job-9', 'pay_out:job-10'):
        assert await pending_calls(journal, key) == []  # the decisions stand
    assert adapter.queue.messages == []
    adapter.queue.down = False
    await asyncio.sleep(RESUME_AFTER)
    assert sorted(await adapter.fleet.sweep()) == ['pay_out:job-10', 'pay_out:job-9']  # the sweep sends them
