"""Tool result payload encoding for leaf toolsets (T-1..T-6)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.messages import BinaryContent, ToolReturn

from pydantic_ai_durable._errors import JournalError
from pydantic_ai_durable._masking import MASK, SecretRegistry
from pydantic_ai_durable._steps._payloads import (
    CONTROL_FLOW_EXCEPTIONS,
    call_and_encode,
    decode_payload,
    encode_exception,
    encode_result,
    is_replayable_payload,
)


def _through_storage(payload: Any) -> Any:
    """What a backend hands back: the payload after a strict JSON round trip."""
    return json.loads(json.dumps(payload, allow_nan=False))


# --- T-1: successful results ---------------------------------------------------------------------


@pytest.mark.parametrize('value', [42, 'three rows', None, True, 1.5, [1, 'a', None], {'rows': [{'id': 1}]}])
def test_t1_plain_values_round_trip(value: Any) -> None:
    payload = encode_result(value, tool_name='query')
    assert payload == {'kind': 'tool_return', 'result': value}
    assert is_replayable_payload(payload)
    assert decode_payload(_through_storage(payload)) == value


class Row(BaseModel):
    id: int
    name: str


@dataclasses.dataclass
class Point:
    x: int
    y: tuple[int, int]


def test_t1_rich_values_are_stored_as_json_data() -> None:
    payload = encode_result({'row': Row(id=1, name='a'), 'point': Point(1, (2, 3)), 'raw': b'ok'}, tool_name='q')
    assert payload == {
        'kind': 'tool_return',
        'result': {'row': {'id': 1, 'name': 'a'}, 'point': {'x': 1, 'y': [2, 3]}, 'raw': 'ok'},
    }
    assert _through_storage(payload) == payload


def test_t1_tool_return_round_trip() -> None:
    original = ToolReturn(return_value={'rows': [1, 2]}, content='see the chart', metadata={'source': 'db'})
    payload = encode_result(original, tool_name='chart')
    assert payload['kind'] == 'tool_return'
    assert 'result' not in payload
    assert payload['tool_return']['return_value'] == {'rows': [1, 2]}
    assert is_replayable_payload(_through_storage(payload))
    replayed = decode_payload(_through_storage(payload))
    assert isinstance(replayed, ToolReturn)
    assert replayed == original


def test_t1_tool_return_with_binary_content() -> None:
    image = BinaryContent(data=b'\x89PNG\xff\x00', media_type='image/png')
    original = ToolReturn(return_value='image', content=[image])
    replayed = decode_payload(_through_storage(encode_result(original, tool_name='plot')))
    assert isinstance(replayed, ToolReturn)
    assert isinstance(replayed.content, list)
    item = replayed.content[0]
    assert isinstance(item, BinaryContent)
    assert item.data == b'\x89PNG\xff\x00'
    assert item.media_type == 'image/png'


def test_t1_dict_that_looks_like_a_tool_return_stays_a_value() -> None:
    value = {'return_value': 1, 'kind': 'tool-return'}
    payload = encode_result(value, tool_name='q')
    assert payload == {'kind': 'tool_return', 'result': value}
    assert decode_payload(payload) == value


# --- T-2: control-flow exceptions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ('exc', 'expected'),
    [
        (ModelRetry('no column nope'), {'kind': 'model_retry', 'message': 'no column nope'}),
        (ToolFailed('broke'), {'kind': 'tool_failed', 'message': 'broke'}),
        (ApprovalRequired(metadata={'amount': 10}), {'kind': 'approval_required', 'metadata': {'amount': 10}}),
        (ApprovalRequired(), {'kind': 'approval_required', 'metadata': None}),
        (CallDeferred(metadata={'job': 'j-1'}), {'kind': 'call_deferred', 'metadata': {'job': 'j-1'}}),
        (CallDeferred(), {'kind': 'call_deferred', 'metadata': None}),
    ],
)
def test_t2_control_flow_exceptions_are_values(exc: Exception, expected: dict[str, Any]) -> None:
    assert encode_exception(exc) == expected
    assert is_replayable_payload(expected)


def test_t2_metadata_is_json_encoded() -> None:
    payload = encode_exception(ApprovalRequired(metadata={'items': (1, 2), 'row': Row(id=1, name='a')}))
    assert payload == {'kind': 'approval_required', 'metadata': {'items': [1, 2], 'row': {'id': 1, 'name': 'a'}}}


def test_t2_unserializable_metadata_is_a_journal_error() -> None:
    with pytest.raises(JournalError, match='not JSON-serializable') as info:
        encode_exception(CallDeferred(metadata={'handle': object()}), tool_name='launch')
    assert "'launch'" in str(info.value)


async def test_t2_call_and_encode_hands_back_the_exception() -> None:
    for exc in (ModelRetry('no column nope'), ToolFailed('broke'), ApprovalRequired(metadata={'a': 1}), CallDeferred()):

        async def tool(exc: Exception = exc) -> object:
            raise exc

        outcome, payload = await call_and_encode(tool, tool_name='t')
        assert outcome is exc
        assert isinstance(outcome, CONTROL_FLOW_EXCEPTIONS)
        assert payload == encode_exception(exc)


async def test_t1_call_and_encode_returns_value_and_payload() -> None:
    calls = 0

    async def tool() -> object:
        nonlocal calls
        calls += 1
        return {'rows': 3}

    outcome, payload = await call_and_encode(tool, tool_name='query')
    assert outcome == {'rows': 3}
    assert payload == {'kind': 'tool_return', 'result': {'rows': 3}}
    assert calls == 1


# --- T-3: other exceptions -----------------------------------------------------------------------


async def test_t3_other_exceptions_propagate_unchanged() -> None:
    error = ValueError('database down')

    async def tool() -> object:
        raise error

    with pytest.raises(ValueError) as info:
        await call_and_encode(tool, tool_name='query')
    assert info.value is error


def test_t3_other_exceptions_are_not_encoded() -> None:
    assert encode_exception(RuntimeError('crash')) is None
    assert encode_exception(KeyboardInterrupt()) is None


# --- T-4: encoding failures ----------------------------------------------------------------------


def test_t4_object_is_not_json_serializable() -> None:
    with pytest.raises(JournalError) as info:
        encode_result(object(), tool_name='fetch_handle')
    message = str(info.value)
    assert 'not JSON-serializable' in message
    assert "'fetch_handle'" in message
    assert 'object' in message
    assert 'not retryable' in message
    assert info.value.__cause__ is not None


async def test_t4_call_and_encode_raises_journal_error() -> None:
    async def tool() -> object:
        return {'nested': [object()]}

    with pytest.raises(JournalError, match='not JSON-serializable'):
        await call_and_encode(tool, tool_name='fetch')


def test_t4_circular_value_is_a_journal_error() -> None:
    value: list[Any] = []
    value.append(value)
    with pytest.raises(JournalError, match='not JSON-serializable'):
        encode_result(value, tool_name='loop')


def test_t4_nan_and_infinity_become_null() -> None:
    payload = encode_result({'nan': math.nan, 'inf': math.inf, 'ninf': -math.inf}, tool_name='stats')
    assert payload['result'] == {'nan': None, 'inf': None, 'ninf': None}
    assert json.loads(json.dumps(payload, allow_nan=False)) == payload


def test_t4_huge_integers_survive() -> None:
    huge = 10**60
    payload = encode_result({'n': huge, 'neg': -huge}, tool_name='big')
    assert decode_payload(_through_storage(payload)) == {'n': huge, 'neg': -huge}


def test_t4_bytes_encode_as_text_and_invalid_utf8_is_refused() -> None:
    assert encode_result(b'hello', tool_name='read')['result'] == 'hello'
    with pytest.raises(JournalError, match='not JSON-serializable') as info:
        encode_result(b'\xff\xfe binary', tool_name='read')
    assert "'read'" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


def test_t4_every_encoded_payload_is_strict_json() -> None:
    values: list[Any] = [
        {'a': (1, 2), 'b': {3}, 4: 'int key'},
        Row(id=1, name='é'),
        Point(1, (2, 3)),
        ['\u2603', '\udcff'.encode('utf-8', 'surrogatepass').decode('utf-8', 'replace')],
        math.nan,
    ]
    for value in values:
        payload = encode_result(value, tool_name='q')
        assert _through_storage(payload) == payload


def test_t4_masking_after_encoding_reaches_strings_in_models() -> None:
    registry = SecretRegistry()
    registry.register('hunter2')
    payload = registry.mask(encode_result(Row(id=1, name='pw=hunter2'), tool_name='q'))
    assert payload == {'kind': 'tool_return', 'result': {'id': 1, 'name': f'pw={MASK}'}}


# --- T-5: decoding on replay ---------------------------------------------------------------------


def test_t5_model_retry_is_raised() -> None:
    with pytest.raises(ModelRetry) as info:
        decode_payload({'kind': 'model_retry', 'message': 'no column nope'})
    assert info.value.message == 'no column nope'
    assert type(info.value) is ModelRetry


def test_t5_tool_failed_is_raised() -> None:
    with pytest.raises(ToolFailed) as info:
        decode_payload({'kind': 'tool_failed', 'message': 'broke'})
    assert info.value.message == 'broke'


def test_t5_approval_required_is_raised_with_metadata() -> None:
    with pytest.raises(ApprovalRequired) as info:
        decode_payload({'kind': 'approval_required', 'metadata': {'amount': 10}})
    assert info.value.metadata == {'amount': 10}


def test_t5_call_deferred_is_raised_with_metadata() -> None:
    with pytest.raises(CallDeferred) as info:
        decode_payload({'kind': 'call_deferred', 'metadata': None})
    assert info.value.metadata is None


@pytest.mark.parametrize(
    'exc',
    [ModelRetry('try again'), ToolFailed('gone'), ApprovalRequired(metadata={'x': [1]}), CallDeferred(metadata={})],
)
def test_t5_every_control_flow_kind_round_trips(exc: Exception) -> None:
    payload = _through_storage(encode_exception(exc))
    with pytest.raises(type(exc)) as info:
        decode_payload(payload)
    assert type(info.value) is type(exc)
    for attribute in ('message', 'metadata'):
        assert getattr(info.value, attribute, None) == getattr(exc, attribute, None)


@pytest.mark.parametrize(
    'payload',
    [
        {'kind': 'renamed_in_a_later_version', 'result': 1},
        {'kind': 'tool_return'},
        {'kind': 'model_retry', 'message': 3},
        {'result': 1},
        'written by another version',
        None,
        [1, 2],
    ],
)
def test_t5_unknown_payloads_cannot_be_replayed(payload: Any) -> None:
    with pytest.raises(JournalError, match='cannot replay'):
        decode_payload(payload)


def test_t5_invalid_tool_return_cannot_be_replayed() -> None:
    with pytest.raises(JournalError, match='cannot replay'):
        decode_payload({'kind': 'tool_return', 'tool_return': {'content': 'no return_value'}})


def test_t5_result_is_returned_as_stored() -> None:
    stored = {'kind': 'tool_return', 'result': {'rows': [[1, 'a']]}}
    assert decode_payload(stored) == {'rows': [[1, 'a']]}


# --- T-6: validity before replay -----------------------------------------------------------------


@pytest.mark.parametrize(
    ('payload', 'valid'),
    [
        ({'kind': 'tool_return', 'result': None}, True),
        ({'kind': 'tool_return', 'result': [1]}, True),
        ({'kind': 'tool_return'}, False),
        ({'kind': 'tool_return', 'tool_return': {'return_value': 1}}, True),
        ({'kind': 'tool_return', 'tool_return': {'return_value': 1, 'kind': 'tool-return', 'tools': None}}, True),
        ({'kind': 'tool_return', 'tool_return': {'content': 'missing return_value'}}, False),
        ({'kind': 'tool_return', 'tool_return': 'not a dict'}, False),
        ({'kind': 'tool_return', 'tool_return': {'return_value': 1, 'tools': 'not a list'}}, False),
        ({'kind': 'model_retry', 'message': 'again'}, True),
        ({'kind': 'model_retry', 'message': None}, False),
        ({'kind': 'model_retry'}, False),
        ({'kind': 'tool_failed', 'message': 'broke'}, True),
        ({'kind': 'tool_failed', 'message': ['x']}, False),
        ({'kind': 'approval_required', 'metadata': {'a': 1}}, True),
        ({'kind': 'approval_required'}, True),
        ({'kind': 'call_deferred', 'metadata': None}, True),
        ({'kind': 'renamed_in_a_later_version'}, False),
        ({'kind': None, 'result': 1}, False),
        ({'result': 1}, False),
        ('written by another version', False),
        (None, False),
        ([{'kind': 'tool_return', 'result': 1}], False),
    ],
)
def test_t6_replayable_payloads(payload: Any, valid: bool) -> None:
    assert is_replayable_payload(payload) is valid


def test_t6_valid_payloads_decode_and_invalid_ones_do_not() -> None:
    samples: list[Any] = [
        {'kind': 'tool_return', 'result': 1},
        {'kind': 'tool_return', 'tool_return': {'return_value': 1}},
        {'kind': 'tool_return', 'tool_return': {'nope': 1}},
        {'kind': 'model_retry', 'message': 'x'},
        {'kind': 'tool_failed', 'message': 1},
        {'kind': 'approval_required'},
        {'kind': 'call_deferred', 'metadata': {'k': 'v'}},
        {'kind': 'other'},
        42,
    ]
    for payload in samples:
        try:
            decode_payload(payload)
        except JournalError:
            assert not is_replayable_payload(payload), payload
        except CONTROL_FLOW_EXCEPTIONS:
            assert is_replayable_payload(payload), payload
        else:
            assert is_replayable_payload(payload), payload


def _nested(depth: int) -> list[Any]:
    outer: list[Any] = []
    current = outer
    for _ in range(depth):
        inner: list[Any] = []
        current.append(inner)
        current = inner
    return outer


@pytest.mark.parametrize(
    'value',
    [
        'text',
        None,
        1.5,
        float('nan'),
        [1, {'a': [2, 3, True]}, ('x', 4)],
        10**4000,
        10**5000,
        {'rows': [1, 2, 10**5000]},
        {1: 'non-string key'},
        {10**5000: 'huge key'},
        {'set': {1, 2}},
        object(),
        _nested(50),
        _nested(5000),
    ],
    ids=lambda value: type(value).__name__,
)
def test_t4_encodable_agrees_with_writing_the_json_text(value: Any) -> None:
    from pydantic_ai_durable.journals import _json

    assert _json.encodable(value) is (_json.dumps(value) is not None)
