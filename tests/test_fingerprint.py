"""Fingerprints (FP-1..FP-13; PERF-1 correctness).

Histories and parameters are real pydantic-ai objects. Timing is left to `benchmarks/fingerprint.py`;
here PERF-1 is checked structurally (how many messages a step renders) and by equality with the
from-scratch digest.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, TypeAdapter, computed_field, field_serializer
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import ToolDefinition

from pydantic_ai_durable._fingerprint import (
    TRANSPORT_ONLY_SETTINGS,
    VERIFY_ENV_VAR,
    ModelFingerprinter,
    RequestPreparer,
    fingerprint_model_request,
    fingerprint_tool_call,
)
from pydantic_ai_durable._fingerprint import _canonical as fp_canonical
from pydantic_ai_durable._fingerprint import _history as fp_history
from pydantic_ai_durable._fingerprint import _settings as fp_settings
from pydantic_ai_durable._fingerprint._history import BOOKKEEPING_FIELDS
from pydantic_ai_durable._masking import SecretRegistry

T0 = datetime(2025, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 6, 6, 12, 30, tzinfo=UTC)


# ------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------


def registry(*secrets: str) -> SecretRegistry:
    """The package's own secret registry, holding `secrets`."""
    masker = SecretRegistry()
    for secret in secrets:
        masker.register(secret)
    return masker


def history(
    *,
    system: str = 'You are terse.',
    prompt: str = 'How many rows?',
    at: datetime = T0,
    run_id: str | None = None,
    args: dict[str, Any] | None = None,
    result: Any = '3 rows',
) -> list[ModelMessage]:
    """A two-step agent's history: prompt, a tool call, its return, the answer."""
    return [
        ModelRequest(
            parts=[SystemPromptPart(system, timestamp=at), UserPromptPart(prompt, timestamp=at)],
            timestamp=at,
            run_id=run_id,
        ),
        ModelResponse(
            parts=[TextPart('Let me look.'), ToolCallPart('query', args or {'sql': 'select 1'}, 'call_1')],
            model_name='m',
            timestamp=at,
            run_id=run_id,
        ),
        ModelRequest(parts=[ToolReturnPart('query', result, 'call_1', timestamp=at)], timestamp=at, run_id=run_id),
        ModelResponse(parts=[TextPart('answer: 3 rows')], model_name='m', timestamp=at, run_id=run_id),
    ]


def long_history(steps: int, *, at: datetime = T0) -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go ' * 50, timestamp=at)], timestamp=at)]
    for index in range(steps):
        call_id = f'call_{index}'
        messages.append(
            ModelResponse(
                parts=[
                    TextPart(f'thinking {index} ' * 20),
                    ToolCallPart('search', {'q': f'q{index}', 'n': index}, call_id),
                ],
                timestamp=at,
            )
        )
        messages.append(
            ModelRequest(parts=[ToolReturnPart('search', {'rows': [f'r{index}'] * 3}, call_id, timestamp=at)])
        )
    return messages


def tool(name: str = 'query', *, strict: bool | None = None, capability_id: str | None = None) -> ToolDefinition:
    return ToolDefinition(
        name=name,
        description=f'Run {name}.',
        parameters_json_schema={'type': 'object', 'properties': {'sql': {'type': 'string'}}, 'required': ['sql']},
        strict=strict,
        capability_id=capability_id,
    )


def params(**overrides: Any) -> ModelRequestParameters:
    values: dict[str, Any] = {'function_tools': [tool()]}
    values.update(overrides)
    return ModelRequestParameters(**values)


def model_fp(
    messages: list[ModelMessage] | None = None,
    settings: dict[str, Any] | None = None,
    request_params: ModelRequestParameters | None = None,
    *,
    identity: str = 'openai:gpt-test',
    secrets: Any = None,
    step: int | None = None,
) -> str | None:
    return fingerprint_model_request(
        identity,
        history() if messages is None else messages,
        settings,
        params() if request_params is None else request_params,
        secrets=secrets,
        step=step,
    )


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(',', ':'))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == 'pydantic_ai_durable' and r.levelno == logging.WARNING]


# ------------------------------------------------------------------------------------------------------
# FP-1 / FP-2: what the digest is
# ------------------------------------------------------------------------------------------------------


def test_fp1_fp15_digest_is_sha256_of_canonical_json_of_model_messages_settings_params() -> None:
    messages = history()
    request_params = params(revealed_tool_names={'b', 'a'})
    dumped = ModelMessagesTypeAdapter.dump_python(messages, mode='json')
    for message in dumped:
        for key in ('timestamp', 'run_id', 'conversation_id'):
            message.pop(key)
        for key in BOOKKEEPING_FIELDS:  # FP-15: what pydantic-ai keeps outside a message's equality
            message.pop(key, None)
        for part in message['parts']:
            for key in ('timestamp', *BOOKKEEPING_FIELDS):
                part.pop(key, None)
    p = TypeAdapter(ModelRequestParameters).dump_python(request_params, mode='json')
    del p['deferred_capability_ids']
    p['revealed_tool_names'] = ['a', 'b']
    for entry in p['function_tools']:
        del entry['capability_id']
    expected = sha(
        canonical({'model': 'openai:gpt-test', 'messages': dumped, 'settings': {'temperature': 0.2}, 'params': p})
    )
    assert model_fp(messages, {'temperature': 0.2, 'timeout': 5}, request_params) == expected


def test_fp1_empty_settings_hash_as_null() -> None:
    assert model_fp(settings=None) == model_fp(settings={}) == model_fp(settings={'timeout': 3.0})
    assert model_fp(settings=None) != model_fp(settings={'seed': 1})


def test_fp2_model_identity_counts() -> None:
    assert model_fp(identity='openai:gpt-a') != model_fp(identity='openai:gpt-b')
    assert model_fp(identity='openai:gpt-a') != model_fp(identity='anthropic:gpt-a')


class CountingModel(FunctionModel):
    """A real FunctionModel that counts how often a request is prepared."""

    prepared = 0

    def prepare_request(self, model_settings: Any, model_request_parameters: ModelRequestParameters) -> Any:
        self.prepared += 1
        return super().prepare_request(model_settings, model_request_parameters)


def counting_model(settings: dict[str, Any] | None = None) -> CountingModel:
    return CountingModel(lambda messages, info: ModelResponse(parts=[TextPart('x')]), settings=settings)  # type: ignore[arg-type]


def test_fp2_request_preparer_reuses_preparation_while_inputs_are_equal() -> None:
    model, preparer = counting_model({'temperature': 0.5}), RequestPreparer()
    first = preparer.prepare(model, {'seed': 1}, params())
    again = preparer.prepare(model, {'seed': 1}, params())  # new, equal objects: no second preparation
    assert model.prepared == 1
    assert again == first
    assert first[0] == {'temperature': 0.5, 'seed': 1}  # the model's own setting counts (FP-2)


def test_fp2_request_preparer_prepares_again_when_any_input_changes() -> None:
    model, preparer = counting_model({'temperature': 0.5}), RequestPreparer()
    request_params, settings = params(), {'seed': 1}
    preparer.prepare(model, settings, request_params)
    settings['seed'] = 2  # edited in place: compared with a copy, not with itself
    assert preparer.prepare(model, settings, request_params)[0] == {'temperature': 0.5, 'seed': 2}
    request_params.function_tools.append(ToolDefinition(name='extra', parameters_json_schema={'type': 'object'}))
    assert [tool.name for tool in preparer.prepare(model, settings, request_params)[1].function_tools][-1] == 'extra'
    other = counting_model({'temperature': 0.9})  # another model: its own settings count
    assert preparer.prepare(other, settings, request_params)[0] == {'temperature': 0.9, 'seed': 2}
    assert (model.prepared, other.prepared) == (3, 1)


def test_fp2_request_preparer_results_are_not_changed_by_edits_to_returned_objects() -> None:
    model, preparer = counting_model(), RequestPreparer()
    first_settings, _ = preparer.prepare(model, {'seed': 1}, params())
    first_settings['seed'] = 99  # a caller editing what it got back
    assert preparer.prepare(model, {'seed': 1}, params())[0] == {'seed': 1}


# ------------------------------------------------------------------------------------------------------
# FP-3: volatile fields, user data, masking, code mode
# ------------------------------------------------------------------------------------------------------


def test_fp3_volatile_fields_do_not_change_digest() -> None:
    assert model_fp(history(at=T0)) == model_fp(history(at=T1))


def test_fp3_histories_built_separately_with_different_run_ids_are_equal() -> None:
    first = history(run_id='run-a')
    second = history(run_id='run-b')
    for message in second:
        message.conversation_id = 'conv-2'
    assert model_fp(first) == model_fp(second) is not None


def test_fp3_tool_arg_named_run_id_still_counts() -> None:
    assert model_fp(history(args={'run_id': 'a'})) != model_fp(history(args={'run_id': 'b'}))
    assert model_fp(history(result={'timestamp': 1})) != model_fp(history(result={'timestamp': 2}))


def code_mode_history(nested_at: datetime, *, flag: object = True, nested_result: str = 'ok') -> list[ModelMessage]:
    nested = ToolReturnPart('lookup', nested_result, 'run_1__0', timestamp=nested_at)
    metadata = {'code_mode': flag, 'tool_calls': {'run_1__0': {'name': 'lookup'}}, 'tool_returns': {'run_1__0': nested}}
    return [
        ModelRequest(parts=[UserPromptPart('go', timestamp=T0)]),
        ModelResponse(parts=[ToolCallPart('run_code', {'code': 'lookup()'}, 'run_1')], timestamp=T0),
        ModelRequest(parts=[ToolReturnPart('run_code', {'output': 'ok'}, 'run_1', metadata=metadata, timestamp=T0)]),
    ]


def test_fp3_code_mode_nested_return_timestamps_do_not_change_digest() -> None:
    assert model_fp(code_mode_history(T0)) == model_fp(code_mode_history(T1)) is not None
    assert model_fp(code_mode_history(T0)) != model_fp(code_mode_history(T0, nested_result='other'))


def test_fp3_nested_timestamps_count_when_not_code_mode() -> None:
    assert model_fp(code_mode_history(T0, flag='yes')) != model_fp(code_mode_history(T1, flag='yes'))


def test_fp3_secrets_are_masked_so_replayed_history_matches_live() -> None:
    live = history(result='token=sk-123 rows=3')
    replayed = history(result='token=*** rows=3')
    assert model_fp(live) != model_fp(replayed)
    masker = registry('sk-123')
    assert model_fp(live, secrets=masker) == model_fp(replayed, secrets=masker)


# ------------------------------------------------------------------------------------------------------
# FP-4: transport-only settings
# ------------------------------------------------------------------------------------------------------

# The transport-only settings of pydantic-ai 2.62 as reviewed by hand. The module also adds any future
# `*_cache*` setting it finds by itself, but the classification test below still fails until it is listed
# here (or in ANSWER_AFFECTING), so a new release's settings always get a human look.
REVIEWED_TRANSPORT_ONLY = {
    'timeout', 'request_timeout', 'max_retries', 'cache',
    'anthropic_cache', 'anthropic_cache_tool_definitions', 'anthropic_cache_instructions', 'anthropic_cache_messages',
    'anthropic_cache_diagnostics',
    'bedrock_cache_tool_definitions', 'bedrock_cache_instructions', 'bedrock_cache_messages',
    'openrouter_cache_tool_definitions', 'openrouter_cache_instructions', 'openrouter_cache_messages',
    'openai_prompt_cache_key', 'openai_prompt_cache_retention', 'openai_prompt_cache_options',
    'openai_prompt_cache_diagnostics', 'openai_cache_instructions', 'mistral_prompt_cache_key',
    # added by 2.63-2.68: a deadline for the first streamed event, and HTTP or a WebSocket for one request
    'first_event_timeout', 'openai_transport',
}  # fmt: skip

SPEC_TRANSPORT_ONLY = {
    'timeout',
    'request_timeout',
    'max_retries',
    'anthropic_cache',
    'anthropic_cache_tool_definitions',
    'anthropic_cache_instructions',
    'anthropic_cache_messages',
    'bedrock_cache_tool_definitions',
    'bedrock_cache_instructions',
    'bedrock_cache_messages',
    'openrouter_cache_tool_definitions',
    'openrouter_cache_instructions',
    'openrouter_cache_messages',
    'openai_prompt_cache_key',
    'openai_prompt_cache_retention',
}

# Every other settings key of pydantic-ai 2.62's model settings: each can change what the model answers
# (or, like `openai_store`, is not known not to), so it stays in the fingerprint. A key that is in neither
# list fails `test_fp4_every_installed_setting_is_classified`: decide which list it belongs to.
ANSWER_AFFECTING = {
    # pydantic_ai.settings.ModelSettings
    'max_tokens', 'temperature', 'top_p', 'top_k', 'parallel_tool_calls', 'tool_choice', 'seed',
    'presence_penalty', 'frequency_penalty', 'logit_bias', 'stop_sequences', 'extra_headers', 'thinking',
    'citations', 'service_tier', 'extra_body',
    # Anthropic
    'anthropic_metadata', 'anthropic_thinking', 'anthropic_service_tier', 'anthropic_effort',
    'anthropic_task_budget', 'anthropic_container', 'anthropic_code_execution_tool_version',
    'anthropic_eager_input_streaming', 'anthropic_betas', 'anthropic_speed', 'anthropic_context_management',
    # Bedrock
    'bedrock_guardrail_config', 'bedrock_performance_configuration', 'bedrock_request_metadata',
    'bedrock_additional_model_response_fields_paths', 'bedrock_prompt_variables',
    'bedrock_additional_model_requests_fields', 'bedrock_service_tier', 'bedrock_inference_profile',
    # Cerebras, Groq, Z.AI, Snowflake, MCP sampling, decision models
    'cerebras_disable_reasoning', 'cerebras_clear_thinking', 'groq_reasoning_format', 'groq_reasoning_effort',
    'zai_clear_thinking', 'snowflake_reasoning', 'mcp_model_preferences', 'decision_boolean_threshold',
    'decision_route_threshold', 'typesafe_boolean_threshold', 'typesafe_tool_call_threshold',
    # Google (cached content is part of the prompt, not a cache hint)
    'google_safety_settings', 'google_thinking_config', 'google_labels', 'google_video_resolution',
    'google_cached_content', 'google_logprobs', 'google_top_logprobs', 'google_cloud_service_tier',
    'google_model_armor_config',
    # OpenAI
    'openai_reasoning_effort', 'openai_logprobs', 'openai_top_logprobs', 'openai_store', 'openai_user',
    'openai_moderation', 'openai_text_verbosity', 'openai_service_tier', 'openai_prediction',
    'openai_continuous_usage_stats', 'openai_include_raw_annotations', 'openai_native_tools',
    'openai_reasoning_mode', 'openai_reasoning_context', 'openai_reasoning_summary', 'openai_send_reasoning_ids',
    'openai_truncation', 'openai_previous_response_id', 'openai_conversation_id',
    'openai_include_code_execution_outputs', 'openai_include_web_search_sources',
    'openai_include_file_search_results', 'openai_context_management', 'openai_background',
    # OpenRouter
    'openrouter_models', 'openrouter_provider', 'openrouter_preset', 'openrouter_transforms',
    'openrouter_reasoning', 'openrouter_usage',
    # xAI
    'xai_logprobs', 'xai_top_logprobs', 'xai_user', 'xai_store_messages', 'xai_previous_response_id',
    'xai_include_encrypted_content', 'xai_include_code_execution_output', 'xai_include_web_search_output',
    'xai_include_inline_citations', 'xai_include_mcp_output', 'xai_include_x_search_output',
    'xai_include_collections_search_output', 'xai_include_attachment_search_output', 'xai_reasoning_effort',
    'xai_max_turns', 'xai_agent_count',
    # added by 2.63-2.68: prompt text about `<system>` frames, who may call web tools, what a response keeps
    'framing_announcement', 'anthropic_web_tools_allowed_callers', 'openai_include_unmapped_response_data',
    # added by 2.71-2.78: each can change what the model is asked or what it returns (where it runs, which tier,
    # what a response includes, a thinking summary, a continued message), so each counts, as a setting not
    # reviewed as transport-only would (FP-4)
    'anthropic_inference_geo', 'anthropic_previous_message_id', 'anthropic_thinking_display',
    'bedrock_thinking_display',
    'google_interactions_generation_config', 'google_interactions_native_tools', 'google_interactions_response_format',
    'google_interactions_safety_settings', 'google_interactions_service_tier', 'google_interactions_thinking_level',
    'google_interactions_thinking_summaries', 'groq_service_tier', 'huggingface_logprobs', 'huggingface_top_logprobs',
    'openai_include_web_search_results', 'openai_safety_identifier', 'thinking_summary',
}  # fmt: skip


def _installed_settings_files() -> list[Path]:
    root = _pydantic_ai_root()
    return [root / 'settings.py', *(root / 'models').rglob('*.py')]


def _pydantic_ai_root() -> Path:
    import pydantic_ai

    return Path(pydantic_ai.__file__).parent


@functools.cache
def _keys_by_full_parse() -> dict[str, set[str]]:
    """Every `*ModelSettings` class in the installed model modules, by a full parse (independent of the module)."""
    found: dict[str, set[str]] = {}
    for path in _installed_settings_files():
        for node in ast.parse(path.read_text(encoding='utf-8')).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith('ModelSettings'):
                found[f'{path}:{node.name}'] = {
                    item.target.id
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
    return found


def _keys_by_import() -> dict[str, set[str]]:
    """The TypedDicts of the provider modules whose SDK is installed (the others raise ImportError)."""
    found: dict[str, set[str]] = {}
    for path in _installed_settings_files():
        if 'ModelSettings(' not in path.read_text(encoding='utf-8'):
            continue
        module_name = '.'.join(path.relative_to(_pydantic_ai_root().parent).with_suffix('').parts)
        module_name = module_name.removesuffix('.__init__')
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # the provider's optional SDK is not installed
        for name, value in vars(module).items():
            if name.endswith('ModelSettings') and hasattr(value, '__optional_keys__'):
                found[f'{module_name}:{name}'] = set(value.__optional_keys__) | set(value.__required_keys__)
    return found


def test_fp4_every_installed_setting_is_classified() -> None:
    by_parse = _keys_by_full_parse()
    assert any(name.endswith(':AnthropicModelSettings') for name in by_parse)
    assert any(name.endswith(':OpenAIResponsesModelSettings') for name in by_parse)
    all_keys = set().union(*by_parse.values(), *_keys_by_import().values())
    unclassified = sorted(all_keys - REVIEWED_TRANSPORT_ONLY - ANSWER_AFFECTING)
    assert not unclassified, f'new pydantic-ai settings; add each to one of the two lists: {unclassified}'
    assert REVIEWED_TRANSPORT_ONLY <= TRANSPORT_ONLY_SETTINGS
    assert not (TRANSPORT_ONLY_SETTINGS & ANSWER_AFFECTING)


def test_fp4_transport_only_settings_include_spec_names_and_every_prompt_cache_setting() -> None:
    assert SPEC_TRANSPORT_ONLY <= TRANSPORT_ONLY_SETTINGS
    all_keys = set().union(*_keys_by_full_parse().values())
    cache_settings = {key for key in all_keys if 'cache' in key.split('_')}
    assert cache_settings <= TRANSPORT_ONLY_SETTINGS
    assert 'google_cached_content' not in TRANSPORT_ONLY_SETTINGS


def test_fp4_module_scan_finds_the_same_keys_as_a_full_parse() -> None:
    fast = set().union(*map(set, fp_settings.installed_settings_keys().values()))
    assert fast == set().union(*_keys_by_full_parse().values())


def test_fp4_timeout_forms_and_prompt_cache_keys_do_not_change_digest() -> None:
    base = {'temperature': 0.2}
    variants = [
        base,
        {**base, 'timeout': 12.5},
        {**base, 'timeout': httpx.Timeout(10.0, connect=3.0)},
        {**base, 'request_timeout': 3, 'max_retries': 4},
        {**base, 'anthropic_cache': True, 'anthropic_cache_messages': '1h', 'bedrock_cache_instructions': True},
        {**base, 'openrouter_cache_tool_definitions': True, 'openai_prompt_cache_key': 'user-7', 'cache': '5m'},
    ]
    digests = {model_fp(settings=variant) for variant in variants}
    assert len(digests) == 1
    assert None not in digests


def test_fp4_temperature_still_counts_alongside_a_timeout() -> None:
    timeout = httpx.Timeout(10.0)
    assert model_fp(settings={'temperature': 0.2, 'timeout': timeout}) != model_fp(
        settings={'temperature': 0.9, 'timeout': timeout}
    )


# ------------------------------------------------------------------------------------------------------
# FP-5: request parameters
# ------------------------------------------------------------------------------------------------------


def test_fp5_capability_ids_deferred_ids_and_revealed_order_do_not_change_digest() -> None:
    a = params(
        function_tools=[tool(capability_id='<toolset:a1b2c3>')],
        output_tools=[tool('final_result', capability_id='<toolset:d4>')],
        deferred_capability_ids={'<toolset:a1b2c3>'},
        revealed_tool_names={'zeta', 'alpha', 'mid'},
    )
    b = params(
        function_tools=[tool(capability_id='<toolset:ffffff>')],
        output_tools=[tool('final_result', capability_id=None)],
        deferred_capability_ids={'<toolset:ffffff>', 'other'},
        revealed_tool_names={'mid', 'zeta', 'alpha'},
    )
    assert model_fp(request_params=a) == model_fp(request_params=b) is not None


def test_fp5_revealed_tool_names_set_order_does_not_change_digest() -> None:
    names = [f'tool_{index}' for index in range(40)]
    forward, backward = set(names), set(reversed(names))
    backward.update(f'extra_{index}' for index in range(200))
    backward.difference_update(f'extra_{index}' for index in range(200))
    assert model_fp(request_params=params(revealed_tool_names=forward)) == model_fp(
        request_params=params(revealed_tool_names=backward)
    )


@pytest.mark.parametrize(
    'change',
    [
        pytest.param({'messages': history(system='You are verbose.')}, id='system-prompt'),
        pytest.param({'messages': history(prompt='How many columns?')}, id='user-prompt'),
        pytest.param({'identity': 'openai:gpt-other'}, id='model-identity'),
        pytest.param({'settings': {'temperature': 0.9}}, id='temperature'),
        pytest.param({'request_params': params(function_tools=[tool(), tool('drop')])}, id='tool-list'),
        pytest.param({'request_params': params(output_mode='native')}, id='output-mode'),
        pytest.param({'request_params': params(function_tools=[tool(strict=True)])}, id='strict'),
        pytest.param({'request_params': params(introduced_tool_names={'query'})}, id='introduced-tool-names'),
    ],
)
def test_fp5_what_the_model_is_asked_changes_digest(change: dict[str, Any]) -> None:
    baseline: dict[str, Any] = {'messages': history(), 'settings': {'temperature': 0.2}, 'request_params': params()}
    assert model_fp(**baseline) != model_fp(**{**baseline, **change})


# ------------------------------------------------------------------------------------------------------
# FP-6: rendering of settings and arguments
# ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Window:
    start: datetime
    length: timedelta


def test_fp6_plain_json_arguments_are_hashed_as_is() -> None:
    args = {'b': [1, 2.5, None, True], 'a': {'x': 'y'}}
    expected = sha(canonical({'args': args, 'name': 'query', 'tool_call_id': 'c1'}))
    assert fingerprint_tool_call('query', args, 'c1') == expected


def test_fp6_datetime_decimal_bytes_and_dataclass_arguments_are_stable() -> None:
    def args() -> dict[str, Any]:
        return {
            'when': datetime(2025, 5, 1, 9, 30, tzinfo=UTC),
            'amount': Decimal('12.50'),
            'blob': b'\x00\xffdata',
            'window': Window(datetime(2025, 1, 1, tzinfo=UTC), timedelta(hours=2)),
        }

    first = fingerprint_tool_call('book', args(), 'c1')
    assert first is not None
    assert first == fingerprint_tool_call('book', args(), 'c1')
    changed = {**args(), 'amount': Decimal('12.51')}
    assert fingerprint_tool_call('book', changed, 'c1') != first


def test_fp6_bytes_render_as_base64() -> None:
    assert fp_canonical.render_value({'blob': b'\xff\x00'}) == '{"blob":"_wA="}'


def test_fp6_unserializable_setting_gives_none_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger='pydantic_ai_durable')
    assert model_fp(settings={'extra_body': object()}, step=3) is None
    assert len(warnings_of(caplog)) == 1


def test_fp6_non_json_setting_values_are_rendered_by_pydantic() -> None:
    first = model_fp(settings={'extra_body': {'since': datetime(2025, 1, 1, tzinfo=UTC)}})
    assert first is not None
    assert first == model_fp(settings={'extra_body': {'since': datetime(2025, 1, 1, tzinfo=UTC)}})


# ------------------------------------------------------------------------------------------------------
# FP-7: tool-call fingerprints
# ------------------------------------------------------------------------------------------------------


def test_fp7_argument_key_order_does_not_change_digest() -> None:
    assert fingerprint_tool_call('query', {'a': 1, 'b': {'x': 1, 'y': 2}}, 'c1') == fingerprint_tool_call(
        'query', {'b': {'y': 2, 'x': 1}, 'a': 1}, 'c1'
    )


def test_fp7_name_argument_and_call_id_each_change_digest() -> None:
    base = fingerprint_tool_call('query', {'a': 1}, 'c1')
    assert base is not None
    others = [
        fingerprint_tool_call('other', {'a': 1}, 'c1'),
        fingerprint_tool_call('query', {'a': 2}, 'c1'),
        fingerprint_tool_call('query', {'a': 1}, 'c2'),
        fingerprint_tool_call('query', {'a': 1}, None),
    ]
    assert len({base, *others}) == 5


class Lookup(BaseModel):
    city: str
    days: int

    @cached_property
    def slug(self) -> str:
        return f'{self.city}-{self.days}'

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def label(self) -> str:
        return f'{self.city} for {self.days} days'


def test_fp7_rendering_does_not_touch_the_argument_the_tool_receives() -> None:
    model = Lookup(city='Oslo', days=3)
    args = {'request': model, 'tags': ['a']}
    digest = fingerprint_tool_call('lookup', args, 'c1')
    assert digest is not None
    assert 'label' not in model.__dict__
    assert 'slug' not in model.__dict__
    assert args == {'request': model, 'tags': ['a']}
    assert digest == fingerprint_tool_call('lookup', {'request': Lookup(city='Oslo', days=3), 'tags': ['a']}, 'c1')


@pytest.mark.parametrize(
    'args',
    [{}, {'page': 0}, {'q': 'caf\u00e9 "x"', 'n': [1, 2.5, None, True, {'k': 'v', 'e': []}]}, [], 'text'],
    ids=['empty', 'usual', 'nested', 'list', 'string'],
)
def test_fp7_plain_arguments_render_as_their_copy_does(args: Any) -> None:
    """Arguments of the built-in JSON types skip the copy (nothing in them runs code), with the same digests."""
    from pydantic_ai_durable._fingerprint._canonical import canonical, is_plain_json, render_value
    from pydantic_ai_durable._fingerprint._digests import _call_hash, tool_call_digests

    assert is_plain_json(args)
    copied = render_value(copy.deepcopy(args))
    expected_call = _call_hash(copied, canonical('t'))
    text = f'{{"args":{copied},"name":{canonical("t")},"tool_call_id":{canonical("c1")}}}'
    assert tool_call_digests('t', args, 'c1') == (hashlib.sha256(text.encode('ascii')).hexdigest(), expected_call)


def test_fp7_arguments_that_are_not_plain_json_are_copied_before_rendering() -> None:
    from pydantic_ai_durable._fingerprint._canonical import is_plain_json

    class Keys(dict[str, Any]):
        pass

    for args in (
        {'n': (1, 2)},
        Keys(a=1),
        {1: 'int key'},
        {'when': datetime(2026, 1, 1, tzinfo=UTC)},
        {'m': Lookup(city='a', days=1)},
    ):
        assert not is_plain_json(args), args
    cycle: list[Any] = [1]
    cycle.append(cycle)
    assert not is_plain_json({'c': cycle})  # the walk ends, and the copy and the renderer deal with the cycle
    assert fingerprint_tool_call('t', {'c': cycle}, 'c1') is None
    # a tuple renders as the list it would be in JSON: the copied path gives the plain one's digest
    assert fingerprint_tool_call('t', {'n': (1, 2)}, 'c1') == fingerprint_tool_call('t', {'n': [1, 2]}, 'c1')


def test_fp7_tool_fingerprint_is_synchronous() -> None:
    assert not inspect.iscoroutinefunction(fingerprint_tool_call)
    assert isinstance(fingerprint_tool_call('t', {}, None), str)


# ------------------------------------------------------------------------------------------------------
# FP-8: set ordering and refusals
# ------------------------------------------------------------------------------------------------------

_SEED_SCRIPT = textwrap.dedent(
    """
    import json
    from datetime import datetime, timezone
    from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai_durable._fingerprint import ModelFingerprinter, fingerprint_model_request, fingerprint_tool_call

    at = datetime(2025, 1, 1, tzinfo=timezone.utc)
    members = {"a", "b", "c", "d", "e"}
    messages = [
        ModelRequest(parts=[UserPromptPart("go", timestamp=at)]),
        ModelResponse(parts=[ToolCallPart("tag", {"s": {"x", "y", "z", "w"}}, "c1")], timestamp=at),
        ModelRequest(parts=[ToolReturnPart("tag", {"tags": {"p", "q", "r", "s"}}, "c1", timestamp=at)]),
    ]
    params = ModelRequestParameters(
        function_tools=[ToolDefinition(name="tag", parameters_json_schema={"type": "object"})],
        introduced_tool_names={"tag", "alpha", "beta", "gamma"},
    )
    print(json.dumps({
        "raw_order": list(members),
        "tool": fingerprint_tool_call("tag", {"s": members}, "c1"),
        "model": fingerprint_model_request("test:m", messages, {"temperature": 0.1}, params),
        "incremental": ModelFingerprinter().fingerprint("test:m", messages, {"temperature": 0.1}, params),
    }))
    """
)


def test_fp8_set_order_is_hash_seed_free() -> None:
    results = []
    for seed in ('1', '2', '3'):
        env = {**os.environ, 'PYTHONHASHSEED': seed}
        out = subprocess.run(
            [sys.executable, '-c', _SEED_SCRIPT], env=env, capture_output=True, text=True, check=True, timeout=120
        )
        results.append(json.loads(out.stdout))
    assert len({tuple(r['raw_order']) for r in results}) > 1, 'the seeds should order the raw set differently'
    for key in ('tool', 'model', 'incremental'):
        digests = {r[key] for r in results}
        assert len(digests) == 1, key
        assert None not in digests
    assert results[0]['model'] == results[0]['incremental']


def test_fp8_sets_are_sorted_by_canonical_json() -> None:
    assert fp_canonical.render_value({'s': {'b', 'c', 'a'}}) == '{"s":["a","b","c"]}'
    assert fp_canonical.render_value({'n': frozenset({10, 2, 33})}) == '{"n":[10,2,33]}'


def test_fp8_nested_sets_in_tuple_members_are_ordered() -> None:
    value = {'s': {(2, frozenset({'z'})), (1, frozenset({'y', 'x', 'w'}))}}
    assert fp_canonical.render_value(value) == '{"s":[[1,["w","x","y"]],[2,["z"]]]}'


class BytesBag(BaseModel):
    model_config = ConfigDict(ser_json_bytes='hex')
    items: set[bytes]


def test_fp8_set_rendered_under_a_model_bytes_mode_is_located() -> None:
    assert fp_canonical.render_value({'bag': BytesBag(items={b'\x02', b'\x01', b'\xff'})}) == (
        '{"bag":{"items":["01","02","ff"]}}'
    )


class Joined(BaseModel):
    tags: set[str]

    @field_serializer('tags', when_used='json')
    def _join(self, tags: set[str]) -> str:
        return ','.join(tags)


class JoinedInts(BaseModel):
    ids: set[int]

    @field_serializer('ids', when_used='json')
    def _join(self, ids: set[int]) -> str:
        return ','.join(map(str, ids))


def test_fp8_hash_seed_ordered_set_that_cannot_be_located_is_refused() -> None:
    assert fingerprint_tool_call('t', {'x': Joined(tags={'a', 'b', 'c'})}, 'c1') is None
    assert fingerprint_tool_call('t', {'x': Joined(tags={'only'})}, 'c1') is not None


def test_fp8_seed_free_set_that_cannot_be_located_is_kept_as_rendered() -> None:
    assert fp_canonical.render_value({'x': JoinedInts(ids={3, 1, 2})}) == '{"x":{"ids":"1,2,3"}}'


def _generator() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    'args',
    [
        pytest.param({1: 'a', '1': 'b'}, id='int-and-str-key'),
        pytest.param({'x': {b'k': 1, 'aw==': 2}}, id='bytes-key-rendering-like-a-str-key'),
        pytest.param({'it': iter([1, 2])}, id='iterator'),
        pytest.param(_generator(), id='generator'),
        pytest.param({'g': _generator()}, id='nested-generator'),
        pytest.param({'o': object()}, id='object'),
    ],
)
def test_fp8_unreproducible_arguments_give_none(args: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger='pydantic_ai_durable')
    assert fingerprint_tool_call('risky', args, 'c1') is None
    [record] = warnings_of(caplog)
    assert 'risky' in record.getMessage()


def test_fp8_an_iterator_is_refused_before_rendering_consumes_it() -> None:
    items = iter([1, 2, 3])
    messages = history(result={'rows': items})
    assert model_fp(messages) is None
    assert list(items) == [1, 2, 3]


def test_fp8_distinct_non_string_keys_that_render_differently_are_fine() -> None:
    assert fingerprint_tool_call('t', {'m': {1: 'a', 2: 'b', (3, 4): 'c'}, 's': {'k'}}, 'c1') is not None


def test_fp8_nan_key_colliding_with_its_rendering_is_refused() -> None:
    assert fingerprint_tool_call('t', {'m': {math.nan: 1, 'nan': 2}}, 'c1') is None
    assert fingerprint_tool_call('t', {'m': {math.nan: 1, 'other': 2}}, 'c1') is not None


def test_fp8_sets_in_history_are_ordered() -> None:
    first = model_fp(history(result={'tags': {'x', 'y', 'z'}}))
    assert first is not None
    assert first == model_fp(history(result={'tags': ['x', 'y', 'z']}))


# ------------------------------------------------------------------------------------------------------
# FP-9, FP-10: fallbacks and copies
# ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Point:
    x: int


def test_fp9_set_of_dataclasses_in_history_hashes_the_json_rendering_as_is() -> None:
    messages = history(result={'points': {Point(1)}, 'names': ['a']})
    assert model_fp(messages) is not None
    assert ModelFingerprinter().fingerprint('openai:gpt-test', messages, None, params()) == model_fp(messages)


def test_fp9_as_is_history_is_not_refused_elsewhere() -> None:
    messages = history(result={'points': {Point(1)}})
    messages.append(ModelRequest(parts=[ToolReturnPart('query', {1: 'a', '1': 'b'}, 'call_2', timestamp=T0)]))
    assert model_fp(messages) is not None


def test_fp9_set_of_dataclasses_in_params_hashes_the_json_rendering_as_is() -> None:
    definition = dataclasses.replace(tool(), metadata={'points': {Point(1)}})
    assert model_fp(request_params=params(function_tools=[definition])) is not None


class NoCopy:
    def __deepcopy__(self, memo: dict[int, Any]) -> NoCopy:
        raise TypeError('cannot copy')


def test_fp10_argument_that_cannot_be_deep_copied_is_refused() -> None:
    assert fingerprint_tool_call('t', {'x': NoCopy()}, 'c1') is None
    assert fingerprint_tool_call('t', _generator(), 'c1') is None


# ------------------------------------------------------------------------------------------------------
# FP-11, FP-12, FP-13
# ------------------------------------------------------------------------------------------------------


def test_fp11_model_warning_names_step_error_and_later_steps(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger='pydantic_ai_durable')
    assert model_fp(settings={'extra_body': object()}, step=4) is None
    [record] = warnings_of(caplog)
    message = record.getMessage()
    assert 'step 4' in message
    assert 'PydanticSerializationError' in message
    assert 'later' in message and 'model steps' in message


def test_fp11_fingerprinter_warns_once_per_failing_call_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger='pydantic_ai_durable')
    fingerprinter = ModelFingerprinter()
    for step in range(3):
        bad = fingerprinter.fingerprint('x:y', history(), {'extra_body': object()}, params(), step=step)
        assert bad is None
    assert len(warnings_of(caplog)) == 3
    assert fingerprinter.fingerprint('x:y', None, None, params()) is None  # type: ignore[arg-type]
    unrenderable_tool = dataclasses.replace(tool(), metadata={'o': object()})
    assert fingerprint_model_request('x:y', history(), None, params(function_tools=[unrenderable_tool])) is None


def test_fp11_tool_warning_names_the_tool(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger='pydantic_ai_durable')
    assert fingerprint_tool_call('fetch_page', {'o': object()}, 'c9') is None
    [record] = warnings_of(caplog)
    assert "'fetch_page'" in record.getMessage()


def test_fp12_a_bad_setting_loses_model_verification_but_not_tool_verification() -> None:
    settings = {'extra_body': object()}
    fingerprinter = ModelFingerprinter()
    messages = long_history(3)
    assert fingerprinter.fingerprint('x:y', messages[:3], settings, params()) is None
    assert fingerprinter.fingerprint('x:y', messages, settings, params()) is None
    assert fingerprint_tool_call('search', {'q': 'q1', 'n': 1}, 'call_1') is not None


def test_fp13_a_set_of_ints_is_sorted_like_any_other_set() -> None:
    assert fingerprint_tool_call('t', {'ids': {3, 1, 2}}, 'c') == fingerprint_tool_call('t', {'ids': [1, 2, 3]}, 'c')


# ------------------------------------------------------------------------------------------------------
# PERF-1: the incremental path equals the from-scratch path and renders only what is new
# ------------------------------------------------------------------------------------------------------


def incremental_matches(fingerprinter: ModelFingerprinter, messages: list[ModelMessage], **kwargs: Any) -> str:
    settings = kwargs.get('settings', {'temperature': 0.3})
    request_params = kwargs.get('request_params', params())
    secrets = kwargs.get('secrets')
    got = fingerprinter.fingerprint('test:m', messages, settings, request_params)
    expected = fingerprint_model_request('test:m', messages, settings, request_params, secrets=secrets)
    assert got == expected
    assert got is not None
    return got


def test_perf1_incremental_digest_equals_from_scratch_on_a_growing_history() -> None:
    messages = long_history(20)
    fingerprinter = ModelFingerprinter()
    seen = {incremental_matches(fingerprinter, messages[:end]) for end in range(1, len(messages) + 1, 2)}
    assert len(seen) == len(range(1, len(messages) + 1, 2))


def test_perf1_a_step_renders_only_new_messages_however_long_the_history(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = long_history(1500)
    fingerprinter = ModelFingerprinter()
    fingerprinter.fingerprint('test:m', messages[:-2], None, params())
    rendered: list[ModelMessage] = []
    original = fp_history._dump_message

    def counting(message: ModelMessage, mode: Any) -> Any:
        rendered.append(message)
        return original(message, mode)

    monkeypatch.setattr(fp_history, '_dump_message', counting)
    fingerprinter.fingerprint('test:m', messages, None, params())
    assert rendered == messages[-2:]


def test_perf1_per_message_rendering_equals_the_history_adapter() -> None:
    messages = [
        *history(result={'raw': b'\x00\xff', 'when': T1}),
        ModelRequest(parts=[UserPromptPart(['see', BinaryContent(b'\x89PNG\xff', media_type='image/png')])]),
    ]
    for mode in ('python', 'json'):
        whole = ModelMessagesTypeAdapter.dump_python(messages, mode=mode)
        assert [fp_history._dump_message(message, mode) for message in messages] == whole


def test_perf1_plain_snapshot_implies_nothing_for_the_guide_to_handle() -> None:
    samples = [*history(), *long_history(2), *code_mode_history(T0), *history(result={'a': [1, (2, 3)]})]
    for message in samples:
        assert fp_history.snapshot_of(message) is not None
        assert not fp_canonical.inspect_guide(fp_history._dump_message(message, 'python'))
    assert fp_history.snapshot_of(history(result={'s': {'a'}})[2]) is None
    assert fp_history.snapshot_of(history(result={1: 'a'})[2]) is None
    assert fp_history.snapshot_of(history(result=Lookup(city='x', days=1))[2]) is None


def test_perf1_in_place_edit_of_the_previous_last_message_is_seen() -> None:
    messages = long_history(4)
    fingerprinter = ModelFingerprinter()
    incremental_matches(fingerprinter, messages[:5])
    last = messages[4]
    assert isinstance(last, ModelRequest)
    last.parts = [*last.parts, UserPromptPart('appended in place', timestamp=T0)]
    incremental_matches(fingerprinter, messages[:5])
    last.metadata = {'pydantic_ai': {'n': 1}}
    incremental_matches(fingerprinter, messages[:7])
    tail = messages[6]
    assert isinstance(tail, ModelRequest)
    tail.metadata = {'ns': {'a': 1}}
    incremental_matches(fingerprinter, messages[:7])
    tail.metadata['ns']['a'] = 2
    incremental_matches(fingerprinter, messages[:7])
    part = tail.parts[0]
    assert isinstance(part, ToolReturnPart)
    part.content = {'rows': ['changed']}
    incremental_matches(fingerprinter, messages[:9])


def test_perf1_a_message_that_contains_itself_gives_none_without_hanging() -> None:
    loop: dict[str, Any] = {'a': 1}
    loop['self'] = loop
    messages = history(result=loop)
    assert fp_history.snapshot_of(messages[2]) is None
    assert ModelFingerprinter().fingerprint('test:m', messages, None, params()) is None
    assert model_fp(messages) is None


def test_perf1_in_place_edit_of_a_non_plain_last_message_is_seen() -> None:
    messages = long_history(2)
    rows = {'x', 'y'}
    messages[2] = ModelRequest(parts=[ToolReturnPart('search', {'rows': rows}, 'call_0', timestamp=T0)])
    fingerprinter = ModelFingerprinter()
    incremental_matches(fingerprinter, messages[:3])
    rows.add('z')
    incremental_matches(fingerprinter, messages[:5])


@pytest.mark.parametrize(
    'edit',
    ['truncate', 'replace-old', 'remove-middle', 'compact', 'same-objects-new-list', 'tuple', 'equal-copies'],
)
def test_perf1_a_history_that_is_not_an_extension_falls_back(edit: str) -> None:
    messages = long_history(6)
    fingerprinter = ModelFingerprinter()
    incremental_matches(fingerprinter, messages[:9])
    if edit == 'truncate':
        changed: Any = messages[:5]
    elif edit == 'replace-old':
        changed = [*messages[:2], ModelRequest(parts=[UserPromptPart('edited', timestamp=T0)]), *messages[3:11]]
    elif edit == 'remove-middle':
        changed = [*messages[:3], *messages[5:11]]
    elif edit == 'compact':
        changed = [ModelRequest(parts=[UserPromptPart('summary of earlier steps', timestamp=T0)]), *messages[7:11]]
    elif edit == 'same-objects-new-list':
        changed = list(messages[:11])
    elif edit == 'tuple':
        changed = tuple(messages[:11])
    else:
        changed = [dataclasses.replace(message) for message in messages[:11]]
    incremental_matches(fingerprinter, changed)
    incremental_matches(fingerprinter, [*changed, *messages[11:13]])


def test_perf1_changed_settings_and_params_between_steps_are_seen() -> None:
    messages = long_history(4)
    fingerprinter = ModelFingerprinter()
    incremental_matches(fingerprinter, messages[:3], settings={'temperature': 1})
    incremental_matches(fingerprinter, messages[:5], settings={'temperature': 1.0})
    request_params = params()
    incremental_matches(fingerprinter, messages[:5], request_params=request_params)
    request_params.function_tools.append(tool('second'))
    incremental_matches(fingerprinter, messages[:7], request_params=request_params)
    request_params.function_tools[0].parameters_json_schema['properties']['sql']['type'] = 'number'
    incremental_matches(fingerprinter, messages[:7], request_params=request_params)


def test_perf1_a_newly_registered_secret_invalidates_the_running_hash() -> None:
    messages = long_history(4)
    masker = registry('not-present')
    fingerprinter = ModelFingerprinter(secrets=masker)
    incremental_matches(fingerprinter, messages[:5], secrets=masker)
    masker.register('q1')
    incremental_matches(fingerprinter, messages[:7], secrets=masker)


def test_perf1_renderings_handed_to_the_step_are_the_masked_dump_until_a_secret_is_registered() -> None:
    special = history(result={'tags': {'x', 'y', 'z'}, 2: 'b', 1: 'a'})
    messages = [*special, *long_history(2)[1:]]
    masker = registry('q0')
    fingerprinter = ModelFingerprinter(secrets=masker)
    fingerprinter.fingerprint('test:m', messages, None, params())
    renderings = fingerprinter.take_renderings()
    reusable = [message for message in messages if message is not special[2]]  # FP-8 reorders that one
    expected = masker.mask(ModelMessagesTypeAdapter.dump_python(reusable, mode='json'))
    assert json.dumps(renderings.of(reusable)) == json.dumps(expected)
    assert '***' in json.dumps(expected)
    assert renderings.of(messages) is None
    assert fingerprinter.take_renderings().of(reusable) is None  # handed over once, to the step it was for
    fingerprinter.fingerprint('test:m', [ModelRequest(parts=[UserPromptPart('other', timestamp=T0)])], None, params())
    assert renderings.of(reusable) is not None  # a later call does not change what was handed over
    masker.register('r0')  # registered after the rendering: it must be masked again
    assert renderings.of(reusable) is None


def test_perf1_verify_switch_compares_with_from_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = long_history(4)
    monkeypatch.delenv(VERIFY_ENV_VAR, raising=False)
    unchecked = ModelFingerprinter()
    monkeypatch.setenv(VERIFY_ENV_VAR, '1')
    checked = ModelFingerprinter()
    for fingerprinter in (unchecked, checked):
        fingerprinter.fingerprint('test:m', messages[:5], None, params())
    # The documented blind spot: an in-place edit of a message older than the previous call's last one.
    first = messages[0]
    assert isinstance(first, ModelRequest)
    first.parts = [UserPromptPart('rewritten in place', timestamp=T0)]
    assert unchecked.fingerprint('test:m', messages[:7], None, params()) != model_fp(messages[:7], identity='test:m')
    with pytest.raises(AssertionError, match='from-scratch'):
        checked.fingerprint('test:m', messages[:7], None, params())
