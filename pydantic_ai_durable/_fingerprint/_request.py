"""A model request's fingerprint from scratch: the canonical text of its messages, model, params and settings.

Layout: the sha256 of the canonical JSON (`sort_keys`, compact separators) of
`{"messages": [...], "model": ..., "params": ..., "settings": ...}`. Because the keys sort in that order,
the canonical text starts with the messages, one canonical JSON text per message joined by commas. That
is what lets `ModelFingerprinter` keep a running sha256 over the messages it has already seen and only
render what is new (PERF-1), while producing exactly the digest `fingerprint_model_request` computes here.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import ModelRequestParameters

from ._canonical import adapter, canonical, inspect_guide, order
from ._history import Masker, history_texts
from ._settings import settings_text

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = (
    'MESSAGES_OPEN',
    'earlier_scheme_digest',
    'fingerprint_model_request',
    'full_digest',
    'params_text',
    'request_tail',
    'warn_model',
)

log = logging.getLogger('pydantic_ai_durable')


# ---------------------------------------------------------------------------------------------------------
# request parameters
# ---------------------------------------------------------------------------------------------------------


def _drop_capability_id(tool: Any) -> Any:
    if isinstance(tool, dict):
        return {key: value for key, value in tool.items() if key != 'capability_id'}
    return tool


def _normalize_params(rendered: Any) -> Any:
    """Leave out what differs per run without reaching the model: random capability ids (FP-5)."""
    if not isinstance(rendered, dict):
        return rendered
    result = {key: value for key, value in rendered.items() if key != 'deferred_capability_ids'}
    revealed = result.get('revealed_tool_names')
    if isinstance(revealed, list) and all(isinstance(name, str) for name in revealed):
        result['revealed_tool_names'] = sorted(revealed)
    for field in ('function_tools', 'output_tools'):
        tools = result.get(field)
        if isinstance(tools, list):
            result[field] = [_drop_capability_id(tool) for tool in tools]
    return result


def params_text(params: ModelRequestParameters) -> str:
    try:
        guide: Any = adapter(ModelRequestParameters).dump_python(params)
        special = inspect_guide(guide)
    except TypeError:
        guide, special = None, False  # FP-9: hash the JSON rendering as it is
    rendered = adapter(ModelRequestParameters).dump_python(params, mode='json')
    if special:
        rendered = order(rendered, guide)
    return canonical(_normalize_params(rendered))


# ---------------------------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------------------------

MESSAGES_OPEN = b'{"messages":['


def request_tail(identity: str, settings_json: str, params_json: str) -> bytes:
    """Everything after the message list, in sort order: `model`, `params`, `settings`."""
    return f'],"model":{canonical(identity)},"params":{params_json},"settings":{settings_json}}}'.encode('ascii')


def _hash_messages(hasher: _Hash, texts: Iterable[bytes], first: bool) -> None:
    for text in texts:
        if not first:
            hasher.update(b',')
        hasher.update(text)
        first = False


def full_digest(
    identity: str,
    messages: Sequence[ModelMessage],
    settings: Mapping[str, Any] | None,
    params: ModelRequestParameters,
    secrets: Masker | None,
    *,
    earlier: bool = False,
) -> str:
    """The from-scratch digest; raises on anything that cannot be fingerprinted. `earlier`: the first scheme (FP-16)."""
    hasher = hashlib.sha256(MESSAGES_OPEN)
    _hash_messages(hasher, history_texts(messages, secrets, earlier=earlier), first=True)
    hasher.update(request_tail(identity, settings_text(settings), params_text(params)))
    return hasher.hexdigest()


def fingerprint_model_request(
    identity: str,
    messages: Sequence[ModelMessage],
    settings: Mapping[str, Any] | None,
    params: ModelRequestParameters,
    *,
    secrets: Masker | None = None,
    step: int | None = None,
) -> str | None:
    """Digest of a model request rendered from scratch (FP-1 to FP-5, FP-8, FP-9).

    `settings` and `params` must already be what `model.prepare_request` returned, so a setting that only
    lives on the model still counts (FP-2). `None` plus one warning when it cannot be computed (FP-11).
    """
    try:
        return full_digest(identity, messages, settings, params, secrets)
    except Exception as error:
        warn_model(step, error)
        return None


def earlier_scheme_digest(
    identity: str,
    messages: Sequence[ModelMessage],
    settings: Mapping[str, Any] | None,
    params: ModelRequestParameters,
    secrets: Masker | None,
) -> Callable[[], str | None]:
    """The request's digest under the first scheme, computed only when asked: on a mismatch (FP-16).

    A journal recorded before FP-15 hashed the bookkeeping fields a later pydantic-ai put on messages; its
    entries still replay when this digest equals theirs. `None` when it cannot be computed.
    """

    def digest() -> str | None:
        try:
            return full_digest(identity, messages, settings, params, secrets, earlier=True)
        except Exception:
            return None

    return digest


def warn_model(step: int | None, error: BaseException) -> None:
    where = f'Model request at step {step}' if step is not None else 'A model request'
    log.warning(
        '%s cannot be fingerprinted (%s: %s), so it will replay without verification. Settings, tool '
        'definitions and history carry over into later requests, so the model steps after it are usually '
        'unverified too.',
        where,
        type(error).__name__,
        error,
    )
