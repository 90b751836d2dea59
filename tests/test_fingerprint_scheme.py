"""What the history fingerprint hashes on every supported pydantic-ai (FP-15), and journals of the first scheme (FP-16).

pydantic-ai 2.7x stamps each response with when its request was sent and how long it took; neither is sent to
the model, and both change on every call. A step that runs again in the middle of a run must not make every
later model request miss because of them, and a journal whose fingerprints still hashed them must keep replaying.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai import messages as pai_messages
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.function import AgentInfo, FunctionModel
from test_reliability import put_raw, read_raw

from pydantic_ai_durable import Durable, execution
from pydantic_ai_durable._fingerprint import _history, fingerprint_model_request
from pydantic_ai_durable._fingerprint._history import BOOKKEEPING_FIELDS, history_texts
from pydantic_ai_durable.journals import DiskJournal

HAS_REQUEST_TIMESTAMP = any(field.name == 'request_timestamp' for field in dataclasses.fields(ModelResponse))
needs_stamped_responses = pytest.mark.skipif(
    not HAS_REQUEST_TIMESTAMP,
    reason='this pydantic-ai stamps no request_timestamp/duration on a response (they came with 2.7x)',
)


def _history_with(response: ModelResponse) -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart('hi', timestamp=datetime(2026, 1, 1, tzinfo=UTC))]), response]


def _digest(messages: list[ModelMessage]) -> str | None:
    return fingerprint_model_request('test:m', messages, None, ModelRequestParameters())


def test_fp15_every_field_pydantic_ai_leaves_out_of_equality_is_left_out_of_the_fingerprint() -> None:
    declared = {
        field.name
        for value in vars(pai_messages).values()
        if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == pai_messages.__name__
        for field in dataclasses.fields(value)
        if not field.compare and not field.name.startswith('_')
    }
    assert declared <= BOOKKEEPING_FIELDS
    assert 'record_id' in BOOKKEEPING_FIELDS


@needs_stamped_responses
def test_fp15_request_timestamp_and_duration_do_not_count() -> None:
    def response(sent: datetime, took: float) -> ModelResponse:
        made = ModelResponse(parts=[TextPart('hello')], timestamp=datetime(2026, 1, 1, tzinfo=UTC))
        made.request_timestamp = sent  # type: ignore[attr-defined,unused-ignore]
        made.duration = timedelta(seconds=took)  # type: ignore[attr-defined,unused-ignore]
        return made

    first = _digest(_history_with(response(datetime(2026, 1, 1, tzinfo=UTC), 1.5)))
    again = _digest(_history_with(response(datetime(2026, 6, 1, tzinfo=UTC), 9.0)))
    assert first is not None and first == again
    other_text = ModelResponse(parts=[TextPart('bye')], timestamp=datetime(2026, 1, 1, tzinfo=UTC))
    assert _digest(_history_with(other_text)) != first  # what reaches the model still counts


@pytest.mark.skipif(
    any(
        field.name in BOOKKEEPING_FIELDS
        for kind in (ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart)
        for field in dataclasses.fields(kind)
    ),
    reason='this pydantic-ai puts bookkeeping fields on messages: the two schemes differ, and FP-16 matches both',
)
def test_fp16_on_releases_without_bookkeeping_fields_both_schemes_render_alike() -> None:
    """On 2.62-2.68 no message carries a field FP-15 leaves out, so journals of those releases hash as before."""
    history = _history_with(
        ModelResponse(
            parts=[TextPart('hello'), ToolCallPart('query', {'sql': 'select 1'}, tool_call_id='q1')],
            timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        )
    )
    assert history_texts(history, None) == history_texts(history, None, earlier=True)


# -- a run that repeats one step, and a journal of the first scheme, on a real agent ----------------------------


def _agent(journal: DiskJournal, calls: list[str]) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(part, pai_messages.ToolReturnPart) for m in messages for part in m.parts)
        calls.append(f'model {2 * done}')
        if done < 3:
            return ModelResponse(parts=[ToolCallPart('step', {'n': done + 1}, tool_call_id=f'c{done + 1}')])
        return ModelResponse(parts=[TextPart('done')])

    def step(n: int) -> str:
        calls.append(f'tool {2 * n - 1}')
        return f'r{n}'

    return Agent(
        FunctionModel(model),
        name='fp15',
        toolsets=[FunctionToolset([step], id='steps')],
        capabilities=[Durable(journal=journal)],
    )


@needs_stamped_responses
async def test_fp15_a_model_step_run_again_leaves_later_steps_replaying(tmp_path: Path) -> None:
    """The model step at position 2 no longer loads, so it runs live: the steps after it still replay."""
    path = tmp_path / 'j'
    calls: list[str] = []
    agent = _agent(DiskJournal(path), calls)
    async with execution('fp15', cleanup='keep'):
        assert (await agent.run('go')).output == 'done'
    put_raw(path, 'fp15', 'e/0/2', json.dumps({**read_raw(path, 'fp15', 'e/0/2'), 'v': 999}))
    calls.clear()
    async with execution('fp15', cleanup='keep') as handle:
        assert (await agent.run('go')).output == 'done'
    assert calls == ['model 2']
    assert [step.position for step in handle.stats.steps if step.outcome == 'live'] == [2]
    assert handle.stats.divergences == []


@needs_stamped_responses
async def test_fp16_a_journal_of_the_first_scheme_replays_with_no_live_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = DiskJournal(tmp_path / 'j')
    calls: list[str] = []
    agent = _agent(journal, calls)
    with monkeypatch.context() as old_code:  # the package before FP-15 hashed the bookkeeping fields
        old_code.setattr(_history, '_MESSAGE_VOLATILE', _history._EARLIER_MESSAGE)
        old_code.setattr(_history, '_PART_VOLATILE', _history._EARLIER_PART)
        async with execution('fp16', cleanup='keep'):
            assert (await agent.run('go')).output == 'done'
    assert len(calls) == 7
    calls.clear()
    async with execution('fp16', cleanup='keep') as handle:
        assert (await agent.run('go')).output == 'done'
    assert calls == []
    assert handle.stats.divergences == []
