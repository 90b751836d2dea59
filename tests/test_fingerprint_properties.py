"""PERF-1's equality, as a property: the incremental fingerprint equals the from-scratch one.

A random history is fed to one `ModelFingerprinter` as a run would feed it (growing by a few messages
per request), interleaved with the edits a run can make: truncation, replaced or copied messages, an
in-place edit of the previous request's last message (which may also sit at earlier positions), a newly
registered secret, and settings or parameters that change between requests.

Not generated, because `ModelFingerprinter` documents them as unseen: an in-place edit that reaches an
older message some other way, and a message or parameters object replaced by one that is `==` to it but
renders differently (`1` for `True`). Replacements are therefore made unequal on purpose.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.tools import ToolDefinition

from pydantic_ai_durable._fingerprint import ModelFingerprinter, fingerprint_model_request
from pydantic_ai_durable._masking import SecretRegistry


@dataclasses.dataclass(frozen=True)
class Point:
    x: int


words = st.text(alphabet='abcxyz_-é"\\ ', max_size=6)
json_scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False) | words
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3), max_leaves=6
)
odd_values = st.one_of(
    json_values,
    st.sets(words, max_size=5),
    st.frozensets(st.integers(0, 9), max_size=4),
    st.sets(st.tuples(st.integers(0, 2), st.frozensets(words, max_size=3)), max_size=3),
    st.tuples(st.integers(0, 3), words),
    st.datetimes(timezones=st.just(UTC)),
    st.binary(max_size=4),
    st.decimals(places=2, min_value=-10, max_value=10),
    st.dictionaries(st.integers(0, 3), words, max_size=2),
    st.dictionaries(st.one_of(st.integers(0, 2), st.sampled_from(['0', '1', 'a'])), words, max_size=3),
    st.just(frozenset({Point(1), Point(2)})),
)
user_data = st.dictionaries(words, odd_values, max_size=3)
call_ids = st.sampled_from(['c1', 'c2', 'c3', None])


def request_parts() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(UserPromptPart, words),
        st.builds(SystemPromptPart, words),
        st.builds(
            ToolReturnPart,
            tool_name=st.sampled_from(['query', 'fetch']),
            content=st.one_of(words, user_data),
            tool_call_id=st.sampled_from(['c1', 'c2', 'c3']),
            metadata=st.none() | user_data,
        ),
    )


def response_parts() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(TextPart, words),
        st.builds(ToolCallPart, tool_name=st.sampled_from(['query', 'fetch']), args=user_data, tool_call_id=call_ids),
    )


messages = st.one_of(
    st.builds(ModelRequest, parts=st.lists(request_parts(), min_size=1, max_size=3), metadata=st.none() | user_data),
    st.builds(ModelResponse, parts=st.lists(response_parts(), min_size=1, max_size=3), model_name=words),
)
schemas = st.fixed_dictionaries({'type': st.just('object')}, optional={'properties': user_data, 'default': odd_values})
tools = st.builds(
    ToolDefinition,
    name=st.sampled_from(['query', 'fetch', 'final_result']),
    parameters_json_schema=schemas,
    strict=st.none() | st.booleans(),
    capability_id=st.none() | words,
)
request_params = st.builds(
    ModelRequestParameters,
    function_tools=st.lists(tools, max_size=3),
    output_tools=st.lists(tools, max_size=1),
    output_mode=st.sampled_from(['text', 'tool', 'native']),
    revealed_tool_names=st.sets(words, max_size=4),
    introduced_tool_names=st.sets(words, max_size=4),
    deferred_capability_ids=st.sets(words, max_size=3),
)
model_settings = st.none() | st.fixed_dictionaries(
    {},
    optional={
        'temperature': st.sampled_from([0, 0.0, 1, 1.0, 0.5, True]),
        'timeout': st.floats(1, 60),
        'max_tokens': st.integers(1, 5),
        'anthropic_cache_messages': st.booleans(),
        'extra_body': odd_values,
        'stop_sequences': st.lists(words, max_size=2),
        'seed': st.sampled_from([Decimal('1.0'), 1]),
    },
)
actions = st.sampled_from(['extend', 'extend', 'extend', 'truncate', 'replace', 'copy', 'edit-last', 'secret'])


def edit_in_place(message: ModelMessage, data: st.DataObject) -> None:
    """Edit a message the way pydantic-ai or a capability edits the request it is sending."""
    how = data.draw(st.sampled_from(['metadata', 'append-part', 'nested']))
    if how == 'metadata':
        message.metadata = data.draw(user_data)
    elif how == 'append-part':
        new_part = data.draw(request_parts() if isinstance(message, ModelRequest) else response_parts())
        message.parts = [*message.parts, new_part]  # type: ignore[list-item]
    else:
        for part in message.parts:
            target = getattr(part, 'content', None) or getattr(part, 'args', None)
            if isinstance(target, dict):
                target[data.draw(words)] = data.draw(odd_values)
                return
        message.metadata = {'edited': data.draw(words)}


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    pool=st.lists(messages, min_size=1, max_size=10),
    param_pool=st.lists(request_params, min_size=1, max_size=2),
    settings_pool=st.lists(model_settings, min_size=1, max_size=2),
    data=st.data(),
)
def test_perf1_incremental_fingerprint_equals_from_scratch(
    pool: list[ModelMessage],
    param_pool: list[ModelRequestParameters],
    settings_pool: list[dict[str, Any] | None],
    data: st.DataObject,
) -> None:
    for index, candidate in enumerate(param_pool):  # pool entries never compare equal to each other
        candidate.function_tools.append(ToolDefinition(name=f'pool_marker_{index}'))
    masker = SecretRegistry()
    fingerprinter = ModelFingerprinter(secrets=masker)
    current: list[ModelMessage] = []
    for _ in range(data.draw(st.integers(1, 8))):
        action = data.draw(actions)
        if action == 'extend' or not current:
            current = [*current, *data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))]
        elif action == 'truncate':
            current = current[: data.draw(st.integers(0, len(current) - 1))]
        elif action == 'replace':
            current = list(current)
            replacement = data.draw(messages)
            replacement.metadata = {'replacement': len(current)}  # never `==` to what it replaces (see below)
            current[data.draw(st.integers(0, len(current) - 1))] = replacement
        elif action == 'copy':
            current = copy.deepcopy(current)
        elif action == 'edit-last':
            edit_in_place(current[-1], data)
        else:
            masker.register(data.draw(st.text(alphabet='abcxyz', min_size=1, max_size=2)))
        chosen_settings = data.draw(st.sampled_from(settings_pool))
        chosen_params = data.draw(st.sampled_from(param_pool))
        expected = fingerprint_model_request('test:m', current, chosen_settings, chosen_params, secrets=masker)
        got = fingerprinter.fingerprint('test:m', current, chosen_settings, chosen_params)
        assert got == expected
