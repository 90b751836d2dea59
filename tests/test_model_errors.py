"""A model request that raises a `ModelAPIError` is a step too (A-16), and a wait before a recorded step is not
waited again (A-17).

Every test checks the invariant of a durable run: once an execution finished, running it again returns its
recorded output with no live model request and no wait, whatever the models would answer now. The
capabilities that recover from a failed request in the same run step (`ModelFallback`, `RetryOnModelErrors`)
are in pydantic-ai-slim 2.78 and not in 2.62, and so is the model-error codec the recorded error is written
with; on 2.62 a failed request stays unrecorded, as it always was there.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelUnavailableError,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import Model
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext
from pydantic_ai.usage import RequestUsage, RunUsage, UsageLimits

from pydantic_ai_durable import Durable, Journal, MemoryJournal, execution, recorded_messages
from pydantic_ai_durable._steps import MODEL_ERRORS_RECORDED, _timer
from pydantic_ai_durable._steps import _model_errors as model_errors
from pydantic_ai_durable.testing import SimulatedCrash, crash_at

try:
    from pydantic_ai.capabilities import ModelFallback
except ImportError:  # pydantic-ai-slim 2.62
    ModelFallback = None  # type: ignore[assignment,misc]
try:
    from pydantic_ai.capabilities import RetryOnModelErrors
except ImportError:
    RetryOnModelErrors = None  # type: ignore[assignment,misc]

pytestmark = pytest.mark.anyio

needs_codec = pytest.mark.skipif(
    not MODEL_ERRORS_RECORDED,
    reason='this pydantic-ai-slim has no model-error codec (pydantic_ai.durable_exec._model_error_codec, in 2.78): '
    'a failed model request stays unrecorded, as on every release before it (A-16)',
)
needs_model_fallback = pytest.mark.skipif(
    ModelFallback is None, reason='this pydantic-ai-slim has no ModelFallback capability (2.78 has it)'
)
needs_retry = pytest.mark.skipif(
    RetryOnModelErrors is None, reason='this pydantic-ai-slim has no RetryOnModelErrors capability (2.78 has it)'
)


def overloaded() -> Exception:
    """What an adapter raises for an HTTP 503: an HTTP error of the category `RetryOnModelErrors` retries."""
    return ModelHTTPError.for_category(ModelUnavailableError, status_code=503, model_name='primary', body={'e': 1})


@dataclass
class Flaky:
    """A model that raises `error()` while `down`, and answers `answer` otherwise; `calls` counts every request."""

    answer: str
    down: bool = True
    failures_left: int | None = None
    """When set, the model recovers by itself after this many failures."""
    error: Callable[[], Exception] = overloaded
    calls: int = 0

    def model(self, name: str) -> FunctionModel:
        def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            self.calls += 1
            if self.failures_left is not None:
                if self.failures_left > 0:
                    self.failures_left -= 1
                    raise self.error()
            elif self.down:
                raise self.error()
            return ModelResponse(parts=[TextPart(self.answer)], usage=RequestUsage(input_tokens=7, output_tokens=3))

        return FunctionModel(respond, model_name=name)


def fallback_agent(journal: Journal, primary: Flaky, backup: Flaky) -> Agent[None, str]:
    """The primary model with a `ModelFallback` to the backup, which `Durable` knows by the name `backup`."""
    assert ModelFallback is not None
    backup_model = backup.model('backup')
    return Agent(
        primary.model('primary'),
        name='fallback',
        capabilities=[ModelFallback('backup'), Durable(journal=journal, models={'backup': backup_model})],
    )


@dataclass
class Sleeps:
    """The agent graph's sleep, counted and not waited: what a test sees of every wait the run makes."""

    delays: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@contextmanager
def counted_sleeps() -> Iterator[Sleeps]:
    """Counted sleeps, on a clock that moves on by what was slept: the one a durable timer reads (TM-1)."""
    sleeps = Sleeps()
    real_clock = _timer.clock
    _timer.clock = lambda: 1000.0 + sum(sleeps.delays)
    try:
        with Agent.using_sleep(sleeps):
            yield sleeps
    finally:
        _timer.clock = real_clock


async def run_once(agent: Agent[None, str], key: str = 'order-1') -> tuple[str, Any]:
    async with execution(key) as handle:
        result = await agent.run('What is on order 1?')
    return result.output, handle


# -- ModelFallback and FallbackModel ---------------------------------------------------------------------------


@needs_codec
@needs_model_fallback
async def test_a16_model_fallback_replays_the_backup_answer_after_the_primary_recovers() -> None:
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    with counted_sleeps() as sleeps:
        output, first = await run_once(agent)
        assert output == 'backup answer'
        assert (primary.calls, backup.calls) == (1, 1)
        assert first.stats.recorded['model'] == 2  # the failed request is a step of its own

        primary.down = False  # the primary recovered: a live request would now get its answer
        output, replay = await run_once(agent)
    assert output == 'backup answer'
    assert (primary.calls, backup.calls) == (1, 1)  # zero live requests to either model
    assert replay.stats.replayed['model'] == 2 and replay.stats.recorded['model'] == 0
    assert sleeps.delays == []


@needs_codec
@needs_model_fallback
async def test_a16_the_recorded_error_replays_from_every_backend(new_journal: Callable[[], Journal]) -> None:
    """Each attempt opens the journal anew, as another process would: the error is read back from the store."""
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    assert (await run_once(fallback_agent(new_journal(), primary, backup)))[0] == 'backup answer'
    primary.down = False
    for _ in range(2):
        output, replay = await run_once(fallback_agent(new_journal(), primary, backup))
        assert output == 'backup answer'
        assert replay.stats.replayed['model'] == 2
    assert (primary.calls, backup.calls) == (1, 1)


@needs_codec
@needs_model_fallback
@pytest.mark.parametrize(
    'error',
    [
        pytest.param(
            lambda: ModelHTTPError.for_category(
                ModelRateLimitError,
                status_code=429,
                model_name='primary',
                body={'error': {'code': 'rate_limit_exceeded'}},
                provider_error_code='rate_limit_exceeded',
                retry_after=2.5,
            ),
            id='categorized-http',
        ),
        pytest.param(lambda: ModelHTTPError(500, 'primary', body='upstream timed out'), id='plain-http'),
        pytest.param(lambda: ModelAPIError('primary', 'connection reset'), id='api-error'),
    ],
)
async def test_a16_the_replayed_error_has_its_original_type_and_fields(error: Callable[[], ModelAPIError]) -> None:
    """What the fallback decides from reaches it on replay as it did live: same class, message and fields."""
    journal = MemoryJournal()
    seen: list[BaseException] = []
    primary, backup = Flaky('primary answer', error=error), Flaky('backup answer', down=False)

    def fall_back_on(error: Exception) -> bool:
        seen.append(error)
        return isinstance(error, ModelAPIError)

    assert ModelFallback is not None
    agent = Agent(
        primary.model('primary'),
        name='fallback',
        capabilities=[
            ModelFallback('backup', fallback_on=fall_back_on),
            Durable(journal=journal, models={'backup': backup.model('backup')}),
        ],
    )
    assert (await run_once(agent))[0] == 'backup answer'
    assert (await run_once(agent))[0] == 'backup answer'
    assert (primary.calls, backup.calls) == (1, 1)
    live, replayed = seen
    assert replayed is not live
    assert type(replayed) is type(live)
    assert str(replayed) == str(live)
    fields = ('model_name', 'status_code', 'provider_error_code', 'retry_after')
    assert [getattr(replayed, name, None) for name in fields] == [getattr(live, name, None) for name in fields]
    if isinstance(live.body, dict):  # type: ignore[attr-defined]
        assert replayed.body == live.body  # type: ignore[attr-defined]


@needs_codec
@needs_model_fallback
async def test_a16_the_answering_response_lists_the_failed_attempt_on_replay_too() -> None:
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    async with execution('order-1'):
        live = await agent.run('What is on order 1?')
    primary.down = False
    async with execution('order-1'):
        replay = await agent.run('What is on order 1?')
    live_attempts = [(a.model_name, a.outcome) for a in live.all_messages()[-1].failed_attempts or []]  # type: ignore[union-attr]
    replay_attempts = [(a.model_name, a.outcome) for a in replay.all_messages()[-1].failed_attempts or []]  # type: ignore[union-attr]
    assert live_attempts == replay_attempts == [('primary', 'error')]


@pytest.mark.parametrize('attempts', [2, 3])
async def test_a16_fallback_model_replays_the_backup_answer(attempts: int) -> None:
    """`FallbackModel` moves on inside one step, on every release: the step records the backup's answer."""
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    primary_model, backup_model = primary.model('primary'), backup.model('backup')
    agent = Agent(
        FallbackModel(primary_model, backup_model),
        name='fallback_model',
        capabilities=[Durable(journal=journal, models={'primary': primary_model, 'backup': backup_model})],
    )
    assert (await run_once(agent))[0] == 'backup answer'
    primary.down = False
    for _ in range(attempts - 1):
        assert (await run_once(agent))[0] == 'backup answer'
    assert (primary.calls, backup.calls) == (1, 1)


@needs_codec
@needs_model_fallback
async def test_a16_a_crash_after_the_recorded_error_reruns_only_the_backup() -> None:
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    # the backup answered, and nothing recorded it yet
    with crash_at(kind='model', nth=2, point='after_body') as plan, pytest.raises(SimulatedCrash):
        await run_once(agent)
    assert plan.fired
    assert (primary.calls, backup.calls) == (1, 1)

    primary.down = False
    output, rerun = await run_once(agent)
    assert output == 'backup answer'  # the recorded error sent the rerun to the backup, as in the attempt it replays
    assert (primary.calls, backup.calls) == (1, 2)
    assert rerun.stats.replayed['model'] == 1 and rerun.stats.recorded['model'] == 1

    output, _ = await run_once(agent)
    assert output == 'backup answer'
    assert (primary.calls, backup.calls) == (1, 2)


@needs_codec
@needs_model_fallback
async def test_a16_a_run_the_error_failed_sends_the_request_again() -> None:
    """Every model failed, so the run failed: the next attempt asks them again (F-2 through the group)."""
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer')
    agent = fallback_agent(journal, primary, backup)
    with pytest.raises(BaseException) as failed:
        await run_once(agent)
    assert not isinstance(failed.value, SimulatedCrash)
    assert (primary.calls, backup.calls) == (1, 1)

    primary.down = False
    output, retry = await run_once(agent)
    assert output == 'primary answer'
    assert (primary.calls, backup.calls) == (2, 1)
    assert retry.stats.replayed['model'] == 0

    output, _ = await run_once(agent)  # and that answer replays from now on
    assert output == 'primary answer'
    assert (primary.calls, backup.calls) == (2, 1)


async def test_a16_a_run_failed_by_the_error_alone_sends_the_request_again() -> None:
    """No capability recovers: the error fails the run, and the retry is sent live, not replayed into the error."""
    journal = MemoryJournal()
    primary = Flaky('primary answer')
    agent = Agent(primary.model('primary'), name='plain', capabilities=[Durable(journal=journal)])
    with pytest.raises(ModelHTTPError):
        await run_once(agent)
    primary.down = False
    assert (await run_once(agent))[0] == 'primary answer'
    assert primary.calls == 2


class ApplicationModelError(ModelHTTPError):
    """A subclass of pydantic-ai's error an application raises from its own model: the codec cannot rebuild it."""


@needs_codec
@needs_model_fallback
@pytest.mark.parametrize(
    ('error', 'named'),
    [
        pytest.param(lambda: ApplicationModelError(503, 'primary'), 'ApplicationModelError', id='application-subclass'),
        pytest.param(lambda: ModelHTTPError(502, 'primary', body=b'\xff\xfe'), 'ModelHTTPError', id='body-not-utf8'),
    ],
)
async def test_a16_an_error_the_codec_cannot_rebuild_is_not_recorded(
    error: Callable[[], Exception], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Recording it would replay something else in its place: the request stays a live one, with a WARNING."""
    journal = MemoryJournal()
    primary = Flaky('primary answer', error=error)
    backup = Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    with caplog.at_level(logging.WARNING, logger='pydantic_ai_durable'):
        output, first = await run_once(agent)
    assert output == 'backup answer'
    assert first.stats.recorded['model'] == 1  # the backup's answer only
    assert any(f'with {named},' in record.getMessage() and 'A-16' in record.getMessage() for record in caplog.records)

    output, _ = await run_once(agent)  # the unrecorded request runs live again, into the same error
    assert output == 'backup answer'
    assert (primary.calls, backup.calls) == (2, 1)


@needs_codec
@needs_model_fallback
@pytest.mark.parametrize(
    'error',
    [
        pytest.param(lambda: RuntimeError('the adapter broke'), id='not-a-model-error'),
        pytest.param(lambda: UnexpectedModelBehavior('empty response'), id='unexpected-model-behavior'),
    ],
)
async def test_a16_only_model_api_errors_are_recorded(error: Callable[[], Exception]) -> None:
    journal = MemoryJournal()
    primary = Flaky('primary answer', error=error)
    backup = Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    with pytest.raises(BaseException) as failed:
        await run_once(agent)
    assert not isinstance(failed.value, SimulatedCrash)
    run = await journal.read_run('order-1', '0')
    assert run.entries == {}  # nothing was recorded for the request that raised
    assert (primary.calls, backup.calls) == (1, 0)


class Recovering(AbstractCapability[Any]):
    """Answers for a failed request itself: `on_model_request_error`, which every supported release has."""

    async def on_model_request_error(
        self, ctx: RunContext[Any], *, request_context: Any, error: Exception
    ) -> ModelResponse:
        return ModelResponse(parts=[TextPart('recovered')])


@needs_codec
async def test_a16_a_recovering_hook_gets_the_recorded_error_on_replay() -> None:
    journal = MemoryJournal()
    primary = Flaky('primary answer')
    agent = Agent(primary.model('primary'), name='hooked', capabilities=[Recovering(), Durable(journal=journal)])
    assert (await run_once(agent))[0] == 'recovered'
    primary.down = False
    assert (await run_once(agent))[0] == 'recovered'
    assert primary.calls == 1


@pytest.mark.skipif(MODEL_ERRORS_RECORDED, reason='this pydantic-ai-slim has the model-error codec')
async def test_a16_without_the_codec_a_failed_request_stays_unrecorded() -> None:
    """The oldest supported release keeps its behaviour: the failed request is no step, and runs live again."""
    journal = MemoryJournal()
    primary = Flaky('primary answer')
    agent = Agent(primary.model('primary'), name='hooked', capabilities=[Recovering(), Durable(journal=journal)])
    output, first = await run_once(agent)
    assert output == 'recovered'
    assert first.stats.recorded['model'] == 0
    primary.down = False
    assert (await run_once(agent))[0] == 'primary answer'  # as before: the request was no step
    assert primary.calls == 2


@needs_codec
@needs_model_fallback
async def test_a16_a_stream_that_failed_after_its_output_is_not_recorded() -> None:
    """Its events went out already; pydantic-ai fails the run rather than fall back, and so does its retry."""
    journal = MemoryJournal()
    streams = 0

    async def primary(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        nonlocal streams
        streams += 1
        yield 'a partial answer '
        raise overloaded()

    async def backup(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield 'backup answer'  # pragma: no cover

    async def handler(ctx: RunContext[Any], events: AsyncIterable[Any]) -> None:
        async for _ in events:
            pass

    assert ModelFallback is not None
    agent = Agent(
        FunctionModel(stream_function=primary, model_name='primary'),
        name='streamed',
        capabilities=[
            ModelFallback('backup'),
            Durable(
                journal=journal,
                models={'backup': FunctionModel(stream_function=backup, model_name='backup')},
                event_stream_handler=handler,
            ),
        ],
    )
    for attempt in (1, 2):
        with pytest.raises(ModelHTTPError):
            await run_once(agent)
        assert streams == attempt
    assert (await journal.read_run('order-1', '0')).entries == {}


# -- usage -----------------------------------------------------------------------------------------------------


@needs_codec
@needs_model_fallback
async def test_a16_usage_of_a_replayed_error_is_nothing_and_the_totals_stay() -> None:
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    async with execution('order-1') as first:
        live = await agent.run('What is on order 1?')
    assert live.usage.input_tokens == 7 and live.usage.output_tokens == 3
    spent = first.usage.total
    assert spent.requests == 2  # the failed request was sent, so it counts in the spend (U2-1)
    assert (spent.input_tokens, spent.output_tokens) == (7, 3)  # it billed no tokens the package can see

    primary.down = False
    async with execution('order-1') as replay:
        replayed = await agent.run('What is on order 1?')
    assert replay.usage.attempt == RunUsage()  # the replay spent nothing
    assert replay.usage.total == spent
    assert replayed.usage == spent  # the earlier spend, and nothing of the replay on top (U2-2)


@needs_codec
@needs_model_fallback
@pytest.mark.parametrize('request_limit', [2, 1])  # 1: the whole limit, as pydantic-ai counts, with a failed request
async def test_a16_u8_a_request_limit_the_first_attempt_kept_lets_its_replay_through(request_limit: int) -> None:
    """pydantic-ai counts the fallback's step once and the failed request nothing; the spend counts both (it was
    sent), and the replay's credits cover both (it used to send the request live, then to refuse the replay)."""
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    limits = UsageLimits(request_limit=request_limit)
    for _ in range(3):  # the live run, then two replays of the finished execution
        async with execution('order-1') as handle:
            result = await agent.run('What is on order 1?', usage_limits=limits)
        assert result.output == 'backup answer'
        primary.down = False
    assert result.usage.requests == 2  # a replay shows the spend: both requests were sent
    assert (primary.calls, backup.calls) == (1, 1) and handle.usage.attempt == RunUsage()


# -- RetryOnModelErrors ----------------------------------------------------------------------------------------


def retrying_agent(journal: MemoryJournal, model: Model, **retry: Any) -> Agent[None, str]:
    assert RetryOnModelErrors is not None
    return Agent(model, name='retrying', capabilities=[RetryOnModelErrors(**retry), Durable(journal=journal)])


@needs_codec
@needs_retry
async def test_a17_retry_on_model_errors_replays_without_a_request_or_a_wait() -> None:
    journal = MemoryJournal()
    flaky = Flaky('answer after retries', failures_left=2)
    agent = retrying_agent(journal, flaky.model('flaky'), max_attempts=3, initial_delay=5.0)
    with counted_sleeps() as sleeps:
        output, first = await run_once(agent)
        assert output == 'answer after retries'
        assert flaky.calls == 3
        assert len(sleeps.delays) == 2  # the first attempt waited before each retry
        assert first.stats.recorded['model'] == 3

        flaky.failures_left = 5  # a live request would fail now
        output, replay = await run_once(agent)
    assert output == 'answer after retries'
    assert flaky.calls == 3  # no live request
    assert len(sleeps.delays) == 2  # and no wait
    assert replay.stats.replayed['model'] == 3


@needs_codec
@needs_retry
async def test_a17_u8_retries_that_used_the_whole_request_limit_replay() -> None:
    journal = MemoryJournal()
    flaky = Flaky('answer after retries', failures_left=2)
    agent = retrying_agent(journal, flaky.model('flaky'), max_attempts=3, initial_delay=5.0)
    limits = UsageLimits(request_limit=1)
    with counted_sleeps():
        for _ in range(2):  # the live run (two failures, then the answer), then the replay
            async with execution('order-1'):
                result = await agent.run('What is on order 1?', usage_limits=limits)
            assert result.output == 'answer after retries'
            flaky.failures_left = 5  # a live request would fail now
    assert flaky.calls == 3 and result.usage.requests == 3  # the replay shows the spend: three were sent


@needs_codec
@needs_retry
async def test_a17_tm2_a_crash_during_the_retries_waits_only_what_is_left() -> None:
    journal = MemoryJournal()
    flaky = Flaky('answer after retries', failures_left=2)
    agent = retrying_agent(journal, flaky.model('flaky'), max_attempts=4, initial_delay=5.0)
    with counted_sleeps() as sleeps:
        # two errors recorded, the third request not sent
        with crash_at(kind='model', nth=3, point='before_body'), pytest.raises(SimulatedCrash):
            await run_once(agent)
        assert flaky.calls == 2 and len(sleeps.delays) == 2

        output, _ = await run_once(agent)
        assert output == 'answer after retries'
        assert flaky.calls == 3  # the two recorded errors replayed; only the third request went out
        assert len(sleeps.delays) == 2  # its backoff ended before the crash: a timer past its wake-up (TM-2)

        output, _ = await run_once(agent)
    assert output == 'answer after retries'
    assert (flaky.calls, len(sleeps.delays)) == (3, 2)


@needs_codec
@needs_retry
async def test_a17_retries_used_up_fail_the_run_and_the_next_attempt_retries_live() -> None:
    journal = MemoryJournal()
    flaky = Flaky('answer', failures_left=3)
    agent = retrying_agent(journal, flaky.model('flaky'), max_attempts=2, initial_delay=1.0)
    with counted_sleeps() as sleeps:
        with pytest.raises(ModelHTTPError):
            await run_once(agent)
        assert flaky.calls == 2 and len(sleeps.delays) == 1

        output, _ = await run_once(agent)  # fails once more (the third failure), then answers
    assert output == 'answer'
    assert flaky.calls == 4
    assert len(sleeps.delays) == 2


@needs_codec
@needs_model_fallback
async def test_a16_the_recorded_conversation_leaves_the_failed_request_out() -> None:
    """A failed request added nothing to the conversation (XP-5): the run reads back as the live run's history.

    Less the answering response's `failed_attempts`, which pydantic-ai attaches after the step returned it, so
    the recorded response never held them (as before A-16).
    """
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    async with execution('order-1'):
        live = await agent.run('What is on order 1?')
    recorded = await recorded_messages(journal, 'order-1')
    history = live.all_messages()
    assert history[-1].failed_attempts  # type: ignore[union-attr]
    assert recorded == [replace(m, failed_attempts=None) if isinstance(m, ModelResponse) else m for m in history]


@needs_codec
@needs_model_fallback
async def test_a16_a_recorded_error_this_release_cannot_rebuild_runs_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read where pydantic-ai has no codec (a downgrade): the entry no longer loads, so the request runs live (X-1)."""
    journal = MemoryJournal()
    primary, backup = Flaky('primary answer'), Flaky('backup answer', down=False)
    agent = fallback_agent(journal, primary, backup)
    assert (await run_once(agent))[0] == 'backup answer'
    monkeypatch.setattr(model_errors, '_CODEC', None)
    primary.down = False
    output, retry = await run_once(agent)
    assert output == 'primary answer'
    assert primary.calls == 2
    assert [d.reason for d in retry.stats.divergences] == ['recorded result no longer loads']


class RecoversTheFirst(AbstractCapability[Any]):
    """Answers a failed first request with a tool call; a later failure goes through."""

    async def on_model_request_error(
        self, ctx: RunContext[Any], *, request_context: Any, error: Exception
    ) -> ModelResponse:
        if len(request_context.messages) > 1:
            raise error
        return ModelResponse(parts=[ToolCallPart('lookup', {'order': 1}, tool_call_id='l1')])


@needs_codec
async def test_a16_a_step_between_two_failures_ends_the_streak_the_fence_starts_from() -> None:
    """The run failed at its second request: the retry replays the first failure and the tool, sends only that one."""
    journal = MemoryJournal()
    primary = Flaky('primary answer')
    looked_up: list[int] = []

    def lookup(order: int) -> str:
        looked_up.append(order)
        return 'order 1: two books'

    agent = Agent(
        primary.model('primary'),
        name='hooked',
        toolsets=[FunctionToolset([lookup], id='orders')],
        capabilities=[RecoversTheFirst(), Durable(journal=journal)],
    )
    with pytest.raises(ModelHTTPError):
        await run_once(agent)
    assert (primary.calls, looked_up) == (2, [1])

    primary.down = False
    output, retry = await run_once(agent)
    assert output == 'primary answer'
    assert (primary.calls, looked_up) == (3, [1])  # the failed request at 0 and the tool call replayed
    assert retry.stats.replayed == {'model': 1, 'tool': 1}


@needs_codec
@needs_retry
async def test_a17_a_delegate_run_replayed_inside_a_live_tool_does_not_wait_again() -> None:
    """The tool crashed after its delegate finished: the rerun runs the tool, whose delegate replays, without waits."""
    journal = MemoryJournal()
    flaky = Flaky('the delegate answer', failures_left=1)
    delegate = retrying_agent(journal, flaky.model('delegate'), max_attempts=2, initial_delay=5.0)
    asked: list[str] = []

    async def ask_delegate(question: str) -> str:
        asked.append(question)
        return (await delegate.run(question)).output

    def parent_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart('ask_delegate', {'question': 'what?'}, tool_call_id='d1')])
        return ModelResponse(parts=[TextPart('parent: done')])

    parent = Agent(
        FunctionModel(parent_model, model_name='parent'),
        name='parent',
        toolsets=[FunctionToolset([ask_delegate], id='delegation')],
        capabilities=[Durable(journal=journal)],
    )
    with counted_sleeps() as sleeps:
        with crash_at(kind='tool', name='ask_delegate', point='after_body'), pytest.raises(SimulatedCrash):
            await run_once(parent)
        assert (flaky.calls, len(sleeps.delays), asked) == (2, 1, ['what?'])

        flaky.failures_left = 5
        assert (await run_once(parent))[0] == 'parent: done'
        assert len(asked) == 2  # the tool ran again: it was never recorded
        assert flaky.calls == 2  # its delegate replayed both of its requests
        assert len(sleeps.delays) == 1  # and did not wait between them again
