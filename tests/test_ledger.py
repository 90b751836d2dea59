"""Unit tests of the replay usage ledger (U-1..U-17).

Where a rule promises to cancel what pydantic-ai adds, the "graph" side is played by pydantic-ai's
own code (its pricing, `RunUsage.incr`, the continuation merge), so the tests fail if the two drift.
End-to-end agent runs live elsewhere.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest
from pydantic_ai._genai_prices import fill_response_cost
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models._continuation import merge_responses
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RequestUsage, RunUsage, UsageLimits

from pydantic_ai_durable._usage._arithmetic import (  # pyright: ignore[reportPrivateUsage]
    SUCCESSFUL_TOOL_RESULT_KINDS,
    _price_like_the_graph,  # pyright: ignore[reportPrivateUsage]
    add_usage,
    is_successful_tool_payload,
    price_response,
    subtract_request_usage,
    subtract_usage,
)
from pydantic_ai_durable._usage._ledger import ReplayUsageLedger

# -- test data -----------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeRun:
    """A journal run as the ledger sees it: recorded entries by position, and where the run stands."""

    entries: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    position: int = 0

    def peek(self, position: int) -> Mapping[str, Any] | None:
        return self.entries.get(position)

    @property
    def next_position(self) -> int:
        return self.position


def model_entry() -> dict[str, Any]:
    return {'name': 'ag__model.request', 'kind': 'model', 'fingerprint': 'fp', 'payload': {'parts': []}}


def tool_entry(kind: str = 'tool_return') -> dict[str, Any]:
    return {'name': 'ag__toolset__t.call_tool:q', 'kind': 'tool', 'fingerprint': 'fp', 'payload': {'kind': kind}}


def other_entry() -> dict[str, Any]:
    return {'name': 'ag__toolset__t.get_tools', 'kind': 'other', 'fingerprint': None, 'payload': []}


def journal(layout: str) -> FakeRun:
    """Build a run from a layout string: m = model, t = successful tool, r = retried tool, o = other, . = gap."""
    makers = {'m': model_entry, 't': tool_entry, 'r': lambda: tool_entry('model_retry'), 'o': other_entry}
    return FakeRun({i: makers[c]() for i, c in enumerate(layout) if c != '.'})


PARAMS = ModelRequestParameters(
    function_tools=[ToolDefinition(name='query'), ToolDefinition(name='charge')],
    output_tools=[ToolDefinition(name='final_result', kind='output')],
)


def calls(*names: str) -> list[ToolCallPart]:
    return [ToolCallPart(name, {}, tool_call_id=f'call-{i}') for i, name in enumerate(names)]


def response(
    *parts: Any,
    input_tokens: int = 0,
    output_tokens: int = 0,
    model_name: str | None = 'function:model:',
    response_id: str | None = None,
    state: str = 'complete',
    **usage: Any,
) -> ModelResponse:
    return ModelResponse(
        parts=list(parts) or [TextPart('ok')],
        usage=RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens, **usage),
        model_name=model_name,
        provider_response_id=response_id,
        state=state,  # type: ignore[arg-type]
    )


def prompt() -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart('hi')])]


def graph_commits(run_usage: RunUsage, replayed: ModelResponse) -> None:
    """What pydantic-ai does with a response it gets back: its own decoded copy, priced, added, counted."""
    own = copy.deepcopy(replayed)
    fill_response_cost(own)
    run_usage.incr(own.usage)
    run_usage.requests += 1


def graph_commits_chain(run_usage: RunUsage, segments: Sequence[ModelResponse]) -> None:
    """pydantic-ai's continuation loop: price each segment, merge them, commit the merge once."""
    merged = copy.deepcopy(segments[0])
    fill_response_cost(merged)
    for segment in segments[1:]:
        own = copy.deepcopy(segment)
        fill_response_cost(own)
        merged = merge_responses(merged, own)
    graph_commits(run_usage, merged)


def numeric_fields(usage_type: type[Any]) -> list[str]:
    names = []
    for field in dataclasses.fields(usage_type):
        if field.name in ('details', 'cost'):
            continue
        # A new field that is not a number would need its own netting rule: fail loudly.
        assert isinstance(field.default, (int, float)), f'{usage_type.__name__}.{field.name} is not a counter'
        names.append(field.name)
    return names


# -- U-1 -----------------------------------------------------------------------------------------


def test_u1_no_limits_means_pydantic_ai_defaults() -> None:
    usage = RunUsage(requests=50)
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=None)
    assert ledger.run_usage is usage
    ledger.credit_request()
    assert ledger.settle() is True
    with pytest.raises(UsageLimitExceeded, match='request_limit of 50'):
        ledger.record_live_model_request(had_request_credit=True)


# -- U-2 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize('usage_type', [RunUsage, RequestUsage])
def test_u2_subtract_covers_every_field(usage_type: type[RunUsage | RequestUsage]) -> None:
    names = numeric_fields(usage_type)
    assert {'input_tokens', 'output_tokens', 'cache_read_tokens', 'audio_seconds'} <= set(names)
    values: dict[str, Any] = {name: index + 1 for index, name in enumerate(names)}
    values['audio_seconds'] = 2.5
    subtrahend = usage_type(**values)
    target = RunUsage(**values)
    assert all(getattr(subtrahend, name) == value != 0 for name, value in values.items())
    if usage_type is RequestUsage:
        target.requests, target.tool_calls = 7, 8  # a response never carries these

    subtract_usage(target, subtrahend)

    for name in names:
        assert getattr(target, name) == 0, name
    if usage_type is RequestUsage:
        assert (target.requests, target.tool_calls) == (7, 8)
    else:
        assert {'requests', 'tool_calls'} <= set(names)


def test_u2_details_key_by_key() -> None:
    target = RunUsage(details={'reasoning': 5, 'kept': 1})
    subtract_usage(target, RequestUsage(details={'reasoning': 2, 'new': 3, 'broken': None}))  # type: ignore[dict-item]
    assert target.details == {'reasoning': 3, 'kept': 1, 'new': -3}
    add_usage(target, RequestUsage(details={'reasoning': 2, 'new': 3}))
    assert target.details == {'reasoning': 5, 'kept': 1, 'new': 0}


@pytest.mark.parametrize(
    ('target_cost', 'subtracted_cost', 'expected'),
    [
        (None, None, None),
        (Decimal('0.5'), None, Decimal('0.5')),
        (None, Decimal('0.2'), Decimal('-0.2')),
        (Decimal('0.5'), Decimal('0.2'), Decimal('0.3')),
    ],
)
def test_u2_cost_only_when_set(
    target_cost: Decimal | None, subtracted_cost: Decimal | None, expected: Decimal | None
) -> None:
    target = RunUsage(cost=target_cost)
    subtract_usage(target, RequestUsage(cost=subtracted_cost))
    assert target.cost == expected


def test_u2_provider_specific_counters() -> None:
    # pydantic-ai keeps unknown usage keys as attributes and sums them; so does the ledger.
    segment = RequestUsage(input_tokens=4, web_searches=2)
    target = RunUsage(input_tokens=4)
    subtract_usage(target, segment)
    assert target.web_searches == -2  # type: ignore[attr-defined]
    target.incr(segment)
    assert target.web_searches == 0  # type: ignore[attr-defined]
    assert target.input_tokens == 4


def test_u2_add_is_the_inverse_and_alias() -> None:
    original = RunUsage(requests=3, tool_calls=2, input_tokens=100, details={'a': 1}, cost=Decimal('0.3'))
    target = copy.copy(original)
    delta = RunUsage(requests=1, tool_calls=1, input_tokens=40, output_tokens=9, details={'a': 1}, cost=Decimal('0.1'))
    subtract_request_usage(target, delta)
    assert (target.requests, target.tool_calls, target.input_tokens, target.output_tokens) == (2, 1, 60, -9)
    add_usage(target, delta)
    assert target == original
    assert subtract_request_usage is subtract_usage


# -- U-3 -----------------------------------------------------------------------------------------


PRICERS = pytest.mark.parametrize(
    'price',
    [price_response, _price_like_the_graph],
    ids=['the-graphs-function', 'the-fallback-without-it'],
)
"""`price_response` calls pydantic-ai's private pricing function; the fallback for a release without it must agree."""


@PRICERS
def test_u3_a_response_is_priced_like_the_graph(price: Callable[[ModelResponse], None]) -> None:
    replayed = ModelResponse(
        parts=[TextPart('x')],
        model_name='gpt-4o',
        provider_name='openai',
        usage=RequestUsage(input_tokens=1000, output_tokens=500),
    )
    price(replayed)
    assert isinstance(replayed.usage.cost, Decimal)
    assert replayed.usage.cost == replayed.cost().total_price == Decimal('0.0075')

    graph_copy = copy.deepcopy(replayed)
    graph_copy.usage.cost = None
    fill_response_cost(graph_copy)
    assert graph_copy.usage.cost == replayed.usage.cost


@PRICERS
def test_u3_unknown_or_unnamed_models_stay_unpriced(price: Callable[[ModelResponse], None]) -> None:
    for model_name in ('function:model:', None):
        replayed = response(input_tokens=10, model_name=model_name)
        price(replayed)  # LookupError (or no name) must not escape
        assert replayed.usage.cost is None


@PRICERS
def test_u3_existing_cost_is_kept(price: Callable[[ModelResponse], None]) -> None:
    replayed = ModelResponse(
        parts=[], model_name='gpt-4o', provider_name='openai', usage=RequestUsage(input_tokens=10, cost=Decimal('9'))
    )
    price(replayed)
    assert replayed.usage.cost == Decimal('9')


@PRICERS
@pytest.mark.parametrize('input_tokens', [1000, 0])
def test_u3_unmeasured_usage_priced_as_the_graph_prices_it(
    input_tokens: int, price: Callable[[ModelResponse], None]
) -> None:
    # `ModelResponse.cost()` refuses these, the graph prices a positive lower bound; the ledger follows the graph.
    replayed = ModelResponse(
        parts=[],
        model_name='gpt-4o',
        provider_name='openai',
        usage=RequestUsage(input_tokens=input_tokens, unmeasured_requests=1),
    )
    graph_copy = copy.deepcopy(replayed)
    price(replayed)
    fill_response_cost(graph_copy)
    assert replayed.usage.cost == graph_copy.usage.cost
    assert (replayed.usage.cost is None) == (input_tokens == 0)


# -- U-4 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ('payload', 'expected'),
    [
        ({'kind': 'tool_return', 'result': 1}, True),
        ({'kind': 'tool_content_result', 'result': {}}, True),
        ({'kind': 'model_retry', 'message': 'again'}, False),
        ({'kind': 'tool_failed', 'message': 'broke'}, False),
        ({'kind': 'approval_required', 'metadata': None}, False),
        ({'kind': 'call_deferred', 'metadata': None}, False),
        ({'kind': 'validation_error'}, False),
        ({'result': 1}, False),
        ('tool_return', False),
        (None, False),
    ],
)
def test_u4_successful_tool_payload(payload: object, expected: bool) -> None:
    assert is_successful_tool_payload(payload) is expected
    assert frozenset({'tool_return', 'tool_content_result'}) == SUCCESSFUL_TOOL_RESULT_KINDS


# -- U-5 / U-6 -----------------------------------------------------------------------------------


def test_u5_continuation_needs_a_suspended_previous_and_last_message() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(), usage_limits=None)
    assert ledger.begin_model_request(prompt()) is False
    suspended = response(response_id='a', state='suspended')
    ledger.track_chain(suspended, PARAMS)
    assert ledger.begin_model_request([*prompt(), suspended]) is True
    complete = response(response_id='b')
    ledger.track_chain(complete, PARAMS)
    assert ledger.begin_model_request([*prompt(), suspended]) is False  # previous was complete


def test_u5_suspended_history_alone_is_not_a_continuation() -> None:
    # A run resumed from a history ending in a suspended response starts a new request step.
    ledger = ReplayUsageLedger(run_usage=RunUsage(), usage_limits=None)
    assert ledger.begin_model_request([*prompt(), response(state='suspended')]) is False


def test_u6_track_chain_counts_function_tool_calls() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(), usage_limits=None)
    ledger.begin_model_request(prompt())
    ledger.track_chain(response(*calls('query', 'charge', 'hallucinated', 'final_result'), TextPart('x')), PARAMS)
    assert ledger._chain_calls == 2  # unknown and output tools are not function tools


def test_u6_chain_counts_add_up_and_a_new_request_resets_them() -> None:
    usage = RunUsage(tool_calls=10)
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=None)
    first = response(*calls('query'), response_id='a', state='suspended')
    ledger.begin_model_request(prompt())
    ledger.track_chain(first, PARAMS)
    assert ledger.begin_model_request([*prompt(), first]) is True
    ledger.track_chain(response(*calls('charge', 'charge'), response_id='b'), PARAMS)
    assert ledger._chain_calls == 3
    ledger.credit_successors(FakeRun(), 0)  # nothing recorded: only the projection is noted
    assert ledger._batch_projection == 10 + 3
    ledger.begin_model_request(prompt())
    ledger.track_chain(response(*calls('query')), PARAMS)
    assert ledger._chain_calls == 1


def test_u6_same_job_repoll_replaces_the_count() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(), usage_limits=None)
    first = response(*calls('query', 'charge'), response_id='job', state='suspended')
    ledger.begin_model_request(prompt())
    ledger.track_chain(first, PARAMS)
    ledger.begin_model_request([*prompt(), first])
    ledger.track_chain(response(*calls('query', 'charge'), response_id='job'), PARAMS)
    assert ledger._chain_calls == 2  # the merge keeps only the latest snapshot's parts


def test_u6_response_from_another_model_replaces_the_count() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(), usage_limits=None)
    first = response(*calls('query', 'charge'), model_name='m1', state='suspended')
    ledger.begin_model_request(prompt())
    ledger.track_chain(first, PARAMS)
    ledger.begin_model_request([*prompt(), first])
    ledger.track_chain(response(*calls('query'), model_name='m2'), PARAMS)
    assert ledger._chain_calls == 1


# -- U-7 / U-8 -----------------------------------------------------------------------------------


def test_u7_first_model_entry_is_credited_past_other_steps() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(requests=3), usage_limits=UsageLimits(request_limit=3))
    ledger.credit_first_replay(journal('oom'))
    assert ledger.run_usage.requests == 2
    UsageLimits(request_limit=3).check_before_request(ledger.run_usage)  # pydantic-ai's first check passes


def test_u7_gap_or_empty_journal_gives_no_credit() -> None:
    for run in (journal('o.m'), FakeRun(), journal('oo')):
        ledger = ReplayUsageLedger(run_usage=RunUsage(requests=1), usage_limits=None)
        ledger.credit_first_replay(run)
        assert ledger.run_usage.requests == 1


def test_u7_starts_at_the_runs_next_position() -> None:
    run = journal('m..om')
    run.position = 3
    ledger = ReplayUsageLedger(run_usage=RunUsage(requests=1), usage_limits=None)
    ledger.credit_first_replay(run)
    assert ledger.run_usage.requests == 0
    run.position = 1
    ledger.settle()
    ledger.credit_first_replay(run)
    assert ledger.run_usage.requests == 1


def test_u8_only_one_request_credit_at_a_time() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(requests=2), usage_limits=None)
    ledger.credit_request()
    ledger.credit_request()
    assert ledger.run_usage.requests == 1
    assert ledger.settle() is True
    assert ledger.settle() is False
    assert ledger.run_usage.requests == 2


# -- U-9 -----------------------------------------------------------------------------------------


def _ledger_after_response(tool_calls: int, *names: str, usage: RunUsage | None = None) -> ReplayUsageLedger:
    ledger = ReplayUsageLedger(run_usage=usage or RunUsage(tool_calls=tool_calls), usage_limits=None)
    ledger.begin_model_request(prompt())
    ledger.track_chain(response(*calls(*names)), PARAMS)
    return ledger


def test_u9_credits_successful_tools_and_the_next_request() -> None:
    ledger = _ledger_after_response(5, 'query', 'charge', 'query')
    ledger.credit_successors(journal('mtortm'), 0)
    assert ledger._tool_credits == {1, 4}  # the retried call at 3 is not counted by pydantic-ai
    assert ledger.run_usage.tool_calls == 3
    assert ledger.run_usage.requests == -1
    assert ledger._batch_projection == 3 + 3


def test_u9_stops_at_the_next_model_entry() -> None:
    ledger = _ledger_after_response(0, 'query')
    ledger.credit_successors(journal('mmt'), 0)
    assert ledger._tool_credits == set()
    assert ledger.run_usage.requests == -1


@pytest.mark.parametrize(
    ('layout', 'n_calls', 'credited'),
    [
        ('m.t.t', 1, {2}),  # second gap exceeds one call
        ('m..t', 2, {3}),  # two gaps for two calls are allowed
        ('m...t', 2, set()),
        ('m.', 0, set()),
    ],
)
def test_u9_gaps_beyond_the_call_count_end_the_scan(layout: str, n_calls: int, credited: set[int]) -> None:
    ledger = _ledger_after_response(10, *['query'] * n_calls)
    ledger.credit_successors(journal(layout), 0)
    assert ledger._tool_credits == credited


@pytest.mark.parametrize(('n_calls', 'reach'), [(0, 17), (1, 19), (3, 23)])
def test_u9_scan_window_is_two_per_call_plus_slack_16(n_calls: int, reach: int) -> None:
    for last_seen, expect_credit in ((reach, True), (reach + 1, False)):
        layout = 'm' + 'o' * (last_seen - 1) + 'm'
        ledger = _ledger_after_response(0, *['query'] * n_calls)
        ledger.credit_successors(journal(layout), 0)
        assert (ledger.run_usage.requests == -1) is expect_credit, (n_calls, last_seen)


def test_u9_scan_starts_after_the_response_position() -> None:
    ledger = _ledger_after_response(0, 'query')
    ledger.credit_successors(journal('ttmtm'), 2)
    assert ledger._tool_credits == {3}
    assert ledger.run_usage.requests == -1


# -- U-10 / U-11 / U-14 --------------------------------------------------------------------------


def test_u10_u11_u14_credits_replays_and_settle() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(tool_calls=5), usage_limits=None)
    ledger.credit_tool_steps([1, 2], batch_calls=2)
    assert ledger.run_usage.tool_calls == 3
    ledger.record_tool_replay(1)
    ledger.run_usage.tool_calls += 1  # the tool manager counts the replayed call
    assert ledger.run_usage.tool_calls == 4
    assert ledger.settle() is False
    assert ledger.run_usage.tool_calls == 5
    ledger.record_tool_replay(7)
    ledger.run_usage.tool_calls += 1
    assert ledger.run_usage.tool_calls == 5


def test_u10_a_position_is_credited_once_and_projection_follows() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(tool_calls=4), usage_limits=None)
    ledger.credit_tool_steps([1, 2], batch_calls=2)
    ledger.credit_tool_steps([2, 3], batch_calls=3)
    assert ledger.run_usage.tool_calls == 1
    assert ledger._batch_projection == 1 + 3


def test_u11_settle_gives_back_everything() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(requests=2, tool_calls=3), usage_limits=None)
    ledger.credit_request()
    ledger.credit_tool_steps([4, 5, 6], batch_calls=3)
    assert (ledger.run_usage.requests, ledger.run_usage.tool_calls) == (1, 0)
    assert ledger.settle() is True
    assert ledger.run_usage == RunUsage(requests=2, tool_calls=3)
    assert ledger._batch_projection is None
    ledger.record_live_tool_call(4)  # its credit is gone: nothing to give back
    assert ledger.run_usage.tool_calls == 3


def test_u14_replay_of_a_credited_call_uses_the_credit_once() -> None:
    ledger = ReplayUsageLedger(run_usage=RunUsage(tool_calls=1), usage_limits=None)
    ledger.credit_tool_steps([3], batch_calls=1)
    ledger.record_tool_replay(3)
    ledger.run_usage.tool_calls += 1
    ledger.record_tool_replay(3)  # a second replay at the same position is no longer credited
    ledger.run_usage.tool_calls += 1
    ledger.settle()
    assert ledger.run_usage.tool_calls == 1


# -- U-12 ----------------------------------------------------------------------------------------


def test_u12_replayed_response_nets_to_nothing() -> None:
    seeded = RunUsage(requests=2, tool_calls=1, input_tokens=300, output_tokens=30)
    usage = copy.copy(seeded)
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=None)
    replayed = response(input_tokens=100, output_tokens=10, details={'reasoning': 4})
    ledger.begin_model_request(prompt())
    ledger.settle()
    ledger.record_model_replay(replayed, continuation=False)
    graph_commits(usage, replayed)
    ledger.settle()
    assert usage == seeded  # the `reasoning` key the replay created is tidied away again


def test_u12_priced_response_recorded_unpriced_nets_its_cost() -> None:
    for seeded_cost in (None, Decimal('0.0075')):
        seeded = RunUsage(requests=1, input_tokens=1000, output_tokens=500, cost=seeded_cost)
        usage = copy.copy(seeded)
        ledger = ReplayUsageLedger(run_usage=usage, usage_limits=None)
        recorded = ModelResponse(
            parts=[TextPart('x')],
            model_name='gpt-4o',
            provider_name='openai',
            usage=RequestUsage(input_tokens=1000, output_tokens=500),
        )
        ledger.record_model_replay(copy.deepcopy(recorded), continuation=False)
        graph_commits(usage, recorded)  # the graph prices its own copy of the journaled, unpriced response
        ledger.settle()
        assert usage == seeded
        assert usage.cost == seeded_cost


def _replay_chain(usage: RunUsage, segments: Sequence[ModelResponse]) -> None:
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=None)
    messages = prompt()
    for segment in segments:
        continuation = ledger.begin_model_request(messages)
        assert continuation == (segment is not segments[0])
        ledger.settle()
        ledger.record_model_replay(copy.deepcopy(segment), continuation=continuation)
        ledger.track_chain(segment, PARAMS)
        messages = [*prompt(), segment]
    graph_commits_chain(usage, segments)
    ledger.settle()


def test_u12_continuation_chain_with_distinct_ids_is_one_request() -> None:
    segments = [
        response(input_tokens=10, output_tokens=1, response_id='a', state='suspended'),
        response(input_tokens=20, output_tokens=2, response_id='b', state='suspended'),
        response(input_tokens=30, output_tokens=3, response_id='c'),
    ]
    seeded = RunUsage(requests=4, input_tokens=60, output_tokens=6)
    usage = copy.copy(seeded)
    _replay_chain(usage, segments)
    assert usage == seeded


def test_u12_same_job_repolls_give_back_the_previous_snapshot() -> None:
    segments = [
        response(input_tokens=10, output_tokens=1, response_id='job', state='suspended'),
        response(input_tokens=25, output_tokens=4, response_id='job', state='suspended'),
        response(input_tokens=40, output_tokens=9, response_id='job'),
    ]
    seeded = RunUsage(requests=1, input_tokens=40, output_tokens=9)
    usage = copy.copy(seeded)
    _replay_chain(usage, segments)
    assert usage == seeded


@pytest.mark.parametrize(
    'ids_and_models',
    [
        [('a', 'm1'), ('b', 'm1'), ('b', 'm1')],  # accumulate, then a re-poll of the merged id
        [('a', 'm1'), (None, 'm1'), ('a', 'm1')],  # a segment without an id keeps the chain's
        [('a', 'm1'), ('b', 'm2'), ('c', 'm2')],  # another model replaces the parts but sums usage
        [('a', 'm1'), (None, 'm2'), ('a', 'm2')],  # ... and brings its own (missing) id
    ],
)
def test_u12_chain_mirrors_the_graphs_merge(ids_and_models: list[tuple[str | None, str]]) -> None:
    last = len(ids_and_models) - 1
    segments = [
        response(
            input_tokens=10 * (i + 1),
            output_tokens=i + 1,
            response_id=response_id,
            model_name=model,
            state='complete' if i == last else 'suspended',
        )
        for i, (response_id, model) in enumerate(ids_and_models)
    ]
    seeded = RunUsage(requests=3, input_tokens=500, output_tokens=50)
    usage = copy.copy(seeded)
    _replay_chain(usage, segments)
    assert usage == seeded


# -- U-13 ----------------------------------------------------------------------------------------


def test_u13_credited_request_that_turns_live_is_rechecked() -> None:
    limits = UsageLimits(request_limit=3)
    usage = RunUsage(requests=3)
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=limits)
    ledger.credit_first_replay(journal('m'))
    limits.check_before_request(usage)  # pydantic-ai's pre-check passes thanks to the credit
    ledger.begin_model_request(prompt())
    had_credit = ledger.settle()
    assert had_credit is True
    with pytest.raises(UsageLimitExceeded):
        ledger.record_live_model_request(had_request_credit=had_credit)
    assert usage.requests == 3


def test_u13_no_recheck_without_credit_or_below_the_limit() -> None:
    usage = RunUsage(requests=3)
    ReplayUsageLedger(run_usage=usage, usage_limits=UsageLimits(request_limit=3)).record_live_model_request(
        had_request_credit=False
    )
    ReplayUsageLedger(run_usage=usage, usage_limits=UsageLimits(request_limit=4)).record_live_model_request(
        had_request_credit=True
    )
    with pytest.raises(UsageLimitExceeded, match='input_tokens_limit'):
        ReplayUsageLedger(
            run_usage=RunUsage(input_tokens=11), usage_limits=UsageLimits(input_tokens_limit=10)
        ).record_live_model_request(had_request_credit=True)


def test_u13_live_segment_forgets_the_replayed_chain() -> None:
    usage = RunUsage()
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=None)
    first = response(input_tokens=10, response_id='job', state='suspended')
    ledger.begin_model_request(prompt())
    ledger.record_model_replay(first, continuation=False)
    ledger.track_chain(first, PARAMS)
    assert ledger.begin_model_request([*prompt(), first]) is True
    ledger.record_live_model_request(had_request_credit=ledger.settle())
    live = response(input_tokens=25, response_id='job', state='suspended')
    ledger.track_chain(live, PARAMS)
    ledger.begin_model_request([*prompt(), live])
    ledger.record_model_replay(response(input_tokens=40, response_id='job'), continuation=True)
    # Nothing is given back for the live snapshot: the ledger only ever returns its own subtractions.
    assert (usage.requests, usage.input_tokens) == (-1, -50)


# -- U-15 ----------------------------------------------------------------------------------------


def test_u15_credited_call_that_turns_live_is_rechecked_against_the_batch() -> None:
    limits = UsageLimits(tool_calls_limit=3)
    usage = RunUsage(tool_calls=3)
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=limits)
    ledger.credit_tool_steps([1, 2, 3], batch_calls=3)
    projected = copy.copy(usage)
    projected.tool_calls += 3
    limits.check_before_tool_call(projected)  # pydantic-ai's up-front check passes on the credits
    ledger.record_tool_replay(1)
    usage.tool_calls += 1
    with pytest.raises(UsageLimitExceeded, match='tool_calls=4'):
        ledger.record_live_tool_call(2)


def test_u15_last_credited_call_to_turn_live_sees_the_whole_batch() -> None:
    usage = RunUsage(tool_calls=2)
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=UsageLimits(tool_calls_limit=4))
    ledger.credit_tool_steps([1, 2, 3], batch_calls=3)
    for position in (3, 1):  # completion order does not matter
        ledger.record_live_tool_call(position)
        usage.tool_calls += 1
    with pytest.raises(UsageLimitExceeded, match='tool_calls=5'):
        ledger.record_live_tool_call(2)


def test_u15_within_the_limit_counts_the_live_call_once() -> None:
    usage = RunUsage(tool_calls=3)
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=UsageLimits(tool_calls_limit=4))
    ledger.credit_tool_steps([1, 2, 3], batch_calls=3)
    for position in (1, 2):
        ledger.record_tool_replay(position)
        usage.tool_calls += 1
    ledger.record_live_tool_call(3)
    usage.tool_calls += 1
    ledger.settle()
    assert usage.tool_calls == 4


def test_u15_uncredited_or_unlimited_calls_are_not_checked() -> None:
    usage = RunUsage(tool_calls=9)
    ledger = ReplayUsageLedger(run_usage=usage, usage_limits=UsageLimits(tool_calls_limit=1))
    ledger.record_live_tool_call(4)
    assert usage.tool_calls == 9
    unlimited = ReplayUsageLedger(run_usage=RunUsage(tool_calls=9), usage_limits=None)
    unlimited.credit_tool_steps([1], batch_calls=1)
    unlimited.record_live_tool_call(1)
    assert unlimited.run_usage.tool_calls == 9


# -- U-17 ----------------------------------------------------------------------------------------


class GraphSim:
    """Plays pydantic-ai's side of a run around the ledger, in the order A-5/A-6 call it."""

    def __init__(self, run: FakeRun, usage: RunUsage, limits: UsageLimits) -> None:
        self.run, self.usage, self.limits = run, usage, limits
        self.ledger = ReplayUsageLedger(run_usage=usage, usage_limits=limits)
        self.ledger.credit_first_replay(run)
        self.live_requests = 0
        self.live_tools = 0

    def model_step(self, recorded: ModelResponse, *, live: bool = False) -> None:
        self.limits.check_before_request(self.usage)
        self.ledger.begin_model_request(prompt())
        had_credit = self.ledger.settle()
        position = self.run.position
        self.run.position += 1
        if live:
            self.ledger.record_live_model_request(had_request_credit=had_credit)
            self.live_requests += 1
            self.ledger.track_chain(recorded, PARAMS)
        else:
            self.ledger.record_model_replay(copy.deepcopy(recorded), continuation=False)
            self.ledger.track_chain(recorded, PARAMS)
            self.ledger.credit_successors(self.run, position)
        graph_commits(self.usage, recorded)

    def tool_batch(self, *live: bool) -> None:
        if self.limits.tool_calls_limit is not None:
            projected = copy.copy(self.usage)
            projected.tool_calls += len(live)
            self.limits.check_before_tool_call(projected)
        for is_live in live:
            position = self.run.position
            self.run.position += 1
            if is_live:
                self.live_tools += 1
                self.ledger.record_live_tool_call(position)
            else:
                self.ledger.record_tool_replay(position)
            self.usage.tool_calls += 1

    def finish(self) -> None:
        self.ledger.settle()


def _two_step_journal() -> tuple[FakeRun, ModelResponse, ModelResponse]:
    first = response(*calls('query', 'query', 'query'), input_tokens=100, output_tokens=10)
    final = response(input_tokens=200, output_tokens=20)
    return journal('mtttm'), first, final


@pytest.mark.parametrize('limits', [UsageLimits(request_limit=2), UsageLimits(request_limit=2, tool_calls_limit=3)])
def test_u17_full_replay_at_the_limits_succeeds_and_changes_nothing(limits: UsageLimits) -> None:
    run, first, final = _two_step_journal()
    seeded = RunUsage(requests=2, tool_calls=3, input_tokens=300, output_tokens=30)
    usage = copy.copy(seeded)
    sim = GraphSim(run, usage, limits)
    sim.model_step(first)
    sim.tool_batch(False, False, False)
    sim.model_step(final)
    sim.finish()
    assert usage == seeded


@pytest.mark.parametrize(('tool_calls_limit', 'fails'), [(3, True), (4, False)])
def test_u17_missing_tool_entry_is_checked_when_it_runs_live(tool_calls_limit: int, fails: bool) -> None:
    run, first, final = _two_step_journal()
    del run.entries[2]
    usage = RunUsage(requests=2, tool_calls=3, input_tokens=300, output_tokens=30)
    sim = GraphSim(run, usage, UsageLimits(request_limit=3, tool_calls_limit=tool_calls_limit))
    sim.model_step(first)
    if fails:
        with pytest.raises(UsageLimitExceeded):
            sim.tool_batch(False, True, False)
        return
    sim.tool_batch(False, True, False)
    sim.model_step(final)
    sim.finish()
    assert (usage.requests, usage.tool_calls, usage.input_tokens) == (2, 4, 300)


def test_u17_partial_replay_counts_only_live_work() -> None:
    # U-17: attempt 1 recorded the first response and the tool call, then crashed in the final request.
    run = journal('mt')
    first = response(*calls('query'), input_tokens=100, output_tokens=10)
    final = response(input_tokens=200, output_tokens=20)
    usage = RunUsage()
    sim = GraphSim(run, usage, UsageLimits())
    sim.model_step(first)
    sim.tool_batch(False)
    sim.model_step(final, live=True)
    sim.finish()
    assert (usage.requests, usage.tool_calls, usage.input_tokens, usage.output_tokens) == (1, 0, 200, 20)


def test_u17_seeded_at_request_limit_with_a_stale_first_entry_stops_before_the_model() -> None:
    # U-13: the first entry no longer matches, so the credited request goes live and must be refused.
    usage = RunUsage(requests=2)
    sim = GraphSim(journal('m'), usage, UsageLimits(request_limit=2))
    with pytest.raises(UsageLimitExceeded):
        sim.model_step(response(), live=True)
    assert sim.live_requests == 0
    assert usage.requests == 2
