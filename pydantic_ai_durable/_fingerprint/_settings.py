"""Which model settings count (FP-4): those that can change the answer, not transport or prompt caching.

A timeout or a provider's prompt-cache switch changes how a request travels, never what the model
answers, so it is left out of the fingerprint: a retry with a longer timeout still replays. The cache
settings of every provider are found by reading the installed pydantic-ai's sources, so a release that
adds one is covered without a change here.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._canonical import render_value

__all__ = ('TRANSPORT_ONLY_SETTINGS', 'installed_settings_keys', 'settings_text')


_ALWAYS_TRANSPORT_ONLY = frozenset(
    # `first_event_timeout` and `openai_transport` (HTTP or one WebSocket) came with pydantic-ai 2.64-2.68.
    {'timeout', 'request_timeout', 'max_retries', 'first_event_timeout', 'openai_transport'}
)

# Named by FP-4, plus every prompt-cache setting of pydantic-ai 2.62, so the set does not depend on being
# able to read the installed sources. Settings added by later releases are picked up by the scan below.
_KNOWN_CACHE_SETTINGS = frozenset(
    {
        'cache',
        'anthropic_cache',
        'anthropic_cache_tool_definitions',
        'anthropic_cache_instructions',
        'anthropic_cache_messages',
        'anthropic_cache_diagnostics',
        'bedrock_cache_tool_definitions',
        'bedrock_cache_instructions',
        'bedrock_cache_messages',
        'openrouter_cache_tool_definitions',
        'openrouter_cache_instructions',
        'openrouter_cache_messages',
        'openai_prompt_cache_key',
        'openai_prompt_cache_retention',
        'openai_prompt_cache_options',
        'openai_prompt_cache_diagnostics',
        'openai_cache_instructions',
        'mistral_prompt_cache_key',
    }
)

# A whole `cache` word in the key (`anthropic_cache_messages`, `openai_prompt_cache_key`), but not
# `google_cached_content`, which names content that becomes part of the prompt.
_CACHE_WORD = re.compile(r'(?:^|_)cache(?:_|$)')
# A top-level class whose name ends in `ModelSettings`, its (possibly multi-line) bases, and its indented body.
_SETTINGS_CLASS = re.compile(
    r'^class (?P<name>\w*ModelSettings)\b(?:\([^)]*\))?:[^\n]*\n(?:(?:[ \t][^\n]*)?\n)*', re.MULTILINE
)


def _settings_source_files() -> list[Path]:
    """The installed pydantic-ai files that can define a `ModelSettings` TypedDict."""
    spec = importlib.util.find_spec('pydantic_ai')
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    # Provider packages keep their settings in any module (`models/openai/_settings.py` since 2.64).
    return [root / 'settings.py', *sorted((root / 'models').rglob('*.py'))]


def _class_keys(source: str, name: str) -> list[str]:
    """Annotated attribute names of the top-level class `name` in `source`."""
    keys: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            keys.extend(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            )
    return keys


def installed_settings_keys() -> dict[str, list[str]]:
    """Keys of every `*ModelSettings` TypedDict in the installed pydantic-ai, by class name.

    Read from the source rather than imported, because most provider modules need an optional SDK that is
    usually not installed, and importing the ones that are installed would be slow and have side effects.
    Only each class's own block is parsed, which keeps this to a few milliseconds at import.
    """
    found: dict[str, list[str]] = {}
    for path in _settings_source_files():
        try:
            text = path.read_text(encoding='utf-8')
        except OSError:
            continue
        if 'ModelSettings' not in text:
            continue
        for match in _SETTINGS_CLASS.finditer(text):
            name = match.group('name')
            try:
                keys = _class_keys(match.group(0), name)
            except SyntaxError:  # the block cut short, e.g. by an unindented line inside a string
                keys = _class_keys(text, name)
            found[f'{path.parent.name}/{path.name}:{name}'] = keys
    return found


def _derive_transport_only() -> frozenset[str]:
    """The transport-only set: fixed names plus every installed provider's prompt-cache setting."""
    derived: set[str] = set()
    try:
        for keys in installed_settings_keys().values():
            derived.update(key for key in keys if _CACHE_WORD.search(key))
    except Exception:  # pragma: no cover - an unreadable installation keeps the fixed names
        pass
    return _ALWAYS_TRANSPORT_ONLY | _KNOWN_CACHE_SETTINGS | frozenset(derived)


TRANSPORT_ONLY_SETTINGS: frozenset[str] = _derive_transport_only()
"""Model settings left out of model fingerprints: they change how a request travels or what the provider
caches, never the answer."""


def settings_text(settings: Mapping[str, Any] | None) -> str:
    """The settings that can change the answer, or `null` when there are none."""
    if not settings:
        return 'null'
    kept = {key: value for key, value in settings.items() if key not in TRANSPORT_ONLY_SETTINGS}
    return render_value(kept) if kept else 'null'
